"""A request that asks for some outputs runs only the nodes those outputs need (mock):
the router skips every step and switch whose tensors feed none of them, per request, as
Triton's ensemble scheduler prunes its steps; where Triton 2.51's pruning fails a request
("unexpected deadlock"), the router answers it (a documented difference)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import yaml

from orchestrator.runtime.routing.pipeline import read_pipeline
from orchestrator.runtime.routing.pipeline_plan import Pruning, unneeded_nodes
from orchestrator.testing.mock import InferError, MockTriton
from tests.mock.test_pipeline_mock import img, same, typed_inputs
from tests.pipeline_repo import CLASSES, MODELS, STOP_EARLY, make_pipeline_repository

FORK_OUTPUTS = ("SCORE", "OUT", "PROBS")
#: The fork's requested outputs -> the models that run (router and ensemble alike; Triton
#: 2.51's statistics say the same: tests/server/test_pipeline_pruning.py).
FORK_RUNS = {
    ("SCORE",): ["first"],
    ("OUT",): ["first", "second"],
    ("PROBS",): ["detector"],
    ("SCORE", "OUT"): ["first", "second"],
    ("SCORE", "PROBS"): ["detector", "first"],
    ("OUT", "PROBS"): ["detector", "first", "second"],
    FORK_OUTPUTS: ["detector", "first", "second"],
}
STEP_MODELS = ("first", "second", "detector", "mixer", "labeler", *(f"cls_{c}" for c in CLASSES))


def pruning_repository(repo):
    """The pipeline repository with ``fork_migrated``: ``orchestrator migrate`` of ``fork_ensemble``."""
    from orchestrator.tooling.migrate import migrate

    make_pipeline_repository(repo)
    migrate(repo / "fork_ensemble", "fork_migrated", repo, config_name=None)
    return repo


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = pruning_repository(tmp_path_factory.mktemp("pipelines") / "model_repository")
    with MockTriton(repo, model_config_name=None) as m:
        for name in MODELS + ["fork_migrated"]:
            m.load(name)
        yield m


def ran(mock) -> list:
    """The step models that ran since the last reset."""
    return sorted({c.model for c in mock.calls if c.model in STEP_MODELS})


def test_every_subset_of_outputs_is_listed():
    assert set(FORK_RUNS) == {c for r in (1, 2, 3) for c in itertools.combinations(FORK_OUTPUTS, r)}


@pytest.mark.parametrize("outputs,models", list(FORK_RUNS.items()))
def test_the_router_and_the_migrated_ensemble_run_the_steps_the_ensemble_runs(mock, outputs, models):
    x = img([[0.9, 0.1, 0.3, 0.0], [0.2, 0.8, 0.1, 0.5]])
    mock.reset_calls()
    got = mock.infer("fork", {"IMG": x}, outputs=list(outputs))
    assert ran(mock) == models and set(got) == set(outputs)
    mock.reset_calls()
    same(got, mock.infer("fork_ensemble", {"IMG": x}, outputs=list(outputs)))
    assert ran(mock) == models
    mock.reset_calls()
    same(got, mock.infer("fork_migrated", {"IMG": x}, outputs=list(outputs)))
    assert ran(mock) == models


def test_an_unrequested_output_a_later_step_reads_still_runs_its_step_where_triton_fails(mock):
    inputs = typed_inputs(2, 3)
    mock.reset_calls()
    got = mock.infer("typed", inputs, outputs=["Y"])
    assert list(got) == ["Y"] and ran(mock) == ["mixer"]
    mock.reset_calls()
    got = mock.infer("typed", inputs, outputs=["LABEL"])
    assert list(got) == ["LABEL"] and ran(mock) == ["labeler", "mixer"]
    same(got, {"LABEL": mock.infer("typed", inputs)["LABEL"]})
    # Triton 2.51's ensemble prunes mixer (its outputs Y and CODE are not asked for) although
    # labeler reads CODE: no step runs and the request fails
    with pytest.raises(InferError, match="unexpected deadlock"):
        mock.infer("typed_ensemble", inputs, outputs=["LABEL"])


def test_a_switch_whose_outputs_are_not_asked_for_is_skipped_conditions_and_all(mock):
    x = img([[3.0, 0.0, 0.0, 1.0], [0.0, 3.0, 0.0, 2.0]])
    mock.reset_calls()
    got = mock.infer("per_class", {"IMG": x}, outputs=["PROBS"])
    assert list(got) == ["PROBS"] and ran(mock) == ["detector"]
    mock.reset_calls()
    got = mock.infer("per_class", {"IMG": x}, outputs=["LABEL"])
    assert list(got) == ["LABEL"] and ran(mock) == ["cls_cat", "cls_dog", "detector"]


def test_requests_of_one_execute_each_run_what_they_asked_for(mock):
    x = img([[0.9, 0.1, 0.3, 0.0]])
    mock.reset_calls()
    answers = mock.infer_batch("fork", [{"inputs": {"IMG": x}, "outputs": ["PROBS"]},
                                        {"inputs": {"IMG": x}, "outputs": ["SCORE"]},
                                        {"inputs": {"IMG": x}, "outputs": ["OUT"]}])
    assert [sorted(a) for a in answers] == [["PROBS"], ["SCORE"], ["OUT"]]
    assert mock.calls_to("fork") == [(1, 1, 1)]  # one execute
    # one call per model, holding only the rows of the requests that need it
    assert mock.calls_to("detector") == [(1,)] and mock.calls_to("first") == [(2,)] and mock.calls_to("second") == [(1,)]
    full = mock.infer("fork", {"IMG": x})
    for a in answers:
        same(a, {k: full[k] for k in a})


def test_unneeded_nodes_follows_reads_back_through_conditions():
    stop_early = read_pipeline(yaml.safe_load(yaml.safe_dump(STOP_EARLY))["pipeline"])
    assert unneeded_nodes(stop_early, ["SCORE"]) == {"second:when", "second"}
    assert unneeded_nodes(stop_early, ["OUT"]) == frozenset()  # second reads FEAT, its condition SCORE
    assert unneeded_nodes(stop_early, []) == unneeded_nodes(stop_early, ["SCORE", "OUT"]) == frozenset()
    assert unneeded_nodes(stop_early, ["ELSEWHERE"]) == {"first", "second:when", "second"}
    pruning = Pruning(stop_early, limit=1)
    assert pruning.skip(("SCORE",)) == {"second:when", "second"} and pruning.skip(("OUT",)) == frozenset()
    assert list(pruning.known) == [frozenset({"SCORE"})]  # at most `limit` sets kept


def test_the_fork_answers_every_row_as_the_full_request(mock):
    x = img(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    full = mock.infer("fork", {"IMG": x})
    for outputs in FORK_RUNS:
        same(mock.infer("fork", {"IMG": x}, outputs=list(outputs)), {k: full[k] for k in outputs})
