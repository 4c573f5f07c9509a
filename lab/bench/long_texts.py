"""Long texts at ensemble speed: the ensemble (which truncates every text
to its first 128 tokens), the router classifying every window and the shipped router (whose
chunk nodes may stop early, ``nodes.chunk``), side by side in one run of one embedded server,
on two kinds of long text.

``make bench-long`` or ``python -m lab.bench.long_texts [--quick] [--out docs/results]``:

1. texts: held-out examples (``data.held_out_examples``, the test split, in the order of
   ``make bench``: ``RandomState(0)`` permutation) joined into long texts of two kinds, a
   join kept when its real token count (the repository's tokenizer, special tokens
   included) is within :data:`~.plan.LENGTH_BOUNDS` ``long`` (256 .. 384 tokens):
   *same-label* (:func:`same_label_long_texts`: sentences of one label only, so the text has
   that label) and *turning* (:func:`turning_long_texts`: an opening of about
   :data:`OPENING_TOKENS` tokens of one label, then about :data:`LATER_FACTOR` times as many
   of the other; the text's label is the later, longer part's);
2. copies ``model_repository/`` to a temporary directory and adds ``router_all_windows``:
   the shipped policy with every chunk node's stopping keys (``stop_when_decided``,
   ``stop_margin``, ``max_windows``) removed, i.e. every window classified;
3. starts one server; accuracy, per kind: every long text through ``ensemble``,
   ``router_all_windows`` and ``router`` (tritonclient gRPC, 64 texts per request, threshold
   0.5) against the labels, with the ROUTE counts and the windows each router's chunk nodes
   classified and skipped (``orchestrator_chunks_total``,
   ``orchestrator_chunks_skipped_total`` on ``/metrics``, counted over that pass);
4. throughput, p50 and p99 per kind at concurrency 4, one text per request, with
   perf_analyzer as ``make bench`` runs it (:func:`~.perf_analyzer.measure`,
   :data:`~.plan.FULL_SETTINGS`; ``--quick``: :data:`~.plan.QUICK_SETTINGS`), the three
   models interleaved in :data:`ROUNDS` rounds, merged by median
   (:func:`~.measurement.combine_rounds`); it waits up to 3 minutes for the 1-minute load
   average to fall below half the cores first, and marks the throughput not valid when other
   load was still over that at the start (the load during the run is its own, recorded per
   level);
5. writes ``<out>/bench/long_texts.json`` and the section between
   :data:`~.report.LONG_START` and :data:`~.report.LONG_END` of ``<out>/benchmarks.md``
   (``make bench`` keeps it).

Goals: speed, on same-label texts the shipped router's throughput at least
:data:`GOAL_RATIO` x the ensemble's with at least its accuracy (the ensemble reads only the
first 128 tokens; early stopping keeps reading the whole text near that speed); accuracy, on
turning texts the shipped router within :data:`TURNING_POINTS` accuracy points of
``router_all_windows`` (stopping early must not miss a label that turns later in the text).
Units: infer/s (texts per second), milliseconds. Errors: :class:`~.plan.BenchError`;
``ServerError`` from the server.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import yaml

from lab.bench.machine import QUIET_LOAD_PER_CORE, git_revision, load_average, machine_info, wait_quiet
from lab.bench.measurement import (
    accuracy_summary,
    classify_all,
    combine_rounds,
    length_stats,
    measure_next,
    token_lengths,
    write_input_data,
)
from lab.bench.perf_analyzer import install_perf_analyzer
from lab.bench.plan import (
    DEFAULT_TOOL_DIR,
    FULL_SETTINGS,
    LENGTH_BOUNDS,
    QUICK_SETTINGS,
    REPO,
    SWEEP_CONCURRENCY,
    BenchError,
    Spec,
)
from lab.bench.report import LONG_END, LONG_START, add_out_argument, write_kept_outputs
from lab.bench.stack import StackError, add_url_argument, header_line, read_stack, served, server_or_url
from orchestrator.runtime.routing.nodes.chunk import window_count
from orchestrator.tooling.modeling.long_texts import (  # noqa: F401 (the joiners, here as before)
    LATER_FACTOR,
    OPENING_TOKENS,
    same_label_long_texts,
    turning_long_texts,
)

COMMAND = "make bench-long  (python -m lab.bench.long_texts --out docs/results)"
#: The models compared, in table order.
MODELS = ("ensemble", "router_all_windows", "router")
ALL_WINDOWS = "router_all_windows"
STOP_KEYS = ("stop_when_decided", "stop_margin", "max_windows")
ROUNDS = 2
GOAL_RATIO = 0.8
SECTION = "long_texts"
#: The shipped policy's windows (its ``defaults.chunk``), for the windows a text makes.
WINDOW, STRIDE = 128, 96


# ----------------------------------------------------------------------------- the repository


def without_stopping(node: Any) -> Any:
    """A policy document (or node tree) with every chunk node's stopping keys removed."""
    if isinstance(node, dict):
        drop = STOP_KEYS if node.get("kind") == "chunk" else ()
        return {k: without_stopping(v) for k, v in node.items() if k not in drop}
    if isinstance(node, list):
        return [without_stopping(v) for v in node]
    return node


