"""Triton Python-backend adapter; the implementation is orchestrator.models.postprocess."""

from orchestrator.models.postprocess import TritonPythonModel  # noqa: F401
