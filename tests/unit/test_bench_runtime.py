"""The pure parts of the runtime before/after benchmark (``lab.bench.runtime``, ``python -m
lab.bench.instances --compare runtime``): the pinned model.py imports the baseline's
orchestrator, the baseline's router gets this checkout's policy, the verdict on per-round
ratios, and the section."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import instances as I
from lab.bench import runtime as R
from lab.bench.plan import BenchError
from lab.bench.report import KEPT_SECTIONS, RUNTIME_END, RUNTIME_START
from orchestrator.tooling.repository import read_config
from tests.helpers import REPO, ROOT

MODEL_PY = '''"""A router adapter as a baseline has it."""

from __future__ import annotations

from orchestrator.runtime.router import TritonPythonModel  # noqa: F401
'''


def fake_checkout(root: Path, who: str, policy_module: str = "") -> Path:
    """A checkout with a tiny ``orchestrator`` (``WHO``, ``runtime.router.TritonPythonModel``,
    optionally ``runtime.policy.load_policy`` with body ``policy_module``) and the router's
    model directory."""
    pkg = root / "orchestrator" / "runtime"
    pkg.mkdir(parents=True)
    (root / "orchestrator" / "__init__.py").write_text(f"WHO = {who!r}\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "router.py").write_text("class TritonPythonModel:\n    pass\n")
    if policy_module:
        (pkg / "policy.py").write_text(policy_module)
    router = root / "model_repository" / "router"
    shutil.copytree(REPO / "router", router, ignore=shutil.ignore_patterns("__pycache__"))
    (router / "1" / "model.py").write_text(MODEL_PY)
    (router / "policy.yaml").write_text("version: 1  # the baseline's own policy\n")
    return root


def import_model(model_dir: Path, before: str = "") -> subprocess.CompletedProcess:
    """Import ``model_dir/1/model.py`` as the stub does (``1.model`` with the model directory
    on sys.path), this checkout first on PYTHONPATH as the embedded server puts it."""
    script = (f"import sys\n{before}\nsys.path.append({str(model_dir)!r})\nimport importlib\n"
              "m = importlib.import_module('1.model')\nimport orchestrator\n"
              "print(orchestrator.WHO if hasattr(orchestrator, 'WHO') else 'this', m.TritonPythonModel.__name__)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd="/", timeout=60)


def test_the_pinned_model_py_puts_the_baseline_first_and_imports_from_it(tmp_path):
    base = fake_checkout(tmp_path / "before", "before")
    text = R.pinned_model_py(MODEL_PY, base, "router_before")
    # the docstring and the __future__ import stay first; the checkout goes in before the import
    assert text.index("from __future__") < text.index(f"_pin_sys.path.insert(0, {str(base)!r})") \
        < text.index("from orchestrator.runtime.router")
    model = tmp_path / "repo" / "router_before"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(text)
    done = import_model(model)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["before", "TritonPythonModel"]  # not this checkout's orchestrator
    assert R.pinned_files(done.stderr) == {"router_before": str((base / "orchestrator" / "__init__.py").resolve())}


def test_the_pinned_model_py_refuses_an_orchestrator_from_elsewhere(tmp_path):
    empty = tmp_path / "empty"  # no orchestrator here: the import falls through to this checkout's
    empty.mkdir()
    model = tmp_path / "repo" / "router_before"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(R.pinned_model_py(
        "from orchestrator.runtime.serving.router import TritonPythonModel\n", empty, "router_before"))
    done = import_model(model)
    assert done.returncode != 0 and "router_before: orchestrator came from" in done.stderr
    base = fake_checkout(tmp_path / "before", "before")
    (model / "1" / "model.py").write_text(R.pinned_model_py(MODEL_PY, base, "router_before"))
    done = import_model(model, before="import orchestrator")  # imported before the pin: refused
    assert done.returncode != 0 and "imported before its model.py could pin it" in done.stderr


def test_pinned_files_reads_the_last_line_of_each_model():
    log = (f"I1122 model.py:1] loading\n{R.PIN_MARK} router /a/orchestrator/__init__.py\n"
           f"{R.PIN_MARK} router_before /b/orchestrator/__init__.py\n{R.PIN_MARK} router /c/orchestrator/__init__.py\n")
    assert R.pinned_files(log) == {"router": "/c/orchestrator/__init__.py", "router_before": "/b/orchestrator/__init__.py"}
    with pytest.raises(BenchError, match="not from the baseline"):
        R.served_from(log, Path("/a"))
    with pytest.raises(BenchError, match="no 'lab.bench.runtime pin:' line of router_before"):
        R.served_from(log.splitlines()[1], Path("/a"))
    assert R.served_from(log, Path("/b"))["router_before"] == "/b/orchestrator/__init__.py"


ACCEPTS = "def load_policy(path):\n    open(path).read()\n"
REFUSES = "def load_policy(path):\n    raise ValueError('policy: unknown key admission_v2')\n"


def test_the_baseline_router_is_copied_with_this_checkouts_policy(tmp_path):
    base = fake_checkout(tmp_path / "before", "before", policy_module=ACCEPTS)
    repo = R.make_runtime_repository(tmp_path / "repo", base)
    before, after = repo / "router_before", repo / "router"
    assert (before / "policy.yaml").read_text() == (REPO / "router" / "policy.yaml").read_text()
    assert (before / "labels.txt").read_text() == (base / "model_repository" / "router" / "labels.txt").read_text()
    config = read_config(before / "config.pbtxt")
    assert config.name == "router_before"
    config.name = "router"
    assert config == read_config(base / "model_repository" / "router" / "config.pbtxt")  # else as the baseline has it
    code = (before / "1" / "model.py").read_text()
    assert f"_pin_sys.path.insert(0, {str(base)!r})" in code and "orchestrator.runtime.router import" in code
    assert f"_pin_sys.path.insert(0, {str(ROOT)!r})" in (after / "1" / "model.py").read_text()
    assert (after / "policy.yaml").read_text() == (REPO / "router" / "policy.yaml").read_text()


def test_a_baseline_that_refuses_the_policy_or_is_no_checkout_fails_clearly(tmp_path):
    base = fake_checkout(tmp_path / "before", "before", policy_module=REFUSES)
    with pytest.raises(BenchError, match=r"refuses this checkout's policy policy\.yaml "
                                         r"\(orchestrator\.runtime\.policy\.load_policy\): ValueError: policy: unknown key"):
        R.make_runtime_repository(tmp_path / "repo", base)
    with pytest.raises(BenchError, match="not a checkout of this project"):
        R.check_checkout(tmp_path)
    # a checkout without a policy module this lab knows: the server's load checks it instead
    assert R.check_policy(fake_checkout(tmp_path / "other", "other"), REPO / "router" / "policy.yaml") == ""


def test_verdicts_on_constructed_ratios():
    flat = [1.0 + (i % 5 - 2) / 100 for i in range(15)]  # 0.98 .. 1.02
    v = R.verdict(flat, higher_is_faster=False)
    assert v["verdict"] == "unchanged" and v["direction"] is None and v["rounds_needed"] is None and v["n"] == 15
    slower = [1.10 + i / 100 for i in range(15)]  # p50 10-24% higher after: slower
    assert R.verdict(slower, higher_is_faster=False)["verdict"] == "changed"
    assert R.verdict(slower, higher_is_faster=False)["direction"] == "slower"
    assert R.verdict(slower, higher_is_faster=True)["direction"] == "faster"  # throughput 10-24% higher
    assert R.verdict([0.8 + i / 100 for i in range(10)], higher_is_faster=True)["direction"] == "slower"
    # the interval straddles the band's edge: undecided, more rounds would tell
    wide = [0.90, 1.0, 1.1, 0.93, 1.07, 1.02, 0.96, 1.04, 0.99, 1.01]  # interval: 2nd..9th of 10
    v = R.verdict(wide, higher_is_faster=False)
    assert v["verdict"] == "undecided" and (v["low"], v["high"]) == (0.93, 1.07)
    assert v["rounds_needed"] > len(wide)
    # the band's ends belong to it
    assert R.verdict([0.95, 1.05] * 5, higher_is_faster=False)["verdict"] == "unchanged"
    assert R.verdict([1.0, 1.01, 0.99], higher_is_faster=False) == {
        "n": 3, "median": 1.0, "low": None, "high": None, "verdict": "undecided", "direction": None, "rounds_needed": 6}
    assert R.verdict([1.0, 1.1], higher_is_faster=False)["rounds_needed"] is None  # the median on the edge: never
    assert R.verdict([], higher_is_faster=False)["verdict"] == "undecided"
    assert R.overall([{"verdict": "unchanged"}, {"verdict": "undecided"}]) == "undecided"
    assert R.overall([{"verdict": "unchanged"}, {"verdict": "changed"}]) == "changed"
    assert R.overall([{"verdict": "unchanged"}] * 2) == "unchanged" and R.overall([]) == "undecided"


def m(model, c, r, thr, p50):
    return {"model": model, "concurrency": c, "round": r, "throughput": thr, "p50_ms": p50, "p99_ms": 2 * p50}


def test_the_plan_alternates_the_two_routers():
    cmp = I.COMPARISONS["runtime"]
    assert cmp.models == ("router", "router_before") and cmp.concurrencies == (1, 16) and cmp.rounds == R.ROUNDS
    assert [(s.model, s.concurrency) for s in I.plan(2, cmp.concurrencies, cmp.models)] == [
        ("router", 1), ("router_before", 1), ("router", 16), ("router_before", 16),
        ("router_before", 1), ("router", 1), ("router_before", 16), ("router", 16)]


def test_the_section_reports_the_ratios_verdicts_and_both_commits():
    assert (RUNTIME_START, RUNTIME_END) in KEPT_SECTIONS
    ms = [m("router", 1, r, 200.0, 4.0) for r in range(15)] + [m("router_before", 1, r, 200.0, 4.0 * (1 + (r % 3 - 1) / 100))
                                                             for r in range(15)]
    ms += [m("router", 16, r, 300.0, 50.0) for r in range(15)] + [m("router_before", 16, r, 250.0, 60.0) for r in range(15)]
    ms.append({**m("router", 16, 15, 1.0, 1.0), "error": "perf_analyzer exited 1"})
    s = R.runtime_summary(ms)
    c1, c16 = s["concurrency"]["1"], s["concurrency"]["16"]
    assert c1["judged"] == "p50_ms" and c1["ratios"]["p50_ms"]["verdict"] == "unchanged"
    assert c16["judged"] == "throughput" and c16["ratios"]["throughput"]["verdict"] == "changed"
    assert c16["ratios"]["throughput"]["direction"] == "faster" and c16["ratios"]["throughput"]["median"] == 1.2
    assert c16["models"]["router"]["rounds"] == 15 and s["overall"] == "changed"
    r = {"started_utc": "2026-11-28 10:00", "machine": {"cores": 2, "cpu_model": "cpu"}, "load_before": [1.3, 0.5, 0.6],
         "load_max_during": 3.5, "rounds": 15, "quick": False, "comparison": "runtime", "measurements": ms, "summary": s,
         "command": "python -m lab.bench.instances --compare runtime --baseline /b",
         "checkouts": {"after": {"path": "/a", "commit": "a" * 40, "dirty": True},
                       "before": {"path": "/b", "commit": "b" * 40, "dirty": False}},
         "orchestrator_files": {"router": "/a/orchestrator/__init__.py", "router_before": "/b/orchestrator/__init__.py"}}
    text = I.render_section(r)
    assert text.startswith(RUNTIME_START) and text.endswith(RUNTIME_END)
    assert "One run of `python -m lab.bench.instances --compare runtime --baseline /b` at 2026-11-28 10:00 UTC" in text
    assert f"`/a` at commit `{'a' * 40}` **with uncommitted changes**" in text and f"`/b` at commit `{'b' * 40}`;" in text
    assert "from `/b/orchestrator/__init__.py`" in text
    assert "| 16 | `router_before` | 250.0 | 60.0 | 120.0 |" in text
    assert "| 1 | p50 | 1.0x | 0.99x to 1.01x | **unchanged** |" in text
    assert "| 16 | throughput | 1.2x | 1.2x to 1.2x | **changed: faster** |" in text
    assert "**Speed changed** by this run" in text and "a 1-minute load of 1.3 on 2 cores" in text
    assert "1 measurement(s) failed: router c=16 round 16: perf_analyzer exited 1" in text
    # three rounds: no interval, undecided, six rounds at least; one round: no spread to tell
    few = [x for x in ms if x["round"] < 3]
    text = I.render_section({**r, "rounds": 3, "load_before": [0.9, 0.5, 0.6], "load_max_during": 5.5, "measurements": few, "summary": R.runtime_summary(few)})
    assert "none (under 6 rounds)" in text and "**Not decided** by this run" in text
    assert "about 6 rounds would decide it" in text and "Other work" not in text
    one = [x for x in ms if x["round"] == 0]
    text = I.render_section({**r, "rounds": 1, "quick": True, "measurements": one, "summary": R.runtime_summary(one)})
    assert "`--quick` run" in text and "under 2 rounds there is no spread" in text


def test_baseline_goes_only_with_the_runtime_comparison(tmp_path, capsys):
    with pytest.raises(BenchError, match="--baseline DIR goes with --compare runtime"):
        I.run(tmp_path, compare="runtime")
    with pytest.raises(BenchError, match="--baseline DIR goes with --compare runtime"):
        I.run(tmp_path, compare="flush", baseline=tmp_path)
    assert I.main(["--compare", "floor", "--baseline", str(tmp_path), "--out", str(tmp_path)]) == 1
    assert "--baseline DIR goes with --compare runtime" in capsys.readouterr().err


def test_the_engine_alone_is_timed_from_the_checkout_it_names(tmp_path):
    """``engine_time.py`` runs this checkout's engine in a fresh interpreter and says where its
    orchestrator came from; a checkout it cannot run is a BenchError naming it."""
    got = R.engine_time(ROOT, runs=20)
    assert got["runs"] == 20 and got["median_us"] > 0
    assert Path(got["orchestrator"]).resolve() == (ROOT / "orchestrator" / "__init__.py").resolve()
    other = fake_checkout(tmp_path / "other", "other")
    with pytest.raises(BenchError, match=f"engine_time.py on {other} failed"):
        R.engine_time(other, runs=5)


def test_engine_rounds_alternate_and_judge_the_ratios(monkeypatch):
    calls = []

    def fake(path, runs):
        calls.append(path)
        return {"median_us": 500.0 if path == "after" else 400.0, "runs": runs, "orchestrator": path}

    monkeypatch.setattr(R, "engine_time", fake)
    e = R.engine_rounds("after", "before", 8, runs=10)
    assert calls[:4] == ["after", "before", "before", "after"]  # the order alternates per round
    assert e["per_round"] == [1.25] * 8 and e["verdict"] == "changed" and e["direction"] == "slower"
    ms = [m("router", 1, r, 200.0, 4.0) for r in range(8)] + [m("router_before", 1, r, 200.0, 4.0) for r in range(8)]
    assert R.runtime_summary(ms)["overall"] == "unchanged"
    assert R.runtime_summary(ms, e)["overall"] == "changed"  # the engine's verdict counts too
    r = {"started_utc": "2026-11-28 10:00", "machine": {"cores": 2, "cpu_model": "cpu"}, "load_before": [0.3, 0.5, 0.6],
         "load_max_during": 1.5, "rounds": 8, "quick": False, "comparison": "runtime", "measurements": ms,
         "summary": R.runtime_summary(ms, e), "engine": e, "command": "c",
         "checkouts": {"after": {"path": "/a", "commit": "a" * 40, "dirty": False},
                       "before": {"path": "/b", "commit": "b" * 40, "dirty": False}}}
    text = I.render_section(r)
    assert "the median of 10 runs per checkout and round, 8 rounds, the order alternating): after 500.0 us, before 400.0 us" in text
    assert "| engine time after / before | 1.25x | 1.25x to 1.25x | **changed: slower** |" in text
    assert "**Speed changed** by this run" in text
