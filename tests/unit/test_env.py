"""Execution environments (`make env`, `orchestrator env`) and stubs (`make stub`, stub_build/).

The real-server test runs a model in a packed env of *another* CPython version than the
server's (3.12 from pyenv while the embedded server's stub is 3.11; 3.11 when the server
itself runs 3.12) with the matching stub in its model directory, and checks through
tritonclient that it really ran that interpreter and a package only that env has. The env
builds are cached for the session (two venvs, about 10 s each); wheels are cached in
.cache/wheels, so later runs install offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from orchestrator.tooling import repository
from orchestrator.tooling.env import build, commands, common, inspection, install, interpreters, stubs, verify
from orchestrator.tooling.env.common import EnvError
from tests.envhelpers import ENV_PY, SERVER_PY, probe_repo
from tests.helpers import ROOT

# ----------------------------------------------------------------------------------------
# Building and verifying


def test_find_python_names_where_it_looked():
    with pytest.raises(EnvError, match=r"no Python 3\.99 found: looked in .*versions/3\.99\.\*/bin"):
        interpreters.find_python("3.99")
    with pytest.raises(EnvError, match="not a Python version"):
        interpreters.find_python("latest")


def test_build_env_venv_fallback(packed_env, env_python):
    assert packed_env.tool == ("conda-pack" if build.conda_executable() else "venv-pack")
    assert packed_env.python.startswith(ENV_PY + ".")
    assert packed_env.packages["numpy"] == "1.26.4"
    assert packed_env.packages["envprobe"] == "0.1.0"
    assert packed_env.packages["triton-orchestrator"] == "0.1.0"  # non-editable, or the packer refuses
    manifest = json.loads(packed_env.path.with_name(packed_env.path.name + ".json").read_text())
    assert manifest["python"] == packed_env.python and manifest["tool"] == packed_env.tool
    with tarfile.open(packed_env.path) as tar:
        names = set(tar.getnames())
    # venv-pack fallback: the base interpreter's libpython copied into lib/ (the stub needs it).
    assert f"lib/{env_python.soname}" in names
    assert "bin/activate" in names
    info = inspection.inspect_env(packed_env.path)
    assert info.python_version == env_python.version[:2] and info.flavour == "venv" and info.gzip


def test_build_env_without_conda_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "conda_executable", lambda: None)
    with pytest.raises(EnvError, match="conda is not installed on this machine"):
        build.build_env(SERVER_PY, tool="conda", output=tmp_path / "x.tar.gz", quiet=True)


def test_failed_step_names_command_and_output(tmp_path, env_python):
    with pytest.raises(EnvError) as info:
        build.build_env(
            ENV_PY,
            requirements=["no-such-package-anywhere==9.9"],
            pip_args=["--no-index", "--find-links", str(tmp_path)],
            install_project=False,
            output=tmp_path / "x.tar.gz",
            quiet=True,
        )
    message = str(info.value)
    assert "step 3/7 failed" in message and "pip" in message and "install" in message
    assert "no-such-package-anywhere" in message and "full log:" in message


def test_verify_runs_the_env_interpreter(packed_env):
    report = verify.verify_env(packed_env.path, imports=["numpy", "envprobe", "triton_python_backend_utils"])
    assert report.python.startswith(ENV_PY + ".")
    assert "/verify-env-" in report.executable  # the unpacked env's python3, found through bin/activate
    assert report.numpy == "1.26.4"
    assert report.imports == {"numpy": None, "envprobe": None, "triton_python_backend_utils": None}
    assert report.stub is not None and report.stub.python_version == tuple(map(int, ENV_PY.split(".")))
    assert report.problems == []
    assert importlib.util.find_spec("envprobe") is None  # only the env has it


def test_verify_rejects_numpy2_with_this_stub(packed_env_numpy2):
    with pytest.raises(EnvError) as info:
        verify.verify_env(packed_env_numpy2.path, imports=["numpy"])
    message = str(info.value)
    assert "numpy 2.0.2" in message and "pybind11 < 2.12" in message and "0 bytes" in message
    assert "numpy<2" in message


def test_verify_rejects_a_stub_of_another_version(packed_env):
    server_stub = stubs.embedded_stub(sys.version_info[:2])
    report = verify.verify_env(packed_env.path, stub=server_stub, imports=["numpy"], raise_on_problems=False)
    assert any(f"links libpython{SERVER_PY}" in p and f"make stub PYTHON={ENV_PY}" in p for p in report.problems)


def test_verify_reports_failing_imports(packed_env):
    report = verify.verify_env(packed_env.path, imports=["numpy", "transformers"], raise_on_problems=False)
    assert report.imports["numpy"] is None
    assert "ModuleNotFoundError" in report.imports["transformers"]
    assert any("`import transformers` fails" in p for p in report.problems)


# ----------------------------------------------------------------------------------------
# Installing into model directories


def test_install_env_writes_variant_tarball_and_dispatcher(packed_env, tmp_path):
    repo = probe_repo(tmp_path / "repo")
    (results,) = install.install_env(repo, ["probe"], tarball=packed_env.path, base_config_name=None)
    model = repo / "probe"
    # The effective config, read through model_config.proto, plus EXECUTION_ENV_PATH.
    written = repository.read_config(model / "configs" / "env.pbtxt")
    expected = repository.read_config(model / "config.pbtxt")
    assert repository.get_parameter(expected, "EXECUTION_ENV_PATH") is None
    repository.set_parameter(expected, "EXECUTION_ENV_PATH", "$$TRITON_MODEL_DIRECTORY/triton_env.tar.gz")
    assert written == expected and common.ENV_PATH_VALUE == "$$TRITON_MODEL_DIRECTORY/triton_env.tar.gz"
    header = (model / "configs" / "env.pbtxt").read_text().splitlines()[:2]
    assert header[0].startswith("# Generated by `orchestrator env install` from config.pbtxt")
    assert f"(env Python {ENV_PY}). Used with --model-config-name=env." in header[1]
    assert os.path.samefile(model / "triton_env.tar.gz", packed_env.path) and results.how == "hardlink"
    # The env's Python differs from the server's: stub binary + dispatcher.
    binary = model / f"triton_python_backend_stub.py{ENV_PY}"
    assert stubs.inspect_stub(binary).python_version == tuple(map(int, ENV_PY.split(".")))
    assert stubs.dispatcher_target(model / "triton_python_backend_stub") == (tuple(map(int, ENV_PY.split("."))), binary)
    # Triton probes the stub without arguments and expects exit status 1 (stub_launcher.cc).
    assert subprocess.run([str(model / "triton_python_backend_stub")]).returncode == 1
    # --plain-stub places the binary itself (python_backend's documented layout).
    install.install_env(repo, ["probe"], tarball=packed_env.path, base_config_name=None, dispatch=False)
    assert stubs.inspect_stub(model / "triton_python_backend_stub").python_version is not None
    assert not binary.exists()
    # Idempotent; a server of the env's own Python needs no stub: ours are removed.
    install.install_env(repo, ["probe"], tarball=packed_env.path, base_config_name=None)
    install.install_env(repo, ["probe"], tarball=packed_env.path, base_config_name=None)
    assert stubs.dispatcher_target(model / "triton_python_backend_stub") is not None and binary.exists()
    install.install_env(repo, ["probe"], tarball=packed_env.path, base_config_name=None, server_python=ENV_PY)
    assert not (model / "triton_python_backend_stub").exists() and not binary.exists()
    # An EXECUTION_ENV_PATH of the base config is replaced; its other parameters are kept.
    base = model / "config.pbtxt"
    base.write_text(
        base.read_text()
        + 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "/elsewhere.tar.gz" } }\n'
        + 'parameters { key: "KEEP" value: { string_value: "1" } }\n'
    )
    install.install_env(repo, ["probe"], tarball=packed_env.path, base_config_name=None)
    parameters = repository.read_config(model / "configs" / "env.pbtxt").parameters
    assert {k: v.string_value for k, v in parameters.items()} == {"EXECUTION_ENV_PATH": common.ENV_PATH_VALUE, "KEEP": "1"}


def test_install_env_default_models_are_the_python_ones(packed_env, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("__pycache__", "*.tar.gz", "triton_python_backend_stub*"))
    results = install.install_env(repo, tarball=packed_env.path)
    expected = sorted(
        d.name
        for d in repo.iterdir()
        if (d / "config.pbtxt").is_file()
        and 'backend: "python"' in ((d / "configs" / "embedded.pbtxt") if (d / "configs" / "embedded.pbtxt").is_file() else d / "config.pbtxt").read_text()
    )
    assert sorted(r.name for r in results) == expected
    assert {"classifier", "classifier_fast", "postprocess", "router", "tokenizer"} <= set(expected)
    # Classifiers: the Python fallback (configs/embedded.pbtxt) is what gets the env.
    assert 'backend: "python"' in (repo / "classifier" / "configs" / "env.pbtxt").read_text()
    with pytest.raises(EnvError, match="not a Python-backend model"):
        install.install_env(repo, ["ensemble"], tarball=packed_env.path)
    with pytest.raises(EnvError, match="no env tarball"):
        install.install_env(repo, tarball=tmp_path / "missing.tar.gz")


# ----------------------------------------------------------------------------------------
# conda (runs where conda exists)


@pytest.mark.skipif(build.conda_executable() is None, reason="conda is not installed on this machine (no conda on PATH)")
def test_conda_pack_env(tmp_path):
    pytest.importorskip("conda_pack", reason="conda-pack is not installed (pip install -e '.[env]')")
    built = build.build_env(
        SERVER_PY,
        tool="conda",
        requirements=["numpy==1.26.4"],
        install_project=False,
        imports=["numpy", "triton_python_backend_utils"],
        output=tmp_path / common.ENV_TARBALL_NAME,
        quiet=True,
    )
    assert built.tool == "conda-pack" and built.python.startswith(SERVER_PY + ".")
    info = inspection.inspect_env(built.path)
    assert info.flavour == "conda" and info.has_activate and info.numpy_version == "1.26.4"


# ----------------------------------------------------------------------------------------
# Stubs: the embedded server's prebuilt ones, stub_build/ (Docker), make targets


def test_prepare_stub_from_the_wheel(tmp_path):
    path = stubs.prepare_stub(ENV_PY, tmp_path)
    assert path == tmp_path / ENV_PY / "triton_python_backend_stub" and os.access(path, os.X_OK)
    manifest = json.loads((path.parent / "stub.json").read_text())
    assert manifest["python"] == ENV_PY and manifest["triton_release"] == "r24.10"
    assert manifest["libpython"].startswith("libpython") and manifest["numpy2_support"] is False
    try:
        interpreters.find_python(ENV_PY)
    except EnvError:
        pass
    else:  # ldd resolved it with that interpreter's lib dir
        assert manifest["ldd_libpython"].endswith(manifest["libpython"])
    with pytest.raises(EnvError, match=f"make stub PYTHON={ENV_PY} TRITON=r25.01"):
        stubs.prepare_stub(ENV_PY, tmp_path, triton="r25.01")


def test_stub_command_output(tmp_path, capsys):
    import argparse

    parser = commands.add_stub_arguments(argparse.ArgumentParser())
    assert commands.stub_command(parser.parse_args(["--python", "3.10", "--out", str(tmp_path)])) == 0
    out = capsys.readouterr().out
    assert "libpython3.10.so.1.0" in out and (tmp_path / "3.10" / "triton_python_backend_stub").is_file()
    assert commands.stub_command(parser.parse_args(["--python", "3.7", "--out", str(tmp_path)])) == 1
    assert "no Python-backend stub for Python 3.7" in capsys.readouterr().err


def test_triton_release_mapping():
    assert stubs.triton_release_for_version("2.51.0") == "r24.10"  # the embedded server
    assert stubs.triton_release_for_version("2.54.0") == "r25.01"
    assert stubs.triton_release_for_version("2.18.0") == "r22.01"
    with pytest.raises(EnvError):
        stubs.triton_release_for_version("2.17.0")


BUILD_SH = ROOT / "stub_build" / "build.sh"


def test_build_script_syntax():
    subprocess.run(["bash", "-n", str(BUILD_SH)], check=True)


def _dockerfile_base_image(build_args: dict) -> str:
    """Resolve the Dockerfile's FROM line with its ARG defaults and ``build_args``."""
    text = (ROOT / "stub_build" / "Dockerfile").read_text()
    values = {}
    for line in text.splitlines():
        if line.startswith("ARG ") and "=" in line:
            key, value = line[4:].split("=", 1)
            values.setdefault(key.strip(), value.strip())
        if line.startswith("FROM "):
            image = line.split()[1]
            break
    values.update(build_args)
    for key, value in values.items():
        image = image.replace("${" + key + "}", value)
    return image


