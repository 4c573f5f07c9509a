"""Routing policies in a real tritonserver: request-parameter routes, on-demand models,
metrics on /metrics, the shipped A/B example, `policy show`, and invalid policies."""

from __future__ import annotations

import concurrent.futures as cf
import shutil
import time

import numpy as np
import pytest
import yaml
from tritonclient.utils import InferenceServerException

from orchestrator.runtime.routing.heads import logit
from orchestrator.runtime.routing.nodes.split import split_fraction
from orchestrator.tooling import prometheus
from orchestrator.tooling.cli import main
from orchestrator.tooling.client import text_inputs
from orchestrator.tooling.modeling import data
from orchestrator.tooling.policy_cli import fetch_policy
from orchestrator.tooling.server import ServerError
from tests.helpers import BAD_SAMPLE_VARIANT, NO_METRICS_VARIANT, REPO, ROOT, TIMINGS_VARIANT, add_router_variant, call, routes

pytestmark = pytest.mark.server
TEXTS = data.held_out_texts(n=16, seed=21)


def metric(snapshot, name, **labels) -> float:
    return prometheus.value(snapshot, name, **labels)


def settled_metrics(server) -> dict:
    """``metrics()`` once the router's buffered updates are out (flushed every 0.5 s)."""
    time.sleep(1.2)
    return server.metrics()


def state(server, model) -> str:
    return {m["name"]: m.get("state", "") for m in server.repository_index()}.get(model, "")


def test_request_parameters_choose_among_the_exposed_routes(triton):
    ens = call(triton, "ensemble", TEXTS)
    acc = call(triton, "router", TEXTS, parameters={"route": "accurate"})
    fast = call(triton, "router", TEXTS, parameters={"route": "fast"})
    assert routes(acc) == ["classifier"] * len(TEXTS)
    assert routes(fast) == ["classifier_fast"] * len(TEXTS)
    np.testing.assert_allclose(acc["PROBABILITIES"], ens["PROBABILITIES"], atol=1e-5)


def test_a_request_cannot_name_a_model_the_policy_does_not_expose(triton):
    with pytest.raises(InferenceServerException, match="parameter route='classifier_spare': not a route this policy exposes"):
        call(triton, "router", TEXTS[:1], parameters={"route": "classifier_spare"})
    assert state(triton, "classifier_spare") != "READY"


def test_on_demand_model_loads_once_then_unloads_when_idle(triton):
    assert state(triton, "classifier_spare") != "READY"
    before = settled_metrics(triton)
    with cf.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda t: call(triton, "router_ondemand", [t], parameters={"route": "spare"}), TEXTS[:6]))
    assert all(routes(r) == ["classifier_spare"] for r in results)
    assert state(triton, "classifier_spare") == "READY"
    after = settled_metrics(triton)
    loads = dict(router="router_ondemand", model="classifier_spare", outcome="success")
    assert metric(after, "orchestrator_model_loads_total", **loads) - metric(before, "orchestrator_model_loads_total", **loads) == 1
    # same weights as classifier_fast: same answers
    fast = call(triton, "router", TEXTS[:6], parameters={"route": "fast"})["PROBABILITIES"].reshape(-1)
    np.testing.assert_allclose([r["PROBABILITIES"][0, 0] for r in results], fast, atol=1e-5)
    deadline = time.monotonic() + 30
    while state(triton, "classifier_spare") == "READY" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state(triton, "classifier_spare") != "READY"
    unloads = dict(router="router_ondemand", model="classifier_spare")
    assert metric(settled_metrics(triton), "orchestrator_model_unloads_total", **unloads) == 1
    # and it comes back on the next use
    assert routes(call(triton, "router_ondemand", TEXTS[:1], parameters={"route": "spare"})) == ["classifier_spare"]
    # leave the shared server as found: its idle unload done (with --strict-readiness the
    # server is not ready while a model unloads, which later tests assert)
    deadline = time.monotonic() + 30
    while state(triton, "classifier_spare") in ("READY", "UNLOADING", "LOADING") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state(triton, "classifier_spare") not in ("READY", "UNLOADING", "LOADING")


