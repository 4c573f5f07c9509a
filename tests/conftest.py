"""Shared fixtures: one real Triton server per test session for the pipeline tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "model_repository"

# Test-only router variants added to a copy of the repository: same code, other knobs.
ROUTER_VARIANTS = {
    # every non-empty text escalates: its answers must equal the ensemble's
    "router_accurate": {"cascade_margin": "1.0"},
    # never escalates
    "router_fast": {"cascade_margin": "0.0"},
}


def make_test_repository(dest: Path) -> Path:
    """Copy ``model_repository`` to ``dest`` and add the :data:`ROUTER_VARIANTS`."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns("__pycache__"))
    config = (REPO / "router" / "config.pbtxt").read_text()
    for name, params in ROUTER_VARIANTS.items():
        text = config.replace('name: "router"', f'name: "{name}"')
        for key, value in params.items():
            old = f'key: "{key}" value: {{ string_value: "'
            start = text.index(old) + len(old)
            end = text.index('"', start)
            text = text[:start] + value + text[end:]
        (dest / name / "1").mkdir(parents=True)
        shutil.copy(REPO / "router" / "1" / "model.py", dest / name / "1" / "model.py")
        (dest / name / "config.pbtxt").write_text(text)
    return dest


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory) -> Path:
    return make_test_repository(tmp_path_factory.mktemp("repo") / "model_repository")


@pytest.fixture(scope="session")
def triton(test_repository):
    """A real tritonserver on loopback serving the test repository; stopped at the end."""
    from orchestrator.server import TritonServer

    server = TritonServer(test_repository)
    server.start()
    yield server
    server.stop()
