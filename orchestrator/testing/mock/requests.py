"""``pb_utils.InferenceRequest``/``InferenceResponse`` and the response sender (r24.10).

Errors of a BLS call are *responses* (``response.has_error()``), never exceptions, as in
the stub's ``RequestExecutor``; argument errors raise ``TypeError`` (pybind11's
"incompatible constructor arguments") or ``TritonModelException`` where the stub does.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Union

from orchestrator.testing.mock.context import CTX, current_features, current_server
from orchestrator.testing.mock.errors import TritonError, TritonModelException, as_str, incompatible
from orchestrator.testing.mock.releases import RESPONSE_PARAMETERS
from orchestrator.testing.mock.tensors import PreferredMemory, Tensor

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.testing.mock.instances import LoadedModel
    from orchestrator.testing.mock.records import Req


class InferenceTrace:
    """Mirror of ``pb_utils.InferenceTrace``: ``get_context()`` only (r24.10 ``pb_stub.cc``).

    ``InferenceTrace()`` is the stub's default: no Triton trace behind it (a request that
    was not sampled, or tracing off), so a BLS call given it is not traced. A sampled
    request's trace (``MockTriton(trace_rate=...)``) has an id; in ``opentelemetry`` mode
    its context is the W3C ``traceparent`` JSON Triton's tracer sets at REQUEST_START
    (server r24.10 ``PrepareTraceContext``), in ``triton`` mode None, as in Triton.
    """

    def __init__(self) -> None:
        self._id = 0  # Triton's trace id; 0: no trace (Triton reserves 0 for "no parent")
        self._root = 0  # the id of the client request's trace this one descends from
        self._context: Optional[str] = None

    @classmethod
    def _traced(cls, trace_id: int, root: int, opentelemetry: bool) -> "InferenceTrace":
        trace = cls()
        trace._id, trace._root = trace_id, root
        if opentelemetry:
            trace._context = json.dumps({"traceparent": f"00-{root:032x}-{trace_id:016x}-01"}, separators=(",", ":"))
        return trace

    def get_context(self) -> Optional[str]:
        return self._context


FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
_RELEASE_ALL = 1
_RELEASE_RESCHEDULE = 2


class InferenceResponseSender:
    """Response sender of a request (r24.10 ``response_sender.cc``).

    In a non-decoupled model its one response answers the request even when sent after
    ``execute`` returned (from another thread), as in Triton 2.51; the frontends hold it
    until the final flag comes (with it, sent alone, or as the error response of a failed
    ``execute``: then the request had two responses). In a decoupled model (``decoupled=True``) every ``send`` goes to the
    request's stream at once (``sink(response, flags)``), any number of them, until one
    carries ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; a send after that raises. When
    ``execute`` fails, the stub closes every sender of the batch (later sends raise).
    """

    def __init__(self, requested_output_names: Optional[set], usable: bool,
                 decoupled: bool = False,
                 sink: Optional[Callable[[Optional["InferenceResponse"], int], None]] = None):
        self._usable = usable
        self._decoupled = decoupled
        self._sink = sink
        self._responses: List[Optional["InferenceResponse"]] = []
        self._first_final = False  # the first response carried COMPLETE_FINAL
        self._count = 0
        self._closed = False
        self._lock = threading.Lock()
        self._send_lock = threading.RLock()  # keeps a stream's responses in send order
        self._done = threading.Event()  # set with TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._any = threading.Event()  # set with the first response

    def _update(self, response: Optional["InferenceResponse"], flags: int) -> None:
        if not self._usable:
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to the "
                "decoupled state of the model."
            )
        with self._lock:
            if not self._decoupled:
                if response is not None and self._count > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than "
                        "one response."
                    )
                if response is None and flags == FINAL and self._count == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete "
                        "final before sending a response."
                    )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if flags == FINAL:
                self._closed = True
            self._count += 1

    def send(self, response: Optional["InferenceResponse"] = None, flags: int = 0) -> None:
        if flags != FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is "
                "set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError("send(): response must be an InferenceResponse or None")
        with self._send_lock:
            self._update(response, flags)
            if self._decoupled and self._sink is not None:
                self._sink(response, flags)
                return
        if response is not None:
            if not self._responses:
                self._first_final = flags == FINAL
            self._responses.append(response)
            self._any.set()
        if self._closed:
            self._done.set()

    def _close(self) -> bool:
        """Close the sender as the stub does after a failed ``execute``; True when it was
        still open (its request has not had its final response)."""
        with self._send_lock, self._lock:
            was_open = not self._closed
            self._closed = True
            return was_open

    def _sent(self) -> Optional["InferenceResponse"]:
        """The (first) response sent, final or not; None when none was."""
        with self._lock:
            return self._responses[0] if self._responses else None

    def _first(self, wait: float = 0.0) -> Optional["InferenceResponse"]:
        """The first response sent, waiting up to ``wait`` seconds for it (or for the
        final flag without one); None when there is none (yet)."""
        if wait > 0 and not self._any.is_set() and not self._done.is_set():
            deadline = time.monotonic() + wait
            while not (self._any.wait(0.01) or self._done.is_set()) and time.monotonic() < deadline:
                pass
        return self._sent()

    def _final(self, wait: float = 0.0) -> Optional["InferenceResponse"]:
        """The response sent with (or before) COMPLETE_FINAL, waiting up to ``wait``
        seconds for it; None when there is none (yet)."""
        if wait > 0:
            self._done.wait(wait)
        with self._lock:
            return self._responses[0] if self._closed and self._responses else None

    def is_cancelled(self) -> bool:
        return False


_REQUIRED: Any = object()
_DEFAULT_MEMORY: Any = object()
_SIGNATURE = (
    "c_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, "
    "inputs: List[triton::backend::python::PbTensor], requested_output_names: List[str], "
    "model_name: str, model_version: int = -1, flags: int = 0, timeout: int = 0, "
    "preferred_memory: c_python_backend_utils.PreferredMemory = ..., "
    "trace: c_python_backend_utils.InferenceTrace = ..., parameters: object = None)"
)


def _bad_arguments(detail: str) -> TypeError:
    """pybind11's refusal of the constructor's arguments (the stub declares every
    argument but ``parameters`` ``.none(false)``; ``str`` ones also take ``bytes``)."""
    return incompatible("__init__", _SIGNATURE, detail, constructor=True)


class InferenceRequest:
    """Mirror of ``pb_utils.InferenceRequest`` (r24.10 signature).

    ``InferenceRequest(request_id="", correlation_id=0, inputs=..., requested_output_names=...,
    model_name=..., model_version=-1, flags=0, timeout=0, preferred_memory=..., trace=...,
    parameters=None)``. As in r24.10, ``parameters`` must be a ``dict`` (keys ``str``,
    values ``bool``/``int``/``str``) or ``None``: a JSON string raises
    ``TritonModelException`` (older releases accepted one). ``exec()`` returns an
    ``InferenceResponse`` (errors are *responses*, not exceptions); ``async_exec()``
    returns an awaitable (it must be called inside a running event loop). BLS from
    ``initialize``/``finalize`` raises ``TritonModelException``. Arguments pybind11
    refuses (``None`` where the stub declares ``.none(false)``, wrong types) raise
    ``TypeError`` with pybind's "incompatible constructor arguments" text; ``str``
    arguments also take ``bytes`` (UTF-8), as in the stub.

    Requests handed to ``execute`` are instances of this class too;
    ``requested_output_names()`` returns a ``set`` (pybind converts the C++ ``std::set``)
    holding every configured output when the client asked for none, and ``inputs()``
    lists the inputs in the client's order (Triton's order is unspecified -- use
    ``get_input_tensor_by_name``).
    """

    def __init__(  # noqa: C901 (one check per InferenceRequest argument, in r24.10's order)
        self,
        request_id: str = "",
        correlation_id: Union[int, str] = 0,
        inputs: Sequence[Tensor] = _REQUIRED,
        requested_output_names: Sequence[str] = _REQUIRED,
        model_name: str = _REQUIRED,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Optional[PreferredMemory] = _DEFAULT_MEMORY,
        trace: Optional[InferenceTrace] = None,
        parameters: Optional[dict] = None,
    ):
        model_name, request_id = as_str(model_name), as_str(request_id)
        missing = [
            n for n, v in (("inputs", inputs), ("requested_output_names", requested_output_names),
                           ("model_name", model_name)) if v is _REQUIRED
        ]
        if missing:
            raise _bad_arguments("missing " + ", ".join(missing))
        if not isinstance(request_id, str):
            raise _bad_arguments(f"request_id={request_id!r}")
        if correlation_id is None:
            raise _bad_arguments("correlation_id=None")
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, (list, tuple)) or not all(
            isinstance(t, Tensor) for t in inputs
        ):
            raise _bad_arguments(f"inputs={inputs!r}")
        names = requested_output_names
        if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple, set)):
            raise _bad_arguments(f"requested_output_names={names!r}")
        names = [as_str(n) for n in names]
        if not all(isinstance(n, str) for n in names):
            raise _bad_arguments(f"requested_output_names={requested_output_names!r}")
        requested_output_names = names
        if not isinstance(model_name, str):
            raise _bad_arguments(f"model_name={model_name!r}")
        for label, value in (("model_version", model_version), ("flags", flags), ("timeout", timeout)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad_arguments(f"{label}={value!r}")
        if preferred_memory is _DEFAULT_MEMORY:  # the stub's PreferredMemory(kDefault, 0): the producer's memory
            preferred_memory = None
        elif not isinstance(preferred_memory, PreferredMemory):  # None included (.none(false))
            raise _bad_arguments(f"preferred_memory={preferred_memory!r}")
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
    def _for_execute(cls, model: "LoadedModel", req: "Req",
                     sink: Optional[Callable[[Optional["InferenceResponse"], int], None]] = None,
                     ) -> "InferenceRequest":
        """The request ``execute`` gets; ``sink`` receives what its sender sends when
        ``model`` is decoupled."""
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
        request._trace = req.trace if req.trace is not None else InferenceTrace()
        request._parameters_json = json.dumps(req.parameters, separators=(",", ":"))
        request._sender = InferenceResponseSender(
            request._requested, usable=True, decoupled=model.decoupled, sink=sink
        )
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
        ctx = CTX.get()
        server = ctx.server if ctx is not None else current_server()
        caller = ctx.model if ctx is not None else None
        if caller is not None and (not caller.initialized or caller.finalizing):
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        # decoupled: a ResponseIterator (returned once the first response is there)
        return server.bls_exec(self, bool(decoupled))

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
    """Mirror of ``pb_utils.InferenceResponse``: r24.10 ``(output_tensors=[], error=None)``;
    with the ``response_parameters`` feature of the server's release profile (python_backend
    r25.02, PR #394) also ``parameters=None`` (a dict: ``str`` keys, ``bool``/``int``/``str``
    values) and ``parameters()`` (the JSON text). Without the feature ``parameters=`` raises
    pybind's ``TypeError``, as the r24.10 stub does."""

    def __init__(self, output_tensors: Sequence[Tensor] = (), error: Optional[TritonError] = None,
                 **kwargs: Any):
        if kwargs and (set(kwargs) != {"parameters"} or RESPONSE_PARAMETERS not in current_features()):
            raise incompatible(
                "__init__",
                "c_python_backend_utils.InferenceResponse(output_tensors: "
                "List[triton::backend::python::PbTensor], error: c_python_backend_utils.TritonError = None)",
                ", ".join(f"{k}={v!r}" for k, v in kwargs.items()), constructor=True,
            )
        parameters = kwargs.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
        for key, value in parameters.items():
            if not isinstance(key, str):
                raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
            if not isinstance(value, (bool, int, str)):
                raise TritonModelException(
                    f"Expect parameters values to have type bool/int/str, found type {type(value)}")
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
        self._parameters = dict(parameters)

    def output_tensors(self) -> List[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> Optional[TritonError]:
        return self._error

    def __getattr__(self, name: str) -> Any:
        # parameters() exists only from r25.02 on (the release profile's feature)
        if name == "parameters" and RESPONSE_PARAMETERS in current_features():
            return lambda: json.dumps(self._parameters)
        raise AttributeError(f"'InferenceResponse' object has no attribute '{name}'")

    def __repr__(self) -> str:
        if self._error is not None:
            return f"InferenceResponse(error={self._error!r})"
        return f"InferenceResponse({self._outputs!r})"
