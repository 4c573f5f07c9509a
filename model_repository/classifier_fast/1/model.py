"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.onnx_classifier."""

from orchestrator.runtime.models.onnx_classifier import TritonPythonModel  # noqa: F401
