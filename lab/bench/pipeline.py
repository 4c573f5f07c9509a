"""A migrated pipeline against its ensemble, a hand-written BLS model and a cost model
(``make bench-pipeline`` or ``python -m lab.bench.pipeline [--quick] [--rounds N] [--out DIR]``),
side by side in one embedded server.

The benchmark repository is a copy of ``model_repository/`` with:

- ``migrated``: ``orchestrator migrate model_repository/ensemble --name migrated`` run into
  it (the shipped ensemble's tokenizer -> classifier -> postprocess as a pipeline policy);
- ``hand_pipeline`` (``lab/bench/hand_pipeline``, beside ``lab/bench/hand_bls``): the same
  three calls written by hand with BLS, request by request, with the migrated router's
  configuration (``dynamic_batching``, as ``migrate`` writes it for a batching ensemble);
- ``hand_ensemble`` (``lab/bench/hand_ensemble``): one BLS call to ``ensemble`` per request,
  nothing else: the least any Python-backend model in front of the ensemble costs (its stub's
  entry and one round trip), the floor under the p50 goal;
- ``migrated_whole``: ``orchestrator migrate ... --call-ensemble``: the router calling
  ``ensemble`` whole, in one step (the ensemble kept, the router in front of it where
  branches would go);
- ``migrated_serial`` and ``hand_serial``: the same two without ``dynamic_batching``
  (``migrate --no-dynamic-batching``): one request per ``execute``, so their throughput
  at c=16 compares the router's own cost per request with the hand-written model's;
- ``skip_half`` and ``skip_never``: two-step pipelines (``tokenizer``, then ``classifier``);
  in ``skip_half`` the second step runs only for the texts of more tokens than the held-out
  texts' median (a ``when`` on ``input_ids``' shape, request scope, ``logits`` omitted
  otherwise): half the texts, whatever order perf_analyzer sends them in; in ``skip_never``
  always.

Every request carries one held-out text (``THRESHOLD`` 0.5). perf_analyzer (gRPC, closed
loop), in rounds with the model order rotated each round:

1. ``ensemble``, ``migrated``, ``hand_pipeline``, ``hand_ensemble`` and ``migrated_whole`` at
   c=1 and c=16;
2. at c=16, ``skip_half``, ``skip_never``, ``tokenizer`` alone (the texts) and ``classifier``
   alone (the texts tokenized, each at its own length: :func:`lab.bench.floor.classifier_input_json`);
3. at c=16, ``migrated_serial`` and ``hand_serial``.

Goals, each judged by the distribution-free 95% interval of the median per-round ratio
(:func:`lab.bench.floor.decide`: met, not met, or not decided with the rounds that would
decide it at this run's spread):

- ``migrated`` throughput at c=16 at least :data:`THROUGHPUT_GOAL` x ``hand_pipeline``'s;
- ``migrated`` p50 at c=1 at most :data:`P50_GOAL` x ``ensemble``'s; beside it, decided
  against the same goal, ``hand_ensemble``'s (where its interval lies above the goal, no
  Python-backend router in front of the ensemble can meet it on this stack) and
  ``migrated_whole``'s;
- ``migrated_serial`` throughput at c=16 at least :data:`THROUGHPUT_GOAL` x ``hand_serial``'s
  (the router's own cost per request: reported beside the goals, decided the same way);
- ``skip_half`` throughput at c=16 at least :data:`COST_GOAL` x the cost model's prediction
  1 / (c_first + share * c_second + overhead) (:func:`skip_cost_model`): c_first and
  c_second are 1 / the throughput of ``tokenizer`` and ``classifier`` alone, overhead =
  1/T(``skip_never``) - c_first - c_second (the router's own cost per request), share the
  fraction of ``skip_half``'s requests that ran the second step during its measurement
  (Triton's statistics: ``classifier``'s inference count over ``skip_half``'s, both taken
  before and after it; in a closed loop the requests that skip come back sooner, so the
  share answered can be under the texts' 0.5), all from the same round.

Units: throughput in inferences (requests of one text) per second, latency in
milliseconds, costs in seconds per request in the arithmetic (milliseconds in the report).
Writes ``<out>/bench/pipeline.json`` and its section of ``<out>/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import yaml

from lab.bench.floor import _by_round, _fmt_decision, decide, pair_ratios
from lab.bench.plan import REPO, Spec
from lab.bench.report import PIPELINE_END, PIPELINE_START

MIGRATED, HAND, ENSEMBLE = "migrated", "hand_pipeline", "ensemble"
FLOOR, WHOLE = "hand_ensemble", "migrated_whole"
MIGRATED_SERIAL, HAND_SERIAL = "migrated_serial", "hand_serial"
SERIAL_MODELS = (MIGRATED_SERIAL, HAND_SERIAL)
SKIP, NEVER, FIRST, SECOND = "skip_half", "skip_never", "tokenizer", "classifier"
SIDE_MODELS = (ENSEMBLE, MIGRATED, HAND, FLOOR, WHOLE)
COST_MODELS = (SKIP, NEVER, FIRST, SECOND)
CONCURRENCIES = (1, 16)
COST_CONCURRENCY = 16
#: ``migrated`` throughput at c=16 over ``hand_pipeline``'s: at least.
THROUGHPUT_GOAL = 0.95
#: ``migrated`` p50 at c=1 over ``ensemble``'s: at most.
P50_GOAL = 1.10
#: ``skip_half`` throughput at c=16 over its cost model's prediction: at least.
COST_GOAL = 0.9
ROUNDS = 8
DATASETS = {ENSEMBLE: "texts", MIGRATED: "texts", HAND: "texts", FLOOR: "texts", WHOLE: "texts", SKIP: "texts", NEVER: "texts",
            FIRST: "text_only", SECOND: "tokens", MIGRATED_SERIAL: "texts", HAND_SERIAL: "texts"}
COMMAND = "python -m lab.bench.pipeline"


def plan(rounds: int) -> List[Spec]:
    """Per round: ``SIDE_MODELS`` at each of ``CONCURRENCIES``, then ``COST_MODELS`` and
    ``SERIAL_MODELS`` at ``COST_CONCURRENCY``, each list's order rotated by one per round."""
    out: List[Spec] = []
    for r in range(rounds):
        k = r % len(SIDE_MODELS)
        side = list(SIDE_MODELS[k:]) + list(SIDE_MODELS[:k])
        for c in CONCURRENCIES:
            out += [Spec("pipeline", m, DATASETS[m], c, 1, r) for m in side]
        cost = list(COST_MODELS[r % 4:]) + list(COST_MODELS[:r % 4])
        out += [Spec("cost", m, DATASETS[m], COST_CONCURRENCY, 1, r) for m in cost]
        serial = list(SERIAL_MODELS[r % 2:]) + list(SERIAL_MODELS[:r % 2])
        out += [Spec("serial", m, DATASETS[m], COST_CONCURRENCY, 1, r) for m in serial]
    return out