def chunk_nodes(node: Any) -> List[Dict[str, Any]]:
    """The chunk nodes of a policy document, in document order."""
    if isinstance(node, dict):
        own = [node] if node.get("kind") == "chunk" else []
        return own + [c for v in node.values() for c in chunk_nodes(v)]
    if isinstance(node, list):
        return [c for v in node for c in chunk_nodes(v)]
    return []


def make_long_repository(dest: Path, source: Path = REPO) -> dict:
    """Copy ``source`` to ``dest`` and add ``router_all_windows``; returns the shipped
    policy document (its ``defaults`` included)."""
    from lab.bench.features import _copy, _policy

    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(
        "__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"))
    shipped = yaml.safe_load((source / "router" / "policy.yaml").read_text())
    _policy(_copy(dest, "router", ALL_WINDOWS), without_stopping(shipped))
    return shipped


# ----------------------------------------------------------------------------- report


KINDS = ("same_label", "turning")
KIND_TEXT = {
    "same_label": "same-label texts: held-out sentences of one label only, joined; the text has that label",
    "turning": (f"turning texts: an opening of about {OPENING_TOKENS} tokens of sentences of one label, then about "
                f"{LATER_FACTOR:g} times as many tokens of sentences of the other label; the text's label is the "
                "later, longer part's"),
}
#: The turning-texts goal: on turning texts, the shipped router within this many accuracy points of
#: reading every window.
TURNING_POINTS = 2.0


