"""Policy validation (offline): every error names its location; the shipped policies are valid."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.runtime.routing import policy as P
from orchestrator.runtime.routing.nodes.cascade import CascadeNode
from orchestrator.runtime.routing.nodes.fallback import FallbackNode
from orchestrator.runtime.routing.nodes.sequence import SequenceNode
from orchestrator.runtime.routing.nodes.switch import SwitchNode
from orchestrator.tooling.cli import main
from tests.helpers import ROOT

DEFAULT = ROOT / "model_repository" / "router" / "policy.yaml"


def doc(root, **top):
    return {"version": 1, "root": root, **top}


M = {"kind": "model", "model": "classifier"}

BAD = [
    ({"root": M, "version": 2}, "policy.version"),
    ({"version": 1}, "policy.root: required key is missing"),
    (doc(M, extra=1), "policy.extra: unknown key"),
    (doc({"kind": "modle", "model": "x"}), "root.kind: 'modle' is not a node kind"),
    (doc({"kind": "model"}), "root.model: required key is missing"),
    (doc({"kind": "model", "model": "x", "colour": "red"}), "root.colour: unknown key"),
    (doc({"kind": "cascade", "margin": 1.5, "stages": [M, M]}), "root.margin: 1.5 is outside [0.0, 1.0]"),
    (doc({"kind": "cascade", "margin": 0.1, "stages": [M]}), "root.stages: needs at least 2 entries"),
    (doc({"kind": "chunk", "window": 128, "stride": 200, "node": M}), "root.stride: 200 is outside [1, 126]"),
    (doc({"kind": "chunk", "aggregation": "median", "node": M}), "root.aggregation: 'median'"),
    (doc({"kind": "parallel", "combine": "sum", "nodes": [M, M]}), "root.combine: 'sum'"),
    (doc({"kind": "split", "branches": [{"weight": 0, "node": M}, {"weight": 1, "node": M}]}), "root.branches[0].weight: must be > 0"),
    (doc({"kind": "model", "model": "x", "timeout_ms": -5}), "root.timeout_ms: must be > 0"),
    (doc({"kind": "sequence", "steps": [M, M]}), "root.steps[1]: unreachable"),
    (doc({"kind": "switch", "cases": [{"when": {"empty": True}, "then": M}]}), "root: some texts may get no answer"),
    (doc({"kind": "switch", "cases": [{"when": {"margin_below": 0.1}, "then": M}], "default": M}), "root.cases[0].when.margin_below: needs a 'score'"),
    (doc({"kind": "switch", "cases": [{"when": {"param": {"name": "route", "equals": "x"}}, "then": M}], "default": M}), "root.cases[0].when.param.name: 'route' is not declared"),
    (
        doc({"kind": "switch", "cases": [{"when": {"param": {"name": "route", "equals": "classifier"}}, "then": M}], "default": M}, request_parameters={"route": ["fast"]}),
        "root.cases[0].when.param: value 'classifier' is not declared in request_parameters.route",
    ),
    (doc({"kind": "sequence", "steps": [{"kind": "model", "model": "a", "name": "n"}, {"kind": "model", "model": "b", "name": "n"}]}), "root.steps[1].name: 'n' is already used"),
    (doc({"kind": "model", "model": "x", "calibration": {"reference_threshold": 0.5}}), "root.calibration.threshold: required"),
    (doc({"kind": "model", "model": "x", "on_demand": {"idle_timeout_s": "soon"}}), "root.on_demand.idle_timeout_s: expected a finite number"),
    (doc({"kind": "fallback", "nodes": [{"kind": "switch", "cases": [{"when": {"empty": True}, "then": M}]}, M]}), "a switch without default may only be a step of a sequence"),
]


@pytest.mark.parametrize("document,message", BAD, ids=[m for _, m in BAD])
def test_invalid_policies_name_the_bad_key(document, message):
    with pytest.raises(P.PolicyError) as info:
        P.parse_policy(document)
    assert message in str(info.value)


def test_default_policy_reproduces_the_first_router():
    policy = P.load_policy(DEFAULT)
    main_ = policy.root
    assert isinstance(main_, SequenceNode)
    guard, choose = main_.steps
    empty = guard.cases[0]
    assert empty.when.empty is True and empty.then.probability == (0.5,) and empty.then.verdict is False
    assert empty.then.route == "empty"
    length = choose.default  # texts over 128 tokens: classifier_fast over every window, no cascade
    assert isinstance(length, SwitchNode)
    [long_case] = length.cases
    assert (long_case.when.tokens_min, long_case.when.tokens_max) == (129, None)
    long_fast, long_spare = long_case.then.nodes
    assert long_fast.stop_when_decided and long_fast.stop_margin is None
    assert (long_fast.node.model, long_spare.node.model) == ("classifier_fast", "classifier")
    assert (long_fast.window, long_fast.stride, long_fast.aggregation) == (128, 96, "length_weighted_mean")
    degrade = length.default
    assert isinstance(degrade, FallbackNode)
    cascade, spare = degrade.nodes
    assert isinstance(cascade, CascadeNode) and cascade.margin == 0.295  # chosen by orchestrator tune (docs/guides/tune.md)
    fast, accurate_or_fast = cascade.stages
    accurate, fast_degraded = accurate_or_fast.nodes
    for chunk in (fast, accurate):  # the exact stopping rule only: stop_margin lost accuracy on turning texts
        assert chunk.stop_when_decided and chunk.stop_margin is None
    for chunk in (fast, accurate, fast_degraded, spare):
        assert (chunk.window, chunk.stride, chunk.aggregation) == (128, 96, "length_weighted_mean")
    assert fast.node.model == "classifier_fast" and accurate.node.model == "classifier"
    # degraded answers: classifier for texts that needed classifier_fast, and the other way
    assert (spare.node.model, spare.node.route) == ("classifier", "classifier")
    assert (fast_degraded.node.model, fast_degraded.node.route) == ("classifier_fast", "classifier_fast:degraded")
    for case, (model, spare_model) in zip(choose.cases, [("classifier_fast", "classifier"), ("classifier", "classifier_fast")]):
        first, second = case.then.nodes
        assert (first.node.model, second.node.model) == (model, spare_model)
        assert (first.window, first.stride, second.window, second.stride) == (128, 96, 128, 96)
    assert policy.request_parameters == {"route": ("fast", "accurate")}
    assert policy.models() == ["classifier_fast", "classifier"]  # tokenizer inline
    assert policy.inline_tokenizer is True and policy.tokenizers() == ["tokenizer"]
    assert (policy.limits.max_text_bytes, policy.limits.max_windows_per_text) == (65536, 256)


def test_calibration_becomes_a_logit_shift():
    node = P.parse_policy(doc({"kind": "model", "model": "v", "calibration": {"reference_threshold": 0.6, "threshold": 0.4}})).root
    import math

    assert node.logit_shift == pytest.approx(math.log(0.6 / 0.4) - math.log(0.4 / 0.6))


def test_shipped_policies_are_valid_and_check_prints_the_graph(capsys):
    for path in [DEFAULT, *sorted((ROOT / "docs" / "policies").glob("*.yaml"))]:
        assert main(["policy", "check", str(path)]) == 0
        out = capsys.readouterr().out
        assert "policy is valid" in out and "models called:" in out


def test_check_reports_errors_with_the_file_and_location(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc({"kind": "cascade", "margin": 0.2, "stages": [M, {"kind": "model"}]})))
    assert main(["policy", "check", str(bad)]) == 1
    assert f"{bad}: root.stages[1].model: required key is missing" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("root: [unclosed")
    assert main(["policy", "check", str(broken)]) == 1
    assert "not valid YAML" in capsys.readouterr().err
