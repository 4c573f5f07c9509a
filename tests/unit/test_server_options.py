"""ServerOptions and RepositoryControl: the router reads the hosting tritonserver's command
line so it never sends a model-control request that must fail (a failed pb_utils.load_model
can crash Triton 2.51; tests/server/test_policy_server.py has the real-server checks) and
sends its loads through the server's repository API (gRPC, else HTTP, else pb_utils)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from orchestrator.runtime import control as control_module
from orchestrator.runtime.control import ControlError, RepositoryControl, ServerOptions
from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.nodes.model import OnDemand
from orchestrator.runtime.ondemand import ModelManager


class FakePb:
    """Just the model-control part of pb_utils, recording every request."""

    def __init__(self, ready=()):
        self.ready, self.requests = set(ready), []

    def is_model_ready(self, name):
        return name in self.ready

    def load_model(self, model_name):
        self.requests.append(("load", model_name))
        self.ready.add(model_name)

    def unload_model(self, model_name):
        self.requests.append(("unload", model_name))
        self.ready.discard(model_name)


class Log:
    def __init__(self):
        self.lines = []

    def log_info(self, m):
        self.lines.append(m)

    log_warn = log_error = log_verbose = log_info


def manager(pb, server, retry=30.0):
    log = Log()
    m = ModelManager(pb, {"spare": OnDemand(idle_timeout_s=60, retry_after_s=retry)}, Metrics(pb, "r"), log, server=server)
    return m, log


def test_parse_reads_mode_and_repositories_in_both_flag_forms(tmp_path):
    argv = ["/opt/tritonserver/bin/tritonserver", "--model-repository=models", "--model-store", "/abs/other",
            "--model-control-mode", "explicit", "--http-port=0"]
    options = ServerOptions.parse(argv, tmp_path)
    assert options.mode == "explicit"
    assert options.repositories == ((tmp_path / "models").resolve(), Path("/abs/other"))


def test_parse_defaults_to_mode_none_and_the_last_mode_wins(tmp_path):
    assert ServerOptions.parse(["tritonserver", "--model-repository=/m"], tmp_path).mode == "none"
    argv = ["tritonserver", "--model-control-mode=explicit", "--model-repository=/m", "--model-control-mode=POLL"]
    assert ServerOptions.parse(argv, tmp_path).mode == "poll"


def test_a_remote_repository_makes_the_repositories_unknown(tmp_path):
    options = ServerOptions.parse(["tritonserver", "--model-repository=/m", "--model-repository=s3://bucket/models"], tmp_path)
    assert options.repositories is None and options.missing("anything") is None


def test_missing_names_the_repositories_searched(tmp_path):
    (tmp_path / "present").mkdir()
    options = ServerOptions(mode="explicit", repositories=(tmp_path,))
    assert options.missing("present") is None
    assert options.missing("absent") == f"model 'absent' is in no model repository ({tmp_path})"


def test_of_parent_is_unknown_outside_tritonserver():
    assert ServerOptions.of_parent() == ServerOptions()  # pytest's parent is not tritonserver


def test_of_parent_reads_a_parent_named_tritonserver(tmp_path):
    """A child of a process named ``tritonserver`` (a copy of this Python) reads its flags."""
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("needs Linux /proc, which Triton's own platform has")
    server = tmp_path / "tritonserver"
    os.symlink(sys.executable, server)
    child = "from orchestrator.runtime.control import ServerOptions; print(ServerOptions.of_parent())"
    parent = textwrap.dedent(f"""
        import subprocess, sys
        sys.exit(subprocess.run([{sys.executable!r}, "-c", {child!r}]).returncode)
    """)
    # argv[0] of the parent is the symlink's path, as for a real tritonserver binary
    out = subprocess.run([str(server), "-c", parent, "--model-repository=repo", "--model-control-mode=explicit"],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.returncode == 0, out.stderr
    expected = ServerOptions("explicit", ((tmp_path / "repo").resolve(),), ("127.0.0.1", 8000), None, ("127.0.0.1", 8001))
    assert out.stdout.strip() == str(expected)


def test_under_mode_none_no_load_request_is_ever_sent():
    pb = FakePb()
    m, log = manager(pb, ServerOptions(mode="none", repositories=None))
    assert not m.enabled and m.reaper is None
    assert any("--model-control-mode=none" in line and "always loaded" in line for line in log.lines)
    import asyncio

    asyncio.run(m.acquire("spare"))  # treated as loaded: the BLS call itself will say if it is not
    m.release("spare")
    assert pb.requests == []


def test_a_model_in_no_repository_fails_without_a_load_request(tmp_path):
    pb = FakePb()
    m, _ = manager(pb, ServerOptions(mode="explicit", repositories=(tmp_path,)), retry=0.0)
    for _ in range(3):  # retried at once (retry_after_s 0), never sent
        with pytest.raises(DownstreamError, match=r"model 'spare' failed to load: model 'spare' is in no model repository"):
            m._load_blocking("spare")
    assert pb.requests == []
    (tmp_path / "spare").mkdir()  # once it is there, the load is sent
    m._load_blocking("spare")
    assert pb.requests == [("load", "spare")]
    m.close()


def test_with_unknown_options_the_load_is_sent_as_before():
    pb = FakePb()
    m, _ = manager(pb, ServerOptions())
    assert m.enabled
    m._load_blocking("spare")
    assert pb.requests == [("load", "spare")]
    m.close()


def test_parse_finds_the_http_endpoint_and_its_repository_header(tmp_path):
    default = ServerOptions.parse(["tritonserver", "--model-repository=/m"], tmp_path)
    assert default.http == ("127.0.0.1", 8000) and default.http_header is None
    argv = ["tritonserver", "--http-address", "10.1.2.3", "--http-port=9000",
            "--http-restricted-api=model-repository,health:admin-key=s3cret"]
    options = ServerOptions.parse(argv, tmp_path)
    assert options.http == ("10.1.2.3", 9000) and options.http_header == ("admin-key", "s3cret")
    assert ServerOptions.parse(["tritonserver", "--http-restricted-api=health:k=v"], tmp_path).http_header is None
    assert ServerOptions.parse(["tritonserver", "--allow-http=false"], tmp_path).http is None


def test_parse_finds_the_grpc_endpoint_and_its_repository_header(tmp_path):
    default = ServerOptions.parse(["tritonserver", "--model-repository=/m"], tmp_path)
    assert default.grpc == ("127.0.0.1", 8001) and default.grpc_header is None
    argv = ["tritonserver", "--grpc-address=0.0.0.0", "--grpc-port", "9001",
            "--grpc-restricted-protocol=model-repository:admin-key=s3cret"]
    options = ServerOptions.parse(argv, tmp_path)
    assert options.grpc == ("127.0.0.1", 9001) and options.grpc_header == ("admin-key", "s3cret")
    assert options.http_header is None  # the HTTP restriction is a flag of its own
    assert ServerOptions.parse(["tritonserver", "--allow-grpc=false"], tmp_path).grpc is None


class _Repository(BaseHTTPRequestHandler):
    """A stand-in for Triton's repository API: records requests, refuses model 'bad'."""

    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Repository.seen.append((self.path, self.headers.get("admin-key"), json.loads(body)))
        if "/bad/" in self.path:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error":"failed to load \'bad\': no version is available"}')
            return
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def repository_api():
    httpd = HTTPServer(("127.0.0.1", 0), _Repository)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Repository.seen = []
    yield httpd.server_address[1]
    httpd.shutdown()


