"""``switch``: if-else branches on the text, its length, a request parameter or a score."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from orchestrator.runtime.concurrency import gather
from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.heads import Head
from orchestrator.runtime.nodes.base import Answer, Answers, BindContext, Engine, Item, Node, NodeKind, ParseContext, Reader


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
        return self.margin_below is None or head.unsure(score.probabilities, it.threshold, self.margin_below)

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
    """First matching case wins.

    Policy keys: ``cases`` (1+ ``{when: CONDITION, then: NODE}``), ``default`` (NODE for
    the rest; without it the rest stays unanswered, so such a switch may only be a step
    of a ``sequence``), ``score`` (NODE run first on all texts, whose answer stands for
    texts no case takes and whose probability ``margin_below`` reads). CONDITION keys:
    ``empty`` (bool), ``tokens`` (``{min, max}``), ``param`` (``{name, equals}`` or
    ``{name, in: [..]}``), ``margin_below`` (a probability distance); see
    :class:`Condition`.
    """

    cases: List[Case] = field(default_factory=list)
    default: Optional[Node] = None
    score: Optional[Node] = None
    tokenizer: str = ""  # counts ``tokens``: the policy's ``tokenizer`` (set by ``policy.bind_heads``)


def _param(p: Reader, ctx: ParseContext, cond: Condition) -> None:
    cond.param_name = p.get("name", str, required=True)
    if cond.param_name not in ctx.request_parameters:
        raise PolicyError(f"{p.where}.name: {cond.param_name!r} is not declared in request_parameters")
    if ("equals" in p.data) == ("in" in p.data):
        raise PolicyError(f"{p.where}: give exactly one of 'equals' or 'in'")
    values = [p.get("equals", str)] if "equals" in p.data else p.get("in", list)
    allowed = ctx.request_parameters[cond.param_name]
    for v in values:
        if v not in allowed:
            raise PolicyError(f"{p.where}: value {v!r} is not declared in request_parameters.{cond.param_name} {list(allowed)}")
    cond.param_values = tuple(values)


def parse_condition(data: Any, where: str, ctx: ParseContext, has_score: bool) -> Condition:
    """Validate one ``when`` mapping. Raises PolicyError with the location."""
    r = Reader(data, where, ("empty", "tokens", "param", "margin_below"))
    if not r.data:
        raise PolicyError(f"{where}: empty condition (use the switch's default instead)")
    cond = Condition(empty=r.get("empty", bool), margin_below=r.number_in("margin_below", 0.0, 1.0))
    if cond.margin_below is not None and not has_score:
        raise PolicyError(f"{where}.margin_below: needs a 'score' node on the switch")
    if "tokens" in r.data:
        t = Reader(r.data["tokens"], f"{where}.tokens", ("min", "max"))
        cond.tokens_min = t.number_in("min", 0, 1 << 30, kind=int)
        cond.tokens_max = t.number_in("max", 0, 1 << 30, kind=int)
        if cond.tokens_min is None and cond.tokens_max is None:
            raise PolicyError(f"{where}.tokens: give min, max or both")
    if "param" in r.data:
        _param(Reader(r.data["param"], f"{where}.param", ("name", "equals", "in")), ctx, cond)
    return cond


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> SwitchNode:
    score = ctx.parse_node(r.data["score"], f"{r.where}.score") if "score" in r.data else None
    cases = []
    for i, c in enumerate(r.list_of("cases", 1)):
        cr = Reader(c, f"{r.where}.cases[{i}]", ("when", "then"))
        cond = parse_condition(cr.get("when", dict, required=True), f"{cr.where}.when", ctx, score is not None)
        cases.append(Case(when=cond, then=ctx.parse_node(cr.get("then", dict, required=True), f"{cr.where}.then")))
    default = ctx.parse_node(r.data["default"], f"{r.where}.default") if "default" in r.data else None
    return SwitchNode(**common, cases=cases, default=default, score=score)


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
    keys=("cases", "default", "score"),
    parse=_parse,
    run=_run,
    describe=lambda node: "switch",
    children=_children,
    declines=lambda node: node.default is None and node.score is None,
    bind=_bind,
)
