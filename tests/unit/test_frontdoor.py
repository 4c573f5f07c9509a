"""The front door's nginx configuration, offline: generated from the router
policy and the quotas file, the manifests' copy in step with both, accepted by ``nginx -t``,
and admitting exactly the router's client paths and gRPC methods. The real proxy in front
of a real server: tests/server/test_front_door.py."""

from __future__ import annotations

import re

import pytest
import yaml

from orchestrator.tooling import frontdoor as F
from orchestrator.tooling import frontdoor_nginx as N
from orchestrator.tooling.deploy import http_max_input_size, router_policy
from tests.helpers import ROOT


def test_manifests_copy_is_a_fresh_render():
    assert F.RENDERED_FILE.read_text() == F.render_default(), (
        "deploy/k8s/base/frontdoor/nginx.conf is stale: python -m orchestrator.tooling.frontdoor render --out deploy/k8s/base/frontdoor/nginx.conf")


def test_body_limits_follow_the_policy():
    largest = router_policy(ROOT / "model_repository", "router").limits.max_request_bytes
    limits = F.body_limits()
    assert limits.grpc == largest + 64 * 1024
    assert limits.http == 2 * largest + 64 * 1024 == http_max_input_size()  # the manifests' HTTP_MAX_INPUT_SIZE
    text = F.render_default()
    servers = text.split("  server {")[1:]
    assert f"client_max_body_size {limits.http};" in servers[0]
    assert f"client_max_body_size {limits.grpc};" in servers[1] and "http2;" in servers[1]
    assert "client_max_body_size 0" not in text


@pytest.mark.skipif(not F.nginx_ready(), reason=f"nginx or its Lua module is not installed: {F.INSTALL_HINT}")
def test_nginx_accepts_the_configuration():
    result = F.check_config(F.render_default())
    assert result.returncode == 0, result.stderr
    bad = F.render_default().replace("limit_req_status 429;", "limit_req_status 429")
    assert F.check_config(bad).returncode != 0


def _locations(server: str):
    exact = set(re.findall(r"location = (\S+) \{", server))
    regex = [re.compile(r) for r in re.findall(r"location ~ (\S+) \{", server)]
    return exact, regex


def _admitted(server: str, path: str) -> bool:
    exact, regex = _locations(server)
    return path in exact or any(r.search(path) for r in regex)


def test_http_admits_the_router_and_health_only():
    http = F.render_default().split("  server {")[1]
    for path in ("/v2/models/router/infer", "/v2/models/router/versions/1/infer", "/v2/models/router/ready",
                 "/v2/models/router", "/v2/health/live", "/v2/health/ready", "/v2"):
        assert _admitted(http, path), path
    for path in ("/v2/models/classifier/infer", "/v2/models/classifier/ready", "/v2/models/router_x/infer",
                 "/v2/models/xrouter/infer", "/v2/models/router/config", "/v2/models/router/stats",
                 "/v2/repository/index", "/v2/repository/models/router/load", "/v2/models/router/generate",
                 "/v2/models/router/infer/x", "/v2/logging", "/v2/trace/setting", "/v2/systemsharedmemory/status"):
        assert not _admitted(http, path), path
    assert re.search(r"location / \{[^}]*return 404", http)


def test_grpc_admits_the_client_methods_only():
    grpc = F.render_default().split("  server {")[2]
    exact, regex = _locations(grpc)
    service = "/inference.GRPCInferenceService/"
    assert exact == {service + m for m in F.GRPC_METERED + F.GRPC_UNMETERED} and not regex
    assert "grpc-status 12" in grpc.split("location / {")[1]


def test_quotas_meter_client_calls_and_not_probes():
    text = F.render_default()
    quotas = F.load_quotas()
    for line in text.splitlines():
        if "/infer$" in line or "/ModelInfer" in line or "/ModelMetadata" in line:
            assert f"zone=quota_default burst={quotas.default.burst} nodelay" in line, line
            assert line.count("limit_req zone=") == 1 + len(quotas.clients), line
        if "/ready" in line or "/health/" in line or "ServerLive" in line or "ServerReady" in line or "ModelReady" in line:
            assert "limit_req" not in line, line
    for name, q in quotas.clients.items():
        assert f'"{name}" "{q.rate} requests/s, burst {q.burst}";' in text
    assert re.search(rf"limit_req_zone \$quota_key_default zone=quota_default:\S+ rate={quotas.default.rate}r/s;", text)
    assert "limit_req_status 429;" in text and "grpc-status 8" in text


