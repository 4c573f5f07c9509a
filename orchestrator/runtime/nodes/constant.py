"""``constant``: answer without a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.nodes.base import Answer, Answers, BindContext, Engine, Item, Node, NodeKind, ParseContext, Reader


@dataclass
class ConstantNode(Node):
    """Answer every text with fixed probabilities.

    Policy keys: ``probability`` (required: a probability in [0, 1] for every output column,
    or a list with one per column of the policy's head), ``verdict`` (bool, for every
    column; default: the head's rule on the probabilities and the client's thresholds),
    ``route`` (default the node's name).
    """

    probability: Tuple[float, ...] = (0.5,)
    verdict: Optional[bool] = None
    route: str = ""


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> ConstantNode:
    values, _ = r.numbers_in("probability", 0.0, 1.0)
    return ConstantNode(
        **common,
        probability=tuple(values),
        verdict=r.get("verdict", bool),
        route=r.get("route", str, common["name"]),
    )


def _bind(node: ConstantNode, ctx: BindContext) -> None:
    head = ctx.head
    if len(node.probability) not in (1, head.columns):
        raise PolicyError(
            f"{node.name}.probability: {len(node.probability)} values, but the policy's head ({head.describe()}) "
            f"answers {head.columns} column(s)"
        )


async def _run(engine: Engine, node: ConstantNode, items: List[Item]) -> Answers:
    columns = engine.head.columns
    p = np.broadcast_to(np.asarray(node.probability, dtype=np.float64), (columns,)).copy()
    v = None if node.verdict is None else np.full(columns, node.verdict)
    return {it.idx: Answer(p, node.route, v) for it in items}


def _describe(node: ConstantNode) -> str:
    v = "" if node.verdict is None else f" verdict={str(node.verdict).lower()}"
    return f"constant p={','.join(f'{x:g}' for x in node.probability)}{v} route={node.route}"


KIND = NodeKind(
    name="constant",
    node_type=ConstantNode,
    keys=("probability", "verdict", "route"),
    parse=_parse,
    run=_run,
    describe=_describe,
    bind=_bind,
)
