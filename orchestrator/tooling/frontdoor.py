"""The front door: an nginx front proxy in the Triton pod (docs/guides/front-door.md).

Triton listens on loopback only; clients reach it through nginx, which admits only what a
client of the router needs and bounds and meters every request:

* HTTP (``listen`` port 8000): ``GET /v2/health/live``, ``/v2/health/ready``, ``/v2``
  (server metadata), ``GET /v2/models/router[/versions/N]`` (metadata) and ``.../ready``,
  ``POST .../infer``. Everything else: 404 (403 for another method); a control character in
  the decoded path: 400.
* gRPC (8001, HTTP/2 cleartext): ``ServerLive``, ``ServerReady``, ``ServerMetadata`` of
  ``inference.GRPCInferenceService``, and ``ModelReady``, ``ModelMetadata``, ``ModelInfer``
  for the router only. The model name is read from the protobuf body by a strict parser in
  Lua (``frontdoor_check.lua`` beside this module, nginx's Lua module) that admits only bodies every protobuf
  parser reads alike (minimal tags and varints, known fields with their wire types, singular
  fields once, valid UTF-8; :data:`PROTO_MESSAGES`): a malformed body answers
  INVALID_ARGUMENT naming what is wrong, another model PERMISSION_DENIED. Every other method
  (repository, config, statistics, shared memory, trace, logging, ``ModelStreamInfer``)
  answers UNIMPLEMENTED. ``grpc_model_check: false`` in the quotas file drops the check
  (methods only); ``grpc: false`` closes the gRPC port.
* Metrics (8002): ``GET /metrics`` only.
* ``describe_policy`` (the router's policy document) is refused in HTTP and gRPC infer
  requests unless the quotas file says ``describe_policy: true``.
* Every location is bounded: the endpoints that need no body refuse one (413) before reading
  it; ``Content-Encoding`` (415) and ``grpc-encoding`` are refused; probes have in-flight
  limits of their own; requests in flight per source address too; a request's header must come
  within :data:`HEADER_TIMEOUT_S`, its body keep moving (:data:`BODY_TIMEOUT_S`); the gRPC
  check's work per request is bounded (:data:`CHECK_BUDGET`).
* Connections: each public port is a TCP server of nginx's stream module that holds at most
  ``connections_per_address`` connections per source address (closing one more at once, before
  any request is read) and passes each on to its HTTP server over a unix socket in the run
  directory with the PROXY protocol; the HTTP side takes the client's address from it, so every
  per-address limit and log sees the client (:func:`render`'s ``stream``).
* Bodies (read whole before anything goes to Triton): HTTP up to the manifests'
  ``HTTP_MAX_INPUT_SIZE`` (2 x the router policy's ``limits.max_request_bytes`` + 64 KiB: JSON
  escapes texts), gRPC ``ModelInfer`` up to ``max_request_bytes`` + 64 KiB (binary tensors:
  4 bytes of length per text), the gRPC calls without tensors up to :data:`SMALL_BODY`. Over
  it: HTTP 413, gRPC RESOURCE_EXHAUSTED, both saying which limit. At most
  :data:`BODY_BUFFER` of a body is held in memory; the rest waits in a file under the run
  directory, and the check reads it from there in 64 KiB chunks.
* Quotas: token buckets (nginx ``limit_req``, ``nodelay``) per client named by the header
  ``x-client-id`` (``deploy/frontdoor/quotas.yaml``); a request without a listed
  name is metered per source address at the default rate. Requests in flight are bounded per
  client identity (``in_flight_per_client``, also HTTP/2's concurrent streams per
  connection) and in all (``in_flight_total``). Over either: HTTP 429, gRPC
  RESOURCE_EXHAUSTED, saying which. Health and readiness are not metered (the kubelet's
  probes must never be refused for a busy client).

``orchestrator frontdoor render [--out PATH]`` writes the configuration (default
``.cache/frontdoor/nginx.conf``; the manifests' copy is
``deploy/k8s/base/frontdoor/nginx.conf``: ``--out`` it there after changing the policy or the
quotas), ``check`` compares the manifests' copy with a fresh render and runs ``nginx -t``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

from orchestrator.runtime.request import DESCRIBE_PARAMETER
from orchestrator.runtime.routing.policy import PolicyError, load_any
from orchestrator.tooling.errors import ConfigError, ToolingError
from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.repository import get_parameter, read_config
from orchestrator.tooling.routers import load_routers

# Not imported from orchestrator.tooling.deploy, which calls this module's checks.
DEPLOY_DIR = PROJECT_ROOT / "deploy"
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
#: The routers the front door admits (``deploy/routers.yaml``).
ROUTERS = load_routers()
#: HTTP bodies: 2 x max_request_bytes + this, the same bound as the manifests'
#: HTTP_MAX_INPUT_SIZE (orchestrator.tooling.deploy.http_max_input_size; a test keeps them equal).
HTTP_HEADROOM = 64 * 1024


class FrontDoorError(ToolingError):
    """The front door cannot be configured or started; the message says what to do."""


FRONTDOOR_DIR = DEPLOY_DIR / "k8s" / "base" / "frontdoor"
QUOTAS_FILE = DEPLOY_DIR / "frontdoor" / "quotas.yaml"
RENDERED_FILE = FRONTDOOR_DIR / "nginx.conf"
#: gRPC body headroom over ``max_request_bytes``: 4 bytes of length per text, the protobuf
#: framing and the other inputs (same allowance as Triton's HTTP limit's headroom).
GRPC_HEADROOM = 64 * 1024
GRPC_SERVICE = "inference.GRPCInferenceService"
#: gRPC methods a client of the router needs; metered ones first.
GRPC_METERED = ("ModelInfer", "ModelMetadata", "ServerMetadata")
GRPC_UNMETERED = ("ServerLive", "ServerReady", "ModelReady")
#: The gRPC methods whose request names a model in field 1 (``model_name`` of
#: ``ModelInferRequest``, ``name`` of ``ModelMetadataRequest`` and ``ModelReadyRequest``):
#: with ``model_check``, admitted for the router only.
GRPC_MODEL_NAMED = ("ModelInfer", "ModelMetadata", "ModelReady")
#: Debian's dynamic modules (libnginx-mod-http-lua, which pulls libnginx-mod-http-ndk).
MODULES_DIR = "/usr/lib/nginx/modules"
LUA_MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")
#: Debian's libnginx-mod-stream: the TCP layer in front that caps connections per source address.
STREAM_MODULE = "ngx_stream_module.so"
#: The Debian package the image installs for each module the configuration loads (the Lua
#: module's package pulls the NDK's).
MODULE_PACKAGES = {"ndk_http_module.so": "libnginx-mod-http-lua", "ngx_http_lua_module.so": "libnginx-mod-http-lua",
                   STREAM_MODULE: "libnginx-mod-stream"}

#: How the gRPC check reads a field: its protobuf kind (``string``: UTF-8 checked; ``int``:
#: any varint type; ``bool``: a varint of 0 or 1; ``fixed32``/``fixed64``: float, double),
#: whether it repeats, the message it holds (``kind == "message"``) and its oneof.
@dataclass(frozen=True)
class ProtoField:
    kind: str
    repeated: bool = False
    message: str = ""
    oneof: str = ""


_S, _B = ProtoField("string"), ProtoField("bytes")
_PARAMS = ProtoField("message", True, "ParametersEntry")
#: The request messages the gRPC check reads, as Triton's ``grpc_service.proto`` declares them
#: (tests/unit/test_frontdoor.py compares this table with the descriptors that the
#: ``tritonclient`` package compiles from that file). Field number -> :class:`ProtoField`.
PROTO_MESSAGES: Dict[str, Dict[int, ProtoField]] = {
    "ModelInferRequest": {1: _S, 2: _S, 3: _S, 4: _PARAMS, 5: ProtoField("message", True, "InferInputTensor"),
                          6: ProtoField("message", True, "InferRequestedOutputTensor"), 7: ProtoField("bytes", True)},
    "ModelMetadataRequest": {1: _S, 2: _S},
    "ModelReadyRequest": {1: _S, 2: _S},
    "InferInputTensor": {1: _S, 2: _S, 3: ProtoField("int", True), 4: _PARAMS, 5: ProtoField("message", message="InferTensorContents")},
    "InferRequestedOutputTensor": {1: _S, 2: _PARAMS},
    "ParametersEntry": {1: _S, 2: ProtoField("message", message="InferParameter")},
    "InferParameter": {1: ProtoField("bool", oneof="parameter_choice"), 2: ProtoField("int", oneof="parameter_choice"),
                       3: ProtoField("string", oneof="parameter_choice"), 4: ProtoField("fixed64", oneof="parameter_choice"),
                       5: ProtoField("int", oneof="parameter_choice")},
    "InferTensorContents": {1: ProtoField("bool", True), 2: ProtoField("int", True), 3: ProtoField("int", True),
                            4: ProtoField("int", True), 5: ProtoField("int", True), 6: ProtoField("fixed32", True),
                            7: ProtoField("fixed64", True), 8: ProtoField("bytes", True)},
}
#: The request message of each gRPC method the check inspects (field 1 names the model).
GRPC_REQUESTS = {"ModelInfer": "ModelInferRequest", "ModelMetadata": "ModelMetadataRequest", "ModelReady": "ModelReadyRequest"}


def lua_messages() -> str:
    """:data:`PROTO_MESSAGES` as the Lua table ``frontdoor.messages``."""
    out = ["frontdoor.messages = {"]
    for name, fields in PROTO_MESSAGES.items():
        specs = []
        for number, f in sorted(fields.items()):
            parts = [f'k = "{f.kind}"'] + (["r = true"] if f.repeated else []) + ([f'm = "{f.message}"'] if f.message else []) \
                + ([f'o = "{f.oneof}"'] if f.oneof else [])
            specs.append(f"[{number}] = {{{', '.join(parts)}}}")
        out.append(f"      {name} = {{{', '.join(specs)}}},")
    return "\n".join(out) + "\n    }"


#: The gRPC check's Lua (lua-nginx-module, nginx's access phase, after ``client_max_body_size``
#: has bounded the body): shipped beside this module; what it admits is described at its top.
CHECK_LUA_FILE = Path(__file__).with_name("frontdoor_check.lua")
#: The check's work budget per request: tags, packed varints and non-ASCII characters it may
#: read (a request ``tritonclient`` serializes for the router holds a few dozen; texts travel
#: in ``raw_input_contents``, one field). Past it: gRPC RESOURCE_EXHAUSTED naming the limit.
#: It bounds a worker's CPU per request whatever the body holds (tests/unit/test_frontdoor_lua.py
#: times a body at the budget).
CHECK_BUDGET = 65536


def model_check_lua(budget: int = CHECK_BUDGET, refused: Sequence[str] = (DESCRIBE_PARAMETER,)) -> str:
    """The Lua that ``init_by_lua_block`` runs: the globals ``frontdoor.messages``
    (:data:`PROTO_MESSAGES`), ``frontdoor.budget`` and ``frontdoor.refused`` (request
    parameters the door refuses), then :data:`CHECK_LUA_FILE`, which defines
    ``frontdoor.check(data, path, request, admitted) -> verdict, reason``,
    ``frontdoor.json_refused(next_chunk)`` and, for nginx, ``frontdoor.admit(request, admitted)``
    and ``frontdoor.admit_http()``."""
    return (f"frontdoor = {{}}\nfrontdoor.budget = {budget}\nfrontdoor.refused = {_lua_set(refused)}\n{lua_messages()}\n"
            + CHECK_LUA_FILE.read_text(encoding="utf-8"))



_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HEADER = re.compile(r"^[a-z0-9-]{1,64}$")
INSTALL_HINT = ("apt-get install nginx-light libnginx-mod-http-lua libnginx-mod-stream (Debian/Ubuntu; nginx >= 1.19.5 "
                "with the http_v2 and realip modules, the Lua module for the gRPC model check and the stream module "
                "for the per-address connection cap)")


@dataclass(frozen=True)
class Quota:
    """A token bucket: ``rate`` requests per second sustained, ``burst`` more at once."""

    rate: int
    burst: int


@dataclass(frozen=True)
class Quotas:
    """The quotas file: the identity header, the default quota (per source address, for a
    request without a listed client name) and each named client's quota; ``grpc``: whether
    the gRPC port is open; ``model_check``: whether gRPC calls that name a model are
    admitted for the router only (needs nginx's Lua module), else by method only."""

    header: str
    default: Quota
    clients: Dict[str, Quota] = field(default_factory=dict)
    grpc: bool = True
    model_check: bool = True
    in_flight_per_client: int = 32
    in_flight_total: int = 192
    in_flight_per_address: int = 64
    describe_policy: bool = False
    connections_per_address: int = 512


def _quota(value: object, where: str) -> Quota:
    if not isinstance(value, dict) or set(value) != {"rate_per_s", "burst"}:
        raise FrontDoorError(f"{where}: a quota is {{rate_per_s: N, burst: N}}, not {value!r}")
    rate, burst = value["rate_per_s"], value["burst"]
    if not isinstance(rate, int) or isinstance(rate, bool) or rate < 1:
        raise FrontDoorError(f"{where}.rate_per_s must be an integer >= 1 (requests per second), not {rate!r}")
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0:
        raise FrontDoorError(f"{where}.burst must be an integer >= 0, not {burst!r}")
    return Quota(rate, burst)


def parse_quotas(data: object, source: str = "quotas") -> Quotas:
    """:class:`Quotas` from the quotas file's YAML; :class:`FrontDoorError` naming the key."""
    if not isinstance(data, dict):
        raise FrontDoorError(f"{source}: a mapping with client_header, default and clients, not {type(data).__name__}")
    known = {"client_header", "default", "clients", "grpc", "grpc_model_check", "in_flight_per_client", "in_flight_total",
             "in_flight_per_address", "describe_policy", "connections_per_address"}
    unknown = set(data) - known
    if unknown:
        raise FrontDoorError(f"{source}: unknown keys {sorted(unknown)} ({', '.join(sorted(known))})")
    header = str(data.get("client_header", "x-client-id")).lower()
    if not _HEADER.match(header):
        raise FrontDoorError(f"{source}: client_header {header!r} is not a header name (a-z 0-9 -)")
    if "default" not in data:
        raise FrontDoorError(f"{source}: no default quota (for clients without a listed {header})")
    clients = {}
    for name, value in (data.get("clients") or {}).items():
        if not isinstance(name, str) or not _NAME.match(name) or name == "default":
            raise FrontDoorError(f"{source}: client name {name!r} must be 1-64 of A-Z a-z 0-9 . _ - and not 'default'")
        clients[name] = _quota(value, f"{source}: clients.{name}")
    flags = {key: data.get(key, default) for key, default in (("grpc", True), ("grpc_model_check", True), ("describe_policy", False))}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise FrontDoorError(f"{source}: {key} must be true or false, not {value!r}")
    connections = data.get("connections_per_address", Quotas.connections_per_address)
    if not isinstance(connections, int) or isinstance(connections, bool) or not 1 <= connections <= CLIENT_CONNECTIONS:
        raise FrontDoorError(f"{source}: connections_per_address must be an integer from 1 to {CLIENT_CONNECTIONS} "
                             "(TCP connections at once per source address, the door's client connections in all), "
                             f"not {connections!r}")
    return Quotas(header, _quota(data["default"], f"{source}: default"), clients, flags["grpc"], flags["grpc_model_check"],
                  describe_policy=flags["describe_policy"], connections_per_address=connections, **_in_flight(data, source))


def _in_flight(data: dict, source: str) -> Dict[str, int]:
    """The quotas file's in-flight limits, each 1 to 100000 and none over ``in_flight_total``."""
    in_flight: Dict[str, int] = {}
    for key in ("in_flight_per_client", "in_flight_total", "in_flight_per_address"):
        value = data.get(key, getattr(Quotas, key))
        if key == "in_flight_per_address" and key not in data:
            value = min(value, in_flight["in_flight_total"])  # the default never exceeds a smaller total
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100000:
            raise FrontDoorError(f"{source}: {key} must be an integer from 1 to 100000 (requests at once), not {value!r}")
        in_flight[key] = value
    for key in ("in_flight_per_client", "in_flight_per_address"):
        if in_flight[key] > in_flight["in_flight_total"]:
            raise FrontDoorError(f"{source}: {key} ({in_flight[key]}) is over in_flight_total ({in_flight['in_flight_total']})")
    return in_flight


def load_quotas(path: Path = QUOTAS_FILE) -> Quotas:
    try:
        return parse_quotas(yaml.safe_load(Path(path).read_text()), str(path))
    except (OSError, yaml.YAMLError) as exc:
        raise FrontDoorError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class Limits:
    """Request-body limits in bytes."""

    http: int
    grpc: int


def max_request_bytes(repo: Path, router: str) -> int:
    """``limits.max_request_bytes`` of the policy ``router`` reads (its config's parameter
    ``policy``, default ``policy.yaml``)."""
    try:
        name = get_parameter(read_config(Path(repo) / router / "config.pbtxt"), "policy") or "policy.yaml"
        return load_any(Path(repo) / router / name).limits.max_request_bytes
    except (ConfigError, PolicyError, OSError) as exc:
        raise FrontDoorError(f"router {router!r}: {exc}") from None


def body_limits(repo: Path = MODEL_REPOSITORY, routers: Optional[Sequence[str]] = None) -> Limits:
    """The front door's body limits from the routers' ``limits.max_request_bytes`` (default:
    :data:`ROUTERS`)."""
    largest = max(max_request_bytes(Path(repo), r) for r in routers or ROUTERS)
    return Limits(2 * largest + HTTP_HEADROOM, largest + GRPC_HEADROOM)


@dataclass(frozen=True)
class Ports:
    """Where nginx listens (``listen``: address; the three ports) and Triton's loopback ports."""

    listen: str = "0.0.0.0"
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002
    triton_http: int = 18000
    triton_grpc: int = 18001
    triton_metrics: int = 18002


def _grpc_answer(status: int, message: str) -> str:
    # A trailers-only gRPC answer: HTTP 200 headers with grpc-status and END_STREAM.
    return (f'default_type application/grpc; add_header grpc-status {status} always; '
            f'add_header grpc-message "{message}" always; return 204;')


#: Bodies of the gRPC methods that carry no tensors (ServerLive/Ready/Metadata, ModelReady,
#: ModelMetadata: a model name and version at most): what nginx reads of them.
SMALL_BODY = 4096
#: Request bodies over this are kept in a file under the run directory, not in memory.
BODY_BUFFER = 128 * 1024
#: Seconds a client may take to send a request's header, and between two reads of its body
#: (nginx's default is 60): how long a connection that never finishes its request is held.
HEADER_TIMEOUT_S = 10
BODY_TIMEOUT_S = 10
#: Connections each nginx worker holds (idle, unfinished and busy together). An unfinished
#: request costs nginx about 20 KiB with its three worker connections (the client's, the hop,
#: the HTTP side's: pools and header buffers): all the clients both workers hold fit under half
#: the manifests' memory limit of 256 MiB (tests/server/test_front_door.py).
WORKER_CONNECTIONS = 4096
#: Health and readiness requests in flight (they carry no body and are not metered), per
#: source address and in all: the kubelet's probes come one at a time from the node.
PROBES_PER_ADDRESS = 8
PROBES_TOTAL = 64
#: Worker connections one client connection takes with the per-address cap in front: the
#: client's own (stream layer), the hop to the HTTP side over a unix socket, and that side's.
CONNECTIONS_PER_CLIENT = 3
#: Client connections the door holds in all (both workers), with the cap in front.
CLIENT_CONNECTIONS = 2 * WORKER_CONNECTIONS // CONNECTIONS_PER_CLIENT
#: The stream layer's buffer per direction and connection (nginx's default is 16k).
STREAM_BUFFER = 16 * 1024


def _side(listen: str, port: int, run_dir: str, name: str, stream: bool) -> str:
    """Where an HTTP server listens: behind the stream layer a unix socket in the run directory
    speaking the PROXY protocol, else the public port."""
    return f"unix:{run_dir}/{name}.sock proxy_protocol" if stream else f"{listen}:{port}"


def _stream_block(quotas: Quotas, ports: Ports, run_dir: str) -> List[str]:
    """The TCP layer on the public ports: at most ``connections_per_address`` connections per
    source address (one more is closed at once), each handed to its HTTP server's unix socket."""
    public = [("http", ports.http), *([("grpc", ports.grpc)] if quotas.grpc else []), ("metrics", ports.metrics)]
    return [
        "# TCP connections per source address, counted from the connection's start (the HTTP side's",
        "# limit_conn counts a connection only once its request header is read): one more is closed.",
        "stream {",
        "  limit_conn_zone $binary_remote_addr zone=connections:10m;",
        "  limit_conn_log_level warn;",
        "  proxy_protocol on;",
        f"  proxy_buffer_size {STREAM_BUFFER // 1024}k;",
        "  proxy_connect_timeout 5s;",
        "  # Idle longer than the HTTP side keeps a connection (keepalive_timeout): that side closes first.",
        "  proxy_timeout 630s;",
        *[f"  server {{ listen {ports.listen}:{port}; limit_conn connections {quotas.connections_per_address}; "
          f"proxy_pass unix:{run_dir}/{name}.sock; }}" for name, port in public],
        "}",
    ]


def _lua_set(names: Sequence[str]) -> str:
    return "{" + ", ".join(f'["{n}"] = true' for n in names) + "}"


def render(quotas: Quotas, limits: Limits, ports: Ports = Ports(), *, run_dir: str = "/tmp/nginx",
           routers: Optional[Sequence[str]] = None, workers: int = 2, modules_dir: str = MODULES_DIR,
           stream: bool = True) -> str:
    """The nginx configuration (text). ``run_dir``: a writable directory for the pid file,
    request-body buffers and the HTTP side's unix sockets (an emptyDir in the pod); ``routers``:
    the models admitted (default: :data:`ROUTERS`); ``workers``: nginx worker processes;
    ``stream``: the TCP layer on the public ports that caps connections per source address
    (``quotas.connections_per_address``) and hands each to the HTTP side over a unix socket with
    the PROXY protocol (the HTTP side's limits and logs see the client's address). False: the
    HTTP side listens on the public ports itself, with no connection cap (for a comparison of the
    hop's cost, not for a deployment)."""
    routers = tuple(routers or ROUTERS)
    h = quotas.header.replace("-", "_")
    names = sorted(quotas.clients)
    refused = () if quotas.describe_policy else (DESCRIBE_PARAMETER,)
    lua = bool(quotas.grpc and quotas.model_check or refused)
    router = "(" + "|".join(re.escape(r) for r in routers) + ")" if len(routers) > 1 else re.escape(routers[0])
    only = f"the {routers[0]} model" if len(routers) == 1 else f"the router models {', '.join(routers)}"
    out: List[str] = [
        "# The front door (docs/guides/front-door.md). Generated by",
        "#   orchestrator frontdoor render --out deploy/k8s/base/frontdoor/nginx.conf",
        "# from the router policy's limits.max_request_bytes and quotas.yaml: do not edit by hand",
        "# (orchestrator deploy check and tests/unit/test_frontdoor.py compare it with a fresh render).",
        f"worker_processes {workers};",
        *([f"load_module {modules_dir}/{m};" for m in LUA_MODULES] if lua else []),
        *([f"load_module {modules_dir}/{STREAM_MODULE};"] if stream else []),
        f"pid {run_dir}/nginx.pid;",
        "error_log stderr warn;",
        "daemon off;",
        f"events {{ worker_connections {WORKER_CONNECTIONS}; }}",
        "http {",
        "  server_tokens off;",
        "  access_log off;",
        f"  client_body_temp_path {run_dir}/body;",
        f"  proxy_temp_path {run_dir}/proxy;",
        f"  fastcgi_temp_path {run_dir}/fastcgi;",
        f"  uwsgi_temp_path {run_dir}/uwsgi;",
        f"  scgi_temp_path {run_dir}/scgi;",
        "  # Bodies over this wait in a file under the run directory, not in memory.",
        f"  client_body_buffer_size {BODY_BUFFER // 1024}k;",
        "  # Triton answers when the request is done; on-demand loads can take minutes.",
        "  proxy_read_timeout 600s; proxy_send_timeout 600s; grpc_read_timeout 600s; grpc_send_timeout 600s;",
        "  # Pooled client connections stay open: a close after nginx's default 1000 requests races",
        "  # the client's next request on it (HTTP clients see a reset, gRPC a GOAWAY).",
        "  keepalive_requests 1000000; keepalive_timeout 620s;",
        "  # A request's header must arrive within this, its body keep moving: a connection that",
        "  # never finishes its request is closed (nginx's default holds it 60 s), its memory freed.",
        f"  client_header_timeout {HEADER_TIMEOUT_S}s; client_body_timeout {BODY_TIMEOUT_S}s; reset_timedout_connection on;",
        "  # Only a body sent as it is: Triton before 2.65 inflates Content-Encoding: gzip without a",
        "  # bound (the body limit would count compressed bytes); a gRPC message nginx cannot read.",
        "  map $http_content_encoding $frontdoor_encoded { default 1; \"\" 0; \"~*^identity$\" 0; }",
        "  map $http_grpc_encoding $frontdoor_grpc_encoded { default 1; \"\" 0; \"~*^identity$\" 0; }",
        "  # A request with a body (a length over 0, or chunked): refused where none is read.",
        "  map \"$http_content_length:$http_transfer_encoding\" $frontdoor_body { default 1; \":\" 0; \"~^0+:$\" 0; }",
        *(["  # The stream layer passes each connection on with the PROXY protocol: every limit and",
           "  # log below sees the client's address, not the unix socket's.",
           "  set_real_ip_from unix:; real_ip_header proxy_protocol;"] if stream else []),
        "  proxy_http_version 1.1;",
        "  proxy_set_header Connection \"\";",
        f"  upstream triton_http {{ server 127.0.0.1:{ports.triton_http}; keepalive 32; }}",
        f"  upstream triton_grpc {{ server 127.0.0.1:{ports.triton_grpc}; keepalive 32; }}",
        f"  # Client identity: the {quotas.header} header when it names a listed client, else 'default'.",
        f"  map $http_{h} $frontdoor_client {{",
        "    default default;",
        *[f"    \"{n}\" \"{n}\";" for n in names],
        "  }",
        "  map $frontdoor_client $frontdoor_quota {",
        f"    default \"{quotas.default.rate} requests/s, burst {quotas.default.burst}, per source address\";",
        *[f"    \"{n}\" \"{quotas.clients[n].rate} requests/s, burst {quotas.clients[n].burst}\";" for n in names],
        "  }",
        "  # One token bucket zone per client (a zone has one rate); an empty key is not metered.",
        f"  map $http_{h} $quota_key_default {{",
        "    default $binary_remote_addr;",
        *[f"    \"{n}\" \"\";" for n in names],
        "  }",
        f"  limit_req_zone $quota_key_default zone=quota_default:10m rate={quotas.default.rate}r/s;",
        "  # Requests in flight (an HTTP/2 stream counts as one), per client identity and in all:",
        "  # what a client can make the door hold at once.",
        f"  map $http_{h} $frontdoor_in_flight_key {{",
        "    default $remote_addr;",
        *[f"    \"{n}\" \"client:{n}\";" for n in names],
        "  }",
        "  limit_conn_zone $frontdoor_in_flight_key zone=in_flight:10m;",
        "  map $scheme $frontdoor_everyone { default all; }",
        "  limit_conn_zone $frontdoor_everyone zone=in_flight_total:1m;",
        "  # Per source address, whatever client name it sends (anyone can send a listed name).",
        "  limit_conn_zone $binary_remote_addr zone=per_address:10m;",
        "  limit_conn_zone $binary_remote_addr zone=probes:1m;",
        "  limit_conn_zone $frontdoor_everyone zone=probes_total:1m;",
    ]
    metered = [f"limit_req zone=quota_default burst={quotas.default.burst} nodelay;"]
    for i, n in enumerate(names):
        q = quotas.clients[n]
        out += [f"  map $http_{h} $quota_key_{i} {{ default \"\"; \"{n}\" \"{n}\"; }}",
                f"  limit_req_zone $quota_key_{i} zone=quota_{i}:1m rate={q.rate}r/s;"]
        metered.append(f"limit_req zone=quota_{i} burst={q.burst} nodelay;")
    held = (f"limit_conn in_flight {quotas.in_flight_per_client}; limit_conn per_address {quotas.in_flight_per_address}; "
            f"limit_conn in_flight_total {quotas.in_flight_total};")
    probes = f"limit_conn probes {PROBES_PER_ADDRESS}; limit_conn probes_total {PROBES_TOTAL};"
    if lua:  # counted in Lua too, to say which limit refused a request
        held = f'{held} set $frontdoor_counted "";'
    meter = " ".join(metered) + " " + held
    counted = "access_by_lua_block { frontdoor.enter() } " if lua else ""
    which = (f"set_by_lua_block $frontdoor_which {{ return frontdoor.which({quotas.in_flight_per_client}, "
             f"{quotas.in_flight_per_address}, {quotas.in_flight_total}) }} ") if lua else ""
    quota_text = f"quota exceeded: client $frontdoor_client ({quotas.header}) is over its quota of $frontdoor_quota (front door)"
    client_text = (f"too many requests at once: client $frontdoor_client ({quotas.header}) is over the front door's limit of "
                   f"{quotas.in_flight_per_client} requests in flight per client")
    address_text = (f"too many requests at once: source address $remote_addr is over the front door's limit of "
                    f"{quotas.in_flight_per_address} requests in flight per address")
    total_text = f"too many requests at once: all of the front door's {quotas.in_flight_total} requests in flight are in use"
    # Without Lua nginx does not say which limit_conn zone refused: the message names each.
    busy_text = (f"too many requests at once: the front door holds at most {quotas.in_flight_per_client} requests in flight "
                 f"per client (this one: $frontdoor_client, {quotas.header}), {quotas.in_flight_per_address} per source "
                 f"address and {quotas.in_flight_total} in all, and one of these is reached")
    probe_text = (f"too many health and readiness requests at once: the front door holds at most {PROBES_PER_ADDRESS} "
                  f"per source address and {PROBES_TOTAL} in all")
    v = r"(/versions/[0-9]+)?"
    encoded_text = ("Content-Encoding is not admitted by the front door: send the body as it is (the body limit counts "
                    "the bytes Triton would read)")
    no_body = ("if ($frontdoor_body) { return 413 '{\"error\":\"request body refused by the front door: "
               "this endpoint takes no body\"}'; }")
    # probes: their own in-flight limits and refusal (503 inside nginx, answered as 429)
    probe = f"{probes} limit_conn_status 503;"
    # the refused request parameters (describe_policy) in an HTTP infer's JSON
    http_check = "access_by_lua_block { frontdoor.admit_http() } " if refused else ""
    too_large = f"request body over the front door limit of {limits.http} bytes (2 x the router policy limits.max_request_bytes + 64 KiB)"
    out += [
        "  # A 429 is a quota or an in-flight limit: say which.",
        *(["  map \"$limit_conn_status:$frontdoor_which\" $frontdoor_refusal {",
           f"    \"~^REJECTED:client\" \"{client_text}\";",
           f"    \"~^REJECTED:address\" \"{address_text}\";",
           f"    \"~^REJECTED:total\" \"{total_text}\";",
           f"    \"~^REJECTED\" \"{busy_text}\";"] if lua else
          ["  map $limit_conn_status $frontdoor_refusal {", f"    REJECTED \"{busy_text}\";"]),
        f"    default \"{quota_text}\";",
        "  }",
        *(["  lua_shared_dict frontdoor_in_flight 1m;", "  log_by_lua_block { frontdoor.leave() }",
           "  # leave() reads $frontdoor_counted for every request, counted or not: no warning each time",
           "  uninitialized_variable_warn off;"] if lua else []),
        "  limit_req_status 429;",
        "  limit_req_log_level warn;",
        "  limit_conn_status 429;",
        "  limit_conn_log_level warn;",
        "  # Why a gRPC call was refused; a request nginx refuses before the door's own checks ran",
        "  # (a bad header or frame, a duplicate :path) has no reason of its own.",
        "  map $frontdoor_reason $frontdoor_why { \"\" \"the request cannot be read: a bad header or frame\"; default $frontdoor_reason; }",
        *(["  init_by_lua_block {\n" + model_check_lua(refused=refused).rstrip() + "\n  }"] if lua else []),
        "",
        "  server {",
        f"    listen {_side(ports.listen, ports.http, run_dir, 'http', stream)};",
        f"    client_max_body_size {limits.http};",
        "    default_type application/json;",
        "    # A control character in the decoded path (router/infer%0a) is refused, never passed on.",
        "    if ($uri ~ \"[\\x00-\\x1f\\x7f]\") { return 400; }",
        f"    if ($frontdoor_encoded) {{ return 415 '{{\"error\":\"{encoded_text}\"}}'; }}",
        "    # A URI, not a named location: a request line nginx cannot parse (%00) has no URI to carry.",
        "    error_page 400 /.frontdoor/bad-request;",
        "    error_page 429 @quota;",
        "    error_page 413 @too_large;",
        "    error_page 503 @probes_busy;",
        "    location = /.frontdoor/bad-request { internal; default_type application/json; return 400 '{\"error\":\"bad request: a control character in "
        "the path, or a request nginx cannot read (front door)\"}'; }",
        f"    location @quota {{ default_type application/json; {which}return 429 '{{\"error\":\"$frontdoor_refusal\"}}'; }}",
        f"    location @probes_busy {{ default_type application/json; return 429 '{{\"error\":\"{probe_text}\"}}'; }}",
        f"    location @too_large {{ default_type application/json; return 413 '{{\"error\":\"{too_large}\"}}'; }}",
        f"    location = /v2/health/live {{ limit_except GET {{ deny all; }} {no_body} {probe} proxy_pass http://triton_http; }}",
        f"    location = /v2/health/ready {{ limit_except GET {{ deny all; }} {no_body} {probe} proxy_pass http://triton_http; }}",
        f"    location = /v2 {{ limit_except GET {{ deny all; }} {no_body} {meter} {counted}proxy_pass http://triton_http; }}",
        f"    location ~ ^/v2/models/{router}{v}/ready$ {{ limit_except GET {{ deny all; }} {no_body} {probe} proxy_pass http://triton_http$uri; }}",
        f"    location ~ ^/v2/models/{router}{v}$ {{ limit_except GET {{ deny all; }} {no_body} {meter} {counted}proxy_pass http://triton_http$uri; }}",
        f"    location ~ ^/v2/models/{router}{v}/infer$ {{ limit_except POST {{ deny all; }} {meter} {http_check or counted}proxy_pass http://triton_http$uri; }}",
        f"    location / {{ default_type application/json; return 404 '{{\"error\":\"not admitted by the front door: only {only} (infer, metadata, ready) and server health\"}}'; }}",
        "  }",
    ]

    def _grpc_location(method: str) -> str:
        small = method != "ModelInfer"
        parts = [meter if method in GRPC_METERED else held]
        if small:
            # error_page here replaces the server's, so all of them are named again
            parts.append(f"client_max_body_size {SMALL_BODY}; {grpc_errors.replace('@too_large;', '@too_large_small;')}")
        if quotas.grpc and quotas.model_check and method in GRPC_MODEL_NAMED:
            parts.append(f"access_by_lua_block {{ frontdoor.admit(\"{GRPC_REQUESTS[method]}\", {_lua_set(routers)}) }}")
        elif refused and method == "ModelInfer":  # no model check: the refused parameters alone
            parts.append(f"access_by_lua_block {{ frontdoor.admit(\"{GRPC_REQUESTS[method]}\", nil) }}")
        elif counted:
            parts.append(counted.strip())
        return f"    location = /{GRPC_SERVICE}/{method} {{ {' '.join(parts)} grpc_pass grpc://triton_grpc; }}"

    grpc_errors = ("error_page 400 = @malformed; error_page 403 = @not_router; error_page 413 = @too_large; "
                   "error_page 415 = @compressed; error_page 422 = @too_complex; error_page 423 = @refused_parameter; error_page 429 = @quota;")
    if quotas.grpc:
        out += [
            "",
            "  server {",
            f"    listen {_side(ports.listen, ports.grpc, run_dir, 'grpc', stream)} http2;",
            f"    client_max_body_size {limits.grpc};",
            "    # A client's streams on one connection: no more than it may have in flight.",
            f"    http2_max_concurrent_streams {quotas.in_flight_per_client};",
            "    set $frontdoor_reason \"\";",
            "    if ($frontdoor_grpc_encoded) { return 415; }",
            f"    {grpc_errors}",
            f"    location @quota {{ {which}{_grpc_answer(8, '$frontdoor_refusal')} }}",
            f"    location @too_large {{ {_grpc_answer(8, f'request body over the front door limit of {limits.grpc} bytes (the router policy limits.max_request_bytes + 64 KiB)')} }}",
            f"    location @too_large_small {{ {_grpc_answer(8, f'request body over the front door limit of {SMALL_BODY} bytes for a call without tensors')} }}",
            f"    location @malformed {{ {_grpc_answer(3, 'malformed request refused by the front door: $frontdoor_why')} }}",
            f"    location @not_router {{ {_grpc_answer(7, f'not admitted by the front door: only {only}')} }}",
            f"    location @too_complex {{ {_grpc_answer(8, 'request over the front door limit of work per request: $frontdoor_why')} }}",
            f"    location @refused_parameter {{ {_grpc_answer(7, 'the request parameter $frontdoor_why is not admitted by the front door ($frontdoor_why: true in its quotas file admits it)')} }}",
            f"    location @compressed {{ {_grpc_answer(12, 'compressed gRPC messages (grpc-encoding) are not admitted by the front door')} }}",
            *[_grpc_location(m) for m in GRPC_METERED + GRPC_UNMETERED],
            f"    location / {{ {_grpc_answer(12, 'not admitted by the front door: ' + ', '.join(GRPC_METERED + GRPC_UNMETERED) + ' only')} }}",
            "  }",
        ]
    out += [
        "",
        "  server {",
        f"    listen {_side(ports.listen, ports.metrics, run_dir, 'metrics', stream)};",
        f"    client_max_body_size {SMALL_BODY};",
        "    default_type application/json;",
        f"    location = /metrics {{ limit_except GET {{ deny all; }} {no_body} {probes} "
        f"proxy_pass http://127.0.0.1:{ports.triton_metrics}; }}",
        "    location / { return 404; }",
        "  }",
        "}",
        *(_stream_block(quotas, ports, run_dir) if stream else []),
    ]
    return "\n".join(out) + "\n"


def render_default(ports: Ports = Ports(), **kwargs) -> str:
    """The manifests' configuration: the shipped quotas and the shipped router's policy."""
    return render(load_quotas(), body_limits(), ports, **kwargs)


# ----------------------------------------------------------------------------------------
# nginx itself


def nginx_binary() -> Optional[str]:
    """The nginx binary (``NGINX`` or on PATH, then /usr/sbin/nginx), else None."""
    found = os.environ.get("NGINX") or shutil.which("nginx")
    if found:
        return found if os.access(found, os.X_OK) else None
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def nginx_ready() -> bool:
    """nginx and the modules the shipped configuration loads (Lua, stream) are installed."""
    return nginx_binary() is not None and all(Path(MODULES_DIR, m).exists() for m in LUA_MODULES + (STREAM_MODULE,))


def _in_run_dir(text: str, run_dir: str) -> str:
    """``text`` with its run directory (pid file, body buffers, unix sockets) moved to ``run_dir``."""
    return re.sub(r"(pid |_temp_path |unix:)/tmp/nginx/", lambda m: f"{m.group(1)}{run_dir}/", text)


def check_config(text: str, binary: Optional[str] = None) -> subprocess.CompletedProcess:
    """``nginx -t`` on ``text`` (its run directory is replaced by a temporary one)."""
    binary = binary or nginx_binary()
    if binary is None:
        raise FrontDoorError(f"nginx is not installed: {INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="frontdoor-") as tmp:
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(_in_run_dir(text, tmp))
        return subprocess.run([binary, "-t", "-q", "-e", "stderr", "-p", tmp, "-c", str(conf)],
                              capture_output=True, text=True, timeout=60)


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def check_rendered(path: Path = RENDERED_FILE, quotas: Path = QUOTAS_FILE, repo: Path = MODEL_REPOSITORY,
                   routers: Optional[Sequence[str]] = None) -> List[str]:
    """Problems with the manifests' configuration (``path``, from the quotas file ``quotas``,
    the policies in ``repo`` and ``routers``, default :data:`ROUTERS`): differs from a fresh
    render, or ``nginx -t`` refuses it (not run when nginx or its Lua module is not installed;
    ``main`` says so)."""
    problems = []
    fresh = render(load_quotas(quotas), body_limits(repo, routers), routers=routers)
    if not Path(path).exists() or Path(path).read_text() != fresh:
        problems.append(f"{_shown(path)} differs from the policy and quotas.yaml: "
                        f"python -m orchestrator.tooling.frontdoor render --out {_shown(path)}")
    if nginx_ready():
        result = check_config(fresh)
        if result.returncode != 0:
            problems.append(f"nginx -t refuses the front door's configuration: {result.stderr.strip()}")
    return problems


LOOPBACK_NO_PROXY = ("127.0.0.1", "localhost")


def _env(container: dict) -> Dict[str, str]:
    return {e.get("name"): str(e.get("value", "")) for e in container.get("env") or []}


def _no_proxy_problems(container: dict) -> List[str]:
    env = _env(container)
    return [f"{var} must list {', '.join(LOOPBACK_NO_PROXY)} (a cluster-wide proxy must not see loopback calls), not {env.get(var)!r}"
            for var in ("NO_PROXY", "no_proxy") if not set(LOOPBACK_NO_PROXY) <= set((env.get(var) or "").split(","))]


def _check_pod(pod: dict, ports: Ports = Ports(), spool: Optional[int] = None, routers: Optional[Sequence[str]] = None) -> List[str]:
    """What is wrong with a Deployment's pod behind the front door (messages); its readiness
    probe asks for the first of ``routers`` (default :data:`ROUTERS`)."""
    first = (routers or ROUTERS)[0]
    containers = pod.get("containers") or []
    triton = containers[0] if containers else {}
    door = next((c for c in containers if c.get("name") == "frontdoor"), None)
    out = []
    if door is None:
        return ["no frontdoor container: Triton would face the clients itself"]
    env = _env(triton)
    want = {"BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": str(ports.triton_http), "GRPC_PORT": str(ports.triton_grpc),
            "METRICS_PORT": str(ports.triton_metrics)}
    out += [f"triton {k}={env.get(k)!r}, the front door expects {v!r}" for k, v in want.items() if env.get(k) != v]
    out += _no_proxy_problems(triton)
    exposed = {(p.get("name"), p.get("containerPort")) for p in door.get("ports") or []}
    if exposed != {("http", ports.http), ("grpc", ports.grpc), ("metrics", ports.metrics)}:
        out.append(f"frontdoor ports {sorted(exposed, key=str)}: http {ports.http}, grpc {ports.grpc}, metrics {ports.metrics}")
    out += [f"container {c.get('name')} exposes ports: only the front door may" for c in containers if c is not door and c.get("ports")]
    mounts = {m.get("mountPath"): m.get("name") for m in door.get("volumeMounts") or []}
    volume = next((v for v in pod.get("volumes") or [] if v.get("name") == mounts.get("/etc/orchestrator-frontdoor")), {})
    if not (volume.get("configMap") or {}).get("name", "").startswith("orchestrator-frontdoor"):
        out.append("frontdoor does not mount the ConfigMap orchestrator-frontdoor at /etc/orchestrator-frontdoor")
    ready = ((door.get("readinessProbe") or {}).get("httpGet") or {}).get("path")
    if ready != f"/v2/models/{first}/ready":
        out.append(f"frontdoor readinessProbe path {ready!r}: the first router of deploy/routers.yaml is "
                   f"/v2/models/{first}/ready")
    if "/tmp/nginx" not in mounts:
        out.append("frontdoor has no writable /tmp/nginx (pid file, request bodies) under a read-only root")
    else:
        run = next((v for v in pod.get("volumes") or [] if v.get("name") == mounts["/tmp/nginx"]), {})
        size = _quantity((run.get("emptyDir") or {}).get("sizeLimit"))
        if spool is not None and (size is None or size < spool):
            out.append(f"frontdoor's /tmp/nginx emptyDir sizeLimit is {(run.get('emptyDir') or {}).get('sizeLimit')!r}: the bodies "
                       f"it may hold need {spool / 2**30:.2f} GiB (in_flight_total x the HTTP body limit)")
    return out


def _quantity(value: object) -> Optional[float]:
    """A Kubernetes memory/storage quantity (``2Gi``, ``512Mi``, ``1G``) in bytes, else None."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "": 1}
    match = re.fullmatch(r"([0-9.]+)([KMGT]i?)?", str(value or ""))
    return float(match.group(1)) * units[match.group(2) or ""] if match else None


def spool_bytes(quotas: Quotas, limits: Limits) -> int:
    """The most request-body bytes the front door can keep in files at once: every request it
    admits in flight (``in_flight_total``) at the larger body limit."""
    return quotas.in_flight_total * max(limits.http, limits.grpc)


def image_module_problems(conf: str, dockerfile: str) -> List[str]:
    """The modules the configuration ``conf`` loads (``load_module``) whose Debian package
    (:data:`MODULE_PACKAGES`) the front door's Dockerfile (text ``dockerfile``, comments
    ignored) does not install: nginx in that image would refuse to start."""
    installed = set(re.findall(r"\b(libnginx-mod-[a-z0-9-]+)", "\n".join(
        line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))))
    out = []
    for module in re.findall(r"^load_module \S+/([^/\s;]+);", conf, re.M):
        package = MODULE_PACKAGES.get(module)
        if package is None:
            out.append(f"the configuration loads {module}, a module of no known Debian package")
        elif package not in installed:
            out.append(f"the configuration loads {module}, but the image does not install {package}")
    return out


def check_manifests(rendered: Dict[str, str], deploy_dir: Path = DEPLOY_DIR, repo: Path = MODEL_REPOSITORY,
                    routers: Optional[Sequence[str]] = None) -> List[Tuple[str, str]]:
    """``make deploy-check``'s front-door problems as ``(source, message)``: the configuration
    in step with the policies in ``repo``, ``routers`` (default :data:`ROUTERS`) and the
    quotas (and ``nginx -t``), every Deployment's pod behind it (Triton on loopback, the front
    door's ports, its ConfigMap holding the rendered configuration, room in its run directory
    for every body it may hold), ``NO_PROXY`` for loopback in every Triton container, and the
    front door's image installing every module the configuration loads."""
    conf = deploy_dir / "k8s" / "base" / "frontdoor" / "nginx.conf"
    quotas = deploy_dir / "frontdoor" / "quotas.yaml"
    out = [("deploy/k8s/base/frontdoor", p) for p in check_rendered(conf, quotas, repo, routers)]
    expected = conf.read_text() if conf.exists() else None
    image = deploy_dir / "frontdoor" / "Dockerfile"
    if expected is not None and image.exists():
        out += [("deploy/frontdoor/Dockerfile", p) for p in image_module_problems(expected, image.read_text())]
    spool = spool_bytes(load_quotas(quotas), body_limits(repo, routers))
    for rel, text in rendered.items():
        for doc in (d for d in yaml.safe_load_all(text) if isinstance(d, dict)):
            kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name", "")
            if kind == "Deployment":
                out += [(rel, f"Deployment/{name}: {m}") for m in _check_pod(doc["spec"]["template"]["spec"], spool=spool, routers=routers)]
            elif kind == "ServingRuntime":
                out += [(rel, f"ServingRuntime/{name}: {m}") for m in _no_proxy_problems((doc["spec"].get("containers") or [{}])[0])]
            elif kind == "ConfigMap" and name.startswith("orchestrator-frontdoor") and (doc.get("data") or {}).get("nginx.conf") != expected:
                out.append((rel, f"ConfigMap/{name}: nginx.conf is not deploy/k8s/base/frontdoor/nginx.conf"))
    return out


def add_frontdoor_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``orchestrator frontdoor``'s subcommands (``frontdoor_command`` runs them); returns ``parser``."""
    sub = parser.add_subparsers(dest="frontdoor_command", required=True)
    r = sub.add_parser("render", help="write the nginx configuration from the policy and the quotas")
    r.add_argument("--out", default=str(PROJECT_ROOT / ".cache" / "frontdoor" / "nginx.conf"))
    sub.add_parser("check", help=f"compare {_shown(RENDERED_FILE)} with a fresh render; nginx -t")
    return parser


def frontdoor_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator frontdoor <render|check>``: 0 done, 1 a problem or an error."""
    try:
        if args.frontdoor_command == "render":
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(render_default())
            print(out)
            return 0
        problems = check_rendered()
    except FrontDoorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for p in problems:
        print(p)
    if not nginx_ready():
        print(f"nginx -t not run: nginx or its Lua module is not installed ({INSTALL_HINT})")
    return 1 if problems else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m orchestrator.tooling.frontdoor ...``: the same as ``orchestrator frontdoor ...``."""
    parser = add_frontdoor_arguments(argparse.ArgumentParser(prog="orchestrator frontdoor", description=__doc__.split("\n\n")[0]))
    return frontdoor_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
