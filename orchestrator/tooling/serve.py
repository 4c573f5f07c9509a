"""``orchestrator serve`` (and ``python -m orchestrator.tooling.serve``): run the embedded
Triton server in the foreground until Ctrl-C or SIGTERM.

Ports: Triton's standard 8000 (HTTP), 8001 (gRPC) and 8002 (metrics) where they are free
on the host (:func:`standard_ports`), else a free port, and it says which it took instead;
``--http-port`` and the others pin one (an error when it is taken). ``--backend-dir`` adds
the backends of another backend directory (Triton's ``onnxruntime``, built for this
release) beside the wheel's Python backend; with ``onnxruntime`` among them the server
reads the shipped ``config.pbtxt`` files unless ``--model-config-name`` says otherwise
(:func:`resolve_model_config_name`), and ``--instance-kind-cpu`` serves a copy of the
repository whose ``KIND_GPU`` instance groups are ``KIND_CPU`` (:func:`cpu_instance_copy`),
for a machine without a GPU (docs/guides/gpu.md). It prints the URLs and
the log path once the server is ready, and stops the server (no
process of its group left) on SIGINT or SIGTERM, also when started in the background by
a shell, which leaves SIGINT ignored (``tests/server/test_server.py``,
``test_serve_stops_cleanly_on_signal``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from orchestrator.tooling import repository
from orchestrator.tooling.client import remove_serve_record, write_serve_record
from orchestrator.tooling.embedded import default_cache_dir, extra_backends
from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.paths import MODEL_REPOSITORY_NAME, default_model_repository
from orchestrator.tooling.repository import list_models
from orchestrator.tooling.server import ServerError, TritonServer, port_is_free

__all__ = [
    "STANDARD_PORTS",
    "standard_ports",
    "resolve_model_config_name",
    "cpu_instance_copy",
    "add_serve_arguments",
    "serve_command",
    "main",
]

#: Triton's own defaults, which clients (and the README) expect.
STANDARD_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}


def standard_ports(host: str, given: dict) -> tuple:
    """``(ports, taken)``: for each of ``http``, ``grpc``, ``metrics`` the port given (not
    None), else its :data:`STANDARD_PORTS` entry when free on ``host``, else None (the
    server picks a free one); ``taken``: kind -> the standard port that was not free."""
    probe = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    ports, taken = {}, {}
    for kind, standard in STANDARD_PORTS.items():
        if given.get(kind) is not None:
            ports[kind] = given[kind]
        elif standard not in given.values() and port_is_free(standard, probe):
            ports[kind] = standard
        else:
            ports[kind] = None
            taken[kind] = standard
    return ports, taken


def taken_notes(taken: dict, urls: dict) -> list:
    """One line per standard port that was in use: which port the server took instead
    (``urls``: kind -> ``host:port`` the server listens on)."""
    return [f"port {standard} was in use, so {kind} took {urls[kind].rsplit(':', 1)[-1]} instead"
            + (f" (clients: --url {urls[kind]})" if kind != "metrics" else "")
            for kind, standard in taken.items()]


def resolve_model_config_name(given: str | None, backends: Sequence[str]) -> str | None:
    """The ``--model-config-name`` to serve with: ``given`` when set (``""``: None, i.e.
    ``config.pbtxt``); else None when ``onnxruntime`` is among ``backends`` (the shipped
    classifier configs are ``platform: "onnxruntime_onnx"``), else ``"embedded"`` (the
    wheel has no ONNX Runtime backend, so the classifiers run as Python models)."""
    if given is not None:
        return given or None
    return None if "onnxruntime" in backends else "embedded"


def cpu_instance_copy(source: str | Path, dest: str | Path) -> list[Path]:
    """Copy model repository ``source`` to ``dest`` (which must not exist) and change every
    ``KIND_GPU`` instance group to ``KIND_CPU`` (its ``gpus`` list cleared) in the copy's
    configuration files (``config.pbtxt`` and ``configs/*.pbtxt``). Returns the files
    changed. Everything else is copied as it is (ONNX files, warmup data, policy), and a
    changed file is parsed and written with Triton's ``model_config.proto``
    (:mod:`orchestrator.tooling.repository`: its header comments are kept, one line is
    added, comments inside are dropped), so only the kind differs from what ships. Triton
    has no flag to override an instance kind; a ``KIND_GPU`` model fails to load without a
    GPU ("no GPUs are available").

    Raises ConfigError for a configuration that does not parse, OSError when the copy fails.
    """
    from tritonclient.grpc import model_config_pb2

    source, dest = Path(source), Path(dest)
    shutil.copytree(source, dest, symlinks=True)
    changed = []
    for model_dir in sorted(p for p in dest.iterdir() if p.is_dir()):
        for path in repository.model_config_paths(model_dir):
            config = repository.read_config(path)
            groups = [g for g in config.instance_group if g.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU]
            for group in groups:
                group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
            if groups:
                header = repository.header_lines(path) + [
                    f"Copied from {source}; KIND_GPU changed to KIND_CPU (orchestrator.tooling.serve.cpu_instance_copy)."
                ]
                repository.write_config(path, config, header)
                changed.append(path)
    return changed


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator serve`` options to ``parser`` (returned for chaining)."""
    parser.add_argument(
        "--repo",
        default=None,
        help=f"model repository (default: ./{MODEL_REPOSITORY_NAME}, else the one in this checkout)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, loopback)")
    parser.add_argument("--http-port", type=int, default=None, help="HTTP port (default: 8000 when free, else a free port)")
    parser.add_argument("--grpc-port", type=int, default=None, help="gRPC port (default: 8001 when free, else a free port)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="metrics port (default: 8002 when free, else a free port)")
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="NAME",
        help="model to load at start; repeat for several (default: every model of the repository)",
    )
    parser.add_argument(
        "--model-config-name",
        default=None,
        help="read <model>/configs/NAME.pbtxt where it exists ('' for config.pbtxt; default: "
        "embedded, or config.pbtxt when --backend-dir gives an onnxruntime backend)",
    )
    parser.add_argument(
        "--backend-dir",
        action="append",
        default=None,
        metavar="DIR",
        help="a backend directory (holding e.g. onnxruntime/libtriton_onnxruntime.so, built for "
        "Triton 2.51) whose backends are served beside the Python backend; repeatable",
    )
    parser.add_argument(
        "--instance-kind-cpu",
        action="store_true",
        help="serve a copy of the repository (under the cache, removed at stop) whose KIND_GPU "
        "instance groups are KIND_CPU, for a machine without a GPU",
    )
    parser.add_argument(
        "--response-cache-mb",
        type=float,
        default=0.0,
        metavar="MB",
        help="Triton's response cache for the models that enable it (the classifiers), in MiB; "
        "0 (the default): no cache (docs/results/benchmarks.md, 'Response cache', has the trade-off)",
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


def loaded_count(log: Path) -> int:
    """Models the server's log says it loaded so far (``successfully loaded '<name>'`` lines)."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            return sum("successfully loaded '" in line for line in f)
    except OSError:
        return 0


def _start_progress(server: TritonServer, total: int, interval: float = 5.0) -> threading.Event:
    """Print, every ``interval`` s until the returned event is set, how far the start is."""
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(interval):
            print(f"  ... {time.monotonic() - started:.0f} s: {loaded_count(server.log_path)} of {total} models loaded",
                  flush=True)

    threading.Thread(target=tick, name="serve-progress", daemon=True).start()
    return done


class _Terminate(BaseException):
    """Raised from the SIGTERM handler of `serve` to leave the wait loop."""


def serve_command(args: argparse.Namespace) -> int:  # noqa: C901 (start, wait and stop with the signals in one place)
    """Run ``orchestrator serve``: start the server, print its URLs and log path, block
    until Ctrl-C or SIGTERM, stop it. Returns 0 after a clean stop, 1 on ServerError
    (message on stderr) or if the server dies while serving."""
    host = getattr(args, "host", "127.0.0.1")
    backend_dirs = getattr(args, "backend_dir", None) or []
    try:
        backends = sorted(extra_backends(backend_dirs))
    except ServerError as exc:
        print(f"error: --backend-dir: {exc}", file=sys.stderr)
        return 1
    config_name = resolve_model_config_name(getattr(args, "model_config_name", None), backends)
    repo = _resolve_repository(getattr(args, "repo", None))
    copy_root = None
    if getattr(args, "instance_kind_cpu", False):
        copies = default_cache_dir() / "repositories"
        copies.mkdir(parents=True, exist_ok=True)
        copy_root = Path(tempfile.mkdtemp(prefix="kind-cpu-", dir=copies))
        try:
            cpu_instance_copy(repo, copy_root / repo.name)
        except (ConfigError, OSError) as exc:
            shutil.rmtree(copy_root, ignore_errors=True)
            print(f"error: --instance-kind-cpu: cannot copy {repo}: {exc}", file=sys.stderr)
            return 1
        repo = copy_root / repo.name
    ports, taken = standard_ports(host, {k: getattr(args, f"{k}_port", None) for k in STANDARD_PORTS})
    server = TritonServer(
        repo,
        models=getattr(args, "model", None) or None,
        host=host,
        http_port=ports["http"],
        grpc_port=ports["grpc"],
        metrics_port=ports["metrics"],
        model_config_name=config_name,
        log_path=getattr(args, "log_file", None),
        startup_timeout=getattr(args, "startup_timeout", 180.0),
        response_cache_bytes=int(getattr(args, "response_cache_mb", 0.0) * 1024 * 1024),
        backend_dirs=backend_dirs,
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
            total = len(server.models) if server.models is not None else len(list_models(server.model_repository,
                                                                                          server.model_config_name))
            print(f"Starting Triton (embedded) on {server.model_repository}: {total} models to load "
                  f"(15-35 s on 2 cores); log {server.log_path}", flush=True)
            progress = _start_progress(server, total)
            try:
                server.start()
            finally:
                progress.set()
            print(f"Triton Inference Server (embedded, nvidia-pytriton) ready, pid {server.pid}")
            print(f"  HTTP     http://{server.http_url}")
            print(f"  gRPC     {server.grpc_url}")
            print(f"  metrics  http://{server.metrics_url}/metrics")
            print(f"  models   {', '.join(server.startup_models) or '(none)'} from {server.model_repository}")
            print(f"  configs  {f'configs/{config_name}.pbtxt where present, else ' if config_name else ''}config.pbtxt"
                  + (f"; backends python, {', '.join(backends)}" if backends else ""))
            if server.response_cache_bytes:
                print(f"  cache    {server.response_cache_bytes / 2**20:g} MiB response cache")
            print(f"  log      {server.log_path}")
            urls = {"http": server.http_url, "grpc": server.grpc_url, "metrics": server.metrics_url}
            for note in taken_notes(taken, urls):
                print(f"  note: {note}")
            record = write_serve_record({"http": server.http_url, "grpc": server.grpc_url, "metrics": server.metrics_url},
                                        os.getpid())
            print(f"  record   {record} (`orchestrator classify` uses these URLs while this runs)")
            print("Press Ctrl-C to stop.", flush=True)
            while server.running:
                time.sleep(0.5)
            print(server.failure(f"tritonserver exited with status {server.returncode}"), file=sys.stderr)
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
            remove_serve_record(os.getpid())
            server.stop()
            if copy_root is not None:
                shutil.rmtree(copy_root, ignore_errors=True)
        finally:
            for sig, handler in previous.items():
                if handler is not None:  # None: a handler not installed from Python
                    signal.signal(sig, handler)
    if rc == 0:
        print("Stopped.", flush=True)
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.tooling.serve [serve options]``."""
    parser = add_serve_arguments(
        argparse.ArgumentParser(prog="python -m orchestrator.tooling.serve", description="Run the embedded Triton server.")
    )
    return serve_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
