"""``orchestrator export``: put a Hugging Face sequence classifier into the model repository.

Usage::

    orchestrator export SOURCE --name classifier [--repo model_repository] [--fp16]
                        [--max-length N] [--opset 17] [--no-tokenizer]
    orchestrator export --fp16-from-onnx classifier [--repo model_repository]

``SOURCE`` is a local checkpoint directory (``save_pretrained`` output: ``config.json``,
weights, tokenizer files) or a Hugging Face hub id, downloaded with
``huggingface_hub.snapshot_download`` when the hub can be reached (:class:`SourceError`
otherwise, naming both readings of ``SOURCE``).

What it writes under ``<repo>`` (each file written to a temporary name, then moved):

- ``<name>/1/model.onnx``: ``AutoModelForSequenceClassification`` (eager attention) exported
  with the TorchScript exporter (``dynamo=False``, opset 17 by default, as
  ``orchestrator.tooling.modeling.train``). Inputs ``input_ids``, ``attention_mask`` int64
  ``[batch, sequence]``; output ``logits`` float32 ``[batch, num_labels]``; batch and
  sequence axes dynamic. ``num_labels`` comes from the checkpoint's config: 1 for a binary
  single-logit model (sigmoid), 2 or more for softmax logits.
- ``<name>/config.pbtxt`` (native ``onnxruntime_onnx``, KIND_GPU) and
  ``<name>/configs/embedded.pbtxt`` (Python backend, ``orchestrator.runtime.models.onnx_classifier``,
  KIND_CPU), the same layout as the committed ``classifier``; output ``logits`` dims
  ``[num_labels]``. Existing files are updated in place (only the ``logits`` dims and
  the comment header change), new ones are written from the templates below.
- ``<name>/1/model.py``: the one-line Python-backend adapter.
- with ``--fp16``: ``<name>_fp16/`` the same, with ``1/model.onnx`` converted by
  ``onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)``: weights
  and compute in float16, inputs and outputs keep int64 ids and float32 logits, so the
  configs are identical apart from the name.
- ``tokenizer/1/``: the checkpoint's tokenizer, saved with ``save_pretrained`` with
  ``model_max_length`` set to the export's maximum sequence length (unless
  ``--no-tokenizer``). The old tokenizer files are removed first (``model.py`` is kept).
- with ``trtexec`` on ``PATH``: ``<name>/1/model.plan`` and ``<name>/configs/tensorrt.pbtxt``
  (``platform: "tensorrt_plan"``; selected with ``--model-config-name=tensorrt``).
- ``<name>/export.json``: provenance (source, sha256 of the files, validation numbers).

Validation (on :data:`SAMPLE_TEXTS`, or ``--validation-texts``), :class:`ExportValidationError`
on failure:

- fp32: max |onnxruntime - torch| over all logits < :data:`FP32_TOLERANCE` (1e-4, the bound
  ``orchestrator.tooling.modeling.train`` uses), for batches padded to the longest text, padded to the
  maximum length, and one text at a time.
- fp16: max |onnxruntime fp16 - reference| <= :data:`FP16_TOLERANCE` (0.05 logit), the
  reference being torch (checkpoint export) or the fp32 ONNX model (``--fp16-from-onnx``).
  Why 0.05: float16 has a unit roundoff of 2**-11 (4.9e-4); 0.05 is about 100 of those, room
  for rounding to accumulate through a few encoder layers, yet a logit error of 0.05 moves a
  sigmoid probability by at most 0.0125 (the sigmoid's slope is at most 1/4). Measured on the
  demo ``classifier``: see ``classifier_fp16/export.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from orchestrator.tooling.files import sha256_file
from orchestrator.tooling.paths import default_model_repository

__all__ = [
    "ExportError",
    "SourceError",
    "ExportValidationError",
    "ExportResult",
    "FP32_TOLERANCE",
    "FP16_TOLERANCE",
    "SAMPLE_TEXTS",
    "export_checkpoint",
    "fp16_from_onnx",
    "convert_to_fp16",
    "write_model_configs",
    "add_export_arguments",
    "export_command",
]

FP32_TOLERANCE = 1e-4  # same bound as orchestrator.tooling.modeling.train.TOL
FP16_TOLERANCE = 0.05  # see the module docstring
DEFAULT_OPSET = 17  # docs/architecture.md
MAX_BATCH_SIZE = 64  # every model of the repository
TRTEXEC_TIMEOUT_S = 3600

#: Texts for the export check: short, negated, mixed case, emoji, non-ASCII, empty, and one
#: long text that is truncated to the maximum length.
SAMPLE_TEXTS: tuple[str, ...] = (
    "A gorgeous, witty, seductive movie.",
    "The plot is nothing but boilerplate cliches from start to finish.",
    "ok",
    "I LOVED every minute of it!!! :)",
    "Not bad at all, though not great either.",
    "An utterly forgettable, 2-hour slog :( #fail",
    "Das war leider nichts. Très décevant.",
    "The battery died after two days and support never answered.",
    "",
    "What a waste of talent, time and money.",
    "Surprisingly moving; the lead performance is wonderful.",
    " ".join(["The film drags on and on, and every scene repeats the one before it."] * 40),
)

ADAPTER = '"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.onnx_classifier."""\n\n' \
          "from orchestrator.runtime.models.onnx_classifier import TritonPythonModel  # noqa: F401\n"
