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
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from orchestrator.runtime.bls import control as control_module
from orchestrator.runtime.bls.control import RepositoryControl, ServerOptions, parse_restriction, repair_config
from orchestrator.runtime.bls.ondemand import ModelManager
from orchestrator.runtime.errors import Cause, ControlError, UnavailableError
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.routing.nodes.model import OnDemand
from tests.helpers import Log


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
    child = "from orchestrator.runtime.bls.control import ServerOptions; print(ServerOptions.of_parent())"
    parent = textwrap.dedent(f"""
        import subprocess, sys
        sys.exit(subprocess.run([{sys.executable!r}, "-c", {child!r}]).returncode)
    """)
    # argv[0] of the parent is the symlink's path, as for a real tritonserver binary
    out = subprocess.run([str(server), "-c", parent, "--model-repository=repo", "--model-control-mode=explicit"],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert out.returncode == 0, out.stderr
    expected = ServerOptions("explicit", ((tmp_path / "repo").resolve(),), ("127.0.0.1", 8000), ("127.0.0.1", 8001))
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
        with pytest.raises(UnavailableError, match=r"model 'spare' failed to load: model 'spare' is in no model repository") as info:
            m._load_blocking("spare")
        assert info.value.cause is Cause.NOT_LOADED and info.value.code == "UNAVAILABLE"
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


def test_idle_unload_only_of_models_the_router_loaded_itself():
    """A model an operator loaded is used but never unloaded; once the router loaded it,
    it is the router's to unload when idle."""
    import asyncio
    import time

    pb = FakePb(ready={"spare"})  # loaded by someone else
    m, _ = manager(pb, ServerOptions())
    asyncio.run(m.acquire("spare"))
    m.release("spare")
    assert m.reap(now=time.monotonic() + 3600) == [] and pb.requests == []
    pb.ready.clear()  # unloaded by its operator: the next use loads it, and it is ours
    asyncio.run(m.acquire("spare"))
    m.release("spare")
    assert m.reap(now=time.monotonic() + 30) == []  # idle_timeout_s is 60
    assert m.reap(now=time.monotonic() + 3600) == ["spare"]
    assert pb.requests == [("load", "spare"), ("unload", "spare")]
    m.close()


def test_a_model_outside_the_on_demand_list_is_never_loaded_or_counted():
    import asyncio

    pb = FakePb()  # "other" is not ready: the BLS call itself will say so
    m, _ = manager(pb, ServerOptions())
    asyncio.run(m.acquire("other"))
    m.release("other")
    assert pb.requests == [] and "other" not in m.in_use and m.reap(now=1e12) == []
    m.close()


def test_concurrent_first_loads_share_one_load_request():
    import asyncio
    import time

    class SlowPb(FakePb):
        def load_model(self, model_name):
            time.sleep(0.3)  # the second caller arrives while the first load runs
            super().load_model(model_name)

    pb = SlowPb()
    m, _ = manager(pb, ServerOptions())

    async def three():
        await asyncio.gather(*(m.acquire("spare") for _ in range(3)))

    asyncio.run(three())
    assert pb.requests == [("load", "spare")] and m.in_use["spare"] == 3
    m.close()


def test_parse_finds_the_http_endpoint_and_its_repository_header(tmp_path):
    default = ServerOptions.parse(["tritonserver", "--model-repository=/m"], tmp_path)
    assert default.http == ("127.0.0.1", 8000) and default.header("http") is None
    argv = ["tritonserver", "--http-address", "10.1.2.3", "--http-port=9000",
            "--http-restricted-api=model-repository,health:admin-key=s3cret"]
    options = ServerOptions.parse(argv, tmp_path)
    assert options.http == ("10.1.2.3", 9000) and options.header("http") == ("admin-key", "s3cret")
    assert ServerOptions.parse(["tritonserver", "--http-restricted-api=health:k=v"], tmp_path).header("http") is None
    assert ServerOptions.parse(["tritonserver", "--allow-http=false"], tmp_path).http is None


def test_parse_finds_the_grpc_endpoint_and_its_prefixed_repository_header(tmp_path):
    default = ServerOptions.parse(["tritonserver", "--model-repository=/m"], tmp_path)
    assert default.grpc == ("127.0.0.1", 8001) and default.header("grpc") is None
    argv = ["tritonserver", "--grpc-address=0.0.0.0", "--grpc-port", "9001",
            "--grpc-restricted-protocol=model-repository:admin-key=s3cret"]
    options = ServerOptions.parse(argv, tmp_path)
    # Triton expects the key under its prefix (a bare 'admin-key' is refused as UNAVAILABLE)
    assert options.grpc == ("127.0.0.1", 9001) and options.header("grpc") == ("triton-grpc-protocol-admin-key", "s3cret")
    assert options.header("http") is None  # the HTTP restriction is a flag of its own
    assert ServerOptions.parse(["tritonserver", "--allow-grpc=false"], tmp_path).grpc is None


def test_every_restriction_flag_counts_and_each_group_gets_its_own_key(tmp_path):
    """The image's flags (comma-separated groups, one flag per protocol) and several flags
    per protocol: Triton reads all of them (a group may appear in only one)."""
    groups = "model-repository,model-config,shared-memory,statistics,trace,logging"
    image = ServerOptions.parse(["tritonserver", f"--http-restricted-api={groups}:admin-key=K1",
                                 f"--grpc-restricted-protocol={groups}:admin-key=K1"], tmp_path)
    for group in groups.split(","):
        assert image.header("http", group) == ("admin-key", "K1")
        assert image.header("grpc", group) == ("triton-grpc-protocol-admin-key", "K1")
    assert image.header("http", "inference") is None and image.header("grpc", "health") is None
    several = ServerOptions.parse([
        "tritonserver", "--grpc-restricted-protocol=model-config:cfg-key=C",
        "--grpc-restricted-protocol", "model-repository,logging:Repo-Key=a=b",  # the value may hold '='
        "--grpc-restricted-protocol=statistics:stats=S",
        "--http-restricted-api=statistics:s=1", "--http-restricted-api=model-repository:repo=R",
    ], tmp_path)
    assert several.header("grpc") == ("triton-grpc-protocol-repo-key", "a=b")  # gRPC metadata keys are lower case
    assert several.header("grpc", "model-config") == ("triton-grpc-protocol-cfg-key", "C")
    assert several.header("grpc", "statistics") == ("triton-grpc-protocol-stats", "S")
    assert several.header("http") == ("repo", "R") and several.header("http", "statistics") == ("s", "1")
    assert several.header("http", "model-config") is None


def test_parse_restriction_splits_as_triton_does():
    assert parse_restriction("model-repository,trace:k=v") == [("model-repository", "k", "v"), ("trace", "k", "v")]
    assert parse_restriction("a:k=v=w") == [("a", "k", "v=w")]
    for malformed in ("", "model-repository", "model-repository:k", "model-repository:=v", ":k=v", "g:k="):
        assert parse_restriction(malformed) == [], malformed


CONFIG = {"name": "classifier", "backend": "python", "max_batch_size": 64,
          "parameters": {"onnx_file": {"string_value": "model.onnx"}}}
RESTRICTED = "This API is restricted, expecting header 'admin-key'"


class _Repository(BaseHTTPRequestHandler):
    """A stand-in for Triton's HTTP repository and model-config APIs, restricted to the key
    ``k`` in header ``admin-key`` as Triton does it (403): records requests, refuses
    model 'bad'."""

    seen: list = []

    def _refuse_without_key(self) -> bool:
        if self.headers.get("admin-key") == "k":
            return False
        self.send_response(403)
        self.end_headers()
        self.wfile.write(json.dumps({"error": RESTRICTED}).encode())
        return True

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Repository.seen.append((self.path, self.headers.get("admin-key"), None))
        if not self._refuse_without_key():
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(CONFIG).encode())

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Repository.seen.append((self.path, self.headers.get("admin-key"), json.loads(body)))
        if self._refuse_without_key():
            return
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


