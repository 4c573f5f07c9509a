"""One request, as the router receives it, runs it and answers it.

- What a client sent, parsed and validated (:func:`parse_request` -> :class:`Work`), and the
  input checks the tokenizer and postprocess models share with the router. Every check
  raises :class:`InputError` whose message names the input (and the element index where one
  element is at fault) and says what was wrong, so that the Python-backend models can turn
  it into a per-request ``INVALID_ARG`` error instead of failing the batch.
- What a request brings besides its inputs (:class:`RequestContext`: trace, deadline,
  ``is_cancelled``), what one BLS call carries for it (:class:`CallOptions`, the trace picked
  by :func:`call_trace`), and the deadline arithmetic (:class:`Deadlines`: the engine clock,
  node cost estimates, the only reader and writer of a context's flags ``started``,
  ``cancelled``, ``late``, ``early``; docs/guides/reliability.md). Nodes use it through
  ``nodes.base.DeadlineView`` (``engine.deadlines``): before a further stage or round they
  ask :meth:`Deadlines.live` (once per stage) and :meth:`Deadlines.affordable`.
- What it gets back (:class:`Result`).

Inputs (full shapes, batch first):
    TEXT       TYPE_STRING [N, 1]  UTF-8 texts
    THRESHOLD  FP32        [N, 1]  decision threshold per text, a probability in [0, 1];
                           [N, K]  or one per label (multiclass and multilabel heads)
Request parameters (KServe v2 ``parameters``): the ones the policy declares in
``request_parameters`` (``route`` in the shipped policy) and ``describe_policy``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Protocol, Sequence, Set, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import DeadlineExceeded, InputError, LimitError, RequestCancelled, RequestStopped
from orchestrator.runtime.metrics import Metrics

if TYPE_CHECKING:  # nodes.base's Item carries a RequestContext: the types only, no import circle
    from orchestrator.runtime.routing.nodes.base import Answers, Item, Node

__all__ = [
    "InputError", "decode_texts", "check_thresholds", "request_parameters", "parse_bool", "config_parameters",
    "Work", "Result", "Limits", "check_sizes", "check_parameters", "parse_request", "policy_path",
    "RequestContext", "CallOptions", "call_trace", "Deadlines", "DEADLINE_SUFFIX",
]


#: Added to the ``ROUTE`` of a text answered by an earlier stage because of its request's
#: deadline (``classifier_fast:deadline``; docs/guides/reliability.md "Deadlines").
DEADLINE_SUFFIX = ":deadline"

def never_cancelled() -> bool:
    """``is_cancelled`` of a request that is never asked: always False (warmup, tests, a
    policy with ``check_cancelled: false``)."""
    return False


class Cancellable(Protocol):
    """What :meth:`Deadlines.ask_cancelled` reads and sets: a text request's
    :class:`RequestContext` or a pipeline's ``execution.pipeline.Req``."""

    started: bool
    cancelled: bool

    @property
    def is_cancelled(self) -> Callable[[], bool]: ...


@dataclass
class RequestContext:
    """What a request brings besides its inputs, for every downstream call made for it.

    Attributes:
        trace: the request's ``pb_utils.InferenceTrace`` (``request.trace()``), passed on as
            ``InferenceRequest(trace=...)`` so a Triton trace follows the request downstream;
            None: none (warmup, tests).
        deadline: the engine clock's seconds (``Engine.clock``, ``time.monotonic`` in the
            router) at which the client's timeout (``request.timeout()``, microseconds;
            0: none) ends, counted from the start of the router's ``execute`` (the stub
            cannot see when Triton received the request, so the time it waited in the
            router's queue is not deducted); None: no timeout. docs/guides/reliability.md
            "Deadlines".
        is_cancelled: ``request.is_cancelled()``: True once the client cancelled the request
            (an IPC round trip to the Triton process in the real stub; the engine asks it
            only through ``Deadlines.live``).
        started: a downstream call was made for the request (set by the engine; before it,
            the request has just arrived and ``is_cancelled`` is not asked).
        cancelled: ``is_cancelled()`` said True (kept: the flag never goes back to False).
        late: a downstream answer for the request arrived at or after its deadline.
        early: a later stage was skipped or its late answer dropped for the deadline, and
            the request's answers come from an earlier stage that ended in time (a late
            request that is not ``early`` gets ``DeadlineExceeded``).
    """

    trace: Any = None
    deadline: Optional[float] = None
    is_cancelled: Callable[[], bool] = never_cancelled
    started: bool = False
    cancelled: bool = False
    late: bool = False
    early: bool = False


