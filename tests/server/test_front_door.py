"""The front door: the real nginx, configured by
``orchestrator.tooling.frontdoor.render`` from the repository's router policy, in front of the
embedded tritonserver on loopback ports, with the admin APIs restricted as in the image.

Checked through it, over HTTP and gRPC: the router answers; an oversized body is refused
before Triton runs anything (the router's statistics do not move); a direct classifier call
(gRPC too: the Lua model check) and the admin APIs are refused; one client over its quota gets 429 / RESOURCE_EXHAUSTED
saying so while another keeps its full rate; under a bounded load from several threads no
response is lost, duplicated or different from Triton's own answer; a model name hidden from
the check (over-long tags, a duplicate name) is refused as malformed and runs nothing; a control
character in an HTTP path is refused at the door; one client holding 64 ModelInfer and 64
ModelReady streams of maximal bodies keeps nginx well under the manifests' memory limit while
another client is served.
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from orchestrator.tooling import frontdoor as F
from orchestrator.tooling import frontdoor_nginx as N
from orchestrator.tooling.client import text_inputs
from orchestrator.tooling.deploy import always_on_models
from orchestrator.tooling.server import TritonServer, find_free_ports
from tests.helpers import eventually

pytestmark = pytest.mark.server

if not F.nginx_ready():
    pytest.skip(f"nginx or its Lua module is not installed: {F.INSTALL_HINT}", allow_module_level=True)

import tritonclient.grpc as grpcclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

ROUTERS = ("router", "router_ab")
QUOTAS = F.Quotas("x-client-id", F.Quota(100, 100), {
    "slow": F.Quota(2, 3),
    "fast": F.Quota(1000, 1000),
    "load": F.Quota(10000, 10000),
})


@pytest.fixture(scope="module")
def stack(test_repository):
    key = secrets.token_hex(16)
    t_http, t_grpc, t_metrics, p_http, p_grpc, p_metrics = find_free_ports(6)
    server = TritonServer(test_repository, models=always_on_models(test_repository, ROUTERS), http_port=t_http,
                          grpc_port=t_grpc, metrics_port=t_metrics, control_key=key)
    server.start()
    ports = F.Ports("127.0.0.1", p_http, p_grpc, p_metrics, t_http, t_grpc, t_metrics)
    limits = F.body_limits(test_repository)
    door = N.FrontDoor(F.render(QUOTAS, limits, ports, workers=1), ports)
    # a second door admitting two routers, one not named router (deploy/routers.yaml lists them)
    ports2 = F.Ports("127.0.0.1", *find_free_ports(3), t_http, t_grpc, t_metrics)
    door2 = N.FrontDoor(F.render(QUOTAS, F.body_limits(test_repository, ROUTERS), ports2, workers=1, routers=ROUTERS), ports2)
    try:
        door.start()
        door2.start()
        server.door2 = door2
        yield server, door, limits
    finally:
        door2.stop()
        door.stop()
        server.stop()


def http(port: int, path: str, method: str = "GET", body: bytes | None = None, client: str | None = None):
    """``(status, body)`` of one request, no proxy."""
    headers = {"Content-Type": "application/json"}
    if client:
        headers["x-client-id"] = client
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method, headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def router_counts(server: TritonServer) -> int:
    """Requests the router has seen (success + fail), from Triton's statistics extension."""
    stats = server.client().get_inference_statistics("router", headers=server.control_headers("http"))
    s = stats["model_stats"][0]["inference_stats"]
    return int(s["success"]["count"]) + int(s["fail"]["count"])


def classifier_counts(server: TritonServer) -> int:
    stats = server.client().get_inference_statistics("classifier", headers=server.control_headers("http"))
    s = stats["model_stats"][0]["inference_stats"]
    return int(s["success"]["count"]) + int(s["fail"]["count"])


