"""The router: one Python-backend model that replaces the ``ensemble`` DAG.

Same inputs and outputs as ``ensemble`` plus ``ROUTE``, so a client switches by model name
(C: 1 for a binary head, K labels for multiclass and multilabel heads; ``heads``):
    TEXT           TYPE_STRING [N, 1]  UTF-8 texts
    THRESHOLD      FP32        [N, 1]  decision threshold per text, in [0, 1]; or [N, C]
    PROBABILITIES  FP32        [N, C]  binary: P(positive label); else one per label
    VERDICTS       BOOL        [N, C]  the head's rule (binary: PROBABILITIES >= THRESHOLD),
                                       unless a constant or vote fixes them
    ROUTE          TYPE_STRING [N, 1]  the branch that answered
    POLICY         TYPE_STRING [N, 1]  optional: the policy as JSON, only for requests with
                                       the parameter ``describe_policy: true``

A policy with the top-level key ``pipeline`` (a tensor pipeline: any ensemble's steps, with
conditions) is served by ``serving.pipeline.PipelineRouter`` instead: its inputs and outputs
are the router's config's, whatever they are (``initialize`` decides; nothing below applies).

What happens to each text is decided by the routing policy (``orchestrator.runtime.routing.policy``;
node kinds in ``orchestrator.runtime.routing.nodes``), a YAML file in the model directory named by
the config parameter ``policy``. The shipped policy (``model_repository/router/policy.yaml``)
answers empty texts without a model (probability 0.5, verdict false, ROUTE ``empty``),
reads texts over 128 tokens with ``classifier_fast`` in overlapping windows (ROUTE
``chunked:<model>``; a text settled before its last window:
``chunked:<model>:windows=<used>/<made>``), cascades shorter texts from ``classifier_fast``
to ``classifier`` when the calibrated probability is within the policy's ``margin`` of
their threshold, and degrades when a model is broken (ROUTE ``classifier`` for texts that
needed ``classifier_fast``, ``classifier_fast:degraded`` for texts that needed
``classifier``).

Batching: the texts of all requests in one ``execute`` call go through the policy
together: one tokenization per tokenizer (whole texts, no truncation), one BLS call per
model node, the heads applied in-process; BLS calls are split at ``bls_max_batch_size`` rows and sent
concurrently, with rows sorted by length so each call pads as little as possible.

Heads: at load the router reads each model's head (``<repository>/<model>/head.json``; a
model without one is served as one logit, sigmoid) and refuses to load when the policy
cannot answer with them (``policy.bind_heads``: heads that disagree, a length over a
model's maximum), or when its ``PROBABILITIES`` label file (Triton's classification
extension) names other labels than the policy's head.

Errors (``errors``; each request gets exactly one response, one outcome): bad input
(including a text over the policy's ``limits``) gives that request an INVALID_ARG error
naming the input (or the request parameter). A model that cannot serve now (its stub
died, it is not ready or unloaded, its circuit is open, its on-demand load failed:
``errors.UnavailableError``) gives an UNAVAILABLE error naming the model, which clients
may retry later; any other downstream failure gives an INTERNAL error naming the model,
unless a ``fallback`` node answers instead. When requests batched together fail, each is
retried alone, all concurrently, so only the requests that need the failing model get the
error; a model that cannot serve is not called again by those retries (its circuit is
open, ``downstream.CircuitBreaker``, or its load is in back-off). A request its client cancelled
(``request.is_cancelled()``, asked before a later stage) gets CANCELLED and no further
stage; a request's ``timeout()`` is the budget of its downstream calls, counted from the
start of ``execute`` (docs/guides/reliability.md "Cancellation", "Deadlines").

Admission control (the policy's ``admission``, ``runtime.serving.admission``; off in the shipped
policy unless it sets one): at the start of an ``execute`` the router runs only the requests
it expects to answer within ``admission.max_wait_ms`` of their arrival (at least one, in
arrival order) and answers the others at once with UNAVAILABLE ("overloaded: ..."),
counted in ``orchestrator_shed_requests_total``.

Newer releases (``releases``; docs/reference/compatibility.md "Releases"): where the stub's
``InferenceResponse`` takes ``parameters`` (python_backend r25.02), each answer also carries
the route as KServe v2 response parameters (``releases.route_parameters``) beside ``ROUTE``;
where the server calls a model's ``is_ready()`` (r26.03), the router reports not ready while
its policy cannot answer (``Downstream.not_ready``). On 2.51 neither exists and nothing
changes.

Warmup: Triton runs a model's ``model_warmup`` samples as this instance's first
``execute`` calls, before the model is ready (core r24.10 ``TritonModelInstance::WarmUp``),
and a sample answered with an error fails the load. Triton knows nothing of BLS
dependencies, loads the models of one ``--load-model`` list concurrently and refuses BLS
calls with "Server not ready" while it starts; and a ``pb_utils.is_model_ready`` call
during startup sometimes aborted Triton 2.51 here (``boost::interprocess::lock_exception``,
in 3 of 11 starts). So the router's sample is marked (``THRESHOLD`` NaN, which a client
request may never carry: it is refused as INVALID_ARG) and, among this instance's first
:func:`warmup_executes` calls, such a request runs through the policy at threshold 0.5
with no downstream call at all (:meth:`TritonPythonModel._warmup`): request parsing, the
inline tokenizer, the policy walk and the response are warm before the first client
request, the downstream models warm themselves with their own samples, and nothing
loading beside the router can fail its load.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Awaitable, Callable, Coroutine, Dict, Generator, List, Optional, TypeVar, Union, cast

import numpy as np

from orchestrator.runtime.bls.downstream import Downstream
from orchestrator.runtime.errors import (
    DownstreamError,
    InputError,
    LimitError,
    OrchestratorError,
    Overloaded,
    PolicyError,
    RequestStopped,
)
from orchestrator.runtime.execution.engine import Engine, gather
from orchestrator.runtime.metrics import QUEUE_DELAY, SUCCEEDED, observe_stage, router_metrics
from orchestrator.runtime.request import (
    POLICY_OUTPUT,
    RequestContext,
    Result,
    Work,
    config_parameters,
    parse_request,
    policy_path,
    request_parameters,
)
from orchestrator.runtime.routing.heads import HeadError, repository_heads
from orchestrator.runtime.routing.nodes.model import ModelNode
from orchestrator.runtime.routing.policy import Policy, bind_heads, is_pipeline, load_policy, parse_pipeline_policy, read_document
from orchestrator.runtime.routing.policy import describe as describe_policy
from orchestrator.runtime.serving.admission import Admission
from orchestrator.runtime.serving.pipeline import PipelineRouter
from orchestrator.runtime.serving.releases import cpu_outputs, has_response_parameters, route_parameters

# ----------------------------------------------------------------------------- the queue delay
#
# The router's queue delay, estimated inside the Python-backend stub.
#
# Triton's Python backend (stub r24.10) does not tell a model when its requests were
# enqueued, so the delay is estimated from what the router sees: the start and end of each
# of its own ``execute`` calls. One router instance runs one ``execute`` at a time, and the
# dynamic batcher hands it every request that queued meanwhile (up to ``max_batch_size``).
# When an ``execute`` starts within ``busy_gap_s`` of the previous one's end (the stub's
# turnaround: sending the responses, receiving the next batch), requests were waiting: they
# arrived after the previous batch was taken, so the oldest of them waited about the time
# from the previous ``execute``'s start to this one's (the sample). After a longer gap the
# instance sat idle and its requests found it free: the sample is 0. Samples are smoothed
# with an exponential moving average (weight ``smoothing`` for the newest), so one slow batch
# does not flip the overload mode of a cascade while a backlog shows after two or three
# executes.
#
# Limits: the estimate is the oldest request's wait (a Poisson stream's mean request waited
# about half of it); a request that waited more than one ``execute`` (a queue longer than
# ``max_batch_size``) counts as one period, which the recommended queue policy's
# ``max_queue_size`` (16, at most its ``max_batch_size``; docs/guides/reliability.md "Overload")
# rules out; on a machine so loaded that the stub's turnaround exceeds ``busy_gap_s`` the
# backlog is missed (a queue policy still refuses).
# It assumes one router instance (the shipped ``instance_group``); with more, each
# instance sees only its own executes and reads low. Triton 2.51's dynamic batcher can
# leave the instance idle up to 500 ms under any queue policy (docs/guides/reliability.md
# "Overload"): such a gap reads as idle.
# The clock is injectable so tests drive it (``clock``: seconds, monotonic).

#: An ``execute`` starting within this many seconds of the previous one's end found a
#: request waiting: a margin over the stub's turnaround between two executes of a
#: backlogged router (responses out, next batch in: milliseconds), wide enough for a
#: loaded CPU; an idle gap this short adds at most one execute period to the estimate,
#: which is small exactly when the router is not loaded.
BUSY_GAP_S = 0.020
#: The newest sample's weight in the moving average.
SMOOTHING = 0.5


class QueueDelay:
    """Estimated queue delay of the router's requests (module docstring).

    Args:
        clock: seconds, monotonic (default ``time.monotonic``).
        busy_gap_s: see :data:`BUSY_GAP_S`.
        smoothing: weight of the newest sample, in (0, 1] (1: no smoothing).

    Raises:
        ValueError: ``smoothing`` outside (0, 1] or ``busy_gap_s`` negative.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, busy_gap_s: float = BUSY_GAP_S,
                 smoothing: float = SMOOTHING) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if busy_gap_s < 0.0:
            raise ValueError(f"busy_gap_s must be >= 0, got {busy_gap_s}")
        self.clock = clock
        self.busy_gap_s = busy_gap_s
        self.smoothing = smoothing
        self._lock = threading.Lock()
        self._estimate_s = 0.0
        self._started: Optional[float] = None
        self._ended: Optional[float] = None
        self._last_start: Optional[float] = None

    def begin(self) -> float:
        """Mark the start of an ``execute``; returns the updated estimate, seconds."""
        with self._lock:
            now = self.clock()
            if self._ended is not None and self._last_start is not None:
                busy = now - self._ended <= self.busy_gap_s
                sample = now - self._last_start if busy else 0.0
                self._estimate_s += self.smoothing * (sample - self._estimate_s)
            self._started = self._last_start = now
            self._ended = None
            return self._estimate_s

    def end(self) -> None:
        """Mark the end of the ``execute`` that :meth:`begin` started (no-op without one)."""
        with self._lock:
            if self._started is None:
                return
            self._ended, self._started = self.clock(), None

    def delay_ms(self) -> float:
        """The current estimate, milliseconds (0 before the second ``execute``)."""
        with self._lock:
            return self._estimate_s * 1000.0


