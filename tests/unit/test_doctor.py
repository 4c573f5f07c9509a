"""`orchestrator doctor` on the healthy repository and on broken setups built in tmp dirs.

Each broken setup is one small Python model whose EXECUTION_ENV_PATH points at an env laid
out like a packed one (tests/envhelpers.fake_env): the doctor reads files and
runs ldd, it never starts a server, so these take milliseconds. Stubs are the embedded
server's real prebuilt ones (nvidia-pytriton wheel).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from orchestrator.tooling.env import doctor, install, interpreters, stubs
from orchestrator.tooling.env.common import EnvError
from tests import envhelpers
from tests.helpers import FIXTURES, ROOT

FIXTURE_MODEL = FIXTURES / "env" / "models" / "probe"
SERVER_PY, OTHER_PY = envhelpers.SERVER_PY, envhelpers.ENV_PY
OTHER = tuple(int(x) for x in OTHER_PY.split("."))


def problems(report: doctor.ModelReport) -> dict[str, str]:
    return {f.kind: f.message for f in report.findings if f.is_problem}


@pytest.fixture(scope="module")
def other_libpython():
    """The shared libpython of OTHER_PY (pyenv), or skip: some cases need a loadable one."""
    try:
        info = interpreters.find_python(OTHER_PY)
    except EnvError as exc:
        pytest.skip(f"no Python {OTHER_PY} here: {exc}")
    if info.libpython is None:
        pytest.skip(f"{info.executable} has no shared libpython")
    return info.libpython


@pytest.fixture(scope="module")
def packed_fake_env(other_libpython, tmp_path_factory) -> Path:
    """A gzip tarball of a healthy OTHER_PY fake env with its libpython (built once)."""
    tmp = tmp_path_factory.mktemp("packed")
    env = envhelpers.fake_env(tmp / "env", OTHER_PY, libpython=other_libpython)
    tarball = tmp / "triton_env.tar.gz"
    with tarfile.open(tarball, "w:gz", compresslevel=1) as tar:
        tar.add(env, arcname=".")
    return tarball


def model_with_env(tmp: Path, env_value: str | None, *, stub: tuple | None = OTHER, name: str = "probe") -> Path:
    """A repository with one Python model ``name``; ``env_value``: its EXECUTION_ENV_PATH
    (None: none); ``stub``: the Python version of the wheel's stub copied into the model
    directory (None: the server's stub)."""
    repo = tmp / "repo"
    model = repo / name
    shutil.copytree(FIXTURE_MODEL, model, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    text = (model / "config.pbtxt").read_text().replace('name: "probe"', f'name: "{name}"')
    if env_value is not None:
        text += f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env_value}" }} }}\n'
    (model / "config.pbtxt").write_text(text)
    if stub is not None:
        shutil.copy(stubs.embedded_stub(stub), model / "triton_python_backend_stub")
    return repo


def diagnose_one(repo: Path, config_name=None) -> doctor.ModelReport:
    (report,), _ = doctor.diagnose(repo, config_name)
    return report


def test_healthy_repository(capsys):
    reports, skipped = doctor.diagnose(ROOT / "model_repository", "embedded")
    assert {"classifier", "classifier_fast", "postprocess", "router", "tokenizer"} <= {r.name for r in reports}
    assert "ensemble" in skipped
    for r in reports:
        assert r.healthy, (r.name, r.findings)
        assert r.env == "server's Python" and r.env_python == SERVER_PY
        assert r.libpython.startswith(f"libpython{SERVER_PY}.so.1.0 => /")
    parser = doctor.add_doctor_arguments(argparse.ArgumentParser())
    rc = doctor.doctor_command(parser.parse_args(["--repo", str(ROOT / "model_repository")]))
    out = capsys.readouterr().out
    assert rc == 0 and f"all {len(reports)} Python models healthy" in out and "tokenizer" in out


def test_healthy_packed_env_with_matching_stub(tmp_path, packed_fake_env, other_libpython):
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/triton_env.tar.gz")
    shutil.copy(packed_fake_env, repo / "probe" / "triton_env.tar.gz")
    report = diagnose_one(repo)
    assert report.healthy, report.findings
    assert report.env_python == OTHER_PY
    assert report.libpython == f"{other_libpython.name} => <env>/lib/{other_libpython.name}"


def test_missing_libpython(tmp_path):
    env = envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY)  # no lib/libpython
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    report = diagnose_one(repo)
    message = problems(report)["libpython"]
    assert message.startswith("missing libpython: the stub needs libpython") and "copy the base interpreter's" in message
    assert report.libpython.endswith("=> not found")
    # What it means at run time: with the launcher's library path the loader cannot start the stub.
    soname = stubs.inspect_stub(repo / "probe" / "triton_python_backend_stub").libpython
    ld_path = os.pathsep.join([str(env / "lib"), *stubs.embedded_library_path()])
    proc = subprocess.run([str(repo / "probe" / "triton_python_backend_stub")], capture_output=True, text=True, env={"LD_LIBRARY_PATH": ld_path})
    assert proc.returncode == 127 and f"{soname}: cannot open shared object file" in proc.stderr