def _fmt(x: Optional[float], digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _windows_made(ds: Mapping[str, Any]) -> str:
    lo, hi = ds.get("windows_min"), ds.get("windows_max")
    if lo == hi:
        return f"{lo} windows a text"
    return f"{lo} to {hi} windows a text, {ds.get('windows_mean', 0):.2f} on average"


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section for the results ``r`` of one run."""
    perf = {(m["model"], m["dataset"]): m for m in r["measurements"]}
    stops = "; ".join(f"`{c['name']}` " + ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in c["keys"].items())
                      for c in r["stopping"]) or "no chunk node stops early"
    L = [LONG_START, "## Long texts: early stopping in the chunk node", "",
         f"One run of `{COMMAND}`{' --quick' if r.get('quick') else ''} at {r['started_utc']} UTC on "
         f"{r['machine']['cores']} cores ({r['machine']['cpu_model']}), load average {r['load_start']} at start and "
         f"{r['load_end']} at the end, {r['wall_s']:.0f} s; figures in `bench/long_texts.json`.", "",
         header_line(r.get("stack")), "",
         "Two kinds of long text, each built from held-out test sentences (the order of `make bench`), a text kept "
         f"when its token count is within {r['bounds'][0]}-{r['bounds'][1]}:", ""]
    for kind in KINDS:
        ds = r["datasets"][kind]
        L.append(f"- {KIND_TEXT[kind]}: {ds['n']} texts ({ds.get('positive')} positive) of {ds['tokens_min']} to "
                 f"{ds['tokens_max']} tokens (median {ds['tokens_p50']:g}), {_windows_made(ds)}.")
    L += ["", "The ensemble reads the first 128 tokens; the routers cut 128-token windows at stride 96. "
          "`router_all_windows` is the shipped policy with the chunk nodes' stopping keys removed (every window "
          f"classified); `router` is the shipped policy: {stops}.", "",
          f"Accuracy: every text once (64 per request, threshold 0.5) against its label. Windows: per long text, "
          "summed over the policy's chunk nodes, during the accuracy pass. Throughput, p50, p99: perf_analyzer, gRPC, "
          f"one text per request, concurrency {r['concurrency']}, the models interleaved in {r['rounds']} round(s) "
          "(median)." + (" **The throughput columns of this run are not valid: the machine was loaded (see the load "
                         "average); re-run on a quiet machine.**" if r.get("loaded") else ""), "",
          "| texts | model | accuracy | windows classified per text | windows skipped per text | throughput (infer/s) "
          "| / ensemble | p50 (ms) | p99 (ms) | stable |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for kind in KINDS:
        ens = perf.get(("ensemble", f"long_{kind}"), {}).get("throughput")
        for model in MODELS:
            a, w, m = r["accuracy"][kind][model], r["windows"][kind].get(model), perf.get((model, f"long_{kind}"), {})
            if w is None and model != "ensemble":  # --url: the server's metrics are not read
                used = "not read (server not started here)"
            else:
                used = "1 (truncated)" if w is None else f"{w['classified_per_text']:.2f}"
            skipped = "n/a" if w is None else f"{w['skipped_per_text']:.2f}"
            ratio = f"{m['throughput'] / ens:.2f}x" if m.get("throughput") and ens else "n/a"
            stable = {True: "yes", False: "no", None: "not checked"}[m.get("stable")] if not m.get("error") else "FAILED"
            L.append(f"| {kind.replace('_', '-')} | `{model}` | {a['accuracy_pct']:.2f}% ({a['correct']}/{a['n']}) | {used} | "
                     f"{skipped} | {_fmt(m.get('throughput'))} | {ratio} | {_fmt(m.get('p50_ms'), 2)} | "
                     f"{_fmt(m.get('p99_ms'), 2)} | {stable} |")
    g, t = r["goal"], r["turning_goal"]
    L += ["", f"Goal (same-label texts): `router` at least {GOAL_RATIO:g}x the ensemble's throughput with at least "
          f"its accuracy: **{'met' if g['met'] else 'not met'}** (throughput {_fmt(g['ratio'], 2)}x, accuracy "
          f"{g['router_accuracy_pct']:.2f}% vs {g['ensemble_accuracy_pct']:.2f}%).", "",
          f"Goal (turning texts): `router` within {TURNING_POINTS:g} points of `router_all_windows`: "
          f"**{'met' if t['met'] else 'not met'}** ({t['router_accuracy_pct']:.2f}% vs {t['all_windows_accuracy_pct']:.2f}%).",
          "", "Routes of the shipped router (`:windows=<used>/<made>`: the text stopped early):", ""]
    for kind in KINDS:
        L += [f"- {kind.replace('_', '-')}: " + ", ".join(f"`{k}` {v}" for k, v in r["accuracy"][kind]["router"].get("routes", {}).items())]
    L += ["", LONG_END]
    return "\n".join(L)


# ----------------------------------------------------------------------------- run


def _window_counts(server: Any, router: str) -> Tuple[float, float]:
    return (server.metric("orchestrator_chunks_total", router=router),
            server.metric("orchestrator_chunks_skipped_total", router=router))


def long_text_sets(tokenizer: Any, examples: Sequence[Any], n: Optional[int] = None) -> Dict[str, List[Tuple[str, int]]]:
    """``{"same_label": [(text, label)], "turning": [...]}`` from ``examples`` (in the given
    order): :func:`same_label_long_texts` and :func:`turning_long_texts`, ``n`` of each at most."""
    texts, labels = [e.text for e in examples], [int(e.label) for e in examples]
    lengths = token_lengths(tokenizer, texts)

    def count(t: str) -> int:
        return int(token_lengths(tokenizer, [t])[0])

    return {"same_label": same_label_long_texts(texts, labels, lengths, count, n=n),
            "turning": turning_long_texts(texts, labels, lengths, count, n=n)}


def _accuracy_pass(server: Any, sets: Mapping[str, List[Tuple[str, int]]], count_windows: bool = True) -> Tuple[dict, dict]:
    accuracy: Dict[str, Dict[str, Any]] = {k: {} for k in sets}
    windows: Dict[str, Dict[str, Any]] = {k: {} for k in sets}
    for kind, pairs in sets.items():
        texts, labels = [t for t, _ in pairs], [y for _, y in pairs]
        for model in MODELS:
            before = _window_counts(server, model) if model != "ensemble" and count_windows else None
            res = classify_all(server.grpc_url, model, texts)
            accuracy[kind][model] = accuracy_summary(labels, res["verdicts"], res["routes"])
            if before is not None:
                time.sleep(1.0)  # the router flushes its counters every 0.5 s
                after = _window_counts(server, model)
                windows[kind][model] = {"classified_per_text": (after[0] - before[0]) / len(texts),
                                        "skipped_per_text": (after[1] - before[1]) / len(texts)}
            print(f"[bench-long] {kind} {model}: {accuracy[kind][model]['accuracy_pct']:.2f}% "
                  f"{windows[kind].get(model, '')}", file=sys.stderr, flush=True)
    return accuracy, windows


def _throughput(binary: Path, url: str, inputs: Mapping[str, Path], tmp: Path, sets: Mapping[str, List[Tuple[str, int]]],
                settings: Any, rounds: int) -> List[dict]:
    warmup: Dict[Tuple[str, str], float] = {}
    for kind, pairs in sets.items():
        for model in MODELS:
            lat = []
            for t, _ in pairs[:6]:
                s = time.perf_counter()
                classify_all(url, model, [t])
                lat.append((time.perf_counter() - s) * 1000.0)
            warmup[(model, f"long_{kind}")] = float(np.median(lat[1:]))
    measurements: List[dict] = []
    for r in range(rounds):
        for kind in sets:
            order = MODELS if r % 2 == 0 else tuple(reversed(MODELS))
            for model in order:
                spec = Spec(SECTION, model, f"long_{kind}", SWEEP_CONCURRENCY, 1, r)
                m = measure_next(binary, spec, url, inputs[kind], tmp / "pa", settings, measurements, warmup)
                print(f"[bench-long] round {r + 1} {kind} {model}: "
                      + (f"FAILED {m['error']}" if m.get("error") else
                         f"{m['throughput']:.1f} infer/s, p50 {m['p50_ms']:.2f} ms, p99 {m['p99_ms']:.2f} ms "
                         f"(load {m['load_1min']}; throughput only valid from a quiet machine)"),
                      file=sys.stderr, flush=True)
    return measurements


def run(out: Path, quick: bool = False, tool_dir: Path = DEFAULT_TOOL_DIR, urls: Sequence[str] = ()) -> dict:
    """The whole benchmark (module docstring); writes the outputs and returns the results.

    ``urls``: measure the running server at these ``--url`` values (``stack.parse_urls``;
    gRPC needed; it must serve :data:`MODELS`) instead of starting one; the window counts,
    read from the metrics of a server started here, are then not taken."""
    from transformers import AutoTokenizer

    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    t0 = time.monotonic()
    settings = QUICK_SETTINGS if quick else FULL_SETTINGS
    binary = install_perf_analyzer(tool_dir)
    machine = machine_info()
    quiet = QUIET_LOAD_PER_CORE * machine.get("cores", 1)
    results: Dict[str, Any] = {
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_start": wait_quiet(quiet, log=lambda m: print(f"[bench-long] {m}", flush=True)),
        "machine": machine, "git": git_revision(), "command": COMMAND,
        "quick": quick, "concurrency": SWEEP_CONCURRENCY, "rounds": 1 if quick else ROUNDS,
        "bounds": list(LENGTH_BOUNDS["long"]),
    }
    tokenizer = AutoTokenizer.from_pretrained(str(REPO / "tokenizer" / "1"))
    try:
        held_out = data.held_out_examples()
    except Exception as exc:  # DataUnavailableError, DataFormatError
        raise BenchError(f"cannot load the held-out split: {exc}") from exc
    examples = [held_out[i] for i in np.random.RandomState(0).permutation(len(held_out))]
    sets = long_text_sets(tokenizer, examples, n=60 if quick else None)
    if not all(sets.values()):
        raise BenchError("no long texts of some kind could be joined from the held-out split")
    results["datasets"] = {}
    for kind, pairs in sets.items():
        lengths = token_lengths(tokenizer, [t for t, _ in pairs])
        made = [window_count(int(k), WINDOW, STRIDE) for k in lengths]
        results["datasets"][kind] = {**length_stats(lengths), "positive": int(sum(y for _, y in pairs)),
                                     "windows_min": min(made), "windows_max": max(made), "windows_mean": float(np.mean(made))}
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        repo = Path(tmp) / "model_repository"
        shipped = make_long_repository(repo)
        defaults = (shipped.get("defaults") or {}).get("chunk", {})
        results["stopping"] = [{"name": c.get("name", "?"), "keys": {k: c.get(k, defaults.get(k)) for k in STOP_KEYS
                                                                      if c.get(k, defaults.get(k)) is not None}}
                               for c in chunk_nodes(shipped["root"])]
        results["stopping"] = [c for c in results["stopping"] if c["keys"]]
        inputs = {k: write_input_data(Path(tmp) / f"input-{k}.json", [t for t, _ in pairs]) for k, pairs in sets.items()}
        start = ["tokenizer", "postprocess", "classifier", "classifier_fast", "ensemble", "router", ALL_WINDOWS]
        with server_or_url(urls, lambda: TritonServer(repo, models=start), need="grpc") as server:
            results["stack"] = read_stack(server, embedded=not urls)
            served(results["stack"], MODELS, "serve the repository of --write-repository DIR, or run without --url")
            results["accuracy"], results["windows"] = _accuracy_pass(server, sets, count_windows=not urls)
            measurements = _throughput(binary, server.grpc_url, inputs, Path(tmp), sets, settings, results["rounds"])
    results["measurements"] = combine_rounds(measurements)
    perf = {(m["model"], m["dataset"]): m for m in results["measurements"]}
    acc = results["accuracy"]
    ens, rt = perf[("ensemble", "long_same_label")].get("throughput"), perf[("router", "long_same_label")].get("throughput")
    ratio = rt / ens if ens and rt else None
    results["goal"] = {"ratio": ratio, "router_accuracy_pct": acc["same_label"]["router"]["accuracy_pct"],
                       "ensemble_accuracy_pct": acc["same_label"]["ensemble"]["accuracy_pct"],
                       "met": bool(ratio is not None and ratio >= GOAL_RATIO
                                   and acc["same_label"]["router"]["correct"] >= acc["same_label"]["ensemble"]["correct"])}
    turning = acc["turning"]
    results["turning_goal"] = {"router_accuracy_pct": turning["router"]["accuracy_pct"],
                               "all_windows_accuracy_pct": turning[ALL_WINDOWS]["accuracy_pct"],
                               "met": turning["router"]["accuracy_pct"] >= turning[ALL_WINDOWS]["accuracy_pct"] - TURNING_POINTS}
    results["load_end"] = load_average()
    # other processes' load before the run; the load during it is this benchmark's own server
    # and perf_analyzer (recorded per level as load_1min)
    results["loaded"] = bool((results["load_start"] or [0])[0] > quiet)
    results["wall_s"] = round(time.monotonic() - t0, 1)
    write_kept_outputs(out, "long_texts", results, render_section(results), LONG_START, LONG_END)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.long_texts",
                                     description=(__doc__ or "").split("\n")[0])
    add_out_argument(parser)
    parser.add_argument("--quick", action="store_true", help="60 texts, one round, short windows (a smoke run)")
    add_url_argument(parser)
    parser.add_argument("--write-repository", type=Path, default=None, metavar="DIR",
                        help="only write the repository this benchmark serves to DIR (to serve it yourself for --url)")
    args = parser.parse_args(argv)
    if args.write_repository:
        make_long_repository(args.write_repository)
        print(f"wrote {args.write_repository}")
        return 0
    try:
        print(render_section(run(args.out, quick=args.quick, urls=args.url)))
    except (StackError, BenchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