# ----------------------------------------------------------------------------- the event loop
#
# One execute is one coroutine, and most never wait: a lone downstream call is a blocking ``exec``, yet
# ``loop.run_until_complete`` costs a task and two loop iterations (a tenth of the router's own time).
# :func:`run_eagerly` runs the first step in the calling thread, the loop marked running (so
# ``asyncio.get_running_loop``, ``asyncio.gather`` and the stub's ``async_exec`` find it) and, only when
# the run waits (``async_exec``, branches side by side, an on-demand load), goes on in a task on the loop
# (:class:`_Resume`) in the same ``contextvars`` context (a variable set before the wait is reset after it).
# No task exists in the first step, so a policy with a node ``timeout_ms`` (``asyncio.wait_for``: on
# Python 3.12 it needs a current task) never runs eagerly: decided at load (``TritonPythonModel.eager``).

T = TypeVar("T")


class _Resume:
    """Awaitable: the rest of a coroutine stepped outside a task, which yielded ``pending``
    (what a task's step gets from a coroutine that waits: a future, or None for a bare
    yield). Each value goes up to the task that awaits this and each result or exception
    the task sends back goes down to the coroutine, as ``yield from`` does."""

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self.coro, self.pending = coro, pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.pending
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation: into the coroutine, where it waits
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _finish(rest: Awaitable[T]) -> T:  # a task needs a coroutine (Python 3.12: not a generator)
    return await rest


