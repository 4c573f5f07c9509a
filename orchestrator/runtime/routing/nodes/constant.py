"""``constant``: answer without a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.nodes.base import Answer, Answers, BindContext, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.routing.schema import REQUIRED, Bool, Key, Probabilities, Str


@dataclass(frozen=True)
class ConstantNode(Node):
    """Answer every text with fixed probabilities (keys: :data:`KIND` ``.keys``, docs/reference/policy.md).

    Attributes:
        probability: one probability for every output column, or one per column.
        verdict: a fixed verdict for every column, or None (the head's rule decides).
        route: the ``ROUTE`` value.
    """

    probability: Tuple[float, ...] = REQUIRED
    verdict: Optional[bool] = None
    route: str = REQUIRED


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> ConstantNode:
    probability, _ = values["probability"]
    return ConstantNode(**common, probability=tuple(probability), verdict=values["verdict"], route=values["route"] or common["name"])


def _bind(node: ConstantNode, ctx: BindContext) -> ConstantNode:
    head = ctx.head
    if len(node.probability) not in (1, head.columns):
        raise PolicyError(
            f"{node.name}.probability: {len(node.probability)} values, but the policy's head ({head.describe()}) "
            f"answers {head.columns} column(s)"
        )
    return node


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
    doc="Answer without a model.",
    keys=(
        Key("probability", Probabilities(0.0, 1.0), "the answer's probability for every output column, or a list "
            "with one per column of the policy's head"),
        Key("verdict", Bool(), "a fixed verdict for every column; absent: the head's rule on the probabilities and "
            "the client's thresholds"),
        Key("route", Str(), "the `ROUTE` value", computed="the node's name"),
    ),
    build=_build,
    run=_run,
    describe=_describe,
    bind=_bind,
)
