"""Triton Python-backend adapter; the implementation is orchestrator.runtime.router."""

from orchestrator.runtime.router import TritonPythonModel  # noqa: F401
