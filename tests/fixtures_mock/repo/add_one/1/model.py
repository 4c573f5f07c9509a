"""Adds 1 (or the request parameter "add") to INPUT0; counts requests in a metric."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.config = json.loads(args["model_config"])
        family = pb_utils.MetricFamily(
            name="add_one_requests_total",
            description="requests seen by add_one",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.family = family
        self.requests_metric = family.Metric(labels={"model": args["model_name"]})
        pb_utils.Logger.log_info("add_one initialized")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            add = json.loads(request.parameters() or "{}").get("add", 1)
            out = (x + np.float32(add)).astype(np.float32)
            self.requests_metric.increment(1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_one finalized")
