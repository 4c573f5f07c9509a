"""Scores to probabilities and verdicts: the one definition the postprocess model, the
router's in-process postprocess and ``orchestrator parity`` share (no Triton imports)."""

from __future__ import annotations

import numpy as np


def sigmoid(logits) -> np.ndarray:
    """Numerically stable logistic function; float64 in, float64 out, same shape."""
    x = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def probabilities_and_verdicts(logits: np.ndarray, thresholds: np.ndarray):
    """``(PROBABILITIES float32 [N, K], VERDICTS bool [N, K])`` for logits [N, K] and
    thresholds [N]: sigmoid per logit (the classifiers were trained with binary
    cross-entropy on one logit, ``orchestrator.tooling.modeling.train``), verdict = probability >= threshold."""
    probs = sigmoid(logits).astype(np.float32)
    return probs, probs >= np.asarray(thresholds, dtype=np.float32).reshape(-1, 1)