def test_an_on_demand_model_in_no_repository_fails_over_without_a_load_request(triton):
    """A load request that fails can crash Triton 2.51 (see ServerOptions): a model that is
    in no repository must fail over to the fallback without one, on every request."""
    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda t: call(triton, "router_absent", [t]), TEXTS * 5))
    assert all(routes(r) == ["fallback"] for r in results)
    fast = call(triton, "router", TEXTS, parameters={"route": "fast"})["PROBABILITIES"].reshape(-1)
    np.testing.assert_allclose([r["PROBABILITIES"][0, 0] for r in results], np.tile(fast, 5), atol=1e-5)
    failures = metric(settled_metrics(triton), "orchestrator_model_loads_total", router="router_absent", model="classifier_absent", outcome="failure")
    assert 1 <= failures <= len(results)
    assert "failed to poll model 'classifier_absent'" not in triton.log_path.read_text()  # Triton never heard of it
    assert triton.is_ready()


def test_the_router_never_unloads_a_model_it_did_not_load(triton):
    assert routes(call(triton, "router_not_owner", TEXTS[:2], parameters={"route": "spare"})) == ["classifier_fast"] * 2
    time.sleep(2.5)  # idle timeout 0.5 s, checked every 0.2 s
    assert state(triton, "classifier_fast") == "READY"
    snapshot = settled_metrics(triton)
    assert metric(snapshot, "orchestrator_model_unloads_total", router="router_not_owner", model="classifier_fast") == 0


def test_metrics_count_requests_texts_routes_and_node_latency(triton):
    texts = TEXTS[:8] + ["", "  "]
    before = settled_metrics(triton)
    out = call(triton, "router", texts)
    with pytest.raises(InferenceServerException):
        call(triton, "router", TEXTS[:1], thresholds=float("nan"))
    after = settled_metrics(triton)

    def delta(name, **labels):
        return metric(after, name, router="router", **labels) - metric(before, name, router="router", **labels)

    for route in set(routes(out)):
        assert delta("orchestrator_texts_total", route=route) == routes(out).count(route)
    assert delta("orchestrator_requests_total", outcome="success") == 1
    assert delta("orchestrator_requests_total", outcome="error") == 1
    escalated = routes(out).count("classifier")
    assert delta("orchestrator_escalations_total", node="cascade") == escalated
    assert prometheus.total(after, "orchestrator_node_latency_seconds_count", router="router", node="cascade") >= 1


def test_the_timing_histograms_send_a_sample_unless_the_config_asks_for_all(triton):
    """``metrics_timing_sample`` (runtime/metrics.py) on the real server: the shipped router
    sends at most 8 stage observations per series per 0.5 s flush, ``router_all_timings``
    (the parameter ``all``) one per execute."""
    import math

    n = 60
    before = settled_metrics(triton)
    began = time.monotonic()
    for text in (TEXTS * 4)[:n]:
        call(triton, "router", [text])
    elapsed = time.monotonic() - began
    for text in (TEXTS * 4)[:n]:
        call(triton, TIMINGS_VARIANT, [text])
    after = settled_metrics(triton)

    def delta(router):
        name, labels = "orchestrator_stage_seconds_count", {"router": router, "stage": "parse"}
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta(TIMINGS_VARIANT) == n
    flushes = math.ceil(elapsed / 0.5) + 1  # the flushes that can hold the shipped router's executes
    assert 0 < delta("router") <= 8 * flushes and delta("router") < n


