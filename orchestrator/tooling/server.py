"""The embedded default Triton Inference Server.

A real ``tritonserver`` (Triton 2.51.0) taken from the ``nvidia-pytriton==0.7.0`` wheel,
started as a child process on loopback. The CLI (``orchestrator serve``,
:mod:`orchestrator.tooling.serve`), the demo and every test that needs a server use it.
Contract: docs/development/architecture.md, section ``orchestrator.tooling.server``; Triton's server
docs (model management, ``--model-config-name``). The wheel's layout, the backend
directory and the stub environment the stubs need are :mod:`orchestrator.tooling.embedded`.

What was seen on these machines and is checked by ``tests/server/test_server.py``:

- Logs are glog lines: ``E1122 07:21:23.167537 3847 model_lifecycle.cc:642] "failed to
  load 'broken' version 1: Internal: RuntimeError: boom..."``, the fatal one last:
  ``error: creating server: ...`` (``test_broken_model_error_names_model_and_exception``).
  On a machine without a GPU every start prints some ``E``/``W`` lines about CUDA, NVML,
  DCGM and pinned memory; they are harmless and never reported as the error
  (``test_extract_error_lines``).
- A stopped server leaves no process of its group (``tritonserver``,
  ``triton_python_backend_stub``) behind (``test_stop_leaves_no_process``).

Errors are :class:`ServerError` (from :mod:`orchestrator.tooling.embedded`); its message
carries the error lines of the server log, the log path and the command line.
"""

from __future__ import annotations

import atexit
import datetime
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

from orchestrator.tooling import prometheus
from orchestrator.tooling.embedded import (
    EmbeddedServer,
    ServerError,
    default_cache_dir,
    find_embedded_server,
    prepare_backend_directory,
    prepare_core_library_alias,
    prepare_stub_environment,
    server_environment,
)
from orchestrator.tooling.repository import list_models

__all__ = [
    "ServerError",
    "EmbeddedServer",
    "TritonServer",
    "find_embedded_server",
    "default_cache_dir",
    "prepare_backend_directory",
    "prepare_stub_environment",
    "server_environment",
    "extract_error_lines",
    "split_error_lines",
    "find_free_ports",
    "port_is_free",
    "trace_config_args",
]

_WILDCARD_HOSTS = {"0.0.0.0", "::", ""}

#: ``--exit-timeout-secs`` (Triton's default is 30). On SIGINT Triton 2.51 waits until every
#: HTTP connection is closed, an idle keep-alive client included ("Timeout 25: Found 1 HTTP
#: service connections"), then for in-flight requests; seen here: an open tritonclient made
#: every stop take 30 s. In-flight requests of this project take milliseconds.
EXIT_TIMEOUT_SECS = 5

# Log lines that every CPU-only start prints; harmless, so never "the error" (see module doc).
_NOISE = re.compile(
    r"CudaDriverHelper has not been initialized|Failed to initialize NVML|DCGM|"
    r"Unable to allocate pinned system memory|CUDA memory pool disabled"
)
# Error lines a start can print that never explain its failure: the router's warmup (its
# downstream models are not called during warmup) and CUDA on a machine without a GPU.
_HARMLESS = re.compile(
    r"is not called during warmup|CUDA driver version is insufficient|no CUDA-capable device|"
    r"cudaGetDeviceCount|cudaDriverGetVersion|Unable to find a CUDA driver"
)
# The lines that say why a start failed, shown first.
_DECISIVE = re.compile(r"failed to load|error: creating server|unexpected model name|Invalid argument|already in use", re.I)
# glog: severity (Info/Warning/Error/Fatal), MMDD, time, thread id, file:line], message.
_GLOG = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+\S+\]\s*(.*)$")
_PY_EXCEPTION = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:.*)?$")


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


def split_error_lines(lines: list[str]) -> tuple[list[str], list[str]]:
    """``(errors, harmless)``: the error lines that can explain a failed start, those that say
    why first (``failed to load``, ``error: creating server``, ...), and the known-harmless
    ones (the router's warmup, CUDA without a GPU)."""
    harmless = [line for line in lines if _HARMLESS.search(line)]
    errors = [line for line in lines if not _HARMLESS.search(line)]
    return sorted(errors, key=lambda line: not _DECISIVE.search(line)), harmless


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


