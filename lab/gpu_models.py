"""Python-backend models that answer in GPU memory, for ``make gpu-check`` only (lab.gpu_check).

Triton's ONNX Runtime backend on a ``KIND_GPU`` instance answers its outputs in GPU memory;
a BLS caller that does not ask for CPU memory then gets a tensor whose ``as_numpy()`` raises
"Tensor is stored in GPU and cannot be converted to NumPy." (python_backend
``src/pb_tensor.cc``). Where that backend cannot be had (a GPU machine with only the
embedded server), these models reproduce the same memory placement from a Python model:

* :class:`GpuOutputClassifier`: ``orchestrator.runtime.models.onnx_classifier`` whose
  ``logits`` (FP32 ``[N, 1]`` or ``[N, C]``) are copied to the instance's GPU (torch, then
  ``pb_utils.Tensor.from_dlpack``) before they are answered.
* :class:`GpuEcho`: ``Y = 2 * X`` (FP32 ``[N, K]``) answered in GPU memory: the source of the
  negative control.
* :class:`BlsCaller`: one BLS call to ``gpu_echo`` per request, with CPU memory asked for
  (``releases.cpu_outputs``, what the router does) when ``ASK_CPU`` (BOOL ``[1]``) is true,
  without it otherwise; answers ``Y`` from ``as_numpy()`` or the error that call raised.

All need torch with CUDA in the stub's interpreter and a ``KIND_GPU`` instance (GpuEcho,
GpuOutputClassifier); ``initialize`` raises a RuntimeError naming what is missing otherwise.
Nothing here is served by the shipped repository.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import triton_python_backend_utils as pb_utils

from orchestrator.runtime.models.onnx_classifier import TritonPythonModel as OnnxClassifier
from orchestrator.runtime.serving.releases import cpu_outputs


def _cuda_device(args: Dict[str, str]) -> Any:
    """The instance's CUDA device (torch); RuntimeError unless KIND_GPU with CUDA in torch."""
    if args.get("model_instance_kind") != "GPU":
        raise RuntimeError(f"{args.get('model_name')}: needs a KIND_GPU instance, got {args.get('model_instance_kind')}")
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(f"{args.get('model_name')}: needs torch in the stub's interpreter: {exc}") from exc
    if not torch.cuda.is_available():
        raise RuntimeError(f"{args.get('model_name')}: torch {torch.__version__} sees no CUDA device")
    return torch.device("cuda", int(args.get("model_instance_device_id", 0)))


def to_gpu_tensor(name: str, array: np.ndarray, device: Any) -> Any:
    """``array`` copied to ``device`` and wrapped as a ``pb_utils.Tensor`` (DLPack).

    Raises RuntimeError if the stub placed the result in CPU memory after all."""
    import torch

    on_gpu = torch.from_numpy(np.ascontiguousarray(array)).to(device)
    torch.cuda.synchronize(device)  # the copy is done before the tensor leaves the stub
    tensor = pb_utils.Tensor.from_dlpack(name, on_gpu)
    if tensor.is_cpu():
        raise RuntimeError(f"{name}: from_dlpack of a CUDA tensor gave a CPU tensor")
    return tensor


class GpuOutputClassifier(OnnxClassifier):
    """The embedded ONNX classifier, its outputs answered in GPU memory (module docstring)."""

    def initialize(self, args: Dict[str, str]) -> None:
        """The classifier's own initialize, on a KIND_GPU instance with CUDA in torch."""
        self.device = _cuda_device(args)
        super().initialize(args)

    def execute(self, requests: List[Any]) -> List[Any]:
        """The classifier's responses, each output tensor moved to the GPU; errors unchanged."""
        out = []
        for response in super().execute(requests):
            if response.has_error():
                out.append(response)
                continue
            tensors = [to_gpu_tensor(t.name(), t.as_numpy(), self.device) for t in response.output_tensors()]
            out.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return out


class GpuEcho:
    """``Y = 2 * X`` in GPU memory (module docstring)."""

    def initialize(self, args: Dict[str, str]) -> None:
        """Find the instance's CUDA device."""
        self.device = _cuda_device(args)

    def execute(self, requests: List[Any]) -> List[Any]:
        """One response per request, ``Y`` on the GPU."""
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[to_gpu_tensor("Y", x * 2, self.device)]))
        return out


class BlsCaller:
    """Calls ``gpu_echo`` through BLS with or without CPU memory asked for (module docstring)."""

    def initialize(self, args: Dict[str, str]) -> None:
        """Nothing to set up."""

    def execute(self, requests: List[Any]) -> List[Any]:
        """One response per request: ``Y`` read with ``as_numpy()``, or the error it raised."""
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            ask_cpu = bool(pb_utils.get_input_tensor_by_name(request, "ASK_CPU").as_numpy().reshape(-1)[0])
            memory = {"preferred_memory": cpu_outputs(pb_utils)} if ask_cpu else {}
            response = pb_utils.InferenceRequest(
                model_name="gpu_echo", inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y"], **memory
            ).exec()
            if response.has_error():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"gpu_echo: {response.error().message()}")))
                continue
            tensor = response.output_tensors()[0]
            try:
                y = np.array(tensor.as_numpy(), copy=True)
            except Exception as exc:  # the stub raises TritonModelException; its text is the finding
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"Y (is_cpu={tensor.is_cpu()}): {exc}")))
                continue
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
        return out
