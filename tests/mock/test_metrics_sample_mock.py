"""The router's config parameter ``metrics_timing_sample`` (runtime/metrics.py) on the
in-process mock: absent, the router sends at most ``MAX_SAMPLED`` timing observations per
series per flush; ``all`` sends every one; ``off`` takes none (every other metric still
counts); a bad value fails the router's load, naming the parameter."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from orchestrator.runtime import metrics as M
from orchestrator.testing.mock import MockTriton
from orchestrator.tooling.repository import read_config, write_config
from tests.helpers import REPO


def _repo(tmp_path, value):
    repo = tmp_path / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    if value is not None:
        path = repo / "router" / "config.pbtxt"
        config = read_config(path)
        config.parameters[M.SAMPLE_PARAMETER].string_value = value
        write_config(path, config, ["test: metrics_timing_sample"])
    return repo


def _stage_count(tmp_path, value, texts=40):
    with MockTriton(_repo(tmp_path, value)) as mock:
        for name in ("tokenizer", "classifier", "classifier_fast", "router"):
            mock.load(name)
        router = mock.loaded("router").instance
        router.metrics.stop.set()  # only the flushes below send: one interval's sample
        router.metrics.flusher.join(5)
        router.metrics.flush()
        before = _count(mock)
        for i in range(texts):
            mock.infer("router", {"TEXT": np.array([[f"review {i}: a fine film".encode()]], dtype=np.object_),
                                  "THRESHOLD": np.full((1, 1), 0.5, np.float32)})
        router.metrics.flush()
        return router.metrics.max_sampled, _count(mock) - before


def _count(mock):
    """The parse stage histogram's ``count`` (0 before its first observation)."""
    value = mock.metric("orchestrator_stage_seconds", {"router": "router", "stage": "parse"})
    return value["count"] if value else 0


def test_the_shipped_router_sends_a_sample_and_all_sends_every_observation(tmp_path):
    sampled, count = _stage_count(tmp_path / "shipped", None)
    assert sampled == M.MAX_SAMPLED and 0 < count <= M.MAX_SAMPLED
    every, count = _stage_count(tmp_path / "all", "all")
    assert every is None and count == 40


def test_off_takes_no_timing_observation_and_keeps_every_other_metric(tmp_path):
    sampled, count = _stage_count(tmp_path / "off", "off")
    assert sampled == 0 and count == 0
    with MockTriton(_repo(tmp_path / "off2", "off")) as mock:
        for name in ("tokenizer", "classifier", "classifier_fast", "router"):
            mock.load(name)
        router = mock.loaded("router").instance
        for i in range(3):
            mock.infer("router", {"TEXT": np.array([[f"review {i}: a fine film".encode()]], dtype=np.object_),
                                  "THRESHOLD": np.full((1, 1), 0.5, np.float32)})
        router.metrics.flush()
        families = mock.metrics()
        assert not families.get("orchestrator_stage_seconds") and not families.get("orchestrator_node_latency_seconds")
        assert mock.metric("orchestrator_requests_total", {"router": "router", "outcome": "success"}) == 3
        assert sum(families["orchestrator_texts_total"].values()) == 3


def test_a_bad_value_fails_the_load_by_name(tmp_path):
    with MockTriton(_repo(tmp_path, "lots")) as mock:
        for name in ("tokenizer", "classifier", "classifier_fast"):
            mock.load(name)
        with pytest.raises(Exception, match="metrics_timing_sample='lots'"):
            mock.load("router")


def _repo_with(tmp_path, key, value):
    repo = tmp_path / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    path = repo / "router" / "config.pbtxt"
    config = read_config(path)
    config.parameters[key].string_value = value
    write_config(path, config, [f"test: {key}"])
    return repo


def _answers(repo, texts):
    with MockTriton(repo) as mock:
        for name in ("tokenizer", "classifier", "classifier_fast", "router"):
            mock.load(name)
        router = mock.loaded("router").instance
        out = [mock.infer("router", {"TEXT": np.array([[t.encode()]], dtype=np.object_),
                                     "THRESHOLD": np.full((1, 1), 0.5, np.float32)}) for t in texts]
        router.metrics.flush()
        families = {k: v for k, v in mock.metrics().items() if k.startswith("orchestrator_") and v}
        return [{k: v.tolist() for k, v in o.items()} for o in out], families, router


def test_metrics_off_answers_alike_and_registers_no_family_of_its_own(tmp_path):
    """``metrics: off``: the same answers, no ``orchestrator_*`` series, no flusher thread, and
    the engine's runs get no metrics sink (nothing counted, observed or flushed per execute)."""
    texts = ["a fine film", "", "dull and long, " * 60, "an awful mess"]
    shipped, shipped_families, _ = _answers(_repo(tmp_path / "on", None), texts)
    off, off_families, router = _answers(_repo_with(tmp_path / "off", M.ENABLED_PARAMETER, "off"), texts)
    assert off == shipped
    assert sum(shipped_families["orchestrator_texts_total"].values()) == len(texts)
    assert off_families == {}
    assert router.metrics.enabled is False and router.metrics.families == {} and not hasattr(router.metrics, "flusher")
    assert router.engine.metrics is None and router.engine.start(router.engine.infer).timing is False


def test_a_bad_metrics_value_fails_the_load_by_name(tmp_path):
    with MockTriton(_repo_with(tmp_path, M.ENABLED_PARAMETER, "sometimes")) as mock:
        for name in ("tokenizer", "classifier", "classifier_fast"):
            mock.load(name)
        with pytest.raises(Exception, match="metrics='sometimes'"):
            mock.load("router")


def test_metrics_enabled_reads_on_and_off_in_any_case():
    assert M.metrics_enabled({}) and M.metrics_enabled({"metrics": ""}) and M.metrics_enabled({"metrics": "ON"})
    assert not M.metrics_enabled({"metrics": "off"}) and not M.metrics_enabled({"metrics": " False "})
    with pytest.raises(ValueError, match="expected 'on' or 'off'"):
        M.metrics_enabled({"metrics": "2"})
