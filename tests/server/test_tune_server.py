"""``orchestrator tune --url`` against a real tritonserver: each stage model measured in short
closed loops, the router's own overhead parts fitted from its closed loop on text lists with a
known escalated share (at the margin it serves), every point's predicted throughput with the
overhead in it, the chosen point refused while the router serves another margin, run once it
serves the tuned policy, and checked with the parts fitted at the other margin given
(orchestrator/tooling/tune_throughput.py). The mechanics only: whether the prediction is
within 15% of the measurement needs a quiet machine and longer loops."""

from __future__ import annotations

import shutil

import pytest

from orchestrator.tooling import tune as T
from orchestrator.tooling import tune_throughput as TT
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
        o = c["overhead"]  # fitted on the router as served (the shipped margin)
        assert o["source"] == "fitted" and o["margin"] == T.cascades(T.P.load_policy(policy))[0].margin
        assert [li["stage"] for li in o["lists"]] == [1] * len(TT.OVERHEAD_SHARES) and o["notes"] == []
        for li in o["lists"]:
            assert li["router"]["requests"] > 0 and li["router"]["errors"] == 0 and li["texts"] == 300
            assert li["reach"] == [1.0, li["share"]] and li["stage_cost_s"] == pytest.approx(fast + li["share"] * slow)
        assert [round(li["share"], 2) for li in o["lists"]] == list(TT.OVERHEAD_SHARES)
        parts, curvature = TT.fit_overhead([li["reach"] for li in o["lists"]], [li["router"]["throughput"] for li in o["lists"]],
                                           [fast, slow], [0, 1])
        assert o["parts_s"] == pytest.approx(parts) and o["curvature_s"] == pytest.approx(curvature)
        for p in c["points"]:
            e = p["escalation_rate"]
            assert p["overhead_s"] == pytest.approx(max(0.0, o["parts_s"][0] + e * o["parts_s"][1] + e * e * curvature[1]))
            assert p["predicted_throughput"] == pytest.approx(1 / (p["overhead_s"] + fast + e * slow))
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
        text = T.render(second)
        assert "measured/predicted" in text and "concurrency 2, 1 s per model" in text and "Router overhead o = " in text
        assert "fitted from the router's closed loop at the margin it serves" in text
        # the chosen point checked with the parts fitted at the shipped margin, given: no fit, one loop
        ms = [1000 * x for x in o["parts_s"]]
        third = T.tune(policy, str(data), url=url, out=tmp_path / "c", router_overhead_ms=ms[0],
                       router_stage_overhead_ms=ms[1:], **kw)
        (c,) = third["throughput"]["cascades"]
        assert c["overhead"] == {"parts_s": pytest.approx(o["parts_s"]), "curvature_s": [0.0, 0.0], "source": "given"}
        assert c["router"]["requests"] > 0 and "given: --router-overhead-ms" in T.render(third)
        with capsys.disabled():
            print("\n" + text[text.index("## Throughput"):])
