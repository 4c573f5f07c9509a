"""Two replicas of the router, as two pods behind a Service: two real embedded tritonservers
(separate processes, loopback, free ports) serving the same model repository, each loading
the always-on models of its routers (orchestrator.tooling.deploy.always_on_models, the
LOAD_MODELS of deploy/).

- the same requests get the same answers and ROUTE on both, over HTTP and gRPC;
- the A/B split (docs/policies/ab_fallback.yaml, 90/10, as router_ab) sends a request id to
  the same arm on both replicas;
- an on-demand model loads on the replica whose router needed it, and only there, and
  unloads there when idle;
- both replicas expose the same series (names and labels) with their own values, so only
  the target labels Prometheus adds at scrape time keep them apart: the ServiceMonitor's
  relabelings (deploy/k8s/base/servicemonitor.yaml) are applied here to a scrape of each.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time

import numpy as np
import pytest
import yaml

from orchestrator.tooling import deploy as D
from orchestrator.tooling import prometheus
from orchestrator.tooling.client import client_module, text_inputs
from orchestrator.tooling.server import TritonServer
from tests.helpers import ROOT

pytestmark = pytest.mark.server

ROUTERS = ("router", "router_ab", "router_ondemand")
TEXTS = [
    "A gorgeous, witty, seductive movie.",
    "Not worth the ticket, dull and far too long.",
    "It was fine, I guess.",
    "",
    " ".join(["The plot wanders but the performances are wonderful and the music is lovely."] * 14),  # > 128 tokens
]


@pytest.fixture(scope="module")
def replicas(test_repository):
    models = D.always_on_models(test_repository, ROUTERS)
    servers = [TritonServer(test_repository, models=models) for _ in range(2)]
    try:
        # both at once, as pods start (this once broke on sysconfig's lazy cache: see
        # orchestrator/tooling/embedded.py and tests/unit/test_embedded.py)
        with cf.ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(server.start) for server in servers]:
                started.result()
        yield servers
    finally:
        for server in servers:
            server.stop()


def infer(server, protocol, model, texts, request_id="", parameters=None, threshold=0.5):
    tc = client_module(protocol)
    client = tc.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url,
                                      **({"network_timeout": 120} if protocol == "http" else {}))
    try:
        ins = text_inputs(tc, texts, threshold)
        r = client.infer(model, ins, request_id=request_id, parameters=parameters)
        return {
            "PROBABILITIES": r.as_numpy("PROBABILITIES").reshape(-1),
            "VERDICTS": r.as_numpy("VERDICTS").reshape(-1),
            "ROUTE": [x.decode() for x in r.as_numpy("ROUTE").reshape(-1)],
        }
    finally:
        client.close()


def state(server, model) -> str:
    return {m["name"]: m.get("state", "") for m in server.repository_index()}.get(model, "")


def settled_scrape(server) -> dict:
    time.sleep(1.2)  # the router flushes its metric updates every 0.5 s
    return server.metrics()


value = prometheus.value


# ----------------------------------------------------------------------------- answers


def test_both_replicas_answer_the_same_requests_the_same_over_http_and_grpc(replicas):
    a, b = replicas
    answers = [infer(server, protocol, "router", TEXTS) for server in (a, b) for protocol in ("http", "grpc")]
    first = answers[0]
    assert first["ROUTE"][3] == "empty" and first["ROUTE"][4].startswith("chunked:")
    for other in answers[1:]:
        assert other["ROUTE"] == first["ROUTE"]
        assert other["VERDICTS"].tolist() == first["VERDICTS"].tolist()
        # same model, same batch, same CPU kernels: equal up to float noise
        np.testing.assert_allclose(other["PROBABILITIES"], first["PROBABILITIES"], rtol=0, atol=1e-6)
    # a request parameter route too
    fast = [infer(server, "grpc", "router", TEXTS[:3], parameters={"route": "fast"}) for server in (a, b)]
    assert fast[0]["ROUTE"] == fast[1]["ROUTE"] == ["classifier_fast"] * 3
    np.testing.assert_allclose(fast[0]["PROBABILITIES"], fast[1]["PROBABILITIES"], rtol=0, atol=1e-6)


def test_the_ab_split_sends_a_request_id_to_the_same_arm_on_both_replicas(replicas):
    a, b = replicas
    arms = {}
    for i in range(120):
        rid = f"customer-{i}"
        on_a = infer(a, "http", "router_ab", TEXTS[:2], request_id=rid)
        on_b = infer(b, "grpc", "router_ab", TEXTS[:2], request_id=rid)
        assert on_a["ROUTE"] == on_b["ROUTE"], rid
        assert len(set(on_a["ROUTE"])) == 1, rid  # one arm per request, all its texts
        np.testing.assert_allclose(on_a["PROBABILITIES"], on_b["PROBABILITIES"], rtol=0, atol=1e-6)
        arms[rid] = on_a["ROUTE"][0]
    assert set(arms.values()) == {"a:classifier", "b:classifier_fast"}
    share_a = sum(v == "a:classifier" for v in arms.values()) / len(arms)
    assert 0.8 <= share_a <= 0.97  # the policy's 90/10 weights (120 fixed ids)
    # asked again, later, in the other order: still the same arm
    for rid in list(arms)[:10]:
        assert infer(b, "http", "router_ab", TEXTS[:1], request_id=rid)["ROUTE"] == [arms[rid]]
        assert infer(a, "grpc", "router_ab", TEXTS[:1], request_id=rid)["ROUTE"] == [arms[rid]]


# ----------------------------------------------------------------------------- on demand


def test_on_demand_models_load_and_unload_per_replica(replicas):
    a, b = replicas
    spare = {"route": "spare"}
    loads = dict(router="router_ondemand", model="classifier_spare", outcome="success")
    unloads = dict(router="router_ondemand", model="classifier_spare")
    assert state(a, "classifier_spare") != "READY" and state(b, "classifier_spare") != "READY"
    assert infer(a, "http", "router_ondemand", TEXTS[:2], parameters=spare)["ROUTE"] == ["classifier_spare"] * 2
    assert state(a, "classifier_spare") == "READY"
    assert state(b, "classifier_spare") != "READY"  # replica B's router has not needed it
    assert value(settled_scrape(a), "orchestrator_model_loads_total", **loads) == 1
    assert value(b.metrics(), "orchestrator_model_loads_total", **loads) == 0
    assert infer(b, "grpc", "router_ondemand", TEXTS[:2], parameters=spare)["ROUTE"] == ["classifier_spare"] * 2
    assert state(b, "classifier_spare") == "READY"
    assert value(settled_scrape(b), "orchestrator_model_loads_total", **loads) == 1
    # each router unloads its own replica's copy once idle (idle_timeout_s: 2)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and "READY" in (state(a, "classifier_spare"), state(b, "classifier_spare")):
        time.sleep(0.5)
    assert state(a, "classifier_spare") != "READY" and state(b, "classifier_spare") != "READY"
    for server in (a, b):
        assert value(settled_scrape(server), "orchestrator_model_unloads_total", **unloads) == 1


# ----------------------------------------------------------------------------- metrics


def relabel(meta: dict, rules: list) -> dict:
    """Prometheus ``replace`` relabeling (the only action the ServiceMonitor uses): join the
    source labels with ';', match ``regex`` (default ``(.*)``, anchored), write
    ``replacement`` (default ``$1``) to ``targetLabel``; an empty result removes the label."""
    labels = dict(meta)
    for rule in rules:
        assert rule.get("action", "replace") == "replace", rule
        joined = rule.get("separator", ";").join(labels.get(s, "") for s in rule["sourceLabels"])
        m = re.fullmatch(rule.get("regex", "(.*)"), joined)
        if m:
            result = m.expand(rule.get("replacement", "$1").replace("$", "\\"))
            if result:
                labels[rule["targetLabel"]] = result
            else:
                labels.pop(rule["targetLabel"], None)
    return labels


def target_labels(meta: dict, rules: list) -> dict:
    """The labels a target keeps after relabeling: ``instance`` defaults to the address,
    labels starting with ``__`` are dropped (Prometheus' documented behaviour)."""
    labels = relabel(meta, rules)
    labels.setdefault("instance", labels["__address__"])
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def test_replicas_expose_the_same_series_and_the_servicemonitor_keeps_them_apart(replicas):
    a, b = replicas
    ok_labels = dict(router="router", outcome="success")
    before = {"pod-a": settled_scrape(a), "pod-b": b.metrics()}
    sent = {"pod-a": 3, "pod-b": 5}
    for server, n in ((a, sent["pod-a"]), (b, sent["pod-b"])):
        for i in range(n):
            infer(server, "http", "router", TEXTS[:1], request_id=f"m-{i}")
    scrapes = {"pod-a": settled_scrape(a), "pod-b": b.metrics()}
    for pod in sent:  # each replica counted what it served, and only that
        delta = value(scrapes[pod], "orchestrator_requests_total", **ok_labels) - value(before[pod], "orchestrator_requests_total", **ok_labels)
        assert delta == sent[pod]
    def ours(series):
        return {k for k in series if k[0].startswith(("orchestrator_", "nv_inference_"))}

    keys_a, keys_b = ours(scrapes["pod-a"]), ours(scrapes["pod-b"])
    shared = keys_a & keys_b
    # the same series on both (names and labels): nothing in them says which replica
    ok = ("orchestrator_requests_total", frozenset({("router", "router"), ("outcome", "success")}))
    assert ok in shared and ("nv_inference_request_success", frozenset({("model", "router"), ("version", "1")})) in shared
    assert len(shared) >= 0.9 * len(keys_a | keys_b), sorted(map(str, (keys_a ^ keys_b)))[:40]
    # and none of the labels the scrape adds (a clash would rename the series' own label)
    added = {"pod", "kubernetes_node", "namespace", "instance", "job"}
    assert not any(added & dict(labels).keys() for _, labels in keys_a | keys_b)

    monitor = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "servicemonitor.yaml").read_text())
    rules = monitor["spec"]["endpoints"][0]["relabelings"]
    pods = {
        "pod-a": {"__address__": f"10.0.0.1:{a.metrics_port}", "__meta_kubernetes_pod_name": "orchestrator-triton-7d9c-a",
                  "__meta_kubernetes_pod_node_name": "gpu-node-1", "__meta_kubernetes_namespace": "orchestrator"},
        "pod-b": {"__address__": f"10.0.0.2:{b.metrics_port}", "__meta_kubernetes_pod_name": "orchestrator-triton-7d9c-b",
                  "__meta_kubernetes_pod_node_name": "gpu-node-2", "__meta_kubernetes_namespace": "orchestrator"},
    }
    stored = {}
    for pod, samples in scrapes.items():
        extra = target_labels(pods[pod], rules)
        assert {"pod", "kubernetes_node", "namespace"} <= set(extra)
        for name, labels in ours(samples):
            key = (name, frozenset(dict(labels, **extra).items()))
            assert key not in stored, key  # no two replicas' series collide once scraped
            stored[key] = samples[(name, labels)]
    assert len(stored) == len(keys_a) + len(keys_b)
    # and each pod's series holds that replica's own count
    per_pod = {}
    for (name, labels), v in stored.items():
        d = dict(labels)
        if name == "orchestrator_requests_total" and d["router"] == "router" and d["outcome"] == "success":
            per_pod[d["pod"]] = v
    assert per_pod == {
        "orchestrator-triton-7d9c-a": value(scrapes["pod-a"], "orchestrator_requests_total", **ok_labels),
        "orchestrator-triton-7d9c-b": value(scrapes["pod-b"], "orchestrator_requests_total", **ok_labels),
    }


