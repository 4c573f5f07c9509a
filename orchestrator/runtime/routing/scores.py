"""The one definition of the logistic function and its inverse, shared by the heads
(``heads.py``: sigmoid heads, calibration shifts), the policy (calibration thresholds) and
``orchestrator parity``. No Triton imports."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: Probabilities are clipped to [LOGIT_EPS, 1 - LOGIT_EPS] before :func:`logit`, so a
#: probability of exactly 0 or 1 (a constant node, a max over windows) has a finite logit.
LOGIT_EPS = 1e-12


def sigmoid(logits: ArrayLike) -> NDArray[Any]:
    """Numerically stable logistic function; float64 in, float64 out, same shape."""
    x = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def logit(p: float) -> float:
    """Inverse of :func:`sigmoid` for one probability ``p``: ``log(p / (1 - p))``, with ``p``
    clipped to ``[LOGIT_EPS, 1 - LOGIT_EPS]`` so the result is always finite (about +-27.6
    at the clip)."""
    p = min(max(float(p), LOGIT_EPS), 1.0 - LOGIT_EPS)
    return math.log(p) - math.log1p(-p)
