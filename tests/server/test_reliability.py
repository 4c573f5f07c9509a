"""Breaking things on purpose against a real server: a killed stub, oversized input, odd requests.

One server for the module (its own: a killed stub must not disturb other modules) serving
tokenizer, both classifiers, postprocess and the shipped router, under
``--model-control-mode=explicit`` so the router may reload a model whose stub died.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from orchestrator.tooling.modeling import data
from orchestrator.tooling.soak.procs import read_proc
from tests.helpers import call, make_test_repository, routes, rss_bytes, stub_pid

MODELS = ["tokenizer", "classifier", "classifier_fast", "postprocess", "router", "router_strict"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from orchestrator.tooling.server import TritonServer

    repo = make_test_repository(tmp_path_factory.mktemp("reliability") / "model_repository")
    with TritonServer(repo, models=MODELS) as srv:
        yield srv


@pytest.fixture(scope="module")
def texts():
    return data.held_out_texts(n=24, seed=5)


def test_a_killed_classifier_stub_degrades_then_heals(server, texts):
    """SIGKILL the classifier_fast stub (a child of this test's server, found by pid): the
    texts that need it are answered by classifier at once, requests that do not need it
    keep working, and the router reloads the model so classifier_fast answers again."""
    healthy_fast = call(server, "router", texts, parameters={"route": "fast"})["PROBABILITIES"].reshape(-1)
    healthy_acc = call(server, "router", texts, parameters={"route": "accurate"})["PROBABILITIES"].reshape(-1)
    assert set(routes(call(server, "router", texts))) <= {"classifier_fast", "classifier"}
    old = stub_pid(server, "classifier_fast_0_0")
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()
    while getattr(read_proc(old), "state", "Z") != "Z" and time.monotonic() - killed < 5:
        time.sleep(0.001)  # until the kill is done: the stub is a zombie of the server
    time.sleep(0.05)  # past runtime.stubs.CHECK_S since the router last saw the stub alive

    out = call(server, "router", texts)  # every text needs classifier_fast first
    first_answer_s = time.monotonic() - killed
    assert routes(out) == ["classifier"] * len(texts)
    np.testing.assert_allclose(out["PROBABILITIES"].reshape(-1), healthy_acc, atol=1e-5)
    # the router saw the zombie in /proc and did not wait python_backend's 1 s health timeout
    # (the bound separates an answer from the fallback from waiting for a repair)
    log = server.log_path.read_text()
    assert "classifier_fast_0_0' is not healthy (process" in log
    # the repair goes over gRPC (an HTTP load would stall HTTP clients; runtime/control.py)
    assert "reloading the model (repository API over grpc)" in log
    assert first_answer_s < 5.0, first_answer_s
    acc = call(server, "router", texts, parameters={"route": "accurate"})
    assert routes(acc) == ["classifier"] * len(texts)

    deadline = killed + 30
    while time.monotonic() < deadline:
        out = call(server, "router", texts, parameters={"route": "fast"})
        if routes(out) == ["classifier_fast"] * len(texts):
            break
        time.sleep(0.25)
    healed_s = time.monotonic() - killed
    assert routes(out) == ["classifier_fast"] * len(texts), f"not healed after {healed_s:.1f} s"
    np.testing.assert_allclose(out["PROBABILITIES"].reshape(-1), healthy_fast, atol=1e-5)
    assert stub_pid(server, "classifier_fast_0_0") != old
    time.sleep(1.2)  # metrics are flushed every 0.5 s
    assert server.metric("orchestrator_model_reloads_total", model="classifier_fast", outcome="success") == 1
    assert server.metric("orchestrator_circuit_state", model="classifier_fast") == 0
    assert server.metric("orchestrator_circuit_transitions_total", model="classifier_fast", state="open") >= 1
    assert server.is_ready()


def _text_input(arr):
    inp = httpclient.InferInput("TEXT", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    thr = httpclient.InferInput("THRESHOLD", [arr.shape[0], 1], "FP32")
    thr.set_data_from_numpy(np.full((arr.shape[0], 1), 0.5, np.float32))
    return [inp, thr]


def test_an_oversized_text_is_refused_at_once_without_growing_the_router(server, texts):
    router_pid = stub_pid(server, "router_0_0")
    big = np.array([b"good " * ((8 << 20) // 5)], dtype=object).reshape(1, 1)  # 8 MiB
    call(server, "router", texts[:4])  # warm
    before = rss_bytes(router_pid)

    def oversized():
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)  # one per thread (gevent)
        try:
            start = time.monotonic()
            with pytest.raises(InferenceServerException, match=r"TEXT\[0\]: 8388605 bytes, over the limit of 65536 bytes per text"):
                client.infer("router", _text_input(big))
            return time.monotonic() - start
        finally:
            client.close()

    def normal():
        start = time.monotonic()
        return call(server, "router", texts[:2]), time.monotonic() - start

    with cf.ThreadPoolExecutor(3) as pool:
        refusals = [pool.submit(oversized) for _ in range(20)]
        time.sleep(0.2)
        small = [pool.submit(normal) for _ in range(3)]
        durations = [f.result() for f in refusals]
        answers = [f.result() for f in small]
    assert all(len(routes(out)) == 2 for out, _ in answers)
    after = rss_bytes(router_pid)
    assert after - before < 50 * 2**20, (before, after)
    assert max(durations) < 10.0, durations  # sending 8 MiB over loopback dominates; the router refuses at once
    time.sleep(1.2)  # metrics are flushed every 0.5 s
    assert server.metric("orchestrator_rejected_requests_total", router="router", limit="max_text_bytes") >= 20


def test_policy_output_alone_without_describe_policy_is_an_error(server, texts):
    client = httpclient.InferenceServerClient(server.http_url)
    arr = np.array([t.encode() for t in texts[:1]], dtype=object).reshape(-1, 1)
    try:
        with pytest.raises(InferenceServerException, match="POLICY: this output is only produced for requests with the parameter describe_policy=true"):
            client.infer("router", _text_input(arr), outputs=[httpclient.InferRequestedOutput("POLICY")])
        r = client.infer("router", _text_input(arr), outputs=[httpclient.InferRequestedOutput("POLICY")],
                         parameters={"describe_policy": True})
        assert b'"root"' in r.as_numpy("POLICY")[0, 0]
        r = client.infer("router", _text_input(arr))  # no outputs named: all but POLICY
        assert r.as_numpy("POLICY") is None and r.as_numpy("ROUTE") is not None
    finally:
        client.close()


def test_an_unknown_request_parameter_is_refused(server, texts):
    with pytest.raises(InferenceServerException, match=r"parameter 'rout': not a parameter of this router \(it accepts: describe_policy, route\)"):
        call(server, "router", texts[:1], parameters={"rout": "fast"})
    # Triton's own request options never reach the router's parameters
    client = httpclient.InferenceServerClient(server.http_url)
    arr = np.array([t.encode() for t in texts[:1]], dtype=object).reshape(-1, 1)
    try:
        r = client.infer("router", _text_input(arr), priority=1, timeout=10_000_000)
        assert r.as_numpy("ROUTE").shape == (1, 1)
    finally:
        client.close()
    assert server.is_ready()
