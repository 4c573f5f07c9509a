"""Text to token ids with the ``tokenizers`` library alone, as ``transformers`` would.

:class:`TextTokenizer` reads a tokenizer model's directory (``<repo>/<name>/1``):
``tokenizer.json`` (vocabulary, normalizer, pre-tokenizer, special-token template) and the
settings ``transformers`` keeps beside it: ``tokenizer_config.json`` (``model_max_length``,
``padding_side``, ``truncation_side``, the pad token, BERT's ``do_lower_case``,
``strip_accents``, ``tokenize_chinese_chars``, byte-level ``add_prefix_space``,
``split_special_tokens``) and
``special_tokens_map.json`` (the pad token). The ids, masks and truncation are those of
``AutoTokenizer.from_pretrained(dir)(texts, truncation=..., padding=False)`` followed by
``pad`` (``tests/unit/test_tokenize.py`` compares them on WordPiece BERT and DistilBERT,
byte-level BPE RoBERTa and the demo's tokenizer). The router's in-process tokenization and
the ``tokenizer`` model both use it, so the Python models never import ``transformers``.

Settings are fixed at load (one backend tokenizer with truncation, one without), so
encoding never mutates shared state and two threads may encode at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer, normalizers

from orchestrator.runtime.errors import TokenizerFilesError

__all__ = ["NO_MAX_LENGTH", "TOKENIZER_FILE", "TextTokenizer", "TokenizerFilesError", "truncate"]

#: The file that holds the whole backend tokenizer (``transformers``' fast-tokenizer file).
TOKENIZER_FILE = "tokenizer.json"
#: ``transformers``' ``model_max_length`` when its files set none (``VERY_LARGE_INTEGER``).
NO_MAX_LENGTH = int(1e30)
#: Longest truncation length the backend accepts (a Rust ``usize``); longer means none.
_MAX_BACKEND_LENGTH = 1 << 62


def _read_json(path: Path) -> Dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerFilesError(f"{path}: not readable JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise TokenizerFilesError(f"{path}: expected a JSON object")
    return doc


def _token_text(value: Any) -> Optional[str]:
    """A special token as ``transformers`` stores it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        content = value.get("content")
        return str(content) if content is not None else None
    return None if value is None else str(value)


def _side(value: Any, key: str, where: Path) -> str:
    side = "right" if value is None else str(value)
    if side not in ("left", "right"):
        raise TokenizerFilesError(f"{where}: {key} {side!r}, expected 'left' or 'right'")
    return side


def _sync_normalizer(backend: Any, config: Dict[str, Any]) -> None:
    """BERT's normalizer follows ``tokenizer_config.json`` where it says how: ``transformers``
    rebuilds it from ``do_lower_case``, ``strip_accents`` and ``tokenize_chinese_chars``."""
    if backend.normalizer is None:
        return
    state = json.loads(backend.normalizer.__getstate__())
    if state.get("type") != "BertNormalizer":
        return
    wanted = {"lowercase": config.get("do_lower_case", state.get("lowercase")),
              "strip_accents": config.get("strip_accents", state.get("strip_accents")),
              "handle_chinese_chars": config.get("tokenize_chinese_chars", state.get("handle_chinese_chars"))}
    if any(state.get(k) != v for k, v in wanted.items()):
        backend.normalizer = normalizers.BertNormalizer(clean_text=bool(state.get("clean_text", True)), **wanted)


def _sync_prefix_space(backend: Any, config: Dict[str, Any]) -> None:
    """A byte-level pre-tokenizer takes ``add_prefix_space`` from ``tokenizer_config.json``
    when it is set there (``transformers``' RoBERTa and GPT-2 tokenizers do)."""
    pre = backend.pre_tokenizer
    if "add_prefix_space" in config and pre is not None and type(pre).__name__ == "ByteLevel":
        pre.add_prefix_space = bool(config["add_prefix_space"])
        backend.pre_tokenizer = pre