def test_metrics_off_answers_as_the_router_and_exports_no_series_of_its_own(triton):
    """The config parameter ``metrics: off`` on the real server: the same answers as the
    shipped router, and ``/metrics`` holds no ``orchestrator_*`` series for it (Triton's own
    ``nv_inference_*`` for the model still count), while the shipped router's count."""
    for text in TEXTS:
        shipped, quiet = call(triton, "router", [text]), call(triton, NO_METRICS_VARIANT, [text])
        assert {k: v.tolist() for k, v in quiet.items()} == {k: v.tolist() for k, v in shipped.items()}
    after = settled_metrics(triton)
    ours = [name for (name, labels), _ in after.items()
            if name.startswith("orchestrator_") and ("router", NO_METRICS_VARIANT) in labels]
    assert ours == []
    assert metric(after, "orchestrator_requests_total", router="router", outcome="success") >= len(TEXTS)
    assert prometheus.total(after, "nv_inference_request_success", model=NO_METRICS_VARIANT) >= len(TEXTS)


def test_shipped_ab_example_splits_by_request_id_and_falls_back(triton):
    expected = {}
    for i in range(30):
        rid = f"user-{i}"
        out = call_with_id(triton, "router_ab", TEXTS[:2], rid)
        want = "a:classifier" if split_fraction("ab", rid) < 0.9 else "b:classifier_fast"
        assert routes(out) == [want, want]
        expected[rid] = want
    assert "a:classifier" in expected.values()
    triton.unload_model("classifier")
    try:
        a_ids = [rid for rid, r in expected.items() if r == "a:classifier"][:3]
        for rid in a_ids:
            assert routes(call_with_id(triton, "router_ab", TEXTS[:1], rid)) == ["a:fallback:classifier_fast"]
    finally:
        triton.load_model("classifier")


def call_with_id(server, model, texts, request_id, threshold=0.5):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        ins = text_inputs(httpclient, texts, threshold)
        r = client.infer(model, ins, request_id=request_id)
        return {"ROUTE": r.as_numpy("ROUTE"), "PROBABILITIES": r.as_numpy("PROBABILITIES"), "VERDICTS": r.as_numpy("VERDICTS")}
    finally:
        client.close()


def test_policy_show_prints_what_the_running_router_uses(triton, capsys):
    shipped = yaml.safe_load((ROOT / "model_repository" / "router" / "policy.yaml").read_text())
    assert fetch_policy(triton.http_url, "router") == shipped
    assert fetch_policy(triton.grpc_url, "router_ab", protocol="grpc")["root"]["steps"][1]["node"]["name"] == "ab"
    assert main(["policy", "show", "--url", triton.http_url]) == 0
    out = capsys.readouterr().out
    margin = [n for n in _values(shipped, "margin")][0]
    assert f"[cascade] cascade margin={margin:g}" in out and "request parameter route: fast, accurate" in out
    # ordinary requests do not carry the POLICY output
    assert "POLICY" not in call(triton, "router", TEXTS[:1])


def test_an_invalid_policy_or_config_parameter_stops_the_router_from_loading(test_repository):
    # Its own server: with --strict-readiness a failed load leaves the server not-ready.
    from orchestrator.tooling.server import TritonServer

    with TritonServer(test_repository, models=["postprocess"]) as server:
        with pytest.raises(ServerError) as info:
            server.load_model("router_bad_policy")
        assert "invalid routing policy" in str(info.value)
        assert "router_bad_policy/policy.yaml: root.stages: needs at least 2 entries" in str(info.value)
        # A config parameter the router cannot read fails its load the same way, named.
        with pytest.raises(ServerError) as info:
            server.load_model(BAD_SAMPLE_VARIANT)
        assert "parameter metrics_timing_sample='every': expected a positive integer, 'all' or 'off'" in str(info.value)
        assert state(server, "postprocess") == "READY"


