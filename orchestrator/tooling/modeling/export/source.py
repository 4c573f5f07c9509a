"""Where an export starts: the checkpoint (local or from the hub), its tokenizer, the torch export."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.tooling.files import write_atomic
from orchestrator.tooling.modeling.configs import tokenizer_config
from orchestrator.tooling.modeling.contract import ExportValidationError, SourceError, encode
from orchestrator.tooling.modeling.export.validate import SAMPLE_TEXTS
from orchestrator.tooling.repository import write_config

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

TOKENIZER_ADAPTER = '"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.tokenizer."""\n\n' \
                    "from orchestrator.runtime.models.tokenizer import TritonPythonModel  # noqa: F401\n"
TOKENIZER_HEADER = (
    "Text to token ids with transformers' fast tokenizer (files in 1/); written by `orchestrator export`",
    "(orchestrator.tooling.modeling.configs.tokenizer_config). padding: \"longest\" (pad to the",
    "request's longest text) or \"max_length\" (pad to max_length).",
)


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


def default_max_length(tokenizer, config) -> int:
    """Tokenizer's ``model_max_length`` when set (<= 100,000), else min(512, positions)."""
    tok_max = int(getattr(tokenizer, "model_max_length", 0) or 0)
    positions = getattr(config, "max_position_embeddings", None)
    if 0 < tok_max <= 100_000:
        return tok_max
    return int(min(512, positions or 512))


def save_tokenizer(tokenizer, tok_dir: Path, max_length: int, texts: Sequence[str]) -> list[str]:
    """Replace the tokenizer files in ``tok_dir`` with ``tokenizer`` (``model_max_length`` set
    to ``max_length``); keep ``model.py``. Returns the file names written.

    The files are saved to a temporary directory and reloaded with ``AutoTokenizer`` first;
    :class:`ExportValidationError` (``tok_dir`` untouched) if the reloaded tokenizer encodes
    one of ``texts`` differently from ``tokenizer`` truncating to ``max_length``. A missing
    ``model.py`` or ``config.pbtxt`` of the ``tokenizer`` model is written too.
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
            os.replace(Path(tmp, n), tok_dir / n)  # a rename out of a fresh temporary directory
    if not (tok_dir / "model.py").is_file():
        write_atomic(tok_dir / "model.py", TOKENIZER_ADAPTER.encode("utf-8"), 0o644)
    if not (tok_dir.parent / "config.pbtxt").is_file():
        from orchestrator.tooling.warmup import write_warmup_files

        write_config(tok_dir.parent / "config.pbtxt", tokenizer_config(tok_dir.parent.name, tokenizer_dir=tok_dir), TOKENIZER_HEADER)
        write_warmup_files(tok_dir.parent, "tokenizer", tok_dir)
    return names


def torch_export(model, tokenizer, path: Path, max_length: int, opset: int) -> None:
    """Export the torch ``model`` to ``path`` with the training export (one code path),
    traced on two sample texts. Raises :class:`ExportValidationError`."""
    from orchestrator.tooling.modeling.train.onnx_export import export_onnx

    export_onnx(model, path, opset=opset, example=encode(tokenizer, SAMPLE_TEXTS[:2], max_length))
