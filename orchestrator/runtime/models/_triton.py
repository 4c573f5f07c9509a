"""Small helpers around ``triton_python_backend_utils`` shared by our Python-backend models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Mapping

import triton_python_backend_utils as pb_utils


def error_response(message: str, code: str = "INVALID_ARG") -> "pb_utils.InferenceResponse":
    """A response that carries only an error (one per failed request, never a crash).

    ``code`` names a ``pb_utils.TritonError`` constant (INVALID_ARG for bad input, INTERNAL
    for a downstream failure); stubs that predate error codes get a plain error.
    """
    try:
        error = pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
    except (AttributeError, TypeError):
        error = pb_utils.TritonError(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def model_directory(args: Mapping[str, Any]) -> Path:
    """The model version directory (``<repo>/<model>/<version>``) from ``initialize`` args."""
    return Path(args["model_repository"]) / str(args["model_version"])


def model_config(args: Mapping[str, Any]) -> Dict[str, Any]:
    """The model configuration (JSON in ``args['model_config']``) as a dict."""
    config: Dict[str, Any] = json.loads(args["model_config"])
    return config
