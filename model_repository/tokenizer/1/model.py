"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.tokenizer."""

from orchestrator.runtime.models.tokenizer import TritonPythonModel  # noqa: F401