def skip_cost_model(t_first: float, t_second: float, t_never: float, t_skip: float, share: float = 0.5) -> Dict[str, Any]:
    """The skipping pipeline's cost model from throughputs (requests/s) at one concurrency:
    ``c_first`` = 1/t_first, ``c_second`` = 1/t_second (s/request), ``overhead`` =
    1/t_never - c_first - c_second, ``predicted`` = 1 / (c_first + share * c_second +
    overhead) (requests/s; None when that cost is not positive), ``measured`` = t_skip,
    ``ratio`` = measured / predicted. Raises ValueError on a throughput that is not
    positive or ``share`` outside [0, 1]."""
    if min(t_first, t_second, t_never, t_skip) <= 0:
        raise ValueError("throughputs must be positive")
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share {share} outside [0, 1]")
    c_first, c_second = 1.0 / t_first, 1.0 / t_second
    overhead = 1.0 / t_never - c_first - c_second
    cost = c_first + share * c_second + overhead
    predicted = 1.0 / cost if cost > 0 else None
    return {"c_first": c_first, "c_second": c_second, "overhead": overhead, "predicted": predicted,
            "measured": t_skip, "ratio": None if predicted is None else t_skip / predicted}


def round_cost_models(measurements: Sequence[Mapping[str, Any]], share: float = 0.5) -> List[Dict[str, Any]]:
    """:func:`skip_cost_model` of each round in which ``COST_MODELS`` were all measured at
    ``COST_CONCURRENCY``, with its ``round`` and ``share`` (the ``skip_half`` measurement's
    ``second_share`` where it has one, else ``share``); rounds without a prediction left out."""
    tables = {m: _by_round(measurements, m, COST_CONCURRENCY) for m in COST_MODELS}
    rounds = sorted(set.intersection(*(set(t) for t in tables.values())))
    shares = {r: tables[SKIP][r].get("second_share", share) for r in rounds}
    out = [{"round": r, "share": shares[r],
            **skip_cost_model(tables[FIRST][r]["throughput"], tables[SECOND][r]["throughput"],
                              tables[NEVER][r]["throughput"], tables[SKIP][r]["throughput"], shares[r])}
           for r in rounds]
    return [r for r in out if r["predicted"] is not None]


