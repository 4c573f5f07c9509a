"""``orchestrator tune POLICY --data LABELED``: a policy's operating points chosen from data.

What it does (docs/guides/tune.md):

1. reads the policy (``orchestrator.runtime.routing.policy``) and its models' heads from the
   repository (``--repo``, default the one holding the policy); every ``cascade`` node is
   tuned: each stage must be a model, a chunk node of a model, or a ``fallback`` whose
   first node is one of those (the stage as it runs while nothing is broken);
2. runs the labeled texts through the real models in this process (onnxruntime sessions
   of each model's ONNX file, each model's tokenizer files, ``heads.Head.probabilities``
   with its calibration and the model node's ``calibration`` shift), window by window:
   the short texts of ``--data`` as they are, and long texts joined from them
   (``modeling.long_texts``: same-label texts and turning texts, whose label is the later,
   longer part's);
3. chunk nodes with ``stop_margin``: sweeps it on the long texts (the stage alone), with the
   runtime's own stopping code (``nodes.chunk._stop_reason``, ``stop_when_decided`` kept:
   it is exact), drawing accuracy and agreement with reading every window against windows
   read; keeps the fewest windows meeting the chunk target (default: at least the accuracy
   of reading every window), or removes ``stop_margin`` when no value does;
4. cascades: sweeps ``margin`` on the short texts, drawing accuracy and agreement with the
   last stage alone against the escalation rate (texts sent past the first stage);
   ``unsure`` is the runtime's ``heads.Head.unsure`` (binary ``|p - t| < margin``;
   multiclass top-two gap; multilabel any label); keeps the cheapest margin meeting
   ``--target``: ``accuracy>=last`` (at least the last stage's own accuracy),
   ``accuracy>=0.8``, ``agreement>=0.99`` (that share of the last stage's verdicts),
   ``noninferior:0.5`` (the one-sided 95% lower bound of accuracy minus the last stage's,
   a paired bootstrap over the tuning texts, above -0.5 percentage points: :func:`noninferiority`);
5. writes the curves (``curves.json``, ``cascade_<name>.png``, ``chunk_<name>.png``), the
   tuned policy (``policy.yaml``: the margins replaced in the text, comments kept, each
   with a comment saying where it came from, checked with the policy parser and the
   repository's heads) and ``tune.md`` under ``--out`` (default ``.cache/tune``); with
   ``--write`` the policy file itself is edited;
6. with ``--report-data`` (e.g. ``split:test``): the same measures at the chosen point on
   other texts (never the tuning texts), next to the last stage alone, the ensemble's
   answer (the last stage reading the first ``max_sequence_length`` tokens) and the router
   reading every window;
7. with ``--url``: each stage model's throughput and the router's own overhead per text
   (a part per text and a part per text reaching each later stage, fitted from the router
   as served on text lists with a known escalated share) measured on that server and every
   point's predicted, the chosen point run through the router where it serves that margin
   (:mod:`orchestrator.tooling.tune_throughput`).

Errors: :class:`TuneError` (message names the input); ``ParityError``/``OSError`` for data.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from orchestrator.runtime.execution.tokenize import truncate
from orchestrator.runtime.routing import policy as P
from orchestrator.runtime.routing.heads import MULTICLASS, Head
from orchestrator.runtime.routing.nodes.base import Answer
from orchestrator.runtime.routing.nodes.cascade import CascadeNode
from orchestrator.runtime.routing.nodes.chunk import ChunkNode, ChunkText, _combine, _stop_reason, token_windows, window_weights
from orchestrator.runtime.routing.nodes.fallback import FallbackNode
from orchestrator.runtime.routing.nodes.model import ModelNode
from orchestrator.tooling.errors import ToolingError, TuneError
from orchestrator.tooling.paths import PROJECT_ROOT

#: Cascade margins swept (probability distances).
MARGINS = tuple(float(x) for x in np.round(np.arange(0.0, 0.5 + 1e-9, 0.005), 3))
#: Chunk ``stop_margin`` values swept; None: no stop_margin.
STOP_MARGINS: Tuple[Optional[float], ...] = (None,) + tuple(float(x) for x in np.round(np.arange(0.05, 0.5 + 1e-9, 0.025), 3))
BATCH = 64
#: Bootstrap draws of every paired interval.
RESAMPLES = 2000
LONG_TEXTS = 120  # of each kind


# ----------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """``measure>=value``: ``measure`` accuracy or agreement; ``value`` a share in [0, 1], or
    None for ``last`` (the reference's own accuracy: the last stage alone, or reading every
    window). ``noninferior:value``: ``value`` a margin in percentage points; a point meets it
    when its ``difference_low`` (the one-sided 95% lower bound of its accuracy minus the last
    stage's, a share: :func:`noninferiority`) is above ``-value / 100``."""

    measure: str
    value: Optional[float]

    def met(self, point: Mapping[str, float], reference_accuracy: float) -> bool:
        """Raises KeyError: a noninferior target on a point without ``difference_low``."""
        if self.measure == "noninferior":
            return point["difference_low"] > -self.value / 100.0  # type: ignore[operator]
        want = reference_accuracy if self.value is None else self.value
        return point[self.measure] >= want - 1e-12

    def __str__(self) -> str:
        if self.measure == "noninferior":
            return f"noninferior:{self.value:g}"
        return f"{self.measure}>={'last' if self.value is None else f'{self.value:g}'}"


def parse_target(text: str) -> Target:
    """``accuracy>=last``, ``accuracy>=0.8``, ``agreement>=0.99``, ``noninferior:0.5`` (a
    margin in percentage points, 0 to 100).

    Raises:
        TuneError: another form.
    """
    m = re.fullmatch(r"\s*noninferior\s*:\s*([0-9]*\.?[0-9]+)\s*", text)
    if m:
        value = float(m.group(1))
        if not 0.0 <= value <= 100.0:
            raise TuneError(f"--target {text!r}: {value} is not a margin in percentage points (0 to 100)")
        return Target("noninferior", value)
    m = re.fullmatch(r"\s*(accuracy|agreement)\s*>=\s*(last|[0-9]*\.?[0-9]+)\s*", text)
    if not m or (m.group(1) == "agreement" and m.group(2) == "last"):
        raise TuneError(f"--target {text!r}: expected accuracy>=last, accuracy>=X, agreement>=X (X a share in [0, 1]) "
                        "or noninferior:P (P a margin in percentage points)")
    value = None if m.group(2) == "last" else float(m.group(2))
    if value is not None and not 0.0 <= value <= 1.0:
        raise TuneError(f"--target {text!r}: {value} is not a share in [0, 1]")
    return Target(m.group(1), value)


# ----------------------------------------------------------------------------- answers and measures


def correct(head: Head, probs: np.ndarray, labels: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """bool [N]: each text's answer right (multiclass: top label; else every verdict)."""
    p = np.asarray(probs, dtype=np.float64).reshape(len(probs), -1)
    if head.kind == MULTICLASS:
        return p.argmax(axis=1) == np.asarray(labels).reshape(-1)
    v = head.verdicts(p, np.full((len(p), 1), threshold))
    return (v == np.asarray(labels).astype(bool).reshape(len(p), -1)).all(axis=1)


def same(head: Head, a: np.ndarray, b: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """bool [N]: two answers of each text agree (multiclass: top label; else every verdict)."""
    a, b = (np.asarray(x, dtype=np.float64).reshape(len(x), -1) for x in (a, b))
    if head.kind == MULTICLASS:
        return a.argmax(axis=1) == b.argmax(axis=1)
    t = np.full((len(a), 1), threshold)
    return (head.verdicts(a, t) == head.verdicts(b, t)).all(axis=1)


def cascade_answers(head: Head, stages: Sequence[np.ndarray], margin: float,
                    threshold: float = 0.5) -> Tuple[np.ndarray, List[np.ndarray]]:
    """The cascade's answers float64 [N, columns] at ``margin`` for stage answers ``stages``
    (each float64 [N, columns], every text answered by every stage), and per stage the bool
    [N] mask of the texts that reached it: a text unsure at stage i (``head.unsure``, the
    runtime's rule) takes stage i+1's answer."""
    n = len(stages[0])
    t = np.full((n, 1), threshold)
    answer, reached = stages[0].copy(), [np.ones(n, dtype=bool)]
    for i in range(1, len(stages)):
        go = reached[-1] & head.unsure(answer, t, margin)
        answer[go] = stages[i][go]
        reached.append(go)
    return answer, reached


def cascade_curve(head: Head, stages: Sequence[np.ndarray], labels: np.ndarray, margins: Sequence[float] = MARGINS,
                  threshold: float = 0.5) -> List[Dict[str, float]]:
    """The cascade's points: per margin ``{"margin", "escalation_rate", "accuracy",
    "agreement"}`` for stage answers ``stages`` (each float64 [N, columns], every text
    answered by every stage; :func:`cascade_answers`); the escalation rate counts texts
    sent past the first stage; agreement is with the last stage alone."""
    out = []
    for m in margins:
        answer, reached = cascade_answers(head, stages, m, threshold)
        escalated = reached[1] if len(reached) > 1 else np.zeros(len(labels), dtype=bool)
        out.append({"margin": float(m), "escalation_rate": float(escalated.mean()),
                    "accuracy": float(correct(head, answer, labels, threshold).mean()),
                    "agreement": float(same(head, answer, stages[-1], threshold).mean())})
    return out


def choose(points: Sequence[Mapping[str, Any]], target: Target, reference_accuracy: float, cost: str) -> Optional[Dict[str, Any]]:
    """The point of least ``cost`` (then the earliest in ``points``) meeting ``target``, or
    None."""
    ok = [dict(p) for p in points if target.met(p, reference_accuracy)]
    return min(ok, key=lambda p: p[cost]) if ok else None


# ----------------------------------------------------------------------------- chunk simulation


@dataclass
class _Engine:  # what nodes.chunk._stop_reason reads of the engine
    head: Head


@dataclass
class _Item:  # what nodes.chunk._stop_reason reads of an item
    threshold: np.ndarray


def chunk_answer(head: Head, node: ChunkNode, window_probs: Sequence[np.ndarray], weights: Sequence[int],
                 threshold: float = 0.5) -> Tuple[np.ndarray, int]:
    """One text's answer float64 [columns] and the windows used, by the runtime's own
    rules (``nodes.chunk``: windows in order, ``_stop_reason`` after each, the aggregate of
    the windows used) for window answers ``window_probs`` (each [columns])."""
    if len(window_probs) == 1:
        return np.asarray(window_probs[0], dtype=np.float64).reshape(-1), 1
    text = ChunkText(_Item(np.array([threshold])), [None] * len(window_probs), list(weights))  # type: ignore[arg-type, list-item]
    for p in window_probs:
        text.answers.append(Answer(np.asarray(p, dtype=np.float64).reshape(-1), ""))
        if node.stops_early:
            reason = _stop_reason(_Engine(head), node, text)  # type: ignore[arg-type]
            if reason is not None:
                text.stop(reason)
                break
    used = len(text.answers)
    return _combine(head, node.aggregation, [a.probabilities for a in text.answers], text.weights[:used]), used


# ----------------------------------------------------------------------------- the policy's stages


@dataclass
class Stage:
    """A cascade stage as tune runs it: ``model`` (its node, for the logit shift), and the
    chunk node around it (None: the model reads the first ``max_length`` tokens)."""

    model: ModelNode
    chunk: Optional[ChunkNode]


def resolve_stage(node: Any, where: str) -> Stage:
    """The stage a cascade's ``node`` is while nothing is broken.

    Raises:
        TuneError: a stage of another shape.
    """
    chunk = None
    while True:
        if isinstance(node, FallbackNode):
            node = node.nodes[0]
        elif isinstance(node, ChunkNode):
            if chunk is not None:
                raise TuneError(f"{where}: a chunk node inside a chunk node")
            chunk, node = node, node.node
        elif isinstance(node, ModelNode):
            return Stage(node, chunk)
        else:
            raise TuneError(f"{where}: a '{node.kind}' node; tune runs stages that are a model, a chunk node of a "
                            "model, or a fallback whose first node is one of those")


def cascades(policy: P.Policy) -> List[CascadeNode]:
    """The policy's cascade nodes, depth first."""
    from orchestrator.runtime.routing.nodes.base import descendants

    return [n for n in [policy.root] + descendants(policy.root) if isinstance(n, CascadeNode)]


# ----------------------------------------------------------------------------- models in this process


class Models:
    """The repository's models in this process: window answers per text and model."""

    def __init__(self, repo: Path, heads: Mapping[str, Head], threads: Optional[int] = None):
        from orchestrator.runtime.execution.tokenize import TextTokenizer
        from orchestrator.tooling.modeling.contract import ort_session
        from orchestrator.tooling.modeling.parity.backends import onnx_file

        self.repo, self.heads = repo, heads
        self.sessions: Dict[str, Any] = {}
        self.tokenizers: Dict[str, Any] = {}
        for model, head in heads.items():
            path = onnx_file(repo / model)
            if not path.is_file():
                raise TuneError(f"model '{model}': {path} does not exist (tune runs the models' ONNX files)")
            self.sessions[model] = ort_session(path, threads)
            if head.tokenizer not in self.tokenizers:
                tok_dir = repo / head.tokenizer / "1"
                if not (tok_dir / "tokenizer.json").is_file():
                    raise TuneError(f"tokenizer '{head.tokenizer}' (of '{model}'): {tok_dir} has no tokenizer.json")
                self.tokenizers[head.tokenizer] = TextTokenizer(tok_dir)  # as the tokenizer model serves it

    def ids(self, tokenizer: str, texts: Sequence[str]) -> List[np.ndarray]:
        """Token ids int64 [T] of each text, special tokens included, not truncated."""
        return self.tokenizers[tokenizer].encode(list(texts), truncation=False)

    def logits(self, model: str, rows: Sequence[np.ndarray]) -> np.ndarray:
        """float32 [len(rows), num_logits]: the model on each row of token ids (padded with
        its head's pad id, longest first in batches of :data:`BATCH`)."""
        head = self.heads[model]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        out = np.zeros((len(rows), head.num_logits), dtype=np.float32)
        for s in range(0, len(order), BATCH):
            idx = order[s:s + BATCH]
            width = max(len(rows[i]) for i in idx)
            ids = np.full((len(idx), width), head.pad_token_id, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for j, i in enumerate(idx):
                ids[j, :len(rows[i])], mask[j, :len(rows[i])] = rows[i], 1
            out[idx] = self.sessions[model].run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
        return out

    def windows(self, stage: Stage, texts: Sequence[str], max_length: int) -> Tuple[List[List[np.ndarray]], List[List[int]]]:
        """Per text, the stage model's answer (float64 [columns]) for each window the stage
        reads (a chunk node's windows; else one, truncated to ``max_length``) and the
        windows' aggregation weights."""
        head = self.heads[stage.model.model]
        ids = self.ids(head.tokenizer, texts)
        if stage.chunk is None:
            rows = [[truncate(x, min(max_length, head.max_length))] for x in ids]
            weights = [[1] for _ in ids]
        else:
            c = stage.chunk
            rows = [token_windows(x, c.window, c.stride) for x in ids]
            weights = [window_weights(len(x), c.window, c.stride) for x in ids]
        flat = [w for r in rows for w in r]
        probs = head.probabilities(self.logits(stage.model.model, flat), np.asarray(stage.model.logit_shift, dtype=np.float64))
        out, k = [], 0
        for r in rows:
            out.append([probs[k + j] for j in range(len(r))])
            k += len(r)
        return out, weights


def chunk_answers(head: Head, chunk: Optional[ChunkNode], windows: Sequence[Sequence[np.ndarray]], weights: Sequence[Sequence[int]],
            threshold: float = 0.5) -> Tuple[np.ndarray, np.ndarray]:
    """float64 [N, columns] answers and int [N] windows used, with ``chunk`` deciding when a
    text stops (None: no chunk node, each text's one truncated row)."""
    if chunk is None:
        return np.stack([np.asarray(w[0], dtype=np.float64).reshape(-1) for w in windows]), np.ones(len(windows), dtype=int)
    res = [chunk_answer(head, chunk, w, ws, threshold) for w, ws in zip(windows, weights)]
    return np.stack([r[0] for r in res]), np.array([r[1] for r in res])


def stage_answers(head: Head, stage: Stage, windows: Sequence[Sequence[np.ndarray]], weights: Sequence[Sequence[int]],
                  chunk: Optional[ChunkNode] = None, threshold: float = 0.5) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`chunk_answers` of a stage, with ``chunk`` (default: the stage's own chunk node)."""
    return chunk_answers(head, chunk if chunk is not None else stage.chunk, windows, weights, threshold)


def without_stop_keys(node: ChunkNode) -> ChunkNode:
    """``node`` reading every window."""
    return dataclasses.replace(node, stop_when_decided=False, stop_margin=None, max_windows=None)


def stop_curve(head: Head, node: ChunkNode, windows: Sequence[Sequence[np.ndarray]], weights: Sequence[Sequence[int]],
               labels: np.ndarray, stop_margins: Sequence[Optional[float]] = STOP_MARGINS,
               threshold: float = 0.5) -> Tuple[List[Dict[str, Any]], Dict[str, float]]:
    """A chunk node's points over ``stop_margins`` (its other stopping keys kept):
    ``{"stop_margin", "windows_per_text", "accuracy", "agreement"}`` (agreement with reading
    every window), and the reference: every window read."""
    full, used_full = chunk_answers(head, without_stop_keys(node), windows, weights, threshold)
    ref = {"windows_per_text": float(used_full.mean()), "accuracy": float(correct(head, full, labels, threshold).mean())}
    pts = []
    for sm in stop_margins:
        p, used = chunk_answers(head, dataclasses.replace(node, stop_margin=sm), windows, weights, threshold)
        pts.append({"stop_margin": sm, "windows_per_text": float(used.mean()),
                    "accuracy": float(correct(head, p, labels, threshold).mean()),
                    "agreement": float(same(head, p, full, threshold).mean())})
    return pts, ref


# ----------------------------------------------------------------------------- long texts


def long_texts(models: Models, tokenizer: str, texts: Sequence[str], labels: np.ndarray, n: int = LONG_TEXTS) -> Dict[str, Tuple[List[str], np.ndarray]]:
    """``{"same_label": (texts, labels), "turning": (texts, labels)}`` joined from ``texts``
    (``modeling.long_texts``: the same-label rule, and the turning rule: the later, longer
    part's label), ``n`` of each at most, in a fixed shuffled order (``RandomState(0)``)."""
    from orchestrator.tooling.modeling.long_texts import same_label_long_texts, turning_long_texts

    order = np.random.RandomState(0).permutation(len(texts))
    t = [texts[i] for i in order]
    ys = [labels[i] for i in order]
    keys = [tuple(bool(v) for v in y) if np.ndim(y) else int(y) for y in ys]
    lengths = [len(x) for x in models.ids(tokenizer, t)]

    def count(s: str) -> int:
        return len(models.ids(tokenizer, [s])[0])

    out = {}
    same_pairs = same_label_long_texts(t, [hash(k) for k in keys], lengths, count, n=n) if keys else []
    by_hash = {hash(k): k for k in keys}
    out["same_label"] = ([s for s, _ in same_pairs], np.array([by_hash[y] for _, y in same_pairs]))
    turning = turning_long_texts(t, keys, lengths, count, n=n)
    out["turning"] = ([s for s, _ in turning], np.array([y for _, y in turning]))
    return out


# ----------------------------------------------------------------------------- editing the policy text


def _find_mapping(node: Any, kind: str, name: str) -> Any:
    import yaml

    if isinstance(node, yaml.MappingNode):
        keys = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
        if getattr(keys.get("kind"), "value", None) == kind and getattr(keys.get("name"), "value", None) == name:
            return node
        children = [v for _, v in node.value]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        return None
    for c in children:
        found = _find_mapping(c, kind, name)
        if found is not None:
            return found
    return None


def edit_policy_text(text: str, edits: Sequence[Tuple[str, str, str, Optional[float], str]]) -> str:
    """``text`` (a policy YAML document) with each edit ``(kind, node name, key, value,
    comment)`` applied to the mapping of that node: the key's value replaced (its line's
    comment replaced by ``comment``), the key added after ``name`` (block mappings: a line
    of its own; flow mappings: before the closing brace) or, for ``value`` None, removed.
    Every other byte is kept.

    Raises:
        TuneError: the node is not in the document.
    """
    import yaml

    spans: List[Tuple[int, int, str]] = []
    root = yaml.compose(text)
    for kind, name, key, value, comment in edits:
        m = _find_mapping(root, kind, name)
        if m is None:
            raise TuneError(f"the policy has no {kind} node named '{name}'")
        pairs = {k.value: (k, v) for k, v in m.value}
        rendered = f"{value:g}" if value is not None else ""
        if key in pairs:
            k, v = pairs[key]
            if m.flow_style:
                if value is None:  # from the end of the previous value (or to the next key's start)
                    i = [kk.value for kk, _ in m.value].index(key)
                    spans.append((m.value[i - 1][1].end_mark.index, v.end_mark.index, "") if i > 0 else
                                 (k.start_mark.index, m.value[1][0].start_mark.index if len(m.value) > 1 else v.end_mark.index, ""))
                else:
                    spans.append((v.start_mark.index, v.end_mark.index, rendered))
                continue
            line_start = text.rfind("\n", 0, k.start_mark.index) + 1
            line_end = text.find("\n", v.end_mark.index)
            line_end = len(text) if line_end < 0 else line_end
            if value is None:
                spans.append((line_start, min(line_end + 1, len(text)), ""))
            else:
                spans.append((v.start_mark.index, line_end, f"{rendered}  # {comment}"))
        elif value is not None:
            k, v = pairs["name"]
            if m.flow_style:
                close = m.end_mark.index - 1
                spans.append((close, close, f", {key}: {rendered}"))
            else:
                line_end = text.find("\n", v.end_mark.index)
                line_end = len(text) if line_end < 0 else line_end
                indent = " " * k.start_mark.column
                spans.append((line_end, line_end, f"\n{indent}{key}: {rendered}  # {comment}"))
    for start, end, new in sorted(spans, reverse=True):
        text = text[:start] + new + text[end:]
    return text


# ----------------------------------------------------------------------------- plots


def plot_curve(path: Path, points: Sequence[Mapping[str, Any]], x: str, xlabel: str, title: str,
               chosen: Optional[Mapping[str, Any]], references: Mapping[str, float]) -> Path:
    """Accuracy and agreement against ``x`` (PNG, matplotlib), the chosen point marked and
    ``references`` (name -> accuracy) as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(points, key=lambda p: p[x])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[x] for p in pts], [p["accuracy"] for p in pts], ".-", label="accuracy")
    ax.plot([p[x] for p in pts], [p["agreement"] for p in pts], ".-", label="agreement with the reference")
    for name, y in references.items():
        ax.axhline(y, linestyle=":", color="grey")
        ax.annotate(name, (pts[0][x], y), fontsize=7, va="bottom")
    if chosen is not None:
        ax.plot([chosen[x]], [chosen["accuracy"]], "r*", markersize=12, label="chosen")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of texts")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- the command


@dataclass
class Measured:
    """Window answers of every stage model on one set of texts."""

    texts: List[str]
    labels: np.ndarray
    windows: Dict[str, Tuple[List[List[np.ndarray]], List[List[int]]]] = field(default_factory=dict)


def _measure(models: Models, stages: Sequence[Stage], texts: List[str], labels: np.ndarray, max_length: int) -> Measured:
    m = Measured(texts, labels)
    for s in stages:
        if s.model.name not in m.windows:
            m.windows[s.model.name] = models.windows(s, texts, max_length)
    return m


def paired_difference(a: np.ndarray, b: np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
                      alternative: str = "two-sided") -> Dict[str, Any]:
    """Accuracy of answers ``a`` minus that of ``b`` (bool [N] each: right or not, the same
    texts) and its 95% confidence interval: a paired bootstrap over the texts
    (``scipy.stats.bootstrap``, BCa, ``resamples`` draws, fixed ``seed``; percentile where
    BCa is undefined). Returns ``{"difference", "low", "high"}`` (shares, -1 to 1);
    ``alternative="greater"``: ``high`` is None and ``low`` the one-sided 95% lower bound.

    Raises:
        ValueError: another ``alternative``, or ``a`` and ``b`` of different lengths.
    """
    from scipy import stats

    if alternative not in ("two-sided", "greater"):
        raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"paired answers of different shapes: {x.shape} and {y.shape}")
    diff = float(x.mean() - y.mean())
    high: Optional[float] = diff if alternative == "two-sided" else None
    if len(x) < 2 or np.array_equal(x, y):  # nothing to resample: no text differs
        return {"difference": diff, "low": diff, "high": high}
    for method in ("BCa", "percentile"):
        res = stats.bootstrap((x, y), lambda u, v, axis=-1: u.mean(axis=axis) - v.mean(axis=axis), paired=True,
                              vectorized=True, n_resamples=resamples, confidence_level=0.95, method=method,
                              alternative=alternative, random_state=np.random.RandomState(seed))
        if np.isfinite(res.confidence_interval.low):
            break
    ci = res.confidence_interval
    return {"difference": diff, "low": float(ci.low), "high": float(ci.high) if alternative == "two-sided" else None}


def noninferiority(head: Head, stages: Sequence[np.ndarray], labels: np.ndarray, points: Sequence[Dict[str, Any]],
                   threshold: float = 0.5, resamples: int = RESAMPLES, seed: int = 0) -> None:
    """Adds to each cascade point (:func:`cascade_curve`, the same ``stages`` and ``labels``)
    ``difference`` (its accuracy minus the last stage's, a share) and ``difference_low``: that
    difference's one-sided 95% lower bound, a paired bootstrap over the texts
    (:func:`paired_difference`, ``alternative="greater"``, ``resamples`` draws, ``seed``)."""
    last = correct(head, stages[-1], labels, threshold)
    seen: Dict[bytes, Dict[str, Any]] = {}
    for p in points:
        right = correct(head, cascade_answers(head, stages, p["margin"], threshold)[0], labels, threshold)
        key = np.packbits(right).tobytes()
        if key not in seen:  # neighbouring margins often answer every text alike
            seen[key] = paired_difference(right, last, resamples, seed, alternative="greater")
        p["difference"], p["difference_low"] = seen[key]["difference"], seen[key]["low"]


def evaluate(head: Head, stages: Sequence[Stage], m: Measured, margin: float, chunks: Mapping[str, Optional[ChunkNode]],
             threshold: float = 0.5) -> Tuple[Dict[str, float], np.ndarray]:
    """Accuracy, agreement with the last stage alone (every window), escalation rate and
    windows per text of the cascade at ``margin`` with chunk nodes ``chunks`` (stage model
    node name -> chunk node as tuned; None: as in the stage), and the cascade's answers
    (float64 [N, columns])."""
    answers, used = [], []
    for s in stages:
        w, ws = m.windows[s.model.name]
        a, u = stage_answers(head, s, w, ws, chunks.get(s.model.name), threshold)
        answers.append(a)
        used.append(u)
    last_w, last_ws = m.windows[stages[-1].model.name]
    last_full, _ = stage_answers(head, stages[-1], last_w, last_ws,
                                 without_stop_keys(stages[-1].chunk) if stages[-1].chunk else None, threshold)
    final, reached = cascade_answers(head, answers, margin, threshold)
    windows = sum((np.where(r, u, 0) for r, u in zip(reached, used)), np.zeros(len(m.labels)))
    pt = {"margin": float(margin), "escalation_rate": float(reached[1].mean()) if len(reached) > 1 else 0.0,
          "accuracy": float(correct(head, final, m.labels, threshold).mean()),
          "agreement": float(same(head, final, last_full, threshold).mean()),
          "windows_per_text": float(windows.mean()), "n": int(len(m.labels))}
    return pt, final


def _tune_chunks(head: Head, stages: Sequence[Stage], models: Models, tuning: Any, data: str, goal: Target, source: str,
                 max_length: int, threshold: float, long_n: int, out: Path, result: Dict[str, Any],
                 edits: List[Tuple[str, str, str, Optional[float], str]]) -> Dict[str, Optional[ChunkNode]]:
    """Sweep ``stop_margin`` of each stage's chunk node that has a stopping key, on long
    texts joined from the tuning texts; returns stage model node name -> the chunk node as
    tuned (None: the stage's own), adding to ``result["chunks"]`` and ``edits``."""
    chunked: Dict[str, Optional[ChunkNode]] = {}
    kinds = long_texts(models, models.heads[stages[0].model.model].tokenizer, list(tuning.texts), tuning.labels, long_n)
    texts = kinds["same_label"][0] + kinds["turning"][0]
    labels = np.concatenate([kinds["same_label"][1], kinds["turning"][1]]) if len(kinds["turning"][1]) else kinds["same_label"][1]
    for s in stages:
        if s.chunk is None or (s.chunk.stop_margin is None and not s.chunk.stop_when_decided):
            chunked[s.model.name] = None
            continue
        lm = _measure(models, [s], texts, labels, max_length)
        pts, ref = stop_curve(head, s.chunk, *lm.windows[s.model.name], lm.labels, threshold=threshold)
        best = choose(pts, goal, ref["accuracy"], "windows_per_text")
        sm = best["stop_margin"] if best else None
        chunked[s.model.name] = dataclasses.replace(s.chunk, stop_margin=sm)
        plot_curve(out / f"chunk_{s.chunk.name}.png", pts, "windows_per_text", "windows read per long text",
                   f"{s.chunk.name} ({s.model.model}) on {len(texts)} long texts of {data}: stop_margin sweep",
                   best, {"every window": ref["accuracy"]})
        result["chunks"].append({"name": s.chunk.name, "model": s.model.model, "long_texts": len(texts),
                                 "same_label": len(kinds["same_label"][0]), "turning": len(kinds["turning"][0]),
                                 "every_window": ref, "points": pts, "chosen": best,
                                 "stop_when_decided": s.chunk.stop_when_decided})
        if sm is not None:
            edits.append(("chunk", s.chunk.name, "stop_margin", sm, f"{source}, {goal} on long texts"))
        elif s.chunk.stop_margin is not None:
            edits.append(("chunk", s.chunk.name, "stop_margin", None, ""))
    return chunked


def _tune_margin(head: Head, cascade: CascadeNode, stages: Sequence[Stage], answers: Sequence[np.ndarray], labels: np.ndarray,
                 goal: Target, data: str, out: Path, threshold: float) -> Tuple[Dict[str, Any], str]:
    """Sweep one cascade's ``margin`` over stage answers ``answers`` (float64 [N, columns]
    each): its ``curves.json`` entry (the chosen point under ``"chosen"``) and the policy
    comment's figures; the plot ``cascade_<name>.png`` under ``out``.

    Raises:
        TuneError: no margin meets ``goal``.
    """
    pts = cascade_curve(head, answers, labels, MARGINS, threshold)
    last_acc = float(correct(head, answers[-1], labels, threshold).mean())
    if goal.measure == "noninferior":
        noninferiority(head, answers, labels, pts, threshold)
    best = choose(pts, goal, last_acc, "escalation_rate")
    if best is None:
        raise TuneError(f"cascade '{cascade.name}': no margin up to {MARGINS[-1]} meets {goal} on {data} "
                        f"(last stage alone: accuracy {last_acc:.4f}); choose another --target")
    plot_curve(out / f"cascade_{cascade.name}.png", pts, "escalation_rate", "escalation rate (texts sent past the first stage)",
               f"cascade {cascade.name} on {len(labels)} texts of {data}: margin sweep", best,
               {"last stage alone": last_acc, "first stage alone": float(correct(head, answers[0], labels, threshold).mean())})
    entry: Dict[str, Any] = {"name": cascade.name, "stages": [s.model.model for s in stages], "was": cascade.margin,
                             "last_stage_accuracy": last_acc, "points": pts, "chosen": best}
    note = (f"escalates {100 * best['escalation_rate']:.1f}%, accuracy {100 * best['accuracy']:.2f}% "
            f"(last stage alone {100 * last_acc:.2f}%)")
    if goal.measure == "noninferior":
        entry["noninferiority"] = {"margin_points": goal.value, "confidence": 0.95, "one_sided": True,
                                   "method": "paired bootstrap over the tuning texts (scipy.stats.bootstrap, BCa)",
                                   "resamples": RESAMPLES, "seed": 0}
        note += (f", minus last stage {100 * best['difference']:+.2f} points (one-sided 95% lower bound "
                 f"{100 * best['difference_low']:+.2f})")
    return entry, note


def tune(policy_path: Path, data: str, repo: Optional[Path] = None, target: str = "accuracy>=last",
         chunk_target: str = "accuracy>=last", report_data: Optional[str] = None, out: Optional[Path] = None,
         write: bool = False, threshold: float = 0.5, long_n: int = LONG_TEXTS, url: Optional[str] = None,
         concurrency: Optional[int] = None, duration_s: Optional[float] = None,
         router_model: Optional[str] = None, router_overhead_ms: Optional[float] = None,
         router_stage_overhead_ms: Optional[Sequence[float]] = None,
         overhead_shares: Optional[Sequence[float]] = None) -> Dict[str, Any]:
    """The command (module docstring); returns ``curves.json``'s document. ``url``
    (``grpc://HOST:PORT`` or ``http://HOST:PORT``): each point's throughput predicted on that
    server (:mod:`orchestrator.tooling.tune_throughput`, ``concurrency`` clients,
    ``duration_s`` seconds per model; ``router_model`` default: the policy file's directory
    name; ``router_overhead_ms``: the router's own milliseconds per text and
    ``router_stage_overhead_ms`` its extra milliseconds per text reaching each later stage
    (0 each when not given), instead of fitting them; ``overhead_shares``: the escalated
    shares of the text lists they are fitted from, each in [0, 1], default
    ``tune_throughput.OVERHEAD_SHARES``) under ``"throughput"``.

    Raises:
        TuneError: also ``router_stage_overhead_ms`` without ``router_overhead_ms``, fewer
            than two distinct overhead shares or one outside [0, 1].
    """
    from orchestrator.tooling.modeling.parity.calibration import load_data
    from orchestrator.tooling.policy_cli import _repository_for, bind_repository

    policy_path = Path(policy_path)
    goal, chunk_goal = parse_target(target), parse_target(chunk_target)
    from orchestrator.tooling.tune_throughput import check_overhead_arguments

    check_overhead_arguments(router_overhead_ms, router_stage_overhead_ms, overhead_shares)
    if chunk_goal.measure == "noninferior":
        raise TuneError(f"--chunk-target {chunk_target!r}: noninferior is a cascade target; use accuracy>=... or agreement>=...")
    try:
        policy = P.load_policy(policy_path)
    except P.PolicyError as exc:
        raise TuneError(f"{policy_path}: {exc}") from None
    repo = _repository_for(policy_path, str(repo) if repo else None)
    bound, errors = bind_repository(policy, repo, "embedded")
    if bound is None:
        raise TuneError(f"{policy_path} with {repo}: " + "; ".join(errors))
    policy, head = bound, bound.head  # the plan: its model nodes carry their heads
    found = cascades(policy)
    if not found:
        raise TuneError(f"{policy_path}: no cascade node to tune")
    plan = [(c, [resolve_stage(s, f"{c.name}.stages[{i}]") for i, s in enumerate(c.stages)]) for c in found]
    heads = {s.model.model: s.model.head for _, stages in plan for s in stages}
    models = Models(repo, heads)
    out = Path(out) if out else PROJECT_ROOT / ".cache" / "tune"
    out.mkdir(parents=True, exist_ok=True)
    tuning = load_data(data, head)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    source = f"orchestrator tune {stamp}, {data} ({len(tuning.texts)} texts)"
    result: Dict[str, Any] = {"policy": str(policy_path), "repo": str(repo), "data": data, "n": len(tuning.texts),
                              "target": str(goal), "chunk_target": str(chunk_goal), "threshold": threshold,
                              "cascades": [], "chunks": []}
    edits: List[Tuple[str, str, str, Optional[float], str]] = []
    tuned_chunks: Dict[str, Dict[str, Optional[ChunkNode]]] = {}
    stage_answers_of: Dict[str, Tuple[List[np.ndarray], Measured]] = {}
    for cascade, stages in plan:
        short = _measure(models, stages, list(tuning.texts), tuning.labels, policy.max_sequence_length)
        chunked = _tune_chunks(head, stages, models, tuning, data, chunk_goal, source, policy.max_sequence_length,
                               threshold, long_n, out, result, edits)
        tuned_chunks[cascade.name] = chunked
        answers = [stage_answers(head, s, *short.windows[s.model.name], chunked.get(s.model.name), threshold)[0] for s in stages]
        entry, note = _tune_margin(head, cascade, stages, answers, short.labels, goal, data, out, threshold)
        result["cascades"].append(entry)
        stage_answers_of[cascade.name] = (answers, short)
        edits.append(("cascade", cascade.name, "margin", entry["chosen"]["margin"], f"{source}, {goal}: {note}"))
    text = edit_policy_text(policy_path.read_text(encoding="utf-8"), edits)
    try:
        import yaml

        tuned = P.parse_policy(yaml.safe_load(text))
    except P.PolicyError as exc:
        raise TuneError(f"the tuned policy is invalid (a bug in tune; nothing written): {exc}") from None
    checked, check_errors = bind_repository(tuned, repo, "embedded")
    if checked is None:
        raise TuneError("the tuned policy does not bind to the repository: " + "; ".join(check_errors))
    (out / "policy.yaml").write_text(text, encoding="utf-8")
    result["tuned_policy"] = str(out / "policy.yaml")
    if write:
        from orchestrator.tooling.files import write_atomic

        write_atomic(policy_path, text.encode("utf-8"), 0o644)
        result["written"] = str(policy_path)
    if report_data:
        result["report"] = report(head, plan, tuned_chunks, {c["name"]: c["chosen"]["margin"] for c in result["cascades"]},
                                  models, load_data(report_data, head), report_data, policy.max_sequence_length, threshold, long_n)
    if url:
        from orchestrator.tooling import tune_throughput as TT

        result["throughput"] = TT.throughput_report(
            url, head, result, plan, stage_answers_of, models, router_model or policy_path.resolve().parent.name,
            policy.max_sequence_length, threshold, concurrency or TT.CONCURRENCY, duration_s or TT.DURATION_S,
            cascade_answers=cascade_answers, cascades_of=cascades,
            router_overhead_s=None if router_overhead_ms is None else router_overhead_ms / 1000.0,
            router_stage_overhead_s=None if router_stage_overhead_ms is None else [x / 1000.0 for x in router_stage_overhead_ms],
            overhead_shares=tuple(overhead_shares) if overhead_shares else TT.OVERHEAD_SHARES)
        for c in result["throughput"]["cascades"]:
            TT.plot_throughput(out / f"throughput_{c['name']}.png", c, f"cascade {c['name']} on {url}: accuracy on {data} "
                               f"against predicted throughput (concurrency {result['throughput']['concurrency']})")
    (out / "curves.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "tune.md").write_text(render(result))
    result["out"] = str(out)
    return result


def report(head: Head, plan: Sequence[Tuple[CascadeNode, List[Stage]]], chunks: Mapping[str, Mapping[str, Optional[ChunkNode]]],
           margins: Mapping[str, float], models: Models, data: Any, name: str, max_length: int, threshold: float,
           long_n: int) -> Dict[str, Any]:
    """The chosen point on other texts: per cascade, on the short texts and on each kind of
    long text, the router as tuned, the router reading every window (stop keys removed),
    the last stage alone (every window), the router's accuracy minus the last stage's with
    its 95% interval (:func:`paired_difference`: whether a gap is more than the sampling
    noise of these texts) and the ensemble (the last stage's model reading the first
    ``max_length`` tokens)."""
    out: Dict[str, Any] = {"data": name, "cascades": []}
    for cascade, stages in plan:
        tok = models.heads[stages[0].model.model].tokenizer
        kinds = long_texts(models, tok, list(data.texts), data.labels, long_n)
        sets = {"short": (list(data.texts), data.labels), **kinds}
        rows: Dict[str, Any] = {}
        for kind, (texts, labels) in sets.items():
            if not texts:
                continue
            m = _measure(models, stages, texts, labels, max_length)
            tuned, final = evaluate(head, stages, m, margins[cascade.name], chunks[cascade.name], threshold)
            every, _ = evaluate(head, stages, m, margins[cascade.name],
                                {s.model.name: without_stop_keys(s.chunk) if s.chunk else None for s in stages}, threshold)
            last = stages[-1]
            lw, lws = m.windows[last.model.name]
            alone, _ = stage_answers(head, last, lw, lws, without_stop_keys(last.chunk) if last.chunk else None, threshold)
            # the ensemble truncates to the first max_length tokens: the first window (or the truncated row)
            ens = np.stack([np.asarray(w[0], dtype=np.float64).reshape(-1) for w in lw])
            right, alone_right = correct(head, final, labels, threshold), correct(head, alone, labels, threshold)
            rows[kind] = {"n": len(texts), "router": tuned, "router_every_window": every,
                          "last_stage_alone": float(alone_right.mean()),
                          "router_minus_last_stage": paired_difference(right, alone_right),
                          "router_minus_last_stage_low_one_sided": paired_difference(right, alone_right,
                                                                                      alternative="greater")["low"],
                          "ensemble": float(correct(head, ens, labels, threshold).mean())}
        out["cascades"].append({"name": cascade.name, "margin": margins[cascade.name], "sets": rows})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _points(d: Optional[Mapping[str, float]]) -> str:
    if not d:
        return "n/a"
    return f"{100 * d['difference']:+.2f} ({100 * d['low']:+.2f} to {100 * d['high']:+.2f})"


def _signed(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}"


def render(r: Mapping[str, Any]) -> str:
    """``tune.md``: what was chosen and, with ``--report-data``, how it does there."""
    L = [f"# orchestrator tune {r['policy']}", "", f"Tuned on {r['data']} ({r['n']} texts), target `{r['target']}` "
         f"(cascades), `{r['chunk_target']}` (chunk nodes' stop_margin), threshold {r['threshold']:g}.", ""]
    for c in r["chunks"]:
        ch = c["chosen"]
        L.append(f"- chunk `{c['name']}` ({c['model']}), {c['long_texts']} long texts: every window "
                 f"{_pct(c['every_window']['accuracy'])} at {c['every_window']['windows_per_text']:.2f} windows/text; "
                 + (f"stop_margin {ch['stop_margin']} (None: removed): {_pct(ch['accuracy'])} at "
                    f"{ch['windows_per_text']:.2f} windows/text" if ch else "no stop_margin meets the target: removed"))
    for c in r["cascades"]:
        ch = c["chosen"]
        ni = c.get("noninferiority")
        L.append(f"- cascade `{c['name']}` ({' -> '.join(c['stages'])}): margin {c['was']:g} -> **{ch['margin']:g}**: "
                 f"escalates {_pct(ch['escalation_rate'])}, accuracy {_pct(ch['accuracy'])} (last stage alone "
                 f"{_pct(c['last_stage_accuracy'])}), agreement {_pct(ch['agreement'])}"
                 + (f"; minus the last stage {100 * ch['difference']:+.2f} points, one-sided 95% lower bound "
                    f"{100 * ch['difference_low']:+.2f} > -{ni['margin_points']:g} (paired bootstrap, "
                    f"{ni['resamples']} resamples, seed {ni['seed']})" if ni else ""))
    rep = r.get("report")
    if rep:
        L += ["", f"## On {rep['data']} (the chosen point, never the tuning texts)", "",
              "| texts | n | router as tuned | escalation rate | windows/text | router, every window | windows/text | "
              "last stage alone | router - last stage, points (95% interval) | one-sided 95% lower bound | "
              "ensemble (first window) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in rep["cascades"]:
            for kind, s in c["sets"].items():
                L.append(f"| {kind} | {s['n']} | {_pct(s['router']['accuracy'])} | {_pct(s['router']['escalation_rate'])} | "
                         f"{s['router']['windows_per_text']:.2f} | {_pct(s['router_every_window']['accuracy'])} | "
                         f"{s['router_every_window']['windows_per_text']:.2f} | {_pct(s['last_stage_alone'])} | "
                         f"{_points(s.get('router_minus_last_stage'))} | "
                         f"{_signed(s.get('router_minus_last_stage_low_one_sided'))} | {_pct(s['ensemble'])} |")
    if r.get("throughput"):
        from orchestrator.tooling.tune_throughput import render_throughput

        L += render_throughput(r["throughput"])
    return "\n".join(L) + "\n"


def add_tune_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from orchestrator.tooling.tune_throughput import add_url_arguments

    parser.add_argument("policy", type=Path, help="the policy file (its cascades and chunk nodes are tuned)")
    parser.add_argument("--data", required=True, help="labeled texts to tune on: .jsonl/TSV, or split:validation")
    parser.add_argument("--repo", type=Path, default=None, help="model repository (default: the one holding the policy)")
    parser.add_argument("--target", default="accuracy>=last",
                        help="cascades: accuracy>=last (default), accuracy>=X, agreement>=X (with the last stage), or "
                             "noninferior:P (the fewest escalations whose accuracy minus the last stage's has a one-sided "
                             "95%% lower bound above -P percentage points; paired bootstrap over the tuning texts)")
    parser.add_argument("--chunk-target", default="accuracy>=last",
                        help="chunk nodes' stop_margin, on long texts: accuracy>=last (default: at least reading every "
                             "window), accuracy>=X or agreement>=X (with reading every window)")
    parser.add_argument("--report-data", default=None, help="labeled texts to report the chosen point on, e.g. split:test")
    parser.add_argument("--out", type=Path, default=None, help="curves, tuned policy and report (default .cache/tune)")
    parser.add_argument("--write", action="store_true", help="edit the policy file itself (default: write OUT/policy.yaml)")
    parser.add_argument("--threshold", type=float, default=0.5, help="decision threshold of every text (default 0.5)")
    parser.add_argument("--long-texts", type=int, default=LONG_TEXTS, help="long texts of each kind (default %(default)s)")
    add_url_arguments(parser)
    return parser


def tune_command(args: argparse.Namespace) -> int:
    try:
        r = tune(args.policy, args.data, args.repo, args.target, args.chunk_target, args.report_data, args.out,
                 args.write, args.threshold, args.long_texts, getattr(args, "url", None), getattr(args, "concurrency", None),
                 getattr(args, "duration", None), getattr(args, "router_model", None),
                 getattr(args, "router_overhead_ms", None), getattr(args, "router_stage_overhead_ms", None),
                 getattr(args, "overhead_shares", None))
    except (ToolingError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(render(r))
    print(f"curves and tuned policy: {r['out']}" + (f"\nwrote {r['written']}" if r.get("written") else
                                                    "\n(policy file not changed: add --write)"))
    return 0
