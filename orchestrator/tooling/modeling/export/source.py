"""Where an export starts: the checkpoint (local or from the hub), its tokenizer, the torch export."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.runtime.execution.tokenize import TOKENIZER_FILE
from orchestrator.tooling.files import write_atomic
from orchestrator.tooling.modeling.configs import tokenizer_config
from orchestrator.tooling.modeling.contract import ExportError, ExportValidationError, SourceError, encode
from orchestrator.tooling.modeling.export.validate import SAMPLE_TEXTS
from orchestrator.tooling.repository import get_parameter, read_config, write_config

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

TOKENIZER_ADAPTER = '"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.tokenizer."""\n\n' \
                    "from orchestrator.runtime.models.tokenizer import TritonPythonModel  # noqa: F401\n"
TOKENIZER_HEADER = (
    "Text to token ids with the tokenizers library from 1/tokenizer.json (truncation length: the files'",
    "model_max_length); written by `orchestrator export` (orchestrator.tooling.modeling.configs.tokenizer_config).",
    "padding: \"longest\" (pad to the request's longest text) or \"max_length\" (pad to max_length).",
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


#: Files that hold a tokenizer's vocabulary (``transformers``' names): the fast tokenizer's
#: ``tokenizer.json``, WordPiece ``vocab.txt``, BPE ``vocab.json`` with ``merges.txt``,
#: SentencePiece models.
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                    "tokenizer.model")


def check_tokenizer_files(checkpoint: Path) -> list[str]:
    """The vocabulary files of the checkpoint directory (names), at least one.

    Without them ``AutoTokenizer`` still loads, with a vocabulary of only the special
    tokens, which turns every word into the unknown token: refused here.

    Raises:
        SourceError: no vocabulary file (the message lists what the directory holds and
            what was expected), or ``vocab.json`` without ``merges.txt``.
    """
    checkpoint = Path(checkpoint)
    present = sorted(p.name for p in checkpoint.iterdir() if p.is_file())
    found = [n for n in VOCABULARY_FILES if n in present]
    if not found:
        raise SourceError(
            f"{checkpoint}: no tokenizer files: none of {', '.join(VOCABULARY_FILES)} (it holds "
            f"{', '.join(present) or 'nothing'}). Save the tokenizer the model was trained with next to it: "
            "tokenizer.save_pretrained(DIR)"
        )
    if found == ["vocab.json"] and "merges.txt" not in present:
        raise SourceError(f"{checkpoint}: vocab.json without merges.txt: a BPE tokenizer needs both")
    return found


def write_tokenizer_json(tokenizer, directory: Path) -> None:
    """Make sure ``directory`` (``save_pretrained`` output of ``tokenizer``) holds
    ``tokenizer.json``, the file the tokenizer model and the router serve from: a fast
    tokenizer wrote it; a slow (Python) one is converted with ``transformers``' converter.

    Raises:
        ExportError: a slow tokenizer that ``transformers`` cannot convert; the message
            says what to provide instead.
    """
    path = Path(directory) / TOKENIZER_FILE
    if path.is_file():
        return
    try:
        from transformers.convert_slow_tokenizer import convert_slow_tokenizer

        backend = convert_slow_tokenizer(tokenizer)
    except Exception as e:  # no converter for the class, or a converter that fails on these files
        raise ExportError(
            f"the checkpoint's tokenizer ({type(tokenizer).__name__}) is a slow (Python) tokenizer with no "
            f"{TOKENIZER_FILE}, and transformers cannot convert it ({type(e).__name__}: {e}). The router serves "
            f"tokenizers from {TOKENIZER_FILE} (the `tokenizers` library): save a fast tokenizer with the "
            f"checkpoint (tokenizer.save_pretrained(DIR) of a tokenizers-backed tokenizer writes {TOKENIZER_FILE}) "
            "and export again"
        ) from None
    backend.save(str(path))


