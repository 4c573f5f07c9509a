"""``shadow``: answer from one node, mirror a sample of the texts to a candidate node."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Tuple

from orchestrator.runtime.routing.nodes.base import Answers, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.routing.nodes.split import split_fraction
from orchestrator.runtime.routing.schema import REQUIRED, Int, Key, NodeRef, Number


@dataclass(frozen=True)
class ShadowNode(Node):
    """Every text is answered by ``primary``; the texts of a sampled fraction of the
    requests also go to ``candidate`` in the background, and the two answers are
    compared in metrics (``orchestrator.runtime.execution.mirror``): the live twin of
    ``orchestrator parity``, e.g. to promote ``classifier_fp16`` or version 2 of a model.

    The candidate never changes an answer and never delays one: its texts wait in a
    bounded queue of the router instance and run in a background thread, one batch at a
    time, with their own circuit breakers; when ``queue_size`` texts already wait or
    run, the batch is dropped and counted (``orchestrator_shadow_dropped_total``). Its
    errors and timeouts are counted (``orchestrator_shadow_errors_total``), never
    raised. Give the candidate a ``timeout_ms`` so a hung model cannot hold the queue.
    Keys: :data:`KIND` ``.keys`` (docs/reference/policy.md); the sample is chosen per request like
    ``split``'s branch (:func:`~orchestrator.runtime.routing.nodes.split.split_fraction` of this
    node's name, random for requests without an id).

    Attributes:
        sample: the fraction of requests mirrored, in [0, 1].
        queue_size: texts queued or running for the candidate, per router instance.
    """

    primary: Node = REQUIRED
    candidate: Node = REQUIRED
    sample: float = 1.0
    queue_size: int = 256


def mirrored(engine: Engine, node: ShadowNode, items: List[Item]) -> List[Item]:
    """The items whose request is in the sample (one draw per request)."""
    if node.sample <= 0.0:
        return []
    chosen: Dict[int, bool] = {}
    for it in items:
        if it.req not in chosen:
            x = split_fraction(node.name, it.request_id) if it.request_id else engine.random()
            chosen[it.req] = x < node.sample
    return [it for it in items if chosen[it.req]]


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> ShadowNode:
    return ShadowNode(**common, **values)


async def _run(engine: Engine, node: ShadowNode, items: List[Item]) -> Answers:
    answers = await engine.run_node(node.primary, items)
    sample = [it for it in mirrored(engine, node, items) if it.idx in answers]
    if sample:
        engine.mirror(node, sample, answers)
    return answers


def _children(node: ShadowNode) -> List[Tuple[str, Node]]:
    return [("answer: ", node.primary), ("mirror: ", node.candidate)]


KIND = NodeKind(
    name="shadow",
    node_type=ShadowNode,
    doc="Answer from `primary`; run `candidate` on a sample of the requests in the background and compare in metrics.",
    keys=(
        Key("primary", NodeRef(), "answers every text"),
        Key("candidate", NodeRef(), "compared with the primary in the background; never changes or delays an answer"),
        Key("sample", Number(0.0, 1.0), "the fraction of requests mirrored, deterministic per request id"),
        Key("queue_size", Int(1, 1 << 20), "texts queued or running for the candidate per router instance; a batch "
            "that does not fit is dropped and counted"),
    ),
    build=_build,
    run=_run,
    describe=lambda node: f"shadow sample={node.sample:g} queue_size={node.queue_size}",
    children=_children,
    with_children=lambda node, children: replace(node, primary=children[0], candidate=children[1]),
    declines=lambda node: False,
    background=True,
)