def test_every_metric_the_dashboard_and_the_autoscalers_query_is_exposed(replicas):
    """Metric names in deploy/grafana, the Prometheus adapter rules and the KEDA triggers
    exist on a real replica. Triton declares its nv_inference_* families from the start; a
    router family appears with its first sample, so the router's are exercised here (chunks,
    an escalation, an on-demand load) and the rest must be in the metrics reference's table
    (node errors need a failing model). nv_gpu_* exist only on GPU nodes: not here."""
    a, _ = replicas
    out = infer(a, "http", "router", TEXTS)
    fast = infer(a, "http", "router", TEXTS[2:3], parameters={"route": "fast"})["PROBABILITIES"][0]
    assert infer(a, "http", "router", TEXTS[2:3], threshold=float(fast))["ROUTE"] == ["classifier"]  # escalated
    assert out["ROUTE"][4].startswith("chunked:")
    infer(a, "http", "router_ondemand", TEXTS[:1], parameters={"route": "spare"})
    samples = settled_scrape(a)
    exposed = {re.sub(r"_(bucket|sum|count)$", "", name) if name.startswith("orchestrator_node_latency") else name for name, _ in samples}
    texts = [
        (ROOT / "deploy" / "grafana" / "orchestrator-dashboard.json").read_text(),
        (ROOT / "deploy" / "prometheus-adapter" / "values.yaml").read_text(),
        (ROOT / "deploy" / "k8s" / "components" / "keda" / "scaledobject.yaml").read_text(),
    ]
    queried = {m for t in texts for m in re.findall(r"\b((?:orchestrator|nv)_[a-z_]+)", t)}
    queried = {re.sub(r"_bucket$", "", m) for m in queried}
    queried -= {"orchestrator_router_queue_us_per_request", "orchestrator_router_requests_per_second"}  # the adapter's own names
    gpu_only = {m for m in queried if m.startswith("nv_gpu_")}
    assert gpu_only and queried - gpu_only
    documented = set(re.findall(r"^\| `(orchestrator_\w+)` \|", (ROOT / "docs" / "reference" / "metrics.md").read_text(), re.M))
    router = {m for m in queried if m.startswith("orchestrator_")}
    assert {"orchestrator_requests_total", "orchestrator_texts_total", "orchestrator_escalations_total",
            "orchestrator_chunks_total", "orchestrator_model_loads_total", "orchestrator_node_latency_seconds"} <= router & exposed
    assert sorted(router - exposed - documented) == []
    assert sorted(queried - router - gpu_only - exposed) == []
