"""Cancellation and deadlines on a real tritonserver (docs/guides/reliability.md "Cancellation",
"Deadlines").

A deliberately slow downstream model (``classifier_slow``: a Python model that sleeps
:data:`SLOW_S` per execute and answers logit 0, probability 0.5, unsure at every margin)
makes the timing plain: ``router_slow_first`` cascades from it to ``classifier`` (every
text escalates), ``router_slow_second`` from ``classifier_fast`` to it. Downstream calls
are counted with Triton's statistics extension, the router's counters on ``/metrics``.
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
import threading
import time

import numpy as np
import pytest

from orchestrator.tooling.migrate import MODEL_PY as ROUTER_MODEL_PY
from orchestrator.tooling.modeling import data
from tests.helpers import REPO, add_router_variant, eventually

pytestmark = pytest.mark.server

SLOW_S = 2.0  # seconds classifier_slow sleeps per execute
MODELS = ["tokenizer", "classifier", "classifier_fast", "classifier_slow", "router_slow_first", "router_slow_second",
          "postprocess", "pipe_slow", "pipe_slow_unchecked"]

#: A pipeline router (tokenizer -> classifier_slow -> postprocess), the shipped ensemble's
#: interface; ``pipe_slow_unchecked`` is the same with ``check_cancelled: false``.
PIPE_CONFIG = '''# Test-only (tests/server/test_cancel_deadline.py): a pipeline router through classifier_slow.
name: "{name}"
backend: "python"
max_batch_size: 64
input {{ name: "TEXT" data_type: TYPE_STRING dims: 1 }}
input {{ name: "THRESHOLD" data_type: TYPE_FP32 dims: 1 }}
output {{ name: "PROBABILITIES" data_type: TYPE_FP32 dims: -1 }}
output {{ name: "VERDICTS" data_type: TYPE_BOOL dims: -1 }}
instance_group {{ count: 1 kind: KIND_CPU }}
parameters {{ key: "policy" value {{ string_value: "policy.yaml" }} }}
'''
PIPE_STEPS = [
    {"kind": "step", "model": "tokenizer", "inputs": {"TEXT": "TEXT"},
     "outputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
    {"kind": "step", "model": "classifier_slow", "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"},
     "outputs": {"logits": "logits"}},
    {"kind": "step", "model": "postprocess", "inputs": {"logits": "logits", "THRESHOLD": "THRESHOLD"},
     "outputs": {"PROBABILITIES": "PROBABILITIES", "VERDICTS": "VERDICTS"}},
]

SLOW_MODEL = '''"""Test-only: sleeps SLOW_S seconds per execute, then answers logit 0 for every row."""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.seconds = float(params["SLOW_S"]["string_value"])

    def execute(self, requests):
        time.sleep(self.seconds)
        out = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().shape[0]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("logits", np.zeros((rows, 1), np.float32))]))
        return out
'''

SLOW_CONFIG = f'''# Test-only (tests/server/test_cancel_deadline.py): the classifier's inputs and outputs, slow.
name: "classifier_slow"
backend: "python"
max_batch_size: 64
input {{ name: "input_ids" data_type: TYPE_INT64 dims: -1 }}
input {{ name: "attention_mask" data_type: TYPE_INT64 dims: -1 }}
output {{ name: "logits" data_type: TYPE_FP32 dims: 1 }}
instance_group {{ count: 1 kind: KIND_CPU }}
dynamic_batching {{ }}
parameters {{ key: "SLOW_S" value {{ string_value: "{SLOW_S}" }} }}
'''


def _chunk(name: str, model: str) -> dict:
    return {"kind": "chunk", "name": f"chunk_{name}", "node": {"kind": "model", "name": name, "model": model}}


def _policy(first: tuple, second: tuple) -> dict:
    return {
        "version": 1,
        "inline": {"tokenizer": True},
        "defaults": {"chunk": {"window": 128, "stride": 96}},
        "root": {"kind": "cascade", "name": "cascade", "margin": 1.0, "stages": [_chunk(*first), _chunk(*second)]},
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from orchestrator.tooling.server import TritonServer

    repo = tmp_path_factory.mktemp("cancel") / "model_repository"
    for name in ("tokenizer", "classifier", "classifier_fast"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "env.pbtxt"))
    slow = repo / "classifier_slow"
    (slow / "1").mkdir(parents=True)
    (slow / "1" / "model.py").write_text(SLOW_MODEL)
    (slow / "config.pbtxt").write_text(SLOW_CONFIG)
    shutil.copy(REPO / "classifier" / "head.json", slow / "head.json")
    add_router_variant(repo, "router_slow_first", _policy(("slow", "classifier_slow"), ("accurate", "classifier")))
    add_router_variant(repo, "router_slow_second", _policy(("fast", "classifier_fast"), ("slow", "classifier_slow")))
    shutil.copytree(REPO / "postprocess", repo / "postprocess", ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "env.pbtxt"))
    for name, checked in (("pipe_slow", True), ("pipe_slow_unchecked", False)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(ROUTER_MODEL_PY)
        (repo / name / "config.pbtxt").write_text(PIPE_CONFIG.format(name=name))
        document = {"version": 1, "check_cancelled": checked, "pipeline": {"outputs": ["PROBABILITIES", "VERDICTS"], "steps": PIPE_STEPS}}
        (repo / name / "policy.yaml").write_text(json.dumps(document))
    with TritonServer(repo, models=MODELS) as srv:
        yield srv


def long_text() -> str:
    """A held-out text of several 128-token windows."""
    return " ".join(data.held_out_texts(n=12, corpus="movie_reviews", seed=3))


def inputs_grpc(texts, grpcclient):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    thr = np.full((len(texts), 1), 0.5, np.float32)
    out = [grpcclient.InferInput("TEXT", list(t.shape), "BYTES"), grpcclient.InferInput("THRESHOLD", list(thr.shape), "FP32")]
    out[0].set_data_from_numpy(t)
    out[1].set_data_from_numpy(thr)
    return out


def executions(server, model: str) -> tuple:
    """(successful inferences, executions) of ``model`` (Triton's statistics extension)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"]), int(stats["execution_count"])
    finally:
        client.close()


def router_counter(server, family: str, router: str, **labels) -> float:
    return server.metric(family, router=router, **labels)


def settled_counter(server, family, router, want, wait_s=5.0, **labels) -> float:
    """The router's counter once its 0.5 s metric flush reached ``want`` (or ``wait_s``
    passed), then one more flush, so a double count would show."""
    eventually(lambda: router_counter(server, family, router, **labels), want, timeout=wait_s)
    time.sleep(0.7)
    return router_counter(server, family, router, **labels)


def wait_idle(server, model: str, executions_want: int, wait_s: float = 3 * SLOW_S) -> None:
    deadline = time.monotonic() + wait_s
    while executions(server, model)[1] < executions_want and time.monotonic() < deadline:
        time.sleep(0.1)


def cancel_while_slow_runs(server, router: str, text: str, slow_before: tuple) -> None:
    """Send ``text`` to ``router`` over gRPC, cancel it while ``classifier_slow`` runs for it,
    check the client was answered cancelled, then wait until ``classifier_slow`` is idle and
    the router's next stage would have been called (``slow_before``: its ``executions``)."""
    import tritonclient.grpc as grpcclient

    results = []
    done = threading.Event()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        handle = client.async_infer(router, inputs_grpc([text], grpcclient),
                                    callback=lambda result, error: (results.append((result, error)), done.set()))
        time.sleep(SLOW_S / 2)  # classifier_slow is running
        handle.cancel()
        assert done.wait(10), "the client got no callback"
        assert results[0][0] is None and "cancel" in str(results[0][1]).lower()
        wait_idle(server, "classifier_slow", slow_before[1] + 1)
        time.sleep(1.0)  # the router's next stage would have been called by now
    finally:
        client.close()


# ----------------------------------------------------------------------------- cancellation


def test_a_cancelled_grpc_request_stops_before_its_next_stage(server):
    router = "router_slow_first"
    text = long_text()
    accurate_before = executions(server, "classifier")
    slow_before = executions(server, "classifier_slow")
    cancelled_before = router_counter(server, "orchestrator_cancelled_requests_total", router)
    cancel_while_slow_runs(server, router, text, slow_before)
    slow_after = executions(server, "classifier_slow")
    assert slow_after[1] == slow_before[1] + 1  # the first stage ran once (all windows in one call)
    assert executions(server, "classifier") == accurate_before  # the escalation was never sent
    assert settled_counter(server, "orchestrator_cancelled_requests_total", router, cancelled_before + 1) == cancelled_before + 1


def test_an_uncancelled_request_of_the_same_router_is_escalated(server):
    """The control of the test above: without a cancel the long text goes to both stages."""
    from tests.helpers import call, routes

    accurate_before = executions(server, "classifier")[1]
    out = call(server, "router_slow_first", [long_text()])
    assert routes(out) == ["chunked:classifier"]
    # Triton counts the classifier's execution after its response went out: wait for it.
    assert eventually(lambda: executions(server, "classifier")[1], accurate_before + 1, timeout=5) == accurate_before + 1


@pytest.mark.parametrize("router,asks", [("pipe_slow", True), ("pipe_slow_unchecked", False)])
def test_a_cancelled_grpc_request_to_a_pipeline_stops_before_its_next_step_unless_its_policy_never_asks(server, router, asks):
    post_before = executions(server, "postprocess")
    slow_before = executions(server, "classifier_slow")
    cancelled_before = router_counter(server, "orchestrator_cancelled_requests_total", router)
    cancel_while_slow_runs(server, router, "A fine film.", slow_before)
    assert executions(server, "classifier_slow")[1] == slow_before[1] + 1
    # asked before the third step: not run; never asked (check_cancelled: false): run, its answer dropped by Triton
    assert executions(server, "postprocess")[1] == post_before[1] + (0 if asks else 1)
    want = cancelled_before + (1 if asks else 0)
    assert settled_counter(server, "orchestrator_cancelled_requests_total", router, want) == want


def _http_request_bytes(server, model: str, text: str) -> bytes:
    body = json.dumps({"inputs": [
        {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [text]},
        {"name": "THRESHOLD", "shape": [1, 1], "datatype": "FP32", "data": [0.5]},
    ]}).encode()
    host, port = server.http_url.split(":")
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


@pytest.mark.parametrize("how", ["close", "reset"])
def test_closing_an_http_connection_does_not_cancel_the_request(server, how):
    """Measured on Triton 2.51: a client that closes its HTTP connection (FIN, or RST with
    SO_LINGER 0) while the request runs does not cancel it. The HTTP frontend cancels a
    request only from its request-fini hook (server r24.10
    ``InferRequestClass::RequestFiniHook``), which did not run before the router's next
    stage: ``is_cancelled()`` stays False and the escalation is sent. Cancel over gRPC."""
    router = "router_slow_first"
    accurate_before = executions(server, "classifier")[1]
    slow_before = executions(server, "classifier_slow")[1]
    cancelled_before = router_counter(server, "orchestrator_cancelled_requests_total", router)
    host, port = server.http_url.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(_http_request_bytes(server, router, long_text()))
    time.sleep(SLOW_S / 2)  # the first stage is running
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    wait_idle(server, "classifier", accurate_before + 1)
    assert executions(server, "classifier_slow")[1] == slow_before + 1
    assert executions(server, "classifier")[1] == accurate_before + 1  # the escalation was sent all the same
    assert settled_counter(server, "orchestrator_cancelled_requests_total", router, cancelled_before, wait_s=0) == cancelled_before


# ----------------------------------------------------------------------------- deadlines


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_short_client_timeout_answers_from_the_first_stage(server, protocol):
    """tritonclient's ``timeout=`` (microseconds; the KServe v2 ``timeout`` request
    parameter) becomes the request's ``timeout()``. The first request of a protocol
    finds the slow stage measured or not: either way its answer is the first stage's,
    ``:deadline``. Then the stage is not even started."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    router = "router_slow_second"
    texts = ["A fine, warm film.", "Dull and long."]
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    client = module.InferenceServerClient(url)
    try:
        deadline_before = router_counter(server, "orchestrator_deadline_texts_total", router, node="cascade")
        for attempt in range(2):
            slow_before = executions(server, "classifier_slow")[1]
            t0 = time.monotonic()
            result = client.infer(router, inputs_grpc(texts, module), timeout=int(SLOW_S / 4 * 1e6))
            took = time.monotonic() - t0
            assert [r.decode() for r in result.as_numpy("ROUTE").reshape(-1)] == ["classifier_fast:deadline"] * 2
            p = result.as_numpy("PROBABILITIES").reshape(-1)
            assert np.all(np.abs(p - 0.5) > 1e-6)  # classifier_fast's answer, not the slow model's 0.5
            if attempt == 1:  # measured by now: the slow stage is not started at all
                assert executions(server, "classifier_slow")[1] == slow_before and took < SLOW_S
        want = deadline_before + 2 * len(texts)
        assert settled_counter(server, "orchestrator_deadline_texts_total", router, want, node="cascade") == want
    finally:
        client.close()


def test_without_a_timeout_the_slow_stage_answers(server):
    from tests.helpers import call, routes

    out = call(server, "router_slow_second", ["A fine, warm film."])
    assert routes(out) == ["classifier_slow"]
    assert float(out["PROBABILITIES"].reshape(-1)[0]) == pytest.approx(0.5)