def test_a_variant_answers_at_its_calibrated_threshold(triton):
    """The A/B example's canary (classifier_fast) decides at its own calibrated threshold:
    for a client's reference threshold (0.8214) its verdicts are classifier_fast's own at
    0.8526 (the example policy's calibration, from orchestrator parity on the calibrated
    heads), which differ from its verdicts at 0.8214 on this data, so a calibration that
    does not move the threshold fails here."""
    policy = yaml.safe_load((ROOT / "docs" / "policies" / "ab_fallback.yaml").read_text())
    [cal] = [v for v in _values(policy, "calibration")]
    ref_thr, own_thr = cal["reference_threshold"], cal["threshold"]
    assert own_thr > ref_thr + 0.01
    pool = data.held_out_texts(n=400, seed=2)
    pool_p = np.concatenate([call(triton, "router", pool[i : i + 64], parameters={"route": "fast"})["PROBABILITIES"].reshape(-1)
                             for i in range(0, len(pool), 64)])
    between = [t for t, p in zip(pool, pool_p) if ref_thr <= p < own_thr][:16]
    assert len(between) >= 4, "held-out texts between the two thresholds"
    texts = between + [t for t, p in zip(pool, pool_p) if not ref_thr <= p < own_thr][: 64 - len(between)]
    b_ids = [f"user-{i}" for i in range(400) if split_fraction("ab", f"user-{i}") >= 0.9][:4]
    fast = call(triton, "router", texts, parameters={"route": "fast"})  # classifier_fast, uncalibrated
    fast_p = fast["PROBABILITIES"].reshape(-1)
    canary_p, canary_v = [], []
    for k, rid in enumerate(b_ids):
        part = slice(16 * k, 16 * (k + 1))
        out = call_with_id(triton, "router_ab", texts[part], rid, threshold=ref_thr)
        assert routes(out) == ["b:classifier_fast"] * 16
        canary_p += out["PROBABILITIES"].reshape(-1).tolist()
        canary_v += out["VERDICTS"].reshape(-1).tolist()
    # Same verdicts as classifier_fast at its own threshold; a shifted probability.
    assert canary_v == (fast_p >= own_thr).tolist()
    shift = logit(ref_thr) - logit(own_thr)
    want = 1 / (1 + np.exp(-(np.log(fast_p / (1 - fast_p)) + shift)))
    np.testing.assert_allclose(canary_p, want, rtol=0, atol=2e-4)
    # Texts between the two thresholds: uncalibrated they would be positive, calibrated not.
    n = len(between)
    assert canary_v[:n] == [False] * n and (fast_p[:n] >= ref_thr).all()


