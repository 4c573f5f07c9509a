"""``chunk``: a loop over overlapping token windows of long texts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.runtime.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext, Reader
from orchestrator.runtime.scores import logit

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
    ``mean``; ``max``), ``node`` (required).
    """

    window: int = 128
    stride: int = 96
    aggregation: str = "length_weighted_mean"
    node: Optional[Node] = None


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


def aggregate(probabilities: Sequence[float], lengths: Sequence[int], how: str) -> float:
    """Combine the window probabilities of one text into one (see :data:`AGGREGATIONS`);
    ``lengths`` are the windows' lengths in tokens."""
    p = np.asarray(probabilities, dtype=np.float64)
    if how == "max":
        return float(p.max())
    if how == "mean":
        return float(p.mean())
    w = np.asarray(lengths, dtype=np.float64)
    return float((p * w).sum() / w.sum())


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> ChunkNode:
    window = r.number_in("window", 3, 1 << 20, ctx.max_sequence_length, kind=int)
    stride = r.number_in("stride", 1, window - 2, max(1, (window - 2) * 3 // 4), kind=int)
    aggregation = r.choice("aggregation", AGGREGATIONS, "length_weighted_mean")
    inner = ctx.parse_node(r.get("node", dict, required=True), f"{r.where}.node")
    return ChunkNode(**common, window=window, stride=stride, aggregation=aggregation, node=inner)


async def _run(engine: Engine, node: ChunkNode, items: List[Item]) -> Answers:
    await engine.ensure_tokens(items)
    windows: List[Item] = []
    owner: Dict[int, int] = {}
    chunked = set()
    for it in items:
        pieces = token_windows(it.ids, node.window, node.stride)
        if len(pieces) == 1:
            windows.append(it)
            owner[it.idx] = it.idx
            continue
        chunked.add(it.idx)
        for piece in pieces:
            w = engine.window(it, piece)
            windows.append(w)
            owner[w.idx] = it.idx
    if chunked:
        engine.count("orchestrator_chunked_texts_total", len(chunked), node=node.name)
        engine.count("orchestrator_chunks_total", len(windows) - (len(items) - len(chunked)), node=node.name)
    inner = await engine.run_node(node.node, windows)
    per_text: Dict[int, list] = {}
    for w in windows:
        per_text.setdefault(owner[w.idx], []).append((inner[w.idx], int(w.ids.shape[0])))
    answers: Answers = {}
    for idx, parts in per_text.items():
        if idx not in chunked:
            answers[idx] = parts[0][0]
            continue
        p = aggregate([a.probability for a, _ in parts], [n for _, n in parts], node.aggregation)
        routes = list(dict.fromkeys(a.route for a, _ in parts))
        answers[idx] = Answer(p, logit(p), "chunked:" + "+".join(routes))
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
)