def goals(measurements: Sequence[Mapping[str, Any]], share: float = 0.5) -> Dict[str, Any]:
    """The three goals, the serial comparison and the p50 floor (module docstring), each
    :func:`lab.bench.floor.decide` of its per-round ratios with ``per_round``."""
    thr = pair_ratios(measurements, MIGRATED, HAND, 16, "throughput")
    serial = pair_ratios(measurements, MIGRATED_SERIAL, HAND_SERIAL, 16, "throughput")
    p50 = pair_ratios(measurements, MIGRATED, ENSEMBLE, 1, "p50_ms")
    floor = pair_ratios(measurements, FLOOR, ENSEMBLE, 1, "p50_ms")
    whole = pair_ratios(measurements, WHOLE, ENSEMBLE, 1, "p50_ms")
    cost = [r["ratio"] for r in round_cost_models(measurements, share)]
    return {name: {**decide(values, goal, at_most), "per_round": [round(v, 3) for v in values]}
            for name, values, goal, at_most in (("throughput_c16_vs_hand", thr, THROUGHPUT_GOAL, False),
                                                ("p50_c1_vs_ensemble", p50, P50_GOAL, True),
                                                ("skip_vs_cost_model", cost, COST_GOAL, False),
                                                ("serial_c16_vs_hand", serial, THROUGHPUT_GOAL, False),
                                                ("floor_p50_c1_vs_ensemble", floor, P50_GOAL, True),
                                                ("whole_p50_c1_vs_ensemble", whole, P50_GOAL, True))}


def cost_medians(measurements: Sequence[Mapping[str, Any]], share: float = 0.5) -> Optional[Dict[str, float]]:
    """Medians over the rounds of each cost-model figure (costs in ms/request), or None."""
    rounds = round_cost_models(measurements, share)
    if not rounds:
        return None
    med = {k: statistics.median(r[k] for r in rounds)
           for k in ("c_first", "c_second", "overhead", "predicted", "measured", "share")}
    return {"share": round(med["share"], 3), "c_first_ms": round(1000 * med["c_first"], 3), "c_second_ms": round(1000 * med["c_second"], 3),
            "overhead_ms": round(1000 * med["overhead"], 3), "predicted": round(med["predicted"], 1),
            "measured": round(med["measured"], 1)}


def length_split(lengths: Sequence[int]) -> Tuple[int, float]:
    """``(split, share)``: the median token count of ``lengths`` (rounded down) and the
    fraction of them above it (the texts ``skip_half`` sends to its second step). Raises
    ValueError on no lengths."""
    if not lengths:
        raise ValueError("no texts")
    split = int(statistics.median(lengths))
    return split, round(sum(1 for n in lengths if n > split) / len(lengths), 4)