def test_config_that_does_not_parse(tmp_path):
    repo = model_with_env(tmp_path, None, stub=None)
    config = repo / "probe" / "config.pbtxt"
    config.write_text(config.read_text() + "no_such_field: 1\n")
    (report,), skipped = doctor.diagnose(repo, None)
    assert not skipped and not report.healthy
    assert f"{config}:" in problems(report)["config"] and "no_such_field" in problems(report)["config"]


def test_version_mismatch_between_env_and_stub(tmp_path):
    envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY)
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env", stub=None)  # the server's stub
    message = problems(diagnose_one(repo))["version"]
    assert f"is Python {OTHER_PY} but the stub" in message and f"libpython{SERVER_PY}" in message
    assert f"make stub PYTHON={OTHER_PY}" in message


def test_stub_left_in_a_model_without_env(tmp_path):
    repo = model_with_env(tmp_path, None)  # an OTHER_PY stub, no EXECUTION_ENV_PATH
    found = problems(diagnose_one(repo))
    assert "no EXECUTION_ENV_PATH" in found["version"] and "libpython" in found


def test_glibcxx_too_old_system_libstdcxx(tmp_path):
    env = envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY)
    ext = env / "lib" / f"python{OTHER_PY}" / "site-packages" / "fastext" / "_core.so"
    envhelpers.make_elf(ext, needs=[("libstdc++.so.6", ["GLIBCXX_3.4", "GLIBCXX_3.4.99"])])
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    message = problems(diagnose_one(repo))["glibcxx"]
    assert message.startswith("GLIBCXX too old: the system's ") and "libstdc++.so.6 defines up to GLIBCXX_3.4." in message
    assert f"lib/python{OTHER_PY}/site-packages/fastext/_core.so needs GLIBCXX_3.4.99" in message


def test_glibcxx_too_old_env_libstdcxx(tmp_path):
    env = envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY)
    # An old conda libstdc++ in the env's lib/: the launcher puts it first, for the stub too.
    envhelpers.make_elf(env / "lib" / "libstdc++.so.6", defs=[f"GLIBCXX_3.4.{i}" for i in range(0, 21)] + ["GLIBCXX_3.4"])
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    message = problems(diagnose_one(repo))["glibcxx"]
    assert "the env's lib/libstdc++.so.6 defines up to GLIBCXX_3.4.20" in message
    assert "stub triton_python_backend_stub needs" in message and "libstdcxx-ng>=12" in message


def test_numpy2_with_a_numpy1_stub(tmp_path):
    envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY, numpy="2.0.2")
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    message = problems(diagnose_one(repo))["numpy"]
    assert "numpy 2.0.2" in message and "pybind11 < 2.12" in message and "0 bytes" in message


def test_numpy_missing(tmp_path):
    envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY, numpy=None)
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    assert "numpy is not installed" in problems(diagnose_one(repo))["numpy"]


def test_env_path_escaping_the_model_directory(tmp_path):
    envhelpers.fake_env(tmp_path / "repo" / "shared_env", OTHER_PY)
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/../shared_env")
    message = problems(diagnose_one(repo))["env-path"]
    assert "escapes the model directory" in message and "undefined" in message


def test_env_path_escaping_through_a_symlink(tmp_path):
    env = envhelpers.fake_env(tmp_path / "outside_env", OTHER_PY)
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    (repo / "probe" / "env").symlink_to(env)
    assert "escapes the model directory" in problems(diagnose_one(repo))["env-path"]


def test_env_path_missing_file(tmp_path):
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/triton_env.tar.gz")
    report = diagnose_one(repo)
    assert "points at a missing file" in problems(report)["env-path"] and report.env_python == "?"


def test_env_path_keyword_not_at_start(tmp_path):
    repo = model_with_env(tmp_path, "/opt$$TRITON_MODEL_DIRECTORY/triton_env.tar.gz")
    assert "must start the value" in problems(diagnose_one(repo))["env-path"]


def test_env_without_activate_script(tmp_path):
    envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY, activate=False)
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    assert "has no bin/activate" in problems(diagnose_one(repo))["env-path"]


def test_env_tarball_not_gzip(tmp_path):
    env = envhelpers.fake_env(tmp_path / "env", OTHER_PY)
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/triton_env.tar")
    with tarfile.open(repo / "probe" / "triton_env.tar", "w") as tar:
        tar.add(env, arcname=".")
    assert "not gzip-compressed" in problems(diagnose_one(repo))["env-path"]


def test_venv_base_interpreter_missing(tmp_path):
    envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY, home="/nonexistent/python/bin")
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    message = problems(diagnose_one(repo))["base-interpreter"]
    assert "/nonexistent/python/bin" in message and "same path on the server" in message


def test_conda_env_is_not_asked_for_a_base_interpreter(tmp_path, other_libpython):
    envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY, flavour="conda", libpython=other_libpython)
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    report = diagnose_one(repo)
    assert report.healthy, report.findings
    assert report.env_python == OTHER_PY
    assert [f for f in report.findings if f.kind == "base-interpreter"] == []  # a conda env has no pyvenv.cfg home


