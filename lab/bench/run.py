"""One benchmark run end to end (see the package docstring) and its outputs."""

from __future__ import annotations

import datetime
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from lab.bench.goals import compute_ratios, evaluate_goals
from lab.bench.machine import git_revision, load_average, machine_info
from lab.bench.measurement import (
    RAW_SIZES,
    RAW_SIZES_QUICK,
    accuracy_summary,
    classify_all,
    combine_raw_rounds,
    combine_rounds,
    length_sets,
    length_stats,
    max_load,
    measure_next,
    raw_floor_batches,
    raw_floor_round,
    token_lengths,
    write_input_data,
)
from lab.bench.perf_analyzer import install_perf_analyzer, perf_analyzer_version
from lab.bench.plan import (
    BATCH_MODELS,
    BATCH_SIZES,
    CONCURRENCIES,
    DEFAULT_TOOL_DIR,
    FULL_SETTINGS,
    GRID_MODELS,
    GRID_ROUNDS,
    LENGTH_BOUNDS,
    LENGTH_MODELS,
    QUICK_SETTINGS,
    REPO,
    SWEEP_CONCURRENCY,
    VARIANTS,
    BenchError,
    PASettings,
    bench_plan,
)
from lab.bench.plots import write_plots
from lab.bench.report import render_report
from lab.bench.stack import StackError, read_stack, served, server_or_url
from lab.bench.stack import describe as describe_stack
from lab.bench.variants import make_bench_repository, model_files


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _training_info(repo: Path) -> dict:
    try:
        meta = json.loads((repo / "training_metrics.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: meta.get(k) for k in ("command", "quick", "created_utc")}


def run_benchmark(out: Path | str = "docs", *, quick: bool = False, repo: Path | str = REPO,
                  tool_dir: Path | str = DEFAULT_TOOL_DIR, settings: Optional[PASettings] = None,
                  command: str = "python -m lab.bench", urls: Sequence[str] = ()) -> dict:
    """Run the whole benchmark and write ``<out>/benchmarks.md`` and ``<out>/bench/``.

    ``quick``: fewer texts (200 for accuracy, 100 per length set, :data:`RAW_SIZES_QUICK`
    and two raw-floor rounds instead of three), :data:`QUICK_SETTINGS`. ``urls``: measure
    the running server at these ``--url`` values (``stack.parse_urls``; it needs a gRPC URL
    and must serve the benchmark repository's models) instead of starting one.
    Returns the results dict (also ``<out>/bench/results.json``). Raises BenchError or
    ServerError (see the module docstring).
    """
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    t_start = time.monotonic()
    settings = settings or (QUICK_SETTINGS if quick else FULL_SETTINGS)
    out = Path(out)
    load_before = load_average()
    _log(f"load average before: {load_before}")
    binary = install_perf_analyzer(tool_dir)
    pa_version = perf_analyzer_version(binary)

    with tempfile.TemporaryDirectory(prefix="orchestrator-bench-") as tmp:
        tmp = Path(tmp)
        bench_repo = make_bench_repository(tmp / "model_repository", repo)
        onnx_files = model_files(bench_repo)
        tokenizer = AutoTokenizer.from_pretrained(str(bench_repo / "tokenizer" / "1"))

        # Data: the held-out split, shuffled with a fixed seed (every prefix keeps the length mix).
        try:
            held_out = data.held_out_examples()
        except Exception as exc:  # DataUnavailableError, DataFormatError
            raise BenchError(f"cannot load the held-out split: {exc}") from exc
        # the order of held_out_examples(n=len, seed=0), without loading the split twice
        examples = [held_out[i] for i in np.random.RandomState(0).permutation(len(held_out))]
        texts = [e.text for e in examples]
        labels = [int(e.label) for e in examples]
        lengths = token_lengths(tokenizer, texts)
        n_acc = 200 if quick else len(texts)
        n_len = 100 if quick else 200
        sets = {"held_out": texts}
        sets.update(length_sets(texts, lengths, n_len, join_length=lambda t: int(token_lengths(tokenizer, [t])[0])))
        datasets = {name: length_stats(token_lengths(tokenizer, sel)) for name, sel in sets.items()}
        files = {name: write_input_data(tmp / f"input-{name}.json", sel) for name, sel in sets.items()}

        # The raw floor: rounds before the server starts, after the accuracy pass and at the
        # end (server idle each time); the least-disturbed round counts (raw_floor_round).
        sessions = {m: ort.InferenceSession(str(bench_repo / m / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
                    for m in ("classifier", "classifier_fast")}
        sizes = RAW_SIZES_QUICK if quick else RAW_SIZES
        raw_batches = raw_floor_batches(tokenizer, texts, sets, sizes)
        raw_rounds = []

        def raw_round(when: str) -> None:
            _log(f"raw ONNX floor, round {len(raw_rounds) + 1} ({when}): onnxruntime in-process")
            raw_rounds.append(raw_floor_round(sessions, raw_batches))
            for k, v in raw_rounds[-1].items():
                _log(f"  {k}: p50 {v['p50_ms']:.2f} ms, {v['throughput']:.0f} rows/s ({v['calls']} calls)")

        raw_round("before the server starts")

        _log(f"measuring the running server at {', '.join(urls)}" if urls else f"starting the embedded Triton server on {bench_repo}")
        with server_or_url(urls, lambda: TritonServer(bench_repo), need="grpc") as server:
            try:
                stack = read_stack(server, embedded=not urls)
                served(stack, [spec.model for spec in bench_plan(quick)] + ["ensemble", "router_single", "router", "ensemble_pad512"],
                       "load the benchmark repository into it (python -m lab.bench --write-repository DIR "
                       "writes it) or run without --url")
            except StackError as exc:
                raise BenchError(str(exc)) from None
            _log(f"stack: {describe_stack(stack)}")
            triton = {"version": stack["server"]["version"]}
            url = server.grpc_url

            _log(f"accuracy on {n_acc} held-out texts (also the warm-up)")
            accuracy = {}
            for model in ("ensemble", "router_single", "router"):
                res = classify_all(url, model, texts[:n_acc])
                accuracy[model] = accuracy_summary(labels[:n_acc], res["verdicts"], res["routes"])
                _log(f"  {model}: {accuracy[model]['accuracy_pct']:.2f}% {accuracy[model].get('routes', '')}")
            n_agree = 16 if quick else 64
            pad_res = classify_all(url, "ensemble_pad512", texts[:n_agree], batch=16)
            ens_res = classify_all(url, "ensemble", texts[:n_agree])
            accuracy["ensemble_pad512_agreement"] = {
                "n": n_agree,
                "same_verdicts": int((pad_res["verdicts"] == ens_res["verdicts"]).sum()),
                "max_abs_probability_diff": float(np.abs(pad_res["probabilities"] - ens_res["probabilities"]).max()),
            }
            if not quick:
                raw_round("server idle, after the accuracy pass")
            plan = bench_plan(quick)
            # Warm-up of every (model, data) pair; its one-text latency sizes the first windows.
            warmup_ms = {}
            for key in dict.fromkeys((spec.model, spec.dataset) for spec in plan):
                lat = []
                for text in sets[key[1]][:6]:
                    t0 = time.perf_counter()
                    classify_all(url, key[0], [text])
                    lat.append((time.perf_counter() - t0) * 1000.0)
                warmup_ms[key] = float(np.median(lat[1:]))
            measurements = []
            for i, spec in enumerate(plan, 1):
                m = measure_next(binary, spec, url, files[spec.dataset], tmp / "pa", settings, measurements, warmup_ms)
                if m.get("error"):
                    _log(f"[{i}/{len(plan)}] {spec.section} {spec.model} {spec.dataset} c={spec.concurrency} "
                         f"b={spec.batch_size} round {spec.round + 1}: FAILED {m['error']}")
                else:
                    _log(f"[{i}/{len(plan)}] {spec.section} {spec.model} {spec.dataset} c={spec.concurrency} "
                         f"b={spec.batch_size} round {spec.round + 1}: {m['throughput']:.1f} infer/s, p50 {m['p50_ms']:.2f} ms, "
                         f"p99 {m['p99_ms']:.2f} ms, stable {m['stable']}, windows of {m['interval_ms']} ms, {m['wall_s']:.0f} s")

            raw_round("server idle, after the load runs")
    measurements = combine_rounds(measurements)
    raw = combine_raw_rounds(raw_rounds)
    ratios = compute_ratios(measurements, accuracy, raw)

    results = {
        "schema": 1,
        "command": command,
        "quick": quick,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "wall_s": round(time.monotonic() - t_start, 1),
        "machine": machine_info(),
        "load": {"before": load_before, "after": load_average(), "max_1min_during": max_load(measurements)},
        "git": git_revision(),
        "triton": triton,
        "stack": stack,
        "software": {"perf_analyzer": pa_version, "onnxruntime": ort.__version__},
        "raw_rounds": len(raw_rounds),
        "settings": asdict(settings),
        "plan": {"grid_models": GRID_MODELS, "concurrencies": CONCURRENCIES, "grid_rounds": {} if quick else GRID_ROUNDS,
                 "length_models": LENGTH_MODELS,
                 "batch_models": BATCH_MODELS, "batch_sizes": BATCH_SIZES, "sweep_concurrency": SWEEP_CONCURRENCY,
                 "length_bounds": LENGTH_BOUNDS, "variants": VARIANTS},
        "models": {"onnx": onnx_files, "training": _training_info(Path(repo))},
        "datasets": datasets,
        "measurements": measurements,
        "accuracy": accuracy,
        "raw": raw,
        "ratios": ratios,
        "goals": evaluate_goals(ratios),
    }
    write_outputs(results, out)
    return results


def write_outputs(results: Mapping, out: Path | str) -> Path:
    """Write ``<out>/bench/results.json``, the plots and ``<out>/benchmarks.md``; returns the report path."""
    out = Path(out)
    bench_dir = out / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    (bench_dir / "results.json").write_text(json.dumps(results, indent=1, default=_json_default) + "\n")
    write_plots(results, bench_dir)
    report = out / "benchmarks.md"
    existing = report.read_text() if report.is_file() else None
    report.write_text(render_report(results, existing, plots_dir=bench_dir.name))
    return report


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (tuple, set)):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")

