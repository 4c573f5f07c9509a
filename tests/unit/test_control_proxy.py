"""The router's admin gRPC channel never goes through an HTTP CONNECT proxy.

A pod with ``https_proxy`` set (a cluster-wide egress proxy) made gRPC core tunnel the
admin channel, key included, through that proxy: every on-demand load and repair then
failed. A loopback listener stands in for the proxy and records what reaches it.
"""

from __future__ import annotations

import socket
import threading

import pytest

from orchestrator.runtime.bls import control
from orchestrator.runtime.bls.control import RepositoryControl, ServerOptions
from orchestrator.runtime.errors import ControlError

pytest.importorskip("tritonclient.grpc")


class FakeProxy:
    """A loopback TCP listener that records the first bytes of every connection (a CONNECT
    request when a client uses it as a proxy) and then closes it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.seen.append(conn.recv(4096))
                except OSError:
                    self.seen.append(b"")

    def close(self) -> None:
        self.sock.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def proxy(monkeypatch):
    fake = FakeProxy()
    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "grpc_proxy"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{fake.port}")
    for var in ("no_proxy", "NO_PROXY", "no_grpc_proxy"):
        monkeypatch.delenv(var, raising=False)
    yield fake
    fake.close()


def _config_over_grpc(port: int, channel_args) -> None:
    import tritonclient.grpc as tc

    client = tc.InferenceServerClient(f"127.0.0.1:{port}", channel_args=channel_args)
    try:
        client.get_model_config("router", client_timeout=3)
    except tc.InferenceServerException:
        pass
    finally:
        client.close()


def test_the_fake_proxy_sees_a_default_channel(proxy):
    """The check below can fail: a channel with gRPC's default options goes to the proxy."""
    _config_over_grpc(_closed_port(), None)
    assert any(b.startswith(b"CONNECT 127.0.0.1:") for b in proxy.seen), proxy.seen


def test_admin_channel_bypasses_the_proxy(proxy):
    port = _closed_port()
    ctl = RepositoryControl(pb=None, server=ServerOptions("explicit", None, None, ("127.0.0.1", port)), timeout_s=3)
    assert ctl.via == "grpc"
    with pytest.raises(ControlError, match=f"127.0.0.1:{port} did not answer"):
        ctl.load("classifier")
    assert proxy.seen == [], "the admin channel went to the proxy"
    assert ("grpc.enable_http_proxy", 0) in control.CHANNEL_ARGS
