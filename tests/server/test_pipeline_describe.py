"""``describe_policy`` and ``orchestrator policy show`` on pipeline routers in the embedded
Triton 2.51: the POLICY output as on the mock, no step run for it, and a router without a
POLICY output refused naming why (``policy show`` too)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from tritonclient.utils import InferenceServerException

from orchestrator.runtime.routing.pipeline import read_pipeline
from orchestrator.runtime.routing.pipeline_plan import describe_pipeline
from orchestrator.testing.mock import MockTriton
from orchestrator.tooling.cli import main
from orchestrator.tooling.policy_cli import fetch_policy
from tests.mock.test_pipeline_mock import img, same, typed_inputs
from tests.pipeline_repo import make_pipeline_repository
from tests.server.test_pipeline_pruning import COUNTED, run_counted
from tests.server.test_tensor_pipeline_server import infer

pytestmark = pytest.mark.server

MODELS = ["first", "second", "detector", "fork", "flat", "flat_router", "mixer", "labeler", "typed"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_pipeline_repository(tmp_path_factory.mktemp("describe") / "model_repository")


@pytest.fixture(scope="module")
def server(repo):
    from orchestrator.tooling.server import TritonServer

    with TritonServer(repo, models=MODELS, model_config_name=None) as srv:
        yield srv


@pytest.fixture(scope="module")
def mock(repo):
    with MockTriton(repo, model_config_name=None, models=MODELS) as m:
        yield m


def document(repo, model):
    return yaml.safe_load((repo / model / "policy.yaml").read_text())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_policy_output_as_on_the_mock_and_no_step_run_for_it(repo, server, mock, protocol):
    x = {"IMG": img([[1, 2, 3, 4], [0, 0, 0, 1]])}
    assert set(COUNTED) >= {"first", "second", "detector"}
    got, ran = run_counted(server, "fork", x, ["POLICY"], parameters={"describe_policy": True}, protocol=protocol)
    assert list(got) == ["POLICY"] and got["POLICY"].shape == (2, 1) and ran == []
    assert json.loads(bytes(got["POLICY"][0, 0])) == document(repo, "fork")
    same(got, mock.infer("fork", x, parameters={"describe_policy": True}, outputs=["POLICY"]))
    everything = infer(server, "fork", x, parameters={"describe_policy": True}, protocol=protocol)
    same(everything, mock.infer("fork", x, parameters={"describe_policy": True}))
    assert "POLICY" not in infer(server, "fork", x, protocol=protocol)
    flat = infer(server, "flat_router", {"V": np.array([1.0, 2.0, 3.0])}, parameters={"describe_policy": True})
    assert flat["POLICY"].shape == (1,)
    same(flat, mock.infer("flat_router", {"V": np.array([1.0, 2.0, 3.0])}, parameters={"describe_policy": True}))


def test_refusals_name_why(server):
    with pytest.raises(InferenceServerException, match="only produced for requests with the parameter describe_policy"):
        infer(server, "fork", {"IMG": img([[1, 2, 3, 4]])}, outputs=["POLICY"])
    with pytest.raises(InferenceServerException, match="router 'typed' has no POLICY output in its config"):
        infer(server, "typed", typed_inputs(1), parameters={"describe_policy": True})
    assert server.is_ready()


def test_policy_show_prints_the_running_pipeline(repo, server, capsys):
    assert fetch_policy(server.http_url, "fork") == document(repo, "fork")
    assert fetch_policy(server.grpc_url, "flat_router", protocol="grpc") == document(repo, "flat_router")
    assert main(["policy", "show", "--url", server.http_url, "--model", "fork"]) == 0
    assert capsys.readouterr().out.strip() == describe_pipeline(read_pipeline(document(repo, "fork")["pipeline"]))
    assert main(["policy", "show", "--url", server.http_url, "--model", "fork", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == document(repo, "fork")
    assert main(["policy", "show", "--url", server.http_url, "--model", "typed"]) == 1
    err = capsys.readouterr().err
    assert "model 'typed' has no POLICY output" in err and 'name: "POLICY" data_type: TYPE_STRING' in err
