"""The router's Triton adapter (runtime/serving/router.py) on the in-process mock: error codes and
texts per request, the counters it keeps, retries of a failed batch one request at a time,
and request ids on its BLS calls. Each behaviour here fails a test when it breaks, without
starting a server."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import yaml

from orchestrator.testing.mock import InferenceRequest, InferError, MockTriton
from orchestrator.tooling import repository
from tests.helpers import REPO, STRICT_VARIANT, add_router_variant, without_fallbacks

TEXTS = ["A gorgeous, witty film.", "Not worth the ticket.", "plain"]
NO_ROUTE = "router_no_route"  # the shipped router, ROUTE left out of its config.pbtxt


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("adapter") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    document["root"] = without_fallbacks(document["root"])
    add_router_variant(repo, STRICT_VARIANT, document)
    shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    config = repository.read_config(add_router_variant(repo, NO_ROUTE, shipped) / "config.pbtxt")
    del config.output[[o.name for o in config.output].index("ROUTE")]
    repository.write_config(repo / NO_ROUTE / "config.pbtxt", config)
    with MockTriton(repo) as m:  # strict outputs: an output the config leaves out fails the request
        for name in ("tokenizer", "classifier", "classifier_fast", "router", STRICT_VARIANT, NO_ROUTE):
            m.load(name)
        yield m


def inputs(texts, threshold=0.5):
    t = np.array([s if isinstance(s, bytes) else s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    return {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), threshold, np.float32)}


def counter(mock, family, **labels):
    return mock.metric(family, {"router": "router", **labels}) or 0.0


def settled(mock, family, want, **labels):
    """The counter once the router's 0.5 s metric flush has reached ``want`` (or 3 s passed)."""
    deadline = time.monotonic() + 3.0
    while counter(mock, family, **labels) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.6)  # one more flush: a double count would show now
    return counter(mock, family, **labels)


def test_bad_input_is_invalid_arg_for_that_request_and_counted_once(mock):
    errors = counter(mock, "orchestrator_requests_total", outcome="error")
    ok = counter(mock, "orchestrator_requests_total", outcome="success")
    with pytest.raises(InferError) as err:
        mock.infer("router", inputs(TEXTS[:1], threshold=1.5))
    assert err.value.code == "INVALID_ARG"
    assert err.value.message == "router: THRESHOLD[0] = 1.5: must be a finite probability in [0, 1]"
    assert settled(mock, "orchestrator_requests_total", errors + 1, outcome="error") == errors + 1
    assert counter(mock, "orchestrator_requests_total", outcome="success") == ok


def test_invalid_utf8_names_the_text_the_byte_and_its_offset(mock):
    with pytest.raises(InferError) as err:
        mock.infer("router", inputs([b"fine", b"abcd\xffz"]))
    assert err.value.code == "INVALID_ARG"
    assert err.value.message == "router: TEXT[1]: invalid UTF-8 (byte 0xff at offset 4)"


def test_a_text_over_the_limit_is_refused_and_counted_by_limit(mock):
    before = counter(mock, "orchestrator_rejected_requests_total", limit="max_text_bytes")
    with pytest.raises(InferError) as err:
        mock.infer("router", inputs([b"x" * 65537]))
    assert err.value.code == "INVALID_ARG" and "65537 bytes, over the limit of 65536 bytes per text" in err.value.message
    assert settled(mock, "orchestrator_rejected_requests_total", before + 1, limit="max_text_bytes") == before + 1


def test_success_counts_one_per_request_and_each_text_by_route(mock):
    ok = counter(mock, "orchestrator_requests_total", outcome="success")
    routes_before = {r: counter(mock, "orchestrator_texts_total", route=r) for r in ("classifier_fast", "classifier", "empty")}
    out = mock.infer("router", inputs(TEXTS + [""]))
    routes = [r.decode() for r in out["ROUTE"].reshape(-1)]
    assert settled(mock, "orchestrator_requests_total", ok + 1, outcome="success") == ok + 1
    for r in set(routes):
        assert counter(mock, "orchestrator_texts_total", route=r) - routes_before[r] == routes.count(r)


def test_a_failing_batch_is_retried_one_request_at_a_time(mock):
    """Two requests in one execute; the one that needs the failing model gets INTERNAL
    naming it, the other its answer."""
    mock.set_failure("classifier", "injected")
    try:
        fast = {"inputs": inputs(TEXTS), "parameters": {"route": "fast"}, "request_id": "a"}
        accurate = {"inputs": inputs(TEXTS), "parameters": {"route": "accurate"}, "request_id": "b"}
        mock.reset_calls()
        first, second = mock.infer_batch(STRICT_VARIANT, [fast, accurate])
    finally:
        mock.clear_faults()
    assert [c.batch_sizes for c in mock.calls if c.model == STRICT_VARIANT][0] == (3, 3)  # one execute for both
    assert not isinstance(first, InferError) and [r.decode() for r in first["ROUTE"].reshape(-1)] == ["classifier_fast"] * 3
    assert isinstance(second, InferError) and second.code == "INTERNAL"
    assert second.message.startswith("router: ") and "model 'classifier' failed: injected" in second.message


