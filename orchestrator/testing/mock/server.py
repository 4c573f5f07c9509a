""":class:`MockTriton`: the mini server's API (model control, inference, test helpers).

The work is done by collaborators: :mod:`~orchestrator.testing.mock.loading` (config,
import, ``initialize``/``finalize``), :class:`~orchestrator.testing.mock.execution.Executor`
(validation, batching, ``execute``), :class:`~orchestrator.testing.mock.faults.FaultInjector`,
:class:`~orchestrator.testing.mock.metric_store.MetricRegistry` and
:class:`~orchestrator.testing.mock.records.Recorder`. They see the server only through
:class:`~orchestrator.testing.mock.host.Host`, which :class:`MockTriton` implements.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from orchestrator.testing.mock.client import client_request, parse_item
from orchestrator.testing.mock.context import activate, deactivate, running
from orchestrator.testing.mock.decoupled import Item, ResponseIterator
from orchestrator.testing.mock.errors import ErrorCode, InferError, LoadError, TritonError
from orchestrator.testing.mock.execution import Executor
from orchestrator.testing.mock.faults import FaultInjector
from orchestrator.testing.mock.instances import LoadedModel
from orchestrator.testing.mock.loading import build, finalize
from orchestrator.testing.mock.metric_store import MetricRegistry, exposition, snapshot
from orchestrator.testing.mock.pb_utils import install
from orchestrator.testing.mock.records import Call, Err, LogRecord, Recorder, Req, TraceRecord, to_client
from orchestrator.testing.mock.releases import IS_READY, PROFILES, RESPONSE_PARAMETERS, resolve
from orchestrator.testing.mock.requests import InferenceRequest, InferenceResponse, InferenceTrace
from orchestrator.testing.mock.tensors import Tensor


class StreamResponse(NamedTuple):
    """One response of :meth:`MockTriton.infer_stream`: ``outputs`` (name -> array; ``{}``
    for the empty final response of a decoupled model), or ``error``; ``final``: it
    carried ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (gRPC's ``triton_final_response``)."""

    outputs: Optional[Dict[str, np.ndarray]]
    error: Optional[InferError]
    final: bool


# Triton 2.51's unary endpoints refuse decoupled models (server r24.10 grpc/infer_handler.cc;
# HTTP says "HTTP end point doesn't support models with decoupled transaction policy").
UNARY_DECOUPLED = "ModelInfer RPC doesn't support models with decoupled transaction policy"


class MockTriton:
    """A mini Triton server running the real ``model.py`` files of a repository.

    ``model_repository``: the repository directory (FileNotFoundError if it is not
    one). ``model_config_name``: like tritonserver's ``--model-config-name``:
    ``<model>/configs/<name>.pbtxt`` is used when it exists, else ``<model>/config.pbtxt``
    (``None``/``""`` always uses config.pbtxt). Explicit model control: nothing is loaded
    until :meth:`load` (or ``models=``, or ``pb_utils.load_model`` from a model); a load
    loads every version the model's ``version_policy`` names (default: the highest).
    ``strict_outputs``: see the package docs. ``auto_complete``: call a model class's
    ``auto_complete_config`` when it defines one. ``instance_wait_timeout``: seconds a
    request waits for a busy model instance before failing (guards tests against
    deadlocks such as a model calling itself). ``log_verbose``: as tritonserver's
    ``--log-verbose``; at 0 (Triton's default) ``pb_utils.Logger`` VERBOSE messages are
    dropped. ``response_timeout``: seconds to wait, after ``execute`` returned None for
    a request, for the response it sends later through the request's response sender
    (Triton waits for ever; the mock then fails the request). ``trace_rate``: as
    ``--trace-config rate=N`` with ``level=TIMESTAMPS``: every N-th client request is traced
    (0: tracing off, Triton's default level OFF); a BLS call given a traced request's
    ``trace()`` gets a child trace (python_backend r24.10 ``RequestExecutor``:
    ``TRITONSERVER_InferenceTraceSpawnChildTrace``); :attr:`traces` records each traced
    request (:class:`~orchestrator.testing.mock.records.TraceRecord`). ``trace_mode``:
    ``triton`` or ``opentelemetry`` (then a sampled request's ``trace().get_context()`` is
    its ``traceparent``). Ensemble steps are not traced. Use as a context manager, or call
    :meth:`close`. ``release``: the python_backend release profile whose ``pb_utils``
    features the models see (:mod:`~orchestrator.testing.mock.releases`: ``"24.10"``/``"2.51"``,
    the default, or ``"26.08"``; None: ``$MOCK_TRITON_RELEASE``).

    A ``KIND_GPU`` model answers a BLS call in GPU memory unless the request asked for CPU
    memory (``preferred_memory=PreferredMemory(TRITONSERVER_MEMORY_CPU, 0)``): the caller's
    ``as_numpy()`` on such an output raises the stub's "Tensor is stored in GPU and cannot be
    converted to NumPy." (Triton's native backends on a GPU answer in GPU memory; a Python
    model's numpy outputs are CPU memory even on ``KIND_GPU``, so the mock is the stricter
    case.) Client requests always get their outputs in CPU memory, as over HTTP/gRPC.
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
        log_verbose: int = 0,
        response_timeout: float = 5.0,
        trace_rate: int = 0,
        trace_mode: str = "triton",
        release: Optional[str] = None,
    ):
        if isinstance(trace_rate, bool) or not isinstance(trace_rate, int) or trace_rate < 0:
            raise ValueError(f"trace_rate must be an integer >= 0 (0: tracing off), not {trace_rate!r}")
        if trace_mode not in ("triton", "opentelemetry"):
            raise ValueError(f"trace_mode must be 'triton' or 'opentelemetry', not {trace_mode!r}")
        self.release = resolve(release)
        self.features = PROFILES[self.release]
        install()
        self.model_repository = Path(model_repository).resolve()
        if not self.model_repository.is_dir():
            raise FileNotFoundError(f"model repository not found: {self.model_repository}")
        self.model_config_name = model_config_name
        self.strict_outputs = strict_outputs
        self.auto_complete = auto_complete
        self.instance_wait_timeout = instance_wait_timeout
        self.response_timeout = response_timeout
        self.recorder = Recorder(log_verbose)
        self.calls: List[Call] = self.recorder.calls
        self.logs: List[LogRecord] = self.recorder.logs
        self.traces: List[TraceRecord] = self.recorder.traces
        self.trace_rate, self.trace_mode = trace_rate, trace_mode
        self._trace_ids = itertools.count(1)
        self._sampled = 0
        self.faults = FaultInjector()
        self.metric_registry = MetricRegistry()
        self._models: Dict[str, Dict[str, LoadedModel]] = {}  # name -> version -> model
        self._load_order: List[str] = []
        self._load_lock = threading.RLock()
        self._executor = Executor(self)
        self._closed = False
        activate(self)
        try:
            for name in models:
                self.load(name)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "MockTriton":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this MockTriton is closed")

    def loaded(self, name: str, version: Union[int, str] = -1) -> Optional[LoadedModel]:
        """The READY model ``name`` in ``version`` (-1 or "": the highest), else None."""
        versions = self._models.get(name)
        if not versions:
            return None
        wanted = str(version)
        if wanted in ("", "-1"):
            model = versions[max(versions, key=int)]
        else:
            model = versions.get(wanted)
        return model if model is not None and model.ready else None

    # -- model control ----------------------------------------------------------------

    def load(self, name: str, config: Optional[str] = None) -> None:
        """Load (or, with ``config``, reload) a model. Raises :class:`LoadError`.

        ``config``: a JSON model configuration overriding the file (as
        ``pb_utils.load_model(name, config=...)``). Ensembles load their composing
        models. Loading a READY model without ``config`` does nothing.
        """
        with self._load_lock:
            self._check_open()
            if self.loaded(name) is not None and config is None and not self.faults.is_dead(name):
                return
            self.faults.revive(name)  # a load starts new stubs
            if name in self._models:
                self.unload(name)
            if not (self.model_repository / name).is_dir():
                self.recorder.set_state(name, "UNAVAILABLE", "not found in the model repository", "")
                raise LoadError(f"failed to load '{name}', failed to poll from model repository")
            try:
                models = build(self, name, config)
            except LoadError as exc:
                self.recorder.set_state(name, "UNAVAILABLE", exc.reason, self.recorder.state(name)[2])
                raise
            self._models[name] = {m.version: m for m in models}
            for model in models:
                model.ready = True
            self.recorder.set_state(name, "READY", "", models[-1].version)
            if name in self._load_order:
                self._load_order.remove(name)
            self._load_order.append(name)

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload a model: wait for its running execute, call ``finalize``, drop it.

        ``unload_dependents`` also unloads an ensemble's composing models. Unloading a
        model that is not loaded does nothing.
        """
        with self._load_lock:
            versions = self._models.pop(name, None)
            if not versions:
                return
            models = sorted(versions.values(), key=lambda m: int(m.version), reverse=True)
            for model in models:
                model.ready = False
            self.recorder.set_state(name, "UNLOADING", "", models[0].version)
            dead = self.faults.is_dead(name)
            self.faults.revive(name)
            for model in models:
                got_lock = model.lock.acquire(timeout=self.instance_wait_timeout)
                try:
                    if dead:  # a killed stub runs no finalize
                        model.instance = None
                    finalize(self, model)
                finally:
                    if got_lock:
                        model.lock.release()
            self.recorder.set_state(name, "UNAVAILABLE", "unloaded", models[0].version)
            if name in self._load_order:
                self._load_order.remove(name)
            if unload_dependents:
                for step_model in {s.model_name for m in models for s in m.steps}:
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
            deactivate(self)

    def is_model_ready(self, name: str, version: Union[str, int] = "") -> bool:
        """As ``pb_utils.is_model_ready``/the KServe ready endpoint: ``version`` "" (or -1)
        is the highest loaded version, else that version (every version the
        ``version_policy`` names is served). With the ``is_ready`` feature of the release
        profile (python_backend r26.03, PR #430) a loaded Python model whose class defines
        ``is_ready()`` (sync or async) is asked: anything but ``True``/``False``, an
        exception or no answer within 5 s reports not ready."""
        model = self.loaded(name, version)
        if model is None:
            return False
        if IS_READY not in self.features or not hasattr(model.instance, "is_ready"):
            return True
        return self._user_ready(model)

    def _user_ready(self, model: LoadedModel) -> bool:
        try:
            with running(self, model):
                answer = model.instance.is_ready()
            if asyncio.iscoroutine(answer):
                answer = asyncio.run_coroutine_threadsafe(answer, model.loop()).result(timeout=5.0)
        except Exception as exc:  # the stub reports not ready and logs the error
            self.recorder.log(LogRecord(model.name, "ERROR", f"is_ready() failed: {type(exc).__name__}: {exc}"))
            return False
        if not isinstance(answer, bool):
            self.recorder.log(LogRecord(model.name, "ERROR", "is_ready() must return a boolean value"))
            return False
        return answer

    def repository_index(self) -> List[dict]:
        """Like Triton's repository index: every model directory with its state.

        Items: ``{"name", "version", "state", "reason"}``, one per served version of a
        READY model (as Triton lists them); ``state`` is ``""`` for models never loaded,
        else ``READY``/``UNAVAILABLE``/``LOADING``/``UNLOADING``.
        """
        names = sorted(p.name for p in self.model_repository.iterdir() if p.is_dir())
        out = []
        for name in names:
            state, reason, version = self.recorder.state(name)
            served = sorted(self._models.get(name, {}), key=int) if state == "READY" else [version]
            for each in served:
                out.append({"name": name, "version": each, "state": state, "reason": reason})
        return out

    def model_config(self, name: str) -> dict:
        """The configuration dict handed to the loaded model (``json.loads(args["model_config"])``).
        Raises KeyError when it is not loaded."""
        model = self.loaded(name)
        if model is None:
            raise KeyError(f"model '{name}' is not loaded")
        return json.loads(model.config_json)

    def instance(self, name: str, version: Union[int, str] = -1) -> Any:
        """The ``TritonPythonModel`` object of a loaded Python model, its highest version
        unless ``version`` is given (for white-box tests). Raises KeyError when it is not
        loaded."""
        model = self.loaded(name, version)
        if model is None or model.instance is None:
            raise KeyError(f"Python model '{name}' is not loaded")
        return model.instance

    # -- test helpers -----------------------------------------------------------------

    def calls_to(self, model: str) -> List[tuple]:
        """Batch sizes of each ``execute()`` of ``model``, e.g. ``[(2,), (1, 1)]``."""
        with self.recorder.lock:
            return [c.batch_sizes for c in self.calls if c.model == model]

    def reset_calls(self) -> None:
        with self.recorder.lock:
            self.calls.clear()

    def fail_next(self, model: str, message: str = "injected failure", count: int = 1,
                  code: str = "INTERNAL") -> None:
        """Make the next ``count`` requests reaching ``model`` get an error response.

        Applies to every request to that model (client, BLS or ensemble step) that passed
        validation; the model's ``execute`` does not see them. The error text is
        ``message`` (BLS callers see it as ``response.error().message()``); ``code`` a
        Triton error code name (KeyError for an unknown one).
        """
        self.faults.fail_next(model, message, count, code)

    def set_failure(self, model: str, failure: Union[None, str, Callable[..., Any]],
                    code: str = "INTERNAL") -> None:
        """Make requests to ``model`` fail until cleared (``failure=None``).

        ``failure`` is a message (every request fails) or a predicate
        ``f(inputs: dict[str, np.ndarray], parameters: dict) -> str | bool | None``: a
        string is the error message, ``True`` a default message, falsy lets it through.
        """
        self.faults.set_failure(model, failure, code)

    def set_delay(self, model: str, seconds: Optional[float]) -> None:
        """Sleep ``seconds`` in each ``execute()`` of ``model`` (holding its instance)."""
        self.faults.set_delay(model, seconds)

    def kill_stub(self, model: str) -> None:
        """Make ``model``'s stub process dead, as after a SIGKILL of it in Triton 2.51: the
        model stays READY (ready endpoint, repository index, ``is_model_ready``) and every
        request to it (client, BLS, ensemble step) fails with ``Stub process '<instance>' is
        not healthy.`` (INTERNAL; python_backend r24.10 ``stub_launcher.cc``; Triton answers
        after about 1 s, the mock at once) until the model is loaded again. ``finalize`` is
        not called on unload (a dead stub cannot run it). Raises KeyError when the model
        is not loaded."""
        loaded = self.loaded(model)
        if loaded is None:
            raise KeyError(f"model '{model}' is not loaded")
        self.faults.kill(model, f"Stub process '{loaded.instance_name}' is not healthy.")

    def clear_faults(self, model: Optional[str] = None) -> None:
        """Remove the faults of ``model`` (of every model when None)."""
        self.faults.clear(model)

    def metrics(self) -> Dict[str, Dict[frozenset, Any]]:
        """Custom metric values: ``{family: {frozenset(labels.items()): value}}``.

        Counter and gauge values are floats; a histogram value is a dict
        ``{"count": int, "sum": float, "buckets": {upper_bound: cumulative_count, ...,
        inf: count}}``. A series exists while a ``Metric`` object for it is alive.
        """
        return snapshot(self.metric_registry)

    def metrics_text(self) -> str:
        """The models' own metric families (``pb_utils.MetricFamily``) as Triton's ``/metrics``
        endpoint shows them: Prometheus text, byte for byte as the 2.51 server writes each
        family's block (tests/server/test_mock_agrees_metrics_text.py). Triton's own ``nv_*``
        families are not emulated."""
        return exposition(self.metric_registry)

    def metric(self, family: str, labels: Optional[dict] = None) -> Any:
        """One value of :meth:`metrics` (``None`` if absent)."""
        return self.metrics().get(family, {}).get(frozenset((labels or {}).items()))

    # -- inference --------------------------------------------------------------------

    def _client_model(self, name: str, version: str = "") -> Union[LoadedModel, Err]:
        self._check_open()
        model = self.loaded(name, version)
        if model is not None:
            return model
        if version not in ("", "-1") and self.loaded(name) is not None:
            return Err(
                f"Request for unknown model: '{name}' version {version} is not found",
                ErrorCode.NOT_FOUND, "notready",
            )
        if self.recorder.state(name)[0] != "":
            return Err(
                f"Request for unknown model: '{name}' has no available versions",
                ErrorCode.NOT_FOUND, "notready",
            )
        return Err(
            f"Request for unknown model: '{name}' is not found", ErrorCode.INVALID_ARG, "notready"
        )

    def infer(
        self,
        model: str,
        inputs: Dict[str, np.ndarray],
        parameters: Optional[dict] = None,
        request_id: str = "",
        *,
        outputs: Optional[Sequence[str]] = None,
        model_version: str = "",
    ) -> Dict[str, np.ndarray]:
        """One inference request, as a client would send it. Raises :class:`InferError`.

        ``inputs``: name -> numpy array (full shape, batch dimension first for batching
        models). ``parameters``: KServe request parameters (str -> bool/int/float/str).
        ``outputs``: output names to request (default: all). ``model_version``: the
        version to run ("": the highest served). Returns name -> numpy array
        (BYTES as object arrays of ``bytes``). Raises TypeError/ValueError for what
        tritonclient would refuse to send, RuntimeError once closed.
        """
        return self.infer_response(model, inputs, parameters, request_id, outputs=outputs,
                                   model_version=model_version)[0]

    def infer_response(
        self,
        model: str,
        inputs: Dict[str, np.ndarray],
        parameters: Optional[dict] = None,
        request_id: str = "",
        *,
        outputs: Optional[Sequence[str]] = None,
        model_version: str = "",
    ) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        """:meth:`infer`, also returning the response's KServe ``parameters`` (empty unless
        the model set some, which needs a release profile with ``response_parameters``)."""
        request = client_request(model, inputs, parameters, request_id, outputs)
        target = self._client_model(model, str(model_version))
        if isinstance(target, Err):
            raise InferError(target.message, target.code.name)
        if target.decoupled:
            raise InferError(UNARY_DECOUPLED, "UNSUPPORTED")
        self._sample(request, target.name)
        answer = self._executor.run(target, [request], frontend=True)[0]
        result = to_client(answer)
        if isinstance(result, InferError):
            raise result
        return result, dict(getattr(answer, "parameters", {}))

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
        prepared = [client_request(model, *parse_item(item, i)) for i, item in enumerate(requests)]
        target = self._client_model(model)
        if isinstance(target, Err):
            return [InferError(target.message, target.code.name) for _ in prepared]
        if target.decoupled:
            return [InferError(UNARY_DECOUPLED, "UNSUPPORTED") for _ in prepared]
        for request in prepared:
            self._sample(request, target.name)
        return [to_client(r) for r in self._executor.run(target, prepared, frontend=True)]

    def infer_stream(
        self,
        model: str,
        inputs: Dict[str, np.ndarray],
        parameters: Optional[dict] = None,
        request_id: str = "",
        *,
        outputs: Optional[Sequence[str]] = None,
        model_version: str = "",
    ) -> List[StreamResponse]:
        """One request on a gRPC stream (``tritonclient.grpc``'s ``async_stream_infer``
        with ``enable_empty_final_response=True``): every response, in order, up to the
        one flagged final. Works for decoupled models (any number of responses; a
        flag-only final arrives as ``StreamResponse({}, None, True)``) and others (one
        response: final unless the model sent it through its response sender without
        ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``, as Triton's stream shows it; nothing
        after it, as Triton shows neither a flag-only final nor a later error response
        of a non-decoupled model). Error responses are items too (nothing is raised for them);
        after an error a decoupled model may still send more. Waits up to
        ``response_timeout`` seconds for each response (Triton waits for ever), then ends
        with a mock-only error. Arguments as :meth:`infer`.
        """
        request = client_request(model, inputs, parameters, request_id, outputs)
        target = self._client_model(model, str(model_version))
        if isinstance(target, Err):
            return [StreamResponse(None, InferError(target.message, target.code.name), True)]
        self._sample(request, target.name)
        stream = self._executor.run_streams(target, [request], frontend=True)[0]
        return [self._stream_response(item) for item in stream.drain()]

    @staticmethod
    def _stream_response(item: Item) -> StreamResponse:
        if item.result is None:
            return StreamResponse({}, None, item.final)
        result = to_client(item.result)
        if isinstance(result, InferError):
            return StreamResponse(None, result, item.final)
        return StreamResponse(result, None, item.final)

    def _sample(self, req: Req, model: str) -> None:
        """Trace every ``trace_rate``-th client request (Triton's ``TraceSetting::SampleTrace``)."""
        if self.trace_rate <= 0:
            return
        with self.recorder.lock:
            self._sampled += 1
            if self._sampled % self.trace_rate:
                return
            trace_id = next(self._trace_ids)
        req.trace = InferenceTrace._traced(trace_id, trace_id, self.trace_mode == "opentelemetry")
        self.recorder.trace(TraceRecord(trace_id, 0, model, req.request_id))

    def _spawn(self, req: Req, parent: InferenceTrace, model: str) -> None:
        """A BLS call given a traced request's trace: a child trace (``parent_id``)."""
        if parent._id == 0:
            return
        with self.recorder.lock:
            trace_id = next(self._trace_ids)
        req.trace = InferenceTrace._traced(trace_id, parent._root, parent._context is not None)
        self.recorder.trace(TraceRecord(trace_id, parent._id, model, req.request_id))

    def bls_exec(self, request: InferenceRequest, decoupled: bool = False) -> Any:
        """``request.exec(decoupled)`` from a model (or a test): the response, errors
        included; with ``decoupled`` a :class:`~orchestrator.testing.mock.decoupled.ResponseIterator`
        of every response (the final one too, empty when flag-only), returned once the
        first is there, as python_backend r24.10's ``RequestExecutor`` and stub do. A
        decoupled model called without ``decoupled=True`` answers the stub's error."""
        name = request._model_name
        prefix = f"Model {name} - Error when running inference: "
        model = None if self._closed else self.loaded(name, request._model_version)
        error: Optional[str] = None
        if model is None:
            error = prefix + f"Failed for execute the inference request. Model '{name}' is not ready."
        elif model.decoupled and not decoupled:
            error = prefix + (
                f"Model {name} is using the decoupled. The current BLS request call doesn't "
                "support models using the decoupled transaction policy. Please use "
                "'decoupled=True' argument to the 'exec' or 'async_exec' calls for "
                "decoupled models.'"
            )
        if error is not None or model is None:
            response = InferenceResponse(error=TritonError(error or ""))
            return ResponseIterator(response, True, _no_more) if decoupled else response
        req = Req(
            [(t.name(), t._dtype, t._wire_array()) for t in request._inputs],
            sorted(request._requested) or None,
            json.loads(request._parameters_json),
            request._request_id,
            request._correlation_id,
            request._flags,
            request._timeout,
        )
        self._spawn(req, request._trace, model.name)
        memory = request._preferred_memory
        # a KIND_GPU model's outputs stay in its GPU memory unless CPU memory was asked for
        # (request_executor.cc ResponseAlloc); BLS responses carry parameters from r25.02 (PR #395)
        gpu = int(model.device_id) if model.instance_kind == "GPU" and not (memory is not None and memory.is_cpu()) else None
        parameters = RESPONSE_PARAMETERS in self.features
        if decoupled:
            stream = self._executor.run_streams(model, [req])[0]
            first, final = _bls_item(stream.get(), prefix, gpu, parameters)
            return ResponseIterator(first, final, lambda: _bls_item(stream.get(), prefix, gpu, parameters))
        return _bls_response(self._executor.run(model, [req])[0], prefix, gpu, parameters)

    def __repr__(self) -> str:
        loaded = ", ".join(sorted(self._models))
        return f"MockTriton({str(self.model_repository)!r}, loaded=[{loaded}])"


def _bls_response(result: Any, prefix: str, gpu: Optional[int] = None, parameters: bool = False) -> InferenceResponse:
    """A BLS caller's view of a result (None: a flag-only final, an empty response);
    errors refused before ``execute`` carry the RequestExecutor's prefix. ``gpu``: the
    device whose memory holds the outputs (None: CPU); ``parameters``: the release passes
    response parameters on."""
    if result is None:
        return InferenceResponse([])
    if isinstance(result, Err):
        stage_prefix = prefix if result.stage in ("validation", "notready") else ""
        return InferenceResponse(error=TritonError(stage_prefix + result.message))
    if gpu is not None:
        response = InferenceResponse([Tensor._on_gpu(n, d, a, gpu) for n, d, a in result.outputs])
    else:
        response = InferenceResponse([Tensor._wire(n, d, a) for n, d, a in result.outputs])
    if parameters:
        response._parameters = dict(result.parameters)
    return response


def _bls_item(item: Item, prefix: str, gpu: Optional[int] = None, parameters: bool = False) -> tuple:
    return _bls_response(item.result, prefix, gpu, parameters), item.final


def _no_more() -> tuple:  # pragma: no cover - a finished iterator never asks
    raise StopIteration
