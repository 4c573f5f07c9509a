"""``switch``: if-else branches on the text, its length, a request parameter or a score's
answer (its margin, its top label, or a label's probability band)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.heads import BINARY, Head
from orchestrator.runtime.routing.nodes.base import REGISTRY, Answer, Answers, BindContext, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.routing.schema import REQUIRED, Bool, Int, Key, ListOf, NodeRef, Number, Str, Strings, Struct


@dataclass(frozen=True)
class Condition:
    """A case's condition; every key given must hold.

    Attributes:
        empty: text empty or whitespace-only (True) or not (False).
        tokens_min, tokens_max: inclusive bounds on the text's token count (special
            tokens included; an untokenized empty text counts 0).
        param_name, param_values: the request parameter ``param_name`` is one of
            ``param_values`` (the parameter must be declared in ``request_parameters``).
        margin_below: the score's answer is unsure by this margin (``heads.Head.unsure``;
            binary: |probability - threshold| < margin_below; needs the switch's ``score`` node).
        label: the score's top label is this one (:func:`top_label`; needs ``score``).
        band: ``(label, low, high)``: the score's probability of ``label``
            (:func:`label_probability`) is in ``[low, high]`` (needs ``score``).
    """

    empty: Optional[bool] = None
    tokens_min: Optional[int] = None
    tokens_max: Optional[int] = None
    param_name: Optional[str] = None
    param_values: Tuple[str, ...] = ()
    margin_below: Optional[float] = None
    label: Optional[str] = None
    band: Optional[Tuple[str, float, float]] = None

    @property
    def reads_score(self) -> bool:
        """True when the condition reads the switch's ``score`` answer."""
        return self.margin_below is not None or self.label is not None or self.band is not None

    @property
    def labels(self) -> Tuple[str, ...]:
        """The labels the condition names (checked against the score's head)."""
        return tuple(x for x in (self.label, self.band[0] if self.band else None) if x is not None)

    @property
    def needs_tokens(self) -> bool:
        """True when the condition reads the token count."""
        return self.tokens_min is not None or self.tokens_max is not None

    def matches(self, it: Item, score: Optional[Answer], head: Head, tokenizer: str) -> bool:
        """True when ``it`` (with its ``score`` answer, if the switch has one, in ``head``'s
        columns: the score's head) meets every key; tokens are counted with tokenizer model
        ``tokenizer``."""
        if self.empty is not None and (not it.text.strip()) != self.empty:
            return False
        if self.needs_tokens:
            n = 0 if not it.text.strip() and tokenizer not in it.tokens else int(it.tokens[tokenizer].shape[0])
            if (self.tokens_min is not None and n < self.tokens_min) or (self.tokens_max is not None and n > self.tokens_max):
                return False
        if self.param_name is not None and str(it.params.get(self.param_name, "")) not in self.param_values:
            return False
        if not self.reads_score:
            return True
        assert score is not None, "a switch whose cases read its score scores its texts first"
        if self.label is not None and top_label(head, score.probabilities) != self.label:
            return False
        if self.band is not None and not self.band[1] <= label_probability(head, score.probabilities, self.band[0]) <= self.band[2]:
            return False
        return self.margin_below is None or bool(head.unsure(score.probabilities, it.threshold, self.margin_below))

    def text(self) -> str:
        """The condition in words, for ``orchestrator policy check``."""
        parts = []
        if self.empty is not None:
            parts.append("empty" if self.empty else "not empty")
        if self.needs_tokens:
            low = self.tokens_min if self.tokens_min is not None else 0
            high = self.tokens_max if self.tokens_max is not None else "inf"
            parts.append(f"tokens in [{low}, {high}]")
        if self.param_name:
            parts.append(f"param {self.param_name} in {list(self.param_values)}")
        if self.margin_below is not None:
            parts.append(f"|score - threshold| < {self.margin_below:g}")
        if self.label is not None:
            parts.append(f"score label {self.label}")
        if self.band is not None:
            parts.append(f"score p({self.band[0]}) in [{self.band[1]:g}, {self.band[2]:g}]")
        return " and ".join(parts)


