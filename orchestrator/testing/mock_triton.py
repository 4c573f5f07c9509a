"""In-process mock of Triton's Python backend and a mini "server" for unit tests.

The mock runs the *real* ``model.py`` files of a model repository in the test process,
so Python-backend models (including a BLS router that calls other models) can be
tested in milliseconds, without a ``tritonserver``. It has two parts:

* a stand-in for the ``triton_python_backend_utils`` module (``pb_utils``), installed in
  ``sys.modules`` by :func:`install`. Its pure-Python helpers (``get_input_tensor_by_name``,
  ``triton_string_to_numpy``, ``serialize_byte_tensor``, ``ModelConfig`` ...) are loaded at
  run time from the real file shipped in the ``nvidia-pytriton`` wheel
  (``pytriton/tritonserver/backends/python/triton_python_backend_utils.py``, Triton 2.51 /
  r24.10; set ``MOCK_TRITON_PB_UTILS`` to use another copy). The parts that are C++ in the
  real stub (``Tensor``, ``InferenceRequest``, ``InferenceResponse``, ``TritonError``,
  ``TritonModelException``, ``Logger``, ``MetricFamily``, ``load_model``,
  ``unload_model``, ``is_model_ready``, ``get_model_dir``, ``PreferredMemory``,
  ``TRITONSERVER_MEMORY_CPU/GPU``) are re-implemented here after the r24.10 sources
  (python_backend ``pb_stub.cc``, ``infer_request.cc``, ``request_executor.cc``; core
  ``infer_request.cc``). Only the names the real module exposes are exposed.
* :class:`MockTriton`, a mini server with explicit model control: it parses the model
  configurations, imports each Python model, calls ``initialize``/``execute``/``finalize``
  as the stub does, validates requests the way Triton's core does, runs ensembles, and
  records what happened (``calls``, ``logs``, ``metrics()``).

Usage::

    from orchestrator.testing.mock_triton import MockTriton, InferError

    with MockTriton("model_repository") as mock:            # model_config_name="embedded"
        mock.load("router")                                  # explicit model control
        out = mock.infer("router", {"TEXT": np.array([[b"hi"]], dtype=object),
                                    "THRESHOLD": np.array([[0.5]], dtype=np.float32)})
        assert mock.calls_to("tokenizer") == [(1,)]          # one BLS call, batch of 1

API summary (see the docstrings)::

    install() -> module                   # idempotent; MockTriton() calls it
    class InferError(Exception): message: str; code: str    # an error *response*
    class LoadError(RuntimeError)                            # a model failed to load
    class MockTriton:
        __init__(model_repository, model_config_name="embedded", *, models=(),
                 strict_outputs=True, auto_complete=True, instance_wait_timeout=120.0)
        load(name, config=None); unload(name, unload_dependents=False); close()
        infer(model, inputs, parameters=None, request_id="", *, outputs=None) -> dict
        infer_batch(model, requests) -> list[dict | InferError]
        is_model_ready(name, version=""); repository_index(); model_config(name); instance(name)
        calls: list[Call]; calls_to(model); reset_calls()
        fail_next(model, message, count=1, code="INTERNAL"); set_failure(model, failure)
        set_delay(model, seconds); clear_faults(model=None)
        metrics() -> {family: {frozenset(labels.items()): value}}; metric(family, labels)
        logs: list[LogRecord]

Where the mock differs from a real Triton 2.51 server (a mock must say where it is not
honest):

* One process, one instance. Every model gets a single ``TritonPythonModel`` instance
  (``instance_group.count`` is ignored), all models share this interpreter's
  ``sys.modules`` and globals (Triton gives every instance its own stub process), and
  ``model.py`` is imported under a unique module name (``_mock_triton_models.<...>.model``)
  with its version directory as package path, so ``from . import x`` works. Triton appends
  ``<model>/1`` and ``<model>`` to ``sys.path`` for good; the mock does so only while
  ``model.py`` is imported. ``args["model_instance_kind"]`` is taken from the config
  (``KIND_GPU`` -> ``"GPU"``); nothing checks that a GPU exists.
* Executes of one model are serialized (one instance = one batch at a time). Requests
  sent concurrently (e.g. two ``async_exec`` to the same model under ``asyncio.gather``)
  are *not* merged into one batch as Triton's dynamic batcher might; each gets its own
  ``execute``. Only :meth:`MockTriton.infer_batch` forms batches, with the batcher's
  rules (see there). ``preferred_batch_size``, queue delays, priorities, request timeouts
  (``timeout=``) and cancellation are not modelled (``is_cancelled()`` is always False).
* ``async def execute`` runs on a per-model event loop in a daemon thread and the caller
  waits for it, as the r24.10 stub does (``run_coroutine_threadsafe(...).result()``);
  ``async_exec`` is ``loop.run_in_executor(None, exec)`` as in the stub. The stub also
  makes that loop the main thread's current loop (``asyncio.set_event_loop``); the mock
  does not touch the caller's thread.
* Ensembles run their steps one after the other in dependency order (Triton may run
  independent steps concurrently); each request of an ``infer_batch`` to an ensemble goes
  through the pipeline on its own. Request parameters and ids are forwarded to the
  composing models, as in Triton.
* Output checks (``strict_outputs=True``, the default) are *stricter* than Triton: a
  returned output that is not in the model configuration, whose datatype differs from
  the configuration, or whose shape does not fit ``[batch] + dims`` fails that request
  with a message that says it is a mock-only check. Real Triton 24.10 silently drops
  outputs that were not requested (an unknown name is never requested) and passes any
  datatype/shape through to the client. ``strict_outputs=False`` mirrors Triton exactly.
* Error *texts* follow the r24.10 sources (core ``Normalize()``, stub ``ProcessRequests``,
  BLS ``RequestExecutor``); the Python traceback part of "Failed to process the
  request(s) ..." messages is an approximation of pybind11's ``At:`` frame list.
  Error codes of client-side errors follow the core; BLS error responses carry
  ``TritonError.INTERNAL`` as in r24.10 (the stub keeps only the message).
* Client side: :meth:`MockTriton.infer` takes numpy arrays, as ``tritonclient``'s
  ``set_data_from_numpy`` does, with the datatype taken from the array (float64 stays
  FP64, so a FP32 input fails server-side like it would with a real client). Object
  arrays of ``str`` are encoded to UTF-8 ``bytes`` like the client's
  ``serialize_byte_tensor``; numpy unicode arrays (``dtype '<U..'``) are refused, as the
  real client refuses them. Output BYTES tensors come back as object arrays of ``bytes``.
* Load/unload are synchronous. Loading an already-READY model without a config override
  is a no-op (Triton skips unmodified models); with ``config=`` it reloads. Decoupled
  models and ``load_model(files=...)`` are not supported. ``auto_complete_config`` is
  called when the class defines it (Triton's default, auto-complete enabled).
* Metrics live in the :class:`MockTriton`, not in a Prometheus endpoint. As in Triton a
  metric series disappears when the last ``Metric`` object for it is garbage-collected
  (or its model is unloaded), so read ``metrics()`` before ``close()``.
* Input validation mirrors the core exactly, including its gap: with ``optional`` inputs
  only the *number* of inputs is checked, so a request that omits a required input but
  sends an optional one reaches ``execute`` (in Triton too).
* A synchronous model that BLS-calls itself re-enters its own instance in the mock (Triton
  would wait for the busy instance); an asynchronous one fails after
  ``instance_wait_timeout``. ``InferenceRequest.exec()`` also works from test code outside
  any model (it uses the most recent open MockTriton); the real stub has no such case.
* ``pb_utils.InferenceRequest(parameters=...)`` takes a ``dict`` only, as in r24.10; a
  JSON string raises ``TritonModelException`` there and here.
* Responses sent through ``request.get_response_sender()`` in a non-decoupled model are
  delivered when ``execute`` returns, not immediately. A request that gets no response at
  all fails with an error instead of hanging as it would in Triton.
* GPU tensors, DLPack GPU exchange, BF16, shape tensors, request rescheduling,
  sequence batching state and model warmup are not supported.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import enum
import importlib.util
import json
import logging
import os
import re
import sys
import threading
import time
import traceback
import types
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Union

import numpy as np

__all__ = [
    "install",
    "MockTriton",
    "InferError",
    "LoadError",
    "Call",
    "LogRecord",
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "TritonError",
    "TritonModelException",
    "Logger",
    "MetricFamily",
]

_LOG = logging.getLogger(__name__)
_PB_MODULE_NAME = "triton_python_backend_utils"
_THIS_FILE = os.path.abspath(__file__)

# --------------------------------------------------------------------------------------
# Datatypes
# --------------------------------------------------------------------------------------

# config data_type -> KServe protocol datatype
_CONFIG_TO_PROTOCOL = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
# protocol datatype -> TRITONSERVER_DataType value (what Tensor.triton_dtype() returns)
_PROTOCOL_TO_TRITON_INT = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
_NUMPY_TO_PROTOCOL = [
    (np.dtype(np.bool_), "BOOL"),
    (np.dtype(np.uint8), "UINT8"),
    (np.dtype(np.uint16), "UINT16"),
    (np.dtype(np.uint32), "UINT32"),
    (np.dtype(np.uint64), "UINT64"),
    (np.dtype(np.int8), "INT8"),
    (np.dtype(np.int16), "INT16"),
    (np.dtype(np.int32), "INT32"),
    (np.dtype(np.int64), "INT64"),
    (np.dtype(np.float16), "FP16"),
    (np.dtype(np.float32), "FP32"),
    (np.dtype(np.float64), "FP64"),
]


def _numpy_to_protocol(dtype: Any) -> Optional[str]:
    """Protocol datatype of a numpy dtype, with the stub's rules (None if unsupported).

    Like ``numpy_to_triton_type`` in the stub, comparisons are dtype equality, so a
    byte-swapped dtype is unsupported, ``object_`` and ``bytes_`` ('S') are BYTES and
    unicode ('U') is unsupported.
    """
    dtype = np.dtype(dtype)
    if dtype == np.dtype(np.object_) or dtype.type == np.bytes_:
        return "BYTES"
    for candidate, name in _NUMPY_TO_PROTOCOL:
        if dtype == candidate:
            return name
    return None


def _dims_str(dims: Iterable[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


# --------------------------------------------------------------------------------------
# The real pure-Python helpers
# --------------------------------------------------------------------------------------


def _real_utils_path() -> Path:
    env = os.environ.get("MOCK_TRITON_PB_UTILS")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("pytriton")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = (
                Path(location) / "tritonserver" / "backends" / "python"
                / "triton_python_backend_utils.py"
            )
            if candidate.is_file():
                return candidate
    raise ImportError(
        "mock_triton needs Triton's pure-Python triton_python_backend_utils.py; it is "
        "looked up in the nvidia-pytriton wheel (pytriton/tritonserver/backends/python/). "
        "Install nvidia-pytriton or set MOCK_TRITON_PB_UTILS to the file's path."
    )


_pb_module: Optional[types.ModuleType] = None
_install_lock = threading.RLock()


def _pb() -> types.ModuleType:
    """The mock module (built on first use)."""
    global _pb_module
    with _install_lock:
        if _pb_module is None:
            path = _real_utils_path()
            spec = importlib.util.spec_from_file_location(_PB_MODULE_NAME, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for name, obj in _pb_exports().items():
                setattr(module, name, obj)
            module.__mock_triton__ = True
            _pb_module = module
        return _pb_module


def install() -> types.ModuleType:
    """Put the mock ``triton_python_backend_utils`` into ``sys.modules`` (idempotent).

    Returns the module. :class:`MockTriton` calls this; call it yourself before
    importing a ``model.py`` directly.
    """
    with _install_lock:
        module = _pb()
        if sys.modules.get(_PB_MODULE_NAME) is not module:
            sys.modules[_PB_MODULE_NAME] = module
        return module


def _serialize(array: np.ndarray) -> bytes:
    out = _pb().serialize_byte_tensor(array)
    return b"" if out is None or len(out) == 0 else bytes(out)


def _deserialize(blob: bytes, shape: Sequence[int]) -> np.ndarray:
    if len(blob) == 0:
        return np.empty(tuple(shape), dtype=np.object_)
    flat = _pb().deserialize_bytes_tensor(blob)
    return flat.reshape(tuple(shape))


# --------------------------------------------------------------------------------------
# Context: which server / model the current code runs for
# --------------------------------------------------------------------------------------


class _Ctx(NamedTuple):
    server: "MockTriton"
    model: Optional["_Model"]


_CTX: contextvars.ContextVar[Optional[_Ctx]] = contextvars.ContextVar(
    "mock_triton_ctx", default=None
)
_ACTIVE: List["MockTriton"] = []
_ACTIVE_LOCK = threading.Lock()


def _current_server() -> "MockTriton":
    ctx = _CTX.get()
    if ctx is not None:
        return ctx.server
    with _ACTIVE_LOCK:
        for server in reversed(_ACTIVE):
            if not server._closed:
                return server
    raise RuntimeError(
        "no MockTriton is active: create MockTriton(model_repository) before using "
        "triton_python_backend_utils server functions"
    )


def _current_model() -> Optional["_Model"]:
    ctx = _CTX.get()
    return ctx.model if ctx is not None else None


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class TritonModelException(Exception):
    """Mirror of ``pb_utils.TritonModelException`` (raised by stub functions)."""


class _ErrorCode(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """Mirror of ``pb_utils.TritonError(message, code=TritonError.INTERNAL)``.

    Not an exception: it goes into ``InferenceResponse(error=...)``.
    """

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: _ErrorCode = _ErrorCode.INTERNAL):
        if not isinstance(message, str):
            raise TypeError(
                "TritonError(): incompatible constructor arguments: message must be str, "
                f"got {type(message)}"
            )
        if not isinstance(code, _ErrorCode):
            raise TypeError(
                "TritonError(): incompatible constructor arguments: code must be one of "
                f"TritonError.UNKNOWN/INTERNAL/..., got {code!r}"
            )
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> _ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code=TritonError.{self._code.name})"


class InferError(Exception):
    """An error response, as a client of the server would see it.

    ``message`` is the error text; ``code`` the Triton error code name
    (``"INVALID_ARG"``, ``"NOT_FOUND"``, ``"INTERNAL"`` ...).
    """

    def __init__(self, message: str, code: str = "INTERNAL"):
        super().__init__(message)
        self.message = message
        self.code = code

    def __repr__(self) -> str:
        return f"InferError({self.message!r}, code={self.code!r})"


class LoadError(RuntimeError):
    """A model failed to load; the message names the model and the cause."""


# --------------------------------------------------------------------------------------
# Tensor, requests, responses
# --------------------------------------------------------------------------------------


class _DLPackCapsule:
    def __init__(self, capsule: Any):
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple:
        return (1, 0)


class Tensor:
    """Mirror of ``pb_utils.Tensor(name, numpy_array)`` (CPU only).

    As in the stub: the name must be non-empty; the dtype must be one Triton supports
    (numpy unicode ``<U`` arrays raise ``TritonModelException("NumPy dtype is not
    supported.")`` -- use ``dtype=object``); non-contiguous arrays are made contiguous;
    ``as_numpy()`` returns the array given; a BYTES tensor is serialized when created,
    so later changes to its object array are not sent.
    """

    __slots__ = ("_name", "_dtype", "_array", "_serialized")

    def __init__(self, name: str, numpy_array: Any):
        if not isinstance(name, str):
            raise TypeError(
                f"Tensor(): incompatible constructor arguments: name must be str, got {type(name)}"
            )
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = np.asarray(numpy_array)
        dtype = _numpy_to_protocol(array.dtype)
        if dtype is None:
            raise TritonModelException("NumPy dtype is not supported.")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._dtype = dtype
        self._array = array
        self._serialized = _serialize(array) if dtype == "BYTES" else None

    @classmethod
    def _wire(cls, name: str, dtype: str, array: np.ndarray) -> "Tensor":
        """A tensor as Triton hands it over (input to execute, BLS output)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._dtype = dtype
        tensor._array = array
        tensor._serialized = _serialize(array) if dtype == "BYTES" else None
        return tensor

    def _wire_array(self) -> np.ndarray:
        """The data as it would arrive on the other side of shared memory."""
        if self._dtype == "BYTES":
            return _deserialize(self._serialized or b"", self._array.shape)
        return np.array(self._array, copy=True, order="C")

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return _PROTOCOL_TO_TRITON_INT[self._dtype]

    def shape(self) -> List[int]:
        return [int(d) for d in self._array.shape]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._dtype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple:
        return (1, 0)  # kDLCPU, device 0

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> "Tensor":
        source = tensor if hasattr(tensor, "__dlpack__") else _DLPackCapsule(tensor)
        return Tensor(name, np.from_dlpack(source))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._dtype}, shape={self.shape()})"


