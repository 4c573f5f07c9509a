"""Triton Python-backend adapter; the implementation is orchestrator.runtime.serving.router."""

from orchestrator.runtime.serving.router import TritonPythonModel  # noqa: F401
