"""The router serving a tensor pipeline (a policy with the top-level key ``pipeline``).

``router.TritonPythonModel.initialize`` hands the model to :class:`PipelineRouter` when its
policy is a pipeline; the text router's path is not touched. The router's own configuration
(``args['model_config']``: inputs, outputs, ``max_batch_size``, dims) is the pipeline's
contract with clients, as an ensemble's is:

- each request's inputs are read by name (an absent optional input is an absent tensor;
  a required one missing, a data type, rank, fixed dimension or batch size that disagrees
  with the config is that request's INVALID_ARG naming the input), never converted (BYTES
  stay object arrays of ``bytes``);
- request parameters: those the policy declares (``request_parameters``, values checked) or
  ignores (``ignored_parameters`` patterns; a migrated ensemble has ``["*"]``) are accepted
  and forwarded to steps (bool, int and string only: what a BLS request carries); any other
  is refused naming it;
- the response carries ``pipeline.outputs`` in that order, each as the step produced it
  (data type included: Triton does not convert a model's outputs either), an output no node
  produced for the request left out; with ``max_batch_size: 0`` an output of a batching
  step (``model_dims`` or ``add_batch_dim``) of batch size 1 loses that dimension when it
  does not fit the router's dims, as Triton reshapes an ensemble's outputs.

``describe_policy: true`` (a request parameter, never forwarded) adds the router's optional
``POLICY`` output: the policy document as JSON (BYTES, one per row), as for text policies;
it needs a ``POLICY`` output of ``TYPE_STRING`` in the router's config that is not a pipeline
output (a migrated ensemble has none: its outputs are the ensemble's), else the request is
refused naming why. ``POLICY`` asked for without the parameter is refused too. A request
that asks only for ``POLICY`` runs no step (its outputs need none).

Every BLS call goes through ``bls.downstream.Downstream`` (circuit breaker per model, stub
watch, CPU memory, the request's trace and time left). Warmup samples (``model_warmup``)
run through the pipeline as any request; admission control (``admission``) refuses what it
cannot run in time, as for text policies.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.runtime.bls.downstream import Downstream
from orchestrator.runtime.errors import (
    DeadlineExceeded,
    InputError,
    OrchestratorError,
    Overloaded,
    PolicyError,
    RequestCancelled,
)
from orchestrator.runtime.execution.pipeline import PipelineRun, Req, plan_lists, reshape_dims
from orchestrator.runtime.metrics import Metrics, observe_stage
from orchestrator.runtime.request import DESCRIBE_PARAMETER, POLICY_OUTPUT, never_cancelled, parse_bool, request_parameters
from orchestrator.runtime.routing.pipeline_plan import Pruning, bind_pipeline, describe_pipeline, switch_exports, with_batches
from orchestrator.runtime.routing.policy import PipelinePolicy
from orchestrator.runtime.routing.tensors import RouterSpec, TensorSpec, callee_config, router_spec
from orchestrator.runtime.serving.admission import Admission
from orchestrator.runtime.serving.releases import cpu_outputs


def policy_output(spec: RouterSpec, outputs: Sequence[str]) -> Tuple[Optional[TensorSpec], str]:
    """The router's ``POLICY`` output (None: it has none it can answer, and why)."""
    out = spec.output(POLICY_OUTPUT)
    if out is None:
        return None, (f"router '{spec.name}' has no {POLICY_OUTPUT} output in its config (a migrated ensemble's "
                      f"outputs are the ensemble's); add {{ name: \"{POLICY_OUTPUT}\" data_type: TYPE_STRING dims: [ 1 ] }} "
                      "to its outputs to read its policy")
    if POLICY_OUTPUT in outputs:
        return None, f"{POLICY_OUTPUT} is an output of this router's pipeline (pipeline.outputs), not its policy"
    if out.data_type != "TYPE_STRING":
        return None, f"router '{spec.name}' declares {POLICY_OUTPUT} as {out.data_type}; the policy needs TYPE_STRING"
    return out, ""


def _same_dtype(array: Any, wanted: Any) -> bool:
    if wanted is np.object_:
        return bool(array.dtype == np.object_ or array.dtype.kind in "SU")
    return bool(array.dtype == np.dtype(wanted))


