"""orchestrator.tooling.modeling.export: checkpoint -> ONNX fp32 + fp16 + configs + tokenizer, offline.

A tiny checkpoint is built here (random ``BertForSequenceClassification`` weights from a
``BertConfig`` and a WordPiece tokenizer trained with ``tokenizers`` on a few sentences,
``save_pretrained`` into tmp) and exported into a tmp copy of ``model_repository``.
The committed ``classifier_fp16`` is checked against the committed ``classifier``.

Not tested: re-exporting the committed ``classifier`` from its torch checkpoint, because
``lab.train`` keeps no checkpoint (it exports the best epoch's weights straight to
ONNX); the export path itself is covered by the tiny checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc.model_config_pb2 import TYPE_FP32, ModelInstanceGroup

from orchestrator.runtime.routing.heads import read_head
from orchestrator.tooling.modeling import export as E
from orchestrator.tooling.repository import read_config, write_config
from orchestrator.tooling.warmup import warmup_sample
from tests.helpers import REPO

try:  # the `train` extra: `make test` installs it, `make demo` does not
    import onnx
    import torch
except ImportError:
    onnx = torch = None

needs_train = pytest.mark.skipif(torch is None or onnx is None,
                                 reason="needs torch and onnx: pip install -e '.[train]'")

SENTENCES = [
    "a good movie with great acting",
    "a bad movie with a terrible plot",
    "great fun for the whole family",
    "not worth the ticket",
    "the acting was fine but the story was boring",
    "I loved it and would watch it again",
]
NEW_TEXTS = ["good fun", "TERRIBLE, boring plot!", "unseen words: zebra quantum", "movie " * 200]


def make_checkpoint(path: Path, num_labels: int, max_positions: int = 64) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(SENTENCES * 3, trainers.WordPieceTrainer(vocab_size=150, special_tokens=specials,
                                                                     show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = BertTokenizerFast(tokenizer_object=tok, do_lower_case=True, model_max_length=48,
                             model_input_names=["input_ids", "attention_mask"])
    torch.manual_seed(num_labels)
    cfg = BertConfig(vocab_size=len(fast.get_vocab()), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=max_positions, num_labels=num_labels,
                     pad_token_id=0)
    model = BertForSequenceClassification(cfg)
    with torch.no_grad():  # logits of a few units, so fp16 rounding shows
        model.classifier.weight.mul_(40.0)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def copy_repository(dest: Path) -> Path:
    """model_repository without its large model files (the export writes its own)."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns("__pycache__", "*.onnx", "*.plan"))
    return dest


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    ckpt = make_checkpoint(base / "ckpt", num_labels=1)
    repo = copy_repository(base / "model_repository")
    result = E.export_checkpoint(str(ckpt), repo, "classifier", fp16=True, quiet=True, tensorrt=False)
    return ckpt, repo, result


def torch_logits(ckpt: Path, texts, max_length: int):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    model = AutoModelForSequenceClassification.from_pretrained(str(ckpt), attn_implementation="eager").eval()
    enc = tok(texts, truncation=True, max_length=max_length, padding="longest", return_tensors="pt")
    with torch.inference_mode():
        return model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.numpy()


