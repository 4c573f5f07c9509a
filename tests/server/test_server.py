"""Tests of orchestrator.tooling.server, .embedded and .serve: the embedded Triton 2.51 server
from nvidia-pytriton.

Tests marked ``server`` start a real ``tritonserver`` on loopback with the tiny model
repositories under tests/fixtures/ (``models/``: identity, doubler; ``broken_models/``:
broken). One module-scoped server serves most of them; a start takes about 2 s and a
clean stop about 2-3 s on these machines.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from orchestrator.tooling import embedded, prometheus, serve
from orchestrator.tooling.server import ServerError, TritonServer, extract_error_lines
from tests.helpers import FIXTURES, ROOT

MODELS = FIXTURES / "server" / "models"
BROKEN = FIXTURES / "server" / "broken_models"

try:
    EMBEDDED = embedded.find_embedded_server()
    NO_SERVER = ""
except ServerError as exc:  # the wheel is a project dependency; skip rather than fail
    EMBEDDED = None
    NO_SERVER = str(exc)

needs_server = pytest.mark.skipif(EMBEDDED is None, reason=NO_SERVER or "no embedded server")


def group_members(pgid: int) -> list[tuple[int, str, str]]:
    """(pid, command name, state) of every process in process group ``pgid`` (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after the ')'.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            members.append((int(entry), comm, fields[0]))
    return members


def live_members(pgid: int) -> list[tuple[int, str, str]]:
    return [m for m in group_members(pgid) if m[2] != "Z"]


def infer(url: str, model: str, x: np.ndarray, protocol: str = "http") -> np.ndarray:
    """INPUT0 -> OUTPUT0 (FP32) of ``model`` through tritonclient's ``protocol`` client."""
    if protocol == "http":
        import tritonclient.http as client_module
    else:
        import tritonclient.grpc as client_module

    client = client_module.InferenceServerClient(url)
    try:
        inp = client_module.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()  # an open HTTP connection delays Triton's shutdown (EXIT_TIMEOUT_SECS)


@pytest.fixture(scope="module")
def server():
    """One server for the module: every model of tests/fixtures/server/models (models=None)."""
    with TritonServer(MODELS, startup_timeout=120) as srv:
        yield srv


# ----------------------------------------------------------------------------------------
# No server process needed


@needs_server
def test_find_embedded_server_paths():
    assert EMBEDDED.server.name == "tritonserver" and os.access(EMBEDDED.server, os.X_OK)
    assert (EMBEDDED.backends / "python" / "libtriton_python.so").is_file()
    assert EMBEDDED.stub().parent.name == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert EMBEDDED.libs.name == "nvidia_pytriton.libs"
    with pytest.raises(ServerError, match="no Python-backend stub for Python 2.7"):
        EMBEDDED.stub((2, 7))


@needs_server
def test_prepare_backend_directory_is_idempotent_and_concurrency_safe(tmp_path):
    results, errors = [], []

    def prepare():
        try:
            results.append(embedded.prepare_backend_directory(tmp_path))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=prepare) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and set(results) == {tmp_path / "backends"}
    python = tmp_path / "backends" / "python"
    stub = python / "triton_python_backend_stub"
    assert stub.read_bytes() == EMBEDDED.stub().read_bytes() and os.access(stub, os.X_OK)
    assert (python / "libtriton_python.so").is_file()
    utils = EMBEDDED.backends / "python" / "triton_python_backend_utils.py"
    assert (python / "triton_python_backend_utils.py").read_bytes() == utils.read_bytes()
    assert not [p for p in python.iterdir() if p.name.endswith(".tmp")]
    before = {p.name: p.stat().st_mtime_ns for p in python.iterdir()}
    embedded.prepare_backend_directory(tmp_path)
    assert {p.name: p.stat().st_mtime_ns for p in python.iterdir()} == before
    # A stub for another Python version replaces the file in place (atomically).
    other = (3, 12) if sys.version_info[:2] != (3, 12) else (3, 11)
    embedded.prepare_backend_directory(tmp_path, python_version=other)
    assert stub.read_bytes() == EMBEDDED.stub(other).read_bytes()


