"""``orchestrator export`` always writes ``tokenizer.json``, the file the tokenizer model and the
router serve from (``orchestrator.runtime.execution.tokenize``): a fast tokenizer saves it, a slow one is
converted with ``transformers``' converter, one without a converter is refused with a message
that says what to do. No torch needed: ``save_tokenizer`` is the export's tokenizer step."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from orchestrator.runtime.execution.tokenize import TextTokenizer
from orchestrator.tooling.modeling.contract import ExportError, ExportValidationError
from orchestrator.tooling.modeling.export.source import save_tokenizer, write_tokenizer_json
from tests.byom import MAX_LENGTH, wordpiece_tokenizer
from tests.helpers import REPO

transformers = pytest.importorskip("transformers")

TEXTS = ["a good movie with great acting", "TERRIBLE, boring plot!", "movie " * 80, "Café 👍"]


def _model_dir(tmp_path: Path) -> Path:
    """``<repo>/NAME_tokenizer`` with the shared tokenizer's config, as an export starts from."""
    model = tmp_path / "repo" / "x_tokenizer"
    model.mkdir(parents=True)
    shutil.copy(REPO / "tokenizer" / "config.pbtxt", model / "config.pbtxt")
    return model


def _slow_bert(tmp_path: Path):
    """A Python (slow) WordPiece tokenizer whose class has a converter (``BertConverter``)."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    vocab = wordpiece_tokenizer().get_vocab()
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])), encoding="utf-8")
    slow = type("BertTokenizer", (BertTokenizerLegacy,), {})  # the class name the converter table knows
    return slow(vocab_file=str(path), do_lower_case=True, model_max_length=MAX_LENGTH)


def test_a_fast_tokenizer_is_saved_with_its_tokenizer_json(tmp_path):
    tok = wordpiece_tokenizer()
    model = _model_dir(tmp_path)
    names = save_tokenizer(tok, model / "1", MAX_LENGTH, TEXTS)
    assert "tokenizer.json" in names
    served = TextTokenizer(model / "1")
    assert [i.tolist() for i in served.encode(TEXTS)] == tok(TEXTS, truncation=True)["input_ids"]


def test_a_slow_tokenizer_is_converted_at_export(tmp_path):
    slow = _slow_bert(tmp_path)
    assert not slow.is_fast
    model = _model_dir(tmp_path)
    names = save_tokenizer(slow, model / "1", MAX_LENGTH, TEXTS)
    assert "tokenizer.json" in names
    served = TextTokenizer(model / "1")
    assert [i.tolist() for i in served.encode(TEXTS)] == [slow(t, truncation=True)["input_ids"] for t in TEXTS]


def test_a_slow_tokenizer_without_a_converter_is_refused_with_what_to_do(tmp_path):
    from transformers import CanineTokenizer

    tok = CanineTokenizer(model_max_length=MAX_LENGTH)
    tok.save_pretrained(tmp_path / "saved")
    with pytest.raises(ExportError, match=r"CanineTokenizer\) is a slow .*tokenizer\.json.*save a fast tokenizer"):
        write_tokenizer_json(tok, tmp_path / "saved")
    model = _model_dir(tmp_path)
    with pytest.raises(ExportError, match="slow"):
        save_tokenizer(tok, model / "1", MAX_LENGTH, TEXTS)
    assert not (model / "1" / "tokenizer_config.json").exists()  # nothing half-written


def test_a_tokenizer_json_that_serves_other_ids_is_refused(tmp_path, monkeypatch):
    """The export reads its files back as the tokenizer model will: other ids, no export."""
    tok = wordpiece_tokenizer()
    monkeypatch.setattr(TextTokenizer, "encode",
                        lambda self, texts, truncation=True: [np.asarray([2, 3], dtype=np.int64) for _ in texts])
    with pytest.raises(ExportValidationError, match="as the tokenizer model serves it"):
        save_tokenizer(tok, _model_dir(tmp_path) / "1", MAX_LENGTH, TEXTS)
