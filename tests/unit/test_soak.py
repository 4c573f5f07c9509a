"""The soak's logic without a server: the answer check, the ledger (lost, duplicated,
mismatched), the report's verdict, stub processes found through /proc, the CLI options."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from orchestrator.tooling.soak import procs
from orchestrator.tooling.soak.command import add_soak_arguments, config_from_args
from orchestrator.tooling.soak.ledger import Ledger, Record, error_key
from orchestrator.tooling.soak.report import failed, goals, markdown, oversized_summary, recovery, summarize, totals
from orchestrator.tooling.soak.runner import SHORT, models_to_load
from orchestrator.tooling.soak.workload import (
    LONG_MIN_CHARS,
    Reference,
    RequestSpec,
    TextPool,
    build_pool,
    cascade_margin,
    check_answer,
    chunk_stops_early,
    compute_references,
    draw_request,
    fast_texts,
    needed_models,
    route_model,
)
from tests.helpers import REPO


@pytest.fixture
def pool():
    p = TextPool(["", "good", "bad", "long " * 300], ["empty", "short", "short", "long"])
    p.references = {1: Reference(0.9, 0.8, False), 2: Reference(0.45, 0.2, False), 3: Reference(0.3, 0.35, True)}
    return p


def spec(texts, thresholds, route=None, rid="r1"):
    return RequestSpec(rid, tuple(texts), tuple(thresholds), route, "http")


def test_route_model_strips_chunked_and_degraded():
    assert route_model("chunked:classifier_fast:degraded") == "classifier_fast"
    assert route_model("chunked:classifier_fast:windows=1/3") == "classifier_fast"
    assert route_model("chunked:classifier_fast:degraded:windows=2/4") == "classifier_fast"
    assert route_model("classifier_fast:degraded") == "classifier_fast"
    assert route_model("chunked:classifier") == "classifier"
    assert route_model("empty") == "empty"


def test_check_answer_accepts_any_model_the_route_names_with_its_healthy_answer(pool):
    s = spec([0, 1, 2, 3], [0.5, 0.5, 0.5, 0.32])
    # healthy routes
    assert check_answer(s, pool, [0.5, 0.9, 0.2, 0.3], [False, True, False, False],
                        ["empty", "classifier_fast", "classifier", "chunked:classifier_fast"]) == []
    # faults: classifier answers for classifier_fast, classifier_fast:degraded for classifier
    assert check_answer(s, pool, [0.5, 0.8, 0.45, 0.35], [False, True, False, True],
                        ["empty", "classifier", "classifier_fast:degraded", "chunked:classifier"]) == []


@pytest.mark.parametrize("probs, verdicts, routes, expect", [
    ([0.5, 0.9], [False, True], ["empty", "classifier"], "healthy classifier answer 0.8"),  # fast's answer, route says classifier
    ([0.5, 0.90002], [False, True], ["empty", "classifier_fast"], "probability 0.900020"),
    ([0.5, 0.9], [False, False], ["empty", "classifier_fast"], "verdict False"),
    ([0.5, 0.9], [True, True], ["empty", "classifier_fast"], "want 0.5/False"),
    ([0.5, 0.9], [False, True], ["classifier_fast", "classifier_fast"], "must go together"),
    ([0.5, 0.9], [False, True], ["empty", "chunked:classifier_fast"], "chunked is False"),
    ([0.5, 0.9], [False, True], ["empty", "ensemble"], "names no model"),
    ([0.5], [False], ["empty"], "shape"),
])
def test_check_answer_flags_wrong_answers(pool, probs, verdicts, routes, expect):
    problems = check_answer(spec([0, 1], [0.5, 0.5]), pool, np.array(probs, np.float32), np.array(verdicts), routes)
    assert any(expect in p for p in problems), problems


def test_needed_models_follow_the_cascade_margin(pool):
    # text 1: fast 0.9, threshold 0.5 -> 0.4 away: fast only; text 2: fast 0.45 -> escalates
    assert needed_models(spec([1], [0.5]), pool, 0.15) == {"classifier_fast"}
    assert needed_models(spec([2], [0.5]), pool, 0.15) == {"classifier_fast", "classifier"}
    assert needed_models(spec([1], [0.5], "accurate"), pool, 0.15) == {"classifier"}
    assert needed_models(spec([2], [0.5], "fast"), pool, 0.15) == {"classifier_fast"}
    assert needed_models(spec([0, 0], [0.5, 0.5]), pool, 0.15) == frozenset()
    assert fast_texts(spec([0, 1, 2], [0.5] * 3), pool, 0.15) == [1]
    assert fast_texts(spec([0, 1, 2], [0.5] * 3, "fast"), pool, 0.15) == [1, 2]
    assert fast_texts(spec([1], [0.5], "accurate"), pool, 0.15) == []


def test_an_early_stopped_chunk_answer_is_not_compared_with_the_whole_text(pool):
    s = spec([0, 3], [0.5, 0.5])
    # text 3 (long): fast 0.3 on the whole text; 0.1 from its first window is no fault
    assert check_answer(s, pool, [0.5, 0.1], [False, False], ["empty", "chunked:classifier_fast:windows=1/3"]) == []
    for bad in ("chunked:classifier_fast:windows=3/3", "chunked:classifier_fast:windows=0/3", "chunked:classifier_fast:windows=x"):
        assert any("windows count" in p for p in check_answer(s, pool, [0.5, 0.1], [False, False], ["empty", bad])), bad
    # the verdict rule still holds
    assert any("verdict" in p for p in check_answer(s, pool, [0.5, 0.1], [False, True],
                                                      ["empty", "chunked:classifier_fast:windows=1/3"]))
    # a short text never has a windows count
    assert check_answer(spec([0, 1], [0.5, 0.5]), pool, [0.5, 0.2], [False, False],
                        ["empty", "chunked:classifier_fast:windows=1/3"]) != []


def test_under_early_stopping_a_long_cascade_text_may_escalate(pool):
    # text 3 (long): fast 0.3 -> 0.2 from threshold 0.5: fast only with whole-text answers
    assert needed_models(spec([3], [0.5]), pool, 0.15) == {"classifier_fast"}
    assert fast_texts(spec([3], [0.5]), pool, 0.15) == [0]
    pool.early_stopping = True
    assert needed_models(spec([3], [0.5]), pool, 0.15) == {"classifier_fast", "classifier"}
    assert fast_texts(spec([3], [0.5]), pool, 0.15) == []
    assert fast_texts(spec([1], [0.5]), pool, 0.15) == [0]  # short texts are unchanged
    assert fast_texts(spec([3], [0.5], "fast"), pool, 0.15) == [0]


def test_chunk_stops_early_reads_the_cascade_chunk_nodes():
    shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    assert chunk_stops_early(shipped) is True
    plain = {"root": {"kind": "cascade", "margin": 0.1, "stages": [{"kind": "chunk", "node": {}}, {"kind": "model"}]}}
    assert chunk_stops_early(plain) is False
    plain["root"]["stages"][0]["stop_margin"] = 0.3
    assert chunk_stops_early(plain) is True
    outside = {"root": {"kind": "sequence", "steps": [{"kind": "chunk", "max_windows": 1}, {"kind": "cascade", "stages": []}]}}
    assert chunk_stops_early(outside) is False


def test_shipped_policy_margin_and_models():
    policy = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    assert cascade_margin(policy) == 0.305  # chosen by orchestrator tune (docs/guides/tune.md)
    assert set(models_to_load(policy)) >= {"router", "classifier", "classifier_fast"}
    assert "tokenizer" in models_to_load({"root": {}})  # no inline: tokenizer and postprocess through BLS


def test_compute_references_rejects_a_route_that_names_another_model(pool):
    calls = []

    def send(texts, route):
        calls.append(route)
        name = "classifier_fast" if route == "fast" else "classifier"
        return np.linspace(0.1, 0.9, len(texts)), [("chunked:" if t.startswith("long") else "") + name for t in texts]

    refs = compute_references(send, pool, batch=2)
    assert calls == ["fast", "fast", "accurate", "accurate"] and set(refs) == {1, 2, 3}
    assert refs[3].chunked and not refs[1].chunked
    with pytest.raises(RuntimeError, match="ROUTE 'classifier_fast:degraded'"):
        compute_references(lambda texts, route: ([0.5] * len(texts), ["classifier_fast:degraded"] * len(texts)), pool)


def test_pool_and_requests_are_mixed_and_reproducible():
    pool = build_pool(20, 3, seed=1)
    assert pool.texts[0] == "" and pool.summary()["long"] == 3
    assert all(len(pool.texts[i]) >= LONG_MIN_CHARS for i in pool.indices("long"))
    import random

    a = [draw_request(random.Random(5), pool, f"r{i}", "grpc") for i in range(3)]
    b = [draw_request(random.Random(5), pool, f"r{i}", "grpc") for i in range(3)]
    assert a == b
    many = [draw_request(random.Random(i), pool, str(i), "http") for i in range(300)]
    assert {len(r.texts) for r in many} == set(range(1, 17))
    assert {r.route for r in many} == {None, "fast", "accurate"}
    assert all(0.05 <= t <= 0.95 for r in many for t in r.thresholds)


# ----------------------------------------------------------------------------- ledger, report


def record(rid, phase="healthy", sent=0.0):
    return Record(spec([1], [0.5], rid=rid), phase, frozenset({"classifier_fast"}), sent)


def test_ledger_counts_lost_duplicated_mismatched_and_wrong():
    ledger = Ledger()
    for rid in ("ok", "dup", "mis", "wrong", "err", "lost", "late"):
        ledger.add(record(rid))
    ledger.answer("ok", "ok", 0.1, [], ["classifier_fast"])
    ledger.answer("dup", "dup", 0.1, [], ["classifier_fast"])
    ledger.answer("dup", "dup", 0.2, [], ["classifier_fast"])  # a second response
    ledger.answer("mis", "other", 0.1, [], ["classifier_fast"])  # another request's id
    ledger.answer("wrong", "wrong", 0.1, ["probability 0.1"], ["classifier_fast"])
    ledger.fail("err", "err", 0.1, "500", "[request id: err] model 'classifier' failed after 12 ms")
    ledger.lose("lost", "client: timed out")
    ledger.lose("late", "client: timed out")
    ledger.answer("late", "late", 40.0, [], ["classifier_fast"])  # after the client gave up
    with pytest.raises(ValueError):
        ledger.add(record("ok"))
    t = totals(ledger.snapshot())
    assert t == {"sent": 7, "answered": 4, "correct": 3, "wrong": 1, "errors": 1, "lost": 2,
                 "duplicated": 1, "mismatched": 1, "late": 1, "unanswered": 0}
    assert failed({"totals": t}) == ["2 lost", "1 duplicated", "1 mismatched", "1 wrong"]
    assert ledger.records["late"].done is None  # the late answer does not count as one


def test_error_key_groups_messages_by_their_text():
    assert error_key("[request id: soak-1-2] TEXT[3]: 8388608 bytes, over 65536") == "TEXT[N]: N bytes, over N"
    assert error_key("Stub process 'classifier_fast_0_0' is not healthy.") == "Stub process 'classifier_fast_0_0' is not healthy."


def test_recovery_times_from_the_kill(pool):
    kill = 100.0
    before = record("a", sent=99.0)
    before.done, before.outcome, before.routes = 99.5, "ok", ["classifier_fast"]
    spare = record("b", sent=100.2)  # text 1 is a fast-only text: classifier answered for it
    spare.done, spare.outcome, spare.routes = 101.5, "ok", ["classifier"]
    back = record("c", sent=104.0)
    back.done, back.outcome, back.routes = 104.3, "ok", ["classifier_fast"]
    assert recovery([before, spare, back], kill, pool, 0.15) == {"to_classifier_s": 1.5, "to_fast_s": 4.3}
    assert recovery([before], None, pool, 0.15) == {"to_classifier_s": None, "to_fast_s": None}


def test_report_renders_and_judges_a_run(pool):
    recs = []
    for i, phase in enumerate(["healthy", "stub_killed"]):
        r = record(f"r{i}", phase, sent=float(i))
        r.done, r.outcome, r.routes = i + 0.1, "ok", ["classifier"]
        recs.append(r)
    lost = record("lost", "stub_killed", sent=1.0)
    lost.outcome, lost.error = "lost", "client: timed out"
    recs.append(lost)
    oversized = [{"protocol": "http", "outcome": "error", "status": "400", "message": "TEXT[0]: 8388608 bytes", "latency_s": 0.2,
                  "probe_sent_in_flight": True, "probe_latency_s": 0.05, "probe_outcome": "ok"}]
    result = {"records": recs, "pool": pool, "margin": 0.15, "kill_time": 0.5, "new_stub": None, "oversized": oversized,
              "rss": {"pid": 1, "before_bytes": 100 * 2**20, "after_bytes": 200 * 2**20, "pid_after": 1},
              "events": [{"t_s": 0.0, "wall": "12:00:00.000", "event": "phase healthy"}], "skipped": [], "duration_s": 2.0,
              "config": {**SHORT.__dict__, "mix": SHORT.mix.__dict__}, "models": ["router"], "server_log": "x.log"}
    summary = summarize(result)
    assert summary["failed"] == ["1 lost"]

    def met(start):
        return next(g["met"] for g in goals(summary) if g["goal"].startswith(start))

    assert met("0 lost") is False
    assert met("router RSS") is False  # +100 MB
    assert met("an 8 MiB text") is True
    assert met("texts that need classifier_fast") is True  # 0.1 s after the kill (0.5 s): r1 at 1.1 s
    assert oversized_summary(oversized)["probe_in_flight"] == 1
    text = markdown(summary)
    assert "| 3 | 2 | 2 | 0 | 0 | 1 | 0 | 0 |" in text and "FAILED: 1 lost" in text
    assert [x["id"] for x in summary["slowest"]["stub_killed"]] == ["r1"]  # the lost one has no latency
    assert "| stub_killed | r1 | 1.00 | 100.0 | http | cascade | 1 | classifier_fast |" in text
    # Issue 26: a missed timing bound next to "passed" says it is advisory; the gate says gate.
    assert "| +100.0 MB | <= +50 MB | **not met** (advisory) |" in text
    assert [g["goal"] for g in goals(summary) if g.get("gates")] == [goals(summary)[0]["goal"]]
    import io

    from orchestrator.tooling.soak.report import print_summary

    out = io.StringIO()
    print_summary(summary, out)
    printed = out.getvalue()
    assert "[MISS] (gate) 0 lost" in printed and "[MISS] (advisory) router RSS" in printed
    assert "advisory: timing bounds reported, never failing it" in printed


# ----------------------------------------------------------------------------- /proc


def test_find_and_kill_a_stub_by_parent_and_instance_name():
    code = "import time; time.sleep(60)"
    # argv shaped like a stub's: the instance name is an argument, not the process name
    target = subprocess.Popen([sys.executable, "-c", code, "/repo/classifier_fast/1/model.py", "classifier_fast_0_0", "DEFAULT"])
    other = subprocess.Popen([sys.executable, "-c", code, "/repo/classifier/1/model.py", "classifier_0_0", "DEFAULT"])
    try:
        deadline = time.monotonic() + 10
        while procs.find_stub(os.getpid(), "classifier_fast_0_0") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs.find_stub(os.getpid(), "classifier_fast_0_0") == target.pid
        assert procs.find_stub(other.pid, "classifier_fast_0_0") is None  # not a child of that one
        assert procs.rss_bytes(target.pid) > 1 << 20
        assert procs.kill_stub(os.getpid(), "classifier_fast_0_0") == target.pid
        assert target.wait(10) == -signal.SIGKILL
        assert other.poll() is None  # the other instance lives
        with pytest.raises(procs.StubNotFound, match="classifier_fast_0_0"):
            procs.kill_stub(os.getpid(), "classifier_fast_0_0")  # a zombie or gone: not live
    finally:
        for p in (target, other):
            p.kill()
            p.wait()
    assert procs.rss_bytes(target.pid) is None


def test_cli_options_pick_the_short_or_full_config():
    import argparse

    parser = add_soak_arguments(argparse.ArgumentParser())
    short = config_from_args(parser.parse_args(["--short", "--threads", "3", "--seed", "7"]))
    assert (short.healthy_s, short.http_threads, short.grpc_threads, short.seed) == (SHORT.healthy_s, 3, 3, 7)
    full = config_from_args(parser.parse_args(["--max-duration", "60"]))
    assert full.max_duration_s == 60 and full.healthy_s > SHORT.healthy_s
    from orchestrator.tooling.cli import build_parser

    assert build_parser().parse_args(["soak", "--short"]).func.__name__ == "soak_command"
