"""Long texts at ensemble speed (issue 20): the ensemble (which truncates every text to its
first 128 tokens), the router classifying every window and the shipped router (whose chunk
nodes may stop early, ``nodes.chunk``), side by side in one run of one embedded server.

``make bench-long`` or ``python -m orchestrator.tooling.bench.long_texts [--quick] [--out docs]``:

1. texts: held-out examples (``data.held_out_examples``, the test split, in the order of
   ``make bench``: ``RandomState(0)`` permutation) joined into long texts by
   :func:`same_label_long_texts`: only sentences of one label are joined, so the long text
   has that label (a person reading any part of it would answer the same), and a join is
   kept when its real token count (the repository's tokenizer, special tokens included) is
   within :data:`~.plan.LENGTH_BOUNDS` ``long`` (256 .. 384 tokens);
2. copies ``model_repository/`` to a temporary directory and adds ``router_all_windows``:
   the shipped policy with every chunk node's stopping keys (``stop_when_decided``,
   ``stop_margin``, ``max_windows``) removed, i.e. every window classified (the router
   before issue 20);
3. starts one server; accuracy: every long text through ``ensemble``, ``router_all_windows``
   and ``router`` (tritonclient gRPC, 64 texts per request, threshold 0.5) against the
   labels, with the ROUTE counts and the windows each router's chunk nodes classified and
   skipped (``orchestrator_chunks_total``, ``orchestrator_chunks_skipped_total`` on
   ``/metrics``, counted over that pass);
4. throughput, p50 and p99 at concurrency 4, one text per request, with perf_analyzer as
   ``make bench`` runs it (:func:`~.perf_analyzer.measure`, :data:`~.plan.FULL_SETTINGS`;
   ``--quick``: :data:`~.plan.QUICK_SETTINGS`), the three models interleaved in
   :data:`ROUNDS` rounds, merged by median (:func:`~.measurement.combine_rounds`);
5. writes ``<out>/bench/long_texts.json`` and the section between
   :data:`~.report.LONG_START` and :data:`~.report.LONG_END` of ``<out>/benchmarks.md``
   (``make bench`` keeps it).

Goal (issue 20): the shipped router's throughput at least :data:`GOAL_RATIO` x the
ensemble's, with accuracy at least the ensemble's, both from this run.
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
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import yaml

from orchestrator.runtime.nodes.chunk import window_count
from orchestrator.tooling.bench.machine import git_revision, load_average, machine_info
from orchestrator.tooling.bench.measurement import (
    accuracy_summary,
    classify_all,
    combine_rounds,
    expected_latency_ms,
    length_stats,
    token_lengths,
    write_input_data,
)
from orchestrator.tooling.bench.perf_analyzer import install_perf_analyzer, measure
from orchestrator.tooling.bench.plan import (
    DEFAULT_TOOL_DIR,
    FULL_SETTINGS,
    LENGTH_BOUNDS,
    QUICK_SETTINGS,
    REPO,
    SWEEP_CONCURRENCY,
    BenchError,
    Spec,
)
from orchestrator.tooling.bench.report import LONG_END, LONG_START, replace_section

COMMAND = "make bench-long  (python -m orchestrator.tooling.bench.long_texts --out docs)"
#: The models compared, in table order.
MODELS = ("ensemble", "router_all_windows", "router")
ALL_WINDOWS = "router_all_windows"
STOP_KEYS = ("stop_when_decided", "stop_margin", "max_windows")
ROUNDS = 2
GOAL_RATIO = 0.8
SECTION, DATASET = "long_texts", "long_same_label"
#: The shipped policy's windows (its ``defaults.chunk``), for the windows a text makes.
WINDOW, STRIDE = 128, 96


# ----------------------------------------------------------------------------- texts


def same_label_long_texts(texts: Sequence[str], labels: Sequence[int], lengths: Sequence[int],
                          join_length: Callable[[str], int], bounds: Tuple[int, int] = LENGTH_BOUNDS["long"],
                          n: Optional[int] = None) -> List[Tuple[str, int]]:
    """Long texts of one label each: ``(text, label)`` in order of completion.

    Sentences are taken in the given order; each goes to the open join of its own label.
    When a join's estimated token count (``lengths`` summed, minus 2 per join for the
    shared special tokens) reaches ``bounds[0]`` it is closed: kept when its real count
    ``join_length(joined)`` is within ``bounds`` (inclusive), dropped otherwise (a new join
    of that label starts either way). ``n``: stop after that many texts.

    Raises:
        ValueError: the sequences differ in length.
    """
    if not len(texts) == len(labels) == len(lengths):
        raise ValueError("texts, labels and lengths differ in length")
    lo, hi = bounds
    open_: Dict[int, Tuple[List[str], int]] = {}
    out: List[Tuple[str, int]] = []
    for t, y, k in zip(texts, labels, lengths):
        parts, total = open_.get(int(y), ([], 0))
        parts = parts + [t]
        total = int(k) if len(parts) == 1 else total + int(k) - 2
        if total < lo:
            open_[int(y)] = (parts, total)
            continue
        open_.pop(int(y), None)
        joined = " ".join(parts)
        if lo <= join_length(joined) <= hi:
            out.append((joined, int(y)))
            if n is not None and len(out) >= n:
                break
    return out


#: Turning texts (:func:`turning_long_texts`): the opening's target tokens, and how many
#: times as many tokens the later part has.
OPENING_TOKENS, LATER_FACTOR = 110, 2.0


def turning_long_texts(texts: Sequence[str], labels: Sequence[Any], lengths: Sequence[int],
                       join_length: Callable[[str], int], bounds: Tuple[int, int] = LENGTH_BOUNDS["long"],
                       n: Optional[int] = None, opening: int = OPENING_TOKENS,
                       factor: float = LATER_FACTOR) -> List[Tuple[str, Any]]:
    """Long texts whose parts disagree: ``(text, label)``, an opening of about ``opening``
    tokens of sentences of one label, then about ``factor`` times as many tokens of sentences
    of another label. **Label rule: the text's label is the later, longer part's** (a review
    that opens with a plot summary and ends with its verdict).

    Sentences are taken in the given order from one queue per label (``labels`` hashable:
    an int, or a tuple for multilabel rows); texts alternate their opening label over the
    labels present. The opening takes sentences until its estimated count (``lengths``
    summed, minus 2 per join for the shared special tokens) reaches ``opening``, the later
    part until it reaches ``factor`` times ``opening``; the text is kept when its real
    count ``join_length(text)`` is within ``bounds`` (inclusive). Stops when a label's queue
    runs out, or after ``n`` texts.

    Raises:
        ValueError: the sequences differ in length.
    """
    if not len(texts) == len(labels) == len(lengths):
        raise ValueError("texts, labels and lengths differ in length")
    queues: Dict[Any, List[Tuple[str, int]]] = {}
    for t, y, k in zip(texts, labels, lengths):
        queues.setdefault(y, []).append((t, int(k)))
    keys = list(queues)
    if len(keys) < 2:
        return []
    pos = {y: 0 for y in keys}

    def take(y: Any, tokens: float) -> Optional[Tuple[List[str], int]]:
        parts, total = [], 0
        while total < tokens:
            if pos[y] >= len(queues[y]):
                return None
            t, k = queues[y][pos[y]]
            pos[y] += 1
            parts.append(t)
            total = k if len(parts) == 1 else total + k - 2
        return parts, total

    out: List[Tuple[str, Any]] = []
    i = 0
    while n is None or len(out) < n:
        first, later = keys[i % len(keys)], keys[(i + 1) % len(keys)]
        i += 1
        head = take(first, opening)
        tail = take(later, factor * opening) if head else None
        if head is None or tail is None:
            break
        joined = " ".join(head[0] + tail[0])
        if bounds[0] <= join_length(joined) <= bounds[1]:
            out.append((joined, later))
    return out


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
    from orchestrator.tooling.bench.features import _copy, _policy

    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(
        "__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"))
    shipped = yaml.safe_load((source / "router" / "policy.yaml").read_text())
    _policy(_copy(dest, "router", ALL_WINDOWS), without_stopping(shipped))
    return shipped


# ----------------------------------------------------------------------------- report


def _fmt(x: Optional[float], digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _windows_made(ds: Mapping[str, Any]) -> str:
    lo, hi = ds.get("windows_min"), ds.get("windows_max")
    if lo == hi:
        return f"{lo} windows a text here"
    return f"{lo} to {hi} windows a text here, {ds.get('windows_mean', 0):.2f} on average"


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section for the results ``r`` of one run."""
    ds, acc, perf, win = r["dataset"], r["accuracy"], {m["model"]: m for m in r["measurements"]}, r["windows"]
    L = [LONG_START, "## Long texts: early stopping in the chunk node (issue 20)", "",
         f"One run of `{COMMAND}`{' --quick' if r.get('quick') else ''} at {r['started_utc']} UTC on "
         f"{r['machine']['cores']} cores ({r['machine']['cpu_model']}), load average {r['load_start']} at start and "
         f"{r['load_end']} at the end, {r['wall_s']:.0f} s; figures in `bench/long_texts.json`.", "",
         f"Texts: {ds['n']} long texts ({ds.get('positive')} positive) of {ds['tokens_min']} to {ds['tokens_max']} tokens "
         f"(median {ds['tokens_p50']:g}), "
         "each made of held-out test sentences of one label only (the order of `make bench`; a join is kept when its "
         f"token count is within {r['bounds'][0]}-{r['bounds'][1]}), so each long text has that label. The ensemble "
         f"reads the first 128 tokens; the routers cut 128-token windows at stride 96 ({_windows_made(ds)}). "
         "`router_all_windows` is the shipped policy with the chunk nodes' stopping keys removed (every window "
         "classified: the router before issue 20); `router` is the shipped policy: "
         + ("; ".join(f"`{c['name']}` " + ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in c["keys"].items())
                      for c in r["stopping"]) or "no chunk node stops early") + ".", "",
         f"Throughput, p50, p99: perf_analyzer, gRPC, one text per request, concurrency {r['concurrency']}, the models "
         f"interleaved in {r['rounds']} round(s) (median). Accuracy: every text once (64 per request, threshold 0.5) "
         "against its label. Windows: per long text, summed over the policy's chunk nodes, during the accuracy pass.", "",
         "| model | throughput (infer/s) | / ensemble | p50 (ms) | p99 (ms) | stable | accuracy | windows classified per text | windows skipped per text |",
         "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    ens = perf.get("ensemble", {}).get("throughput")
    for model in MODELS:
        m, a, w = perf.get(model, {}), acc[model], win.get(model)
        used = "1 (truncated)" if w is None else f"{w['classified_per_text']:.2f}"
        skipped = "n/a" if w is None else f"{w['skipped_per_text']:.2f}"
        ratio = f"{m['throughput'] / ens:.2f}x" if m.get("throughput") and ens else "n/a"
        stable = {True: "yes", False: "no", None: "not checked"}[m.get("stable")] if not m.get("error") else "FAILED"
        L.append(f"| `{model}` | {_fmt(m.get('throughput'))} | {ratio} | {_fmt(m.get('p50_ms'), 2)} | "
                 f"{_fmt(m.get('p99_ms'), 2)} | {stable} | {a['accuracy_pct']:.2f}% ({a['correct']}/{a['n']}) | "
                 f"{used} | {skipped} |")
    g = r["goal"]
    L += ["", f"Goal (issue 20): `router` at least {GOAL_RATIO:g}x the ensemble's throughput with at least its accuracy: "
          f"**{'met' if g['met'] else 'not met'}** (throughput {_fmt(g['ratio'], 2)}x, accuracy "
          f"{g['router_accuracy_pct']:.2f}% vs {g['ensemble_accuracy_pct']:.2f}%).", "",
          "Routes of the shipped router (`:windows=<used>/<made>`: the text stopped early):", ""]
    L += [f"- `{k}`: {v}" for k, v in acc["router"].get("routes", {}).items()]
    L += ["", LONG_END]
    return "\n".join(L)


