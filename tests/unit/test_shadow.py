"""``shadow`` nodes and pinned model versions through the engine with the fake BLS function
(``tests.helpers.FakeBLS``): the primary answers, the candidate runs in the background
and is compared in metrics, never changing or delaying an answer."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import numpy as np
import pytest

from orchestrator.runtime.errors import DownstreamError, PolicyError
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing.nodes.model import split_target, target
from orchestrator.runtime.routing.nodes.split import split_fraction
from orchestrator.runtime.routing.policy import describe, parse_policy
from orchestrator.runtime.serving.router import warmup_executes
from tests.helpers import FakeBLS, expected_logit, ids_of, sig

TEXTS = ["good good film", "bad plot", "good bad", "a long tale of good things", "bad bad bad good"]


class RecordingMetrics:
    """What ``metrics.Metrics`` receives, kept in memory."""

    def __init__(self):
        self.counts = defaultdict(float)
        self.observations = defaultdict(list)
        self.gauges = {}

    def inc(self, family, value=1.0, **labels):
        self.counts[(family, tuple(sorted(labels.items())))] += value

    def observe(self, family, value, **labels):
        self.observations[(family, tuple(sorted(labels.items())))].append(value)

    def set(self, family, value, **labels):
        self.gauges[(family, tuple(sorted(labels.items())))] = value

    def record(self, counts, observations, gauges):
        for key, value in counts.items():
            self.counts[key] += value
        for key, values in observations.items():
            self.observations[key].extend(values)
        self.gauges.update(gauges)

    def count(self, family, **labels):
        return self.counts.get((family, tuple(sorted(labels.items()))), 0.0)


def model(name, **kw):
    return {"kind": "model", "name": kw.pop("node_name", name), "model": name, **kw}


def shadow_doc(primary="fast", candidate="accurate", **kw):
    return {"version": 1, "inline": {"postprocess": True},
            "root": {"kind": "shadow", "name": "sh", "primary": model(primary), "candidate": model(candidate), **kw}}


def make(doc, fake=None, metrics=None):
    fake = fake or FakeBLS()
    metrics = metrics or RecordingMetrics()
    return Engine(parse_policy(doc), fake, metrics), fake, metrics


def run(engine, texts, request_id="", thresholds=0.5):
    thr = np.full(len(texts), thresholds, np.float32)
    [result] = asyncio.run(engine.run([Work(list(texts), thr, {}, request_id)]))
    return result


LABELS = {"node": "sh", "candidate": "accurate"}


def test_shadow_answers_from_the_primary_and_compares_the_candidate_in_metrics():
    engine, fake, metrics = make(shadow_doc())
    result = run(engine, TEXTS, request_id="r1")
    want = [sig(expected_logit("fast", ids_of(t))) for t in TEXTS]
    np.testing.assert_allclose(result.probabilities.reshape(-1), want, rtol=1e-6)
    assert result.routes == ["fast"] * len(TEXTS)
    assert engine.mirror_runner.wait(5.0)
    engine.close()
    cand = [sig(expected_logit("accurate", ids_of(t))) for t in TEXTS]
    flips = sum((p >= 0.5) != (q >= 0.5) for p, q in zip(want, cand))
    assert flips > 0  # the fake models disagree on some of TEXTS, so the count is tested
    assert metrics.count("orchestrator_shadow_texts_total", **LABELS) == len(TEXTS)
    assert metrics.count("orchestrator_shadow_flips_total", **LABELS) == flips
    diffs = metrics.observations[("orchestrator_shadow_probability_difference", tuple(sorted(LABELS.items())))]
    np.testing.assert_allclose(sorted(diffs), sorted(abs(p - q) for p, q in zip(want, cand)), rtol=1e-6)
    # the candidate got the same token rows, in its own call after the primary's
    calls = [c for c in fake.calls if c["model"] == "accurate"]
    assert len(calls) == 1 and calls[0]["rows"] == len(TEXTS)
    assert metrics.gauges[("orchestrator_shadow_queued_texts", (("node", "sh"),))] == 0


def test_a_slow_candidate_does_not_delay_the_answer():
    engine, fake, metrics = make(shadow_doc(), fake=FakeBLS(delay={"accurate": 1.0}))
    start = time.perf_counter()
    result = run(engine, TEXTS, request_id="r1")
    assert time.perf_counter() - start < 0.5  # the candidate's 1 s runs in the background
    assert result.routes == ["fast"] * len(TEXTS)
    assert metrics.count("orchestrator_shadow_texts_total", **LABELS) == 0
    assert engine.mirror_runner.wait(5.0)
    assert metrics.count("orchestrator_shadow_texts_total", **LABELS) == len(TEXTS)
    engine.close()


def test_a_failing_candidate_is_counted_and_never_changes_the_answer():
    alone, _, _ = make({"version": 1, "inline": {"postprocess": True}, "root": model("fast")})
    engine, _, metrics = make(shadow_doc(), fake=FakeBLS(fail={"accurate"}))
    result = run(engine, TEXTS, request_id="r1")
    reference = run(alone, TEXTS, request_id="r1")
    np.testing.assert_array_equal(result.probabilities, reference.probabilities)
    assert result.routes == reference.routes
    assert engine.mirror_runner.wait(5.0)
    assert metrics.count("orchestrator_shadow_errors_total", **LABELS) == len(TEXTS)
    assert metrics.count("orchestrator_shadow_texts_total", **LABELS) == 0
    engine.close()


def test_a_full_queue_drops_and_counts():
    engine, _, metrics = make(shadow_doc(queue_size=len(TEXTS)), fake=FakeBLS(delay={"accurate": 0.5}))
    for k in range(3):  # the first batch fills the queue while the candidate sleeps
        run(engine, TEXTS, request_id=f"r{k}")
    assert metrics.count("orchestrator_shadow_dropped_total", **LABELS) == 2 * len(TEXTS)
    assert engine.mirror_runner.wait(5.0)
    assert metrics.count("orchestrator_shadow_texts_total", **LABELS) == len(TEXTS)
    engine.close()


def test_sampling_is_deterministic_per_request_id():
    engine, fake, metrics = make(shadow_doc(sample=0.3))
    ids = [f"req-{k}" for k in range(40)]
    for rid in ids:
        run(engine, ["good film"], request_id=rid)
    assert engine.mirror_runner.wait(5.0)
    want = sum(split_fraction("sh", rid) < 0.3 for rid in ids)
    assert 0 < want < len(ids)
    assert metrics.count("orchestrator_shadow_texts_total", **LABELS) == want
    engine.close()
    never, fake, _ = make(shadow_doc(sample=0.0))
    run(never, TEXTS, request_id="r1")
    assert never.mirror_runner.thread is None and "accurate" not in fake.models_called()


def test_a_model_node_pins_a_version_and_its_route_names_it():
    doc = {"version": 1, "inline": {"postprocess": True},
           "root": {"kind": "split", "name": "ab", "branches": [{"weight": 1, "node": model("fast", version=1, node_name="v1")},
                                                                  {"weight": 1, "node": model("fast", version=2, node_name="v2")}]}}
    engine, fake, _ = make(doc)
    for rid in ["a", "b", "c", "d", "e", "f"]:
        version = 1 if split_fraction("ab", rid) < 0.5 else 2
        result = run(engine, ["good film"], request_id=rid)
        assert result.routes == [f"fast@{version}"]
        assert result.probabilities[0, 0] == pytest.approx(sig(expected_logit(f"fast@{version}", ids_of("good film"))), rel=1e-6)
        assert fake.calls[-1]["model"] == f"fast@{version}"
    policy = parse_policy(doc)
    assert policy.models() == ["tokenizer", "fast@1", "fast@2"]
    assert "model fast@1 max_length=128" in describe(policy)
    assert (target("fast", 2), split_target("fast@2"), split_target("fast"), split_target("a@b")) == (
        "fast@2", ("fast", 2), ("fast", None), ("a@b", None))


def test_shadow_across_versions_of_one_model():
    doc = {"version": 1, "inline": {"postprocess": True},
           "root": {"kind": "shadow", "name": "sh", "primary": model("fast", version=1, node_name="p"),
                    "candidate": model("fast", version=2, node_name="c")}}
    engine, fake, metrics = make(doc)
    result = run(engine, TEXTS)
    assert result.routes == ["fast@1"] * len(TEXTS)
    assert engine.mirror_runner.wait(5.0)
    assert metrics.count("orchestrator_shadow_texts_total", node="sh", candidate="c") == len(TEXTS)
    assert sorted(set(fake.models_called())) == ["fast@1", "fast@2", "tokenizer"]
    engine.close()


class WrongRows(FakeBLS):
    """Answers every classifier call with one row, as a response-cache entry of another
    request with the same input bytes would."""

    async def __call__(self, model, inputs, parameters, request_id, alone, options=None):
        out = await super().__call__(model, inputs, parameters, request_id, alone, options)
        return {k: v[:1] for k, v in out.items()} if model == "fast" else out


def test_an_answer_with_another_row_count_is_an_error_not_a_broadcast():
    engine, _, _ = make({"version": 1, "inline": {"postprocess": True}, "root": model("fast")}, fake=WrongRows())
    with pytest.raises(DownstreamError, match=r"model 'fast' answered 1 rows of 'logits' for 2 input rows"):
        run(engine, ["good film", "bad plot"])


@pytest.mark.parametrize("document,message", [
    ({"version": 1, "root": {"kind": "shadow", "primary": model("fast"), "candidate": "accurate"}},
     "root.candidate: expected a node (a mapping with 'kind'), got str"),
    ({"version": 1, "root": {"kind": "shadow", "primary": model("fast")}}, "root.candidate: required key is missing"),
    (shadow_doc(sample=1.5), "root.sample: 1.5 is outside [0.0, 1.0]"),
    (shadow_doc(queue_size=0), "root.queue_size: 0 is outside [1, 1048576]"),
    ({"version": 1, "root": model("fast", version=0)}, "root.version: 0 is outside"),
    ({"version": 1, "root": model("fast", version="2")}, "root.version: expected an integer, got '2'"),
    ({"version": 1, "root": model("fast@2")}, "root.model: 'fast@2' contains '@'; name a version with the key 'version'"),
])
def test_invalid_shadow_and_version_keys_name_their_location(document, message):
    with pytest.raises(PolicyError) as info:
        parse_policy(document)
    assert message in str(info.value)


def test_router_counts_its_warmup_executes_from_the_config():
    assert warmup_executes({}) == 0
    assert warmup_executes({"model_warmup": [{"name": "a", "batch_size": 1, "count": 0},
                                             {"name": "b", "batch_size": 4, "count": 3},
                                             {"name": "skipped", "batch_size": 0, "count": 2}]}) == 4
