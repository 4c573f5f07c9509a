"""The model-configuration features against a real Triton 2.51: warmup samples, the response cache (and why the
router must not use it), model versions in the policy, and shadow nodes.

One server for the module, started with a 16 MiB response cache, on a test repository
with two versions of one classifier (``classifier_versioned``: version 1 is
``classifier``, version 2 is ``classifier_fast``, so the answers tell the versions apart)
and the routers below.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from orchestrator.runtime.routing.nodes.split import split_fraction
from orchestrator.tooling import repository
from orchestrator.tooling.modeling import data
from tests.helpers import REPO, ROOT, add_router_variant, copy_model, eventually, make_test_repository, set_node_fields

INLINE = {"tokenizer": "../tokenizer/1", "postprocess": True}
EMPTY_GUARD = {"kind": "switch", "name": "guard", "cases": [
    {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False}}]}


def model(name, model_name, **kw):
    return {"kind": "model", "name": name, "model": model_name, **kw}


def policy(root, **top):
    return {"version": 1, "inline": INLINE, "root": {"kind": "sequence", "name": "main", "steps": [EMPTY_GUARD, root]}, **top}


VERSIONS = policy({"kind": "switch", "name": "choose", "cases": [
    {"when": {"param": {"name": "route", "equals": "v1"}}, "then": model("v1", "classifier_versioned", version=1)},
    {"when": {"param": {"name": "route", "equals": "v2"}}, "then": model("v2", "classifier_versioned", version=2)},
], "default": model("latest", "classifier_versioned")}, request_parameters={"route": ["v1", "v2"]})
SPLIT = policy({"kind": "split", "name": "ab", "branches": [
    {"weight": 1, "node": model("a", "classifier_versioned", version=1)},
    {"weight": 1, "node": model("b", "classifier_versioned", version=2)}]})
SHADOW_VERSIONS = policy({"kind": "shadow", "name": "sv", "primary": model("p", "classifier_versioned", version=1),
                          "candidate": model("c", "classifier_versioned", version=2)})
SHADOW_BROKEN = policy({"kind": "shadow", "name": "sb", "primary": model("p2", "classifier"),
                        "candidate": model("gone", "classifier_absent", timeout_ms=1000)})

ROUTERS = {"router_versions": VERSIONS, "router_split_versions": SPLIT, "router_shadow_versions": SHADOW_VERSIONS,
           "router_shadow_broken": SHADOW_BROKEN}
MODELS = ["tokenizer", "postprocess", "classifier", "classifier_fast", "classifier_fp16", "classifier_versioned",
          "router", "router_cached", "router_shadow", *ROUTERS]


def build_repository(dest):
    repo = make_test_repository(dest)
    versioned = copy_model(repo, "classifier", "classifier_versioned")
    shutil.copytree(repo / "classifier_fast" / "1", versioned / "2")
    for cfg in [versioned / "config.pbtxt", *versioned.glob("configs/*.pbtxt")]:
        cfg.write_text(cfg.read_text() + "version_policy: { specific: { versions: [1, 2] } }\n")
    for name, document in ROUTERS.items():
        add_router_variant(repo, name, document)
    shadow = yaml.safe_load((ROOT / "docs" / "policies" / "shadow_fp16.yaml").read_text())
    set_node_fields(shadow, {"fp16_shadow": {"sample": 1.0}})  # every request, so the counts are exact
    add_router_variant(repo, "router_shadow", shadow)
    # the shipped router with the response cache on: what Triton's cache key does to it
    cached = add_router_variant(repo, "router_cached", yaml.safe_load((REPO / "router" / "policy.yaml").read_text()))
    (cached / "config.pbtxt").write_text((cached / "config.pbtxt").read_text() + "response_cache { enable: true }\n")
    # the same classifier with and without its warmup sample, loaded by the tests
    copy_model(repo, "classifier_fast", "classifier_warm")
    cold = copy_model(repo, "classifier_fast", "classifier_cold")
    for cfg in [cold / "config.pbtxt", *cold.glob("configs/*.pbtxt")]:
        config = repository.read_config(cfg)
        assert config.model_warmup
        del config.model_warmup[:]
        repository.write_config(cfg, config, ["classifier_cold: classifier_fast without its warmup sample (test only)."])
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from orchestrator.tooling.server import TritonServer

    repo = build_repository(tmp_path_factory.mktemp("features") / "model_repository")
    with TritonServer(repo, models=MODELS, response_cache_bytes=16 << 20) as srv:
        yield srv


@pytest.fixture(scope="module")
def texts():
    """24 held-out texts under 100 tokens: every policy here answers them with one window."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(REPO / "tokenizer" / "1"))
    candidates = data.held_out_texts(n=200, seed=13)
    return [t for t in candidates if len(tokenizer(t)["input_ids"]) < 100][:24]


