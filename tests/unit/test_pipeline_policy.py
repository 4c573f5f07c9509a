"""Pipeline policies (top-level ``pipeline``): the parser and the checks made at load
(``routing.pipeline_plan.bind_pipeline``), conditions as row masks (``routing.conditions``), and
the guide's policies being the ones the tests serve."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

from orchestrator.runtime.errors import InputError, PolicyError
from orchestrator.runtime.routing.conditions import evaluate, read_condition
from orchestrator.runtime.routing.pipeline_plan import bind_pipeline
from orchestrator.runtime.routing.policy import load_any, parse_any, parse_pipeline_policy, parse_policy
from orchestrator.runtime.routing.tensors import router_spec
from tests.helpers import ROOT
from tests.pipeline_repo import ONE_OF_N, PER_CLASS, STOP_EARLY

GUIDE = ROOT / "docs" / "guides" / "branching-pipelines.md"


def config(mbs=8, inputs=(("IMG", "TYPE_FP32", [4]),), outputs=(("SCORE", "TYPE_FP32", [1]), ("OUT", "TYPE_FP32", [2]))):
    return {"name": "r", "max_batch_size": mbs,
            "input": [{"name": n, "data_type": t, "dims": d} for n, t, d in inputs],
            "output": [{"name": n, "data_type": t, "dims": d} for n, t, d in outputs]}


def bind(document, cfg=None):
    return bind_pipeline(parse_pipeline_policy(document).pipeline, router_spec(cfg or config()))


def test_the_guides_policies_are_the_ones_the_tests_serve():
    blocks = re.findall(r"```yaml\n# policy: (\w+)\n(.*?)```", GUIDE.read_text(), re.S)
    found = {name: yaml.safe_load(body) for name, body in blocks}
    assert found == {"stop_early": STOP_EARLY, "per_class": PER_CLASS, "one_of_n": ONE_OF_N}


def test_the_public_asks_load(tmp_path):
    bind(STOP_EARLY)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(STOP_EARLY))
    assert load_any(path).pipeline.outputs == ("SCORE", "OUT")


def test_a_document_is_a_text_policy_or_a_pipeline_never_both():
    with pytest.raises(PolicyError, match="only one of root"):
        parse_any(dict(STOP_EARLY, root={"kind": "model", "model": "m"}))
    with pytest.raises(PolicyError, match="tensor pipeline"):
        parse_policy(STOP_EARLY)
    with pytest.raises(PolicyError, match="policy.inline: a key of text policies"):
        parse_any(dict(STOP_EARLY, inline={"tokenizer": True}))


def steps(*nodes, outputs=("OUT",)):
    return {"version": 1, "pipeline": {"outputs": list(outputs), "steps": list(nodes)}}


def st(model, inputs, outputs, **kw):
    return {"kind": "step", "model": model, "inputs": inputs, "outputs": outputs, **kw}


@pytest.mark.parametrize("document,needle", [
    (steps(st("a", {"X": "NOPE"}, {"Y": "OUT"})), "reads 'NOPE', which is not a router input"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}), st("b", {"X": "IMG"}, {"Y": "OUT"})), "writes 'OUT', which"),
    (steps(st("a", {"X": "T2"}, {"Y": "T1"}), st("b", {"X": "T1"}, {"Y": "T2"}), st("c", {"X": "T1"}, {"Y": "OUT"})),
     "a cycle"),
    (steps(st("a", {"X": "IMG"}, {"Y": "IMG"})), "which is a router input"),
    (steps(st("a", {"X": "IMG"}, {"Y": "T"}), outputs=("OUT",)), "no node writes 'OUT'"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}), outputs=("ELSE",)), "'ELSE' is not an output of router"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}, when={"tensor": "IMG", "op": "gt", "value": 0})),
     "'OUT' is not written when no case is taken"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}, when={"tensor": "IMG", "op": "gt", "value": 0}, omit=["OUT"])),
     "only in request scope"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}, when={"tensor": "IMG", "op": "gt", "value": "x"}, fill={"OUT": 0})),
     "compare it with numbers"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}, when={"tensor": "LATER", "op": "gt", "value": 1}, fill={"OUT": 0})),
     "reads 'LATER'"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}, when={"tensor": "IMG", "op": "gt", "value": 1}, fill={"OUT": "x"})),
     "fill it with numbers"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}, when={"tensor": "IMG", "op": "gt", "value": 1}, fill={"OUT": [1, 2, 3]})),
     "is not a row of 'OUT'"),
    (steps(st("a", {"X": "IMG"}, {"Y": "T"}, when={"tensor": "IMG", "op": "gt", "value": 1}, fill={"T": 1}),
           st("b", {"T": "T"}, {"Y": "OUT"})), "only a router output can be filled"),
    (steps({"kind": "switch", "cases": [{"when": {"present": "IMG"}, "then": [st("a", {"X": "IMG"}, {"Y": "OUT"})]}],
            "default": [st("b", {"X": "IMG"}, {"Y": "SCORE"})], "scope": "request", "omit": ["SCORE"]}),
     "'OUT' is not written when default is taken"),
    (steps(st("a", {"X": "IMG"}, {"Y": "OUT"}), st("a", {"X": "IMG"}, {"Y": "SCORE"}), outputs=("OUT", "SCORE")),
     "names are unique"),
])
def test_load_refuses_what_would_be_missing_or_wrong_by_accident(document, needle):
    with pytest.raises(PolicyError, match=re.escape(needle)):
        bind(document)


def test_bf16_is_refused_at_load_with_the_reason():
    cfg = config(inputs=(("IMG", "TYPE_BF16", [4]),))
    with pytest.raises(PolicyError, match="numpy cannot hold"):
        bind(steps(st("a", {"X": "IMG"}, {"Y": "OUT"})), cfg)


def test_a_request_scope_switch_may_omit_and_a_filled_branch_loads():
    bind(steps(st("a", {"X": "IMG"}, {"Y": "OUT"}, when={"tensor": "IMG", "op": "gt", "value": 0}, scope="request",
                  omit=["OUT"])))


# ----------------------------------------------------------------------------- conditions as row masks


def mask(cond, tensors, rows=3, per_row=True, params=None):
    return evaluate(read_condition(cond, "c"), tensors, rows, per_row, params or {}).tolist()


def test_conditions_are_row_masks():
    x = np.array([[0.1, 0.9], [0.6, 0.7], [0.0, 0.0]], dtype=np.float16)
    assert mask({"tensor": "X", "op": "gt", "value": 0.5}, {"X": x}) == [False, True, False]
    assert mask({"tensor": "X", "op": "gt", "value": 0.5, "reduce": "any"}, {"X": x}) == [True, True, False]
    assert mask({"tensor": "X", "reduce": "argmax", "op": "eq", "value": 1}, {"X": x}) == [True, True, False]
    assert mask({"tensor": "X", "reduce": "count_nonzero", "op": "eq", "value": 0}, {"X": x}) == [False, False, True]
    assert mask({"tensor": "X", "op": "eq", "value": 0.1, "reduce": "any"}, {"X": x}) == [True, False, False]  # FP16's 0.1
    assert mask({"not": {"present": "Y"}}, {"X": x}) == [True] * 3
    assert mask({"tensor": "Y", "op": "eq", "value": 1}, {"X": x}) == [False] * 3
    assert mask({"tensor": "X", "op": "gt", "value": 0.5, "reduce": "any"}, {"X": x}, per_row=False) == [True] * 3
    assert mask({"shape": {"tensor": "X", "dim": 0, "op": "eq", "value": 2}}, {"X": x}) == [True] * 3
    assert mask({"param": {"name": "fast", "equals": True}}, {}, params={"fast": True}) == [True] * 3
    assert mask({"param": {"name": "fast", "equals": True}}, {}, params={"fast": "true"}) == [False] * 3
    assert mask({"all": [{"present": "X"}, {"tensor": "X", "reduce": "max", "op": "ge", "value": 0.9}]}, {"X": x}) == [True, False, False]


def test_bytes_conditions_never_decode():
    t = np.array([[b""], [b"abc\xff"], [b"ab"]], dtype=object)
    assert mask({"bytes": {"tensor": "T", "empty": True}}, {"T": t}) == [True, False, False]
    assert mask({"bytes": {"tensor": "T", "prefix": "ab"}}, {"T": t}) == [False, True, True]
    assert mask({"bytes": {"tensor": "T", "length": {"op": "gt", "value": 3}}}, {"T": t}) == [False, True, False]
    assert mask({"tensor": "T", "op": "in", "value": ["ab", "x"]}, {"T": t}) == [False, False, True]


def test_a_literal_that_does_not_fit_the_tensor_is_that_requests_error():
    with pytest.raises(InputError, match="not an integer"):
        mask({"tensor": "C", "op": "eq", "value": 2.5}, {"C": np.zeros((3, 1), np.int8)})


def test_policy_check_checks_a_pipeline_against_the_router_config_beside_it(tmp_path, capsys):
    from orchestrator.tooling.cli import main
    from tests.pipeline_repo import make_pipeline_repository

    repo = make_pipeline_repository(tmp_path / "repo")
    assert main(["policy", "check", str(repo / "per_class" / "policy.yaml")]) == 0
    out = capsys.readouterr().out
    assert "switch [by_class] scope=row fill LABEL" in out and "policy is valid" in out
    document = yaml.safe_load((repo / "per_class" / "policy.yaml").read_text())
    document["pipeline"]["outputs"] = ["PROBS", "LABELS"]
    (repo / "per_class" / "policy.yaml").write_text(yaml.safe_dump(document))
    assert main(["policy", "check", str(repo / "per_class" / "policy.yaml")]) == 1
    assert "'LABELS' is not an output of router 'per_class'" in capsys.readouterr().err
    document["pipeline"]["outputs"] = ["PROBS", "LABEL"]
    document["pipeline"]["steps"][0]["model"] = "nowhere"
    (repo / "per_class" / "policy.yaml").write_text(yaml.safe_dump(document))
    assert main(["policy", "check", str(repo / "per_class" / "policy.yaml")]) == 1
    assert "model 'nowhere' is not in the model repository" in capsys.readouterr().err


def test_a_decoupled_step_model_is_refused_at_load_naming_it(tmp_path):
    from orchestrator.testing.mock import LoadError, MockTriton
    from tests.pipeline_repo import make_pipeline_repository

    repo = make_pipeline_repository(tmp_path / "repo")
    cfg = repo / "second" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "model_transaction_policy { decoupled: true }\n")
    with MockTriton(repo, model_config_name=None) as mock:
        with pytest.raises(LoadError, match="model 'second' is decoupled"):
            mock.load("stop_early")


def test_the_published_json_schema_accepts_the_pipelines_and_rejects_what_the_parser_rejects():
    jsonschema = pytest.importorskip("jsonschema")
    from orchestrator.runtime.routing.policy_docs import json_schema

    validator = jsonschema.Draft7Validator(json_schema())
    for document in (STOP_EARLY, PER_CLASS, ONE_OF_N):
        validator.validate(document)
    bad = yaml.safe_load(yaml.safe_dump(PER_CLASS))
    bad["pipeline"]["steps"][1]["cases"][0]["when"]["reduce"] = "median"
    assert not validator.is_valid(bad)
    with pytest.raises(PolicyError, match="median"):
        parse_any(bad)
    both = dict(STOP_EARLY, root={"kind": "constant", "probability": 0.5})
    assert not validator.is_valid(both)


def test_the_router_tensors_are_as_the_model_sees_them_reshape_included():
    spec = router_spec({"name": "r", "max_batch_size": 4, "input": [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [1], "reshape": {}},
        {"name": "B", "data_type": "TYPE_INT8", "dims": [2, 3], "reshape": {"shape": [6]}, "optional": True}],
        "output": [{"name": "C", "data_type": "TYPE_STRING", "dims": [-1]}]})
    assert [(t.name, t.dims, t.optional) for t in spec.inputs] == [("A", (), False), ("B", (6,), True)]
    assert spec.output("C").dtype is np.object_ and spec.output("D") is None


def test_deploy_and_the_front_door_read_a_pipeline_router(tmp_path):
    from orchestrator.tooling.deploy import always_on_models
    from orchestrator.tooling.frontdoor import max_request_bytes
    from tests.pipeline_repo import make_pipeline_repository

    repo = make_pipeline_repository(tmp_path / "repo")
    assert always_on_models(repo, ["per_class", "typed_on_demand", "typed_fallback"]) == [
        "per_class", "detector", "cls_cat", "cls_dog", "typed_on_demand", "mixer", "typed_fallback", "labeler",
        "labeler_spare"]
    document = yaml.safe_load((repo / "per_class" / "policy.yaml").read_text())
    document["limits"] = {"max_request_bytes": 1 << 24}
    (repo / "per_class" / "policy.yaml").write_text(yaml.safe_dump(document))
    assert max_request_bytes(repo, "per_class") == 1 << 24
