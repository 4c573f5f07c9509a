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
  Lua (:data:`MODEL_CHECK_LUA`, nginx's Lua module) that admits only bodies every protobuf
  parser reads alike (minimal tags and varints, known fields with their wire types, singular
  fields once, valid UTF-8; :data:`PROTO_MESSAGES`): a malformed body answers
  INVALID_ARGUMENT naming what is wrong, another model PERMISSION_DENIED. Every other method
  (repository, config, statistics, shared memory, trace, logging, ``ModelStreamInfer``)
  answers UNIMPLEMENTED. ``grpc_model_check: false`` in the quotas file drops the check
  (methods only); ``grpc: false`` closes the gRPC port.
* Metrics (8002): ``GET /metrics`` only.
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
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

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


#: The gRPC check (lua-nginx-module, nginx's access phase, after ``client_max_body_size`` has
#: bounded the body). It reads the body as protobuf reads it and admits only what every
#: protobuf parser reads the same way: one uncompressed gRPC message filling the body; every
#: tag a minimal varint of at most 5 bytes naming a field of the message with that field's
#: wire type (repeated numbers packed or not); every varint minimal and at most 64 bits, a bool
#: 0 or 1; every length within its message; strings valid UTF-8; a singular field, and a oneof,
#: at most once; nested messages read the same way. Anything else is refused, never skipped:
#: ``"malformed"`` with the reason. Then field 1 (the model name) must be an admitted router,
#: else ``"model"``. A body nginx kept in a file (over ``client_body_buffer_size``) is read from
#: the file in 64 KiB chunks, so the memory a check holds does not grow with the body.
MODEL_CHECK_LUA = r"""
    frontdoor = {}
    local byte, char, find, floor = string.byte, string.char, string.find, math.floor
    local CHUNK = 65536
    local WIRE = {string = 2, bytes = 2, message = 2, bool = 0, int = 0, fixed32 = 5, fixed64 = 1}
    local SIZE = {fixed32 = 4, fixed64 = 8}
    MESSAGES

    -- verdict, reason: "admit", "model" (not an admitted router) or "malformed" and why.
    local function parse(data, f, total, request, admitted)
      local base, pos = 0, 0
      local function getbyte()
        local i = pos - base
        if i < 0 or i >= #data then
          if not f or pos >= total then return nil end
          f:seek("set", pos)
          data, base, i = f:read(CHUNK) or "", pos, 0
          if #data == 0 then return nil end
        end
        pos = pos + 1
        return byte(data, i + 1)
      end
      local function varint(stop, most)
        local v, scale = 0, 1
        for n = 1, most do
          if pos >= stop then return nil, "a varint runs past its message" end
          local c = getbyte()
          if not c then return nil, "a varint runs past the body" end
          if c < 128 then
            if c == 0 and n > 1 then return nil, "a varint is not minimally encoded" end
            if n == 10 and c > 1 then return nil, "a varint is over 64 bits" end
            return v + c * scale
          end
          v, scale = v + (c - 128) * scale, scale * 128
        end
        return nil, (most == 5 and "a tag is" or "a varint is") .. " over " .. most .. " bytes"
      end
      local function utf8(stop)
        while pos < stop do
          if not getbyte() then return false end
          pos = pos - 1
          local i = pos - base + 1
          local last = math.min(#data, stop - base)
          local k = find(data, "[\128-\255]", i)
          if not k or k > last then
            pos = base + last
          else
            pos = base + k - 1
            local c, n, lo, hi = getbyte(), 0, 0x80, 0xBF
            if c >= 0xC2 and c <= 0xDF then n = 1
            elseif c == 0xE0 then n, lo = 2, 0xA0
            elseif c == 0xED then n, hi = 2, 0x9F
            elseif c >= 0xE1 and c <= 0xEF then n = 2
            elseif c == 0xF0 then n, lo = 3, 0x90
            elseif c >= 0xF1 and c <= 0xF3 then n = 3
            elseif c == 0xF4 then n, hi = 3, 0x8F
            else return false end
            for t = 1, n do
              if pos >= stop then return false end
              local d = getbyte()
              if not d then return false end
              if t > 1 then lo, hi = 0x80, 0xBF end
              if d < lo or d > hi then return false end
            end
          end
        end
        return true
      end
      local function text(stop)
        local out = {}
        while pos < stop do out[#out + 1] = char(getbyte()) end
        return table.concat(out)
      end
      local message
      message = function(schema, stop, top)
        local seen, model = {}, nil
        while pos < stop do
          local key, err = varint(stop, 5)
          if not key then return nil, err end
          local number, wire = floor(key / 8), key % 8
          local spec = schema[number]
          if not spec then return nil, "field " .. number .. " is not a field of the request" end
          local want = WIRE[spec.k]
          local packed = spec.r and want ~= 2 and wire == 2
          if wire ~= want and not packed then
            return nil, "field " .. number .. " has wire type " .. wire .. ", not " .. want
          end
          if not spec.r then
            if seen[number] then return nil, "field " .. number .. " occurs twice" end
            seen[number] = true
            if spec.o then
              if seen[spec.o] then return nil, "two fields of oneof " .. spec.o end
              seen[spec.o] = true
            end
          end
          if wire == 0 then
            local v, e = varint(stop, 10)
            if not v then return nil, e end
            if spec.k == "bool" and v > 1 then return nil, "field " .. number .. " is a bool other than 0 or 1" end
          elseif wire ~= 2 then
            if pos + SIZE[spec.k] > stop then return nil, "field " .. number .. " runs past its message" end
            pos = pos + SIZE[spec.k]
          else
            local len, e = varint(stop, 5)
            if not len then return nil, e end
            local finish = pos + len
            if finish > stop then return nil, "field " .. number .. " runs past its message" end
            if packed and SIZE[spec.k] then
              if len % SIZE[spec.k] ~= 0 then return nil, "packed field " .. number .. " is not whole values" end
            elseif packed then
              while pos < finish do
                local v, e2 = varint(finish, 10)
                if not v then return nil, e2 end
                if spec.k == "bool" and v > 1 then return nil, "field " .. number .. " is a bool other than 0 or 1" end
              end
            elseif spec.k == "message" then
              local ok, e2 = message(frontdoor.messages[spec.m], finish, false)
              if not ok then return nil, e2 end
            elseif top and number == 1 then
              model = len <= 256 and text(finish) or ""
            elseif spec.k == "string" and not utf8(finish) then
              return nil, "field " .. number .. " is not valid UTF-8"
            end
            pos = finish
          end
        end
        return true, nil, model
      end
      if total < 5 then return "malformed", "not a gRPC message" end
      local flag, b2, b3, b4, b5 = getbyte(), getbyte(), getbyte(), getbyte(), getbyte()
      if flag ~= 0 then return "malformed", "a compressed gRPC message cannot be inspected" end
      if ((b2 * 256 + b3) * 256 + b4) * 256 + b5 ~= total - 5 then
        return "malformed", "the gRPC length prefix is not the length of the body"
      end
      local ok, err, model = message(frontdoor.messages[request], total, true)
      if not ok then return "malformed", err end
      if not model or not admitted[model] then return "model" end
      return "admit"
    end

    -- The body in memory (data) or in nginx's temporary file (path).
    function frontdoor.check(data, path, request, admitted)
      local f, total = nil, data and #data
      if not data then
        if not path then return "malformed", "no request body" end
        f = io.open(path, "rb")
        if not f then return "malformed", "the request body could not be read" end
        total, data = f:seek("end"), ""
      end
      local ok, verdict, why = pcall(parse, data, f, total, request, admitted)
      if f then f:close() end
      if not ok then
        if ngx then ngx.log(ngx.ERR, "front door check failed: ", verdict) end
        return "malformed", "the request could not be read"
      end
      return verdict, why
    end

    function frontdoor.admit(request, admitted)
      ngx.req.read_body()
      local verdict, why = frontdoor.check(ngx.req.get_body_data(), ngx.req.get_body_file(), request, admitted)
      if verdict == "admit" then return end
      if verdict == "model" then return ngx.exit(403) end
      ngx.var.frontdoor_reason = why
      return ngx.exit(400)
    end
""".replace("MESSAGES", lua_messages())


_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HEADER = re.compile(r"^[a-z0-9-]{1,64}$")
INSTALL_HINT = ("apt-get install nginx-light libnginx-mod-http-lua (Debian/Ubuntu; nginx >= 1.19.5 with the http_v2 "
                "module, and the Lua module for the gRPC model check)")


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
    known = {"client_header", "default", "clients", "grpc", "grpc_model_check", "in_flight_per_client", "in_flight_total"}
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
    grpc, check = data.get("grpc", True), data.get("grpc_model_check", True)
    for key, value in (("grpc", grpc), ("grpc_model_check", check)):
        if not isinstance(value, bool):
            raise FrontDoorError(f"{source}: {key} must be true or false, not {value!r}")
    in_flight = {}
    for key in ("in_flight_per_client", "in_flight_total"):
        value = data.get(key, getattr(Quotas, key))
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100000:
            raise FrontDoorError(f"{source}: {key} must be an integer from 1 to 100000 (requests at once), not {value!r}")
        in_flight[key] = value
    if in_flight["in_flight_per_client"] > in_flight["in_flight_total"]:
        raise FrontDoorError(f"{source}: in_flight_per_client ({in_flight['in_flight_per_client']}) is over in_flight_total "
                             f"({in_flight['in_flight_total']})")
    return Quotas(header, _quota(data["default"], f"{source}: default"), clients, grpc, check, **in_flight)


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


def _lua_set(names: Sequence[str]) -> str:
    return "{" + ", ".join(f'["{n}"] = true' for n in names) + "}"


def render(quotas: Quotas, limits: Limits, ports: Ports = Ports(), *, run_dir: str = "/tmp/nginx",
           routers: Optional[Sequence[str]] = None, workers: int = 2, modules_dir: str = MODULES_DIR) -> str:
    """The nginx configuration (text). ``run_dir``: a writable directory for the pid file and
    request-body buffers (an emptyDir in the pod); ``routers``: the models admitted (default:
    :data:`ROUTERS`)."""
    routers = tuple(routers or ROUTERS)
    h = quotas.header.replace("-", "_")
    names = sorted(quotas.clients)
    lua = quotas.grpc and quotas.model_check
    router = "(" + "|".join(re.escape(r) for r in routers) + ")" if len(routers) > 1 else re.escape(routers[0])
    only = f"the {routers[0]} model" if len(routers) == 1 else f"the router models {', '.join(routers)}"
    out: List[str] = [
        "# The front door (docs/guides/front-door.md). Generated by",
        "#   orchestrator frontdoor render --out deploy/k8s/base/frontdoor/nginx.conf",
        "# from the router policy's limits.max_request_bytes and quotas.yaml: do not edit by hand",
        "# (orchestrator deploy check and tests/unit/test_frontdoor.py compare it with a fresh render).",
        f"worker_processes {workers};",
        *([f"load_module {modules_dir}/{m};" for m in LUA_MODULES] if lua else []),
        f"pid {run_dir}/nginx.pid;",
        "error_log stderr warn;",
        "daemon off;",
        "events { worker_connections 4096; }",
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
    ]
    metered = [f"limit_req zone=quota_default burst={quotas.default.burst} nodelay;"]
    for i, n in enumerate(names):
        q = quotas.clients[n]
        out += [f"  map $http_{h} $quota_key_{i} {{ default \"\"; \"{n}\" \"{n}\"; }}",
                f"  limit_req_zone $quota_key_{i} zone=quota_{i}:1m rate={q.rate}r/s;"]
        metered.append(f"limit_req zone=quota_{i} burst={q.burst} nodelay;")
    held = f"limit_conn in_flight {quotas.in_flight_per_client}; limit_conn in_flight_total {quotas.in_flight_total};"
    meter = " ".join(metered) + " " + held
    quota_text = f"quota exceeded: client $frontdoor_client ({quotas.header}) is over its quota of $frontdoor_quota (front door)"
    busy_text = (f"too many requests at once: client $frontdoor_client ({quotas.header}) is over the front door's limit of "
                 f"{quotas.in_flight_per_client} requests in flight per client ({quotas.in_flight_total} in all)")
    v = r"(/versions/[0-9]+)?"
    too_large = f"request body over the front door limit of {limits.http} bytes (2 x the router policy limits.max_request_bytes + 64 KiB)"
    out += [
        "  # A 429 is either limit: say which.",
        "  map $limit_conn_status $frontdoor_refusal {",
        f"    REJECTED \"{busy_text}\";",
        f"    default \"{quota_text}\";",
        "  }",
        "  limit_req_status 429;",
        "  limit_req_log_level warn;",
        "  limit_conn_status 429;",
        "  limit_conn_log_level warn;",
        *(["  init_by_lua_block {" + MODEL_CHECK_LUA.rstrip() + "\n  }"] if lua else []),
        "",
        "  server {",
        f"    listen {ports.listen}:{ports.http};",
        f"    client_max_body_size {limits.http};",
        "    # A control character in the decoded path (router/infer%0a) is refused, never passed on.",
        "    if ($uri ~ \"[\\x00-\\x1f\\x7f]\") { return 400; }",
        "    error_page 400 @bad_path;",
        "    error_page 429 @quota;",
        "    error_page 413 @too_large;",
        "    location @bad_path { default_type application/json; return 400 '{\"error\":\"bad request: a control character in "
        "the path, or a request nginx cannot read (front door)\"}'; }",
        "    location @quota { default_type application/json; return 429 '{\"error\":\"$frontdoor_refusal\"}'; }",
        f"    location @too_large {{ default_type application/json; return 413 '{{\"error\":\"{too_large}\"}}'; }}",
        "    location = /v2/health/live { limit_except GET { deny all; } proxy_pass http://triton_http; }",
        "    location = /v2/health/ready { limit_except GET { deny all; } proxy_pass http://triton_http; }",
        f"    location = /v2 {{ limit_except GET {{ deny all; }} {meter} proxy_pass http://triton_http; }}",
        f"    location ~ ^/v2/models/{router}{v}/ready$ {{ limit_except GET {{ deny all; }} proxy_pass http://triton_http$uri; }}",
        f"    location ~ ^/v2/models/{router}{v}$ {{ limit_except GET {{ deny all; }} {meter} proxy_pass http://triton_http$uri; }}",
        f"    location ~ ^/v2/models/{router}{v}/infer$ {{ limit_except POST {{ deny all; }} {meter} proxy_pass http://triton_http$uri; }}",
        f"    location / {{ default_type application/json; return 404 '{{\"error\":\"not admitted by the front door: only {only} (infer, metadata, ready) and server health\"}}'; }}",
        "  }",
    ]

    def _grpc_location(method: str) -> str:
        small = method != "ModelInfer"
        parts = [meter if method in GRPC_METERED else held]
        if small:
            # error_page here replaces the server's, so all of them are named again
            parts.append(f"client_max_body_size {SMALL_BODY}; {grpc_errors.replace('@too_large;', '@too_large_small;')}")
        if lua and method in GRPC_MODEL_NAMED:
            parts.append(f"access_by_lua_block {{ frontdoor.admit(\"{GRPC_REQUESTS[method]}\", {_lua_set(routers)}) }}")
        return f"    location = /{GRPC_SERVICE}/{method} {{ {' '.join(parts)} grpc_pass grpc://triton_grpc; }}"

    grpc_errors = "error_page 400 = @malformed; error_page 403 = @not_router; error_page 413 = @too_large; error_page 429 = @quota;"
    if quotas.grpc:
        out += [
            "",
            "  server {",
            f"    listen {ports.listen}:{ports.grpc} http2;",
            f"    client_max_body_size {limits.grpc};",
            "    # A client's streams on one connection: no more than it may have in flight.",
            f"    http2_max_concurrent_streams {quotas.in_flight_per_client};",
            "    set $frontdoor_reason \"the request cannot be read\";",
            f"    {grpc_errors}",
            f"    location @quota {{ {_grpc_answer(8, '$frontdoor_refusal')} }}",
            f"    location @too_large {{ {_grpc_answer(8, f'request body over the front door limit of {limits.grpc} bytes (the router policy limits.max_request_bytes + 64 KiB)')} }}",
            f"    location @too_large_small {{ {_grpc_answer(8, f'request body over the front door limit of {SMALL_BODY} bytes for a call without tensors')} }}",
            f"    location @malformed {{ {_grpc_answer(3, 'malformed request refused by the front door: $frontdoor_reason')} }}",
            f"    location @not_router {{ {_grpc_answer(7, f'not admitted by the front door: only {only}')} }}",
            *[_grpc_location(m) for m in GRPC_METERED + GRPC_UNMETERED],
            f"    location / {{ {_grpc_answer(12, 'not admitted by the front door: ' + ', '.join(GRPC_METERED + GRPC_UNMETERED) + ' only')} }}",
            "  }",
        ]
    out += [
        "",
        "  server {",
        f"    listen {ports.listen}:{ports.metrics};",
        f"    location = /metrics {{ limit_except GET {{ deny all; }} proxy_pass http://127.0.0.1:{ports.triton_metrics}; }}",
        "    location / { return 404; }",
        "  }",
        "}",
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
    """nginx and the Lua modules the shipped configuration loads are installed."""
    return nginx_binary() is not None and all(Path(MODULES_DIR, m).exists() for m in LUA_MODULES)


def check_config(text: str, binary: Optional[str] = None) -> subprocess.CompletedProcess:
    """``nginx -t`` on ``text`` (its run directory is replaced by a temporary one)."""
    binary = binary or nginx_binary()
    if binary is None:
        raise FrontDoorError(f"nginx is not installed: {INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="frontdoor-") as tmp:
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(re.sub(r"(pid|_temp_path) /tmp/nginx", rf"\1 {tmp}", text))
        return subprocess.run([binary, "-t", "-q", "-e", "stderr", "-p", tmp, "-c", str(conf)],
                              capture_output=True, text=True, timeout=60)


class FrontDoor:
    """nginx with a rendered configuration, as a child process (tests and the soak).

    Usage::

        with FrontDoor(render(quotas, limits, Ports("127.0.0.1", 9000, ...))) as door:
            ...
    """

    def __init__(self, text: str, ports: Ports, run_dir: Optional[Path] = None, binary: Optional[str] = None):
        self.binary = binary or nginx_binary()
        if self.binary is None:
            raise FrontDoorError(f"nginx is not installed: {INSTALL_HINT}")
        self.ports = ports
        self._tmp = None if run_dir else tempfile.TemporaryDirectory(prefix="frontdoor-")
        self.run_dir = Path(run_dir) if run_dir else Path(self._tmp.name)  # type: ignore[union-attr]
        self.text = re.sub(r"(pid|_temp_path) /tmp/nginx", rf"\1 {self.run_dir}", text)
        # Started as root, nginx's workers run as nobody and must reach their body buffers.
        self.run_dir.chmod(0o711)
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = self.run_dir / "nginx.log"

    def start(self, timeout: float = 15.0) -> "FrontDoor":
        conf = self.run_dir / "nginx.conf"
        conf.write_text(self.text)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "-e", "stderr", "-p", str(self.run_dir), "-c", str(conf)],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        wanted = [self.ports.http, self.ports.metrics]
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise FrontDoorError(f"nginx exited ({self.proc.returncode}): {self.log_path.read_text()[-2000:]}")
            if all(_listening(self.ports.listen, p) for p in wanted):
                return self
            time.sleep(0.05)
        self.stop()
        raise FrontDoorError(f"nginx did not listen on {wanted} within {timeout} s: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: finish what was accepted
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "FrontDoor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ThroughFrontDoor:
    """A :class:`~orchestrator.tooling.server.TritonServer` seen through a started
    :class:`FrontDoor`: ``http_url``/``grpc_url`` are the front door's, ``admin_grpc_url``
    the server's own (the admin APIs are not admitted through the door); everything else
    is the server's (``pid``, ``control_headers``, ``log_path``, ...). The soak's
    ``--front-door`` mode."""

    def __init__(self, server, door: FrontDoor):
        self._server, self.door = server, door
        host = "127.0.0.1" if door.ports.listen in ("0.0.0.0", "") else door.ports.listen
        self.http_url = f"{host}:{door.ports.http}"
        self.grpc_url = f"{host}:{door.ports.grpc}"
        self.admin_grpc_url = server.grpc_url

    def __getattr__(self, name: str):
        return getattr(self._server, name)


def start_in_front_of(server, quotas: Optional[Quotas] = None, repo: Optional[Path] = None) -> ThroughFrontDoor:
    """Start nginx on free loopback ports in front of a started ``server`` with the body
    limits of ``repo``'s router policy (default: the server's repository) and ``quotas``
    (default: one client at 100000 requests/s, i.e. no quota in the way)."""
    from orchestrator.tooling.server import find_free_ports

    http, grpc, metrics = find_free_ports(3)
    ports = Ports("127.0.0.1", http, grpc, metrics, server.http_port, server.grpc_port, server.metrics_port)
    quotas = quotas or Quotas("x-client-id", Quota(100000, 100000))
    door = FrontDoor(render(quotas, body_limits(Path(repo or server.model_repository)), ports, workers=1), ports).start()
    return ThroughFrontDoor(server, door)


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host if host not in ("0.0.0.0", "") else "127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def check_rendered(path: Path = RENDERED_FILE, quotas: Path = QUOTAS_FILE) -> List[str]:
    """Problems with the manifests' configuration (``path``, from the quotas file ``quotas``):
    differs from a fresh render, or ``nginx -t`` refuses it (not run when nginx or its Lua
    module is not installed; ``main`` says so)."""
    problems = []
    fresh = render(load_quotas(quotas), body_limits())
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


def _check_pod(pod: dict, ports: Ports = Ports(), spool: Optional[int] = None) -> List[str]:
    """What is wrong with a Deployment's pod behind the front door (messages)."""
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
    if ready != f"/v2/models/{ROUTERS[0]}/ready":
        out.append(f"frontdoor readinessProbe path {ready!r}: the first router of deploy/routers.yaml is "
                   f"/v2/models/{ROUTERS[0]}/ready")
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


def check_manifests(rendered: Dict[str, str], deploy_dir: Path = DEPLOY_DIR) -> List[Tuple[str, str]]:
    """``make deploy-check``'s front-door problems as ``(source, message)``: the configuration
    in step with the policy and quotas (and ``nginx -t``), every Deployment's pod behind it
    (Triton on loopback, the front door's ports, its ConfigMap holding the rendered
    configuration, room in its run directory for every body it may hold), and ``NO_PROXY``
    for loopback in every Triton container."""
    conf = deploy_dir / "k8s" / "base" / "frontdoor" / "nginx.conf"
    out = [("deploy/k8s/base/frontdoor", p) for p in check_rendered(conf, deploy_dir / "frontdoor" / "quotas.yaml")]
    expected = conf.read_text() if conf.exists() else None
    spool = spool_bytes(load_quotas(deploy_dir / "frontdoor" / "quotas.yaml"), body_limits())
    for rel, text in rendered.items():
        for doc in (d for d in yaml.safe_load_all(text) if isinstance(d, dict)):
            kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name", "")
            if kind == "Deployment":
                out += [(rel, f"Deployment/{name}: {m}") for m in _check_pod(doc["spec"]["template"]["spec"], spool=spool)]
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