def infer_body(texts, request_id: str = "") -> bytes:
    return json.dumps({"id": request_id, "inputs": [
        {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": list(texts)},
        {"name": "THRESHOLD", "shape": [len(texts), 1], "datatype": "FP32", "data": [0.5] * len(texts)},
    ]}).encode()


def grpc_client(door: N.FrontDoor, client_id: str | None = None):
    return grpcclient.InferenceServerClient(f"127.0.0.1:{door.ports.grpc}", channel_args=[("grpc.enable_http_proxy", 0)])


def grpc_headers(client_id: str | None):
    return {"x-client-id": client_id} if client_id else None


def test_router_answers_through_the_front_door_over_http_and_grpc(stack):
    server, door, _ = stack
    status, body = http(door.ports.http, "/v2/models/router/infer", "POST", infer_body(["great hotel, lovely staff"], "h1"))
    assert status == 200, body
    direct = http(server.http_port, "/v2/models/router/infer", "POST", infer_body(["great hotel, lovely staff"], "h1"))
    assert json.loads(body)["outputs"] == json.loads(direct[1])["outputs"]
    assert http(door.ports.http, "/v2/models/router/ready")[0] == 200
    assert http(door.ports.http, "/v2/health/live")[0] == 200
    assert http(door.ports.http, "/v2/models/router")[0] == 200
    c = grpc_client(door)
    try:
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("router")
        assert c.get_model_metadata("router").name == "router"
        result = c.infer("router", text_inputs(grpcclient, ["great hotel, lovely staff"]), request_id="g1")
        assert result.get_response().id == "g1"
        assert result.as_numpy("LABELS") is not None or result.get_response().outputs
    finally:
        c.close()
    metrics = http(door.ports.metrics, "/metrics")
    assert metrics[0] == 200 and "nv_inference_request_success" in metrics[1]


def test_oversized_body_refused_before_triton_on_http(stack):
    server, door, limits = stack
    before = router_counts(server)
    text = "a" * (limits.http + 1024)
    status, body = http(door.ports.http, "/v2/models/router/infer", "POST", infer_body([text]))
    assert status == 413, body
    assert f"front door limit of {limits.http} bytes" in body
    assert router_counts(server) == before, "Triton saw the oversized request"
    # A large request within the limits (2 MB: past nginx's in-memory body buffer) is served.
    status, body = http(door.ports.http, "/v2/models/router/infer", "POST", infer_body(["x" * 50000] * 40))
    assert status == 200 and len(json.loads(body)["outputs"][0]["data"]) == 40, body[:300]
    # Counted once it is: the refused request never was (a read right after a refusal
    # could pass only because Triton had not counted it yet).
    assert eventually(lambda: router_counts(server), before + 1, timeout=5) == before + 1


def test_oversized_body_refused_before_triton_on_grpc(stack):
    server, door, limits = stack
    before = router_counts(server)
    c = grpc_client(door)
    try:
        with pytest.raises(InferenceServerException) as info:
            c.infer("router", text_inputs(grpcclient, ["a" * (limits.grpc + 1024)]))
    finally:
        c.close()
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED", info.value
    assert f"front door limit of {limits.grpc} bytes" in info.value.message()
    assert router_counts(server) == before, "Triton saw the oversized request"
    # Just under the limit reaches the router, which applies its own per-text limit.
    c = grpc_client(door)
    try:
        with pytest.raises(InferenceServerException) as info:
            c.infer("router", text_inputs(grpcclient, ["a" * (limits.grpc - 4096)]))
    finally:
        c.close()
    assert "max_text_bytes" in info.value.message(), info.value
    # Triton counts a request after its response went out: wait for the count, which
    # also shows the refused request was never counted.
    assert eventually(lambda: router_counts(server), before + 1, timeout=5) == before + 1


def test_direct_classifier_and_admin_calls_refused(stack):
    server, door, _ = stack
    ids = np.ones((1, 8), dtype=np.int64).tolist()
    body = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 8], "datatype": "INT64", "data": ids}]}).encode()
    assert http(server.http_port, "/v2/models/classifier/ready")[0] == 200  # Triton itself would answer
    for path, method, data in [("/v2/models/classifier/infer", "POST", body), ("/v2/models/classifier/ready", "GET", None),
                               ("/v2/models/classifier/versions/1/infer", "POST", body),
                               ("/v2/models/router/../classifier/infer", "POST", body),
                               ("/v2/models/%63lassifier/infer", "POST", body),
                               ("/v2/repository/index", "POST", b"{}"), ("/v2/models/router/config", "GET", None),
                               ("/v2/models/router/stats", "GET", None), ("/v2/repository/models/router/unload", "POST", b"{}"),
                               ("/v2/models/router/generate", "POST", b"{}"), ("/v2/systemsharedmemory/status", "GET", None)]:
        status, text = http(door.ports.http, path, method, data)
        assert status in (400, 404), (path, status, text)
    status, text = http(door.ports.http, "/v2/models/classifier/infer", "POST", body)
    assert "not admitted by the front door" in text
    assert http(door.ports.http, "/v2/models/router/infer", "GET")[0] == 403  # wrong method
    before = classifier_counts(server)
    c = grpc_client(door)
    try:
        ids = grpcclient.InferInput("input_ids", [1, 8], "INT64")
        ids.set_data_from_numpy(np.ones((1, 8), dtype=np.int64))
        for call in (lambda: c.infer("classifier", [ids]), lambda: c.get_model_metadata("classifier"),
                     lambda: c.is_model_ready("classifier"), lambda: c.infer("classifier", [ids], model_version="1")):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == "StatusCode.PERMISSION_DENIED", info.value
            assert "only the router model" in info.value.message()
        assert c.is_model_ready("router") and c.get_model_metadata("router").name == "router"
    finally:
        c.close()
    assert classifier_counts(server) == before, "Triton ran the classifier for a client"
    c = grpc_client(door)
    try:
        for call in (lambda: c.get_model_repository_index(), lambda: c.get_model_config("router"),
                     lambda: c.get_inference_statistics("router"), lambda: c.unload_model("router"),
                     lambda: c.get_system_shared_memory_status()):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == "StatusCode.UNIMPLEMENTED", info.value
            assert "not admitted by the front door" in info.value.message()
    finally:
        c.close()
    assert c is not None and server.is_ready()