def served_logits(repo: Path, model: str, texts):
    """What the served pipeline computes: the files of the tokenizer model the model's
    head.json names, then the model."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(repo / read_head(repo / model).tokenizer / "1"))
    enc = tok(texts, truncation=True, padding="longest", return_tensors="np")
    sess = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"input_ids": enc["input_ids"].astype(np.int64),
                                 "attention_mask": enc["attention_mask"].astype(np.int64)})[0]


def io_types(path: Path):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return ({i.name: (i.type, i.shape) for i in sess.get_inputs()},
            {o.name: (o.type, o.shape) for o in sess.get_outputs()})


@needs_train
def test_round_trip_fp32_and_fp16(exported):
    ckpt, repo, result = exported
    assert result.num_labels == 1 and result.max_length == 48  # the tokenizer's model_max_length
    ref = torch_logits(ckpt, NEW_TEXTS, 48)
    fp32 = served_logits(repo, "classifier", NEW_TEXTS)
    fp16 = served_logits(repo, "classifier_fp16", NEW_TEXTS)
    assert fp32.shape == fp16.shape == (len(NEW_TEXTS), 1)
    assert np.abs(fp32 - ref).max() < E.FP32_TOLERANCE
    assert np.abs(fp16 - ref).max() <= E.FP16_TOLERANCE
    assert np.abs(ref).max() > 0.5  # the check is not trivially passed by near-zero logits
    v = result.validation
    assert v["fp32"]["max_abs_diff_vs_torch"] < 1e-4 and v["fp16"]["max_abs_diff_vs_torch"] <= 0.05


@needs_train
def test_fp16_keeps_io_dtypes_and_halves_the_weights(exported):
    _, repo, _ = exported
    ins16, outs16 = io_types(repo / "classifier_fp16" / "1" / "model.onnx")
    ins32, outs32 = io_types(repo / "classifier" / "1" / "model.onnx")
    assert ins16 == ins32 and outs16 == outs32
    assert {n: t for n, (t, _) in ins16.items()} == {"input_ids": "tensor(int64)", "attention_mask": "tensor(int64)"}
    assert outs16["logits"][0] == "tensor(float)" and outs16["logits"][1][1] == 1
    assert all(isinstance(d, str) for _, shape in ins16.values() for d in shape)  # dynamic batch and sequence
    m = onnx.load(str(repo / "classifier_fp16" / "1" / "model.onnx"))
    kinds = {onnx.TensorProto.DataType.Name(t.data_type) for t in m.graph.initializer if len(t.dims)}
    assert "FLOAT16" in kinds and "FLOAT" not in kinds


@needs_train
def test_configs_match_the_committed_layout(exported):
    """Same settings as the committed classifier's; the warmup sample is made again with the
    model's own tokenizer (the committed one has 26 ids of the demo tokenizer)."""
    _, repo, _ = exported
    sample = warmup_sample("classifier", repo / "classifier_tokenizer" / "1")
    assert list(sample.inputs["input_ids"].dims) != [26]
    for rel in ("config.pbtxt", "configs/embedded.pbtxt"):
        for name in ("classifier", "classifier_fp16"):
            got, want = read_config(repo / name / rel), renamed(REPO / "classifier" / rel, name)
            assert list(got.model_warmup) == [sample], f"{name}/{rel}"
            del got.model_warmup[:], want.model_warmup[:]
            assert got == want, f"{name}/{rel}"
            assert (repo / name / rel).read_text().count("# exported by `orchestrator export`:") == 1
    assert (repo / "classifier_fp16" / "1" / "model.py").read_text() == (REPO / "classifier" / "1" / "model.py").read_text()
    assert not (repo / "classifier" / "configs" / "tensorrt.pbtxt").exists()  # no trtexec here
    rec = json.loads((repo / "classifier_fp16" / "export.json").read_text())
    assert rec["variant"] == "fp16" and rec["num_labels"] == 1 and rec["files"]["1/model.onnx"]["bytes"] > 0


