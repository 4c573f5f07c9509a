"""The front door's gRPC check (orchestrator/tooling/frontdoor_check.lua) run by LuaJIT
directly: what it admits, and what it costs. The check must be linear in the body and stay
within its work budget (``CHECK_BUDGET``): a body of many short strings (the parameter-map
attack: ``0a 0a "classifier"`` then 5-byte entries ``22 03 0a 01 61``) once cost a worker 20 s
at 131 KB and 82 s at 1 MiB, because each string's UTF-8 search ran to the end of the buffer.
The differential fuzz against protobuf (test_frontdoor_protobuf.py) times every body too."""

from __future__ import annotations

import struct

import pytest

from orchestrator.tooling import frontdoor as F
from tests.unit.frontdoor_lua import LUAJIT_HINT, LuaCheck, luajit

pytestmark = pytest.mark.skipif(luajit() is None, reason=f"luajit is not installed: {LUAJIT_HINT}")

#: No body within the gRPC body limit takes longer than this to check (CPU time, ms): the
#: budget's worst case measures about 17 ms on a loaded 2-core machine; the quadratic check
#: took 20,000 ms at 131 KB.
CHECK_MS = 100
ENTRY = b"\x22\x03\x0a\x01\x61"  # a parameters map entry {"a": unset}: 5 bytes, 3 tags


