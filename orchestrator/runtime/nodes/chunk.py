"""``chunk``: a loop over overlapping token windows of long texts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, List, Tuple

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.nodes.base import (
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
from orchestrator.runtime.schema import REQUIRED, Choice, Int, Key, NodeRef

AGGREGATIONS = ("length_weighted_mean", "mean", "max")


@dataclass
class ChunkNode(Node):
    """Texts longer than ``window`` tokens are split into overlapping windows (see
    :func:`token_windows`) that ``node`` classifies; the text's probability aggregates the
    windows'. ``ROUTE`` gets the prefix ``chunked:``. Keys: :data:`KIND` ``.keys``
    (docs/policy.md); every model under ``node`` must use one tokenizer, since windows are
    token windows.
    """

    window: int = REQUIRED
    stride: int = REQUIRED
    aggregation: str = "length_weighted_mean"
    node: Node = REQUIRED
    tokenizer: str = ""  # whose tokens are windowed: its models' one tokenizer (``policy.bind_heads``)


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
    starts = list(range(0, body.shape[0] - width + 1, stride))
    if starts[-1] + width < body.shape[0]:
        starts.append(body.shape[0] - width)
    return [np.concatenate([ids[:1], body[s : s + width], ids[-1:]]) for s in starts]


def window_count(tokens: int, max_length: int, stride: int) -> int:
    """How many windows :func:`token_windows` makes of a text of ``tokens`` tokens."""
    if tokens <= max_length:
        return 1
    content, width = tokens - 2, max_length - 2
    full = (content - width) // stride + 1
    return full + (1 if (full - 1) * stride + width < content else 0)


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> ChunkNode:
    window = values["window"] or ctx.max_sequence_length
    stride = values["stride"] or max(1, (window - 2) * 3 // 4)
    if not 1 <= stride <= window - 2:  # the schema cannot compare two keys
        raise PolicyError(f"{common['where']}.stride: {stride!r} is outside [1, {window - 2}]")
    return ChunkNode(**common, window=window, stride=stride, aggregation=values["aggregation"], node=values["node"])


def _bind(node: ChunkNode, ctx: BindContext) -> None:
    calls = [c for n in descendants(node) for c in REGISTRY[n.kind].calls(n)]
    heads = {c.model: ctx.heads.get(c.model, ctx.head) for c in calls}
    tokenizers = sorted({h.tokenizer for h in heads.values()})
    if len(tokenizers) > 1:
        raise PolicyError(
            f"{node.name}: its models use different tokenizers ({', '.join(tokenizers)}); a chunk node windows one "
            "tokenizer's tokens, so give each tokenizer its own chunk node"
        )
    node.tokenizer = tokenizers[0] if tokenizers else ctx.tokenizer
    for model, head in heads.items():
        if node.window > head.max_length:
            raise PolicyError(
                f"{node.name}.window: {node.window} tokens, over model '{model}''s maximum of {head.max_length} "
                "(its head.json max_length)"
            )


async def _run(engine: Engine, node: ChunkNode, items: List[Item]) -> Answers:
    await engine.ensure_tokens(items, node.tokenizer)
    windows: List[Item] = []
    owner: Dict[int, int] = {}
    chunked = set()
    for it in items:
        pieces = token_windows(it.ids(node.tokenizer), node.window, node.stride)
        if len(pieces) == 1:
            windows.append(it)
            owner[it.idx] = it.idx
            continue
        chunked.add(it.idx)
        for piece in pieces:
            w = engine.window(it, node.tokenizer, piece)
            windows.append(w)
            owner[w.idx] = it.idx
    if chunked:
        engine.count("orchestrator_chunked_texts_total", len(chunked), node=node.name)
        engine.count("orchestrator_chunks_total", len(windows) - (len(items) - len(chunked)), node=node.name)
    inner = await engine.run_node(node.node, windows)
    per_text: Dict[int, List[Tuple[Any, int]]] = {}
    for w in windows:
        per_text.setdefault(owner[w.idx], []).append((inner[w.idx], int(w.ids(node.tokenizer).shape[0])))
    answers: Answers = {}
    for idx, parts in per_text.items():
        if idx not in chunked:
            answers[idx] = parts[0][0]
            continue
        how = "mean" if node.aggregation == "length_weighted_mean" else node.aggregation
        weights = [n for _, n in parts] if node.aggregation == "length_weighted_mean" else None
        p = engine.head.combine([a.probabilities for a, _ in parts], how, weights)
        routes = list(dict.fromkeys(a.route for a, _ in parts))
        answers[idx] = Answer(p, "chunked:" + "+".join(routes))
    return answers


def _children(node: ChunkNode) -> List[Tuple[str, Node]]:
    return [("", node.node)]


KIND = NodeKind(
    name="chunk",
    node_type=ChunkNode,
    doc="Overlapping token windows of long texts, classified by `node`, aggregated per text; `ROUTE` gets `chunked:`.",
    keys=(
        Key("window", Int(3, 1 << 20), "tokens per window, special tokens included",
            computed="the policy's `max_sequence_length`"),
        Key("stride", Int(1, 1 << 20), "content tokens between window starts, 1 .. `window` - 2",
            computed="3/4 of the window's content, `(window - 2) * 3 // 4`"),
        Key("aggregation", Choice(AGGREGATIONS), "how window answers become the text's, each column by itself: "
            "`length_weighted_mean` (weighted by window length in tokens), `mean`, `max`"),
        Key("node", NodeRef(), "classifies the windows; its models must share one tokenizer"),
    ),
    build=_build,
    run=_run,
    describe=lambda node: f"chunk window={node.window} stride={node.stride} aggregation={node.aggregation}",
    children=_children,
    bind=_bind,
    tokens=lambda node: (node.tokenizer,),
    windows=lambda node: Windows(node.tokenizer, partial(window_count, max_length=node.window, stride=node.stride)),
)
