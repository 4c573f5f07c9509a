"""``benchmarks.md`` from a run's results (pure: every figure comes from the results)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from lab.bench.goals import find_measurement, metric_of, paired_median, ratio
from lab.bench.plan import CONCURRENCIES, GRID_MODELS, LENGTH_MODELS, SWEEP_CONCURRENCY
from lab.bench.stack import CLASSIFIERS, devices, header_line, runtime_label

WHAT_WE_TRIED_START = "<!-- what-we-tried:start (kept across runs: edit freely) -->"
WHAT_WE_TRIED_END = "<!-- what-we-tried:end -->"
# The section `make bench-features` writes (lab.bench.features), kept across runs.
FEATURES_START = "<!-- bench-features:start (written by `make bench-features`) -->"
FEATURES_END = "<!-- bench-features:end -->"
# The section `make bench-overload` writes (lab.bench.overload), kept across runs.
OVERLOAD_START = "<!-- bench-overload:start (written by `make bench-overload`) -->"
OVERLOAD_END = "<!-- bench-overload:end -->"
# The section `make bench-long` writes (lab.bench.long_texts), kept across runs.
LONG_START = "<!-- bench-long:start (written by `make bench-long`) -->"
LONG_END = "<!-- bench-long:end -->"
#: Sections other commands write into benchmarks.md; ``make bench`` keeps them as they are.
PROFILE_START = "<!-- bench-profile:start (written by `make profile`) -->"
PROFILE_END = "<!-- bench-profile:end -->"
#: Figures of both stacks side by side (written by hand from two runs: this report and
#: docs/results/native/benchmarks.md, ``make bench --url`` against the native backend).
STACKS_START = "<!-- stacks:start (kept across runs: edit freely) -->"
STACKS_END = "<!-- stacks:end -->"
#: The section ``make bench-instances`` writes (lab.bench.instances), kept across runs.
INSTANCES_START = "<!-- bench-instances:start (written by `make bench-instances`) -->"
INSTANCES_END = "<!-- bench-instances:end -->"
#: The section ``make bench-flush`` writes (the same module, ``--compare flush``), kept across runs.
FLUSH_START = "<!-- bench-flush:start (written by `make bench-flush`) -->"
FLUSH_END = "<!-- bench-flush:end -->"
#: The section ``make bench-single`` writes (the same module, ``--compare single``), kept across runs.
SINGLE_START = "<!-- bench-single:start (written by `make bench-single`) -->"
SINGLE_END = "<!-- bench-single:end -->"
#: The section ``python -m lab.bench.instances --compare floor`` writes (``lab.bench.floor``), kept across runs.
FLOOR_START = "<!-- bench-floor:start (written by `python -m lab.bench.instances --compare floor`) -->"
FLOOR_END = "<!-- bench-floor:end -->"
#: The section ``make bench-runtime`` writes (``--compare runtime``, ``lab.bench.runtime``), kept across runs.
RUNTIME_START = "<!-- bench-runtime:start (written by `make bench-runtime`) -->"
RUNTIME_END = "<!-- bench-runtime:end -->"
#: The section ``make bench-pipeline`` writes (``lab.bench.pipeline``), kept across runs.
PIPELINE_START = "<!-- bench-pipeline:start (written by `make bench-pipeline`) -->"
PIPELINE_END = "<!-- bench-pipeline:end -->"
#: The section ``make bench-tune-check`` writes (``lab.bench.tune_check``), kept across runs.
TUNE_CHECK_START = "<!-- bench-tune-check:start (written by `make bench-tune-check`) -->"
TUNE_CHECK_END = "<!-- bench-tune-check:end -->"
KEPT_SECTIONS = ((OVERLOAD_START, OVERLOAD_END), (LONG_START, LONG_END), (FEATURES_START, FEATURES_END),
                 (PROFILE_START, PROFILE_END), (INSTANCES_START, INSTANCES_END), (FLUSH_START, FLUSH_END),
                 (SINGLE_START, SINGLE_END), (FLOOR_START, FLOOR_END), (RUNTIME_START, RUNTIME_END),
                 (STACKS_START, STACKS_END), (PIPELINE_START, PIPELINE_END), (TUNE_CHECK_START, TUNE_CHECK_END))


def replace_section(report: Path, section: str, start: str, end: str) -> None:
    """Replace the part of ``report`` from marker ``start`` to marker ``end`` (both
    included) with ``section``, or append ``section`` when the markers are absent (or the
    file is). One of :data:`KEPT_SECTIONS`' writers (``make bench-features``, ``make
    bench-long``, ``make bench-overload``)."""
    text = report.read_text() if report.is_file() else ""
    if start in text and end in text:
        text = text[:text.index(start)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    report.write_text(text)


def write_kept_outputs(out: Path, name: str, results: Any, section: str, start: str, end: str) -> None:
    """Write one :data:`KEPT_SECTIONS` benchmark's outputs: ``<out>/bench/<name>.json``
    (``results`` as indented JSON) and its
    ``section`` between ``start`` and ``end`` of ``<out>/benchmarks.md``
    (:func:`replace_section`)."""
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    replace_section(out / "benchmarks.md", section, start, end)


def add_out_argument(parser: Any) -> None:
    """``--out``, the directory of ``benchmarks.md`` and ``bench/`` (default
    ``.cache/docs``), for the benchmarks that write a :data:`KEPT_SECTIONS` section."""
    parser.add_argument("--out", type=Path, default=Path(".cache/docs"),
                        help="where benchmarks.md and bench/ are (default: .cache/docs; --out docs/results: the committed ones)")


WHAT_WE_TRIED_PLACEHOLDER = """\
> **Placeholder, to be filled by the router's optimisation work.** One row per change
> tried, with the figures from the run of `make bench` that measured it.

