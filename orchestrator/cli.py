"""The ``orchestrator`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def _classify(args) -> int:
    from tritonclient.utils import InferenceServerException

    from orchestrator.client import classify, format_prediction

    try:
        predictions = classify(args.texts, model=args.model, url=args.url, protocol=args.protocol, threshold=args.threshold)
    except InferenceServerException as exc:
        print(f"error: {args.model}: {exc}", file=sys.stderr)
        return 1
    for pred in predictions:
        print(format_prediction(pred))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from orchestrator.server import add_serve_arguments, serve_command

    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the embedded Triton server on the model repository")
    add_serve_arguments(serve)
    serve.set_defaults(func=serve_command)

    cls = sub.add_parser("classify", help="classify texts through a running server")
    cls.add_argument("texts", nargs="+", help="texts to classify (one line of output each)")
    cls.add_argument("--model", default="router", help="router (default) or ensemble")
    cls.add_argument("--url", default=None, help="host:port (default 127.0.0.1:8000 http, :8001 grpc)")
    cls.add_argument("--protocol", choices=("http", "grpc"), default="http")
    cls.add_argument("--threshold", type=float, default=0.5, help="decision threshold in [0, 1]")
    cls.set_defaults(func=_classify)

    from orchestrator.policy_cli import add_policy_arguments, policy_command

    pol = sub.add_parser("policy", help="check a routing policy file, or show the one a router runs")
    add_policy_arguments(pol)
    pol.set_defaults(func=policy_command)

    from orchestrator.doctor import add_doctor_arguments, doctor_command
    from orchestrator.envtools import add_env_arguments, add_stub_arguments, env_command, stub_command

    env = sub.add_parser("env", help="build, verify and install the models' execution environment")
    add_env_arguments(env)
    env.set_defaults(func=env_command)
    stub = sub.add_parser("stub", help="Python-backend stub for another Python version")
    add_stub_arguments(stub)
    stub.set_defaults(func=stub_command)
    doc = sub.add_parser("doctor", help="check each Python model's env, stub and libpython")
    add_doctor_arguments(doc)
    doc.set_defaults(func=doctor_command)

    from orchestrator.export import add_export_arguments, export_command
    from orchestrator.parity import add_parity_arguments, parity_command

    exp = sub.add_parser("export", help="export a Hugging Face classifier (and an fp16 variant) into the model repository")
    add_export_arguments(exp)
    exp.set_defaults(func=export_command)
    par = sub.add_parser("parity", help="compare candidate classifiers with a reference: logits, thresholds, flips, recommendation")
    add_parity_arguments(par)
    par.set_defaults(func=parity_command)

    from orchestrator.bench import add_bench_arguments, bench_command

    bench = sub.add_parser("bench", help="perf_analyzer benchmark: router vs ensemble vs the raw model (docs/benchmarks.md)")
    add_bench_arguments(bench)
    bench.set_defaults(func=bench_command)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
