"""The ``orchestrator export`` command line (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.tooling.modeling.contract import ExportError
from orchestrator.tooling.modeling.export.run import ExportResult, check_name, export_checkpoint, fp16_from_onnx, read_texts
from orchestrator.tooling.modeling.export.validate import DEFAULT_OPSET, FP16_TOLERANCE
from orchestrator.tooling.paths import default_model_repository


def _default_repo() -> Path:
    return default_model_repository()


def add_export_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator export`` options to ``parser`` (returned for chaining)."""
    parser.add_argument("source", nargs="?", default=None,
                        help="Hugging Face checkpoint directory (or hub id, when the hub is reachable)")
    parser.add_argument("--name", default=None,
                        help="model name in the repository (required with SOURCE; with --fp16-from-onnx, default MODEL_fp16)")
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
    parser.add_argument("--router-name", default=None, metavar="ROUTER",
                        help="with --router (implied): the router's model name, the name clients call "
                             "(default: NAME_router)")
    parser.add_argument("--replace", action="store_true",
                        help="replace the model directories of that name that exist (refused without it); "
                             "an edited router policy.yaml is kept, the new starter written beside it. All or nothing: "
                             "written beside the repository, checked, then moved in")
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


def export_command(args: argparse.Namespace) -> int:  # noqa: C901 (refusals first, then the export and its checks)
    """Run ``orchestrator export``. Returns 0 on success; 2 on bad arguments and on existing
    models without ``--replace`` (nothing written); 1 on :class:`ExportError` or when the
    export would leave a router unable to load (messages on stderr; nothing written: the
    export is staged beside the repository and moved in only once checked, :mod:`.guard`)."""
    from rich.console import Console

    from orchestrator.tooling.modeling.export import guard
    from orchestrator.tooling.modeling.export.starter import router_name

    console = Console(stderr=True)
    repo = Path(args.repo) if getattr(args, "repo", None) else _default_repo()
    if args.fp16_from_onnx and args.source:
        print("error: give SOURCE or --fp16-from-onnx, not both", file=sys.stderr)
        return 2
    if not args.fp16_from_onnx and not args.source:
        print("error: SOURCE (checkpoint directory or hub id) or --fp16-from-onnx MODEL is required", file=sys.stderr)
        return 2
    if args.source and not args.name:
        print("error: --name NAME is required with SOURCE: the model's name in the repository "
              "(export never picks one, so it never replaces a model you did not name)", file=sys.stderr)
        return 2
    router_model = getattr(args, "router_name", None)
    if router_model and args.fp16_from_onnx:
        print("error: --router-name goes with SOURCE (--fp16-from-onnx writes no router)", file=sys.stderr)
        return 2
    router = (bool(getattr(args, "router", False)) or bool(router_model)) and not args.fp16_from_onnx
    name = args.name or f"{args.fp16_from_onnx}_fp16"
    router_model = router_model or router_name(name)
    texts = None
    try:
        if args.source:
            check_name(name)
            if router:
                check_name(router_model)
        planned = guard.planned_models(name, args.fp16, router, router_model) if args.source else [name]
        if router and planned.count(router_model) > 1:
            print(f"error: --router-name {router_model} is one of the models the export writes ({', '.join(planned[:-1])})",
                  file=sys.stderr)
            return 2
        present = guard.existing(repo, planned) if repo.is_dir() else []
        if present and not getattr(args, "replace", False):
            variants = [name] + ([f"{name}_fp16"] if args.fp16 else [])
            repointed = guard.ensembles_calling(repo, variants, skip=planned) if args.source else []
            print(guard.replace_refusal(repo, present, repointed), file=sys.stderr)
            return 2
        if not repo.is_dir():
            raise ExportError(f"model repository {repo} does not exist")
        before = guard.router_states(repo)
        previous = _head_of(repo / name) if args.source else None
        if getattr(args, "validation_texts", None):
            texts = read_texts(args.validation_texts)
        stage = guard.stage_repository(repo, planned)
    except ExportError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot write the export beside {repo} (it is written there, checked, then moved in): {e}", file=sys.stderr)
        return 1
    try:
        trt = False if getattr(args, "no_tensorrt", False) else None
        if args.fp16_from_onnx:
            result = fp16_from_onnx(stage, args.fp16_from_onnx, out_name=args.name, texts=texts,
                                    fp16_tolerance=args.fp16_tolerance, tensorrt=trt,
                                    quiet=args.quiet, console=console)
        else:
            result = export_checkpoint(
                args.source, stage, name, fp16=args.fp16, max_length=args.max_length, opset=args.opset,
                positive_label=args.positive_label, texts=texts, fp16_tolerance=args.fp16_tolerance,
                tensorrt=trt, revision=args.revision, quiet=args.quiet, console=console,
            )
        if router:
            _add_router(result, stage, console, [previous] if previous else [], router_model, shown=repo)
        after = {r: [e.replace(str(stage), str(repo)) for e in errors] for r, errors in guard.router_states(stage).items()}
    except BaseException as e:
        guard.discard(stage)
        if not isinstance(e, ExportError):
            raise
        print(f"error: {type(e).__name__}: {str(e).replace(str(stage), str(repo))}", file=sys.stderr)
        print(f"nothing was changed in {repo}", file=sys.stderr)
        return 1
    lines = guard.breakage_lines(repo, before, after)
    if guard.newly_broken(before, after):
        guard.discard(stage)
        for line in lines:
            print(line, file=sys.stderr)
        print(f"nothing was changed in {repo}: the export was written beside it, checked, and removed", file=sys.stderr)
        return 1
    guard.swap_in(repo, stage)
    result.repo = str(repo)
    if not args.quiet:
        _summary(result, console)
    _warn_env(repo, result.models, console)
    if name in present:  # a re-export: running routers keep the old tokenizer and head
        rewritten = [router_model] if router else []  # told above what it reads now
        _note_users(repo, result, rewritten + [r for r, errors in after.items() if errors], console)
    for line in lines:
        print(line, file=sys.stderr)
    return 0


