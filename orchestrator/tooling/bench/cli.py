"""``orchestrator bench`` / ``python -m orchestrator.tooling.bench``: the command line."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.tooling.bench.plan import DEFAULT_TOOL_DIR, FULL_SETTINGS, QUICK_SETTINGS, REPO, BenchError, PASettings
from orchestrator.tooling.bench.report import met_label
from orchestrator.tooling.bench.run import run_benchmark, write_outputs

# Command line


def add_bench_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator bench`` options to ``parser`` (returned for chaining)."""
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: short windows, no stability check, fewer texts (under 2 minutes)")
    parser.add_argument("--out", default=".cache/docs",
                        help="where benchmarks.md and bench/ go (default: %(default)s; --out docs/results rewrites the committed ones)")
    parser.add_argument("--repo", default=str(REPO), help="model repository to copy (default: this checkout's)")
    parser.add_argument("--tool-dir", default=str(DEFAULT_TOOL_DIR),
                        help="where perf_analyzer is installed (default: .cache/tools/perf_analyzer)")
    parser.add_argument("--measurement-interval", type=int, default=None, metavar="MS",
                        help="shortest perf_analyzer window in ms (default: 3000, --quick 500)")
    parser.add_argument("--stability-percentage", type=float, default=None, metavar="PCT",
                        help="perf_analyzer stability rule in %% (default: 25; --quick: not checked)")
    parser.add_argument("--url", action="append", default=[], metavar="URL",
                        help="measure a running server this command did not start: grpc://host:port (perf_analyzer) "
                             "and/or http://host:port, or host:port (protocol found by asking); it must serve the "
                             "benchmark repository (--write-repository). Repeat for HTTP and gRPC")
    parser.add_argument("--write-repository", default=None, metavar="DIR",
                        help="only write the benchmark repository (model_repository plus the benchmark variants) "
                             "to DIR, to serve it in your own Triton for --url")
    parser.add_argument("--from-results", default=None, metavar="JSON",
                        help="only re-render benchmarks.md and the plots from a results.json")
    return parser


def _command_line(args: argparse.Namespace) -> str:
    parts = ["python -m orchestrator.tooling.bench"]
    if getattr(args, "quick", False):
        parts.append("--quick")
    parts.append(f"--out {shlex.quote(str(getattr(args, 'out', 'docs')))}")
    for url in getattr(args, "url", None) or []:
        parts.append(f"--url {shlex.quote(url)}")
    for opt in ("measurement_interval", "stability_percentage"):
        v = getattr(args, opt, None)
        if v is not None:
            parts.append(f"--{opt.replace('_', '-')} {v:g}")
    return " ".join(parts)


def bench_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator bench``; returns 0 on success, 1 on BenchError/ServerError (message on stderr).

    Goals not met do not change the exit status: the benchmark measures, it does not judge.
    """
    from orchestrator.tooling.server import ServerError

    try:
        if getattr(args, "from_results", None):
            results = json.loads(Path(args.from_results).read_text())
            report = write_outputs(results, Path(args.out))
            print(f"wrote {report}")
            return 0
        if getattr(args, "write_repository", None):
            from orchestrator.tooling.bench.variants import make_bench_repository

            dest = make_bench_repository(Path(args.write_repository), getattr(args, "repo", REPO))
            print(f"wrote the benchmark repository to {dest}")
            return 0
        quick = bool(getattr(args, "quick", False))
        base = QUICK_SETTINGS if quick else FULL_SETTINGS
        changes = {}
        if getattr(args, "measurement_interval", None):
            changes["measurement_interval_ms"] = int(args.measurement_interval)
        if getattr(args, "stability_percentage", None):
            changes.update(stability_percentage=float(args.stability_percentage), check_stability=True, fallback=True)
        settings = PASettings(**{**asdict(base), **changes})
        results = run_benchmark(
            getattr(args, "out", "docs"), quick=quick, repo=getattr(args, "repo", REPO),
            tool_dir=getattr(args, "tool_dir", DEFAULT_TOOL_DIR), settings=settings, command=_command_line(args),
            urls=getattr(args, "url", None) or [],
        )
    except (BenchError, ServerError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {Path(args.out) / 'benchmarks.md'} and {Path(args.out) / 'bench'}/ in {results['wall_s']:.0f} s")
    for g in results["goals"]:
        v = g["value"]
        shown = "n/a" if v is None else f"{v:.2f}"
        print(f"  {g['goal']}: {shown} ({g['op']} {g['bound']:g}) -> {met_label(g['met']).strip('*')}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m orchestrator.tooling.bench [--quick] [--out docs/results]``."""
    parser = add_bench_arguments(argparse.ArgumentParser(prog="python -m orchestrator.tooling.bench", description="Benchmarks: router against ensemble and the raw ONNX model, with perf_analyzer."))
    return bench_command(parser.parse_args(argv))


