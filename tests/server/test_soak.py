"""The fault-injection soak, short version (``orchestrator soak --short``), on a real server.

One run (module fixture, about a minute): its own tritonserver on a read-only copy of
model_repository with its bytecode compiled before the first load and the control plane
restricted as in the image (``orchestrator.tooling.production``), HTTP and gRPC client
threads, ``classifier`` unloaded and loaded again, the ``classifier_fast`` stub SIGKILLed
twice in a row (found as a child of the server this run started, by its instance-name
argument, never by name), the ``router`` reloaded, 20 requests with an 8 MiB text. Asserted: the bounds of issue 11 that hold on a busy 2-core machine; the
latency ratios are in the report (docs/results/reliability.md), not here.
"""

from __future__ import annotations

import json

import pytest
import yaml

from orchestrator.tooling.soak.report import markdown, summarize
from orchestrator.tooling.soak.runner import PHASES, SHORT, run_soak
from tests.helpers import REPO


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    result = run_soak(SHORT, REPO, workdir=tmp_path_factory.mktemp("soak"), log=lambda line: None)
    summary = summarize(result, command="tests/server/test_soak.py")
    print(markdown(summary))  # shown by pytest when a test fails
    return summary


def _why(summary, *keys) -> str:
    return json.dumps({k: summary[k] for k in keys}, indent=1, default=str)[:4000]


def test_every_phase_ran_with_traffic(soak):
    assert soak["skipped"] == []
    for phase in PHASES:
        assert soak["phases"][phase]["all"]["sent"] > 0, phase
    # the workload is mixed: long texts were chunked, both routes parameters and protocols sent
    assert soak["pool"]["chunked"] == soak["pool"]["long"] > 0
    assert soak["by_protocol"]["http"]["answered"] > 0 and soak["by_protocol"]["grpc"]["answered"] > 0


def test_no_response_lost_duplicated_mismatched_or_wrong(soak):
    t = soak["totals"]
    assert (t["lost"], t["duplicated"], t["mismatched"], t["wrong"], t["unanswered"]) == (0, 0, 0, 0, 0), _why(
        soak, "totals", "errors", "wrong_examples", "mismatched_examples")
    assert t["answered"] + t["errors"] == t["sent"]
    assert soak["failed"] == []


def test_broken_models_degrade_instead_of_failing(soak):
    """While classifier is unloaded, texts that needed it are answered by classifier_fast
    (ROUTE ...:degraded); after the kill, classifier answers for classifier_fast."""
    unloaded = soak["phases"]["classifier_unloaded"]["routes"]
    assert any(route.endswith("classifier_fast:degraded") for route in unloaded), unloaded
    killed = soak["phases"]["stub_killed"]["routes"]
    assert killed.get("classifier", 0) + killed.get("chunked:classifier", 0) > 0, killed


def test_killed_stub_texts_answered_by_classifier_soon_after_the_kill(soak):
    assert soak["recovery"]["to_classifier_s"] is not None, _why(soak, "recovery", "events")
    # The report checks issue 11's 2 s (1.1 s in the short run here, up to 2.2 s in full runs
    # on a busy machine); the test asserts an answer from the fallback well before a repair
    # could have helped, with room for CI's load.
    assert soak["recovery"]["to_classifier_s"] <= 5.0, _why(soak, "recovery", "events")


def test_classifier_fast_healthy_again_within_30s_after_each_kill(soak):
    rec = soak["recovery"]
    assert rec["to_fast_s"] is not None and rec["to_fast_s"] <= 30.0, _why(soak, "recovery", "events")
    # each kill: a new stub process, started by the server on the router's forced reload
    # (a plain load starts none on this compiled, unchanged copy), and classifier_fast answering
    assert [h["kill"] for h in rec["heals"]] == [1, 2], _why(soak, "recovery", "events")
    for heal in rec["heals"]:
        assert heal["new_pid"] not in (None, heal["pid"]) and heal["fast_after_s"] <= 30.0, _why(soak, "recovery", "events")
    assert rec["heals"][1]["pid"] == rec["heals"][0]["new_pid"]  # the second kill hit the repaired stub


def test_oversized_text_refused_with_invalid_arg(soak):
    over = soak["oversized"]
    limit = (yaml.safe_load((REPO / "router" / "policy.yaml").read_text()).get("limits") or {}).get("max_text_bytes", 65536)
    assert over["sent"] == 20 and over["invalid_arg"] == 20, _why(soak, "oversized")
    # the error names the text, its size and the limit
    message = over["example_message"]
    assert "TEXT[0]" in message and str(SHORT.oversized_bytes) in message and str(limit) in message, message
    # the probes sent meanwhile were answered correctly
    assert over["probe_outcomes"] == {"ok": 20}, over


def test_router_memory_bounded_after_oversized_requests(soak):
    rss = soak["rss"]
    assert rss["pid_after"] == rss["pid"], rss  # the same router process, not a restart
    assert rss["after_bytes"] - rss["before_bytes"] <= 50 * 2**20, rss
