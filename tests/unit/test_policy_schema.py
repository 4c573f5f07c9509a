"""One declaration of the policy format (``orchestrator.runtime.routing.schema``): the parser and the
published JSON Schema agree on valid and invalid documents, the generated docs are current,
``defaults`` per kind work, and a new kind is its module plus one table line."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from dataclasses import dataclass, replace

import jsonschema
import numpy as np
import pytest
import yaml

from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing import policy as P
from orchestrator.runtime.routing import policy_docs as D
from orchestrator.runtime.routing import schema as S
from orchestrator.runtime.routing.heads import LEGACY, Head
from orchestrator.runtime.routing.nodes import KINDS, KindDefaults, defaultable
from orchestrator.runtime.routing.nodes.base import Answer, ModelCall, Node, NodeKind
from orchestrator.runtime.routing.nodes.chunk import ChunkNode
from tests.helpers import ROOT, FakeBLS, expected_logit, ids_of, sig

SHIPPED = [ROOT / "model_repository" / "router" / "policy.yaml", *sorted((ROOT / "docs" / "policies").glob("*.yaml"))]
_n = iter(range(1000))


def model(name, **kw):
    return {"kind": "model", "name": f"m{next(_n)}", "model": name, **kw}


# Every kind and every key at least once (valid for both the parser and the schema).
FULL = {
    "version": 1,
    "description": "every key",
    "tokenizer": "tokenizer",
    "inline": {"tokenizer": False, "postprocess": True},
    "max_sequence_length": 128,
    "bls_max_batch_size": 32,
    "request_parameters": {"route": ["fast", "accurate", "vote"]},
    "ignored_parameters": ["x-*"],
    "limits": {"max_text_bytes": 1000, "max_request_bytes": 5000, "max_windows_per_text": 8},
    "circuit_breaker": {"consecutive_failures": 2, "open_s": 1.5, "reload_unhealthy": False, "reload_interval_s": 10,
                        "watch_stubs": False},
    "defaults": {"chunk": {"window": 64, "stride": 40, "aggregation": "max"}, "model": {"timeout_ms": 500}},
    "root": {"kind": "sequence", "name": "main", "steps": [
        {"kind": "switch", "name": "guard", "cases": [
            {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False,
                                               "route": "e"}},
            {"when": {"tokens": {"min": 0, "max": 2}}, "then": {"kind": "constant", "name": "short", "probability": [0.4]}},
        ]},
        {"kind": "switch", "name": "choose", "score": model("fast"), "cases": [
            {"when": {"param": {"name": "route", "equals": "fast"}},
             "then": {"kind": "chunk", "name": "c1", "node": model("fast", version=2, route="f2", max_length=64)}},
            {"when": {"param": {"name": "route", "in": ["accurate"]}}, "then": {"kind": "split", "name": "sp", "branches": [
                {"weight": 9, "node": model("accurate", on_demand={"idle_timeout_s": 60, "retry_after_s": 5})},
                {"weight": 1, "node": model("fast", on_demand=True,
                                            calibration={"reference_threshold": 0.5, "threshold": [0.4]})},
            ]}},
            {"when": {"margin_below": 0.1}, "then": {"kind": "parallel", "name": "par", "combine": "vote",
                                                      "nodes": [model("fast"), model("accurate")], "quorum": 1}},
            {"when": {"label": "positive", "probability": {"label": "positive", "min": 0.2, "max": 0.9}},
             "then": model("accurate")},
        ], "default": {"kind": "fallback", "name": "fb", "timeout_ms": 1000, "nodes": [
            {"kind": "cascade", "name": "cas", "margin": 0.2, "stages": [model("fast"), model("accurate")],
             "budget": {"max_escalation_rate": 0.1, "window": 50, "window_s": 30}},
            {"kind": "shadow", "name": "sh", "sample": 0.5, "queue_size": 16, "primary": model("fast"),
             "candidate": model("accurate")},
        ]}},
    ]},
}


def valid_documents():
    docs = {p.name: yaml.safe_load(p.read_text()) for p in SHIPPED}
    docs["full"] = FULL
    docs["minimal"] = {"root": {"kind": "constant", "probability": 0.5}}
    docs["nulls"] = {**FULL, "limits": None, "circuit_breaker": None, "defaults": None, "inline": {"tokenizer": None}}
    return docs


# ----------------------------------------------------------------------------- mutations


def _numbers(t):
    out = ["x", True]
    out += [t.low - 1] if t.low is not None else []
    out += [t.high + 1] if t.high is not None else []
    return out + ([t.above] if t.above is not None else [])


# Values of the wrong type or out of bounds, per value type (test-side, from its declaration).
INVALID = {
    S.Const: lambda t: [not t.value] if isinstance(t.value, bool) else [t.value + 1],
    S.Int: lambda t: ["x", 1.5, t.low - 1, t.high + 1],
    S.Number: _numbers,
    S.Bool: lambda t: ["yes", 1],
    S.Choice: lambda t: ["nope", 3],
    S.Str: lambda t: [5] + ([] if t.empty else [""]),
    S.AnyOf: lambda t: [5, ""],
    S.Probabilities: lambda t: ["x", [], [t.item.high + 1], t.item.high + 1],
    S.Strings: lambda t: ["x", [""]] + ([[]] if t.minimum else []),
    S.Params: lambda t: [[], {"p": []}, {"p": [""]}],
    S.NodeRef: lambda t: [5, {"kind": "nope"}, {}],
    S.ListOf: lambda t: [{}, "x", [5]] + ([[]] if t.minimum else []),
    S.TrueOr: lambda t: [False, "x"],
    S.Struct: lambda t: ["x", [], 5],
    KindDefaults: lambda t: ["x", [], 5],
}


def invalid_values(t):
    return INVALID[type(t)](t)


def structs_in(value, t, path):
    """``(path, Struct)`` of every mapping in ``value`` (of type ``t``), depth first."""
    if isinstance(t, S.NodeRef) and isinstance(value, dict):
        yield from structs_in(value, KINDS[value["kind"]].spec, path)
    elif isinstance(t, S.Struct) and isinstance(value, dict):
        yield path, t
        for k in t.keys:
            if k.name in value:
                yield from structs_in(value[k.name], k.type, path + (k.name,))
    elif isinstance(t, S.ListOf) and isinstance(value, list):
        for i, v in enumerate(value):
            yield from structs_in(v, t.item, path + (i,))
    elif isinstance(t, S.TrueOr) and isinstance(value, dict):
        yield from structs_in(value, t.struct, path)
    elif isinstance(t, KindDefaults) and isinstance(value, dict):
        for kind in value:
            yield path + (kind,), S.Struct(kind, defaultable(KINDS[kind]))


def at(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def changed(doc, path, fn):
    """A copy of ``doc`` with ``fn`` applied to the mapping at ``path``."""
    d = copy.deepcopy(doc)
    fn(at(d, path))
    return d


def mutations(doc):
    """``(label, document)``: each one change that makes ``doc`` invalid by the declaration."""
    for path, struct in structs_in(doc, P.TOP, ()):
        where, given = ".".join(map(str, path)) or "policy", at(doc, path)
        yield f"{where}: unknown key", changed(doc, path, lambda m: m.__setitem__("bogus_key", 1))
        for key in struct.keys:
            if key.name not in given:
                continue
            if key.required and key.name != "kind":
                yield f"{where}: {key.name} missing", changed(doc, path, lambda m, k=key.name: m.pop(k))
            for bad in invalid_values(key.type):
                yield f"{where}: {key.name}={bad!r}", changed(doc, path, lambda m, k=key.name, b=bad: m.__setitem__(k, copy.deepcopy(b)))
        if struct.nonempty:
            yield f"{where}: emptied", changed(doc, path, lambda m: m.clear())
        if struct.one_of:
            both = {n: ["fast"] if n == "in" else "fast" for n in struct.one_of[0]}
            yield f"{where}: both of {list(both)}", changed(doc, path, lambda m, b=both: m.update(b))


def parser_accepts(doc):
    try:
        P.parse_policy(doc)
    except P.PolicyError:
        return False
    return True


def schema_errors(schema, doc):
    validator = schema if isinstance(schema, jsonschema.Draft7Validator) else jsonschema.Draft7Validator(schema)
    return [e.message for e in validator.iter_errors(json.loads(json.dumps(doc)))]


def test_the_published_schema_is_a_valid_draft7_schema():
    jsonschema.Draft7Validator.check_schema(D.json_schema())


def test_schema_and_parser_accept_the_same_valid_documents():
    schema = D.json_schema()
    for name, doc in valid_documents().items():
        assert parser_accepts(doc), name
        assert schema_errors(schema, doc) == [], name


def test_schema_and_parser_reject_every_mutation_of_the_declaration():
    schema = jsonschema.Draft7Validator(D.json_schema())
    count = 0
    for name, doc in valid_documents().items():
        for label, bad in mutations(doc):
            count += 1
            assert not parser_accepts(bad), f"{name}: parser accepted {label}"
            assert not schema.is_valid(json.loads(json.dumps(bad))), f"{name}: schema accepted {label}"
    assert count > 300  # every key of every kind, several ways each


def test_parser_errors_keep_their_locations():
    bad = copy.deepcopy(FULL)
    bad["root"]["steps"][1]["default"]["nodes"][0]["stages"][1].pop("model")
    with pytest.raises(P.PolicyError, match=r"^root\.steps\[1\]\.default\.nodes\[0\]\.stages\[1\]\.model: required key is missing"):
        P.parse_policy(bad)
    bad = copy.deepcopy(FULL)
    bad["root"]["steps"][1]["cases"][1]["then"]["branches"][1]["node"]["calibration"]["threshold"] = [0.4, 2]
    with pytest.raises(P.PolicyError, match=r"branches\[1\]\.node\.calibration\.threshold\[1\]: 2\.0 is outside"):
        P.parse_policy(bad)


def test_head_dependent_values_are_a_number_or_a_list_in_the_schema():
    schema = D.json_schema()
    for probability in (0.5, [0.1, 0.8, 0.1]):
        doc = {"version": 1, "root": {"kind": "constant", "probability": probability}}
        assert parser_accepts(doc) and not schema_errors(schema, doc)
    for thr in (0.4, [0.3, 0.5, 0.6]):
        doc = {"version": 1, "root": model("ml", calibration={"reference_threshold": 0.5, "threshold": thr})}
        assert parser_accepts(doc) and not schema_errors(schema, doc)


# ----------------------------------------------------------------------------- generated files


@pytest.mark.parametrize("name", ["policy.schema.json", "reference/policy.md"])
def test_generated_docs_are_current(name):
    path = ROOT / "docs" / name
    assert path.read_text(encoding="utf-8") == D.generated_docs()[name], "run: python -m orchestrator.runtime.routing.policy_docs"


def test_docs_table_gives_each_default_from_its_dataclass():
    md = D.markdown()
    assert "| `idle_timeout_s` | number in [0, 86400] | `300` |" in md  # OnDemand.idle_timeout_s
    assert "| `max_text_bytes` | integer in [1, 2147483648] | `65536` |" in md  # Limits
    assert "| `margin` | number in [0, 1] | required |" in md  # CascadeNode.margin = REQUIRED
    assert "| `model` | non-empty string | required |" in md
    for kind in KINDS:
        assert f"### `{kind}`" in md


def test_shipped_policy_points_editors_at_the_schema():
    first = SHIPPED[0].read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../../docs/policy.schema.json"
    assert (SHIPPED[0].parent / "../../docs/policy.schema.json").resolve().is_file()


# ----------------------------------------------------------------------------- defaults


def test_defaults_per_kind_apply_unless_a_node_sets_the_key():
    doc = {"version": 1, "defaults": {"chunk": {"window": 64, "stride": 40}},
           "root": {"kind": "fallback", "nodes": [{"kind": "chunk", "node": model("fast")},
                                                  {"kind": "chunk", "window": 32, "stride": 8, "node": model("accurate")}]}}
    a, b = P.parse_policy(doc).root.nodes
    assert (a.window, a.stride, b.window, b.stride) == (64, 40, 32, 8)
    doc["defaults"]["chunk"].pop("stride")  # the computed default follows the default window
    assert P.parse_policy(doc).root.nodes[0].stride == (64 - 2) * 3 // 4


def test_shipped_policy_says_window_and_stride_once():
    text = SHIPPED[0].read_text()
    assert len(re.findall(r"\bwindow:", text)) == 1 and len(re.findall(r"\bstride:", text)) == 1
    chunks = [n for n in P.load_policy(SHIPPED[0]).nodes() if n.kind == "chunk"]
    assert len(chunks) == 10 and {(c.window, c.stride) for c in chunks} == {(128, 96)}


@pytest.mark.parametrize("defaults,message", [
    ({"chunk": {"stride": 0}}, r"^policy\.defaults\.chunk\.stride: 0 is outside \[1, 1048576\]"),
    ({"chunk": {"node": {"kind": "constant", "probability": 0.5}}}, r"^policy\.defaults\.chunk\.node: unknown key"),
    ({"model": {"model": "x"}}, r"^policy\.defaults\.model\.model: unknown key"),  # required keys stay in the node
    ({"model": {"name": "x"}}, r"^policy\.defaults\.model\.name: unknown key"),
    ({"modle": {}}, r"^policy\.defaults\.modle: unknown key"),
    ({"chunk": {"window": 64, "stride": 96}}, r"^root\.stride: 96 is outside \[1, 62\]"),  # across keys: at the node
])
def test_defaults_are_checked_where_they_are_written(defaults, message):
    doc = {"version": 1, "defaults": defaults, "root": {"kind": "chunk", "node": model("fast")}}
    with pytest.raises(P.PolicyError, match=message):
        P.parse_policy(doc)


def test_required_fields_have_no_stand_in_default():
    with pytest.raises(TypeError, match="ChunkNode: required field"):
        ChunkNode(kind="chunk", name="c")


# ----------------------------------------------------------------------------- a new kind


def test_engine_and_policy_never_test_a_kind_by_name():
    for name in ("execution/engine.py", "routing/policy.py"):
        source = (ROOT / "orchestrator" / "runtime" / name).read_text()
        for pattern in ("kind ==", "kind !=", '"chunk"', '"model"', '"shadow"', '"switch"', '"sequence"', "ModelNode",
                        "nodes.chunk", "nodes.model import split", "nodes.model import truncate"):
            assert pattern not in source, f"{name}: {pattern}"


@dataclass(frozen=True)
class PrefixNode(Node):
    """The toy kind: classify the first ``keep`` content tokens of each text with ``model``."""

    model: str = S.REQUIRED
    keep: int = 4
    head: Head = LEGACY


async def _prefix_run(engine, node, items):
    await engine.calls.ensure_tokens(items, node.head.tokenizer)
    logits = await engine.calls.classify(node.model, items, node.keep + 2, node.head)  # [CLS] keep tokens [SEP]
    probs = node.head.probabilities(logits, np.zeros(1))
    return {it.idx: Answer(p, f"prefix:{node.model}") for it, p in zip(items, probs)}


PREFIX = NodeKind(
    name="prefix",
    node_type=PrefixNode,
    doc="Classify the first `keep` tokens of each text.",
    keys=(S.Key("model", S.Str(), "the model"), S.Key("keep", S.Int(1, 64), "content tokens classified")),
    build=lambda values, ctx, common: PrefixNode(**common, **values),
    run=_prefix_run,
    describe=lambda node: f"prefix {node.model} keep={node.keep}",
    bind=lambda node, ctx: replace(node, head=ctx.heads[node.model]),
    tokens=lambda node: (node.head.tokenizer,),
    calls=lambda node: (ModelCall(node.model, None, node.where),),
)


def test_a_new_kind_is_its_module_and_one_table_line(monkeypatch):
    monkeypatch.setitem(KINDS, "prefix", PREFIX)  # the table line
    doc = {"version": 1, "defaults": {"prefix": {"keep": 2}},
           "root": {"kind": "fallback", "nodes": [{"kind": "prefix", "name": "p", "model": "fast"}, model("accurate")]}}
    # parsed (with defaults per kind), declared needs read by the policy
    policy = P.parse_policy(doc)
    assert policy.root.nodes[0].keep == 2
    assert policy.models() == ["tokenizer", "fast", "accurate"]
    # run by the engine: tokenized once, truncated to [CLS] + 2 tokens + [SEP]
    fake = FakeBLS()
    texts = ["good bad good good", "bad bad", "bad good"]
    [result] = asyncio.run(Engine(policy, fake).run([Work(texts, np.full(3, 0.5, np.float32), {}, "")]))
    want = [sig(expected_logit("fast", (ids_of(t)[:3] + [102]) if len(ids_of(t)) > 4 else ids_of(t))) for t in texts]
    np.testing.assert_allclose(result.probabilities.reshape(-1), want, rtol=1e-6)
    assert result.routes == ["prefix:fast"] * 3 and fake.models_called() == ["tokenizer", "fast"]
    # rendered
    assert "[p] prefix fast keep=2" in P.describe(policy)
    # validated by the schema and documented, from the same declaration
    schema = D.json_schema()
    assert schema_errors(schema, doc) == []
    too_long = copy.deepcopy(doc)
    too_long["root"]["nodes"][0]["keep"] = 100
    assert schema_errors(schema, too_long) and not parser_accepts(too_long)
    assert "### `prefix`" in D.markdown() and "| `keep` | integer in [1, 64] | `4` |" in D.markdown()
    # the published schema (without the toy kind) refuses it
    published = json.loads((ROOT / "docs" / "policy.schema.json").read_text())
    assert schema_errors(published, doc)


def test_tokenizers_come_from_what_kinds_declare_models_first():
    doc = {"version": 1, "tokenizer": "tok_b", "root": {"kind": "sequence", "steps": [
        {"kind": "switch", "cases": [{"when": {"tokens": {"max": 3}}, "then": {"kind": "constant", "probability": 0.1}}]},
        model("fast")]}}
    policy = P.parse_policy(doc)
    assert policy.tokenizers() == ["tokenizer", "tok_b"]  # the model's (its head), then the switch's tokens condition
    assert policy.models() == ["tokenizer", "tok_b", "fast"] and policy.windows() == []
