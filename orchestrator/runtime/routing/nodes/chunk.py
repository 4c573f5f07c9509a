"""``chunk``: a loop over overlapping token windows of long texts.

Windows are classified in rounds (:func:`classify_rounds`): each round sends the next
windows of every text still open, all of them in one call of the inner node, so batching
across texts is kept. Without a stopping key every window is sent in one round, as before
the rounds existed. With one (``stop_when_decided``, ``stop_margin``, ``max_windows``) a
text leaves the loop as soon as its answer is settled and its other windows are never
classified; its answer aggregates the windows it used, and ``ROUTE`` says how many. A round
sends each text the fewest windows after which it could stop (:func:`next_windows`): one
with ``stop_margin``; with ``stop_when_decided`` alone, a 3-window text of the shipped
policy sends two at once, since one window can never settle it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.heads import MULTICLASS, Head
from orchestrator.runtime.routing.nodes.base import (
    REGISTRY,
    Answer,
    Answers,
    BindContext,
    Engine,
    Item,
    Node,
    NodeKind,
    ParseContext,
    Windows,
    descendants,
)
from orchestrator.runtime.routing.schema import REQUIRED, Bool, Choice, Int, Key, NodeRef, Number

AGGREGATIONS = ("length_weighted_mean", "mean", "max")
#: Why a text stopped before its last window (the ``reason`` label of
#: ``orchestrator_chunks_skipped_total``): its verdicts could no longer change
#: (``stop_when_decided``), its answer so far was sure by ``stop_margin``, it reached
#: ``max_windows``.
STOP_DECIDED, STOP_MARGIN, STOP_MAX_WINDOWS = "decided", "margin", "max_windows"
#: Why a text left the rounds for its request: cancelled, or no time for another round.
STOP_CANCELLED, STOP_DEADLINE = "cancelled", "deadline"


@dataclass(frozen=True)
class ChunkNode(Node):
    """Texts longer than ``window`` tokens are split into overlapping windows (see
    :func:`token_windows`) that ``node`` classifies; the text's probability aggregates the
    windows' (``length_weighted_mean``: each window weighted by the content tokens it adds,
    :func:`window_weights`). ``ROUTE`` gets the prefix ``chunked:``, and the suffix
    ``:windows=<used>/<made>`` when a stopping key left windows unclassified. Keys:
    :data:`KIND` ``.keys`` (docs/reference/policy.md); every model under ``node`` must use one
    tokenizer, since windows are token windows.
    """

    window: int = REQUIRED
    stride: int = REQUIRED
    aggregation: str = "length_weighted_mean"
    node: Node = REQUIRED
    stop_when_decided: bool = False
    stop_margin: Optional[float] = None
    max_windows: Optional[int] = None
    tokenizer: str = ""  # whose tokens are windowed: its models' one tokenizer, in the plan (``policy.bind_heads``)

    @property
    def stops_early(self) -> bool:
        """True when a stopping key is set: windows go in rounds, one per open text."""
        return self.stop_when_decided or self.stop_margin is not None or self.max_windows is not None


def token_windows(ids: NDArray[Any], max_length: int, stride: int) -> List[NDArray[Any]]:
    """Split one tokenized text into overlapping windows of at most ``max_length`` tokens.

    Args:
        ids: int64 [T] token ids of the whole text, first and last being special tokens
            ([CLS] ... [SEP] for BERT).
        max_length: window length in tokens, special tokens included.
        stride: content tokens between the starts of consecutive windows.

    Returns:
        A list of int64 arrays, each ``[first] + content slice + [last]``; together they
        cover every content token, the last window ends at the text's last content token.
        A text of at most ``max_length`` tokens comes back as one window, itself.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.shape[0] <= max_length:
        return [ids]
    body, width = ids[1:-1], max_length - 2
    starts = _starts(body.shape[0], width, stride)
    return [np.concatenate([ids[:1], body[s : s + width], ids[-1:]]) for s in starts]


def _starts(content: int, width: int, stride: int) -> List[int]:
    starts = list(range(0, content - width + 1, stride))
    if starts[-1] + width < content:
        starts.append(content - width)
    return starts


def window_count(tokens: int, max_length: int, stride: int) -> int:
    """How many windows :func:`token_windows` makes of a text of ``tokens`` tokens."""
    if tokens <= max_length:
        return 1
    content, width = tokens - 2, max_length - 2
    full = (content - width) // stride + 1
    return full + (1 if (full - 1) * stride + width < content else 0)