@pytest.mark.parametrize("release", ["r24.10", "r25.01"])
def test_dockerfile_names_the_release_image(release):
    out = subprocess.run(["bash", str(BUILD_SH), "--dry-run", "3.12", release], capture_output=True, text=True, check=True).stdout
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    args = dict(a.split("=", 1) for a in lines["command"].split("--build-arg ")[1:] for a in [a.split()[0]])
    expected = f"nvcr.io/nvidia/tritonserver:{release[1:]}-py3"
    assert lines["base image"] == expected
    assert _dockerfile_base_image(args) == expected
    assert args["TRITON_BRANCH"] == release and args["PYTHON_VERSION"] == "3.12"
    # Without build args the Dockerfile builds for the embedded server's release.
    assert _dockerfile_base_image({}) == f"nvcr.io/nvidia/tritonserver:{common.EMBEDDED_TRITON_RELEASE[1:]}-py3"


def test_build_script_without_docker_engine(tmp_path):
    # A socket nobody listens on: no engine, whatever this machine has (without a docker
    # CLI the script stops one check earlier, with the same exit status).
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    proc = subprocess.run(["bash", str(BUILD_SH), "3.12", "r24.10"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "error: " in proc.stderr and ("no Docker engine reachable" in proc.stderr or "docker CLI is not installed" in proc.stderr)
    assert "nvcr.io/nvidia/tritonserver:24.10-py3" in proc.stderr and "make stub PYTHON=3.12" in proc.stderr


def test_build_script_without_docker_cli(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("dirname"), bin_dir / "dirname")
    proc = subprocess.run(
        [shutil.which("bash"), str(BUILD_SH), "3.12", "r24.10"], capture_output=True, text=True, env={"PATH": str(bin_dir)}
    )
    assert proc.returncode == 3
    assert "the docker CLI is not installed" in proc.stderr


def test_build_script_rejects_bad_arguments():
    for args in (["3.12"], ["three", "r24.10"], ["3.12", "24.10"]):
        proc = subprocess.run(["bash", str(BUILD_SH), *args], capture_output=True, text=True)
        assert proc.returncode == 2 and ("usage" in proc.stderr or "error" in proc.stderr)


def _make_n(*args) -> str:
    return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_targets():
    out = _make_n("env", "PYTHON=3.12", "TARGET=gpu")
    assert "/bin/orchestrator env build --python 3.12 --target gpu --install model_repository" in out
    assert "python3 lab/preflight.py --venv .venv --extras env" in out  # the venv is not built with "3.12"
    assert "bash stub_build/build.sh 3.12 r24.10" in _make_n("stub", "PYTHON=3.12", "TRITON=r24.10")
    assert "/bin/orchestrator stub --python 3.12" in _make_n("stub", "PYTHON=python3.12")
    # The verbs the Makefile runs parse those commands.
    for args in (["env", "build", "--help"], ["stub", "--help"]):
        proc = subprocess.run([sys.executable, "-m", "orchestrator.tooling.cli", *args], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0 and "--python" in proc.stdout, proc.stderr


# ----------------------------------------------------------------------------------------
# Declarations


def test_requirements_pin_numpy_below_2_and_match_the_project():
    import re

    pyproject = (ROOT / "pyproject.toml").read_text()
    for target in ("cpu", "gpu"):
        pins = {}
        for line in build.requirements_file(target).read_text().splitlines():
            line, _, marker = line.split("#")[0].strip().partition(";")
            if line and "< \"3.11\"" not in marker:  # the Python 3.10 pins are older releases
                name, _, version = line.strip().partition("==")
                assert version, f"{target}: {line!r} is not pinned with =="
                pins[name] = version
        assert int(pins["numpy"].split(".")[0]) < 2
        for name, version in pins.items():
            m = re.search(rf'"{re.escape(name)}==([^"]+)"', pyproject)
            if m:
                assert m.group(1) == version, f"{name}: env pins {version}, pyproject {m.group(1)}"
    assert "onnxruntime-gpu" in build.requirements_file("gpu").read_text()
    with pytest.raises(EnvError, match="unknown env target 'tpu'"):
        build.requirements_file("tpu")


def test_environment_yml_renders_python_and_requirements(tmp_path):
    import yaml

    path = build._render_environment_yml("3.12", ["-r", str(build.requirements_file("cpu"))], tmp_path)
    spec = yaml.safe_load(path.read_text())
    assert "python=3.12" in spec["dependencies"]
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    assert pip == [f"-r {build.requirements_file('cpu')}"]


def test_generated_files_are_git_ignored():
    paths = [
        "model_repository/router/triton_env.tar.gz",
        "model_repository/router/triton_python_backend_stub",
        "model_repository/router/triton_python_backend_stub.py3.12",
        "model_repository/router/configs/env.pbtxt",
        "stub_build/out/3.12/triton_python_backend_stub",
        ".cache/env/triton_env.tar.gz.json",
    ]
    proc = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 128:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    assert sorted(proc.stdout.split()) == sorted(paths)