def write_section(report: Path, section: str) -> None:
    """Replace the section between :data:`LONG_START` and :data:`LONG_END` in ``report``, or
    append it (``report.replace_section``)."""
    replace_section(report, section, LONG_START, LONG_END)


# ----------------------------------------------------------------------------- run


def _window_counts(server: Any, router: str) -> Tuple[float, float]:
    return (server.metric("orchestrator_chunks_total", router=router),
            server.metric("orchestrator_chunks_skipped_total", router=router))


def run(out: Path, quick: bool = False, tool_dir: Path = DEFAULT_TOOL_DIR) -> dict:
    """The whole benchmark (module docstring); writes the outputs and returns the results."""
    from transformers import AutoTokenizer

    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    t0 = time.monotonic()
    settings = QUICK_SETTINGS if quick else FULL_SETTINGS
    binary = install_perf_analyzer(tool_dir)
    results: Dict[str, Any] = {
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_start": load_average(), "machine": machine_info(), "git": git_revision(), "command": COMMAND,
        "quick": quick, "concurrency": SWEEP_CONCURRENCY, "rounds": 1 if quick else ROUNDS,
        "bounds": list(LENGTH_BOUNDS["long"]),
    }
    tokenizer = AutoTokenizer.from_pretrained(str(REPO / "tokenizer" / "1"))
    try:
        held_out = data.held_out_examples()
    except Exception as exc:  # DataUnavailableError, DataFormatError
        raise BenchError(f"cannot load the held-out split: {exc}") from exc
    examples = [held_out[i] for i in np.random.RandomState(0).permutation(len(held_out))]
    texts, labels = [e.text for e in examples], [int(e.label) for e in examples]
    pairs = same_label_long_texts(texts, labels, token_lengths(tokenizer, texts),
                                  lambda t: int(token_lengths(tokenizer, [t])[0]), n=60 if quick else None)
    if not pairs:
        raise BenchError("no long texts could be joined from the held-out split")
    long_texts, long_labels = [t for t, _ in pairs], [y for _, y in pairs]
    lengths = token_lengths(tokenizer, long_texts)
    made = [window_count(int(k), WINDOW, STRIDE) for k in lengths]
    results["dataset"] = {**length_stats(lengths), "positive": int(sum(long_labels)),
                          "windows_min": min(made), "windows_max": max(made), "windows_mean": float(np.mean(made))}
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        repo = Path(tmp) / "model_repository"
        shipped = make_long_repository(repo)
        defaults = (shipped.get("defaults") or {}).get("chunk", {})
        results["stopping"] = [{"name": c.get("name", "?"), "keys": {k: c.get(k, defaults.get(k)) for k in STOP_KEYS
                                                                      if c.get(k, defaults.get(k)) is not None}}
                               for c in chunk_nodes(shipped["root"])]
        results["stopping"] = [c for c in results["stopping"] if c["keys"]]
        input_file = write_input_data(Path(tmp) / "input-long.json", long_texts)
        start = ["tokenizer", "postprocess", "classifier", "classifier_fast", "ensemble", "router", ALL_WINDOWS]
        with TritonServer(repo, models=start) as server:
            url = server.grpc_url
            accuracy, windows = {}, {}
            for model in MODELS:
                before = _window_counts(server, model) if model != "ensemble" else None
                res = classify_all(url, model, long_texts)
                accuracy[model] = accuracy_summary(long_labels, res["verdicts"], res["routes"])
                if before is not None:
                    time.sleep(1.0)  # the router flushes its counters every 0.5 s
                    after = _window_counts(server, model)
                    windows[model] = {"classified_per_text": (after[0] - before[0]) / len(long_texts),
                                      "skipped_per_text": (after[1] - before[1]) / len(long_texts)}
                print(f"[bench-long] {model}: {accuracy[model]['accuracy_pct']:.2f}% {windows.get(model, '')}",
                      file=sys.stderr, flush=True)
            warmup: Dict[Tuple[str, str], float] = {}
            for model in MODELS:
                lat = []
                for t in long_texts[:6]:
                    s = time.perf_counter()
                    classify_all(url, model, [t])
                    lat.append((time.perf_counter() - s) * 1000.0)
                warmup[(model, DATASET)] = float(np.median(lat[1:]))
            measurements: List[dict] = []
            for r in range(results["rounds"]):
                order = MODELS if r % 2 == 0 else tuple(reversed(MODELS))
                for model in order:
                    spec = Spec(SECTION, model, DATASET, SWEEP_CONCURRENCY, 1, r)
                    m = measure(binary, spec, url, input_file, Path(tmp) / "pa", settings,
                                latency_ms=expected_latency_ms(spec, measurements, warmup))
                    m["load_1min"] = (load_average() or [None])[0]
                    measurements.append(m)
                    print(f"[bench-long] round {r + 1} {model}: "
                          + (f"FAILED {m['error']}" if m.get("error") else
                             f"{m['throughput']:.1f} infer/s, p50 {m['p50_ms']:.2f} ms, p99 {m['p99_ms']:.2f} ms"),
                          file=sys.stderr, flush=True)
    results["accuracy"], results["windows"] = accuracy, windows
    results["measurements"] = combine_rounds(measurements)
    perf = {m["model"]: m for m in results["measurements"]}
    ens, rt = perf["ensemble"].get("throughput"), perf["router"].get("throughput")
    ratio = rt / ens if ens and rt else None
    results["goal"] = {"ratio": ratio, "router_accuracy_pct": accuracy["router"]["accuracy_pct"],
                       "ensemble_accuracy_pct": accuracy["ensemble"]["accuracy_pct"],
                       "met": bool(ratio is not None and ratio >= GOAL_RATIO
                                   and accuracy["router"]["correct"] >= accuracy["ensemble"]["correct"])}
    results["load_end"] = load_average()
    results["wall_s"] = round(time.monotonic() - t0, 1)
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / "long_texts.json").write_text(json.dumps(results, indent=1) + "\n")
    write_section(out / "benchmarks.md", render_section(results))
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.tooling.bench.long_texts",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs"), help="where benchmarks.md and bench/ are (default: docs)")
    parser.add_argument("--quick", action="store_true", help="60 texts, one round, short windows (a smoke run)")
    args = parser.parse_args(argv)
    print(render_section(run(args.out, quick=args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
