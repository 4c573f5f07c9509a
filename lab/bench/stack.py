"""What a Triton server serves, read from the server itself: the "stack" of a report header.

The benchmarks and the soak measure either a server they start (the embedded Triton 2.51 on a
copy of ``model_repository/``, ``--model-config-name=embedded``) or a running server they did
not start (``--url``: an NGC container, a GPU node). Either way the report says what was
measured, from the same reading (:func:`read_stack`): the server's name, version and KServe
extensions (server metadata), and for each loaded model its backend or platform and its
instance groups (model configuration). :func:`describe` turns that into one line, e.g.
"embedded Triton 2.51, classifiers: python backend (onnxruntime in Python), CPU".

URLs (:func:`parse_urls`): ``--url`` takes ``http://host:port``, ``grpc://host:port`` or a bare
``host:port``, whose protocol is found by asking (an HTTP ``GET /v2/health/live``; gRPC
otherwise). Give it twice for a server's HTTP and gRPC ports.
"""

from __future__ import annotations

import contextlib
import http.client
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Mapping, Optional, Sequence, cast

#: Models whose backend names the "classifiers" part of :func:`describe`.
CLASSIFIERS = ("classifier", "classifier_fast", "classifier_fp16")


class StackError(ValueError):
    """A ``--url`` that names no Triton server, or a server that cannot be read."""


@dataclass
class ExternalServer:
    """A running server this tool did not start (``--url``).

    ``http_url``/``grpc_url``: ``host:port`` without scheme, or None when not given. ``pid``
    is None: fault injection that needs the server's processes cannot run against it.
    """

    http_url: Optional[str] = None
    grpc_url: Optional[str] = None
    pid: Optional[int] = None
    control_key: Optional[str] = None
    external: bool = field(default=True, init=False)

    def client(self, **kwargs: Any) -> Any:
        """A ``tritonclient.http`` client (HTTP URL required)."""
        import tritonclient.http as httpclient

        if not self.http_url:
            raise StackError("this step needs the server's HTTP port: add --url http://host:port")
        return httpclient.InferenceServerClient(self.http_url, **kwargs)

    def control_headers(self, protocol: str = "http") -> Optional[dict]:
        return None


def _is_http(address: str, timeout: float = 3.0) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy for the user's server
    try:
        with opener.open(f"http://{address}/v2/health/live", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):  # a gRPC port answers HTTP/2 bytes
        return False


def parse_urls(urls: Sequence[str], probe: bool = True) -> ExternalServer:
    """An :class:`ExternalServer` from ``--url`` values (see the module docstring).

    Raises StackError for a value without ``host:port``, a scheme other than http/grpc, or
    two URLs of one protocol.
    """
    server = ExternalServer()
    for url in urls:
        scheme, sep, rest = url.partition("://")
        if not sep:
            scheme, rest = "", url
        host, colon, port = rest.rstrip("/").rpartition(":")
        if not colon or not host or not port.isdigit():
            raise StackError(f"--url {url!r}: expected host:port, http://host:port or grpc://host:port")
        if scheme not in ("", "http", "grpc"):
            raise StackError(f"--url {url!r}: the scheme must be http or grpc, not {scheme!r}")
        address = f"{host}:{port}"
        if not scheme:
            scheme = "http" if probe and _is_http(address) else "grpc"
        attr = f"{scheme}_url"
        if getattr(server, attr):
            raise StackError(f"--url {url!r}: a {scheme} URL was given twice")
        setattr(server, attr, address)
    if not (server.http_url or server.grpc_url):
        raise StackError("no --url given")
    return server


def server_or_url(urls: Sequence[str], start: Callable[[], Any], need: str = "") -> ContextManager[Any]:
    """The server to measure: the :class:`ExternalServer` of ``urls`` when given (``need``:
    ``"grpc"``/``"http"``, the protocol the tool cannot do without; StackError when it is
    missing), else ``start()`` (a context manager that starts one, e.g. ``TritonServer``)."""
    if not urls:
        return cast(ContextManager[Any], start())
    external = parse_urls(urls)
    if need and not getattr(external, f"{need}_url"):
        raise StackError(f"this command needs the server's {need} port: add --url {need}://host:port")
    return contextlib.nullcontext(external)


def read_stack(server: Any, embedded: bool = False) -> Dict[str, Any]:
    """What ``server`` serves (anything with ``http_url``/``grpc_url``; HTTP preferred).

    Returns ``{"embedded", "url", "server": {name, version, extensions}, "models": {name:
    {version, backend, platform, instance_groups: [{kind, count, gpus}], parameters}}}`` for
    every READY model. Raises StackError when the server cannot be read.
    """
    http_url, grpc_url = getattr(server, "http_url", None), getattr(server, "grpc_url", None)
    headers = server.control_headers("http" if http_url else "grpc") if hasattr(server, "control_headers") else None
    try:
        if http_url:
            import tritonclient.http as httpclient

            client: Any = httpclient.InferenceServerClient(http_url)
            meta = client.get_server_metadata()
            index = client.get_model_repository_index(headers=headers)
            configs = {m["name"]: client.get_model_config(m["name"], headers=headers)
                       for m in index if m.get("state") == "READY"}
        elif grpc_url:
            import tritonclient.grpc as grpcclient

            client = grpcclient.InferenceServerClient(grpc_url)
            meta = client.get_server_metadata(as_json=True)
            index = client.get_model_repository_index(headers=headers, as_json=True).get("models", [])
            configs = {m["name"]: client.get_model_config(m["name"], headers=headers, as_json=True).get("config", {})
                       for m in index if m.get("state") == "READY"}
        else:
            raise StackError("no server URL")
        client.close()
    except StackError:
        raise
    except Exception as exc:  # tritonclient's InferenceServerException, connection errors
        raise StackError(f"cannot read the server at {http_url or grpc_url}: {exc}") from exc
    versions = {m["name"]: str(m.get("version", "")) for m in index if m.get("state") == "READY"}
    return {
        "embedded": bool(embedded),
        "url": http_url or grpc_url,
        "server": {"name": meta.get("name", ""), "version": meta.get("version", ""),
                   "extensions": list(meta.get("extensions", []))},
        "models": {name: model_summary(cfg, versions.get(name, "")) for name, cfg in sorted(configs.items())},
    }