def _http_only(port, key=True):
    restricted = (("model-repository", "admin-key", "k"), ("model-config", "admin-key", "k")) if key else ()
    return ServerOptions("explicit", None, ("127.0.0.1", port), None, restricted)


def test_loads_go_through_the_http_repository_api(repository_api, monkeypatch):
    monkeypatch.setattr(control_module, "_grpc_client", lambda: None)  # no tritonclient[grpc] in the stub's env
    assert RepositoryControl(FakePb(), ServerOptions("explicit", None, ("127.0.0.1", 1), ("127.0.0.1", 2))).via == "http"
    pb = FakePb()
    control = RepositoryControl(pb, _http_only(repository_api))
    control.load("classifier")
    control.unload("spare")
    with pytest.raises(ControlError, match=r"^failed to load 'bad': no version is available$"):
        control.load("bad")
    assert control.reload("classifier", "123") == "config"
    override = json.loads(_Repository.seen[-1][2]["parameters"]["config"])
    assert _Repository.seen[:-1] == [
        ("/v2/repository/models/classifier/load", "k", {}),
        ("/v2/repository/models/spare/unload", "k", {"parameters": {"unload_dependents": False}}),
        ("/v2/repository/models/bad/load", "k", {}),
        ("/v2/models/classifier/config", "k", None),
    ]
    assert _Repository.seen[-1][:2] == ("/v2/repository/models/classifier/load", "k")
    assert override == repair_config(CONFIG, "123")
    assert pb.requests == []  # pb_utils.load_model (it holds the stub's GIL) is not used
    unreachable = RepositoryControl(pb, ServerOptions("explicit", None, ("127.0.0.1", 1)))
    with pytest.raises(ControlError, match="did not answer"):
        unreachable.load("classifier")