def trace_config_args(
    mode: str = "triton",
    *,
    rate: int = 1000,
    level: str = "TIMESTAMPS",
    count: int = -1,
    file: str | os.PathLike | None = None,
    log_frequency: int = 0,
    url: str | None = None,
    resource: Mapping[str, str] | None = None,
    bsp_schedule_delay_ms: int | None = None,
) -> list[str]:
    """``--trace-config`` flags for ``tritonserver`` (server r24.10 docs/user_guide/trace.md).

    Args:
        mode: ``triton`` (JSON trace file) or ``opentelemetry`` (OTLP/HTTP export).
        rate: trace every ``rate``-th request (Triton's default 1000); 0 traces only requests
            with a propagated OpenTelemetry context.
        level: ``TIMESTAMPS`` (``TENSORS`` too in triton mode), or ``OFF``.
        count: traces to collect before stopping; -1: no limit.
        file: triton mode: the trace file; with ``log_frequency`` N > 0 Triton writes every N
            traces to ``<file>.<index>``, with 0 the whole file at shutdown.
        url: opentelemetry mode: the collector's OTLP/HTTP endpoint,
            e.g. ``http://127.0.0.1:4318/v1/traces`` (Triton's default).
        resource: opentelemetry mode: resource attributes (``service.name`` ...).
        bsp_schedule_delay_ms: opentelemetry mode: the batch span processor's export delay
            (Triton's default 5000 ms).

    Raises:
        ValueError: an unknown mode or level, a negative rate, a triton mode without ``file``.
    """
    if mode not in ("triton", "opentelemetry"):
        raise ValueError(f"trace mode must be 'triton' or 'opentelemetry', not {mode!r}")
    if level not in ("OFF", "TIMESTAMPS", "TENSORS"):
        raise ValueError(f"trace level must be OFF, TIMESTAMPS or TENSORS, not {level!r}")
    if rate < 0:
        raise ValueError(f"trace rate must be >= 0, not {rate}")
    # Triton's defaults (count -1, log-frequency 0) are left out: the same flags as
    # deploy/entrypoint.sh builds (tests/unit/test_deploy.py compares them)
    args = [f"--trace-config=mode={mode}", f"--trace-config=level={level}", f"--trace-config=rate={rate}"]
    if count != -1:
        args.append(f"--trace-config=count={count}")
    if mode == "triton":
        if not file:
            raise ValueError("trace mode 'triton' needs a trace file")
        args.append(f"--trace-config=triton,file={Path(file)}")
        if log_frequency:
            args.append(f"--trace-config=triton,log-frequency={log_frequency}")
    else:
        if url:
            args.append(f"--trace-config=opentelemetry,url={url}")
        for key, value in (resource or {}).items():
            args.append(f"--trace-config=opentelemetry,resource={key}={value}")
        if bsp_schedule_delay_ms is not None:
            args.append(f"--trace-config=opentelemetry,bsp_schedule_delay={bsp_schedule_delay_ms}")
    return args


