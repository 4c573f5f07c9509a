"""pytest plugin: test Triton Python-backend models (``model.py``) in process, no server.

Installed with ``pip install "triton-orchestrator[testing]"`` (entry point ``pytest11``); in
a checkout without it, ``-p orchestrator.testing.pytest_plugin``. Fixtures:

``triton_mock``
    A :class:`~orchestrator.testing.harness.TritonMock` (a
    :class:`~orchestrator.testing.mock.MockTriton`) over the model repository named by the
    test's ``@pytest.mark.triton_repository(path, load=[...])`` (path relative to the test
    file), else ``--triton-repository`` / the ``triton_repository`` ini value (relative to
    the rootdir), else an empty repository the test fills with ``add_model``/``fake``.
    Explicit model control: only ``load=`` models are loaded. Closed (every model's
    ``finalize`` run) after the test.
``triton_mock_factory``
    ``make(model_repository=None, *, load=(), release=None, **MockTriton options)``: more
    mocks in one test, each closed after it.

The emulated release (which ``pb_utils`` features models see: ``"24.10"``/``"2.51"``, the
default, or ``"26.08"``): ``@pytest.mark.triton_release("26.08")``, else
``--triton-release``, else ``$MOCK_TRITON_RELEASE``. When a test fails, the report shows
the mock's log (``pb_utils.Logger`` and load/finalize messages) in a "triton mock log"
section.

``import triton_python_backend_utils as pb_utils`` works in test modules (to write a fake
model class, or to import a ``model.py`` directly): the plugin adds an import hook that
installs the mock's module the first time that name is imported, unless a real one is
importable. The plugin imports numpy and the mock only then, or when a fixture is used.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, List, Optional, Sequence

import pytest

_MOCKS = pytest.StashKey[List[Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("triton-mock", "Triton Python-backend mock (orchestrator.testing)")
    group.addoption("--triton-repository", default=None,
                    help="model repository for the triton_mock fixture (relative to the rootdir)")
    group.addoption("--triton-release", default=None,
                    help="emulated Triton release for triton_mock: 24.10 (2.51, default) or 26.08")
    parser.addini("triton_repository", "model repository for the triton_mock fixture (relative to the rootdir)")


class _PbUtilsFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``triton_python_backend_utils`` (only) and gives the mock's module."""

    NAME = "triton_python_backend_utils"

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None) -> Any:
        if fullname != self.NAME:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> Any:
        from orchestrator.testing.mock import install

        return install()

    def exec_module(self, module: Any) -> None:
        return None


_FINDER = _PbUtilsFinder()


_ADDED = pytest.StashKey[bool]()


def _importable(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def pytest_configure(config: pytest.Config) -> None:
    # appended: a real module on sys.path (or one already imported) wins
    added = _FINDER not in sys.meta_path and not _importable(_PbUtilsFinder.NAME)
    if added:
        sys.meta_path.append(_FINDER)
    config.stash[_ADDED] = added
    config.addinivalue_line(
        "markers",
        "triton_repository(path, load=()): the model repository of the triton_mock fixture "
        "(relative to the test file) and the models loaded before the test",
    )
    config.addinivalue_line(
        "markers", "triton_release(name): the Triton release the mock emulates (24.10, 2.51, 26.08)"
    )


def _release(request: pytest.FixtureRequest, release: Optional[str]) -> Optional[str]:
    if release is not None:
        return release
    marker = request.node.get_closest_marker("triton_release")
    if marker is not None:
        return str(marker.args[0]) if marker.args else str(marker.kwargs["name"])
    option = request.config.getoption("--triton-release")
    return str(option) if option else None


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_ADDED, False) and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


@pytest.fixture
def triton_mock_factory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """``make(model_repository=None, *, load=(), release=None, **options) -> TritonMock``."""
    from orchestrator.testing.harness import TritonMock

    made: List[Any] = []
    request.node.stash.setdefault(_MOCKS, [])

    def make(model_repository: Any = None, *, load: Any = (), release: Optional[str] = None, **options: Any) -> Any:
        workdir = tmp_path_factory.mktemp("triton_repository")
        mock = TritonMock(model_repository, workdir, load=load, release=_release(request, release), **options)
        made.append(mock)
        request.node.stash[_MOCKS].append(mock)
        return mock

    yield make
    errors = []
    for mock in reversed(made):
        try:
            mock.close()
        except Exception as exc:  # pragma: no cover - close logs finalize errors itself
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def triton_mock(request: pytest.FixtureRequest, triton_mock_factory: Callable[..., Any]) -> Any:
    """A mock Triton over the test's model repository (see the module docs)."""
    marker = request.node.get_closest_marker("triton_repository")
    source: Optional[Path] = None
    load: Any = ()
    if marker is not None:
        path = Path(marker.args[0]) if marker.args else Path(marker.kwargs["path"])
        source = path if path.is_absolute() else Path(request.node.path).parent / path
        load = marker.kwargs.get("load", marker.args[1] if len(marker.args) > 1 else ())
    else:
        configured = request.config.getoption("--triton-repository") or request.config.getini("triton_repository")
        if configured:
            path = Path(str(configured))
            source = path if path.is_absolute() else Path(request.config.rootpath) / path
    return triton_mock_factory(source, load=[load] if isinstance(load, str) else load)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    mocks = item.stash.get(_MOCKS, [])
    if report.failed and mocks:
        lines = [f"{r.level} [{r.model or 'server'}] {r.message}" for mock in mocks for r in list(mock.logs)]
        if lines:
            report.sections.append(("triton mock log", "\n".join(lines)))
