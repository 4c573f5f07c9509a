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
gRPC one did; docs/guides/reliability.md). A load over gRPC keeps clients of both protocols
answering. It needs ``tritonclient[grpc]`` in the stub's environment; without it the
router uses HTTP.

A restricted control plane (``--grpc-restricted-protocol`` / ``--http-restricted-api``,
every flag, each ``<group>[,<group>...]:<key>=<value>``): each request carries the key of
the group it calls, as ``triton-grpc-protocol-<key>`` over gRPC (Triton's prefix) and as
``<key>`` over HTTP; a refusal raises :class:`ControlError` with ``refused`` set.

Why :meth:`RepositoryControl.reload` and not a load: Triton (2.51 and through r26.06)
skips a load of a loaded model whose files did not change, and applies a configuration
that differs only in its instance groups in place; only a configuration that differs
elsewhere makes it load new instances (core ``ConfigChangeRequiresReload``).
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

from orchestrator.runtime.errors import ControlError

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
        grpc: ``(host, port)`` of the server's gRPC endpoint (``--grpc-address``,
            ``--grpc-port``, default port 8001; a wildcard address becomes 127.0.0.1), or
            None when gRPC is off (``--allow-grpc=false``) or the command line is unknown.
        http_restricted: ``(group, header, value)`` for every API group of every
            ``--http-restricted-api=<group>[,<group>...]:<key>=<value>`` flag: an HTTP
            request to that group must carry the header ``<key>: <value>``.
        grpc_restricted: the same for ``--grpc-restricted-protocol``; the header is the
            gRPC metadata key ``triton-grpc-protocol-<key>`` (Triton adds the prefix).

    Why the router reads them: in Triton 2.51 (python_backend ``ProcessMessage``) a
    ``pb_utils.load_model`` that fails frees the error text in shared memory before the
    stub reads it; the stub then frees it again, the shared-memory allocator is corrupted
    and the server aborts (``boost::interprocess::lock_exception``). A refused load in
    ``--model-control-mode=none`` and a load of a model that is in no repository are
    failures known in advance, so the router does not ask for them. docs/guides/env-and-stub.md
    has the details and the reproduction.
    """

    mode: Optional[str] = None
    repositories: Optional[Tuple[Path, ...]] = None
    http: Optional[Tuple[str, int]] = None
    grpc: Optional[Tuple[str, int]] = None
    http_restricted: Tuple[Tuple[str, str, str], ...] = ()
    grpc_restricted: Tuple[Tuple[str, str, str], ...] = ()

    @classmethod
    def parse(cls, argv: Sequence[str], cwd: Path) -> "ServerOptions":
        """Options from ``tritonserver`` arguments (``--flag=value`` or ``--flag value``;
        the last occurrence of a flag wins, as in Triton, except the restriction flags,
        which all count, as in Triton)."""
        mode, repositories, flags = "none", [], {}
        restricted: Dict[str, List[Tuple[str, str, str]]] = {"--http-restricted-api": [], "--grpc-restricted-protocol": []}
        args = list(argv[1:])
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            if flag in ("--model-repository", "--model-store"):
                repositories.append(value)
            elif flag in restricted:
                restricted[flag] += parse_restriction(value)
            elif flag.startswith("--"):
                flags[flag] = value.strip()
        mode = flags.get("--model-control-mode", mode).lower()
        local = None
        if repositories and not any("://" in r for r in repositories):
            local = tuple((cwd / r).resolve() for r in repositories)
        grpc_restricted = tuple((group, GRPC_HEADER_PREFIX + key.lower(), value)
                                for group, key, value in restricted["--grpc-restricted-protocol"])
        return cls(mode, local, _endpoint(flags, "http", 8000), _endpoint(flags, "grpc", 8001),
                   tuple(restricted["--http-restricted-api"]), grpc_restricted)

    def header(self, protocol: str, group: str = "model-repository") -> Optional[Tuple[str, str]]:
        """``(header, value)`` that a ``protocol`` (``http`` or ``grpc``) request to API
        ``group`` must carry, or None when the group is not restricted."""
        for g, key, value in self.http_restricted if protocol == "http" else self.grpc_restricted:
            if g == group:
                return key, value
        return None

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


def parent_server_argv() -> Optional[List[str]]:
    """The command line of this process's parent when it is ``tritonserver`` (Linux
    ``/proc/<ppid>/cmdline``), else None (the in-process mock, another OS)."""
    try:
        raw = (Path("/proc") / str(os.getppid()) / "cmdline").read_bytes()
        argv = [a.decode() for a in raw.split(b"\0") if a]
    except (OSError, UnicodeDecodeError):
        return None
    return argv if argv and Path(argv[0]).name.startswith("tritonserver") else None


def _endpoint(flags: Dict[str, str], protocol: str, default_port: int) -> Optional[Tuple[str, int]]:
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
def _grpc_client() -> Any:
    """``tritonclient.grpc`` when the stub's environment has it, else None (imported once)."""
    try:
        import tritonclient.grpc as module
    except ImportError:
        return None
    return module


