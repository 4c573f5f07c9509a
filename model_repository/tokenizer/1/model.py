"""Triton Python-backend adapter; the implementation is orchestrator.models.tokenizer."""

from orchestrator.models.tokenizer import TritonPythonModel  # noqa: F401
