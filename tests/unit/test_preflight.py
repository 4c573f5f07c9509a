"""make's first step (lab/preflight.py): interpreter, platform, virtualenv reuse."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab import preflight
from orchestrator.tooling.paths import PROJECT_ROOT

PYPROJECT = (PROJECT_ROOT / "pyproject.toml").read_text()


def test_requires_python_is_read_from_pyproject_and_matches_the_readme():
    minimum = preflight.requires_python(PYPROJECT)
    assert minimum == (3, 11)  # transformers 5.23.0: Requires-Python >= 3.11; onnxruntime 1.31.1: cp311+ wheels
    readme = (PROJECT_ROOT / "README.md").read_text()
    stated = set(re.findall(r"Python (3\.\d+)\+", readme))
    assert stated == {"%d.%d" % minimum}, stated


def test_requires_python_missing_is_an_error():
    with pytest.raises(ValueError, match="requires-python"):
        preflight.requires_python('[project]\nname = "x"\n')


def test_the_script_parses_on_an_old_python3():
    # It must run far enough on Python 3.6-3.10 to say "too old" instead of a SyntaxError.
    src = Path(preflight.__file__).read_text()
    ast.parse(src, feature_version=(3, 6))
    assert "from __future__ import annotations" not in src
    assert not re.search(r"^(import|from) orchestrator", src, re.M)


@pytest.mark.parametrize("version,ok", [((3, 9, 18), False), ((3, 10, 12), False), ((3, 11, 0), True), ((3, 13, 1), True)])
def test_interpreter_version(version, ok):
    problems = preflight.check_interpreter(version, (3, 11), True, "/usr/bin/python3")
    assert (problems == []) == ok
    if not ok:
        text = problems[0]
        assert "%d.%d.%d" % version in text and "3.11 or newer" in text and "PYTHON=python3" in text
        assert "/usr/bin/python3" in text


def test_interpreter_without_venv_module_names_the_package():
    (problem,) = preflight.check_interpreter((3, 12, 3), (3, 11), False, "/usr/bin/python3")
    assert "python3.12-venv" in problem


@pytest.mark.parametrize("system,machine,glibc,needle", [
    ("Darwin", "arm64", None, "Darwin is not supported"),
    ("Windows", "AMD64", None, "Windows is not supported"),
    ("Linux", "aarch64", (2, 39), "Linux aarch64 is untested"),
    ("Linux", "x86_64", (2, 31), "glibc 2.31 is too old"),      # Ubuntu 20.04
    ("Linux", "x86_64", (2, 34), "glibc 2.34 is too old"),      # RHEL 9
    ("Linux", "x86_64", None, "No glibc found"),                # Alpine (musl)
])
def test_unsupported_platforms_say_what_to_use(system, machine, glibc, needle):
    problems = preflight.check_platform(system, machine, glibc)
    assert any(needle in p for p in problems), problems
    assert all("NGC Triton container" in p for p in problems)


@pytest.mark.parametrize("glibc", [(2, 35), (2, 36), (2, 39), (3, 0)])
def test_supported_platform(glibc):
    assert preflight.check_platform("Linux", "x86_64", glibc) == []


def test_parse_glibc():
    assert preflight.parse_glibc("glibc 2.36") == (2, 36)
    assert preflight.parse_glibc("2.35") == (2, 35)
    assert preflight.parse_glibc("") is None
    assert preflight.glibc_version() is None or preflight.glibc_version() >= (2, 0)


def _fake_venv(path: Path, version: str, python: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "pyvenv.cfg").write_text(f"home = /opt/python/{version}/bin\ninclude-system-site-packages = false\n"
                                     f"version = {version}\n")
    if python:
        (path / "bin").mkdir()
        (path / "bin" / "python").write_text("")
    return path


def test_venv_verdicts(tmp_path):
    assert preflight.venv_verdict(str(tmp_path / "none"), "3.11.7")[0] == "create"
    (tmp_path / "empty").mkdir()
    assert preflight.venv_verdict(str(tmp_path / "empty"), "3.11.7")[0] == "create"
    assert preflight.venv_verdict(str(_fake_venv(tmp_path / "same", "3.11.7")), "3.11.7")[0] == "reuse"
    verdict, why = preflight.venv_verdict(str(_fake_venv(tmp_path / "old", "3.10.12")), "3.11.7")
    assert verdict == "rebuild" and "3.10.12" in why and "3.11.7" in why
    assert preflight.venv_verdict(str(_fake_venv(tmp_path / "patch", "3.11.6")), "3.11.7")[0] == "rebuild"
    assert preflight.venv_verdict(str(_fake_venv(tmp_path / "half", "3.11.7", python=False)), "3.11.7")[0] == "rebuild"
    (tmp_path / "notavenv").mkdir()
    (tmp_path / "notavenv" / "precious.txt").write_text("x")
    verdict, why = preflight.venv_verdict(str(tmp_path / "notavenv"), "3.11.7")
    assert verdict == "refuse" and "not a virtualenv" in why


def test_needs_install():
    assert preflight.needs_install({}, [], "h") == "first install"
    stamp = {"extras": ["test"], "pyproject_sha256": "h"}
    assert preflight.needs_install(stamp, [], "h") is None
    assert preflight.needs_install(stamp, ["test"], "h") is None
    assert preflight.needs_install(stamp, ["test", "train"], "h") == "extras not installed yet: train"
    assert preflight.needs_install(stamp, ["test"], "other") == "pyproject.toml changed"


class _Recorder:
    def __init__(self):
        self.cmds = []

    def __call__(self, cmd):
        self.cmds.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            _fake_venv(Path(cmd[3]), preflight.platform.python_version())


def test_a_venv_from_another_python_is_rebuilt_and_the_stamp_records_the_interpreter(tmp_path, monkeypatch, capsys):
    venv = _fake_venv(tmp_path / ".venv", "3.10.12")
    (venv / "old-marker").write_text("")
    rec = _Recorder()
    monkeypatch.setattr(preflight, "run", rec)
    version = preflight.platform.python_version()
    assert preflight.ensure_venv(str(venv), [], version) == 0
    out = capsys.readouterr().out
    assert "Rebuilding the virtualenv" in out and "3.10.12" in out
    assert not (venv / "old-marker").exists()
    assert rec.cmds[0][1:] == ["-m", "venv", str(venv)]
    install = rec.cmds[-1]
    assert install[-2:] == ["-e", str(PROJECT_ROOT)] and "--quiet" not in install   # no extras: no torch, visible
    stamp = json.loads((venv / ".installed").read_text())
    assert stamp["python"] == sys.executable and stamp["version"] == version and stamp["extras"] == []

    # Same interpreter, same pyproject: nothing runs. More extras: pip runs for their union.
    rec.cmds.clear()
    assert preflight.ensure_venv(str(venv), [], version) == 0 and rec.cmds == []
    assert preflight.ensure_venv(str(venv), ["test", "train"], version) == 0
    assert rec.cmds[-1][-1] == f"{PROJECT_ROOT}[test,train]"
    assert "torch" in capsys.readouterr().out
    rec.cmds.clear()
    assert preflight.ensure_venv(str(venv), ["test"], version) == 0 and rec.cmds == []


def test_a_directory_that_is_not_a_venv_is_never_deleted(tmp_path, monkeypatch):
    target = tmp_path / "work"
    target.mkdir()
    (target / "precious.txt").write_text("x")
    monkeypatch.setattr(preflight, "run", _Recorder())
    assert preflight.ensure_venv(str(target), [], "3.11.7") == 2
    assert (target / "precious.txt").exists()


def test_the_script_passes_on_this_machine():
    r = subprocess.run([sys.executable, str(Path(preflight.__file__))], capture_output=True, text=True,
                       env={**os.environ, preflight.SKIP_PLATFORM: ""})
    assert r.returncode == 0 and r.stdout.startswith("ok: Python"), r.stderr


def test_main_reports_every_problem_and_exits_2_before_touching_the_venv(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(preflight.SKIP_PLATFORM, raising=False)
    monkeypatch.setattr(preflight.platform, "system", lambda: "Linux")
    monkeypatch.setattr(preflight.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(preflight, "glibc_version", lambda: (2, 31))
    monkeypatch.setattr(preflight, "run", _Recorder())
    assert preflight.main(["--venv", str(tmp_path / ".venv")]) == 2
    err = capsys.readouterr().err
    assert "aarch64 is untested" in err and "glibc 2.31 is too old" in err
    assert not (tmp_path / ".venv").exists()
    monkeypatch.setenv(preflight.SKIP_PLATFORM, "1")
    assert preflight.main([]) == 0


def test_makefile_runs_the_check_before_every_venv():
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert "SETUP = $(PYTHON) lab/preflight.py --venv $(VENV)" in makefile
    # demo installs the embedded server and no torch (extras export, train); test and model do.
    extras = dict(re.findall(r"^(\w+_EXTRAS) := (\S+)$", makefile, re.M))
    assert extras["DEMO_EXTRAS"] == "serve"
    assert re.search(r"^demo: venv-demo$", makefile, re.M)
    assert re.search(r"^venv-demo:\n\t@\$\(SETUP\) --extras \$\(DEMO_EXTRAS\)\n", makefile, re.M)
    assert re.search(r"^test: venv-train$", makefile, re.M) and re.search(r"^venv-train:\n\t@\$\(SETUP\) --extras \$\(TEST_EXTRAS\)\n", makefile, re.M)
    assert {"export", "train"} <= set(extras["TEST_EXTRAS"].split(",")) and set(extras["LAB_EXTRAS"].split(",")) <= set(extras["TEST_EXTRAS"].split(","))
    assert re.search(r"^model: venv-model$", makefile, re.M) and re.search(r"^venv-model:\n\t@\$\(SETUP\) --extras train\n", makefile, re.M)
    assert "--quiet" not in makefile.split("# Benchmarks")[0]


def test_this_checkout_installed_under_its_old_name_is_removed_first(tmp_path, monkeypatch, capsys):
    """A virtualenv from before the rename holds `orchestrator` (editable, from this checkout):
    it is uninstalled before `triton-orchestrator` goes in; PyPI's unrelated `orchestrator` is not."""
    version = preflight.platform.python_version()
    venv = _fake_venv(tmp_path / ".venv", version)
    dist = venv / "lib" / "python3.11" / "site-packages" / "orchestrator-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": f"file://{PROJECT_ROOT}"}))
    rec = _Recorder()
    monkeypatch.setattr(preflight, "run", rec)
    assert preflight.stale_old_install(str(venv))
    assert preflight.ensure_venv(str(venv), [], version) == 0
    names = [c[3:] for c in rec.cmds if c[1:3] == ["-m", "pip"]]
    assert ["uninstall", "--yes", "orchestrator"] in names
    assert names.index(["uninstall", "--yes", "orchestrator"]) < len(names) - 1  # before the install
    (dist / "direct_url.json").write_text(json.dumps({"url": "https://files.pythonhosted.org/orchestrator-1.0.tar.gz"}))
    assert not preflight.stale_old_install(str(venv))
