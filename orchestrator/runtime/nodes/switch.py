"""``switch``: if-else branches on the text, its length, a request parameter or a score."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from orchestrator.runtime.concurrency import gather
from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.heads import Head
from orchestrator.runtime.nodes.base import Answer, Answers, BindContext, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.schema import REQUIRED, Bool, Int, Key, ListOf, NodeRef, Number, Str, Strings, Struct


@dataclass
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
    """

    empty: Optional[bool] = None
    tokens_min: Optional[int] = None
    tokens_max: Optional[int] = None
    param_name: Optional[str] = None
    param_values: Tuple[str, ...] = ()
    margin_below: Optional[float] = None

    @property
    def needs_tokens(self) -> bool:
        """True when the condition reads the token count."""
        return self.tokens_min is not None or self.tokens_max is not None

    def matches(self, it: Item, score: Optional[Answer], head: Head, tokenizer: str) -> bool:
        """True when ``it`` (with its ``score`` answer, if the switch has one) meets every key;
        tokens are counted with tokenizer model ``tokenizer``."""
        if self.empty is not None and (not it.text.strip()) != self.empty:
            return False
        if self.needs_tokens:
            n = 0 if not it.text.strip() and tokenizer not in it.tokens else int(it.ids(tokenizer).shape[0])
            if (self.tokens_min is not None and n < self.tokens_min) or (self.tokens_max is not None and n > self.tokens_max):
                return False
        if self.param_name is not None and str(it.params.get(self.param_name, "")) not in self.param_values:
            return False
        if self.margin_below is None:
            return True
        assert score is not None, "a switch with margin_below scores its texts first"
        return bool(head.unsure(score.probabilities, it.threshold, self.margin_below))

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
        return " and ".join(parts)


@dataclass
class Case:
    """One ``{when, then}`` entry of a switch: ``then`` answers the texts ``when`` matches."""

    when: Condition
    then: Node


@dataclass
class SwitchNode(Node):
    """First matching case wins. Keys: :data:`KIND` ``.keys`` (docs/policy.md); without
    ``default`` (and ``score``) the rest stays unanswered, so such a switch may only be a
    step of a ``sequence``; ``margin_below`` needs ``score``.
    """

    cases: List[Case] = REQUIRED
    default: Optional[Node] = None
    score: Optional[Node] = None
    tokenizer: str = ""  # counts ``tokens``: the policy's ``tokenizer`` (set by ``policy.bind_heads``)


def _condition(values: Dict[str, Any], where: str) -> Condition:
    tokens, param = values["tokens"] or {}, values["param"]
    cond = Condition(empty=values["empty"], tokens_min=tokens.get("min"), tokens_max=tokens.get("max"),
                     margin_below=values["margin_below"])
    if param is not None:  # exactly one of equals / in (the struct's one_of)
        cond.param_name = param["name"]
        cond.param_values = (param["equals"],) if param["equals"] is not None else tuple(param["in"])
    return cond


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
            "|probability - threshold| < margin_below); needs `score`"),
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
    """What spans keys: ``margin_below`` needs a score, ``param`` values are declared."""
    cond = case.when
    if cond.margin_below is not None and not has_score:
        raise PolicyError(f"{where}.when.margin_below: needs a 'score' node on the switch")
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
    return SwitchNode(**common, **values)


async def _run(engine: Engine, node: SwitchNode, items: List[Item]) -> Answers:
    scores = await engine.run_node(node.score, items) if node.score else {}
    if any(c.when.needs_tokens for c in node.cases):
        await engine.ensure_tokens([it for it in items if it.text.strip()], node.tokenizer)
    groups: List[List[Item]] = [[] for _ in node.cases]
    rest: List[Item] = []
    for it in items:
        k = next((k for k, case in enumerate(node.cases) if case.when.matches(it, scores.get(it.idx), engine.head, node.tokenizer)), None)
        (rest if k is None else groups[k]).append(it)
    jobs = [engine.run_node(c.then, g) for c, g in zip(node.cases, groups) if g]
    if node.default and rest:
        jobs.append(engine.run_node(node.default, rest))
    answers: Answers = {}
    if node.score and not node.default:
        answers.update({it.idx: scores[it.idx] for it in rest})
    for part in await gather(jobs):
        answers.update(part)
    return answers


def _children(node: SwitchNode) -> List[Tuple[str, Node]]:
    out = [("score: ", node.score)] if node.score else []
    out += [(f"when {c.when.text()}: ", c.then) for c in node.cases]
    return out + ([("default: ", node.default)] if node.default else [])


def _bind(node: SwitchNode, ctx: BindContext) -> None:
    node.tokenizer = ctx.tokenizer


KIND = NodeKind(
    name="switch",
    node_type=SwitchNode,
    doc="If-else: the first case whose `when` matches answers the text: `empty`, `tokens`, `param`, `margin_below`.",
    keys=(
        Key("score", NodeRef(), "run first on every text; its answer stands for texts no case takes and "
            "`margin_below` reads its probability"),
        Key("cases", ListOf(CASE, 1), "`{when, then}` entries, tried in order"),
        Key("default", NodeRef(), "answers the texts no case takes; without it (and `score`) they stay unanswered, "
            "so the switch may only be a step of a `sequence`"),
    ),
    build=_build,
    run=_run,
    describe=lambda node: "switch",
    children=_children,
    declines=lambda node: node.default is None and node.score is None,
    bind=_bind,
    tokens=lambda node: (node.tokenizer,) if any(c.when.needs_tokens for c in node.cases) else (),
)
