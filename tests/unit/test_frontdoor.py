"""The front door's nginx configuration (issue 27), offline: generated from the router
policy and the quotas file, the manifests' copy in step with both, accepted by ``nginx -t``,
and admitting exactly the router's client paths and gRPC methods. The real proxy in front
of a real server: tests/server/test_front_door.py."""

from __future__ import annotations

import re

import pytest
import yaml

from orchestrator.tooling import frontdoor as F
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

    seen = F.ThroughFrontDoor(Server(), Door())  # type: ignore[arg-type]
    assert (seen.http_url, seen.grpc_url, seen.admin_grpc_url, seen.pid) == ("127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:1", 42)


def _frame(message: bytes, compressed: int = 0, length: int | None = None) -> bytes:
    return bytes([compressed]) + (len(message) if length is None else length).to_bytes(4, "big") + message


def _field(number: int, value: bytes) -> bytes:
    return bytes([number << 3 | 2, len(value)]) + value


MODEL_BODIES = [
    # (gRPC body, admitted as a call of model "router")
    (_frame(_field(1, b"router")), True),
    (_frame(_field(1, b"router") + _field(2, b"1") + bytes([3 << 3 | 0, 0x96, 0x01]) + bytes([4 << 3 | 1]) + b"\0" * 8), True),
    (_frame(bytes([5 << 3 | 5]) + b"\0" * 4 + _field(1, b"router")), True),
    (_frame(_field(1, b"classifier")), False),
    (_frame(_field(1, b"router") + _field(1, b"classifier")), False),  # protobuf keeps the last
    (_frame(_field(1, b"classifier") + _field(1, b"router")), False),
    (_frame(_field(1, b"routerx")), False),
    (_frame(_field(1, b"route")), False),
    (_frame(_field(2, b"router")), False),  # no model name at all
    (_frame(b""), False),
    (_frame(_field(1, b"router"), compressed=1), False),  # compressed: not inspectable
    (_frame(_field(1, b"router"), length=7), False),  # length prefix disagrees
    (_frame(_field(1, b"router")) + _frame(_field(1, b"classifier")), False),  # two messages
    (_frame(bytes([1 << 3 | 2, 50]) + b"router"), False),  # length past the end
    (_frame(bytes([1 << 3 | 3]) + _field(1, b"router")), False),  # a group: refused
    (_frame(bytes([0x80] * 11)), False),  # a varint that never ends
    (b"\0\0\0", False),
]


@pytest.mark.skipif(not F.nginx_ready(), reason=f"nginx or its Lua module is not installed: {F.INSTALL_HINT}")
def test_the_grpc_model_check_admits_the_router_only(tmp_path):
    """The Lua check itself, in the real nginx, on crafted gRPC bodies (no Triton needed)."""
    import urllib.request

    from orchestrator.tooling.server import find_free_ports

    (port,) = find_free_ports(1)
    text = "\n".join([*[f"load_module {F.MODULES_DIR}/{m};" for m in F.LUA_MODULES], "daemon off; pid PIDFILE; error_log stderr warn;",
                      "events {}", "http { client_body_temp_path BODY; init_by_lua_block {" + F.MODEL_CHECK_LUA + "}",
                      f"  server {{ listen 127.0.0.1:{port}; client_body_buffer_size 1m; location / {{ content_by_lua_block {{",
                      "    ngx.req.read_body() ngx.print(frontdoor.model_is(ngx.req.get_body_data(), 'router') and 'yes' or 'no') } } } }"])
    text = text.replace("PIDFILE", str(tmp_path / "nginx.pid")).replace("BODY", str(tmp_path / "body"))
    with F.FrontDoor(text, F.Ports("127.0.0.1", port, 0, port), run_dir=tmp_path):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for body, admitted in MODEL_BODIES:
            with opener.open(urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, method="POST"), timeout=10) as r:
                assert r.read() == (b"yes" if admitted else b"no"), body


def test_the_model_check_guards_exactly_the_methods_that_name_a_model():
    grpc = F.render_default().split("  server {")[2]
    for line in grpc.splitlines():
        method = re.search(r"GRPCInferenceService/(\w+)", line)
        if method:
            assert ('frontdoor.admit("router")' in line) == (method.group(1) in F.GRPC_MODEL_NAMED), line
            if method.group(1) in F.GRPC_MODEL_NAMED:
                assert f"client_body_buffer_size {F.body_limits().grpc};" in line  # the whole body in memory
    assert "grpc-status 7" in grpc.split("location @not_router")[1].split("\n")[0]
    off = F.render(F.parse_quotas({"default": {"rate_per_s": 1, "burst": 1}, "grpc_model_check": False}), F.Limits(100, 100))
    assert "lua" not in off and "load_module" not in off and "grpc_pass" in off
