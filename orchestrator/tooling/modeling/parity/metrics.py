"""Parity numbers: scores, thresholds, flips against the reference, and the recommendation
(definitions in the package docstring)."""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from orchestrator.runtime.routing.heads import BINARY, MULTICLASS, Head, logit, sigmoid
from orchestrator.tooling.modeling.parity.labeled import ParityError

DEFAULT_TARGET_PRECISION = 0.9
DEFAULT_MAX_FLIP_RATE = 0.005  # 0.5% of the texts
SPEED_MARGIN = 0.05  # latency ratios within 5% count as equal speed
SIZE_MARGIN = 0.9  # "smaller" means at most 90% of the reference's bytes


def binary_scores(logits: np.ndarray, head: Optional[Head] = None) -> np.ndarray:
    """float64 score [n] (log-odds of the positive label) from logits [n, K] of a binary
    ``head``: the positive logit (K = 1), or the positive minus the other logit (K = 2,
    so ``sigmoid(score)`` is the softmax's positive column). Without ``head``: positive
    index 0 for one logit, 1 for two. Raises :class:`ParityError` for other shapes."""
    lg = np.asarray(logits, dtype=np.float64)
    if lg.ndim == 1:
        lg = lg[:, None]
    if lg.ndim != 2 or lg.shape[1] not in (1, 2):
        raise ParityError(f"logits of shape {lg.shape}: a binary head has 1 or 2 logits")
    pos = head.positive_index if head is not None else lg.shape[1] - 1
    return lg[:, pos] if lg.shape[1] == 1 else lg[:, pos] - lg[:, 1 - pos]


def probabilities(scores: np.ndarray) -> np.ndarray:
    """float32 sigmoid of float64 ``scores``: the postprocess model's own function."""
    return sigmoid(scores).astype(np.float32)


def threshold_logit(t: float) -> Optional[float]:
    """The logit of threshold ``t`` (:func:`orchestrator.runtime.routing.heads.logit`); None for a
    threshold of 0 or 1 (or outside), which no finite score reaches or misses."""
    t = float(t)
    return logit(t) if 0.0 < t < 1.0 else None


def label_metrics(labels: np.ndarray, verdicts: np.ndarray) -> dict:
    """Counts ``tp fp fn tn`` (positive class = label 1) and accuracy, precision, recall, f1.

    precision is ``None`` with no positive verdict, recall ``None`` with no positive label,
    f1 ``None`` when either is.
    """
    y = np.asarray(labels).astype(bool)
    v = np.asarray(verdicts).astype(bool)
    tp, fp = int(np.sum(v & y)), int(np.sum(v & ~y))
    fn, tn = int(np.sum(~v & y)), int(np.sum(~v & ~y))
    prec = tp / (tp + fp) if tp + fp else None
    rec = tp / (tp + fn) if tp + fn else None
    if prec is None or rec is None:
        f1 = None
    else:
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "accuracy": (tp + tn) / len(y),
            "precision": prec, "recall": rec, "f1": f1}


def confusion_vs_reference(ref_verdicts: np.ndarray, cand_verdicts: np.ndarray) -> dict:
    """2x2 counts of reference verdict (row) vs candidate verdict (column) and ``flips``."""
    r = np.asarray(ref_verdicts).astype(bool)
    c = np.asarray(cand_verdicts).astype(bool)
    out = {
        "ref_pos_cand_pos": int(np.sum(r & c)),
        "ref_pos_cand_neg": int(np.sum(r & ~c)),
        "ref_neg_cand_pos": int(np.sum(~r & c)),
        "ref_neg_cand_neg": int(np.sum(~r & ~c)),
    }
    out["flips"] = out["ref_pos_cand_neg"] + out["ref_neg_cand_pos"]
    return out


def logit_deviation(ref_logits: np.ndarray, cand_logits: np.ndarray, head: Optional[Head] = None) -> dict:
    """Deviation ``d = candidate - reference`` over every logit (float64): ``mean_abs_diff``,
    ``max_diff`` and ``min_diff`` (signed), ``max_abs_diff``, ``rms_diff``, plus
    ``max_abs_prob_diff`` of the probabilities and ``values`` (count). Raises
    :class:`ParityError` on different shapes."""
    a = np.asarray(ref_logits, dtype=np.float64)
    b = np.asarray(cand_logits, dtype=np.float64)
    if a.shape != b.shape:
        raise ParityError(f"logits shapes differ: reference {a.shape}, candidate {b.shape}")
    d = b - a
    if head is None or head.kind == BINARY:
        pa, pb = probabilities(binary_scores(a, head)), probabilities(binary_scores(b, head))
    else:
        pa, pb = head.probabilities(a).astype(np.float32), head.probabilities(b).astype(np.float32)
    return {
        "values": int(d.size),
        "mean_abs_diff": float(np.mean(np.abs(d))),
        "max_diff": float(np.max(d)),
        "min_diff": float(np.min(d)),
        "max_abs_diff": float(np.max(np.abs(d))),
        "rms_diff": float(np.sqrt(np.mean(d * d))),
        "max_abs_prob_diff": float(np.max(np.abs(pb.astype(np.float64) - pa))),
    }