@needs_train
def test_the_model_gets_its_own_tokenizer_and_the_shared_one_stays(exported):
    from transformers import AutoTokenizer

    ckpt, repo, _ = exported
    for rel in ("tokenizer.json", "vocab.txt", "config.pbtxt"):  # the demo models' tokenizer is untouched
        assert (repo / "tokenizer" / "1" / rel if rel != "config.pbtxt" else repo / "tokenizer" / rel).read_bytes() == \
            (REPO / "tokenizer" / "1" / rel if rel != "config.pbtxt" else REPO / "tokenizer" / rel).read_bytes()
    tok_dir = repo / "classifier_tokenizer" / "1"
    assert read_head(repo / "classifier").tokenizer == read_head(repo / "classifier_fp16").tokenizer == "classifier_tokenizer"
    assert (tok_dir / "model.py").read_text() == (REPO / "tokenizer" / "1" / "model.py").read_text()
    config = read_config(repo / "classifier_tokenizer" / "config.pbtxt")
    want = read_config(REPO / "tokenizer" / "config.pbtxt")
    want.name = "classifier_tokenizer"
    want.parameters["max_length"].string_value = "48"
    want.model_warmup[0].CopyFrom(config.model_warmup[0])  # same sample text, same shape
    assert config == want
    saved = AutoTokenizer.from_pretrained(str(tok_dir))
    src = AutoTokenizer.from_pretrained(str(ckpt))
    assert saved.model_max_length == 48
    for t in NEW_TEXTS:
        assert saved(t, truncation=True)["input_ids"] == src(t, truncation=True)["input_ids"]


@needs_train
def test_multiclass_export_records_num_labels(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt3", num_labels=3)
    repo = copy_repository(tmp_path / "model_repository")
    old_tokenizer = (repo / "tokenizer" / "1" / "tokenizer.json").read_bytes()
    res = E.export_checkpoint(str(ckpt), repo, "topic", max_length=32, quiet=True, tensorrt=False)
    assert res.num_labels == 3 and res.variants == ["topic"]
    assert (repo / "tokenizer" / "1" / "tokenizer.json").read_bytes() == old_tokenizer
    for rel in ("config.pbtxt", "configs/embedded.pbtxt"):
        config = read_config(repo / "topic" / rel)
        assert config.name == "topic"
        assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("logits", TYPE_FP32, [3])]
    _, outs = io_types(repo / "topic" / "1" / "model.onnx")
    assert outs["logits"][1][1] == 3
    # re-export into the same directory updates the existing configs in place
    config = read_config(repo / "topic" / "config.pbtxt")
    config.instance_group[0].count = 2
    write_config(repo / "topic" / "config.pbtxt", config)
    E.export_checkpoint(str(make_checkpoint(tmp_path / "ckpt1", 1)), repo, "topic", max_length=32,
                        quiet=True, tensorrt=False)
    config = read_config(repo / "topic" / "config.pbtxt")
    assert list(config.output[0].dims) == [1]
    assert [(g.count, g.kind) for g in config.instance_group] == [(2, ModelInstanceGroup.KIND_GPU)]
    assert (repo / "topic" / "config.pbtxt").read_text().count("# exported by") == 1


@needs_train
def test_mismatch_fails_loudly(exported, tmp_path):
    from transformers import AutoTokenizer

    ckpt, repo, _ = exported
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    path = repo / "classifier" / "1" / "model.onnx"
    sess = E.ort_session(path)
    off = lambda ids, mask: E.ort_logits(sess, ids, mask) + 1e-3  # noqa: E731
    with pytest.raises(E.ExportValidationError, match=r"fp32 export .* disagrees beyond 0.0001.*vs_torch = 0.001"):
        E.check_variant("fp32", path, off, tok, list(E.SAMPLE_TEXTS), 48, E.FP32_TOLERANCE, "torch")
    fresh = copy_repository(tmp_path / "r")
    before = sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*"))
    with pytest.raises(E.ExportValidationError, match=r"fp16 export of .*classifier_fp16/1/model.onnx disagrees"):
        E.export_checkpoint(str(ckpt), fresh, "classifier", fp16=True,  # a bound no fp16 model meets
                            fp16_tolerance=1e-9, quiet=True, tensorrt=False)
    # nothing was written: the models are validated under hidden names and moved in only when all pass
    assert sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*")) == before


