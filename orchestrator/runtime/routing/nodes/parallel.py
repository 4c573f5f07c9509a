"""``parallel``: fan out to several nodes concurrently and combine their answers."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from orchestrator.runtime.errors import DownstreamError, PolicyError, UnavailableError
from orchestrator.runtime.routing.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.routing.schema import REQUIRED, Choice, Int, Key, Nodes

COMBINES = ("mean", "max", "vote")
#: Counter of texts a quorum parallel answered without every branch, label ``node``.
PARTIAL_METRIC = "orchestrator_parallel_partial_total"


@dataclass(frozen=True)
class ParallelNode(Node):
    """All ``nodes`` run concurrently on every text; ``combine`` joins their answers column
    by column (``heads.Head.combine``): ``mean`` or ``max`` of the probabilities, or
    ``vote``: per column the share of nodes whose verdict is true there (the head's rule:
    binary, probability >= threshold; multiclass, the node's top label; multilabel, per
    label), a verdict of true where more than half of the nodes vote for it (a tie is false).

    Without ``quorum`` a failing node fails the parallel node. With ``quorum: k`` (KServe
    InferenceGraph's soft dependencies) the node waits for every branch to answer or fail
    (a slow one is bounded by its ``timeout_ms``) and answers when at least ``k`` answered,
    combining only those (a vote's share is over them); its ``ROUTE`` lists the branches
    that answered and ends ``:answered=<m>/<n>`` when one failed.
    Keys: :data:`KIND` ``.keys`` (docs/reference/policy.md).
    """

    nodes: Tuple[Node, ...] = REQUIRED
    combine: str = "mean"
    quorum: Optional[int] = None


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> ParallelNode:
    quorum, n = values["quorum"], len(values["nodes"])
    if quorum is not None and quorum > n:
        raise PolicyError(f"{common['where']}.quorum: {quorum} is more than the node's {n} nodes")
    return ParallelNode(**common, nodes=tuple(values["nodes"]), combine=values["combine"], quorum=quorum)


async def _branches(engine: Engine, node: ParallelNode, items: List[Item]) -> List[Answers]:
    """The answers of the branches that answered (all of them without a quorum).

    Raises:
        DownstreamError: without quorum, the first failure; with one, fewer than ``quorum``
            branches answered (UnavailableError when every failure was one).
    """
    if node.quorum is None:
        return await engine.gather(engine.run_node(n, items) for n in node.nodes)
    settled: List[Union[Answers, BaseException]] = await engine.gather((engine.run_node(n, items) for n in node.nodes), settle=True)
    for r in settled:  # only a branch's failure is tolerated; anything else is a bug
        if isinstance(r, BaseException) and not isinstance(r, DownstreamError):
            raise r
    answered = [r for r in settled if not isinstance(r, BaseException)]
    errors = [r for r in settled if isinstance(r, DownstreamError)]
    if len(answered) >= node.quorum:
        return answered
    message = (f"parallel '{node.name}': {len(answered)} of {len(node.nodes)} nodes answered, quorum {node.quorum}: "
               + "; ".join(map(str, errors)))
    unavailable = [e for e in errors if isinstance(e, UnavailableError)]
    if len(unavailable) == len(errors):
        raise UnavailableError(message, unavailable[-1].cause)
    raise DownstreamError(message)


async def _run(engine: Engine, node: ParallelNode, items: List[Item]) -> Answers:
    results = await _branches(engine, node, items)
    partial = len(results) < len(node.nodes)
    answers: Answers = {}
    for it in items:
        parts = [r[it.idx] for r in results]
        route = f"parallel:{node.combine}(" + ",".join(a.route for a in parts) + ")"
        if partial:
            route += f":answered={len(parts)}/{len(node.nodes)}"
        if node.combine == "vote":
            share = np.mean([engine.final_verdicts(a, it) for a in parts], axis=0)
            answers[it.idx] = Answer(share, route, share > 0.5)
        else:
            answers[it.idx] = Answer(engine.head.combine([a.probabilities for a in parts], node.combine), route)
    if partial:
        engine.count(PARTIAL_METRIC, len(items), node=node.name)
    return answers


def _children(node: ParallelNode) -> List[Tuple[str, Node]]:
    return [("", n) for n in node.nodes]


def _describe(node: ParallelNode) -> str:
    quorum = f" quorum={node.quorum}/{len(node.nodes)}" if node.quorum is not None else ""
    return f"parallel combine={node.combine}{quorum}"


KIND = NodeKind(
    name="parallel",
    node_type=ParallelNode,
    doc="Fan out to every node concurrently and combine their answers column by column; with `quorum`, answer "
        "when enough of them did.",
    keys=(
        Key("nodes", Nodes(2), "the nodes; each answers every text"),
        Key("combine", Choice(COMBINES), "`mean` or `max` of the probabilities, or `vote`: the share of nodes whose "
            "verdict is true, true where more than half vote for it"),
        Key("quorum", Int(1, 1 << 10), "answer when at least this many nodes answered (at most the number of nodes), "
            "combining those; a failing node is left out, and the ROUTE lists the nodes that answered and ends "
            "`:answered=<m>/<n>` (absent: a failing node fails the parallel node)"),
    ),
    build=_build,
    run=_run,
    describe=_describe,
    children=_children,
    with_children=lambda node, children: replace(node, nodes=tuple(children)),
)
