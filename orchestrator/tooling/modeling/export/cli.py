"""The ``orchestrator export`` command line (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.tooling.modeling.contract import ExportError
from orchestrator.tooling.modeling.export.run import ExportResult, export_checkpoint, fp16_from_onnx, read_texts
from orchestrator.tooling.modeling.export.validate import DEFAULT_OPSET, FP16_TOLERANCE
from orchestrator.tooling.paths import default_model_repository


def _default_repo() -> Path:
    return default_model_repository()


def add_export_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator export`` options to ``parser`` (returned for chaining)."""
    parser.add_argument("source", nargs="?", default=None,
                        help="Hugging Face checkpoint directory (or hub id, when the hub is reachable)")
    parser.add_argument("--name", default=None,
                        help="model name in the repository (default: classifier; with --fp16-from-onnx: MODEL_fp16)")
    parser.add_argument("--repo", default=None,
                        help="model repository (default: ./model_repository, else the one in this checkout)")
    parser.add_argument("--fp16", action="store_true", help="also write <name>_fp16 (float16 weights, fp32 io)")
    parser.add_argument("--fp16-from-onnx", metavar="MODEL", default=None,
                        help="no SOURCE: convert <repo>/MODEL/1/model.onnx to <repo>/MODEL_fp16 "
                             "(or --name, when given) and validate it against the fp32 model")
    parser.add_argument("--max-length", type=int, default=None,
                        help="truncation length in tokens (default: the tokenizer's model_max_length)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default: %(default)s)")
    parser.add_argument("--positive-label", default=None, metavar="LABEL",
                        help="binary checkpoints with 2 labels: the positive one (default: a label named "
                             "'positive' in any case, else the second)")
    parser.add_argument("--fp16-tolerance", type=float, default=FP16_TOLERANCE,
                        help="max abs logit difference accepted for fp16 (default: %(default)s)")
    parser.add_argument("--validation-texts", type=Path, default=None,
                        help="UTF-8 file, one text a line, for the export check (default: built-in samples)")
    parser.add_argument("--revision", default=None, help="hub revision (hub ids only)")
    parser.add_argument("--no-tensorrt", action="store_true", help="skip the TensorRT plan even if trtexec exists")
    parser.add_argument("--router", action="store_true",
                        help="also write NAME_router: the shipped router with a starter policy for this model "
                             "(any head; empty texts, chunking at the model's max_length)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    return parser


def _summary(result: ExportResult, console) -> None:
    from rich.table import Table

    table = Table(title=f"orchestrator export: {', '.join(result.variants)}")
    for col in ("variant", "check", "max abs logit diff", "bound"):
        table.add_column(col)
    for variant, v in result.validation.items():
        for k, d in v.items():
            if k.startswith("max_abs"):
                table.add_row(variant, k.replace("max_abs_diff_", ""), f"{d:.3g}", f"{v['tolerance']:g}")
    console.print(table)
    total = sum(result.files.values())
    if result.head:
        console.print(f"head: {result.head['kind']}, labels {result.head['labels']}, tokenizer model "
                      f"{result.head['tokenizer']}, max_length {result.head['max_length']}")
    console.print(f"models: {', '.join(result.models)}")
    weights = {p: n for p, n in result.files.items() if p.endswith(("/model.onnx", "/model.plan"))}
    console.print(f"wrote {len(result.files)} files, {total:,} bytes under {result.repo} "
                  f"({', '.join(f'{p} {n:,}' for p, n in weights.items())})")


def export_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator export``. Returns 0 on success, 1 on :class:`ExportError` (message on
    stderr), 2 on bad arguments."""
    from rich.console import Console

    console = Console(stderr=True)
    repo = Path(args.repo) if getattr(args, "repo", None) else _default_repo()
    texts = None
    try:
        if getattr(args, "validation_texts", None):
            texts = read_texts(args.validation_texts)
        trt = False if getattr(args, "no_tensorrt", False) else None
        if args.fp16_from_onnx:
            if args.source:
                print("error: give SOURCE or --fp16-from-onnx, not both", file=sys.stderr)
                return 2
            result = fp16_from_onnx(repo, args.fp16_from_onnx, out_name=args.name, texts=texts,
                                    fp16_tolerance=args.fp16_tolerance, tensorrt=trt,
                                    quiet=args.quiet, console=console)
        else:
            if not args.source:
                print("error: SOURCE (checkpoint directory or hub id) or --fp16-from-onnx MODEL is required",
                      file=sys.stderr)
                return 2
            result = export_checkpoint(
                args.source, repo, args.name or "classifier", fp16=args.fp16, max_length=args.max_length, opset=args.opset,
                positive_label=args.positive_label, texts=texts, fp16_tolerance=args.fp16_tolerance,
                tensorrt=trt, revision=args.revision, quiet=args.quiet, console=console,
            )
        if getattr(args, "router", False) and not args.fp16_from_onnx:
            _add_router(result, repo, console)
    except ExportError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        _summary(result, console)
    _warn_env(repo, result.models, console)
    return 0


def _add_router(result: ExportResult, repo: Path, console) -> None:
    from orchestrator.runtime.routing.heads import read_head
    from orchestrator.tooling.modeling.export.starter import write_starter_router

    router = write_starter_router(repo, result.name, read_head(repo / result.name))
    result.models.append(router.name)
    result.files.update({str(p.relative_to(repo)): p.stat().st_size for p in sorted(router.rglob("*"))
                         if p.is_file() and "__pycache__" not in p.parts})
    console.print(f"router: {router.name} (policy {router / 'policy.yaml'}). A running server takes the new models when "
                  "restarted (`orchestrator serve` loads every model of the repository) or through a repository load "
                  "(README, 'Bring your own model')", highlight=False)


def _warn_env(repo: Path, models, console) -> None:
    """Say when the repository has an env installed (configs/env.pbtxt) but the new models lack it."""
    from orchestrator.tooling.env.install import env_install_command, models_missing_env_config
    from orchestrator.tooling.errors import ToolingError

    try:
        missing = [m for m in models_missing_env_config(repo) if m in models]
    except ToolingError:
        return
    if missing:
        console.print(f"warning: an execution env is installed in {repo} (configs/env.pbtxt), but not in the models just "
                      f"written ({', '.join(missing)}): with --model-config-name=env Triton would load their config.pbtxt "
                      f"instead. Install it: {env_install_command(repo, missing)}", highlight=False)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.tooling.modeling.export", description="Put a Hugging Face sequence classifier into the model repository.")
    add_export_arguments(p)
    return export_command(p.parse_args(argv))
