"""orchestrator.tooling.modeling.parity: the report's numbers against independent computations.

- a hand-made fixture (``fixtures/parity/hand_made.json``) whose thresholds, confusion
  matrices and flips were worked out by hand;
- random logits with many ties, against brute-force loops in plain Python;
- the whole command in-process on the committed ``classifier`` / ``classifier_fp16`` and
  ``fixtures/parity/labeled.tsv``, against logits computed here with onnxruntime;
- a real server (``server`` mark): ``classifier_fp16`` loads in the embedded Triton server and
  its logits there match ``classifier``'s and the in-process ones.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from orchestrator.runtime.routing.heads import read_head
from orchestrator.tooling.modeling import parity as P
from tests.byom import byom_checkpoints  # noqa: F401
from tests.helpers import FIXTURES, REPO

FIX = FIXTURES / "parity"
FP16_TOLERANCE = 0.05  # orchestrator.tooling.modeling.export.FP16_TOLERANCE


def sig(x: float) -> float:
    return float(np.float32(1.0 / (1.0 + math.exp(-x))))


# --------------------------------------------------------------------------- hand-made fixture


def test_hand_made_fixture():
    """Derivation (labels 1110100100, reference logits descending 3 .. -3):

    reference: top-k precision for k = 1..10 is 1, 1, 1, 3/4, 4/5, 4/6, 4/7, 5/8, 5/9, 5/10.
    The threshold falls as k grows, so the smallest threshold with precision >= 0.75 is
    that of the largest qualifying k, 5: sigmoid(0.5); tp 4 fp 1 fn 1 tn 4.
    candidate: d = [-.1, .1, -.1, .2, -.1, .6, .1, -.1, 0, -.1]: mean |d| 0.15, max 0.6,
    min -0.1. At sigmoid(0.5) the candidate accepts texts 0-3 and 5 (0.6) but not 4 (0.4):
    one flip each way. Best: top-4 (threshold sigmoid(1.2)) and top-6 (sigmoid(0.4)) both
    give 1 flip, top-5 gives 2; sigmoid(0.4) is closer to sigmoid(0.5).
    """
    fx = json.loads((FIX / "hand_made.json").read_text())
    e = fx["expected"]
    y = np.array(fx["labels"])
    ref = np.array(fx["reference"], dtype=np.float32)[:, None]
    cand = np.array(fx["candidate"], dtype=np.float32)[:, None]
    r = P.compare(ref, {"cand": cand}, y, fx["target_precision"], "ref")

    assert r["reference"]["threshold"] == sig(e["reference_threshold_logit"])
    assert r["reference"]["threshold_logit"] == pytest.approx(e["reference_threshold_logit"], abs=1e-6)
    assert {k: r["reference"]["vs_labels"][k] for k in "tp fp fn tn".split()} == e["reference_vs_labels"]
    assert r["reference"]["vs_labels"]["precision"] == pytest.approx(0.8)
    c = r["candidates"]["cand"]
    assert c["logits"]["mean_abs_diff"] == pytest.approx(e["mean_abs_diff"], abs=1e-6)
    assert c["logits"]["max_diff"] == pytest.approx(e["max_diff"], abs=1e-6)
    assert c["logits"]["min_diff"] == pytest.approx(e["min_diff"], abs=1e-6)
    assert c["at_reference_threshold"]["vs_reference"] == e["at_reference_threshold"]
    lab = c["at_reference_threshold"]["vs_labels"]
    assert {k: lab[k] for k in "tp fp fn tn".split()} == e["candidate_vs_labels_at_reference_threshold"]
    assert lab["accuracy"] == pytest.approx(0.6) and lab["precision"] == pytest.approx(0.6)
    b = c["best_threshold"]
    assert b["threshold"] == sig(e["best_threshold_logit"])
    assert b["vs_reference"]["flips"] == e["best_flips"]
    assert {k: b["vs_labels"][k] for k in "tp fp fn tn".split()} == e["candidate_vs_labels_at_best_threshold"]
    assert c["operating_threshold"] == b["threshold"]


# --------------------------------------------------------------------------- brute force


def brute_reference_threshold(probs, labels, target):
    best = None
    for t in sorted(set(float(p) for p in probs)):
        tp = fp = 0
        for p, y in zip(probs, labels):
            if p >= t:
                tp += y == 1
                fp += y == 0
        if tp + fp and tp / (tp + fp) >= target:
            best = t
            break
    return best


def brute_flips(probs, ref_verdicts, t):
    return sum(1 for p, r in zip(probs, ref_verdicts) if (p >= t) != r)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_thresholds_and_confusion_against_loops(seed):
    rng = np.random.RandomState(seed)
    n = 300
    y = rng.randint(0, 2, n)
    ref = np.round(rng.normal(0, 1.5, n) + 3.0 * (y - 0.5), 1).astype(np.float32)  # ties on purpose
    cand = np.round(ref + rng.normal(0, 0.15, n), 1).astype(np.float32)
    target = [0.7, 0.8, 0.9, 0.95][seed]
    r = P.compare(ref[:, None], {"c": cand[:, None]}, y, target, "r")

    rp = [float(p) for p in P.probabilities(ref.astype(np.float64))]
    cp = [float(p) for p in P.probabilities(cand.astype(np.float64))]
    t_ref = brute_reference_threshold(rp, y, target)
    assert r["reference"]["threshold"] == t_ref
    rv = [p >= t_ref for p in rp]
    cv = [p >= t_ref for p in cp]
    # confusion against the reference, by loops
    counts = {"ref_pos_cand_pos": 0, "ref_pos_cand_neg": 0, "ref_neg_cand_pos": 0, "ref_neg_cand_neg": 0}
    for a, b in zip(rv, cv):
        counts[f"ref_{'pos' if a else 'neg'}_cand_{'pos' if b else 'neg'}"] += 1
    counts["flips"] = counts["ref_pos_cand_neg"] + counts["ref_neg_cand_pos"]
    c = r["candidates"]["c"]
    assert c["at_reference_threshold"]["vs_reference"] == counts
    # metrics against labels, by loops
    tp = sum(1 for v, t in zip(cv, y) if v and t == 1)
    fp = sum(1 for v, t in zip(cv, y) if v and t == 0)
    fn = sum(1 for v, t in zip(cv, y) if not v and t == 1)
    m = c["at_reference_threshold"]["vs_labels"]
    assert (m["tp"], m["fp"], m["fn"]) == (tp, fp, fn)
    assert m["precision"] == pytest.approx(tp / (tp + fp))
    assert m["recall"] == pytest.approx(tp / (tp + fn))
    assert m["accuracy"] == pytest.approx(sum(1 for v, t in zip(cv, y) if v == (t == 1)) / n)
    # logit deviations
    d = [float(b) - float(a) for a, b in zip(ref, cand)]
    assert c["logits"]["mean_abs_diff"] == pytest.approx(sum(abs(x) for x in d) / n)
    assert c["logits"]["max_diff"] == pytest.approx(max(d))
    assert c["logits"]["min_diff"] == pytest.approx(min(d))
    # best threshold: the minimum over every possible verdict set (all values and a grid)
    if counts["flips"]:
        grid = sorted(set(cp) | {0.0, 1.0} | {i / 1000 for i in range(1001)})
        min_flips = min(brute_flips(cp, rv, t) for t in grid + [float(np.nextafter(np.float32(max(cp)), 2))])
        b = c["best_threshold"]
        assert b["vs_reference"]["flips"] == min_flips == brute_flips(cp, rv, b["threshold"])
        # tie rule: no threshold of the candidate set with as few flips is closer to t_ref
        cset = set(cp) | {t_ref}
        closest = min((abs(t - t_ref), t) for t in cset if brute_flips(cp, rv, t) == min_flips)[1]
        assert b["threshold"] == closest
    else:
        assert c["best_threshold"] is None and c["operating_threshold"] == t_ref


def test_identical_candidate_has_no_flips_and_keeps_the_threshold():
    y = np.array([1, 0, 1, 1, 0, 0, 1, 0])
    lg = np.array([[2.0], [-1.0], [0.3], [1.0], [0.2], [-2.0], [-0.1], [0.1]], dtype=np.float32)
    r = P.compare(lg, {"same": lg.copy()}, y, 0.9, "ref")
    c = r["candidates"]["same"]
    assert c["at_reference_threshold"]["vs_reference"]["flips"] == 0
    assert c["best_threshold"] is None and c["operating_threshold"] == r["reference"]["threshold"]
    assert c["logits"]["max_abs_diff"] == 0.0


def test_unreachable_target_and_shapes_raise():
    y = np.array([0, 1, 0, 0])
    lg = np.array([[3.0], [2.0], [1.0], [0.0]], dtype=np.float32)  # the top text is negative
    with pytest.raises(P.ParityError, match="no threshold reaches precision 0.9"):
        P.compare(lg, {}, y, 0.9)
    with pytest.raises(P.ParityError, match="binary"):
        P.binary_scores(np.zeros((4, 3)))
    with pytest.raises(P.ParityError, match="shapes differ"):
        P.logit_deviation(lg, lg[:2])


def test_threshold_logit_is_the_runtime_logit_and_none_at_0_and_1():
    from orchestrator.runtime.routing.heads import logit

    for t in (1e-6, 0.25, 0.5, 0.9, 1 - 1e-6):
        assert P.threshold_logit(t) == logit(t)
    assert P.threshold_logit(0.5) == 0.0 and P.threshold_logit(0.9) == pytest.approx(math.log(9))
    # no finite score sits at a threshold of 0 or 1: the report shows no threshold line there
    for t in (0.0, 1.0, -0.1, 1.5):
        assert P.threshold_logit(t) is None
    r = P.compare(np.array([[-5.0], [5.0]], dtype=np.float32), {}, np.array([0, 1]), 1.0, "ref")
    assert r["reference"]["threshold_logit"] == pytest.approx(5.0, abs=1e-5)


def test_two_logit_models_use_the_log_odds():
    lg = np.array([[0.5, 2.0], [1.0, -1.0]], dtype=np.float32)
    np.testing.assert_allclose(P.binary_scores(lg), [1.5, -2.0])
    assert P.probabilities(np.array([0.0]))[0] == np.float32(0.5)


def test_recommend_rule():
    base = {"texts": 1000, "target_precision": 0.9, "reference": {"name": "ref"}}

    def cand(flips):
        vs = {"flips": flips}
        return {"at_reference_threshold": {"vs_reference": vs, "vs_labels": {"precision": 0.9}},
                "best_threshold": None, "operating_threshold": 0.7}

    res = dict(base, candidates={"fast_ok": cand(3), "faster_bad": cand(6), "same_small": cand(0)})
    lat = {"ref": {"median_ms": 100.0}, "fast_ok": {"median_ms": 90.0}, "faster_bad": {"median_ms": 50.0},
           "same_small": {"median_ms": 98.0}}
    sizes = {"ref": 100, "fast_ok": 100, "faster_bad": 50, "same_small": 50}
    rec = P.recommend(res, lat, sizes, max_flip_rate=0.005)
    assert rec["candidates"]["faster_bad"]["flips_ok"] is False  # 6 > 5
    assert rec["candidates"]["fast_ok"]["faster"] and rec["candidates"]["same_small"]["same_speed_smaller"]
    assert rec["ship"] == "fast_ok"  # the fastest qualifying one
    lat["fast_ok"]["median_ms"] = 120.0  # slower now
    assert P.recommend(res, lat, sizes)["ship"] == "same_small"
    sizes["same_small"] = 95
    rec = P.recommend(res, lat, sizes)
    assert rec["ship"] == "ref" and rec["reason"].startswith("Ship `ref`")


def test_paired_ratio():
    ref = {"median_ms": 100.0, "per_batch_ms": [100.0, 200.0, 50.0]}
    cand = {"median_ms": 90.0, "per_batch_ms": [90.0, 220.0, 45.0]}  # ratios 0.9, 1.1, 0.9
    assert P.paired_ratio(cand, ref) == pytest.approx(0.9)
    assert P.paired_ratio({"median_ms": 50.0}, ref) == pytest.approx(0.5)  # no per-batch times


# --------------------------------------------------------------------------- data files


def test_read_labeled_tsv_and_jsonl(tmp_path):
    d = P.read_labeled(FIX / "labeled.tsv")
    assert len(d.texts) == 40 and int(d.labels.sum()) == 21
    assert d.texts[20] == "A joy to watch, with real heart.\tAnd a tab inside the text."
    j = P.write_labeled(tmp_path / "x.jsonl", d, [{"i": i} for i in range(40)])
    d2 = P.read_labeled(j)
    assert d2.texts == d.texts and np.array_equal(d2.labels, d.labels) and d2.digest() == d.digest()
    t = P.write_labeled(tmp_path / "x.tsv", d)
    assert P.read_labeled(t).texts == d.texts
    (tmp_path / "bad.tsv").write_text("1\tok\n2\tbad label\n")
    with pytest.raises(P.ParityError, match="bad.tsv:2: label '2'"):
        P.read_labeled(tmp_path / "bad.tsv")
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(P.ParityError, match="bad.jsonl:1"):
        P.read_labeled(tmp_path / "bad.jsonl")


# --------------------------------------------------------------------------- the command, in-process


def independent_logits(model: str, texts, batch_size=64):
    """Tokenizer files + onnxruntime, batches of 64 padded to their longest text."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(REPO / "tokenizer" / "1"))
    sess = ort.InferenceSession(str(REPO / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for s in range(0, len(texts), batch_size):
        enc = tok(texts[s : s + batch_size], truncation=True, padding="longest", return_tensors="np")
        out.append(sess.run(["logits"], {"input_ids": enc["input_ids"].astype(np.int64),
                                         "attention_mask": enc["attention_mask"].astype(np.int64)})[0])
    return np.concatenate(out)


@pytest.fixture(scope="module")
def fixture_data():
    return P.read_labeled(FIX / "labeled.tsv")


def test_parity_command_in_process(tmp_path, fixture_data, capsys):
    parser = P.add_parity_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--reference", "classifier", "--candidates", "classifier_fp16",
                              "--data", str(FIX / "labeled.tsv"), "--repo", str(REPO), "--out", str(tmp_path),
                              "--batch-size", "16", "--quiet"])
    assert P.parity_command(args) == 0
    assert "reference classifier: threshold" in capsys.readouterr().out
    rep = json.loads((tmp_path / "report.json").read_text())
    for name in ("report.md", "logits.png", "thresholds.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "logits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # independent: logits straight from onnxruntime (batches of 16), then the hand rules
    texts, y = fixture_data.texts, fixture_data.labels
    # divided by each model's head.json temperature: parity works on the served probabilities
    ref = independent_logits("classifier", texts, 16) / read_head(REPO / "classifier").temperature
    cand = independent_logits("classifier_fp16", texts, 16) / read_head(REPO / "classifier_fp16").temperature
    rp = [float(p) for p in P.probabilities(ref[:, 0].astype(np.float64))]
    cp = [float(p) for p in P.probabilities(cand[:, 0].astype(np.float64))]
    t_ref = brute_reference_threshold(rp, y, 0.9)
    res = rep["result"]
    assert res["reference"]["threshold"] == pytest.approx(t_ref, abs=1e-6)
    flips = brute_flips(cp, [p >= t_ref for p in rp], t_ref)
    c = res["candidates"]["classifier_fp16"]
    assert c["at_reference_threshold"]["vs_reference"]["flips"] == flips
    d = cand[:, 0].astype(np.float64) - ref[:, 0]
    assert c["logits"]["max_abs_diff"] == pytest.approx(np.abs(d).max(), abs=1e-6)
    assert c["logits"]["max_abs_diff"] <= FP16_TOLERANCE
    thr = json.loads((tmp_path / "thresholds.json").read_text())
    assert thr == {"classifier": res["reference"]["threshold"], "classifier_fp16": c["operating_threshold"]}
    assert rep["data"]["texts"] == 40 and rep["batch_size"] == 16 and len(rep["batches"]) == 3
    assert set(rep["latency"]) == {"classifier", "classifier_fp16"}
    assert rep["recommendation"]["ship"] in ("classifier", "classifier_fp16")
    md = (tmp_path / "report.md").read_text()
    assert "## Recommendation" in md and f"{res['reference']['threshold']:.6f}" in md


def test_parity_command_argument_errors(tmp_path, capsys):
    parser = P.add_parity_arguments(argparse.ArgumentParser())
    assert P.parity_command(parser.parse_args(["--repo", str(REPO)])) == 2
    args = parser.parse_args(["--data", str(FIX / "labeled.tsv"), "--repo", str(REPO), "--candidates", "nope",
                              "--out", str(tmp_path), "--quiet"])
    assert P.parity_command(args) == 1
    assert "model 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------- real server


# --------------------------------------------------------------------------- every head


def head(kind, labels, positive=0, tokenizer="tokenizer"):
    from orchestrator.runtime.routing.heads import Head

    return Head(kind, tuple(labels), positive, tokenizer, 0, 48)


def test_two_logits_follow_the_heads_positive_label():
    """The score is the positive logit minus the other: sigmoid of it is the softmax's
    positive column, what the postprocess model serves (not sigmoid(logit[0]))."""
    lg = np.array([[0.5, 2.0], [1.0, -1.0], [3.0, 3.0]], dtype=np.float32)
    for pos in (0, 1):
        h = head("binary", ["NEGATIVE", "POSITIVE"], pos)
        np.testing.assert_allclose(P.probabilities(P.binary_scores(lg, h)), h.probabilities(lg)[:, 0], atol=1e-7)
    y = np.array([1, 0, 1])
    # positive column 1: probabilities 0.82, 0.12, 0.5; the two positives on top
    r = P.compare(lg, {"c": lg[:, ::-1].copy()}, y, 0.9, "r", head("binary", ["NEGATIVE", "POSITIVE"], 1))
    assert r["reference"]["threshold"] == 0.5
    assert (r["reference"]["vs_labels"]["tp"], r["reference"]["vs_labels"]["fp"]) == (2, 0)
    assert r["candidates"]["c"]["at_reference_threshold"]["vs_reference"]["flips"] == 2  # columns swapped
    with pytest.raises(P.ParityError, match="no threshold reaches precision 0.9"):  # column 0 ranks them the other way
        P.compare(lg, {}, y, 0.9, "r", head("binary", ["NEGATIVE", "POSITIVE"], 0))


def test_multiclass_flips_are_changes_of_the_top_label():
    h = head("multiclass", ["1 star", "2 stars", "3 stars"])
    ref = np.array([[3, 0, 0], [0, 2, 1], [0, 1, 2], [1, 1.1, 0]], dtype=np.float32)
    cand = np.array([[2.5, 0, 0], [0, 1, 2], [0, 1, 2.2], [1.2, 1.1, 0]], dtype=np.float32)  # texts 1 and 3 change
    y = np.array([0, 1, 2, 0])
    r = P.compare(ref, {"c": cand}, y, 0.9, "r", h)
    c = r["candidates"]["c"]
    assert c["at_reference_threshold"]["vs_reference"]["flips"] == 2
    assert r["reference"]["vs_labels"]["accuracy"] == 0.75 and c["at_reference_threshold"]["vs_labels"]["accuracy"] == 0.75
    assert c["best_threshold"] is None and c["operating_threshold"] == [0.0, 0.0, 0.0]
    brute = sum(int(np.argmax(a) != np.argmax(b)) for a, b in zip(ref, cand))
    assert brute == 2


def test_multilabel_thresholds_per_label_and_flips_per_text():
    h = head("multilabel", ["toxic", "insult"])
    rng = np.random.RandomState(0)
    n = 200
    y = rng.rand(n, 2) < 0.4
    ref = (rng.normal(0, 1.5, (n, 2)) + 2.5 * (y - 0.5)).astype(np.float32)
    cand = (ref + rng.normal(0, 0.2, (n, 2))).astype(np.float32)
    r = P.compare(ref, {"c": cand}, y, 0.8, "r", h)
    t = r["reference"]["threshold"]
    for k in range(2):  # each label's own threshold, by the binary rule on its column
        assert t[k] == P.threshold_for_precision(h.probabilities(ref)[:, k].astype(np.float32), y[:, k], 0.8)
    assert t[0] != t[1]
    pr, pc = (h.probabilities(x).astype(np.float32) for x in (ref, cand))
    vr, vc = pr >= np.float32(t), pc >= np.float32(t)
    c = r["candidates"]["c"]
    assert c["at_reference_threshold"]["vs_reference"]["flips"] == int(np.sum((vr != vc).any(axis=1))) > 0
    best = c["best_threshold"]
    assert best["vs_reference"]["flips"] <= c["at_reference_threshold"]["vs_reference"]["flips"]
    assert c["operating_threshold"] == best["threshold"] and len(best["threshold"]) == 2
    tp = int(np.sum(vr & y))
    assert r["reference"]["vs_labels"]["tp"] == tp and r["reference"]["vs_labels"]["precision"] == pytest.approx(tp / vr.sum())


def _model_with_head(repo, name, h):
    from orchestrator.tooling.modeling.configs import write_head

    (repo / name / "1").mkdir(parents=True)
    write_head(repo / name, h)


@pytest.mark.parametrize("cand, message", [
    (head("multiclass", ["a", "b", "c"]), r"c has a multiclass \(3 labels: a, b, c\) head, r a binary .* same labels"),
    (head("binary", ["NEGATIVE", "POSITIVE"], 0), "c has a binary .*'NEGATIVE'.* head, r a binary .*'POSITIVE'"),
    (head("binary", ["NEGATIVE", "POSITIVE"], 1, "other_tokenizer"), "fed by tokenizer model 'other_tokenizer'"),
])
def test_unsupported_pairs_are_refused_before_scoring(tmp_path, monkeypatch, cand, message):
    """No ONNX file exists here: a refusal after scoring would name the missing file instead."""
    _model_with_head(tmp_path, "r", head("binary", ["NEGATIVE", "POSITIVE"], 1))
    _model_with_head(tmp_path, "c", cand)
    data = P.LabeledData(["x"] * 3, np.array([0, 1, 0]), "test")
    monkeypatch.setattr(P.run, "score_all", lambda *a, **k: pytest.fail("scored"), raising=False)
    with pytest.raises(P.ParityError, match=message):
        P.run_parity("r", ["c"], data, tmp_path, None, quiet=True)


def test_labels_that_do_not_fit_the_head_are_refused(tmp_path):
    h = head("multilabel", ["toxic", "insult"])
    path = tmp_path / "d.tsv"
    path.write_text("label\ttext\ntoxic,insult\tyou idiot\n\tthanks\ninsult,rude\tbad\n")
    with pytest.raises(P.ParityError, match=r"d.tsv:4: label 'insult,rude': expected a list of labels among"):
        P.read_labeled(path, h)
    path.write_text("label\ttext\ntoxic,insult\tyou idiot\n\tthanks\n")
    assert P.read_labeled(path, h).labels.tolist() == [[True, True], [False, False]]
    stars = head("multiclass", ["1 star", "2 stars", "3 stars"])
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "a", "label": "2 stars"}\n{"text": "b", "label": 0}\n')
    assert P.read_labeled(path, stars).labels.tolist() == [1, 0]
    path.write_text('{"text": "a", "label": "6 stars"}\n')
    with pytest.raises(P.ParityError, match="s.jsonl:1: label '6 stars' is neither one of"):
        P.read_labeled(path, stars)
    _model_with_head(tmp_path, "r", h)
    _model_with_head(tmp_path, "c", h)
    with pytest.raises(P.ParityError, match=r"labels of shape \[2\] for a multilabel"):
        P.run_parity("r", ["c"], P.LabeledData(["a", "b"], np.array([0, 1]), "t"), tmp_path, None, quiet=True)


