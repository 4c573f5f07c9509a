"""``chunk``: a loop over overlapping token windows of long texts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.nodes.base import Answer, Answers, BindContext, Engine, Item, Node, NodeKind, ParseContext, Reader, descendants

AGGREGATIONS = ("length_weighted_mean", "mean", "max")


@dataclass
class ChunkNode(Node):
    """Texts longer than ``window`` tokens are split into overlapping windows (see
    :func:`token_windows`) that ``node`` classifies; the text's probability aggregates the
    windows'. ``ROUTE`` gets the prefix ``chunked:``.

    Policy keys: ``window`` (tokens per window, special tokens included; default the
    policy's ``max_sequence_length``), ``stride`` (content tokens between window starts,
    1 .. window - 2; default 3/4 of the window's content), ``aggregation``
    (``length_weighted_mean``: mean weighted by window length in tokens, the default;
    ``mean``; ``max``; each column by itself, ``heads.Head.combine``), ``node`` (required;
    every model under it must use one tokenizer, since windows are token windows).
    """

    window: int = 128
    stride: int = 96
    aggregation: str = "length_weighted_mean"
    node: Optional[Node] = None
    tokenizer: str = ""  # whose tokens are windowed: its models' one tokenizer (``policy.bind_heads``)


def token_windows(ids: np.ndarray, max_length: int, stride: int) -> List[np.ndarray]:
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


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> ChunkNode:
    window = r.number_in("window", 3, 1 << 20, ctx.max_sequence_length, kind=int)
    stride = r.number_in("stride", 1, window - 2, max(1, (window - 2) * 3 // 4), kind=int)
    aggregation = r.choice("aggregation", AGGREGATIONS, "length_weighted_mean")
    inner = ctx.parse_node(r.get("node", dict, required=True), f"{r.where}.node")
    return ChunkNode(**common, window=window, stride=stride, aggregation=aggregation, node=inner)


def _bind(node: ChunkNode, ctx: BindContext) -> None:
    models = [n for n in descendants(node) if n.kind == "model"]
    tokenizers = sorted({m.head.tokenizer for m in models})
    if len(tokenizers) > 1:
        raise PolicyError(
            f"{node.name}: its models use different tokenizers ({', '.join(tokenizers)}); a chunk node windows one "
            "tokenizer's tokens, so give each tokenizer its own chunk node"
        )
    node.tokenizer = tokenizers[0] if tokenizers else ctx.tokenizer
    for m in models:
        if node.window > m.head.max_length:
            raise PolicyError(
                f"{node.name}.window: {node.window} tokens, over model '{m.model}''s maximum of {m.head.max_length} "
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
    per_text: Dict[int, list] = {}
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
    keys=("window", "stride", "aggregation", "node"),
    parse=_parse,
    run=_run,
    describe=lambda node: f"chunk window={node.window} stride={node.stride} aggregation={node.aggregation}",
    children=_children,
    bind=_bind,
)