def _head_of(model_dir: Path):
    """The head of the model in ``model_dir`` before the export; None without one."""
    from orchestrator.runtime.routing.heads import HeadError, read_head

    try:
        return read_head(model_dir) if model_dir.is_dir() else None
    except HeadError:
        return None


def _add_router(result: ExportResult, repo: Path, console, previous=(), router_model: Optional[str] = None,
                shown: Optional[Path] = None) -> None:
    """Write the starter router into ``repo``; messages name its place in ``shown`` (the
    repository it is moved into; default ``repo``)."""
    from orchestrator.runtime.routing.heads import read_head
    from orchestrator.tooling.modeling.export.starter import STARTER_BESIDE, write_starter_router

    router = write_starter_router(repo, result.name, read_head(repo / result.name), previous=previous, name=router_model)
    result.models.append(router.name)
    result.files.update({str(p.relative_to(repo)): p.stat().st_size for p in sorted(router.rglob("*"))
                         if p.is_file() and "__pycache__" not in p.parts})
    final = Path(shown or repo) / router.name
    if (router / STARTER_BESIDE).is_file():
        console.print(f"router: {router.name}: kept your edited {final / 'policy.yaml'}; the starter policy for the new "
                      f"model is beside it in {final / STARTER_BESIDE}", highlight=False, soft_wrap=True)
    console.print(f"router: {router.name} (policy {final / 'policy.yaml'}). A running server takes the new models when "
                  "restarted (`orchestrator serve` loads every model of the repository) or through a repository load "
                  "(README, 'Route your own model')", highlight=False, soft_wrap=True)


def _note_users(repo: Path, result: ExportResult, skip, console) -> None:
    """Name the routers (but ``skip``) that use the re-exported model."""
    from orchestrator.tooling.modeling.export import guard

    users = guard.routers_using(repo, result.variants, skip=skip)
    if users:
        which = f"routers {', '.join(users)} use" if len(users) > 1 else f"router {users[0]} uses"
        console.print(f"note: {which} {', '.join(result.variants)}: a running server serves "
                      f"{'them' if len(users) > 1 else 'it'} with the old tokenizer and head until loaded again (unload "
                      "and load after the new models), or restart the server", highlight=False, soft_wrap=True)


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
