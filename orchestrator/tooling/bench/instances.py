"""Router instances benchmark (issue 29): the shipped router with 1 and with 2 instances
(``instance_group`` count) against the ensemble, closed loop at concurrency 1, 4, 16 and
64, in one run of one server.

``make bench-instances`` or ``python -m orchestrator.tooling.bench.instances [--quick] [--out docs]``:

1. writes the benchmark repository (``make bench``'s, ``variants.make_bench_repository``)
   and adds ``router_x2``: the shipped router with :data:`INSTANCES` instances, nothing else
   changed (the second instance lets the dynamic batcher hand a batch to one instance while
   the other waits on its BLS calls: two ``execute`` calls in flight in one pod);
2. starts one embedded server with ``ensemble``, ``router`` and ``router_x2`` (and what
   they call);
3. for each round and each concurrency, each model in turn (rotated per round, so no
   model always runs first): perf_analyzer (gRPC) on the held-out texts, one text per
   request, ``make bench``'s window settings;
4. writes ``<out>/bench/instances.json`` and the section between :data:`INSTANCES_START`
   and :data:`INSTANCES_END` of ``<out>/benchmarks.md`` (``make bench`` keeps it): per
   concurrency, each model's median throughput and p50 over the rounds and their ratios to
   the ensemble's and to the one-instance router's in the same round (median of the
   per-round ratios).

Units: throughput in inferences per second, latency in milliseconds. Errors:
:class:`~orchestrator.tooling.bench.plan.BenchError`, the server's ``ServerError``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from orchestrator.tooling.bench.machine import load_average, machine_info
from orchestrator.tooling.bench.plan import FULL_SETTINGS, QUICK_SETTINGS, REPO, BenchError, Spec
from orchestrator.tooling.bench.report import INSTANCES_END, INSTANCES_START, write_kept_outputs
from orchestrator.tooling.bench.stack import header_line, read_stack

COMMAND = "make bench-instances  (python -m orchestrator.tooling.bench.instances --out docs)"
MODELS = ("ensemble", "router", "router_x2")
#: ``router_x2``'s instance count.
INSTANCES = 2
CONCURRENCIES = (1, 4, 16, 64)
ROUNDS = 3
SERVER_MODELS = ("tokenizer", "postprocess", "classifier", "classifier_fast", *MODELS)


def _log(msg: str) -> None:
    print(f"[bench-instances {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_instances_repository(dest: Path, repo: Path = REPO) -> Path:
    """The benchmark repository with ``router_x2`` (module docstring), written to ``dest``."""
    from orchestrator.tooling.bench.overload import set_instances
    from orchestrator.tooling.bench.variants import make_bench_repository

    out = make_bench_repository(dest, repo, variants={"router_x2": {"base": "router"}})
    set_instances(out / "router_x2" / "config.pbtxt", INSTANCES)
    return out


def plan(rounds: int, concurrencies: Sequence[int] = CONCURRENCIES, models: Sequence[str] = MODELS) -> List[Spec]:
    """The measurements in order: per round, per concurrency, every model, the model order
    rotated by one each round."""
    out = []
    for r in range(rounds):
        order = list(models[r % len(models):]) + list(models[:r % len(models)])
        for c in concurrencies:
            out += [Spec("instances", m, "held_out", c, 1, r) for m in order]
    return out


def summarize(measurements: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per concurrency (as a string key) and model: ``{"throughput", "p50_ms", "p99_ms"}``
    medians over the rounds, and ``ratios``: per model, the median over rounds of its
    throughput and p50 over the ensemble's and over ``router``'s in the same round
    (``{"throughput_vs_ensemble", "p50_vs_ensemble", "throughput_vs_router",
    "p50_vs_router"}``). Failed measurements (``error``) are left out."""
    ok = [m for m in measurements if not m.get("error")]
    out: Dict[str, Any] = {}
    for c in sorted({int(m["concurrency"]) for m in ok}):
        at = [m for m in ok if int(m["concurrency"]) == c]
        cell: Dict[str, Any] = {"models": {}, "ratios": {}}
        for model in dict.fromkeys(m["model"] for m in at):
            mine = [m for m in at if m["model"] == model]
            cell["models"][model] = {k: round(statistics.median(float(m[k]) for m in mine), 2)
                                     for k in ("throughput", "p50_ms", "p99_ms")}
            cell["models"][model]["rounds"] = len(mine)
        for model in cell["models"]:
            ratios: Dict[str, Optional[float]] = {}
            for base in ("ensemble", "router"):
                if base == model:
                    continue
                thr, p50 = [], []
                for r in sorted({int(m["round"]) for m in at}):
                    a = [m for m in at if m["model"] == model and int(m["round"]) == r]
                    b = [m for m in at if m["model"] == base and int(m["round"]) == r]
                    if a and b and b[0]["throughput"] and b[0]["p50_ms"]:
                        thr.append(a[0]["throughput"] / b[0]["throughput"])
                        p50.append(a[0]["p50_ms"] / b[0]["p50_ms"])
                ratios[f"throughput_vs_{base}"] = round(statistics.median(thr), 2) if thr else None
                ratios[f"p50_vs_{base}"] = round(statistics.median(p50), 2) if p50 else None
            cell["ratios"][model] = ratios
        out[str(c)] = cell
    return out