def save_tokenizer(tokenizer, tok_dir: Path, max_length: int, texts: Sequence[str], padding: str = "longest") -> list[str]:
    """Make ``tok_dir`` (``<repo>/<model>/1``) the files of ``tokenizer`` with
    ``model_max_length`` = ``max_length`` (the truncation length of the tokenizer model),
    always with ``tokenizer.json`` (:func:`write_tokenizer_json`), and its model:
    ``model.py`` and ``config.pbtxt`` (:func:`tokenizer_config`, named after the directory;
    an existing one keeps its settings, with ``max_length`` and the warmup sample made
    again) and the warmup files. Old tokenizer files are removed. Returns the tokenizer file
    names written.

    The files are saved to a temporary directory and read back first, both with
    ``AutoTokenizer`` and with what serves them
    (:class:`orchestrator.runtime.execution.tokenize.TextTokenizer`, ``tokenizers`` alone):
    :class:`ExportValidationError` (``tok_dir`` untouched) if either encodes one of
    ``texts`` (and an empty text) differently from ``tokenizer`` truncating to
    ``max_length``; :class:`ExportError` from :func:`write_tokenizer_json`.
    """
    from transformers import AutoTokenizer

    from orchestrator.runtime.execution.tokenize import TextTokenizer, TokenizerFilesError
    from orchestrator.tooling.warmup import add_model_features, write_warmup_files

    tokenizer.model_max_length = max_length
    tok_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tok_dir.parent, prefix=".tokenizer-") as tmp:
        tokenizer.save_pretrained(tmp)
        write_tokenizer_json(tokenizer, Path(tmp))
        again = AutoTokenizer.from_pretrained(tmp)
        try:
            served = TextTokenizer(Path(tmp))
        except TokenizerFilesError as e:
            raise ExportValidationError(f"the saved tokenizer files cannot be served: {e}") from None
        for t in [*texts, ""]:
            want = tokenizer(t, truncation=True, max_length=max_length)["input_ids"]
            if again(t, truncation=True)["input_ids"] != want:
                raise ExportValidationError(f"the saved tokenizer encodes {t[:40]!r} differently from the source")
            if served.encode([t])[0].tolist() != list(want):
                raise ExportValidationError(
                    f"the saved {TOKENIZER_FILE} (as the tokenizer model serves it, with the tokenizers library) "
                    f"encodes {t[:40]!r} differently from the source tokenizer"
                )
        names = sorted(p.name for p in Path(tmp).iterdir() if p.is_file())
        for old in tok_dir.iterdir():
            if old.is_file() and old.name != "model.py":
                old.unlink()
        for n in names:
            os.replace(Path(tmp, n), tok_dir / n)  # a rename out of a fresh temporary directory
    write_atomic(tok_dir / "model.py", TOKENIZER_ADAPTER.encode("utf-8"), 0o644)
    model_dir = tok_dir.parent
    path = model_dir / "config.pbtxt"
    if path.is_file():
        config = read_config(path)
        config.name = model_dir.name
        pad_to = max_length
        if get_parameter(config, "padding") == "max_length":  # the model refuses padding shorter than truncation
            pad_to = max(max_length, int(get_parameter(config, "max_length") or 0))
        config.parameters["max_length"].string_value = str(pad_to)
        if config.model_warmup:
            add_model_features(config, tok_dir)
    else:
        config = tokenizer_config(model_dir.name, padding=padding, max_length=max_length, tokenizer_dir=tok_dir)
    write_config(path, config, TOKENIZER_HEADER)
    if config.model_warmup:
        write_warmup_files(model_dir, "tokenizer", tok_dir)
    return names


def torch_export(model, tokenizer, path: Path, max_length: int, opset: int) -> None:
    """Export the torch ``model`` to ``path`` with the training export (one code path),
    traced on two sample texts. Raises :class:`ExportValidationError`."""
    from orchestrator.tooling.modeling.torch_export import export_onnx

    export_onnx(model, path, opset=opset, example=encode(tokenizer, SAMPLE_TEXTS[:2], max_length))
