"""``describe_policy`` on a pipeline router (mock): the optional ``POLICY`` output carries
the policy document as JSON, one per row, runs no step when it is all a request asks for,
and is refused, naming why, where the router's config has no ``POLICY`` output."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from orchestrator.testing.mock import InferError, MockTriton
from tests.mock.test_pipeline_mock import img, same, typed_inputs
from tests.pipeline_repo import MODELS, make_pipeline_repository

STEP_MODELS = ("first", "second", "detector", "flat")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_pipeline_repository(tmp_path_factory.mktemp("pipelines") / "model_repository")


@pytest.fixture(scope="module")
def mock(repo):
    with MockTriton(repo, model_config_name=None) as m:
        for name in MODELS:
            m.load(name)
        yield m


def document(repo, model):
    return yaml.safe_load((repo / model / "policy.yaml").read_text())


def test_policy_alone_is_the_document_per_row_and_runs_no_step(repo, mock):
    mock.reset_calls()
    got = mock.infer("fork", {"IMG": img([[1, 2, 3, 4], [0, 0, 0, 1]])}, parameters={"describe_policy": True},
                     outputs=["POLICY"])
    assert list(got) == ["POLICY"] and got["POLICY"].shape == (2, 1) and got["POLICY"].dtype == object
    assert all(json.loads(bytes(v)) == document(repo, "fork") for v in got["POLICY"].reshape(-1))
    assert not [c for c in mock.calls if c.model in STEP_MODELS]


def test_policy_beside_the_outputs_and_only_when_asked(repo, mock):
    x = {"IMG": img([[1, 2, 3, 4]])}
    plain = mock.infer("fork", x)
    assert sorted(plain) == ["OUT", "PROBS", "SCORE"]  # all outputs but POLICY
    described = mock.infer("fork", x, parameters={"describe_policy": "true"})
    assert sorted(described) == ["OUT", "POLICY", "PROBS", "SCORE"]
    same({k: v for k, v in described.items() if k != "POLICY"}, plain)
    flat = mock.infer("flat_router", {"V": np.array([1.0, 2.0, 3.0])}, parameters={"describe_policy": True})
    assert flat["POLICY"].shape == (1,) and json.loads(bytes(flat["POLICY"][0])) == document(repo, "flat_router")


def test_policy_without_the_parameter_or_a_router_without_the_output_is_refused(mock):
    with pytest.raises(InferError, match="POLICY: this output is only produced for requests with the parameter "
                                         "describe_policy=true") as err:
        mock.infer("fork", {"IMG": img([[1, 2, 3, 4]])}, outputs=["POLICY"])
    assert err.value.code == "INVALID_ARG"
    with pytest.raises(InferError, match="parameter describe_policy: router 'typed' has no POLICY output in its "
                                         "config") as err:
        mock.infer("typed", typed_inputs(1), parameters={"describe_policy": True})
    assert err.value.code == "INVALID_ARG"
    with pytest.raises(InferError, match="describe_policy: expected"):
        mock.infer("fork", {"IMG": img([[1, 2, 3, 4]])}, parameters={"describe_policy": "maybe"})


def test_describe_policy_is_never_forwarded_to_the_steps(mock):
    got = mock.infer("echo_router", {"A": np.array([[1.0]], np.float32)}, parameters={"describe_policy": False, "x_a": 1})
    assert json.loads(bytes(got["P"][0, 0])) == {"x_a": 1}
