"""The front door's gRPC check against protobuf itself (a differential test).

The check (orchestrator/tooling/frontdoor_check.lua, :func:`~orchestrator.tooling.frontdoor.model_check_lua`)
runs twice: in the real nginx, in its access phase as in the shipped configuration
(``frontdoor.admit``), on bodies posted over HTTP/1.1 (the check reads only the body); and
in LuaJIT directly (tests/unit/frontdoor_lua.py), which also times every check: none may
take longer than ``CHECK_MS`` of CPU. Each body is also parsed by Python's ``protobuf`` with
the request messages of Triton's ``grpc_service.proto`` that ``tritonclient`` ships. Over
more than 10,000 generated and mutated bodies per run (seeded): whenever the check admits a
body, protobuf parses it and reads its model name as an admitted router; and every request
that protobuf itself serializes for an admitted router (the bytes a gRPC client sends) is
admitted. Bodies over nginx's in-memory buffer exercise the check's file reader.
"""

from __future__ import annotations

import http.client
import random
import struct
from typing import Callable, List, Tuple

import pytest
from google.protobuf.message import DecodeError  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from orchestrator.tooling import frontdoor as F
from orchestrator.tooling import frontdoor_nginx as N
from tests.unit.frontdoor_lua import LUAJIT_HINT, LuaCheck, luajit  # noqa: E402
from tests.unit.test_frontdoor_lua import CHECK_MS  # noqa: E402

ROUTERS = ("router", "other-router")
OTHERS = ("classifier", "ensemble", "tokenizer", "", "Router", "router ", "routerx", "rout", "r\u00e9")
REQUESTS = {"ModelInferRequest": pb.ModelInferRequest, "ModelMetadataRequest": pb.ModelMetadataRequest,
            "ModelReadyRequest": pb.ModelReadyRequest}
#: The bypass the strict parser closes: field 1 = router, then field 1 again behind a 5-byte
#: tag whose value is 2^32 + 10 (protobuf reads a tag as 32 bits, the old check as 64).
BYPASS = b"\x0a\x06router" + b"\x8a\x80\x80\x80\x10" + b"\x0aclassifier"
ROUNDS = 10500


def frame(message: bytes, flag: int = 0, length: int | None = None) -> bytes:
    return bytes([flag]) + struct.pack(">I", len(message) if length is None else length) + message


def varint(value: int, width: int = 0) -> bytes:
    """``value`` as a varint, padded with continuation bytes to ``width`` bytes (non-minimal)."""
    out = bytearray()
    while True:
        out.append(value & 0x7F | 0x80)
        value >>= 7
        if not value:
            break
    while len(out) < width:
        out.append(0x80)
    out[-1] &= 0x7F
    return bytes(out)


