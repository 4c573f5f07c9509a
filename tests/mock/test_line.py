"""A straight-line policy compiled at load (``execution.line``) against the same policy walked
node by node (``Run.run_node``): for each policy shape the line takes, the same requests give
the same outputs, the same errors (code and text), the same metrics handed over per execute
(counters, which series got observations and how many) and the same node cost estimates
updated. The requests cover what must leave the line for the tree (empty texts, long texts,
texts a guard case answers) and what must not change on it (thresholds, parameters, several
requests per execute, a failing model, request timeouts)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from orchestrator.runtime.execution import line as line_module
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.execution.line import compile_line
from orchestrator.runtime.routing.policy import parse_policy
from orchestrator.testing.mock import MockTriton
from orchestrator.testing.mock import requests as mock_requests
from tests.helpers import LONG_TEXT as LONG
from tests.helpers import MIXED_TEXTS as TEXTS
from tests.helpers import REPO, add_router_variant, executes_answered
from tests.helpers import text_request as request

MODEL = {"kind": "model", "name": "accurate", "model": "classifier"}
CHUNK = {"kind": "chunk", "name": "chunk_accurate", "window": 128, "stride": 96, "aggregation": "length_weighted_mean",
         "node": MODEL}
EMPTY = {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False}}
FAST = {"when": {"param": {"name": "route", "equals": "fast"}}, "then": {"kind": "constant", "name": "fixed", "probability": 0.25}}
SHORT = {"when": {"tokens": {"max": 4}}, "then": {"kind": "constant", "name": "short", "probability": 0.75}}

#: router variant -> its policy's root: every shape a line takes.
LINES = {
    "line_guarded": {"kind": "sequence", "name": "main", "steps": [{"kind": "switch", "name": "guard", "cases": [EMPTY]}, CHUNK]},
    "line_model": MODEL,
    "line_chunk": CHUNK,
    "line_cases": {"kind": "sequence", "name": "main", "steps": [
        {"kind": "switch", "name": "guard", "cases": [EMPTY, FAST, SHORT]}, MODEL]},
}

EXECUTES = [
    [request(TEXTS[:1])],
    [request([TEXTS[1]], 0.2)],
    [request(TEXTS[:2], [0.1, 0.9])],
    [request(TEXTS[2:3])],  # three tokens with [CLS] and [SEP]: a tokens case answers it
    [request([""])],
    [request([LONG])],
    [request(TEXTS, [0.1, 0.9, 0.5, 0.5, 0.3, 0.7])],
    [request(TEXTS[:2], parameters={"route": "fast"})],
    [request(TEXTS[:2], parameters={"route": "accurate"})],
    [request(TEXTS[:1], 1.5)],  # INVALID_ARG before the policy
    [request(TEXTS[:2]), request([LONG, ""], 0.4), request(TEXTS[1:2], 0.6, {"route": "fast"})],
    [request(TEXTS[:1]), request(TEXTS[1:2], float("nan")), request(TEXTS[:2])],
    [request([t]) for t in TEXTS],
]


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("line") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    for name, root in LINES.items():
        add_router_variant(repo, name, {**shipped, "root": root})
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", "router", *LINES):
            m.load(name)
        yield m


class Recorder:
    """What one router's executes hand to its metrics (``Metrics.record``) and which node
    costs they update (``Engine.measured``), execute by execute."""

    def __init__(self, instance, monkeypatch):
        self.records, self.measured = [], []
        record, measured = instance.metrics.record, instance.engine.measured

        def on_record(counts, observations, gauges):
            self.records.append((dict(counts), {k: len(v) for k, v in observations.items()}, sorted(gauges)))
            record(counts, observations, gauges)

        def on_measured(node, seconds):
            assert seconds >= 0.0
            self.measured.append(node.name)
            measured(node, seconds)

        monkeypatch.setattr(instance.metrics, "record", on_record)
        monkeypatch.setattr(instance.engine, "measured", on_measured)


def run(mock, model, compiled, monkeypatch, executes=EXECUTES):
    """Outputs and errors of ``executes``, and what they recorded, with the line or without it."""
    instance = mock.instance(model)
    monkeypatch.setattr(instance.engine, "line", compiled)
    recorder = Recorder(instance, monkeypatch)
    out = executes_answered(mock, model, executes)
    monkeypatch.undo()
    return out, recorder.records, recorder.measured


@pytest.mark.parametrize("model", sorted(LINES))
def test_the_line_answers_and_records_as_the_tree(mock, model, monkeypatch):
    compiled = mock.instance(model).engine.line
    assert compiled is not None, f"{model}: its policy is one way through"
    taken = []
    answer = line_module.Line.answer

    async def counted(self, run_, items):
        taken.append(len(items))
        return await answer(self, run_, items)

    monkeypatch.setattr(line_module.Line, "answer", counted)
    on_line = run(mock, model, compiled, monkeypatch)
    assert taken, "some executes took the line"
    in_tree = run(mock, model, None, monkeypatch)
    assert on_line[0] == in_tree[0]
    assert on_line[1] == in_tree[1]  # counters, observation counts per series, gauges: execute by execute
    assert on_line[2] == in_tree[2]  # node cost estimates, in the tree's order
    assert any(isinstance(a, tuple) for a in on_line[0]) and any(isinstance(a, dict) for a in on_line[0])


@pytest.mark.parametrize("model", ["line_guarded", "line_model"])
def test_a_failing_model_fails_alike_on_the_line(mock, model, monkeypatch):
    """Every node around the failing model counted as failing, its latency observed, no cost
    estimate updated; the error response the same (one failure a path: the circuit stays closed)."""
    compiled = mock.instance(model).engine.line
    mock.set_failure("classifier", "injected failure")
    try:
        on_line = run(mock, model, compiled, monkeypatch, EXECUTES[:1])
        in_tree = run(mock, model, None, monkeypatch, EXECUTES[:1])
    finally:
        mock.clear_faults("classifier")
    assert on_line == in_tree
    assert all(a[:2] == ("error", "INTERNAL") for a in on_line[0])
    counts = on_line[1][0][0]
    assert {dict(k[1]).get("node") for k in counts if k[0] == "orchestrator_node_errors_total"} == {n.name for n in compiled.around}


def test_request_timeouts_alike_on_the_line(mock, monkeypatch):
    """A request timeout: the call's timeout on both paths; over at once: UNAVAILABLE on both."""
    compiled = mock.instance("line_guarded").engine.line
    for budget in (30_000_000, 1):
        monkeypatch.setattr(mock_requests.InferenceRequest, "timeout", lambda self, b=budget: b)
        on_line = run(mock, "line_guarded", compiled, monkeypatch, EXECUTES[:3])
        monkeypatch.setattr(mock_requests.InferenceRequest, "timeout", lambda self, b=budget: b)
        assert on_line == run(mock, "line_guarded", None, monkeypatch, EXECUTES[:3])
    monkeypatch.setattr(mock_requests.InferenceRequest, "timeout", lambda self: 1)
    assert run(mock, "line_guarded", compiled, monkeypatch, EXECUTES[:1])[0][0][:2] == ("error", "UNAVAILABLE")