def top_label(head: Head, probabilities: Any) -> Optional[str]:
    """The label with the highest probability in an answer (float [columns] of ``head``):
    multiclass and multilabel, the argmax column's label (the first on a tie); binary, the
    positive label when its probability is at least 0.5, else the other label (None for a
    one-logit head, whose other label has no name). The client's thresholds play no part:
    they are for the policy's head, which a routing model need not share."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    if head.kind != BINARY:
        return head.output_labels()[int(np.argmax(p))]
    if p[0] >= 0.5:
        return head.labels[head.positive_index]
    others = [x for i, x in enumerate(head.labels) if i != head.positive_index]
    return others[0] if others else None


def label_probability(head: Head, probabilities: Any, label: str) -> float:
    """An answer's probability of ``label`` (one of ``head.labels``): its column, or for a
    binary head's other label, 1 - the positive label's."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    if head.kind == BINARY:
        return float(p[0]) if label == head.labels[head.positive_index] else 1.0 - float(p[0])
    return float(p[head.output_labels().index(label)])


@dataclass(frozen=True)
class Case:
    """One ``{when, then}`` entry of a switch: ``then`` answers the texts ``when`` matches."""

    when: Condition
    then: Node


@dataclass(frozen=True)
class SwitchNode(Node):
    """First matching case wins. Keys: :data:`KIND` ``.keys`` (docs/reference/policy.md); without
    ``default`` (and ``score``) the rest stays unanswered, so such a switch may only be a
    step of a ``sequence``; ``margin_below`` needs ``score``.
    """

    cases: Tuple[Case, ...] = REQUIRED
    default: Optional[Node] = None
    score: Optional[Node] = None
    tokenizer: str = ""  # counts ``tokens``: the policy's ``tokenizer``, in the plan (``policy.bind_heads``)
    score_head: Optional[Head] = None  # the score's answers' head, in the plan (``policy.bind_heads``)


def _condition(values: Dict[str, Any], where: str) -> Condition:
    tokens, param = values["tokens"] or {}, values["param"]
    name, allowed = None, ()
    if param is not None:  # exactly one of equals / in (the struct's one_of)
        name = param["name"]
        allowed = (param["equals"],) if param["equals"] is not None else tuple(param["in"])
    return Condition(empty=values["empty"], tokens_min=tokens.get("min"), tokens_max=tokens.get("max"),
                     param_name=name, param_values=allowed, margin_below=values["margin_below"], label=values["label"],
                     band=values["probability"])


@dataclass(frozen=True)
class Band:
    """A ``probability`` condition's keys (read as ``(label, min, max)``)."""

    label: str = REQUIRED
    min: float = 0.0
    max: float = 1.0


def _band(values: Dict[str, Any], where: str) -> Tuple[str, float, float]:
    if values["min"] > values["max"]:
        raise PolicyError(f"{where}.min: {values['min']:g} is above max {values['max']:g}")
    return values["label"], values["min"], values["max"]


#: A ``probability`` condition: a label's probability band.
BAND = Struct(
    "switch.cases[].when.probability",
    [
        Key("label", Str(), "a label of the score model's head", required=True),
        Key("min", Number(0.0, 1.0), "at least this probability (inclusive)"),
        Key("max", Number(0.0, 1.0), "at most this probability (inclusive)"),
    ],
    target=Band,
    build=_band,
    doc="The score's probability of `label` (binary: the positive label's column, or 1 minus it for the other "
        "label) is within [min, max].",
)