def test_grpc_false_closes_the_grpc_port():
    q = F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "grpc": False})
    text = F.render(q, F.Limits(100, 100))
    assert "http2" not in text and "grpc_pass" not in text


@pytest.mark.parametrize("data, words", [
    ({"clients": {}}, "no default quota"),
    ({"default": {"rate_per_s": 0, "burst": 1}}, "rate_per_s must be an integer >= 1"),
    ({"default": {"rate_per_s": 1}}, "a quota is {rate_per_s: N, burst: N}"),
    ({"default": {"rate_per_s": 1, "burst": 1}, "clients": {"a b": {"rate_per_s": 1, "burst": 1}}}, "client name 'a b'"),
    ({"default": {"rate_per_s": 1, "burst": 1}, "clients": {"default": {"rate_per_s": 1, "burst": 1}}}, "not 'default'"),
    ({"default": {"rate_per_s": 1, "burst": 1}, "client_header": "x client"}, "not a header name"),
    ({"default": {"rate_per_s": 1, "burst": 1}, "quota": 3}, "unknown keys ['quota']"),
])
def test_bad_quotas_named(data, words):
    with pytest.raises(F.FrontDoorError, match=re.escape(words)):
        F.parse_quotas(data, "quotas.yaml")


def test_shipped_quotas_parse():
    data = yaml.safe_load(F.QUOTAS_FILE.read_text())
    assert F.parse_quotas(data).default.rate >= 1


def test_soak_front_door_mode_is_wired():
    """``make soak SOAK_ARGS=--front-door``: the config asks for it, the report takes the front
    door's size refusal as a refusal only in that mode, and the server seen through the door
    keeps the server's own admin port."""
    import argparse

    from lab.soak.command import add_soak_arguments, config_from_args
    from lab.soak.report import oversized_summary

    args = add_soak_arguments(argparse.ArgumentParser()).parse_args(["--short", "--front-door"])
    assert config_from_args(args).front_door is True
    assert config_from_args(add_soak_arguments(argparse.ArgumentParser()).parse_args([])).front_door is False
    items = [{"outcome": "error", "status": "StatusCode.RESOURCE_EXHAUSTED", "message": "request body over the front door limit"},
             {"outcome": "error", "status": "400", "message": "max_text_bytes"}]
    assert oversized_summary(items)["invalid_arg"] == 1
    assert oversized_summary(items, front_door=True)["invalid_arg"] == 2

    class Server:
        grpc_url, http_url, pid = "127.0.0.1:1", "127.0.0.1:2", 42

    class Door:
        ports = F.Ports("127.0.0.1", 9000, 9001, 9002)

    seen = N.ThroughFrontDoor(Server(), Door())  # type: ignore[arg-type]
    assert (seen.http_url, seen.grpc_url, seen.admin_grpc_url, seen.pid) == ("127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:1", 42)


