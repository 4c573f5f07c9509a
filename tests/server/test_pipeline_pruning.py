"""A request that asks for some outputs, on the embedded Triton 2.51: the router runs the
steps its ensemble runs (Triton's statistics), answers byte-identically, and answers where
Triton's own pruning fails the request; the mock's ensembles prune as Triton does."""

from __future__ import annotations

import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from orchestrator.testing.mock import InferError, MockTriton
from tests.mock.test_mock_ensemble import FAN_PRUNING, write_repository
from tests.mock.test_pipeline_mock import img, same, typed_inputs
from tests.mock.test_pipeline_pruning import FORK_RUNS, pruning_repository
from tests.server.test_tensor_pipeline_server import infer

pytestmark = pytest.mark.server

MODELS = ["first", "second", "detector", "fork", "fork_ensemble", "fork_migrated", "mixer", "labeler", "typed", "typed_ensemble",
          "pair", "plus_one", "fan"]
COUNTED = ["first", "second", "detector", "mixer", "labeler", "pair", "plus_one"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = pruning_repository(tmp_path_factory.mktemp("pruning") / "model_repository")
    return write_repository(repo)  # the mock's ensemble tests' models beside them (fan, pair, plus_one)


@pytest.fixture(scope="module")
def server(repo):
    from orchestrator.tooling.server import TritonServer

    with TritonServer(repo, models=MODELS, model_config_name=None) as srv:
        yield srv


@pytest.fixture(scope="module")
def mock(repo):
    with MockTriton(repo, model_config_name=None, models=MODELS) as m:
        yield m


def served(server) -> dict:
    """Each counted model's ``inference_count`` (Triton's statistics), once settled."""
    client = server.client()
    try:
        last: dict = {}
        for _ in range(50):
            stats = client.get_inference_statistics("")["model_stats"]
            now = {s["name"]: int(s["inference_count"]) for s in stats if s["name"] in COUNTED}
            if now == last:
                return now
            last = now
            time.sleep(0.1)
        return now
    finally:
        client.close()


def run_counted(server, model, inputs, outputs, **kwargs):
    """(the answer or the error's text, the models whose statistics moved)."""
    before = served(server)
    try:
        answer = infer(server, model, inputs, outputs=outputs, **kwargs)
    except InferenceServerException as exc:
        answer = str(exc)
    after = served(server)
    return answer, sorted(m for m in COUNTED if after.get(m) != before.get(m))


@pytest.mark.parametrize("outputs,models", list(FORK_RUNS.items()))
def test_the_router_and_the_migrated_ensemble_run_what_the_ensemble_runs_and_answer_the_same(server, mock, outputs, models):
    x = {"IMG": img([[0.9, 0.1, 0.3, 0.0], [0.2, 0.8, 0.1, 0.5]])}
    got, ran = run_counted(server, "fork", x, list(outputs))
    assert ran == models and set(got) == set(outputs)
    expected, ran = run_counted(server, "fork_ensemble", x, list(outputs))
    assert ran == models
    same(got, expected)
    migrated, ran = run_counted(server, "fork_migrated", x, list(outputs))
    assert ran == models
    same(migrated, expected)
    same(got, mock.infer("fork", x, outputs=list(outputs)))


@pytest.mark.parametrize("outputs,expected", list(FAN_PRUNING.items()))
def test_the_mock_prunes_an_ensemble_as_triton_does(server, mock, outputs, expected):
    x = {"X": np.array([1.0], np.float32)}
    got, ran = run_counted(server, "fan", x, list(outputs))
    if isinstance(expected, str):
        assert isinstance(got, str) and "[400]" in got and expected in got and ran == []
        with pytest.raises(InferError, match=expected):
            mock.infer("fan", x, outputs=list(outputs))
    else:
        assert ran == expected
        same(got, mock.infer("fan", x, outputs=list(outputs)))


def test_the_router_answers_where_the_ensembles_pruning_fails(server, mock):
    inputs = typed_inputs(2, 3)
    failed, ran = run_counted(server, "typed_ensemble", inputs, ["LABEL"])
    assert "unexpected deadlock" in failed and ran == []
    got, ran = run_counted(server, "typed", inputs, ["LABEL"])
    assert list(got) == ["LABEL"] and ran == ["labeler", "mixer"]
    same(got, {"LABEL": infer(server, "typed_ensemble", inputs)["LABEL"]})
    got, ran = run_counted(server, "typed", inputs, ["Y"])
    assert list(got) == ["Y"] and ran == ["mixer"]
    same(got, mock.infer("typed", inputs, outputs=["Y"]))