def threshold_for_precision(probs: np.ndarray, labels: np.ndarray, target: float) -> float:
    """The smallest ``t`` in ``probs`` with precision of ``probs >= t`` against ``labels`` at
    least ``target`` (see the module docstring). float32 value, a probability.

    Raises :class:`ParityError` if no threshold reaches ``target`` (message: the best
    precision reachable) or ``target`` is outside (0, 1].
    """
    if not 0.0 < target <= 1.0:
        raise ParityError(f"target precision {target} outside (0, 1]")
    p = np.asarray(probs, dtype=np.float32)
    y = np.asarray(labels).astype(np.int64)
    order = np.argsort(p, kind="stable")
    ps, ys = p[order], y[order]
    # suffix sums: positives and predicted count of {p >= ps[i]}
    tp_suffix = np.cumsum(ys[::-1])[::-1]
    cnt_suffix = np.arange(len(ps), 0, -1)
    values, first = np.unique(ps, return_index=True)  # first index of each value in ps
    tp = tp_suffix[first]
    cnt = cnt_suffix[first]
    prec = tp / cnt
    ok = np.nonzero(prec >= target)[0]
    if not len(ok):
        raise ParityError(f"no threshold reaches precision {target} on these {len(p)} texts; "
                          f"the best is {float(prec.max()):.4f}")
    return float(values[ok[0]])


