"""The policy's node kinds, one module each, found through one table: :data:`KINDS`.

Each module defines its kind once: the dataclass (its field defaults are the keys'
defaults), its keys (``orchestrator.runtime.routing.schema.Key``: type, bounds, meaning), its build
step, its handler (``run``) and what it needs from the engine (tokens, windows, model
calls, background work), bundled in a ``KIND`` record
(:class:`~orchestrator.runtime.routing.nodes.base.NodeKind`). The policy parser, the JSON Schema,
``docs/reference/policy.md``, the engine and the text rendering look a kind up here, never by its name.

| kind | module | does |
|---|---|---|
| ``model`` | ``model.py`` | classify with one model or one version of it (on demand, calibrated) |
| ``constant`` | ``constant.py`` | answer without a model |
| ``sequence`` | ``sequence.py`` | steps in order; a step may leave texts for the next |
| ``switch`` | ``switch.py`` | first matching case: empty, tokens, param, a score's margin, label or band |
| ``cascade`` | ``cascade.py`` | later stages only for unsure texts, within an escalation budget |
| ``chunk`` | ``chunk.py`` | overlapping token windows, aggregated |
| ``split`` | ``split.py`` | weighted A/B or canary split per request id |
| ``parallel`` | ``parallel.py`` | fan out and combine: mean, max, vote; a quorum of answers |
| ``fallback`` | ``fallback.py`` | the next node answers when one fails |
| ``shadow`` | ``shadow.py`` | answer from one node, compare a candidate in the background |
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Tuple

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.nodes import cascade, chunk, constant, fallback, model, parallel, sequence, shadow, split, switch
from orchestrator.runtime.routing.nodes.base import (
    COMMON_KEYS,
    REGISTRY,
    Answer,
    BindContext,
    Item,
    ModelCall,
    Node,
    NodeKind,
    ParseContext,
    Windows,
    may_decline,
)
from orchestrator.runtime.routing.schema import Key, Struct, Type

#: kind name -> its definition, in documentation order (the same dict as ``base.REGISTRY``;
#: a new kind is its module plus one entry here).
KINDS: Dict[str, NodeKind] = REGISTRY
KINDS.update(
    (k.name, k)
    for k in (
        model.KIND, constant.KIND, sequence.KIND, switch.KIND, cascade.KIND, chunk.KIND, split.KIND, parallel.KIND,
        fallback.KIND, shadow.KIND,
    )
)

__all__ = [
    "KINDS", "COMMON_KEYS", "Answer", "Item", "ModelCall", "Node", "NodeKind", "Windows", "parse_node", "children", "walk",
    "bind_tree", "may_decline", "describe", "KindDefaults", "defaultable",
]


def defaultable(kind: NodeKind) -> List[Key]:
    """The keys of ``kind`` the policy's ``defaults`` may set: optional, without nodes,
    not ``kind`` or ``name``."""
    return [k for k in kind.spec.keys if not k.required and not k.type.has_nodes and k.name not in ("kind", "name")]


class KindDefaults(Type):
    """The policy's ``defaults``: kind name -> keys every node of that kind gets unless it
    sets them itself (``defaults: {chunk: {window: 128, stride: 96}}``). Each value is
    checked at its own location (``policy.defaults.chunk.stride``) and read again, with
    the node's own keys, at every node it reaches; read as ``{kind: {key: value}}``."""

    def _structs(self) -> Dict[str, Struct]:
        return {name: Struct(f"defaults.{name}", defaultable(kind)) for name, kind in KINDS.items()}

    def read(self, value: Any, where: str, ctx: Any) -> Dict[str, Dict[str, Any]]:
        """The given keys per kind, each value checked (raises PolicyError)."""
        structs = self._structs()
        outer = Struct("defaults", [Key(name, s, "") for name, s in structs.items()])
        outer.check(value, where)
        out: Dict[str, Dict[str, Any]] = {}
        for name, given in value.items():
            inner = structs[name]
            inner.check(given, f"{where}.{name}")
            for key, v in given.items():
                inner.key(key).type.read(v, f"{where}.{name}.{key}", ctx)
            out[name] = dict(given)
        return out

    def json(self) -> Dict[str, Any]:
        """Per kind, its default-able keys, none required."""
        props = {}
        for name, s in self._structs().items():
            props[name] = s.json()
            for p in props[name]["properties"].values():
                p.pop("default", None)  # a default of the defaults would read as a value given
        return {"type": "object", "additionalProperties": False, "properties": props}

    def text(self) -> str:
        """In words."""
        return "mapping: kind -> {key: value}"


def parse_node(data: Any, where: str, ctx: ParseContext, names: Dict[str, str]) -> Node:
    """Validate one node document at location ``where`` (``names``: node name -> location,
    filled in as nodes are parsed, for uniqueness); keys it does not set come from
    ``ctx.defaults`` of its kind, then from the kind's defaults.

    Raises:
        PolicyError: the first problem found, with its location.
    """
    if not isinstance(data, Mapping):
        raise PolicyError(f"{where}: expected a node (a mapping with 'kind'), got {type(data).__name__}")
    name = data.get("kind")
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise PolicyError(f"{where}.kind: {data.get('kind')!r} is not a node kind (expected one of: {', '.join(KINDS)})")
    spec = kind.spec
    spec.check(data, where)
    data = {**ctx.defaults.get(kind.name, {}), **data}
    name = spec.read_key(spec.key("name"), data, where, ctx) or where
    if name in names:
        raise PolicyError(f"{where}.name: {name!r} is already used by {names[name]}")
    names[name] = where
    timeout = spec.read_key(spec.key("timeout_ms"), data, where, ctx)
    values = {k.name: spec.read_key(k, data, where, ctx) for k in spec.keys if k.name not in ("kind", "name", "timeout_ms")}
    return kind.build(values, ctx, dict(kind=kind.name, name=name, timeout_ms=timeout, where=where))


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


def bind_tree(node: Node, ctx: BindContext) -> Node:
    """``node``'s tree bound: a new tree in which every node is its kind's ``bind`` of the
    node rebuilt with its bound children (``NodeKind.with_children``); ``node`` and its
    descendants are left as they are (a kind's bind may return a node unchanged, shared).
    Nodes are bound in the reverse of :func:`walk`'s order (the last child first, a node
    after its children), so of several problems the same one is reported first whatever
    the kinds.

    Raises:
        PolicyError: the first problem found, with its location.
        TypeError: a kind's ``with_children`` did not place the children it was given.
    """
    kind = KINDS[node.kind]
    given = children(node)
    if given:
        bound = [bind_tree(c, ctx) for c in reversed(given)][::-1]
        node = kind.with_children(node, bound)
        if [id(c) for c in children(node)] != [id(c) for c in bound]:
            raise TypeError(f"{kind.name}: with_children did not place the children it was given")
    return kind.bind(node, ctx)


def describe(node: Node) -> str:
    """One line for ``node``: its kind's description and its timeout."""
    t = f" timeout={node.timeout_ms:g}ms" if node.timeout_ms else ""
    return KINDS[node.kind].describe(node) + t