def test_an_http_refusal_is_reported_as_a_refusal(repository_api, monkeypatch):
    monkeypatch.setattr(control_module, "_grpc_client", lambda: None)
    control = RepositoryControl(FakePb(), _http_only(repository_api, key=False))
    with pytest.raises(ControlError) as info:
        control.load("classifier")
    assert info.value.refused and "did not answer" not in str(info.value)
    assert str(info.value) == (f"the server refused the load of 'classifier': {RESTRICTED} "
                               "(no --http-restricted-api flag of the server covers this API group)")


def test_repair_config_changes_one_parameter_and_keeps_the_rest():
    out = repair_config(CONFIG, "42")
    assert out["parameters"] == {"onnx_file": {"string_value": "model.onnx"}, "orchestrator_repair": {"string_value": "42"}}
    assert {k: v for k, v in out.items() if k != "parameters"} == {k: v for k, v in CONFIG.items() if k != "parameters"}
    assert CONFIG["parameters"] == {"onnx_file": {"string_value": "model.onnx"}}  # not changed in place
    assert repair_config({"name": "m"}, "1")["parameters"] == {"orchestrator_repair": {"string_value": "1"}}


class _GrpcRepository:
    """A stand-in for Triton's gRPC repository and model-config APIs (Triton's own messages,
    from tritonclient's service_pb2), restricted as ``--grpc-restricted-protocol=
    model-repository,model-config:admin-key=k`` makes Triton: UNAVAILABLE without the
    header ``triton-grpc-protocol-admin-key: k``. Records requests, refuses model 'bad'."""

    HEADER = "triton-grpc-protocol-admin-key"

    def __init__(self):
        import grpc
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2, service_pb2

        self.seen = []

        def handler(action, response):
            def handle(request, context):
                metadata = dict(context.invocation_metadata())
                self.seen.append((action, request.name if action == "config" else request.model_name,
                                  metadata.get(self.HEADER), metadata.get("admin-key"),
                                  None if action == "config" else dict(request.parameters)))
                if metadata.get(self.HEADER) != "k":
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"This protocol is restricted, expecting header '{self.HEADER}'")
                if action == "config":
                    return response(config=json_format.ParseDict(CONFIG, model_config_pb2.ModelConfig()))
                if request.model_name == "bad":
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "failed to load 'bad': no version is available")
                return response()
            return handle

        methods = {
            name: grpc.unary_unary_rpc_method_handler(
                handler(action, getattr(service_pb2, f"{name}Response")),
                request_deserializer=getattr(service_pb2, f"{name}Request").FromString,
                response_serializer=getattr(service_pb2, f"{name}Response").SerializeToString)
            for name, action in (("RepositoryModelLoad", "load"), ("RepositoryModelUnload", "unload"), ("ModelConfig", "config"))
        }
        self.server = grpc.server(cf.ThreadPoolExecutor(2))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", methods),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def _options(http_port, grpc_port, flag="model-repository,model-config:admin-key=k"):
    argv = ["tritonserver", "--model-control-mode=explicit", f"--http-port={http_port}", f"--grpc-port={grpc_port}",
            f"--grpc-restricted-protocol={flag}"]
    return ServerOptions.parse(argv, Path("/"))


