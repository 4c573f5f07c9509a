"""``orchestrator tune --url`` against a real tritonserver: each stage model and the router's
own overhead measured in short closed loops, every point's predicted throughput with the
overhead in it, the chosen point refused while the router serves another margin, run once it
serves the tuned policy, and checked against an overhead measured at the other margin
(orchestrator/tooling/tune_throughput.py). The mechanics only: whether the prediction is
within 15% of the measurement needs a quiet machine and longer loops."""

from __future__ import annotations

import shutil

import pytest

from orchestrator.tooling import tune as T
from orchestrator.tooling.server import TritonServer
from tests.helpers import REPO
from tests.unit.test_tune import _labeled

pytestmark = pytest.mark.server


def test_tune_predicts_throughput_on_the_server_and_runs_the_chosen_point_only_where_it_is_served(tmp_path, capsys):
    repo = tmp_path / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"))
    data = _labeled(tmp_path / "val.tsv", 300, 0)
    policy = repo / "router" / "policy.yaml"
    kw = dict(repo=repo, target="accuracy>=last", long_n=5, concurrency=2, duration_s=1.0)
    with TritonServer(repo, models=["classifier", "classifier_fast", "router"]) as server:
        url = f"grpc://{server.grpc_url}"
        first = T.tune(policy, str(data), url=url, out=tmp_path / "a", **kw)
        t = first["throughput"]
        assert t["concurrency"] == 2 and t["duration_s"] == 1.0 and "overhead" in t["formula"]
        assert set(t["models"]) == {"classifier", "classifier_fast"}
        for m in t["models"].values():
            assert m["requests"] > 0 and m["errors"] == 0 and m["cost_s"] == pytest.approx(1 / m["throughput"])
        (c,) = t["cascades"]
        assert len(c["points"]) == len(T.MARGINS) and (tmp_path / "a" / "throughput_cascade.png").is_file()
        fast, slow = t["models"]["classifier_fast"]["cost_s"], t["models"]["classifier"]["cost_s"]
        o = c["overhead"]  # measured on the router as served (the shipped margin)
        assert o["source"] == "measured" and o["router"]["requests"] > 0 and o["router"]["errors"] == 0
        assert o["margin"] == T.cascades(T.P.load_policy(policy))[0].margin and o["overhead_s"] >= 0.0
        assert o["overhead_s"] == pytest.approx(max(0.0, 1 / o["router"]["throughput"] - o["stage_cost_s"]))
        for p in c["points"]:
            assert p["predicted_throughput"] == pytest.approx(1 / (o["overhead_s"] + fast + p["escalation_rate"] * slow))
        chosen = first["cascades"][0]["chosen"]["margin"]
        served = T.P.load_policy(policy)
        if T.cascades(served)[0].margin != chosen:  # the shipped margin: not what was chosen on these texts
            assert "router" not in c and f"margin {T.cascades(served)[0].margin:g}, not the chosen" in c["router_not_run"]
        # serve the tuned policy, then the chosen point runs on the server
        shutil.copy(tmp_path / "a" / "policy.yaml", policy)
        server.load_model("router")
        second = T.tune(policy, str(data), url=url, out=tmp_path / "b", **kw)
        (c,) = second["throughput"]["cascades"]
        assert "router_not_run" not in c, c.get("router_not_run")
        r = c["router"]
        assert r["requests"] > 0 and r["errors"] == 0
        assert r["measured_over_predicted"] == pytest.approx(r["throughput"] / c["chosen"]["predicted_throughput"])
        assert r["overhead_measured_here"] is (c["overhead"]["margin"] == c["chosen"]["margin"])
        text = T.render(second)
        assert "measured/predicted" in text and "concurrency 2, 1 s per model" in text and "Router overhead o = " in text
        # the chosen point checked against the overhead measured at the shipped margin: not a calibration
        third = T.tune(policy, str(data), url=url, out=tmp_path / "c", router_overhead_ms=1000 * o["overhead_s"], **kw)
        (c,) = third["throughput"]["cascades"]
        assert c["overhead"] == {"overhead_s": pytest.approx(o["overhead_s"]), "source": "given"}
        assert c["router"]["requests"] > 0 and c["router"]["overhead_measured_here"] is False
        with capsys.disabled():
            print("\n" + text[text.index("## Throughput"):])
