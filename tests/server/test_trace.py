"""Trace context in a real tritonserver: the spans of the tokenizer and classifier calls a
router makes over BLS point to the router's request as their parent.

The router here is ``router_bls`` (tests/helpers.py ``BLS_VARIANT``: the shipped policy
without ``inline``, so the tokenizer is a BLS call too). Requests go one at a time, so each
BLS call carries the trace of exactly one request.

- ``triton`` mode (``--trace-config triton,file=...``, level TIMESTAMPS, rate 1,
  log-frequency 1): Triton writes each finished trace group to ``<file>.<index>``; a child
  trace has ``"parent_id"``: the router's trace ``"id"`` (server r24.10 ``tracer.cc``).
- ``opentelemetry`` mode (``opentelemetry,url=...``) against an OTLP/HTTP receiver run by
  the test: Triton 2.51's exporter (opentelemetry-cpp 1.13) posts OTLP/JSON
  (``Content-Type: application/json``, ids as hex, as the OTLP spec says), decoded here into
  the official ``ExportTraceServiceRequest`` of ``opentelemetry-proto``; a child model span's
  ``parent_span_id`` is the router's model span, all spans share one trace id.
- the image's configuration: deploy/entrypoint.sh with the cpu overlay's environment and
  ``TRACE_MODE=opentelemetry`` exports the shipped router's spans to ``OTEL_ENDPOINT``.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import glob
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

from orchestrator.tooling.server import ServerError, TritonServer, trace_config_args
from tests.helpers import BLS_VARIANT

pytestmark = pytest.mark.server
MODELS = ["tokenizer", "classifier_fast", "classifier", BLS_VARIANT]
TEXT = "A gorgeous, witty and moving film."


def send(server: TritonServer, request_id: str, threshold: float = 0.5) -> Dict[str, np.ndarray]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[TEXT.encode()]], dtype=np.object_))
        thr = httpclient.InferInput("THRESHOLD", [1, 1], "FP32")
        thr.set_data_from_numpy(np.full((1, 1), threshold, np.float32))
        result = client.infer(BLS_VARIANT, [text, thr], request_id=request_id)
        return {n: result.as_numpy(n) for n in ("PROBABILITIES", "ROUTE")}
    finally:
        client.close()


def two_requests(server: TritonServer) -> List[str]:
    """``fast`` (answered by the first stage) then ``both`` (its threshold set to the first
    answer's probability, inside the cascade's margin: it escalates); the routes."""
    first = send(server, "fast")
    second = send(server, "both", threshold=float(first["PROBABILITIES"][0, 0]))
    return [r.reshape(-1)[0].decode() for r in (first["ROUTE"], second["ROUTE"])]


# ----------------------------------------------------------------------------- triton mode


def triton_traces(trace_file: Path, want: int, timeout: float = 30.0) -> List[Dict[str, Any]]:
    """The records of the first ``want`` index files (one per trace group at log-frequency 1)."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(glob.glob(f"{trace_file}.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
        if len(files) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(files) >= want, f"Triton wrote {len(files)} trace files, expected {want}"
    records: List[Dict[str, Any]] = []
    for f in files[:want]:
        records += json.loads(Path(f).read_text())
    return records


def test_triton_mode_child_traces_point_to_the_routers_request(test_repository, tmp_path):
    trace_file = tmp_path / "trace.json"
    args = trace_config_args("triton", rate=1, level="TIMESTAMPS", file=trace_file, log_frequency=1)
    with TritonServer(test_repository, models=MODELS, extra_args=args) as server:
        routes = two_requests(server)
        assert routes == ["classifier_fast", "classifier"]
        records = triton_traces(trace_file, 2)
        # then concurrent requests, which the dynamic batcher may merge into one execute
        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: send(server, f"c{i}"), range(8)))
        concurrent = triton_traces(trace_file, 10)
    check_batched(concurrent)
    heads = {r["id"]: r for r in records if "model_name" in r}
    stamps: Dict[int, Dict[str, int]] = {}
    for r in records:
        for s in r.get("timestamps", []):
            stamps.setdefault(r["id"], {})[s["name"]] = s["ns"]
    routers = {h["request_id"]: h for h in heads.values() if h["model_name"] == BLS_VARIANT}
    assert set(routers) == {"fast", "both"} and all("parent_id" not in h for h in routers.values())
    calls = {rid: sorted(h["model_name"] for h in heads.values() if h.get("parent_id") == router["id"])
             for rid, router in routers.items()}
    assert calls == {"fast": ["classifier_fast", "tokenizer"], "both": ["classifier", "classifier_fast", "tokenizer"]}
    # no other trace: every child belongs to one of the two routed requests
    assert len(heads) == 2 + 5
    for router in routers.values():
        # (not COMPUTE_START: the Python backend reports the router's compute timestamps
        # with the batch's statistics, taken after the stub began executing)
        start, end = stamps[router["id"]]["REQUEST_START"], stamps[router["id"]]["REQUEST_END"]
        for child in (h for h in heads.values() if h.get("parent_id") == router["id"]):
            assert child["request_id"] == router["request_id"]  # the router passes its ids on
            # each call started while the router's request ran; its REQUEST_END is the BLS
            # request's release, which the server's core calls on its own thread after the
            # response callback that wakes the router (python_backend's InferRequestComplete
            # beside InferResponseComplete), so it can land after the router's own end
            assert start <= stamps[child["id"]]["REQUEST_START"] <= end
            assert stamps[child["id"]]["REQUEST_START"] <= stamps[child["id"]]["REQUEST_END"]