def field(number: int, wire: int, payload: bytes = b"", tag: bytes | None = None) -> bytes:
    key = tag if tag is not None else varint(number << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


@pytest.fixture(scope="module", params=["nginx", "luajit"])
def checker(request):
    """``check(request, body) -> 'admit' | 'model' | 'malformed'`` through the real nginx, or
    in LuaJIT (then ``check.slowest`` is the longest check's CPU time, microseconds)."""
    if request.param == "luajit":
        if luajit() is None:
            pytest.skip(f"luajit is not installed: {LUAJIT_HINT}")
        lua = LuaCheck(ROUTERS)

        def check_lua(request_type: str, body: bytes) -> str:
            verdict, us, _ = lua(request_type, body)
            check_lua.slowest = max(check_lua.slowest, us)  # type: ignore[attr-defined]
            return verdict

        check_lua.slowest = 0  # type: ignore[attr-defined]
        yield check_lua
        lua.close()
        return
    if not F.nginx_ready():
        pytest.skip(f"nginx or its Lua module is not installed: {F.INSTALL_HINT}")
    from orchestrator.tooling.server import find_free_ports

    (port,) = find_free_ports(1)
    admitted = F._lua_set(ROUTERS)
    text = "\n".join([
        *[f"load_module {F.MODULES_DIR}/{m};" for m in F.LUA_MODULES], "worker_processes 1;",
        "daemon off; pid /tmp/nginx/nginx.pid; error_log stderr error;", "events {}",
        f"http {{ access_log off; client_body_temp_path /tmp/nginx/body; client_body_buffer_size {F.BODY_BUFFER};",
        "  client_max_body_size 16m; keepalive_requests 1000000;",
        "  init_by_lua_block {" + F.model_check_lua() + "}",
        f"  server {{ listen 127.0.0.1:{port}; set $frontdoor_reason \"\";",
        "    location ~ ^/(\\w+)$ { access_by_lua_block { frontdoor.admit(ngx.var[1], " + admitted + ") }",
        "      content_by_lua_block { ngx.print('admitted') } } } }",
    ])
    # FrontDoor moves /tmp/nginx to its own run directory, one nginx's workers can reach.
    door = N.FrontDoor(text, F.Ports("127.0.0.1", port, 0, port)).start()
    conn = [http.client.HTTPConnection("127.0.0.1", port, timeout=30)]

    def check(request: str, body: bytes) -> str:
        for attempt in (0, 1):
            try:
                conn[0].request("POST", f"/{request}", body=body)
                response = conn[0].getresponse()
                response.read()
                break
            except (http.client.HTTPException, OSError):
                conn[0].close()
                conn[0] = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                if attempt:
                    raise
        return {200: "admit", 403: "model", 400: "malformed", 422: "limit"}[response.status]

    yield check
    conn[0].close()
    door.stop()


def parsed_name(request: str, body: bytes) -> str | None:
    """The model name protobuf reads from a framed body, None where it refuses it."""
    message = REQUESTS[request]()
    try:
        message.ParseFromString(body[5:])
    except DecodeError:
        return None
    return message.model_name if request == "ModelInferRequest" else message.name


def _text(rng: random.Random, limit: int = 12) -> str:
    return "".join(rng.choice("abcXYZ09_- \u00e9\u4e2d\U0001f600") for _ in range(rng.randrange(limit)))


def _parameters(rng: random.Random, target) -> None:
    for _ in range(rng.randrange(3)):
        p = target[_text(rng, 6)]
        choice = rng.randrange(5)
        if choice == 0:
            p.bool_param = rng.random() < 0.5
        elif choice == 1:
            p.int64_param = rng.randrange(-2**63, 2**63)
        elif choice == 2:
            p.string_param = _text(rng)
        elif choice == 3:
            p.double_param = rng.uniform(-1e9, 1e9)
        else:
            p.uint64_param = rng.randrange(2**64)


def random_request(rng: random.Random, request: str, name: str, big: bool = False) -> bytes:
    """A request protobuf serializes, with random contents in every field the check reads."""
    if request != "ModelInferRequest":
        return REQUESTS[request](name=name, version=rng.choice(["", "1", "7"])).SerializeToString()
    m = pb.ModelInferRequest(model_name=name, model_version=rng.choice(["", "1"]), id=_text(rng))
    _parameters(rng, m.parameters)
    for _ in range(rng.randrange(3)):
        t = m.inputs.add(name=rng.choice(["TEXT", "THRESHOLD", "classifier", _text(rng)]), datatype=rng.choice(["BYTES", "FP32"]))
        t.shape.extend(rng.randrange(-2, 70) for _ in range(rng.randrange(3)))
        _parameters(rng, t.parameters)
        if rng.random() < 0.4:
            c = t.contents
            c.bool_contents.extend(rng.random() < 0.5 for _ in range(rng.randrange(3)))
            c.int_contents.extend(rng.randrange(-2**31, 2**31) for _ in range(rng.randrange(3)))
            c.int64_contents.extend(rng.randrange(-2**63, 2**63) for _ in range(rng.randrange(3)))
            c.uint_contents.extend(rng.randrange(2**32) for _ in range(rng.randrange(3)))
            c.uint64_contents.extend(rng.randrange(2**64) for _ in range(rng.randrange(3)))
            c.fp32_contents.extend(rng.uniform(-1, 1) for _ in range(rng.randrange(3)))
            c.fp64_contents.extend(rng.uniform(-1, 1) for _ in range(rng.randrange(3)))
            c.bytes_contents.extend(rng.randbytes(rng.randrange(8)) for _ in range(rng.randrange(3)))
    for _ in range(rng.randrange(3)):
        o = m.outputs.add(name=rng.choice(["LABELS", "PROBABILITIES", _text(rng)]))
        _parameters(rng, o.parameters)
    size = rng.randrange(200_000, 600_000) if big else rng.randrange(64)
    for _ in range(rng.randrange(1, 3) if big else rng.randrange(3)):
        m.raw_input_contents.append(rng.randbytes(size))
    return m.SerializeToString()


def _hidden_name(rng: random.Random) -> bytes:
    """Field 1 = another model behind a tag protobuf and a lax reader could read apart: over-long,
    non-minimal, or with bits at and above 2^32."""
    width = rng.randrange(2, 11)
    value = (1 << 3 | 2) + (rng.randrange(1, 2**(7 * width - 32)) << 32 if width >= 5 and rng.random() < 0.6 else 0)
    return field(1, 2, rng.choice(OTHERS).encode(), tag=varint(value, width))


MUTATIONS: List[Callable[[random.Random, bytes], bytes]] = [
    lambda rng, b: b + _hidden_name(rng),
    lambda rng, b: _hidden_name(rng) + b,
    lambda rng, b: b + field(1, 2, rng.choice(OTHERS + ROUTERS).encode()),  # a second model name
    lambda rng, b: b + field(2, 2, b"1") + field(2, 2, b"2"),  # a repeated model_version
    lambda rng, b: b + field(rng.randrange(8, 2**29), rng.choice([0, 1, 2, 5]), rng.randbytes(rng.choice([0, 4, 8, 3]))),
    lambda rng, b: b + field(rng.randrange(1, 8), rng.choice([3, 4, 6, 7])),  # groups and wire types that do not exist
    lambda rng, b: b + field(rng.randrange(1, 8), rng.randrange(8), field(1, 2, b"classifier")),  # a nested field 1
    lambda rng, b: b + varint(rng.randrange(2**35)) + rng.randbytes(rng.randrange(12)),  # any tag at all
    lambda rng, b: b + varint(0) + b"\x0aclassifier",  # field number 0
    lambda rng, b: b[:rng.randrange(len(b) + 1)],  # truncated
    lambda rng, b: b[: (i := rng.randrange(len(b) + 1))] + bytes([rng.randrange(256)]) + b[i + 1:],  # one byte changed
    lambda rng, b: b[: (i := rng.randrange(len(b) + 1))] + rng.randbytes(rng.randrange(1, 4)) + b[i:],  # bytes inserted
    lambda rng, b: b[: (i := rng.randrange(len(b) + 1))] + b[i + rng.randrange(1, 6):],  # bytes deleted
    lambda rng, b: bytes([b[0] ^ rng.choice([1, 2, 3, 4, 5, 6, 7])]) + b[1:] if b else b,  # the first tag's wire type
    lambda rng, b: varint(b[0], rng.randrange(2, 6)) + b[1:] if b and b[0] < 128 else b,  # the first tag non-minimal
    lambda rng, b: b[:1] + varint(b[1], rng.randrange(2, 6)) + b[2:] if len(b) > 1 and b[1] < 128 else b,  # a length non-minimal
    lambda rng, b: b[:1] + bytes([min(255, b[1] + rng.randrange(1, 4))]) + b[2:] if len(b) > 1 else b,  # a length past its data
    lambda rng, b: b + field(4, 2, field(1, 2, b"k") + field(2, 2, field(1, 0, b"\x02"))),  # a bool of 2
    lambda rng, b: b + field(4, 2, field(1, 2, b"k") + field(2, 2, field(1, 0, b"\x01") + field(3, 2, b"x"))),  # two oneof fields
    lambda rng, b: b + field(3, 2, rng.choice([b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", b"\xf4\x90\x80\x80", b"\xe2\x82"])),  # bad UTF-8
    lambda rng, b: b + field(5, 2, field(3, 2, varint(5) + b"\x80\x00")),  # a packed varint non-minimal
    lambda rng, b: b + field(5, 2, field(5, 2, field(6, 2, b"\0\0\0"))),  # packed floats not whole
]


def bodies(rng: random.Random) -> List[Tuple[str, bytes]]:
    out: List[Tuple[str, bytes]] = []
    for i in range(ROUNDS):
        request = rng.choice(list(REQUESTS))
        name = rng.choice(ROUTERS if rng.random() < 0.5 else OTHERS)
        payload = random_request(rng, request, name, big=i % 400 == 0)
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            payload = rng.choice(MUTATIONS)(rng, payload)
        if rng.random() < 0.03:
            out.append((request, frame(payload, flag=rng.choice([0, 1]), length=max(0, len(payload) + rng.choice([-1, 1, 0])))))
        else:
            out.append((request, frame(payload)))
    return out


def test_a_body_the_check_admits_is_an_admitted_router_to_protobuf(checker):
    rng = random.Random(20261127)
    verdicts = {"admit": 0, "model": 0, "malformed": 0}
    for request, body in bodies(rng):
        verdict = checker(request, body)
        verdicts[verdict] += 1
        if verdict == "admit":
            assert parsed_name(request, body) in ROUTERS, (request, body[:200])
    assert sum(verdicts.values()) >= 10_000
    # every kind of answer was reached, so the run was not trivially one-sided
    assert min(verdicts.values()) > 500, verdicts
    slowest = getattr(checker, "slowest", None)  # timed in LuaJIT only
    assert slowest is None or slowest < CHECK_MS * 1000, f"a body took {slowest / 1000:.1f} ms to check"


def test_every_request_protobuf_serializes_for_a_router_is_admitted(checker):
    rng = random.Random(7)
    for i in range(1500):
        request = rng.choice(list(REQUESTS))
        body = frame(random_request(rng, request, rng.choice(ROUTERS), big=i % 300 == 0))
        assert checker(request, body) == "admit", (request, body[:200])
        other = frame(random_request(rng, request, rng.choice(OTHERS)))
        assert checker(request, other) == "model", (request, other[:200])


@pytest.mark.parametrize("payload", [
    BYPASS,
    b"\x0a\x06router" + b"\x8a\x80\x80\x80\x80\x80\x80\x80\x80\x00" + b"\x0aclassifier",  # a 10-byte tag
    b"\x0a\x06router" + b"\x8a\x80\x80\x80\x10\x0aclassifier\x0a\x06router",  # hidden in the middle
    b"\x0a\x06router" + b"\x8a\x00\x0aclassifier",  # a 2-byte tag for field 1
    b"\x0a\x06router" + b"\x0a\x0aclassifier",  # a duplicate model_name
    b"\x8a\x80\x80\x80\x10\x0aclassifier" + b"\x0a\x06router",
    b"\x0a\x06router" + b"\xfa\x01\x0c" + b"\x0a\x0aclassifier",  # field 1 inside an unknown field 31
    b"\x0a\x06router" + b"\x0b\x0a\x0aclassifier\x0c",  # field 1 inside a group
    b"\x0a\x86\x00router",  # a non-minimal length
])
@pytest.mark.parametrize("request_type", list(REQUESTS))
def test_the_bypass_family_is_refused(checker, request_type, payload):
    assert checker(request_type, frame(payload)) == "malformed"


def test_bodies_kept_in_a_file_are_read_whole(checker):
    """A name hidden past nginx's in-memory buffer, in a body nginx kept in a file."""
    m = pb.ModelInferRequest(model_name="router", raw_input_contents=[b"x" * (3 * F.BODY_BUFFER)])
    assert checker("ModelInferRequest", frame(m.SerializeToString())) == "admit"
    assert checker("ModelInferRequest", frame(m.SerializeToString() + BYPASS[8:])) == "malformed"
    assert checker("ModelInferRequest", frame(m.SerializeToString() + field(1, 2, b"classifier"))) == "malformed"
    m.id = "\u00e9" * 40_000  # a string across the file reader's 64 KiB chunks, checked as UTF-8 (within the budget)
    assert checker("ModelInferRequest", frame(m.SerializeToString())) == "admit"