def test_bad_sources(tmp_path):
    with pytest.raises(E.SourceError, match="Hugging Face hub"):
        E.resolve_source("orchestrator-tests/no-such-model-xyz")
    with pytest.raises(E.SourceError, match="without config.json"):
        E.resolve_source(str(tmp_path))
    with pytest.raises(E.SourceError, match="not a Hugging Face hub id"):
        E.resolve_source(str(tmp_path / "missing" / "deeper" / "path"))
    parser = E.add_export_arguments(argparse.ArgumentParser())
    assert E.export_command(parser.parse_args(["--repo", str(tmp_path), "--quiet"])) == 2
    assert E.export_command(parser.parse_args([str(tmp_path / "nope"), "--repo", str(tmp_path), "--quiet"])) == 2  # no --name
    assert E.export_command(parser.parse_args([str(tmp_path / "nope"), "--name", "x", "--repo", str(tmp_path),
                                               "--quiet"])) == 1


@needs_train
def test_tensorrt_plan_with_a_fake_trtexec(exported, tmp_path, monkeypatch):
    """With ``trtexec`` on PATH: plan + configs/tensorrt.pbtxt (a stand-in trtexec records its args)."""
    ckpt, _, _ = exported
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "trtexec.log"
    script = bin_dir / "trtexec"
    script.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in --saveEngine=*) echo plan > "${a#--saveEngine=}";; '
                      f'esac; done\necho "$@" >> {log}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    repo = copy_repository(tmp_path / "model_repository")
    res = E.export_checkpoint(str(ckpt), repo, "classifier", fp16=True, quiet=True)
    assert set(res.tensorrt) == {"classifier", "classifier_fp16"}
    for name in ("classifier", "classifier_fp16"):
        assert (repo / name / "1" / "model.plan").is_file()
        cfg = read_config(repo / name / "configs" / "tensorrt.pbtxt")
        assert (cfg.platform, cfg.name, cfg.default_model_filename) == ("tensorrt_plan", name, "model.plan")
        assert list(cfg.output[0].dims) == [1]
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and "--maxShapes=input_ids:64x48,attention_mask:64x48" in calls[0]
    assert not calls[0].endswith("--fp16") and calls[1].endswith("--fp16")
    # without trtexec the stale plan and its config go away
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    E.export_checkpoint(str(ckpt), repo, "classifier", quiet=True)
    assert not (repo / "classifier" / "1" / "model.plan").exists()
    assert not (repo / "classifier" / "configs" / "tensorrt.pbtxt").exists()


@needs_train
def test_fp16_from_onnx(exported, tmp_path):
    _, repo, _ = exported
    work = tmp_path / "model_repository"
    shutil.copytree(repo, work)
    shutil.rmtree(work / "classifier_fp16")
    res = E.fp16_from_onnx(work, "classifier", quiet=True, tensorrt=False)
    assert res.variants == ["classifier_fp16"] and res.validation["fp16"]["reference"] == "onnx_fp32"
    rec = json.loads((work / "classifier_fp16" / "export.json").read_text())
    assert rec["source_sha256"] == hashlib.sha256(Path(work / "classifier" / "1" / "model.onnx").read_bytes()).hexdigest()
    # the conversion is deterministic: same bytes as the fp16 model of the checkpoint export
    assert (work / "classifier_fp16" / "1" / "model.onnx").read_bytes() == \
        (repo / "classifier_fp16" / "1" / "model.onnx").read_bytes()


# --------------------------------------------------------------------------- committed demo models


def test_committed_fp16_is_converted_from_the_committed_classifier(tmp_path):
    src = REPO / "classifier" / "1" / "model.onnx"
    dst = REPO / "classifier_fp16" / "1" / "model.onnx"
    rec = json.loads((REPO / "classifier_fp16" / "export.json").read_text())
    assert rec["source_sha256"] == hashlib.sha256(Path(src).read_bytes()).hexdigest(), (
        "classifier changed since classifier_fp16 was made: run `orchestrator export --fp16-from-onnx classifier --replace`")
    assert rec["files"]["1/model.onnx"]["sha256"] == hashlib.sha256(Path(dst).read_bytes()).hexdigest()
    assert 0.45 < dst.stat().st_size / src.stat().st_size < 0.55
    ins16, outs16 = io_types(dst)
    assert (ins16, outs16) == io_types(src)
    assert np.abs(committed_logits(dst) - committed_logits(src)).max() <= E.FP16_TOLERANCE
    for rel in ("config.pbtxt", "configs/embedded.pbtxt"):
        assert read_config(REPO / "classifier_fp16" / rel) == renamed(REPO / "classifier" / rel, "classifier_fp16")