def test_one_client_over_quota_refused_while_another_keeps_its_rate(stack):
    _, door, _ = stack
    results: dict[str, list] = {"slow": [], "fast": []}

    def burst(client: str) -> None:
        for _ in range(20):
            results[client].append(http(door.ports.http, "/v2/models/router", client=client))

    threads = [threading.Thread(target=burst, args=(c,)) for c in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slow_ok = [s for s, _ in results["slow"] if s == 200]
    refused = [b for s, b in results["slow"] if s == 429]
    assert 3 <= len(slow_ok) <= 8 and len(slow_ok) + len(refused) == 20, results["slow"]
    assert "quota exceeded: client slow (x-client-id)" in refused[0] and "2 requests/s, burst 3" in refused[0]
    assert [s for s, _ in results["fast"]] == [200] * 20
    c = grpc_client(door)
    try:
        codes = []
        for _ in range(10):
            try:
                c.get_model_metadata("router", headers=grpc_headers("slow"))
                codes.append("OK")
            except InferenceServerException as exc:
                codes.append(exc.status())
                message = exc.message()
        assert "StatusCode.RESOURCE_EXHAUSTED" in codes, codes
        assert "quota exceeded: client slow" in message
        assert all(c2 in ("OK", "StatusCode.RESOURCE_EXHAUSTED") for c2 in codes)
        for _ in range(10):
            c.get_model_metadata("router", headers=grpc_headers("fast"))
    finally:
        c.close()


def test_no_response_lost_or_duplicated_under_load(stack):
    server, door, _ = stack
    texts = [f"review {i}: the room was {'clean' if i % 2 else 'dirty'} and the staff {'kind' if i % 3 else 'rude'}" for i in range(40)]
    expected = {}
    for i, t in enumerate(texts):
        expected[i] = json.loads(http(server.http_port, "/v2/models/router/infer", "POST", infer_body([t], f"x{i}"))[1])["outputs"]

    def one(n: int):
        i = n % len(texts)
        if n % 2:
            status, body = http(door.ports.http, "/v2/models/router/infer", "POST", infer_body([texts[i]], f"h{n}"), client="load")
            assert status == 200, body
            data = json.loads(body)
            return data["id"], data["outputs"] == expected[i]
        c = grpc_client(door)
        try:
            r = c.infer("router", text_inputs(grpcclient, [texts[i]]), request_id=f"g{n}", headers=grpc_headers("load"))
        finally:
            c.close()
        want = {o["name"]: np.array(o["data"]) for o in expected[i]}
        same = all(np.array_equal(r.as_numpy(k).reshape(-1).astype(v.dtype) if r.as_numpy(k).dtype != object
                                  else np.char.decode(r.as_numpy(k).reshape(-1).astype(bytes)), v) for k, v in want.items())
        return r.get_response().id, same

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(160)))
    ids = [a for a, _ in answers]
    assert sorted(ids) == sorted([f"h{n}" if n % 2 else f"g{n}" for n in range(160)]), "lost or duplicated responses"
    assert all(same for _, same in answers), "a response differs from Triton's own answer"


