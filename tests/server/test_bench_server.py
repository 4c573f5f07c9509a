"""The benchmark harness against a real embedded server with a real perf_analyzer run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lab.bench.measurement import classify_all, write_input_data
from lab.bench.perf_analyzer import install_perf_analyzer, measure, perf_analyzer_version
from lab.bench.plan import BenchError, PASettings, Spec
from lab.bench.variants import make_bench_repository


@pytest.fixture(scope="module")
def perf_analyzer():
    try:
        return install_perf_analyzer()
    except BenchError as exc:
        pytest.skip(f"perf_analyzer cannot be installed here: {exc}")


def test_perf_analyzer_smoke_against_the_embedded_server(perf_analyzer, tmp_path):
    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    assert "2.41.0" in perf_analyzer_version(perf_analyzer)
    repo = make_bench_repository(tmp_path / "repo")
    texts = data.held_out_texts(n=50, seed=1)
    input_data = write_input_data(tmp_path / "in.json", texts)
    models = ["tokenizer", "classifier", "postprocess", "ensemble", "router_single"]
    with TritonServer(repo, models=models) as server:
        # router_single (the single-classifier policy) loads and sends every text to classifier
        out = classify_all(server.grpc_url, "router_single", texts[:8], batch=4)
        assert out["routes"] == ["classifier"] * 8
        ens = classify_all(server.grpc_url, "ensemble", texts[:8])
        assert ens["routes"] is None
        np.testing.assert_allclose(out["probabilities"], ens["probabilities"], atol=1e-5)

        settings = PASettings(measurement_interval_ms=500, check_stability=False, fallback=False, max_interval_ms=500)
        m = measure(perf_analyzer, Spec("grid", "ensemble", "held_out", 2), server.grpc_url, input_data,
                          tmp_path / "pa", settings)
    assert m["error"] is None, m
    assert m["throughput"] > 0
    assert 0 < m["p50_ms"] <= m["p90_ms"] <= m["p95_ms"] <= m["p99_ms"]
    assert m["windows"] == 3 and m["requests"] > 0
    assert m["stable"] is None and "--concurrency-range 2" in m["command"]
    assert math.isfinite(m["throughput_spread_pct"])
