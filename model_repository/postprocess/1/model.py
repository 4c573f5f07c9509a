"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.postprocess."""

from orchestrator.runtime.models.postprocess import TritonPythonModel  # noqa: F401