def raw_grpc(door: N.FrontDoor, method: str, payload: bytes, client: str | None = None):
    """One unary call of ``method`` with ``payload`` sent as it is (no protobuf in between):
    ``(status name, message, response bytes or None)``."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{door.ports.grpc}", options=[("grpc.enable_http_proxy", 0)]) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        try:
            return "OK", "", call(payload, metadata=[("x-client-id", client)] if client else None, timeout=30)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details(), None


BYPASS = b"\x0a\x06router" + b"\x8a\x80\x80\x80\x10" + b"\x0aclassifier"


def test_a_model_name_hidden_from_the_check_is_refused(stack):
    """The bypass (a second field 1 behind a 5-byte tag of value 2^32 + 10) and its family,
    through the real nginx in front of the real server: refused as malformed, and Triton runs
    and describes nothing but the router."""
    from tritonclient.grpc import service_pb2 as pb

    server, door, _ = stack
    before = classifier_counts(server)
    tensor = pb.ModelInferRequest(model_name="classifier", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64", shape=[1, 8])],
        raw_input_contents=[np.ones((1, 8), np.int64).tobytes()]).SerializeToString()
    hidden = [b"\x8a\x80\x80\x80\x10", b"\x8a\x80\x80\x80\x80\x80\x80\x80\x80\x00", b"\x8a\x00", b"\x0a"]
    for method, tail in [("ModelMetadata", b"\x0aclassifier"), ("ModelReady", b"\x0aclassifier"), ("ModelInfer", None)]:
        for tag in hidden:
            if tail is None:  # the whole classifier request behind the router's name
                payload = b"\x0a\x06router" + tensor.replace(b"\x0a\x0aclassifier", tag + b"\x0aclassifier", 1)
            else:
                payload = b"\x0a\x06router" + tag + tail
            status, message, answer = raw_grpc(door, method, payload)
            assert status == "INVALID_ARGUMENT" and answer is None, (method, tag, status, message)
            assert message.startswith("malformed request refused by the front door: "), message
    # The same reasons are named: a duplicate name, and a tag over 5 bytes.
    assert "occurs twice" in raw_grpc(door, "ModelMetadata", b"\x0a\x06router\x0a\x0aclassifier")[1]
    assert "a tag is over 5 bytes" in raw_grpc(door, "ModelMetadata", b"\x0a\x06router" + hidden[1] + b"\x0aclassifier")[1]
    # Without the hidden field the router's own calls are answered.
    status, _, answer = raw_grpc(door, "ModelMetadata", b"\x0a\x06router")
    assert status == "OK" and pb.ModelMetadataResponse.FromString(answer).name == "router"
    assert classifier_counts(server) == before, "Triton ran the classifier for a client"


def test_a_control_character_in_the_path_is_refused_at_the_door(stack):
    server, door, _ = stack
    before = router_counts(server)
    for path in ("/v2/models/router/infer%0a", "/v2/models/router/infer%0d", "/v2/models/router%09/infer", "/v2/models/router/ready%7f"):
        status, text = http(door.ports.http, path, "POST" if "infer" in path else "GET", infer_body(["fine"]))
        assert status == 400 and "control character" in text, (path, status, text)
    assert http(door.ports.http, "/v2/models/router/infer", "POST", infer_body(["fine"]))[0] == 200
    assert eventually(lambda: router_counts(server), before + 1, timeout=5) == before + 1


def _pss_bytes(root_pid: int) -> int:
    """Proportional set size of ``root_pid`` and its children (nginx's master and workers)."""
    from lab.soak.memory import pss_bytes
    from lab.soak.procs import children

    return sum(pss_bytes(pid) or 0 for pid in [root_pid] + [c.pid for c in children(root_pid)])


def _manifest_memory_limit() -> int:
    """The frontdoor container's memory limit in the base Deployment, in bytes."""
    import yaml

    from tests.helpers import ROOT

    for doc in yaml.safe_load_all((ROOT / "deploy/k8s/base/deployment.yaml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            door = next(c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "frontdoor")
            value = door["resources"]["limits"]["memory"]
            assert value.endswith("Mi"), value
            return int(value[:-2]) * 2**20
    raise AssertionError("no Deployment")


class HeldStreams:
    """One client's HTTP/2 connections to the front door's gRPC port, each stream sending up to
    ``size`` bytes of a gRPC body and never ending it (the ``h2`` protocol library over a socket)."""

    def __init__(self, port: int, method: str, client: str):
        self.port, self.method, self.client = port, method, client
        self.conns: list = []
        self.refused: set = set()

    def open(self, connections: int, streams: int, size: int) -> None:
        import socket

        import h2.config
        import h2.connection

        head = b"\0" + (size + 1).to_bytes(4, "big")  # one byte more than will ever be sent
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", self.port))
            sock.settimeout(30)
            h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            h2c.initiate_connection()
            sock.sendall(h2c.data_to_send())
            self._pump(sock, h2c)
            todo = {}
            for _ in range(streams):
                sid = h2c.get_next_available_stream_id()
                h2c.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", f"/inference.GRPCInferenceService/{self.method}"),
                                       (":authority", f"127.0.0.1:{self.port}"), ("content-type", "application/grpc"), ("te", "trailers"),
                                       ("x-client-id", self.client)])
                todo[sid] = head + b"\x0a\x06router\x3a" + b"x" * size
                todo[sid] = todo[sid][:size]
            self.conns.append((sock, h2c, todo))

    def send(self, seconds: float) -> None:
        """Send what flow control lets through, for ``seconds``."""
        import time as _time

        end = _time.monotonic() + seconds
        while _time.monotonic() < end:
            moved = False
            for sock, h2c, todo in self.conns:
                for sid in list(todo):
                    try:
                        window = min(h2c.local_flow_control_window(sid), h2c.max_outbound_frame_size, len(todo[sid]))
                    except Exception:  # the stream was closed by the door (a refusal)
                        del todo[sid]
                        continue
                    if window > 0:
                        h2c.send_data(sid, todo[sid][:window])
                        todo[sid] = todo[sid][window:]
                        moved = True
                sock.sendall(h2c.data_to_send())
                self._pump(sock, h2c)
            if not moved:
                _time.sleep(0.05)

    def _pump(self, sock, h2c) -> None:
        import select

        import h2.events

        if not select.select([sock], [], [], 0.05)[0]:
            return
        try:
            data = sock.recv(1 << 20)
        except OSError:
            return
        for event in h2c.receive_data(data):
            if isinstance(event, (h2.events.StreamReset, h2.events.StreamEnded)):
                self.refused.add((id(h2c), event.stream_id))
        sock.sendall(h2c.data_to_send())

    def close(self) -> None:
        for sock, _, _ in self.conns:
            sock.close()


def test_one_client_cannot_push_the_door_past_its_memory_limit(stack):
    """One client holds 64 ModelInfer streams of maximal bodies (two connections) and 64
    ModelReady streams of maximal bodies open at once: the door admits its in-flight limit,
    refuses the rest, keeps each body's excess in a file, and its memory stays under half the
    manifests' limit while a second client is served."""
    server, door, limits = stack
    limit = _manifest_memory_limit()
    baseline = _pss_bytes(door.proc.pid)
    infer = HeldStreams(door.ports.grpc, "ModelInfer", "attacker")
    ready = HeldStreams(door.ports.grpc, "ModelReady", "attacker")
    peak = baseline
    try:
        infer.open(connections=2, streams=32, size=limits.grpc - 64)
        ready.open(connections=2, streams=32, size=limits.grpc - 64)
        # within the door's body timeout: a stream whose body stops moving is closed after it
        for _ in range(6):
            infer.send(1.2)
            ready.send(0.2)
            peak = max(peak, _pss_bytes(door.proc.pid))
        spooled = sum(f.stat().st_size for f in (door.run_dir / "body").glob("*"))
        refused = len(infer.refused), len(ready.refused)
        # The second client is served while the first holds all of that.
        c = grpc_client(door)
        try:
            r = c.infer("router", text_inputs(grpcclient, ["great hotel, lovely staff"]), headers=grpc_headers("fast"))
            assert r.get_response().outputs
        finally:
            c.close()
        peak = max(peak, _pss_bytes(door.proc.pid))
        # the held bodies have stopped moving: the door drops them after its body timeout
        infer.send(F.BODY_TIMEOUT_S + 3)
        stalled = len(infer.refused)
    finally:
        infer.close()
        ready.close()
    print(f"front door PSS: baseline {baseline / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB with 128 streams held "
          f"(manifest limit {limit / 2**20:.0f} MiB); bodies spooled to files: {spooled / 2**20:.1f} MiB; streams refused: "
          f"{refused[0]} infer, {refused[1]} ready")
    per_client = QUOTAS.in_flight_per_client
    assert refused[0] == 64 - per_client, "the in-flight limit did not refuse the client's streams past it"
    assert refused[1] == 64, "a ModelReady body of megabytes was read"
    assert stalled == 64, "a body that stopped moving was held past the body timeout"
    assert 0.9 * per_client * limits.grpc < spooled <= per_client * limits.grpc, "the held bodies were not spooled to files"
    assert peak < limit / 2, f"nginx held {peak / 2**20:.1f} MiB, over half the manifests' {limit / 2**20:.0f} MiB"
    assert eventually(lambda: _pss_bytes(door.proc.pid) < limit / 4, True, timeout=10)


def test_the_routers_of_the_one_setting_are_admitted_and_nothing_else(stack):
    """A door rendered for two routers (one not named router) admits both over HTTP and gRPC
    and still refuses the classifier; the door for router alone refuses router_ab."""
    server, door, _ = stack
    door2 = server.door2
    for name in ROUTERS:
        status, body = http(door2.ports.http, f"/v2/models/{name}/infer", "POST", infer_body(["great hotel"]))
        assert status == 200, (name, body)
        c = grpc_client(door2)
        try:
            assert c.is_model_ready(name) and c.infer(name, text_inputs(grpcclient, ["great hotel"])).get_response().outputs
        finally:
            c.close()
    assert http(door2.ports.http, "/v2/models/classifier/ready")[0] == 404
    status, _, _ = raw_grpc(door2, "ModelReady", b"\x0a\x0aclassifier")
    assert status == "PERMISSION_DENIED"
    assert "only the router models router, router_ab" in raw_grpc(door2, "ModelReady", b"\x0a\x0aclassifier")[1]
    assert http(door.ports.http, "/v2/models/router_ab/ready")[0] == 404
    assert raw_grpc(door, "ModelReady", b"\x0a\x09router_ab")[0] == "PERMISSION_DENIED"


# ----------------------------------------------------------------------------------------
# The door's own resources under attack: CPU, memory, disk and connections per request and
# per source, each with the figure it must stay under.

def _worker_cpu_s(door: N.FrontDoor) -> float:
    """CPU seconds (user + system) of nginx's workers so far."""
    import os

    from lab.soak.procs import children

    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for c in children(door.proc.pid):
        try:
            fields = open(f"/proc/{c.pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _timed(call) -> float:
    import time

    start = time.monotonic()
    call()
    return time.monotonic() - start


#: A legit client's call while an attack runs may take at most this (seconds): the attacks
#: below once held every probe and router call for 26-60 s.
LEGIT_S = 1.0
MAP_ENTRY = b"\x22\x03\x0a\x01\x61"  # a ModelInferRequest.parameters entry: 5 bytes, 3 tags


def test_a_body_built_to_cost_the_check_most_is_refused_in_milliseconds(stack):
    """The parameter-map attack (another model's name, then 5-byte map entries) at 131 KB and
    at the gRPC body limit, two at a time: each refused with RESOURCE_EXHAUSTED naming the work
    limit, at most 0.25 s of a worker's CPU per request (the quadratic check spent 20 s at
    131 KB, 330 s at the limit), while readiness and the router answer a second client within
    LEGIT_S. Triton runs nothing for them."""
    server, door, limits = stack
    before = classifier_counts(server)
    bodies = [b"\x0a\x0aclassifier" + MAP_ENTRY * ((size - 17) // 5) for size in (131_000, limits.grpc, limits.grpc)]
    answers: list = []
    cpu0 = _worker_cpu_s(door)

    def attack():
        for payload in bodies:
            answers.append(raw_grpc(door, "ModelInfer", payload, client="attacker"))

    threads = [threading.Thread(target=attack) for _ in range(2)]
    for t in threads:
        t.start()
    slowest = 0.0
    c = grpc_client(door)
    try:
        while any(t.is_alive() for t in threads):
            slowest = max(slowest, _timed(lambda: http(door.ports.http, "/v2/models/router/ready")),
                          _timed(lambda: c.is_model_ready("router", headers=grpc_headers("fast"))))
        slowest = max(slowest, _timed(lambda: c.infer("router", text_inputs(grpcclient, ["great hotel"]), headers=grpc_headers("fast"))))
    finally:
        c.close()
        for t in threads:
            t.join()
    per_request = (_worker_cpu_s(door) - cpu0) / len(answers)
    print(f"map attack: {len(answers)} requests, {per_request * 1000:.0f} ms of worker CPU each (reading the body included), "
          f"slowest legit call {slowest * 1000:.0f} ms")
    assert [a[0] for a in answers] == ["RESOURCE_EXHAUSTED"] * 6, answers
    assert f"over {F.CHECK_BUDGET} protobuf fields" in answers[0][1], answers[0]
    assert per_request < 0.25, f"{per_request:.2f} s of a worker's CPU per request"
    assert slowest < LEGIT_S, f"a legit call took {slowest:.1f} s during the attack"
    assert classifier_counts(server) == before


def _send_all(socks, data: bytes) -> None:
    for s in socks:
        try:
            s.sendall(data)
        except OSError:
            pass


def test_endpoints_that_need_no_body_refuse_one_without_holding_it(stack):
    """300 connections each send a health, readiness, metadata or metrics GET announcing a
    7.6 MB body and start sending it: each is refused with 413 before the body is read, the
    door spools nothing to disk and its PSS grows by less than 32 MiB (they once held
    2 GiB in files and 832 MiB of memory); probes of a second client answer within LEGIT_S."""
    import socket

    server, door, _ = stack
    paths = ["/v2/health/live", "/v2/health/ready", "/v2/models/router/ready", "/v2/models/router/versions/1/ready",
             "/v2/models/router", "/v2"]
    baseline = _pss_bytes(door.proc.pid)
    socks, answers = [], []
    try:
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", door.ports.http))
            s.settimeout(10)
            s.sendall(f"GET {paths[i % len(paths)]} HTTP/1.1\r\nHost: x\r\nContent-Length: 7600000\r\n\r\n".encode() + b"x" * 65536)
            socks.append(s)
        _send_all(socks, b"x" * 65536)
        slowest = max(_timed(lambda p=p: http(door.ports.http, p)) for p in paths[:3])
        metrics = socket.create_connection(("127.0.0.1", door.ports.metrics))
        metrics.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        socks.append(metrics)
        for s in socks:
            answers.append(s.recv(4096).split(b"\r\n", 1)[0])
        spooled = sum(f.stat().st_size for f in (door.run_dir / "body").glob("*")) if (door.run_dir / "body").exists() else 0
        peak = _pss_bytes(door.proc.pid)
    finally:
        for s in socks:
            s.close()
    print(f"bodies on bodiless endpoints: PSS {baseline / 2**20:.1f} -> {peak / 2**20:.1f} MiB, spooled {spooled} bytes, "
          f"slowest probe {slowest * 1000:.0f} ms")
    assert answers == [b"HTTP/1.1 413 Request Entity Too Large"] * 301, set(answers)
    assert spooled == 0
    assert peak - baseline < 32 * 2**20
    assert slowest < LEGIT_S
    status, text = http(door.ports.http, "/v2/health/live", "GET", b"{}")
    assert status == 413 and "this endpoint takes no body" in text
    assert http(door.ports.http, "/v2/health/live")[0] == 200


def test_connections_that_never_finish_a_request_are_closed(stack):
    """Six sources open as many connections as the door under test (one worker) holds, less
    room for another client's calls (each connection takes CONNECTIONS_PER_CLIENT of the
    worker's connections; more than that exhausts the worker, which the front-door guide
    says six addresses can do), each source under the per-address cap, and send 50 bytes of
    a request on each (such connections once used all of nginx's worker connections for 60 s
    each): a second client's probe and router call answer within LEGIT_S meanwhile, and the
    door closes every one of them within its header timeout (+2 s)."""
    import socket
    import time

    server, door, _ = stack
    sources = 6
    per_source = F.WORKER_CONNECTIONS // F.CONNECTIONS_PER_CLIENT // sources - 8  # 8 a source left for others
    n = sources * per_source
    assert per_source < QUOTAS.connections_per_address
    socks = []
    baseline = _pss_bytes(door.proc.pid)
    try:
        start = time.monotonic()
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", door.ports.http), source_address=(f"127.0.1.{i // per_source + 1}", 0))
            s.sendall(b"POST /v2/models/router/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: 01234")
            socks.append(s)
        per_connection = (_pss_bytes(door.proc.pid) - baseline) / n
        slowest = max(_timed(lambda: http(door.ports.http, "/v2/models/router/ready")),
                      _timed(lambda: http(door.ports.http, "/v2/models/router/infer", "POST", infer_body(["fine"]))))
        closed = 0
        deadline = start + F.HEADER_TIMEOUT_S + 2
        for s in socks:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                closed += s.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                pass
        held = time.monotonic() - start
    finally:
        for s in socks:
            s.close()
    print(f"{n} unfinished requests: slowest legit call {slowest * 1000:.0f} ms, {closed} closed by the door within {held:.1f} s, "
          f"{per_connection / 1024:.1f} KiB of nginx's PSS each")
    assert slowest < LEGIT_S
    assert closed == n
    # every client connection the door's workers may hold (each taking CONNECTIONS_PER_CLIENT of
    # a worker's connections, all counted in per_connection) fits in the manifests' memory limit
    import inspect

    workers = inspect.signature(F.render).parameters["workers"].default
    clients = workers * F.WORKER_CONNECTIONS // F.CONNECTIONS_PER_CLIENT
    assert baseline + per_connection * clients < _manifest_memory_limit() / 2, per_connection


def _closed_within(socks, seconds: float) -> int:
    """How many of ``socks`` the peer closes (EOF or reset) within ``seconds``."""
    import select
    import time

    closed, open_ = 0, list(socks)
    deadline = time.monotonic() + seconds
    while open_ and time.monotonic() < deadline:
        ready, _, _ = select.select(open_, [], [], max(0.0, deadline - time.monotonic()))
        for s in ready:
            try:
                gone = s.recv(1) == b""
            except OSError:
                gone = True
            if gone:
                closed += 1
                open_.remove(s)
    return closed


def test_one_source_holds_at_most_its_connection_cap(stack):
    """One source address opens the per-address cap + 200 connections to the HTTP port (and 20
    more to gRPC and metrics), each sending 50 bytes of a request and nothing more: the door
    holds exactly the cap (HTTP's limit_conn would count none of them: no header is complete);
    every connection over it is closed within 1 s; meanwhile a second address's probe, router
    call over HTTP and over gRPC (HTTP/2 through the stream layer) answer within LEGIT_S. When
    the source's connections end, it is served again."""
    import socket

    server, door, _ = stack
    cap = F.Quotas("x", F.Quota(1, 1)).connections_per_address
    assert cap == F.load_quotas().connections_per_address  # the shipped setting is the one tested
    attacker = "127.0.2.1"
    socks = []
    try:
        for port in [door.ports.http] * (cap + 200) + [door.ports.grpc, door.ports.metrics] * 10:
            s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(attacker, 0))
            try:
                s.sendall(b"POST /v2/models/router/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: 01234")
            except OSError:
                pass  # closed by the cap already
            socks.append(s)
        refused = _closed_within(socks, 1.0)
        slowest = max(_timed(lambda: http(door.ports.http, "/v2/models/router/ready")),
                      _timed(lambda: http(door.ports.http, "/v2/models/router/infer", "POST", infer_body(["fine"]))),
                      _timed(lambda: grpc_client(door).is_model_ready("router")))
        assert grpc_client(door).is_model_ready("router")
    finally:
        for s in socks:
            s.close()
    print(f"{len(socks)} unfinished connections from one address: {len(socks) - refused} held (cap {cap}), "
          f"slowest legit call {slowest * 1000:.0f} ms")
    assert len(socks) - refused == cap
    assert slowest < LEGIT_S

    def live_from_attacker() -> bytes:
        with socket.create_connection(("127.0.0.1", door.ports.http), timeout=5, source_address=(attacker, 0)) as s:
            try:
                s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return s.recv(4096)[:12]
            except OSError:
                return b""

    assert eventually(live_from_attacker, b"HTTP/1.1 200", timeout=5) == b"HTTP/1.1 200"


def test_an_encoded_body_is_refused_before_triton_inflates_it(stack):
    """A 100 KB gzip body that inflates to 100 MiB (Triton 2.51 inflates without a bound): 415
    at the door, the router's statistics do not move and Triton's RSS grows by under 16 MiB."""
    import gzip

    from lab.soak.procs import rss_bytes

    server, door, _ = stack
    bomb = gzip.compress(b'{"inputs":[{"name":"TEXT","shape":[1,1],"datatype":"BYTES","data":["' + b"a" * (100 << 20) + b'"]}]}', 9)
    assert len(bomb) < 200_000
    before, rss = router_counts(server), rss_bytes(server.pid)
    for _ in range(3):
        request = urllib.request.Request(f"http://127.0.0.1:{door.ports.http}/v2/models/router/infer", data=bomb, method="POST",
                                         headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30)
        assert info.value.code == 415 and "Content-Encoding is not admitted" in info.value.read().decode()
    grown = rss_bytes(server.pid) - rss
    print(f"gzip bomb: Triton RSS grew {grown / 2**20:.1f} MiB")
    assert grown < 16 * 2**20
    assert router_counts(server) == before
    # the gRPC side: a compressed message (grpc-encoding) is refused for every method
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{door.ports.grpc}", options=[("grpc.enable_http_proxy", 0)],
                               compression=grpc.Compression.Gzip) as channel:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED and "grpc-encoding" in err.value.details()


def test_requests_nginx_cannot_read_get_their_reason(stack):
    """A NUL in the path answers 400 with the door's message (it was 500); a duplicate
    ``:path`` on the gRPC port answers INVALID_ARGUMENT with a reason (it was empty)."""
    import socket

    import h2.config
    import h2.connection
    import h2.events

    server, door, _ = stack
    for path in ("/v2/models/router/infer%00", "/v2/models/router%00/ready", "/v2/health/live%00"):
        status, text = http(door.ports.http, path, "POST" if "infer" in path else "GET", infer_body(["x"]) if "infer" in path else None)
        assert status == 400 and "front door" in text, (path, status, text)
    sock = socket.create_connection(("127.0.0.1", door.ports.grpc))
    sock.settimeout(10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, validate_outbound_headers=False,
                                                                normalize_outbound_headers=False))
    conn.initiate_connection()
    method = "/inference.GRPCInferenceService/ModelReady"
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", method), (":path", method),
                          (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    conn.send_data(1, b"\0\0\0\0\x08\x0a\x06router", end_stream=True)
    sock.sendall(conn.data_to_send())
    headers: dict = {}
    try:
        while "grpc-status" not in headers:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    headers.update({k.decode(): v.decode() for k, v in event.headers})
    finally:
        sock.close()
    assert headers.get("grpc-status") == "3", headers
    assert headers["grpc-message"].startswith("malformed request refused by the front door: ") and \
        headers["grpc-message"].rstrip() != "malformed request refused by the front door:", headers


def test_describe_policy_is_refused_at_the_door_by_default(stack):
    """``describe_policy`` (the router's policy document: a small request, a 242 KB answer that
    discloses the routing) is refused at the door over HTTP (however the JSON spells the name)
    and gRPC; the router never sees it; Triton itself still answers it."""
    server, door, _ = stack
    before = router_counts(server)
    for name in ("describe_policy", "describe\\u005fpolicy", "describe_policy\\u0000x"):
        body = infer_body(["great hotel"])[:-1] + f', "parameters": {{"{name}": true}}}}'.encode()
        status, text = http(door.ports.http, "/v2/models/router/infer", "POST", body)
        assert status == 403 and "describe_policy is not admitted by the front door" in text, (status, text)
    c = grpc_client(door)
    try:
        with pytest.raises(InferenceServerException) as info:
            c.infer("router", text_inputs(grpcclient, ["great hotel"]), parameters={"describe_policy": True})
        assert info.value.status() == "StatusCode.PERMISSION_DENIED", info.value
        assert "describe_policy is not admitted by the front door" in info.value.message()
        assert c.infer("router", text_inputs(grpcclient, ["great hotel"])).get_response().outputs
    finally:
        c.close()
    direct = http(server.http_port, "/v2/models/router/infer", "POST",
                  infer_body(["great hotel"])[:-1] + b', "parameters": {"describe_policy": true}}')
    assert direct[0] == 200 and "POLICY" in direct[1]
    assert eventually(lambda: router_counts(server), before + 2, timeout=5) == before + 2  # the served call and the direct one


def test_a_refusal_for_requests_in_flight_names_the_limit_reached(stack, test_repository):
    """Per client 2, per source address 3, in all 4: the refusal names the client's limit, the
    address's or the door's, whichever was reached (the message once blamed the client for the
    door's total); twice, so the counts behind the messages come back when requests end."""
    import socket
    import time

    server, _, limits = stack
    names = ("a", "b", "c", "d", "e")
    quotas = F.Quotas("x-client-id", F.Quota(10000, 10000), {n: F.Quota(10000, 10000) for n in names},
                      in_flight_per_client=2, in_flight_per_address=3, in_flight_total=4)
    ports = F.Ports("127.0.0.1", *find_free_ports(3), server.http_port, server.grpc_port, server.metrics_port)
    door = N.FrontDoor(F.render(quotas, limits, ports, workers=1), ports).start()

    def request(source: str, client: str, hold: bool):
        s = socket.create_connection(("127.0.0.1", ports.http), timeout=10, source_address=(source, 0))
        size = 1000 if hold else 2
        s.sendall(f"POST /v2/models/router/infer HTTP/1.1\r\nHost: x\r\nx-client-id: {client}\r\nContent-Length: {size}\r\n\r\n".encode()
                  + (b"{" if hold else b"{}"))
        if hold:
            return s
        answer = s.recv(65536).decode()
        s.close()
        return answer

    try:
        for _ in range(2):
            held = [request("127.0.0.1", "a", True), request("127.0.0.1", "a", True), request("127.0.0.1", "b", True)]
            time.sleep(0.3)
            address = request("127.0.0.1", "c", False)
            held.append(request("127.0.0.2", "d", True))
            time.sleep(0.3)
            total = request("127.0.0.2", "e", False)
            client = request("127.0.0.2", "a", False)
            for s in held:
                s.close()
            assert "429" in address.split("\r\n")[0] and \
                "source address 127.0.0.1 is over the front door's limit of 3 requests in flight per address" in address, address
            assert "all of the front door's 4 requests in flight are in use" in total, total
            assert "client a (x-client-id) is over the front door's limit of 2 requests in flight per client" in client, client
            time.sleep(0.5)  # the held requests end
    finally:
        door.stop()


def test_the_door_logged_no_lua_error_and_no_warning_per_request(stack):
    """After every test above on this door: its Lua never failed (a failure admits nothing, but
    would be a bug) and nginx logged no warning for each request (a probe every few seconds
    would fill the log)."""
    _, door, _ = stack
    log = door.log_path.read_text()
    assert "front door check failed" not in log and "runtime error" not in log and "lua entry thread aborted" not in log, log[-3000:]
    assert "uninitialized" not in log, log[-3000:]


def test_describe_policy_in_the_json_part_of_a_binary_request_is_refused(stack):
    """With Triton's binary data extension only the first Inference-Header-Content-Length bytes
    are JSON: the door reads exactly those, so the name is found there and a text in the binary
    data is not taken for it; when the header is not one plain number the door reads all of the
    body (never less than Triton reads as JSON) and may refuse more."""
    server, door, _ = stack
    text = b'"describe_policy" is a parameter'  # binary data that reads as the name if taken for JSON
    raw = len(text).to_bytes(4, "little") + text
    for params, want in (({"describe_policy": True}, 403), ({}, 200)):
        header = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}},
                                        {"name": "THRESHOLD", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}],
                             "parameters": params}).encode()
        for length in (str(len(header)), f"{len(header)}x", f"+{len(header)}"):
            request = urllib.request.Request(f"http://127.0.0.1:{door.ports.http}/v2/models/router/infer", data=header + raw,
                                             method="POST", headers={"Inference-Header-Content-Length": length})
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30) as resp:
                    status = resp.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            if length.isdigit():
                assert status == want, (params, length, status)
            else:  # all of the body read (Triton reads "201x" as 201): the text is taken for the name too
                assert status == 403, (params, length, status)