#: A case's ``when``: every key given must hold.
WHEN = Struct(
    "switch.cases[].when",
    [
        Key("empty", Bool(), "the text is empty or whitespace-only (true) or not (false)"),
        Key("tokens", Struct("switch.cases[].when.tokens", [
            Key("min", Int(0, 1 << 30), "at least this many tokens"),
            Key("max", Int(0, 1 << 30), "at most this many tokens"),
        ], nonempty="give min, max or both", doc="Inclusive bounds on the text's token count (special tokens included; "
            "the policy's `tokenizer`; an empty text counts 0)."), "the token count is within bounds"),
        Key("param", Struct("switch.cases[].when.param", [
            Key("name", Str(), "a request parameter declared in `request_parameters`", required=True),
            Key("equals", Str(), "the value it must have"),
            Key("in", Strings(), "the values it may have"),
        ], one_of=(("equals", "in"), "give exactly one of 'equals' or 'in'"),
            doc="A request parameter's value; the values must be declared in `request_parameters`."),
            "the request parameter has one of these values"),
        Key("margin_below", Number(0.0, 1.0), "the switch's `score` answer is unsure by this margin (binary: "
            "|probability - threshold| < margin_below); needs `score` with the policy's head"),
        Key("label", Str(), "the switch's `score` answer's top label is this one (the most probable label; binary: "
            "the positive label at probability >= 0.5, else the other); needs `score`, and the label must be in "
            "the score model's head"),
        Key("probability", BAND, "the switch's `score` answer's probability of a label is in a band; needs `score`"),
    ],
    build=_condition,
    nonempty="empty condition (use the switch's default instead)",
    doc="A case's condition; every key given must hold.",
)

#: One ``{when, then}`` entry of ``cases``.
CASE = Struct(
    "switch.cases[]",
    [
        Key("when", WHEN, "the condition", required=True),
        Key("then", NodeRef(), "answers the texts the condition matches", required=True),
    ],
    build=lambda values, where: Case(when=values["when"], then=values["then"]),
    doc="One case of a switch.",
)


def _check_case(case: Case, where: str, ctx: ParseContext, has_score: bool) -> None:
    """What spans keys: ``margin_below``, ``label`` and ``probability`` need a score,
    ``param`` values are declared."""
    cond = case.when
    for key, given in (("margin_below", cond.margin_below), ("label", cond.label), ("probability", cond.band)):
        if given is not None and not has_score:
            raise PolicyError(f"{where}.when.{key}: needs a 'score' node on the switch")
    if cond.param_name is None:
        return
    if cond.param_name not in ctx.request_parameters:
        raise PolicyError(f"{where}.when.param.name: {cond.param_name!r} is not declared in request_parameters")
    allowed = ctx.request_parameters[cond.param_name]
    for v in cond.param_values:
        if v not in allowed:
            raise PolicyError(f"{where}.when.param: value {v!r} is not declared in request_parameters.{cond.param_name} {list(allowed)}")


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> SwitchNode:
    for i, case in enumerate(values["cases"]):
        _check_case(case, f"{common['where']}.cases[{i}]", ctx, values["score"] is not None)
    return SwitchNode(**common, **{**values, "cases": tuple(values["cases"])})


async def _run(engine: Engine, node: SwitchNode, items: List[Item]) -> Answers:
    scores = await engine.run_node(node.score, items) if node.score else {}
    for c in node.cases:  # loops, not any() and next() of generators: on every text's path
        if c.when.needs_tokens:
            await engine.calls.ensure_tokens([it for it in items if it.text.strip()], node.tokenizer)
            break
    head = node.score_head or engine.head
    groups: List[List[Item]] = [[] for _ in node.cases]
    rest: List[Item] = []
    for it in items:
        score = scores.get(it.idx)
        for k, case in enumerate(node.cases):  # the first case that matches
            if case.when.matches(it, score, head, node.tokenizer):
                groups[k].append(it)
                break
        else:
            rest.append(it)
    jobs = [engine.run_node(c.then, g) for c, g in zip(node.cases, groups) if g]
    if node.default and rest:
        jobs.append(engine.run_node(node.default, rest))
    answers: Answers = {}
    if node.score and not node.default:
        answers.update({it.idx: scores[it.idx] for it in rest})
    for part in await engine.gather(jobs):
        answers.update(part)
    return answers


