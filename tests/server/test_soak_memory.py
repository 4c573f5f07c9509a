"""The hour-of-memory soak, cut to under a minute of traffic, on a real server.

One run (module fixture): its own tritonserver on the read-only, compiled copy of
model_repository the soak uses, 45 s of the mixed workload (HTTP and gRPC, 2 + 2 client
threads) plus bad requests, a sample every 5 s, the first 15 s not judged. Asserted: every
stub of the server found with its RSS/PSS, the server's /dev/shm regions seen, every bad
request answered with its error, no lost/duplicated/mismatched/wrong response, every hard
series judged. The bounds themselves are judged by the hour-long run (docs/results/reliability.md);
45 s of a loaded machine cannot show a slope per 10 minutes, so pass/fail is not asserted.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.tooling.soak.memory import BAD_KINDS, MemoryConfig, run_memory, summarize, write
from tests.helpers import REPO

CONFIG = MemoryConfig(minutes=0.75, interval_s=5.0, warmup_minutes=0.25, n_short=96, n_long=8)


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    result = run_memory(CONFIG, REPO, log=lambda line: None)
    out = summarize(result, CONFIG, command="tests/server/test_soak_memory.py")
    out["paths"] = write(out, tmp_path_factory.mktemp("memory"))
    return out


def _why(summary) -> str:
    return json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1, default=str)[:4000]


@pytest.mark.timeout(240)
def test_every_stub_and_the_servers_shm_are_sampled(summary):
    samples = summary["samples"]
    assert len(samples) == 10, _why(summary)  # at 0, 5, ..., 45 s
    for s in samples:
        assert set(s["stubs"]) == {"classifier_0_0", "classifier_fast_0_0", "router_0_0"}, s["stubs"]
        for row in s["stubs"].values():
            assert row["rss"] > 50 * 1024 * 1024 and row["pss"] > 0
        assert s["triton"]["rss"] > 10 * 1024 * 1024
        # one python_backend shared-memory region per stub, at least its default size
        assert s["shm"]["files"] >= 3 and s["shm"]["size"] >= 3 * 1024 * 1024
    assert summary["restarts"] == {}
    # python_backend removes its regions when the server stops cleanly (nothing in flight)
    assert summary["shm_left_after_stop"] == [], summary["shm_left_after_stop"]
    for name, j in summary["series"].items():
        if j["hard"]:
            assert j["ok"] is not None and j["points"] >= 7, (name, j)  # 15 s .. 45 s
    assert summary["paths"]["png"].stat().st_size > 10_000


def test_traffic_was_answered_and_bad_inputs_got_their_errors(summary):
    c = summary["counts"]
    assert c["good"]["ok"] > 20, _why(summary)
    for what in ("wrong", "lost", "pending", "error"):
        assert c["good"][what] == 0, _why(summary)
    assert c["duplicated"] == 0 and c["mismatched"] == 0
    assert c["bad"]["error"] == c["bad"]["sent"] >= len(BAD_KINDS), _why(summary)
    messages = " | ".join(c["errors_by_message"])
    for needle in ("THRESHOLD[N] = nan", "THRESHOLD[N] = N: must be a finite probability", "invalid UTF", "no_such_parameter"):
        assert needle in messages, messages
    failures = [f for f in summary["failures"] if "MiB" not in f]  # slopes are the hour's to judge
    assert failures == [], failures
