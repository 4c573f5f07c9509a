"""The policy's node kinds, one module each, found through one table: :data:`KINDS`.

Each module defines its kind once: the dataclass (fields and units in its docstring), its
validation (``parse``) and its handler (``run``), bundled in a ``KIND`` record
(:class:`~orchestrator.runtime.nodes.base.NodeKind`). The policy parser, the engine and the
text rendering look a kind up here, never by building method names.

| kind | module | does |
|---|---|---|
| ``model`` | ``model.py`` | classify with one model or one version of it (on demand, calibrated) |
| ``constant`` | ``constant.py`` | answer without a model |
| ``sequence`` | ``sequence.py`` | steps in order; a step may leave texts for the next |
| ``switch`` | ``switch.py`` | first matching case: empty, tokens, param, margin_below |
| ``cascade`` | ``cascade.py`` | later stages only for unsure texts |
| ``chunk`` | ``chunk.py`` | overlapping token windows, aggregated |
| ``split`` | ``split.py`` | weighted A/B or canary split per request id |
| ``parallel`` | ``parallel.py`` | fan out and combine: mean, max, vote |
| ``fallback`` | ``fallback.py`` | the next node answers when one fails |
| ``shadow`` | ``shadow.py`` | answer from one node, compare a candidate in the background |
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Tuple

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.nodes import cascade, chunk, constant, fallback, model, parallel, sequence, shadow, split, switch
from orchestrator.runtime.nodes.base import REGISTRY, Answer, Item, Node, NodeKind, ParseContext, Reader, may_decline

#: kind name -> its definition, in documentation order.
KINDS: Dict[str, NodeKind] = {
    k.name: k
    for k in (
        model.KIND, constant.KIND, sequence.KIND, switch.KIND, cascade.KIND, chunk.KIND, split.KIND, parallel.KIND,
        fallback.KIND, shadow.KIND,
    )
}
REGISTRY.update(KINDS)
#: Keys every node may have.
COMMON_KEYS = ("kind", "name", "timeout_ms")

__all__ = ["KINDS", "COMMON_KEYS", "Answer", "Item", "Node", "NodeKind", "parse_node", "children", "walk", "may_decline", "describe"]


def parse_node(data: Any, where: str, ctx: ParseContext, names: Dict[str, str]) -> Node:
    """Validate one node document at location ``where`` (``names``: node name -> location,
    filled in as nodes are parsed, for uniqueness).

    Raises:
        PolicyError: the first problem found, with its location.
    """
    if not isinstance(data, Mapping):
        raise PolicyError(f"{where}: expected a node (a mapping with 'kind'), got {type(data).__name__}")
    kind = KINDS.get(data.get("kind")) if isinstance(data.get("kind"), str) else None
    if kind is None:
        raise PolicyError(f"{where}.kind: {data.get('kind')!r} is not a node kind (expected one of: {', '.join(KINDS)})")
    r = Reader(data, where, COMMON_KEYS + kind.keys)
    name = r.get("name", str, where)
    if name in names:
        raise PolicyError(f"{where}.name: {name!r} is already used by {names[name]}")
    names[name] = where
    timeout = r.get("timeout_ms", float)
    if timeout is not None and timeout <= 0:
        raise PolicyError(f"{where}.timeout_ms: must be > 0, got {timeout}")
    return kind.parse(r, ctx, dict(kind=kind.name, name=name, timeout_ms=timeout))


def labelled_children(node: Node) -> List[Tuple[str, Node]]:
    """``[(label, child)]`` of ``node`` in rendering order."""
    return KINDS[node.kind].children(node)


def children(node: Node) -> List[Node]:
    """The direct child nodes of ``node`` (score first for a switch)."""
    return [c for _, c in labelled_children(node)]


def walk(node: Node) -> Iterator[Node]:
    """``node`` and its descendants, depth first."""
    yield node
    for child in children(node):
        yield from walk(child)


def describe(node: Node) -> str:
    """One line for ``node``: its kind's description and its timeout."""
    t = f" timeout={node.timeout_ms:g}ms" if node.timeout_ms else ""
    return KINDS[node.kind].describe(node) + t
