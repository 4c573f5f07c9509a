"""What the mock server passes around: requests as Triton holds them, results, and what
it records (each ``execute()`` call, ``pb_utils.Logger`` messages, model states) in a
:class:`Recorder` handed to the parts that write them."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from orchestrator.testing.mock.errors import ErrorCode, InferError


class Call(NamedTuple):
    """One ``execute()`` call: the model and the batch size of each request in it
    (the first dimension; 1 for models with ``max_batch_size: 0``).

    Compares equal to a plain tuple: ``Call("add_one", (2, 1)) == ("add_one", (2, 1))``.
    """

    model: str
    batch_sizes: tuple

    @property
    def requests(self) -> int:
        """How many requests the call got."""
        return len(self.batch_sizes)


class LogRecord(NamedTuple):
    """One ``pb_utils.Logger`` message: the model it came from (None outside models)."""

    model: Optional[str]
    level: str
    message: str


class TraceRecord(NamedTuple):
    """One traced request, as Triton's trace file (``--trace-config mode=triton``) names it
    at REQUEST_START: its trace ``id``, ``parent_id`` (the trace of the request whose BLS
    call it is; 0: a client request), the ``model`` and the ``request_id``."""

    id: int
    parent_id: int
    model: str
    request_id: str


class Recorder:
    """What one server records, thread-safe: ``calls`` (:class:`Call`), ``logs``
    (:class:`LogRecord`; VERBOSE ones only when ``log_verbose`` > 0, as Triton's
    ``--log-verbose``) and each model's ``(state, reason, version)``."""

    def __init__(self, log_verbose: int = 0):
        self.log_verbose = log_verbose
        self.lock = threading.Lock()
        self.calls: List[Call] = []
        self.logs: List[LogRecord] = []
        self.states: Dict[str, Tuple[str, str, str]] = {}
        self.traces: List[TraceRecord] = []

    def trace(self, record: TraceRecord) -> None:
        with self.lock:
            self.traces.append(record)

    def call(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def log(self, record: LogRecord) -> bool:
        """Keep ``record`` unless Triton would drop it; True when kept."""
        if record.level == "VERBOSE" and self.log_verbose <= 0:
            return False
        with self.lock:
            self.logs.append(record)
        return True

    def set_state(self, name: str, state: str, reason: str = "", version: str = "") -> None:
        with self.lock:
            self.states[name] = (state, reason, version)

    def state(self, name: str) -> Tuple[str, str, str]:
        """``(state, reason, version)``; ``("", "", "")`` for a model never loaded."""
        with self.lock:
            return self.states.get(name, ("", "", ""))


class Req:
    """A request inside the server (already converted to what Triton would hold).

    ``inputs``: ``[(name, protocol datatype, array)]`` as sent; ``model_inputs``: the
    same after validation (reshaped where the config says ``reshape``); ``batch_size``:
    the first dimension for batching models, else 0 (set by validation).
    """

    __slots__ = (
        "inputs", "requested", "parameters", "request_id", "correlation_id", "flags",
        "timeout", "batch_size", "model_inputs", "trace",
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
        self.inputs = inputs
        self.requested = requested or None
        self.parameters = parameters
        self.request_id = request_id
        self.correlation_id = correlation_id
        self.flags = flags
        self.timeout = timeout
        self.batch_size = 0
        self.model_inputs: List[tuple] = []
        self.trace: Any = None  # its pb_utils.InferenceTrace when traced (MockTriton(trace_rate=...))

    def input_dict(self) -> Dict[str, np.ndarray]:
        return {name: array for name, _, array in self.inputs}

    def derived(self, inputs: List[tuple], requested: Optional[List[str]]) -> "Req":
        """A request with the same parameters, id, correlation id, flags and timeout
        (what an ensemble sends to a composing model)."""
        return Req(
            inputs, requested, dict(self.parameters), self.request_id, self.correlation_id,
            self.flags, self.timeout,
        )


class Ok(NamedTuple):
    outputs: List[tuple]  # [(name, protocol dtype, array)]
    parameters: Dict[str, Any] = {}  # the response's KServe parameters (release profiles with them)


class Err(NamedTuple):
    """An error result. ``stage``: ``"notready"`` (no such model), ``"validation"``
    (the core refused the request) or ``"exec"`` (the model or a fault failed it); BLS
    callers see the first two behind a "Model <name> - Error when running inference: "
    prefix."""

    message: str
    code: ErrorCode
    stage: str


Result = Union[Ok, Err]


def to_client(result: Result) -> Union[Dict[str, np.ndarray], InferError]:
    """What a client gets: name -> array, or the error response."""
    if isinstance(result, Err):
        return InferError(result.message, result.code.name)
    return {name: array for name, _, array in result.outputs}


class BatchFailure(Exception):
    """The whole ``execute()`` failed (every request of the batch gets ``message``)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
