"""The policy compiled once, at load, into an immutable plan (``policy.bind_heads``), and the
nodes' run-time state held by the engine (``Engine.states``, ``Run.state``): every node kind's dataclass is
frozen, binding builds a new tree and leaves the parsed one as it was, and a cascade's
escalation budget lives in the engine, per node, from one execute to the next. No server.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing import nodes as N
from orchestrator.runtime.routing.heads import BINARY, LEGACY, MULTICLASS, Head
from orchestrator.runtime.routing.nodes import base
from orchestrator.runtime.routing.nodes.cascade import EscalationBudget
from orchestrator.runtime.routing.policy import bind_heads, parse_policy
from tests.helpers import FakeBLS, expected_logit, ids_of, sig

BIN = Head(BINARY, ("positive",), tokenizer="tok_b", max_length=256)
LANG = Head(MULTICLASS, ("en", "de", "fr"))
HEADS = {"fast": BIN, "accurate": BIN, "lang": LANG}


def model(name, model_name, **kw):
    return {"kind": "model", "name": name, "model": model_name, **kw}


#: Every node kind once, with the parts that hang on nodes (cases, conditions, a budget,
#: on-demand settings, a calibration).
EVERY_KIND = {
    "version": 1,
    "request_parameters": {"route": ["a", "b"]},
    "root": {"kind": "sequence", "name": "seq", "steps": [
        {"kind": "switch", "name": "blank", "cases": [
            {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False}}]},
        {"kind": "switch", "name": "by_lang", "score": model("lang_id", "lang"), "cases": [
            {"when": {"label": "de"}, "then": {"kind": "shadow", "name": "sh", "primary": model("fast_de", "fast"),
                                               "candidate": model("acc_de", "accurate")}},
            {"when": {"tokens": {"min": 50}, "param": {"name": "route", "equals": "a"}},
             "then": {"kind": "chunk", "name": "ch", "window": 16, "node": model("fast_long", "fast")}},
        ], "default": {"kind": "fallback", "name": "fb", "nodes": [
            {"kind": "cascade", "name": "cas", "margin": 0.1, "budget": {"max_escalation_rate": 0.2}, "stages": [
                model("fast_c", "fast", on_demand=True, calibration={"reference_threshold": 0.5, "threshold": 0.4}),
                {"kind": "parallel", "name": "par", "nodes": [model("acc_p", "accurate"), model("fast_p", "fast")]},
            ]},
            {"kind": "split", "name": "sp", "branches": [
                {"weight": 1, "node": model("fast_s", "fast")},
                {"weight": 1, "node": {"kind": "constant", "name": "c_s", "probability": 0.3}},
            ]},
        ]}},
    ]},
}


def parts(node):
    """The values hanging on ``node`` that are dataclasses themselves (cases, conditions,
    a budget, on-demand settings), not nodes."""
    def own(value):
        return [v for v in (value if isinstance(value, tuple) else (value,))
                if dataclasses.is_dataclass(v) and not isinstance(v, (base.Node, Head, type))]

    out = []
    for f in dataclasses.fields(node):
        for v in own(getattr(node, f.name)):
            out += [v] + [w for g in dataclasses.fields(v) for w in own(getattr(v, g.name))]
    return out


def test_the_policy_names_every_kind():
    assert {n.kind for n in parse_policy(EVERY_KIND).nodes()} == set(N.KINDS)


def test_a_bound_plan_is_immutable():
    plan = bind_heads(parse_policy(EVERY_KIND), HEADS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.head = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.root = plan.root  # type: ignore[misc]
    found = set()
    for node in plan.nodes():
        for f in dataclasses.fields(node):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(node, f.name, getattr(node, f.name))
            # no list to append to: the children and cases are tuples
            assert not isinstance(getattr(node, f.name), (list, dict)), f"{node.name}.{f.name}"
        for part in parts(node):
            found.add(type(part).__name__)
            for f in dataclasses.fields(part):
                with pytest.raises(dataclasses.FrozenInstanceError):
                    setattr(part, f.name, getattr(part, f.name))
    assert found == {"Case", "Condition", "Budget", "OnDemand"}


def test_binding_returns_a_new_bound_plan_and_leaves_the_parsed_policy_unbound():
    parsed = parse_policy(EVERY_KIND)
    before = repr(parsed)  # every field, down the tree
    plan = bind_heads(parsed, HEADS)
    assert repr(parsed) == before  # nothing of the parsed tree changed
    assert parsed.head is None and plan.head is BIN
    old, new = {n.name: n for n in parsed.nodes()}, {n.name: n for n in plan.nodes()}
    assert list(old) == list(new)  # the same tree, node for node
    # what binding sets is in the plan only
    assert [old[m].head for m in ("fast_c", "acc_p", "lang_id")] == [LEGACY] * 3
    assert [new[m].head for m in ("fast_c", "acc_p", "lang_id")] == [BIN, BIN, LANG]
    assert (old["by_lang"].tokenizer, old["by_lang"].score_head) == ("", None)
    assert (new["by_lang"].tokenizer, new["by_lang"].score_head) == ("tok_b", LANG)
    assert old["ch"].tokenizer == "" and new["ch"].tokenizer == "tok_b"
    # every node with children or bound fields is a new object; the plan's parents hold the plan's children
    for name in ("seq", "by_lang", "sh", "ch", "fb", "cas", "par", "sp", "fast_c", "lang_id"):
        assert new[name] is not old[name], name
    for node in plan.nodes():
        assert all(c is new[c.name] for c in N.children(node)), node.name
    assert parsed.tokenizers() == ["tokenizer"] and plan.tokenizers() == ["tokenizer", "tok_b"]
    # binding the parsed policy again gives an equal plan
    assert bind_heads(parsed, HEADS) == plan


def test_a_kind_with_children_must_rebuild_with_the_children_given(monkeypatch):
    doc = {"version": 1, "root": {"kind": "fallback", "nodes": [model("a", "fast"), model("b", "accurate")]}}
    kind = N.KINDS["fallback"]
    monkeypatch.setitem(N.KINDS, "fallback", dataclasses.replace(kind, with_children=base._has_no_children))
    with pytest.raises(TypeError, match="fallback: it declares children but no with_children"):
        bind_heads(parse_policy(doc), HEADS)
    dropped = dataclasses.replace(kind, with_children=lambda node, children: node)  # keeps the unbound children
    monkeypatch.setitem(N.KINDS, "fallback", dropped)
    with pytest.raises(TypeError, match="fallback: with_children did not place the children it was given"):
        bind_heads(parse_policy(doc), HEADS)


# ----------------------------------------------------------------------------- run-time state

P_FILM = sig(expected_logit("fast", ids_of("film")))  # every text is "film": its threshold sets its distance


def two_cascades():
    """Two cascades with budgets, chosen per request by the parameter ``route``: ``a``
    (at most half the texts escalated) and ``b`` (every unsure text)."""
    def cascade(name, rate):
        return {"kind": "cascade", "name": name, "margin": 0.1, "budget": {"max_escalation_rate": rate},
                "stages": [model(f"fast_{name}", "fast"), model(f"acc_{name}", "accurate")]}
    return parse_policy({"version": 1, "request_parameters": {"route": ["a", "b"]}, "root": {
        "kind": "switch", "name": "pick", "cases": [{"when": {"param": {"name": "route", "equals": "a"}}, "then": cascade("a", 0.5)}],
        "default": cascade("b", 1.0)}})


def execute(engine, route, distance):
    """One execute of one text "film" whose threshold is ``distance`` from its first stage's answer."""
    t = np.array([[P_FILM + distance]], np.float32)
    [result] = asyncio.run(engine.run([Work(["film"], t, {"route": route}, "")]))
    return result.routes[0]


