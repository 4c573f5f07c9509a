"""What every node kind shares: the node and item types, typed policy reading, and the
:class:`NodeKind` record that ties a kind's dataclass, validation and handler together.

A node receives a list of :class:`Item` (texts, or windows of texts) and returns an
:class:`Answer` per item it answers, keyed by ``Item.idx``. Handlers reach the rest of the
router only through the :class:`Engine` protocol below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

import numpy as np

from orchestrator.runtime.errors import PolicyError


@dataclass
class Node:
    """Fields every node has.

    Attributes:
        kind: the node kind (a key of ``orchestrator.runtime.nodes.KINDS``).
        name: unique in the policy; used in metrics, errors and routes (default: the node's
            path in the policy tree, e.g. ``root.steps[1]``).
        timeout_ms: milliseconds; the node fails (``DownstreamError``) when it takes longer.
            None: no limit.
    """

    kind: str
    name: str
    timeout_ms: Optional[float] = None


@dataclass
class Item:
    """One text, or one window of a text, travelling through the policy.

    Attributes:
        idx: key of this item's answer; texts count from 0, windows get negative keys.
        req: index of the request (within one ``execute`` call) the text came from.
        text: the whole text (a window keeps its text's).
        threshold: the client's decision threshold for the text, a probability in [0, 1].
        params: the request's parameters (KServe v2 ``parameters``).
        request_id: Triton's request id (may be empty).
        ids: int64 [T] token ids of the whole text (or of the window), special tokens
            included; None until tokenized.
    """

    idx: int
    req: int
    text: str
    threshold: float
    params: Mapping[str, object]
    request_id: str
    ids: Optional[np.ndarray] = None


@dataclass
class Answer:
    """A node's answer for one item.

    Attributes:
        probability: probability of the positive class, in [0, 1].
        logit: the score that postprocess turns into PROBABILITIES/VERDICTS (None only
            when ``verdict`` is set).
        route: the ``ROUTE`` value reported to the client.
        verdict: a fixed verdict (a constant or a vote); None: probability >= threshold.
    """

    probability: float
    logit: Optional[float]
    route: str
    verdict: Optional[bool] = None


Answers = Dict[int, Answer]


class Engine(Protocol):
    """What a node handler may use of the engine (``orchestrator.runtime.engine.Engine``)."""

    async def run_node(self, node: Node, items: List[Item]) -> Answers:
        """Run a child node on ``items`` (raises DownstreamError)."""

    async def ensure_tokens(self, items: Sequence[Item]) -> None:
        """Tokenize the items that have no ``ids`` yet."""

    async def classify(self, model: str, items: Sequence[Item], max_length: int) -> np.ndarray:
        """Logits (float32 [len(items)]) of ``model``, inputs truncated to ``max_length`` tokens."""

    def count(self, family: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to the counter ``family``."""

    def window(self, parent: Item, ids: np.ndarray) -> Item:
        """A new item for one window (token ids ``ids``) of ``parent``'s text."""

    def random(self) -> float:
        """A uniform draw in [0, 1)."""

    def mirror(self, node: Node, items: List[Item], answers: Answers) -> None:
        """Queue ``items`` (answered with ``answers``) for a shadow node's candidate."""


# ----------------------------------------------------------------------------- policy reading


class Reader:
    """Typed access to one mapping of a policy document, with its location for errors.

    Raises:
        PolicyError: ``data`` is not a mapping, or has a key outside ``allowed``.
    """

    def __init__(self, data: Any, where: str, allowed: Tuple[str, ...]):
        if not isinstance(data, Mapping):
            raise PolicyError(f"{where}: expected a mapping, got {type(data).__name__}")
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise PolicyError(f"{where}.{unknown[0]}: unknown key (expected one of: {', '.join(allowed)})")
        self.data, self.where = data, where

    def get(self, key: str, kind: type, default: Any = None, required: bool = False) -> Any:
        """The value of ``key`` checked to be a ``kind`` (float: finite number; str: non-empty).

        Raises:
            PolicyError: the key is missing and required, or its value has the wrong type.
        """
        if key not in self.data:
            if required:
                raise PolicyError(f"{self.where}.{key}: required key is missing")
            return default
        return _typed(self.data[key], kind, f"{self.where}.{key}")

    def number_in(self, key: str, low: float, high: float, default: Any = None, required: bool = False, kind: type = float) -> Any:
        """Like :meth:`get` for a number that must lie in ``[low, high]``."""
        value = self.get(key, kind, default, required)
        if value is not None and not (low <= value <= high):
            raise PolicyError(f"{self.where}.{key}: {value!r} is outside [{low}, {high}]")
        return value

    def list_of(self, key: str, minimum: int) -> List[Any]:
        """A required list of at least ``minimum`` entries."""
        items = self.get(key, list, required=True)
        if len(items) < minimum:
            raise PolicyError(f"{self.where}.{key}: needs at least {minimum} entries, got {len(items)}")
        return items

    def choice(self, key: str, options: Tuple[str, ...], default: str) -> str:
        """A string that must be one of ``options``."""
        value = self.get(key, str, default)
        if value not in options:
            raise PolicyError(f"{self.where}.{key}: {value!r}, expected one of {', '.join(options)}")
        return value


def _typed(value: Any, kind: type, where: str) -> Any:
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise PolicyError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError(f"{where}: expected an integer, got {value!r}")
        return value
    if kind is bool and not isinstance(value, bool):
        raise PolicyError(f"{where}: expected true or false, got {value!r}")
    if kind is str and (not isinstance(value, str) or not value):
        raise PolicyError(f"{where}: expected a non-empty string, got {value!r}")
    if kind is list and not isinstance(value, list):
        raise PolicyError(f"{where}: expected a list, got {type(value).__name__}")
    return value


@dataclass
class ParseContext:
    """What parsing one node needs beyond its own mapping.

    Attributes:
        max_sequence_length: the policy's default token limit (tokens).
        request_parameters: request parameter name -> the values clients may send.
        parse_node: parses a child node document at a location (the policy parser's own).
    """

    max_sequence_length: int
    request_parameters: Mapping[str, Tuple[str, ...]]
    parse_node: Callable[[Any, str], Node]

    def nodes(self, r: Reader, key: str, minimum: int) -> List[Node]:
        """Parse the list of child nodes under ``key`` (at least ``minimum``)."""
        return [self.parse_node(n, f"{r.where}.{key}[{i}]") for i, n in enumerate(r.list_of(key, minimum))]


# ----------------------------------------------------------------------------- the kind record

Handler = Callable[[Engine, Any, List[Item]], Awaitable[Answers]]


def _no_children(node: Node) -> List[Tuple[str, Node]]:
    return []


def _never_declines(node: Node) -> bool:
    return False


def _binds_anything(node: Node, head: Any) -> None:
    return None


@dataclass(frozen=True)
class NodeKind:
    """One node kind, defined once.

    Attributes:
        name: the ``kind`` value in a policy.
        node_type: its dataclass (fields and units in its docstring).
        keys: the keys its mapping may have besides ``kind``, ``name`` and ``timeout_ms``.
        parse: ``(reader, context, common) -> node``: validation; ``common`` holds the
            :class:`Node` fields; raises PolicyError with the location.
        run: ``async (engine, node, items) -> answers``: the handler.
        describe: one line for ``orchestrator policy check`` (without name and timeout).
        children: ``node -> [(label, child)]`` in rendering order (label may be "").
        declines: True when the node can leave texts unanswered.
        bind: ``(node, head) -> None``: checks the node against the policy's head once the
            repository's heads are known (``policy.bind_heads``); raises PolicyError.
    """

    name: str
    node_type: type
    keys: Tuple[str, ...]
    parse: Callable[[Reader, ParseContext, Dict[str, Any]], Node]
    run: Handler
    describe: Callable[[Any], str]
    children: Callable[[Any], List[Tuple[str, Node]]] = _no_children
    declines: Callable[[Any], bool] = _never_declines
    bind: Callable[[Any, Any], None] = _binds_anything


#: kind name -> its definition; filled by ``orchestrator.runtime.nodes`` (its ``KINDS``).
REGISTRY: Dict[str, NodeKind] = {}


def may_decline(node: Node) -> bool:
    """True when ``node`` can leave texts unanswered (a switch without default or score,
    or a sequence of such steps)."""
    return REGISTRY[node.kind].declines(node)
