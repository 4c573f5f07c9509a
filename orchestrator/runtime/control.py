"""Model control from inside the router: what the hosting server allows, and load/unload
requests sent through its own repository API, over gRPC where it can, else HTTP.

Why not ``pb_utils.load_model``: in Triton 2.51 (python_backend r24.10) that call holds the
stub's Python GIL until the load is done (``load_model`` is bound without releasing it), so
the whole router stops answering for the load's duration (measured here: about 2 s for a
classifier), and a load that fails can abort the server (see :class:`ServerOptions`). A
POST to ``/v2/repository/models/<name>/load`` on the server's own HTTP endpoint (loopback)
does the same load without either problem; ``pb_utils`` is the fallback when the command
line shows no usable endpoint.

Why gRPC first: Triton 2.51 works an HTTP load off on the HTTP worker thread that received
it, and HTTP inference requests on the connections that thread serves wait until the load
is done (measured here: 2 and 4 of 4 HTTP client connections waited a 1.6-1.7 s repair; no
gRPC one did; docs/reliability.md). A load over gRPC keeps clients of both protocols
answering. It needs ``tritonclient[grpc]`` in the stub's environment; without it the
router uses HTTP.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

_ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True)
class ServerOptions:
    """What the hosting ``tritonserver``'s command line says about model control.

    Attributes:
        mode: the ``--model-control-mode`` value (``none`` when the flag is absent, as in
            Triton), or None when the command line could not be read.
        repositories: the ``--model-repository``/``--model-store`` paths, absolute, or None
            when unknown or when any of them is not a local path (``s3://``, ``gs://``).
        http: ``(host, port)`` of the server's HTTP endpoint as seen from this machine
            (``--http-address``, ``--http-port``, default port 8000; a wildcard address
            becomes 127.0.0.1), or None when HTTP is off (``--allow-http=false``) or the
            command line is unknown.
        http_header: ``(key, value)`` the server requires on model-repository requests
            (``--http-restricted-api=model-repository:<key>=<value>``), or None.
        grpc: ``(host, port)`` of the server's gRPC endpoint (``--grpc-address``,
            ``--grpc-port``, default port 8001; a wildcard address becomes 127.0.0.1), or
            None when gRPC is off (``--allow-grpc=false``) or the command line is unknown.
        grpc_header: ``(key, value)`` for ``--grpc-restricted-protocol=model-repository:<key>=<value>``,
            or None.

    Why the router reads them: in Triton 2.51 (python_backend ``ProcessMessage``) a
    ``pb_utils.load_model`` that fails frees the error text in shared memory before the
    stub reads it; the stub then frees it again, the shared-memory allocator is corrupted
    and the server aborts (``boost::interprocess::lock_exception``). A refused load in
    ``--model-control-mode=none`` and a load of a model that is in no repository are
    failures known in advance, so the router does not ask for them. docs/deployment.md
    has the details and the reproduction.
    """

    mode: Optional[str] = None
    repositories: Optional[tuple] = None
    http: Optional[Tuple[str, int]] = None
    http_header: Optional[Tuple[str, str]] = None
    grpc: Optional[Tuple[str, int]] = None
    grpc_header: Optional[Tuple[str, str]] = None

    @classmethod
    def parse(cls, argv: Sequence[str], cwd: Path) -> "ServerOptions":
        """Options from ``tritonserver`` arguments (``--flag=value`` or ``--flag value``;
        the last occurrence of a flag wins, as in Triton)."""
        mode, repositories, flags = "none", [], {}
        args = list(argv[1:])
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            if flag in ("--model-repository", "--model-store"):
                repositories.append(value)
            elif flag.startswith("--"):
                flags[flag] = value.strip()
        mode = flags.get("--model-control-mode", mode).lower()
        local = None
        if repositories and not any("://" in r for r in repositories):
            local = tuple((cwd / r).resolve() for r in repositories)
        return cls(mode, local,
                   _endpoint(flags, "http", 8000), _restricted_header(flags.get("--http-restricted-api", "")),
                   _endpoint(flags, "grpc", 8001), _restricted_header(flags.get("--grpc-restricted-protocol", "")))

    @classmethod
    def of_parent(cls) -> "ServerOptions":
        """Options of this process's parent when it is ``tritonserver`` (Linux ``/proc``);
        empty options (all unknown) otherwise, e.g. under the in-process mock."""
        argv = parent_server_argv()
        if argv is None:
            return cls()
        try:
            return cls.parse(argv, Path(os.readlink(Path("/proc") / str(os.getppid()) / "cwd")))
        except OSError:
            return cls()

    def missing(self, model: str) -> Optional[str]:
        """Why loading ``model`` must fail, when the local repositories show it; else None."""
        if self.repositories is None or any((r / model).is_dir() for r in self.repositories):
            return None
        return f"model '{model}' is in no model repository ({', '.join(map(str, self.repositories))})"


def parent_server_argv() -> Optional[list]:
    """The command line of this process's parent when it is ``tritonserver`` (Linux
    ``/proc/<ppid>/cmdline``), else None (the in-process mock, another OS)."""
    try:
        raw = (Path("/proc") / str(os.getppid()) / "cmdline").read_bytes()
        argv = [a.decode() for a in raw.split(b"\0") if a]
    except (OSError, UnicodeDecodeError):
        return None
    return argv if argv and Path(argv[0]).name.startswith("tritonserver") else None


def _endpoint(flags: dict, protocol: str, default_port: int) -> Optional[Tuple[str, int]]:
    """``(host, port)`` of the ``http`` or ``grpc`` endpoint from ``--allow-<p>``,
    ``--<p>-address`` and ``--<p>-port`` (Triton's defaults), or None when it is off."""
    if flags.get(f"--allow-{protocol}", "true").lower() in ("false", "0", "no"):
        return None
    host = flags.get(f"--{protocol}-address", "0.0.0.0")
    try:
        return ("127.0.0.1" if host in _ANY_ADDRESS else host, int(flags.get(f"--{protocol}-port", str(default_port))))
    except ValueError:
        return None


@functools.lru_cache(maxsize=1)
def _grpc_client():
    """``tritonclient.grpc`` when the stub's environment has it, else None (imported once)."""
    try:
        import tritonclient.grpc as module
    except ImportError:
        return None
    return module


def _restricted_header(value: str) -> Optional[Tuple[str, str]]:
    """``(key, value)`` from ``<apis>:<key>=<value>`` when the apis include model-repository."""
    apis, _, header = value.partition(":")
    key, eq, val = header.partition("=")
    if eq and "model-repository" in [a.strip() for a in apis.split(",")]:
        return key.strip(), val.strip()
    return None


class ControlError(RuntimeError):
    """A load or unload request failed; the message is the server's."""


class RepositoryControl:
    """Load and unload models through the server's repository API: over gRPC when the server
    has a gRPC endpoint and the stub's environment has ``tritonclient[grpc]``, else over
    HTTP, else through ``pb_utils`` (see the module docstring for why in this order).

    Args:
        pb: ``triton_python_backend_utils`` (the last resort).
        server: the hosting server's options.
        timeout_s: seconds to wait for one load or unload (default 300).
    """

    def __init__(self, pb, server: ServerOptions, timeout_s: float = 300.0):
        self.pb, self.server, self.timeout_s = pb, server, timeout_s
        if server.grpc and server.mode == "explicit":  # import now (0.1-0.3 s), not in the first repair
            threading.Thread(target=_grpc_client, name="orchestrator-grpc-import", daemon=True).start()

    @property
    def via(self) -> str:
        """``grpc``, ``http`` or ``pb_utils``: how requests are sent."""
        if self.server.grpc and _grpc_client() is not None:
            return "grpc"
        return "http" if self.server.http else "pb_utils"

    def load(self, model: str) -> None:
        """Load (or reload, when loaded) ``model``; blocks until done.

        Raises:
            ControlError: the server refused or the load failed.
        """
        self._send(model, "load")

    def unload(self, model: str) -> None:
        """Unload ``model`` (not its dependents).

        Raises:
            ControlError: the server refused.
        """
        self._send(model, "unload")

    def _send(self, model: str, action: str) -> None:
        via = self.via
        if via == "grpc":
            self._grpc(model, action)
        elif via == "http":
            self._post(model, action, {} if action == "load" else {"parameters": {"unload_dependents": False}})
        else:
            try:
                getattr(self.pb, f"{action}_model")(model_name=model)
            except Exception as exc:  # the stub raises TritonModelException
                raise ControlError(str(exc)) from None

    def _grpc(self, model: str, action: str) -> None:
        tc = _grpc_client()
        host, port = self.server.grpc
        headers = dict([self.server.grpc_header]) if self.server.grpc_header else None
        client = tc.InferenceServerClient(f"{host}:{port}")
        try:
            if action == "load":
                client.load_model(model, headers=headers, client_timeout=self.timeout_s)
            else:
                client.unload_model(model, headers=headers, unload_dependents=False, client_timeout=self.timeout_s)
        except tc.InferenceServerException as exc:
            if exc.status() == "StatusCode.UNAVAILABLE":
                raise ControlError(f"the server's gRPC endpoint {host}:{port} did not answer: {exc.message()}") from None
            raise ControlError(exc.message()) from None
        finally:
            client.close()

    def _post(self, model: str, action: str, body: dict) -> None:
        host, port = self.server.http
        url = f"http://{host}:{port}/v2/repository/models/{urllib.parse.quote(model, safe='')}/{action}"
        headers = {"Content-Type": "application/json"}
        if self.server.http_header:
            headers[self.server.http_header[0]] = self.server.http_header[1]
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            try:
                text = json.loads(text).get("error", text)
            except ValueError:
                pass
            raise ControlError(text or f"HTTP {exc.code}") from None
        except OSError as exc:
            raise ControlError(f"the server's HTTP endpoint {host}:{port} did not answer: {exc}") from None