def policy(root, **top):
    shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    return parse_policy({**shipped, "root": root, **top})


@pytest.mark.parametrize("root", [
    LINES["line_guarded"]["steps"][0] | {"default": MODEL},  # a switch that answers every text: branches
    {**CHUNK, "stop_when_decided": True},  # windows in rounds
    {**CHUNK, "max_windows": 2},
    {**MODEL, "timeout_ms": 50},  # the tree applies a node's timeout
    {**LINES["line_guarded"], "timeout_ms": 50},
    {"kind": "sequence", "name": "main", "steps": [  # two guards in a row
        {"kind": "switch", "name": "g1", "cases": [EMPTY]}, {"kind": "switch", "name": "g2", "cases": [FAST]}, MODEL]},
    {"kind": "sequence", "name": "main", "steps": [
        {"kind": "switch", "name": "guard", "cases": [{"when": {"empty": True}, "then": MODEL | {"name": "other"}}]}, CHUNK]},
])
def test_only_one_way_through_compiles(root):
    assert compile_line(policy(root).root) is None


def test_the_shipped_policy_is_not_a_line_and_the_lines_are(mock):
    assert mock.instance("router").engine.line is None  # a cascade: the tree
    shapes = {name: mock.instance(name).engine.line for name in LINES}
    assert (shapes["line_guarded"].guard, shapes["line_guarded"].chunk) != (None, None)
    assert shapes["line_model"].around == (shapes["line_model"].model,)
    assert [n.name for n in shapes["line_guarded"].around] == ["accurate", "chunk_accurate", "main"]


def test_an_engine_compiles_its_policy_when_it_is_made():
    engine = Engine(policy(LINES["line_chunk"]), infer=None, model_dir=REPO / "router")  # type: ignore[arg-type]
    assert engine.line is not None and engine.line.chunk is not None and engine.line.model.model == "classifier"