def test_the_budget_is_state_the_engine_holds_per_node_across_executes():
    engine = Engine(two_cascades(), FakeBLS())
    assert all("controller" not in {f.name for f in dataclasses.fields(n)} for n in engine.policy.nodes())
    assert engine.states == {}  # made on first use
    # a's first text: a window of one text allows no escalation (floor(0.5 * 1) = 0)
    assert execute(engine, "a", 0.05) == "fast:budget"
    held = engine.states["a"]
    assert isinstance(held, EscalationBudget) and held.budget.max_escalation_rate == 0.5
    # b's own budget (rate 1): with a's state it would be kept (a window of two, one allowed,
    # and 0.05 not below the quantile 0.05)
    assert execute(engine, "b", 0.05) == "accurate"
    assert engine.states["b"] is not held and engine.states["b"].budget.max_escalation_rate == 1.0
    # a's second text: its window now holds two texts, one escalation allowed; a state made
    # afresh for this execute would keep it as the first
    assert execute(engine, "a", 0.01) == "accurate"
    assert engine.states["a"] is held and set(engine.states) == {"a", "b"}
    # every run of the engine (warmup, the shadow worker: another infer) shares it
    node = next(n for n in engine.policy.nodes() if n.name == "a")
    assert engine.start(FakeBLS()).state(node, lambda: pytest.fail("made again")) is held
    # another engine (another router instance) starts empty
    assert execute(Engine(two_cascades(), FakeBLS()), "a", 0.01) == "fast:budget"
