"""``orchestrator serve`` as a user runs it (a process, Ctrl-C to stop): it prints its start
progress, records where it listens, ``orchestrator classify`` without ``--url`` follows that
record (whatever ports it took), and the record goes when it stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from orchestrator.tooling.paths import PROJECT_ROOT


def test_serve_records_where_it_listens_and_classify_follows(tmp_path):
    cache = tmp_path / "cache" / "triton"
    env = dict(os.environ, ORCHESTRATOR_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    record = cache.parent / "serve.json"
    models = ["tokenizer", "classifier", "postprocess", "ensemble"]
    cmd = [sys.executable, "-m", "orchestrator.tooling.cli", "serve", *[a for m in models for a in ("--model", m)]]
    proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        out = "".join(lines)
        assert out.startswith(f"Starting Triton (embedded) on {PROJECT_ROOT / 'model_repository'}: 4 models to load"), out
        assert record.is_file(), out
        urls = json.loads(record.read_text())
        assert urls["pid"] == proc.pid and f"HTTP     http://{urls['http']}" in out and f"record   {record}" in out
        r = subprocess.run([sys.executable, "-m", "orchestrator.tooling.cli", "classify", "a wonderful, moving film",
                            "--model", "ensemble"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(("positive", "not positive")), r.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    assert "Stopped." in rest and not record.exists()
