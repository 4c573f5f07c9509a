"""A ``max_batch_size: 0`` ensemble mixing batching and non-batching steps both ways,
migrated: the router's per-tensor reshape (``model_dims``) answers byte-identically to the
ensemble on the mock (whose ensembles reshape as Triton 2.51's do); the real server's side
is tests/server/test_migrate_server.py."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.pipeline import read_pipeline
from orchestrator.testing.mock import MockTriton
from orchestrator.tooling.cli import main
from tests import reshape_repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = reshape_repo.write(tmp_path_factory.mktemp("bothways"))
    assert main(["migrate", str(repo / "bothways"), "--name", "bothways_bls", "--repo", str(repo),
                 "--model-config-name", ""]) == 0
    return repo


def test_batch_dimensions_added_and_stripped_per_tensor_as_the_ensemble_does(repo):
    with MockTriton(repo, model_config_name=None) as mock:
        mock.load("bothways")
        mock.load("bothways_bls")
        for request in reshape_repo.requests(5):
            ens = mock.infer("bothways", request)
            bls = mock.infer("bothways_bls", request)
            a = request["A"]
            assert {n: v.shape for n, v in ens.items()} == {"Y": (4,), "Z": (4,), "K": (1, 4), "V": (4,)}
            assert ens["V"].tobytes() == (((a * 2 + 1) * 2 - 3) * 2).astype(np.float32).tobytes()
            assert list(bls) == list(ens)
            for name in ens:
                assert (bls[name].dtype, bls[name].shape) == (ens[name].dtype, ens[name].shape), name
                assert bls[name].tobytes() == ens[name].tobytes(), name


def test_model_dims_is_checked_at_load():
    step = {"kind": "step", "model": "m", "inputs": {"X": "A"}, "outputs": {"Y": "B"}}
    for bad, message in (
            ({"max_batch_size": 4, "inputs": {"Q": [4]}}, r"model_dims.inputs.Q: not one of the step's inputs \(X\)"),
            ({"max_batch_size": 4, "inputs": {"X": [-2]}}, r"model_dims.inputs.X: expected a list of dims"),
            ({"inputs": {"X": [4]}}, r"max_batch_size"),
    ):
        with pytest.raises(PolicyError, match=message):
            read_pipeline({"outputs": ["B"], "steps": [dict(step, model_dims=bad)]})
    with pytest.raises(PolicyError, match="add_batch_dim and model_dims together"):
        read_pipeline({"outputs": ["B"], "steps": [dict(step, add_batch_dim=True,
                                                        model_dims={"max_batch_size": 4, "inputs": {"X": [4]}})]})
