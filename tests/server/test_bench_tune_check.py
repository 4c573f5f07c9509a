"""``python -m lab.bench.tune_check`` end to end on a real tritonserver, with 1-second loops at
concurrency 2: tune's stage costs and fitted router overhead parts, three router variants each serving its
margin and measured, the arithmetic of every point, and the JSON and the section written. The
mechanics only: whether the predictions are within 15% needs a quiet machine and the default
loops (``make bench-tune-check``)."""

from __future__ import annotations

import json

import pytest

from lab.bench import tune_check as C
from lab.bench.plan import REPO
from lab.bench.report import TUNE_CHECK_END, TUNE_CHECK_START
from orchestrator.runtime.routing import policy as P
from orchestrator.tooling import tune as T
from tests.unit.test_tune import _labeled

pytestmark = pytest.mark.server


def test_the_tune_check_runs_end_to_end_and_writes_its_report(tmp_path, capsys):
    data = _labeled(tmp_path / "val.tsv", 300, 0)
    out = tmp_path / "out"
    out.mkdir()
    (out / "benchmarks.md").write_text("# Benchmarks\n\nkept text\n")
    argv = ["--duration", "1", "--concurrency", "2", "--data", str(data), "--target", "accuracy>=last",
            "--long-texts", "5", "--warmup", "1", "--out", str(out)]
    assert C.main(argv) == 0
    r = json.loads((out / "bench" / "tune_check.json").read_text())
    assert (r["concurrency"], r["duration_s"], r["texts"], r["cascade"]) == (2, 1.0, 300, "cascade")
    assert r["command"] == f"{C.COMMAND} --concurrency 2 --duration 1 --data {data} --target 'accuracy>=last' --long-texts 5 --warmup 1"
    assert r["stages"] == ["classifier_fast", "classifier"] and all(c > 0 for c in r["stage_costs_s"])
    t = r["tune"]
    shipped = T.cascades(P.load_policy(REPO / "router" / "policy.yaml"))[0].margin
    assert t["margin"] == shipped and len(t["parts_s"]) == 2  # fitted at the margin served
    assert [li["stage"] for li in t["lists"]] == [1, 1]
    assert all(li["requests"] > 0 and li["errors"] == 0 for li in t["lists"])
    points = r["points"]
    assert [p["role"] for p in points] == ["chosen", "near 0.2", "near 0.6"]
    assert points[0]["margin"] == t["chosen_margin"] and len({p["margin"] for p in points}) == 3
    for p in points:
        assert p["model"] == C.variant_name(p["margin"])  # each point's own router variant, served and measured
        assert p["requests"] > 0 and p["errors"] == 0, p
        assert p["reach"][0] == 1.0 and p["reach"][1] == pytest.approx(p["escalation_rate"])
        fast, slow = r["stage_costs_s"]
        o = max(0.0, t["parts_s"][0] + p["escalation_rate"] * t["parts_s"][1])
        assert p["tune"]["overhead_s"] == pytest.approx(o)
        assert p["tune"]["predicted"] == pytest.approx(1 / (o + fast + p["escalation_rate"] * slow))
        assert p["tune"]["ratio"] == pytest.approx(p["measured"] / p["tune"]["predicted"])
        assert p["implied_overhead_s"] == pytest.approx(max(0.0, 1 / p["measured"] - fast - p["escalation_rate"] * slow))
        assert sorted(c["overhead_margin"] for c in p["others"]) == sorted(q["margin"] for q in points if q is not p)
    assert r["warmup"]["model"] == "router" and r["warmup"]["requests"] > 0 and r["warmup_s"] == 1.0
    assert all(p["warmup"]["model"] == p["model"] and p["warmup"]["requests"] > 0 for p in points)
    v = r["verdict"]
    assert v["verdict"] in ("met", "not met") and v["checks"] == 3
    # the one constant: each point against the two others (6), and tune's where it ran the chosen point
    assert v["constant"]["checks"] == 6 + (2 if "constant_s" in t else 0)
    text = (out / "benchmarks.md").read_text()
    assert text.startswith("# Benchmarks\n\nkept text\n") and text.count(TUNE_CHECK_START) == 1 and TUNE_CHECK_END in text
    assert "Short loops" in text and f"| {points[1]['margin']:g} | near 0.2 |" in text
    with capsys.disabled():
        print("\n" + text[text.index(TUNE_CHECK_START):])