def test_loads_go_through_the_http_repository_api(repository_api, monkeypatch):
    monkeypatch.setattr(control_module, "_grpc_client", lambda: None)  # no tritonclient[grpc] in the stub's env
    assert RepositoryControl(FakePb(), ServerOptions("explicit", None, ("127.0.0.1", 1), None, ("127.0.0.1", 2))).via == "http"
    pb = FakePb()
    control = RepositoryControl(pb, ServerOptions("explicit", None, ("127.0.0.1", repository_api), ("admin-key", "k")))
    control.load("classifier")
    control.unload("spare")
    with pytest.raises(ControlError, match=r"^failed to load 'bad': no version is available$"):
        control.load("bad")
    assert _Repository.seen == [
        ("/v2/repository/models/classifier/load", "k", {}),
        ("/v2/repository/models/spare/unload", "k", {"parameters": {"unload_dependents": False}}),
        ("/v2/repository/models/bad/load", "k", {}),
    ]
    assert pb.requests == []  # pb_utils.load_model (it holds the stub's GIL) is not used
    unreachable = RepositoryControl(pb, ServerOptions("explicit", None, ("127.0.0.1", 1)))
    with pytest.raises(ControlError, match="did not answer"):
        unreachable.load("classifier")


class _GrpcRepository:
    """A stand-in for Triton's gRPC repository API (Triton's own messages, from
    tritonclient's service_pb2): records requests, refuses model 'bad'."""

    def __init__(self):
        import grpc
        from tritonclient.grpc import service_pb2

        self.seen = []

        def handler(action, response):
            def handle(request, context):
                key = dict(context.invocation_metadata()).get("admin-key")
                self.seen.append((action, request.model_name, key, dict(request.parameters)))
                if request.model_name == "bad":
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "failed to load 'bad': no version is available")
                return response()
            return handle

        methods = {
            name: grpc.unary_unary_rpc_method_handler(
                handler(action, getattr(service_pb2, f"{name}Response")),
                request_deserializer=getattr(service_pb2, f"{name}Request").FromString,
                response_serializer=getattr(service_pb2, f"{name}Response").SerializeToString)
            for name, action in (("RepositoryModelLoad", "load"), ("RepositoryModelUnload", "unload"))
        }
        self.server = grpc.server(cf.ThreadPoolExecutor(2))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", methods),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_loads_go_through_the_grpc_repository_api_first(repository_api):
    grpc_api = _GrpcRepository()
    try:
        pb = FakePb()
        options = ServerOptions("explicit", None, ("127.0.0.1", repository_api), None, ("127.0.0.1", grpc_api.port), ("admin-key", "k"))
        control = RepositoryControl(pb, options)
        assert control.via == "grpc"
        control.load("classifier")
        control.unload("spare")
        with pytest.raises(ControlError, match=r"^failed to load 'bad': no version is available$"):
            control.load("bad")
        assert [s[:3] for s in grpc_api.seen] == [("load", "classifier", "k"), ("unload", "spare", "k"), ("load", "bad", "k")]
        assert "unload_dependents" in grpc_api.seen[1][3] and not grpc_api.seen[1][3]["unload_dependents"].bool_param
        assert _Repository.seen == [] and pb.requests == []  # neither HTTP nor pb_utils
    finally:
        grpc_api.server.stop(0)
    unreachable = RepositoryControl(FakePb(), ServerOptions("explicit", None, None, None, ("127.0.0.1", 1)))
    with pytest.raises(ControlError, match="gRPC endpoint 127.0.0.1:1 did not answer"):
        unreachable.load("classifier")


def test_repair_reloads_once_per_interval_and_only_models_in_a_repository(tmp_path):
    (tmp_path / "classifier").mkdir()
    pb, repaired = FakePb(ready={"classifier"}), []
    log = Log()
    m = ModelManager(pb, {}, Metrics(pb, "r"), log, server=ServerOptions("explicit", (tmp_path,)),
                     repair_interval_s=60, on_repaired=repaired.append)
    assert m.repair("classifier") is True
    for _ in range(50):
        if repaired:
            break
        time.sleep(0.02)
    assert repaired == ["classifier"] and pb.requests == [("load", "classifier")]  # no HTTP endpoint known: pb_utils
    assert m.repair("classifier") is False  # within the interval
    assert m.repair("absent") is False and any("not reloading 'absent'" in line for line in log.lines)
    none = ModelManager(FakePb(), {}, Metrics(pb, "r"), Log(), server=ServerOptions("none", (tmp_path,)))
    assert none.repair("classifier") is False
