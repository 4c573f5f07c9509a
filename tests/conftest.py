"""Shared fixtures: one real Triton server per test session for the server tests, and the
execution environments the env tests build once. Helpers: ``tests/helpers.py``,
``tests/envhelpers.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.envhelpers import ENV_PY, build_probe_env
from tests.helpers import NOT_LOADED_AT_START, make_test_repository


def pytest_configure(config):
    """``make test`` sets ORCHESTRATOR_REQUIRE_TORCH=1: the tests that export then run, never skip."""
    if os.environ.get("ORCHESTRATOR_REQUIRE_TORCH") == "1":
        try:
            import onnx  # noqa: F401
            import torch  # noqa: F401
        except ImportError as exc:
            raise pytest.UsageError(f"make test needs the `train` extra (torch, onnx) for the export tests: {exc}; "
                                    "run `.venv/bin/pip install -e '.[test,train]'`") from exc


def pytest_collection_modifyitems(config, items):
    """Every test under tests/server/ starts or uses a real tritonserver: mark it ``server``."""
    for item in items:
        if "/tests/server/" in str(item.fspath):
            item.add_marker(pytest.mark.server)


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory) -> Path:
    return make_test_repository(tmp_path_factory.mktemp("repo") / "model_repository")


@pytest.fixture(scope="session")
def triton(test_repository):
    """A real tritonserver on loopback serving the test repository; stopped at the end."""
    from orchestrator.tooling.server import TritonServer

    models = [p.name for p in sorted(test_repository.iterdir()) if (p / "config.pbtxt").exists() and p.name not in NOT_LOADED_AT_START]
    server = TritonServer(test_repository, models=models)
    server.start()
    yield server
    server.stop()


# ----------------------------------------------------------------------------- execution environments


@pytest.fixture(scope="session")
def env_python():
    from orchestrator.tooling.env.common import EnvError
    from orchestrator.tooling.env.interpreters import find_python

    try:
        return find_python(ENV_PY)
    except EnvError as exc:
        pytest.skip(f"no Python {ENV_PY} on this machine for the interpreter-mismatch case: {exc}")


@pytest.fixture(scope="session")
def packed_env(env_python, tmp_path_factory):
    """A venv-pack'ed env of ENV_PY with numpy 1.26.4, envprobe and this checkout's
    orchestrator package (a wheel, --no-deps), built and verified."""
    return build_probe_env(tmp_path_factory.mktemp("env-np1"), "1.26.4", verify=True, project=True)


@pytest.fixture(scope="session")
def packed_env_numpy2(env_python, tmp_path_factory):
    """The same with numpy 2.0.2 (not verified: verification rejects it, see below)."""
    return build_probe_env(tmp_path_factory.mktemp("env-np2"), "2.0.2", verify=False)
