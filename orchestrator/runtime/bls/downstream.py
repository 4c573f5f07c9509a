"""The router's downstream client: every BLS call it makes, behind one narrow interface.

:class:`Downstream` owns what a call to another model needs: the blocking or asynchronous
BLS request, a circuit breaker per model (``health.CircuitBreaker``; the candidates of
``shadow`` nodes get breakers of their own, so their failures never open a circuit the
answers depend on), the look in ``/proc`` for a dead Python-backend stub
(``stubs.StubWatch``), readiness, and the repair of a model whose stub died
(``ondemand.ModelManager.repair``). Every BLS request asks for its outputs in CPU memory
(``releases.cpu_outputs``): a ``KIND_GPU`` model would otherwise answer in GPU memory, which
``as_numpy()`` refuses. :meth:`Downstream.not_ready` is the router's readiness (its
``is_ready()`` hook on releases that call it). The engine sees only its :meth:`Downstream.infer`
(``engine.InferFn``), the seam the tests fake; the router parses, runs, responds and warms
up (``router``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from numpy.typing import NDArray

from orchestrator.runtime.bls.health import CircuitBreaker, CircuitState, classify
from orchestrator.runtime.bls.ondemand import ModelManager
from orchestrator.runtime.bls.stubs import StubWatch
from orchestrator.runtime.errors import Cause, DownstreamError, UnavailableError
from orchestrator.runtime.execution.deadlines import CallOptions
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.routing import nodes as N
from orchestrator.runtime.routing.nodes.model import split_target
from orchestrator.runtime.routing.nodes.shadow import ShadowNode
from orchestrator.runtime.routing.policy import Policy
from orchestrator.runtime.serving.releases import cpu_outputs

NO_OPTIONS = CallOptions()


class Downstream:
    """BLS calls of one router instance, through circuit breakers, with repairs.

    Args:
        pb: the ``triton_python_backend_utils`` module (or the mock's).
        policy: the bound policy (its ``circuit_breaker`` settings and models).
        metrics: where circuit states, transitions and on-demand loads are counted.
        logger: ``pb_utils.Logger``.
        router: the router model's own name (never repaired, never watched).

    Attributes:
        models: the on-demand model manager (loads, idle unloads, repairs).
    """

    def __init__(self, pb: Any, policy: Policy, metrics: Metrics, logger: Any, router: str):
        self.pb, self.policy, self.metrics, self.logger, self.router = pb, policy, metrics, logger, router
        settings = policy.breaker
        self.stub_watch = StubWatch.of_parent() if settings.watch_stubs else StubWatch(None)
        self.breaker = CircuitBreaker(
            settings, on_change=self._circuit_changed, on_unhealthy=self._unhealthy, ready_check=self._ready,
        )
        self.shadow_breaker = CircuitBreaker(settings, ready_check=self._ready)
        self.cpu_memory = cpu_outputs(pb)  # one PreferredMemory for every BLS request
        self.targets = {m: split_target(m) for m in policy.models()}  # call target -> (model, version), once
        self.models = ModelManager(
            pb, policy.on_demand(), metrics, logger,
            repair_interval_s=settings.reload_interval_s, on_repaired=self.breaker.half_open,
        )
        for model in policy.models():
            metrics.set("orchestrator_circuit_state", CircuitState.CLOSED.gauge, model=model)

    def close(self) -> None:
        """Stop the on-demand manager's background thread."""
        self.models.close()

    # -- the engine's InferFn (engine.InferFn): outputs by name, or DownstreamError

    async def infer(self, model: str, inputs: Dict[str, NDArray[Any]], parameters: Optional[Dict[str, Any]], request_id: str,
                    alone: bool = False, options: CallOptions = NO_OPTIONS) -> Dict[str, NDArray[Any]]:
        """One call to ``model`` through its circuit breaker (raises DownstreamError)."""
        return await self._call(self.breaker, model, inputs, parameters, request_id, alone, options)

    async def shadow_infer(self, model: str, inputs: Dict[str, NDArray[Any]], parameters: Optional[Dict[str, Any]], request_id: str,
                           alone: bool = False, options: CallOptions = NO_OPTIONS) -> Dict[str, NDArray[Any]]:
        """Like :meth:`infer`, through the shadow candidates' own breakers."""
        return await self._call(self.shadow_breaker, model, inputs, parameters, request_id, alone, options)

    @staticmethod
    async def no_infer(model: str, inputs: Dict[str, NDArray[Any]], parameters: Optional[Dict[str, Any]], request_id: str,
                       alone: bool = False, options: CallOptions = NO_OPTIONS) -> Dict[str, NDArray[Any]]:
        """The warmup's InferFn: no downstream call is made (raises DownstreamError)."""
        raise DownstreamError(f"model '{model}' is not called during warmup")

    async def _call(self, breaker: CircuitBreaker, model: str, inputs: Dict[str, NDArray[Any]],
                    parameters: Optional[Dict[str, Any]], request_id: str, alone: bool,
                    options: CallOptions) -> Dict[str, NDArray[Any]]:
        """One BLS call to ``model`` under ``breaker`` (``health.CallGuard``), failed at once
        when the stub watch saw its stub exit (raises DownstreamError)."""
        async with breaker.guard(model):
            dead = self._stub_dead(model)
            if dead:  # as python_backend would say it, 1 s later
                raise UnavailableError(dead, Cause.STUB_DEAD)
            return await self._bls(model, inputs, parameters, request_id, alone, options)

    async def _bls(self, model: str, inputs: Dict[str, NDArray[Any]], parameters: Optional[Dict[str, Any]], request_id: str,
                   alone: bool, options: CallOptions) -> Dict[str, NDArray[Any]]:
        """One BLS call to ``model`` (a name, or ``name@version``: that version); the
        blocking ``exec`` when ``alone``, else ``async_exec``; with the trace and timeout of
        ``options`` (the stub refuses ``trace=None``, so it is left out when absent)."""
        pb = self.pb
        name, version = self.targets.get(model) or split_target(model)
        pinned: Dict[str, object] = {} if version is None else {"model_version": version}
        if options.trace is not None:
            pinned["trace"] = options.trace
        if options.timeout_us:
            pinned["timeout"] = int(options.timeout_us)
        request = pb.InferenceRequest(
            model_name=name,
            inputs=[pb.Tensor(key, value) for key, value in inputs.items()],
            requested_output_names=[],
            request_id=request_id,
            parameters=parameters or {},
            preferred_memory=self.cpu_memory,
            **pinned,
        )
        response = request.exec() if alone else await request.async_exec()
        if response.has_error():
            error = response.error()
            message = f"model '{model}' failed: {error.message()}"
            cause = classify(message, _code_name(pb, error))
            raise DownstreamError(message) if cause is None else UnavailableError(message, cause)
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    # -- readiness (the router's is_ready(), python_backend r26.03 and later)

    def not_ready(self) -> Optional[str]:
        """Why the policy cannot answer now, or None when it can.

        Not ready when a required model is not ready (a tokenizer model called through BLS,
        or a model outside every ``fallback`` node and ``shadow`` candidate that is not
        loaded on demand), or when every model that can answer is not ready or has its
        circuit open. Asks ``pb_utils.is_model_ready`` once per model; safe beside
        ``execute`` (the circuit states are read under the breaker's lock).
        """
        required, answering = _answer_models(self.policy)
        on_demand = self.policy.on_demand()
        missing = [m for m in required if split_target(m)[0] not in on_demand and not self._ready(m)]
        if missing:
            return f"required models not ready: {', '.join(missing)}"
        usable = [m for m in answering if self.breaker.state(m) is not CircuitState.OPEN
                  and (split_target(m)[0] in on_demand or self._ready(m))]
        if answering and not usable:
            return f"no model can answer (not ready or circuit open): {', '.join(answering)}"
        return None

    # -- the breakers' callbacks

    def _circuit_changed(self, model: str, old: CircuitState, new: CircuitState, reason: str) -> None:
        self.metrics.set("orchestrator_circuit_state", new.gauge, model=model)
        self.metrics.inc("orchestrator_circuit_transitions_total", model=model, state=new.value)
        log = self.logger.log_info if new is CircuitState.CLOSED else self.logger.log_warn
        log(f"router '{self.router}': circuit of '{model}' {old.value} -> {new.value} ({reason})")

    def _ready(self, model: str) -> bool:
        name, version = split_target(model)
        return bool(self.pb.is_model_ready(name, "" if version is None else str(version)))

    def _stub_dead(self, model: str) -> Optional[str]:
        name, _ = self.targets.get(model) or split_target(model)
        return None if name == self.router else self.stub_watch.dead(name)

    def _unhealthy(self, model: str) -> bool:
        name, _ = split_target(model)
        if self.policy.breaker.reload_unhealthy and model in self.policy.models() and name != self.router:
            return self.models.repair(name)  # True: under way, the breaker holds the circuit open
        return False


def _answer_models(policy: Policy) -> Tuple[List[str], List[str]]:
    """``(required, answering)`` call targets of ``policy``: answering are the models of its
    nodes but the ``shadow`` candidates'; required the targets the policy cannot do without
    (tokenizer models called through BLS, then models outside every ``fallback`` node)."""
    required: List[str] = [] if policy.inline_tokenizer else list(policy.tokenizers())
    answering: List[str] = []

    def visit(node: N.Node, optional: bool) -> None:
        for call in N.KINDS[node.kind].calls(node):
            answering.append(call.target)
            if not optional:
                required.append(call.target)
        if isinstance(node, ShadowNode):
            visit(node.primary, optional)  # the candidate never answers
            return
        for child in N.children(node):
            visit(child, optional or node.kind == "fallback")

    visit(policy.root, False)
    return list(dict.fromkeys(required)), list(dict.fromkeys(answering))


def _code_name(pb: Any, error: Any) -> Optional[str]:
    """The name of a BLS error's Triton code (``INTERNAL``, ``UNAVAILABLE``, ...), or None
    for a stub without codes. Triton 2.51 says ``INTERNAL`` for every BLS error
    (``health`` module docstring); kept for stubs and mocks that pass the code on."""
    try:
        code = error.code()
    except AttributeError:
        return None
    for name in ("UNAVAILABLE", "NOT_FOUND", "INTERNAL"):
        if code == getattr(pb.TritonError, name, object()):
            return name
    return None
