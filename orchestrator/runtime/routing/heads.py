"""A classifier's head: how its logits become the answers clients get.

The head is part of a classifier's model contract. ``orchestrator export`` writes it next to
the model in the repository (``<model>/head.json``) from the checkpoint's own Hugging Face
config (``problem_type``, ``num_labels``, ``id2label``); the router, the postprocess model
(config parameter ``head``), parity and ``orchestrator policy check --repo`` read it. A
model directory without ``head.json`` is the legacy contract: one logit, sigmoid
(:data:`LEGACY`), and an answer with another number of logits is an error, never a guess.

Heads (``K`` = number of labels; answers are float64 here, FP32 on the wire):

| ``kind`` | logits | ``PROBABILITIES`` | ``VERDICTS`` |
|---|---|---|---|
| ``binary``, 1 logit | [N, 1] | [N, 1] sigmoid(logit) | [N, 1] p >= THRESHOLD |
| ``binary``, 2 logits | [N, 2] | [N, 1] softmax(logits)[positive_index] | [N, 1] p >= THRESHOLD |
| ``multiclass`` (K >= 3) | [N, K] | [N, K] softmax | [N, K] true only for the top label, when its p >= its threshold |
| ``multilabel`` | [N, K] | [N, K] sigmoid per label | [N, K] p_k >= threshold_k |

Calibration (``head.json`` key ``calibration``, written by ``orchestrator calibrate``):
``{"method": "temperature", "temperature": T, ...}`` divides the logits by ``T`` before the
table's function (temperature scaling, Guo et al. 2017): one ``T`` for binary and multiclass
heads, one per label (a list of K) or one for all for multilabel heads. The argmax, and so
a multiclass head's top label, never changes; binary and multilabel verdicts at 0.5 do
not either, other thresholds act on the calibrated probability. Without the key the
logits are used as they are. Other keys of the mapping (``fitted_on``, ``ece_before``,
...) are provenance.

``THRESHOLD`` is [N, 1] (one per text, broadcast over the columns) or, for multiclass and
multilabel heads, [N, K] (one per label). The rules follow ``transformers``'
``*ForSequenceClassification`` losses: ``problem_type`` ``single_label_classification``
trains a softmax (cross-entropy), ``multi_label_classification`` a sigmoid per label
(``BCEWithLogitsLoss``); ``num_labels == 1`` is served as a binary sigmoid (a model trained
with binary cross-entropy on one logit, like the demo classifiers); ``regression`` is no
classifier and is refused.

The logistic function and its inverse (:func:`sigmoid`, :func:`logit`) are defined here once
(sigmoid heads, calibration shifts and thresholds, ``orchestrator parity``). No Triton
imports: the router, the postprocess model and the tooling share this module.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from orchestrator.runtime.errors import OrchestratorError

#: Probabilities are clipped to [LOGIT_EPS, 1 - LOGIT_EPS] before :func:`logit`, so a
#: probability of exactly 0 or 1 (a constant node, a max over windows) has a finite logit.
LOGIT_EPS = 1e-12


def sigmoid(logits: ArrayLike) -> NDArray[Any]:
    """Numerically stable logistic function; float64 in, float64 out, same shape."""
    x = np.asarray(logits, dtype=np.float64)
    if x.size == 1:  # one logit (one text of a binary head): the same bits in half the time
        return np.array(sigmoid_one(x.item())).reshape(x.shape)
    # exp(-|x|) is exp(-x) where x >= 0 and exp(x) below: the same two formulas, bit for bit,
    # without boolean indexing (a third of the router's head time on one text)
    e = np.exp(-np.abs(x))
    # 1 / (1 + e) where x >= 0, e / (1 + e) below: each numerator over the one denominator
    out: NDArray[Any] = np.where(x >= 0, 1.0, e) / (1.0 + e)
    return out


def sigmoid_one(v: float) -> float:
    """:func:`sigmoid` of one logit: Python floats around numpy's exp of a 1-element float64
    array (the vectorised formula's exp); + and / are IEEE in both, so the bits are the same."""
    e: float = np.exp(np.array((-abs(v),))).item()
    return (1.0 if v >= 0 else e) / (1.0 + e)


def logit(p: float) -> float:
    """Inverse of :func:`sigmoid` for one probability ``p``: ``log(p / (1 - p))``, with ``p``
    clipped to ``[LOGIT_EPS, 1 - LOGIT_EPS]`` so the result is always finite (about +-27.6
    at the clip)."""
    p = min(max(float(p), LOGIT_EPS), 1.0 - LOGIT_EPS)
    return math.log(p) - math.log1p(-p)

#: The file, in a model's directory, that holds its head (JSON, :meth:`Head.to_json`).
HEAD_FILE = "head.json"
#: The label file of Triton's classification extension (``label_filename``), one label per
#: line in output column order (:meth:`Head.output_labels`).
LABEL_FILE = "labels.txt"
BINARY, MULTICLASS, MULTILABEL = "binary", "multiclass", "multilabel"
HEAD_KINDS = (BINARY, MULTICLASS, MULTILABEL)


class HeadError(OrchestratorError, ValueError):
    """A head that cannot be served, or heads that do not fit together; the message names
    the model (or file) and what is wrong."""


@dataclass(frozen=True)
class Head:
    """One classifier's head and the tokenizer it was trained with.

    Attributes:
        kind: ``binary``, ``multiclass`` or ``multilabel`` (see the module table).
        labels: the checkpoint's ``id2label`` in logit order; its length is the number of
            logits the model answers.
        positive_index: binary heads: the logit column of the positive label (0 for one
            logit; for two, from the checkpoint's labels or ``orchestrator export
            --positive-label``).
        tokenizer: the name of the tokenizer model in the repository that makes this
            model's ``input_ids`` (its files are in ``<tokenizer>/1``).
        pad_token_id: the tokenizer's pad id (BERT 0, RoBERTa 1), used to pad batches.
        max_length: tokens per input row the model accepts, special tokens included (the
            tokenizer's ``model_max_length``, at most ``max_position_embeddings``).
        problem_type: the checkpoint's ``problem_type`` as written (provenance only).
        calibration: ``head.json``'s ``calibration`` mapping (module docstring), or None.
    """

    kind: str
    labels: Tuple[str, ...]
    positive_index: int = 0
    tokenizer: str = "tokenizer"
    pad_token_id: int = 0
    max_length: int = 512
    problem_type: Optional[str] = None
    calibration: Optional[Mapping[str, Any]] = field(default=None, compare=False, hash=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(str(x) for x in self.labels))
        k = len(self.labels)
        if self.kind not in HEAD_KINDS:
            raise HeadError(f"head kind {self.kind!r}: expected one of {', '.join(HEAD_KINDS)}")
        if self.kind == BINARY and k not in (1, 2):
            raise HeadError(f"a binary head has 1 or 2 logits, got {k} labels")
        if self.kind == BINARY and not 0 <= self.positive_index < k:
            raise HeadError(f"positive_index {self.positive_index} is not a column of {k} logits")
        if self.kind == MULTICLASS and k < 3:
            raise HeadError(f"a multiclass head has at least 3 labels, got {k} (2 labels are a binary head)")
        if self.kind == MULTILABEL and k < 1:
            raise HeadError("a multilabel head needs at least one label")
        t = _temperature(self.calibration, self.kind, k)
        object.__setattr__(self, "_temperature", t)
        # what probabilities() divides by: one temperature as a Python float (the same division, without broadcasting)
        object.__setattr__(self, "_divisor", float(t[0]) if t is not None and t.size == 1 else t)

    @property
    def temperature(self) -> Optional[NDArray[Any]]:
        """Temperatures of the calibration, float64 [1] or [K] (multilabel), or None
        without calibration."""
        t: Optional[NDArray[Any]] = self._temperature  # type: ignore[attr-defined]  # set in __post_init__
        return t

    # -- shapes and names

    @property
    def num_logits(self) -> int:
        """Logit columns the model answers."""
        return len(self.labels)

    @property
    def columns(self) -> int:
        """Columns of ``PROBABILITIES`` and ``VERDICTS``: 1 for binary heads, K otherwise."""
        return 1 if self.kind == BINARY else len(self.labels)

    def output_labels(self) -> Tuple[str, ...]:
        """Label of each output column (the classification extension's label file): the
        positive label for binary heads, every label otherwise."""
        return (self.labels[self.positive_index],) if self.kind == BINARY else self.labels

    def compatible(self, other: "Head") -> bool:
        """True when ``other`` answers in the same columns with the same meaning (same kind,
        same output labels compared case-insensitively), so one may stand in for the other
        (cascade stages, fallbacks, split arms, shadow candidates)."""
        mine = tuple(x.lower() for x in self.output_labels())
        return self.kind == other.kind and mine == tuple(x.lower() for x in other.output_labels())

    def describe(self) -> str:
        """One line: kind, logits and labels."""
        if self.kind == BINARY:
            return f"binary ({self.num_logits} logit{'s' if self.num_logits > 1 else ''}, positive label {self.labels[self.positive_index]!r})"
        return f"{self.kind} ({self.num_logits} labels: {', '.join(self.labels)})"

    # -- answers

    def probabilities(self, logits: NDArray[Any], shift: Union[float, NDArray[Any]] = 0.0) -> NDArray[Any]:
        """Probabilities float64 [N, columns] from logits [N, num_logits] (any float dtype).

        With a ``calibration`` the logits are divided by its temperature(s) first (the
        module docstring). ``shift``: then added to the binary score (the positive logit,
        or the difference of positive and negative logits for two) or per label for
        multilabel heads (a variant's threshold, ``nodes.model``); must be 0 for
        multiclass heads.

        Raises:
            HeadError: the logits have another number of columns than the head.
        """
        z = np.asarray(logits, dtype=np.float64)
        z = z.reshape(z.shape[0], -1) if z.ndim else z.reshape(1, 1)
        if z.shape[1] != self.num_logits:
            raise HeadError(f"expected {self.num_logits} logit column(s) for a {self.describe()} head, got {z.shape[1]}")
        divisor: Union[None, float, NDArray[Any]] = self._divisor  # type: ignore[attr-defined]  # set in __post_init__
        if self.kind == BINARY and z.size == 1 and isinstance(shift, float) and not isinstance(divisor, np.ndarray):
            v = z.item() if divisor is None else z.item() / divisor  # one text, one logit: the same IEEE steps in floats
            return np.array(((sigmoid_one(v if shift == 0.0 else v + shift),),))
        if divisor is not None:
            z = z / divisor
        if self.kind == BINARY:
            score = z[:, self.positive_index] if self.num_logits == 1 else z[:, self.positive_index] - z[:, 1 - self.positive_index]
            if not (isinstance(shift, float) and shift == 0.0):  # x + 0.0 is x (or +0.0 for -0.0: the same sigmoid)
                score = score + shift
            return sigmoid(score).reshape(-1, 1)
        if self.kind == MULTILABEL:
            return sigmoid(z + np.asarray(shift, dtype=np.float64))
        e = np.exp(z - z.max(axis=1, keepdims=True))
        softmax: NDArray[Any] = e / e.sum(axis=1, keepdims=True)
        return softmax

    def thresholds(self, thresholds: NDArray[Any], rows: int) -> NDArray[Any]:
        """Thresholds float64 [rows, columns] from [rows, 1] (broadcast) or [rows, columns]."""
        t = np.asarray(thresholds, dtype=np.float64).reshape(rows, -1)
        return np.broadcast_to(t, (rows, self.columns)) if t.shape[1] == 1 and self.columns > 1 else t

    def verdicts(self, probabilities: NDArray[Any], thresholds: NDArray[Any]) -> NDArray[Any]:
        """VERDICTS bool [N, columns] for probabilities [N, columns] and thresholds [N, 1]
        or [N, columns] (the module table). Compared in float32, as clients see them."""
        p = np.asarray(probabilities, dtype=np.float32).reshape(-1, self.columns)
        t = self.thresholds(thresholds, p.shape[0]).astype(np.float32)
        v = p >= t
        if self.kind == MULTICLASS:
            top = np.zeros_like(v)
            top[np.arange(p.shape[0]), p.argmax(axis=1)] = True
            v &= top
        return v

    def unsure(self, probabilities: NDArray[Any], thresholds: NDArray[Any], margin: float) -> NDArray[Any]:
        """Whether each text's answer is within ``margin`` of a decision: bool [N] for
        probabilities [N, columns] (or one text's [columns]: a 0-d bool) and thresholds
        [N, 1] or [N, columns] (or [1]/[columns]). Binary: ``|p - t| < margin``;
        multiclass: the top two probabilities differ by less than ``margin``; multilabel:
        some label has ``|p_k - t_k| < margin``. A cascade escalates such texts."""
        p = np.asarray(probabilities, dtype=np.float64)
        single = p.ndim == 1
        p = p.reshape(-1, self.columns)
        if self.kind == MULTICLASS:
            top2 = np.sort(p, axis=1)[:, -2:]
            out = top2[:, 1] - top2[:, 0] < margin
        else:
            out = (np.abs(p - self.thresholds(thresholds, p.shape[0])) < margin).any(axis=1)
        return out[0] if single else out

    def flipped(self, a: NDArray[Any], verdicts_a: NDArray[Any], b: NDArray[Any], verdicts_b: NDArray[Any]) -> bool:
        """Whether two answers of one text disagree: multiclass, another top label;
        otherwise another verdict in some column (shadow and parity flips)."""
        if self.kind == MULTICLASS:
            return int(np.argmax(a)) != int(np.argmax(b))
        return bool((np.asarray(verdicts_a) != np.asarray(verdicts_b)).any())

    def combine(self, probabilities: Sequence[NDArray[Any]], how: str, weights: Optional[Sequence[float]] = None) -> NDArray[Any]:
        """Several answers of one text (each [columns]) as one, column by column: ``mean``
        (weighted by ``weights`` when given) or ``max`` (renormalized to sum 1 for
        multiclass heads, so the answer stays a distribution)."""
        p = np.stack([np.asarray(x, dtype=np.float64).reshape(-1) for x in probabilities])
        if how == "max":
            out: NDArray[Any] = p.max(axis=0)
            return out / out.sum() if self.kind == MULTICLASS else out
        w = np.ones(p.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
        mean: NDArray[Any] = (p * w[:, None]).sum(axis=0) / w.sum()
        return mean

    # -- files and parameters

    def to_json(self) -> str:
        """The ``head.json`` document."""
        doc = {k: v for k, v in asdict(self).items() if k not in ("extra", "calibration")}
        doc["labels"] = list(self.labels)
        if self.calibration is not None:
            doc["calibration"] = dict(self.calibration)
        doc.update(self.extra)
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], where: str = "head") -> "Head":
        """A head from a ``head.json`` document (unknown keys are kept in ``extra``).

        Raises:
            HeadError: a missing or mistyped key, or an unservable head (names ``where``).
        """
        if not isinstance(doc, Mapping):
            raise HeadError(f"{where}: expected a JSON object")
        known = {"kind", "labels", "positive_index", "tokenizer", "pad_token_id", "max_length", "problem_type", "calibration"}
        try:
            labels = doc["labels"]
            if not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels):
                raise HeadError("labels: expected a list of non-empty strings")
            for key in ("positive_index", "pad_token_id", "max_length"):
                if key in doc and (isinstance(doc[key], bool) or not isinstance(doc[key], int)):
                    raise HeadError(f"{key}: expected an integer, got {doc[key]!r}")
            return cls(
                kind=str(doc["kind"]),
                labels=tuple(labels),
                positive_index=int(doc.get("positive_index", 0)),
                tokenizer=str(doc.get("tokenizer", "tokenizer")),
                pad_token_id=int(doc.get("pad_token_id", 0)),
                max_length=int(doc.get("max_length", 512)),
                problem_type=doc.get("problem_type"),
                calibration=doc.get("calibration"),
                extra={k: v for k, v in doc.items() if k not in known},
            )
        except KeyError as exc:
            raise HeadError(f"{where}: required key {exc.args[0]!r} is missing") from None
        except HeadError as exc:
            raise HeadError(f"{where}: {exc}") from None

    @classmethod
    def from_json(cls, text: str, where: str = "head") -> "Head":
        """A head from JSON text (see :meth:`from_mapping`)."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise HeadError(f"{where}: not valid JSON: {exc}") from None
        return cls.from_mapping(doc, where)


CALIBRATION_METHODS = ("temperature",)


def _temperature(calibration: Optional[Mapping[str, Any]], kind: str, k: int) -> Optional[NDArray[Any]]:
    """The temperatures float64 [1] or [K] of a ``calibration`` mapping (None: none).

    Raises:
        HeadError: not a mapping, another method, or a temperature that is not a positive
            finite number (or, multilabel, a list of K of them).
    """
    if calibration is None:
        return None
    if not isinstance(calibration, Mapping):
        raise HeadError(f"calibration: expected a JSON object, got {calibration!r}")
    method = calibration.get("method")
    if method not in CALIBRATION_METHODS:
        raise HeadError(f"calibration.method: {method!r}, expected one of {', '.join(CALIBRATION_METHODS)}")
    raw = calibration.get("temperature")
    values = raw if isinstance(raw, list) and kind == MULTILABEL else [raw]
    if len(values) not in (1, k) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v > 0 for v in values
    ):
        want = f"a positive number or a list of {k}" if kind == MULTILABEL else "a positive number"
        raise HeadError(f"calibration.temperature: {raw!r}, expected {want}")
    return np.asarray(values, dtype=np.float64)


#: The contract of a classifier directory without ``head.json`` (the demo models before
#: heads were written): one logit, sigmoid, the repository's ``tokenizer`` model, pad id 0.
LEGACY = Head(kind=BINARY, labels=("positive",), positive_index=0, tokenizer="tokenizer", pad_token_id=0, max_length=512)


def head_from_hf_config(
    config: Any, tokenizer: str, pad_token_id: int, max_length: int, positive_label: Optional[str] = None
) -> Head:
    """The head of a ``transformers`` sequence classifier from its config
    (``problem_type``, ``num_labels``, ``id2label``).

    ``positive_label``: for two labels, the positive one (default: a label named
    ``positive`` in any case, else index 1, the convention of SST-2 checkpoints).

    Raises:
        HeadError: ``problem_type`` is ``regression``, or ``positive_label`` is not a label.
    """
    problem = getattr(config, "problem_type", None)
    n = int(config.num_labels)
    id2label = getattr(config, "id2label", None) or {}
    labels = tuple(str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(n))
    common: Dict[str, Any] = dict(labels=labels, tokenizer=tokenizer, pad_token_id=int(pad_token_id), max_length=int(max_length), problem_type=problem)
    if problem == "regression":
        raise HeadError("problem_type 'regression': a regression head has no labels to classify into")
    if positive_label is not None and positive_label not in labels:
        raise HeadError(f"positive label {positive_label!r} is not one of the checkpoint's labels {list(labels)}")
    if problem == "multi_label_classification":
        return Head(kind=MULTILABEL, **common)
    if n <= 2:
        if positive_label is not None:
            pos = labels.index(positive_label)
        else:
            named = [i for i, x in enumerate(labels) if x.lower() == "positive"]
            pos = named[0] if named else n - 1
        return Head(kind=BINARY, positive_index=pos, **common)
    return Head(kind=MULTICLASS, **common)


def read_head(model_dir: Union[str, Path]) -> Optional[Head]:
    """The head in ``<model_dir>/head.json``, or None when the file does not exist.

    Raises:
        HeadError: the file is unreadable or invalid (the message names it).
    """
    path = Path(model_dir) / HEAD_FILE
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise HeadError(f"{path}: cannot read: {exc.strerror}") from None
    return Head.from_json(text, str(path))


def repository_heads(repo: Union[str, Path], models: Sequence[str]) -> Dict[str, Head]:
    """Model name -> head for each of ``models`` in the model repository ``repo``:
    ``<repo>/<model>/head.json``, or :data:`LEGACY` where the model directory has none.

    Raises:
        HeadError: a ``head.json`` that is unreadable or invalid.
    """
    return {m: read_head(Path(repo) / m) or LEGACY for m in models}


def head_of_parameters(params: Mapping[str, str]) -> Head:
    """The head a postprocess model serves, from its config parameter ``head`` (the
    ``head.json`` document as a string); :data:`LEGACY` when the parameter is absent.

    Raises:
        HeadError: the parameter is not a valid head.
    """
    raw = params.get("head")
    return LEGACY if not raw else Head.from_json(raw, "config parameter 'head'")
