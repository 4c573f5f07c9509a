"""The ``orchestrator`` command line."""

# Only the console script imports this module; the command modules share helpers through
# orchestrator.tooling.cliutil, so none of them imports cli (no import circle).

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from orchestrator.tooling.cliutil import add_subcommand


def _classify(args) -> int:
    from tritonclient.utils import InferenceServerException

    from orchestrator.tooling.client import ServerUnavailable, classify, format_prediction

    try:
        predictions = classify(args.texts, model=args.model, url=args.url, protocol=args.protocol, threshold=args.threshold)
    except ServerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except InferenceServerException as exc:
        print(f"error: {args.model}: {exc.message() if hasattr(exc, 'message') else exc}", file=sys.stderr)
        return 1
    for pred in predictions:
        print(format_prediction(pred))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from orchestrator.tooling.serve import add_serve_arguments, serve_command

    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    add_subcommand(sub, "serve", "run the embedded Triton server on the model repository", add_serve_arguments, serve_command)

    def add_classify_arguments(cls):
        cls.add_argument("texts", nargs="+", help="texts to classify (one line of output each)")
        cls.add_argument("--model", default="router", help="router (default), ensemble or NAME_ensemble")
        cls.add_argument("--url", default=None, help="host:port (default 127.0.0.1:8000 http, :8001 grpc)")
        cls.add_argument("--protocol", choices=("http", "grpc"), default="http")
        cls.add_argument("--threshold", type=float, default=0.5, help="decision threshold in [0, 1]")

    add_subcommand(sub, "classify", "classify texts through a running server", add_classify_arguments, _classify)

    from orchestrator.tooling.bench.cli import add_bench_arguments, bench_command
    from orchestrator.tooling.env.commands import add_env_arguments, add_stub_arguments, env_command, stub_command
    from orchestrator.tooling.env.doctor import add_doctor_arguments, doctor_command
    from orchestrator.tooling.modeling.export import add_export_arguments, export_command
    from orchestrator.tooling.modeling.parity import add_parity_arguments, parity_command
    from orchestrator.tooling.modeling.parity.calibration import add_calibrate_arguments, calibrate_command
    from orchestrator.tooling.policy_cli import add_policy_arguments, policy_command
    from orchestrator.tooling.soak.command import add_soak_arguments, soak_command
    from orchestrator.tooling.tune import add_tune_arguments, tune_command

    add_subcommand(sub, "policy", "check a routing policy file, or show the one a router runs", add_policy_arguments, policy_command)
    add_subcommand(sub, "env", "build, verify and install the models' execution environment", add_env_arguments, env_command)
    add_subcommand(sub, "stub", "Python-backend stub for another Python version", add_stub_arguments, stub_command)
    add_subcommand(sub, "doctor", "check each Python model's env, stub and libpython", add_doctor_arguments, doctor_command)
    add_subcommand(sub, "export", "export a Hugging Face classifier (and an fp16 variant) into the model repository",
                   add_export_arguments, export_command)
    add_subcommand(sub, "parity", "compare candidate classifiers with a reference: logits, thresholds, flips, recommendation",
                   add_parity_arguments, parity_command)
    add_subcommand(sub, "calibrate", "fit temperature scaling of a classifier on labeled texts (head.json calibration)",
                   add_calibrate_arguments, calibrate_command)
    add_subcommand(sub, "tune", "choose a policy's cascade margins and chunk stop_margin from labeled texts (curves, tuned policy)",
                   add_tune_arguments, tune_command)
    add_subcommand(sub, "bench", "perf_analyzer benchmark: router vs ensemble vs the raw model (docs/results/benchmarks.md)",
                   add_bench_arguments, bench_command)
    add_subcommand(sub, "soak", "fault-injection soak of the router on its own server (docs/results/reliability.md)", add_soak_arguments, soak_command)
    from orchestrator.tooling.gpu_check import add_gpu_check_arguments, gpu_check_command

    add_subcommand(sub, "gpu-check", "the shipped configs on a GPU against the CPU answers (no GPU: not run)",
                   add_gpu_check_arguments, gpu_check_command)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
