"""``constant``: answer without a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from orchestrator.runtime.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext, Reader
from orchestrator.runtime.scores import logit


@dataclass
class ConstantNode(Node):
    """Answer every text with a fixed probability.

    Policy keys: ``probability`` (required, in [0, 1]), ``verdict`` (bool; default:
    probability >= the client's threshold), ``route`` (default the node's name).
    """

    probability: float = 0.5
    verdict: Optional[bool] = None
    route: str = ""


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> ConstantNode:
    return ConstantNode(
        **common,
        probability=r.number_in("probability", 0.0, 1.0, required=True),
        verdict=r.get("verdict", bool),
        route=r.get("route", str, common["name"]),
    )


async def _run(engine: Engine, node: ConstantNode, items: List[Item]) -> Answers:
    p = node.probability
    return {it.idx: Answer(p, logit(p), node.route, node.verdict) for it in items}


def _describe(node: ConstantNode) -> str:
    v = "" if node.verdict is None else f" verdict={str(node.verdict).lower()}"
    return f"constant p={node.probability:g}{v} route={node.route}"


KIND = NodeKind(
    name="constant",
    node_type=ConstantNode,
    keys=("probability", "verdict", "route"),
    parse=_parse,
    run=_run,
    describe=_describe,
)
