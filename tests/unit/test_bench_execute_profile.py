"""lab/bench/execute_profile.py: the router's own time of one execute on the in-process mock,
split into exclusive phases, and a feature timed on and off."""

from __future__ import annotations

import time

import pytest

from lab.bench import execute_profile as X


def test_the_clock_splits_nested_phases_into_exclusive_times():
    clock = X.Clock()
    began = time.perf_counter_ns()
    clock.enter("adapter")
    time.sleep(0.002)
    clock.enter("parse")
    time.sleep(0.003)
    clock.leave()
    clock.enter("bls exec")
    time.sleep(0.004)
    clock.leave()
    clock.leave()
    outer = time.perf_counter_ns() - began
    got = clock.take()
    assert set(got) == {"adapter", "parse", "bls exec"} and clock.take() == {}
    assert got["parse"] >= 3e6 and got["bls exec"] >= 4e6 and got["adapter"] >= 2e6
    assert outer - 1e6 < sum(got.values()) <= outer  # exclusive: the parts add up to the whole, once


def test_a_short_run_of_router_single_adds_up_and_restores_the_runtime(tmp_path):
    from orchestrator.runtime.execution.engine import Run
    from orchestrator.runtime.serving.router import TritonPythonModel

    execute, stage = TritonPythonModel.execute, Run.stage
    r = X.main(["--executes", "20", "--warmup", "10", "--models", "router_single", "--ablate", "timing",
                "--blocks", "2", "--json", str(tmp_path / "p.json")])
    m = r["models"]["router_single"]
    assert (tmp_path / "p.json").is_file() and r["orchestrator"].endswith("orchestrator")
    assert 0 < m["bare"]["own_us"] < m["bare"]["execute_us"]
    phases = m["phases"]["phases_median_us"]
    assert set(phases) == set(X.PHASES) and phases["bls exec"] > 0 and phases["parse"] > 0 and phases["tokenize"] > 0
    (a,) = m["ablations"]
    assert a["feature"] == "timing" and a["blocks"] == 2 and a["on_us"] > 0 and a["off_us"] > 0
    assert TritonPythonModel.execute is execute and Run.stage is stage  # every wrapper and patch undone
    text = "\n".join(X.render(r, r))
    assert f"| own time per execute (bare pass) | {m['bare']['own_us']} | {m['bare']['own_us']} |" in text
    assert "`timing` on / off" in text


def test_compare_runs_two_checkouts_in_interleaved_blocks():
    from pathlib import Path

    root = Path(X.__file__).resolve().parents[2]
    r = X.compare(root, "router_single", blocks=2, block=3, warmup=5)  # this checkout against itself
    assert r["after"] == r["before"] == str(root) and r["blocks"] == 2 and len(r["pairs"]) == 2
    assert all(p["after"] > 0 and p["before"] > 0 and p["ratio"] == round(p["after"] / p["before"], 4) for p in r["pairs"])
    assert list(r["pairs"][1]) == ["before", "after", "ratio"]  # the order alternates
    assert r["interval"] == [None, None]  # too few pairs for a 95% interval


def test_the_floor_model_is_profiled_beside_the_router_and_the_downstream_run_timed_on_and_off(tmp_path):
    import onnxruntime as ort

    run = ort.InferenceSession.run
    r = X.main(["--executes", "20", "--warmup", "10", "--models", "hand_bls", "--ablate", "downstream_run",
                "--blocks", "2", "--json", str(tmp_path / "p.json")])
    m = r["models"]["hand_bls"]
    assert 0 < m["bare"]["own_us"] < m["bare"]["execute_us"]  # its execute timed, its BLS call left out
    assert "phases" not in m  # the router's phases: hand_bls has none
    (a,) = m["ablations"]
    assert a["feature"] == "downstream_run" and a["on_us"] > 0 and a["off_us"] > 0
    assert ort.InferenceSession.run is run  # the replay undone
    text = "\n".join(X.render(r, r))
    assert f"| own time per execute (bare pass) | {m['bare']['own_us']} | {m['bare']['own_us']} |" in text
    assert "phases pass" not in text and "`downstream_run` on / off" in text


def test_replayed_runs_answer_the_same_input_from_the_first_run_only():
    from pathlib import Path

    import numpy as np
    import onnxruntime as ort

    onnx = Path(X.__file__).resolve().parents[2] / "model_repository" / "classifier_fast" / "1" / "model.onnx"
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    ids = np.array([[101, 2023, 102]], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    other = {"input_ids": np.array([[101, 2003, 102]], dtype=np.int64), "attention_mask": np.ones_like(ids)}
    undo = X.replayed_runs()
    try:
        first = session.run(None, feed)
        assert session.run(None, {k: v.copy() for k, v in feed.items()}) is first  # replayed, not run
        assert session.run(None, other) is not first  # another input runs
    finally:
        undo()
    assert session.run(None, feed) is not first and np.array_equal(session.run(None, feed)[0], first[0])


def test_each_part_is_patched_out_and_put_back_and_the_router_still_answers():
    import numpy as np

    from orchestrator.runtime import request
    from orchestrator.runtime.bls import downstream
    from orchestrator.runtime.serving import router

    before = (request.check_sizes, request.Deadlines.before_run, downstream.Downstream._call, router.TritonPythonModel._parse)
    inputs = {"TEXT": np.array([[b"A gorgeous, witty film."]], dtype=np.object_), "THRESHOLD": np.full((1, 1), 0.5, np.float32)}
    with X.bench_mock(["router_single"]) as mock:
        full = mock.infer("router_single", inputs)
        for feature in ("route", "deadlines", "breaker", "input_checks"):
            undo = X.ablate(feature)
            try:
                answer = mock.infer("router_single", inputs)
            finally:
                undo()
            assert answer["PROBABILITIES"].tolist() == full["PROBABILITIES"].tolist()
            assert ("ROUTE" in answer) == (feature != "route")
    assert (request.check_sizes, request.Deadlines.before_run, downstream.Downstream._call,
            router.TritonPythonModel._parse) == before
    with pytest.raises(SystemExit, match="expected one of"):
        X.ablate("nothing")


def test_interleaved_blocks_give_each_model_its_time_and_its_difference_from_the_first():
    r = X.main(["--models", "router_single", "router_single_no_metrics", "--interleave", "--blocks", "6", "--block", "3",
                "--warmup", "5"])
    got = r["interleaved"]
    assert got["blocks"] == 6 and got["block"] == 3 and set(got["own_us"]) == {"router_single", "router_single_no_metrics"}
    assert all(v > 0 for v in got["own_us"].values()) and r["models"] == {}
    diff = got["difference_us"]["router_single_no_metrics"]
    assert diff["median"] is not None and len(diff["interval"]) == 2