def run_eagerly(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """``loop.run_until_complete(coro)``, with ``coro``'s first step in the calling thread
    (the section above): its result when it never waits, else the rest in a task on ``loop``.
    Exceptions propagate as from ``run_until_complete`` (a loop running in this thread: its RuntimeError)."""
    if asyncio.events._get_running_loop() is not None:
        return loop.run_until_complete(coro)  # refused, as it always was; the running loop left as it is
    context = contextvars.copy_context()  # as a task's: the rest runs in this same one
    asyncio.events._set_running_loop(loop)  # what get_running_loop() reads (asyncio's own setter)
    try:
        pending = context.run(coro.send, None)
    except StopIteration as stop:
        return cast(T, stop.value)
    finally:
        asyncio.events._set_running_loop(None)
    result: T = loop.run_until_complete(loop.create_task(_finish(_Resume(coro, pending)), context=context))
    return result


# ----------------------------------------------------------------------------- the router


def warmup_executes(config: Dict[str, Any]) -> int:
    """How many ``execute`` calls Triton's warmup makes on one instance of a model with
    ``config`` (the model configuration as JSON): one per iteration of each sample with
    ``batch_size`` >= 1, ``count`` iterations, at least one (core r24.10
    ``TritonModelInstance::GenerateWarmupData``/``WarmUp``; a sample's requests go in one
    call)."""
    samples = config.get("model_warmup") or []
    return sum(max(1, int(s.get("count", 0) or 0)) for s in samples if int(s.get("batch_size", 0) or 0) >= 1)


def check_label_file(model_dir: Path, config: Dict[str, Any], policy: Policy, policy_file: Path) -> None:
    """Refuse to load (ValueError) when the router's ``PROBABILITIES`` output has a
    ``label_filename`` whose lines differ from the policy head's output labels: Triton's
    classification extension would name the columns wrongly."""
    name = next((o.get("label_filename") for o in config.get("output", []) if o.get("name") == "PROBABILITIES"), None)
    if not name:
        return
    path = model_dir / name
    try:
        found = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except OSError as exc:
        raise ValueError(f"router: cannot read label file {path}: {exc.strerror}") from None
    head = policy.head
    assert head is not None, "the policy is bound to its heads (bind_heads) before"
    wanted = list(head.output_labels())
    if found != wanted:
        raise ValueError(
            f"router: label file {path} says {found}, but the policy's models answer {wanted} "
            f"({head.describe()}); run: orchestrator policy check {policy_file} --repo {model_dir.parent} --write-labels"
        )


class TritonPythonModel:
    """Triton Python-backend adapter around :class:`~orchestrator.runtime.execution.engine.Engine`.

    ``execute`` is a plain function that runs the engine on this instance's own event loop
    in the calling (stub main) thread, its first step outside the loop (:func:`run_eagerly`,
    unless a node has ``timeout_ms``). A downstream call that is the only one in flight
    uses the blocking BLS ``exec``; calls that run beside others (several parts of a batch,
    ``parallel``/``split``/``switch`` branches, retries) or under a ``timeout_ms`` use
    ``async_exec``. Why: the stub runs an ``async def execute`` on a loop in another thread
    and ``async_exec`` in a thread pool, four thread hand-offs per request on the path that
    matters most (one text, one classifier call); docs/results/benchmarks.md has the measurement.
    Every downstream call goes through :class:`~orchestrator.runtime.bls.downstream.Downstream`
    (circuit breakers, the stub watch, repairs); the router parses, runs, responds and
    warms up.
    """

    def initialize(self, args: Dict[str, str]) -> None:
        """Read the policy (``ValueError`` if invalid: the model fails to load) and set up
        metrics, circuit breakers, model control and the engine."""
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        self.logger = pb_utils.Logger
        config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        path = policy_path(model_dir, config_parameters(config))
        self.pipeline: Optional[PipelineRouter] = None
        if self._init_pipeline(pb_utils, config, model_dir, path, args):
            return
        try:
            parsed = load_policy(path)
            models = [cast(ModelNode, n).model for n in parsed.model_nodes()]
            self.policy = bind_heads(parsed, repository_heads(model_dir.parent, models))
        except (PolicyError, HeadError) as exc:
            raise ValueError(f"router: invalid routing policy: {exc}") from None
        check_label_file(model_dir, config, self.policy, path)
        self.name = args.get("model_name", config.get("name", "router"))
        self.outputs = {o["name"] for o in config.get("output", [])}
        self.metrics = router_metrics(pb_utils, self.name, config_parameters(config))
        self.downstream = Downstream(pb_utils, self.policy, self.metrics, self.logger, self.name, cpu_outputs(pb_utils))
        self.models = self.downstream.models
        self.load = QueueDelay()  # this instance's executes, marked by _timed_execute
        self.engine = Engine(
            self.policy, self.downstream.infer, self.metrics if self.metrics.enabled else None, self.models, model_dir,
            shadow_infer=self.downstream.shadow_infer, logger=self.logger,
        )
        self.admission = Admission(self.policy.admission) if self.policy.admission is not None else None
        self.warmups_left = warmup_executes(config)
        self.response_parameters = has_response_parameters(pb_utils)
        self.loop = asyncio.new_event_loop()
        # each execute's first step outside the loop (run_eagerly), unless a node has a timeout
        self.eager = not any(n.timeout_ms for n in self.policy.nodes())
        self.policy_json = json.dumps(self.policy.source).encode("utf-8")
        self.logger.log_info(
            f"router '{self.name}': policy {path}; response parameters: "
            f"{'yes' if self.response_parameters else 'no (python_backend before r25.02)'}\n{describe_policy(self.policy)}")
        if self.models.enabled:
            self.logger.log_info(
                f"router '{self.name}': on-demand models {sorted(self.policy.on_demand())} "
                "(needs --model-control-mode=explicit; otherwise they are treated as always loaded)"
            )

    def _init_pipeline(self, pb_utils: Any, config: Dict[str, Any], model_dir: Path, path: Path, args: Dict[str, str]) -> bool:
        """Serve a pipeline policy (top-level ``pipeline``; ``serving.pipeline``) when the
        policy is one: True. A text policy (or an unreadable file, reported by the text
        path) is left to the text router: False."""
        try:
            document = read_document(path)
        except PolicyError:
            return False
        if not is_pipeline(document):
            return False
        try:
            policy = parse_pipeline_policy(document)
        except PolicyError as exc:
            raise ValueError(f"router: invalid pipeline policy: {path}: {exc}") from None
        self.name = args.get("model_name", config.get("name", "router"))
        self.metrics = router_metrics(pb_utils, self.name, config_parameters(config))
        self.load = QueueDelay()
        self.pipeline = PipelineRouter(pb_utils, policy, config, model_dir.parent, self.name, self.metrics,
                                       warmups=warmup_executes(config))
        self.downstream = self.pipeline.downstream
        self.logger.log_info(f"router '{self.name}': pipeline policy {path}\n{self.pipeline.describe()}")
        return True

    def _pipeline_execute(self, pipeline: PipelineRouter, requests: List[Any]) -> List[Any]:
        """A pipeline's execute, marked on this instance's queue-delay estimate (admission)."""
        delay_s = self.load.begin()
        self.metrics.set_series(QUEUE_DELAY, delay_s)
        try:
            return pipeline.execute(requests, delay_s)
        finally:
            self.load.end()

    def is_ready(self) -> bool:
        """The model's readiness hook (python_backend r26.03 calls it on each readiness
        check; older releases never do): False, with a warning, while the policy cannot
        answer (``Downstream.not_ready``)."""
        reason = self.downstream.not_ready()
        if reason is not None:
            self.logger.log_warn(f"router '{self.name}': not ready: {reason}")
        return reason is None

    def finalize(self) -> None:
        """Stop the background threads and close the event loop."""
        if self.pipeline is not None:
            self.pipeline.close()
            self.metrics.close()
            return
        self.engine.close()
        self.downstream.close()
        self.metrics.close()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())  # async_exec's threads
        self.loop.close()

    # -- responses

    def _response(self, result: Union[Result, InputError, RequestStopped], work: Optional[Work] = None) -> Any:
        """The response to ``work`` (None: warmup): the outputs its client asked for, of those its config
        declares (Triton drops any other: one left out of ``config.pbtxt``, as ``ROUTE``, costs nothing)."""
        if isinstance(result, (InputError, RequestStopped)):  # refused, cancelled or past its deadline
            return self._fail(result)
        pb, asked = self.pb, (work.outputs if work is not None and work.outputs is not None else self.outputs)
        tensors = [pb.Tensor(name, value) for name, value in (("PROBABILITIES", result.probabilities), ("VERDICTS", result.verdicts))
                   if name in asked]
        if "ROUTE" in asked:  # a BYTES tensor: the stub serializes it in Python
            tensors.append(pb.Tensor("ROUTE", np.array([r.encode("utf-8") for r in result.routes], dtype=np.object_).reshape(-1, 1)))
        if work is not None and work.describe and POLICY_OUTPUT in asked:  # the policy as JSON, one per row
            tensors.append(pb.Tensor(POLICY_OUTPUT, np.array([self.policy_json] * len(result.routes), dtype=np.object_).reshape(-1, 1)))
        if self.response_parameters:
            return pb.InferenceResponse(output_tensors=tensors, parameters=route_parameters(result.routes))
        return pb.InferenceResponse(output_tensors=tensors)

    def _error(self, message: str, code: str) -> Any:
        from orchestrator.runtime.models._triton import error_response

        self.metrics.inc("orchestrator_requests_total", outcome="error")
        return error_response(message, code)

    def _fail(self, exc: BaseException, log: bool = True) -> Any:
        """The one translation of an error into a request's error response: an
        ``OrchestratorError`` with its own ``code`` (a ``LimitError`` also counted in
        ``orchestrator_rejected_requests_total``); anything else is a bug, answered
        ``INTERNAL`` and (``log``) logged with its traceback."""
        if isinstance(exc, LimitError):
            self.metrics.inc("orchestrator_rejected_requests_total", limit=exc.limit)
        elif isinstance(exc, Overloaded):
            self.metrics.inc("orchestrator_shed_requests_total")
        if isinstance(exc, OrchestratorError):
            return self._error(f"router: {exc}", exc.code)
        if log:
            self.logger.log_error("router: unexpected error: " + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return self._error(f"router: internal error: {type(exc).__name__}: {exc}", "INTERNAL")

    # -- execute

    def execute(self, requests: List[Any]) -> List[Any]:
        """One response per request, in order (see the module docstring for errors and
        warmup)."""
        if self.pipeline is not None:
            return self._pipeline_execute(self.pipeline, requests)
        if self.warmups_left > 0:
            self.warmups_left -= 1
            if all(self._is_warmup_sample(r) for r in requests):
                return self.loop.run_until_complete(self._warmup(requests))
        return self._timed_execute(requests)

    def _timed_execute(self, requests: List[Any]) -> List[Any]:
        """:meth:`_execute` marked on this instance's queue-delay estimate (:class:`QueueDelay`);
        with the policy's ``admission``, only the requests it admits run (the first ones,
        in arrival order) and the others are refused with ``Overloaded`` (``runtime.serving.admission``)."""
        delay_s = self.load.begin()
        self.metrics.set_series(QUEUE_DELAY, delay_s)
        admitted, refusal = len(requests), None
        if self.admission is not None:
            admitted = self.admission.admit(len(requests), delay_s)
            if admitted < len(requests):  # the estimates that decided it, before this execute updates them
                refusal = Overloaded(self.admission.message(delay_s, admitted))
        began = time.perf_counter()
        try:
            run = self._execute(requests[:admitted])
            responses: List[Any] = run_eagerly(self.loop, run) if self.eager else self.loop.run_until_complete(run)
        finally:
            if self.admission is not None:
                self.admission.ran(admitted, time.perf_counter() - began)
            self.load.end()
        if refusal is not None:
            responses += [self._fail(refusal) for _ in requests[admitted:]]
        return responses

    def _is_warmup_sample(self, request: Any) -> bool:
        """True for the marked warmup sample: every THRESHOLD is NaN (module docstring)."""
        thr = self.pb.get_input_tensor_by_name(request, "THRESHOLD")
        value = None if thr is None else np.asarray(thr.as_numpy(), dtype=np.float64)
        return value is not None and value.size > 0 and bool(np.isnan(value).all())

    async def _warmup(self, requests: List[Any]) -> List[Any]:
        """Answer Triton's warmup samples (see the module docstring); never an error."""
        warm = self.engine.start(Downstream.no_infer)  # no on-demand loads, no metrics, no shadow queue
        answers, notes = [], []
        for request in requests:
            rows = 1
            try:
                work = self._parse(request, threshold=0.5)
                rows = max(1, len(work.texts))
                [result] = await warm.run([work])
                if isinstance(result, InputError):
                    raise result
            except Exception as exc:  # the sample's way ends at the first downstream call
                notes.append(f"{type(exc).__name__}: {exc}")
                cols = self.engine.head.columns
                result = Result(np.full((rows, cols), 0.5, np.float32), np.zeros((rows, cols), bool), ["warmup"] * rows)
            answers.append(self._response(result))
        how = f"up to the first downstream call ({'; '.join(notes)})" if notes else "through the policy"
        self.logger.log_info(f"router '{self.name}': warmup sample answered {how}")
        return answers

    def _parse(self, request: Any, threshold: Optional[float] = None, start: Optional[float] = None) -> Work:
        """The request's validated work (``threshold``: replaces every THRESHOLD).

        ``start``: the engine clock at the start of this ``execute``, from which the
        request's ``timeout()`` (microseconds; 0: none) counts (docs/guides/reliability.md
        "Deadlines"); None: the request gets no deadline (warmup).
        """
        pb = self.pb
        text = pb.get_input_tensor_by_name(request, "TEXT")
        thr = pb.get_input_tensor_by_name(request, "THRESHOLD")
        if thr is not None and threshold is not None:
            thr = pb.Tensor("THRESHOLD", np.full(thr.as_numpy().shape, threshold, np.float32))
        requested = set(request.requested_output_names())
        work = parse_request(
            None if text is None else text.as_numpy(),
            None if thr is None else thr.as_numpy(),
            request_parameters(request.parameters()),
            self.policy.request_parameters,
            request.request_id(),
            limits=self.policy.limits,
            ignored=self.policy.ignored_parameters,
            explicit_outputs=None if requested >= self.outputs else requested,
            columns=self.engine.head.columns,
        )
        work.context = RequestContext(trace=request.trace())
        timeout_us = int(request.timeout() or 0) if start is not None else 0
        work.context.deadline = start + timeout_us / 1e6 if timeout_us and start is not None else None
        if self.policy.check_cancelled:  # else the context's default: never cancelled, never asked
            work.context.is_cancelled = request.is_cancelled
        return work

    async def _execute(self, requests: List[Any]) -> List[Any]:
        responses: List[Any] = [None] * len(requests)
        works: Dict[int, Work] = {}
        start = self.engine.clock()  # deadlines count from here: the stub cannot see arrival times
        began = time.perf_counter()
        for k, request in enumerate(requests):
            try:
                works[k] = self._parse(request, start=start)
            except InputError as exc:
                responses[k] = self._fail(exc)
        observe_stage(self.metrics, "parse", began)
        keys = list(works)
        try:
            results = await self.engine.run([works[k] for k in keys])
            began = time.perf_counter()
            for k, result in zip(keys, results):
                responses[k] = self._response(result, works[k])
            observe_stage(self.metrics, "respond", began)
        except DownstreamError as batch_error:
            if len(keys) == 1:
                responses[keys[0]] = self._fail(batch_error)
            else:  # each request alone, concurrently: only those that need the failing model fail
                for k, response in zip(keys, await gather(self._alone(works[k]) for k in keys)):
                    responses[k] = response
        except Exception as exc:  # a bug must fail these requests, not the model instance
            for i, k in enumerate(keys):
                responses[k] = self._fail(exc, log=i == 0)
        ok = sum(1 for k in keys if responses[k] is not None and not responses[k].has_error())
        self.metrics.inc_series(SUCCEEDED, ok)
        return responses

    async def _alone(self, work: Work) -> Any:
        try:
            return self._response((await self.engine.run([work]))[0], work)
        except Exception as exc:  # DownstreamError: its code (UNAVAILABLE or INTERNAL); else a bug
            return self._fail(exc)