def test_the_check_reads_the_request_messages_as_grpc_service_proto_declares_them():
    """:data:`F.PROTO_MESSAGES` against the descriptors tritonclient compiles from Triton's
    grpc_service.proto: every field's number, kind, label and oneof; no field left out."""
    from google.protobuf.descriptor import FieldDescriptor as FD
    from tritonclient.grpc import service_pb2 as pb

    kinds = {FD.TYPE_STRING: "string", FD.TYPE_BYTES: "bytes", FD.TYPE_MESSAGE: "message", FD.TYPE_BOOL: "bool",
             FD.TYPE_INT32: "int", FD.TYPE_INT64: "int", FD.TYPE_UINT32: "int", FD.TYPE_UINT64: "int",
             FD.TYPE_FLOAT: "fixed32", FD.TYPE_DOUBLE: "fixed64"}
    descriptors = {"ModelInferRequest": pb.ModelInferRequest, "ModelMetadataRequest": pb.ModelMetadataRequest,
                   "ModelReadyRequest": pb.ModelReadyRequest, "InferInputTensor": pb.ModelInferRequest.InferInputTensor,
                   "InferRequestedOutputTensor": pb.ModelInferRequest.InferRequestedOutputTensor,
                   "ParametersEntry": pb.ModelInferRequest.ParametersEntry, "InferParameter": pb.InferParameter,
                   "InferTensorContents": pb.InferTensorContents}
    assert set(descriptors) == set(F.PROTO_MESSAGES)
    for name, cls in descriptors.items():
        want = {}
        for f in cls.DESCRIPTOR.fields:
            message = f.message_type.name if f.message_type else ""
            want[f.number] = F.ProtoField(kinds[f.type], f.is_repeated, message, f.containing_oneof.name if f.containing_oneof else "")
        assert F.PROTO_MESSAGES[name] == want, name
    assert {m: F.GRPC_REQUESTS[m] for m in F.GRPC_MODEL_NAMED} == F.GRPC_REQUESTS
    for method, request in F.GRPC_REQUESTS.items():
        assert pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[method].input_type.name == request
        assert getattr(pb, request).DESCRIPTOR.fields_by_number[1].type == FD.TYPE_STRING  # field 1 names the model


def test_the_model_check_guards_exactly_the_methods_that_name_a_model():
    grpc = F.render_default().split("  server {")[2]
    for line in grpc.splitlines():
        method = re.search(r"GRPCInferenceService/(\w+)", line)
        if method:
            m = method.group(1)
            checked = f'frontdoor.admit("{F.GRPC_REQUESTS.get(m)}", {{["router"] = true}})' in line
            assert checked == (m in F.GRPC_MODEL_NAMED), line
            # only ModelInfer carries tensors: the others are read up to a few KiB
            assert (f"client_max_body_size {F.SMALL_BODY};" in line) == (m != "ModelInfer"), line
    assert "grpc-status 7" in grpc.split("location @not_router")[1].split("\n")[0]
    assert "grpc-status 3" in grpc.split("location @malformed")[1].split("\n")[0]
    assert f"client_body_buffer_size {F.BODY_BUFFER // 1024}k;" in F.render_default()  # bodies past it wait in a file
    off = F.render(F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "grpc_model_check": False, "describe_policy": True}),
                   F.Limits(100, 100))
    modules = [line for line in off.splitlines() if line.startswith("load_module")]
    assert "lua" not in off and modules == [f"load_module {F.MODULES_DIR}/{F.STREAM_MODULE};"] and "grpc_pass" in off
    # describe_policy refused (the default) needs the Lua module for HTTP's JSON even without the gRPC check
    http_only = F.render(F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "grpc_model_check": False}), F.Limits(100, 100))
    assert "load_module" in http_only and "{ frontdoor.admit_http() }" in http_only
    assert 'frontdoor.admit("ModelInferRequest", nil)' in http_only and 'frontdoor.admit("ModelReadyRequest"' not in http_only


def test_describe_policy_is_refused_at_the_door_unless_the_deployment_admits_it():
    text = F.render_default()
    assert F.load_quotas().describe_policy is False
    assert 'frontdoor.refused = {["describe_policy"] = true}' in text
    for line in text.split("  server {")[1].splitlines():
        if "/infer$" in line:
            assert "access_by_lua_block { frontdoor.admit_http() }" in line, line
    assert "error_page 423 = @refused_parameter;" in text and "location @refused_parameter" in text
    admitted = F.render(F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "describe_policy": True}), F.Limits(100, 100))
    assert "frontdoor.refused = {}" in admitted and "{ frontdoor.admit_http() }" not in admitted
    with pytest.raises(F.FrontDoorError, match="describe_policy must be true or false"):
        F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "describe_policy": "yes"})


