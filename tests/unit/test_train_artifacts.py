"""The committed artifacts of ``make model`` honour the contract in docs/development/architecture.md.

Checks the files in ``model_repository/`` (no training here): the tokenizer reloads with
lower-casing and ``model_max_length`` 128; each ONNX classifier has the contract's names,
dtypes and dynamic axes and gives the same logits padded to the longest text or to 512;
``training_metrics.json`` shows ``classifier`` beating VADER on the movie-review test split;
all artifacts together are at most 25 MB.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import REPO, ROOT

TOKENIZER_DIR = REPO / "tokenizer" / "1"
MODELS = ("classifier", "classifier_fast")
ARTIFACTS = [
    TOKENIZER_DIR / "tokenizer.json",
    TOKENIZER_DIR / "tokenizer_config.json",
    TOKENIZER_DIR / "special_tokens_map.json",
    TOKENIZER_DIR / "vocab.txt",
    REPO / "classifier" / "1" / "model.onnx",
    REPO / "classifier_fast" / "1" / "model.onnx",
    REPO / "training_metrics.json",
    REPO / "MODEL_CARD.md",
]
SIZE_LIMIT = 25_000_000

TEXTS = [
    "A gorgeous, witty, seductive movie.",
    "The plot is nothing but boilerplate cliches from start to finish.",
    "ok",
    "I LOVED every minute of it!!! :)",
    "word " * 300,  # truncated to 128 tokens
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def test_artifacts_exist_and_fit_in_25_mb():
    missing = [str(p.relative_to(ROOT)) for p in ARTIFACTS if not p.is_file()]
    assert not missing, f"missing artifacts (run `make model`): {missing}"
    total = sum(p.stat().st_size for p in ARTIFACTS)
    assert total <= SIZE_LIMIT, f"artifacts total {total:,} bytes > {SIZE_LIMIT:,}"


def test_tokenizer_config_file():
    cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert cfg["model_max_length"] == 128
    assert cfg["do_lower_case"] is True


def test_tokenizer_reloads_lowercases_truncates(tokenizer):
    assert tokenizer.model_max_length == 128
    assert tokenizer.pad_token_id == 0
    assert tokenizer("GREAT Movie")["input_ids"] == tokenizer("great movie")["input_ids"]
    ids = tokenizer("great movie")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    enc = tokenizer(TEXTS, truncation=True, padding="longest", return_tensors="np")
    assert enc["input_ids"].shape == (len(TEXTS), 128)
    assert enc["input_ids"].dtype == np.int64
    # max_length=512 in the call would also truncate at 512: truncate to 128 first, then pad
    enc512 = tokenizer.pad(tokenizer(TEXTS, truncation=True), padding="max_length", max_length=512,
                           return_tensors="np")
    assert enc512["input_ids"].shape == (len(TEXTS), 512)
    assert enc512["attention_mask"].sum(axis=1).max() == 128
    vocab = (TOKENIZER_DIR / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(vocab) == len(tokenizer.get_vocab())


@pytest.mark.parametrize("name", MODELS)
def test_onnx_contract_and_padding(name, tokenizer):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(REPO / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    ins = {i.name: i for i in sess.get_inputs()}
    outs = {o.name: o for o in sess.get_outputs()}
    assert sorted(ins) == ["attention_mask", "input_ids"]
    assert list(outs) == ["logits"]
    for i in ins.values():
        assert i.type == "tensor(int64)"
        assert len(i.shape) == 2 and all(isinstance(d, str) for d in i.shape), i.shape  # dynamic
    assert outs["logits"].type == "tensor(float)"
    assert isinstance(outs["logits"].shape[0], str) and outs["logits"].shape[1] == 1

    def run(enc):
        return sess.run(["logits"], {"input_ids": enc["input_ids"].astype(np.int64),
                                     "attention_mask": enc["attention_mask"].astype(np.int64)})[0]

    longest = run(tokenizer(TEXTS, truncation=True, padding="longest", return_tensors="np"))
    padded = run(tokenizer.pad(tokenizer(TEXTS, truncation=True), padding="max_length", max_length=512,
                               return_tensors="np"))
    assert longest.dtype == np.float32 and longest.shape == (len(TEXTS), 1)
    assert np.all(np.isfinite(longest))
    np.testing.assert_allclose(padded, longest, rtol=0, atol=1e-4)
    single = run(tokenizer(TEXTS[:1], truncation=True, return_tensors="np"))
    np.testing.assert_allclose(single, longest[:1], rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def metrics():
    return json.loads((REPO / "training_metrics.json").read_text())


def test_metrics_classifier_beats_vader_on_movie_reviews(metrics):
    assert metrics["quick"] is False, "model_repository holds a --quick smoke run; run `make model`"
    movie = {s: metrics["test"][s]["movie_reviews"] for s in ("classifier", "classifier_fast", "vader")}
    assert movie["classifier"]["n"] == movie["vader"]["n"] > 500
    assert movie["classifier"]["accuracy"] > movie["vader"]["accuracy"]


def test_metrics_consistent_with_artifacts(metrics):
    for name in MODELS:
        rep = metrics["models"][name]
        assert rep["onnx_bytes"] == (REPO / name / "1" / "model.onnx").stat().st_size
        for k, v in rep["onnx_validation"].items():
            if k.startswith("max_abs_diff"):
                assert v < 1e-4, (name, k, v)
    for system in ("classifier", "classifier_fast", "vader"):
        m = metrics["test"][system]["all"]
        assert m["n"] == m["tp"] + m["fp"] + m["fn"] + m["tn"]
        assert 0.0 <= m["accuracy"] <= 1.0
    assert metrics["artifacts"]["total_bytes"] <= SIZE_LIMIT


def test_model_card_mentions_source_rule_and_results():
    card = (REPO / "MODEL_CARD.md").read_text(encoding="utf-8")
    for needle in ("Hutto", "ICWSM", "MIT", ">= 0.5", "<= -0.5", "movie_reviews", "vader", "python -m orchestrator.tooling.modeling.train"):
        assert needle in card, needle


def test_quick_training_run_writes_contract_artifacts(tmp_path):
    """``--quick`` smoke run (about 20 s on 2 cores) into a temporary model repository."""
    pytest.importorskip("torch", reason="needs torch (the `train` extra: make test installs it, make demo does not)")
    pytest.importorskip("vaderSentiment")
    from orchestrator.tooling.modeling import data as D
    from orchestrator.tooling.modeling import train as T

    try:
        D.fetch_corpus()
    except D.DataUnavailableError as e:
        pytest.skip(f"corpus not cached and cannot be fetched: {e}")
    assert T.main(["--quick", "--out", str(tmp_path)]) == 0
    for p in T.artifact_paths(tmp_path):
        assert p.is_file(), p
    m = json.loads((tmp_path / "training_metrics.json").read_text())
    assert m["quick"] is True and m["command"].startswith("python -m orchestrator.tooling.modeling.train --quick")
    assert set(m["test"]) == {"classifier", "classifier_fast", "vader"}
    assert m["test"]["vader"]["movie_reviews"]["n"] == m["test"]["classifier"]["movie_reviews"]["n"]
    assert "--quick" in (tmp_path / "MODEL_CARD.md").read_text()
    assert not (tmp_path / "tokenizer" / "1" / "model.py").exists()  # only tokenizer files written


def test_committed_tokenizer_is_reproducible(tokenizer):
    """Retraining the tokenizer on the train split gives the committed vocabulary, id for id."""
    from orchestrator.tooling.modeling import data as D
    from orchestrator.tooling.modeling import train as T

    try:
        examples = D.load_examples()
    except D.DataUnavailableError as e:
        pytest.skip(f"corpus not cached and cannot be fetched: {e}")
    train_texts = [e.text for e in D.split(examples)["train"]]
    fresh = T.train_tokenizer(train_texts)
    assert fresh.get_vocab() == tokenizer.get_vocab()
    assert fresh(TEXTS)["input_ids"] == tokenizer(TEXTS)["input_ids"]
