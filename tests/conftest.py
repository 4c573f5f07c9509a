"""Shared fixtures: one real Triton server per test session for the server tests, and the
execution environments the env tests build once. Helpers: ``tests/helpers.py``,
``tests/envhelpers.py``.

Markers, applied here so that a new test gets them from what it uses (``make test-fast``
deselects them; ``make test`` runs everything):

- ``server``: every test under ``tests/server/`` (a real ``tritonserver`` on loopback);
- ``slow`` and ``network``: a test whose body, or any fixture it uses (directly or through
  other fixtures), calls one of the helpers in :data:`HEAVY_CALLS` (a name looked up in the
  code's names, so ``E.export_checkpoint(...)`` counts as well as ``export_checkpoint(...)``).
  A new helper that exports a model, builds an environment or reaches the package index goes
  into that table.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

from tests.envhelpers import ENV_PY, build_probe_env
from tests.helpers import NOT_LOADED_AT_START, make_test_repository

# The mock Triton fixtures (triton_mock ...) as users get them from the pytest11 entry point
# of the testing extra; registered once when both are there (the entry point has this name).
pytest_plugins = ["orchestrator.testing.pytest_plugin", "pytester"]

#: Helper name -> the markers of every test that calls it (directly or through a fixture).
#: ``slow``: exports or trains a torch model, or builds an execution environment (seconds to
#: a minute each on 2 cores); ``network``: may download from the package index (pip installs
#: of validators, numpy into an environment, the training corpus) when its cache is cold.
HEAVY_CALLS: Dict[str, Tuple[str, ...]] = {
    # torch: checkpoints, ONNX export, training (orchestrator.tooling.modeling, tests/byom.py)
    "make_checkpoint": ("slow",),
    "build_checkpoints": ("slow",),
    "export_checkpoint": ("slow",),
    "export_all": ("slow",),
    "train_tokenizer": ("slow",),
    # the training corpus: pip download of the vaderSentiment sdist when not cached
    "fetch_corpus": ("slow", "network"),
    "load_examples": ("network",),
    # execution environments (orchestrator.tooling.env.build, tests/envhelpers.py): venvs with
    # packages from the index
    "build_env": ("slow", "network"),
    "build_probe_env": ("slow", "network"),
    # the deployment validators and supply-chain tools, pip-installed into .cache/tools
    "ensure_tools": ("slow", "network"),
    "ensure_supply_tools": ("slow", "network"),
    # a fresh virtualenv with the testing extra (a wheel build of this checkout, the index)
    "build_testing_venv": ("slow", "network"),
}


def _names(code: types.CodeType) -> Iterator[str]:
    """Every global and attribute name ``code`` uses, nested functions and lambdas included."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def heavy_marks(item: pytest.Item) -> Set[str]:
    """The markers :data:`HEAVY_CALLS` gives ``item``: from its own code, every fixture in
    its closure, and the helper functions of ``tests/`` they call (followed through their
    module globals)."""
    todo = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        todo += [d.func for d in defs]
    marks: Set[str] = set()
    seen: Set[int] = set()
    while todo:
        fn = todo.pop()
        fn = getattr(fn, "__wrapped__", fn)
        code = getattr(fn, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        names = set(_names(code))
        for name in names & HEAVY_CALLS.keys():
            marks.update(HEAVY_CALLS[name])
        for name in names:
            helper = getattr(fn, "__globals__", {}).get(name)
            if isinstance(helper, types.FunctionType) and helper.__module__.startswith("tests."):
                todo.append(helper)
    return marks


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
    """``server`` for tests/server/; ``slow`` and ``network`` from :data:`HEAVY_CALLS`."""
    for item in items:
        if "/tests/server/" in str(item.fspath):
            item.add_marker(pytest.mark.server)
        for mark in sorted(heavy_marks(item)):
            item.add_marker(getattr(pytest.mark, mark))


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