def skip_policy(split: Optional[int]) -> Dict[str, Any]:
    """``skip_half``'s policy (the second step only for texts of more than ``split`` tokens)
    or, with None, ``skip_never``'s."""
    second: Dict[str, Any] = {"kind": "step", "model": SECOND, "inputs": {"input_ids": "input_ids",
                                                                         "attention_mask": "attention_mask"},
                              "outputs": {"logits": "logits"}}
    if split is not None:
        second.update(when={"shape": {"tensor": "input_ids", "dim": -1, "op": "gt", "value": int(split)}},
                      scope="request", omit=["logits"])
    return {"version": 1, "ignored_parameters": ["*"], "pipeline": {"outputs": ["input_ids", "logits"], "steps": [
        {"kind": "step", "model": FIRST, "inputs": {"TEXT": "TEXT"},
         "outputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}}, second]}}


SKIP_CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 64
input [
  {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "THRESHOLD" data_type: TYPE_FP32 dims: [ 1 ] }}
]
output [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "logits" data_type: TYPE_FP32 dims: [ 1 ] }}
]
parameters {{ key: "policy" value: {{ string_value: "policy.yaml" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''


def make_pipeline_repository(dest: Path, split: int, repo: Path = REPO) -> Path:
    """The benchmark repository (module docstring) at ``dest``; ``skip_half`` runs its second
    step for texts of more than ``split`` tokens."""
    from lab.bench.plan import BenchError
    from lab.bench.variants import make_bench_repository
    from orchestrator.tooling.cli import main as cli
    from orchestrator.tooling.migrate import MODEL_PY
    from orchestrator.tooling.repository import read_config, write_config

    make_bench_repository(dest, repo, variants={HAND: {"source": "lab/bench/hand_pipeline"},
                                                FLOOR: {"source": "lab/bench/hand_ensemble"}})
    for name, extra in ((MIGRATED, []), (MIGRATED_SERIAL, ["--no-dynamic-batching"]), (WHOLE, ["--call-ensemble"])):
        if cli(["migrate", str(dest / ENSEMBLE), "--name", name, "--repo", str(dest), *extra]) != 0:
            raise BenchError("orchestrator migrate failed on the benchmark repository's ensemble")
    shutil.copytree(dest / HAND, dest / HAND_SERIAL)
    serial = read_config(dest / HAND / "config.pbtxt")
    serial.name = HAND_SERIAL
    serial.ClearField("dynamic_batching")
    write_config(dest / HAND_SERIAL / "config.pbtxt", serial, ["# hand_pipeline without dynamic_batching: one request per execute"])
    for name, when in ((SKIP, split), (NEVER, None)):
        (dest / name / "1").mkdir(parents=True)
        (dest / name / "1" / "model.py").write_text(MODEL_PY)
        (dest / name / "config.pbtxt").write_text(SKIP_CONFIG.format(name=name))
        (dest / name / "policy.yaml").write_text(yaml.safe_dump(skip_policy(when), sort_keys=False))
    return dest


def second_share(before: Mapping[str, int], after: Mapping[str, int]) -> Optional[float]:
    """The fraction of ``skip_half``'s requests that reached ``classifier`` between two
    readings of Triton's inference counts (``{model: count}``); None without requests."""
    n = after[SKIP] - before[SKIP]
    return round((after[SECOND] - before[SECOND]) / n, 4) if n > 0 else None


def inference_counts(server: Any, models: Sequence[str]) -> Dict[str, int]:
    """Triton's ``inference_count`` of each of ``models`` (its statistics API, with the
    server's control header)."""
    client = server.client()
    try:
        return {m: int(client.get_inference_statistics(m, headers=server.control_headers())["model_stats"][0]
                       .get("inference_count", 0)) for m in models}
    finally:
        client.close()


def _median(ms: Sequence[Mapping[str, Any]], model: str, c: int, key: str) -> Optional[float]:
    rows = [float(m[key]) for m in ms if m["model"] == model and int(m["concurrency"]) == c and not m.get("error")]
    return round(statistics.median(rows), 2) if rows else None


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section of one run ``r`` (pure)."""
    from lab.bench.measurement import failed_note
    from lab.bench.stack import header_line

    ms = r["measurements"]
    L = [PIPELINE_START, "## A migrated pipeline against its ensemble, a hand-written BLS model and a cost model", "",
         f"One run of `{r['command']}` at {r['started_utc']} UTC on {r['machine']['cores']} cores "
         f"({r['machine']['cpu_model']}), 1-minute load average {r['load_before']} before, highest "
         f"{r['load_max_during']} during, {r['rounds']} rounds, perf_analyzer windows of {r['window_ms']} ms "
         "(3 per measurement, no stability rule); raw figures in `bench/pipeline.json`.", "", header_line(r.get("stack"))]
    if r.get("quick"):
        L += ["", "> **`--quick` run**: a smoke test, not a benchmark."]
    L += ["", "| concurrency | model | throughput, infer/s | p50, ms | p99, ms |", "|---|---|---|---|---|"]
    for c in CONCURRENCIES:
        for model in SIDE_MODELS:
            L.append(f"| {c} | `{model}` | {_median(ms, model, c, 'throughput')} | {_median(ms, model, c, 'p50_ms')} | "
                     f"{_median(ms, model, c, 'p99_ms')} |")
    g = r["goals"]
    L += ["", f"- `migrated` throughput at c=16 at least {THROUGHPUT_GOAL}x `hand_pipeline`'s: "
          f"{_fmt_decision(g['throughput_c16_vs_hand'])}. Per round: {', '.join(map(str, g['throughput_c16_vs_hand']['per_round']))}.",
          f"- `migrated` p50 at c=1 at most {P50_GOAL}x the ensemble's: {_fmt_decision(g['p50_c1_vs_ensemble'])}. "
          f"Per round: {', '.join(map(str, g['p50_c1_vs_ensemble']['per_round']))}."]
    for key, model, what in (("floor_p50_c1_vs_ensemble", FLOOR, "one BLS call to the ensemble, nothing else: the floor of any "
                              "Python-backend model in front of it"),
                             ("whole_p50_c1_vs_ensemble", WHOLE, "the router calling the ensemble whole: `migrate --call-ensemble`")):
        if key in g:
            L.append(f"- `{model}` ({what}) p50 at c=1 against the same goal: {_fmt_decision(g[key])}. "
                     f"Per round: {', '.join(map(str, g[key]['per_round']))}.")
    med = r.get("cost_medians")
    L += ["", f"The skipping pipeline at c={COST_CONCURRENCY} (the second step for texts of more than {r['split']} "
          f"tokens: {r['share']} of the held-out texts; share: the fraction of the requests answered that ran it, from "
          "Triton's statistics):", ""]
    if med:
        L += ["| share | c_first, ms | c_second, ms | overhead, ms | predicted, infer/s | measured, infer/s |",
              "|---|---|---|---|---|---|",
              f"| {med['share']} | {med['c_first_ms']} | {med['c_second_ms']} | {med['overhead_ms']} | {med['predicted']} | "
              f"{med['measured']} |"]
    else:
        L.append("No round measured every model the cost model needs: not computed.")
    L += ["", f"- `skip_half` at least {COST_GOAL}x its cost model's prediction: {_fmt_decision(g['skip_vs_cost_model'])}. "
          f"Per round: {', '.join(map(str, g['skip_vs_cost_model']['per_round']))}."]
    L += ["", f"One request per `execute` (no `dynamic_batching`: `migrate --no-dynamic-batching`) at c={COST_CONCURRENCY}, "
          "the router's own cost per request against the hand-written model's:", "",
          "| model | throughput, infer/s | p50, ms |", "|---|---|---|"]
    for model in SERIAL_MODELS:
        L.append(f"| `{model}` | {_median(ms, model, COST_CONCURRENCY, 'throughput')} | "
                 f"{_median(ms, model, COST_CONCURRENCY, 'p50_ms')} |")
    if "serial_c16_vs_hand" in g:
        L += ["", f"- `{MIGRATED_SERIAL}` throughput at least {THROUGHPUT_GOAL}x `{HAND_SERIAL}`'s: "
              f"{_fmt_decision(g['serial_c16_vs_hand'])}. Per round: {', '.join(map(str, g['serial_c16_vs_hand']['per_round']))}."]
    L += [*failed_note(ms), "", PIPELINE_END]
    return "\n".join(L)


def run(out: Path, quick: bool = False, rounds: Optional[int] = None, window_ms: int = 1000,
        command: str = COMMAND) -> Dict[str, Any]:
    """The whole benchmark (module docstring); writes its outputs under ``out``; returns the results."""
    import datetime
    import tempfile

    from lab.bench.floor import classifier_input_json, tokenize_held_out
    from lab.bench.instances import _log
    from lab.bench.machine import load_average, machine_info
    from lab.bench.measurement import input_data_json, max_load, measure_next, outcome
    from lab.bench.perf_analyzer import install_perf_analyzer
    from lab.bench.plan import PASettings
    from lab.bench.report import write_kept_outputs
    from lab.bench.stack import read_stack
    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    rounds = rounds or (1 if quick else ROUNDS)
    settings = PASettings(measurement_interval_ms=window_ms, check_stability=False, fallback=False,
                          latencies_per_window=10, max_interval_ms=2 * window_ms)
    results: Dict[str, Any] = {
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_before": load_average(), "machine": machine_info(), "command": command, "quick": quick,
        "rounds": rounds, "window_ms": window_ms}
    binary = install_perf_analyzer()
    held_out = data.held_out_examples()
    texts = [held_out[i].text for i in np.random.RandomState(0).permutation(len(held_out))]
    texts = [t for t in texts if t.strip()]
    ids, pad = tokenize_held_out(texts, REPO)
    results["split"], results["share"] = length_split([len(x) for x in ids])
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        repo = make_pipeline_repository(Path(tmp) / "model_repository", results["split"])
        inputs = {name: Path(tmp) / f"{name}.json" for name in ("texts", "text_only", "tokens")}
        both = input_data_json(texts)
        inputs["texts"].write_text(json.dumps(both, ensure_ascii=False), encoding="utf-8")
        inputs["text_only"].write_text(json.dumps({"data": [{"TEXT": s["TEXT"]} for s in both["data"]]},
                                                  ensure_ascii=False), encoding="utf-8")
        inputs["tokens"].write_text(json.dumps(classifier_input_json(ids, pad)))
        with TritonServer(repo, models=["tokenizer", "classifier", "postprocess", *SIDE_MODELS, SKIP, NEVER, *SERIAL_MODELS]) as server:
            results["stack"] = read_stack(server, embedded=True)
            measurements: List[Dict[str, Any]] = []
            warm = {(m, DATASETS[m]): 10.0 for m in (*SIDE_MODELS, *COST_MODELS, *SERIAL_MODELS)}
            specs = plan(rounds)
            for i, spec in enumerate(specs, 1):
                before = inference_counts(server, (SKIP, SECOND)) if spec.model == SKIP else None
                m = measure_next(binary, spec, server.grpc_url, inputs[spec.dataset], Path(tmp) / "pa", settings,
                                 measurements, warm)
                if before is not None:
                    share = second_share(before, inference_counts(server, (SKIP, SECOND)))
                    if share is not None:
                        m["second_share"] = share
                _log(f"[pipeline {i}/{len(specs)}] {spec.model} c={spec.concurrency} round {spec.round + 1}: {outcome(m)}")
    results.update(measurements=measurements, load_max_during=max_load(measurements),
                   goals=goals(measurements, results["share"]), cost_medians=cost_medians(measurements, results["share"]))
    write_kept_outputs(out, "pipeline", results, render_section(results), PIPELINE_START, PIPELINE_END)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line (module docstring)."""
    from lab.bench.report import add_out_argument

    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round: a smoke test, not a benchmark")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {ROUNDS}; 1 with --quick)")
    parser.add_argument("--window-ms", type=int, default=1000, help="perf_analyzer window, ms (default 1000)")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    run(args.out, quick=args.quick, rounds=args.rounds, window_ms=args.window_ms,
        command=COMMAND + (" --quick" if args.quick else "") + (f" --rounds {args.rounds}" if args.rounds else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
