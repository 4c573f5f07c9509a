"""Side-by-side router variants: the shipped router against one variant of it and
the ensemble, closed loop, in one run of one server. The comparisons:

- ``instances`` (``make bench-instances``): ``router_x2``, the shipped router with
  :data:`INSTANCES` instances (``instance_group`` count), at concurrency 1, 4, 16 and 64
  (the second instance lets the dynamic batcher hand a batch to one instance while the
  other waits on its BLS calls: two ``execute`` calls in flight in one pod);
- ``flush`` (``make bench-flush``): ``router_all_timings``, the shipped router with the
  config parameter ``metrics_timing_sample: all`` (every timing observation sent to
  ``/metrics``, one stub-server round trip each, as before ``make profile``'s change), at
  concurrency 1 and 16, five rounds (the c=1 routing-overhead goal is stated as a median of five);
- ``single`` (``make bench-single``): ``router_single`` (``make bench``'s single-classifier
  policy: the ensemble's compute, so the ratio is the routing overhead alone) at
  concurrency 1 only, :data:`SINGLE_ROUNDS` rounds: enough for a distribution-free 95%
  interval of the median per-round p50 ratio to the ensemble (:func:`median_interval`), so
  the routing-overhead goal (at most :data:`SINGLE_P50_GOAL`) is judged met, not met, or not
  decided by the run, instead of by one noisy median of five;
- ``runtime`` (``make bench-runtime BASELINE=DIR``): ``router_before``, the router of another
  checkout of this project (``--baseline DIR``, e.g. a worktree of the previous commit)
  importing that checkout's ``orchestrator``, beside ``router`` at concurrency 1 and 16,
  :data:`lab.bench.runtime.ROUNDS` rounds, no ensemble: after / before per round, judged
  "speed unchanged" by the interval of the median ratio (:mod:`lab.bench.runtime`).

``python -m lab.bench.instances [--compare instances|flush|single|runtime] [--baseline DIR] [--quick] [--out docs/results]``:

1. writes the benchmark repository (``make bench``'s, ``variants.make_bench_repository``)
   and adds the variant (nothing else changed);
2. starts one embedded server with ``ensemble``, ``router`` and the variant (and what
   they call);
3. for each round and each concurrency, each model in turn (rotated per round, so no
   model always runs first): perf_analyzer (gRPC) on the held-out texts, one text per
   request, ``make bench``'s window settings;
4. writes ``<out>/bench/<comparison>.json`` and the comparison's section of
   ``<out>/benchmarks.md`` (``make bench`` keeps it): per concurrency, each model's median
   throughput and p50 over the rounds and their ratios to the ensemble's and to the shipped
   router's in the same round (median of the per-round ratios, with its 95% interval).

Units: throughput in inferences per second, latency in milliseconds. Errors:
:class:`~lab.bench.plan.BenchError`, the server's ``ServerError``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from lab.bench.machine import load_average, machine_info
from lab.bench.measurement import failed_note, max_load
from lab.bench.plan import FULL_SETTINGS, QUICK_SETTINGS, REPO, BenchError, Spec
from lab.bench.report import (
    FLUSH_END,
    FLUSH_START,
    INSTANCES_END,
    INSTANCES_START,
    RUNTIME_END,
    RUNTIME_START,
    SINGLE_END,
    SINGLE_START,
    add_out_argument,
    write_kept_outputs,
)
from lab.bench.runtime import CONCURRENCIES as RUNTIME_CONCURRENCIES
from lab.bench.runtime import MODELS as RUNTIME_MODELS
from lab.bench.runtime import ROUNDS as RUNTIME_ROUNDS
from lab.bench.stack import header_line, read_stack

#: ``router_x2``'s instance count.
INSTANCES = 2
CONCURRENCIES = (1, 4, 16, 64)
ROUNDS = 3
#: ``single``'s rounds: with 15 per-round ratios the distribution-free 95% interval of their
#: median runs from the 4th to the 12th smallest (binomial, p=0.5).
SINGLE_ROUNDS = 15
#: The routing-overhead goal: ``router_single``'s p50 at c=1 at most this times the ensemble's.
SINGLE_P50_GOAL = 1.05


def _log(msg: str) -> None:
    print(f"[bench-variants {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_instances_repository(dest: Path, repo: Path = REPO) -> Path:
    """The benchmark repository with ``router_x2`` (module docstring), written to ``dest``."""
    from lab.bench.overload import set_instances
    from lab.bench.variants import make_bench_repository

    out = make_bench_repository(dest, repo, variants={"router_x2": {"base": "router"}})
    set_instances(out / "router_x2" / "config.pbtxt", INSTANCES)
    return out


def make_flush_repository(dest: Path, repo: Path = REPO) -> Path:
    """The benchmark repository with ``router_all_timings`` (module docstring), written to ``dest``."""
    from lab.bench.variants import make_bench_repository
    from orchestrator.runtime.metrics import SAMPLE_PARAMETER
    from orchestrator.tooling.repository import read_config, write_config

    out = make_bench_repository(dest, repo, variants={"router_all_timings": {"base": "router"}})
    path = out / "router_all_timings" / "config.pbtxt"
    config = read_config(path)
    config.parameters[SAMPLE_PARAMETER].string_value = "all"
    write_config(path, config, [f"Benchmark variant (lab.bench.instances): {SAMPLE_PARAMETER} all."])
    return out


def make_single_repository(dest: Path, repo: Path = REPO) -> Path:
    """The benchmark repository with ``router_single`` (``make bench``'s variant), written to ``dest``."""
    from lab.bench.plan import VARIANTS
    from lab.bench.variants import make_bench_repository

    return make_bench_repository(dest, repo, variants={"router_single": VARIANTS["router_single"]})


@dataclass(frozen=True)
class Comparison:
    """One side-by-side comparison: the shipped router against ``variant`` (module docstring)."""

    name: str  # --compare value and the JSON's name under bench/
    make: str  # the make target
    title: str
    variant: str
    what: str  # the variant in one sentence, for the section
    make_repository: Callable[[Path], Path]
    concurrencies: Tuple[int, ...]
    rounds: int
    start: str
    end: str
    p50_goal: Optional[float] = None  # the variant's p50 over the ensemble's, judged by its interval
    served: Optional[Tuple[str, ...]] = None  # the models measured, when not the ensemble, router and variant

    @property
    def models(self) -> Tuple[str, ...]:
        return self.served or ("ensemble", "router", self.variant)

    @property
    def command(self) -> str:
        flag = "" if self.name == "instances" else f" --compare {self.name}"
        return f"make {self.make}  (python -m lab.bench.instances{flag} --out docs/results)"


def make_runtime_repository(dest: Path, baseline: Path) -> Path:
    """The benchmark repository with ``router_before`` from the checkout ``baseline``
    (:func:`lab.bench.runtime.make_runtime_repository`), written to ``dest``."""
    from lab.bench import runtime

    return runtime.make_runtime_repository(dest, baseline)


COMPARISONS = {
    "instances": Comparison(
        "instances", "bench-instances", "Router instances: one or two per pod", "router_x2",
        f"the shipped router with `instance_group` count {INSTANCES}, nothing else changed",
        make_instances_repository, CONCURRENCIES, ROUNDS, INSTANCES_START, INSTANCES_END),
    "flush": Comparison(
        "flush", "bench-flush", "The metrics flush: a sample of timings or every one", "router_all_timings",
        "the shipped router with the config parameter `metrics_timing_sample: all` (every timing observation "
        "sent to `/metrics`, one stub-server round trip each, as before the profile's change); `router` sends "
        "at most 8 per series per flush",
        make_flush_repository, (1, 16), 5, FLUSH_START, FLUSH_END),
    "single": Comparison(
        "single", "bench-single", "Routing overhead at concurrency 1: router_single against the ensemble",
        "router_single", "`make bench`'s single-classifier policy (the empty-text guard, then `classifier` in a "
        "chunk node): the ensemble's compute, so its ratio to the ensemble is the routing overhead alone",
        make_single_repository, (1,), SINGLE_ROUNDS, SINGLE_START, SINGLE_END, SINGLE_P50_GOAL),
    "runtime": Comparison(
        "runtime", "bench-runtime", "The runtime before and after", "router_before",
        "the router of the baseline checkout (`--baseline DIR`) importing that checkout's `orchestrator`, "
        "with this checkout's policy", make_runtime_repository, RUNTIME_CONCURRENCIES, RUNTIME_ROUNDS,
        RUNTIME_START, RUNTIME_END, served=RUNTIME_MODELS),
}
#: The default comparison's models (kept for callers of the instances benchmark).
MODELS = COMPARISONS["instances"].models


def plan(rounds: int, concurrencies: Sequence[int] = CONCURRENCIES, models: Sequence[str] = MODELS) -> List[Spec]:
    """The measurements in order: per round, per concurrency, every model, the model order
    rotated by one each round."""
    out = []
    for r in range(rounds):
        order = list(models[r % len(models):]) + list(models[:r % len(models)])
        for c in concurrencies:
            out += [Spec("instances", m, "held_out", c, 1, r) for m in order]
    return out


def _round_ratios(at: Sequence[Mapping[str, Any]], model: str, base: str) -> Tuple[List[float], List[float]]:
    """``model``'s throughput and p50 over ``base``'s in each round of the measurements
    ``at`` (one concurrency, failures left out) where both were measured, in round order."""
    thr: List[float] = []
    p50: List[float] = []
    for r in sorted({int(m["round"]) for m in at}):
        a = [m for m in at if m["model"] == model and int(m["round"]) == r]
        b = [m for m in at if m["model"] == base and int(m["round"]) == r]
        if a and b and b[0]["throughput"] and b[0]["p50_ms"]:
            thr.append(a[0]["throughput"] / b[0]["throughput"])
            p50.append(a[0]["p50_ms"] / b[0]["p50_ms"])
    return thr, p50


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Optional[Tuple[float, float, float]]:
    """``(median, low, high)`` of ``values``: ``low..high`` is the distribution-free
    interval of the median at ``confidence`` (order statistics, binomial with p=0.5:
    ``scipy.stats.quantile_test``), which assumes only that the values are independent
    draws; None for fewer than 2 values; ``low``/``high`` are NaN when there are too few
    values for ``confidence`` (under 6 at 95%)."""
    from scipy import stats

    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=float)
    ci = stats.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(confidence_level=confidence)
    return float(np.median(x)), float(ci.low), float(ci.high)