#: The admin channel's options: never through an HTTP CONNECT proxy (gRPC core reads
#: ``grpc_proxy``/``https_proxy``/``http_proxy`` otherwise). They replace tritonclient's
#: defaults; the default 4 MiB receive limit holds any model configuration.
CHANNEL_ARGS: List[Tuple[str, int]] = [("grpc.enable_http_proxy", 0)]

#: What Triton puts before the key of ``--grpc-restricted-protocol`` (server
#: ``src/grpc/grpc_server.h``, ``kRestrictedProtocolHeaderTemplate``).
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


def parse_restriction(spec: str) -> List[Tuple[str, str, str]]:
    """``[(group, key, value), ...]`` from one restriction flag's value
    ``<group>[,<group>...]:<key>=<value>``, split as Triton splits it (at the first ``:``,
    then the first ``=``); ``[]`` when malformed (Triton would not start)."""
    groups, colon, setting = spec.partition(":")
    key, eq, value = setting.partition("=")
    if not (colon and eq and groups and key and value):
        return []
    return [(group, key, value) for group in groups.split(",") if group]


#: The config parameter a repair changes so that Triton reloads the model
#: (:meth:`RepositoryControl.reload`); its value is the repair's time in ns.
REPAIR_PARAMETER = "orchestrator_repair"


def repair_config(config: Dict[str, Any], stamp: str) -> Dict[str, Any]:
    """``config`` (the model configuration as JSON) with parameter :data:`REPAIR_PARAMETER`
    set to ``stamp``: different from the loaded configuration outside ``instance_group``
    and ``version_policy``, so Triton loads new instances instead of skipping the load
    (core ``ConfigChangeRequiresReload``)."""
    out = dict(config)
    out["parameters"] = {**(config.get("parameters") or {}), REPAIR_PARAMETER: {"string_value": stamp}}
    return out


