"""The demo's footer states the shipped cascade's margin as the policy has it."""

from __future__ import annotations

from orchestrator.runtime.routing.nodes import walk
from orchestrator.runtime.routing.nodes.cascade import CascadeNode
from orchestrator.runtime.routing.policy import load_policy
from orchestrator.tooling.demo import cascade_margin
from tests.helpers import REPO


def test_the_footer_margin_is_the_shipped_cascades():
    policy = load_policy(REPO / "router" / "policy.yaml")
    margins = {c.margin for c in walk(policy.root) if isinstance(c, CascadeNode)}
    assert margins == {cascade_margin(REPO / "router" / "policy.yaml")}


def test_the_demo_takes_the_ports_as_serve_does(monkeypatch):
    """`make demo HTTP_PORT=... GRPC_PORT=... METRICS_PORT=...` reaches the server as `make serve`'s do."""
    import shutil
    import subprocess

    from orchestrator.tooling import demo
    from orchestrator.tooling.server import ServerError
    from tests.helpers import ROOT

    seen = {}

    class Refused:
        def __init__(self, repo, **kwargs):
            seen.update(kwargs)

        def __enter__(self):
            raise ServerError("not started in this test")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(demo, "TritonServer", Refused)
    assert demo.main(["--http-port", "9100", "--grpc-port", "9101", "--metrics-port", "9102"]) == 1
    assert seen == {"http_port": 9100, "grpc_port": 9101, "metrics_port": 9102}
    if shutil.which("make"):
        for target, command in (("demo", "-m orchestrator.tooling.demo"), ("serve", "orchestrator serve")):
            out = subprocess.run(["make", "-n", "-C", str(ROOT), target, "HTTP_PORT=9100", "GRPC_PORT=9101", "METRICS_PORT=9102"],
                                 capture_output=True, text=True, check=True).stdout
            line = next(ln for ln in out.splitlines() if command in ln)
            assert "--http-port 9100 --grpc-port 9101 --metrics-port 9102" in line, line