class PreferredMemory:
    """Mirror of ``pb_utils.PreferredMemory`` (accepted and ignored: all memory is CPU)."""

    def __init__(self, preferred_memory_type: Any, preferred_device_id: int = 0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class _MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


class InferenceTrace:
    def get_context(self) -> None:
        return None


_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
_RELEASE_ALL = 1
_RELEASE_RESCHEDULE = 2


class InferenceResponseSender:
    """Response sender of a request in a non-decoupled model (see module docs)."""

    def __init__(self, requested_output_names: Optional[set], usable: bool):
        self._usable = usable
        self._responses: List[Optional["InferenceResponse"]] = []
        self._count = 0
        self._closed = False
        self._lock = threading.Lock()

    def _update(self, response: Optional["InferenceResponse"], flags: int) -> None:
        if not self._usable:
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to the "
                "decoupled state of the model."
            )
        with self._lock:
            if response is not None and self._count > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than "
                    "one response."
                )
            if response is None and flags == _FINAL and self._count == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete "
                    "final before sending a response."
                )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if flags == _FINAL:
                self._closed = True
            self._count += 1

    def send(self, response: Optional["InferenceResponse"] = None, flags: int = 0) -> None:
        if flags != _FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is "
                "set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError("send(): response must be an InferenceResponse or None")
        self._update(response, flags)
        if response is not None:
            self._responses.append(response)

    def is_cancelled(self) -> bool:
        return False


class _ResponseIterator:
    def __init__(self, response: "InferenceResponse"):
        self._pending = [response]

    def __iter__(self) -> "_ResponseIterator":
        return self

    def __next__(self) -> "InferenceResponse":
        if not self._pending:
            raise StopIteration
        return self._pending.pop(0)


_REQUIRED: Any = object()


