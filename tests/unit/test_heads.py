"""Heads (runtime/routing/heads.py): each rule computed here independently with numpy, boundaries
included, and the transformers config mapping."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.runtime.request import InputError, check_thresholds
from orchestrator.runtime.routing.heads import (
    BINARY,
    LEGACY,
    MULTICLASS,
    MULTILABEL,
    Head,
    HeadError,
    head_from_hf_config,
    head_of_parameters,
    read_head,
)

LOGITS = np.array([[0.3, -1.2, 2.0], [1.5, 1.5, -0.5]], dtype=np.float32)


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sig(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


def test_binary_one_logit_is_sigmoid_with_a_calibration_shift():
    z = np.array([[0.4], [-2.0]], np.float32)
    np.testing.assert_allclose(LEGACY.probabilities(z), sig(z), rtol=1e-12)
    np.testing.assert_allclose(LEGACY.probabilities(z, 0.5), sig(z.astype(np.float64) + 0.5), rtol=1e-12)
    assert LEGACY.columns == 1 and LEGACY.output_labels() == ("positive",)


@pytest.mark.parametrize("pos", [0, 1])
def test_binary_two_logits_is_the_softmax_column_of_the_positive_label(pos):
    head = Head(BINARY, ("NEGATIVE", "POSITIVE") if pos else ("POSITIVE", "NEGATIVE"), positive_index=pos)
    z = LOGITS[:, :2]
    np.testing.assert_allclose(head.probabilities(z)[:, 0], softmax(z.astype(np.float64))[:, pos], rtol=1e-12)
    assert head.output_labels() == ("POSITIVE",) and head.columns == 1


def test_multiclass_is_softmax_and_its_verdict_is_the_top_label_above_its_threshold():
    head = Head(MULTICLASS, ("a", "b", "c"))
    p = head.probabilities(LOGITS)
    np.testing.assert_allclose(p, softmax(LOGITS.astype(np.float64)), rtol=1e-12)
    v = head.verdicts(p, np.array([[0.5], [0.5]]))
    assert v.tolist() == [[False, False, True], [False, False, False]]  # row 1: the top p (0.468) < 0.5
    v = head.verdicts(p, np.array([[0.0], [0.0]]))
    assert v.sum(axis=1).tolist() == [1, 1]  # one label only, also on a tie (argmax: the first)
    exact = np.float32(p[0, 2])
    assert head.verdicts(p[:1], np.array([[exact]]))[0, 2]  # >=: equal to the threshold is true


def test_multilabel_is_sigmoid_per_label_with_a_threshold_per_label():
    head = Head(MULTILABEL, ("toxic", "insult", "threat"))
    p = head.probabilities(LOGITS)
    np.testing.assert_allclose(p, sig(LOGITS), rtol=1e-12)
    per_label = np.array([[0.5, 0.1, 0.95], [0.9, 0.5, 0.5]])
    assert head.verdicts(p, per_label).tolist() == (p.astype(np.float32) >= per_label.astype(np.float32)).tolist()
    assert head.verdicts(p, np.array([[0.5], [0.5]])).tolist() == (p >= 0.5).tolist()
    np.testing.assert_allclose(head.probabilities(LOGITS, np.array([0.1, 0.0, -0.2])), sig(LOGITS + [0.1, 0.0, -0.2]))


def test_a_head_refuses_logits_of_another_width():
    with pytest.raises(HeadError, match="expected 1 logit column"):
        LEGACY.probabilities(LOGITS)


def test_unsure_rules_and_their_strict_boundaries():
    assert LEGACY.unsure([0.6], [0.5], 0.2) and not LEGACY.unsure([0.75], [0.5], 0.25)  # |p - t| < margin, strictly
    mc = Head(MULTICLASS, ("a", "b", "c"))
    assert mc.unsure([0.45, 0.40, 0.15], [0.5], 0.1)  # top two 0.05 apart
    assert not mc.unsure([0.5, 0.25, 0.25], [0.5], 0.25)  # exactly the margin apart: sure
    ml = Head(MULTILABEL, ("a", "b"))
    assert ml.unsure([0.99, 0.55], [0.5, 0.5], 0.1) and not ml.unsure([0.99, 0.05], [0.5, 0.5], 0.1)
    assert ml.unsure([0.99, 0.05], [0.5, 0.1], 0.1)  # per-label thresholds


def test_flips_per_head():
    mc = Head(MULTICLASS, ("a", "b", "c"))
    assert mc.flipped([0.5, 0.3, 0.2], [True, False, False], [0.3, 0.5, 0.2], [False, True, False])
    assert not mc.flipped([0.5, 0.3, 0.2], [True, False, False], [0.4, 0.3, 0.3], [False, False, False])  # same top label
    ml = Head(MULTILABEL, ("a", "b"))
    assert ml.flipped([0.9, 0.2], [True, False], [0.9, 0.6], [True, True])
    assert not ml.flipped([0.9, 0.2], [True, False], [0.8, 0.3], [True, False])


def test_combine_column_by_column():
    mc = Head(MULTICLASS, ("a", "b", "c"))
    parts = [[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]
    np.testing.assert_allclose(mc.combine(parts, "mean"), [0.4, 0.25, 0.35])
    np.testing.assert_allclose(mc.combine(parts, "mean", [3, 1]), [0.5, 0.275, 0.225])
    np.testing.assert_allclose(mc.combine(parts, "max"), np.array([0.6, 0.3, 0.6]) / 1.5)  # still a distribution
    ml = Head(MULTILABEL, ("a", "b", "c"))
    np.testing.assert_allclose(ml.combine(parts, "max"), [0.6, 0.3, 0.6])


def test_head_json_round_trip_and_located_errors(tmp_path):
    head = Head(MULTICLASS, ("1 star", "2 stars", "3 stars"), tokenizer="stars_tokenizer", pad_token_id=1, max_length=256)
    (tmp_path / "head.json").write_text(head.to_json())
    assert read_head(tmp_path) == head and read_head(tmp_path / "nothing") is None
    assert head_of_parameters({"head": head.to_json()}) == head and head_of_parameters({}) is LEGACY
    (tmp_path / "head.json").write_text('{"kind": "binary", "labels": ["a", "b", "c"]}')
    with pytest.raises(HeadError, match=r"head.json: a binary head has 1 or 2 logits, got 3 labels"):
        read_head(tmp_path)
    with pytest.raises(HeadError, match="required key 'labels' is missing"):
        Head.from_json('{"kind": "binary"}')
    with pytest.raises(HeadError, match="positive_index 2 is not a column"):
        Head(BINARY, ("a", "b"), positive_index=2)
    with pytest.raises(HeadError, match="2 labels are a binary head"):
        Head(MULTICLASS, ("a", "b"))


class Config:
    def __init__(self, num_labels, id2label=None, problem_type=None):
        self.num_labels, self.problem_type = num_labels, problem_type
        self.id2label = id2label or {i: f"LABEL_{i}" for i in range(num_labels)}


def test_heads_from_transformers_configs():
    def head(cfg, **kw):
        return head_from_hf_config(cfg, "t", 0, 128, **kw)

    assert head(Config(1)).kind == BINARY and head(Config(1)).positive_index == 0
    sst2 = head(Config(2, {0: "NEGATIVE", 1: "POSITIVE"}))
    assert (sst2.kind, sst2.positive_index, sst2.output_labels()) == (BINARY, 1, ("POSITIVE",))
    assert head(Config(2, {0: "positive", 1: "negative"})).positive_index == 0  # found by name
    assert head(Config(2)).positive_index == 1  # LABEL_0/LABEL_1: index 1, the SST-2 convention
    assert head(Config(2, {0: "spam", 1: "ham"}), positive_label="spam").positive_index == 0
    assert head(Config(5, problem_type="single_label_classification")).kind == MULTICLASS
    assert head(Config(6, problem_type="multi_label_classification")).kind == MULTILABEL
    assert head(Config(2, problem_type="multi_label_classification")).kind == MULTILABEL
    with pytest.raises(HeadError, match="regression"):
        head(Config(1, problem_type="regression"))
    with pytest.raises(HeadError, match="'maybe' is not one of"):
        head(Config(2), positive_label="maybe")


def test_thresholds_per_text_or_per_label():
    assert check_thresholds(np.array([[0.2], [0.4]], np.float32), 2).shape == (2, 1)
    assert check_thresholds(np.full((2, 3), 0.5, np.float32), 2, columns=3).shape == (2, 3)
    with pytest.raises(InputError, match=r"THRESHOLD: expected shape \[2, 1\] \(one threshold per text\) or \[2, 3\]"):
        check_thresholds(np.full((2, 2), 0.5, np.float32), 2, columns=3)
    with pytest.raises(InputError, match=r"THRESHOLD\[1, 2\] = 1.5"):
        check_thresholds(np.array([[0.1, 0.2, 0.3], [0.1, 0.2, 1.5]], np.float32), 2, columns=3)
    with pytest.raises(InputError, match=r"expected shape \[2, 1\]"):
        check_thresholds(np.full((2, 3), 0.5, np.float32), 2)  # a binary head takes one per text


def test_sigmoid_of_one_logit_is_the_vectorised_one_bit_for_bit():
    """One logit goes through Python floats around numpy's exp (the router's c=1 path); it
    must give the very bits of the vectorised formula, whatever the value."""
    from orchestrator.runtime.routing.heads import sigmoid

    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e308, -1e308, 5e-324, -5e-324, 36.7, -36.7, 709.0, -745.1, -746.0]
    values = np.concatenate([np.random.default_rng(7).normal(0.0, 8.0, 20000), edges])
    together = sigmoid(np.stack([values, np.zeros_like(values)], axis=1))[:, 0]  # two per row: the vectorised path
    alone = np.array([sigmoid(np.array([v]))[0] for v in values])
    assert np.array_equal(alone.view(np.int64), together.view(np.int64))
    assert sigmoid(np.array([[-2.0]])).shape == (1, 1) and sigmoid(np.array([-2.0])).dtype == np.float64


@pytest.mark.parametrize("calibration", [None, {"method": "temperature", "temperature": 1.37}, {"method": "temperature", "temperature": 0.5}])
@pytest.mark.parametrize("shift", [0.0, 0.731, -2.25])
def test_one_texts_probability_is_the_batchs_bit_for_bit(calibration, shift):
    """A binary head's one-text path (Python floats: the router at c=1) gives the bits of the
    vectorised path over a batch, with and without a temperature and a logit shift."""
    head = Head("binary", ("positive",), calibration=calibration)
    logits = np.concatenate([np.random.default_rng(3).normal(0.0, 6.0, 3000), [0.0, -0.0, 40.0, -40.0, 800.0, -800.0]])
    batch = head.probabilities(logits.astype(np.float32).reshape(-1, 1), shift)[:, 0]
    alone = np.array([head.probabilities(np.array([[v]], np.float32), shift)[0, 0] for v in logits.astype(np.float32)])
    assert np.array_equal(alone.view(np.int64), batch.view(np.int64))
    assert head.probabilities(np.array([[0.3]], np.float32), shift).shape == (1, 1)