def call_trace(contexts: Sequence[RequestContext]) -> Any:
    """The one trace a downstream call carries for rows of several requests.

    A BLS request carries one trace (python_backend r24.10 ``InferenceRequest(trace=...)``;
    the stub's ``RequestExecutor`` spawns the call's trace as a child of it with
    ``TRITONSERVER_InferenceTraceSpawnChildTrace``), so a call that batches rows of several
    requests is traced under ONE of them: the first, in row order, whose trace has a context
    (``get_context()`` is not None: in ``opentelemetry`` mode, a sampled request), else the
    first request's trace. The other requests' traces get no span for that call: they show
    the router's own spans only, never a span under the wrong parent. In ``triton`` mode
    ``get_context()`` is None for every request (sampled or not), so with ``rate`` above 1
    a batched call is traced only when the first request of its rows was sampled
    (docs/reference/metrics.md, "Tracing").

    Args:
        contexts: the contexts of the call's rows, in row order (repeats allowed).

    Returns:
        a ``pb_utils.InferenceTrace``, or None when no row has one.
    """
    traces = [c.trace for c in {id(c): c for c in contexts}.values() if c.trace is not None]
    for trace in traces:
        get_context = getattr(trace, "get_context", None)
        if callable(get_context) and get_context() is not None:
            return trace
    return traces[0] if traces else None


@dataclass(frozen=True)
class CallOptions:
    """What one downstream (BLS) call carries besides its inputs.

    Attributes:
        trace: the ``pb_utils.InferenceTrace`` to pass as ``InferenceRequest(trace=...)``;
            None: none.
        timeout_us: ``InferenceRequest(timeout=...)``, microseconds; 0: no timeout.
    """

    trace: Any = None
    timeout_us: int = 0


# Request parameter that asks for the optional POLICY output (``orchestrator policy show``).
DESCRIBE_PARAMETER = "describe_policy"
POLICY_OUTPUT = "POLICY"


@dataclass
class Work:
    """One request's validated input.

    Attributes:
        texts: N strings.
        thresholds: float32 [N, 1] or [N, C] (one per label), each in [0, 1].
        parameters: the request's parameters (``describe_policy`` removed).
        request_id: Triton's request id (may be empty).
        describe: the request asked for the POLICY output.
        outputs: the outputs the client named, when it named a subset (None: all); the
            router builds only these (Triton drops the others from the response anyway).
        context: its trace, deadline and cancellation (:class:`RequestContext`).
    """

    texts: List[str]
    thresholds: NDArray[Any]
    parameters: Mapping[str, object]
    request_id: str = ""
    describe: bool = False
    outputs: Optional[FrozenSet[str]] = None
    context: RequestContext = field(default_factory=RequestContext)


@dataclass
class Result:
    """One request's answer: PROBABILITIES float32 [N, C], VERDICTS bool [N, C], ROUTE [N]
    (C: the policy head's columns, ``heads.Head.columns``)."""

    probabilities: NDArray[Any]
    verdicts: NDArray[Any]
    routes: List[str]


@dataclass(frozen=True)
class Limits:
    """Input sizes the router accepts (the policy's ``limits`` block).

    A request over a limit gets INVALID_ARG naming the text, its size and the limit; the
    byte limits are checked before anything is decoded or tokenized, so rejected input
    costs no tokenizer or model time and leaves no memory behind.

    The field defaults below are the policy keys' defaults (``policy.LIMITS`` reads them;
    docs/reference/policy.md shows them with each key's meaning).

    Attributes:
        max_text_bytes: UTF-8 bytes per text (the demo corpus's longest text has 855 bytes).
        max_request_bytes: UTF-8 bytes of all texts of one request.
        max_windows_per_text: windows a ``chunk`` node may make of one text, which bounds a
            text's model time.
    """

    max_text_bytes: int = 65536
    max_request_bytes: int = 4 * 1024 * 1024
    max_windows_per_text: int = 256