TOKENIZER_ADAPTER = '"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.tokenizer."""\n\n' \
                    "from orchestrator.runtime.models.tokenizer import TritonPythonModel  # noqa: F401\n"

_IO = """input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {num_labels} ] }} ]
"""

NATIVE_TEMPLATE = """# Native ONNX Runtime backend (NGC tritonserver container). The embedded server, which has
# no ONNX Runtime backend, reads configs/embedded.pbtxt instead (--model-config-name=embedded).
{header}name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 64
dynamic_batching {{ }}
""" + _IO + """instance_group [ {{ count: 1 kind: KIND_GPU }} ]
"""

EMBEDDED_TEMPLATE = """# The same 1/model.onnx run through onnxruntime from a Python-backend model
# (orchestrator.runtime.models.onnx_classifier): CUDA provider when present, CPU otherwise.
{header}name: "{name}"
backend: "python"
max_batch_size: 64
dynamic_batching {{ }}
""" + _IO + """parameters {{ key: "onnx_file" value: {{ string_value: "model.onnx" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

TENSORRT_TEMPLATE = """# TensorRT engine 1/model.plan built by `orchestrator export` with trtexec (see
# export.json for the command); select with --model-config-name=tensorrt. A plan only runs
# on the GPU model and TensorRT version it was built with.
{header}name: "{name}"
platform: "tensorrt_plan"
default_model_filename: "model.plan"
max_batch_size: 64
dynamic_batching {{ }}
""" + _IO + """instance_group [ {{ count: 1 kind: KIND_GPU }} ]
"""

TOKENIZER_CONFIG = """# Text to token ids with transformers' fast tokenizer (files in 1/).
name: "tokenizer"
backend: "python"
max_batch_size: 64
dynamic_batching { }
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
# padding: "longest" (pad to the request's longest text) or "max_length" (pad to max_length).
parameters { key: "padding" value: { string_value: "longest" } }
parameters { key: "max_length" value: { string_value: "512" } }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

_HEADER_MARK = "# exported by `orchestrator export`:"
_LOGITS_RE = re.compile(r'(\{\s*name:\s*"logits"\s+data_type:\s*TYPE_FP32\s+dims:\s*\[)\s*[-0-9, ]+(\])')
_NAME_RE = re.compile(r'^name:\s*"([^"]*)"', re.M)
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ExportError(RuntimeError):
    """The export could not be done (bad source, bad arguments, unexpected config files)."""


class SourceError(ExportError):
    """``SOURCE`` is neither a checkpoint directory nor a hub id that could be downloaded."""


class ExportValidationError(ExportError):
    """An exported model disagrees with its reference beyond the tolerance (or has the
    wrong inputs/outputs); the message gives the numbers."""