def _children(node: SwitchNode) -> List[Tuple[str, Node]]:
    out = [("score: ", node.score)] if node.score else []
    out += [(f"when {c.when.text()}: ", c.then) for c in node.cases]
    return out + ([("default: ", node.default)] if node.default else [])


def _with_children(node: SwitchNode, children: Sequence[Node]) -> SwitchNode:
    """``children`` in :func:`_children`'s order: the score, each case's ``then``, the default."""
    rest = list(children)
    score = rest.pop(0) if node.score is not None else None
    default = rest.pop() if node.default is not None else None
    return replace(node, score=score, cases=tuple(replace(c, then=t) for c, t in zip(node.cases, rest)), default=default)


def _score_head(node: SwitchNode, ctx: BindContext) -> Head:
    """The head of the score's answers: a lone model node's own (it may differ from the
    policy's when the switch has a default: ``policy.bind_heads``), else the policy's."""
    kind = REGISTRY[node.score.kind] if node.score is not None else None
    calls = kind.calls(node.score) if kind is not None else ()
    if kind is not None and len(calls) == 1 and not kind.children(node.score):
        return ctx.heads.get(calls[0].model, ctx.head)
    return ctx.head


def _bind(node: SwitchNode, ctx: BindContext) -> SwitchNode:
    """The node with the tokenizer and the score's head; checks the labels the cases name
    exist in it, and that ``margin_below`` (which reads the client's thresholds, given for
    the policy's head) has a score with the policy's head.

    Raises:
        PolicyError: naming the case's location and the labels the score's head has.
    """
    if node.score is None:
        return replace(node, tokenizer=ctx.tokenizer)
    head = _score_head(node, ctx)
    node = replace(node, tokenizer=ctx.tokenizer, score_head=head)
    for i, case in enumerate(node.cases):
        where = f"{node.where}.cases[{i}].when"
        for label in case.when.labels:
            if label not in head.labels:
                raise PolicyError(f"{where}: label {label!r} is not in the score's head ({head.describe()}); "
                                  f"expected one of: {', '.join(head.labels)}")
        if case.when.margin_below is not None and not head.compatible(ctx.head):
            raise PolicyError(f"{where}.margin_below: the score has a {head.describe()} head, not the policy's "
                              f"{ctx.head.describe()}: the client's thresholds are for the policy's head; route on "
                              "its 'label' or 'probability'")
    return node


KIND = NodeKind(
    name="switch",
    node_type=SwitchNode,
    doc="If-else: the first case whose `when` matches answers the text: `empty`, `tokens`, `param`, or the `score` "
        "answer's `margin_below`, `label` or `probability` band (hierarchical classification: a domain or language "
        "model as `score`, a specialist per label).",
    keys=(
        Key("score", NodeRef(), "run first on every text; its answer stands for texts no case takes (without "
            "`default`) and `margin_below`, `label` and `probability` read it; with `default`, a lone model node here "
            "may have another head than the policy's (its labels are the ones cases name)"),
        Key("cases", ListOf(CASE, 1), "`{when, then}` entries, tried in order"),
        Key("default", NodeRef(), "answers the texts no case takes; without it (and `score`) they stay unanswered, "
            "so the switch may only be a step of a `sequence`"),
    ),
    build=_build,
    run=_run,
    describe=lambda node: "switch",
    children=_children,
    with_children=_with_children,
    declines=lambda node: node.default is None and node.score is None,
    bind=_bind,
    reads_only=lambda node: (node.score,) if node.score is not None and node.default is not None else (),
    tokens=lambda node: (node.tokenizer,) if any(c.when.needs_tokens for c in node.cases) else (),
)
