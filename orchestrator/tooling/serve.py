"""``orchestrator serve`` (and ``python -m orchestrator.tooling.serve``): run the embedded
Triton server in the foreground until Ctrl-C or SIGTERM.

Ports: Triton's standard 8000 (HTTP), 8001 (gRPC) and 8002 (metrics) where they are free
on the host (:func:`standard_ports`), else a free port, and it says which it took instead;
``--http-port`` and the others pin one (an error when it is taken). It prints the URLs and
the log path once the server is ready, and stops the server (no
process of its group left) on SIGINT or SIGTERM, also when started in the background by
a shell, which leaves SIGINT ignored (``tests/server/test_server.py``,
``test_serve_stops_cleanly_on_signal``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from orchestrator.tooling.client import remove_serve_record, write_serve_record
from orchestrator.tooling.paths import MODEL_REPOSITORY_NAME, default_model_repository
from orchestrator.tooling.repository import list_models
from orchestrator.tooling.server import ServerError, TritonServer, port_is_free

__all__ = ["STANDARD_PORTS", "standard_ports", "add_serve_arguments", "serve_command", "main"]

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
        default="embedded",
        help="read <model>/configs/NAME.pbtxt where it exists (default: %(default)s; '' for config.pbtxt)",
    )
    parser.add_argument(
        "--response-cache-mb",
        type=float,
        default=0.0,
        metavar="MB",
        help="Triton's response cache for the models that enable it (the classifiers), in MiB; "
        "0 (the default): no cache (docs/benchmarks.md, 'Response cache', has the trade-off)",
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
    ports, taken = standard_ports(host, {k: getattr(args, f"{k}_port", None) for k in STANDARD_PORTS})
    server = TritonServer(
        _resolve_repository(getattr(args, "repo", None)),
        models=getattr(args, "model", None) or None,
        host=host,
        http_port=ports["http"],
        grpc_port=ports["grpc"],
        metrics_port=ports["metrics"],
        model_config_name=getattr(args, "model_config_name", "embedded") or None,
        log_path=getattr(args, "log_file", None),
        startup_timeout=getattr(args, "startup_timeout", 180.0),
        response_cache_bytes=int(getattr(args, "response_cache_mb", 0.0) * 1024 * 1024),
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
