"""The smallest hand-written BLS model making the shipped ensemble's three calls: the floor
for a migrated pipeline router on the same server.

Written the way a user following python_backend's BLS example would: per request,
``tokenizer`` (TEXT -> input_ids, attention_mask), ``classifier`` (-> logits) and
``postprocess`` (logits, THRESHOLD -> PROBABILITIES, VERDICTS), each one ``exec``, every
request parameter dropped, the last answer's outputs returned. No policy, no input checks,
no circuit breaker, no deadlines: only what the three BLS calls cost.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The floor model (see the module docstring)."""

    def initialize(self, args):
        """Answers in CPU memory, as the router asks for them."""
        self.cpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)

    def _call(self, model, inputs, outputs):
        answer = pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs, inputs=inputs,
                                           preferred_memory=self.cpu).exec()
        if answer.has_error():
            raise pb_utils.TritonModelException(answer.error().message())
        return [pb_utils.get_output_tensor_by_name(answer, name) for name in outputs]

    def execute(self, requests):
        """One response per request, in order; a failed call is that request's error."""
        responses = []
        for request in requests:
            try:
                text = pb_utils.get_input_tensor_by_name(request, "TEXT")
                threshold = pb_utils.get_input_tensor_by_name(request, "THRESHOLD")
                ids, mask = self._call("tokenizer", [text], ["input_ids", "attention_mask"])
                (logits,) = self._call("classifier", [ids, mask], ["logits"])
                probs, verdicts = self._call("postprocess", [logits, threshold], ["PROBABILITIES", "VERDICTS"])
                responses.append(pb_utils.InferenceResponse(output_tensors=[probs, verdicts]))
            except pb_utils.TritonModelException as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses
