"""``parallel``: fan out to several nodes concurrently and combine their answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import numpy as np

from orchestrator.runtime.concurrency import gather
from orchestrator.runtime.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext, Reader
from orchestrator.runtime.scores import logit

COMBINES = ("mean", "max", "vote")


@dataclass
class ParallelNode(Node):
    """All ``nodes`` run concurrently on every text; ``combine`` joins their answers:
    ``mean`` or ``max`` of the probabilities, or ``vote``: the share of nodes whose
    probability reaches the threshold, positive when more than half do.

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
        probs = [a.probability for a in parts]
        route = f"parallel:{node.combine}(" + ",".join(a.route for a in parts) + ")"
        if node.combine == "vote":
            share = sum(p >= it.threshold for p in probs) / len(probs)
            answers[it.idx] = Answer(share, logit(share), route, share > 0.5)
        else:
            p = float(np.mean(probs)) if node.combine == "mean" else float(max(probs))
            answers[it.idx] = Answer(p, logit(p), route)
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
