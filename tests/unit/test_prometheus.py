"""orchestrator.tooling.prometheus: samples keep the names Prometheus stores them under."""

import pytest

from orchestrator.tooling import prometheus

TEXT = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="router",version="1"} 5
nv_inference_request_success{model="classifier",version="1"} 7
# HELP orchestrator_requests_total Router requests by outcome
# TYPE orchestrator_requests_total counter
orchestrator_requests_total{outcome="success",router="router"} 2
orchestrator_requests_total{outcome="error",router="router"} 1
orchestrator_requests_total{outcome="success",router="router_ab"} 4
# TYPE orchestrator_node_latency_seconds histogram
orchestrator_node_latency_seconds_bucket{node="cascade",router="router",le="0.1"} 3
orchestrator_node_latency_seconds_bucket{node="cascade",router="router",le="+Inf"} 4
orchestrator_node_latency_seconds_count{node="cascade",router="router"} 4
orchestrator_node_latency_seconds_sum{node="cascade",router="router"} 0.25
nv_model_note{reason="say \\"hi\\", then go"} 1
"""


def test_counters_keep_their_exposed_names():
    samples = prometheus.parse(TEXT)
    names = {name for name, _ in samples}
    assert "nv_inference_request_success" in names and "nv_inference_request_success_total" not in names
    assert "orchestrator_requests_total" in names
    assert {"orchestrator_node_latency_seconds_bucket", "orchestrator_node_latency_seconds_count",
            "orchestrator_node_latency_seconds_sum"} <= names


def test_value_matches_exact_labels_and_total_sums_the_matching_series():
    samples = prometheus.parse(TEXT)
    assert prometheus.value(samples, "nv_inference_request_success", model="router", version="1") == 5
    assert prometheus.value(samples, "nv_inference_request_success", model="router") == 0.0  # not the exact label set
    assert prometheus.total(samples, "orchestrator_requests_total", outcome="success") == 6
    assert prometheus.total(samples, "orchestrator_requests_total", router="router") == 3
    assert prometheus.total(samples, "orchestrator_requests_total", router="absent") == 0.0
    assert prometheus.total(samples, "orchestrator_node_latency_seconds_bucket", le="+Inf") == 4
    assert prometheus.value(samples, "nv_model_note", reason='say "hi", then go') == 1


def test_malformed_text_is_an_error():
    with pytest.raises(ValueError):
        prometheus.parse('orchestrator_requests_total{outcome="success" 2\n')