def test_requests_in_flight_are_bounded_per_client_and_in_all():
    quotas = F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "clients": {"a": {"rate_per_s": 1, "burst": 1}},
                             "in_flight_per_client": 5, "in_flight_total": 9})
    text = F.render(quotas, F.Limits(100, 100))
    held = "limit_conn in_flight 5; limit_conn per_address 9; limit_conn in_flight_total 9;"
    probes = f"limit_conn probes {F.PROBES_PER_ADDRESS}; limit_conn probes_total {F.PROBES_TOTAL}; limit_conn_status 503;"
    for line in text.splitlines():
        if "grpc_pass" in line or "/infer$" in line or "location = /v2 " in line:
            assert held in line, line
        if "/health/" in line or "/ready$" in line:
            # the probes have their own limits: a busy client never takes the kubelet's place
            assert probes in line and "limit_conn in_flight" not in line, line
    assert "http2_max_concurrent_streams 5;" in text
    assert '"a" "client:a";' in text and "default $remote_addr;" in text  # a listed name never collides with an address
    assert "client $frontdoor_client (x-client-id) is over the front door's limit of 5 requests in flight per client" in text
    assert "all of the front door's 9 requests in flight are in use" in text
    assert "set_by_lua_block $frontdoor_which { return frontdoor.which(5, 9, 9) }" in text
    plain = F.render(F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "in_flight_per_client": 5, "in_flight_total": 9,
                                     "grpc_model_check": False, "describe_policy": True}), F.Limits(100, 100))
    # without Lua the message names every limit
    assert "at most 5 requests in flight per client (this one: $frontdoor_client, x-client-id), 9 per source address and 9 in all" in plain
    assert "limit_conn_zone $binary_remote_addr zone=per_address:10m;" in text
    narrow = F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "in_flight_per_address": 3})
    assert "limit_conn per_address 3;" in F.render(narrow, F.Limits(100, 100))
    with pytest.raises(F.FrontDoorError, match="in_flight_per_address \\(300\\) is over in_flight_total"):
        F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "in_flight_per_address": 300})


def test_every_location_bounds_bodies_and_requests_in_flight():
    """No endpoint that needs no body reads one; each admitted location is under an in-flight
    limit; encoded bodies and compressed gRPC messages are refused at the door; connections that
    never finish a request are closed after a short timeout."""
    text = F.render_default()
    http, grpc, metrics = text.split("stream {")[0].split("  server {")[1:]
    for server in (http, metrics):
        for line in server.splitlines():
            if "limit_except GET" in line:
                assert "if ($frontdoor_body) { return 413" in line and "limit_conn " in line, line
            if "limit_except POST" in line:
                assert "limit_conn in_flight " in line, line
    assert re.search(r"map \S+ \$frontdoor_body \{ default 1; \":\" 0; \"~\^0\+:\$\" 0; \}", text)
    assert "if ($frontdoor_encoded) { return 415" in http and "if ($frontdoor_grpc_encoded) { return 415; }" in grpc
    assert "error_page 415 = @compressed;" in grpc
    assert f"client_header_timeout {F.HEADER_TIMEOUT_S}s; client_body_timeout {F.BODY_TIMEOUT_S}s;" in text
    assert f"worker_connections {F.WORKER_CONNECTIONS};" in text
    assert "error_page 400 /.frontdoor/bad-request;" in http and "location = /.frontdoor/bad-request { internal;" in http
    assert "$frontdoor_why" in grpc.split("location @malformed")[1].split("\n")[0]


def test_connections_are_capped_per_source_address_before_any_request():
    """A stream layer on every public port counts TCP connections per source address
    (``connections_per_address``) and hands each to its HTTP server's unix socket with the PROXY
    protocol; the HTTP side takes the client's address from it, so every per-address limit
    still sees the client. Without the layer (``stream=False``) the HTTP servers face the port."""
    quotas = F.load_quotas()
    ports = F.Ports("0.0.0.0", 8000, 8001, 8002)
    text = F.render(quotas, F.Limits(100, 100), ports)
    assert f"load_module {F.MODULES_DIR}/{F.STREAM_MODULE};" in text
    stream = text.split("\nstream {")[1]
    assert "limit_conn_zone $binary_remote_addr zone=connections:10m;" in stream and "proxy_protocol on;" in stream
    for name, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        assert (f"server {{ listen 0.0.0.0:{port}; limit_conn connections {quotas.connections_per_address}; "
                f"proxy_pass unix:/tmp/nginx/{name}.sock; }}") in stream
    http, grpc, metrics = text.split("stream {")[0].split("  server {")[1:]
    assert "listen unix:/tmp/nginx/http.sock proxy_protocol;" in http and "listen unix:/tmp/nginx/metrics.sock proxy_protocol;" in metrics
    assert "listen unix:/tmp/nginx/grpc.sock proxy_protocol http2;" in grpc
    assert "set_real_ip_from unix:; real_ip_header proxy_protocol;" in text
    # every directory the door writes moves with the run directory (tests, nginx -t)
    moved = F._in_run_dir(text, "/run/x")
    assert "/tmp/nginx" not in moved and "proxy_pass unix:/run/x/http.sock;" in moved
    plain = F.render(quotas, F.Limits(100, 100), ports, stream=False)
    assert "stream {" not in plain and F.STREAM_MODULE not in plain and "real_ip_header" not in plain
    assert "listen 0.0.0.0:8000;" in plain and "listen 0.0.0.0:8001 http2;" in plain
    closed = F.render(F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "grpc": False, "connections_per_address": 7}),
                      F.Limits(100, 100), ports)
    assert "limit_conn connections 7;" in closed and "0.0.0.0:8001" not in closed and "grpc.sock" not in closed
    # the shipped cap keeps one source under a fifth of the client connections the door holds
    assert F.CLIENT_CONNECTIONS == 2 * F.WORKER_CONNECTIONS // 3 and quotas.connections_per_address * 5 < F.CLIENT_CONNECTIONS


