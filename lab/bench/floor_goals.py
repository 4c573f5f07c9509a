"""The two floor goals alone (``python -m lab.bench.instances --compare floor --goals-only``):
``router_single`` against ``hand_bls`` at c=1 and c=16, side by side for as many rounds as
deciding the goals takes, on one embedded server that serves only what the two call, with
variants of ``router_single`` beside them (``--also``). The goals, their decisions and the
server's split are ``lab.bench.floor``'s; see its module docstring.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from lab.bench.floor import (
    COMMAND,
    FLOOR_CONCURRENCIES,
    SPLIT_DOWNSTREAM,
    SPLIT_MODELS,
    _fmt_decision,
    floor_goals,
    held_out_order,
    make_floor_repository,
    measure_specs,
    pair_ratios,
    run_header,
    split_summary,
)
from lab.bench.measurement import max_load
from lab.bench.plan import Spec


def goals_plan(rounds: int, concurrencies: Sequence[int] = FLOOR_CONCURRENCIES, also: Sequence[str] = ()) -> List[Spec]:
    """The floor goals alone (:func:`goals_run`): per round, at each concurrency,
    ``router_single``, the variants ``also`` and ``hand_bls``, the order reversed every other
    round."""
    models = ("router_single", *also, "hand_bls")
    return [Spec("floor", m, "held_out", c, 1, r)
            for r in range(rounds) for c in concurrencies for m in (models if r % 2 == 0 else models[::-1])]


def variant_ratios(measurements: Sequence[Mapping[str, Any]], also: Sequence[str], concurrencies: Sequence[int]) -> Dict[str, Any]:
    """Each variant of ``also`` against ``hand_bls`` as the goals judge ``router_single``: p50
    at c=1 and throughput at c=16, the median per-round ratio with its interval, not judged."""
    from lab.bench.instances import median_interval, rounded_interval

    out: Dict[str, Any] = {}
    for model in also:
        for c, key, field in ((1, "p50_c1", "p50_ms"), (16, "throughput_c16", "throughput")):
            if c in concurrencies:
                ratios = pair_ratios(measurements, model, "hand_bls", c, field)
                out.setdefault(model, {})[key] = {"n": len(ratios), "interval": rounded_interval(median_interval(ratios)),
                                                  "per_round": [round(v, 3) for v in ratios]}
    return out


def goals_run(out: Path, rounds: int, window_ms: int = 1000, concurrencies: Sequence[int] = FLOOR_CONCURRENCIES,
              command: str = COMMAND + " --goals-only", also: Sequence[str] = ()) -> Dict[str, Any]:
    """The two floor goals alone, for as many rounds as deciding them takes (``--goals-only``):
    :func:`goals_plan` on one embedded server that serves only what ``router_single`` and
    ``hand_bls`` call, with the server's split at c=1 as in ``lab.bench.floor.run``; no cost model, load
    or repair. ``also``: variants of ``router_single`` in the benchmark repository
    (``lab.bench.plan.VARIANTS``) measured in every round too, their ratios to ``hand_bls``
    reported beside the goals (:func:`variant_ratios`). Writes ``<out>/bench/floor_goals.json``
    (not the floor's section: that stays the full run's) and returns ``{"floor_goals",
    "variants", "server_split", ...}``."""
    import tempfile
    import time

    from lab.bench.machine import load_average
    from lab.bench.measurement import write_input_data
    from lab.bench.stack import read_stack
    from orchestrator.tooling.server import TritonServer

    started = time.monotonic()
    results: Dict[str, Any] = {**run_header(command, rounds, window_ms), "concurrencies": list(concurrencies),
                               "models": ["router_single", *also, "hand_bls"]}
    texts = held_out_order()
    with tempfile.TemporaryDirectory(prefix="bench-floor-goals-") as tmp:
        repo = make_floor_repository(Path(tmp) / "model_repository", also=also)
        inputs = {"held_out": write_input_data(Path(tmp) / "input.json", texts)}
        with TritonServer(repo, models=["tokenizer", "postprocess", SPLIT_DOWNSTREAM, *SPLIT_MODELS, *also]) as server:
            results["stack"] = read_stack(server, embedded=True)
            warm = {(m, "held_out"): 10.0 for m in (*SPLIT_MODELS, *also)}
            measurements = measure_specs(goals_plan(rounds, concurrencies, also), server, inputs, Path(tmp) / "pa", window_ms,
                                         warm, lambda spec: spec.concurrency == 1, "floor goals")
    results.update(measurements=measurements, load_max_during=max_load(measurements), load_after=load_average(),
                   floor_goals=goals_of(measurements, concurrencies), variants=variant_ratios(measurements, also, concurrencies),
                   server_split=split_summary(measurements), wall_s=round(time.monotonic() - started, 1))
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / "floor_goals.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def goals_of(measurements: Sequence[Mapping[str, Any]], concurrencies: Sequence[int]) -> Dict[str, Any]:
    """:func:`floor_goals` of the goals whose concurrency was measured (``p50_c1``: 1,
    ``throughput_c16``: 16)."""
    return {k: v for k, v in floor_goals(measurements).items() if (1 if k == "p50_c1" else 16) in concurrencies}


def render_goals(r: Mapping[str, Any]) -> str:
    """:func:`goals_run`'s verdicts, one line each."""
    lines = [f"floor goals, {r['rounds']} rounds ({r['command']}):"]
    for name, d in r["floor_goals"].items():
        lines.append(f"  {name}: {_fmt_decision(d)}")
    for model, goals in (r.get("variants") or {}).items():
        for name, d in goals.items():
            median, low, high = d["interval"]
            lines.append(f"  {model} {name}: median {median}x over {d['n']} rounds, 95% interval {low}x to {high}x (not judged)")
    return "\n".join(lines)
