"""An ONNX classifier served from the Python backend through ``onnxruntime``.

Used by ``configs/embedded.pbtxt`` of ``classifier`` and ``classifier_fast``, for servers
without Triton's ONNX Runtime backend (the ``nvidia-pytriton`` wheel has none). The same
``model.onnx`` is what ``config.pbtxt`` (``platform: "onnxruntime_onnx"``) serves natively.

Inputs and outputs (full shapes):
    input_ids       INT64 [N, L]
    attention_mask  INT64 [N, L]
    logits          FP32  [N, 1]

Config parameters: ``onnx_file`` (default ``model.onnx``, in the version directory),
``intra_op_threads`` (default 0: onnxruntime's choice). The CUDA execution provider is used
when the instance is KIND_GPU and onnxruntime offers it, the CPU provider otherwise.

Requests of one ``execute`` call with the same sequence length run in one
``InferenceSession.run``; requests of other lengths run separately, so no request is padded
differently from what its sender sent (results stay bit-identical to one-by-one runs).
Errors (per request, INVALID_ARG): ``input_ids``/``attention_mask`` shapes differ.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Tuple, Union

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

from orchestrator.runtime.models._triton import error_response, model_config, model_directory
from orchestrator.runtime.request import config_parameters


class TritonPythonModel:
    """An ONNX classifier model (see the module docstring for inputs, outputs and parameters)."""

    def initialize(self, args: Dict[str, str]) -> None:
        """Open the ONNX file with onnxruntime (CUDA provider on a KIND_GPU instance when available)."""
        params = config_parameters(model_config(args))
        path = model_directory(args) / params.get("onnx_file", "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_threads", "0"))
        providers: List[Union[str, Tuple[str, Dict[str, int]]]] = ["CPUExecutionProvider"]
        if args.get("model_instance_kind") == "GPU" and "CUDAExecutionProvider" in ort.get_available_providers():
            device = {"device_id": int(args.get("model_instance_device_id", 0))}
            providers = [("CUDAExecutionProvider", device), "CPUExecutionProvider"]
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        self.output_name = self.session.get_outputs()[0].name

    def execute(self, requests: List[Any]) -> List[Any]:
        """One logits response per request; requests of equal sequence length share one session run."""
        responses = [None] * len(requests)
        groups = defaultdict(list)
        for i, request in enumerate(requests):
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            if ids.shape != mask.shape:
                responses[i] = error_response(
                    f"attention_mask: shape {list(mask.shape)} differs from input_ids shape {list(ids.shape)}"
                )
                continue
            groups[ids.shape[1]].append((i, ids, mask))
        for members in groups.values():
            ids = np.concatenate([m[1] for m in members]).astype(np.int64, copy=False)
            mask = np.concatenate([m[2] for m in members]).astype(np.int64, copy=False)
            logits = self.session.run([self.output_name], {"input_ids": ids, "attention_mask": mask})[0]
            logits = logits.astype(np.float32, copy=False)
            start = 0
            for i, rows, _ in members:
                end = start + rows.shape[0]
                responses[i] = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("logits", logits[start:end])])
                start = end
        return responses