class TritonServer:
    """A ``tritonserver`` child process serving ``model_repository`` on loopback.

    ``models``: names to load at start (``--load-model``; ``None`` = every model directory,
    see :func:`orchestrator.tooling.repository.list_models`); explicit model control, so more can be loaded later.
    Ports: ``None`` = a free port picked at :meth:`start`; a given port is checked first.
    ``model_config_name``: Triton reads ``<model>/configs/<name>.pbtxt`` where it exists,
    else ``config.pbtxt`` (``None``/``""`` = always ``config.pbtxt``).
    ``log_path``: file for the server's stdout+stderr, appended to after a header line
    with the command (default: a new file under ``<cache>/logs/``). ``startup_timeout``: seconds to wait for readiness.
    ``extra_args``: appended to the command line. ``env``: merged on top of
    :func:`server_environment`. ``cache_dir``: see :func:`default_cache_dir`.
    ``response_cache_bytes``: size of Triton's ``local`` response cache in bytes
    (``--cache-config=local,size=N`` with the wheel's cache directory); it serves the models
    whose configuration has ``response_cache { enable: true }`` (the classifiers, see
    :mod:`orchestrator.tooling.warmup`). None or 0: no cache.
    ``control_key``: restrict the control plane as the shipped image does
    (:func:`orchestrator.tooling.production.restricted_args`: model repository, model
    config, shared memory, statistics, trace and logging need the header ``admin-key``);
    this object's own loads, unloads and index requests send it. None: unrestricted.
    ``backend_dirs``: backend directories whose backends are served beside the wheel's
    Python backend (e.g. a directory holding Triton's ``onnxruntime/``, to serve the
    ``config.pbtxt`` files with ``model_config_name=None``); see
    :func:`orchestrator.tooling.embedded.prepare_backend_directory`.

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
        response_cache_bytes: int | None = None,
        control_key: str | None = None,
        backend_dirs: Sequence[str | os.PathLike] = (),
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.models = list(models) if models is not None else None
        self.host = host
        self.model_config_name = model_config_name
        self.startup_timeout = float(startup_timeout)
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.cache_dir = Path(cache_dir).resolve() if cache_dir else default_cache_dir()
        self.response_cache_bytes = int(response_cache_bytes or 0)
        self.control_key = control_key
        self.backend_dirs = [Path(d) for d in backend_dirs]
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
        ]
        if self.response_cache_bytes > 0:
            if not (embedded.caches / "local").is_dir():
                raise ServerError(f"the nvidia-pytriton wheel has no local response cache under {embedded.caches}")
            cmd += [f"--cache-config=local,size={self.response_cache_bytes}", f"--cache-dir={embedded.caches}"]
        if self.control_key:
            from orchestrator.tooling.production import restricted_args

            cmd += restricted_args(self.control_key)
        cmd += self.extra_args  # last, so they can override the flags above
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
            backend_dir = prepare_backend_directory(self.cache_dir, embedded=embedded, backend_dirs=self.backend_dirs)
            self._stub_env = prepare_stub_environment(self.cache_dir)
            env = server_environment(embedded, self.env, stub_env=self._stub_env)
            if self.backend_dirs:  # backends built from source need libtritonserver.so
                core_lib = prepare_core_library_alias(self.cache_dir, embedded=embedded)
                env["LD_LIBRARY_PATH"] = os.pathsep.join([str(core_lib), env["LD_LIBRARY_PATH"]])
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
                raise self.failure(f"tritonserver exited with status {code} during startup")
            if self.is_ready(timeout=1.0):
                return
            if time.monotonic() > deadline:
                self.stop(timeout=10.0)
                raise self.failure(f"tritonserver was not ready after {self.startup_timeout:g} s")
            time.sleep(0.1)

    def _new_log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(getattr(self, "_log_offset", 0))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def failure(self, what: str) -> ServerError:
        """A ServerError for ``what`` (a sentence) with the error lines this server wrote to
        its log since its last start (else the last 15 lines), the log path, the command
        line, and a hint when a model's import failed."""
        text = self._new_log_text()
        lines, harmless = split_error_lines(extract_error_lines(text))
        if lines:
            detail = "error lines from the log:\n" + "\n".join(f"  {line}" for line in lines)
            if harmless:
                detail += "\nknown harmless lines (warmup, CUDA on a machine without a GPU):\n" + "\n".join(f"  {line}" for line in harmless)
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

    def control_headers(self, protocol: str = "http") -> dict | None:
        """The headers a control-plane request needs (``protocol``: ``http`` or ``grpc``);
        None when the server runs without ``control_key``."""
        if not self.control_key:
            return None
        from orchestrator.tooling.production import KEY_HEADER

        return {(KEY_HEADER if protocol == "http" else f"triton-grpc-protocol-{KEY_HEADER}"): self.control_key}

    def _control(self, action: str, name: str) -> None:
        from tritonclient.utils import InferenceServerException

        client = self.client(network_timeout=max(self.startup_timeout, 60.0))
        try:
            getattr(client, f"{action}_model")(name, headers=self.control_headers())
        except InferenceServerException as exc:
            raise self.failure(f"{action} of model {name!r} failed: {exc.message()}") from exc
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

    def metrics(self) -> prometheus.Samples:
        """Every sample on this server's ``/metrics`` (see :mod:`orchestrator.tooling.prometheus`).
        Raises OSError when the endpoint does not answer."""
        return prometheus.scrape(f"http://{self.metrics_url}/metrics")

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of metric ``name`` on ``/metrics`` whose labels include
        ``labels`` (0.0 when there is none). Raises OSError when the endpoint does not answer."""
        return prometheus.total(self.metrics(), name, **labels)

    def repository_index(self) -> list[dict]:
        """``POST /v2/repository/index``: one dict per model version known to the server,
        ``{"name", "version", "state" ("READY", "UNAVAILABLE", ...), "reason"}``; models
        never loaded have only ``name``."""
        client = self.client()
        try:
            return list(client.get_model_repository_index(headers=self.control_headers()))
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