def check_batched(records: List[Dict[str, Any]]) -> None:
    """A call serving texts of several requests is traced under one of them
    (request.call_trace; in triton mode no trace has a context: the first in row order, the
    first of the call's comma-separated request ids); no call hangs under a request it did
    not serve. Seen here: ``"request_id":"c2,c4,c5,c6,c0","parent_id":10`` with trace 10
    the router's request ``c2``."""
    heads = {r["id"]: r for r in records if "model_name" in r}
    routers = {i: h for i, h in heads.items() if h["model_name"] == BLS_VARIANT}
    assert {h["request_id"] for h in routers.values()} >= {f"c{i}" for i in range(8)}
    children = [h for h in heads.values() if "parent_id" in h]
    assert children and all(h["parent_id"] in routers for h in children)
    for child in children:
        assert routers[child["parent_id"]]["request_id"] == child["request_id"].split(",")[0], child


# ----------------------------------------------------------------------------- opentelemetry mode


def _hex_ids_to_base64(node: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping reads bytes as base64."""
    if isinstance(node, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId") and v else _hex_ids_to_base64(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: ``POST /v1/traces`` with OTLP/protobuf or
    OTLP/JSON, decoded into ``ExportTraceServiceRequest``; answers 200 with an empty
    ``ExportTraceServiceResponse``."""

    def __init__(self) -> None:
        from google.protobuf import json_format
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.exports: List[Any] = []
        self.errors: List[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                kind = self.headers.get("Content-Type", "")
                export = ExportTraceServiceRequest()
                try:
                    if self.path != "/v1/traces":
                        raise ValueError(f"POST to {self.path}, not /v1/traces")
                    if kind.startswith("application/json"):
                        json_format.ParseDict(_hex_ids_to_base64(json.loads(body)), export)
                    else:
                        export.ParseFromString(body)
                except Exception as exc:  # recorded: the test fails on it
                    receiver.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                    self.send_response(400)
                    self.end_headers()
                    return
                receiver.exports.append(export)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", kind or "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> Iterator[Tuple[Any, Dict[str, Any]]]:
        for export in self.exports:
            for rs in export.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                        yield span, attrs


@pytest.fixture
def receiver():
    pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto (pyproject's test extra) is not installed")
    with Receiver() as r:
        yield r


def test_opentelemetry_mode_child_spans_have_the_routers_span_as_parent(test_repository, receiver):
    args = trace_config_args("opentelemetry", rate=1, level="TIMESTAMPS", url=receiver.url,
                             resource={"service.name": "orchestrator-test"}, bsp_schedule_delay_ms=200)
    try:
        server = TritonServer(test_repository, models=MODELS, extra_args=args).start()
    except ServerError as exc:
        if "opentelemetry" in str(exc).lower():
            pytest.skip(f"this tritonserver has no OpenTelemetry trace mode: {exc}")
        raise
    try:
        routes = two_requests(server)
        assert routes == ["classifier_fast", "classifier"]
        deadline = time.monotonic() + 30
        while sum(1 for _ in receiver.spans()) < 2 * 3 + 5 * 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        server.stop()
    assert receiver.errors == []
    spans = list(receiver.spans())
    resources = {a.key: a.value.string_value for e in receiver.exports for rs in e.resource_spans for a in rs.resource.attributes}
    assert resources["service.name"] == "orchestrator-test"
    routers = {attrs["triton.request_id"]: (span, attrs) for span, attrs in spans if span.name == BLS_VARIANT}
    assert set(routers) == {"fast", "both"}
    by_id = {span.span_id: span for span, _ in spans}
    for rid, (router, attrs) in routers.items():
        assert attrs["triton.trace_parent_id"] == 0
        # the router's model span hangs off the request's top-level span (InferRequest)
        assert by_id[router.parent_span_id].name == "InferRequest" and not by_id[router.parent_span_id].parent_span_id
        children = [(span, a) for span, a in spans if span.parent_span_id == router.span_id and span.name != "compute"]
        names = sorted(span.name for span, _ in children)
        assert names == (["classifier_fast", "tokenizer"] if rid == "fast" else ["classifier", "classifier_fast", "tokenizer"])
        for span, a in children:
            assert span.trace_id == router.trace_id  # one trace per routed request
            assert a["triton.trace_parent_id"] == attrs["triton.trace_id"] and a["triton.request_id"] == rid
            # each call's own compute span is its child
            assert any(c.name == "compute" and c.parent_span_id == span.span_id for c, _ in spans)
    assert routers["fast"][0].trace_id != routers["both"][0].trace_id


# ----------------------------------------------------------------------------- the image's configuration


def test_the_entrypoints_opentelemetry_config_exports_the_shipped_routers_spans(test_repository, receiver, tmp_path):
    """deploy/entrypoint.sh with the cpu overlay's environment and TRACE_MODE=opentelemetry,
    OTEL_ENDPOINT at the receiver, TRACE_RATE=1: the shipped router (tokenizer inline) and
    its classifier call arrive as one trace, the call a child of the router's span."""
    import subprocess

    from orchestrator.tooling.server import (
        find_embedded_server,
        find_free_ports,
        prepare_backend_directory,
        prepare_stub_environment,
        server_environment,
    )
    from tests.helpers import ROOT, call
    from tests.server.test_deploy_image import get, overlay_env

    env_vars = overlay_env("k8s/overlays/cpu")
    assert env_vars["TRACE_MODE"] == "off"  # shipped off: switched on here as docs/reference/metrics.md says
    embedded = find_embedded_server()
    http, grpc, metrics = find_free_ports(3)
    env = server_environment(embedded, {
        **env_vars, "MODEL_REPOSITORY": str(test_repository), "TRITONSERVER": str(embedded.server),
        "BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": str(http), "GRPC_PORT": str(grpc), "METRICS_PORT": str(metrics),
        "TRITON_ADMIN_UNRESTRICTED": "1",
        "TRACE_MODE": "opentelemetry", "TRACE_RATE": "1", "OTEL_ENDPOINT": receiver.url,
    }, stub_env=prepare_stub_environment())
    log = tmp_path / "tritonserver.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "deploy" / "entrypoint.sh"), f"--backend-directory={prepare_backend_directory(embedded=embedded)}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while get(f"http://127.0.0.1:{http}/v2/models/router/ready") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the entrypoint's server did not get ready (status {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

        class At:
            http_url = f"127.0.0.1:{http}"

        assert call(At, "router", [TEXT])["ROUTE"].reshape(-1)[0] == b"classifier_fast"
        deadline = time.monotonic() + 30  # the batch span processor exports every 5 s
        while not any(s.name == "classifier_fast" for s, _ in receiver.spans()) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert "--trace-config=mode=opentelemetry" in log.read_text()
    assert receiver.errors == []
    spans = {s.name: s for s, _ in receiver.spans()}
    assert {"InferRequest", "router", "classifier_fast"} <= set(spans)
    router, child = spans["router"], spans["classifier_fast"]
    assert child.parent_span_id == router.span_id and child.trace_id == router.trace_id
    assert "tokenizer" not in spans  # the shipped policy tokenizes in the router's process


def test_opentelemetry_mode_a_batched_call_follows_a_sampled_request(test_repository, receiver):
    """rate=2: every other request is sampled. A sampled request's ``trace().get_context()``
    holds its traceparent (Triton sets it at REQUEST_START, before ``execute``), so a call
    that merges it with an unsampled request is traced under the sampled one
    (request.call_trace): every sampled request's texts went through a tokenizer call that
    has a span, its request id among the call's. Under "the first request's trace" a sampled
    request batched behind an unsampled one has none: with that rule this failed in 1 of 2
    runs here (it needs the batcher to put an unsampled request first; the deterministic
    check is tests/mock/test_trace_mock.py). Seen with the rule:
    ``r2-5,r2-6,r2-4,...`` traced under ``r2-6``."""
    args = trace_config_args("opentelemetry", rate=2, level="TIMESTAMPS", url=receiver.url, bsp_schedule_delay_ms=200)
    with TritonServer(test_repository, models=MODELS, extra_args=args) as server:
        for round_ in range(3):
            with cf.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda rid: send(server, rid), [f"r{round_}-{i}" for i in range(8)]))
        time.sleep(2)  # the last export (every 200 ms)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            spans = list(receiver.spans())
            sampled = {a["triton.request_id"] for s, a in spans if s.name == BLS_VARIANT}
            served = {rid for s, a in spans if s.name == "tokenizer" for rid in a["triton.request_id"].split(",")}
            if sampled and sampled <= served:
                break
            time.sleep(0.5)
    assert receiver.errors == []
    assert sampled and sampled <= served, (sampled, served)
    routers = {s.span_id: a["triton.request_id"] for s, a in spans if s.name == BLS_VARIANT}
    for span, attrs in spans:
        if span.name == "tokenizer":  # under a sampled request it served
            assert routers[span.parent_span_id] in attrs["triton.request_id"].split(",")
    merged = [(a["triton.request_id"], routers[s.parent_span_id]) for s, a in spans if s.name == "tokenizer" and "," in a["triton.request_id"]]
    print(f"tokenizer calls serving several requests (ids, traced under): {merged}")
