"""Triton Python-backend adapter; the implementation is orchestrator.models.onnx_classifier."""

from orchestrator.models.onnx_classifier import TritonPythonModel  # noqa: F401
