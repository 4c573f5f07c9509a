"""``orchestrator parity``: do candidate classifiers (fp16, re-exports) decide like the reference?

Usage::

    orchestrator parity --reference classifier --candidates classifier_fp16 \\
        (--data FILE | --held-out) [--target-precision 0.9] [--max-flip-rate 0.005] \\
        [--in-process | --url HOST:PORT | --embedded-server] [--cross-check] \\
        [--repo model_repository] [--out docs/results/parity]
    orchestrator parity --write-held-out FILE      # the held-out test split as TSV/JSONL

Every model compared must have the same head (``<repo>/<model>/head.json``, the legacy
one-logit head without one: same kind, labels and positive label) and the same tokenizer
model (the head's ``tokenizer``); otherwise :class:`ParityError` before any text is scored.
Every text goes through that tokenizer and then each model, in the same batches of
``--batch-size`` (64, the repository's ``max_batch_size``) consecutive texts, each batch padded
to its longest text, exactly as one request to the tokenizer model does. Backends:
in-process (onnxruntime CPU sessions on ``<repo>/<model>/1/<onnx_file>`` plus the tokenizer
files of ``<repo>/<tokenizer>/1``), or a Triton server through tritonclient HTTP (``--url``, or
``--embedded-server`` to start :class:`orchestrator.tooling.server.TritonServer` on ``--repo``).
``--cross-check`` runs the other backend too and reports the largest logit difference
between the two.

Labels (``--data``): binary heads 0/1; multiclass heads the label's name or index;
multilabel heads the list of labels that apply (:func:`read_labeled`). ``--held-out`` is
binary.

Multiclass and multilabel heads (:func:`compare_multi`): probabilities and verdicts by the
head (``Head.probabilities``, ``Head.verdicts``); a flip is a text whose top label changed
(multiclass) or with some label's verdict changed (multilabel, ``Head.flipped``);
multilabel thresholds are per label (each label's column calibrated as below), multiclass
answers are the top label (threshold 0). The rest of this section is the binary case.

Definitions (all in the report):

- score ``s``: the logit for single-logit (binary, sigmoid) models; the positive logit minus
  the other for two-logit (softmax) models, the log-odds of the head's positive label, so
  ``sigmoid(s)`` is the softmax's positive column, what the postprocess model serves.
- probability ``p = sigmoid(s)``, computed in float64 and rounded to float32 (as the
  ``postprocess`` model does); verdict ``p >= t`` for a threshold ``t`` (as ``postprocess``).
- logit deviation: ``d = candidate - reference`` over every logit; mean |d|, max d, min d
  (signed), max |d|.
- reference threshold (:func:`threshold_for_precision`): the smallest ``t`` among the
  reference's own probabilities on the data whose precision ``TP / (TP + FP)`` against the
  labels is at least the target. Every ``t`` between the next lower probability (exclusive)
  and this one gives the same verdicts on this data; taking a data value follows
  scikit-learn's ``precision_recall_curve`` convention. Precision is not monotone in ``t``:
  this is the lowest qualifying threshold, the one with the highest recall.
- confusion against the reference: rows reference verdict, columns candidate verdict, at
  the same threshold; flips = reference-positive/candidate-negative +
  reference-negative/candidate-positive.
- best candidate threshold (:func:`best_matching_threshold`): among ``{reference threshold}``
  U the candidate's probabilities on the data U {just above its largest probability}, the
  one with the fewest flips; ties go to the one closest to the reference threshold, then to
  the smaller one.
- recommendation (:func:`recommend`): a candidate qualifies when, at its operating
  threshold (the reference threshold if it gives 0 flips, else its best threshold), its
  flips are at most ``max_flip_rate`` of the texts. Its precision there is reported but not
  a condition: the reference threshold sits exactly at the target by construction, so a
  single flip can move a candidate just below it. A qualifying candidate is shipped instead
  of the reference when its
  latency is at most 0.95 of the reference's (median over batches of the per-batch ratio,
  :func:`paired_ratio`) (5%: our margin for timing
  noise on a shared machine), or when it is within 5% and its file at most 0.9 of the
  reference's size; the fastest such candidate wins. Otherwise the reference is shipped.

Outputs in ``--out``: ``report.json``, ``report.md``, ``logits.png`` (candidate vs reference
score scatter and difference histogram per candidate), ``thresholds.json``
(``{model: threshold}``: the reference threshold and each candidate's operating threshold,
probabilities in [0, 1] for the ``THRESHOLD`` input).

Modules: :mod:`.labeled` (data), :mod:`.metrics` (the numbers and the rule),
:mod:`.backends` (in-process, Triton), :mod:`.report`, :mod:`.run` (the run, the CLI).
"""

from __future__ import annotations

from orchestrator.tooling.modeling.parity.backends import BATCH_SIZE, InProcessBackend, TritonBackend, onnx_file, score_all
from orchestrator.tooling.modeling.parity.labeled import LabeledData, ParityError, held_out_data, read_labeled, write_labeled
from orchestrator.tooling.modeling.parity.metrics import (
    DEFAULT_MAX_FLIP_RATE,
    DEFAULT_TARGET_PRECISION,
    SIZE_MARGIN,
    SPEED_MARGIN,
    best_matching_threshold,
    binary_scores,
    compare,
    compare_multi,
    confusion_vs_reference,
    label_metrics,
    logit_deviation,
    paired_ratio,
    probabilities,
    recommend,
    threshold_for_precision,
    threshold_logit,
)
from orchestrator.tooling.modeling.parity.report import plot_logits, render_markdown, write_report
from orchestrator.tooling.modeling.parity.run import add_parity_arguments, main, parity_command, parity_head, run_parity

__all__ = [
    "ParityError",
    "LabeledData",
    "read_labeled",
    "write_labeled",
    "held_out_data",
    "binary_scores",
    "probabilities",
    "threshold_logit",
    "label_metrics",
    "confusion_vs_reference",
    "logit_deviation",
    "threshold_for_precision",
    "best_matching_threshold",
    "compare",
    "compare_multi",
    "parity_head",
    "paired_ratio",
    "recommend",
    "InProcessBackend",
    "TritonBackend",
    "onnx_file",
    "score_all",
    "run_parity",
    "render_markdown",
    "plot_logits",
    "write_report",
    "add_parity_arguments",
    "parity_command",
    "main",
    "BATCH_SIZE",
    "DEFAULT_TARGET_PRECISION",
    "DEFAULT_MAX_FLIP_RATE",
    "SPEED_MARGIN",
    "SIZE_MARGIN",
]
