"""lab/bench/own_split.py: the server's own time of router_single and hand_bls split into the
Python in execute, the BLS crossing and the stub around execute (the arithmetic and the timed
copies; tests/server/test_own_split.py serves them)."""

from __future__ import annotations

import pytest

from lab.bench import own_split as S
from tests.helpers import REPO


def _stats(count, infer, classifier):
    return {"m": {"count": count, "compute_infer": infer},
            S.DOWNSTREAM: {"queue": classifier[0], "compute_input": classifier[1], "compute_infer": classifier[2], "compute_output": classifier[3]}}


def test_split_adds_up_to_the_execute_per_request():
    s0 = _stats(10, 1_000_000, (0, 0, 0, 0))
    s1 = _stats(110, 1_000_000 + 100 * 3_000_000, (100 * 100_000, 100 * 50_000, 100 * 1_500_000, 100 * 50_000))
    t0 = {"executes": 11, "execute_ns": 5, "bls_ns": 7}
    t1 = {"executes": 111, "execute_ns": 5 + 100 * 2_800_000, "bls_ns": 7 + 100 * 2_000_000}
    got = S.split(s0, s1, t0, t1, "m")
    assert got == {"execute_us": 3000.0, "python_us": 800.0, "bls_overhead_us": 300.0, "outside_python_us": 200.0,
                   "classifier_us": 1700.0}
    assert got["python_us"] + got["bls_overhead_us"] + got["classifier_us"] + got["outside_python_us"] == got["execute_us"]


def test_split_refuses_sums_that_do_not_match_the_servers_count():
    s0, s1 = _stats(0, 0, (0, 0, 0, 0)), _stats(100, 1, (0, 0, 0, 0))
    with pytest.raises(ValueError, match="the server counted 100 requests, the timed copy 99 executes"):
        S.split(s0, s1, {"executes": 0, "execute_ns": 0, "bls_ns": 0}, {"executes": 99, "execute_ns": 0, "bls_ns": 0}, "m")


def test_summarize_takes_per_round_differences_and_renders_them():
    rounds = [{"router_single": {f: 100.0 + r for f in S.FIGURES}, "hand_bls": {f: 40.0 for f in S.FIGURES}} for r in range(8)]
    summary = S.summarize(rounds)
    d = summary["difference"]["python_us"]
    assert summary["rounds"] == 8 and summary["models"]["hand_bls"]["python_us"] == 40.0
    assert d["per_round"] == [60.0 + r for r in range(8)] and d["median"] == 63.5 and d["low"] == 60.0 and d["high"] == 67.0
    lines = S.render(summary)
    assert lines[0].startswith("| per request, us (medians of 8 rounds) | `router_single` | `hand_bls` |")
    assert "| Python in `execute`, less the BLS `exec` | 103.5 | 40.0 | 63.5 (60.0 to 67.0) |" in lines
    few = S.render(S.summarize(rounds[:3]))
    assert any("(too few rounds)" in line for line in few)


def test_the_timed_copy_keeps_the_original_model_beside_it(tmp_path):
    import shutil

    from orchestrator.tooling.repository import read_config

    repo = tmp_path / "repo"
    shutil.copytree(REPO / "postprocess", repo / "postprocess", ignore=shutil.ignore_patterns("__pycache__"))
    name = S.add_timed_copy(repo, "postprocess")
    copy = repo / name
    assert name == "postprocess_timed" and read_config(copy / "config.pbtxt").name == "postprocess_timed"
    assert (copy / "1" / "_timed_original.py").read_text() == (REPO / "postprocess" / "1" / "model.py").read_text()
    code = (copy / "1" / "model.py").read_text()
    compile(code, "model.py", "exec")
    assert "_timed_original.py" in code and f"DUMP_EVERY = {S.DUMP_EVERY}" in code and repr(S.TIMINGS) in code
