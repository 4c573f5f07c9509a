"""Running requests on a model: validation, injected faults, the dynamic batcher's
grouping, ``execute`` as the stub calls it, and the stub's checks of what it returns.

One instance per model: ``execute`` calls of a model are serialized by its lock (a
request waits up to ``instance_wait_timeout`` for it). An ``async def execute`` runs on
the model's own event loop and the caller waits for it, as the r24.10 stub does
(``run_coroutine_threadsafe(...).result()``). Messages of a failed ``execute`` follow
the stub's ``ProcessRequests``/``ProcessReturnedResponses`` (python_backend r24.10).

A request's ``timeout`` (microseconds) applies as in core r24.10's scheduler queue: only
for a model whose ``dynamic_batching.default_queue_policy`` sets
``default_timeout_microseconds`` (a request's own timeout counts when the policy has
``allow_timeout_override`` and it is shorter), and only to the time spent waiting for
the instance; an expired request is refused with ``Request timeout expired``
(UNAVAILABLE), a running ``execute`` is never cut short.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, List, NamedTuple, Optional, Tuple, Union

from orchestrator.testing.mock.context import running
from orchestrator.testing.mock.decoupled import ResponseStream, log_background_failure, run_decoupled
from orchestrator.testing.mock.ensemble import run_ensemble
from orchestrator.testing.mock.errors import ErrorCode, TritonModelException, format_exception
from orchestrator.testing.mock.instances import LoadedModel
from orchestrator.testing.mock.logger import LOGGER_NAME
from orchestrator.testing.mock.records import BatchFailure, Call, Err, Ok, Req, Result
from orchestrator.testing.mock.requests import FINAL, InferenceRequest, InferenceResponse
from orchestrator.testing.mock.validation import normalize
from orchestrator.testing.mock.wire import config_to_protocol, dims_str

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.testing.mock.host import Host

_LOG = logging.getLogger(LOGGER_NAME)


class Answer(NamedTuple):
    """A non-decoupled model's answer that Triton's frontends show otherwise than a plain
    result (python_backend r24.10 with server 2.51, measured on the embedded server).

    ``result``: the first response, what BLS callers and ensembles get. ``final``: whether
    it carried TRITONSERVER_RESPONSE_COMPLETE_FINAL; when the flag came alone (or with
    the error response of a failed ``execute``) a gRPC stream shows the response with
    ``triton_final_response`` false and nothing after it. ``responses``: how many
    responses the request got; 2 when a response sent without the final flag was followed
    by the error response of a failed ``execute`` (a second ``send``, or a returned
    response): HTTP and gRPC ``infer`` then answer ``expected a single response, got 2``.
    """

    result: Result
    final: bool
    responses: int


Outcome = Union[Result, ResponseStream, Answer]  # a decoupled model's requests get streams
SINGLE_RESPONSE = "expected a single response, got {}"  # server 2.51 HTTP and gRPC frontends
_STRICT_NOTE = (
    " [mock_triton strict_outputs check; real Triton 24.10 does not check this -- "
    "pass strict_outputs=False to mirror it]"
)


def queue_timeout_us(model: LoadedModel, req: Req) -> int:
    """Microseconds ``req`` may wait for the instance of ``model`` (0: no limit), as
    core r24.10's ``PolicyQueue::Enqueue``: the default timeout of the queue policy,
    replaced by the request's own when overriding is allowed and it is shorter. With
    ``timeout_action: DELAY`` nothing is refused (0)."""
    policy = (model.config.get("dynamic_batching") or {}).get("default_queue_policy") or {}
    if policy.get("timeout_action", "REJECT") != "REJECT":
        return 0
    timeout = int(policy.get("default_timeout_microseconds") or 0)
    if policy.get("allow_timeout_override") and 0 < req.timeout < timeout:
        timeout = req.timeout
    return timeout


def max_queue_size(model: LoadedModel) -> int:
    """The queue policy's ``max_queue_size`` of ``model`` (0: unbounded), as core r24.10's
    ``PolicyQueue::Enqueue`` reads it; priorities are not modelled (one queue)."""
    policy = (model.config.get("dynamic_batching") or {}).get("default_queue_policy") or {}
    return int(policy.get("max_queue_size") or 0)


def queue_full_error(req: Req) -> Err:
    """Core r24.10's refusal of a request that finds the queue full: UNAVAILABLE,
    ``[request id: <id>] Exceeds maximum queue size`` (``<id_unknown>`` without an id)."""
    return Err(f"[request id: {req.request_id or '<id_unknown>'}] Exceeds maximum queue size", ErrorCode.UNAVAILABLE, "exec")


def batch_signature(model: LoadedModel, req: Req) -> tuple:
    """What requests must share to go into one batch: the shape of each variable-size
    input without ``allow_ragged_batch`` (and of shape tensors) and, for models with
    optional inputs, the set of inputs sent."""
    signature = []
    for name, _, array in req.model_inputs:
        cfg = model.inputs[name]
        variable = any(int(d) == -1 for d in cfg.get("dims", []))
        if cfg.get("is_shape_tensor") or (variable and not cfg.get("allow_ragged_batch")):
            signature.append((name, tuple(array.shape[1:])))
    if model.has_optional_input:
        signature.append(("__inputs__", tuple(sorted(n for n, _, _ in req.model_inputs))))
    return tuple(sorted(signature))


def form_batches(model: LoadedModel, indices: List[int], reqs: List[Req]) -> List[List[int]]:
    """Group the requests ``indices`` (in order) into ``execute()`` calls as the
    dynamic batcher could: consecutive requests with the same :func:`batch_signature`
    whose batch sizes add up to at most ``max_batch_size``. Without
    ``dynamic_batching`` (or with ``max_batch_size: 0``) every request is alone."""
    if not model.dynamic_batching or model.max_batch_size == 0:
        return [[i] for i in indices]
    batches: List[List[int]] = []
    current: List[int] = []
    current_size = 0
    current_sig: Optional[tuple] = None
    for i in indices:
        size = max(1, reqs[i].batch_size)
        sig = batch_signature(model, reqs[i])
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


def collect_responses(model: LoadedModel, requests: List[InferenceRequest], returned: Any,
                      wait: float = 0.0, final: bool = True) -> List[Any]:
    """Stub's ProcessReturnedResponses: checks, then one response (or Err) per request.

    A request with None in the return gets what its response sender sends, waiting up
    to ``wait`` seconds for it (Triton waits for ever): for its final flag (``final``:
    HTTP and gRPC clients get the response then), else for the response itself (a BLS
    caller gets it as soon as it is sent, request_executor.cc). Raises BatchFailure
    where the stub fails the whole batch.
    """
    if returned is not None:
        if not isinstance(returned, list):
            raise BatchFailure(
                f"Expected a list in the execute return, found type '{type(returned)}'."
            )
        if len(returned) != len(requests):
            raise BatchFailure(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, "
                f"and InferenceResponse(s) size is:{len(returned)}\n"
            )
        for request, response in zip(requests, returned):
            if response is None:
                continue
            if not isinstance(response, InferenceResponse):
                raise BatchFailure(
                    "Expected an 'InferenceResponse' object in the execute function "
                    f"return list, found type '{type(response)}'."
                )
            try:
                request._sender._update(response, FINAL)
            except TritonModelException as exc:
                raise BatchFailure(str(exc)) from exc
    out: List[Any] = []
    for i, request in enumerate(requests):
        response = returned[i] if returned is not None else None
        if response is not None:
            out.append(response)
            continue
        sender = request._sender
        answer = sender._final(wait) if final else sender._first(wait)
        if answer is not None:
            out.append(answer)
        elif sender._responses:
            out.append(Err(
                f"mock_triton: model '{model.name}' sent a response for request {i} "
                "through its response sender but never sent "
                "TRITONSERVER_RESPONSE_COMPLETE_FINAL (real Triton keeps the request open)",
                ErrorCode.INTERNAL, "exec",
            ))
        else:
            out.append(Err(
                f"mock_triton: model '{model.name}' returned no response for request {i} "
                "(None in the execute return and nothing sent through its response "
                "sender); real Triton never answers such a request and the client waits "
                "until it times out",
                ErrorCode.INTERNAL, "exec",
            ))
    return out


def _strict_check(model: LoadedModel, req: Req, name: str, cfg: dict, dtype: str,
                  shape: List[int]) -> Optional[Err]:
    """The mock-only checks of one returned output: datatype and shape as configured."""
    expected = config_to_protocol(cfg["data_type"])
    if dtype != expected:
        return Err(
            f"model '{model.name}' returned output '{name}' with datatype "
            f"{dtype}, but its configuration declares {cfg['data_type']} "
            f"({expected})" + _STRICT_NOTE,
            ErrorCode.INTERNAL, "exec",
        )
    dims = cfg["reshape"].get("shape", []) if "reshape" in cfg else cfg.get("dims", [])
    model_dims = [int(d) for d in dims]
    batched = model.max_batch_size > 0
    full = ([max(1, req.batch_size)] if batched else []) + model_dims
    if len(shape) != len(full) or any(e != -1 and e != s for e, s in zip(full, shape)):
        shown = ([-1] if batched else []) + model_dims
        return Err(
            f"model '{model.name}' returned output '{name}' with shape "
            f"{dims_str(shape)}, but its configuration says {dims_str(shown)} "
            f"(batch size of the request: {max(1, req.batch_size)})" + _STRICT_NOTE,
            ErrorCode.INTERNAL, "exec",
        )
    return None


def finish_outputs(model: LoadedModel, req: Req, response: InferenceResponse, strict: bool) -> Result:
    """Prune to the requested outputs (as the stub does) and, when ``strict``, run the
    mock-only checks (unknown or repeated output, datatype, shape)."""
    requested = set(req.requested) if req.requested else set(model.outputs)
    outputs = []
    seen = set()
    for tensor in response.output_tensors():
        name = tensor.name()
        cfg = model.outputs.get(name)
        if strict and cfg is None:
            return Err(
                f"model '{model.name}' returned output '{name}', which is not in its "
                "configuration (real Triton drops it silently)" + _STRICT_NOTE,
                ErrorCode.INTERNAL, "exec",
            )
        if name not in requested:
            continue
        assert cfg is not None
        if name in seen and strict:
            return Err(
                f"model '{model.name}' returned output '{name}' more than once" + _STRICT_NOTE,
                ErrorCode.INTERNAL, "exec",
            )
        seen.add(name)
        array = tensor._wire_array()
        if strict:
            problem = _strict_check(model, req, name, cfg, tensor._dtype, list(array.shape))
            if problem is not None:
                return problem
        if "reshape" in cfg:
            dims = [int(d) for d in cfg.get("dims", [])]
            lead = [int(array.shape[0])] if model.max_batch_size > 0 and array.ndim > 0 else []
            if dims.count(-1) <= 1:
                try:
                    array = array.reshape(lead + dims)
                except ValueError:
                    pass
        outputs.append((name, tensor._dtype, array))
    return Ok(outputs, dict(response._parameters))


class Executor:
    """Runs requests on the models of one server (reads its ``strict_outputs`` and
    ``instance_wait_timeout`` on every call)."""

    def __init__(self, server: "Host"):
        self._server = server

    def run(self, model: LoadedModel, reqs: List[Req], frontend: bool = False) -> List[Result]:
        """One result per request: validated, faults applied, batched, executed.
        ``model`` must not be decoupled (see :meth:`run_streams`). ``frontend``: as a
        client's HTTP/gRPC ``infer`` sees it (a request that got two responses is an
        error); else as a BLS caller or an ensemble (the first response)."""
        out: List[Result] = []
        for outcome in self._run_any(model, reqs, frontend):
            assert not isinstance(outcome, ResponseStream), "decoupled model: use run_streams"
            if isinstance(outcome, Answer):
                if frontend and outcome.responses > 1:
                    outcome = Err(SINGLE_RESPONSE.format(outcome.responses), ErrorCode.INTERNAL, "exec")
                else:
                    outcome = outcome.result
            out.append(outcome)
        return out

    def run_streams(self, model: LoadedModel, reqs: List[Req], frontend: bool = False) -> List[ResponseStream]:
        """One stream of responses per request; a request refused before ``execute`` (or
        one to a non-decoupled model) gets a stream of one response, final unless
        ``frontend`` (a client's gRPC stream) and it was sent without the final flag."""
        out = []
        for o in self._run_any(model, reqs, frontend):
            if isinstance(o, Answer):
                o = ResponseStream.of(model.name, o.result, o.final or not frontend)
            out.append(o if isinstance(o, ResponseStream) else ResponseStream.of(model.name, o))
        return out

    def _run_any(self, model: LoadedModel, reqs: List[Req], frontend: bool) -> List[Outcome]:
        server = self._server
        results: List[Optional[Outcome]] = [None] * len(reqs)
        pending: List[int] = []
        for i, req in enumerate(reqs):
            problem = normalize(model, req)
            if problem is None:
                problem = server.faults.check(model.name, req)
            if problem is not None:
                results[i] = problem
            else:
                pending.append(i)
        if model.is_ensemble:
            for i in pending:
                results[i] = run_ensemble(model, reqs[i], server.loaded, self.run)
        else:
            for batch in form_batches(model, pending, reqs):
                for i, result in zip(batch, self._execute(model, [reqs[j] for j in batch], frontend)):
                    results[i] = result
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _execute(self, model: LoadedModel, reqs: List[Req], frontend: bool) -> List[Outcome]:
        """``reqs`` through the model's queue (``max_queue_size``: a request that finds it
        full is refused at once) and its instance."""
        limit = max_queue_size(model)
        accepted = len(reqs)
        if limit:
            with model.queue_lock:
                accepted = max(0, min(len(reqs), limit - model.queued))
                model.queued += accepted
        results = self._wait_and_run(model, reqs[:accepted], frontend, bool(limit)) if accepted else []
        return results + [queue_full_error(r) for r in reqs[accepted:]]

    def _wait_and_run(self, model: LoadedModel, reqs: List[Req], frontend: bool,
                      counted: bool = False) -> List[Outcome]:
        """Wait for the instance (``counted``: ``reqs`` are in ``model.queued`` until then)."""
        server = self._server
        n = len(reqs)
        enqueued = time.monotonic()
        acquired = model.lock.acquire(timeout=server.instance_wait_timeout)
        if counted:
            with model.queue_lock:
                model.queued -= n
        if not acquired:
            err = Err(
                f"mock_triton: waited {server.instance_wait_timeout}s for the instance of model "
                f"'{model.name}' (deadlock? e.g. a model calling itself)",
                ErrorCode.UNAVAILABLE, "exec",
            )
            return [err] * n
        try:
            if not model.ready or model.instance is None:
                err = Err(
                    f"Request for unknown model: '{model.name}' has no available versions",
                    ErrorCode.NOT_FOUND, "exec",
                )
                return [err] * n
            waited_us = (time.monotonic() - enqueued) * 1e6
            limits = [queue_timeout_us(model, r) for r in reqs]
            if any(0 < limit < waited_us for limit in limits):
                expired = Err("Request timeout expired", ErrorCode.UNAVAILABLE, "exec")
                keep = [i for i, limit in enumerate(limits) if not 0 < limit < waited_us]
                results: List[Outcome] = [expired] * n
                if keep:
                    for i, result in zip(keep, self._run_locked(model, [reqs[i] for i in keep], frontend)):
                        results[i] = result
                return results
            return self._run_locked(model, reqs, frontend)
        finally:
            model.lock.release()

    def _run_locked(self, model: LoadedModel, reqs: List[Req], frontend: bool) -> List[Outcome]:
        """``execute`` on ``reqs`` (the caller holds the instance) and the results; a
        response sent through the sender of a model that is not decoupled is waited for
        up to its final flag (``frontend``) or only until it is sent (a BLS caller)."""
        server = self._server
        delay = server.faults.delay(model.name)
        if delay > 0:
            time.sleep(delay)
        server.recorder.call(Call(model.name, tuple(max(1, r.batch_size) for r in reqs)))
        if model.decoupled:
            return list(run_decoupled(self._server, model, reqs, self._call_execute, finish_outputs))
        requests = [InferenceRequest._for_execute(model, r) for r in reqs]
        answers: List[Tuple[Any, bool, int]]  # (response or Err, carried the final flag, responses)
        try:
            returned = self._call_execute(model, requests)
            responses = collect_responses(model, requests, returned, server.response_timeout, frontend)
            answers = [(response, returned is not None and returned[i] is not None
                        or isinstance(response, Err) or requests[i]._sender._first_final, 1)
                       for i, response in enumerate(responses)]
        except BatchFailure as failure:
            answers = self._failed_batch(model, requests, failure.message)
        except Exception as exc:
            answers = self._failed_batch(model, requests, format_exception(exc))
        results: List[Outcome] = []
        for req, (response, final, count) in zip(reqs, answers):
            result: Result
            if isinstance(response, Err):
                result = response
            elif response.has_error():
                error = response.error()
                assert error is not None
                result = Err(error.message(), error.code(), "exec")
            else:
                result = finish_outputs(model, req, response, server.strict_outputs)
            results.append(result if final and count == 1 else Answer(result, final, count))
        return results

    @staticmethod
    def _failed_batch(model: LoadedModel, requests: List[InferenceRequest],
                      message: str) -> List[Tuple[Any, bool, int]]:
        """The stub's answer to a failed ``execute``: the error for every request, except
        those whose response sender already delivered a final response (they keep it).
        A request sent a response without the final flag gets the error as its second
        response (python_be.cc answers every request not yet closed)."""
        text = f"Failed to process the request(s) for model '{model.instance_name}', message: {message}"
        _LOG.error("%s", text)  # Triton logs it as an error (pb_stub.cc)
        error = Err(text, ErrorCode.INTERNAL, "exec")
        kept: List[Tuple[Any, bool, int]] = []
        for request in requests:
            sender = request._sender
            final, sent = sender._final(), sender._sent()
            if final is not None:
                kept.append((final, sender._first_final, 1))
            elif sent is not None:
                kept.append((sent, False, 2))
            else:
                kept.append((error, True, 1))
            sender._close()  # as the stub: later sends raise
        return kept

    def _call_execute(self, model: LoadedModel, requests: List[InferenceRequest],
                      background: bool = False) -> Any:
        """``execute(requests)``; a coroutine it returns is run on the model's loop and
        waited for, or with ``background`` (decoupled models, as the stub) left running
        there (its exception is logged) and None returned."""
        with running(self._server, model):
            if not hasattr(model.instance, "execute"):
                raise BatchFailure(
                    f"Python model {model.model_py} does not implement `execute` method."
                )
            returned = model.instance.execute(requests)
            if asyncio.iscoroutine(returned):
                future = asyncio.run_coroutine_threadsafe(returned, model.loop())
                if background:
                    future.add_done_callback(log_background_failure)
                    return None
                returned = future.result()
            return returned
