"""The floor of any Python-backend model placed in front of the shipped ensemble: per
request, one ``exec`` of ``ensemble`` with the request's ``TEXT`` and ``THRESHOLD``, its two
outputs returned. No policy, no checks: what a model in front of the ensemble costs at the
least (its stub's entry and one BLS round trip), the bound under which no BLS router can go.
"""

import triton_python_backend_utils as pb_utils

OUTPUTS = ["PROBABILITIES", "VERDICTS"]


class TritonPythonModel:
    """The floor model (see the module docstring)."""

    def initialize(self, args):
        """Answers in CPU memory, as the router asks for them."""
        self.cpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)

    def execute(self, requests):
        """One response per request, in order; a failed call is that request's error."""
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("TEXT", "THRESHOLD")]
            answer = pb_utils.InferenceRequest(model_name="ensemble", requested_output_names=OUTPUTS, inputs=inputs,
                                               preferred_memory=self.cpu).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.error().message())))
            else:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.get_output_tensor_by_name(answer, name) for name in OUTPUTS]))
        return responses