def window_weights(tokens: int, max_length: int, stride: int) -> List[int]:
    """The ``length_weighted_mean`` weight of each window of :func:`token_windows`: the
    content tokens it covers that no earlier window covered (the first window: all of its
    ``max_length - 2``; then ``stride`` each; the end-aligned last one: what is left). The
    weights add up to the text's content tokens, so every token counts once however much
    the windows overlap. A text of at most ``max_length`` tokens: one window, weight
    ``tokens``.

    (Every window has exactly ``max_length`` tokens, so weighting by window length would be
    the plain mean.)
    """
    if tokens <= max_length:
        return [tokens]
    width = max_length - 2
    starts = _starts(tokens - 2, width, stride)
    return [width] + [s - prev for prev, s in zip(starts, starts[1:])]


# ----------------------------------------------------------------------------- policy


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> ChunkNode:
    window = values["window"] or ctx.max_sequence_length
    stride = values["stride"] or max(1, (window - 2) * 3 // 4)
    if not 1 <= stride <= window - 2:  # the schema cannot compare two keys
        raise PolicyError(f"{common['where']}.stride: {stride!r} is outside [1, {window - 2}]")
    return ChunkNode(**common, window=window, stride=stride, aggregation=values["aggregation"], node=values["node"],
                     stop_when_decided=values["stop_when_decided"], stop_margin=values["stop_margin"],
                     max_windows=values["max_windows"])


def _bind(node: ChunkNode, ctx: BindContext) -> ChunkNode:
    calls = [c for n in descendants(node) for c in REGISTRY[n.kind].calls(n)]
    heads = {c.model: ctx.heads.get(c.model, ctx.head) for c in calls}
    tokenizers = sorted({h.tokenizer for h in heads.values()})
    if len(tokenizers) > 1:
        raise PolicyError(
            f"{node.name}: its models use different tokenizers ({', '.join(tokenizers)}); a chunk node windows one "
            "tokenizer's tokens, so give each tokenizer its own chunk node"
        )
    node = replace(node, tokenizer=tokenizers[0] if tokenizers else ctx.tokenizer)
    for model, head in heads.items():
        if node.window > head.max_length:
            raise PolicyError(
                f"{node.name}.window: {node.window} tokens, over model '{model}''s maximum of {head.max_length} "
                "(its head.json max_length)"
            )
    if node.stop_when_decided and node.aggregation == "max" and ctx.head.kind == MULTICLASS:
        raise PolicyError(
            f"{node.name}.stop_when_decided: not available with aggregation 'max' and a multiclass head: the maximum "
            "is renormalized to sum 1, so no window answered so far bounds the text's answer; use aggregation "
            "'mean' or 'length_weighted_mean', or stop_margin"
        )
    return node


# ----------------------------------------------------------------------------- stopping rules


def _combine(head: Head, how: str, probs: Sequence[NDArray[Any]], weights: Sequence[float]) -> NDArray[Any]:
    if how == "max":
        return head.combine(probs, "max")
    return head.combine(probs, "mean", weights if how == "length_weighted_mean" else None)


def _column_bounds(head: Head, low: NDArray[Any], high: NDArray[Any], threshold: NDArray[Any]) -> Tuple[NDArray[Any], NDArray[Any]]:
    """``(yes, no)`` bool [C]: columns whose every answer in ``[low, high]`` is at or above
    the threshold (``low >= t``), and those whose every answer is below it (``high < t``),
    compared in float32 as :meth:`heads.Head.verdicts` does."""
    t = head.thresholds(threshold, 1)[0].astype(np.float32)
    return low.astype(np.float32) >= t, high.astype(np.float32) < t


def settled_verdicts(head: Head, low: NDArray[Any], high: NDArray[Any], threshold: NDArray[Any]) -> Optional[NDArray[Any]]:
    """The verdicts bool [C] every answer within ``[low, high]`` (float64 [C] each, column
    by column) gets from ``head.verdicts`` at ``threshold`` ([1] or [C]), or None when two
    answers in the box may get different ones.

    Compared in float32 as :meth:`heads.Head.verdicts` does (rounding is monotone, so
    ``f32(low) >= f32(t)`` holds for every ``p >= low``). Binary and multilabel, per
    column: true when ``low >= t``, false when ``high < t``. Multiclass: every column
    false when no label can reach its threshold (``high_k < t_k`` for all ``k``);
    otherwise the top label ``j`` must be fixed (``low_j > high_k`` for every other
    ``k``, so no tie) and its own verdict settled as above.
    """
    yes, no = _column_bounds(head, low, high, threshold)
    lo, hi = low.astype(np.float32), high.astype(np.float32)
    if head.kind != MULTICLASS:
        return yes.copy() if bool((yes | no).all()) else None
    if bool(no.all()):
        return np.zeros(head.columns, dtype=bool)
    j = int(np.argmax(lo))
    others = np.delete(hi, j)
    if not bool((lo[j] > others).all()) or not bool(yes[j] or no[j]):
        return None
    out = np.zeros(head.columns, dtype=bool)
    out[j] = bool(yes[j])
    return out


@dataclass
class ChunkText:
    """One text of a chunk node's batch while its windows are classified.

    Attributes:
        item: the text.
        windows: its window items in order (a text of at most ``window`` tokens: itself).
        weights: each window's aggregation weight (:func:`window_weights`).
        answers: the inner node's answers of the windows classified so far, in order.
        stopped: why the text left the rounds before its last window (a ``STOP_*``
            reason, or another one a caller sets through :meth:`stop`); None: open, or
            every window classified.
    """

    item: Item
    windows: List[Item]
    weights: List[int]
    answers: List[Answer] = field(default_factory=list)
    stopped: Optional[str] = None

    @property
    def chunked(self) -> bool:
        """True when the text made more than one window."""
        return len(self.windows) > 1

    @property
    def open(self) -> bool:
        """True while the text has windows left and was not stopped."""
        return self.stopped is None and len(self.answers) < len(self.windows)

    def stop(self, reason: str) -> None:
        """Classify no more windows of this text (a no-op once it is closed)."""
        if self.open:
            self.stopped = reason


def _stop_reason(engine: Engine, node: ChunkNode, text: ChunkText) -> Optional[str]:
    """Why ``text`` (open, at least one window answered) should stop now, or None."""
    used, made = len(text.answers), len(text.windows)
    if used >= made:
        return None
    probs = [a.probabilities for a in text.answers]
    so_far = _combine(engine.head, node.aggregation, probs, text.weights[:used])
    if node.stop_when_decided:
        rest = [np.zeros(engine.head.columns), np.ones(engine.head.columns)]
        low, high = (_combine(engine.head, node.aggregation, probs + [r] * (made - used), text.weights) for r in rest)
        settled = settled_verdicts(engine.head, low, high, text.item.threshold)
        # the answer reported is the aggregate so far: it must carry the settled verdicts
        # (it does in exact arithmetic; this guards float rounding)
        if settled is not None and bool((engine.head.verdicts(so_far.reshape(1, -1), text.item.threshold.reshape(1, -1))[0]
                                          == settled).all()):
            return STOP_DECIDED
    if node.stop_margin is not None and not bool(engine.head.unsure(so_far, text.item.threshold, node.stop_margin)):
        return STOP_MARGIN
    if node.max_windows is not None and used >= node.max_windows:
        return STOP_MAX_WINDOWS
    return None


def could_settle(head: Head, aggregation: str, answered: Sequence[NDArray[Any]], weights: Sequence[int], more: int,
                 threshold: NDArray[Any]) -> bool:
    """Whether the verdicts of a text with window ``weights`` could be settled
    (:func:`settled_verdicts`, as ``stop_when_decided`` checks) once ``more`` windows after
    the ``answered`` ones (probabilities [columns] each) are answered, for some answers of
    those windows. A column's lowest possible aggregate is largest with the new windows at 1
    and the rest at 0, its highest possible smallest the other way round, so these two
    bounds say whether any answers could settle it. Binary and multilabel heads settle
    column by column: exact. Multiclass: a necessary condition (some column settled one way
    or the other). False means no answers of those windows can stop the text there."""
    made, cols = len(weights), head.columns
    zeros, ones = np.zeros(cols), np.ones(cols)
    rest = made - len(answered) - more
    low = _combine(head, aggregation, list(answered) + [ones] * more + [zeros] * rest, weights)
    high = _combine(head, aggregation, list(answered) + [zeros] * more + [ones] * rest, weights)
    yes, no = _column_bounds(head, low, high, threshold)
    settles = yes | no
    return bool(settles.any()) if head.kind == MULTICLASS else bool(settles.all())


def next_windows(head: Head, node: ChunkNode, text: ChunkText) -> int:
    """How many windows the open ``text`` sends in its next round: the fewest after which a
    stopping key could stop it, so a text stops at the same window as when every round
    sent one window, in fewer calls. With ``stop_margin``: 1 (it may fire after any
    window). Otherwise every window up to ``max_windows`` (or the last), and with
    ``stop_when_decided`` the fewest after which :func:`could_settle` (3-window texts of
    the shipped policy: 2, then 1)."""
    used, made = len(text.answers), len(text.windows)
    if node.stop_margin is not None:
        return 1
    last = made if node.max_windows is None else min(made, node.max_windows)
    if node.stop_when_decided:
        answered = [a.probabilities for a in text.answers]
        for more in range(1, last - used):
            if could_settle(head, node.aggregation, answered, text.weights, more, text.item.threshold):
                return more
    return max(1, last - used)


async def classify_rounds(engine: Engine, node: ChunkNode, texts: List[ChunkText]) -> None:
    """Classify the windows of ``texts`` with ``node.node``, filling each text's ``answers``.

    Without a stopping key: one round, every window of every text in one call. With one:
    each round sends the next windows of every open text in one call, for each text as many
    as :func:`next_windows` says (the fewest after which it could stop); after it, each
    text that got answers is checked (:func:`_stop_reason`) and may stop. A caller that
    must stop texts for its own reason (a deadline, a cancelled request) does it at the
    start of a round with :meth:`ChunkText.stop`; texts stopped that way keep the windows
    they have.

    Raises:
        DownstreamError: the inner node failed.
    """
    if not node.stops_early:
        batch = [w for t in texts for w in t.windows]
        inner = await engine.run_node(node.node, batch)
        for t in texts:
            t.answers = [inner[w.idx] for w in t.windows]
        return
    r = 0
    while True:
        round_texts = [t for t in texts if t.open]
        if r > 0:
            round_texts = _still_wanted(engine, node, r, round_texts)
        if not round_texts:
            return
        sends = [t.windows[len(t.answers):len(t.answers) + next_windows(engine.head, node, t)] for t in round_texts]
        windows = [w for send in sends for w in send]
        inner = await engine.run_node(node.node, windows)
        late = {w.idx for w in engine.deadlines.late(windows)} if r > 0 else set()
        for t, send in zip(round_texts, sends):
            if any(w.idx in late for w in send):  # a late answer never reaches a response
                t.stop(STOP_DEADLINE)
                continue
            t.answers += [inner[w.idx] for w in send]
            reason = _stop_reason(engine, node, t) if t.chunked else None
            if reason is not None:
                t.stop(reason)
        r += 1


def _still_wanted(engine: Engine, node: ChunkNode, r: int, texts: List[ChunkText]) -> List[ChunkText]:
    """The open texts worth a round ``r`` >= 1 (each text's next window: the first it has
    not answered): their request not cancelled
    (``Deadlines.live``, asked once per request per round; a cancelled one stops with
    :data:`STOP_CANCELLED` and its request is answered CANCELLED) and with the time left
    for another call of the inner node (``Deadlines.affordable``; else :data:`STOP_DEADLINE`:
    the text answers from the windows it has)."""
    live = {id(it) for it in engine.deadlines.live([t.item for t in texts])}
    go, _ = engine.deadlines.affordable(node.node, [t.windows[len(t.answers)] for t in texts if id(t.item) in live])
    wanted = {w.idx for w in go}
    out = []
    for t in texts:
        if id(t.item) not in live:
            t.stop(STOP_CANCELLED)
        elif t.windows[len(t.answers)].idx not in wanted:
            t.stop(STOP_DEADLINE)
        else:
            out.append(t)
    return out


#: What a chunk node appends to ``ROUTE`` when it left windows unclassified (a route
#: detail, ``engine.route_label``).
WINDOWS_SUFFIX = ":windows="


def _answer(engine: Engine, node: ChunkNode, text: ChunkText) -> Answer:
    if not text.chunked:
        return text.answers[0]
    used = len(text.answers)
    p = _combine(engine.head, node.aggregation, [a.probabilities for a in text.answers], text.weights[:used])
    route = "chunked:" + "+".join(dict.fromkeys(a.route for a in text.answers))
    if used < len(text.windows):
        route += f"{WINDOWS_SUFFIX}{used}/{len(text.windows)}"
    return Answer(p, route)


async def _run(engine: Engine, node: ChunkNode, items: List[Item]) -> Answers:
    await engine.calls.ensure_tokens(items, node.tokenizer)
    texts: List[ChunkText] = []
    for it in items:
        ids = it.tokens[node.tokenizer]
        pieces = token_windows(ids, node.window, node.stride)
        windows = [it] if len(pieces) == 1 else [engine.window(it, node.tokenizer, piece) for piece in pieces]
        texts.append(ChunkText(it, windows, window_weights(int(ids.shape[0]), node.window, node.stride)))
    await classify_rounds(engine, node, texts)
    chunked = [t for t in texts if t.chunked]
    if chunked:
        engine.count("orchestrator_chunked_texts_total", len(chunked), node=node.name)
        engine.count("orchestrator_chunks_total", sum(len(t.answers) for t in chunked), node=node.name)
        skipped: Dict[str, int] = {}
        for t in chunked:
            if t.stopped is not None:
                skipped[t.stopped] = skipped.get(t.stopped, 0) + len(t.windows) - len(t.answers)
        for reason, n in sorted(skipped.items()):
            engine.count("orchestrator_chunks_skipped_total", n, node=node.name, reason=reason)
    answers = {t.item.idx: _answer(engine, node, t) for t in texts}
    stopped_in_time = [t.item for t in texts if t.stopped == STOP_DEADLINE]
    if stopped_in_time:  # ROUTE gets :deadline; the request counts as answered in time
        engine.deadlines.keep_for_deadline(node, stopped_in_time, answers)
    return answers


def _children(node: ChunkNode) -> List[Tuple[str, Node]]:
    return [("", node.node)]


def _describe(node: ChunkNode) -> str:
    out = f"chunk window={node.window} stride={node.stride} aggregation={node.aggregation}"
    if node.stop_when_decided:
        out += " stop_when_decided"
    if node.stop_margin is not None:
        out += f" stop_margin={node.stop_margin:g}"
    if node.max_windows is not None:
        out += f" max_windows={node.max_windows}"
    return out


KIND = NodeKind(
    name="chunk",
    node_type=ChunkNode,
    doc="Overlapping token windows of long texts, classified by `node`, aggregated per text; `ROUTE` gets `chunked:`. "
        "With a stopping key the windows go in rounds (each round: the next windows of every open text in one call, as "
        "many per text as could let it stop, one with `stop_margin`) and "
        "a text stops once settled; `ROUTE` then ends in `:windows=<used>/<made>`.",
    keys=(
        Key("window", Int(3, 1 << 20), "tokens per window, special tokens included",
            computed="the policy's `max_sequence_length`"),
        Key("stride", Int(1, 1 << 20), "content tokens between window starts, 1 .. `window` - 2",
            computed="3/4 of the window's content, `(window - 2) * 3 // 4`"),
        Key("aggregation", Choice(AGGREGATIONS), "how window answers become the text's, each column by itself: "
            "`length_weighted_mean` (each window weighted by the content tokens it adds that no earlier window "
            "covered, so overlaps count once), `mean`, `max` (multiclass: renormalized to sum 1)"),
        Key("node", NodeRef(), "classifies the windows; its models must share one tokenizer"),
        Key("stop_when_decided", Bool(), "stop a text once its remaining windows cannot change its verdicts, "
            "whatever they answer (each probability in [0, 1]; exact, compared in float32 like the verdicts); "
            "its answer aggregates the windows used. Not with `max` and a multiclass head"),
        Key("stop_margin", Number(0.0, 1.0), "stop a text once its answer so far is sure by this margin: not "
            "within it of a threshold (binary: `|p - t| >= margin`; multiclass: top two at least this apart; "
            "multilabel: every label). Set it at least the enclosing cascade's `margin` so a stopped text is not "
            "escalated. Absent: no such rule"),
        Key("max_windows", Int(1, 1 << 20), "classify at most the first this many windows of a text (the "
            "others are skipped, not refused: compare `limits.max_windows_per_text`). Absent: every window"),
    ),
    build=_build,
    run=_run,
    describe=_describe,
    children=_children,
    with_children=lambda node, children: replace(node, node=children[0]),
    bind=_bind,
    tokens=lambda node: (node.tokenizer,),
    windows=lambda node: Windows(node.tokenizer, partial(window_count, max_length=node.window, stride=node.stride)),
)
