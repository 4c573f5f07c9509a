"""ServerOptions: the router reads the hosting tritonserver's command line so it never sends
a model-control request that must fail (a failed pb_utils.load_model can crash Triton 2.51;
test_policy_server.py has the real-server checks)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.ondemand import ModelManager, ServerOptions
from orchestrator.runtime.nodes.model import OnDemand


class FakePb:
    """Just the model-control part of pb_utils, recording every request."""

    def __init__(self, ready=()):
        self.ready, self.requests = set(ready), []

    def is_model_ready(self, name):
        return name in self.ready

    def load_model(self, model_name):
        self.requests.append(("load", model_name))
        self.ready.add(model_name)

    def unload_model(self, model_name):
        self.requests.append(("unload", model_name))
        self.ready.discard(model_name)


class Log:
    def __init__(self):
        self.lines = []

    def log_info(self, m):
        self.lines.append(m)

    log_warn = log_error = log_verbose = log_info


def manager(pb, server, retry=30.0):
    log = Log()
    m = ModelManager(pb, {"spare": OnDemand(idle_timeout_s=60, retry_after_s=retry)}, Metrics(pb, "r"), log, server=server)
    return m, log


def test_parse_reads_mode_and_repositories_in_both_flag_forms(tmp_path):
    argv = ["/opt/tritonserver/bin/tritonserver", "--model-repository=models", "--model-store", "/abs/other",
            "--model-control-mode", "explicit", "--http-port=0"]
    options = ServerOptions.parse(argv, tmp_path)
    assert options.mode == "explicit"
    assert options.repositories == ((tmp_path / "models").resolve(), Path("/abs/other"))


def test_parse_defaults_to_mode_none_and_the_last_mode_wins(tmp_path):
    assert ServerOptions.parse(["tritonserver", "--model-repository=/m"], tmp_path).mode == "none"
    argv = ["tritonserver", "--model-control-mode=explicit", "--model-repository=/m", "--model-control-mode=POLL"]
    assert ServerOptions.parse(argv, tmp_path).mode == "poll"


def test_a_remote_repository_makes_the_repositories_unknown(tmp_path):
    options = ServerOptions.parse(["tritonserver", "--model-repository=/m", "--model-repository=s3://bucket/models"], tmp_path)
    assert options.repositories is None and options.missing("anything") is None


def test_missing_names_the_repositories_searched(tmp_path):
    (tmp_path / "present").mkdir()
    options = ServerOptions(mode="explicit", repositories=(tmp_path,))
    assert options.missing("present") is None
    assert options.missing("absent") == f"model 'absent' is in no model repository ({tmp_path})"


def test_of_parent_is_unknown_outside_tritonserver():
    assert ServerOptions.of_parent() == ServerOptions()  # pytest's parent is not tritonserver


def test_of_parent_reads_a_parent_named_tritonserver(tmp_path):
    """A child of a process named ``tritonserver`` (a copy of this Python) reads its flags."""
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("needs Linux /proc, which Triton's own platform has")
    server = tmp_path / "tritonserver"
    os.symlink(sys.executable, server)
    child = "from orchestrator.runtime.ondemand import ServerOptions; print(ServerOptions.of_parent())"
    parent = textwrap.dedent(f"""
        import subprocess, sys
        sys.exit(subprocess.run([{sys.executable!r}, "-c", {child!r}]).returncode)
    """)
    # argv[0] of the parent is the symlink's path, as for a real tritonserver binary
    out = subprocess.run([str(server), "-c", parent, "--model-repository=repo", "--model-control-mode=explicit"],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(ServerOptions("explicit", ((tmp_path / "repo").resolve(),)))


def test_under_mode_none_no_load_request_is_ever_sent():
    pb = FakePb()
    m, log = manager(pb, ServerOptions(mode="none", repositories=None))
    assert not m.enabled and m.reaper is None
    assert any("--model-control-mode=none" in line and "always loaded" in line for line in log.lines)
    import asyncio

    asyncio.run(m.acquire("spare"))  # treated as loaded: the BLS call itself will say if it is not
    m.release("spare")
    assert pb.requests == []


def test_a_model_in_no_repository_fails_without_a_load_request(tmp_path):
    pb = FakePb()
    m, _ = manager(pb, ServerOptions(mode="explicit", repositories=(tmp_path,)), retry=0.0)
    for _ in range(3):  # retried at once (retry_after_s 0), never sent
        with pytest.raises(DownstreamError, match=r"model 'spare' failed to load: model 'spare' is in no model repository"):
            m._load_blocking("spare")
    assert pb.requests == []
    (tmp_path / "spare").mkdir()  # once it is there, the load is sent
    m._load_blocking("spare")
    assert pb.requests == [("load", "spare")]
    m.close()


def test_with_unknown_options_the_load_is_sent_as_before():
    pb = FakePb()
    m, _ = manager(pb, ServerOptions())
    assert m.enabled
    m._load_blocking("spare")
    assert pb.requests == [("load", "spare")]
    m.close()
