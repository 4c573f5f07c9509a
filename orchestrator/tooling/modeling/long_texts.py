"""Long texts joined from short labeled ones: what ``orchestrator tune`` scores a chunk
policy's ``stop_margin`` on, and what the lab's long-text benchmark sends.

Two kinds, each ``(text, label)``: *same-label* (:func:`same_label_long_texts`: sentences of
one label only) and *turning* (:func:`turning_long_texts`: an opening of one label, then a
longer part of another; the text's label is the later part's). Lengths are token counts
(special tokens included), from the caller's tokenizer.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: Token-count bounds (inclusive) of a kept long text: longer than two 128-token windows.
LONG_BOUNDS = (256, 384)


def same_label_long_texts(texts: Sequence[str], labels: Sequence[int], lengths: Sequence[int],
                          join_length: Callable[[str], int], bounds: Tuple[int, int] = LONG_BOUNDS,
                          n: Optional[int] = None) -> List[Tuple[str, int]]:
    """Long texts of one label each: ``(text, label)`` in order of completion.

    Sentences are taken in the given order; each goes to the open join of its own label.
    When a join's estimated token count (``lengths`` summed, minus 2 per join for the
    shared special tokens) reaches ``bounds[0]`` it is closed: kept when its real count
    ``join_length(joined)`` is within ``bounds`` (inclusive), dropped otherwise (a new join
    of that label starts either way). ``n``: stop after that many texts.

    Raises:
        ValueError: the sequences differ in length.
    """
    if not len(texts) == len(labels) == len(lengths):
        raise ValueError("texts, labels and lengths differ in length")
    lo, hi = bounds
    open_: Dict[int, Tuple[List[str], int]] = {}
    out: List[Tuple[str, int]] = []
    for t, y, k in zip(texts, labels, lengths):
        parts, total = open_.get(int(y), ([], 0))
        parts = parts + [t]
        total = int(k) if len(parts) == 1 else total + int(k) - 2
        if total < lo:
            open_[int(y)] = (parts, total)
            continue
        open_.pop(int(y), None)
        joined = " ".join(parts)
        if lo <= join_length(joined) <= hi:
            out.append((joined, int(y)))
            if n is not None and len(out) >= n:
                break
    return out


#: Turning texts (:func:`turning_long_texts`): the opening's target tokens, and how many
#: times as many tokens the later part has.
OPENING_TOKENS, LATER_FACTOR = 110, 2.0


def turning_long_texts(texts: Sequence[str], labels: Sequence[Any], lengths: Sequence[int],
                       join_length: Callable[[str], int], bounds: Tuple[int, int] = LONG_BOUNDS,
                       n: Optional[int] = None, opening: int = OPENING_TOKENS,
                       factor: float = LATER_FACTOR) -> List[Tuple[str, Any]]:
    """Long texts whose parts disagree: ``(text, label)``, an opening of about ``opening``
    tokens of sentences of one label, then about ``factor`` times as many tokens of sentences
    of another label. **Label rule: the text's label is the later, longer part's** (a review
    that opens with a plot summary and ends with its verdict).

    Sentences are taken in the given order from one queue per label (``labels`` hashable:
    an int, or a tuple for multilabel rows); texts alternate their opening label over the
    labels present. The opening takes sentences until its estimated count (``lengths``
    summed, minus 2 per join for the shared special tokens) reaches ``opening``, the later
    part until it reaches ``factor`` times ``opening``; the text is kept when its real
    count ``join_length(text)`` is within ``bounds`` (inclusive). Stops when a label's queue
    runs out, or after ``n`` texts.

    Raises:
        ValueError: the sequences differ in length.
    """
    if not len(texts) == len(labels) == len(lengths):
        raise ValueError("texts, labels and lengths differ in length")
    queues: Dict[Any, List[Tuple[str, int]]] = {}
    for t, y, k in zip(texts, labels, lengths):
        queues.setdefault(y, []).append((t, int(k)))
    keys = list(queues)
    if len(keys) < 2:
        return []
    pos = {y: 0 for y in keys}

    def take(y: Any, tokens: float) -> Optional[Tuple[List[str], int]]:
        parts, total = [], 0
        while total < tokens:
            if pos[y] >= len(queues[y]):
                return None
            t, k = queues[y][pos[y]]
            pos[y] += 1
            parts.append(t)
            total = k if len(parts) == 1 else total + k - 2
        return parts, total

    out: List[Tuple[str, Any]] = []
    i = 0
    while n is None or len(out) < n:
        first, later = keys[i % len(keys)], keys[(i + 1) % len(keys)]
        i += 1
        head = take(first, opening)
        tail = take(later, factor * opening) if head else None
        if head is None or tail is None:
            break
        joined = " ".join(head[0] + tail[0])
        if bounds[0] <= join_length(joined) <= bounds[1]:
            out.append((joined, later))
    return out