def model_summary(config: Mapping[str, Any], version: str = "") -> Dict[str, Any]:
    """The parts of a model configuration (KServe JSON form) a report shows."""
    groups = [{"kind": str(g.get("kind", "KIND_AUTO")), "count": int(g.get("count", 1) or 1),
               "gpus": [int(x) for x in g.get("gpus", []) or []]} for g in config.get("instance_group", []) or []]
    params = {k: (v.get("string_value", "") if isinstance(v, Mapping) else str(v))
              for k, v in (config.get("parameters") or {}).items()}
    return {"version": version, "backend": config.get("backend", ""), "platform": config.get("platform", ""),
            "instance_groups": groups, "parameters": params}


def runtime_label(model: Mapping[str, Any]) -> str:
    """How a model runs: ``python backend (onnxruntime in Python)``, ``onnxruntime backend``,
    ``ensemble``, ``python backend``, ..."""
    backend, platform = model.get("backend") or "", model.get("platform") or ""
    if platform == "ensemble":
        return "ensemble"
    if backend == "python" and "onnx_file" in (model.get("parameters") or {}):
        return "python backend (onnxruntime in Python)"
    if backend == "onnxruntime" or platform == "onnxruntime_onnx":
        return "onnxruntime backend"
    return f"{backend or platform or 'unknown'} backend"


def devices(model: Mapping[str, Any]) -> str:
    """``CPU``, ``GPU`` or ``CPU+GPU`` from the instance groups (``KIND_AUTO``/none: ``AUTO``)."""
    kinds = sorted({g["kind"].replace("KIND_", "") for g in model.get("instance_groups", [])}) or ["AUTO"]
    return "+".join(kinds)


def describe(stack: Mapping[str, Any]) -> str:
    """One line: who started the server, its release, how the classifiers run and where.

    E.g. ``embedded Triton 2.51, classifiers: python backend (onnxruntime in Python), CPU``
    or ``server at host:8001 (Triton 2.72), classifiers: onnxruntime backend, GPU``.
    """
    server = stack.get("server", {})
    release = f"Triton {server.get('version') or '?'}"
    who = f"embedded {release}" if stack.get("embedded") else f"server at {stack.get('url')} ({release})"
    models = stack.get("models", {})
    found = [models[n] for n in CLASSIFIERS if n in models]
    if not found:
        return f"{who}, classifiers: none of {', '.join(CLASSIFIERS)} loaded"
    runtimes = ", ".join(dict.fromkeys(runtime_label(m) for m in found))
    where = ", ".join(dict.fromkeys(devices(m) for m in found))
    return f"{who}, classifiers: {runtimes}, {where}"


def markdown(stack: Mapping[str, Any]) -> List[str]:
    """The report header's "stack" block: the :func:`describe` line and a table of models."""
    server = stack.get("server", {})
    lines = [f"Stack: **{describe(stack)}**.", "",
             f"Server {server.get('name', '')} {server.get('version', '')}; extensions: "
             f"{', '.join(server.get('extensions', [])) or 'none'}.", "",
             "| model | version | runs on | instance groups |", "|---|---|---|---|"]
    for name, m in stack.get("models", {}).items():
        groups = ", ".join(f"{g['count']}x {g['kind']}" + (f" gpus {g['gpus']}" if g["gpus"] else "")
                           for g in m.get("instance_groups", [])) or "-"
        lines.append(f"| {name} | {m.get('version', '')} | {runtime_label(m)} | {groups} |")
    return lines


#: What every run before the stack reading measured (its results have no ``stack``).
LEGACY = "embedded Triton 2.51, classifiers: python backend (onnxruntime in Python), CPU"


def header_line(stack: Optional[Mapping[str, Any]]) -> str:
    """The report header's one-line stack statement (``LEGACY`` for older results)."""
    if not stack:
        return f"Stack: **{LEGACY}** (a run from before the stack was read from the server)."
    return f"Stack: **{describe(stack)}** (read from the server's metadata and model configurations)."


def served(stack: Mapping[str, Any], models: Sequence[str], hint: str) -> None:
    """Raise StackError naming the ``models`` the server does not serve (READY); ``hint``
    says how to serve them."""
    missing = [m for m in dict.fromkeys(models) if m not in stack.get("models", {})]
    if missing:
        raise StackError(f"the server at {stack.get('url')} does not serve {', '.join(missing)} (READY): {hint}")


def add_url_argument(parser: Any) -> None:
    """``--url`` (repeatable) on an argparse parser: the running server to measure."""
    parser.add_argument("--url", action="append", default=[], metavar="URL",
                        help="measure a running server this command did not start: grpc://host:port and/or "
                             "http://host:port, or host:port (protocol found by asking); repeat for both")
