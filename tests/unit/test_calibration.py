"""Temperature scaling: fitting recovers a known temperature on synthetic logits, heads apply
it for every kind, ``head.json`` round trip and errors, the measures, the postprocess config
edit (orchestrator/tooling/modeling/parity/calibration.py, orchestrator/runtime/routing/heads.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.runtime.routing.heads import BINARY, MULTICLASS, MULTILABEL, Head, HeadError
from orchestrator.tooling import repository
from orchestrator.tooling.modeling.parity import calibration as C
from tests.helpers import REPO

pytest.importorskip("scipy")

RNG = np.random.default_rng(0)


def _sample(p):
    return (RNG.random(p.shape) < p).astype(np.int64)


def test_fit_recovers_a_binary_temperature_one_logit():
    true_scores = RNG.normal(0, 2.0, 40000)
    y = _sample(1 / (1 + np.exp(-true_scores)))
    head = Head(BINARY, ("positive",))
    t = C.fit_temperature(head, (true_scores * 3.0).reshape(-1, 1), y)  # logits 3x too sure
    assert t == [pytest.approx(3.0, rel=0.05)]


def test_fit_recovers_a_binary_temperature_two_logits_positive_first():
    s = RNG.normal(0, 2.0, 40000)
    y = _sample(1 / (1 + np.exp(-s)))
    head = Head(BINARY, ("POSITIVE", "NEGATIVE"), positive_index=0)
    z = np.stack([s * 0.5 + 1.0, 1.0 - s * 0.0], axis=1)  # score = pos - neg = s / 2: under-confident
    assert C.fit_temperature(head, z, y) == [pytest.approx(0.5, rel=0.05)]


def test_fit_recovers_a_multiclass_temperature():
    z = RNG.normal(0, 2.0, (30000, 4))
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    y = np.array([RNG.choice(4, p=row) for row in p])
    head = Head(MULTICLASS, ("a", "b", "c", "d"))
    assert C.fit_temperature(head, z * 2.0, y) == [pytest.approx(2.0, rel=0.05)]


def test_fit_recovers_one_temperature_per_multilabel_label():
    z = RNG.normal(0, 2.0, (30000, 3))
    y = _sample(1 / (1 + np.exp(-z))).astype(bool)
    head = Head(MULTILABEL, ("x", "y", "z"))
    got = C.fit_temperature(head, z * np.array([0.5, 1.0, 4.0]), y)
    assert got == [pytest.approx(0.5, rel=0.05), pytest.approx(1.0, rel=0.05), pytest.approx(4.0, rel=0.05)]


def test_fit_refuses_one_class_and_mismatched_rows():
    head = Head(BINARY, ("positive",))
    with pytest.raises(C.CalibrationError, match="same"):
        C.fit_temperature(head, np.ones((5, 1)), np.ones(5, dtype=np.int64))
    with pytest.raises(C.CalibrationError, match="4 logit rows for 5 labels"):
        C.fit_temperature(head, np.ones((4, 1)), np.ones(5, dtype=np.int64))


def _cal(t):
    return {"method": "temperature", "temperature": t}


@pytest.mark.parametrize("head, z, want", [
    (Head(BINARY, ("positive",), calibration=_cal(2.0)), [[4.0]], [[1 / (1 + np.exp(-2.0))]]),
    (Head(BINARY, ("NEG", "POS"), positive_index=1, calibration=_cal(2.0)), [[1.0, 5.0]], [[1 / (1 + np.exp(-2.0))]]),
    (Head(MULTICLASS, ("a", "b", "c"), calibration=_cal(2.0)), [[0.0, 2.0, 4.0]],
     [np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()]),
    (Head(MULTILABEL, ("a", "b"), calibration=_cal([2.0, 0.5])), [[2.0, 1.0]],
     [[1 / (1 + np.exp(-1.0)), 1 / (1 + np.exp(-2.0))]]),
    (Head(MULTILABEL, ("a", "b"), calibration=_cal(2.0)), [[2.0, 4.0]],
     [[1 / (1 + np.exp(-1.0)), 1 / (1 + np.exp(-2.0))]]),
])
def test_heads_divide_the_logits_by_the_temperature(head, z, want):
    np.testing.assert_allclose(head.probabilities(np.array(z, dtype=np.float32)), want, rtol=1e-12)


def test_a_head_without_calibration_answers_as_before_and_the_shift_comes_after_the_temperature():
    plain = Head(BINARY, ("positive",))
    assert plain.temperature is None and "calibration" not in json.loads(plain.to_json())
    np.testing.assert_allclose(plain.probabilities(np.array([[1.5]])), [[1 / (1 + np.exp(-1.5))]])
    cal = Head(BINARY, ("positive",), calibration=_cal(3.0))
    np.testing.assert_allclose(cal.probabilities(np.array([[3.0]]), 1.0), [[1 / (1 + np.exp(-2.0))]])


def test_calibration_round_trips_through_head_json_and_bad_values_are_named():
    head = Head(MULTILABEL, ("a", "b"), calibration={**_cal([1.5, 2.5]), "fitted_on": "x"})
    back = Head.from_json(head.to_json())
    assert back.calibration == head.calibration and list(back.temperature) == [1.5, 2.5]
    for bad, msg in [({"method": "platt"}, "calibration.method"), (_cal(0.0), "calibration.temperature"),
                     (_cal("2"), "calibration.temperature"), (_cal([1.0, 2.0, 3.0]), "list of 2"), ([1], "JSON object")]:
        doc = json.loads(Head(MULTILABEL, ("a", "b")).to_json())
        doc["calibration"] = bad
        with pytest.raises(HeadError, match=msg):
            Head.from_mapping(doc, "m/head.json")
    with pytest.raises(HeadError, match="a positive number"):  # a list is for multilabel heads only
        Head(BINARY, ("positive",), calibration=_cal([2.0]))


def test_ece_brier_and_reliability_on_known_answers():
    head = Head(BINARY, ("positive",))
    p = np.array([[0.9], [0.9], [0.1], [0.1]])
    y = np.array([1, 0, 0, 0])
    # bin of 0.9: frequency 0.5 (gap 0.4, half the texts); bin of 0.1: frequency 0 (gap 0.1)
    assert C.ece(head, p, y) == pytest.approx(0.5 * 0.4 + 0.5 * 0.1)
    assert C.brier(head, p, y) == pytest.approx((0.01 + 0.81 + 0.01 + 0.01) / 4)
    assert [q["n"] for q in C.reliability(head, p, y)] == [2, 2]
    mc = Head(MULTICLASS, ("a", "b", "c"))
    pm = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1]])
    assert C.brier(mc, pm, np.array([0, 2])) == pytest.approx(((0.04 + 0.01 + 0.01) + (0.04 + 0.49 + 0.81)) / 2)
    assert C.accuracy(mc, pm, np.array([0, 2])) == 0.5


def test_temperature_scaling_lowers_the_ece_of_over_confident_logits():
    s = RNG.normal(0, 1.5, 20000)
    y = _sample(1 / (1 + np.exp(-s)))
    head = Head(BINARY, ("positive",))
    z = (s * 4).reshape(-1, 1)
    t = C.fit_temperature(head, z, y)
    before, after = C.summary(head, z, y), C.summary(C.with_temperature(head, t), z, y)
    assert after["ece"] < before["ece"] / 3 and after["brier"] < before["brier"]
    assert after["accuracy"] == before["accuracy"]


def test_the_postprocess_config_gets_the_head_keeping_its_comments(tmp_path):
    cfg = tmp_path / "config.pbtxt"
    original = (REPO / "postprocess" / "config.pbtxt").read_text()
    cfg.write_text(original)
    head = Head(BINARY, ("positive",), max_length=128, calibration=_cal(1.7))
    C.set_postprocess_head(cfg, head)
    again = Head(BINARY, ("positive",), max_length=128, calibration=_cal(2.2))
    C.set_postprocess_head(cfg, again)  # replaced in place, not added twice
    text = cfg.read_text()
    assert text.count('key: "head"') == 1 and text.splitlines()[0] == original.splitlines()[0]
    assert Head.from_json(repository.get_parameter(repository.read_config(cfg), "head")).calibration == again.calibration


def test_the_postprocess_of_a_model_is_found_in_the_repositorys_ensembles():
    assert C.postprocess_models(REPO, "classifier") == ["postprocess"]
    assert C.postprocess_models(REPO, "classifier_fast") == []


def test_labeled_data_from_a_file_or_an_unknown_split(tmp_path):
    f = tmp_path / "d.tsv"
    f.write_text("label\ttext\n1\tgood\n0\tbad\n")
    d = C.load_data(str(f))
    assert d.texts == ["good", "bad"] and list(d.labels) == [1, 0]
    with pytest.raises(C.CalibrationError, match="unknown split"):
        C.load_data("split:dev")
    with pytest.raises(C.CalibrationError, match="no such file"):
        C.load_data(str(tmp_path / "missing.tsv"))