@pytest.mark.parametrize("name", ["toxic6", "stars5", "bert2"])
def test_parity_command_on_exported_heads(byom_checkpoints, tmp_path, capsys, name):  # noqa: F811
    """`orchestrator parity` on an exported checkpoint and its fp16 copy, with labels for its
    head: the report's probabilities are the head's, thresholds per label for multilabel."""
    import shutil

    from orchestrator.runtime.routing.heads import read_head
    from orchestrator.tooling.modeling import export as E
    from tests.byom import TEXTS

    pytest.importorskip("torch", reason="needs torch (the `train` extra: make test installs it, make demo does not)")
    repo = tmp_path / "model_repository"
    shutil.copytree(REPO / "tokenizer", repo / "tokenizer")  # a repository holds more than the models compared
    E.export_checkpoint(str(byom_checkpoints[name][0]), repo, name, fp16=True, quiet=True, tensorrt=False)
    h = read_head(repo / name)
    data = tmp_path / "data.jsonl"
    rows = []
    for i, text in enumerate(TEXTS):
        label = ([h.labels[(i + j) % len(h.labels)] for j in range(2)] if h.kind == "multilabel"
                 else h.labels[i % len(h.labels)] if h.kind == "multiclass" else i % 2)
        rows.append(json.dumps({"text": text, "label": label}))
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "report"
    parser = P.add_parity_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--reference", name, "--data", str(data), "--repo", str(repo), "--out", str(out),
                              "--target-precision", "0.01", "--quiet"])
    assert P.parity_command(args) == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["head"] == json.loads(h.to_json())
    thresholds = report["thresholds"][name]
    if h.kind == "multilabel":
        assert isinstance(thresholds, list) and len(thresholds) == 6
    elif h.kind == "multiclass":
        assert thresholds == [0.0] * 5
    else:
        assert isinstance(thresholds, float) and (out / "logits.png").is_file()
    cand = report["result"]["candidates"][f"{name}_fp16"]
    assert cand["logits"]["max_abs_diff"] <= FP16_TOLERANCE
    assert f"reference {name}: threshold" in capsys.readouterr().out
    assert (out / "report.md").read_text().startswith(f"# Parity report: `{name}_fp16` vs `{name}`")
