"""``fallback``: try nodes in order when one fails."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Tuple

from orchestrator.runtime.errors import DownstreamError, UnavailableError
from orchestrator.runtime.routing.nodes.base import Answers, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.routing.schema import REQUIRED, Key, Nodes


@dataclass(frozen=True)
class FallbackNode(Node):
    """Try ``nodes`` in order; the next one answers when one fails, times out or its
    model is not ready (any ``DownstreamError``). Keys: :data:`KIND` ``.keys``.
    """

    nodes: Tuple[Node, ...] = REQUIRED


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> FallbackNode:
    return FallbackNode(**common, nodes=tuple(values["nodes"]))


async def _run(engine: Engine, node: FallbackNode, items: List[Item]) -> Answers:
    errors = []
    for child in node.nodes:
        try:
            return await engine.run_node(child, items)
        except DownstreamError as exc:
            errors.append(exc)
    message = f"all options of fallback '{node.name}' failed: " + "; ".join(map(str, errors))
    unavailable = [e for e in errors if isinstance(e, UnavailableError)]
    if len(unavailable) == len(errors):  # none of the options can serve now: UNAVAILABLE
        raise UnavailableError(message, unavailable[-1].cause)
    raise DownstreamError(message)


def _children(node: FallbackNode) -> List[Tuple[str, Node]]:
    return [("try: " if i == 0 else "else: ", n) for i, n in enumerate(node.nodes)]


KIND = NodeKind(
    name="fallback",
    node_type=FallbackNode,
    doc="Try nodes in order: the next one answers when one fails, times out or its model is not ready.",
    keys=(Key("nodes", Nodes(2), "the nodes, in the order they are tried"),),
    build=_build,
    run=_run,
    describe=lambda node: "fallback",
    children=_children,
    with_children=lambda node, children: replace(node, nodes=tuple(children)),
)
