"""``pip install "<this project>[testing]"`` alone, in a fresh virtualenv: the plugin's tests
and the example repository's tests pass there, with the stubs installed and neither
nvidia-pytriton, tritonclient nor torch installed or imported. Slow and network (a wheel
build and the index; tests/conftest.py HEAVY_CALLS marks it through ``build_testing_venv``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.unit.test_packaging import _source_copy

HEAVY = ("pytriton", "tritonclient", "torch")

PROBE = '''
import importlib.util, sys
import numpy as np

def test_the_mock_runs_without_heavy_packages(triton_mock):
    triton_mock.fake("double", lambda x: {"OUT": x["IN"] * 2}, inputs={"IN": "FP32"}, outputs={"OUT": "FP32"})
    assert triton_mock.infer("double", {"IN": np.float32([1, 2])})["OUT"].tolist() == [2, 4]
    for name in %r:
        assert importlib.util.find_spec(name) is None, name + " is installed"
    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
    assert loaded == [], loaded
''' % (HEAVY, HEAVY)


def build_testing_venv(where: Path) -> Path:
    """A virtualenv at ``where`` with ``pip install "<ROOT>[testing]"`` only; its python."""
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    python = where / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{ROOT}[testing]"],
                   check=True, timeout=900, capture_output=True)
    return python


@pytest.mark.skipif(sys.platform == "win32", reason="the venv layout below is POSIX")
def test_the_testing_extra_alone_runs_the_plugin_and_example_tests(tmp_path):
    python = build_testing_venv(tmp_path / "venv")
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples" / "test-your-python-models", work / "example")
    shutil.copy(ROOT / "tests" / "mock" / "test_pytest_plugin.py", work / "test_pytest_plugin.py")
    (work / "test_no_heavy.py").write_text(PROBE, encoding="utf-8")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "TRITON_MOCK_EXAMPLE": str(work / "example")}
    # the plugin through its entry point only: no -p, no conftest
    result = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "pytester", "-p", "no:cacheprovider", "."],
                            cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    # the plugin's 7, the example's 4 and the probe; nothing skipped
    assert re.fullmatch(r"(\d+) passed in .*", summary) and int(summary.split()[0]) >= 12, summary
    stubs = subprocess.run([str(python), "-c", "import sysconfig, pathlib; print((pathlib.Path(sysconfig.get_paths()['purelib']) "
                            "/ 'triton_python_backend_utils-stubs' / '__init__.pyi').is_file())"],
                           capture_output=True, text=True, check=True, env=env)
    assert stubs.stdout.strip() == "True"


def test_the_wheel_ships_the_plugin_entry_point_the_stubs_and_the_testing_extra(tmp_path):
    """Offline (no build isolation, no index): what the testing extra relies on is in the wheel."""
    import zipfile

    src = _source_copy(tmp_path / "src")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                           "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "triton_python_backend_utils-stubs/__init__.pyi" in names
    assert "[pytest11]\norchestrator.testing.pytest_plugin = orchestrator.testing.pytest_plugin" in entry_points
    assert "Provides-Extra: testing" in metadata
    for requirement in ("numpy", "protobuf", "pytest"):
        assert re.search(rf"^Requires-Dist: {requirement}\b.*extra == \"testing\"", metadata, re.M), requirement
