"""Model control from inside the router: what the hosting server allows, and load/unload
requests sent through its own HTTP repository API.

Why not ``pb_utils.load_model``: in Triton 2.51 (python_backend r24.10) that call holds the
stub's Python GIL until the load is done (``load_model`` is bound without releasing it), so
the whole router stops answering for the load's duration (measured here: about 2 s for a
classifier), and a load that fails can abort the server (see :class:`ServerOptions`). A
POST to ``/v2/repository/models/<name>/load`` on the server's own HTTP endpoint (loopback)
does the same load without either problem; ``pb_utils`` is the fallback when the command
line shows no usable HTTP endpoint.
"""

from __future__ import annotations

import json
import os
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
        http = None
        if flags.get("--allow-http", "true").lower() not in ("false", "0", "no"):
            host = flags.get("--http-address", "0.0.0.0")
            try:
                http = ("127.0.0.1" if host in _ANY_ADDRESS else host, int(flags.get("--http-port", "8000")))
            except ValueError:
                http = None
        return cls(mode, local, http, _restricted_header(flags.get("--http-restricted-api", "")))

    @classmethod
    def of_parent(cls) -> "ServerOptions":
        """Options of this process's parent when it is ``tritonserver`` (Linux ``/proc``);
        empty options (all unknown) otherwise, e.g. under the in-process mock."""
        proc = Path("/proc") / str(os.getppid())
        try:
            argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            if not argv or not Path(argv[0]).name.startswith("tritonserver"):
                return cls()
            return cls.parse(argv, Path(os.readlink(proc / "cwd")))
        except (OSError, UnicodeDecodeError):
            return cls()

    def missing(self, model: str) -> Optional[str]:
        """Why loading ``model`` must fail, when the local repositories show it; else None."""
        if self.repositories is None or any((r / model).is_dir() for r in self.repositories):
            return None
        return f"model '{model}' is in no model repository ({', '.join(map(str, self.repositories))})"


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
    """Load and unload models through the server's HTTP repository API, else ``pb_utils``.

    Args:
        pb: ``triton_python_backend_utils`` (the fallback).
        server: the hosting server's options.
        timeout_s: seconds to wait for one load or unload (default 300).
    """

    def __init__(self, pb, server: ServerOptions, timeout_s: float = 300.0):
        self.pb, self.server, self.timeout_s = pb, server, timeout_s

    @property
    def via(self) -> str:
        """``http`` or ``pb_utils``: how requests are sent."""
        return "http" if self.server.http else "pb_utils"

    def load(self, model: str) -> None:
        """Load (or reload, when loaded) ``model``; blocks until done.

        Raises:
            ControlError: the server refused or the load failed.
        """
        if self.server.http:
            self._post(model, "load", {})
            return
        try:
            self.pb.load_model(model_name=model)
        except Exception as exc:  # the stub raises TritonModelException
            raise ControlError(str(exc)) from None

    def unload(self, model: str) -> None:
        """Unload ``model`` (not its dependents).

        Raises:
            ControlError: the server refused.
        """
        if self.server.http:
            self._post(model, "unload", {"parameters": {"unload_dependents": False}})
            return
        try:
            self.pb.unload_model(model_name=model)
        except Exception as exc:
            raise ControlError(str(exc)) from None

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