@dataclass
class ExportResult:
    """What one export wrote and measured (also written as ``<name>/export.json``).

    ``validation``: per variant (``fp32``, ``fp16``) the max abs logit differences, in logits.
    ``files``: repository-relative path -> bytes.
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
    tokenizer_written: bool = False


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


def _write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _num_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _ort_session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = _num_cores()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def _encode(tokenizer, texts: Sequence[str], max_length: int, pad_to: Optional[int] = None):
    """int64 ``(input_ids, attention_mask)`` [n, L]: truncated to ``max_length``, right-padded
    to the longest text or to ``pad_to`` (the tokenizer model's two-step encode)."""
    enc = tokenizer(list(texts), truncation=True, max_length=max_length, padding=False)
    longest = max(len(ids) for ids in enc["input_ids"])
    padded = tokenizer.pad(enc, padding="max_length", max_length=pad_to or longest, return_tensors="np")
    return padded["input_ids"].astype(np.int64), padded["attention_mask"].astype(np.int64)


def check_onnx_contract(path: Path, num_labels: Optional[int] = None) -> int:
    """Check the classifier contract of an ONNX file; return its ``num_labels``.

    Inputs exactly ``input_ids`` and ``attention_mask``, ``tensor(int64)``, two symbolic
    (dynamic) dims each; one output ``logits``, ``tensor(float)``, symbolic batch dim and a
    fixed label dim (equal to ``num_labels`` when given). Raises
    :class:`ExportValidationError` otherwise.
    """
    sess = _ort_session(path)
    ins = {i.name: i for i in sess.get_inputs()}
    outs = {o.name: o for o in sess.get_outputs()}
    if set(ins) != {"input_ids", "attention_mask"} or list(outs) != ["logits"]:
        raise ExportValidationError(f"{path}: inputs {sorted(ins)}, outputs {list(outs)}; "
                                    "expected input_ids, attention_mask -> logits")
    for name, i in ins.items():
        if i.type != "tensor(int64)" or len(i.shape) != 2 or not all(isinstance(d, str) for d in i.shape):
            raise ExportValidationError(f"{path}: input {name} is {i.type} {i.shape}; expected int64 "
                                        "[batch, sequence] with dynamic axes")
    lg = outs["logits"]
    if lg.type != "tensor(float)" or len(lg.shape) != 2 or not isinstance(lg.shape[0], str) \
            or not isinstance(lg.shape[1], int):
        raise ExportValidationError(f"{path}: output logits is {lg.type} {lg.shape}; expected float32 "
                                    "[batch, num_labels]")
    if num_labels is not None and lg.shape[1] != num_labels:
        raise ExportValidationError(f"{path}: logits has {lg.shape[1]} labels, the checkpoint {num_labels}")
    return int(lg.shape[1])


def _ort_logits(sess, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    if out.dtype != np.float32:
        raise ExportValidationError(f"logits dtype {out.dtype}, expected float32")
    return out


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _check_variant(
    label: str,
    path: Path,
    reference: Callable[[np.ndarray, np.ndarray], np.ndarray],
    tokenizer,
    texts: Sequence[str],
    max_length: int,
    tolerance: float,
    reference_name: str,
) -> dict:
    """Compare ``path`` (onnxruntime) with ``reference`` on ``texts``; return the max abs diffs.

    Three layouts: the whole batch padded to the longest text, the batch padded to
    ``max_length`` (must equal the unpadded result: padding is masked), and the first four
    texts one at a time. Raises :class:`ExportValidationError` if any diff is not below
    ``tolerance`` (fp32) / not at most ``tolerance`` (fp16), or a logit is not finite.
    """
    sess = _ort_session(path)
    ids, mask = _encode(tokenizer, texts, max_length)
    ref = reference(ids, mask)
    got = _ort_logits(sess, ids, mask)
    if got.shape != ref.shape:
        raise ExportValidationError(f"{label}: logits shape {got.shape} != reference {ref.shape}")
    if not np.all(np.isfinite(got)):
        raise ExportValidationError(f"{label}: non-finite logits {got.ravel()[:8]}")
    pids, pmask = _encode(tokenizer, texts, max_length, pad_to=max_length)
    padded = _ort_logits(sess, pids, pmask)
    single = np.concatenate([_ort_logits(sess, *_encode(tokenizer, [t], max_length)) for t in texts[:4]])
    diffs = {
        "texts": len(texts),
        "reference": reference_name,
        f"max_abs_diff_vs_{reference_name}": _max_diff(got, ref),
        "max_abs_diff_padded_to_max_length_vs_longest": _max_diff(padded, got),
        "max_abs_diff_one_by_one_vs_batched": _max_diff(single, got[: len(single)]),
        "tolerance": tolerance,
    }
    strict = label == "fp32"
    bad = {k: v for k, v in diffs.items() if k.startswith("max_abs")
           and not (v < tolerance if strict else v <= tolerance)}
    if bad:
        raise ExportValidationError(
            f"{label} export of {_final_path(path)} disagrees beyond {tolerance:g} (max abs logit difference): "
            + ", ".join(f"{k} = {v:.3g}" for k, v in bad.items())
        )
    return diffs


# --------------------------------------------------------------------------- configs


def _header(comment: Optional[str]) -> str:
    return f"{_HEADER_MARK} {comment}\n" if comment else ""


def _update_config(path: Path, template: str, name: str, num_labels: int, comment: Optional[str]) -> None:
    """Write ``path`` from ``template``, or update an existing file: the ``logits`` dims
    become ``[num_labels]`` and our comment line is replaced. Raises :class:`ExportError`
    if an existing file names another model or has no ``logits`` FP32 output to update."""
    if not path.is_file():
        _write_text_atomic(path, template.format(name=name, num_labels=num_labels, header=_header(comment)))
        return
    text = path.read_text(encoding="utf-8")
    m = _NAME_RE.search(text)
    if not m or m.group(1) != name:
        raise ExportError(f"{path}: name {m.group(1) if m else None!r} is not {name!r}; fix or delete the file")
    new, n = _LOGITS_RE.subn(rf"\g<1> {num_labels} \g<2>", text)
    if n != 1:
        raise ExportError(f"{path}: no single `{{ name: \"logits\" data_type: TYPE_FP32 dims: [...] }}` "
                          "output to update; fix or delete the file")
    lines = [ln for ln in new.splitlines(keepends=True) if not ln.startswith(_HEADER_MARK)]
    if comment:
        idx = next((i for i, ln in enumerate(lines) if _NAME_RE.match(ln)), 0)
        lines.insert(idx, _header(comment))
    _write_text_atomic(path, "".join(lines))


def write_model_configs(
    model_dir: Path, num_labels: int, comment: Optional[str] = None, tensorrt: bool = False
) -> list[Path]:
    """Write or update ``config.pbtxt``, ``configs/embedded.pbtxt`` (and with ``tensorrt``,
    ``configs/tensorrt.pbtxt``) and ``1/model.py`` of the classifier in ``model_dir``.

    The model name is the directory name (Triton requires it). ``num_labels`` becomes the
    ``logits`` dims. Returns the paths written. Raises :class:`ExportError` (see
    :func:`_update_config`).
    """
    name = model_dir.name
    written = [model_dir / "config.pbtxt", model_dir / "configs" / "embedded.pbtxt"]
    _update_config(written[0], NATIVE_TEMPLATE, name, num_labels, comment)
    _update_config(written[1], EMBEDDED_TEMPLATE, name, num_labels, comment)
    if tensorrt:
        written.append(model_dir / "configs" / "tensorrt.pbtxt")
        _update_config(written[-1], TENSORRT_TEMPLATE, name, num_labels, comment)
    adapter = model_dir / "1" / "model.py"
    if not adapter.is_file() or adapter.read_text() != ADAPTER:
        _write_text_atomic(adapter, ADAPTER)
    written.append(adapter)
    return written


# --------------------------------------------------------------------------- fp16 and TensorRT


def convert_to_fp16(src: Path, dst: Path) -> None:
    """Convert the ONNX model ``src`` to float16 into ``dst`` (one file).

    ``onnxruntime.transformers.float16.convert_float_to_float16(model, keep_io_types=True)``
    (defaults otherwise: values below 5.96e-8 / above 65504 in magnitude are clamped, ops in
    its default block list stay float32). ``keep_io_types`` keeps the graph inputs
    (int64) and the ``logits`` output float32, with Cast nodes inside. Raises
    :class:`ExportValidationError` if the result fails ``onnx.checker``.
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fp16 = convert_float_to_float16(model, keep_io_types=True)
    try:
        onnx.checker.check_model(fp16)
    except onnx.checker.ValidationError as e:
        raise ExportValidationError(f"fp16 model from {src} fails onnx.checker: {e}") from e
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    onnx.save(fp16, str(tmp))
    os.replace(tmp, dst)


def trtexec_command(onnx_path: Path, plan_path: Path, max_length: int, fp16: bool) -> list[str]:
    """The ``trtexec`` command that builds ``plan_path``: one optimisation profile, batch
    1..64 (opt 16), sequence 1..``max_length`` (opt ``max_length``); ``--fp16`` for fp16."""
    shapes = {"min": (1, 1), "opt": (16, max_length), "max": (MAX_BATCH_SIZE, max_length)}
    cmd = [shutil.which("trtexec") or "trtexec", f"--onnx={onnx_path}", f"--saveEngine={plan_path}"]
    for kind, (b, s) in shapes.items():
        cmd.append(f"--{kind}Shapes=input_ids:{b}x{s},attention_mask:{b}x{s}")
    if fp16:
        cmd.append("--fp16")
    return cmd


def build_tensorrt_plan(onnx_path: Path, plan_path: Path, max_length: int, fp16: bool) -> dict:
    """Run ``trtexec`` (must be on ``PATH``); return ``{"command", "bytes"}``.

    Raises :class:`ExportError` with the tail of its output if it fails or writes no plan.
    """
    cmd = trtexec_command(onnx_path, plan_path, max_length, fp16)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TRTEXEC_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ExportError(f"could not run {' '.join(cmd)}: {e}") from e
    if proc.returncode != 0 or not plan_path.is_file():
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise ExportError(f"trtexec failed (exit {proc.returncode}): {tail}")
    return {"command": cmd, "bytes": plan_path.stat().st_size}


# --------------------------------------------------------------------------- source


def resolve_source(source: str, revision: Optional[str] = None) -> Path:
    """A local checkpoint directory for ``source``.

    An existing directory is used as it is. Otherwise ``source`` is read as a hub id and
    downloaded with ``huggingface_hub.snapshot_download`` (config, weights, tokenizer files).
    Raises :class:`SourceError` if it is neither, or the download fails (no network, no such
    model), with the underlying error.
    """
    p = Path(source).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise SourceError(f"{p} is a directory without config.json: not a Hugging Face checkpoint")
        return p
    if p.exists():
        raise SourceError(f"{source}: not a directory (expected a save_pretrained checkpoint directory)")
    if not _HUB_ID_RE.match(source):
        raise SourceError(f"{source}: no such directory, and not a Hugging Face hub id")
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(
            source, revision=revision,
            allow_patterns=["*.json", "*.txt", "*.model", "*.safetensors", "*.bin", "*.jinja"],
        )
    except Exception as e:  # network errors, 404, auth: all end the export the same way
        raise SourceError(
            f"{source}: no such local directory, and downloading it from the Hugging Face hub failed "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Download the checkpoint on "
            "a machine that reaches the hub and pass its directory."
        ) from e
    return Path(path)


def _default_max_length(tokenizer, config) -> int:
    """Tokenizer's ``model_max_length`` when set (<= 100,000), else min(512, positions)."""
    tok_max = int(getattr(tokenizer, "model_max_length", 0) or 0)
    positions = getattr(config, "max_position_embeddings", None)
    if 0 < tok_max <= 100_000:
        return tok_max
    return int(min(512, positions or 512))


def _save_tokenizer(tokenizer, tok_dir: Path, max_length: int, texts: Sequence[str]) -> list[str]:
    """Replace the tokenizer files in ``tok_dir`` with ``tokenizer`` (``model_max_length`` set
    to ``max_length``); keep ``model.py``. Returns the file names written.

    The files are saved to a temporary directory and reloaded with ``AutoTokenizer`` first;
    :class:`ExportValidationError` (``tok_dir`` untouched) if the reloaded tokenizer encodes
    one of ``texts`` differently from ``tokenizer`` truncating to ``max_length``.
    """
    from transformers import AutoTokenizer

    tokenizer.model_max_length = max_length
    tok_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tok_dir.parent, prefix=".tokenizer-") as tmp:
        tokenizer.save_pretrained(tmp)
        again = AutoTokenizer.from_pretrained(tmp)
        for t in texts:
            if again(t, truncation=True)["input_ids"] != tokenizer(t, truncation=True, max_length=max_length)["input_ids"]:
                raise ExportValidationError(f"the saved tokenizer encodes {t[:40]!r} differently from the source")
        names = sorted(p.name for p in Path(tmp).iterdir() if p.is_file())
        for old in tok_dir.iterdir():
            if old.is_file() and old.name != "model.py":
                old.unlink()
        for n in names:
            os.replace(Path(tmp, n), tok_dir / n)
    if not (tok_dir / "model.py").is_file():
        _write_text_atomic(tok_dir / "model.py", TOKENIZER_ADAPTER)
    if not (tok_dir.parent / "config.pbtxt").is_file():
        _write_text_atomic(tok_dir.parent / "config.pbtxt", TOKENIZER_CONFIG)
    return names


def _torch_export(model, tokenizer, path: Path, max_length: int, opset: int) -> None:
    from orchestrator.tooling.modeling.train import ExportValidationError, export_onnx  # the training export, one code path

    try:
        export_onnx(model, path, opset=opset, example=_encode(tokenizer, SAMPLE_TEXTS[:2], max_length))
    except ExportValidationError as exc:
        raise ExportError(str(exc)) from None


def _staging(path: Path) -> Path:
    """Hidden sibling name for a file under validation (Triton only loads ``model.onnx``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.new")


def _final_path(path: Path) -> Path:
    """The name a staged file (:func:`_staging`) will have."""
    n = path.name
    return path.with_name(n[1:-4]) if n.startswith(".") and n.endswith(".new") else path


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
        **extra,
        "num_labels": result.num_labels,
        "max_length": result.max_length,
        "onnxruntime": onnxruntime.__version__,
        "files": {
            str(p.relative_to(model_dir)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted((model_dir / "1").glob("model.*")) if p.suffix in (".onnx", ".plan")
        },
    }
    _write_text_atomic(model_dir / "export.json", json.dumps(rec, indent=2) + "\n")


def _files(repo: Path, dirs: Sequence[Path]) -> dict:
    out = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out[str(p.relative_to(repo))] = p.stat().st_size
    return out


def _read_texts(path: Optional[Path]) -> list[str]:
    if path is None:
        return list(SAMPLE_TEXTS)
    texts = [ln for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not texts:
        raise ExportError(f"{path}: no texts")
    return texts


# --------------------------------------------------------------------------- exports


def export_checkpoint(
    source: str,
    repo: os.PathLike | str,
    name: str = "classifier",
    *,
    fp16: bool = False,
    max_length: Optional[int] = None,
    opset: int = DEFAULT_OPSET,
    tokenizer: bool = True,
    texts: Optional[Sequence[str]] = None,
    fp16_tolerance: float = FP16_TOLERANCE,
    tensorrt: Optional[bool] = None,
    revision: Optional[str] = None,
    quiet: bool = False,
    console=None,
) -> ExportResult:
    """Export the checkpoint ``source`` into ``repo`` as model ``name`` (and ``name_fp16``).

    See the module docstring for the files and checks. ``max_length`` (tokens, the
    truncation length written into the tokenizer): default from :func:`_default_max_length`;
    must not exceed the checkpoint's ``max_position_embeddings``. ``texts``: validation
    texts (default :data:`SAMPLE_TEXTS`). ``tensorrt``: build a plan (default: when
    ``trtexec`` is on ``PATH``).

    Raises :class:`SourceError`, :class:`ExportError`, :class:`ExportValidationError`.
    """
    repo = Path(repo)
    if not repo.is_dir():
        raise ExportError(f"model repository {repo} does not exist")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name) or name == "tokenizer":
        raise ExportError(f"bad model name {name!r}")
    tensorrt = shutil.which("trtexec") is not None if tensorrt is None else tensorrt
    texts = list(texts) if texts is not None else list(SAMPLE_TEXTS)
    with _Steps(quiet, console) as steps:
        with steps.step(f"resolve {source}"):
            ckpt = resolve_source(source, revision)
        with steps.step("load model and tokenizer (transformers)"):
            import torch
            from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

            from transformers.utils import logging as hf_logging

            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # its "Loading weights" bar would break the display
            try:
                config = AutoConfig.from_pretrained(str(ckpt))
                tok = AutoTokenizer.from_pretrained(str(ckpt))
                model = AutoModelForSequenceClassification.from_pretrained(
                    str(ckpt), attn_implementation="eager"
                ).eval()
            except (OSError, ValueError, KeyError) as e:
                raise SourceError(f"{ckpt}: cannot load a sequence classifier and tokenizer: {e}") from e
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
            num_labels = int(model.config.num_labels)
            positions = getattr(config, "max_position_embeddings", None)
            max_length = int(max_length or _default_max_length(tok, config))
            if max_length < 2 or (positions and max_length > positions):
                raise ExportError(f"--max-length {max_length} outside [2, max_position_embeddings={positions}]")
            if tok.pad_token_id is None:
                raise ExportError(f"{ckpt}: the tokenizer has no pad token; batches cannot be padded")

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
        staged = {onnx_path: _staging(onnx_path)}
        if fp16:
            staged[fp16_path] = _staging(fp16_path)
        ok = False
        try:
            with steps.step(f"export ONNX fp32 (opset {opset}) -> {onnx_path}"):
                _torch_export(model, tok, staged[onnx_path], max_length, opset)
                check_onnx_contract(staged[onnx_path], num_labels)
            with steps.step(f"validate fp32 vs torch on {len(texts)} texts (< {FP32_TOLERANCE:g})"):
                val = {"fp32": _check_variant("fp32", staged[onnx_path], torch_ref, tok, texts, max_length,
                                              FP32_TOLERANCE, "torch")}
            if fp16:
                with steps.step(f"convert to fp16 (keep_io_types) -> {fp16_path}"):
                    convert_to_fp16(staged[onnx_path], staged[fp16_path])
                    check_onnx_contract(staged[fp16_path], num_labels)
                with steps.step(f"validate fp16 vs torch (<= {fp16_tolerance:g})"):
                    val["fp16"] = _check_variant("fp16", staged[fp16_path], torch_ref, tok, texts, max_length,
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
        labels = [str(model.config.id2label.get(i, i)) for i in range(num_labels)]
        comment = f"{type(model).__name__} from {source}, {num_labels} logit(s) {labels}, max_length {max_length}"
        dirs = [model_dir]
        trt = {}
        with steps.step(f"write configs of {name}"):
            write_model_configs(model_dir, num_labels, comment, tensorrt=tensorrt)
        if fp16:
            with steps.step(f"write configs of {name}_fp16"):
                write_model_configs(fp16_dir, num_labels, comment + ", float16 weights (fp32 io)",
                                    tensorrt=tensorrt)
            dirs.append(fp16_dir)
        if not tensorrt:  # a plan from an earlier export would no longer match the new model
            for d in [model_dir] + ([repo / f"{name}_fp16"] if fp16 else []):
                _remove_stale_plan(d, steps)
        if tensorrt:
            for d, is16 in [(model_dir, False)] + ([(repo / f"{name}_fp16", True)] if fp16 else []):
                with steps.step(f"TensorRT plan {d.name}/1/model.plan (trtexec)"):
                    trt[d.name] = build_tensorrt_plan(model_dir / "1" / "model.onnx", d / "1" / "model.plan",
                                                      max_length, is16)
        if tokenizer:
            tok_dir = repo / "tokenizer" / "1"
            with steps.step(f"tokenizer files -> {tok_dir}"):
                _save_tokenizer(tok, tok_dir, max_length, texts)
            dirs.append(tok_dir)
            others = sorted(p.parent.parent.name for p in repo.glob("*/1/model.onnx")
                            if p.parent.parent.name not in (name, f"{name}_fp16"))
            if others:
                steps.note(f"[yellow]note:[/yellow] the tokenizer is shared; {', '.join(others)} now get "
                           "this checkpoint's token ids (pass --no-tokenizer to keep the old tokenizer)")
        result = ExportResult(
            name=name, repo=str(repo), source=str(source), num_labels=num_labels, max_length=max_length,
            opset=opset, variants=[name] + ([f"{name}_fp16"] if fp16 else []), validation=val,
            tensorrt=trt or None, tokenizer_written=tokenizer,
        )
        for d, key in [(model_dir, "fp32")] + ([(repo / f"{name}_fp16", "fp16")] if fp16 else []):
            _record(result, d, {"source": str(source), "checkpoint": str(ckpt), "model_class": type(model).__name__,
                                "labels": labels, "opset": opset, "variant": key, "validation": val[key],
                                "tensorrt": trt.get(d.name)})
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
    fp32 ONNX model (onnxruntime) on ``texts`` tokenized by ``<repo>/tokenizer/1``: max abs
    logit difference <= ``fp16_tolerance``. Raises :class:`ExportError` (missing files),
    :class:`ExportValidationError`.
    """
    from transformers import AutoTokenizer

    repo = Path(repo)
    src = repo / name / "1" / "model.onnx"
    if not src.is_file():
        raise ExportError(f"{src} does not exist")
    tok_dir = repo / "tokenizer" / "1"
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
        tmp = _staging(dst)
        try:
            with steps.step(f"convert to fp16 (keep_io_types) -> {dst}"):
                convert_to_fp16(src, tmp)
                check_onnx_contract(tmp, num_labels)
            ref_sess = _ort_session(src)
            with steps.step(f"validate fp16 vs fp32 ONNX on {len(texts)} texts (<= {fp16_tolerance:g})"):
                val = {"fp16": _check_variant("fp16", tmp, lambda i, m: _ort_logits(ref_sess, i, m), tok, texts,
                                              max_length, fp16_tolerance, "onnx_fp32")}
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
        comment = f"float16 weights (fp32 io) converted from {name}/1/model.onnx, {num_labels} logit(s)"
        with steps.step(f"write configs of {out_name}"):
            write_model_configs(out_dir, num_labels, comment, tensorrt=tensorrt)
        trt = None
        if not tensorrt:
            _remove_stale_plan(out_dir, steps)
        if tensorrt:
            with steps.step(f"TensorRT plan {out_name}/1/model.plan (trtexec)"):
                trt = {out_name: build_tensorrt_plan(src, out_dir / "1" / "model.plan", max_length, True)}
        result = ExportResult(
            name=out_name, repo=str(repo), source=f"{name}/1/model.onnx", num_labels=num_labels,
            max_length=max_length, opset=None, variants=[out_name], validation=val, tensorrt=trt,
        )
        _record(result, out_dir, {"source": f"{name}/1/model.onnx", "source_sha256": sha256_file(src),
                                  "source_bytes": src.stat().st_size, "variant": "fp16",
                                  "converter": "onnxruntime.transformers.float16.convert_float_to_float16"
                                               "(keep_io_types=True)",
                                  "validation": val["fp16"], "tensorrt": (trt or {}).get(out_name)})
        result.files = _files(repo, [out_dir])
    return result


# --------------------------------------------------------------------------- CLI


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
    parser.add_argument("--no-tokenizer", action="store_true", help="leave <repo>/tokenizer/1 as it is")
    parser.add_argument("--fp16-tolerance", type=float, default=FP16_TOLERANCE,
                        help="max abs logit difference accepted for fp16 (default: %(default)s)")
    parser.add_argument("--validation-texts", type=Path, default=None,
                        help="UTF-8 file, one text a line, for the export check (default: built-in samples)")
    parser.add_argument("--revision", default=None, help="hub revision (hub ids only)")
    parser.add_argument("--no-tensorrt", action="store_true", help="skip the TensorRT plan even if trtexec exists")
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
    console.print(f"wrote {len(result.files)} files, {total:,} bytes under {result.repo}")


def export_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator export``. Returns 0 on success, 1 on :class:`ExportError` (message on
    stderr), 2 on bad arguments."""
    from rich.console import Console

    console = Console(stderr=True)
    repo = Path(args.repo) if getattr(args, "repo", None) else _default_repo()
    texts = None
    try:
        if getattr(args, "validation_texts", None):
            texts = _read_texts(args.validation_texts)
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
                tokenizer=not args.no_tokenizer, texts=texts, fp16_tolerance=args.fp16_tolerance,
                tensorrt=trt, revision=args.revision, quiet=args.quiet, console=console,
            )
    except ExportError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        _summary(result, console)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.tooling.modeling.export", description=__doc__.split("\n")[0])
    add_export_arguments(p)
    return export_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
