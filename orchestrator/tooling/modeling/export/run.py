"""The two exports: a torch checkpoint (:func:`export_checkpoint`) and an fp16 copy of an
ONNX classifier (:func:`fp16_from_onnx`), with their progress display and records."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.runtime.routing.heads import BINARY, LEGACY, Head, HeadError, head_from_hf_config, read_head
from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.files import sha256_file, write_atomic
from orchestrator.tooling.modeling.configs import export_comment, write_classifier_configs
from orchestrator.tooling.modeling.contract import ExportError, SourceError, check_onnx_contract, ort_session
from orchestrator.tooling.modeling.export import pipeline
from orchestrator.tooling.modeling.export.convert import build_tensorrt_plan, convert_to_fp16
from orchestrator.tooling.modeling.export.source import (
    check_tokenizer_files,
    default_max_length,
    resolve_source,
    save_tokenizer,
    torch_export,
)
from orchestrator.tooling.modeling.export.validate import (
    DEFAULT_OPSET,
    FP16_TOLERANCE,
    FP32_TOLERANCE,
    SAMPLE_TEXTS,
    check_variant,
    ort_logits,
    staging,
)

ADAPTER = '"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.onnx_classifier."""\n\n' \
          "from orchestrator.runtime.models.onnx_classifier import TritonPythonModel  # noqa: F401\n"


@dataclass
class ExportResult:
    """What one export wrote and measured (also written as ``<name>/export.json``).

    ``validation``: per variant (``fp32``, ``fp16``) the max abs logit differences, in logits.
    ``files``: repository-relative path -> bytes. ``head``: the head written (``head.json``
    as a dict). ``models``: the model directories written. ``notes``: what changed
    around them (ensembles re-pointed, routers checked), one line each.
    """

    name: str
    repo: str
    source: str
    num_labels: int
    max_length: int
    opset: Optional[int]
    variants: list[str]
    validation: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    tensorrt: Optional[dict] = None
    head: Optional[dict] = None
    models: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- progress


class _Steps:
    """Rich progress: one line per step with a spinner, then a check mark (or nothing if quiet)."""

    def __init__(self, quiet: bool = False, console=None):
        self.quiet = quiet
        self.console = console
        self._progress = None

    def __enter__(self):
        if not self.quiet:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.console = self.console or Console(stderr=True)
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                console=self.console, transient=False,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)

    @contextlib.contextmanager
    def step(self, description: str):
        if self._progress is None:
            yield
            return
        task = self._progress.add_task(description, total=1)
        try:
            yield
        except BaseException:
            self._progress.update(task, completed=1, description=f"[red]x[/red] {description}")
            raise
        self._progress.update(task, completed=1, description=f"[green]ok[/green] {description}")

    def note(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)


# --------------------------------------------------------------------------- helpers


def write_model_configs(
    model_dir: Path, num_labels: int, comment: Optional[str] = None, tensorrt: bool = False,
    head: Optional[Head] = None,
) -> list[Path]:
    """Write or update ``config.pbtxt``, ``configs/embedded.pbtxt`` (and with ``tensorrt``,
    ``configs/tensorrt.pbtxt``), ``1/model.py`` and, with ``head``, ``head.json`` of the
    classifier in ``model_dir``.

    The configs come from :func:`orchestrator.tooling.modeling.configs.write_classifier_configs`
    (the model name is the directory name; ``num_labels`` becomes the ``logits`` dims); the
    warmup ids from the tokenizer model the head names (``head``, else the directory's
    ``head.json``, else the legacy ``tokenizer``). Returns the paths written. Raises
    :class:`ExportError` when an existing config is invalid, names another model or has no
    single FP32 ``logits`` output.
    """
    try:
        served = head or read_head(model_dir) or LEGACY
        tokenizer_dir = model_dir.parent / served.tokenizer / "1"  # warmup ids in the model's own vocabulary
        written = write_classifier_configs(model_dir, num_labels, comment, tensorrt=tensorrt,
                                           tokenizer_dir=tokenizer_dir if tokenizer_dir.is_dir() else None, head=head)
    except (ConfigError, HeadError) as e:
        raise ExportError(str(e)) from None
    adapter = model_dir / "1" / "model.py"
    if not adapter.is_file() or adapter.read_text() != ADAPTER:
        adapter.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(adapter, ADAPTER.encode("utf-8"), 0o644)
    written.append(adapter)
    return written


