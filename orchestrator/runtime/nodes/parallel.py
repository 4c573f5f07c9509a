"""``parallel``: fan out to several nodes concurrently and combine their answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import numpy as np

from orchestrator.runtime.concurrency import gather
from orchestrator.runtime.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext, Reader

COMBINES = ("mean", "max", "vote")


@dataclass
class ParallelNode(Node):
    """All ``nodes`` run concurrently on every text; ``combine`` joins their answers column
    by column (``heads.Head.combine``): ``mean`` or ``max`` of the probabilities, or
    ``vote``: per column the share of nodes whose verdict is true there (the head's rule:
    binary, probability >= threshold; multiclass, the node's top label; multilabel, per
    label), a verdict of true where more than half of the nodes vote for it (a tie is false).

    Policy keys: ``nodes`` (2+), ``combine`` (default ``mean``).
    """

    nodes: List[Node] = field(default_factory=list)
    combine: str = "mean"


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> ParallelNode:
    nodes = ctx.nodes(r, "nodes", 2)
    return ParallelNode(**common, nodes=nodes, combine=r.choice("combine", COMBINES, "mean"))


async def _run(engine: Engine, node: ParallelNode, items: List[Item]) -> Answers:
    results = await gather(engine.run_node(n, items) for n in node.nodes)
    answers: Answers = {}
    for it in items:
        parts = [r[it.idx] for r in results]
        route = f"parallel:{node.combine}(" + ",".join(a.route for a in parts) + ")"
        if node.combine == "vote":
            share = np.mean([engine.final_verdicts(a, it) for a in parts], axis=0)
            answers[it.idx] = Answer(share, route, share > 0.5)
        else:
            answers[it.idx] = Answer(engine.head.combine([a.probabilities for a in parts], node.combine), route)
    return answers


def _children(node: ParallelNode) -> List[Tuple[str, Node]]:
    return [("", n) for n in node.nodes]


KIND = NodeKind(
    name="parallel",
    node_type=ParallelNode,
    keys=("nodes", "combine"),
    parse=_parse,
    run=_run,
    describe=lambda node: f"parallel combine={node.combine}",
    children=_children,
)
