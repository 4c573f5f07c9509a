"""``make profile`` end to end on a real tritonserver (short): py-spy attached to the router's
stub while perf_analyzer drives it; the flame graph, the collapsed stacks and the stage
histogram come back, and the router's own code is in the samples."""

from __future__ import annotations

import json

from lab.bench import profile


def test_a_short_profile_of_the_router_stub(tmp_path):
    result = profile.run_profile(tmp_path, levels=[2], seconds=2, rate=100, log=lambda _: None)
    [level] = result["levels"]
    assert (tmp_path / "bench" / "profile_c2.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    stacks = profile.parse_collapsed((tmp_path / "bench" / "profile_c2.txt").read_text())
    assert level["profile"]["samples"] == sum(n for _, n in stacks) > 0
    assert any("(router.py)" in r["function"] for r in level["profile"]["total"]), level["profile"]["total"]
    assert level["throughput"] and level["throughput"] > 0
    # every stage of an execute was observed while the level ran
    assert all(level["stages"][s]["count"] > 0 and level["stages"][s]["mean_us"] > 0 for s in profile.STAGES), level["stages"]
    report = (tmp_path / "benchmarks.md").read_text()
    assert profile.PROFILE_START in report and "### Concurrency 2" in report
    assert json.loads((tmp_path / "bench" / "profile.json").read_text())["levels"][0]["concurrency"] == 2