def stats(server, model, version=""):
    client = server.client()
    try:
        return client.get_inference_statistics(model, version)["model_stats"][0]
    finally:
        client.close()


def ask(server, model, texts, request_id="", parameters=None):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    inputs = [httpclient.InferInput("TEXT", list(t.shape), "BYTES"), httpclient.InferInput("THRESHOLD", [len(texts), 1], "FP32")]
    inputs[0].set_data_from_numpy(t)
    inputs[1].set_data_from_numpy(np.full((len(texts), 1), 0.5, np.float32))
    try:
        result = client.infer(model, inputs, request_id=request_id, parameters=parameters)
        return result.as_numpy("PROBABILITIES").reshape(-1), [r.decode() for r in result.as_numpy("ROUTE").reshape(-1)]
    finally:
        client.close()


def classify(server, model, ids):
    client = server.client()
    inputs = [httpclient.InferInput("input_ids", list(ids.shape), "INT64"), httpclient.InferInput("attention_mask", list(ids.shape), "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(np.ones_like(ids))
    try:
        return client.infer(model, inputs).as_numpy("logits")
    finally:
        client.close()


# ----------------------------------------------------------------------------- warmup


def test_every_kind_of_model_runs_its_warmup_sample_when_it_loads(server):
    """Freshly loaded copies of the tokenizer, postprocess, a classifier and the router have
    executed once (their warmup sample) before any client request; the copy whose sample
    was removed has not."""
    repo = server.model_repository
    for source in ("tokenizer", "postprocess"):
        copy_model(repo, source, f"{source}_fresh")
    add_router_variant(repo, "router_fresh", yaml.safe_load((REPO / "router" / "policy.yaml").read_text()))
    for name in ("tokenizer_fresh", "postprocess_fresh", "router_fresh", "classifier_warm", "classifier_cold"):
        server.load_model(name)
        st = stats(server, name)
        want = 0 if name == "classifier_cold" else 1
        assert (st["execution_count"], st["inference_stats"]["success"]["count"]) == (want, want), name
    assert "warmup sample answered up to the first downstream call" in server.log_path.read_text()


def test_a_warmed_model_answers_its_first_request_at_warm_latency(server):
    """Server-side compute time of the first request after load: the warmed copy's is a
    fraction of the cold copy's (measured here: about 2 ms against 35 ms)."""
    ids = np.array([[2, 310, 538, 3]], np.int64)
    first = {}
    for name in ("classifier_warm", "classifier_cold"):
        server.unload_model(name)
        server.load_model(name)
        before = stats(server, name)["inference_stats"]
        classify(server, name, ids)
        want = int(before["success"]["count"]) + 1
        assert eventually(lambda name=name: int(stats(server, name)["inference_stats"]["success"]["count"]), want) == want
        first[name] = stats(server, name)["inference_stats"]["compute_infer"]["ns"] - before["compute_infer"]["ns"]
    assert first["classifier_warm"] < first["classifier_cold"] / 2, first


def test_an_on_demand_model_is_warmed_when_the_router_loads_it(server):
    """``router_ondemand`` loads ``classifier_spare`` at its first use: Triton runs the
    sample before the model is ready, so the router's request is its second execution."""
    server.load_model("router_ondemand")
    _, r = ask(server, "router_ondemand", ["the room was lovely"], parameters={"route": "spare"})
    assert r == ["classifier_spare"]
    def counts():
        st = stats(server, "classifier_spare")
        return int(st["execution_count"]), int(st["inference_stats"]["success"]["count"])
    assert eventually(counts, (2, 2)) == (2, 2)


# ----------------------------------------------------------------------------- response cache


def test_the_classifiers_answer_repeated_inputs_from_the_cache(server):
    ids = np.array([[2, 310, 111, 538, 3]], np.int64)
    before = stats(server, "classifier")
    first, second = classify(server, "classifier", ids), classify(server, "classifier", ids)
    np.testing.assert_array_equal(first, second)

    def moved():  # (requests counted, cache hits, executions) since ``before``
        after = stats(server, "classifier")
        a, b = after["inference_stats"], before["inference_stats"]
        return (int(a["success"]["count"]) - int(b["success"]["count"]), int(a["cache_hit"]["count"]) - int(b["cache_hit"]["count"]),
                int(after["execution_count"]) - int(before["execution_count"]))
    # two requests answered, the second from the cache: it never reached the model
    assert eventually(moved, (2, 1, 1)) == (2, 1, 1)


def test_the_cache_key_leaves_out_request_parameters_so_the_router_is_not_cached(server):
    """``router_cached`` (the shipped router with ``response_cache`` on) answers a request
    for route=accurate with the cached route=fast answer: Triton's key is the model,
    version and input bytes only. The shipped router, which has no cache, answers each
    route correctly from the same server."""
    text = ["the plot was thin but the actors were charming and the music lovely"]
    fast = ask(server, "router", text, parameters={"route": "fast"})
    accurate = ask(server, "router", text, parameters={"route": "accurate"})
    assert (fast[1], accurate[1]) == (["classifier_fast"], ["classifier"]) and fast[0][0] != accurate[0][0]
    assert ask(server, "router_cached", text, parameters={"route": "fast"})[1] == ["classifier_fast"]
    stale = ask(server, "router_cached", text, parameters={"route": "accurate"})
    assert stale[1] == ["classifier_fast"] and stale[0][0] == fast[0][0]
    assert eventually(lambda: int(stats(server, "router_cached")["inference_stats"]["cache_hit"]["count"]), 1) == 1
    assert stats(server, "router")["inference_stats"]["cache_hit"]["count"] == 0


def test_a_cached_answer_of_another_shape_is_never_used(server):
    """One text of 6 tokens ``[CLS] good [SEP] [CLS] bad [SEP]`` and two texts of 3 have
    the same input bytes, so the same cache key (shapes are not in it): the router refuses
    classifier_fast's one-row cached answer for two rows and its fallback answers both."""
    ask(server, "router", ["good [SEP] [CLS] bad"], parameters={"route": "fast"})
    probs, r = ask(server, "router", ["good", "bad"], parameters={"route": "fast"})
    assert r == ["classifier", "classifier"]  # fast_only's spare, not a broadcast of one row
    want = [ask(server, "router", [t], parameters={"route": "accurate"})[0][0] for t in ("good", "bad")]
    np.testing.assert_allclose(probs, want, rtol=1e-6)


# ----------------------------------------------------------------------------- model versions


def test_a_policy_calls_the_version_it_names(server, texts):
    v1, r1 = ask(server, "router_versions", texts, parameters={"route": "v1"})
    v2, r2 = ask(server, "router_versions", texts, parameters={"route": "v2"})
    latest, rl = ask(server, "router_versions", texts)
    np.testing.assert_allclose(v1, ask(server, "router", texts, parameters={"route": "accurate"})[0], rtol=1e-6)
    # Version 2 holds classifier_fast's weights under classifier_versioned's head.json, which
    # is classifier's: its temperature (calibration, one per model directory, every version)
    # differs from classifier_fast's by 0.03%, so the probabilities agree to about 1e-4, while
    # the two versions' answers differ by far more (checked below).
    fast = ask(server, "router", texts, parameters={"route": "fast"})[0]
    np.testing.assert_allclose(v2, fast, atol=3e-4)
    assert np.abs(np.asarray(v1) - np.asarray(v2)).max() > 100 * 3e-4
    np.testing.assert_allclose(latest, v2, rtol=1e-6)  # no version: the highest served, 2
    assert set(r1) == {"classifier_versioned@1"} and set(r2) == {"classifier_versioned@2"}
    assert set(rl) == {"classifier_versioned"}
    assert stats(server, "classifier_versioned", "1")["inference_stats"]["success"]["count"] >= 1


def test_a_split_across_versions_follows_the_request_id(server):
    for rid in [f"user-{k}" for k in range(8)]:
        version = 1 if split_fraction("ab", rid) < 0.5 else 2
        assert ask(server, "router_split_versions", ["great value"], request_id=rid)[1] == [f"classifier_versioned@{version}"]


def test_policy_check_accepts_the_versions_the_test_repository_serves(server, capsys):
    from orchestrator.tooling.cli import main

    assert main(["policy", "check", str(server.model_repository / "router_versions" / "policy.yaml")]) == 0
    assert "classifier_versioned@2" in capsys.readouterr().out


# ----------------------------------------------------------------------------- shadow


def test_a_shadow_across_versions_counts_flips_and_differences(server, texts):
    labels = {"router": "router_shadow_versions", "node": "sv", "candidate": "c"}
    v1, _ = ask(server, "router_versions", texts, parameters={"route": "v1"})
    v2, _ = ask(server, "router_versions", texts, parameters={"route": "v2"})
    flips = int(np.sum((v1 >= 0.5) != (v2 >= 0.5)))
    assert flips > 0  # classifier and classifier_fast disagree on some held-out texts
    for k, t in enumerate(texts):  # one text per request, as clients send them
        probs, r = ask(server, "router_shadow_versions", [t], request_id=f"s{k}")
        assert r == ["classifier_versioned@1"] and probs[0] == pytest.approx(v1[k], rel=1e-6)
    assert eventually(lambda: server.metric("orchestrator_shadow_texts_total", **labels), len(texts)) == len(texts)
    assert eventually(lambda: server.metric("orchestrator_shadow_flips_total", **labels), flips) == flips
    total = float(np.sum(np.abs(v1.astype(np.float64) - v2)))
    assert server.metric("orchestrator_shadow_probability_difference_sum", **labels) == pytest.approx(total, rel=1e-3)
    assert server.metric("orchestrator_shadow_probability_difference_count", **labels) == len(texts)


def test_the_fp16_shadow_example_answers_from_classifier_and_mirrors_every_text(server, texts):
    labels = {"router": "router_shadow", "node": "fp16_shadow", "candidate": "fp16"}
    probs, r = ask(server, "router_shadow", texts, request_id="fp16")
    want, want_routes = ask(server, "router", texts, parameters={"route": "accurate"})
    np.testing.assert_allclose(probs, want, rtol=1e-6)
    assert r == want_routes
    assert eventually(lambda: server.metric("orchestrator_shadow_texts_total", **labels), len(texts)) == len(texts)
    assert server.metric("orchestrator_shadow_errors_total", **labels) == 0


def test_a_broken_candidate_never_changes_an_answer(server, texts):
    labels = {"router": "router_shadow_broken", "node": "sb", "candidate": "gone"}
    probs, r = ask(server, "router_shadow_broken", texts, request_id="b1")
    want, _ = ask(server, "router", texts, parameters={"route": "accurate"})
    np.testing.assert_allclose(probs, want, rtol=1e-6)
    assert set(r) == {"classifier"}
    assert eventually(lambda: server.metric("orchestrator_shadow_errors_total", **labels), len(texts)) == len(texts)
    assert "shadow 'sb': candidate 'gone' failed" in server.log_path.read_text()