def test_loads_go_through_the_grpc_repository_api_first(repository_api):
    grpc_api = _GrpcRepository()
    try:
        pb = FakePb()
        control = RepositoryControl(pb, _options(repository_api, grpc_api.port))
        assert control.via == "grpc"
        control.load("classifier")
        control.unload("spare")
        with pytest.raises(ControlError, match=r"^failed to load 'bad': no version is available$"):
            control.load("bad")
        assert control.reload("classifier", "7") == "config"
        # the key under Triton's gRPC prefix, never the bare key
        assert [s[:4] for s in grpc_api.seen] == [("load", "classifier", "k", None), ("unload", "spare", "k", None),
                                                  ("load", "bad", "k", None), ("config", "classifier", "k", None),
                                                  ("load", "classifier", "k", None)]
        assert "unload_dependents" in grpc_api.seen[1][4] and not grpc_api.seen[1][4]["unload_dependents"].bool_param
        override = json.loads(grpc_api.seen[-1][4]["config"].string_param)
        assert override["parameters"]["orchestrator_repair"] == {"string_value": "7"}
        assert override["name"] == "classifier" and override["max_batch_size"] in (64, "64")
        assert _Repository.seen == [] and pb.requests == []  # neither HTTP nor pb_utils
    finally:
        grpc_api.server.stop(0)
    unreachable = RepositoryControl(FakePb(), ServerOptions("explicit", None, None, ("127.0.0.1", 1)))
    with pytest.raises(ControlError, match="gRPC endpoint 127.0.0.1:1 did not answer"):
        unreachable.load("classifier")


def test_a_grpc_refusal_is_reported_as_a_refusal_not_as_a_dead_endpoint(repository_api):
    grpc_api = _GrpcRepository()
    try:
        # the key of another group only: the repository API refuses
        control = RepositoryControl(FakePb(), _options(repository_api, grpc_api.port, "model-config:admin-key=k"))
        with pytest.raises(ControlError) as info:
            control.load("classifier")
        assert info.value.refused and "did not answer" not in str(info.value)
        assert str(info.value) == ("the server refused the load of 'classifier': This protocol is restricted, expecting "
                                   "header 'triton-grpc-protocol-admin-key' (no --grpc-restricted-protocol flag of the "
                                   "server covers this API group)")
        wrong = RepositoryControl(FakePb(), _options(repository_api, grpc_api.port, "model-repository:admin-key=wrong"))
        with pytest.raises(ControlError, match=r"refused the unload of 'spare': .* \(sent the key of 'triton-grpc-protocol-admin-key'\)"):
            wrong.unload("spare")
    finally:
        grpc_api.server.stop(0)


def test_repair_is_refused_for_models_in_no_repository_and_without_explicit_control(tmp_path):
    (tmp_path / "classifier").mkdir()
    pb, log = FakePb(ready={"classifier"}), Log()
    m = ModelManager(pb, {}, Metrics(pb, "r"), log, server=ServerOptions("explicit", (tmp_path,)))
    assert m.repair("absent") is False and any("not reloading 'absent'" in line for line in log.lines)
    none = ModelManager(FakePb(), {}, Metrics(pb, "r"), Log(), server=ServerOptions("none", (tmp_path,)))
    assert none.repair("classifier") is False
    assert pb.requests == []