class RepositoryControl:
    """Load and unload models through the server's repository API: over gRPC when the server
    has a gRPC endpoint and the stub's environment has ``tritonclient[grpc]``, else over
    HTTP, else through ``pb_utils`` (see the module docstring for why in this order).
    Requests to a restricted API group carry the key the server's command line names
    (:meth:`ServerOptions.header`).

    Args:
        pb: ``triton_python_backend_utils`` (the last resort).
        server: the hosting server's options.
        timeout_s: seconds to wait for one load or unload (default 300).
    """

    def __init__(self, pb: Any, server: ServerOptions, timeout_s: float = 300.0):
        self.pb, self.server, self.timeout_s = pb, server, timeout_s
        if server.grpc and server.mode == "explicit":  # import now (0.1-0.3 s), not in the first repair
            threading.Thread(target=_grpc_client, name="orchestrator-grpc-import", daemon=True).start()

    @property
    def via(self) -> str:
        """``grpc``, ``http`` or ``pb_utils``: how requests are sent."""
        if self.server.grpc and _grpc_client() is not None:
            return "grpc"
        return "http" if self.server.http else "pb_utils"

    def load(self, model: str, config: Optional[Dict[str, Any]] = None) -> None:
        """Load (or reload, when loaded) ``model``; blocks until done. ``config``: a model
        configuration (JSON) that replaces the repository's for this load. Triton 2.51
        returns at once and changes nothing when ``model`` is loaded, its directory did
        not change and ``config`` is None or differs only in its instance groups; see
        :meth:`reload`.

        Raises:
            ControlError: the server refused or the load failed.
        """
        self._send(model, "load", config)

    def unload(self, model: str) -> None:
        """Unload ``model`` (not its dependents); returns before the model is unloaded.

        Raises:
            ControlError: the server refused.
        """
        self._send(model, "unload")

    def config(self, model: str) -> Dict[str, Any]:
        """The loaded configuration of ``model`` as JSON (the ``model-config`` API).

        Raises:
            ControlError: the server refused or does not know the model, or there is no
                endpoint to ask (``pb_utils`` has no such call).
        """
        via = self.via
        config: Dict[str, Any]
        if via == "grpc":
            config = self._grpc(model, "config")
            return config
        if via == "http":
            config = self._http(model, "config")
            return config
        raise ControlError("the server has no HTTP or gRPC endpoint to read a model configuration from")

    def reload(self, model: str, stamp: str) -> str:
        """Reload ``model`` with new instances (new stub processes), a load Triton cannot
        skip: over gRPC or HTTP, a load carrying the model's loaded configuration with
        parameter :data:`REPAIR_PARAMETER` = ``stamp`` (:func:`repair_config`); Triton
        keeps the old instances until the new ones are ready. Through ``pb_utils`` (no
        endpoint), an unload and then a load. Blocks until done; returns how
        (``config`` or ``unload+load``).

        Raises:
            ControlError: the server refused, or reading the configuration or the load
                failed.
        """
        if self.via == "pb_utils":
            self.unload(model)
            self.load(model)
            return "unload+load"
        self.load(model, repair_config(self.config(model), stamp))
        return "config"

    def _send(self, model: str, action: str, config: Optional[Dict[str, Any]] = None) -> None:
        via = self.via
        if via == "grpc":
            self._grpc(model, action, config)
        elif via == "http":
            body: Dict[str, Any]
            if action == "load":
                body = {} if config is None else {"parameters": {"config": json.dumps(config)}}
            else:
                body = {"parameters": {"unload_dependents": False}}
            self._http(model, action, body)
        else:
            try:
                getattr(self.pb, f"{action}_model")(model_name=model, **({} if config is None else {"config": json.dumps(config)}))
            except Exception as exc:  # the stub raises TritonModelException
                raise ControlError(str(exc)) from None

    def _grpc(self, model: str, action: str, config: Optional[Dict[str, Any]] = None) -> Any:
        tc = _grpc_client()
        assert self.server.grpc is not None, "via is grpc only with an endpoint"
        host, port = self.server.grpc
        header = self.server.header("grpc", "model-config" if action == "config" else "model-repository")
        headers = dict([header]) if header else None
        # No proxies: gRPC core honours https_proxy/grpc_proxy and would tunnel the key through one.
        client = tc.InferenceServerClient(f"{host}:{port}", channel_args=CHANNEL_ARGS)
        try:
            if action == "load":
                extra = {} if config is None else {"config": json.dumps(config)}
                client.load_model(model, headers=headers, client_timeout=self.timeout_s, **extra)
            elif action == "unload":
                client.unload_model(model, headers=headers, unload_dependents=False, client_timeout=self.timeout_s)
            else:
                return client.get_model_config(model, headers=headers, as_json=True, client_timeout=self.timeout_s)["config"]
        except tc.InferenceServerException as exc:
            message = exc.message() or str(exc)
            if "restricted" in message:  # Triton answers UNAVAILABLE: not a dead endpoint
                raise ControlError(_refused(action, model, message, header, "--grpc-restricted-protocol"), refused=True) from None
            if exc.status() == "StatusCode.UNAVAILABLE":
                raise ControlError(f"the server's gRPC endpoint {host}:{port} did not answer: {message}") from None
            raise ControlError(message) from None
        finally:
            client.close()

    def _http(self, model: str, action: str, body: Optional[Dict[str, Any]] = None) -> Any:
        assert self.server.http is not None, "via is http only with an endpoint"
        host, port = self.server.http
        quoted = urllib.parse.quote(model, safe="")
        header = self.server.header("http", "model-config" if action == "config" else "model-repository")
        headers = {"Content-Type": "application/json"}
        if header:
            headers[header[0]] = header[1]
        if action == "config":
            url, data, method = f"http://{host}:{port}/v2/models/{quoted}/config", None, "GET"
        else:
            url, data, method = f"http://{host}:{port}/v2/repository/models/{quoted}/{action}", json.dumps(body).encode(), "POST"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            try:
                text = json.loads(text).get("error", text)
            except ValueError:
                pass
            if exc.code == 403:
                raise ControlError(_refused(action, model, text or "HTTP 403", header, "--http-restricted-api"), refused=True) from None
            raise ControlError(text or f"HTTP {exc.code}") from None
        except OSError as exc:
            raise ControlError(f"the server's HTTP endpoint {host}:{port} did not answer: {exc}") from None
        return json.loads(text) if action == "config" else None


# No proxies: an http_proxy in the stub's environment must not see loopback requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _refused(action: str, model: str, message: str, header: Optional[Tuple[str, str]], flag: str) -> str:
    sent = f"sent the key of {header[0]!r}" if header else f"no {flag} flag of the server covers this API group"
    return f"the server refused the {action} of '{model}': {message} ({sent})"
