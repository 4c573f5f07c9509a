"""``make profile`` (lab.bench.profile): collapsed stacks read, self and
total shares, the stage histogram between two scrapes, the report section."""

from __future__ import annotations

import pytest

from lab.bench import profile
from orchestrator.tooling import prometheus

COLLAPSED = """\
process 1:"triton_python_backend_stub";thread (0x1);execute (router.py:250);run (engine.py:180);gather (concurrency.py:40) 6
process 1:"triton_python_backend_stub";thread (0x1);execute (router.py:250);_parse (router.py:290) 3
process 1:"triton_python_backend_stub";thread (0x1);execute (router.py:251) 1
"""


def test_collapsed_stacks_and_shares():
    stacks = profile.parse_collapsed(COLLAPSED)
    assert [n for _, n in stacks] == [6, 3, 1] and stacks[1][0][-1] == "_parse (router.py:290)"
    got = profile.summarize(stacks)
    assert got["samples"] == 10
    assert got["self"][0] == {"function": "gather (concurrency.py)", "share": 0.6, "samples": 6}
    assert {r["function"]: r["share"] for r in got["self"]} == {
        "gather (concurrency.py)": 0.6, "_parse (router.py)": 0.3, "execute (router.py)": 0.1}
    total = {r["function"]: r["share"] for r in got["total"]}
    assert total["execute (router.py)"] == 1.0 and total["run (engine.py)"] == 0.6
    assert not any(r["function"].startswith(("process", "thread")) for r in got["total"])
    with pytest.raises(ValueError, match="not a collapsed stack line"):
        profile.parse_collapsed("execute (router.py:1)\n")
    assert profile.parse_collapsed(" 29\n") == [([profile.NO_PYTHON_FRAME], 29)]  # a sample in the stub's C++ code
    assert profile.summarize([]) == {"samples": 0, "self": [], "total": []}


def test_a_recursive_function_counts_once_per_sample_in_total():
    got = profile.summarize(profile.parse_collapsed("a (x.py:1);b (x.py:2);a (x.py:1) 4\n"))
    assert {r["function"]: r["samples"] for r in got["total"]} == {"a (x.py)": 4, "b (x.py)": 4}


def test_stage_means_between_two_scrapes():
    def scrape(count, total):
        return prometheus.parse(
            f'orchestrator_stage_seconds_count{{router="router",stage="parse"}} {count}\n'
            f'orchestrator_stage_seconds_sum{{router="router",stage="parse"}} {total}\n')

    got = profile.stage_means(scrape(10, 0.001), scrape(30, 0.005))
    assert got["parse"] == {"count": 20.0, "mean_us": 200.0}
    assert got["bls"] == {"count": 0.0, "mean_us": 0.0}


def test_render_has_the_markers_and_a_row_per_stage():
    level = {"concurrency": 1, "throughput": 100.0, "p50_ms": 2.0, "load_before": [0.1], "load_during": [1.0],
             "profile": profile.summarize(profile.parse_collapsed(COLLAPSED)),
             "stages": {s: {"count": 1.0, "mean_us": 5.0} for s in profile.STAGES}}
    text = profile.render({"created_utc": "x", "seconds": 5, "rate_hz": 200, "stack": "s", "levels": [level]})
    assert text.startswith(profile.PROFILE_START) and text.endswith(profile.PROFILE_END)
    assert "| `gather (concurrency.py)` | 60.0% |" in text
    assert sum(1 for line in text.splitlines() if line.startswith(("| parse ", "| tokenize ", "| bls ", "| results ", "| respond "))) == 5


def test_wait_quiet_waits_for_the_load_to_fall_and_gives_up_after_its_bound(monkeypatch):
    from lab.bench import machine

    loads = iter([[3.0, 1, 1], [2.0, 1, 1], [0.4, 1, 1]])
    monkeypatch.setattr(machine, "load_average", lambda: next(loads))
    monkeypatch.setattr(machine.time, "sleep", lambda s: None)
    said = []
    assert machine.wait_quiet(1.0, log=said.append) == [0.4, 1, 1] and len(said) == 2
    monkeypatch.setattr(machine, "load_average", lambda: [9.0, 9, 9])
    clock = iter([0.0, 100.0, 200.0, 300.0])
    monkeypatch.setattr(machine.time, "monotonic", lambda: next(clock))
    assert machine.wait_quiet(1.0, max_wait_s=180, log=lambda m: None) == [9.0, 9, 9]  # gave up: the report says loaded
