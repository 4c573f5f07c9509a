"""The embedded default Triton Inference Server.

A real ``tritonserver`` (Triton 2.51.0) taken from the ``nvidia-pytriton==0.7.0`` wheel,
started as a child process on loopback. The CLI (``orchestrator serve``), the demo and
every test that needs a server use it. Contract: docs/architecture.md, section
``orchestrator.tooling.server``; facts: the project's FIELD_NOTES.md, "A real Triton Inference
Server without Docker", Triton's server docs (model management, ``--model-config-name``),
and what this module's tests check on these machines.

How it is run (all checked on these machines):

- The wheel carries ``pytriton/tritonserver/bin/tritonserver``,
  ``pytriton/tritonserver/backends/python/`` and one prebuilt Python-backend stub per
  CPython version under ``pytriton/tritonserver/python_backend_stubs/<3.x>/``; its shared
  libraries live in ``site-packages/nvidia_pytriton.libs`` (``LD_LIBRARY_PATH``).
- A backend directory is prepared in a cache: a copy of ``backends/python`` plus the stub
  matching the serving interpreter (``sys.version_info``).
- The stub embeds ``libpython3.X`` with an *isolated* configuration (seen:
  ``sys.flags.isolated == 1``): it ignores ``PYTHONPATH``, and a model's ``import numpy``
  fails (``ModuleNotFoundError``) although numpy is in the venv. The stub imports the
  model module before ``triton_python_backend_utils``, so the fix must act at interpreter
  startup: the embedded interpreter still searches ``PATH`` for ``python3`` to find
  ``sys.executable``, and ``site`` honours a ``pyvenv.cfg`` beside it. So a tiny "stub
  environment" (:func:`prepare_stub_environment`) goes first on ``PATH``; its ``.pth``
  adds the ``PYTHONPATH`` entries (this repository, the venv's site-packages) to
  ``sys.path``. The interpreter's own shared ``libpython`` (pyenv) goes on
  ``LD_LIBRARY_PATH`` so the stub runs the same CPython build; without it the stub falls
  back to the system's ``libpython3.X`` (Debian package ``libpython3.11``).
- Logs are glog lines: ``E1122 07:21:23.167537 3847 model_lifecycle.cc:642] "failed to
  load 'broken' version 1: Internal: RuntimeError: boom..."``, the fatal one last:
  ``error: creating server: ...``. On a machine without a GPU some ``E``/``W`` lines
  about CUDA, NVML and DCGM are always there and harmless.

Errors are :class:`ServerError`; its message carries the error lines of the server log,
the log path and the command line.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import importlib.util
import os
import re
import shlex
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from orchestrator.tooling.files import write_atomic
from orchestrator.tooling.paths import PROJECT_ROOT, default_model_repository, in_checkout

__all__ = [
    "ServerError",
    "EmbeddedServer",
    "TritonServer",
    "find_embedded_server",
    "default_cache_dir",
    "prepare_backend_directory",
    "prepare_stub_environment",
    "server_environment",
    "list_models",
    "extract_error_lines",
    "find_free_ports",
    "port_is_free",
    "add_serve_arguments",
    "serve_command",
]

#: Directory that contains the ``orchestrator`` package (the repository root in a checkout).
PACKAGE_PARENT = PROJECT_ROOT  # on the stub's path, so model.py files import the package

#: Where ``orchestrator serve`` looks for models by default.
DEFAULT_MODEL_REPOSITORY = "model_repository"

_WILDCARD_HOSTS = {"0.0.0.0", "::", ""}

#: ``--exit-timeout-secs`` (Triton's default is 30). On SIGINT Triton 2.51 waits until every
#: HTTP connection is closed, an idle keep-alive client included ("Timeout 25: Found 1 HTTP
#: service connections"), then for in-flight requests; seen here: an open tritonclient made
#: every stop take 30 s. In-flight requests of this project take milliseconds.
EXIT_TIMEOUT_SECS = 5

# Log lines that every CPU-only start prints; harmless (FIELD_NOTES), so never "the error".
_NOISE = re.compile(
    r"CudaDriverHelper has not been initialized|Failed to initialize NVML|DCGM|"
    r"Unable to allocate pinned system memory|CUDA memory pool disabled"
)
# glog: severity (Info/Warning/Error/Fatal), MMDD, time, thread id, file:line], message.
_GLOG = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+\S+\]\s*(.*)$")
_PY_EXCEPTION = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:.*)?$")


class ServerError(RuntimeError):
    """The embedded server could not be found, prepared, started or driven.

    The message includes the log's error lines, the log path and the command line
    where a server process was involved.
    """


# ----------------------------------------------------------------------------------------
# The wheel and the backend directory


@dataclass(frozen=True)
class EmbeddedServer:
    """Paths inside an installed ``nvidia-pytriton`` wheel.

    ``server``: the ``tritonserver`` binary; ``backends``: the wheel's backend directory
    (holds ``python/``); ``stubs``: ``python_backend_stubs`` (one ``<3.x>/`` per CPython
    version); ``libs``: ``nvidia_pytriton.libs`` (goes on ``LD_LIBRARY_PATH``).
    """

    server: Path
    backends: Path
    stubs: Path
    libs: Path

    def stub(self, version: Sequence[int] | None = None) -> Path:
        """The prebuilt stub for CPython ``version`` (default: this interpreter's).

        Raises ServerError when the wheel has no stub for it.
        """
        major, minor = tuple(version or sys.version_info[:2])[:2]
        path = self.stubs / f"{major}.{minor}" / "triton_python_backend_stub"
        if not path.is_file():
            have = sorted(p.name for p in self.stubs.iterdir() if p.is_dir()) if self.stubs.is_dir() else []
            raise ServerError(
                f"the nvidia-pytriton wheel has no Python-backend stub for Python {major}.{minor} "
                f"(it has: {', '.join(have) or 'none'}); serve from one of those interpreters"
            )
        return path


def find_embedded_server() -> EmbeddedServer:
    """Locate Triton inside the installed ``nvidia-pytriton`` wheel.

    Returns the paths as an :class:`EmbeddedServer`. Raises ServerError naming the
    missing piece (and the install command) when the wheel or part of it is absent.
    """
    # find_spec does not import pytriton (its import pulls in much more than we need).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(
            "the embedded Triton server needs the nvidia-pytriton wheel, which is not installed "
            f"for {sys.executable}: pip install 'nvidia-pytriton==0.7.0' (or `make venv`)"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package / "tritonserver"
    found = EmbeddedServer(
        server=root / "bin" / "tritonserver",
        backends=root / "backends",
        stubs=root / "python_backend_stubs",
        libs=package.parent / "nvidia_pytriton.libs",
    )
    for what, path in (
        ("server binary", found.server),
        ("Python backend", found.backends / "python" / "libtriton_python.so"),
        ("Python backend stubs", found.stubs),
        ("shared libraries", found.libs),
    ):
        if not path.exists():
            raise ServerError(
                f"the nvidia-pytriton wheel at {package} is incomplete: no {what} at {path}; "
                "reinstall it: pip install --force-reinstall 'nvidia-pytriton==0.7.0'"
            )
    return found


def default_cache_dir() -> Path:
    """``$ORCHESTRATOR_CACHE_DIR``, else ``<repo>/.cache/triton`` in a checkout, else
    ``~/.cache/orchestrator/triton`` (an installed, non-editable package)."""
    env = os.environ.get("ORCHESTRATOR_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    if in_checkout():
        return PACKAGE_PARENT / ".cache" / "triton"
    return Path.home() / ".cache" / "orchestrator" / "triton"


# The module the stub environment's .pth imports at interpreter startup (see module doc).
_STUB_PATH_MODULE = '''\
"""Written by orchestrator.tooling.server. The Python-backend stub embeds CPython with an isolated
configuration, which ignores PYTHONPATH. This runs at startup (a .pth import line in the
stub environment, before any model module) and adds the PYTHONPATH entries in front of
sys.path, as PYTHONPATH would; site.addsitedir, so their .pth files (editable installs)
work too."""
import os
import site
import sys

_before = list(sys.path)
for _entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    if _entry and os.path.isdir(_entry) and _entry not in _before:
        site.addsitedir(_entry)
sys.path[:] = [p for p in sys.path if p not in _before] + _before
'''


def _symlink(target: Path, points_to: str) -> None:
    """Make ``target`` a symlink to ``points_to`` atomically (temp link + rename)."""
    try:
        if os.readlink(target) == points_to:
            return
    except OSError:
        pass
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(points_to, tmp)
    os.replace(tmp, target)


def prepare_backend_directory(
    cache_dir: str | os.PathLike | None = None,
    *,
    embedded: EmbeddedServer | None = None,
    python_version: Sequence[int] | None = None,
) -> Path:
    """Prepare ``<cache>/backends`` for ``--backend-directory`` and return its path.

    ``<cache>/backends/python/`` gets the wheel's ``backends/python`` files and the stub
    for ``python_version`` (default ``sys.version_info``) as
    ``triton_python_backend_stub`` (mode 755). Idempotent and safe under concurrent
    calls: every file is written to a temporary name and renamed into place, and only
    when its content differs. Raises ServerError (no wheel, no stub for that Python
    version, unwritable cache).
    """
    embedded = embedded or find_embedded_server()
    version = tuple(python_version or sys.version_info[:2])[:2]
    stub = embedded.stub(version)
    target = Path(cache_dir or default_cache_dir()) / "backends" / "python"
    try:
        target.mkdir(parents=True, exist_ok=True)
        source = embedded.backends / "python"
        for path in sorted(source.iterdir()):
            if path.is_file():  # not __pycache__
                write_atomic(target / path.name, path.read_bytes(), 0o755 if path.suffix == ".so" else 0o644, if_changed=True)
        write_atomic(target / "triton_python_backend_stub", stub.read_bytes(), 0o755, if_changed=True)
    except OSError as exc:
        raise ServerError(f"cannot prepare the Triton backend directory {target}: {exc}") from exc
    return target.parent


def prepare_stub_environment(cache_dir: str | os.PathLike | None = None) -> Path:
    """Prepare ``<cache>/stub_env/py3.X`` for this interpreter and return its path.

    The stub's embedded CPython finds its ``sys.executable`` by searching ``PATH`` for
    ``python3`` (seen: ``/root/.pyenv/shims/python3``), and ``site`` then treats a
    ``pyvenv.cfg`` next to that executable's directory as a virtual environment (the same
    mechanism Triton's ``EXECUTION_ENV_PATH`` relies on after ``source bin/activate``).
    This environment has ``bin/python3`` (a symlink to this interpreter's base
    executable), a ``pyvenv.cfg`` whose ``home`` is that executable's directory (the
    stdlib comes from there), and in its ``site-packages`` a ``.pth`` that imports
    ``_orchestrator_stub_path`` (adds ``PYTHONPATH``). :func:`server_environment` puts its
    ``bin`` first on ``PATH``. Idempotent and safe under concurrent calls (temp + rename).
    Raises ServerError when the cache is not writable.
    """
    major, minor = sys.version_info[:2]
    base = Path(getattr(sys, "_base_executable", "") or os.path.realpath(sys.executable))
    root = Path(cache_dir or default_cache_dir()) / "stub_env" / f"py{major}.{minor}"
    site_packages = root / "lib" / f"python{major}.{minor}" / "site-packages"
    try:
        (root / "bin").mkdir(parents=True, exist_ok=True)
        site_packages.mkdir(parents=True, exist_ok=True)
        cfg = (
            f"home = {base.parent}\n"
            "include-system-site-packages = false\n"
            f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
            f"executable = {base}\n"
        )
        write_atomic(root / "pyvenv.cfg", cfg.encode(), 0o644, if_changed=True)
        for name in ("python3", f"python{major}.{minor}", "python"):
            _symlink(root / "bin" / name, str(base))
        write_atomic(site_packages / "_orchestrator_stub_path.py", _STUB_PATH_MODULE.encode(), 0o644, if_changed=True)
        write_atomic(site_packages / "_orchestrator_stub_path.pth", b"import _orchestrator_stub_path\n", 0o644, if_changed=True)
    except OSError as exc:
        raise ServerError(f"cannot prepare the stub environment {root}: {exc}") from exc
    return root


def _libpython_dir() -> str | None:
    """This interpreter's ``LIBDIR`` when it holds its shared ``libpython3.X.so.1.0`` and is
    not a system directory, so the stub loads the same libpython build as this
    interpreter (pyenv builds with ``--enable-shared``; else the stub falls back to the
    system's ``libpython3.X``)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME")
    if not (sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and soname):
        return None
    if not (Path(libdir) / soname).exists() or libdir.startswith(("/usr/lib", "/lib")):
        return None
    return libdir


# ----------------------------------------------------------------------------------------
# Environment, ports, models, logs


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out


def server_environment(
    embedded: EmbeddedServer | None = None,
    env: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
    stub_env: str | os.PathLike | None = None,
) -> dict[str, str]:
    """The environment for ``tritonserver`` and its Python-backend stubs.

    ``base`` (default ``os.environ``) plus: ``LD_LIBRARY_PATH`` = the wheel's libs dir
    (and this interpreter's shared-libpython dir, see :func:`_libpython_dir`) in front of
    the existing value; ``PYTHONPATH`` = the directory holding the ``orchestrator``
    package, this interpreter's site-packages (``site.getsitepackages()``, ``sysconfig``
    purelib/platlib), then the existing value; ``PATH`` = ``<stub_env>/bin`` first when
    ``stub_env`` (:func:`prepare_stub_environment`) is given; ``HF_HUB_OFFLINE=1``,
    ``TRANSFORMERS_OFFLINE=1``, ``TOKENIZERS_PARALLELISM=false``. ``env`` is merged last.
    """
    embedded = embedded or find_embedded_server()
    out = dict(os.environ if base is None else base)
    out["LD_LIBRARY_PATH"] = os.pathsep.join(
        _dedupe([str(embedded.libs), _libpython_dir() or "", *out.get("LD_LIBRARY_PATH", "").split(os.pathsep)])
    )
    if stub_env is not None:
        out["PATH"] = os.pathsep.join(_dedupe([str(Path(stub_env) / "bin"), *out.get("PATH", "").split(os.pathsep)]))
    try:
        site_dirs = list(site.getsitepackages())
    except AttributeError:  # some embedded/virtualenv builds lack it
        site_dirs = []
    paths = sysconfig.get_paths()
    out["PYTHONPATH"] = os.pathsep.join(
        _dedupe(
            [
                str(PACKAGE_PARENT),
                *site_dirs,
                paths.get("purelib", ""),
                paths.get("platlib", ""),
                *out.get("PYTHONPATH", "").split(os.pathsep),
            ]
        )
    )
    out.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    out.update(env or {})
    return out


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a TCP listener could bind ``host:port`` now (SO_REUSEADDR, like Triton,
    so a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def find_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free TCP ports, from binding port 0 on ``host`` (all held open
    together so they differ). Another process may still take one before the server does;
    :meth:`TritonServer.start` retries once in that case."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def list_models(model_repository: str | os.PathLike, model_config_name: str | None = "embedded") -> list[str]:
    """Names of the model directories of a repository, sorted: subdirectories holding a
    ``config.pbtxt`` (or ``configs/<model_config_name>.pbtxt``)."""
    repo = Path(model_repository)
    names = []
    for child in sorted(repo.iterdir()) if repo.is_dir() else []:
        if not child.is_dir() or child.name.startswith("."):
            continue
        if (child / "config.pbtxt").is_file() or (
            model_config_name and (child / "configs" / f"{model_config_name}.pbtxt").is_file()
        ):
            names.append(child.name)
    return names


def extract_error_lines(log_text: str, limit: int = 30) -> list[str]:
    """The lines of a ``tritonserver`` log that explain a failure, in order, deduplicated.

    Kept: glog error/fatal lines (``E1122 07:21:23.167537 3847 file.cc:642] "..."``, shown
    without the prefix), lines containing ``failed to load`` / ``error:`` / ``already in
    use``, and Python exception lines (``RuntimeError: ...``, the last line of a
    traceback). Triton quotes multi-line messages with literal ``\\n``; only the part
    before the ``At:`` traceback is kept. CPU-only noise (CUDA, NVML, DCGM) is dropped.
    """
    out: list[str] = []
    for raw in log_text.splitlines():
        line = raw.rstrip()
        if not line.strip() or _NOISE.search(line) or line.startswith(("|", "+")):
            continue
        glog = _GLOG.match(line)
        message = glog.group(2) if glog else line.strip()
        lowered = message.lower()
        if glog and glog.group(1) in "EF":
            text = message
        elif (
            "failed to load" in lowered
            or "error:" in lowered
            or "already in use" in lowered
            or _PY_EXCEPTION.match(message)
        ):
            text = message
        else:
            continue
        # glog quotes messages; a multi-line one has only its opening quote on this line.
        text = text[1:] if text.startswith('"') else text
        text = text[:-1] if text.endswith('"') else text
        text = text.split("\\n\\nAt:")[0].replace("\\n", " ").strip()
        text = text if len(text) <= 600 else text[:600] + " ..."
        if text and text not in out:
            out.append(text)
    return out[-limit:]


def _default_log_path(cache_dir: Path) -> Path:
    logs = cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    fd, name = tempfile.mkstemp(prefix=f"tritonserver-{stamp}-", suffix=".log", dir=logs)
    os.close(fd)
    return Path(name)


# ----------------------------------------------------------------------------------------
# The server

_RUNNING: set["TritonServer"] = set()
_RUNNING_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _RUNNING_LOCK:
        servers = list(_RUNNING)
    for server in servers:
        try:
            server.stop(timeout=10.0)
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


atexit.register(_stop_all_at_exit)


class TritonServer:
    """A ``tritonserver`` child process serving ``model_repository`` on loopback.

    ``models``: names to load at start (``--load-model``; ``None`` = every model directory,
    see :func:`list_models`); explicit model control, so more can be loaded later.
    Ports: ``None`` = a free port picked at :meth:`start`; a given port is checked first.
    ``model_config_name``: Triton reads ``<model>/configs/<name>.pbtxt`` where it exists,
    else ``config.pbtxt`` (``None``/``""`` = always ``config.pbtxt``).
    ``log_path``: file for the server's stdout+stderr, appended to after a header line
    with the command (default: a new file under ``<cache>/logs/``). ``startup_timeout``: seconds to wait for readiness.
    ``extra_args``: appended to the command line. ``env``: merged on top of
    :func:`server_environment`. ``cache_dir``: see :func:`default_cache_dir`.

    Usage::

        with TritonServer("model_repository") as srv:
            client = tritonclient.http.InferenceServerClient(srv.http_url)
    """

    def __init__(
        self,
        model_repository: str | os.PathLike,
        *,
        models: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        model_config_name: str | None = "embedded",
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = 180.0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.models = list(models) if models is not None else None
        self.host = host
        self.model_config_name = model_config_name
        self.startup_timeout = float(startup_timeout)
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.cache_dir = Path(cache_dir).resolve() if cache_dir else default_cache_dir()
        self._requested_ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self._ports: dict[str, int] = {k: v for k, v in self._requested_ports.items() if v is not None}
        self._log_path = Path(log_path).resolve() if log_path else None
        self._proc: subprocess.Popen | None = None
        self._stub_env: Path | None = None
        self._lock = threading.RLock()
        self.command: list[str] = []  # the last command line started (for messages)
        self.startup_models: list[str] = []  # the --load-model names of that command

    # -- properties ----------------------------------------------------------------------

    @property
    def _connect_host(self) -> str:
        # A wildcard bind address is not an address to connect to.
        if self.host in _WILDCARD_HOSTS:
            return "127.0.0.1"
        return f"[{self.host}]" if ":" in self.host else self.host

    def _port(self, kind: str) -> int:
        if kind not in self._ports:
            raise ServerError(f"the {kind} port is picked at start(); start the server first")
        return self._ports[kind]

    @property
    def http_port(self) -> int:
        return self._port("http")

    @property
    def grpc_port(self) -> int:
        return self._port("grpc")

    @property
    def metrics_port(self) -> int:
        return self._port("metrics")

    @property
    def http_url(self) -> str:
        """``"HOST:PORT"`` for ``tritonclient.http`` (no scheme)."""
        return f"{self._connect_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``"HOST:PORT"`` for ``tritonclient.grpc``."""
        return f"{self._connect_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """``"HOST:PORT"`` of the Prometheus endpoint (``http://<metrics_url>/metrics``)."""
        return f"{self._connect_host}:{self.metrics_port}"

    @property
    def log_path(self) -> Path:
        """The server log (stdout+stderr). Chosen at construction or at the first start."""
        if self._log_path is None:
            self._log_path = _default_log_path(self.cache_dir)
        return self._log_path

    @property
    def pid(self) -> int | None:
        """Process id of ``tritonserver`` (also its process group id); None before start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status once the process has ended (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else None

    # -- lifecycle -----------------------------------------------------------------------

    def _resolve_ports(self) -> None:
        given = {k: v for k, v in self._requested_ports.items() if v is not None}
        for kind, port in given.items():
            if not port_is_free(port, self.host):
                raise ServerError(
                    f"port {port} is already in use on {self.host} (--{kind}-port); "
                    f"pass another --{kind}-port or leave it out to pick a free port"
                )
        if len(set(given.values())) != len(given):
            raise ServerError(f"the HTTP, gRPC and metrics ports must differ: {given}")
        missing = [k for k in ("http", "grpc", "metrics") if k not in given]
        picked = iter(p for p in find_free_ports(len(missing) + 3, self._bind_probe_host()) if p not in given.values())
        self._ports = {**given, **{kind: next(picked) for kind in missing}}

    def _bind_probe_host(self) -> str:
        return "127.0.0.1" if self.host in _WILDCARD_HOSTS else self.host

    def build_command(self, embedded: EmbeddedServer, backend_dir: Path) -> list[str]:
        """The ``tritonserver`` command line for the current ports (see the class doc)."""
        models = self.models if self.models is not None else list_models(self.model_repository, self.model_config_name)
        self.startup_models = list(models)
        cmd = [
            str(embedded.server),
            f"--model-repository={self.model_repository}",
            "--model-control-mode=explicit",
            *[f"--load-model={name}" for name in models],
        ]
        if self.model_config_name:
            cmd.append(f"--model-config-name={self.model_config_name}")
        cmd += [
            f"--backend-directory={backend_dir}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--http-port={self._ports['http']}",
            f"--grpc-port={self._ports['grpc']}",
            f"--metrics-port={self._ports['metrics']}",
            "--log-verbose=0",
            "--exit-on-error=true",
            "--strict-readiness=true",
            f"--exit-timeout-secs={EXIT_TIMEOUT_SECS}",
            *self.extra_args,  # last, so they can override the flags above
        ]
        return cmd

    def start(self) -> "TritonServer":
        """Spawn the server and wait until ``/v2/health/ready`` answers 200.

        With ``--strict-readiness`` that means every model in ``models`` is loaded.
        Returns self. Raises ServerError (with the log's error lines, the log path and
        the command) if the process exits, or is not ready within ``startup_timeout``
        seconds; the process is stopped first. A server that is already running is left
        as it is.
        """
        with self._lock:
            if self.running:
                return self
            if not self.model_repository.is_dir():
                raise ServerError(f"model repository {self.model_repository} is not a directory")
            self._resolve_ports()  # first: a busy port is the clearest error
            embedded = find_embedded_server()
            backend_dir = prepare_backend_directory(self.cache_dir, embedded=embedded)
            self._stub_env = prepare_stub_environment(self.cache_dir)
            env = server_environment(embedded, self.env, stub_env=self._stub_env)
            auto_ports = any(v is None for v in self._requested_ports.values())
            for attempt in (1, 2):
                if attempt == 2:
                    self._resolve_ports()
                self.command = self.build_command(embedded, backend_dir)
                try:
                    self._spawn(env)
                    self._wait_ready()
                    return self
                except ServerError as exc:
                    # A picked port taken by someone else between our probe and the bind.
                    if attempt == 1 and auto_ports and "already in use" in str(exc):
                        continue
                    raise
                except BaseException:
                    self.stop(timeout=10.0)  # Ctrl-C during startup: leave nothing behind
                    raise
        return self  # unreachable

    def _spawn(self, env: Mapping[str, str]) -> None:
        command = list(self.command)
        # If this process dies without running atexit (SIGKILL, a crash), the kernel sends
        # SIGTERM to the server (Triton shuts down on it). PDEATHSIG fires when the parent
        # *thread* exits, so only for servers started from the main thread.
        setpriv = shutil.which("setpriv")
        if setpriv and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "TERM", "--", *command]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            header = f"# orchestrator.tooling.server {datetime.datetime.now().isoformat(timespec='seconds')}: {shlex.join(self.command)}\n"
            log.write(header.encode())
            log.flush()
            self._log_offset = log.tell()
            try:
                # Own session/process group: a terminal's Ctrl-C reaches only us, and stop()
                # can signal the server and its stub processes together.
                self._proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(env),
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerError(f"cannot run {self.command[0]}: {exc}") from exc
        with _RUNNING_LOCK:
            _RUNNING.add(self)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop(timeout=5.0)
                raise self._failure(f"tritonserver exited with status {code} during startup")
            if self.is_ready(timeout=1.0):
                return
            if time.monotonic() > deadline:
                self.stop(timeout=10.0)
                raise self._failure(f"tritonserver was not ready after {self.startup_timeout:g} s")
            time.sleep(0.1)

    def _new_log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(getattr(self, "_log_offset", 0))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _failure(self, what: str) -> ServerError:
        text = self._new_log_text()
        lines = extract_error_lines(text)
        if lines:
            detail = "error lines from the log:\n" + "\n".join(f"  {line}" for line in lines)
        else:
            tail = [line for line in text.splitlines() if line.strip()][-15:]
            detail = "last lines of the log:\n" + "\n".join(f"  {line}" for line in tail or ["(empty)"])
        if "No module named" in text:
            detail += (
                "\nhint: the Python-backend stub imports from PYTHONPATH (this repository and this "
                f"interpreter's site-packages) through the stub environment {self._stub_env} "
                "(its bin/ must stay first on PATH); install the missing package into "
                f"{sys.prefix} or pass env={{'PYTHONPATH': ...}}"
            )
        return ServerError(f"{what}\n{detail}\nlog: {self.log_path}\ncommand: {shlex.join(self.command)}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server: SIGINT (Triton unloads models and exits), wait up to
        ``timeout`` seconds, then SIGKILL its process group. Afterwards no process of the
        group (``tritonserver``, ``triton_python_backend_stub``) is left. Idempotent."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            pgid = proc.pid  # start_new_session: the server leads its own group
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGINT)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _killpg(pgid, signal.SIGKILL)
                    proc.wait()
            # Stubs are the server's children in its group; they exit with it. Whatever
            # is left after a short grace period is killed.
            deadline = time.monotonic() + min(5.0, max(timeout, 0.5))
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _group_alive(pgid):
                _killpg(pgid, signal.SIGKILL)
            with _RUNNING_LOCK:
                _RUNNING.discard(self)

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"TritonServer({str(self.model_repository)!r}, {state}, ports={self._ports})"

    # -- health and model control ----------------------------------------------------------

    def is_ready(self, timeout: float = 2.0) -> bool:
        """True when ``GET /v2/health/ready`` answers 200 within ``timeout`` seconds."""
        if not self.running or "http" not in self._ports:
            return False
        # No proxies: an http_proxy in the environment must not see loopback requests.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://{self.http_url}/v2/health/ready", timeout=timeout) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def client(self, **kwargs):
        """A new ``tritonclient.http.InferenceServerClient`` for this server (close it)."""
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.http_url, **kwargs)

    def _control(self, action: str, name: str) -> None:
        from tritonclient.utils import InferenceServerException

        client = self.client(network_timeout=max(self.startup_timeout, 60.0))
        try:
            getattr(client, f"{action}_model")(name)
        except InferenceServerException as exc:
            raise self._failure(f"{action} of model {name!r} failed: {exc.message()}") from exc
        finally:
            client.close()

    def load_model(self, name: str) -> None:
        """Load (or reload) model ``name`` from the repository; returns once it is ready.
        Raises ServerError with Triton's message and the log's error lines."""
        self._control("load", name)

    def unload_model(self, name: str, wait: float = 30.0) -> None:
        """Unload model ``name``. Triton answers while the model is still ``UNLOADING``,
        so wait up to ``wait`` seconds (0: don't) until it is ``UNAVAILABLE``. Raises
        ServerError."""
        self._control("unload", name)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            states = {m.get("state") for m in self.repository_index() if m.get("name") == name}
            if not states & {"READY", "UNLOADING", "LOADING"}:
                return
            time.sleep(0.05)
        raise ServerError(f"model {name!r} still READY {wait:g} s after unload; log: {self.log_path}")

    def repository_index(self) -> list[dict]:
        """``POST /v2/repository/index``: one dict per model version known to the server,
        ``{"name", "version", "state" ("READY", "UNAVAILABLE", ...), "reason"}``; models
        never loaded have only ``name``."""
        client = self.client()
        try:
            return list(client.get_model_repository_index())
        finally:
            client.close()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """True while any process is left in group ``pgid`` (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ----------------------------------------------------------------------------------------
# `orchestrator serve`


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator serve`` options to ``parser`` (returned for chaining)."""
    parser.add_argument(
        "--repo",
        default=None,
        help=f"model repository (default: ./{DEFAULT_MODEL_REPOSITORY}, else the one in this checkout)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, loopback)")
    parser.add_argument("--http-port", type=int, default=None, help="HTTP port (default: a free port)")
    parser.add_argument("--grpc-port", type=int, default=None, help="gRPC port (default: a free port)")
    parser.add_argument("--metrics-port", type=int, default=None, help="metrics port (default: a free port)")
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="NAME",
        help="model to load at start; repeat for several (default: every model of the repository)",
    )
    parser.add_argument(
        "--model-config-name",
        default="embedded",
        help="read <model>/configs/NAME.pbtxt where it exists (default: %(default)s; '' for config.pbtxt)",
    )
    parser.add_argument("--log-file", default=None, help="server log file (default: a new file under the cache)")
    parser.add_argument(
        "--startup-timeout", type=float, default=180.0, help="seconds to wait for readiness (default: %(default)s)"
    )
    return parser


def _resolve_repository(repo: str | None) -> Path:
    if repo:
        return Path(repo)
    return default_model_repository()


class _Terminate(BaseException):
    """Raised from the SIGTERM handler of `serve` to leave the wait loop."""


def serve_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator serve``: start the server, print its URLs and log path, block
    until Ctrl-C or SIGTERM, stop it. Returns 0 after a clean stop, 1 on ServerError
    (message on stderr) or if the server dies while serving."""
    server = TritonServer(
        _resolve_repository(getattr(args, "repo", None)),
        models=getattr(args, "model", None) or None,
        host=getattr(args, "host", "127.0.0.1"),
        http_port=getattr(args, "http_port", None),
        grpc_port=getattr(args, "grpc_port", None),
        metrics_port=getattr(args, "metrics_port", None),
        model_config_name=getattr(args, "model_config_name", "embedded") or None,
        log_path=getattr(args, "log_file", None),
        startup_timeout=getattr(args, "startup_timeout", 180.0),
    )

    def on_signal(signum, frame):
        raise _Terminate()

    main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    if main_thread:
        # SIGINT too: a shell starting us in the background (`&`) leaves SIGINT ignored.
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    rc = 0
    try:
        try:
            server.start()
            print(f"Triton Inference Server (embedded, nvidia-pytriton) ready, pid {server.pid}")
            print(f"  HTTP     http://{server.http_url}")
            print(f"  gRPC     {server.grpc_url}")
            print(f"  metrics  http://{server.metrics_url}/metrics")
            print(f"  models   {', '.join(server.startup_models) or '(none)'} from {server.model_repository}")
            print(f"  log      {server.log_path}")
            print("Press Ctrl-C to stop.", flush=True)
            while server.running:
                time.sleep(0.5)
            print(server._failure(f"tritonserver exited with status {server.returncode}"), file=sys.stderr)
            rc = 1
        except (KeyboardInterrupt, _Terminate):
            print("Stopping the server ...", flush=True)
        except ServerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            rc = 1
    finally:
        if main_thread:
            # Stopping is not interrupted by a second signal; stop() has its own timeout.
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)
        try:
            server.stop()
        finally:
            for sig, handler in previous.items():
                if handler is not None:  # None: a handler not installed from Python
                    signal.signal(sig, handler)
    if rc == 0:
        print("Stopped.", flush=True)
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.tooling.server [serve options]``."""
    parser = add_serve_arguments(
        argparse.ArgumentParser(prog="python -m orchestrator.tooling.server", description="Run the embedded Triton server.")
    )
    return serve_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
