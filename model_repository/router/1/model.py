"""Triton Python-backend adapter; the implementation is orchestrator.router."""

from orchestrator.router import TritonPythonModel  # noqa: F401