def renamed(path: Path, name: str):
    """The config at ``path`` with another model name."""
    config = read_config(path)
    config.name = name
    return config


def committed_logits(path: Path) -> np.ndarray:
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(REPO / "tokenizer" / "1"))
    enc = tok(list(E.SAMPLE_TEXTS), truncation=True, padding="longest", return_tensors="np")
    feed = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], feed)[0]


@needs_train
def test_reconverting_the_committed_classifier_gives_the_committed_fp16(tmp_path):
    again = tmp_path / "again.onnx"
    E.convert_to_fp16(REPO / "classifier" / "1" / "model.onnx", again)
    np.testing.assert_array_equal(committed_logits(again), committed_logits(REPO / "classifier_fp16" / "1" / "model.onnx"))


def test_one_validation_error_for_train_and_export_under_the_tooling_base():
    """Catching export's ExportValidationError catches train's (one class), and every error of
    the modeling and bench tooling is a ToolingError."""
    from lab import train as T
    from lab.bench.plan import BenchError
    from orchestrator.tooling.errors import ToolingError
    from orchestrator.tooling.modeling import data as D
    from orchestrator.tooling.modeling import parity as P

    assert T.ExportValidationError is E.ExportValidationError
    assert issubclass(E.ExportValidationError, E.ExportError) and issubclass(E.SourceError, E.ExportError)
    for cls in (E.ExportError, E.SourceError, E.ExportValidationError, T.ArtifactSizeError, T.BaselineNotBeatenError,
                P.ParityError, BenchError, D.DataUnavailableError, D.DataFormatError):
        assert issubclass(cls, ToolingError), cls
    assert issubclass(D.DataFormatError, ValueError)  # as before, for callers that catch ValueError
    with pytest.raises(E.ExportValidationError, match=r"inputs \['input_ids'\], outputs \['y'\]"):
        E.check_onnx_contract("m.onnx", session=_FakeSession([("input_ids", "tensor(int64)", ["b", "s"])],
                                                             [("y", "tensor(float)", ["b", 1])]))
    good_inputs = [(n, "tensor(int64)", ["b", "s"]) for n in ("input_ids", "attention_mask")]
    assert E.check_onnx_contract("m.onnx", session=_FakeSession(good_inputs, [("logits", "tensor(float)", ["b", 2])])) == 2
    with pytest.raises(E.ExportValidationError, match="logits has 2 labels, expected 1"):
        E.check_onnx_contract("m.onnx", 1, session=_FakeSession(good_inputs, [("logits", "tensor(float)", ["b", 2])]))
    with pytest.raises(E.ExportValidationError, match="input input_ids is tensor.int64. .8, 's'.; expected int64"):
        E.check_onnx_contract("m.onnx", session=_FakeSession([("input_ids", "tensor(int64)", [8, "s"])] + good_inputs[1:],
                                                             [("logits", "tensor(float)", ["b", 1])]))


class _FakeSession:
    """What check_onnx_contract reads of an onnxruntime session: get_inputs/get_outputs."""

    def __init__(self, inputs, outputs):
        from types import SimpleNamespace

        self._in = [SimpleNamespace(name=n, type=t, shape=s) for n, t, s in inputs]
        self._out = [SimpleNamespace(name=n, type=t, shape=s) for n, t, s in outputs]

    def get_inputs(self):
        return self._in

    def get_outputs(self):
        return self._out
