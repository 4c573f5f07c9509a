"""lab/bench/machine.py's speed probe: a fixed workload in fresh interpreters, per slice."""

from __future__ import annotations

from lab.bench.machine import speed_probe


def test_the_speed_probe_times_each_slice_of_each_process_and_says_how_far_they_moved():
    r = speed_probe(processes=2, slices=3, per_slice=5)
    assert len(r["us"]) == 2 and all(len(p) == 3 and all(x > 0 for x in p) for p in r["us"])
    assert r["fastest_us"] <= r["median_us"] <= r["slowest_us"]
    assert r["within_process_max_ratio"] >= 1.0 and r["across_processes_ratio"] >= 1.0
    assert r["across_processes_ratio"] == round(r["slowest_us"] / r["fastest_us"], 2) or abs(
        r["across_processes_ratio"] - r["slowest_us"] / r["fastest_us"]) < 0.02
