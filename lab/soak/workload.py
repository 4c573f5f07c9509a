"""The soak's workload: the texts, the requests, the healthy reference answers and the check
of every answer against them.

Texts (:func:`build_pool`): the empty text, short held-out test sentences
(:func:`orchestrator.tooling.modeling.data.held_out_texts`, never seen in training; 27
tokens median, 103 at most) and long texts made by joining held-out sentences until they
pass :data:`LONG_MIN_CHARS` characters (well over the router's 128-token window, so the
router chunks them; the reference says which texts it chunked).

Reference (:func:`compute_references`): before any fault, every text is sent through the
router with the request parameter ``route=fast`` (the ``classifier_fast`` answer) and
``route=accurate`` (the ``classifier`` answer). An answer is CORRECT (:func:`check_answer`)
when, for every text, its probability is within :data:`PROBABILITY_TOLERANCE` of the
healthy answer of the model its ``ROUTE`` names (``chunked:`` and ``:degraded`` stripped),
its ``chunked:`` prefix matches the text's length, and ``VERDICTS`` is ``probability >=
threshold`` (``empty``: probability 0.5, verdict false). A chunk node that stopped early
(ROUTE ``...:windows=<used>/<made>``, ``nodes.chunk``) answers from its first windows, not
the whole text: its probability is not compared (the route and verdict rules still are),
and under such a policy (:attr:`TextPool.early_stopping`) a long text under the cascade
may or may not escalate. Which model answered is the
router's choice and may change under faults; a probability that belongs to no model the
route names is WRONG.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

#: |probability - healthy probability| allowed: the same model and input give the same
#: logit up to batch padding (the server tests compare router and ensemble within 1e-5).
PROBABILITY_TOLERANCE = 1e-5
#: A long text has at least this many characters: ~10 held-out sentences, over 200 tokens
#: of the demo tokenizer, so the router cuts it into 128-token windows.
LONG_MIN_CHARS = 1200
#: The models the shipped policy calls, and what a ROUTE names once its decorations are gone.
FAST, ACCURATE, EMPTY = "classifier_fast", "classifier", "empty"
#: What a chunk node that stopped early appends to ROUTE (``nodes.chunk.WINDOWS_SUFFIX``).
WINDOWS_DETAIL = ":windows="
ROUTE_PARAMETER_VALUES = ("fast", "accurate")


@dataclass(frozen=True)
class Reference:
    """The healthy answers for one text: ``fast`` (``route=fast``) and ``accurate``
    (``route=accurate``) probabilities in [0, 1], and whether the router chunked it."""

    fast: float
    accurate: float
    chunked: bool


@dataclass
class TextPool:
    """The soak's texts (index 0 is the empty text), their kinds (``empty``, ``short``,
    ``long``) and, once computed, their :class:`Reference` answers by index."""

    texts: List[str]
    kinds: List[str]
    references: Dict[int, Reference] = field(default_factory=dict)
    #: the policy's cascade has a chunk node that may stop early (:func:`chunk_stops_early`)
    early_stopping: bool = False

    def indices(self, kind: str) -> List[int]:
        return [i for i, k in enumerate(self.kinds) if k == kind]

    def summary(self) -> dict:
        """Counts by kind and how many texts the router chunked (from the reference)."""
        out = {kind: len(self.indices(kind)) for kind in ("empty", "short", "long")}
        out["chunked"] = sum(1 for r in self.references.values() if r.chunked)
        return out


def build_pool(n_short: int, n_long: int, seed: int = 0, data_dir=None) -> TextPool:
    """The empty text, ``n_short`` held-out sentences and ``n_long`` long texts, each
    joined from held-out sentences not among the short ones (drawn with ``seed``).

    Raises what :func:`~orchestrator.tooling.modeling.data.held_out_texts` raises (no
    corpus; ``ValueError`` when more sentences are asked than the test split holds).
    """
    from orchestrator.tooling.modeling.data import held_out_texts

    sentences = [t for t in held_out_texts(data_dir=data_dir) if t.strip()]
    random.Random(seed).shuffle(sentences)
    if n_short > len(sentences):
        raise ValueError(f"n_short={n_short} is more than the {len(sentences)} held-out sentences")
    short, rest = sentences[:n_short], sentences[n_short:] or sentences
    longs, pos = [], 0
    for _ in range(n_long):
        parts: List[str] = []
        while len(" ".join(parts)) < LONG_MIN_CHARS:
            parts.append(rest[pos % len(rest)])
            pos += 1
        longs.append(" ".join(parts))
    texts = ["", *short, *longs]
    kinds = ["empty", *["short"] * len(short), *["long"] * len(longs)]
    return TextPool(texts, kinds)


def route_model(route: str) -> str:
    """The model a ROUTE names: ``chunked:``, ``:degraded`` and a chunk node's
    ``:windows=<used>/<made>`` stripped (``chunked:classifier_fast:degraded`` ->
    ``classifier_fast``)."""
    route = route.split(WINDOWS_DETAIL, 1)[0]
    base = route[len("chunked:"):] if route.startswith("chunked:") else route
    return base[: -len(":degraded")] if base.endswith(":degraded") else base


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestSpec:
    """One soak request: ``texts`` are pool indices ([N] texts, N in 1..16), ``thresholds``
    one per text (sent as FP32 [N, 1]), ``route`` the request parameter (None: the
    cascade), ``protocol`` ``http`` or ``grpc``, ``request_id`` unique in the run."""

    request_id: str
    texts: Tuple[int, ...]
    thresholds: Tuple[float, ...]
    route: Optional[str]
    protocol: str


@dataclass(frozen=True)
class Mix:
    """How requests are drawn: texts per request uniform in 1..``max_texts``; each text
    empty / long with these probabilities (else short); ``accurate`` / ``fast``: share of
    requests with ``route=accurate`` / ``route=fast`` (else the cascade); thresholds
    uniform in [0.05, 0.95], two decimals."""

    max_texts: int = 16
    p_empty: float = 0.08
    p_long: float = 0.12
    accurate: float = 0.3
    fast: float = 0.1


def draw_request(rng: random.Random, pool: TextPool, request_id: str, protocol: str, mix: Mix = Mix()) -> RequestSpec:
    """A random request from ``pool`` (see :class:`Mix`), reproducible from ``rng``."""
    short, long = pool.indices("short"), pool.indices("long")
    n = rng.randint(1, mix.max_texts)
    texts = []
    for _ in range(n):
        u = rng.random()
        if u < mix.p_empty:
            texts.append(0)
        elif u < mix.p_empty + mix.p_long and long:
            texts.append(rng.choice(long))
        else:
            texts.append(rng.choice(short))
    thresholds = tuple(round(rng.uniform(0.05, 0.95), 2) for _ in texts)
    u = rng.random()
    route = "accurate" if u < mix.accurate else "fast" if u < mix.accurate + mix.fast else None
    return RequestSpec(request_id, tuple(texts), thresholds, route, protocol)


def needed_models(spec: RequestSpec, pool: TextPool, margin: Optional[float]) -> frozenset:
    """The downstream models a healthy router calls for ``spec``: ``classifier_fast`` for a
    non-empty text under the cascade or ``route=fast``; ``classifier`` under
    ``route=accurate``, or under the cascade for a text whose fast probability lies within
    ``margin`` of its threshold (``margin`` None: every cascade text may escalate)."""
    need = set()
    for idx, thr in zip(spec.texts, spec.thresholds):
        if pool.kinds[idx] == "empty":
            continue
        if spec.route == "accurate":
            need.add(ACCURATE)
            continue
        need.add(FAST)
        if spec.route is None:
            ref = pool.references.get(idx)
            if margin is None or ref is None or abs(ref.fast - thr) < margin or _may_stop(pool, ref):
                need.add(ACCURATE)
    return frozenset(need)


def fast_texts(spec: RequestSpec, pool: TextPool, margin: Optional[float]) -> List[int]:
    """Positions (in ``spec.texts``) of texts a healthy router answers from
    ``classifier_fast`` alone: non-empty, under ``route=fast``, or under the cascade with
    the fast probability at least ``margin`` away from the threshold."""
    out = []
    for pos, (idx, thr) in enumerate(zip(spec.texts, spec.thresholds)):
        if pool.kinds[idx] == "empty" or spec.route == "accurate":
            continue
        ref = pool.references.get(idx)
        if spec.route == "fast" or (margin is not None and ref is not None and abs(ref.fast - thr) >= margin
                                    and not _may_stop(pool, ref)):
            out.append(pos)
    return out


def _may_stop(pool: TextPool, ref: Reference) -> bool:
    """The cascade's fast answer of this text may come from its first windows only."""
    return pool.early_stopping and ref.chunked