| change | router_single p50 c=1 / ensemble | router_single thr c=16 / ensemble | router thr c=16 / ensemble_pad512 | accuracy (router - ensemble, points) | kept? |
|---|---|---|---|---|---|"""



def _fmt(x, digits=1, suffix="") -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}f}{suffix}"


def _x(x) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def met_label(m) -> str:
    return {True: "**met**", False: "**not met**", None: "not measured"}[m]


def _stable(m: Mapping) -> str:
    if m.get("error"):
        return "failed"
    return {True: "yes", False: "no (3-window fallback)", None: "not checked"}[m.get("stable")]


def _what_we_tried(existing: Optional[str]) -> str:
    if existing and WHAT_WE_TRIED_START in existing and WHAT_WE_TRIED_END in existing:
        start = existing.index(WHAT_WE_TRIED_START)
        end = existing.index(WHAT_WE_TRIED_END) + len(WHAT_WE_TRIED_END)
        return existing[start:end]
    return f"{WHAT_WE_TRIED_START}\n{WHAT_WE_TRIED_PLACEHOLDER}\n{WHAT_WE_TRIED_END}"


def render_report(results: Mapping, existing: Optional[str] = None, plots_dir: str = "bench") -> str:  # noqa: C901 (one report, section by section)
    """``benchmarks.md`` from a run's ``results`` (pure: every figure comes from ``results``).

    ``existing``: the current file, whose "What we tried" block (between the
    ``what-we-tried`` markers) and the sections of ``make bench-overload``, ``make
    bench-long`` and ``make bench-features`` (:data:`KEPT_SECTIONS`) are kept as they are.
    """
    r = results
    meas = r["measurements"]
    mach = r["machine"]
    ratios = r["ratios"]
    acc = r.get("accuracy", {})
    raw = r.get("raw", {})
    L = []
    add = L.append
    add("# Benchmarks: router vs ensemble vs the raw model")
    add("")
    add(f"Generated by `{r['command']}` on {r['created_utc']} (UTC), {r['wall_s']:.0f} s wall time. "
        "Every figure below is from that one run (one server, the same data); raw results: "
        f"[`{plots_dir}/results.json`]({plots_dir}/results.json). Regenerate with `make bench` "
        "(full, under 15 minutes on 2 cores) or `python -m lab.bench --quick` (under 2 minutes).")
    add("")
    if r.get("quick"):
        add("> **`--quick` run**: short windows and no stability check; the figures are a smoke test, not a benchmark.")
        add("")
    if r.get("models", {}).get("training", {}).get("quick"):
        add(f"> **The models measured are from a `--quick` training run** "
            f"(`{r['models']['training'].get('command')}`): accuracy figures are not meaningful.")
        add("")
    add("> " + header_line(r.get("stack")))
    add("")
    add("## Machine and software")
    add("")
    add("| | |")
    add("|---|---|")
    add(f"| CPU | {mach['cpu_model']}, {mach['cores']} cores |")
    add(f"| memory | {_fmt(mach.get('memory_gib'))} GiB |")
    add(f"| OS, kernel | {mach.get('os')}, {mach.get('kernel')} |")
    if r.get("stack") and not r["stack"].get("embedded"):
        add(f"| Triton | {r['triton']['version']} at {r['stack'].get('url')} (not started by the benchmark); "
            + "; ".join(f"{n}: {runtime_label(m)} {devices(m)}" for n, m in r["stack"].get("models", {}).items()
                        if n in CLASSIFIERS) + " |")
    else:
        add(f"| Triton | {r['triton']['version']} (embedded, `nvidia-pytriton` wheel; Python backend, ONNX models through onnxruntime {r['software'].get('onnxruntime')} in Python models) |")
    add(f"| load generator | {r['software']['perf_analyzer']} (gRPC, same machine) |")
    add(f"| Python | {mach.get('python')} |")
    add(f"| code | {r.get('git') or 'n/a'} |")
    peak = r["load"].get("max_1min_during")
    add(f"| load average (1, 5, 15 min) | before: {', '.join(map(str, r['load']['before']))}; after: {', '.join(map(str, r['load']['after']))}"
        + (f"; highest 1-min value after a load run: {peak}" if peak is not None else "") + " |")
    add("")
    add("perf_analyzer, the server (tokenizer, classifiers, postprocess and router in Python-backend "
        "stub processes) and the raw-model timing share these cores; other processes on the machine "
        "add noise. The load average *before* is other processes' load; the values after and during "
        "include this benchmark's own server and perf_analyzer. Ratios of models measured in the same "
        "run are more trustworthy than absolute figures.")
    add("")

    add("## Goals")
    add("")
    add("| goal | measured | bound | |")
    add("|---|---|---|---|")
    for g in r["goals"]:
        v = g["value"]
        shown = "n/a" if v is None else (f"{v:+.2f} points" if "points" in g["key"] else f"{v:.2f}x")
        bound = f"{g['bound']:+.0f} points" if "points" in g["key"] else f"{g['bound']:.2f}x"
        per_round = ratios.get(f"{g['key']}_rounds") or []
        if v is not None and len(per_round) > 1:
            shown += f" (median of {len(per_round)} rounds: " + ", ".join(f"{x:.2f}x" for x in per_round) + ")"
        add(f"| {g['goal']} | {shown} | {g['op']} {bound} | {met_label(g['met'])} |")
    add("")

    grid = [m for m in meas if m["section"] == "grid"]
    add("## 1. Routing overhead: the same classifier behind an ensemble and behind the router")
    add("")
    add(f"Held-out test texts ({r['datasets']['held_out']['n']} real sentences, "
        f"{r['datasets']['held_out']['tokens_p50']:.0f} tokens median, {r['datasets']['held_out']['tokens_max']} max), "
        "one text per request, THRESHOLD 0.5. `ensemble_pad512` is the seeds' ensemble (every text padded to "
        "512 tokens); `ensemble` pads to the longest text of each batch; `router_single` is the router with "
        "the single-classifier policy (every text goes to `classifier`, the ensemble's model), so its "
        "difference from `ensemble` is the routing overhead. Ratios are against `ensemble` at the same concurrency.")
    add("")
    add("| model | concurrency | throughput (infer/s) | p50 (ms) | p90 (ms) | p99 (ms) | throughput / ensemble | p50 / ensemble | stable | window spread |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for c in CONCURRENCIES:
        base = find_measurement(grid, model="ensemble", concurrency=c)
        for model in GRID_MODELS:
            m = find_measurement(grid, model=model, concurrency=c) or next(
                (x for x in grid if x["model"] == model and x["concurrency"] == c), None)
            if m is None:
                continue
            if m.get("error"):
                add(f"| `{model}` | {c} | failed: {m['error'][:120]} | | | | | | failed | |")
                continue
            p50_ratio = (paired_median(grid, model, "ensemble", "p50_ms", concurrency=c) if m.get("rounds")
                         else ratio(m['p50_ms'], base and base['p50_ms']))
            add(f"| `{model}` | {c} | {_fmt(m['throughput'])} | {_fmt(m['p50_ms'], 2)} | {_fmt(m['p90_ms'], 2)} | "
                f"{_fmt(m['p99_ms'], 2)} | {_x(ratio(m['throughput'], base and base['throughput']))} | "
                f"{_x(p50_ratio)} | {_stable(m)} | {_fmt(m.get('throughput_spread_pct'), 0, '%')} |")
    add("")
    multi = sorted({m["concurrency"] for m in grid if len(m.get("rounds") or []) > 1})
    if multi:
        n_rounds = max(len(m["rounds"]) for m in grid if m.get("rounds"))
        add(f"Concurrency {', '.join(map(str, multi))}: measured in {n_rounds} rounds (every model once per round, "
            "rounds back to back). The row shows the median of each figure over the rounds; *p50 / ensemble* is "
            "the median of the per-round ratios (each pair of measurements ran minutes apart at most, so "
            "drifting background load cancels); *stable* is *no* if any round was not; *window spread* is the "
            "largest of the rounds'. Per-round p50 (ms):")
        add("")
        add("| model | concurrency | " + " | ".join(f"round {k + 1}" for k in range(n_rounds)) + " |")
        add("|---|---:|" + "---:|" * n_rounds)
        for c in multi:
            for model in GRID_MODELS:
                m = next((x for x in grid if x["model"] == model and x["concurrency"] == c and x.get("rounds")), None)
                if m is None:
                    continue
                cells = [("failed" if x.get("error") else _fmt(x.get("p50_ms"), 2)) for x in m["rounds"]]
                add(f"| `{model}` | {c} | " + " | ".join(cells + [""] * (n_rounds - len(cells))) + " |")
        add("")
    add("*window spread*: how far apart the throughputs of the 3 reported windows are (100 x (max / min - 1), "
        "from perf_analyzer's profile export); a large spread means the level was disturbed.")
    add("")
    add(f"![latency percentiles per concurrency]({plots_dir}/latency.png)")
    add("")
    add(f"![throughput per concurrency]({plots_dir}/throughput.png)")
    add("")

    add("## 2. What routing buys: default router vs ensemble vs the seeds' ensemble")
    add("")
    n_acc = acc.get("ensemble", {}).get("n")
    add(f"Accuracy: verdicts (probability >= 0.5) against the human labels of the same {n_acc} held-out "
        "texts, sent through each model with tritonclient (gRPC, 64 texts per request). Throughput at c=16 from section 1.")
    add("")
    add("| model | accuracy (%) | accuracy - ensemble (points) | throughput c=16 (infer/s) | throughput / ensemble_pad512 | routes |")
    add("|---|---:|---:|---:|---:|---|")
    pad = metric_of(grid, "throughput", model="ensemble_pad512", concurrency=16)
    for model in GRID_MODELS:
        a = acc.get(model, {})
        thr = metric_of(grid, "throughput", model=model, concurrency=16)
        diff = None if a.get("accuracy_pct") is None or acc.get("ensemble", {}).get("accuracy_pct") is None else (
            a["accuracy_pct"] - acc["ensemble"]["accuracy_pct"])
        routes = ", ".join(f"{k}: {v}" for k, v in a.get("routes", {}).items()) or ""
        shown_acc = _fmt(a.get("accuracy_pct"), 2) if a else "not scored"
        add(f"| `{model}` | {shown_acc} | {'' if diff is None else f'{diff:+.2f}'} | {_fmt(thr)} | {_x(ratio(thr, pad))} | {routes} |")
    agree = acc.get("ensemble_pad512_agreement")
    add("")
    if agree:
        add(f"`ensemble_pad512` was not scored on all texts (padding to 512 costs minutes); on the first "
            f"{agree['n']} texts its verdicts agree with `ensemble`'s on {agree['same_verdicts']} of {agree['n']} "
            f"(largest probability difference {agree['max_abs_probability_diff']:.2e}), as the model card says "
            "(same logits with either padding), so its accuracy is the ensemble's.")
        add("")

    add("## 3. The compute floor: the raw ONNX model in-process")
    add("")
    add("The same `model.onnx` files called directly through `onnxruntime.InferenceSession.run` in the "
        "benchmark process (CPU provider, default threads, like the server's Python models), one call per "
        "text in turn, on the token batches the ensemble's tokenizer makes (truncated to 128 tokens; padded "
        "to the text's length, or to 512 for the seeds'). The floor is timed in "
        f"{r.get('raw_rounds', 1)} rounds spread over the run (server idle) and the round with the lowest p50 "
        "counts (a floor is a minimum; every round's p50 is in results.json). End-to-end figures are "
        "perf_analyzer's p50 at c=1.")
    add("")
    add("| end-to-end model | floor | floor p50 (ms) | floor p99 (ms) | end-to-end p50 (ms) | end-to-end / floor |")
    add("|---|---|---:|---:|---:|---:|")
    floors = (("ensemble", "classifier"), ("ensemble_pad512", "classifier_pad512"),
              ("router_single", "classifier"), ("router", "classifier_fast"))
    for model, floor in floors:
        f = raw.get(floor, {})
        e2e = metric_of(grid, "p50_ms", model=model, concurrency=1)
        add(f"| `{model}` | `{floor}` ({f.get('calls', 'n/a')} texts) | {_fmt(f.get('p50_ms'), 2)} | {_fmt(f.get('p99_ms'), 2)} | "
            f"{_fmt(e2e, 2)} | {_x(ratios.get(f'{model}_p50_c1_vs_raw'))} |")
    add("")
    add("The router's floor is `classifier_fast` (its first step); texts it is unsure of also pay for `classifier`.")
    if any((ratios.get(f"{m}_p50_c1_vs_raw") or 2.0) < 1.0 for m, _ in floors):
        add(" A multiple below 1x means the in-process timing was slowed by other processes more than the "
            "server was: read it as \"no measurable overhead\", not as a speed-up.")
    add("")

    add("## 4. Cost growth")
    add("")
    add(f"### Text length (concurrency {SWEEP_CONCURRENCY}, one text per request)")
    add("")
    add("Sets from held-out texts by token count (special tokens included): short and medium are single "
        "sentences; long ones join consecutive held-out sentences past the classifiers' 128-token limit, "
        "so the router (the shipped policy) chunks them (128-token windows, stride 96, read in order until "
        "each text's answer is settled: early stopping, section \"Long texts\") while the ensemble truncates "
        "them to their first 128 tokens. Floor: raw `classifier`, batch 1, on the truncated tokens.")
    add("")
    add("| set | texts | tokens (min / median / max) | model | throughput (infer/s) | p50 (ms) | p99 (ms) | throughput / same model on short | floor p50 (ms) | stable |")
    add("|---|---:|---|---|---:|---:|---:|---:|---:|---|")
    lm = [m for m in meas if m["section"] == "length"]
    for d in ("short", "medium", "long"):
        ds = r["datasets"].get(d, {})
        for model in LENGTH_MODELS:
            m = next((x for x in lm if x["model"] == model and x["dataset"] == d), None)
            if m is None:
                continue
            short = metric_of(lm, "throughput", model=model, dataset="short")
            floor = raw.get(f"classifier_{d}", {}).get("p50_ms")
            if m.get("error"):
                add(f"| {d} | {ds.get('n')} | | `{model}` | failed: {m['error'][:100]} | | | | | failed |")
                continue
            add(f"| {d} | {ds.get('n')} | {ds.get('tokens_min')} / {_fmt(ds.get('tokens_p50'), 0)} / {ds.get('tokens_max')} | "
                f"`{model}` | {_fmt(m['throughput'])} | {_fmt(m['p50_ms'], 2)} | {_fmt(m['p99_ms'], 2)} | "
                f"{_x(ratio(m['throughput'], short))} | {_fmt(floor, 2)} | {_stable(m)} |")
    add("")
    add(f"![cost by text length]({plots_dir}/length.png)")
    add("")
    add(f"### Client batch (concurrency {SWEEP_CONCURRENCY}, held-out texts)")
    add("")
    add("Throughput counts texts (a request of batch 16 is 16 inferences); latency is per request. "
        "Floor: raw `classifier` on batches of the same size (padded to each batch's longest text), rows/s in one stream.")
    add("")
    add("| model | client batch | throughput (infer/s) | p50 (ms) | p99 (ms) | throughput / batch 1 | floor throughput (rows/s) | stable |")
    add("|---|---:|---:|---:|---:|---:|---:|---|")
    bm = [m for m in meas if m["section"] == "batch"]
    for m in bm:
        b1 = metric_of(bm, "throughput", model=m["model"], batch_size=1)
        floor = raw.get(f"classifier_batch{m['batch_size']}", {}).get("throughput")
        if m.get("error"):
            add(f"| `{m['model']}` | {m['batch_size']} | failed: {m['error'][:100]} | | | | | failed |")
            continue
        add(f"| `{m['model']}` | {m['batch_size']} | {_fmt(m['throughput'])} | {_fmt(m['p50_ms'], 2)} | {_fmt(m['p99_ms'], 2)} | "
            f"{_x(ratio(m['throughput'], b1))} | {_fmt(floor)} | {_stable(m)} |")
    add("")
    add(f"![cost by client batch]({plots_dir}/batch.png)")
    add("")

    s = r["settings"]
    add("## Method")
    add("")
    if r.get("stack") and not r["stack"].get("embedded"):
        add(f"- Server: Triton {r['triton']['version']} at {r['stack'].get('url')}, started by the user, not by the "
            "benchmark; its models and instance groups as it reported them (`stack` in the results).")
    else:
        add(f"- Server: one embedded Triton {r['triton']['version']} on a temporary copy of `model_repository/` "
            "with the benchmark-only variants of `lab.bench.VARIANTS` added; every model loaded, one "
            "instance each, as configured (`configs/embedded.pbtxt` where present).")
    add(f"- Load: `perf_analyzer` over gRPC on loopback, `--input-data` JSON with one real text per entry "
        f"(THRESHOLD 0.5), `--concurrency-range` 1, 4, 16 (one invocation per level), time windows of at least "
        f"{s['measurement_interval_ms']} ms, longer for slow levels (about {s.get('latencies_per_window', 10)} request "
        f"latencies, at most {s.get('max_interval_ms', s['measurement_interval_ms'])} ms; each level's window is "
        "`interval_ms` in results.json), "
        + ("stability: the last 3 windows within "
           f"{s['stability_percentage']:g}% (`--stability-percentage`, on throughput and p50 via `--percentile 50`), "
           f"at most {s['max_trials']} windows; a level that never stabilised is measured again over exactly 3 "
           "windows and marked `no` under *stable*."
           if s["check_stability"] else "exactly 3 windows, no stability check (`--stability-percentage 1000 --max-trials 3`).")
        + " Throughput and percentiles are perf_analyzer's (`-f` CSV) over the final windows; client-side latency.")
    rounds = r.get("plan", {}).get("grid_rounds") or {}
    rounds_text = "".join(f"; concurrency {c} in {n} such rounds" for c, n in sorted((int(c), n) for c, n in rounds.items()) if n > 1)
    add("- Order: the grid runs model after model within each concurrency level, so drifting background "
        f"load falls on all models alike{rounds_text}; the sweeps follow. Before any measurement every model answered the "
        "accuracy texts (warm-up).")
    add("- Example command (paths shortened): `" + _short_command(meas) + "`")
    add("- Data: `orchestrator.tooling.modeling.data.held_out_examples()` (the test split, never seen in training), shuffled "
        "with a fixed seed so every prefix keeps the real length distribution.")
    models = r.get("models", {})
    if models.get("onnx"):
        add("- Models measured: " + ", ".join(f"`{k}` sha256 {v['sha256'][:12]}" for k, v in models["onnx"].items())
            + (f"; trained by `{models['training'].get('command')}` at {models['training'].get('created_utc')} (UTC)"
               if models.get("training") else "") + ".")
    add("")
    add("## What we tried")
    add("")
    add(_what_we_tried(existing))
    add("")
    for start, end in KEPT_SECTIONS:
        if existing and start in existing and end in existing:
            add(existing[existing.index(start):existing.index(end) + len(end)])
            add("")
    return "\n".join(L)


def _short_command(meas: Sequence[Mapping]) -> str:
    m = next((x for x in meas if x.get("command")), None)
    if m is None:
        return "n/a"
    parts = shlex.split(m["command"])
    parts[0] = "perf_analyzer"
    for i, p in enumerate(parts):
        if i and parts[i - 1] in ("--input-data", "-f", "--profile-export-file"):
            parts[i] = Path(p).name
    return shlex.join(parts)

