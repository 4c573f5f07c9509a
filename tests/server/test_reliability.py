"""Breaking things on purpose against a real server: a killed stub, oversized input, odd requests.

One server for the module (its own: a killed stub must not disturb other modules) under the
shipped image's conditions (``orchestrator.tooling.production``): the repository copy's
bytecode compiled before the first load and the copy read-only, so no file of a model
changes after its load (Triton 2.51 then skips a plain load of a loaded model: a repair must
force new instances); ``--model-control-mode=explicit``, ``--strict-readiness=true`` and the
control plane restricted to a key with the image's two flags. It serves tokenizer, both
classifiers, postprocess, the shipped router, the router without fallbacks and an on-demand
router. The stub tests run in order: the first kill comes before the router ever looked at
the stub.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from lab.soak.procs import find_stub, read_proc
from orchestrator.tooling import production
from orchestrator.tooling.modeling import data
from tests.helpers import call, make_test_repository, routes, rss_bytes, stub_pid

MODELS = ["tokenizer", "classifier", "classifier_fast", "postprocess", "router", "router_strict", "router_ondemand", "router_pair"]
FAST = "classifier_fast_0_0"
HEAL_S = 10.0  # the self-healing bound: a killed stub's model answers again within 10 s


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from orchestrator.tooling.server import TritonServer

    repo = make_test_repository(tmp_path_factory.mktemp("reliability") / "model_repository")
    _add_router_pair(repo)
    production.freeze(repo)
    try:
        with TritonServer(repo, models=MODELS, control_key=production.new_key()) as srv:
            yield srv
    finally:
        production.thaw(repo)


def _add_router_pair(repo):
    """``router_pair``: the shipped router with two instances (two repairers in one server)."""
    import yaml

    from orchestrator.tooling import repository
    from tests.helpers import REPO, add_router_variant

    dest = add_router_variant(repo, "router_pair", yaml.safe_load((REPO / "router" / "policy.yaml").read_text()))
    config = repository.read_config(dest / "config.pbtxt")
    config.instance_group[0].count = 2
    repository.write_config(dest / "config.pbtxt", config, ["Test-only: the shipped router with two instances."])


@pytest.fixture(scope="module")
def texts():
    return data.held_out_texts(n=24, seed=5)


@pytest.fixture(scope="module")
def healthy(server, texts):
    """The healthy answers of classifier_fast and classifier for ``texts`` (the first calls
    of this module go through router_strict, so ``router`` has not looked at any stub)."""
    fast = call(server, "router_strict", texts, parameters={"route": "fast"})
    acc = call(server, "router_strict", texts, parameters={"route": "accurate"})
    assert routes(fast) == ["classifier_fast"] * len(texts) and routes(acc) == ["classifier"] * len(texts)
    return fast["PROBABILITIES"].reshape(-1), acc["PROBABILITIES"].reshape(-1)


def _kill(server, instance=FAST) -> tuple:
    """SIGKILL the stub of ``instance`` (a child of this test's server, by pid); returns its
    pid, the monotonic time once it is a zombie of the server, and the server log's size
    before the kill."""
    offset = len(server.log_path.read_bytes())
    pid = stub_pid(server, instance)
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    while getattr(read_proc(pid), "state", "Z") != "Z" and time.monotonic() - start < 5:
        time.sleep(0.001)
    return pid, time.monotonic(), offset


#: A load of classifier_fast takes 3-4 s here (docs/guides/reliability.md); the heal bound covers
#: that, and a load the busy machine made slower extends it by the excess, which is Triton's
#: time, not the repair's (the excess is printed).
NORMAL_LOAD_S = 4.0
_GLOG_TIME = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+) ")


def _load_excess_s(server, offset: int) -> float:
    """Seconds beyond :data:`NORMAL_LOAD_S` that the loads of classifier_fast begun in the
    server log after byte ``offset`` took (from "loading:" to "successfully loaded")."""
    excess, start = 0.0, None
    for line in server.log_path.read_bytes()[offset:].decode("utf-8", "replace").splitlines():
        m = _GLOG_TIME.match(line)
        if not m:
            continue
        t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        if '"loading: classifier_fast:' in line:
            start = t
        elif "successfully loaded 'classifier_fast'" in line and start is not None:
            excess += max(0.0, (t - start) % 86400 - NORMAL_LOAD_S)
            start = None
    return excess


def _wait_healed(server, texts, healthy_fast, old_pid, killed, offset=None, budget_s=HEAL_S) -> float:
    """Poll ``route=fast`` until classifier_fast answers every text from a stub other than
    ``old_pid``; seconds since ``killed``. Fails after ``budget_s`` (plus the excess of slow
    loads logged after byte ``offset``, when given)."""
    out, extra = None, 0.0
    while time.monotonic() - killed < budget_s + extra:
        out = call(server, "router", texts, parameters={"route": "fast"})
        if routes(out) == ["classifier_fast"] * len(texts):
            break
        time.sleep(0.1)
        extra = _load_excess_s(server, offset) if offset is not None else 0.0
    healed_s = time.monotonic() - killed
    assert out is not None and routes(out) == ["classifier_fast"] * len(texts), (
        f"not healed after {healed_s:.1f} s (slow loads: +{extra:.1f} s): {routes(out)}")
    np.testing.assert_allclose(out["PROBABILITIES"].reshape(-1), healthy_fast, atol=1e-5)
    new_pid = stub_pid(server, FAST)
    assert new_pid != old_pid
    if extra:
        print(f"healed in {healed_s:.2f} s, of which {extra:.2f} s the server's load took beyond {NORMAL_LOAD_S:g} s")
    return healed_s


def _metric(server, name, **labels) -> float:
    time.sleep(1.2)  # metrics are flushed every 0.5 s
    return server.metric(name, **labels)


def _repaired_pids(log_text: str) -> list:
    """The new stub pids that the router's successful repairs of classifier_fast named."""
    return [int(p) for p in re.findall(r"router: repaired 'classifier_fast' in [\d.]+ s \(success: reloaded \(config\), new stub process (\d+)\)", log_text)]


def test_the_image_flags_restrict_the_control_plane(server):
    """The image's flags (comma-separated groups, one flag per protocol) start Triton 2.51,
    and an anonymous client can neither load nor unload; with the key it can read."""
    assert any(a.startswith("--grpc-restricted-protocol=model-repository,model-config,") for a in server.command)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for action in (http.load_model, http.unload_model):
            with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'admin-key'") as info:
                action("classifier_fast")
            assert info.value.status() == "403"
        for action in (grpc.load_model, grpc.unload_model):
            with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-admin-key'"):
                action("classifier_fast")
        with pytest.raises(InferenceServerException, match="restricted"):
            grpc.load_model("classifier_fast", headers={"admin-key": server.control_key})  # the bare key is not gRPC's
        assert grpc.get_model_config("classifier_fast", headers=server.control_headers("grpc")).config.name == "classifier_fast"
    finally:
        http.close()
        grpc.close()
    assert server.is_ready() and {m["name"] for m in server.repository_index() if m.get("state") == "READY"} >= set(MODELS)


def test_a_stub_killed_before_the_router_first_looked_is_repaired(server, texts, healthy):
    """``router`` has made no call yet, so it never saw the stub alive: its zombie cannot be
    recognised in /proc, the first call waits python_backend's 1 s health timeout, the
    fallback answers and the repair brings a new stub."""
    healthy_fast, healthy_acc = healthy
    old, killed, offset = _kill(server)
    out = call(server, "router", texts, parameters={"route": "fast"})
    assert routes(out) == ["classifier"] * len(texts)  # the fallback
    np.testing.assert_allclose(out["PROBABILITIES"].reshape(-1), healthy_acc, atol=1e-5)
    _wait_healed(server, texts, healthy_fast, old, killed, offset)
    # (a second success is possible on a starved machine: a live stub that misses python_backend's
    # 1 s health check is reported as unhealthy and reloaded again)
    assert _metric(server, "orchestrator_model_reloads_total", router="router", model="classifier_fast", outcome="success") >= 1
    assert _metric(server, "orchestrator_model_reloads_total", router="router", model="classifier_fast", outcome="failure") == 0
    assert _repaired_pids(server.log_path.read_text())[-1] == stub_pid(server, FAST)  # the success named the new stub


def test_a_killed_classifier_stub_degrades_then_heals_three_times_in_a_row(server, texts, healthy):
    """SIGKILL the classifier_fast stub three times: each time the router sees the zombie
    in /proc before its next call (no 1 s wait), answers from classifier, and the repair
    brings a new stub within 10 s; the model answers again each time."""
    healthy_fast, healthy_acc = healthy
    before = _metric(server, "orchestrator_model_reloads_total", router="router", model="classifier_fast", outcome="success")
    pids = [stub_pid(server, FAST)]
    for i in range(3):
        call(server, "router", texts)  # the router has just seen the stub alive
        old, killed, offset = _kill(server)
        time.sleep(0.05)  # past runtime.bls.stubs.CHECK_S since the router last saw the stub alive
        out = call(server, "router", texts)  # every text needs classifier_fast first
        first_answer_s = time.monotonic() - killed
        assert routes(out) == ["classifier"] * len(texts)
        np.testing.assert_allclose(out["PROBABILITIES"].reshape(-1), healthy_acc, atol=1e-5)
        assert first_answer_s < 1.0, first_answer_s  # seen in /proc: python_backend's 1 s timeout not waited
        healed_s = _wait_healed(server, texts, healthy_fast, old, killed, offset)
        pids.append(stub_pid(server, FAST))
        print(f"kill {i + 1}: first answer {first_answer_s:.2f} s, healed {healed_s:.2f} s, stub {old} -> {pids[-1]}")
    assert len(set(pids)) == 4  # a new stub each time
    log = server.log_path.read_text()
    assert f"classifier_fast_0_0' is not healthy (process {pids[-2]} has exited; seen in /proc before the call)" in log
    assert "(repository API over grpc)" in log  # an HTTP load would stall HTTP clients (runtime/bls/control.py)
    assert set(pids[1:]) <= set(_repaired_pids(log))  # each success named the stub that then answered
    after = _metric(server, "orchestrator_model_reloads_total", router="router", model="classifier_fast", outcome="success")
    assert after - before >= 3
    assert server.metric("orchestrator_model_reloads_total", router="router", model="classifier_fast", outcome="failure") == 0
    assert server.metric("orchestrator_circuit_state", router="router", model="classifier_fast") == 0
    assert server.metric("orchestrator_circuit_transitions_total", router="router", model="classifier_fast", state="open") >= 3
    assert server.is_ready()


def test_a_stub_killed_while_an_execute_waits_on_it(server, texts, healthy):
    """The stub dies in the middle of a call: that call fails after python_backend's 1 s
    health timeout, the fallback answers it, and the repair brings a new stub."""
    healthy_fast, _ = healthy
    long_texts = [" ".join(texts[(i + k) % len(texts)] for k in range(10)) for i in range(48)]  # ~3 windows each
    pid = stub_pid(server, FAST)
    stat = f"/proc/{pid}/stat"

    def cpu_ticks():
        fields = open(stat).read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    box = {}

    def slow():
        start = time.monotonic()
        box["out"] = call(server, "router", long_texts, parameters={"route": "fast"})
        box["took_s"] = time.monotonic() - start

    offset = len(server.log_path.read_bytes())
    base = cpu_ticks()
    worker = threading.Thread(target=slow)
    worker.start()
    deadline = time.monotonic() + 10
    while cpu_ticks() < base + 3 and time.monotonic() < deadline:  # the stub is computing this request
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    worker.join(30)
    assert "out" in box, "the request did not come back"
    assert all(r in ("chunked:classifier", "classifier") for r in routes(box["out"])), routes(box["out"])
    assert box["took_s"] >= 1.0  # it waited python_backend's health timeout inside the call
    new_log = server.log_path.read_bytes()[offset:].decode("utf-8", "replace")
    assert "Stub process 'classifier_fast_0_0' is not healthy." in new_log  # python_backend's own error, not the watch's
    _wait_healed(server, texts, healthy_fast, pid, killed, offset)


def test_two_router_instances_repair_a_dead_stub_once(server, texts, healthy):
    """Both instances of router_pair call classifier_fast; after the kill, one reloads it
    and the other does not reload it again (it waits for the first's lock, or its report
    comes after the repair)."""
    healthy_fast, _ = healthy
    stop = threading.Event()
    seen_routes = []

    def traffic():
        while not stop.is_set():
            seen_routes.extend(routes(call(server, "router_pair", texts[:6])))

    workers = [threading.Thread(target=traffic) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        time.sleep(1.0)  # both instances busy
        offset = len(server.log_path.read_bytes())
        old, killed, _ = _kill(server)
        new = None
        while time.monotonic() - killed < HEAL_S + 5 and new is None:
            pid = find_stub(server.pid, FAST)
            new = pid if pid not in (None, old) else None
            time.sleep(0.05)
        time.sleep(3.0)  # both instances past the kill, with traffic
    finally:
        stop.set()
        for w in workers:
            w.join(60)
    assert new is not None
    log = server.log_path.read_bytes()[offset:].decode("utf-8", "replace")
    assert log.count("loading: classifier_fast") == 1, log[-3000:]  # one reload
    assert log.count("router 'router_pair': circuit of 'classifier_fast' closed -> open") >= 1
    success = _metric(server, "orchestrator_model_reloads_total", router="router_pair", model="classifier_fast", outcome="success")
    assert success == 1
    assert server.metric("orchestrator_model_reloads_total", router="router_pair", model="classifier_fast", outcome="failure") == 0
    assert "classifier_fast" in seen_routes
    _wait_healed(server, texts, healthy_fast, old, time.monotonic())


def test_on_demand_loads_work_with_the_control_plane_restricted(server, texts):
    """router_ondemand loads classifier_spare through the restricted repository API with the
    key it read from the server's command line."""
    out = call(server, "router_ondemand", texts[:4], parameters={"route": "spare"})
    assert routes(out) == ["classifier_spare"] * 4
    assert "router: loaded on-demand model 'classifier_spare'" in server.log_path.read_text()
    assert _metric(server, "orchestrator_model_loads_total", router="router_ondemand", model="classifier_spare", outcome="success") == 1


def test_a_killed_stub_is_seen_and_isolated(server, texts, healthy):
    """Requests that do not need the dead model keep working while it is repaired."""
    healthy_fast, healthy_acc = healthy
    call(server, "router", texts)
    old, killed, offset = _kill(server)
    time.sleep(0.05)
    acc = call(server, "router", texts, parameters={"route": "accurate"})
    assert routes(acc) == ["classifier"] * len(texts)
    np.testing.assert_allclose(acc["PROBABILITIES"].reshape(-1), healthy_acc, atol=1e-5)
    call(server, "router", texts)  # needs classifier_fast: starts the repair
    _wait_healed(server, texts, healthy_fast, old, killed, offset)
    assert find_stub(server.pid, FAST) is not None


@pytest.mark.parametrize("via", ["grpc", "http"])
def test_on_this_copy_a_plain_load_starts_nothing_and_the_forced_reload_a_new_stub(server, via, monkeypatch):
    """Why the repair forces its reload: on a compiled, unchanged repository Triton 2.51
    answers a plain load of a loaded model at once and keeps the old stub; the router's
    reload (its loaded config with one parameter changed) starts a new one, over gRPC and
    over HTTP, with the key the server's command line names."""
    from pathlib import Path

    from orchestrator.runtime.bls import control as control_module
    from orchestrator.runtime.bls.control import RepositoryControl, ServerOptions

    if via == "http":
        monkeypatch.setattr(control_module, "_grpc_client", lambda: None)
    control = RepositoryControl(None, ServerOptions.parse(server.command, Path.cwd()))
    assert control.via == via
    old = stub_pid(server, FAST)
    start = time.monotonic()
    control.load("classifier_fast")
    assert time.monotonic() - start < 1.0 and stub_pid(server, FAST) == old
    assert control.reload("classifier_fast", str(time.time_ns())) == "config"
    new = stub_pid(server, FAST)
    assert new != old
    config = control.config("classifier_fast")
    assert config["name"] == "classifier_fast" and "orchestrator_repair" in config["parameters"]


def _text_input(arr):
    inp = httpclient.InferInput("TEXT", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    thr = httpclient.InferInput("THRESHOLD", [arr.shape[0], 1], "FP32")
    thr.set_data_from_numpy(np.full((arr.shape[0], 1), 0.5, np.float32))
    return [inp, thr]


def test_an_oversized_text_is_refused_at_once_without_growing_the_router(server, texts):
    """Twenty 8 MiB texts (160 MiB) refused, three normal requests answered meanwhile, twice.
    The router's private memory (RssAnon: python_backend's shared-memory pool, which grows to
    hold a batch's inputs and never shrinks, is the platform's, not the router's) may hold a
    batch's copies of the texts (up to 3 in flight here) but none of the refused texts after
    them: a second burst adds next to nothing."""
    router_pid = stub_pid(server, "router_0_0")
    big = np.array([b"good " * ((8 << 20) // 5)], dtype=object).reshape(1, 1)  # 8 MiB
    call(server, "router", texts[:4])  # warm

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

    def burst():
        with cf.ThreadPoolExecutor(3) as pool:
            refusals = [pool.submit(oversized) for _ in range(20)]
            time.sleep(0.2)
            small = [pool.submit(normal) for _ in range(3)]
            durations = [f.result() for f in refusals]
            answers = [f.result() for f in small]
        assert all(len(routes(out)) == 2 for out, _ in answers)
        assert max(durations) < 10.0, durations  # sending 8 MiB over loopback dominates; the router refuses at once
        return rss_bytes(router_pid, "RssAnon")

    before = rss_bytes(router_pid, "RssAnon")
    first = burst()
    second = burst()
    assert first - before < 50 * 2**20, (before, first)  # a batch's copies at most, not the 160 MiB refused
    assert second - first < 25 * 2**20, (first, second)  # nothing of the first burst kept
    time.sleep(1.2)  # metrics are flushed every 0.5 s
    assert server.metric("orchestrator_rejected_requests_total", router="router", limit="max_text_bytes") >= 40


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
        part = client.infer("router", _text_input(arr), outputs=[httpclient.InferRequestedOutput(n) for n in ("VERDICTS", "PROBABILITIES")])
        assert part.as_numpy("ROUTE") is None and part.as_numpy("POLICY") is None  # only those named are built
        assert all(np.array_equal(part.as_numpy(n), r.as_numpy(n)) for n in ("VERDICTS", "PROBABILITIES"))
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