def _remove_stale_plan(model_dir: Path, steps: "_Steps") -> None:
    """Delete ``1/model.plan`` and ``configs/tensorrt.pbtxt`` left by an earlier export."""
    stale = [p for p in (model_dir / "1" / "model.plan", model_dir / "configs" / "tensorrt.pbtxt") if p.is_file()]
    for p in stale:
        p.unlink()
    if stale:
        steps.note(f"[yellow]note:[/yellow] removed {', '.join(map(str, stale))} (built for the old model; "
                   "no trtexec here to rebuild it)")


def _record(result: ExportResult, model_dir: Path, extra: dict) -> None:
    import onnxruntime

    rec = {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "tool": "orchestrator export",
        **{k: v for k, v in extra.items() if k not in ("num_labels", "max_length")},  # placed below
        "num_labels": result.num_labels,
        "max_length": result.max_length,
        "onnxruntime": onnxruntime.__version__,
        "files": {
            str(p.relative_to(model_dir)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted((model_dir / "1").glob("model.*")) if p.suffix in (".onnx", ".plan")
        },
    }
    write_atomic(model_dir / "export.json", (json.dumps(rec, indent=2) + "\n").encode("utf-8"), 0o644)


#: files in a model directory that `env install` wrote, not the export (hard links to one
#: tarball of hundreds of MB: counting them made a 0.2 MB model "414,047,550 bytes written")
_NOT_EXPORTED = ("triton_env", "triton_python_backend_stub")


def _files(repo: Path, dirs: Sequence[Path]) -> dict:
    """Repository-relative path -> bytes of the files the export wrote into ``dirs``."""
    out = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(_NOT_EXPORTED) \
                    and p.relative_to(d).as_posix() != "configs/env.pbtxt":
                out[str(p.relative_to(repo))] = p.stat().st_size
    return out


def read_texts(path: Optional[Path]) -> list[str]:
    if path is None:
        return list(SAMPLE_TEXTS)
    texts = [ln for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not texts:
        raise ExportError(f"{path}: no texts")
    return texts


# --------------------------------------------------------------------------- exports


RESERVED_NAMES = ("tokenizer", "postprocess", "ensemble", "router")


def check_name(name: str) -> None:
    """Raise :class:`ExportError` for a name ``export_checkpoint`` refuses."""
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name) or name in RESERVED_NAMES:
        raise ExportError(f"bad model name {name!r} (letters, digits, _ . -; not one of {', '.join(RESERVED_NAMES)})")


def _load_checkpoint(ckpt: Path):
    """``(config, tokenizer, model)`` of a checkpoint directory (eager attention, eval mode).
    Raises :class:`SourceError`."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Loading weights" bar would break the display
    try:
        config = AutoConfig.from_pretrained(str(ckpt))
        tok = AutoTokenizer.from_pretrained(str(ckpt))
        model = AutoModelForSequenceClassification.from_pretrained(str(ckpt), attn_implementation="eager").eval()
    except (OSError, ValueError, KeyError) as e:
        raise SourceError(f"{ckpt}: cannot load a sequence classifier and tokenizer: {e}") from e
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return config, tok, model


def checkpoint_head(ckpt: Path, config, tok, name: str, max_length: int, positive_label: Optional[str]) -> Head:
    """The head ``orchestrator export`` writes for ``name`` (tokenizer model
    ``<name>_tokenizer``). Raises :class:`ExportError`: a head the router cannot serve
    (regression), ``positive_label`` on a checkpoint that is not binary or not one of its
    labels, a tokenizer with ids beyond the model's vocabulary or without a pad token."""
    if tok.pad_token_id is None:
        raise ExportError(f"{ckpt}: the tokenizer has no pad token; batches cannot be padded")
    vocab = getattr(config, "vocab_size", None)
    if vocab and len(tok) > vocab:
        raise ExportError(f"{ckpt}: the tokenizer has {len(tok)} tokens but the model's embedding only {vocab}: "
                          "they were not trained together")
    try:
        head = head_from_hf_config(config, pipeline.tokenizer_name(name), tok.pad_token_id, max_length, positive_label)
    except HeadError as e:
        raise ExportError(f"{ckpt}: {e}; the router and the postprocess model serve classifiers only "
                          "(binary, multiclass, multilabel)") from None
    if positive_label is not None and head.kind != BINARY:
        raise ExportError(f"--positive-label {positive_label!r}: only for binary checkpoints (1 or 2 labels); "
                          f"{ckpt} has a {head.describe()} head")
    return head


def export_checkpoint(  # noqa: C901 (the export's steps in order, each validated)
    source: str,
    repo: os.PathLike | str,
    name: str = "classifier",
    *,
    fp16: bool = False,
    max_length: Optional[int] = None,
    opset: int = DEFAULT_OPSET,
    positive_label: Optional[str] = None,
    texts: Optional[Sequence[str]] = None,
    fp16_tolerance: float = FP16_TOLERANCE,
    tensorrt: Optional[bool] = None,
    revision: Optional[str] = None,
    quiet: bool = False,
    console=None,
) -> ExportResult:
    """Export the checkpoint ``source`` into ``repo`` as model ``name`` (and ``name_fp16``),
    with its tokenizer, postprocess and ensemble models.

    See the module docstring for the files and checks. ``max_length`` (tokens, the
    truncation length written into the tokenizer): default from :func:`default_max_length`;
    must not exceed the checkpoint's ``max_position_embeddings``. ``positive_label``: the
    positive label of a two-label checkpoint (default: a label named ``positive``, else the
    second). ``texts``: validation texts (default :data:`SAMPLE_TEXTS`). ``tensorrt``:
    build a plan (default: when ``trtexec`` is on ``PATH``).

    Existing model directories of those names are updated in place (``orchestrator
    export`` refuses that without ``--replace``: :mod:`.guard`).

    Raises :class:`SourceError` (no checkpoint, no tokenizer files), :class:`ExportError`
    (a head the router cannot serve, bad arguments), :class:`ExportValidationError`.
    """
    repo = Path(repo)
    if not repo.is_dir():
        raise ExportError(f"model repository {repo} does not exist")
    check_name(name)
    tensorrt = shutil.which("trtexec") is not None if tensorrt is None else tensorrt
    texts = list(texts) if texts is not None else list(SAMPLE_TEXTS)
    with _Steps(quiet, console) as steps:
        with steps.step(f"resolve {source}"):
            ckpt = resolve_source(source, revision)
            check_tokenizer_files(ckpt)
        with steps.step("load model and tokenizer (transformers)"):
            import torch

            config, tok, model = _load_checkpoint(ckpt)
            num_labels = int(model.config.num_labels)
            positions = getattr(config, "max_position_embeddings", None)
            max_length = int(max_length or default_max_length(tok, config))
            if max_length < 2 or (positions and max_length > positions):
                raise ExportError(f"--max-length {max_length} outside [2, max_position_embeddings={positions}]")
            head = checkpoint_head(ckpt, config, tok, name, max_length, positive_label)

        def torch_ref(ids, mask):
            with torch.inference_mode():
                out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits
            return out.float().numpy()

        model_dir = repo / name
        fp16_dir = repo / f"{name}_fp16"
        onnx_path = model_dir / "1" / "model.onnx"
        fp16_path = fp16_dir / "1" / "model.onnx"
        # new files are validated under a hidden name and moved into place only when all pass
        new_dirs = [d for d in (model_dir, model_dir / "1", fp16_dir, fp16_dir / "1") if not d.exists()]
        staged = {onnx_path: staging(onnx_path)}
        if fp16:
            staged[fp16_path] = staging(fp16_path)
        ok = False
        try:
            with steps.step(f"export ONNX fp32 (opset {opset}) -> {onnx_path}"):
                torch_export(model, tok, staged[onnx_path], max_length, opset)
                check_onnx_contract(staged[onnx_path], num_labels)
            with steps.step(f"validate fp32 vs torch on {len(texts)} texts (< {FP32_TOLERANCE:g})"):
                val = {"fp32": check_variant("fp32", staged[onnx_path], torch_ref, tok, texts, max_length,
                                              FP32_TOLERANCE, "torch")}
            if fp16:
                with steps.step(f"convert to fp16 (keep_io_types) -> {fp16_path}"):
                    convert_to_fp16(staged[onnx_path], staged[fp16_path])
                    check_onnx_contract(staged[fp16_path], num_labels)
                with steps.step(f"validate fp16 vs torch (<= {fp16_tolerance:g})"):
                    val["fp16"] = check_variant("fp16", staged[fp16_path], torch_ref, tok, texts, max_length,
                                                 fp16_tolerance, "torch")
            for final, tmp in staged.items():
                os.replace(tmp, final)
            ok = True
        finally:
            for tmp in staged.values():
                tmp.unlink(missing_ok=True)
            for d in reversed(new_dirs if not ok else []):  # leave no empty model directories behind
                if d.is_dir() and not any(d.iterdir()):
                    d.rmdir()
        # what export.json records, and the configs' provenance comment derives from
        provenance = {"source": str(source), "checkpoint": str(ckpt), "model_class": type(model).__name__,
                      "labels": list(head.labels), "opset": opset, "num_labels": num_labels, "max_length": max_length}
        variants = [name] + ([f"{name}_fp16"] if fp16 else [])
        tok_model = repo / head.tokenizer
        # the tokenizer first: the classifiers' warmup ids come from it
        with steps.step(f"tokenizer model {head.tokenizer} (files in {head.tokenizer}/1)"):
            save_tokenizer(tok, tok_model / "1", max_length, texts)
        dirs = [tok_model]
        trt = {}
        for d, key in [(model_dir, "fp32")] + ([(fp16_dir, "fp16")] if fp16 else []):
            with steps.step(f"write configs and head.json of {d.name}"):
                write_model_configs(d, num_labels, export_comment({**provenance, "variant": key}),
                                    tensorrt=tensorrt, head=head)
            dirs.append(d)
        if not tensorrt:  # a plan from an earlier export would no longer match the new model
            for d in [model_dir] + ([fp16_dir] if fp16 else []):
                _remove_stale_plan(d, steps)
        if tensorrt:
            for d, is16 in [(model_dir, False)] + ([(fp16_dir, True)] if fp16 else []):
                with steps.step(f"TensorRT plan {d.name}/1/model.plan (trtexec)"):
                    trt[d.name] = build_tensorrt_plan(model_dir / "1" / "model.onnx", d / "1" / "model.plan",
                                                      max_length, is16)
        post = pipeline.postprocess_name(name)
        with steps.step(f"postprocess model {post} ({head.describe()})"):
            pipeline.write_postprocess(repo, post, head)
        dirs.append(repo / post)
        for variant in variants:
            ens = pipeline.ensemble_name(variant)
            with steps.step(f"ensemble {ens}: {head.tokenizer} -> {variant} -> {post}"):
                pipeline.write_ensemble(repo, ens, head.tokenizer, variant, post, head)
            dirs.append(repo / ens)
        notes = []
        skip = {pipeline.ensemble_name(v) for v in variants}
        for r in pipeline.repoint_ensembles(repo, variants, head.tokenizer, post, head, skip=skip):
            notes += [f"{r.path.relative_to(repo)}: steps re-pointed: {'; '.join(r.changes)}"] if r.changes else []
            notes += [f"warning: {p}" for p in r.problems]
        notes += [c.message if c.binds else f"warning: {c.message}" for c in pipeline.check_routers(repo, variants)]
        for note in notes:
            steps.note(note)
        result = ExportResult(
            name=name, repo=str(repo), source=str(source), num_labels=num_labels, max_length=max_length,
            opset=opset, variants=variants, validation=val, tensorrt=trt or None,
            head=json.loads(head.to_json()), models=[d.name for d in dirs], notes=notes,
        )
        for d, key in [(model_dir, "fp32")] + ([(fp16_dir, "fp16")] if fp16 else []):
            _record(result, d, {**provenance, "variant": key, "validation": val[key], "tensorrt": trt.get(d.name)})
        result.files = _files(repo, dirs)
    return result


def fp16_from_onnx(
    repo: os.PathLike | str,
    name: str,
    *,
    out_name: Optional[str] = None,
    texts: Optional[Sequence[str]] = None,
    fp16_tolerance: float = FP16_TOLERANCE,
    tensorrt: Optional[bool] = None,
    quiet: bool = False,
    console=None,
) -> ExportResult:
    """Convert ``<repo>/<name>/1/model.onnx`` to float16 as ``<repo>/<out_name>`` (default
    ``<name>_fp16``): model file, configs, adapter, ``export.json``.

    For models whose torch checkpoint was not kept (the demo models). Validated against the
    fp32 ONNX model (onnxruntime) on ``texts`` tokenized by the model's own tokenizer
    (the tokenizer model its ``head.json`` names, ``tokenizer`` without one): max abs
    logit difference <= ``fp16_tolerance``. The copy gets the same ``head.json``. Raises
    :class:`ExportError` (missing files, invalid head), :class:`ExportValidationError`.
    """
    from transformers import AutoTokenizer

    repo = Path(repo)
    src = repo / name / "1" / "model.onnx"
    if not src.is_file():
        raise ExportError(f"{src} does not exist")
    try:
        head = read_head(repo / name)
    except HeadError as e:
        raise ExportError(str(e)) from None
    tok_dir = repo / (head or LEGACY).tokenizer / "1"
    if not (tok_dir / "tokenizer_config.json").is_file():
        raise ExportError(f"{tok_dir}: no tokenizer files (needed for the validation texts)")
    out_name = out_name or f"{name}_fp16"
    out_dir = repo / out_name
    dst = out_dir / "1" / "model.onnx"
    tensorrt = shutil.which("trtexec") is not None if tensorrt is None else tensorrt
    texts = list(texts) if texts is not None else list(SAMPLE_TEXTS)
    with _Steps(quiet, console) as steps:
        with steps.step(f"check {src}"):
            num_labels = check_onnx_contract(src)
            tok = AutoTokenizer.from_pretrained(str(tok_dir))
            max_length = int(tok.model_max_length)
        tmp = staging(dst)
        try:
            with steps.step(f"convert to fp16 (keep_io_types) -> {dst}"):
                convert_to_fp16(src, tmp)
                check_onnx_contract(tmp, num_labels)
            ref_sess = ort_session(src)
            with steps.step(f"validate fp16 vs fp32 ONNX on {len(texts)} texts (<= {fp16_tolerance:g})"):
                val = {"fp16": check_variant("fp16", tmp, lambda i, m: ort_logits(ref_sess, i, m), tok, texts,
                                              max_length, fp16_tolerance, "onnx_fp32")}
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
        provenance = {"source": f"{name}/1/model.onnx", "source_sha256": sha256_file(src),
                      "source_bytes": src.stat().st_size, "variant": "fp16",
                      "converter": "onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)"}
        with steps.step(f"write configs of {out_name}"):
            write_model_configs(out_dir, num_labels, export_comment({**provenance, "num_labels": num_labels}),
                                tensorrt=tensorrt, head=head)
        trt = None
        if not tensorrt:
            _remove_stale_plan(out_dir, steps)
        if tensorrt:
            with steps.step(f"TensorRT plan {out_name}/1/model.plan (trtexec)"):
                trt = {out_name: build_tensorrt_plan(src, out_dir / "1" / "model.plan", max_length, True)}
        result = ExportResult(
            name=out_name, repo=str(repo), source=f"{name}/1/model.onnx", num_labels=num_labels,
            max_length=max_length, opset=None, variants=[out_name], validation=val, tensorrt=trt,
            head=json.loads(head.to_json()) if head else None, models=[out_name],
        )
        _record(result, out_dir, {**provenance, "validation": val["fp16"], "tensorrt": (trt or {}).get(out_name)})
        result.files = _files(repo, [out_dir])
    return result
