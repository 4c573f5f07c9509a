"""``orchestrator parity``: the run and its command line (see the package docstring)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from orchestrator.runtime.routing.heads import BINARY, Head, HeadError, repository_heads
from orchestrator.tooling.files import sha256_file
from orchestrator.tooling.modeling.parity.backends import BATCH_SIZE, InProcessBackend, TritonBackend, onnx_file, score_all
from orchestrator.tooling.modeling.parity.labeled import LabeledData, ParityError, held_out_data, read_labeled, write_labeled
from orchestrator.tooling.modeling.parity.metrics import (
    DEFAULT_MAX_FLIP_RATE,
    DEFAULT_TARGET_PRECISION,
    _threshold_text,
    binary_scores,
    compare,
    recommend,
)
from orchestrator.tooling.modeling.parity.report import environment, write_report
from orchestrator.tooling.paths import default_model_repository


def parity_head(repo: Path, reference: str, candidates: Sequence[str]) -> Head:
    """The head every model shares (``<repo>/<model>/head.json``, the legacy head without
    one), checked before any text is scored.

    Raises:
        ParityError: a model's head is invalid, or differs from the reference's in kind,
            labels or logits (parity compares the same answers), or names another tokenizer
            model (parity feeds every model the same token ids).
    """
    try:
        heads = repository_heads(repo, [reference, *candidates])
    except HeadError as exc:
        raise ParityError(str(exc)) from None
    ref = heads[reference]
    for m in candidates:
        h = heads[m]
        if (h.kind, h.labels, h.positive_index) != (ref.kind, ref.labels, ref.positive_index):
            raise ParityError(f"{m} has a {h.describe()} head, {reference} a {ref.describe()} head: "
                              "parity compares models that answer the same labels")
        if h.tokenizer != ref.tokenizer:
            raise ParityError(f"{m} is fed by tokenizer model {h.tokenizer!r}, {reference} by {ref.tokenizer!r}: "
                              "parity feeds every model the same token ids")
    return ref


def _plot_scores(logits: dict, reference: str, candidates: Sequence[str], head: Head) -> tuple:
    """``(reference scores, {candidate: scores})`` in logits for the plot; binary heads only."""
    if head.kind != BINARY:
        return None, None
    return binary_scores(logits[reference], head), {c: binary_scores(logits[c], head) for c in candidates}


def _check_labels(data: LabeledData, head: Head) -> None:
    want = (len(data.texts), head.columns) if head.kind == "multilabel" else (len(data.texts),)
    if data.labels.shape != want:
        raise ParityError(f"labels of shape {list(data.labels.shape)} for a {head.describe()} head; expected "
                          f"{list(want)} (read the data with the head: read_labeled(path, head))")
    if head.kind == "multiclass" and (data.labels.min() < 0 or data.labels.max() >= head.columns):
        raise ParityError(f"labels outside [0, {head.columns}) for a {head.describe()} head")


def run_parity(
    reference: str,
    candidates: Sequence[str],
    data: LabeledData,
    repo: os.PathLike | str,
    out: Optional[os.PathLike | str],
    *,
    head: Optional[Head] = None,
    target_precision: float = DEFAULT_TARGET_PRECISION,
    max_flip_rate: float = DEFAULT_MAX_FLIP_RATE,
    url: Optional[str] = None,
    embedded_server: bool = False,
    cross_check: bool = False,
    batch_size: int = BATCH_SIZE,
    timing_passes: int = 1,
    threads: Optional[int] = None,
    command: Optional[str] = None,
    quiet: bool = False,
) -> dict:
    """Score ``data`` with every model, compare, recommend, and write the report to ``out``
    (``None``: no files). Returns the report dict (what ``report.json`` holds). ``head``:
    the models' head (default: :func:`parity_head`, checked before scoring; ``data``'s
    labels must fit it: :func:`read_labeled` with the head).

    Main backend: in-process, or the server at ``url``, or an embedded server on ``repo``
    (``embedded_server``). ``cross_check``: also the other kind (in-process when the main one
    is a server; an embedded server otherwise). Raises :class:`ParityError`, and
    ``orchestrator.tooling.server.ServerError`` when the embedded server fails to start.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    repo = Path(repo)
    models = [reference, *candidates]
    if len(set(models)) != len(models):
        raise ParityError(f"model names repeat: {models}")
    if not candidates:
        raise ParityError("no candidates")
    if url and embedded_server:
        raise ParityError("give --url or --embedded-server, not both")
    head = head or parity_head(repo, reference, candidates)
    _check_labels(data, head)
    server = None
    console = Console(stderr=True, quiet=quiet)
    env = environment()

    def start_server():
        from orchestrator.tooling.server import TritonServer

        nonlocal server
        console.print(f"starting the embedded Triton server on {repo} ({', '.join([head.tokenizer, *models])})")
        server = TritonServer(repo, models=[head.tokenizer, *models]).start()
        return server.http_url

    def run_backend(backend, passes):
        with Progress(TextColumn(f"{backend.kind}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, disable=quiet) as prog:
            task = prog.add_task("texts", total=len(data.texts) * max(1, passes))
            return score_all(backend, models, data.texts, batch_size, passes,
                             progress=lambda k: prog.advance(task, k))

    try:
        if url or embedded_server:
            main = TritonBackend(url or start_server(), models, tokenizer=head.tokenizer)
        else:
            main = InProcessBackend(repo, models, threads, tokenizer=head.tokenizer)
        try:
            logits, latency, batches = run_backend(main, timing_passes)
            main_desc = main.description
            main_kind = main.kind
            main_ids = [main.encode(data.texts[s : s + batch_size])[0] for s in range(0, min(len(data.texts), batch_size * 4), batch_size)] if cross_check else None
        finally:
            main.close()
        cc = None
        if cross_check:
            other = (InProcessBackend(repo, models, threads, tokenizer=head.tokenizer) if main_kind == "triton"
                     else TritonBackend(start_server(), models, tokenizer=head.tokenizer))
            try:
                logits2, latency2, _ = run_backend(other, 1)
                ids2 = [other.encode(data.texts[s : s + batch_size])[0] for s in range(0, min(len(data.texts), batch_size * 4), batch_size)]
            finally:
                other.close()
            cc = {"backend": other.description,
                  "token_ids_identical": all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(main_ids, ids2)),
                  "token_ids_checked_batches": len(ids2),
                  "max_abs_logit_diff": {m: float(np.max(np.abs(logits[m].astype(np.float64) - logits2[m]))) for m in models},
                  "latency": latency2 if other.kind == "triton" else None}
            if other.kind == "in-process":  # prefer in-process timing for the recommendation
                latency, latency2 = latency2, latency
                cc["latency"] = latency2
                latency_source = other.description
            else:
                latency_source = main_desc
        else:
            latency_source = main_desc
    finally:
        if server is not None:
            server.stop()

    from orchestrator.tooling.modeling.parity.calibration import parity_calibration, served_logits, uncalibrated

    # each model's logits as its head serves them (divided by its own head.json temperature),
    # so thresholds and flips are those of the served probabilities
    served = served_logits(repo, models, logits)
    result = compare(served[reference], {c: served[c] for c in candidates}, data.labels, target_precision, reference,
                     uncalibrated(head))
    model_files = {}
    for m in models:
        p = onnx_file(repo / m)
        model_files[m] = {"file": str(p), "bytes": p.stat().st_size if p.is_file() else None,
                          "sha256": sha256_file(p) if p.is_file() else None}
    sizes = {m: v["bytes"] for m, v in model_files.items() if v["bytes"] is not None}
    rec = recommend(result, latency, sizes, max_flip_rate)
    thresholds = {reference: result["reference"]["threshold"]}
    thresholds.update({c: result["candidates"][c]["operating_threshold"] for c in candidates})
    report = {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "command": command or "orchestrator parity",
        "head": json.loads(head.to_json()),
        "data": {"source": data.source, "texts": len(data.texts), "positives": int(data.labels.sum()),
                 "sha256": data.digest()},
        "backend": main_desc,
        "latency_source": latency_source,
        "batch_size": batch_size,
        "timing_passes": timing_passes,
        "batches": batches,
        "environment": env,
        "models": model_files,
        "latency": latency,
        "result": result,
        "recommendation": rec,
        "thresholds": thresholds,
        "cross_check": cc,
    }
    report["calibration"] = parity_calibration(repo, models, logits, data.labels, Path(out) if out is not None else None)
    if out is not None:
        write_report(report, Path(out), *_plot_scores(served, reference, candidates, head))
    return report


# --------------------------------------------------------------------------- CLI


def _default_repo() -> Path:
    return default_model_repository()


def add_parity_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator parity`` options to ``parser`` (returned for chaining)."""
    parser.add_argument("--reference", default="classifier", help="reference model (default: %(default)s)")
    parser.add_argument("--candidates", nargs="+", default=None, metavar="MODEL",
                        help="models to compare with the reference (default: <reference>_fp16)")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--data", type=Path, default=None,
                     help="labeled texts: .jsonl ({\"text\", \"label\"}) or .tsv (label<TAB>text)")
    src.add_argument("--held-out", action="store_true",
                     help="use the held-out test split of orchestrator.tooling.modeling.data (all corpora)")
    src.add_argument("--write-held-out", type=Path, default=None, metavar="FILE",
                     help="only write the held-out test split to FILE (.jsonl or .tsv) and exit")
    parser.add_argument("--target-precision", type=float, default=DEFAULT_TARGET_PRECISION,
                        help="precision the reference threshold must reach (default: %(default)s)")
    parser.add_argument("--max-flip-rate", type=float, default=DEFAULT_MAX_FLIP_RATE,
                        help="flips (fraction of texts) a shippable candidate may have (default: %(default)s)")
    be = parser.add_mutually_exclusive_group()
    be.add_argument("--in-process", action="store_true", help="onnxruntime in this process (the default)")
    be.add_argument("--url", default=None, help="host:port of a running Triton server (HTTP)")
    be.add_argument("--embedded-server", action="store_true", help="start the embedded Triton server on --repo")
    parser.add_argument("--cross-check", action="store_true",
                        help="also run the other backend (embedded server or in-process) and compare logits")
    parser.add_argument("--repo", default=None,
                        help="model repository (default: ./model_repository, else the one in this checkout)")
    parser.add_argument("--out", type=Path, default=Path(".cache/parity"),
                        help="report directory (default: %(default)s; --out docs/results/parity rewrites the committed report)")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="texts per batch (default: %(default)s)")
    parser.add_argument("--timing-passes", type=int, default=1,
                        help="timed passes over the data (logits from the first; default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    return parser


def parity_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator parity``. Returns 0 on success, 1 on :class:`ParityError` or a server
    or data error (message on stderr), 2 on bad arguments."""
    from orchestrator.tooling.modeling import data as D
    from orchestrator.tooling.server import ServerError

    try:
        if args.write_held_out:
            d, extra = held_out_data()
            path = write_labeled(args.write_held_out, d, extra if args.write_held_out.suffix == ".jsonl" else None)
            print(f"wrote {len(d.texts):,} held-out texts ({int(d.labels.sum()):,} positive) to {path}")
            return 0
        if not args.data and not args.held_out:
            print("error: --data FILE or --held-out is required", file=sys.stderr)
            return 2
        if (args.url or args.embedded_server or args.cross_check) and not 1 <= args.batch_size <= BATCH_SIZE:
            print(f"error: --batch-size must be in [1, {BATCH_SIZE}] (the models' max_batch_size)", file=sys.stderr)
            return 2
        candidates = args.candidates or [f"{args.reference}_fp16"]
        repo = Path(args.repo) if args.repo else _default_repo()
        head = parity_head(repo, args.reference, candidates)  # refused before any text is read or scored
        if args.held_out and head.kind != BINARY:
            raise ParityError(f"--held-out has binary labels; {args.reference} has a {head.describe()} head: pass --data")
        data = held_out_data()[0] if args.held_out else read_labeled(args.data, head)
        command = "orchestrator parity " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "parity"
                                                       else sys.argv[1:])
        report = run_parity(
            args.reference, candidates, data, repo, args.out, head=head, target_precision=args.target_precision,
            max_flip_rate=args.max_flip_rate, url=args.url, embedded_server=args.embedded_server,
            cross_check=args.cross_check, batch_size=args.batch_size, timing_passes=args.timing_passes,
            threads=args.threads, command=command, quiet=args.quiet,
        )
    except (ParityError, ServerError, D.DataUnavailableError, OSError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    r = report["result"]
    print(f"reference {args.reference}: threshold {_threshold_text(r['reference']['threshold'], 6)} "
          f"for precision >= {r['target_precision']} on {r['texts']} texts; head: {head.describe()}")
    for c, block in r["candidates"].items():
        g, a = block["logits"], block["at_reference_threshold"]["vs_reference"]
        print(f"{c}: mean |d| {g['mean_abs_diff']:.3g}, max |d| {g['max_abs_diff']:.3g}, flips {a['flips']}, "
              f"operating threshold {_threshold_text(block['operating_threshold'], 6)}")
    print(report["recommendation"]["reason"])
    if args.out:
        print(f"report: {args.out}/report.md")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="orchestrator parity", description="Do candidate classifiers (fp16, re-exports) decide like the reference?")
    add_parity_arguments(p)
    return parity_command(p.parse_args(argv))