def test_on_demand_in_model_control_mode_none(tmp_path):
    """Without explicit model control the server loads every model at start and refuses
    loads: each router reads the mode from the server's command line, says once that it
    uses its on-demand models as always loaded, never asks to load or unload one (a
    refused load can crash Triton 2.51, see ServerOptions), and a missing one fails over
    to the fallback."""
    from orchestrator.tooling.server import TritonServer

    repo = tmp_path / "model_repository"
    repo.mkdir()
    for name in ("tokenizer", "classifier_fast"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    fast = {"kind": "model", "model": "classifier_fast", "on_demand": {"idle_timeout_s": 0.3, "retry_after_s": 30}}
    absent = {"kind": "model", "model": "classifier_absent", "on_demand": {"idle_timeout_s": 0.3, "retry_after_s": 30}}
    inline = {"tokenizer": "../tokenizer/1", "postprocess": True}
    add_router_variant(repo, "router_present", {"version": 1, "inline": inline, "root": fast})
    add_router_variant(repo, "router_absent", {"version": 1, "inline": inline, "root": {"kind": "fallback", "nodes": [
        absent, {"kind": "model", "name": "spare", "model": "classifier_fast", "route": "fallback"}]}})
    # extra_args come last on the command line, so this mode wins over the default explicit
    with TritonServer(repo, models=[], extra_args=["--model-control-mode=none"]) as server:
        assert {m["name"] for m in server.repository_index() if m.get("state") == "READY"} == {
            "tokenizer", "classifier_fast", "router_present", "router_absent"}
        present = call(server, "router_present", TEXTS[:3])
        assert routes(present) == ["classifier_fast"] * 3
        for _ in range(2):
            answer = call(server, "router_absent", TEXTS[:2])
            assert routes(answer) == ["fallback"] * 2
            np.testing.assert_allclose(answer["PROBABILITIES"], present["PROBABILITIES"][:2], atol=1e-6)
        time.sleep(1.5)  # idle timeout 0.3 s: an explicit-mode router would have unloaded it
        assert state(server, "classifier_fast") == "READY"
        assert routes(call(server, "router_present", TEXTS[:1])) == ["classifier_fast"]
        log = server.log_path.read_text()
        assert log.count("on-demand loading is unavailable (the server runs with --model-control-mode=none") == 2
        assert "explicit model load / unload is not allowed" not in log  # never asked
        snapshot = settled_metrics(server)
        assert metric(snapshot, "orchestrator_model_unloads_total", router="router_present", model="classifier_fast") == 0


def test_budget_and_quorum_in_a_real_server(tmp_path):
    """A cascade's escalation budget (ROUTE ``:budget``, its counter and gauges on /metrics)
    and a quorum parallel answering while one of its models is not loaded, in a real
    tritonserver with the image's explicit model control."""
    from orchestrator.tooling.server import TritonServer

    repo = tmp_path / "model_repository"
    repo.mkdir()
    for name in ("tokenizer", "classifier_fast", "classifier"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "classifier_fast", repo / "classifier_spare")  # in the repository, never loaded
    for cfg in (repo / "classifier_spare").rglob("*.pbtxt"):
        cfg.write_text(cfg.read_text().replace('name: "classifier_fast"', 'name: "classifier_spare"'))
    fast, acc = {"kind": "model", "model": "classifier_fast"}, {"kind": "model", "model": "classifier"}
    inline = {"tokenizer": True}
    add_router_variant(repo, "router_fast", {"version": 1, "inline": inline, "root": fast})
    add_router_variant(repo, "router_budget", {"version": 1, "inline": inline, "root": {
        "kind": "cascade", "name": "cas", "margin": 1.0, "stages": [fast, acc],
        "budget": {"max_escalation_rate": 0.25, "window": 8}}})
    add_router_variant(repo, "router_quorum", {"version": 1, "inline": inline, "root": {
        "kind": "parallel", "name": "par", "quorum": 2, "nodes": [fast, acc, {"kind": "model", "model": "classifier_spare"}]}})
    texts = TEXTS[:8]
    with TritonServer(repo, models=["tokenizer", "classifier_fast", "classifier", "router_fast", "router_budget",
                                    "router_quorum"]) as server:
        p_fast = call(server, "router_fast", texts)["PROBABILITIES"].reshape(-1)
        out = call(server, "router_budget", texts)
        distance = np.abs(p_fast.astype(np.float64) - 0.5)
        most_unsure = set(np.argsort(distance)[:2])  # margin 1: all unsure; 8 texts, 25%: the two most unsure escalate
        assert routes(out) == ["classifier" if i in most_unsure else "classifier_fast:budget" for i in range(8)]
        quorum = call(server, "router_quorum", texts[:2])
        assert routes(quorum) == ["parallel:mean(classifier_fast,classifier):answered=2/3"] * 2
        snapshot = settled_metrics(server)
        assert metric(snapshot, "orchestrator_budget_kept_total", router="router_budget", node="cas") == 6
        assert metric(snapshot, "orchestrator_escalation_rate", router="router_budget", node="cas") == 0.25
        assert metric(snapshot, "orchestrator_cascade_margin", router="router_budget", node="cas") == pytest.approx(
            np.sort(distance)[2], abs=1e-6)
        assert metric(snapshot, "orchestrator_parallel_partial_total", router="router_quorum", node="par") == 2


def _values(node, key):
    """Every value of ``key`` in a policy document, depth first."""
    if isinstance(node, dict):
        return ([node[key]] if key in node else []) + [v for x in node.values() for v in _values(x, key)]
    if isinstance(node, list):
        return [v for x in node for v in _values(x, key)]
    return []
