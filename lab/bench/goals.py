"""The headline ratios of a run and the issue's goals they are judged against."""

from __future__ import annotations

from typing import Iterable, List, Mapping, Optional, Sequence

import numpy as np

#: The issue's goals: ``ratio`` key of :func:`compute_ratios`, comparison, bound.
GOALS = (
    {
        "key": "router_single_p50_c1_vs_ensemble",
        "goal": "router (single-classifier) p50 latency at c=1 within 1.10x of ensemble",
        "op": "<=",
        "bound": 1.10,
    },
    {
        "key": "router_single_throughput_c16_vs_ensemble",
        "goal": "router (single-classifier) throughput at c=16 >= 0.95x ensemble",
        "op": ">=",
        "bound": 0.95,
    },
    {
        "key": "router_single_p50_c1_vs_hand_bls",
        "goal": "router (single-classifier) p50 latency at c=1 within 1.05x of the hand-written BLS floor (hand_bls)",
        "op": "<=",
        "bound": 1.05,
    },
    {
        "key": "router_single_throughput_c16_vs_hand_bls",
        "goal": "router (single-classifier) throughput at c=16 >= 0.95x the hand-written BLS floor (hand_bls)",
        "op": ">=",
        "bound": 0.95,
    },
    {
        "key": "router_throughput_c16_vs_ensemble_pad512",
        "goal": "default router throughput at c=16 >= 3x ensemble_pad512 (the seeds')",
        "op": ">=",
        "bound": 3.0,
    },
    {
        "key": "router_accuracy_points_vs_ensemble",
        "goal": "default router accuracy within 1 point of the accurate classifier (ensemble)",
        "op": ">=",
        "bound": -1.0,
    },
)


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """``numerator / denominator``; None when either is missing or the denominator is not > 0."""
    if numerator is None or denominator is None:
        return None
    try:
        if not denominator > 0 or not np.isfinite(numerator) or not np.isfinite(denominator):
            return None
    except TypeError:
        return None
    return float(numerator) / float(denominator)


def paired_ratios(measurements: Sequence[Mapping], model: str, base: str, metric: str, **where) -> List[float]:
    """Per-round ``metric`` ratios of ``model`` over ``base`` at the level ``where`` (e.g.
    section="grid", concurrency=1), pairing the rounds by number: each pair ran back to
    back. Reads ``rounds`` of :func:`combine_rounds` entries (a single measurement is
    round 0); rounds where either failed are skipped."""
    def by_round(name):
        m = next((x for x in measurements if x.get("model") == name and all(x.get(k) == v for k, v in where.items())), None)
        if m is None:
            return {}
        return {x.get("round", 0): x.get(metric) for x in (m.get("rounds") or [m]) if not x.get("error")}

    a, b = by_round(model), by_round(base)
    return [v for r in sorted(set(a) & set(b)) if (v := ratio(a[r], b[r])) is not None]


def paired_median(measurements: Sequence[Mapping], model: str, base: str, metric: str, **where) -> Optional[float]:
    """The median of :func:`paired_ratios` (same arguments); None when there is no pair."""
    rs = paired_ratios(measurements, model, base, metric, **where)
    return float(np.median(rs)) if rs else None



def find_measurement(measurements: Iterable[Mapping], **where) -> Optional[Mapping]:
    for m in measurements:
        if all(m.get(k) == v for k, v in where.items()) and m.get("error") is None:
            return m
    return None


def metric_of(measurements, metric: str, **where) -> Optional[float]:
    m = find_measurement(measurements, **where)
    return None if m is None else m.get(metric)


def compute_ratios(measurements: Sequence[Mapping], accuracy: Mapping[str, Mapping], raw: Mapping[str, Mapping]) -> dict:
    """The report's headline ratios, all from one run (None where a figure is missing).

    Keys: ``router_single_p50_c1_vs_ensemble`` (p50 ratio at c=1: the median of the
    per-round ratios, :func:`paired_median`; ``..._rounds`` lists them),
    ``router_single_throughput_c16_vs_ensemble``, ``router_throughput_c16_vs_ensemble_pad512``,
    ``router_throughput_c16_vs_ensemble``, ``ensemble_throughput_c16_vs_ensemble_pad512``,
    ``router_accuracy_points_vs_ensemble`` (percentage points, router - ensemble; a
    difference, not a ratio), and ``<model>_p50_c1_vs_raw`` (end-to-end p50 at c=1 over the
    raw floor's p50: ``classifier`` for the ensemble and router_single, ``classifier_pad512``
    for ensemble_pad512, ``classifier_fast`` for the router's first step).
    """
    g = [m for m in measurements if m.get("section") == "grid"]

    def val(model, metric, c):
        return metric_of(g, metric, model=model, concurrency=c)

    out = {
        "router_single_p50_c1_vs_ensemble": paired_median(g, "router_single", "ensemble", "p50_ms", concurrency=1),
        "router_single_p50_c1_vs_ensemble_rounds": paired_ratios(g, "router_single", "ensemble", "p50_ms", concurrency=1),
        "router_single_throughput_c16_vs_ensemble": ratio(val("router_single", "throughput", 16), val("ensemble", "throughput", 16)),
        "router_single_p50_c1_vs_hand_bls": paired_median(g, "router_single", "hand_bls", "p50_ms", concurrency=1),
        "router_single_throughput_c16_vs_hand_bls": ratio(val("router_single", "throughput", 16), val("hand_bls", "throughput", 16)),
        "router_throughput_c16_vs_ensemble_pad512": ratio(val("router", "throughput", 16), val("ensemble_pad512", "throughput", 16)),
        "router_throughput_c16_vs_ensemble": ratio(val("router", "throughput", 16), val("ensemble", "throughput", 16)),
        "ensemble_throughput_c16_vs_ensemble_pad512": ratio(val("ensemble", "throughput", 16), val("ensemble_pad512", "throughput", 16)),
        "router_single_bls_p50_c1_vs_ensemble": paired_median(g, "router_single_bls", "ensemble", "p50_ms", concurrency=1),
        "router_single_bls_throughput_c16_vs_ensemble": ratio(
            val("router_single_bls", "throughput", 16), val("ensemble", "throughput", 16)
        ),
        "router_bls_throughput_c16_vs_ensemble_pad512": ratio(
            val("router_bls", "throughput", 16), val("ensemble_pad512", "throughput", 16)
        ),
    }
    acc_r, acc_e = accuracy.get("router", {}).get("accuracy_pct"), accuracy.get("ensemble", {}).get("accuracy_pct")
    out["router_accuracy_points_vs_ensemble"] = None if acc_r is None or acc_e is None else acc_r - acc_e
    floors = {"ensemble": "classifier", "router_single": "classifier", "ensemble_pad512": "classifier_pad512",
              "router": "classifier_fast"}
    for model, floor in floors.items():
        out[f"{model}_p50_c1_vs_raw"] = ratio(val(model, "p50_ms", 1), raw.get(floor, {}).get("p50_ms"))
    return out


def evaluate_goals(ratios: Mapping[str, Optional[float]], goals: Sequence[Mapping] = GOALS) -> List[dict]:
    """Each goal with ``value`` (from ``ratios``) and ``met`` (True, False, or None if unmeasured)."""
    out = []
    for goal in goals:
        value = ratios.get(goal["key"])
        met = None if value is None else (value <= goal["bound"] if goal["op"] == "<=" else value >= goal["bound"])
        out.append({**goal, "value": value, "met": met})
    return out

