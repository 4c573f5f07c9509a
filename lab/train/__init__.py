"""``make model``: train the demo tokenizer and two sentiment classifiers, export them to ONNX.

Usage::

    python -m lab.train [--quick] [--out model_repository] [--epochs N] [--seed 0] [--threads N]

Steps (each timed; numbers land in ``<out>/training_metrics.json`` and ``<out>/MODEL_CARD.md``):

1. Data: :mod:`orchestrator.tooling.modeling.data` (Hutto & Gilbert 2014 ground truth from the
   ``vaderSentiment==3.3.2`` sdist), labels ``rating >= 0.5`` -> 1, ``<= -0.5`` -> 0,
   near-neutral dropped; fixed-seed 80/10/10 split stratified by (corpus, label).
2. Tokenizer: WordPiece trained with ``tokenizers`` on the train split only (BERT
   normalizer with lower-casing, BERT pre-tokenizer, ``[CLS] ... [SEP]`` post-processor,
   special tokens ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``), wrapped as
   ``transformers.BertTokenizerFast`` with ``model_max_length=128`` and saved to
   ``<out>/tokenizer/1/`` (plus ``vocab.txt`` and ``special_tokens_map.json``).
3. Two ``BertForSequenceClassification(num_labels=1)`` models from scratch
   (``max_position_embeddings=512``), BCE-with-logits on the binary label, AdamW with
   linear warmup/decay, dynamic padding, max length 128, best epoch by validation accuracy:
   ``classifier`` (accurate) and ``classifier_fast`` (small).
4. ONNX export (opset 17, TorchScript exporter ``dynamo=False``): inputs ``input_ids``,
   ``attention_mask`` int64 ``[batch, sequence]``, output ``logits`` float32 ``[batch, 1]``,
   dynamic batch and sequence axes, to ``<out>/<model>/1/model.onnx``. Checked with
   onnxruntime against torch and padded-to-512 against padded-to-longest (max abs logit
   difference < 1e-4 each, else :class:`ExportValidationError`).
5. Test-split accuracy/precision/recall/F1 per corpus for both ONNX models (onnxruntime,
   what is served; positive iff logit >= 0, i.e. probability >= 0.5) and for VADER
   (compound >= 0 -> positive) on the same examples.

Reproducibility: fixed seeds (``random``, numpy, ``torch.manual_seed``), a deterministic
tokenizer (see :func:`train_tokenizer`); torch threads follow :class:`ThreadGovernor` (the
cores other processes leave idle; ``--threads N`` pins them), and identical thread counts
give identical weights.

Raises :class:`ArtifactSizeError` if the artifacts total more than 25 MB (25,000,000 bytes),
and :class:`BaselineNotBeatenError` (full runs only) if ``classifier`` does not beat VADER's
accuracy on the movie-review test split. ``--quick`` trains on a small sample for a smoke
run (about a minute); its numbers are meaningless.

Modules: :mod:`.specs` (settings, errors), :mod:`.tokenizer`, :mod:`.classifier` (the
training loop), :mod:`.onnx_export`, :mod:`.card` (evaluation, ``MODEL_CARD.md``),
:mod:`.run` (the pipeline and its command line).
"""

from __future__ import annotations

from lab.train.card import (
    artifact_paths,
    binary_metrics,
    evaluate,
    vader_predictions,
    write_model_card,
)
from lab.train.classifier import ThreadGovernor, build_model, torch_logits, train_classifier
from lab.train.onnx_export import export_onnx, ort_logits, validate_onnx
from lab.train.run import main, run
from lab.train.specs import (
    MAX_LENGTH,
    MAX_POSITIONS,
    MODEL_NAMES,
    OPSET,
    PAD_TO,
    SIZE_LIMIT_BYTES,
    SPECIAL_TOKENS,
    SPECS,
    TOKENIZER_FILES,
    TOL,
    VOCAB_SIZE,
    ArtifactSizeError,
    BaselineNotBeatenError,
    ModelSpec,
)
from lab.train.tokenizer import check_tokenizer, save_tokenizer, train_tokenizer
from orchestrator.tooling.modeling.contract import ExportValidationError

__all__ = [
    "ExportValidationError",
    "ArtifactSizeError",
    "BaselineNotBeatenError",
    "ModelSpec",
    "SPECS",
    "MAX_LENGTH",
    "MAX_POSITIONS",
    "MODEL_NAMES",
    "OPSET",
    "PAD_TO",
    "SIZE_LIMIT_BYTES",
    "SPECIAL_TOKENS",
    "TOKENIZER_FILES",
    "TOL",
    "VOCAB_SIZE",
    "ThreadGovernor",
    "artifact_paths",
    "binary_metrics",
    "build_model",
    "check_tokenizer",
    "evaluate",
    "export_onnx",
    "main",
    "ort_logits",
    "run",
    "save_tokenizer",
    "torch_logits",
    "train_classifier",
    "train_tokenizer",
    "vader_predictions",
    "validate_onnx",
    "write_model_card",
]
