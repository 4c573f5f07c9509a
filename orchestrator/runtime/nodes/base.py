"""What every node kind shares: the node and item types, typed policy reading, and the
:class:`NodeKind` record that ties a kind's dataclass, validation and handler together.

A node receives a list of :class:`Item` (texts, or windows of texts) and returns an
:class:`Answer` per item it answers, keyed by ``Item.idx``. Handlers reach the rest of the
router only through the :class:`Engine` protocol below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

import numpy as np

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.heads import Head


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
        threshold: float64 [1] (one for every column) or [C] (one per label): the client's
            decision thresholds for the text, probabilities in [0, 1].
        params: the request's parameters (KServe v2 ``parameters``).
        request_id: Triton's request id (may be empty).
        tokens: tokenizer model name -> int64 [T] token ids of the whole text (or of the
            window), special tokens included; a tokenizer is missing until the text was
            tokenized with it (a window has only its chunk node's tokenizer).
    """

    idx: int
    req: int
    text: str
    threshold: np.ndarray
    params: Mapping[str, object]
    request_id: str
    tokens: Dict[str, np.ndarray] = field(default_factory=dict)

    def ids(self, tokenizer: str) -> np.ndarray:
        """The token ids of tokenizer model ``tokenizer`` (KeyError: not tokenized with it)."""
        return self.tokens[tokenizer]


@dataclass
class Answer:
    """A node's answer for one item.

    Attributes:
        probabilities: float64 [C]: the policy head's output columns
            (``heads.Head.probabilities``): [1] P(positive) for binary heads, [K] otherwise.
        route: the ``ROUTE`` value reported to the client.
        verdict: bool [C], a fixed verdict (a constant or a vote); None: the head's rule
            (``heads.Head.verdicts``) decides from the probabilities and the thresholds.
    """

    probabilities: np.ndarray
    route: str
    verdict: Optional[np.ndarray] = None


Answers = Dict[int, Answer]


class Engine(Protocol):
    """What a node handler may use of the engine (``orchestrator.runtime.engine.Engine``).

    Attributes:
        head: the policy's head (``heads.Head``): every answer has its columns.
    """

    head: Head

    async def run_node(self, node: Node, items: List[Item]) -> Answers:
        """Run a child node on ``items`` (raises DownstreamError)."""

    async def ensure_tokens(self, items: Sequence[Item], tokenizer: str) -> None:
        """Tokenize with tokenizer model ``tokenizer`` the items that have no ids of it yet."""

    async def classify(self, model: str, items: Sequence[Item], max_length: int, head: Head) -> np.ndarray:
        """Logits (float32 [len(items), head.num_logits]) of ``model``, inputs made by the
        head's tokenizer, truncated to ``max_length`` tokens, padded with its pad id."""

    def count(self, family: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to the counter ``family``."""

    def window(self, parent: Item, tokenizer: str, ids: np.ndarray) -> Item:
        """A new item for one window (token ids ``ids`` of ``tokenizer``) of ``parent``'s text."""

    def random(self) -> float:
        """A uniform draw in [0, 1)."""

    def mirror(self, node: Node, items: List[Item], answers: Answers) -> None:
        """Queue ``items`` (answered with ``answers``) for a shadow node's candidate."""

    def final_verdicts(self, answer: Answer, item: Item) -> np.ndarray:
        """The verdicts bool [C] the router reports for ``answer`` of ``item``."""


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

    def numbers_in(self, key: str, low: float, high: float) -> Tuple[List[float], bool]:
        """A required number in ``[low, high]``, or a non-empty list of them (one per label);
        returns ``(values, given_as_list)``."""
        raw = self.get(key, object, required=True)
        if not isinstance(raw, list):
            return [self.number_in(key, low, high, required=True)], False
        if not raw:
            raise PolicyError(f"{self.where}.{key}: expected a number or a non-empty list of numbers")
        names = tuple(f"{key}[{i}]" for i in range(len(raw)))
        probe = Reader(dict(zip(names, raw)), self.where, names)
        return [probe.number_in(k, low, high, required=True) for k in names], True

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


@dataclass(frozen=True)
class BindContext:
    """What checking a node against the repository needs (``policy.bind_heads``).

    Attributes:
        head: the policy's head: every answer has its columns.
        tokenizer: the tokenizer model whose tokens ``switch`` ``tokens`` conditions count.
    """

    head: Head
    tokenizer: str


def _binds_anything(node: Node, ctx: BindContext) -> None:
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
        bind: ``(node, BindContext) -> None``: checks the node against the policy's head
            once the repository's heads are known (``policy.bind_heads``); raises PolicyError.
    """

    name: str
    node_type: type
    keys: Tuple[str, ...]
    parse: Callable[[Reader, ParseContext, Dict[str, Any]], Node]
    run: Handler
    describe: Callable[[Any], str]
    children: Callable[[Any], List[Tuple[str, Node]]] = _no_children
    declines: Callable[[Any], bool] = _never_declines
    bind: Callable[[Any, BindContext], None] = _binds_anything


#: kind name -> its definition; filled by ``orchestrator.runtime.nodes`` (its ``KINDS``).
REGISTRY: Dict[str, NodeKind] = {}


def descendants(node: Node) -> List[Node]:
    """``node``'s descendants, depth first (``node`` itself not included)."""
    out: List[Node] = []
    for _, child in REGISTRY[node.kind].children(node):
        out.append(child)
        out.extend(descendants(child))
    return out


def may_decline(node: Node) -> bool:
    """True when ``node`` can leave texts unanswered (a switch without default or score,
    or a sequence of such steps)."""
    return REGISTRY[node.kind].declines(node)
