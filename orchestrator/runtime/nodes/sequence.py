"""``sequence``: steps in order; a step may leave texts for the next one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.nodes.base import Answers, Engine, Item, Node, NodeKind, ParseContext, Reader, may_decline


@dataclass
class SequenceNode(Node):
    """Run ``steps`` in order: each step answers what it can, texts a step leaves
    unanswered (a ``switch`` without ``default``) go to the next step.

    Policy keys: ``steps`` (1+ nodes; every step but the last must be able to decline).
    """

    steps: List[Node] = field(default_factory=list)


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> SequenceNode:
    steps = ctx.nodes(r, "steps", 1)
    for i, step in enumerate(steps[:-1]):
        if not may_decline(step):
            raise PolicyError(f"{r.where}.steps[{i + 1}]: unreachable, steps[{i}] answers every text")
    return SequenceNode(**common, steps=steps)


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


def _declines(node: SequenceNode) -> bool:
    return all(may_decline(s) for s in node.steps)


KIND = NodeKind(
    name="sequence",
    node_type=SequenceNode,
    keys=("steps",),
    parse=_parse,
    run=_run,
    describe=lambda node: "sequence",
    children=_children,
    declines=_declines,
)