def test_dispatcher_picks_the_stub_per_config(tmp_path, packed_fake_env):
    """After `env install` the model directory's stub is a dispatcher: the env config runs
    the OTHER_PY binary, the default config the server's stub; both healthy."""
    repo = model_with_env(tmp_path, None, stub=None)
    install.install_env(repo, ["probe"], tarball=packed_fake_env, base_config_name=None)
    with_env = diagnose_one(repo, "env")
    assert with_env.healthy, with_env.findings
    assert with_env.stub.endswith(f"triton_python_backend_stub.py{OTHER_PY}")
    default = diagnose_one(repo, None)
    assert default.healthy, default.findings
    assert default.stub == str(stubs.embedded_stub(sys.version_info[:2]))


def test_cli_exit_code_and_message_on_problems(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich folds a long temporary path inside its words at 80
    envhelpers.fake_env(tmp_path / "repo" / "probe" / "env", OTHER_PY, numpy="2.1.0")
    repo = model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    parser = doctor.add_doctor_arguments(argparse.ArgumentParser())
    rc = doctor.doctor_command(parser.parse_args(["--repo", str(repo), "--config-name", ""]))
    out = capsys.readouterr().out
    assert rc == 1
    assert "probe [numpy]: numpy 2.1.0" in " ".join(out.split())
    assert "1 of 1 Python models have problems" in out
    # --models: a comma-separated list (blanks ignored); an unknown name is a problem of its own.
    assert doctor.doctor_command(parser.parse_args(["--repo", str(repo), "--config-name", "", "--models", " probe, ,nope"])) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "2 of 2 Python models have problems" in out and "nope has no config" in out
    assert doctor.doctor_command(parser.parse_args(["--repo", str(tmp_path / "nope")])) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_a_model_added_after_env_install_is_reported_with_the_fix(tmp_path, packed_fake_env, capsys):
    """A model exported after `make env` has no configs/env.pbtxt; with
    --model-config-name=env Triton would load its config.pbtxt (for an exported classifier,
    the native onnxruntime backend). The doctor names it and the command that fixes it."""
    repo = model_with_env(tmp_path, None, stub=None)
    install.install_env(repo, ["probe"], tarball=packed_fake_env, base_config_name=None)
    assert install.models_missing_env_config(repo, "env", None) == []
    late = model_with_env(tmp_path, None, stub=None, name="late")  # same repository, no env config
    assert late == repo
    assert install.models_missing_env_config(repo, "env", None) == ["late"]
    parser = doctor.add_doctor_arguments(argparse.ArgumentParser())
    assert doctor.doctor_command(parser.parse_args(["--repo", str(repo), "--config-name", "env"])) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "late [env-config]: no configs/env.pbtxt" in out
    assert f"Fix: orchestrator env install --repo {repo} --models late" in out
    # the fix: the doctor is content again
    install.install_env(repo, ["late"], tarball=packed_fake_env, base_config_name=None)
    assert install.models_missing_env_config(repo, "env", None) == []
    # no env installed anywhere: nothing is missing (the default configs are what runs)
    other = model_with_env(tmp_path / "plain", None, stub=None)
    assert install.models_missing_env_config(other, "env", None) == []
    reports, _ = doctor.diagnose(ROOT / "model_repository", "env")
    assert not any(f.kind == "env-config" for r in reports for f in r.findings)


def test_a_copied_router_that_keeps_its_old_name_is_a_problem(tmp_path, capsys):
    repo = tmp_path / "repo"
    for name in ("router", "postprocess"):
        shutil.copytree(ROOT / "model_repository" / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "router", repo / "router_b")
    parser = doctor.add_doctor_arguments(argparse.ArgumentParser())
    assert doctor.doctor_command(parser.parse_args(["--repo", str(repo)])) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "[repository]:" in out and "name 'router' is not the directory's name 'router_b'" in out
    assert "Python models healthy" not in out


def test_a_router_whose_labels_disagree_with_its_heads_is_a_problem(tmp_path, capsys):
    """As `policy check` does: the shipped router's labels.txt says 'positive'; one saying
    'negative' (a copied file, a stale label set) would name the wrong class to clients."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("__pycache__", "*.onnx", "triton_env*"))
    parser = doctor.add_doctor_arguments(argparse.ArgumentParser())
    assert doctor._label_problems(repo, "embedded") == []
    labels = repo / "router" / "labels.txt"
    labels.write_text("negative\n")
    out_lines = doctor._label_problems(repo, "embedded")
    assert len(out_lines) == 1 and out_lines[0].startswith(f"router router: {labels} lists ['negative'], but its policy answers ['positive']")
    assert out_lines[0].endswith("--write-labels")
    assert doctor.doctor_command(parser.parse_args(["--repo", str(repo), "--models", "router"])) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "[repository]: router router:" in out
    labels.unlink()
    assert "does not exist (its config's label_filename)" in doctor._label_problems(repo, "embedded")[0]
