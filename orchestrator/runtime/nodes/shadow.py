"""``shadow``: answer from one node, mirror a sample of the texts to a candidate node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from orchestrator.runtime.nodes.base import Answers, Engine, Item, Node, NodeKind, ParseContext, Reader
from orchestrator.runtime.nodes.split import split_fraction


@dataclass
class ShadowNode(Node):
    """Every text is answered by ``primary``; the texts of a sampled fraction of the
    requests also go to ``candidate`` in the background, and the two answers are
    compared in metrics (``orchestrator.runtime.mirror``): the live twin of
    ``orchestrator parity``, e.g. to promote ``classifier_fp16`` or version 2 of a model.

    The candidate never changes an answer and never delays one: its texts wait in a
    bounded queue of the router instance and run in a background thread, one batch at a
    time, with their own circuit breakers; when ``queue_size`` texts already wait or
    run, the batch is dropped and counted (``orchestrator_shadow_dropped_total``). Its
    errors and timeouts are counted (``orchestrator_shadow_errors_total``), never
    raised. Give the candidate a ``timeout_ms`` so a hung model cannot hold the queue.

    Policy keys: ``primary`` (node, required: it answers), ``candidate`` (node,
    required: it is compared), ``sample`` (the fraction of requests mirrored, in [0, 1];
    default 1; chosen per request like ``split``: deterministic per request id,
    :func:`~orchestrator.runtime.nodes.split.split_fraction` of this node's name,
    random for requests without an id), ``queue_size`` (texts, 1 .. 1048576, default
    256: queued or running candidate texts of this node per router instance).
    """

    primary: Optional[Node] = None
    candidate: Optional[Node] = None
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


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> ShadowNode:
    primary = ctx.parse_node(r.get("primary", dict, required=True), f"{r.where}.primary")
    candidate = ctx.parse_node(r.get("candidate", dict, required=True), f"{r.where}.candidate")
    return ShadowNode(
        **common,
        primary=primary,
        candidate=candidate,
        sample=r.number_in("sample", 0.0, 1.0, 1.0),
        queue_size=r.number_in("queue_size", 1, 1 << 20, 256, kind=int),
    )


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
    keys=("primary", "candidate", "sample", "queue_size"),
    parse=_parse,
    run=_run,
    describe=lambda node: f"shadow sample={node.sample:g} queue_size={node.queue_size}",
    children=_children,
    declines=lambda node: False,
)