class InferenceRequest:
    """Mirror of ``pb_utils.InferenceRequest`` (r24.10 signature).

    ``InferenceRequest(request_id="", correlation_id=0, inputs=..., requested_output_names=...,
    model_name=..., model_version=-1, flags=0, timeout=0, preferred_memory=..., trace=...,
    parameters=None)``. As in r24.10, ``parameters`` must be a ``dict`` (keys ``str``,
    values ``bool``/``int``/``str``) or ``None``: a JSON string raises
    ``TritonModelException`` (older releases accepted one). ``exec()`` returns an
    ``InferenceResponse`` (errors are *responses*, not exceptions); ``async_exec()``
    returns an awaitable (it must be called inside a running event loop). BLS from
    ``initialize``/``finalize`` raises ``TritonModelException``.

    Requests handed to ``execute`` are instances of this class too;
    ``requested_output_names()`` returns a ``set`` (pybind converts the C++ ``std::set``)
    holding every configured output when the client asked for none, and ``inputs()``
    lists the inputs in the client's order (Triton's order is unspecified -- use
    ``get_input_tensor_by_name``).
    """

    def __init__(
        self,
        request_id: str = "",
        correlation_id: Union[int, str] = 0,
        inputs: Sequence[Tensor] = _REQUIRED,
        requested_output_names: Sequence[str] = _REQUIRED,
        model_name: str = _REQUIRED,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Optional[PreferredMemory] = None,
        trace: Optional[InferenceTrace] = None,
        parameters: Optional[dict] = None,
    ):
        missing = [
            n for n, v in (("inputs", inputs), ("requested_output_names", requested_output_names),
                           ("model_name", model_name)) if v is _REQUIRED
        ]
        if missing:
            raise TypeError(
                "InferenceRequest(): incompatible constructor arguments; missing "
                + ", ".join(missing)
            )
        if not isinstance(request_id, str):
            raise TypeError("InferenceRequest(): request_id must be str")
        if correlation_id is None:
            raise TypeError("InferenceRequest(): correlation_id must not be None")
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, (list, tuple)):
            raise TypeError("InferenceRequest(): inputs must be a list of pb_utils.Tensor")
        for tensor in inputs:
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    "InferenceRequest(): inputs must be a list of pb_utils.Tensor, "
                    f"found {type(tensor)}"
                )
        if isinstance(requested_output_names, (str, bytes)) or not isinstance(
            requested_output_names, (list, tuple, set)
        ):
            raise TypeError("InferenceRequest(): requested_output_names must be a list of str")
        for name in requested_output_names:
            if not isinstance(name, str):
                raise TypeError("InferenceRequest(): requested_output_names must be a list of str")
        if not isinstance(model_name, str):
            raise TypeError("InferenceRequest(): model_name must be str")
        for label, value in (("model_version", model_version), ("flags", flags), ("timeout", timeout)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"InferenceRequest(): {label} must be int")
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, dict):
            raise TritonModelException(
                f"Expect N8pybind114dictE, got {type(parameters)}"
            )
        for key, value in parameters.items():
            if not isinstance(key, str):
                raise TritonModelException(
                    f"Expect parameters keys to have type str, found type {type(key)}"
                )
            if not isinstance(value, (bool, int, str)):
                raise TritonModelException(
                    "Expect parameters values to have type bool/int/str, found type "
                    f"{type(value)}"
                )
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested = set(requested_output_names)
        self._model_name = model_name
        self._model_version = int(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._preferred_memory = preferred_memory
        self._trace = trace if trace is not None else InferenceTrace()
        self._parameters_json = json.dumps(parameters)
        self._sender = InferenceResponseSender(self._requested, usable=False)
        self._release_flags = _RELEASE_ALL

    @classmethod
    def _for_execute(cls, model: "_Model", req: "_Req") -> "InferenceRequest":
        request = cls.__new__(cls)
        request._request_id = req.request_id
        request._correlation_id = req.correlation_id
        request._inputs = [Tensor._wire(n, d, a) for n, d, a in req.model_inputs]
        request._requested = (
            set(req.requested) if req.requested else set(model.outputs.keys())
        )
        request._model_name = model.name
        request._model_version = int(model.version)
        request._flags = req.flags
        request._timeout = req.timeout
        request._preferred_memory = None
        request._trace = InferenceTrace()
        request._parameters_json = json.dumps(req.parameters, separators=(",", ":"))
        request._sender = InferenceResponseSender(request._requested, usable=True)
        request._release_flags = _RELEASE_ALL
        return request

    def inputs(self) -> List[Tensor]:
        return list(self._inputs)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> Union[int, str]:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters_json

    def trace(self) -> InferenceTrace:
        return self._trace

    def requested_output_names(self) -> set:
        return set(self._requested)

    def get_response_sender(self) -> InferenceResponseSender:
        return self._sender

    def is_cancelled(self) -> bool:
        return False

    def set_release_flags(self, flags: int) -> None:
        if flags == _RELEASE_RESCHEDULE:
            raise TritonModelException(
                "mock_triton: request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) "
                "is not supported by the mock"
            )
        self._release_flags = int(flags)

    def exec(self, decoupled: bool = False) -> Any:
        if decoupled is None:
            raise TypeError("exec(): decoupled must not be None")
        ctx = _CTX.get()
        server = ctx.server if ctx is not None else _current_server()
        caller = ctx.model if ctx is not None else None
        if caller is not None and (not caller.initialized or caller.finalizing):
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        response = server._bls_exec(self)
        if decoupled:
            return _ResponseIterator(response)
        return response

    def async_exec(self, decoupled: bool = False) -> "asyncio.Future":
        loop = asyncio.get_running_loop()  # RuntimeError outside a loop, as in the stub
        context = contextvars.copy_context()
        return loop.run_in_executor(None, context.run, self.exec, decoupled)

    def __repr__(self) -> str:
        return (
            f"InferenceRequest(model_name={self._model_name!r}, inputs={self._inputs!r}, "
            f"request_id={self._request_id!r})"
        )


class InferenceResponse:
    """Mirror of ``pb_utils.InferenceResponse(output_tensors=[], error=None)`` (r24.10:
    no ``parameters``)."""

    def __init__(self, output_tensors: Sequence[Tensor] = (), error: Optional[TritonError] = None):
        if isinstance(output_tensors, (str, bytes)) or not isinstance(output_tensors, (list, tuple)):
            raise TypeError(
                "InferenceResponse(): incompatible constructor arguments: output_tensors "
                f"must be a list of pb_utils.Tensor, got {type(output_tensors)}"
            )
        for tensor in output_tensors:
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    "InferenceResponse(): output_tensors must hold pb_utils.Tensor objects, "
                    f"found {type(tensor)}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(
                f"InferenceResponse(): error must be a pb_utils.TritonError, got {type(error)}"
            )
        self._outputs = list(output_tensors)
        self._error = error

    def output_tensors(self) -> List[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> Optional[TritonError]:
        return self._error

    def __repr__(self) -> str:
        if self._error is not None:
            return f"InferenceResponse(error={self._error!r})"
        return f"InferenceResponse({self._outputs!r})"


# --------------------------------------------------------------------------------------
# Logger
# --------------------------------------------------------------------------------------


class _LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class LogRecord(NamedTuple):
    """One ``pb_utils.Logger`` message: the model it came from (None outside models)."""

    model: Optional[str]
    level: str
    message: str


_PY_LEVELS = {
    _LogLevel.INFO: logging.INFO,
    _LogLevel.WARNING: logging.WARNING,
    _LogLevel.ERROR: logging.ERROR,
    _LogLevel.VERBOSE: logging.DEBUG,
}


def _emit_log(level: _LogLevel, message: str) -> None:
    if not isinstance(message, str):
        raise TypeError("Logger: message must be str")
    ctx = _CTX.get()
    model_name = ctx.model.name if ctx is not None and ctx.model is not None else None
    server: Optional[MockTriton]
    try:
        server = _current_server()
    except RuntimeError:
        server = None
    if server is not None:
        with server._record_lock:
            server.logs.append(LogRecord(model_name, level.name, message))
    logging.getLogger(f"{__name__}.{model_name or 'stub'}").log(_PY_LEVELS[level], message)


class Logger:
    """Mirror of ``pb_utils.Logger``: messages go to ``MockTriton.logs`` and to the
    ``logging`` logger ``orchestrator.testing.mock_triton.<model>``."""

    LogLevel = _LogLevel
    INFO = _LogLevel.INFO
    WARNING = _LogLevel.WARNING
    ERROR = _LogLevel.ERROR
    VERBOSE = _LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: _LogLevel = _LogLevel.INFO) -> None:
        if not isinstance(level, _LogLevel):
            raise TypeError("Logger.log(): level must be a pb_utils.Logger.LogLevel")
        _emit_log(level, message)

    @staticmethod
    def log_info(message: str) -> None:
        _emit_log(_LogLevel.INFO, message)

    @staticmethod
    def log_warn(message: str) -> None:
        _emit_log(_LogLevel.WARNING, message)

    @staticmethod
    def log_error(message: str) -> None:
        _emit_log(_LogLevel.ERROR, message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _emit_log(_LogLevel.VERBOSE, message)


# --------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------


class _MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class _Series:
    __slots__ = ("value", "bounds", "bucket_counts", "count", "sum", "refs")

    def __init__(self, bounds: Optional[List[float]]):
        self.value = 0.0
        self.bounds = bounds
        self.bucket_counts = [0] * (len(bounds) + 1) if bounds is not None else None
        self.count = 0
        self.sum = 0.0
        self.refs = 0


class _FamilyRecord:
    __slots__ = ("name", "description", "kind", "series", "refs")

    def __init__(self, name: str, description: str, kind: _MetricKind):
        self.name = name
        self.description = description
        self.kind = kind
        self.series: Dict[frozenset, _Series] = {}
        self.refs = 0


class _MetricRegistry:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.families: Dict[str, _FamilyRecord] = {}

    def family(self, name: str, description: str, kind: _MetricKind) -> _FamilyRecord:
        with self.lock:
            if not _METRIC_NAME_RE.match(name):
                raise TritonModelException(
                    f"Error when creating MetricFamily: Invalid metric name '{name}'"
                )
            record = self.families.get(name)
            if record is None:
                record = _FamilyRecord(name, description, kind)
                self.families[name] = record
            elif record.kind != kind or record.description != description:
                raise TritonModelException(
                    "Error when creating MetricFamily: Family name already exists with "
                    f"different type or help text ('{name}')"
                )
            record.refs += 1
            return record

    def release_family(self, record: _FamilyRecord) -> None:
        with self.lock:
            record.refs -= 1
            if record.refs <= 0 and not record.series and self.families.get(record.name) is record:
                del self.families[record.name]

    def release_series(self, record: _FamilyRecord, key: frozenset) -> None:
        with self.lock:
            series = record.series.get(key)
            if series is None:
                return
            series.refs -= 1
            if series.refs <= 0:
                del record.series[key]
                if record.refs <= 0 and not record.series and self.families.get(record.name) is record:
                    del self.families[record.name]


class _Metric:
    """Mirror of the ``Metric`` object returned by ``MetricFamily.Metric(...)``."""

    def __init__(self, registry: _MetricRegistry, family: _FamilyRecord, key: frozenset):
        self._registry = registry
        self._family = family
        self._key = key

    def _series(self) -> _Series:
        series = self._family.series.get(self._key)
        if series is None:  # pragma: no cover - defensive
            raise TritonModelException("Could not get metric value. Metric has been invalidated.")
        return series

    @staticmethod
    def _number(value: Any, what: str) -> float:
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError(f"{what}(): incompatible function arguments: expected a float")
        return float(value)

    def increment(self, value: float) -> None:
        value = self._number(value, "increment")
        kind = self._family.kind
        with self._registry.lock:
            if kind == _MetricKind.COUNTER:
                if value < 0.0:
                    raise TritonModelException(
                        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can "
                        "only be incremented monotonically by non-negative values."
                    )
                self._series().value += value
            elif kind == _MetricKind.GAUGE:
                self._series().value += value
            else:
                raise TritonModelException(
                    "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does "
                    "not support Increment"
                )

    def set(self, value: float) -> None:
        value = self._number(value, "set")
        kind = self._family.kind
        with self._registry.lock:
            if kind == _MetricKind.GAUGE:
                self._series().value = value
            else:
                raise TritonModelException(
                    f"Failed to set metric value: TRITONSERVER_METRIC_KIND_{kind.name} does not "
                    "support Set"
                )

    def observe(self, value: float) -> None:
        value = self._number(value, "observe")
        kind = self._family.kind
        with self._registry.lock:
            if kind != _MetricKind.HISTOGRAM:
                raise TritonModelException(
                    f"Failed to observe metric value: TRITONSERVER_METRIC_KIND_{kind.name} does "
                    "not support Observe"
                )
            series = self._series()
            assert series.bounds is not None and series.bucket_counts is not None
            index = len(series.bounds)
            for i, bound in enumerate(series.bounds):
                if value <= bound:
                    index = i
                    break
            series.bucket_counts[index] += 1
            series.count += 1
            series.sum += value

    def value(self) -> float:
        with self._registry.lock:
            if self._family.kind == _MetricKind.HISTOGRAM:
                raise TritonModelException(
                    "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not "
                    "support Value"
                )
            return float(self._series().value)

    def __del__(self) -> None:
        try:
            self._registry.release_series(self._family, self._key)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class MetricFamily:
    """Mirror of ``pb_utils.MetricFamily(name, description, kind)``.

    ``kind`` is ``MetricFamily.COUNTER``, ``GAUGE`` or ``HISTOGRAM``;
    ``family.Metric(labels=None, buckets=None)`` returns a metric with ``increment``,
    ``set``, ``observe`` and ``value`` and the r24.10 rules (counters never decrease and
    cannot be set; histograms need ``buckets`` and only ``observe``). Values go to the
    current :class:`MockTriton` (see :meth:`MockTriton.metrics`). Families are shared by
    name, metrics by label set, as in Prometheus.
    """

    COUNTER = _MetricKind.COUNTER
    GAUGE = _MetricKind.GAUGE
    HISTOGRAM = _MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: _MetricKind):
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        if not isinstance(kind, _MetricKind):
            raise TypeError(
                "MetricFamily(): kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM"
            )
        self._registry = _current_server()._metrics
        self._record = self._registry.family(name, description, kind)

    def Metric(self, labels: Optional[dict] = None, buckets: Optional[list] = None) -> _Metric:  # noqa: N802
        kind = self._record.kind
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TritonModelException(
                    "Error when creating Metric: label names and values must be strings"
                )
            if not _LABEL_NAME_RE.match(key) or key.startswith("__"):
                raise TritonModelException(
                    f"Error when creating Metric: Invalid label name '{key}'"
                )
        bounds: Optional[List[float]] = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if kind in (_MetricKind.COUNTER, _MetricKind.GAUGE):
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = [float(b) for b in buckets]
            if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
                raise TritonModelException(
                    "Error when creating Metric: Bucket Boundaries must be strictly sorted"
                )
        elif kind == _MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        key = frozenset(labels.items())
        with self._registry.lock:
            series = self._record.series.get(key)
            if series is None:
                series = _Series(bounds)
                self._record.series[key] = series
            series.refs += 1
        return _Metric(self._registry, self._record, key)

    def __del__(self) -> None:
        try:
            self._registry.release_family(self._record)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


