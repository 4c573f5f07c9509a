"""``orchestrator export``: put a Hugging Face sequence classifier into the model repository.

Usage::

    orchestrator export SOURCE --name NAME [--repo model_repository] [--fp16] [--router | --router-name ROUTER]
                        [--positive-label LABEL] [--max-length N] [--opset 17] [--replace]
    orchestrator export --fp16-from-onnx classifier [--repo model_repository] [--replace]

The command destroys nothing unasked (:mod:`.guard`): ``--name`` is required with
``SOURCE``; model directories that exist are replaced only with ``--replace`` (exit 2 naming
them otherwise, before anything is read); a re-export keeps an edited
``NAME_router/policy.yaml`` (the new starter goes beside it, :mod:`.starter`); an export
that leaves a router of the repository unable to load exits 1 naming it and why; a
re-export names the other routers that use the model (a running server keeps their old
tokenizer and head until they are loaded again).

``SOURCE`` is a local checkpoint directory (``save_pretrained`` output: ``config.json``,
weights, tokenizer files; a directory without tokenizer files is refused:
:class:`SourceError` naming what it holds) or a Hugging Face hub id, downloaded with
``huggingface_hub.snapshot_download`` when the hub can be reached (:class:`SourceError`
otherwise, naming both readings of ``SOURCE``).

The model's head (``orchestrator.runtime.routing.heads.head_from_hf_config``: binary, multiclass or
multilabel from ``problem_type``, ``num_labels``, ``id2label``; ``--positive-label`` for two
labels; regression is refused with :class:`ExportError`) decides what it writes around the
model. Under ``<repo>``, for ``NAME`` (docs/guides/bring-your-own-model.md has the table):

- ``NAME/1/model.onnx``: ``AutoModelForSequenceClassification`` (eager attention) exported
  with the TorchScript exporter (``dynamo=False``, opset 17 by default, as
  ``orchestrator.tooling.modeling.train``). Inputs ``input_ids``, ``attention_mask`` int64
  ``[batch, sequence]``; output ``logits`` float32 ``[batch, K]`` (K = the checkpoint's
  ``num_labels``); batch and sequence axes dynamic (:mod:`orchestrator.tooling.modeling.contract`).
- ``NAME/config.pbtxt`` (native ``onnxruntime_onnx``, KIND_GPU) and
  ``NAME/configs/embedded.pbtxt`` (Python backend, ``orchestrator.runtime.models.onnx_classifier``,
  KIND_CPU) from :mod:`orchestrator.tooling.modeling.configs`, the generator of the
  committed ``classifier``'s; output ``logits`` dims ``[K]``; warmup ids from the model's own
  tokenizer. Existing files keep their settings: the ``logits`` dims, the warmup sample and
  the comment header change. ``NAME/1/model.py``: the one-line adapter. ``NAME/head.json``.
- ``NAME_tokenizer/``: the checkpoint's tokenizer as its own tokenizer model (files in
  ``1/``, ``model_max_length`` = the export's max length); the shared ``tokenizer`` model is
  never replaced.
- ``NAME_postprocess/`` (parameter ``head``, ``labels.txt``) and ``NAME_ensemble/``
  (``NAME_tokenizer`` -> ``NAME`` -> ``NAME_postprocess``): :mod:`.pipeline`.
- with ``--fp16``: ``NAME_fp16/`` the same, with ``1/model.onnx`` converted by
  ``onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)``: weights
  and compute in float16, inputs and outputs keep int64 ids and float32 logits, so the
  configs are identical apart from the name; ``NAME_fp16_ensemble/``.
- with ``trtexec`` on ``PATH``: ``NAME/1/model.plan`` and ``NAME/configs/tensorrt.pbtxt``
  (``platform: "tensorrt_plan"``; selected with ``--model-config-name=tensorrt``).
- ``NAME/export.json``: provenance (source, labels, sha256 of the files, validation numbers).

Then every other ensemble calling ``NAME`` is re-pointed to ``NAME_tokenizer`` and
``NAME_postprocess``, and every router whose policy names ``NAME`` is checked against the
models' heads (its ``labels.txt`` rewritten when the policy binds): :mod:`.pipeline`.

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
(checkpoint, tokenizer files, torch export), :mod:`.pipeline` (the models around the
classifier, ensembles re-pointed, routers checked), :mod:`.run` (the two exports), :mod:`.guard`
(what the command refuses or reports around them), :mod:`.starter` (``--router``), :mod:`.cli`.
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
