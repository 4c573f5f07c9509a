"""Shared fixtures: one real Triton server per test session for the pipeline tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "model_repository"

# Test-only router variants added to a copy of the repository: same code, the default
# policy with the cascade margin changed.
ROUTER_VARIANTS = {
    # every non-empty text escalates: its answers must equal the ensemble's
    "router_accurate": {"cascade": {"margin": 1.0}},
    # never escalates
    "router_fast": {"cascade": {"margin": 0.0}},
}


def set_node_fields(node, changes):
    """Apply ``{node name: {field: value}}`` to a policy document's node tree, in place."""
    if isinstance(node, dict):
        if node.get("name") in changes:
            node.update(changes[node["name"]])
        for value in node.values():
            set_node_fields(value, changes)
    elif isinstance(node, list):
        for value in node:
            set_node_fields(value, changes)


def add_router_variant(repo: Path, name: str, policy_document) -> Path:
    """Add model ``name``: the router's code and config with its own policy document."""
    dest = repo / name
    (dest / "1").mkdir(parents=True)
    shutil.copy(REPO / "router" / "1" / "model.py", dest / "1" / "model.py")
    config = (REPO / "router" / "config.pbtxt").read_text().replace('name: "router"', f'name: "{name}"')
    (dest / "config.pbtxt").write_text(config)
    (dest / "policy.yaml").write_text(yaml.safe_dump(policy_document, sort_keys=False))
    return dest


def make_test_repository(dest: Path) -> Path:
    """Copy ``model_repository`` to ``dest`` and add the :data:`ROUTER_VARIANTS`."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for name, changes in ROUTER_VARIANTS.items():
        document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
        set_node_fields(document, changes)
        add_router_variant(dest, name, document)
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