def frame(message: bytes) -> bytes:
    return b"\0" + struct.pack(">I", len(message)) + message


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def map_attack(size: int) -> bytes:
    """A framed ModelInferRequest of about ``size`` bytes: another model's name, then map entries."""
    head = b"\x0a\x0aclassifier"
    return frame(head + ENTRY * ((size - 5 - len(head)) // len(ENTRY)))


@pytest.fixture(scope="module")
def check():
    c = LuaCheck(["router"])
    yield c
    c.close()


@pytest.fixture(scope="module")
def unbounded():
    """The check with a budget no body reaches: its cost alone, to see it is linear."""
    c = LuaCheck(["router"], budget=10**9)
    yield c
    c.close()


def test_the_rendered_configuration_runs_this_file():
    text = F.render_default()
    assert F.CHECK_LUA_FILE.read_text() in text and f"frontdoor.budget = {F.CHECK_BUDGET}" in text
    assert F.CHECK_LUA_FILE.name in {p.name for p in F.CHECK_LUA_FILE.parent.iterdir()}


@pytest.mark.parametrize("request_type, payload, verdict, reason", [
    ("ModelReadyRequest", b"\x0a\x06router", "admit", ""),
    ("ModelReadyRequest", b"\x0a\x06router\x12\x011", "admit", ""),
    ("ModelReadyRequest", b"\x0a\x0aclassifier", "model", ""),
    ("ModelReadyRequest", b"\x0a\x06router\x0a\x0aclassifier", "malformed", "field 1 occurs twice"),
    ("ModelReadyRequest", b"\x0a\x06router\x8a\x80\x80\x80\x10\x0aclassifier", "malformed", "field 536870913 is not a field"),
    ("ModelInferRequest", b"\x0a\x06router\x1a\x02\xc3\xa9", "admit", ""),
    ("ModelInferRequest", b"\x0a\x06router\x1a\x03a\xc3\xa9", "admit", ""),
    ("ModelInferRequest", b"\x0a\x06router\x1a\x02\xc3\x28", "malformed", "field 3 is not valid UTF-8"),
    ("ModelInferRequest", b"\x0a\x06router\x1a\x01\xc3", "malformed", "field 3 is not valid UTF-8"),  # cut at the string's end
    ("ModelInferRequest", b"\x0a\x06router\x1a\x01\xc3\x12\x01\xa9", "malformed", "field 3 is not valid UTF-8"),
    ("ModelInferRequest", b"\x0a\x06router\x1a\x03\xed\xa0\x80", "malformed", "field 3 is not valid UTF-8"),  # a surrogate
    ("ModelInferRequest", b"\x0a\x06router\x1a\x04\xf4\x90\x80\x80", "malformed", "field 3 is not valid UTF-8"),  # over U+10FFFF
])
def test_verdicts(check, request_type, payload, verdict, reason):
    got, _, why = check(request_type, frame(payload))
    assert (got, why.startswith(reason)) == (verdict, True), (got, why)


def test_utf8_across_the_file_readers_chunks(check):
    """A body past nginx's in-memory buffer is read from its file in 64 KiB chunks: a
    character cut by a chunk's end is read whole, a bad one there is still refused."""
    head = 5 + 8 + 1 + 3  # frame, field 1, the tag and 3-byte length of field 3
    for at in range(65536 - 6, 65536 + 3):  # the character starts here in the body
        pad = b"a" * (at - head)
        tail = b"b" * 200_000
        good = pad + "\u4e2d".encode() + tail
        body = frame(b"\x0a\x06router\x1a" + varint(len(good)) + good)
        assert len(body) > F.BODY_BUFFER and body.index("\u4e2d".encode()) == at
        assert check("ModelInferRequest", body)[0] == "admit", at
        bad = pad + b"\xe4\xb8\x28" + tail  # the last continuation byte is not one
        verdict, _, reason = check("ModelInferRequest", frame(b"\x0a\x06router\x1a" + varint(len(bad)) + bad))
        assert (verdict, reason) == ("malformed", "field 3 is not valid UTF-8"), at
    many = "\u00e9\u4e2d\U0001f600".encode() * 30_000  # 90,000 non-ASCII characters: over the budget
    assert check("ModelInferRequest", frame(b"\x0a\x06router\x1a" + varint(len(many)) + many))[0] == "limit"


@pytest.mark.parametrize("size", [131_000, 1 << 20, F.body_limits().grpc])
def test_the_parameter_map_attack_is_refused_within_the_budget(check, size):
    body = map_attack(size)
    assert len(body) <= F.body_limits().grpc
    verdict, us, reason = check("ModelInferRequest", body, timeout=10)
    assert verdict == "limit" and f"over {F.CHECK_BUDGET} protobuf fields" in reason, (verdict, reason)
    assert us < CHECK_MS * 1000, f"{len(body)} bytes took {us / 1000:.1f} ms to check"


def test_the_check_is_linear_in_the_body(unbounded):
    """Without the budget, the same attack at 8x and 32x the size costs about 8x and 32x
    (quadratic: 64x and 1000x; the 131 KB body alone took 20 s)."""
    small = min(unbounded("ModelInferRequest", map_attack(131_000), timeout=5)[1] for _ in range(3))
    for size in (1 << 20, F.body_limits().grpc):
        verdict, us, _ = unbounded("ModelInferRequest", map_attack(size), timeout=20)
        assert verdict == "model"
        ratio = (size / 131_000)
        assert us < 2.5 * ratio * small, f"{size} bytes: {us / 1000:.0f} ms, {us / small:.1f}x the 131 KB body (linear: {ratio:.0f}x)"


@pytest.mark.parametrize("name, body", [
    ("packed varints", frame(b"\x0a\x06router\x2a" + varint(4 + 4_000_000) + b"\x1a" + varint(4_000_000) + b"\x01" * 4_000_000)),
    ("non-ASCII id", frame(b"\x0a\x06router\x1a" + varint(4_000_000) + "\u00e9".encode() * 2_000_000)),
    ("nested messages", frame(b"\x0a\x06router" + b"\x2a\x00" * 2_000_000)),
    ("ASCII strings", frame(b"\x0a\x06router" + (b"\x32\x42\x0a\x40" + b"o" * 64) * 60_000)),
])
def test_no_body_within_the_limit_takes_longer_than_the_bound(check, name, body):
    assert len(body) <= F.body_limits().grpc + 64, (name, len(body))
    verdict, us, reason = check("ModelInferRequest", body, timeout=10)
    assert us < CHECK_MS * 1000, f"{name}: {us / 1000:.1f} ms ({verdict} {reason})"


def test_describe_policy_is_refused_in_a_grpc_request(check):
    """``describe_policy`` (the policy document, 242 KB for a 767-byte request) is refused in
    the request's own parameters unless the deployment admits it; another parameter, or the
    name elsewhere (a tensor's parameter, a value), is not."""
    entry = b"\x0a\x0fdescribe_policy\x12\x02\x08\x01"  # describe_policy: bool true
    assert check("ModelInferRequest", frame(b"\x0a\x06router\x22" + varint(len(entry)) + entry))[::2] == ("parameter", "describe_policy")
    nul = b"\x0a\x11describe_policy\x00x\x12\x02\x08\x01"  # Triton passes the name on as a C string
    assert check("ModelInferRequest", frame(b"\x0a\x06router\x22" + varint(len(nul)) + nul))[::2] == ("parameter", "describe_policy")
    route = b"\x0a\x05route\x12\x06\x1a\x04fast"
    assert check("ModelInferRequest", frame(b"\x0a\x06router\x22" + varint(len(route)) + route))[0] == "admit"
    tensor = b"\x0a\x04TEXT\x12\x05BYTES\x22" + varint(len(entry)) + entry
    assert check("ModelInferRequest", frame(b"\x0a\x06router\x2a" + varint(len(tensor)) + tensor))[0] == "admit"
    assert check("ModelInferRequest", frame(b"\x0a\x06router\x1a\x0fdescribe_policy"))[0] == "admit"  # the request id
    anyone = LuaCheck([])  # no model check (grpc_model_check: false): the parameters alone
    try:
        assert anyone("ModelInferRequest", frame(b"\x0a\x0aclassifier\x22" + varint(len(entry)) + entry))[0] == "parameter"
        assert anyone("ModelInferRequest", frame(b"\x0a\x0aclassifier"))[0] == "admit"
    finally:
        anyone.close()
    admitted = LuaCheck(["router"], refused=())
    try:
        assert admitted("ModelInferRequest", frame(b"\x0a\x06router\x22" + varint(len(entry)) + entry))[0] == "admit"
    finally:
        admitted.close()


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64, 65536])
@pytest.mark.parametrize("body, verdict", [
    (b'{"inputs":[],"parameters":{"describe_policy":true}}', "parameter"),
    (b'{"parameters":{"describe\\u005fpolicy":true}}', "parameter"),
    (b'{"parameters":{"\\u0064\\u0065scribe_policy":true}}', "parameter"),
    (b'{"parameters":{"describe\\/policy":true}}', "admit"),
    (b'{"parameters":{"describe_policy\\u0000x":true}}', "parameter"),  # Triton reads the name as a C string
    (b'{"parameters":{"describe_policy\\u00e9":true}}', "admit"),
    (b'{"parameters":{"route":"describe_polic"}}', "admit"),
    (b'{"inputs":[{"data":["a \\"describe_policy\\" b"]}]}', "admit"),  # inside a text
    (b'{"inputs":[{"data":["\\\\", "describe_policy"]}]}', "parameter"),  # after an escaped backslash
    (b'{"inputs":[{"data":["' + b"x" * 500 + b'\\\\"], "parameters":{"describe_policy":1}}]}', "parameter"),
    (b'{"inputs":[{"data":["' + b"x" * 500 + b'\\"describe_policy"]}]}', "admit"),  # a long text's escaped quote
    (b'{"inputs":[{"data":["' + b"\\\\" * 300 + b'"]}],"parameters":{"describe_policy":true}}', "parameter"),
])
def test_describe_policy_is_refused_in_http_json_however_it_is_written(check, piece, body, verdict):
    """The HTTP check decodes every JSON string short enough to be the name (escapes included)
    and finds a long string's end through any run of backslashes, wherever nginx's pieces cut it."""
    assert check(f"JSON:{piece}", body)[0] == verdict


def test_the_http_check_is_linear_and_bounded(check):
    texts = [b'"' + "\u4e2d".encode("unicode_escape").replace(b"\\u", b"\\u") * 10_000 + b'"'] * 60
    body = b'{"inputs":[{"name":"TEXT","data":[' + b",".join(texts) + b"]}]}"
    verdict, us, _ = check("JSON:65536", body)
    assert verdict == "admit" and us < CHECK_MS * 1000, (verdict, us)
    many = b'{"inputs":[{"data":[' + b'"",' * 2_800_000 + b'""]}]}'
    verdict, us, reason = check("JSON:65536", many)
    assert verdict == "limit" and us < CHECK_MS * 1000, (verdict, us)
    quotes = b'{"inputs":[{"data":["' + b"x" * 500 + b'\\"' * 4_000_000 + b'"]}]}'
    verdict, us, reason = check("JSON:65536", quotes)
    assert verdict == "limit" and us < CHECK_MS * 1000, (verdict, us)
