"""The mock ``triton_python_backend_utils`` module: the pure-Python helpers (written here,
:mod:`orchestrator.testing.mock.pb_helpers`), the stub's C++ parts as the mock's, and the
model-control functions of the stub.

Only the names the real module exposes are added (r24.10 ``pb_stub.cc``).
"""

from __future__ import annotations

import sys
import types
from typing import Any, Dict, Optional

from orchestrator.testing.mock import pb_helpers
from orchestrator.testing.mock.context import current_model, current_server
from orchestrator.testing.mock.errors import LoadError, TritonError, TritonModelException, as_str, incompatible
from orchestrator.testing.mock.logger import Logger
from orchestrator.testing.mock.metrics import MetricFamily
from orchestrator.testing.mock.requests import InferenceRequest, InferenceResponse
from orchestrator.testing.mock.tensors import MemoryType, PreferredMemory, Tensor
from orchestrator.testing.mock.wire import MODULE_LOCK, PB_MODULE_NAME


def load_model(model_name: str, config: str = "", files: Optional[dict] = None) -> None:
    """Mirror of ``pb_utils.load_model``: loads the model in the current MockTriton.

    ``config`` (a JSON model configuration) overrides the file's configuration, as in
    Triton; ``files`` is not supported. Raises ``TritonModelException("Failed to load
    model: Failed to process the request for model '<calling instance>', message: ...")``
    when the load fails; the real 2.51 stub shows an unreadable byte after "message: ",
    the mock the load error (see the package docs).
    """
    model_name, config = as_str(model_name), as_str(config)
    if not isinstance(model_name, str) or not isinstance(config, str):
        raise incompatible(
            "load_model", "(model_name: str, config: str = '', files: object = None) -> None",
            ", ".join(repr(a) for a in (model_name, config)),
        )
    server = current_server()
    if files is not None:
        if not isinstance(files, dict):
            raise TritonModelException(
                f"Failed to load model: failed to load model '{model_name}', files should be "
                "a dictionary of file paths and file contents"
            )
        if files:
            raise TritonModelException(
                "Failed to load model: mock_triton does not support load_model(files=...)"
            )
    try:
        server.load(model_name, config=config or None)
    except LoadError as exc:
        caller = current_model()
        raise TritonModelException(
            "Failed to load model: Failed to process the request for model "
            f"'{caller.instance_name if caller else ''}', message: {exc}"
        ) from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Mirror of ``pb_utils.unload_model`` (synchronous in the mock)."""
    model_name = as_str(model_name)
    if not isinstance(model_name, str) or not isinstance(unload_dependents, bool):
        raise incompatible(
            "unload_model", "(model_name: str, unload_dependents: bool = False) -> None",
            f"{model_name!r}, {unload_dependents!r}",
        )
    current_server().unload(model_name, unload_dependents=unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Mirror of ``pb_utils.is_model_ready``."""
    model_name, model_version = as_str(model_name), as_str(model_version)
    if not isinstance(model_name, str) or not isinstance(model_version, str):
        raise incompatible(
            "is_model_ready", "(model_name: str, model_version: str = '') -> bool",
            f"{model_name!r}, {model_version!r}",
        )
    return current_server().is_model_ready(model_name, model_version)


def get_model_dir() -> str:
    """Mirror of ``pb_utils.get_model_dir()``: the directory of the running ``model.py``."""
    model = current_model()
    if model is None or model.version_dir is None:
        raise TritonModelException("get_model_dir() is only available inside a Python model")
    return str(model.version_dir)


def _exports() -> Dict[str, Any]:
    return {
        "TritonError": TritonError,
        "TritonModelException": TritonModelException,
        "Tensor": Tensor,
        "InferenceRequest": InferenceRequest,
        "InferenceResponse": InferenceResponse,
        "Logger": Logger,
        "PreferredMemory": PreferredMemory,
        "TRITONSERVER_MEMORY_GPU": MemoryType.TRITONSERVER_MEMORY_GPU,
        "TRITONSERVER_MEMORY_CPU": MemoryType.TRITONSERVER_MEMORY_CPU,
        "MetricFamily": MetricFamily,
        "load_model": load_model,
        "unload_model": unload_model,
        "is_model_ready": is_model_ready,
        "get_model_dir": get_model_dir,
    }


_module: Optional[types.ModuleType] = None


def install() -> types.ModuleType:
    """Put the mock ``triton_python_backend_utils`` into ``sys.modules`` (idempotent).

    Returns the module (always the same object). :class:`MockTriton` calls this; call it
    yourself before importing a ``model.py`` directly. Imports nothing beyond numpy and the
    standard library: no Triton file or wheel is needed.
    """
    global _module
    with MODULE_LOCK:
        if _module is None:
            module = types.ModuleType(PB_MODULE_NAME, "Triton's Python backend utilities (orchestrator's in-process mock).")
            for name in pb_helpers.__all__:
                setattr(module, name, getattr(pb_helpers, name))
            for name, obj in _exports().items():
                setattr(module, name, obj)
            module.__mock_triton__ = True  # type: ignore[attr-defined]
            _module = module
        if sys.modules.get(PB_MODULE_NAME) is not _module:
            sys.modules[PB_MODULE_NAME] = _module
        return _module