def _flips_at(cand_probs: np.ndarray, ref_verdicts: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Flip counts of ``cand_probs >= t`` vs ``ref_verdicts`` for each ``t`` (vectorised)."""
    c = np.asarray(cand_probs, dtype=np.float32)
    r = np.asarray(ref_verdicts).astype(bool)
    order = np.argsort(c, kind="stable")
    cs, rs = c[order], r[order]
    ref_pos_prefix = np.concatenate([[0], np.cumsum(rs)])  # ref positives among the i lowest
    ref_neg_total = int(np.sum(~rs))
    idx = np.searchsorted(cs, np.asarray(thresholds, dtype=np.float32), side="left")  # c < t for first idx
    fn = ref_pos_prefix[idx]
    fp = ref_neg_total - (idx - ref_pos_prefix[idx])
    return fn + fp


def best_matching_threshold(cand_probs: np.ndarray, ref_verdicts: np.ndarray, ref_threshold: float) -> tuple:
    """``(t, flips)``: the threshold on the candidate's probabilities that best reproduces
    ``ref_verdicts`` (see the module docstring for the candidate set and tie rules); ``t``
    is a float32 value in [0, 1]."""
    c = np.asarray(cand_probs, dtype=np.float32)
    t_ref = np.float32(ref_threshold)
    cands = [np.array([t_ref], dtype=np.float32), np.unique(c)]
    above = np.nextafter(c.max(), np.float32(2.0))
    if above <= 1.0:
        cands.append(np.array([above], dtype=np.float32))
    ts = np.unique(np.concatenate(cands))
    flips = _flips_at(c, ref_verdicts, ts)
    best = flips.min()
    tied = ts[flips == best]
    dist = np.abs(tied.astype(np.float64) - float(t_ref))
    pick = tied[np.lexsort((tied, dist))[0]]
    return float(pick), int(best)


def compare(
    ref_logits: np.ndarray,
    cand_logits: Mapping[str, np.ndarray],
    labels: np.ndarray,
    target_precision: float = DEFAULT_TARGET_PRECISION,
    reference: str = "reference",
    head: Optional[Head] = None,
) -> dict:
    """All parity numbers (no timing): the ``reference`` block and one block per candidate.

    ``ref_logits``, each of ``cand_logits``: float32 [n, K]; ``labels``: int [n] (binary:
    0/1; multiclass: the label's index) or bool [n, K] (multilabel). ``head``: the models'
    head (default: binary, positive index 0 for one logit, 1 for two); multiclass and
    multilabel heads: :func:`compare_multi`. Raises :class:`ParityError` (shapes,
    unreachable target).
    """
    if head is not None and head.kind != BINARY:
        return compare_multi(ref_logits, cand_logits, labels, head, target_precision, reference)
    y = np.asarray(labels).astype(np.int64)
    ref_p = probabilities(binary_scores(ref_logits, head))
    if len(ref_p) != len(y):
        raise ParityError(f"{len(ref_p)} reference logits for {len(y)} labels")
    t_ref = threshold_for_precision(ref_p, y, target_precision)
    ref_v = ref_p >= np.float32(t_ref)
    out = {
        "texts": int(len(y)),
        "positives": int(y.sum()),
        "target_precision": target_precision,
        "reference": {"name": reference, "threshold": t_ref, "threshold_logit": threshold_logit(t_ref),
                      "positive_verdicts": int(ref_v.sum()), "vs_labels": label_metrics(y, ref_v),
                      "at_0_5": label_metrics(y, ref_p >= np.float32(0.5))},
        "candidates": {},
    }
    for name, lg in cand_logits.items():
        dev = logit_deviation(ref_logits, lg, head)
        p = probabilities(binary_scores(lg, head))
        v = p >= np.float32(t_ref)
        at_ref = {"threshold": t_ref, "vs_reference": confusion_vs_reference(ref_v, v),
                  "vs_labels": label_metrics(y, v)}
        block = {"logits": dev, "at_reference_threshold": at_ref, "best_threshold": None,
                 "operating_threshold": t_ref}
        if at_ref["vs_reference"]["flips"]:
            t_best, flips = best_matching_threshold(p, ref_v, t_ref)
            vb = p >= np.float32(t_best)
            block["best_threshold"] = {"threshold": t_best, "threshold_logit": threshold_logit(t_best),
                                       "vs_reference": confusion_vs_reference(ref_v, vb),
                                       "vs_labels": label_metrics(y, vb)}
            assert block["best_threshold"]["vs_reference"]["flips"] == flips
            block["operating_threshold"] = t_best
        out["candidates"][name] = block
    return out


def _flips(head: Head, pa: np.ndarray, va: np.ndarray, pb: np.ndarray, vb: np.ndarray) -> int:
    return int(sum(head.flipped(pa[i], va[i], pb[i], vb[i]) for i in range(len(pa))))


def compare_multi(
    ref_logits: np.ndarray,
    cand_logits: Mapping[str, np.ndarray],
    labels: np.ndarray,
    head: Head,
    target_precision: float = DEFAULT_TARGET_PRECISION,
    reference: str = "reference",
) -> dict:
    """:func:`compare` for multiclass and multilabel heads (probabilities, verdicts and
    flips by ``head``: :meth:`Head.probabilities`, :meth:`Head.verdicts`, :meth:`Head.flipped`).

    Multiclass (``labels`` int [n], the label's index): threshold 0 (the top label is the
    answer); a flip is a text whose top label changed; ``vs_labels`` has the accuracy.
    Multilabel (``labels`` bool [n, K]): per label the reference threshold of
    :func:`threshold_for_precision` on that label's column (a list, one per label); a flip
    is a text with some label's verdict changed; when a candidate flips, per label the
    :func:`best_matching_threshold` of that column is its operating threshold.
    ``vs_labels`` has micro-averaged counts over every (text, label).
    """
    y = np.asarray(labels)
    n = len(y)
    ref_p = head.probabilities(ref_logits).astype(np.float32)
    if head.kind == MULTICLASS:
        t_ref = [0.0] * head.columns
        score = lambda p, v: {"accuracy": float(np.mean(p.argmax(axis=1) == y)), "precision": None}  # noqa: E731
    else:
        t_ref = [_label_threshold(ref_p[:, k], y[:, k], target_precision, head.labels[k]) for k in range(head.columns)]
        score = lambda p, v: label_metrics(y.reshape(-1), v.reshape(-1))  # noqa: E731
    rows = lambda t: np.tile(np.asarray(t, dtype=np.float32), (n, 1))  # noqa: E731
    ref_v = head.verdicts(ref_p, rows(t_ref))
    out = {"texts": int(n), "positives": int(y.sum()) if y.ndim == 2 else None, "target_precision": target_precision,
           "head": head.describe(), "labels": list(head.output_labels()),
           "reference": {"name": reference, "threshold": t_ref, "threshold_logit": None,
                         "positive_verdicts": int(ref_v.sum()), "vs_labels": score(ref_p, ref_v),
                         "at_0_5": score(ref_p, head.verdicts(ref_p, rows([0.5] * head.columns)))},
           "candidates": {}}
    for name, lg in cand_logits.items():
        p = head.probabilities(lg).astype(np.float32)
        v = head.verdicts(p, rows(t_ref))
        at_ref = {"threshold": t_ref, "vs_reference": {"flips": _flips(head, ref_p, ref_v, p, v)}, "vs_labels": score(p, v)}
        block = {"logits": logit_deviation(ref_logits, lg, head), "at_reference_threshold": at_ref,
                 "best_threshold": None, "operating_threshold": t_ref}
        if at_ref["vs_reference"]["flips"] and head.kind != MULTICLASS:
            t_best = [best_matching_threshold(p[:, k], ref_v[:, k], t_ref[k])[0] for k in range(head.columns)]
            vb = head.verdicts(p, rows(t_best))
            block["best_threshold"] = {"threshold": t_best, "threshold_logit": None,
                                       "vs_reference": {"flips": _flips(head, ref_p, ref_v, p, vb)},
                                       "vs_labels": score(p, vb)}
            block["operating_threshold"] = t_best
        out["candidates"][name] = block
    return out


def _threshold_text(t, digits: int = 4) -> str:
    """A threshold, or a list of them (one per label)."""
    return f"{t:.{digits}f}" if isinstance(t, float) else "[" + ", ".join(f"{x:.{digits}f}" for x in t) + "]"


def _label_threshold(p: np.ndarray, y: np.ndarray, target: float, label: str) -> float:
    try:
        return threshold_for_precision(p, y, target)
    except ParityError as exc:
        raise ParityError(f"label {label!r}: {exc}") from None


def paired_ratio(candidate: Mapping, reference: Mapping) -> Optional[float]:
    """Median over batches of candidate ms / reference ms for the same batch and pass.

    Pairing cancels what changes between batches (length, load from other processes), so it
    is steadier than a ratio of medians on a shared machine. Falls back to the ratio of the
    medians when per-batch times are missing or of different counts.
    """
    a, b = candidate.get("per_batch_ms"), reference.get("per_batch_ms")
    if a and b and len(a) == len(b):
        return float(np.median(np.asarray(a) / np.asarray(b)))
    if "median_ms" in candidate and reference.get("median_ms"):
        return candidate["median_ms"] / reference["median_ms"]
    return None


def recommend(
    result: dict,
    latency: Mapping[str, dict],
    sizes: Mapping[str, int],
    max_flip_rate: float = DEFAULT_MAX_FLIP_RATE,
) -> dict:
    """Which model to ship, by the rule in the module docstring.

    ``latency``: model -> :func:`score_all` latency dict (same run, same batches; compared
    with :func:`paired_ratio`); ``sizes``: model -> bytes. Returns ``{"ship", "reason", "candidates": {name: {...checks}}, "rule"}``.
    """
    ref = result["reference"]["name"]
    n = result["texts"]
    target = result["target_precision"]
    checks = {}
    winners = []
    for name, c in result["candidates"].items():
        op = c["best_threshold"] or c["at_reference_threshold"]
        flips = op["vs_reference"]["flips"]
        prec = op["vs_labels"]["precision"]
        speed = paired_ratio(latency[name], latency[ref]) if name in latency and ref in latency else None
        size = sizes[name] / sizes[ref] if name in sizes and ref in sizes else None
        ok_flips = flips <= max_flip_rate * n
        ok_prec = prec is not None and prec >= target  # reported, not a condition (see the docstring)
        faster = speed is not None and speed <= 1 - SPEED_MARGIN
        same_speed_smaller = (speed is not None and abs(speed - 1) < SPEED_MARGIN
                              and size is not None and size <= SIZE_MARGIN)
        checks[name] = {"operating_threshold": c["operating_threshold"], "flips": flips,
                        "max_flips": max_flip_rate * n, "flips_ok": ok_flips, "precision": prec,
                        "precision_ok": ok_prec, "latency_ratio": speed, "size_ratio": size,
                        "faster": faster, "same_speed_smaller": same_speed_smaller}
        if ok_flips and (faster or same_speed_smaller):
            winners.append((speed, name))
    ship = min(winners)[1] if winners else ref
    parts = []
    for name, ch in checks.items():
        why = [f"{ch['flips']} flip(s) of {n} at threshold {_threshold_text(ch['operating_threshold'])} "
               f"(limit {ch['max_flips']:.1f}: {'ok' if ch['flips_ok'] else 'too many'})",
               "precision there " + (f"{ch['precision']:.4f}" if ch["precision"] is not None else "undefined")
               + f" (target {target})"]
        if ch["latency_ratio"] is not None:
            why.append(f"latency {ch['latency_ratio']:.2f}x the reference's (median of per-batch ratios)")
        if ch["size_ratio"] is not None:
            why.append(f"file {ch['size_ratio']:.2f}x the reference's size")
        parts.append(f"`{name}`: " + "; ".join(why) + ".")
    if ship == ref:
        head = (f"Ship `{ref}` (the reference): no candidate both stays within the flip limit and is faster "
                "(or as fast and smaller) in this run.")
    else:
        head = (f"Ship `{ship}` with threshold {_threshold_text(checks[ship]['operating_threshold'], 6)}: it stays within the flip "
                f"limit and is {'faster than' if checks[ship]['faster'] else 'as fast as and smaller than'} `{ref}` "
                "in this run.")
    return {"ship": ship, "reason": head + " " + " ".join(parts), "candidates": checks,
            "rule": {"max_flip_rate": max_flip_rate, "speed_margin": SPEED_MARGIN, "size_margin": SIZE_MARGIN}}