def test_request_ids_reach_every_bls_call(mock, monkeypatch):
    seen = []
    original = InferenceRequest.__init__

    def record(self, *args, **kwargs):
        seen.append((kwargs.get("model_name"), kwargs.get("request_id")))
        original(self, *args, **kwargs)

    monkeypatch.setattr(InferenceRequest, "__init__", record)
    mock.infer("router", inputs(TEXTS), request_id="trace-7", parameters={"route": "accurate"})
    assert seen and all(rid == "trace-7" for _, rid in seen)
    assert {m for m, _ in seen} == {"classifier"}  # the shipped policy tokenizes inline


def test_policy_output_only_for_requests_that_ask(mock):
    """POLICY comes back only with ``describe_policy: true``: the policy document as JSON,
    one row per text."""
    import json

    plain = mock.infer("router", inputs(TEXTS[:2]))
    assert "POLICY" not in plain and {"PROBABILITIES", "VERDICTS", "ROUTE"} <= set(plain)
    described = mock.infer("router", inputs(TEXTS[:2]), parameters={"describe_policy": True})
    assert described["POLICY"].shape == (2, 1)
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    assert [json.loads(row) for row in described["POLICY"].reshape(-1)] == [document, document]
    np.testing.assert_array_equal(described["PROBABILITIES"], plain["PROBABILITIES"])


def test_each_stage_of_an_execute_is_observed_once(mock):
    """``orchestrator_stage_seconds{stage}``: one observation per stage per execute
    (``bls``: per batched group of downstream calls; the shipped router tokenizes in-process,
    so its cascade's stages make at least one)."""
    def count(stage):
        value = mock.metric("orchestrator_stage_seconds", {"router": "router", "stage": stage})
        return 0 if value is None else value["count"]

    time.sleep(0.6)  # the earlier tests' observations flushed first (0.5 s flush)
    before = {s: count(s) for s in ("parse", "tokenize", "bls", "results", "respond")}
    mock.infer("router", inputs(TEXTS))
    deadline = time.monotonic() + 3.0
    while count("respond") == before["respond"] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.6)  # one more flush
    grew = {s: count(s) - before[s] for s in before}
    assert {s: grew[s] for s in ("parse", "tokenize", "results", "respond")} == dict.fromkeys(
        ("parse", "tokenize", "results", "respond"), 1), grew
    assert grew["bls"] >= 1, grew
    value = mock.metric("orchestrator_stage_seconds", {"router": "router", "stage": "parse"})
    assert 0 < value["sum"] < 1.0 and min(value["buckets"]) == 0.00005


def outputs_built(router, monkeypatch):
    """The names of the router's outputs built from now on, in order (a list that grows)."""
    built = []
    tensor = router.pb.Tensor

    def spy(name, value):  # the router's outputs (the same pb_utils builds every model's tensors)
        if name in ("PROBABILITIES", "VERDICTS", "ROUTE", "POLICY"):
            built.append(name)
        return tensor(name, value)

    monkeypatch.setattr(router.pb, "Tensor", spy)
    return built


def test_only_the_outputs_a_client_asks_for_are_built(mock, monkeypatch):
    """A client naming a subset of the outputs gets those, the same values as from a request
    for all, and the router builds no tensor for the others (Triton would drop them; the
    BYTES ``ROUTE`` costs the stub a Python serialization). ``POLICY`` is built only when
    asked for by name or by asking for every output."""
    everything = mock.infer("router", inputs(TEXTS), parameters={"describe_policy": True})
    built = outputs_built(mock.instance("router"), monkeypatch)
    for asked in (["PROBABILITIES"], ["VERDICTS", "ROUTE"], ["ROUTE"], ["POLICY", "VERDICTS"]):
        built.clear()
        got = mock.infer("router", inputs(TEXTS), parameters={"describe_policy": True}, outputs=asked)
        assert sorted(got) == sorted(asked) and sorted(built) == sorted(asked)
        for name in asked:
            assert np.array_equal(got[name], everything[name])
    built.clear()
    assert sorted(mock.infer("router", inputs(TEXTS))) == ["PROBABILITIES", "ROUTE", "VERDICTS"]
    assert sorted(built) == ["PROBABILITIES", "ROUTE", "VERDICTS"]
    built.clear()
    mock.infer("router", inputs(TEXTS), parameters={"describe_policy": True})
    assert sorted(built) == ["POLICY", "PROBABILITIES", "ROUTE", "VERDICTS"]


def test_an_output_left_out_of_the_config_is_never_built(mock, monkeypatch):
    """A router whose config.pbtxt leaves ROUTE out answers the same PROBABILITIES and VERDICTS
    without building ROUTE, for a client naming no output and for one naming every other one
    (the mock's strict outputs fail a request answered with an output the config leaves out)."""
    everything = mock.infer("router", inputs(TEXTS))
    built = outputs_built(mock.instance(NO_ROUTE), monkeypatch)
    for asked in (None, ["PROBABILITIES", "VERDICTS"]):
        built.clear()
        got = mock.infer(NO_ROUTE, inputs(TEXTS), outputs=asked)
        assert sorted(got) == sorted(built) == ["PROBABILITIES", "VERDICTS"]
        for name in got:
            assert np.array_equal(got[name], everything[name])
    got = mock.infer(NO_ROUTE, inputs(TEXTS), parameters={"describe_policy": True})
    assert sorted(got) == ["POLICY", "PROBABILITIES", "VERDICTS"]