def check_sizes(texts_array: NDArray[Any], limits: Limits, name: str = "TEXT") -> None:
    """Refuse texts over the byte limits before decoding them.

    Raises:
        InputError: a text over ``max_text_bytes`` (the first one, by index) or all texts
            together over ``max_request_bytes``.
    """
    total = 0
    for i, item in enumerate(np.asarray(texts_array).reshape(-1)):
        size = len(item) if isinstance(item, (bytes, bytearray, np.bytes_)) else len(str(item).encode("utf-8"))
        if size > limits.max_text_bytes:
            raise LimitError(
                f"{name}[{i}]: {size} bytes, over the limit of {limits.max_text_bytes} bytes per text (policy limits.max_text_bytes)",
                "max_text_bytes",
            )
        total += size
    if total > limits.max_request_bytes:
        raise LimitError(
            f"{name}: {total} bytes in all texts, over the limit of {limits.max_request_bytes} bytes per request "
            "(policy limits.max_request_bytes)",
            "max_request_bytes",
        )


def check_parameters(parameters: Mapping[str, object], exposed: Mapping[str, Sequence[str]], ignored: Sequence[str]) -> Dict[str, object]:
    """The request parameters the policy declares, validated; ``describe_policy`` and
    parameters matching an ``ignored`` pattern are dropped.

    Triton's own request parameters (``priority``, ``timeout``, ``sequence_id`` ...) never
    reach a model's ``parameters()``: Triton consumes them.

    Raises:
        InputError: a parameter the policy neither declares nor ignores, or a declared one
            with a value the policy does not offer.
    """
    accepted = {}
    for name, value in parameters.items():
        if name in exposed:
            if str(value) not in exposed[name]:
                raise InputError(
                    f"parameter {name}={value!r}: not a route this policy exposes (choose one of: {', '.join(exposed[name])})"
                )
            accepted[name] = value
        elif name != DESCRIBE_PARAMETER and not any(fnmatch.fnmatchcase(name, p) for p in ignored):
            known = ", ".join(sorted(set(exposed) | {DESCRIBE_PARAMETER}))
            raise InputError(f"parameter {name!r}: not a parameter of this router (it accepts: {known})")
    return accepted


def parse_request(
    texts_array: Optional[NDArray[Any]],
    thresholds_array: Optional[NDArray[Any]],
    parameters: Optional[Mapping[str, object]] = None,
    exposed: Optional[Mapping[str, Sequence[str]]] = None,
    request_id: str = "",
    limits: Optional[Limits] = None,
    ignored: Sequence[str] = (),
    explicit_outputs: Optional[Set[str]] = None,
    columns: int = 1,
) -> Work:
    """Validate one request: ``TEXT`` (sizes first), ``THRESHOLD``, request parameters and
    the outputs it asked for.

    Args:
        texts_array: TEXT, object [N, 1] of UTF-8 bytes (None: missing).
        thresholds_array: THRESHOLD, float32 [N, 1] (None: missing).
        parameters: the request's parameters.
        exposed: parameter name -> the values the policy offers (``request_parameters``).
        request_id: Triton's request id.
        limits: input size limits (default :class:`Limits`).
        ignored: ``fnmatch`` patterns of parameters to accept and ignore.
        explicit_outputs: the outputs the client named, when it named a subset (None: all).
        columns: the answer's columns (the policy head's); THRESHOLD may have one per column.

    Raises:
        InputError: a missing input, an empty batch, a text or request over a size limit,
            invalid UTF-8, a threshold that is not one finite probability per text, an
            unknown parameter or a value the policy does not offer, or the ``POLICY``
            output asked for without ``describe_policy``.
    """
    if texts_array is None:
        raise InputError("TEXT: required input is missing")
    if thresholds_array is None:
        raise InputError("THRESHOLD: required input is missing")
    check_sizes(texts_array, limits or Limits())
    texts = decode_texts(texts_array, "TEXT")
    thresholds = check_thresholds(thresholds_array, len(texts), "THRESHOLD", columns)
    parameters = dict(parameters or {})
    accepted = check_parameters(parameters, exposed or {}, ignored)
    describe = parse_bool(parameters.get(DESCRIBE_PARAMETER, False), DESCRIBE_PARAMETER)
    if explicit_outputs is not None and POLICY_OUTPUT in explicit_outputs and not describe:
        raise InputError(f"{POLICY_OUTPUT}: this output is only produced for requests with the parameter {DESCRIBE_PARAMETER}=true")
    return Work(texts=texts, thresholds=thresholds, parameters=accepted, request_id=request_id, describe=describe,
                outputs=None if explicit_outputs is None else frozenset(explicit_outputs))


