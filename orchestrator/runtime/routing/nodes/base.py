"""What every node kind shares: the node and item types, and the :class:`NodeKind` record
that ties a kind's dataclass, keys (``schema.Key``), build step, handler and needs together.

A node receives a list of :class:`Item` (texts, or windows of texts) and returns an
:class:`Answer` per item it answers, keyed by ``Item.idx``. Handlers reach the rest of the
router only through the :class:`Engine` protocol below. What a kind needs from the engine
and the policy (tokens of a tokenizer, windows, model calls, background work, children
that may decline) it declares in its ``NodeKind``; the engine and the policy read those
declarations and never test a kind's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple, TypeVar

from numpy.typing import NDArray

from orchestrator.runtime.request import RequestContext
from orchestrator.runtime.routing.heads import Head
from orchestrator.runtime.routing.schema import Key, Number, Str, Struct, check_required

T = TypeVar("T")


@dataclass(frozen=True)
class Node:
    """Fields every node has. Nodes are immutable: binding (``policy.bind_heads``) makes new
    ones, and what changes while the router serves lives with the engine (``Engine.state``).

    Attributes:
        kind: the node kind (a key of ``orchestrator.runtime.routing.nodes.KINDS``).
        name: unique in the policy; used in metrics, errors and routes (default: the node's
            path in the policy tree, e.g. ``root.steps[1]``).
        timeout_ms: milliseconds; the node fails (``DownstreamError``) when it takes longer.
            None: no limit.
        where: the node's location in the policy document (``root.steps[1]``), for errors
            found after parsing (``policy.bind_heads``).

    Raises:
        TypeError: (construction) a field whose default is ``schema.REQUIRED`` was not given.
        dataclasses.FrozenInstanceError: a field assigned.
    """

    kind: str
    name: str
    timeout_ms: Optional[float] = None
    where: str = ""

    def __post_init__(self) -> None:
        check_required(self)


#: Keys every node has (``kind`` is checked before them: it selects the others).
COMMON_KEYS: Tuple[Key, ...] = (
    Key("kind", Str(), "the node kind: one of the kinds below"),
    Key("name", Str(), "unique in the policy; used in metrics, errors and routes", computed="its path in the tree, e.g. `root.steps[1]`"),
    Key("timeout_ms", Number(above=0.0), "milliseconds; the node fails (a fallback may answer) when it takes longer"),
)

#: Separates a model's name from a pinned version in targets and default routes
#: (``classifier@1``); ``:`` already qualifies routes (``chunked:``, ``:degraded``).
VERSION_SEP = "@"


def target(model: str, version: Optional[int] = None) -> str:
    """The downstream call target of a model: ``model`` (Triton's choice of version: the
    highest ready one) or ``model@version`` (that version). Circuit breakers, metrics
    labels and errors use it, so two versions of one model are told apart."""
    return f"{model}{VERSION_SEP}{version}" if version is not None else model


def split_target(name: str) -> Tuple[str, Optional[int]]:
    """``(model, version or None)`` of a :func:`target` string."""
    model, sep, version = name.rpartition(VERSION_SEP)
    if sep and model and version.isdigit():
        return model, int(version)
    return name, None


@dataclass(frozen=True)
class ModelCall:
    """A downstream model a node calls itself (not through its children).

    Attributes:
        model: the model's name in the repository.
        version: the pinned version, or None (Triton's highest ready one).
        where: the location of the node that names it (errors say ``<where>.model``).
        on_demand: its on-demand settings (``nodes.model.OnDemand``), or None.
    """

    model: str
    version: Optional[int]
    where: str
    on_demand: Any = None

    @property
    def target(self) -> str:
        """The call target (see :func:`target`)."""
        return target(self.model, self.version)


@dataclass(frozen=True)
class Windows:
    """A node splits texts into windows of one tokenizer's tokens.

    Attributes:
        tokenizer: the tokenizer model whose tokens are windowed.
        count: ``tokens -> windows`` a text of that many tokens becomes.
    """

    tokenizer: str
    count: Callable[[int], int]


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
        context: the request's trace, deadline and cancellation
            (``request.RequestContext``; shared by all items of one request, windows too).
    """

    idx: int
    req: int
    text: str
    threshold: NDArray[Any]
    params: Mapping[str, object]
    request_id: str
    tokens: Dict[str, NDArray[Any]] = field(default_factory=dict)
    context: RequestContext = field(default_factory=RequestContext)


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

    probabilities: NDArray[Any]
    route: str
    verdict: Optional[NDArray[Any]] = None


Answers = Dict[int, Answer]


class ModelCallView(Protocol):
    """What a node handler may use of the engine's model calls (``engine.calls``,
    ``orchestrator.runtime.execution.engine.ModelCalls``)."""

    async def ensure_tokens(self, items: Sequence[Item], tokenizer: str) -> None:
        """Tokenize with tokenizer model ``tokenizer`` the items that have no ids of it yet."""

    async def classify(self, model: str, items: Sequence[Item], max_length: int, head: Head) -> NDArray[Any]:
        """Logits (float32 [len(items), head.num_logits]) of ``model``, inputs made by the
        head's tokenizer, truncated to ``max_length`` tokens, padded with its pad id."""


class DeadlineView(Protocol):
    """What a node handler may use of cancellation and deadlines (``engine.deadlines``,
    ``orchestrator.runtime.request.Deadlines``; docs/guides/reliability.md): a node that runs a
    further stage or round for some items asks ``live`` (once per stage) and ``affordable``
    first. Nodes never read a request's context flags themselves."""

    def now(self) -> float:
        """The engine clock, seconds (deadlines are on it)."""

    def affordable(self, node: Node, items: Sequence[Item]) -> Tuple[List[Item], List[Item]]:
        """``(go, short)``: items whose request can wait for ``node`` (no deadline, or the
        estimate strictly below the time left), and the others."""

    def late(self, items: Sequence[Item]) -> List[Item]:
        """Items whose request deadline has passed (now >= deadline)."""

    def in_time(self, items: Sequence[Item]) -> List[Item]:
        """Items whose request got no downstream answer after its deadline."""

    def live(self, items: Sequence[Item]) -> List[Item]:
        """Items whose request is not cancelled (asks ``is_cancelled()`` at most once per
        request per call, never before the request's first downstream call)."""

    def keep_for_deadline(self, node: Node, items: Sequence[Item], answers: Answers) -> None:
        """``answers`` of ``items`` (an earlier stage's, in time) stay: ROUTE + ``:deadline``,
        their requests count as answered in time; counted for ``node``."""


class Engine(Protocol):
    """What a node handler may use of the engine: the run of one execute
    (``orchestrator.runtime.execution.engine.Run``, made by ``Engine.start``).

    Attributes:
        head: the policy's head (``heads.Head``): every answer has its columns.
        calls: tokenization and classification (:class:`ModelCallView`).
        deadlines: cancellation and deadlines (:class:`DeadlineView`).
    """

    head: Head

    @property
    def calls(self) -> ModelCallView:
        """Tokenization and classification."""

    @property
    def deadlines(self) -> DeadlineView:
        """Cancellation and deadlines."""

    async def run_node(self, node: Node, items: List[Item]) -> Answers:
        """Run a child node on ``items`` (raises DownstreamError)."""

    def gather(self, coros: Iterable[Awaitable[T]], settle: bool = False) -> Awaitable[List[Any]]:
        """To await: ``coros`` side by side (``asyncio.gather``; their downstream calls must not
        block the event loop); ``settle``: a failure is returned in its place instead of
        raised (``return_exceptions``)."""

    def count(self, family: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to the counter ``family``."""

    def gauge(self, family: str, value: float, **labels: str) -> None:
        """Set the gauge ``family`` to ``value``."""

    def window(self, parent: Item, tokenizer: str, ids: NDArray[Any]) -> Item:
        """A new item for one window (token ids ``ids`` of ``tokenizer``) of ``parent``'s text."""

    def random(self) -> float:
        """A uniform draw in [0, 1)."""

    def mirror(self, node: Node, items: List[Item], answers: Answers) -> None:
        """Queue ``items`` (answered with ``answers``) for a shadow node's candidate."""

    def final_verdicts(self, answer: Answer, item: Item) -> NDArray[Any]:
        """The verdicts bool [C] the router reports for ``answer`` of ``item``."""

    def state(self, node: Node, make: Callable[[], T]) -> T:
        """The state of ``node`` that lasts from one execute to the next (a cascade's
        escalation budget), made by ``make`` on first use; held by the engine, keyed by the
        node's name, and shared by all its runs (warmup, the shadow worker)."""


@dataclass
class ParseContext:
    """What parsing one node needs beyond its own mapping.

    Attributes:
        max_sequence_length: the policy's default token limit (tokens).
        request_parameters: request parameter name -> the values clients may send.
        parse_node: parses a child node document at a location (the policy parser's own).
        defaults: kind name -> keys every node of that kind gets unless it sets them
            (the policy's ``defaults``, already validated).
    """

    max_sequence_length: int
    request_parameters: Mapping[str, Tuple[str, ...]]
    parse_node: Callable[[Any, str], Node]
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


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
        heads: model name -> its head, for every model the policy calls.
    """

    head: Head
    tokenizer: str
    heads: Mapping[str, Head] = field(default_factory=dict)


def _binds_nothing(node: Node, ctx: BindContext) -> Node:
    return node


def _has_no_children(node: Node, children: Sequence[Node]) -> Node:
    if children:
        raise TypeError(f"{node.kind}: it declares children but no with_children to rebuild it with them")
    return node


def _no_tokens(node: Node) -> Tuple[str, ...]:
    return ()


def _reads_nothing(node: Node) -> Tuple[Node, ...]:
    return ()


def _no_windows(node: Node) -> Optional[Windows]:
    return None


def _no_calls(node: Node) -> Tuple[ModelCall, ...]:
    return ()


@dataclass(frozen=True)
class NodeKind:
    """One node kind, defined once: its keys, build step, handler and what it needs.

    Attributes:
        name: the ``kind`` value in a policy.
        node_type: its dataclass; a field's default is its key's default
            (``schema.REQUIRED``: the key is required).
        doc: one line for the docs (``docs/reference/policy.md``, the JSON Schema).
        keys: its keys besides ``kind``, ``name`` and ``timeout_ms`` (``schema.Key``: type,
            bounds, meaning), in reading order.
        build: ``(values, context, common) -> node``: ``values`` are the keys read and
            validated (defaults filled in; None for an absent key without one), ``common``
            the :class:`Node` fields; checks what spans keys and computes ``computed``
            defaults; raises PolicyError with the location (``common["where"]``).
        run: ``async (engine, node, items) -> answers``: the handler.
        describe: one line for ``orchestrator policy check`` (without name and timeout).
        children: ``node -> [(label, child)]`` in rendering order (label may be "").
        with_children: ``(node, children) -> node``: a copy of ``node`` whose children are
            ``children`` (one per entry of ``children(node)``, in its order); every kind
            with children declares it (``policy.bind_heads`` rebuilds the tree with it).
        declines: True when the node can leave texts unanswered.
        bind: ``(node, BindContext) -> node``: checks the node against the policy's head
            once the repository's heads are known and returns it with what binding sets
            (a copy, ``dataclasses.replace``; the node itself when nothing is set); its
            children are already bound (``policy.bind_heads``); raises PolicyError.
        tokens: ``node -> tokenizer models`` whose ids the node reads; the engine tokenizes
            every text with them once per ``execute`` ("": the policy's ``tokenizer``).
        windows: ``node -> Windows or None``: the node splits texts into windows (the
            engine refuses texts over ``limits.max_windows_per_text`` before running).
        calls: ``node -> (ModelCall, ...)``: models the node calls itself (the policy's
            ``models()``, ``on_demand()`` and heads come from these).
        background: the node hands work to the engine's background queue
            (``Run.mirror``); the engine starts one only for policies that have such a node.
        accepts_declining: its children may leave texts unanswered (a ``sequence`` passes
            them to its next step); elsewhere such a child is refused.
        reads_only: ``node -> (child, ...)``: children whose answers the node only reads
            (to route) and never returns; such a child that is one ``model`` node may have
            another head than the policy's (``policy.bind_heads``).
        removed: ``(key, message)`` of keys the kind no longer has: a policy holding one is
            refused with the message (what replaces it).
        spec: (derived) the kind's mapping: common keys and ``keys``, defaults resolved.
    """

    name: str
    node_type: type
    doc: str
    keys: Tuple[Key, ...]
    build: Callable[[Dict[str, Any], ParseContext, Dict[str, Any]], Node]
    run: Handler
    describe: Callable[[Any], str]
    children: Callable[[Any], List[Tuple[str, Node]]] = _no_children
    with_children: Callable[[Any, Sequence[Node]], Node] = _has_no_children
    declines: Callable[[Any], bool] = _never_declines
    bind: Callable[[Any, BindContext], Node] = _binds_nothing
    tokens: Callable[[Any], Tuple[str, ...]] = _no_tokens
    windows: Callable[[Any], Optional[Windows]] = _no_windows
    calls: Callable[[Any], Tuple[ModelCall, ...]] = _no_calls
    reads_only: Callable[[Any], Tuple[Node, ...]] = _reads_nothing
    background: bool = False
    accepts_declining: bool = False
    removed: Tuple[Tuple[str, str], ...] = ()
    spec: Struct = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", Struct(self.name, COMMON_KEYS + tuple(self.keys), target=self.node_type, doc=self.doc,
                                                removed=dict(self.removed)))


#: kind name -> its definition; filled by ``orchestrator.runtime.routing.nodes`` (its ``KINDS``).
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