def rounded_interval(interval: Optional[Sequence[float]], digits: int = 3) -> List[Optional[float]]:
    """``[median, low, high]`` of a :func:`median_interval` rounded to ``digits``; None for
    each that is missing or NaN (JSON has no NaN), all three None without an interval."""
    return [None if v is None or not np.isfinite(v) else round(float(v), digits) for v in (interval or (None, None, None))]


def judge(interval: Optional[Sequence[float]], goal: float) -> str:
    """A goal "ratio at most ``goal``" judged by a median's ``(median, low, high)``:
    ``met`` (the high end within it), ``not met`` (the low end past it), else ``not
    decided`` (also without an interval)."""
    if interval is None or not all(v is not None and np.isfinite(v) for v in interval[1:3]):
        return "not decided"
    if interval[2] <= goal:
        return "met"
    return "not met" if interval[1] > goal else "not decided"


def summarize(measurements: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per concurrency (as a string key) and model: ``{"throughput", "p50_ms", "p99_ms"}``
    medians over the rounds, and ``ratios``: per model, the median over rounds of its
    throughput and p50 over the ensemble's and over ``router``'s in the same round
    (``{"throughput_vs_ensemble", "p50_vs_ensemble", "throughput_vs_router",
    "p50_vs_router"}``), and ``p50_vs_ensemble_interval``: per model, :func:`median_interval`
    of its per-round p50 ratios to the ensemble's (rounded to 3 places; None under 2
    rounds, the interval's ends None when too few for one) and ``p50_vs_ensemble_pairs``,
    the number of rounds both were measured in. Failed measurements (``error``) are left out."""
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
                thr, p50 = _round_ratios(at, model, base)
                ratios[f"throughput_vs_{base}"] = round(statistics.median(thr), 2) if thr else None
                ratios[f"p50_vs_{base}"] = round(statistics.median(p50), 2) if p50 else None
                if base == "ensemble":
                    iv = median_interval(p50)
                    cell.setdefault("p50_vs_ensemble_interval", {})[model] = \
                        [round(v, 3) if np.isfinite(v) else None for v in iv] if iv else None  # JSON has no NaN
                    cell.setdefault("p50_vs_ensemble_pairs", {})[model] = len(p50)
            cell["ratios"][model] = ratios
        out[str(c)] = cell
    return out


def _cell(x: Any, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x}{suffix}"


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section of one run's results ``r`` (pure); ``r["comparison"]``
    names its :data:`COMPARISONS` entry (absent in runs before there were two: instances)."""
    if r.get("comparison") == "runtime":
        from lab.bench import runtime

        return runtime.render_section(r)
    cmp = COMPARISONS[r.get("comparison", "instances")]
    L = [cmp.start, f"## {cmp.title}", ""]
    L.append(f"One run of `{cmp.command}` at {r['started_utc']} UTC on {r['machine']['cores']} cores "
             f"({r['machine']['cpu_model']}), load average {r['load_before']} before, highest 1-minute load "
             f"{r['load_max_during']} during (the server and perf_analyzer are on the same cores), "
             f"{r['rounds']} rounds; raw figures in `bench/{cmp.name}.json`.")
    L += ["", header_line(r.get("stack"))]
    if r.get("quick"):
        L += ["", "> **`--quick` run**: one round, short windows; a smoke test, not a benchmark."]
    L += ["", f"`{cmp.variant}`: {cmp.what}. "
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
    for c, cell in r["summary"].items():
        for model, iv in (cell.get("p50_vs_ensemble_interval") or {}).items():
            if iv and iv[1] is not None and iv[2] is not None:
                pairs = (cell.get("p50_vs_ensemble_pairs") or {}).get(model, cell["models"][model]["rounds"])
                L += ["", f"c={c} `{model}` p50 / ensemble: median of {pairs} per-round ratios "
                      f"{iv[0]}x, 95% interval {iv[1]}x to {iv[2]}x (distribution-free interval of a median, "
                      "`scipy.stats.quantile_test`)."]
    if cmp.p50_goal is not None:
        for c, cell in r["summary"].items():
            iv = (cell.get("p50_vs_ensemble_interval") or {}).get(cmp.variant)
            L += ["", f"The routing-overhead goal, `{cmp.variant}` p50 at c={c} at most {cmp.p50_goal}x the ensemble's: "
                  f"**{judge(iv, cmp.p50_goal)}** by this run (met: the interval's high end within the bound; "
                  "not met: its low end past it; otherwise not decided)."]
    rounds = r.get("per_round_ratios") or {}
    if rounds:
        L += ["", "Per-round ratios to the shipped router's, in round order: " + "; ".join(
            f"c={c} throughput {', '.join(map(str, v['throughput']))}, p50 {', '.join(map(str, v['p50']))}"
            for c, v in rounds.items()) + "."]
    L += [*failed_note(r["measurements"], rounds=False), "", cmp.end]
    return "\n".join(L)


def per_round_ratios(measurements: Sequence[Mapping[str, Any]], variant: str) -> Dict[str, Dict[str, List[float]]]:
    """Per concurrency (string key): ``variant``'s throughput and p50 over ``router``'s in
    each round where both were measured, in round order (rounded to 2 places)."""
    ok = [m for m in measurements if not m.get("error")]
    out: Dict[str, Dict[str, List[float]]] = {}
    for c in sorted({int(m["concurrency"]) for m in ok}):
        thr, p50 = _round_ratios([m for m in ok if int(m["concurrency"]) == c], variant, "router")
        out[str(c)] = {"throughput": [round(x, 2) for x in thr], "p50": [round(x, 2) for x in p50]}
    return out


def run(out: Path, quick: bool = False, rounds: Optional[int] = None, compare: str = "instances",
        baseline: Optional[Path] = None, command: Optional[str] = None) -> Dict[str, Any]:
    """The whole benchmark (module docstring) for comparison ``compare``; writes the outputs
    and returns the results. ``baseline``: the other checkout (``runtime`` only, required
    there); ``command``: the command line recorded (default: the comparison's make target)."""
    from lab.bench import runtime
    from lab.bench.measurement import measure_next, outcome, write_input_data
    from lab.bench.perf_analyzer import install_perf_analyzer
    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import ServerError, TritonServer

    cmp = COMPARISONS[compare]
    before = cmp.name == "runtime"
    if before != (baseline is not None):
        raise BenchError("--baseline DIR goes with --compare runtime, and only there")
    settings = QUICK_SETTINGS if quick else FULL_SETTINGS
    rounds = rounds or (1 if quick else cmp.rounds)
    started = time.monotonic()
    results: Dict[str, Any] = {
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_before": load_average(), "machine": machine_info(), "command": command or cmp.command, "quick": quick,
        "comparison": cmp.name, "rounds": rounds, "concurrencies": list(cmp.concurrencies), "models": list(cmp.models)}
    if cmp.name == "instances":
        results["instances"] = INSTANCES
    if before:
        baseline, results["checkouts"] = runtime.prepare(baseline)
        results["command"] = command or f"python -m lab.bench.instances --compare runtime --baseline {baseline}"
    binary = install_perf_analyzer()
    held_out = data.held_out_examples()
    texts = [held_out[i].text for i in np.random.RandomState(0).permutation(len(held_out))]
    with tempfile.TemporaryDirectory(prefix=f"bench-{cmp.name}-") as tmp:
        dest = Path(tmp) / "model_repository"
        repo = cmp.make_repository(dest, baseline) if before else cmp.make_repository(dest)
        input_data = write_input_data(Path(tmp) / "input.json", texts)
        server_models = ["tokenizer", "postprocess", "classifier", "classifier_fast", *cmp.models]
        try:
            server = TritonServer(repo, models=server_models).start()
        except ServerError as exc:
            if not before:
                raise
            raise BenchError(f"the server did not start with {runtime.BEFORE} from the baseline {baseline} "
                             f"(its router with this checkout's policy): {exc}") from exc
        with server:
            results["stack"] = read_stack(server, embedded=True)
            if before:
                results["orchestrator_files"] = runtime.served_from(server.log_path.read_text(errors="replace"),
                                                                    Path(baseline or ""))
            measurements: List[Dict[str, Any]] = []
            # a guess of one text's latency, ms, that sizes each model's first windows only;
            # later ones follow its measured latency (measurement.expected_latency_ms)
            warm = {(m, "held_out"): 10.0 for m in cmp.models}
            specs = plan(rounds, cmp.concurrencies, cmp.models)
            for i, spec in enumerate(specs, 1):
                m = measure_next(binary, spec, server.grpc_url, input_data, Path(tmp) / "pa", settings, measurements, warm)
                _log(f"[{i}/{len(specs)}] {spec.model} c={spec.concurrency} round {spec.round + 1}: {outcome(m)}")
    results.update(measurements=measurements, load_max_during=max_load(measurements),
                   wall_s=round(time.monotonic() - started, 1))
    if before:
        _log(f"the engine alone, {rounds} rounds")
        results["engine"] = runtime.engine_rounds(runtime.ROOT, Path(baseline or ""), rounds,
                                                  runs=300 if quick else runtime.ENGINE_RUNS)
        results["summary"] = runtime.runtime_summary(measurements, results["engine"])
    else:
        results.update(summary=summarize(measurements), per_round_ratios=per_round_ratios(measurements, cmp.variant))
    write_kept_outputs(out, cmp.name, results, render_section(results), cmp.start, cmp.end)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.instances",
                                     description=(__doc__ or "").split("\n")[0])
    add_out_argument(parser)
    parser.add_argument("--compare", choices=sorted([*COMPARISONS, "floor"]), default="instances",
                        help="which variant to put beside the shipped router (default: instances); floor: the "
                             "router against hand_bls, the cascade's cost model, load and repair time (lab.bench.floor)")
    parser.add_argument("--quick", action="store_true", help="one round, short windows (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default: the comparison's; --quick: 1)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="runtime: a checkout of the commit to compare with (e.g. git worktree add DIR HEAD~1); "
                             "its router is served as router_before beside this checkout's")
    parser.add_argument("--load-rounds", type=int, default=5,
                        help="floor: fresh server starts for the load-to-ready times (0: none; default 5)")
    parser.add_argument("--soak-report", type=Path, default=Path("docs/results/soak/report.json"),
                        help="floor: the soak report whose router reload downtime is reported")
    parser.add_argument("--window-ms", type=int, default=1000, help="floor: perf_analyzer window length, ms (default 1000)")
    parser.add_argument("--summarize", type=Path, default=None, metavar="JSON",
                        help="floor: summarize a run's bench/floor.json again with this checkout's code (measures nothing)")
    parser.add_argument("--goals-only", action="store_true",
                        help="floor: only router_single and hand_bls, for the two floor goals (bench/floor_goals.json)")
    parser.add_argument("--concurrencies", type=int, nargs="+", default=[1, 16], choices=[1, 16],
                        help="floor --goals-only: the goals' concurrencies to measure (default: 1 16)")
    parser.add_argument("--also", nargs="+", default=[], metavar="VARIANT",
                        help="floor --goals-only: variants of router_single (lab.bench.plan.VARIANTS) measured in every "
                             "round too, their ratios to hand_bls reported, not judged")
    args = parser.parse_args(argv)
    try:
        if args.baseline is not None and args.compare != "runtime":
            raise BenchError("--baseline DIR goes with --compare runtime, and only there")
        if args.summarize is not None and args.compare != "floor":
            raise BenchError("--summarize JSON goes with --compare floor, and only there")
        if args.compare == "floor":
            from lab.bench import floor

            command = " ".join(["python -m lab.bench.instances", *(sys.argv[1:] if argv is None else argv)])
            if args.summarize is not None:
                print(floor.render_section(floor.summarize(args.summarize, args.out, command)))
                return 0
            if args.goals_only:
                from lab.bench import floor_goals

                print(floor_goals.render_goals(floor_goals.goals_run(args.out, args.rounds or floor.FLOOR_ROUNDS, args.window_ms,
                                                                     args.concurrencies, command, also=args.also)))
                return 0
            print(floor.render_section(floor.run(args.out, quick=args.quick, rounds=args.rounds, load_rounds=args.load_rounds,
                                                 soak_report=args.soak_report, window_ms=args.window_ms, command=command)))
            return 0
        command = None
        if args.compare == "runtime":
            command = " ".join(["python -m lab.bench.instances", *(sys.argv[1:] if argv is None else argv)])
        print(render_section(run(args.out, quick=args.quick, rounds=args.rounds, compare=args.compare,
                                 baseline=args.baseline, command=command)))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