def policy_path(model_dir: Path, params: Mapping[str, str]) -> Path:
    """The policy file named by the config parameter ``policy`` (default ``policy.yaml``),
    relative to the model directory.

    Raises:
        ValueError: the path leaves the model directory.
    """
    name = params.get("policy", "policy.yaml")
    path = (model_dir / name).resolve()
    if model_dir.resolve() not in path.parents:
        raise ValueError(f"router: parameter policy={name!r} points outside the model directory")
    return path


# ----------------------------------------------------------------------------- input checks


def decode_texts(array: NDArray[Any], name: str = "TEXT") -> List[str]:
    """Decode a TYPE_STRING tensor into one Python string per row.

    Args:
        array: the tensor as the Python backend delivers it: ``np.object_`` of ``bytes``
            (``str`` is accepted too), shape ``[N, 1]`` or ``[N]``.
        name: the input's name, used in error messages.

    Returns:
        ``N`` strings, row order kept.

    Raises:
        InputError: ``N == 0`` (empty batch), more than one element per row, or an
            element that is not valid UTF-8 (the message gives the row and byte offset).
    """
    arr = np.asarray(array)
    if arr.ndim == 0:
        raise InputError(f"{name}: expected shape [N, 1], got a scalar")
    if arr.shape[0] == 0:
        raise InputError(f"{name}: empty batch (shape {list(arr.shape)}); send at least one text")
    if arr.ndim > 2 or (arr.ndim == 2 and arr.shape[1] != 1):
        raise InputError(f"{name}: expected shape [N, 1] (one text per row), got {list(arr.shape)}")
    texts = []
    for i, item in enumerate(arr.reshape(-1)):
        if isinstance(item, (bytes, bytearray, np.bytes_)):
            try:
                texts.append(bytes(item).decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{name}[{i}]: invalid UTF-8 (byte 0x{item[exc.start]:02x} at offset {exc.start})"
                ) from None
        elif isinstance(item, str):
            texts.append(item)
        else:
            raise InputError(f"{name}[{i}]: expected a UTF-8 string, got {type(item).__name__}")
    return texts


def check_thresholds(array: NDArray[Any], count: int, name: str = "THRESHOLD", columns: int = 1) -> NDArray[Any]:
    """Validate the decision thresholds of ``count`` texts.

    Args:
        array: FP32 tensor of shape ``[count, 1]`` or ``[count]`` (one threshold per text)
            or, when ``columns`` > 1, ``[count, columns]`` (one per label of a multiclass or
            multilabel head, ``orchestrator.runtime.routing.heads``).
        count: the number of texts (rows of ``TEXT`` or ``logits``) in the same request.
        name: the input's name, used in error messages.
        columns: the answer's columns (labels); 1 for binary heads.

    Returns:
        float32 array of shape ``[count, 1]`` or ``[count, columns]``; each value is a
        probability in ``[0, 1]``.

    Raises:
        InputError: a shape other than those above, or an element that is NaN, infinite,
            negative or greater than 1 (a threshold is compared with a probability).
    """
    arr = np.asarray(array, dtype=np.float32)
    per_label = columns > 1 and arr.ndim == 2 and arr.shape == (count, columns)
    if not per_label and (arr.ndim == 0 or arr.shape[0] != count or arr.size != count):
        also = f" or [{count}, {columns}] (one per label)" if columns > 1 else ""
        raise InputError(f"{name}: expected shape [{count}, 1] (one threshold per text){also}, got {list(arr.shape)}")
    out = arr.reshape(count, -1)
    for i, value in enumerate(out.reshape(-1).tolist()):  # Python floats: each float32 exactly, compared cheaply
        if not math.isfinite(value) or value < 0.0 or value > 1.0:
            where = f"{name}[{i // out.shape[1]}]" if out.shape[1] == 1 else f"{name}[{i // out.shape[1]}, {i % out.shape[1]}]"
            raise InputError(f"{where} = {float(value)!r}: must be a finite probability in [0, 1]")
    return out