def test_prepare_stub_environment(tmp_path):
    root = embedded.prepare_stub_environment(tmp_path)
    assert root == tmp_path / "stub_env" / f"py{sys.version_info[0]}.{sys.version_info[1]}"
    assert os.path.realpath(root / "bin" / "python3") == os.path.realpath(sys._base_executable)
    cfg = (root / "pyvenv.cfg").read_text()
    assert f"home = {Path(sys._base_executable).parent}" in cfg
    site_packages = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    assert (site_packages / "_orchestrator_stub_path.pth").read_text() == "import _orchestrator_stub_path\n"
    assert embedded.prepare_stub_environment(tmp_path) == root  # idempotent
    # The .pth module puts PYTHONPATH entries first, as PYTHONPATH does (run isolated: -I).
    code = f"import sys; sys.path.insert(0, {str(site_packages)!r}); import _orchestrator_stub_path; print(sys.path[0])"
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(tmp_path)


@needs_server
def test_command_line_and_environment(tmp_path):
    srv = TritonServer(MODELS, http_port=18000, grpc_port=18001, metrics_port=18002, env={"FOO": "bar"})
    srv._ports = {"http": 18000, "grpc": 18001, "metrics": 18002}
    cmd = srv.build_command(EMBEDDED, tmp_path)
    assert cmd[0] == str(EMBEDDED.server)
    for flag in (
        f"--model-repository={MODELS.resolve()}",
        "--model-control-mode=explicit",
        "--load-model=doubler",
        "--load-model=identity",
        "--model-config-name=embedded",
        f"--backend-directory={tmp_path}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--http-port=18000",
        "--grpc-port=18001",
        "--metrics-port=18002",
        "--log-verbose=0",
        "--exit-on-error=true",
        "--strict-readiness=true",
    ):
        assert flag in cmd
    one = TritonServer(MODELS, models=["identity"], model_config_name=None, extra_args=["--exit-timeout-secs=1"])
    one._ports = srv._ports
    cmd = one.build_command(EMBEDDED, tmp_path)
    assert [a for a in cmd if a.startswith("--load-model")] == ["--load-model=identity"]
    assert not any(a.startswith("--model-config-name") for a in cmd)
    assert cmd[-1] == "--exit-timeout-secs=1"  # extra args come last and win

    env = embedded.server_environment(
        EMBEDDED, {"FOO": "bar", "HF_HUB_OFFLINE": "0"},
        base={"LD_LIBRARY_PATH": "/x", "PATH": "/bin", "PYTHONPATH": "/pp"}, stub_env="/s"
    )
    ld = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert ld[0] == str(EMBEDDED.libs) and ld[-1] == "/x"
    assert env["PATH"].split(os.pathsep) == ["/s/bin", "/bin"]
    pythonpath = env["PYTHONPATH"].split(os.pathsep)
    assert pythonpath[0] == str(ROOT)
    import numpy

    assert str(Path(numpy.__file__).parent.parent) in pythonpath  # site-packages
    # the caller's PYTHONPATH before site-packages, as Python orders them
    assert pythonpath[1] == "/pp" and pythonpath.index("/pp") < pythonpath.index(str(Path(numpy.__file__).parent.parent))
    assert env["FOO"] == "bar" and env["HF_HUB_OFFLINE"] == "0"
    assert env["TRANSFORMERS_OFFLINE"] == "1" and env["TOKENIZERS_PARALLELISM"] == "false"


def test_extract_error_lines():
    log = "\n".join(
        [
            'W1122 07:21:23.101679 3847 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory"',
            'E1122 07:21:23.101916 3847 server.cc:241] "CudaDriverHelper has not been initialized."',
            'I1122 07:21:23.103432 3847 model_lifecycle.cc:472] "loading: m:1"',
            'E1122 07:21:23.167537 3847 model_lifecycle.cc:642] "failed to load \'m\' version 1: '
            "Internal: RuntimeError: boom\\n\\nAt:\\n  /x/model.py(5): initialize\\n\"",
            "| m | 1 | UNAVAILABLE: Internal: RuntimeError: boom |",
            "Error: Failed to initialize NVML",
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in <module>',
            "ValueError: bad value",
            "error: creating server: Invalid argument - load failed for model 'm'",
        ]
    )
    assert extract_error_lines(log) == [
        "failed to load 'm' version 1: Internal: RuntimeError: boom",
        "ValueError: bad value",
        "error: creating server: Invalid argument - load failed for model 'm'",
    ]