def test_the_image_installs_every_module_the_configuration_loads():
    conf = (ROOT / "deploy/k8s/base/frontdoor/nginx.conf").read_text()
    dockerfile = (ROOT / "deploy/frontdoor/Dockerfile").read_text()
    assert "load_module /usr/lib/nginx/modules/ngx_stream_module.so;" in conf
    assert F.image_module_problems(conf, dockerfile) == []
    without = "\n".join(line for line in dockerfile.splitlines() if not line.strip().startswith("libnginx-mod-stream="))
    assert "libnginx-mod-stream" in without  # a comment still names it: comments do not count
    assert F.image_module_problems(conf, without) == [
        "the configuration loads ngx_stream_module.so, but the image does not install libnginx-mod-stream"]
    assert F.image_module_problems("load_module /m/ngx_x.so;\n", dockerfile) == [
        "the configuration loads ngx_x.so, a module of no known Debian package"]


@pytest.mark.parametrize("value", [0, -1, "many", True, F.CLIENT_CONNECTIONS + 1])
def test_a_bad_connection_cap_is_named(value):
    with pytest.raises(F.FrontDoorError, match=f"connections_per_address must be an integer from 1 to {F.CLIENT_CONNECTIONS}"):
        F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "connections_per_address": value}, "quotas.yaml")


@pytest.mark.parametrize("data, words", [
    ({"in_flight_per_client": 0}, "in_flight_per_client must be an integer from 1 to 100000"),
    ({"in_flight_total": "many"}, "in_flight_total must be an integer"),
    ({"in_flight_per_client": 10, "in_flight_total": 5}, "in_flight_per_client (10) is over in_flight_total (5)"),
])
def test_bad_in_flight_limits_named(data, words):
    with pytest.raises(F.FrontDoorError, match=re.escape(words)):
        F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, **data}, "quotas.yaml")


def test_a_control_character_in_an_http_path_is_refused():
    http = F.render_default().split("  server {")[1]
    assert 'if ($uri ~ "[\\x00-\\x1f\\x7f]") { return 400; }' in http


def test_routers_named_otherwise_are_admitted_by_name():
    text = F.render(F.load_quotas(), F.Limits(100, 100), routers=("sentiment", "topics.v2"))
    http, grpc = text.split("  server {")[1:3]
    for path in ("/v2/models/sentiment/infer", "/v2/models/topics.v2/versions/3/infer", "/v2/models/sentiment/ready"):
        assert _admitted(http, path), path
    for path in ("/v2/models/router/infer", "/v2/models/topicsXv2/infer", "/v2/models/sentimentx/infer"):
        assert not _admitted(http, path), path
    assert '{["sentiment"] = true, ["topics.v2"] = true}' in grpc
    assert "only the router models sentiment, topics.v2" in grpc