def request_parameters(raw: Any) -> Mapping[str, Any]:
    """Parse a request's KServe v2 ``parameters`` (a JSON object string in the Python backend).

    Raises:
        InputError: the string is not a JSON object.
    """
    if raw is None or raw == "" or raw == "{}":  # no parameters (the stub's "{}"): no JSON to parse
        return {}
    if isinstance(raw, Mapping):
        return raw
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        raise InputError(f"parameters: not a JSON object: {raw!r}") from None
    if not isinstance(value, dict):
        raise InputError(f"parameters: expected a JSON object, got {type(value).__name__}")
    return value


def parse_bool(value: Any, name: str) -> bool:
    """Read a boolean request or config parameter given as bool, int or string.

    Raises:
        InputError: the value is not one of true/false/1/0/yes/no.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InputError(f"parameter {name}: expected true or false, got {value!r}")


def config_parameters(model_config: Mapping[str, Any]) -> Dict[str, str]:
    """Flatten a model config's ``parameters { key, value { string_value } }`` into str -> str."""
    params = model_config.get("parameters") or {}
    return {key: (val.get("string_value", "") if isinstance(val, Mapping) else str(val)) for key, val in params.items()}


class Deadlines:
    """The engine clock, node cost estimates and every request-context flag.

    Args:
        clock: seconds of a monotonic clock (``time.monotonic`` in the router; tests pass a
            fake one); ``RequestContext.deadline`` is on it.
        metrics: where the deadline and cancellation counters go (None: nowhere).
        costs: node name -> estimated run time, seconds (the engine's, which updates it,
            shared by its runs; default a new dict).
    """

    def __init__(self, clock: Callable[[], float], metrics: Optional[Metrics] = None,
                 costs: Optional[Dict[str, float]] = None) -> None:
        self.clock = clock
        self.metrics = metrics
        self.costs: Dict[str, float] = {} if costs is None else costs

    def _count(self, family: str, value: float = 1.0, **labels: str) -> None:
        if self.metrics:
            self.metrics.inc(family, value, **labels)

    # -- what nodes use (nodes.base.DeadlineView)

    def now(self) -> float:
        """The engine clock (seconds; deadlines are on it)."""
        return self.clock()

    def affordable(self, node: Node, items: Sequence[Item]) -> Tuple[List[Item], List[Item]]:
        """``(go, short)``: the items whose request can wait for ``node`` (no deadline, or
        :meth:`estimate` strictly below what is left: a stage expected to end exactly at
        the deadline would be late), and the others, in order."""
        cost, now = self.estimate(node), self.clock()
        go: List[Item] = []
        short: List[Item] = []
        for it in items:
            deadline = it.context.deadline
            (go if deadline is None or cost < deadline - now else short).append(it)
        return go, short

    def late(self, items: Sequence[Item]) -> List[Item]:
        """The items whose request deadline has passed (now >= deadline), in order."""
        now = self.clock()
        return [it for it in items if it.context.deadline is not None and now >= it.context.deadline]

    def in_time(self, items: Sequence[Item]) -> List[Item]:
        """The items whose request got no downstream answer after its deadline, in order."""
        return [it for it in items if not it.context.late]

    def live(self, items: Sequence[Item]) -> List[Item]:
        """The items whose request is not cancelled, in order.

        ``is_cancelled()`` is asked at most once per request per call, and only of requests
        that already had a downstream call (one that just arrived is not asked: the stub's
        ``is_cancelled`` is an IPC round trip); an error asking it counts as not cancelled.
        A request found cancelled stays so (``RequestContext.cancelled``) and
        ``Engine.run`` answers it with ``RequestCancelled``.
        """
        asked = set()
        out = []
        for it in items:
            ctx = it.context
            if id(ctx) not in asked:
                asked.add(id(ctx))
                self.ask_cancelled(ctx)
            if not ctx.cancelled:
                out.append(it)
        return out

    def keep_for_deadline(self, node: Node, items: Sequence[Item], answers: Answers) -> None:
        """The answers of ``items`` stay those of an earlier stage, which ended before the
        deadline: ``ROUTE`` gets ``:deadline``, their requests count as answered in time
        (``RequestContext.early``) and ``orchestrator_deadline_texts_total{node}`` counts
        them."""
        for it in items:
            a = answers[it.idx]
            answers[it.idx] = dataclasses.replace(a, route=a.route + DEADLINE_SUFFIX)
            it.context.early = True
        self._count("orchestrator_deadline_texts_total", len(items), node=node.name)

    # -- what the engine uses

    def remaining(self, item: Item) -> Optional[float]:
        """Seconds left before ``item``'s request deadline (<= 0: passed); None: no deadline."""
        deadline = item.context.deadline
        return None if deadline is None else deadline - self.clock()

    def estimate(self, node: Node) -> float:
        """Estimated run time of ``node``, seconds: the engine's estimate from its
        successful runs in this process (``engine.Engine.measured``); 0.0 before its first."""
        return self.costs.get(node.name, 0.0)

    @staticmethod
    def ask_cancelled(ctx: Cancellable) -> None:
        """Ask ``is_cancelled()`` of a request that had a downstream call and is not known
        to be cancelled (an error asking it counts as not cancelled)."""
        if ctx.cancelled or not ctx.started:
            return
        try:
            ctx.cancelled = bool(ctx.is_cancelled())
        except Exception:  # the stub could not ask the server: go on
            ctx.cancelled = False

    def call_options(self, rows: Sequence[Item]) -> CallOptions:
        """The trace and timeout of one downstream call for ``rows``, which marks their
        requests as started (``RequestContext.started``): the trace of their request, or
        for rows of several requests the one :func:`call_trace` picks; the timeout, the
        largest budget left of their requests (at least 1 us), so the call is never cut
        while one of its rows can still use its answer (the rows whose deadline passed
        do not use it: :meth:`arrived`, the cascade); no timeout when a row's request
        has none."""
        contexts = {id(it.context): it.context for it in rows}
        for ctx in contexts.values():
            ctx.started = True
        if len(contexts) == 1:  # one request: its own trace (what call_trace picks for one)
            ctx = rows[0].context
            timeout_us = 0 if ctx.deadline is None else max(1, int((ctx.deadline - self.clock()) * 1e6))
            return CallOptions(trace=ctx.trace, timeout_us=timeout_us)
        trace = call_trace(list(contexts.values()))  # one per request, in row order
        deadlines = [ctx.deadline for ctx in contexts.values() if ctx.deadline is not None]
        timeout_us = 0
        if deadlines and len(deadlines) == len(contexts):  # a request without a deadline: no timeout
            timeout_us = max(1, int((max(deadlines) - self.clock()) * 1e6))
        return CallOptions(trace=trace, timeout_us=timeout_us)

    def arrived(self, items: Sequence[Item]) -> None:
        """Downstream answers for ``items`` arrived now: a request whose deadline has
        passed is marked late (``RequestContext.late``; ``Engine.run`` refuses it unless a
        stage kept an earlier answer for it)."""
        now = self.clock()
        for it in items:
            if it.context.deadline is not None and now >= it.context.deadline:
                it.context.late = True

    def before_run(self, works: Sequence[Work]) -> Dict[int, RequestStopped]:
        """The requests of ``works`` not to run: cancelled (a request run before, as in the
        router's retries, is asked: this run is its next stage) or past their deadline.
        The others start afresh (``late``, ``early`` cleared)."""
        now = self.clock()
        out: Dict[int, RequestStopped] = {}
        for k, w in enumerate(works):
            w.context.late = w.context.early = False
            self.ask_cancelled(w.context)
            if w.context.cancelled:
                out[k] = RequestCancelled("the request was cancelled")
            elif w.context.deadline is not None and now >= w.context.deadline:
                out[k] = DeadlineExceeded("deadline exceeded: no stage answered within the request's timeout")
        return out

    def stopped(self, works: Sequence[Work], refused: Dict[int, Union[InputError, RequestStopped]]) -> Dict[int, RequestStopped]:
        """The requests of ``works`` cancelled or late (refused before the run as such, or
        found so during it), each counted once (``orchestrator_cancelled_requests_total``,
        ``orchestrator_expired_requests_total``)."""
        out: Dict[int, RequestStopped] = {}
        for k, w in enumerate(works):
            ctx = w.context
            if isinstance(refused.get(k), RequestCancelled) or (k not in refused and ctx.cancelled):
                out[k] = RequestCancelled("the request was cancelled; no further stage ran for it")
                self._count("orchestrator_cancelled_requests_total")
            elif isinstance(refused.get(k), DeadlineExceeded) or (k not in refused and ctx.late and not ctx.early):
                out[k] = DeadlineExceeded("deadline exceeded: no stage answered within the request's timeout")
                self._count("orchestrator_expired_requests_total")
        return out
