"""The smallest hand-written BLS model answering what ``router_single`` answers for a short
text: the platform's floor for a Python-backend router on the same server.

Written the way a user following python_backend's BLS example would: tokenize in-process
with ``tokenizers`` (the repository's ``tokenizer/1/tokenizer.json``, truncated to the
classifier's ``max_length``, padded to the longest text of the execute), one ``exec`` of
``classifier`` for every text of every request of the execute, then the calibrated head
``sigmoid(logit / T)`` (``classifier/head.json``) and ``VERDICTS = PROBABILITIES >=
THRESHOLD``. Outputs as ``router_single``'s for a text under the classifier's limit, without
``ROUTE``. No policy, no limits, no circuit breaker, no deadlines: only what BLS itself costs.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    """The floor model (see the module docstring)."""

    def initialize(self, args):
        """Read the tokenizer and the classifier's head from the repository beside this model."""
        repo = Path(args["model_repository"]).parent
        head = json.loads((repo / "classifier" / "head.json").read_text())
        self.temperature = float((head.get("calibration") or {}).get("temperature", 1.0))
        self.tokenizer = Tokenizer.from_file(str(repo / "tokenizer" / "1" / "tokenizer.json"))
        self.tokenizer.enable_truncation(int(head["max_length"]))
        self.tokenizer.enable_padding(pad_id=int(head["pad_token_id"]))
        self.cpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)

    def execute(self, requests):
        """Every text of every request in one BLS call; one response per request, in order."""
        texts, thresholds, sizes = [], [], []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            texts += [t.decode("utf-8") for t in text]
            thresholds.append(pb_utils.get_input_tensor_by_name(request, "THRESHOLD").as_numpy().reshape(-1, 1))
            sizes.append(len(text))
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        call = pb_utils.InferenceRequest(
            model_name="classifier", requested_output_names=["logits"], preferred_memory=self.cpu,
            inputs=[pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)])
        answer = call.exec()
        if answer.has_error():
            error = pb_utils.TritonError(answer.error().message())
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        logits = pb_utils.get_output_tensor_by_name(answer, "logits").as_numpy().reshape(-1, 1)
        probs = (1.0 / (1.0 + np.exp(-logits.astype(np.float64) / self.temperature))).astype(np.float32)
        responses, start = [], 0
        for size, threshold in zip(sizes, thresholds):
            p = probs[start:start + size]
            start += size
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("PROBABILITIES", p), pb_utils.Tensor("VERDICTS", p >= threshold)]))
        return responses