# --------------------------------------------------------------------------------------
# Model control functions of pb_utils
# --------------------------------------------------------------------------------------


def load_model(model_name: str, config: str = "", files: Optional[dict] = None) -> None:
    """Mirror of ``pb_utils.load_model``: loads the model in the current MockTriton.

    ``config`` (a JSON model configuration) overrides the file's configuration, as in
    Triton; ``files`` is not supported.
    """
    if model_name is None or config is None:
        raise TypeError("load_model(): model_name and config must not be None")
    server = _current_server()
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
        raise TritonModelException(f"Failed to load model: {exc}") from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Mirror of ``pb_utils.unload_model`` (synchronous in the mock)."""
    if model_name is None:
        raise TypeError("unload_model(): model_name must not be None")
    _current_server().unload(model_name, unload_dependents=unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Mirror of ``pb_utils.is_model_ready``."""
    if model_name is None or model_version is None:
        raise TypeError("is_model_ready(): arguments must not be None")
    return _current_server().is_model_ready(model_name, model_version)


def get_model_dir() -> str:
    """Mirror of ``pb_utils.get_model_dir()``: the directory of the running ``model.py``."""
    model = _current_model()
    if model is None or model.version_dir is None:
        raise TritonModelException("get_model_dir() is only available inside a Python model")
    return str(model.version_dir)


def _pb_exports() -> Dict[str, Any]:
    return {
        "TritonError": TritonError,
        "TritonModelException": TritonModelException,
        "Tensor": Tensor,
        "InferenceRequest": InferenceRequest,
        "InferenceResponse": InferenceResponse,
        "Logger": Logger,
        "PreferredMemory": PreferredMemory,
        "TRITONSERVER_MEMORY_GPU": _MemoryType.TRITONSERVER_MEMORY_GPU,
        "TRITONSERVER_MEMORY_CPU": _MemoryType.TRITONSERVER_MEMORY_CPU,
        "MetricFamily": MetricFamily,
        "load_model": load_model,
        "unload_model": unload_model,
        "is_model_ready": is_model_ready,
        "get_model_dir": get_model_dir,
    }


# --------------------------------------------------------------------------------------
# Server internals
# --------------------------------------------------------------------------------------


class Call(NamedTuple):
    """One ``execute()`` call: the model and the batch size of each request in it
    (the first dimension; 1 for models with ``max_batch_size: 0``).

    Compares equal to a plain tuple: ``Call("add_one", (2, 1)) == ("add_one", (2, 1))``.
    """

    model: str
    batch_sizes: tuple

    @property
    def requests(self) -> int:
        return len(self.batch_sizes)

    @property
    def total_batch_size(self) -> int:
        return sum(self.batch_sizes)


class _Req:
    """A request inside the server (already converted to what Triton would hold)."""

    __slots__ = (
        "inputs", "requested", "parameters", "request_id", "correlation_id", "flags",
        "timeout", "batch_size", "model_inputs",
    )

    def __init__(
        self,
        inputs: List[tuple],
        requested: Optional[List[str]],
        parameters: dict,
        request_id: str = "",
        correlation_id: Union[int, str] = 0,
        flags: int = 0,
        timeout: int = 0,
    ):
        self.inputs = inputs  # [(name, protocol dtype, array)]
        self.requested = requested or None
        self.parameters = parameters
        self.request_id = request_id
        self.correlation_id = correlation_id
        self.flags = flags
        self.timeout = timeout
        self.batch_size = 0
        self.model_inputs: List[tuple] = []

    def input_dict(self) -> Dict[str, np.ndarray]:
        return {name: array for name, _, array in self.inputs}


class _Ok(NamedTuple):
    outputs: List[tuple]  # [(name, protocol dtype, array)]


class _Err(NamedTuple):
    message: str
    code: _ErrorCode
    stage: str  # "notready" | "validation" | "exec"


_Result = Union[_Ok, _Err]


class _BatchFailure(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class _Faults:
    __slots__ = ("fail_next", "failure", "failure_code", "delay")

    def __init__(self) -> None:
        self.fail_next: List[tuple] = []  # [(message, code)]
        self.failure: Union[None, str, Callable] = None
        self.failure_code = _ErrorCode.INTERNAL
        self.delay = 0.0


class _Step(NamedTuple):
    model_name: str
    model_version: int
    input_map: Dict[str, str]  # composing-model input -> ensemble tensor
    output_map: Dict[str, str]  # composing-model output -> ensemble tensor


class _Model:
    def __init__(self, name: str, model_dir: Path, version: str, config: dict, config_path: Path):
        self.name = name
        self.model_dir = model_dir
        self.version = version
        self.version_dir: Optional[Path] = model_dir / version
        self.config = config
        self.config_json = json.dumps(config)
        self.config_path = config_path
        self.is_ensemble = config.get("platform") == "ensemble"
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.inputs: Dict[str, dict] = {i["name"]: i for i in config.get("input", [])}
        self.outputs: Dict[str, dict] = {o["name"]: o for o in config.get("output", [])}
        self.dynamic_batching = "dynamic_batching" in config
        self.has_optional_input = any(i.get("optional") for i in self.inputs.values())
        groups = config.get("instance_group") or []
        group = groups[0] if groups else {"name": name, "kind": "KIND_CPU", "gpus": []}
        self.instance_name = f"{group.get('name') or name}_0"
        self.instance_kind = "GPU" if group.get("kind") == "KIND_GPU" else "CPU"
        gpus = group.get("gpus") or []
        self.device_id = str(gpus[0]) if (self.instance_kind == "GPU" and gpus) else "0"
        self.model_py: Optional[Path] = None
        self.module_prefix: Optional[str] = None
        self.instance: Any = None
        self.steps: List[_Step] = []
        self.lock = threading.RLock()
        self.initialized = False
        self.finalizing = False
        self.ready = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[threading.Thread] = None
        self._loop_lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=f"mock-triton-{self.name}-loop", daemon=True
                )
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop

    def stop_loop(self) -> None:
        with self._loop_lock:
            loop, thread = self._loop, self._loop_thread
            self._loop = self._loop_thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is thread:
            return  # unloading from inside its own loop: let it wind down
        thread.join(timeout=10)
        if not thread.is_alive():
            try:
                loop.run_until_complete(loop.shutdown_default_executor())
            except Exception:  # pragma: no cover - best effort
                pass
            loop.close()


def _is_repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)
    if isinstance(flag, bool):
        return flag
    if callable(flag):  # pragma: no cover - other protobuf versions
        return bool(flag())
    return field.label == field.LABEL_REPEATED  # pragma: no cover


def _fix_int64(descriptor: Any, data: dict) -> None:
    """Turn protobuf-JSON int64 strings back into ints (Triton's ModelConfigToJson)."""
    from google.protobuf.descriptor import FieldDescriptor

    int64_types = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            message = field.message_type
            if message.GetOptions().map_entry:
                value_field = message.fields_by_name["value"]
                for key in list(value):
                    if value_field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                        _fix_int64(value_field.message_type, value[key])
                    elif value_field.cpp_type in int64_types:
                        value[key] = int(value[key])
            elif _is_repeated(field):
                for item in value:
                    _fix_int64(message, item)
            else:
                _fix_int64(message, value)
        elif field.cpp_type in int64_types:
            if _is_repeated(field):
                data[field.name] = [int(v) for v in value]
            else:
                data[field.name] = int(value)


def _format_exception(exc: BaseException) -> str:
    """Approximation of pybind11's ``error_already_set::what()`` for an execute error."""
    text = f"{type(exc).__name__}: {exc}"
    skip_dirs = (
        os.path.dirname(asyncio.__file__) + os.sep,
        os.path.dirname(concurrent.futures.__file__) + os.sep,
    )
    frames = []
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        if os.path.abspath(filename) == _THIS_FILE or filename.startswith(skip_dirs):
            continue
        frames.append(f"  {filename}({lineno}): {frame.f_code.co_name}\n")
    if frames:
        text += "\n\nAt:\n" + "".join(reversed(frames))
    return text


def _parse_item(item: Any, index: int) -> tuple:
    """(inputs, parameters, request_id, outputs) of one ``infer_batch`` item."""
    if not isinstance(item, dict):
        raise TypeError(f"infer_batch: request {index} must be a dict, got {type(item)}")
    if "inputs" in item and isinstance(item["inputs"], dict):
        unknown = set(item) - {"inputs", "parameters", "request_id", "outputs"}
        if unknown:
            raise TypeError(
                f"infer_batch: request {index} has unknown keys {sorted(unknown)} (allowed: "
                "inputs, parameters, request_id, outputs)"
            )
        return (
            item["inputs"], item.get("parameters"), item.get("request_id", ""),
            item.get("outputs"),
        )
    return item, None, "", None


