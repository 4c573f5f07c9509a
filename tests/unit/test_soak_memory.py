"""The hour-of-memory soak's judgement and sampling (lab.soak.memory), without a server:
slopes on synthetic series, warm-up left out, hard vs advisory bounds, stub restarts, and
the /proc and /dev/shm readings on this process, a child made to look like a stub, and a
temporary directory standing in for /dev/shm."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from lab.soak import memory
from lab.soak.memory import MIB, Bound, judge

MINUTE = 60.0


def _times(n=61):
    return [i * MINUTE for i in range(n)]


def test_fit_slope_is_least_squares():
    t = np.arange(10.0)
    v = 3.0 * t + 7.0 + np.array([0.1, -0.1] * 5)
    assert memory.fit_slope(t, v) == pytest.approx(np.polyfit(t, v, 1)[0])
    assert memory.fit_slope(t, v) == pytest.approx(3.0, abs=0.05)


def test_flat_series_with_noise_passes():
    rng = np.random.default_rng(0)
    values = 300 * MIB + rng.normal(0, 0.2 * MIB, 61)
    j = judge(_times(), values, 10 * MINUTE, Bound(2.0))
    assert j["ok"] is True and j["points"] == 51
    assert abs(j["slope_mib_per_10min"]) < 0.5


def test_growing_series_fails_and_slope_is_in_mib_per_10_minutes():
    values = [300 * MIB + 0.3 * MIB * i for i in range(61)]  # 0.3 MiB a minute = 3 MiB / 10 min
    j = judge(_times(), values, 10 * MINUTE, Bound(2.0))
    assert j["ok"] is False
    assert j["slope_mib_per_10min"] == pytest.approx(3.0, abs=1e-6)
    assert j["growth_mib"] == pytest.approx(15.0, abs=1e-6)  # 50 minutes after warm-up


def test_warmup_is_left_out():
    # +100 MiB during the first 10 minutes (imports, first batches), flat afterwards
    values = [200 * MIB + min(i, 10) * 10 * MIB for i in range(61)]
    assert judge(_times(), values, 10 * MINUTE, Bound(2.0))["ok"] is True
    assert judge(_times(), values, 0.0, Bound(2.0))["ok"] is False


def test_growth_bound_catches_a_step_the_slope_allows():
    values = [3 * MIB] * 58 + [6 * MIB] * 3  # a region grew by 3 MiB at the end
    j = judge(_times(), values, 10 * MINUTE, Bound(100.0, growth_mib=2.0))
    assert j["ok"] is False and j["growth_mib"] == pytest.approx(3.0)
    assert judge(_times(), values, 10 * MINUTE, Bound(100.0))["ok"] is True


def test_too_few_points_after_warmup_is_not_judged_and_missing_values_are_skipped():
    values = [MIB] * 12
    assert judge(_times(12), values, 10 * MINUTE, Bound(2.0))["ok"] is None  # 2 points after warm-up
    gappy = [MIB if i % 2 else None for i in range(61)]
    assert judge(_times(), gappy, 10 * MINUTE, Bound(2.0))["points"] == 25


def _sample(t, stubs, triton=40 * MIB, shm=3 * MIB):
    return {"t_s": t, "stubs": {name: {"pid": pid, "rss": rss, "pss": pss} for name, (pid, rss, pss) in stubs.items()},
            "triton": {"pid": 1, "rss": triton, "pss": triton / 2},
            "shm": {"files": 3, "size": shm, "allocated": shm, "machine_used": None}, "loadavg": [0, 0, 0], "answered": 0}


def test_verdict_hard_and_advisory_bounds():
    samples = [_sample(t, {"router_0_0": (10, 280 * MIB, 100 * MIB + i * MIB)}) for i, t in enumerate(_times())]
    v = memory.verdict(samples, 10 * MINUTE)
    # PSS grew 10 MiB / 10 min: reported OVER, but advisory, so no failure
    assert v["series"]["stub router_0_0 pss"]["ok"] is False
    assert not v["series"]["stub router_0_0 pss"]["hard"]
    assert v["failures"] == []
    growing = [_sample(t, {"router_0_0": (10, 280 * MIB + i * MIB, 100 * MIB)}) for i, t in enumerate(_times())]
    failures = memory.verdict(growing, 10 * MINUTE)["failures"]
    assert len(failures) == 1 and failures[0].startswith("stub router_0_0 rss")
    shm = [_sample(t, {"router_0_0": (10, 280 * MIB, 100 * MIB)}, shm=3 * MIB + (4 * MIB if i > 30 else 0))
           for i, t in enumerate(_times())]
    assert [f.split(":")[0] for f in memory.verdict(shm, 10 * MINUTE)["failures"]] == ["/dev/shm size"]


def test_a_restarted_stub_fails_and_its_new_pid_is_not_mixed_into_the_series():
    samples = [_sample(t, {"classifier_fast_0_0": (10 if i < 30 else 11, (100 if i < 30 else 50) * MIB, MIB)})
               for i, t in enumerate(_times())]
    v = memory.verdict(samples, 10 * MINUTE)
    assert v["restarts"] == {"classifier_fast_0_0": [10, 11]}
    assert any("restarted" in f for f in v["failures"])
    # the RSS series holds the first pid only: flat, not a 50 MiB drop
    assert v["series"]["stub classifier_fast_0_0 rss"]["slope_mib_per_10min"] == pytest.approx(0.0)


def test_no_stub_found_fails():
    assert "no stub process found" in memory.verdict([_sample(t, {}) for t in _times()], 10 * MINUTE)["failures"]


# ----------------------------------------------------------------------------- sampling


def test_rss_and_pss_of_this_process():
    pss = memory.pss_bytes(os.getpid())
    assert pss is not None and 1 * MIB < pss < 64 * 1024 * MIB
    assert memory.pss_bytes(2**22 + 12345) is None  # no such pid


def test_mapped_files_and_usage_in_a_temporary_shm_root(tmp_path):
    root = tmp_path / "shm"
    root.mkdir()
    region = root / "triton_python_backend_shm_region_test"
    with open(region, "wb") as fh:
        fh.truncate(MIB)
    with open(region, "r+b") as fh, mmap.mmap(fh.fileno(), MIB) as mapped:
        mapped[: 8192] = b"x" * 8192
        mapped.flush()
        assert memory.mapped_files(os.getpid(), str(root)) == [str(region)]
        (root / "not_mapped").write_bytes(b"y" * 100)
        files, size, allocated = memory.files_usage([str(region), str(region), str(root / "not_mapped"), str(root / "gone")])
        assert files == 2 and size == MIB + 100
        assert 8192 <= allocated < MIB + 64 * 1024  # a sparse file holds only what was written
    assert memory.mapped_files(os.getpid(), str(root)) == []


def test_sample_finds_a_child_that_runs_as_a_stub_and_its_shm_region(tmp_path):
    """A child whose command line is a stub's (argv[0] named triton_python_backend_stub,
    model.py under <repo>/<model>/<version>/, the region name second, the instance name
    ninth) is found as a child of this process, with its RSS and its region's size."""
    model_py = tmp_path / "repo" / "router" / "1" / "model.py"
    model_py.parent.mkdir(parents=True)
    model_py.write_text("import time\ntime.sleep(60)\n")
    root = tmp_path / "shm"
    root.mkdir()
    (root / "triton_python_backend_shm_region_7").write_bytes(b"z" * 4096)
    argv = [str(tmp_path / "triton_python_backend_stub"), str(model_py), "/triton_python_backend_shm_region_7",
            "1048576", "1048576", str(os.getpid()), "/backends/python", "0", "router_0_0", "DEFAULT"]
    child = subprocess.Popen(argv, executable=sys.executable)
    try:
        deadline = time.monotonic() + 10
        while "router_0_0" not in memory.server_stubs(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        s = memory.sample(os.getpid(), root=str(root))
        assert set(s["stubs"]) == {"router_0_0"}
        row = s["stubs"]["router_0_0"]
        assert row["pid"] == child.pid and row["rss"] > MIB and row["pss"] > 0
        assert s["shm"]["files"] == 1 and s["shm"]["size"] == 4096
        assert s["shm"]["paths"] == [str(root / "triton_python_backend_shm_region_7")]
        assert s["triton"]["pid"] == os.getpid() and s["triton"]["rss"] > MIB
    finally:
        child.kill()
        child.wait()
    assert memory.server_stubs(os.getpid()) == {}


def test_left_behind_lists_the_seen_files_that_still_exist(tmp_path):
    kept, removed = tmp_path / "region_a", tmp_path / "region_b"
    kept.write_bytes(b"a")
    samples = [_sample(0, {}), _sample(60, {})]
    samples[0]["shm"]["paths"] = [str(kept), str(removed)]
    samples[1]["shm"]["paths"] = [str(kept)]
    assert memory.left_behind(samples) == [str(kept)]
    assert memory.left_behind([_sample(0, {})]) == []  # a sample without paths


def test_stub_region_path():
    assert memory.stub_region(["stub", "m.py", "/triton_python_backend_shm_region_1"], "/dev/shm") == \
        "/dev/shm/triton_python_backend_shm_region_1"
    assert memory.stub_region(["stub", "m.py"]) is None


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_requests_are_what_their_name_says(protocol):
    for kind in memory.BAD_KINDS:
        inputs, params = memory.bad_request(kind, protocol, b"fine text")
        assert [i.name() for i in inputs] == ["TEXT", "THRESHOLD"]
        if kind == "unknown_parameter":
            assert params == {"no_such_parameter": "1"}
        else:
            assert params is None
    with pytest.raises(ValueError, match="bad request kind 'nope'"):
        memory.bad_request("nope", protocol, b"")
