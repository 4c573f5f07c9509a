"""The front door as a child process: nginx started with a rendered configuration
(:class:`FrontDoor`) in front of a started Triton (:func:`start_in_front_of`), for the tests,
the soak's ``--front-door`` mode and the lab's measurements. The configuration itself, its
checks and the CLI are :mod:`orchestrator.tooling.frontdoor`."""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from orchestrator.tooling.frontdoor import (
    INSTALL_HINT,
    FrontDoorError,
    Ports,
    Quota,
    Quotas,
    _in_run_dir,
    body_limits,
    nginx_binary,
    render,
)


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
        self.text = _in_run_dir(text, str(self.run_dir))
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
