"""``split``: a weighted A/B or canary split per request."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Sequence, Tuple

from orchestrator.runtime.routing.nodes.base import Answers, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.routing.schema import REQUIRED, Key, ListOf, NodeRef, Number, Struct


@dataclass(frozen=True)
class SplitNode(Node):
    """Send each request's texts to one branch, chosen by weight: deterministic per
    request id (:func:`split_fraction`) when the request has one, random otherwise.
    Keys: :data:`KIND` ``.keys`` (docs/reference/policy.md).

    Attributes:
        branches: ``(weight, node)`` pairs; weights are normalized by their sum.
    """

    branches: Tuple[Tuple[float, Node], ...] = REQUIRED


#: One ``{weight, node}`` entry of ``branches``.
BRANCH = Struct(
    "split.branches[]",
    [
        Key("weight", Number(above=0.0, high=1e9), "a positive number; weights are normalized by their sum "
            "(90 and 10 give a 90 %/10 % split)", required=True),
        Key("node", NodeRef(), "answers the requests this branch gets", required=True),
    ],
    build=lambda values, where: (values["weight"], values["node"]),
    doc="One branch of a split.",
)


def split_fraction(node_name: str, request_id: str) -> float:
    """A request's deterministic position in [0, 1) for a ``split`` node: the first 8 bytes
    of SHA-256(node name, NUL, request id) as a big-endian fraction, so the same id always
    takes the same branch on every replica."""
    digest = hashlib.sha256(f"{node_name}\0{request_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def branch_of(weights: Sequence[float], x: float) -> int:
    """The branch whose cumulative weight share first exceeds ``x`` in [0, 1)."""
    total, acc = sum(weights), 0.0
    for k, w in enumerate(weights):
        acc += w / total
        if x < acc:
            return k
    return len(weights) - 1


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> SplitNode:
    return SplitNode(**common, branches=tuple(values["branches"]))


async def _run(engine: Engine, node: SplitNode, items: List[Item]) -> Answers:
    weights = [w for w, _ in node.branches]
    choice: Dict[int, int] = {}
    groups: List[List[Item]] = [[] for _ in node.branches]
    for it in items:
        if it.req not in choice:
            x = split_fraction(node.name, it.request_id) if it.request_id else engine.random()
            choice[it.req] = branch_of(weights, x)
        groups[choice[it.req]].append(it)
    answers: Answers = {}
    for part in await engine.gather(engine.run_node(n, g) for (_, n), g in zip(node.branches, groups) if g):
        answers.update(part)
    return answers


def _children(node: SplitNode) -> List[Tuple[str, Node]]:
    total = sum(w for w, _ in node.branches)
    return [(f"{100 * w / total:.1f}%: ", n) for w, n in node.branches]


def _with_children(node: SplitNode, children: Sequence[Node]) -> SplitNode:
    return replace(node, branches=tuple((w, c) for (w, _), c in zip(node.branches, children)))


KIND = NodeKind(
    name="split",
    node_type=SplitNode,
    doc="A weighted A/B or canary split: each request's texts go to one branch, deterministic per request id.",
    keys=(Key("branches", ListOf(BRANCH, 2), "the branches (2+)"),),
    build=_build,
    run=_run,
    describe=lambda node: "split",
    children=_children,
    with_children=_with_children,
)