def test_serve_command_reports_server_error(tmp_path, capsys):
    parser = serve.add_serve_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--repo", str(tmp_path / "missing")])
    assert serve.serve_command(args) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_given_port_in_use_is_named(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerError, match=rf"port {port} is already in use .*--http-port"):
            TritonServer(MODELS, http_port=port, log_path=tmp_path / "s.log").start()


# ----------------------------------------------------------------------------------------
# Real server


@needs_server
@pytest.mark.server
@pytest.mark.timeout(180)
def test_infers_over_http_and_grpc(server):
    assert server.is_ready()
    assert server.http_url == f"127.0.0.1:{server.http_port}"
    assert len({server.http_port, server.grpc_port, server.metrics_port}) == 3
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(infer(server.http_url, "identity", x), x)
    np.testing.assert_array_equal(infer(server.grpc_url, "identity", x, "grpc"), x)
    # doubler's config.pbtxt says onnxruntime_onnx (absent from the wheel): it only loads
    # because --model-config-name=embedded picks configs/embedded.pbtxt.
    np.testing.assert_array_equal(infer(server.http_url, "doubler", x), 2 * x)
    assert prometheus.total(server.metrics(), "nv_inference_request_success", model="identity") >= 2


@needs_server
@pytest.mark.server
@pytest.mark.timeout(180)
def test_load_unload_and_repository_index(server):
    from tritonclient.utils import InferenceServerException

    def state(name):
        return {m["name"]: m.get("state") for m in server.repository_index()}[name]

    assert state("identity") == "READY" and state("doubler") == "READY"
    server.unload_model("doubler")
    assert state("doubler") == "UNAVAILABLE"
    x = np.ones((1, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException):
        infer(server.http_url, "doubler", x)
    server.load_model("doubler")
    assert state("doubler") == "READY"
    np.testing.assert_array_equal(infer(server.http_url, "doubler", x), 2 * x)
    with pytest.raises(ServerError, match="no_such_model"):
        server.load_model("no_such_model")


@needs_server
@pytest.mark.server
@pytest.mark.timeout(60)
def test_port_of_running_server_is_reported(server, tmp_path):
    with pytest.raises(ServerError, match=rf"port {server.grpc_port} is already in use .*--grpc-port"):
        TritonServer(MODELS, grpc_port=server.grpc_port, log_path=tmp_path / "s.log").start()


@needs_server
@pytest.mark.server
@pytest.mark.timeout(180)
def test_stop_leaves_no_process(tmp_path):
    log = tmp_path / "server.log"
    with TritonServer(MODELS, models=["identity"], log_path=log) as srv:
        pid = srv.pid
        names = {name for _, name, _ in live_members(pid)}
        assert "tritonserver" in names
        assert any(name.startswith("triton_python") for name in names)  # the model's stub
        assert srv.log_path == log
    assert not srv.running and not live_members(pid)
    srv.stop()  # idempotent
    assert "Started HTTPService at 127.0.0.1:" in log.read_text()


@needs_server
@pytest.mark.server
@pytest.mark.timeout(180)
def test_broken_model_error_names_model_and_exception(tmp_path):
    log = tmp_path / "broken.log"
    srv = TritonServer(BROKEN, log_path=log)
    with pytest.raises(ServerError) as info:
        srv.start()
    message = str(info.value)
    assert "'broken'" in message
    assert "boom: broken on purpose" in message
    assert str(log) in message and "--load-model=broken" in message
    assert not srv.running and not live_members(srv.pid)


@needs_server
@pytest.mark.server
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_cleanly_on_signal(tmp_path, sig):
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "orchestrator.tooling.serve", "--repo", str(MODELS), "--model", "identity", "--log-file", str(log)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    out = []
    try:
        deadline = time.monotonic() + 120
        while not out or "Press Ctrl-C" not in out[-1]:
            out.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        text = "".join(out)
        pid = int(text.split(", pid ")[1].split()[0])
        http = text.split("HTTP     http://")[1].split()[0]
        assert str(log) in text and "models   identity from" in text
        assert live_members(pid)
        x = np.ones((3, 4), dtype=np.float32)
        np.testing.assert_array_equal(infer(http, "identity", x), x)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, "".join(out)
        assert not live_members(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