def chunk_stops_early(policy: Mapping) -> bool:
    """Whether a chunk node inside the first ``cascade`` of a policy document has a
    stopping key (``stop_when_decided``, ``stop_margin``, ``max_windows``)."""
    stack: list = [policy]
    cascade = None
    while stack and cascade is None:
        node = stack.pop(0)
        if isinstance(node, dict):
            if node.get("kind") == "cascade":
                cascade = node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    stack = [cascade] if cascade is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("kind") == "chunk" and any(node.get(k) not in (None, False) for k in
                                                   ("stop_when_decided", "stop_margin", "max_windows")):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


# ----------------------------------------------------------------------------- checking


def check_answer(
    spec: RequestSpec,
    pool: TextPool,
    probabilities: np.ndarray,
    verdicts: np.ndarray,
    routes: Sequence[str],
    tolerance: float = PROBABILITY_TOLERANCE,
) -> List[str]:
    """What is wrong with a 200 answer to ``spec`` (empty list: correct).

    ``probabilities`` FP32 and ``verdicts`` BOOL of shape [N, 1] (or [N]), ``routes`` N
    strings. See the module doc for the rule.
    """
    n = len(spec.texts)
    probs = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    verds = np.asarray(verdicts).reshape(-1)
    if probs.size != n or verds.size != n or len(routes) != n:
        return [f"shape: {probs.size} probabilities, {verds.size} verdicts, {len(routes)} routes for {n} texts"]
    problems = []
    for pos, (idx, thr) in enumerate(zip(spec.texts, spec.thresholds)):
        route, p, v = routes[pos], float(probs[pos]), bool(verds[pos])
        model = route_model(route)
        where = f"text {pos} (pool {idx}, {pool.kinds[idx]}), ROUTE {route!r}"
        if pool.kinds[idx] == "empty" or model == EMPTY:
            if pool.kinds[idx] != "empty" or model != EMPTY or route != EMPTY:
                problems.append(f"{where}: empty text and ROUTE 'empty' must go together")
            elif abs(p - 0.5) > tolerance or v:
                problems.append(f"{where}: empty text answered {p:.6f}/{v}, want 0.5/False")
            continue
        ref = pool.references[idx]
        if model not in (FAST, ACCURATE):
            problems.append(f"{where}: names no model of the shipped policy")
            continue
        if route.startswith("chunked:") != ref.chunked:
            problems.append(f"{where}: chunked is {ref.chunked} for this text")
        want = ref.fast if model == FAST else ref.accurate
        if WINDOWS_DETAIL in route:  # the aggregate of its first windows: no reference
            used, _, made = route.split(WINDOWS_DETAIL, 1)[1].partition("/")
            if not (used.isdigit() and made.isdigit() and 0 < int(used) < int(made) and ref.chunked):
                problems.append(f"{where}: a windows count that no chunk node makes")
        elif abs(p - want) > tolerance:
            problems.append(f"{where}: probability {p:.6f}, healthy {model} answer {want:.6f}")
        # exactly at the threshold float32 rounding may go either way
        if abs(p - thr) > 1e-6 and v != (p >= thr):
            problems.append(f"{where}: verdict {v} for probability {p:.6f} and threshold {thr}")
    return problems