class TextTokenizer:
    """One tokenizer model's files, loaded for encoding (see the module docstring).

    Attributes:
        directory: the directory the files were read from.
        model_max_length: the truncation length in tokens, special tokens included
            (``tokenizer_config.json``; :data:`NO_MAX_LENGTH` when it sets none).
        pad_token_id: the pad token's id, or None when the files name no pad token.
        padding_side: ``right`` (default) or ``left``, where :meth:`pad` adds padding.
        truncation_side: ``right`` (default: keep the start) or ``left`` (keep the end).
    """

    def __init__(self, directory: Path) -> None:
        """Read the files of ``directory``.

        Raises:
            TokenizerFilesError: no ``tokenizer.json`` (re-export the model with
                ``orchestrator export``, which writes it), an unreadable file, a bad
                ``padding_side``/``truncation_side``/``model_max_length``, or a pad token
                that is not in the vocabulary.
        """
        self.directory = Path(directory)
        path = self.directory / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerFilesError(
                f"{path}: no such file; the tokenizer is served from its {TOKENIZER_FILE} (the `tokenizers` "
                "library, without transformers): re-export the model with `orchestrator export`, which writes it, "
                "or save a fast tokenizer into this directory (tokenizer.save_pretrained(DIR))"
            )
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for bad files
            raise TokenizerFilesError(f"{path}: not a `tokenizers` file: {exc}") from None
        config_path = self.directory / "tokenizer_config.json"
        config = _read_json(config_path)
        special = {} if "added_tokens_decoder" in config else _read_json(self.directory / "special_tokens_map.json")
        json_pad, json_trunc = backend.padding or {}, backend.truncation or {}

        raw_max = config.get("model_max_length")
        try:
            self.model_max_length = NO_MAX_LENGTH if raw_max is None else int(raw_max)
        except (TypeError, ValueError):
            raise TokenizerFilesError(f"{config_path}: model_max_length {raw_max!r} is not an integer") from None
        if self.model_max_length < 1:
            raise TokenizerFilesError(f"{config_path}: model_max_length {self.model_max_length} is below 1")
        self.padding_side = _side(config.get("padding_side", json_pad.get("direction")), "padding_side", config_path)
        self.truncation_side = _side(config.get("truncation_side", json_trunc.get("direction")), "truncation_side",
                                     config_path)
        pad = _token_text(special.get("pad_token")) or _token_text(config.get("pad_token")) or json_pad.get("pad_token")
        self.pad_token_id: Optional[int] = None
        if pad is not None:
            pad_id = backend.token_to_id(pad)
            if pad_id is None:
                raise TokenizerFilesError(f"{config_path}: pad token {pad!r} is not in {path.name}'s vocabulary")
            self.pad_token_id = int(pad_id)

        _sync_normalizer(backend, config)
        _sync_prefix_space(backend, config)
        backend.no_padding()
        backend.no_truncation()
        self._whole = backend
        self._truncating: Optional[Any] = None
        if self.model_max_length < _MAX_BACKEND_LENGTH:
            self._truncating = Tokenizer.from_str(backend.to_str())
            self._truncating.enable_truncation(self.model_max_length, stride=0, strategy="longest_first",
                                               direction=self.truncation_side)
        for each in (self._whole, self._truncating):
            if each is not None:  # transformers sets it on every load; tokenizer.json does not keep it
                each.encode_special_tokens = bool(config.get("split_special_tokens", False))

    def encode(self, texts: Sequence[str], truncation: bool = True) -> List[NDArray[np.int64]]:
        """Token ids of each text, special tokens added, not padded.

        Args:
            texts: N texts (any Unicode; an empty text is its special tokens alone).
            truncation: cut each text to ``model_max_length`` tokens on ``truncation_side``
                (special tokens kept), as ``transformers`` does with ``truncation=True``.

        Returns:
            N int64 arrays [T_i], T_i <= ``model_max_length`` when truncating.

        Raises:
            ValueError: ``model_max_length`` leaves no room for the text besides the
                special tokens (the backend refuses such a truncation).
        """
        backend = self._truncating if truncation and self._truncating is not None else self._whole
        try:
            # one text: encode, the same encoding without the batch's hand-off to the library's thread pool
            encodings = [backend.encode(texts[0])] if len(texts) == 1 else backend.encode_batch(list(texts))
        except Exception as exc:  # e.g. "Truncation error: Second sequence not provided"
            raise ValueError(f"{self.directory}: cannot tokenize: {exc}") from None
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def pad(self, seqs: Sequence[NDArray[np.int64]], length: int) -> Tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(input_ids, attention_mask)``, int64 [N, L] with L = max(``length``, longest
        sequence): each row padded with ``pad_token_id`` on ``padding_side``, mask 1 on
        real tokens and 0 on padding (``transformers``' ``pad`` with
        ``padding="max_length"``).

        Raises:
            ValueError: padding is needed and the files name no pad token.
        """
        width = max([length] + [int(s.shape[0]) for s in seqs])
        if self.pad_token_id is None and any(int(s.shape[0]) < width for s in seqs):
            raise ValueError(f"{self.directory}: the tokenizer has no pad token; texts of different lengths "
                             "cannot be padded into one batch")
        ids = np.full((len(seqs), width), self.pad_token_id or 0, dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for row, s in enumerate(seqs):
            n = int(s.shape[0])
            span = slice(width - n, width) if self.padding_side == "left" else slice(0, n)
            ids[row, span] = s
            mask[row, span] = 1
        return ids, mask


def truncate(ids: NDArray[Any], max_length: int) -> NDArray[Any]:
    """Keep the first ``max_length - 1`` tokens and the last (special) one, as a tokenizer's
    truncation does; int64 [T] in, int64 [min(T, max_length)] out."""
    if ids.shape[0] <= max_length:
        return ids
    return np.concatenate([ids[: max_length - 1], ids[-1:]])
