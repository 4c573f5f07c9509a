"""``orchestrator soak``: run the fault-injection soak, print the numbers, write the report.

Exit status: 0 when no response was lost, duplicated, mismatched or wrong; 1 when one
was; 2 when the soak could not run (no server, no healthy reference, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.tooling.errors import ToolingError


def add_soak_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator soak`` options to ``parser`` (returned)."""
    parser.add_argument("--short", action="store_true",
                        help="the short version that runs in `make test` (under a minute) instead of the full one (about 3 minutes)")
    parser.add_argument("--repo", default=None, help="model repository to copy (default: the project's model_repository)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="write DIR/soak/report.json and DIR/soak/report.md (make soak: .cache/docs; SOAK_OUT=docs/results: the committed ones)")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="client threads per protocol (HTTP and gRPC)")
    parser.add_argument("--max-duration", type=float, default=None, metavar="S", help="stop after S seconds of traffic")
    parser.add_argument("--max-requests", type=int, default=None, metavar="N", help="stop after N requests")
    parser.add_argument("--seed", type=int, default=None, help="seed for the texts and requests (default 0)")
    parser.add_argument("--url", action="append", default=[], metavar="URL",
                        help="soak a running server this command did not start: --url http://host:port --url "
                             "grpc://host:port (or host:port, protocol found by asking); the fault steps that need "
                             "its processes or change its models are not run (the report says which and why)")
    parser.add_argument("--quiet", action="store_true", help="print only the summary, not the timeline")
    parser.add_argument("--front-door", action="store_true",
                        help="send the clients' requests through the front door (nginx, docs/guides/front-door.md); needs nginx")
    return parser


def config_from_args(args: argparse.Namespace):
    """The :class:`~orchestrator.tooling.soak.runner.SoakConfig` the options ask for."""
    from orchestrator.tooling.soak.runner import FULL, SHORT

    config = SHORT if getattr(args, "short", False) else FULL
    changes = {}
    if getattr(args, "threads", None):
        changes.update(http_threads=args.threads, grpc_threads=args.threads)
    if getattr(args, "max_duration", None):
        changes["max_duration_s"] = args.max_duration
    if getattr(args, "max_requests", None):
        changes["max_requests"] = args.max_requests
    if getattr(args, "front_door", False):
        changes["front_door"] = True
    if getattr(args, "seed", None) is not None:
        changes["seed"] = args.seed
    return dataclasses.replace(config, **changes)


def soak_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator soak`` (see the module doc for the exit status)."""
    from orchestrator.tooling.server import ServerError
    from orchestrator.tooling.soak.report import print_summary, summarize, write_report
    from orchestrator.tooling.soak.runner import run_soak

    config = config_from_args(args)
    quiet = getattr(args, "quiet", False)
    try:
        result = run_soak(config, Path(args.repo) if getattr(args, "repo", None) else None,
                          log=(lambda line: None) if quiet else (lambda line: print(line, flush=True)),
                          urls=getattr(args, "url", None) or [])
    except (ToolingError, ServerError, OSError, ValueError) as exc:
        print(f"error: soak could not run: {exc}", file=sys.stderr)
        return 2
    summary = summarize(result, command=shlex.join(["orchestrator", "soak", *getattr(args, "argv", [])]))
    print_summary(summary)
    if getattr(args, "out", None):
        paths = write_report(summary, Path(args.out))
        print(f"report: {paths['md']} and {paths['json']}")
    return 1 if summary["failed"] else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m orchestrator.tooling.soak [options]``."""
    parser = add_soak_arguments(argparse.ArgumentParser(prog="orchestrator soak", description=__doc__))
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return soak_command(args)
