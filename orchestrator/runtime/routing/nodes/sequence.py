"""``sequence``: steps in order; a step may leave texts for the next one."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Sequence, Tuple

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.nodes.base import Answers, Engine, Item, Node, NodeKind, ParseContext, may_decline
from orchestrator.runtime.routing.schema import REQUIRED, Key, Nodes


@dataclass(frozen=True)
class SequenceNode(Node):
    """Run ``steps`` in order: each step answers what it can, texts a step leaves
    unanswered (a ``switch`` without ``default``) go to the next step. Keys: :data:`KIND`
    ``.keys``; every step but the last must be able to decline.
    """

    steps: Tuple[Node, ...] = REQUIRED


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> SequenceNode:
    steps = values["steps"]
    for i, step in enumerate(steps[:-1]):
        if not may_decline(step):
            raise PolicyError(f"{common['where']}.steps[{i + 1}]: unreachable, steps[{i}] answers every text")
    return SequenceNode(**common, steps=tuple(steps))


async def _run(engine: Engine, node: SequenceNode, items: List[Item]) -> Answers:
    answers: Answers = {}
    remaining = list(items)
    for step in node.steps:
        answers.update(await engine.run_node(step, remaining))
        remaining = [it for it in remaining if it.idx not in answers]
        if not remaining:
            break
    return answers


def _children(node: SequenceNode) -> List[Tuple[str, Node]]:
    return [(f"{i + 1}. ", n) for i, n in enumerate(node.steps)]


def _with_children(node: SequenceNode, children: Sequence[Node]) -> SequenceNode:
    return replace(node, steps=tuple(children))


def _declines(node: SequenceNode) -> bool:
    return all(may_decline(s) for s in node.steps)


KIND = NodeKind(
    name="sequence",
    node_type=SequenceNode,
    doc="Steps in order; a step may leave texts (a `switch` without `default`) for the next one.",
    keys=(Key("steps", Nodes(1), "the steps; every step but the last must be able to leave texts unanswered"),),
    build=_build,
    run=_run,
    describe=lambda node: "sequence",
    children=_children,
    with_children=_with_children,
    declines=_declines,
    accepts_declining=True,
)
