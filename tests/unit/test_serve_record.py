"""One notion of "the server": ``orchestrator serve`` records where it listens
(``.cache/serve.json``), ``classify`` follows the record, and a service on the port that is
not Triton is named as such instead of "Parse error at offset 0" and an HTML page. Fake HTTP
servers on loopback; ``serve``'s start progress from its log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.tooling import client as C
from orchestrator.tooling import serve
from orchestrator.tooling.cli import main
from orchestrator.tooling.paths import PROJECT_ROOT


def _fake_server(status: int, ctype: str, body: bytes):
    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture
def html_service():
    httpd, url = _fake_server(200, "text/html; charset=utf-8", b"<!DOCTYPE html><html><body>Jenkins dashboard</body></html>")
    yield url
    httpd.shutdown()


@pytest.fixture
def record(tmp_path, monkeypatch):
    path = tmp_path / "serve.json"
    monkeypatch.setattr(C, "serve_record_path", lambda: path)
    return path


def test_classify_names_a_service_that_is_not_triton(html_service, record, capsys):
    assert main(["classify", "hello", "--url", html_service]) == 1
    err = capsys.readouterr().err
    assert f"the service at {html_service} is not a Triton server (GET /v2 answered HTTP 200, text/html" in err
    assert "Jenkins dashboard" in err and "Parse error" not in err and "Traceback" not in err


def test_a_triton_like_v2_answer_is_not_flagged():
    doc = json.dumps({"name": "triton", "version": "2.51.0", "extensions": ["classification"]}).encode()
    httpd, url = _fake_server(200, "application/json", doc)
    try:
        assert C.not_triton(url) is None
    finally:
        httpd.shutdown()
    assert C.not_triton(f"127.0.0.1:{httpd.server_address[1]}", timeout_s=1) is None  # nothing answers: not this error


def test_classify_follows_the_record_of_a_running_serve(html_service, record, capsys):
    assert C.default_url("http") == C.DEFAULT_URLS["http"]  # no record: Triton's standard port
    C.write_serve_record({"http": html_service, "grpc": "127.0.0.1:1", "metrics": "127.0.0.1:2"}, os.getpid())
    assert C.default_url("http") == html_service and C.default_url("grpc") == "127.0.0.1:1"
    assert main(["classify", "hello"]) == 1  # no --url: the recorded one (here a fake, so it says so)
    assert f"the service at {html_service} is not a Triton server" in capsys.readouterr().err


def test_a_record_of_a_process_that_is_gone_is_ignored_and_only_its_owner_removes_it(record):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    C.write_serve_record({"http": "127.0.0.1:9"}, int(dead.stdout))
    assert C.read_serve_record() is None and C.default_url("http") == C.DEFAULT_URLS["http"]
    C.write_serve_record({"http": "127.0.0.1:9"}, os.getpid())
    C.remove_serve_record(os.getpid() + 1)  # another serve's stop: not ours to remove
    assert record.exists()
    C.remove_serve_record(os.getpid())
    assert not record.exists()
    record.write_text("not json")
    assert C.read_serve_record() is None


def test_the_record_lives_under_the_cache_not_the_tracked_tree(monkeypatch):
    monkeypatch.delenv("ORCHESTRATOR_CACHE_DIR", raising=False)
    assert C.serve_record_path() == PROJECT_ROOT / ".cache" / "serve.json"


def test_serve_start_progress_counts_loaded_models(tmp_path):
    log = tmp_path / "triton.log"
    assert serve.loaded_count(log) == 0
    log.write_text('I1125 model_lifecycle.cc:839] "successfully loaded \'tokenizer\'"\n'
                   "I1125 loading: classifier:1\n"
                   'I1125 model_lifecycle.cc:839] "successfully loaded \'classifier\'"\n')
    assert serve.loaded_count(log) == 2


def test_make_serve_passes_its_port_variables():
    """What `make serve HTTP_PORT=...` runs (make -n: printed, not run); `make demo` takes the same (test_demo.py)."""
    import shutil
    import subprocess

    if not shutil.which("make"):
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-C", str(PROJECT_ROOT), "serve", "HTTP_PORT=9000", "GRPC_PORT=9001", "METRICS_PORT=9002"],
                         capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if "orchestrator serve" in ln)
    assert line.split("orchestrator serve", 1)[1].split() == ["--http-port", "9000", "--grpc-port", "9001", "--metrics-port", "9002"]
    bare = subprocess.run(["make", "-n", "-C", str(PROJECT_ROOT), "serve"], capture_output=True, text=True, check=True).stdout
    assert next(ln for ln in bare.splitlines() if "orchestrator serve" in ln).split("orchestrator serve", 1)[1].split() == []