class MockTriton:
    """A mini Triton server running the real ``model.py`` files of a repository.

    ``model_repository``: the repository directory. ``model_config_name``: like
    tritonserver's ``--model-config-name``: ``<model>/configs/<name>.pbtxt`` is used when
    it exists, else ``<model>/config.pbtxt`` (``None``/``""`` always uses config.pbtxt).
    Explicit model control: nothing is loaded until :meth:`load` (or ``models=``, or
    ``pb_utils.load_model`` from a model). ``strict_outputs``: see the module docs.
    ``instance_wait_timeout``: seconds a request waits for a busy model instance before
    failing (guards tests against deadlocks such as a model calling itself).
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        model_repository: Union[str, os.PathLike],
        model_config_name: Optional[str] = "embedded",
        *,
        models: Iterable[str] = (),
        strict_outputs: bool = True,
        auto_complete: bool = True,
        instance_wait_timeout: float = 120.0,
    ):
        install()
        self.model_repository = Path(model_repository).resolve()
        if not self.model_repository.is_dir():
            raise FileNotFoundError(f"model repository not found: {self.model_repository}")
        self.model_config_name = model_config_name
        self.strict_outputs = strict_outputs
        self.auto_complete = auto_complete
        self.instance_wait_timeout = instance_wait_timeout
        self.calls: List[Call] = []
        self.logs: List[LogRecord] = []
        self._models: Dict[str, _Model] = {}
        self._states: Dict[str, tuple] = {}  # name -> (state, reason, version)
        self._load_order: List[str] = []
        self._load_lock = threading.RLock()
        self._record_lock = threading.Lock()
        self._faults: Dict[str, _Faults] = {}
        self._metrics = _MetricRegistry()
        self._closed = False
        with _ACTIVE_LOCK:
            _ACTIVE.append(self)
        try:
            for name in models:
                self.load(name)
        except BaseException:
            self.close()
            raise

    # -- context manager ---------------------------------------------------------------

    def __enter__(self) -> "MockTriton":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this MockTriton is closed")

    # -- configuration ----------------------------------------------------------------

    def _config_path(self, name: str) -> Path:
        model_dir = self.model_repository / name
        if self.model_config_name:
            candidate = model_dir / "configs" / f"{self.model_config_name}.pbtxt"
            if candidate.is_file():
                return candidate
        return model_dir / "config.pbtxt"

    def _read_config(self, name: str, override: Optional[str]) -> tuple:
        from google.protobuf import json_format, text_format
        from tritonclient.grpc import model_config_pb2

        config = model_config_pb2.ModelConfig()
        path = self._config_path(name)
        if override is not None:
            try:
                json_format.Parse(override, config)
            except Exception as exc:
                raise LoadError(f"failed to load '{name}': invalid config override: {exc}") from exc
            path = Path("<config override>")
        else:
            if not path.is_file():
                raise LoadError(
                    f"failed to load '{name}': no model configuration at {path} (the mock does "
                    "not auto-generate configurations)"
                )
            try:
                text_format.Parse(path.read_text(), config)
            except Exception as exc:
                raise LoadError(f"failed to load '{name}': cannot parse {path}: {exc}") from exc
        if not config.name:
            config.name = name
        elif config.name != name:
            raise LoadError(
                f"unexpected directory name '{name}' for model '{config.name}', directory "
                "name must equal model name"
            )
        return config, path

    @staticmethod
    def _normalize_config(config: Any) -> None:
        """Fill in what Triton fills in before handing the config to the backend."""
        if not config.HasField("version_policy"):
            config.version_policy.latest.num_versions = 1
        if config.platform == "ensemble":
            return
        if not config.instance_group:
            group = config.instance_group.add()
            group.name = config.name
        for index, group in enumerate(config.instance_group):
            if not group.name:
                group.name = f"{config.name}_{index}"
            if group.kind == group.KIND_AUTO:
                group.kind = group.KIND_CPU
            if group.count < 1:
                group.count = 1

    @staticmethod
    def _config_dict(config: Any) -> dict:
        from google.protobuf import json_format

        try:
            data = json_format.MessageToDict(
                config,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            )
        except TypeError:  # protobuf < 5.26
            data = json_format.MessageToDict(
                config,
                preserving_proto_field_name=True,
                including_default_value_fields=True,
            )
        _fix_int64(config.DESCRIPTOR, data)
        return data

    def _pick_version(self, name: str, config: dict) -> str:
        model_dir = self.model_repository / name
        versions = sorted(
            int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()
        )
        policy = config.get("version_policy") or {}
        if "specific" in policy:
            wanted = {int(v) for v in policy["specific"].get("versions", [])}
            versions = [v for v in versions if v in wanted]
        if not versions:
            raise LoadError(
                f"failed to load '{name}': at least one version must be available under the "
                f"version policy of model '{name}'"
            )
        return str(versions[-1])

    @staticmethod
    def _validate_io(name: str, config: dict) -> None:
        for kind in ("input", "output"):
            seen = set()
            for io in config.get(kind, []):
                io_name = io.get("name", "")
                if not io_name:
                    raise LoadError(f"failed to load '{name}': model {kind} must specify 'name'")
                if io_name in seen:
                    raise LoadError(
                        f"failed to load '{name}': {kind} '{io_name}' specified more than once"
                    )
                seen.add(io_name)
                if io.get("data_type", "TYPE_INVALID") == "TYPE_INVALID":
                    raise LoadError(
                        f"failed to load '{name}': model {kind} '{io_name}' must specify "
                        "'data_type'"
                    )
                if not io.get("dims") and "reshape" not in io:
                    raise LoadError(
                        f"failed to load '{name}': model {kind} '{io_name}' must specify 'dims'"
                    )

    # -- model control ----------------------------------------------------------------

    def load(self, name: str, config: Optional[str] = None) -> None:
        """Load (or, with ``config``, reload) a model. Raises :class:`LoadError`.

        ``config``: a JSON model configuration overriding the file (as
        ``pb_utils.load_model(name, config=...)``). Ensembles load their composing
        models. Loading a READY model without ``config`` does nothing.
        """
        with self._load_lock:
            self._check_open()
            current = self._models.get(name)
            if current is not None and current.ready and config is None:
                return
            if current is not None:
                self.unload(name)
            if not (self.model_repository / name).is_dir():
                self._states[name] = ("UNAVAILABLE", "not found in the model repository", "")
                raise LoadError(f"failed to load '{name}', failed to poll from model repository")
            try:
                model = self._load(name, config)
            except LoadError as exc:
                self._states[name] = ("UNAVAILABLE", str(exc), self._states.get(name, ("", "", ""))[2])
                raise
            self._models[name] = model
            model.ready = True
            self._states[name] = ("READY", "", model.version)
            if name in self._load_order:
                self._load_order.remove(name)
            self._load_order.append(name)

    def _load(self, name: str, override: Optional[str]) -> _Model:
        proto, path = self._read_config(name, override)
        if proto.model_transaction_policy.decoupled:
            raise LoadError(f"failed to load '{name}': decoupled models are not supported by the mock")
        if proto.platform == "ensemble":
            self._normalize_config(proto)
            data = self._config_dict(proto)
            version = self._pick_version(name, data)
            self._states[name] = ("LOADING", "", version)
            return self._load_ensemble(name, data, version, path)
        if proto.backend != "python":
            what = proto.platform or proto.backend or "no backend/platform"
            raise LoadError(
                f"failed to load '{name}': the mock only runs Python-backend models "
                f"(backend: \"python\") and ensembles; {path} uses {what!r}. (Use a "
                "configuration that runs the model with the Python backend, e.g. "
                "model_config_name='embedded' for this repository's classifiers.)"
            )
        self._normalize_config(proto)
        data = self._config_dict(proto)
        version = self._pick_version(name, data)
        self._states[name] = ("LOADING", "", version)
        return self._load_python(name, proto, data, version, path)

    def _import_model(self, model: _Model) -> types.ModuleType:
        assert model.version_dir is not None
        filename = model.config.get("default_model_filename") or "model.py"
        py_file = model.version_dir / filename
        if not py_file.is_file():
            raise LoadError(
                f"failed to load '{model.name}' version {model.version}: Python model file not "
                f"found in '{py_file}'"
            )
        model.model_py = py_file
        root = "_mock_triton_models"
        if root not in sys.modules:
            root_pkg = types.ModuleType(root)
            root_pkg.__path__ = []  # type: ignore[attr-defined]
            sys.modules[root] = root_pkg
        safe = re.sub(r"\W", "_", model.name)
        prefix = f"{root}.{safe}_v{model.version}_{uuid.uuid4().hex[:8]}"
        package = types.ModuleType(prefix)
        package.__path__ = [str(model.version_dir)]  # type: ignore[attr-defined]
        package.__package__ = prefix
        sys.modules[prefix] = package
        model.module_prefix = prefix
        module_name = f"{prefix}.{py_file.stem}"
        spec = importlib.util.spec_from_file_location(module_name, py_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        added = []
        dont_write_bytecode = sys.dont_write_bytecode
        sys.dont_write_bytecode = True  # as the stub does; keeps model repositories clean
        for entry in (str(model.version_dir), str(model.model_dir)):
            if entry not in sys.path:
                sys.path.append(entry)
                added.append(entry)
        try:
            spec.loader.exec_module(module)
        finally:
            sys.dont_write_bytecode = dont_write_bytecode
            for entry in added:
                try:
                    sys.path.remove(entry)
                except ValueError:  # pragma: no cover
                    pass
        return module

    def _drop_modules(self, model: _Model) -> None:
        prefix = model.module_prefix
        if not prefix:
            return
        for key in [k for k in sys.modules if k == prefix or k.startswith(prefix + ".")]:
            del sys.modules[key]
        model.module_prefix = None

    def _load_python(self, name: str, proto: Any, data: dict, version: str, path: Path) -> _Model:
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2

        model = _Model(name, self.model_repository / name, version, data, path)
        token = _CTX.set(_Ctx(self, model))
        try:
            try:
                module = self._import_model(model)
                cls = getattr(module, "TritonPythonModel", None)
                if cls is None:
                    raise AttributeError(f"{model.model_py} does not define TritonPythonModel")
                if self.auto_complete and hasattr(cls, "auto_complete_config"):
                    pb = _pb()
                    completed = cls.auto_complete_config(pb.ModelConfig(json.dumps(data)))
                    if not isinstance(completed, pb.ModelConfig):
                        raise LoadError(
                            f"auto_complete_config function in model '{name}' must return a "
                            "valid pb.ModelConfig object."
                        )
                    new_proto = model_config_pb2.ModelConfig()
                    json_format.ParseDict(completed.as_dict(), new_proto)
                    self._normalize_config(new_proto)
                    data = self._config_dict(new_proto)
                    prefix, py_file = model.module_prefix, model.model_py
                    model = _Model(name, self.model_repository / name, version, data, path)
                    model.module_prefix, model.model_py = prefix, py_file
                    _CTX.set(_Ctx(self, model))
                self._validate_io(name, data)
                args = {
                    "model_config": model.config_json,
                    "model_instance_kind": model.instance_kind,
                    "model_instance_name": model.instance_name,
                    "model_instance_device_id": model.device_id,
                    "model_repository": str(model.model_dir),
                    "model_version": version,
                    "model_name": name,
                }
                model.instance = cls()
                if hasattr(model.instance, "initialize"):
                    result = model.instance.initialize(args)
                    if asyncio.iscoroutine(result):
                        # The r24.10 stub calls initialize() without awaiting it.
                        result.close()
                        warnings.warn(
                            f"model '{name}': async initialize() is not awaited by Triton's "
                            "Python backend (r24.10); its body never runs",
                            RuntimeWarning,
                            stacklevel=2,
                        )
                model.initialized = True
                return model
            except LoadError:
                self._drop_modules(model)
                raise
            except Exception as exc:
                self._drop_modules(model)
                model.stop_loop()
                raise LoadError(
                    f"failed to load '{name}' version {version}: {type(exc).__name__}: {exc}"
                ) from exc
        finally:
            _CTX.reset(token)

    def _load_ensemble(self, name: str, data: dict, version: str, path: Path) -> _Model:
        model = _Model(name, self.model_repository / name, version, data, path)
        model.version_dir = None
        self._validate_io(name, data)
        raw_steps = (data.get("ensemble_scheduling") or {}).get("step") or []
        if not raw_steps:
            raise LoadError(f"failed to load '{name}': ensemble must specify 'ensemble_scheduling.step'")
        steps = [
            _Step(
                s.get("model_name", ""), int(s.get("model_version", -1)),
                dict(s.get("input_map") or {}), dict(s.get("output_map") or {}),
            )
            for s in raw_steps
        ]
        composing: Dict[str, _Model] = {}
        for step in steps:
            if step.model_name == name:
                raise LoadError(f"failed to load '{name}': ensemble step refers to the ensemble itself")
            if step.model_name not in composing:
                try:
                    self.load(step.model_name)
                except LoadError as exc:
                    raise LoadError(
                        f"failed to load '{name}': composing model '{step.model_name}' failed "
                        f"to load: {exc}"
                    ) from exc
                composing[step.model_name] = self._models[step.model_name]
        # dtypes of ensemble tensors as they are produced
        produced: Dict[str, str] = {n: io["data_type"] for n, io in model.inputs.items()}
        order: List[_Step] = []
        remaining = list(steps)
        while remaining:
            progressed = False
            for step in list(remaining):
                if not all(t in produced for t in step.input_map.values()):
                    continue
                sub = composing[step.model_name]
                for model_input, tensor in step.input_map.items():
                    cfg = sub.inputs.get(model_input)
                    if cfg is None:
                        raise LoadError(
                            f"failed to load '{name}': in ensemble step for '{step.model_name}', "
                            f"'{model_input}' is not an input of that model"
                        )
                    if cfg["data_type"] != produced[tensor]:
                        raise LoadError(
                            f"failed to load '{name}': ensemble tensor '{tensor}' is "
                            f"{produced[tensor]} but '{step.model_name}' input '{model_input}' "
                            f"is {cfg['data_type']}"
                        )
                for model_output, tensor in step.output_map.items():
                    cfg = sub.outputs.get(model_output)
                    if cfg is None:
                        raise LoadError(
                            f"failed to load '{name}': in ensemble step for '{step.model_name}', "
                            f"'{model_output}' is not an output of that model"
                        )
                    produced[tensor] = cfg["data_type"]
                order.append(step)
                remaining.remove(step)
                progressed = True
            if not progressed:
                missing = sorted(
                    {t for s in remaining for t in s.input_map.values() if t not in produced}
                )
                raise LoadError(
                    f"failed to load '{name}': ensemble steps for "
                    f"{sorted({s.model_name for s in remaining})} can never run: no step or "
                    f"ensemble input produces {missing}"
                )
        for out_name, cfg in model.outputs.items():
            if out_name not in produced:
                raise LoadError(
                    f"failed to load '{name}': ensemble output '{out_name}' is produced by no step"
                )
            if produced[out_name] != cfg["data_type"]:
                raise LoadError(
                    f"failed to load '{name}': ensemble output '{out_name}' is "
                    f"{produced[out_name]} where produced but {cfg['data_type']} in the ensemble "
                    "configuration"
                )
        model.steps = order
        model.initialized = True
        return model

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload a model: wait for its running execute, call ``finalize``, drop it.

        ``unload_dependents`` also unloads an ensemble's composing models. Unloading a
        model that is not loaded does nothing.
        """
        with self._load_lock:
            model = self._models.pop(name, None)
            if model is None:
                return
            model.ready = False
            self._states[name] = ("UNLOADING", "", model.version)
            got_lock = model.lock.acquire(timeout=self.instance_wait_timeout)
            try:
                if model.instance is not None and hasattr(model.instance, "finalize"):
                    model.finalizing = True
                    token = _CTX.set(_Ctx(self, model))
                    try:
                        result = model.instance.finalize()
                        if asyncio.iscoroutine(result):
                            result.close()
                    except Exception as exc:  # Triton logs finalize errors and goes on
                        _LOG.error("model '%s' finalize failed: %s", name, exc)
                        with self._record_lock:
                            self.logs.append(
                                LogRecord(name, "ERROR", f"finalize failed: {type(exc).__name__}: {exc}")
                            )
                    finally:
                        _CTX.reset(token)
                model.stop_loop()
                self._drop_modules(model)
                model.instance = None
            finally:
                if got_lock:
                    model.lock.release()
            self._states[name] = ("UNAVAILABLE", "unloaded", model.version)
            if name in self._load_order:
                self._load_order.remove(name)
            if unload_dependents:
                for step_model in {s.model_name for s in model.steps}:
                    self.unload(step_model, unload_dependents=True)

    def close(self) -> None:
        """Unload every model (in reverse load order). The MockTriton is unusable after."""
        if self._closed:
            return
        try:
            with self._load_lock:
                for name in reversed(list(self._load_order)):
                    self.unload(name)
        finally:
            self._closed = True
            with _ACTIVE_LOCK:
                if self in _ACTIVE:
                    _ACTIVE.remove(self)

    def is_model_ready(self, name: str, version: Union[str, int] = "") -> bool:
        """As ``pb_utils.is_model_ready``/the KServe ready endpoint."""
        model = self._models.get(name)
        if model is None or not model.ready:
            return False
        return str(version) in ("", "-1", model.version)

    def repository_index(self) -> List[dict]:
        """Like Triton's repository index: every model directory with its state.

        Items: ``{"name", "version", "state", "reason"}``; ``state`` is ``""`` for
        models never loaded, else ``READY``/``UNAVAILABLE``/``LOADING``/``UNLOADING``.
        """
        names = sorted(p.name for p in self.model_repository.iterdir() if p.is_dir())
        out = []
        for name in names:
            state, reason, version = self._states.get(name, ("", "", ""))
            out.append({"name": name, "version": version, "state": state, "reason": reason})
        return out

    def model_config(self, name: str) -> dict:
        """The configuration dict handed to the loaded model (``json.loads(args["model_config"])``)."""
        model = self._models.get(name)
        if model is None:
            raise KeyError(f"model '{name}' is not loaded")
        return json.loads(model.config_json)

    def instance(self, name: str) -> Any:
        """The ``TritonPythonModel`` object of a loaded Python model (for white-box tests)."""
        model = self._models.get(name)
        if model is None or model.instance is None:
            raise KeyError(f"Python model '{name}' is not loaded")
        return model.instance

    # -- test helpers -----------------------------------------------------------------

    def calls_to(self, model: str) -> List[tuple]:
        """Batch sizes of each ``execute()`` of ``model``, e.g. ``[(2,), (1, 1)]``."""
        with self._record_lock:
            return [c.batch_sizes for c in self.calls if c.model == model]

    def reset_calls(self) -> None:
        with self._record_lock:
            self.calls.clear()

    def _faults_for(self, model: str) -> _Faults:
        with self._record_lock:
            return self._faults.setdefault(model, _Faults())

    def fail_next(self, model: str, message: str = "injected failure", count: int = 1,
                  code: str = "INTERNAL") -> None:
        """Make the next ``count`` requests reaching ``model`` get an error response.

        Applies to every request to that model (client, BLS or ensemble step) that passed
        validation; the model's ``execute`` does not see them. The error text is
        ``message`` (BLS callers see it as ``response.error().message()``).
        """
        faults = self._faults_for(model)
        with self._record_lock:
            faults.fail_next.extend([(message, _ErrorCode[code])] * count)

    def set_failure(self, model: str, failure: Union[None, str, Callable[..., Any]],
                    code: str = "INTERNAL") -> None:
        """Make requests to ``model`` fail until cleared (``failure=None``).

        ``failure`` is a message (every request fails) or a predicate
        ``f(inputs: dict[str, np.ndarray], parameters: dict) -> str | bool | None``: a
        string is the error message, ``True`` a default message, falsy lets it through.
        """
        faults = self._faults_for(model)
        with self._record_lock:
            faults.failure = failure
            faults.failure_code = _ErrorCode[code]

    def set_delay(self, model: str, seconds: Optional[float]) -> None:
        """Sleep ``seconds`` in each ``execute()`` of ``model`` (holding its instance)."""
        faults = self._faults_for(model)
        with self._record_lock:
            faults.delay = float(seconds or 0.0)

    def clear_faults(self, model: Optional[str] = None) -> None:
        with self._record_lock:
            if model is None:
                self._faults.clear()
            else:
                self._faults.pop(model, None)

    def _injected_failure(self, model: str, req: _Req) -> Optional[_Err]:
        with self._record_lock:
            faults = self._faults.get(model)
            if faults is None:
                return None
            if faults.fail_next:
                message, code = faults.fail_next.pop(0)
                return _Err(message, code, "exec")
            failure, code = faults.failure, faults.failure_code
        if failure is None:
            return None
        if isinstance(failure, str):
            return _Err(failure, code, "exec")
        verdict = failure(req.input_dict(), dict(req.parameters))
        if not verdict:
            return None
        if verdict is True:
            verdict = f"injected failure for model '{model}'"
        return _Err(str(verdict), code, "exec")

    def metrics(self) -> Dict[str, Dict[frozenset, Any]]:
        """Custom metric values: ``{family: {frozenset(labels.items()): value}}``.

        Counter and gauge values are floats; a histogram value is a dict
        ``{"count": int, "sum": float, "buckets": {upper_bound: cumulative_count, ...,
        inf: count}}``. A series exists while a ``Metric`` object for it is alive.
        """
        out: Dict[str, Dict[frozenset, Any]] = {}
        with self._metrics.lock:
            for name, family in self._metrics.families.items():
                values: Dict[frozenset, Any] = {}
                for key, series in family.series.items():
                    if family.kind == _MetricKind.HISTOGRAM:
                        assert series.bounds is not None and series.bucket_counts is not None
                        cumulative, buckets = 0, {}
                        for bound, n in zip(series.bounds + [float("inf")], series.bucket_counts):
                            cumulative += n
                            buckets[bound] = cumulative
                        values[key] = {"count": series.count, "sum": series.sum, "buckets": buckets}
                    else:
                        values[key] = series.value
                out[name] = values
        return out

    def metric(self, family: str, labels: Optional[dict] = None) -> Any:
        """One value of :meth:`metrics` (``None`` if absent)."""
        return self.metrics().get(family, {}).get(frozenset((labels or {}).items()))

    # -- inference: client side ---------------------------------------------------------

    @staticmethod
    def _client_tensor(model: str, name: str, array: Any) -> tuple:
        if not isinstance(name, str):
            raise TypeError(f"input names must be str, got {name!r}")
        if not isinstance(array, np.ndarray):
            raise TypeError(
                f"input '{name}' for model '{model}' must be a numpy array, got {type(array)} "
                "(tritonclient's set_data_from_numpy requires one)"
            )
        dtype = _numpy_to_protocol(array.dtype)
        if dtype is None:
            hint = " -- use dtype=object for strings" if array.dtype.kind == "U" else ""
            raise ValueError(
                f"input '{name}': tritonclient cannot send numpy dtype {array.dtype} (got "
                f"unexpected datatype None from numpy array){hint}"
            )
        if dtype == "BYTES":
            return name, dtype, _deserialize(_serialize(array), array.shape)
        return name, dtype, np.array(array, copy=True, order="C")

    @staticmethod
    def _client_parameters(parameters: Optional[dict]) -> dict:
        if parameters is None:
            return {}
        if not isinstance(parameters, dict):
            raise TypeError("parameters must be a dict")
        for key, value in parameters.items():
            if not isinstance(key, str) or not isinstance(value, (bool, int, float, str)):
                raise TypeError(
                    f"parameter {key!r}: KServe request parameters are str keys with bool, "
                    "int, float or str values"
                )
        return dict(parameters)

    def _client_request(self, model: str, inputs: Any, parameters: Any, request_id: Any,
                        outputs: Any) -> _Req:
        if not isinstance(inputs, dict):
            raise TypeError(f"inputs must be a dict of name -> numpy array, got {type(inputs)}")
        if not isinstance(request_id, str):
            raise TypeError("request_id must be str")
        if outputs is not None and (
            isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs)
        ):
            raise TypeError("outputs must be a list of output names")
        tensors = [self._client_tensor(model, n, a) for n, a in inputs.items()]
        return _Req(
            tensors, list(outputs) if outputs else None, self._client_parameters(parameters),
            request_id,
        )

    def _client_model(self, name: str) -> Union[_Model, _Err]:
        self._check_open()
        model = self._models.get(name)
        if model is not None and model.ready:
            return model
        if name in self._states and self._states[name][0] != "":
            return _Err(
                f"Request for unknown model: '{name}' has no available versions",
                _ErrorCode.NOT_FOUND, "notready",
            )
        return _Err(
            f"Request for unknown model: '{name}' is not found", _ErrorCode.INVALID_ARG, "notready"
        )

    @staticmethod
    def _to_client(result: _Result) -> Union[Dict[str, np.ndarray], InferError]:
        if isinstance(result, _Err):
            return InferError(result.message, result.code.name)
        return {name: array for name, _, array in result.outputs}

    def infer(
        self,
        model: str,
        inputs: Dict[str, np.ndarray],
        parameters: Optional[dict] = None,
        request_id: str = "",
        *,
        outputs: Optional[Sequence[str]] = None,
    ) -> Dict[str, np.ndarray]:
        """One inference request, as a client would send it. Raises :class:`InferError`.

        ``inputs``: name -> numpy array (full shape, batch dimension first for batching
        models). ``parameters``: KServe request parameters (str -> bool/int/float/str).
        ``outputs``: output names to request (default: all). Returns name -> numpy array
        (BYTES as object arrays of ``bytes``).
        """
        request = self._client_request(model, inputs, parameters, request_id, outputs)
        target = self._client_model(model)
        if isinstance(target, _Err):
            raise InferError(target.message, target.code.name)
        result = self._to_client(self._run(target, [request])[0])
        if isinstance(result, InferError):
            raise result
        return result

    def infer_batch(self, model: str, requests: Sequence[dict]) -> List[Union[Dict[str, np.ndarray], InferError]]:
        """Send several requests at once, as Triton's dynamic batcher would deliver them.

        Each item is either an inputs dict (name -> numpy array) or
        ``{"inputs": {...}, "parameters": {...}, "request_id": "...", "outputs": [...]}``
        (recognised by an ``"inputs"`` key holding a dict). Returns one item per request:
        an outputs dict or an :class:`InferError` (nothing is raised for error responses).

        Requests that pass validation go to ONE ``execute()`` call when Triton's dynamic
        batcher could batch them: the model has ``dynamic_batching`` and
        ``max_batch_size > 0``, the batch sizes add up to at most ``max_batch_size``, every
        variable-size input without ``allow_ragged_batch`` has the same shape (beyond the
        batch dimension) in all of them, and, for models with optional inputs, they carry
        the same inputs. Otherwise they are split, in order, where the batcher would split
        them (check ``calls``); models without dynamic batching get one request per
        ``execute()``. For an ensemble each request runs through the pipeline separately.
        """
        prepared = [
            self._client_request(model, *_parse_item(item, i)) for i, item in enumerate(requests)
        ]
        target = self._client_model(model)
        if isinstance(target, _Err):
            return [InferError(target.message, target.code.name) for _ in prepared]
        return [self._to_client(r) for r in self._run(target, prepared)]

    # -- inference: BLS -----------------------------------------------------------------

    def _bls_exec(self, request: InferenceRequest) -> InferenceResponse:
        name = request._model_name

        def error(message: str) -> InferenceResponse:
            return InferenceResponse(error=TritonError(message))

        prefix = f"Model {name} - Error when running inference: "
        model = self._models.get(name)
        version = request._model_version
        if (
            self._closed or model is None or not model.ready
            or (version != -1 and str(version) != model.version)
        ):
            return error(
                prefix + f"Failed for execute the inference request. Model '{name}' is not ready."
            )
        req = _Req(
            [(t.name(), t._dtype, t._wire_array()) for t in request._inputs],
            sorted(request._requested) or None,
            json.loads(request._parameters_json),
            request._request_id,
            request._correlation_id,
            request._flags,
            request._timeout,
        )
        result = self._run(model, [req])[0]
        if isinstance(result, _Err):
            message = prefix + result.message if result.stage in ("validation", "notready") else result.message
            return error(message)
        return InferenceResponse([Tensor._wire(n, d, a) for n, d, a in result.outputs])

    # -- inference: the server ----------------------------------------------------------

    def _normalize(self, model: _Model, req: _Req) -> Optional[_Err]:
        """Triton core's InferenceRequest::Normalize (r24.10), in its order."""
        name = model.name
        log = f"[request id: {req.request_id or '<id_unknown>'}] "

        def bad(message: str) -> _Err:
            return _Err(message, _ErrorCode.INVALID_ARG, "validation")

        seen = set()
        for input_name, _, _ in req.inputs:
            if input_name in seen:
                return bad(f"input '{input_name}' already exists in request")
            seen.add(input_name)
        if req.requested:
            for output_name in req.requested:
                if output_name not in model.outputs:
                    return bad(f"unexpected inference output '{output_name}' for model '{name}'")
        n_config = len(model.inputs)
        n_required = sum(1 for i in model.inputs.values() if not i.get("optional"))
        n_given = len(req.inputs)
        if n_given > n_config or n_given < n_required:
            missing = [
                f"'{n}'" for n, i in model.inputs.items() if not i.get("optional") and n not in seen
            ]
            got = "[" + ",".join(f"'{n}'" for n, _, _ in req.inputs) + "]"
            missing_str = "[" + ",".join(missing) + "]"
            if n_config == n_required:
                return bad(
                    f"{log}expected {n_config} inputs but got {n_given} inputs for model "
                    f"'{name}'. Got input(s) {got}, but missing required input(s) "
                    f"{missing_str}. Please provide all required input(s)."
                )
            return bad(
                f"{log}expected number of inputs between {n_required} and {n_config} but got "
                f"{n_given} inputs for model '{name}'. Got input(s) {got}, but missing "
                f"required input(s) {missing_str}. Please provide all required input(s)."
            )
        mbs = model.max_batch_size
        batch = 0
        for input_name, _, array in req.inputs:
            cfg = model.inputs.get(input_name)
            if cfg is None:
                return bad(f"unexpected inference input '{input_name}' for model '{name}'")
            if mbs == 0 or cfg.get("is_shape_tensor"):
                continue
            if array.ndim == 0:
                return bad(
                    f"{log}input '{input_name}' has no shape but model requires batch "
                    f"dimension for '{name}'"
                )
            if batch == 0:
                batch = int(array.shape[0])
            elif int(array.shape[0]) != batch:
                return bad(
                    f"{log}input '{input_name}' batch size does not match other inputs for "
                    f"'{name}'"
                )
        if batch > mbs:
            return bad(f"{log}inference request batch-size must be <= {mbs} for '{name}'")
        model_inputs = []
        for input_name, dtype, array in req.inputs:
            cfg = model.inputs[input_name]
            expected = _CONFIG_TO_PROTOCOL.get(cfg["data_type"], cfg["data_type"])
            if dtype != expected:
                return bad(
                    f"{log}inference input '{input_name}' data-type is '{dtype}', but model "
                    f"'{name}' expects '{expected}'"
                )
            batched = mbs > 0 and not cfg.get("is_shape_tensor")
            shape = list(array.shape[1:]) if batched else list(array.shape)
            dims = [int(d) for d in cfg.get("dims", [])]
            match = len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape))
            if not match:
                full = ([-1] if mbs > 0 else []) + dims
                note = ""
                if mbs > 0:
                    note = (
                        "NOTE: Setting a non-zero max_batch_size in the model config requires a "
                        "batch dimension to be prepended to each input shape. If you want to "
                        "specify the full shape including the batch dim in your input dims "
                        "config, try setting max_batch_size to zero. See the model "
                        "configuration docs for more info on max_batch_size."
                    )
                return bad(
                    f"{log}unexpected shape for input '{input_name}' for model '{name}'. "
                    f"Expected {_dims_str(full)}, got {_dims_str(array.shape)}. {note}"
                )
            if "reshape" in cfg:
                target = [int(d) for d in cfg["reshape"].get("shape", [])]
                variable = iter([s for d, s in zip(dims, shape) if d == -1])
                resolved = [next(variable, -1) if d == -1 else d for d in target]
                lead = [int(array.shape[0])] if batched else []
                array = array.reshape(lead + resolved)
            model_inputs.append((input_name, dtype, array))
        req.batch_size = batch
        req.model_inputs = model_inputs
        return None

    def _run(self, model: _Model, reqs: List[_Req]) -> List[_Result]:
        results: List[Optional[_Result]] = [None] * len(reqs)
        pending: List[int] = []
        for i, req in enumerate(reqs):
            problem = self._normalize(model, req)
            if problem is None:
                problem = self._injected_failure(model.name, req)
            if problem is not None:
                results[i] = problem
            else:
                pending.append(i)
        if model.is_ensemble:
            for i in pending:
                results[i] = self._run_ensemble(model, reqs[i])
        else:
            for batch in self._form_batches(model, pending, reqs):
                for i, result in zip(batch, self._execute(model, [reqs[j] for j in batch])):
                    results[i] = result
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _batch_signature(self, model: _Model, req: _Req) -> tuple:
        signature = []
        for name, _, array in req.model_inputs:
            cfg = model.inputs[name]
            variable = any(int(d) == -1 for d in cfg.get("dims", []))
            if cfg.get("is_shape_tensor") or (variable and not cfg.get("allow_ragged_batch")):
                signature.append((name, tuple(array.shape[1:])))
        if model.has_optional_input:
            signature.append(("__inputs__", tuple(sorted(n for n, _, _ in req.model_inputs))))
        return tuple(sorted(signature))

    def _form_batches(self, model: _Model, indices: List[int], reqs: List[_Req]) -> List[List[int]]:
        if not model.dynamic_batching or model.max_batch_size == 0:
            return [[i] for i in indices]
        batches: List[List[int]] = []
        current: List[int] = []
        current_size = 0
        current_sig: Optional[tuple] = None
        for i in indices:
            size = max(1, reqs[i].batch_size)
            sig = self._batch_signature(model, reqs[i])
            if current and (current_size + size > model.max_batch_size or sig != current_sig):
                batches.append(current)
                current, current_size = [], 0
            if not current:
                current_sig = sig
            current.append(i)
            current_size += size
        if current:
            batches.append(current)
        return batches

    def _execute(self, model: _Model, reqs: List[_Req]) -> List[_Result]:
        n = len(reqs)
        if not model.lock.acquire(timeout=self.instance_wait_timeout):
            err = _Err(
                f"mock_triton: waited {self.instance_wait_timeout}s for the instance of model "
                f"'{model.name}' (deadlock? e.g. a model calling itself)",
                _ErrorCode.UNAVAILABLE, "exec",
            )
            return [err] * n
        try:
            if not model.ready or model.instance is None:
                err = _Err(
                    f"Request for unknown model: '{model.name}' has no available versions",
                    _ErrorCode.NOT_FOUND, "exec",
                )
                return [err] * n
            with self._record_lock:
                delay = self._faults[model.name].delay if model.name in self._faults else 0.0
            if delay > 0:
                time.sleep(delay)
            with self._record_lock:
                self.calls.append(Call(model.name, tuple(max(1, r.batch_size) for r in reqs)))
            requests = [InferenceRequest._for_execute(model, r) for r in reqs]
            try:
                returned = self._call_execute(model, requests)
                responses = self._collect_responses(model, requests, returned)
            except _BatchFailure as failure:
                return [self._batch_error(model, failure.message)] * n
            except Exception as exc:
                return [self._batch_error(model, _format_exception(exc))] * n
            results: List[_Result] = []
            for req, response in zip(reqs, responses):
                if isinstance(response, _Err):
                    results.append(response)
                elif response.has_error():
                    error = response.error()
                    assert error is not None
                    results.append(_Err(error.message(), error.code(), "exec"))
                else:
                    results.append(self._finish_outputs(model, req, response))
            return results
        finally:
            model.lock.release()

    def _batch_error(self, model: _Model, message: str) -> _Err:
        text = f"Failed to process the request(s) for model '{model.instance_name}', message: {message}"
        _LOG.info("%s", text)
        return _Err(text, _ErrorCode.INTERNAL, "exec")

    def _call_execute(self, model: _Model, requests: List[InferenceRequest]) -> Any:
        token = _CTX.set(_Ctx(self, model))
        try:
            if not hasattr(model.instance, "execute"):
                raise _BatchFailure(
                    f"Python model {model.model_py} does not implement `execute` method."
                )
            returned = model.instance.execute(requests)
            if asyncio.iscoroutine(returned):
                future = asyncio.run_coroutine_threadsafe(returned, model.loop())
                returned = future.result()
            return returned
        finally:
            _CTX.reset(token)

    @staticmethod
    def _collect_responses(model: _Model, requests: List[InferenceRequest], returned: Any) -> List[Any]:
        """Stub's ProcessReturnedResponses: checks, then one response per request."""
        if returned is not None:
            if not isinstance(returned, list):
                raise _BatchFailure(
                    f"Expected a list in the execute return, found type '{type(returned)}'."
                )
            if len(returned) != len(requests):
                raise _BatchFailure(
                    "Number of InferenceResponse objects do not match the number of "
                    f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, "
                    f"and InferenceResponse(s) size is:{len(returned)}\n"
                )
            for request, response in zip(requests, returned):
                if response is None:
                    continue
                if not isinstance(response, InferenceResponse):
                    raise _BatchFailure(
                        "Expected an 'InferenceResponse' object in the execute function "
                        f"return list, found type '{type(response)}'."
                    )
                try:
                    request._sender._update(response, _FINAL)
                except TritonModelException as exc:
                    raise _BatchFailure(str(exc)) from exc
        out: List[Any] = []
        for i, request in enumerate(requests):
            response = returned[i] if returned is not None else None
            if response is not None:
                out.append(response)
                continue
            sender = request._sender
            if sender._responses and sender._closed:
                out.append(sender._responses[0])
            elif sender._responses:
                out.append(_Err(
                    f"mock_triton: model '{model.name}' sent a response for request {i} "
                    "through its response sender but never sent "
                    "TRITONSERVER_RESPONSE_COMPLETE_FINAL (real Triton keeps the request open)",
                    _ErrorCode.INTERNAL, "exec",
                ))
            else:
                out.append(_Err(
                    f"mock_triton: model '{model.name}' returned no response for request {i} "
                    "(None in the execute return and nothing sent through its response "
                    "sender); real Triton never answers such a request and the client waits "
                    "until it times out",
                    _ErrorCode.INTERNAL, "exec",
                ))
        return out

    def _finish_outputs(self, model: _Model, req: _Req, response: InferenceResponse) -> _Result:
        """Prune to the requested outputs (as the stub does) and run the strict checks."""
        requested = set(req.requested) if req.requested else set(model.outputs)
        outputs = []
        seen = set()
        note = (
            " [mock_triton strict_outputs check; real Triton 24.10 does not check this -- "
            "pass strict_outputs=False to mirror it]"
        )
        for tensor in response.output_tensors():
            name = tensor.name()
            cfg = model.outputs.get(name)
            if self.strict_outputs and cfg is None:
                return _Err(
                    f"model '{model.name}' returned output '{name}', which is not in its "
                    "configuration (real Triton drops it silently)" + note,
                    _ErrorCode.INTERNAL, "exec",
                )
            if name not in requested:
                continue
            assert cfg is not None
            if name in seen and self.strict_outputs:
                return _Err(
                    f"model '{model.name}' returned output '{name}' more than once" + note,
                    _ErrorCode.INTERNAL, "exec",
                )
            seen.add(name)
            array = tensor._wire_array()
            expected = _CONFIG_TO_PROTOCOL.get(cfg["data_type"], cfg["data_type"])
            model_dims = [int(d) for d in (cfg["reshape"].get("shape", []) if "reshape" in cfg else cfg.get("dims", []))]
            batched = model.max_batch_size > 0
            if self.strict_outputs:
                if tensor._dtype != expected:
                    return _Err(
                        f"model '{model.name}' returned output '{name}' with datatype "
                        f"{tensor._dtype}, but its configuration declares {cfg['data_type']} "
                        f"({expected})" + note,
                        _ErrorCode.INTERNAL, "exec",
                    )
                full = ([max(1, req.batch_size)] if batched else []) + model_dims
                shape = list(array.shape)
                if len(shape) != len(full) or any(e != -1 and e != s for e, s in zip(full, shape)):
                    shown = ([-1] if batched else []) + model_dims
                    return _Err(
                        f"model '{model.name}' returned output '{name}' with shape "
                        f"{_dims_str(shape)}, but its configuration says {_dims_str(shown)} "
                        f"(batch size of the request: {max(1, req.batch_size)})" + note,
                        _ErrorCode.INTERNAL, "exec",
                    )
            if "reshape" in cfg:
                dims = [int(d) for d in cfg.get("dims", [])]
                lead = [int(array.shape[0])] if batched and array.ndim > 0 else []
                if dims.count(-1) <= 1:
                    try:
                        array = array.reshape(lead + dims)
                    except ValueError:
                        pass
            outputs.append((name, tensor._dtype, array))
        return _Ok(outputs)

    def _run_ensemble(self, ensemble: _Model, req: _Req) -> _Result:
        tensors: Dict[str, tuple] = {name: (dtype, array) for name, dtype, array in req.inputs}
        for step in ensemble.steps:
            sub = self._models.get(step.model_name)
            if sub is None or not sub.ready or (
                step.model_version != -1 and str(step.model_version) != sub.version
            ):
                return _Err(
                    f"Request for unknown model: '{step.model_name}' has no available versions",
                    _ErrorCode.NOT_FOUND, "exec",
                )
            absent = [v for v in step.input_map.values() if v not in tensors]
            if absent:
                return _Err(
                    f"in ensemble '{ensemble.name}', tensor(s) {absent} needed by model "
                    f"'{step.model_name}' are not available (optional ensemble inputs that "
                    "were not sent are not supported by the mock)",
                    _ErrorCode.INVALID_ARG, "exec",
                )
            sub_req = _Req(
                [(k, tensors[v][0], tensors[v][1]) for k, v in step.input_map.items()],
                list(step.output_map.keys()),
                dict(req.parameters),
                req.request_id,
                req.correlation_id,
                req.flags,
                req.timeout,
            )
            result = self._run(sub, [sub_req])[0]
            if isinstance(result, _Err):
                return _Err(result.message, result.code, "exec")
            produced = {name: (dtype, array) for name, dtype, array in result.outputs}
            for model_output, tensor in step.output_map.items():
                if model_output not in produced:
                    return _Err(
                        f"in ensemble '{ensemble.name}', model '{step.model_name}' did not "
                        f"return output '{model_output}' (ensemble tensor '{tensor}')",
                        _ErrorCode.INTERNAL, "exec",
                    )
                tensors[tensor] = produced[model_output]
        wanted = req.requested or list(ensemble.outputs)
        return _Ok([(name, tensors[name][0], tensors[name][1]) for name in wanted])

    def __repr__(self) -> str:
        loaded = ", ".join(sorted(self._models))
        return f"MockTriton({str(self.model_repository)!r}, loaded=[{loaded}])"