class PipelineRouter:
    """A pipeline policy served (module docstring).

    Args:
        pb: ``triton_python_backend_utils``.
        policy: the parsed pipeline policy.
        config: the router's configuration (``args['model_config']`` as a dict).
        repository: the model repository (callees' ``max_batch_size`` from their config.pbtxt).
        name: the router's model name.
        metrics: the router's metrics.
        clock: the engine clock (seconds, monotonic).
        warmups: how many first executes are Triton's warmup (``router.warmup_executes``).

    Raises:
        ValueError: the pipeline does not fit the router's config (``bind_pipeline``).
    """

    def __init__(self, pb: Any, policy: PipelinePolicy, config: Dict[str, Any], repository: Any, name: str,
                 metrics: Metrics, clock: Any = time.monotonic, warmups: int = 0) -> None:
        self.pb, self.policy, self.name, self.metrics, self.clock = pb, policy, name, metrics, clock
        self.spec: RouterSpec = router_spec(config)
        try:
            bound = bind_pipeline(policy.pipeline, self.spec)
        except PolicyError as exc:
            raise ValueError(f"router: invalid pipeline policy: {exc}") from None
        callees = {s.model: callee_config(repository, s.model) for s in bound.step_nodes()}
        for s in bound.step_nodes():
            callee = callees[s.model]
            if callee is not None and callee.decoupled:
                raise ValueError(f"router: invalid pipeline policy: {s.where}: model '{s.model}' is decoupled "
                                 "(model_transaction_policy); a pipeline step needs exactly one response per request")
        self.pipeline = with_batches(bound, {m: None if c is None else c.max_batch_size for m, c in callees.items()})
        self.plans, self.fills = plan_lists(self.pipeline.steps, self.spec)
        self.exports = switch_exports(self.pipeline)
        self.pruning = Pruning(self.pipeline)
        self.policy_output, self.no_policy = policy_output(self.spec, self.pipeline.outputs)
        self.policy_json = json.dumps(policy.source).encode("utf-8")
        self.all_outputs = {o.name for o in self.spec.outputs}
        self.downstream = Downstream(pb, policy, metrics, pb.Logger, name, cpu_outputs(pb))
        self.admission = Admission(policy.admission) if policy.admission is not None else None
        self.warmups_left = warmups
        self.loop = asyncio.new_event_loop()

    def close(self) -> None:
        """Stop the background threads and close the event loop."""
        self.downstream.close()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    def describe(self) -> str:
        """The pipeline as a text tree, for the load log."""
        return describe_pipeline(self.pipeline)

    # -- requests

    def parse(self, request: Any, start: float) -> Req:
        """One request's tensors, rows, parameters and deadline (raises InputError naming the input)."""
        batching = self.spec.max_batch_size > 0
        tensors: Dict[str, Any] = {}
        rows: Optional[int] = None
        for spec in self.spec.inputs:
            t = self.pb.get_input_tensor_by_name(request, spec.name)
            if t is None:
                if not spec.optional:
                    raise InputError(f"input '{spec.name}' is required")
                continue
            array = t.as_numpy()
            if not _same_dtype(array, spec.dtype):
                raise InputError(f"input '{spec.name}': data type {array.dtype} is not the router's {spec.data_type}")
            shape = array.shape[1:] if batching else array.shape
            if len(shape) != len(spec.dims) or any(d >= 0 and d != s for d, s in zip(spec.dims, shape)):
                raise InputError(f"input '{spec.name}': shape {list(array.shape)} does not match dims {list(spec.dims)}"
                                 + (" after the batch dimension" if batching else ""))
            if batching:
                if rows is not None and array.shape[0] != rows:
                    raise InputError(f"input '{spec.name}': batch size {array.shape[0]}, other inputs have {rows}")
                rows = int(array.shape[0])
            tensors[spec.name] = array
        params = dict(request_parameters(request.parameters()))
        requested, describe = self.outputs(request, params)
        for key, value in params.items():
            declared = self.policy.request_parameters.get(key)
            if declared is not None:
                if str(value) not in declared:
                    raise InputError(f"parameter {key}={value!r}: not one of {', '.join(declared)}")
            elif not any(fnmatch.fnmatchcase(key, p) for p in self.policy.ignored_parameters):
                known = ", ".join(sorted(self.policy.request_parameters)) or "none"
                raise InputError(f"parameter {key!r}: not a parameter of this router (it accepts: {known})")
        forward = {k: v for k, v in params.items() if isinstance(v, (bool, int, str))}
        timeout_us = int(request.timeout() or 0)
        return Req(tensors, rows if rows is not None else 1, params, forward, request.request_id(), request.trace(),
                   start + timeout_us / 1e6 if timeout_us else None,
                   request.is_cancelled if self.policy.check_cancelled else never_cancelled,
                   requested=requested, skip=self.pruning.skip(requested), describe=describe)

    def outputs(self, request: Any, params: Dict[str, Any]) -> Tuple[Tuple[str, ...], bool]:
        """The outputs ``request`` asked for (empty: all) and whether it asked for ``POLICY``
        (``describe_policy``, taken out of ``params``); raises InputError (module docstring)."""
        describe = parse_bool(params.pop(DESCRIBE_PARAMETER, False), DESCRIBE_PARAMETER)
        requested = tuple(request.requested_output_names())
        if set(requested) >= self.all_outputs:
            requested = ()  # the client named none (Triton then lists them all), or all
        if describe and self.policy_output is None:
            raise InputError(f"parameter {DESCRIBE_PARAMETER}: {self.no_policy}")
        if self.policy_output is not None and POLICY_OUTPUT in requested and not describe:
            raise InputError(f"{POLICY_OUTPUT}: this output is only produced for requests with the parameter "
                             f"{DESCRIBE_PARAMETER}=true")
        return requested, describe

    def respond(self, req: Req) -> Any:
        """The response of a request the pipeline ran (its error, or its outputs in order)."""
        if req.error is not None:
            return self.fail(req.error)
        tensors = []
        for name in self.pipeline.outputs:
            array = req.tensors.get(name)
            if array is None or (req.requested and name not in req.requested):
                continue  # no node produced it (left out, as an ensemble does), or not asked for
            spec = self.spec.output(name)
            if self.spec.max_batch_size == 0 and spec is not None:  # a batching step's output, as an ensemble's
                array = reshape_dims(array, spec.dims, False, req.batch.get(name, 0))
            tensors.append(self.pb.Tensor(name, array))
        if req.describe and self.policy_output is not None:  # one document per row, the output's dims
            shape = ((req.rows,) if self.spec.max_batch_size > 0 else ()) + tuple(max(d, 1) for d in self.policy_output.dims)
            tensors.append(self.pb.Tensor(POLICY_OUTPUT, np.full(shape, self.policy_json, dtype=np.object_)))
        return self.pb.InferenceResponse(output_tensors=tensors)

    def fail(self, exc: BaseException, log: bool = True) -> Any:
        """The error response of a request (``OrchestratorError``: its code; else INTERNAL, logged)."""
        from orchestrator.runtime.models._triton import error_response

        self.metrics.inc("orchestrator_requests_total", outcome="error")
        if isinstance(exc, Overloaded):
            self.metrics.inc("orchestrator_shed_requests_total")
        elif isinstance(exc, RequestCancelled):
            self.metrics.inc("orchestrator_cancelled_requests_total")
        elif isinstance(exc, DeadlineExceeded):
            self.metrics.inc("orchestrator_expired_requests_total")
        if isinstance(exc, OrchestratorError):
            return error_response(f"router: {exc}", exc.code)
        if log:
            self.pb.Logger.log_error("router: unexpected error: " + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return error_response(f"router: internal error: {type(exc).__name__}: {exc}", "INTERNAL")

    # -- execute

    def warmup(self, requests: List[Any]) -> List[Any]:
        """Answer Triton's warmup samples without a downstream call: Triton runs them before
        the router is ready, while the models it calls may still be loading (a failed
        sample would fail the router's load). Each sample is parsed as a request (a bad
        sample is an error: it fails the load, as it should) and answered with zeros (empty
        bytes) of the outputs' types, variable dims as 1: the parsing, the event loop and the
        response path are warm before the first client request."""
        start = self.clock()
        out = []
        for request in requests:
            try:
                req = self.parse(request, start)
            except InputError as exc:
                out.append(self.fail(exc))
                continue
            tensors = []
            for name in self.pipeline.outputs:
                spec = self.spec.output(name)
                assert spec is not None, "bind_pipeline checked the outputs"
                shape = ((req.rows,) if self.spec.max_batch_size > 0 else ()) + tuple(max(d, 1) for d in spec.dims)
                array = np.full(shape, b"", dtype=np.object_) if spec.dtype is np.object_ else np.zeros(shape, spec.dtype)
                tensors.append(self.pb.Tensor(name, array))
            out.append(self.pb.InferenceResponse(output_tensors=tensors))
        self.pb.Logger.log_info(f"router '{self.name}': warmup sample answered without downstream calls")
        return out

    def execute(self, requests: List[Any], delay_s: float = 0.0) -> List[Any]:
        """One response per request, in order (``delay_s``: the router's queue-delay
        estimate, ``router.QueueDelay``, for admission control); the first ``warmups``
        executes are Triton's warmup (:meth:`warmup`)."""
        if self.warmups_left > 0:
            self.warmups_left -= 1
            return self.warmup(requests)
        admitted, refusal = len(requests), None
        if self.admission is not None:
            admitted = self.admission.admit(len(requests), delay_s)
            if admitted < len(requests):
                refusal = Overloaded(self.admission.message(delay_s, admitted))
        began = time.perf_counter()
        try:
            responses = self.loop.run_until_complete(self._execute(requests[:admitted]))
        finally:
            if self.admission is not None:
                self.admission.ran(admitted, time.perf_counter() - began)
        if refusal is not None:
            responses += [self.fail(refusal) for _ in requests[admitted:]]
        return responses

    async def _execute(self, requests: Sequence[Any]) -> List[Any]:
        start = self.clock()
        began = time.perf_counter()
        responses: List[Any] = [None] * len(requests)
        reqs: Dict[int, Req] = {}
        for k, request in enumerate(requests):
            try:
                reqs[k] = self.parse(request, start)
            except InputError as exc:
                responses[k] = self.fail(exc)
        observe_stage(self.metrics, "parse", began)
        run = PipelineRun(self.pipeline.steps, self.spec, self.downstream.call_step, self.clock, self.metrics,
                          self.fills, self.plans, self.exports, self.downstream.models if self.downstream.models.enabled else None)
        try:
            await run.run(list(reqs.values()))
        except Exception as exc:  # a bug fails these requests, never the instance
            for i, k in enumerate(reqs):
                responses[k] = self.fail(exc, log=i == 0)
            return responses
        began = time.perf_counter()
        ok = 0
        for k, req in reqs.items():
            responses[k] = self.respond(req)
            ok += req.error is None
        observe_stage(self.metrics, "respond", began)
        self.metrics.inc("orchestrator_requests_total", ok, outcome="success")
        return responses