def test_the_routers_setting_is_one_file():
    from orchestrator.tooling import routers as R
    from orchestrator.tooling.errors import ConfigError

    assert R.load_routers() == F.ROUTERS == ("router",)
    assert R.parse_routers({"routers": ["a", "b.c"]}) == ("a", "b.c")
    for bad, words in [({"routers": []}, "at least one router"), ({"router": ["a"]}, "expected {routers"),
                       ({"routers": ["a b"]}, "is not a model name"), ({"routers": ["a", "a"]}, "listed twice")]:
        with pytest.raises(ConfigError, match=re.escape(words)):
            R.parse_routers(bad)


def test_the_guide_states_the_shipped_limits():
    """docs/guides/front-door.md's figures for what the door holds are the shipped ones."""
    import inspect

    guide = " ".join((ROOT / "docs/guides/front-door.md").read_text().split())
    quotas = F.load_quotas()
    text = F.render_default()
    workers = inspect.signature(F.render).parameters["workers"].default
    assert f"worker_processes {workers};" in text and f"Each of the {workers} nginx workers" in guide
    assert f"holds up to {F.WORKER_CONNECTIONS:,} connections" in guide
    clients, cap = workers * F.WORKER_CONNECTIONS // F.CONNECTIONS_PER_CLIENT, quotas.connections_per_address
    assert clients == F.CLIENT_CONNECTIONS and f"holds {clients:,} client connections in all" in guide
    assert f"`connections_per_address` connections of one source address at once ({cap} shipped" in guide
    assert f"(at most {clients:,})" in guide and "set_real_ip_from unix:; real_ip_header proxy_protocol;" in text
    assert f"at most {cap} connections at once (`connections_per_address`), under a fifth of the {clients:,}" in guide and cap * 5 < clients
    assert f"at least {clients - cap:,} stay for others" in guide and f"one actor with {-(-clients // cap)} addresses" in guide
    quotas_file = (ROOT / "deploy/frontdoor/quotas.yaml").read_text()
    assert f"The door holds {clients} client connections in all: {cap} keeps one" in " ".join(quotas_file.replace("# ", "").split())
    assert f"(at most {clients})" in quotas_file
    assert f"header within {F.HEADER_TIMEOUT_S} s" in guide and f"at most {F.BODY_TIMEOUT_S} s between two reads" in guide
    assert f"held at most {F.HEADER_TIMEOUT_S} s" in guide and "keepalive_timeout 620s;" in text and "open up to 620 s" in guide
    per_address, total, per_client = quotas.in_flight_per_address, quotas.in_flight_total, quotas.in_flight_per_client
    assert f"(`in_flight_per_address`, {per_address}:" in guide and f"(`in_flight_total`, {total})" in guide
    assert f"at most {per_address} requests in flight (`in_flight_per_address`; its listed client names at most {per_client}" in guide
    assert f"at least {total - per_address} of the {total} request slots" in guide
    assert f"{F.PROBES_PER_ADDRESS} in flight per source address and {F.PROBES_TOTAL} in all" in guide
    assert f"{F.PROBES_TOTAL - F.PROBES_PER_ADDRESS} of the {F.PROBES_TOTAL} probe slots" in guide
    assert f"budget of {F.CHECK_BUDGET:,} per request" in guide and f"at most {F.CHECK_BUDGET:,} units" in guide
    assert f"over {F.CHECK_BUDGET} protobuf fields" in F.CHECK_LUA_FILE.read_text().replace('" .. frontdoor.budget .. "', str(F.CHECK_BUDGET))
    assert f"{F.BODY_BUFFER // 1024} KiB of it in memory" in guide
    for line in ("client NAME (x-client-id) is over the front door's limit of 32 requests in flight per client",
                 "source address ADDRESS is over the front door's limit of 64 requests in flight per address",
                 "all of the front door's 192 requests in flight are in use"):
        assert line in guide
        assert line.replace("NAME", "$frontdoor_client").replace("ADDRESS", "$remote_addr") \
            .replace(" 32 ", f" {per_client} ").replace(" 64 ", f" {per_address} ").replace(" 192 ", f" {total} ") in text
    assert "`describe_policy: true` in `deploy/frontdoor/quotas.yaml`" in guide and quotas.describe_policy is False
    assert "is not admitted by the front door (describe_policy: true in its quotas file admits it)" in guide
    assert "is not admitted by the front door (' .. found .. ': true in its quotas file admits it)" in F.CHECK_LUA_FILE.read_text()
