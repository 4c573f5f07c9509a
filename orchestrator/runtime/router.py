"""The router: one Python-backend model that replaces the ``ensemble`` DAG.

Same inputs and outputs as ``ensemble`` plus ``ROUTE``, so a client switches by model name:
    TEXT           TYPE_STRING [N, 1]  UTF-8 texts
    THRESHOLD      FP32        [N, 1]  decision threshold per text, in [0, 1]
    PROBABILITIES  FP32        [N, 1]  probability of the positive class
    VERDICTS       BOOL        [N, 1]  PROBABILITIES >= THRESHOLD (unless a constant says)
    ROUTE          TYPE_STRING [N, 1]  the branch that answered
    POLICY         TYPE_STRING [N, 1]  optional: the policy as JSON, only for requests with
                                       the parameter ``describe_policy: true``

What happens to each text is decided by the routing policy (``orchestrator.runtime.policy``; node kinds in
``orchestrator.runtime.nodes``), a
YAML file in the model directory named by the config parameter ``policy``. The default
policy (``model_repository/router/policy.yaml``) answers empty texts without a model
(probability 0.5, verdict false, ROUTE ``empty``), chunks texts over 128 tokens into
overlapping windows (ROUTE ``chunked:<model>``), and cascades from ``classifier_fast`` to
``classifier`` for texts whose probability is within 0.15 of their threshold.

Batching: the texts of all requests in one ``execute`` call go through the policy
together: one tokenization (whole texts, no truncation), one BLS call per model node, one
postprocess step; BLS calls are split at ``bls_max_batch_size`` rows and sent
concurrently, with rows sorted by length so each call pads as little as possible. The
shipped policy tokenizes and post-processes in this process (policy option ``inline``,
the tokenizer model's own files and the postprocess model's own function); without it
both are BLS calls to the ``tokenizer`` and ``postprocess`` models.

Errors: bad input gives that request an INVALID_ARG error naming the input (or the request
parameter). A failing downstream model gives an INTERNAL error naming the model, unless a
``fallback`` node answers instead; when several requests were batched together, each is
retried alone so only the requests that fail get the error. Every request gets exactly
one response.
"""

from __future__ import annotations

import asyncio
import json
import traceback
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from orchestrator.runtime.engine import Engine
from orchestrator.runtime.errors import DownstreamError, InputError, PolicyError
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.ondemand import ModelManager
from orchestrator.runtime.policy import describe as describe_policy
from orchestrator.runtime.policy import load_policy
from orchestrator.runtime.request import Result, parse_request, policy_path
from orchestrator.runtime.validation import config_parameters, request_parameters


class TritonPythonModel:
    """Triton Python-backend adapter around :class:`Engine`.

    ``execute`` is a plain function that runs the engine on this instance's own event loop
    in the calling (stub main) thread. A downstream call that is the only one in flight
    uses the blocking BLS ``exec``; calls that run beside others (several parts of a batch,
    ``parallel``/``split``/``switch`` branches) or under a ``timeout_ms`` use ``async_exec``.
    Why: the stub runs an ``async def execute`` on a loop in another thread and
    ``async_exec`` in a thread pool, four thread hand-offs per request on the path that
    matters most (one text, one classifier call); docs/benchmarks.md has the measurement.
    """

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        self.logger = pb_utils.Logger
        config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        path = policy_path(model_dir, config_parameters(config))
        try:
            self.policy = load_policy(path)
        except PolicyError as exc:
            raise ValueError(f"router: invalid routing policy: {exc}") from None
        self.name = args.get("model_name", config.get("name", "router"))
        self.metrics = Metrics(pb_utils, self.name)
        self.models = ModelManager(pb_utils, self.policy.on_demand(), self.metrics, self.logger)
        self.engine = Engine(self.policy, self._infer, self.metrics, self.models, model_dir)
        self.loop = asyncio.new_event_loop()
        self.policy_json = json.dumps(self.policy.source).encode("utf-8")
        self.logger.log_info(f"router '{self.name}': policy {path}\n{describe_policy(self.policy)}")
        if self.models.enabled:
            self.logger.log_info(
                f"router '{self.name}': on-demand models {sorted(self.policy.on_demand())} "
                "(needs --model-control-mode=explicit; otherwise they are treated as always loaded)"
            )

    def finalize(self):
        self.models.close()
        self.metrics.close()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())  # async_exec's threads
        self.loop.close()

    async def _infer(self, model: str, inputs: Dict[str, np.ndarray], parameters: Optional[dict], request_id: str,
                     alone: bool = False):
        pb = self.pb
        request = pb.InferenceRequest(
            model_name=model,
            inputs=[pb.Tensor(name, value) for name, value in inputs.items()],
            requested_output_names=[],
            request_id=request_id,
            parameters=parameters or {},
        )
        response = request.exec() if alone else await request.async_exec()
        if response.has_error():
            raise DownstreamError(f"model '{model}' failed: {response.error().message()}")
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def _response(self, result: Result, describe: bool = False):
        pb = self.pb
        routes = np.array([r.encode("utf-8") for r in result.routes], dtype=np.object_).reshape(-1, 1)
        tensors = [
            pb.Tensor("PROBABILITIES", result.probabilities),
            pb.Tensor("VERDICTS", result.verdicts),
            pb.Tensor("ROUTE", routes),
        ]
        if describe:  # the optional POLICY output: the policy document as JSON, one per row
            tensors.append(pb.Tensor("POLICY", np.array([self.policy_json] * len(result.routes), dtype=np.object_).reshape(-1, 1)))
        return pb.InferenceResponse(output_tensors=tensors)

    def _error(self, message: str, code: str):
        from orchestrator.runtime.models._triton import error_response

        self.metrics.inc("orchestrator_requests_total", outcome="error")
        return error_response(message, code)

    def execute(self, requests):
        """One response per request, in order (see the module docstring for errors)."""
        return self.loop.run_until_complete(self._execute(requests))

    async def _execute(self, requests):
        pb = self.pb
        responses = [None] * len(requests)
        works = {}
        for k, request in enumerate(requests):
            try:
                text = pb.get_input_tensor_by_name(request, "TEXT")
                thr = pb.get_input_tensor_by_name(request, "THRESHOLD")
                works[k] = parse_request(
                    None if text is None else text.as_numpy(),
                    None if thr is None else thr.as_numpy(),
                    request_parameters(request.parameters()),
                    self.policy.request_parameters,
                    request.request_id(),
                )
            except InputError as exc:
                responses[k] = self._error(f"router: {exc}", "INVALID_ARG")
        try:
            keys = list(works)
            for k, result in zip(keys, await self.engine.run([works[k] for k in keys])):
                responses[k] = self._response(result, works[k].describe)
        except DownstreamError as batch_error:
            # Retry each request alone so only the requests that fail get the error.
            for k in works:
                if len(works) == 1:
                    responses[k] = self._error(f"router: {batch_error}", "INTERNAL")
                    continue
                try:
                    responses[k] = self._response((await self.engine.run([works[k]]))[0], works[k].describe)
                except DownstreamError as exc:
                    responses[k] = self._error(f"router: {exc}", "INTERNAL")
        except Exception as exc:  # a bug must fail these requests, not the model instance
            self.logger.log_error(f"router: unexpected error: {traceback.format_exc()}")
            for k in works:
                responses[k] = self._error(f"router: internal error: {type(exc).__name__}: {exc}", "INTERNAL")
        ok = sum(1 for k in works if responses[k] is not None and not responses[k].has_error())
        self.metrics.inc("orchestrator_requests_total", ok, outcome="success")
        return responses