def _cell(x: Any, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x}{suffix}"


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section of one run's results ``r`` (pure)."""
    L = [INSTANCES_START, "## Router instances: one or two per pod (issue 29)", ""]
    L.append(f"One run of `{COMMAND}` at {r['started_utc']} UTC on {r['machine']['cores']} cores "
             f"({r['machine']['cpu_model']}), load average {r['load_before']} before, highest 1-minute load "
             f"{r['load_max_during']} during (the server and perf_analyzer are on the same cores), "
             f"{r['rounds']} rounds; raw figures in `bench/instances.json`.")
    L += ["", header_line(r.get("stack"))]
    if r.get("quick"):
        L += ["", "> **`--quick` run**: one round, short windows; a smoke test, not a benchmark."]
    L += ["", f"`router_x2`: the shipped router with `instance_group` count {r['instances']}, nothing else changed. "
          "perf_analyzer (gRPC), closed loop, one held-out text per request; medians over the rounds; ratios are "
          "the median of the per-round ratios (models measured one after another in each round, in rotated order).",
          "", "| concurrency | model | throughput, infer/s | p50, ms | p99, ms | throughput / ensemble | p50 / ensemble | "
          "throughput / router | p50 / router |", "|---|---|---|---|---|---|---|---|---|"]
    for c, cell in r["summary"].items():
        for model, x in cell["models"].items():
            q = cell["ratios"].get(model, {})
            L.append(f"| {c} | `{model}` | {x['throughput']} | {x['p50_ms']} | {x['p99_ms']} | "
                     f"{_cell(q.get('throughput_vs_ensemble'), 'x')} | {_cell(q.get('p50_vs_ensemble'), 'x')} | "
                     f"{_cell(q.get('throughput_vs_router'), 'x')} | {_cell(q.get('p50_vs_router'), 'x')} |")
    failed = [m for m in r["measurements"] if m.get("error")]
    if failed:
        L += ["", f"{len(failed)} measurement(s) failed: " + "; ".join(
            f"{m['model']} c={m['concurrency']}: {m['error']}" for m in failed[:3])]
    L += ["", INSTANCES_END]
    return "\n".join(L)


def run(out: Path, quick: bool = False, rounds: Optional[int] = None) -> Dict[str, Any]:
    """The whole benchmark (module docstring); writes the outputs and returns the results."""
    from orchestrator.tooling.bench.measurement import expected_latency_ms, write_input_data
    from orchestrator.tooling.bench.perf_analyzer import install_perf_analyzer, measure
    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    settings = QUICK_SETTINGS if quick else FULL_SETTINGS
    rounds = rounds or (1 if quick else ROUNDS)
    started = time.monotonic()
    results: Dict[str, Any] = {
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_before": load_average(), "machine": machine_info(), "command": COMMAND, "quick": quick,
        "rounds": rounds, "instances": INSTANCES, "concurrencies": list(CONCURRENCIES), "models": list(MODELS)}
    binary = install_perf_analyzer()
    held_out = data.held_out_examples()
    texts = [held_out[i].text for i in np.random.RandomState(0).permutation(len(held_out))]
    with tempfile.TemporaryDirectory(prefix="bench-instances-") as tmp:
        repo = make_instances_repository(Path(tmp) / "model_repository")
        input_data = write_input_data(Path(tmp) / "input.json", texts)
        with TritonServer(repo, models=list(SERVER_MODELS)) as server:
            results["stack"] = read_stack(server, embedded=True)
            measurements: List[Dict[str, Any]] = []
            # a guess of one text's latency, ms, that sizes each model's first windows only;
            # later ones follow its measured latency (measurement.expected_latency_ms)
            warm = {(m, "held_out"): 10.0 for m in MODELS}
            specs = plan(rounds)
            for i, spec in enumerate(specs, 1):
                m = measure(binary, spec, server.grpc_url, input_data, Path(tmp) / "pa", settings,
                            latency_ms=expected_latency_ms(spec, measurements, warm))
                m["load_1min"] = (load_average() or [None])[0]
                measurements.append(m)
                _log(f"[{i}/{len(specs)}] {spec.model} c={spec.concurrency} round {spec.round + 1}: "
                     + (f"FAILED {m['error']}" if m.get("error") else
                        f"{m['throughput']:.1f} infer/s, p50 {m['p50_ms']:.2f} ms, p99 {m['p99_ms']:.2f} ms"))
    during = [m["load_1min"] for m in measurements if m.get("load_1min") is not None]
    results.update(measurements=measurements, summary=summarize(measurements),
                   load_max_during=max(during) if during else None, wall_s=round(time.monotonic() - started, 1))
    write_kept_outputs(out, "instances", results, render_section(results), INSTANCES_START, INSTANCES_END)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.tooling.bench.instances",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".cache/docs"),
                        help="where benchmarks.md and bench/ are (default: .cache/docs; --out docs: the committed ones)")
    parser.add_argument("--quick", action="store_true", help="one round, short windows (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {ROUNDS}; --quick: 1)")
    args = parser.parse_args(argv)
    try:
        print(render_section(run(args.out, quick=args.quick, rounds=args.rounds)))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
