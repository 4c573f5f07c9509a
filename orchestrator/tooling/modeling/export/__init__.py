"""``orchestrator export``: put a Hugging Face sequence classifier into the model repository.

Usage::

    orchestrator export SOURCE --name classifier [--repo model_repository] [--fp16]
                        [--max-length N] [--opset 17] [--no-tokenizer]
    orchestrator export --fp16-from-onnx classifier [--repo model_repository]

``SOURCE`` is a local checkpoint directory (``save_pretrained`` output: ``config.json``,
weights, tokenizer files) or a Hugging Face hub id, downloaded with
``huggingface_hub.snapshot_download`` when the hub can be reached (:class:`SourceError`
otherwise, naming both readings of ``SOURCE``).

What it writes under ``<repo>`` (each file written to a temporary name, then moved):

- ``<name>/1/model.onnx``: ``AutoModelForSequenceClassification`` (eager attention) exported
  with the TorchScript exporter (``dynamo=False``, opset 17 by default, as
  ``orchestrator.tooling.modeling.train``). Inputs ``input_ids``, ``attention_mask`` int64
  ``[batch, sequence]``; output ``logits`` float32 ``[batch, num_labels]``; batch and
  sequence axes dynamic (:mod:`orchestrator.tooling.modeling.contract`). ``num_labels``
  comes from the checkpoint's config: 1 for a binary single-logit model (sigmoid), 2 or
  more for softmax logits.
- ``<name>/config.pbtxt`` (native ``onnxruntime_onnx``, KIND_GPU) and
  ``<name>/configs/embedded.pbtxt`` (Python backend, ``orchestrator.runtime.models.onnx_classifier``,
  KIND_CPU) from :mod:`orchestrator.tooling.modeling.configs`, the generator of the
  committed ``classifier``'s; output ``logits`` dims ``[num_labels]``. Existing files keep
  their settings: only the ``logits`` dims and the comment header change.
- ``<name>/1/model.py``: the one-line Python-backend adapter.
- with ``--fp16``: ``<name>_fp16/`` the same, with ``1/model.onnx`` converted by
  ``onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)``: weights
  and compute in float16, inputs and outputs keep int64 ids and float32 logits, so the
  configs are identical apart from the name.
- ``tokenizer/1/``: the checkpoint's tokenizer, saved with ``save_pretrained`` with
  ``model_max_length`` set to the export's maximum sequence length (unless
  ``--no-tokenizer``). The old tokenizer files are removed first (``model.py`` is kept).
- with ``trtexec`` on ``PATH``: ``<name>/1/model.plan`` and ``<name>/configs/tensorrt.pbtxt``
  (``platform: "tensorrt_plan"``; selected with ``--model-config-name=tensorrt``).
- ``<name>/export.json``: provenance (source, sha256 of the files, validation numbers).

Validation (on :data:`SAMPLE_TEXTS`, or ``--validation-texts``), :class:`ExportValidationError`
on failure:

- fp32: max |onnxruntime - torch| over all logits < :data:`FP32_TOLERANCE` (1e-4, the bound
  ``orchestrator.tooling.modeling.train`` uses), for batches padded to the longest text, padded to the
  maximum length, and one text at a time.
- fp16: max |onnxruntime fp16 - reference| <= :data:`FP16_TOLERANCE` (0.05 logit), the
  reference being torch (checkpoint export) or the fp32 ONNX model (``--fp16-from-onnx``).
  Why 0.05: float16 has a unit roundoff of 2**-11 (4.9e-4); 0.05 is about 100 of those, room
  for rounding to accumulate through a few encoder layers, yet a logit error of 0.05 moves a
  sigmoid probability by at most 0.0125 (the sigmoid's slope is at most 1/4). Measured on the
  demo ``classifier``: see ``classifier_fp16/export.json``.

Modules: :mod:`.validate` (the checks), :mod:`.convert` (fp16, TensorRT), :mod:`.source`
(checkpoint, tokenizer, torch export), :mod:`.run` (the two exports), :mod:`.cli`.
"""

from __future__ import annotations

from orchestrator.tooling.modeling.contract import (
    ExportError,
    ExportValidationError,
    SourceError,
    check_onnx_contract,
    ort_session,
)
from orchestrator.tooling.modeling.export.cli import add_export_arguments, export_command, main
from orchestrator.tooling.modeling.export.convert import build_tensorrt_plan, convert_to_fp16, trtexec_command
from orchestrator.tooling.modeling.export.run import ExportResult, export_checkpoint, fp16_from_onnx, write_model_configs
from orchestrator.tooling.modeling.export.source import resolve_source
from orchestrator.tooling.modeling.export.validate import (
    DEFAULT_OPSET,
    FP16_TOLERANCE,
    FP32_TOLERANCE,
    SAMPLE_TEXTS,
    check_variant,
    ort_logits,
)

__all__ = [
    "ExportError",
    "SourceError",
    "ExportValidationError",
    "ExportResult",
    "FP32_TOLERANCE",
    "FP16_TOLERANCE",
    "DEFAULT_OPSET",
    "SAMPLE_TEXTS",
    "check_onnx_contract",
    "check_variant",
    "ort_session",
    "ort_logits",
    "export_checkpoint",
    "fp16_from_onnx",
    "convert_to_fp16",
    "trtexec_command",
    "build_tensorrt_plan",
    "resolve_source",
    "write_model_configs",
    "add_export_arguments",
    "export_command",
    "main",
]