def compute_references(send, pool: TextPool, batch: int = 64) -> Dict[int, Reference]:
    """Healthy answers for every non-empty text of ``pool`` (also stored in it).

    ``send(texts, route) -> (probabilities [N], routes [N])`` sends one request of at most
    ``batch`` texts with the request parameter ``route`` (``fast`` / ``accurate``). Raises
    ``RuntimeError`` when a healthy answer names another model than the one asked for.
    """
    indices = [i for i, kind in enumerate(pool.kinds) if kind != "empty"]
    answers: Dict[str, Dict[int, Tuple[float, str]]] = {"fast": {}, "accurate": {}}
    for route in ROUTE_PARAMETER_VALUES:
        want = FAST if route == "fast" else ACCURATE
        for start in range(0, len(indices), batch):
            part = indices[start : start + batch]
            probs, routes = send([pool.texts[i] for i in part], route)
            for i, p, r in zip(part, probs, routes):
                if route_model(r) != want or r.endswith(":degraded"):
                    raise RuntimeError(f"healthy reference: route={route} answered text {i} with ROUTE {r!r}")
                answers[route][i] = (float(p), r)
    refs = {
        i: Reference(answers["fast"][i][0], answers["accurate"][i][0], answers["fast"][i][1].startswith("chunked:"))
        for i in indices
    }
    pool.references = refs
    return refs


def cascade_margin(policy: Mapping) -> Optional[float]:
    """The ``margin`` of the first ``cascade`` node in a policy document (None: none)."""
    stack = [policy]
    while stack:
        node = stack.pop(0)
        if isinstance(node, dict):
            if node.get("kind") == "cascade" and "margin" in node:
                return float(node["margin"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None
