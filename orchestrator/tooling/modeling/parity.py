"""``orchestrator parity``: do candidate classifiers (fp16, re-exports) decide like the reference?

Usage::

    orchestrator parity --reference classifier --candidates classifier_fp16 \\
        (--data FILE | --held-out) [--target-precision 0.9] [--max-flip-rate 0.005] \\
        [--in-process | --url HOST:PORT | --embedded-server] [--cross-check] \\
        [--repo model_repository] [--out docs/parity]
    orchestrator parity --write-held-out FILE      # the held-out test split as TSV/JSONL

Every text goes through the ``tokenizer`` and then each model, in the same batches of
``--batch-size`` (64, the repository's ``max_batch_size``) consecutive texts, each batch padded
to its longest text, exactly as one request to the ``tokenizer`` model does. Backends:
in-process (onnxruntime CPU sessions on ``<repo>/<model>/1/<onnx_file>`` plus the tokenizer
files of ``<repo>/tokenizer/1``), or a Triton server through tritonclient HTTP (``--url``, or
``--embedded-server`` to start :class:`orchestrator.tooling.server.TritonServer` on ``--repo``).
``--cross-check`` runs the other backend too and reports the largest logit difference
between the two.

Definitions (all in the report):

- score ``s``: the logit for single-logit (binary, sigmoid) models; ``logit[1] - logit[0]``
  for two-logit (softmax) models, the log-odds of class 1. More labels: :class:`ParityError`.
- probability ``p = sigmoid(s)``, computed in float64 and rounded to float32 (as the
  ``postprocess`` model does); verdict ``p >= t`` for a threshold ``t`` (as ``postprocess``).
- logit deviation: ``d = candidate - reference`` over every logit; mean |d|, max d, min d
  (signed), max |d|.
- reference threshold (:func:`threshold_for_precision`): the smallest ``t`` among the
  reference's own probabilities on the data whose precision ``TP / (TP + FP)`` against the
  labels is at least the target. Every ``t`` between the next lower probability (exclusive)
  and this one gives the same verdicts on this data; taking a data value follows
  scikit-learn's ``precision_recall_curve`` convention. Precision is not monotone in ``t``:
  this is the lowest qualifying threshold, the one with the highest recall.
- confusion against the reference: rows reference verdict, columns candidate verdict, at
  the same threshold; flips = reference-positive/candidate-negative +
  reference-negative/candidate-positive.
- best candidate threshold (:func:`best_matching_threshold`): among ``{reference threshold}``
  U the candidate's probabilities on the data U {just above its largest probability}, the
  one with the fewest flips; ties go to the one closest to the reference threshold, then to
  the smaller one.
- recommendation (:func:`recommend`): a candidate qualifies when, at its operating
  threshold (the reference threshold if it gives 0 flips, else its best threshold), its
  flips are at most ``max_flip_rate`` of the texts. Its precision there is reported but not
  a condition: the reference threshold sits exactly at the target by construction, so a
  single flip can move a candidate just below it. A qualifying candidate is shipped instead
  of the reference when its
  latency is at most 0.95 of the reference's (median over batches of the per-batch ratio,
  :func:`paired_ratio`) (5%: our margin for timing
  noise on a shared machine), or when it is within 5% and its file at most 0.9 of the
  reference's size; the fastest such candidate wins. Otherwise the reference is shipped.

Outputs in ``--out``: ``report.json``, ``report.md``, ``logits.png`` (candidate vs reference
score scatter and difference histogram per candidate), ``thresholds.json``
(``{model: threshold}``: the reference threshold and each candidate's operating threshold,
probabilities in [0, 1] for the ``THRESHOLD`` input).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from orchestrator.tooling.files import sha256_file
from orchestrator.tooling.paths import default_model_repository

__all__ = [
    "ParityError",
    "LabeledData",
    "read_labeled",
    "write_labeled",
    "held_out_data",
    "binary_scores",
    "probabilities",
    "label_metrics",
    "confusion_vs_reference",
    "logit_deviation",
    "threshold_for_precision",
    "best_matching_threshold",
    "compare",
    "recommend",
    "InProcessBackend",
    "TritonBackend",
    "score_all",
    "run_parity",
    "write_report",
    "add_parity_arguments",
    "parity_command",
]

DEFAULT_TARGET_PRECISION = 0.9
DEFAULT_MAX_FLIP_RATE = 0.005  # 0.5% of the texts
SPEED_MARGIN = 0.05  # latency ratios within 5% count as equal speed
SIZE_MARGIN = 0.9  # "smaller" means at most 90% of the reference's bytes
BATCH_SIZE = 64  # max_batch_size of the repository's models


class ParityError(RuntimeError):
    """Bad data or models (message says which), or a target precision no threshold reaches."""


# --------------------------------------------------------------------------- data


@dataclass
class LabeledData:
    """Texts with binary labels. ``labels``: int64 [n], 0 or 1. ``source``: where they came from."""

    texts: list
    labels: np.ndarray
    source: str

    def digest(self) -> str:
        """sha256 over ``label TAB text LF`` lines: identifies the exact data of a report."""
        h = hashlib.sha256()
        for t, y in zip(self.texts, self.labels):
            h.update(f"{int(y)}\t{t}\n".encode("utf-8"))
        return h.hexdigest()


def _parse_label(value, where: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false"):
        return int(value.strip().lower() in ("1", "true"))
    raise ParityError(f"{where}: label {value!r} is not 0/1")


def read_labeled(path: os.PathLike | str) -> LabeledData:
    """Read labeled texts.

    Formats (by extension): ``.jsonl`` one JSON object a line with ``text`` (string) and
    ``label`` (0/1, true/false; other keys ignored); ``.tsv`` (or anything else) one
    ``label<TAB>text`` a line, split at the first tab so texts may contain tabs, an optional
    header line ``label<TAB>text``. Blank lines are skipped. Raises :class:`ParityError`
    (file and line) on a malformed line, a label other than 0/1, or no data; ``OSError``.
    """
    path = Path(path)
    texts, labels = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        where = f"{path.name}:{n}"
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ParityError(f"{where}: not JSON: {e}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or "label" not in obj:
                raise ParityError(f"{where}: expected an object with string 'text' and 'label'")
            texts.append(obj["text"])
            labels.append(_parse_label(obj["label"], where))
        else:
            if "\t" not in line:
                raise ParityError(f"{where}: expected label<TAB>text")
            lab, text = line.split("\t", 1)
            if n == 1 and lab.strip().lower() == "label":
                continue
            texts.append(text)
            labels.append(_parse_label(lab, where))
    if not texts:
        raise ParityError(f"{path}: no labeled texts")
    return LabeledData(texts, np.asarray(labels, dtype=np.int64), f"file {path}")


def write_labeled(path: os.PathLike | str, data: LabeledData, extra: Optional[Sequence[dict]] = None) -> Path:
    """Write ``data`` as ``.jsonl`` (``{"text", "label", **extra[i]}``) or TSV (``label<TAB>text``
    with a header; texts containing a newline cannot be TSV: :class:`ParityError`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        lines = [json.dumps({"text": t, "label": int(y), **(extra[i] if extra else {})}, ensure_ascii=False)
                 for i, (t, y) in enumerate(zip(data.texts, data.labels))]
    else:
        bad = [i for i, t in enumerate(data.texts) if "\n" in t or "\r" in t]
        if bad:
            raise ParityError(f"text {bad[0]} contains a line break; write .jsonl instead")
        lines = ["label\ttext"] + [f"{int(y)}\t{t}" for t, y in zip(data.texts, data.labels)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def held_out_data(data_dir=None) -> tuple[LabeledData, list[dict]]:
    """The test split of :mod:`orchestrator.tooling.modeling.data` (``held_out_examples()``: every corpus,
    ``sort_key`` order), as data plus per-text ``{"corpus", "id", "rating"}``. Raises what
    :func:`orchestrator.tooling.modeling.data.held_out_examples` raises (``DataUnavailableError``)."""
    from orchestrator.tooling.modeling import data as D

    ex = D.held_out_examples(data_dir=data_dir)
    d = LabeledData([e.text for e in ex], np.array([e.label for e in ex], dtype=np.int64),
                    "orchestrator.tooling.modeling.data.held_out_examples(): the test split (seed 0) of the vaderSentiment 3.3.2 "
                    "ground truth, all four corpora")
    return d, [{"corpus": e.corpus, "id": e.id, "rating": e.rating} for e in ex]


# --------------------------------------------------------------------------- metrics


def binary_scores(logits: np.ndarray) -> np.ndarray:
    """float64 score [n] from logits [n, K]: ``logits[:, 0]`` (K = 1) or
    ``logits[:, 1] - logits[:, 0]`` (K = 2). Raises :class:`ParityError` for other shapes."""
    lg = np.asarray(logits, dtype=np.float64)
    if lg.ndim == 1:
        lg = lg[:, None]
    if lg.ndim != 2 or lg.shape[1] not in (1, 2):
        raise ParityError(f"logits of shape {lg.shape}: parity needs a binary classifier (1 or 2 logits)")
    return lg[:, 0] if lg.shape[1] == 1 else lg[:, 1] - lg[:, 0]


def probabilities(scores: np.ndarray) -> np.ndarray:
    """float32 sigmoid of float64 ``scores``: the postprocess model's own function."""
    from orchestrator.runtime.scores import sigmoid

    return sigmoid(scores).astype(np.float32)


def _logit(t: float) -> Optional[float]:
    t = float(t)
    if t <= 0.0 or t >= 1.0:
        return None
    return math.log(t / (1.0 - t))


def label_metrics(labels: np.ndarray, verdicts: np.ndarray) -> dict:
    """Counts ``tp fp fn tn`` (positive class = label 1) and accuracy, precision, recall, f1.

    precision is ``None`` with no positive verdict, recall ``None`` with no positive label,
    f1 ``None`` when either is.
    """
    y = np.asarray(labels).astype(bool)
    v = np.asarray(verdicts).astype(bool)
    tp, fp = int(np.sum(v & y)), int(np.sum(v & ~y))
    fn, tn = int(np.sum(~v & y)), int(np.sum(~v & ~y))
    prec = tp / (tp + fp) if tp + fp else None
    rec = tp / (tp + fn) if tp + fn else None
    if prec is None or rec is None:
        f1 = None
    else:
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "accuracy": (tp + tn) / len(y),
            "precision": prec, "recall": rec, "f1": f1}


def confusion_vs_reference(ref_verdicts: np.ndarray, cand_verdicts: np.ndarray) -> dict:
    """2x2 counts of reference verdict (row) vs candidate verdict (column) and ``flips``."""
    r = np.asarray(ref_verdicts).astype(bool)
    c = np.asarray(cand_verdicts).astype(bool)
    out = {
        "ref_pos_cand_pos": int(np.sum(r & c)),
        "ref_pos_cand_neg": int(np.sum(r & ~c)),
        "ref_neg_cand_pos": int(np.sum(~r & c)),
        "ref_neg_cand_neg": int(np.sum(~r & ~c)),
    }
    out["flips"] = out["ref_pos_cand_neg"] + out["ref_neg_cand_pos"]
    return out


def logit_deviation(ref_logits: np.ndarray, cand_logits: np.ndarray) -> dict:
    """Deviation ``d = candidate - reference`` over every logit (float64): ``mean_abs_diff``,
    ``max_diff`` and ``min_diff`` (signed), ``max_abs_diff``, ``rms_diff``, plus
    ``max_abs_prob_diff`` of the probabilities and ``values`` (count). Raises
    :class:`ParityError` on different shapes."""
    a = np.asarray(ref_logits, dtype=np.float64)
    b = np.asarray(cand_logits, dtype=np.float64)
    if a.shape != b.shape:
        raise ParityError(f"logits shapes differ: reference {a.shape}, candidate {b.shape}")
    d = b - a
    pa, pb = probabilities(binary_scores(a)), probabilities(binary_scores(b))
    return {
        "values": int(d.size),
        "mean_abs_diff": float(np.mean(np.abs(d))),
        "max_diff": float(np.max(d)),
        "min_diff": float(np.min(d)),
        "max_abs_diff": float(np.max(np.abs(d))),
        "rms_diff": float(np.sqrt(np.mean(d * d))),
        "max_abs_prob_diff": float(np.max(np.abs(pb.astype(np.float64) - pa))),
    }


def threshold_for_precision(probs: np.ndarray, labels: np.ndarray, target: float) -> float:
    """The smallest ``t`` in ``probs`` with precision of ``probs >= t`` against ``labels`` at
    least ``target`` (see the module docstring). float32 value, a probability.

    Raises :class:`ParityError` if no threshold reaches ``target`` (message: the best
    precision reachable) or ``target`` is outside (0, 1].
    """
    if not 0.0 < target <= 1.0:
        raise ParityError(f"target precision {target} outside (0, 1]")
    p = np.asarray(probs, dtype=np.float32)
    y = np.asarray(labels).astype(np.int64)
    order = np.argsort(p, kind="stable")
    ps, ys = p[order], y[order]
    # suffix sums: positives and predicted count of {p >= ps[i]}
    tp_suffix = np.cumsum(ys[::-1])[::-1]
    cnt_suffix = np.arange(len(ps), 0, -1)
    values, first = np.unique(ps, return_index=True)  # first index of each value in ps
    tp = tp_suffix[first]
    cnt = cnt_suffix[first]
    prec = tp / cnt
    ok = np.nonzero(prec >= target)[0]
    if not len(ok):
        raise ParityError(f"no threshold reaches precision {target} on these {len(p)} texts; "
                          f"the best is {float(prec.max()):.4f}")
    return float(values[ok[0]])


def _flips_at(cand_probs: np.ndarray, ref_verdicts: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Flip counts of ``cand_probs >= t`` vs ``ref_verdicts`` for each ``t`` (vectorised)."""
    c = np.asarray(cand_probs, dtype=np.float32)
    r = np.asarray(ref_verdicts).astype(bool)
    order = np.argsort(c, kind="stable")
    cs, rs = c[order], r[order]
    ref_pos_prefix = np.concatenate([[0], np.cumsum(rs)])  # ref positives among the i lowest
    ref_neg_total = int(np.sum(~rs))
    idx = np.searchsorted(cs, np.asarray(thresholds, dtype=np.float32), side="left")  # c < t for first idx
    fn = ref_pos_prefix[idx]
    fp = ref_neg_total - (idx - ref_pos_prefix[idx])
    return fn + fp


def best_matching_threshold(cand_probs: np.ndarray, ref_verdicts: np.ndarray, ref_threshold: float) -> tuple:
    """``(t, flips)``: the threshold on the candidate's probabilities that best reproduces
    ``ref_verdicts`` (see the module docstring for the candidate set and tie rules); ``t``
    is a float32 value in [0, 1]."""
    c = np.asarray(cand_probs, dtype=np.float32)
    t_ref = np.float32(ref_threshold)
    cands = [np.array([t_ref], dtype=np.float32), np.unique(c)]
    above = np.nextafter(c.max(), np.float32(2.0))
    if above <= 1.0:
        cands.append(np.array([above], dtype=np.float32))
    ts = np.unique(np.concatenate(cands))
    flips = _flips_at(c, ref_verdicts, ts)
    best = flips.min()
    tied = ts[flips == best]
    dist = np.abs(tied.astype(np.float64) - float(t_ref))
    pick = tied[np.lexsort((tied, dist))[0]]
    return float(pick), int(best)


def compare(
    ref_logits: np.ndarray,
    cand_logits: Mapping[str, np.ndarray],
    labels: np.ndarray,
    target_precision: float = DEFAULT_TARGET_PRECISION,
    reference: str = "reference",
) -> dict:
    """All parity numbers (no timing): the ``reference`` block and one block per candidate.

    ``ref_logits``, each of ``cand_logits``: float32 [n, K] (K = 1 or 2); ``labels`` int [n].
    Raises :class:`ParityError` (shapes, binary only, unreachable target).
    """
    y = np.asarray(labels).astype(np.int64)
    ref_p = probabilities(binary_scores(ref_logits))
    if len(ref_p) != len(y):
        raise ParityError(f"{len(ref_p)} reference logits for {len(y)} labels")
    t_ref = threshold_for_precision(ref_p, y, target_precision)
    ref_v = ref_p >= np.float32(t_ref)
    out = {
        "texts": int(len(y)),
        "positives": int(y.sum()),
        "target_precision": target_precision,
        "reference": {"name": reference, "threshold": t_ref, "threshold_logit": _logit(t_ref),
                      "positive_verdicts": int(ref_v.sum()), "vs_labels": label_metrics(y, ref_v),
                      "at_0_5": label_metrics(y, ref_p >= np.float32(0.5))},
        "candidates": {},
    }
    for name, lg in cand_logits.items():
        dev = logit_deviation(ref_logits, lg)
        p = probabilities(binary_scores(lg))
        v = p >= np.float32(t_ref)
        at_ref = {"threshold": t_ref, "vs_reference": confusion_vs_reference(ref_v, v),
                  "vs_labels": label_metrics(y, v)}
        block = {"logits": dev, "at_reference_threshold": at_ref, "best_threshold": None,
                 "operating_threshold": t_ref}
        if at_ref["vs_reference"]["flips"]:
            t_best, flips = best_matching_threshold(p, ref_v, t_ref)
            vb = p >= np.float32(t_best)
            block["best_threshold"] = {"threshold": t_best, "threshold_logit": _logit(t_best),
                                       "vs_reference": confusion_vs_reference(ref_v, vb),
                                       "vs_labels": label_metrics(y, vb)}
            assert block["best_threshold"]["vs_reference"]["flips"] == flips
            block["operating_threshold"] = t_best
        out["candidates"][name] = block
    return out


def paired_ratio(candidate: Mapping, reference: Mapping) -> Optional[float]:
    """Median over batches of candidate ms / reference ms for the same batch and pass.

    Pairing cancels what changes between batches (length, load from other processes), so it
    is steadier than a ratio of medians on a shared machine. Falls back to the ratio of the
    medians when per-batch times are missing or of different counts.
    """
    a, b = candidate.get("per_batch_ms"), reference.get("per_batch_ms")
    if a and b and len(a) == len(b):
        return float(np.median(np.asarray(a) / np.asarray(b)))
    if "median_ms" in candidate and reference.get("median_ms"):
        return candidate["median_ms"] / reference["median_ms"]
    return None


def recommend(
    result: dict,
    latency: Mapping[str, dict],
    sizes: Mapping[str, int],
    max_flip_rate: float = DEFAULT_MAX_FLIP_RATE,
) -> dict:
    """Which model to ship, by the rule in the module docstring.

    ``latency``: model -> :func:`score_all` latency dict (same run, same batches; compared
    with :func:`paired_ratio`); ``sizes``: model -> bytes. Returns ``{"ship", "reason", "candidates": {name: {...checks}}, "rule"}``.
    """
    ref = result["reference"]["name"]
    n = result["texts"]
    target = result["target_precision"]
    checks = {}
    winners = []
    for name, c in result["candidates"].items():
        op = c["best_threshold"] or c["at_reference_threshold"]
        flips = op["vs_reference"]["flips"]
        prec = op["vs_labels"]["precision"]
        speed = paired_ratio(latency[name], latency[ref]) if name in latency and ref in latency else None
        size = sizes[name] / sizes[ref] if name in sizes and ref in sizes else None
        ok_flips = flips <= max_flip_rate * n
        ok_prec = prec is not None and prec >= target  # reported, not a condition (see the docstring)
        faster = speed is not None and speed <= 1 - SPEED_MARGIN
        same_speed_smaller = (speed is not None and abs(speed - 1) < SPEED_MARGIN
                              and size is not None and size <= SIZE_MARGIN)
        checks[name] = {"operating_threshold": c["operating_threshold"], "flips": flips,
                        "max_flips": max_flip_rate * n, "flips_ok": ok_flips, "precision": prec,
                        "precision_ok": ok_prec, "latency_ratio": speed, "size_ratio": size,
                        "faster": faster, "same_speed_smaller": same_speed_smaller}
        if ok_flips and (faster or same_speed_smaller):
            winners.append((speed, name))
    ship = min(winners)[1] if winners else ref
    parts = []
    for name, ch in checks.items():
        why = [f"{ch['flips']} flip(s) of {n} at threshold {ch['operating_threshold']:.4f} "
               f"(limit {ch['max_flips']:.1f}: {'ok' if ch['flips_ok'] else 'too many'})",
               "precision there " + (f"{ch['precision']:.4f}" if ch["precision"] is not None else "undefined")
               + f" (target {target})"]
        if ch["latency_ratio"] is not None:
            why.append(f"latency {ch['latency_ratio']:.2f}x the reference's (median of per-batch ratios)")
        if ch["size_ratio"] is not None:
            why.append(f"file {ch['size_ratio']:.2f}x the reference's size")
        parts.append(f"`{name}`: " + "; ".join(why) + ".")
    if ship == ref:
        head = (f"Ship `{ref}` (the reference): no candidate both stays within the flip limit and is faster "
                "(or as fast and smaller) in this run.")
    else:
        head = (f"Ship `{ship}` with threshold {checks[ship]['operating_threshold']:.6f}: it stays within the flip "
                f"limit and is {'faster than' if checks[ship]['faster'] else 'as fast as and smaller than'} `{ref}` "
                "in this run.")
    return {"ship": ship, "reason": head + " " + " ".join(parts), "candidates": checks,
            "rule": {"max_flip_rate": max_flip_rate, "speed_margin": SPEED_MARGIN, "size_margin": SIZE_MARGIN}}


# --------------------------------------------------------------------------- backends


def _num_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _onnx_file(model_dir: Path) -> Path:
    """``1/<onnx_file>`` from ``configs/embedded.pbtxt`` (parameter ``onnx_file``), default model.onnx."""
    cfg = model_dir / "configs" / "embedded.pbtxt"
    name = "model.onnx"
    if cfg.is_file():
        m = re.search(r'key:\s*"onnx_file"\s*value:\s*\{\s*string_value:\s*"([^"]+)"', cfg.read_text())
        if m:
            name = m.group(1)
    return model_dir / "1" / name


class InProcessBackend:
    """The tokenizer files and ONNX models of ``repo`` run in this process (CPU).

    ``encode(texts)``: int64 ``(input_ids, attention_mask)`` [n, L] like the ``tokenizer``
    model (truncation to ``model_max_length``, padding to the longest text). ``run(model,
    ids, mask)``: float32 logits [n, K]. onnxruntime ``CPUExecutionProvider``,
    ``intra_op_num_threads`` = ``threads`` (default: the usable cores). Raises
    :class:`ParityError` for a missing model or tokenizer.
    """

    kind = "in-process"

    def __init__(self, repo: os.PathLike | str, models: Sequence[str], threads: Optional[int] = None):
        import onnxruntime as ort
        from transformers import AutoTokenizer

        self.repo = Path(repo)
        tok_dir = self.repo / "tokenizer" / "1"
        if not (tok_dir / "tokenizer_config.json").is_file():
            raise ParityError(f"{tok_dir}: no tokenizer files")
        self.tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
        self.max_length = int(self.tokenizer.model_max_length)
        self.threads = threads or _num_cores()
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self.paths, self.sessions = {}, {}
        for m in models:
            path = _onnx_file(self.repo / m)
            if not path.is_file():
                raise ParityError(f"model {m!r}: {path} does not exist")
            self.paths[m] = path
            self.sessions[m] = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        self.description = (f"in-process: onnxruntime {ort.__version__} CPUExecutionProvider, "
                            f"{self.threads} intra-op thread(s), tokenizer {tok_dir}")

    def encode(self, texts: Sequence[str]):
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=False)
        longest = max(len(ids) for ids in enc["input_ids"])
        padded = self.tokenizer.pad(enc, padding="max_length", max_length=longest, return_tensors="np")
        return padded["input_ids"].astype(np.int64), padded["attention_mask"].astype(np.int64)

    def run(self, model: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.sessions[model].run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]

    def close(self) -> None:
        self.sessions.clear()


class TritonBackend:
    """The ``tokenizer`` and classifier models of a Triton server, through tritonclient HTTP.

    Latency measured with it is a client round trip (HTTP, serialisation, the server's
    queue), not comparable with in-process numbers. Raises :class:`ParityError` if a model
    is not ready or a request fails.
    """

    kind = "triton"

    def __init__(self, url: str, models: Sequence[str], timeout_s: float = 300.0):
        import tritonclient.http as httpclient

        self._http = httpclient
        self.url = url
        self.client = httpclient.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)
        for m in ["tokenizer", *models]:
            try:
                ready = self.client.is_model_ready(m)
            except Exception as e:  # connection refused etc.
                raise ParityError(f"Triton server at {url}: {e}") from e
            if not ready:
                raise ParityError(f"Triton server at {url}: model {m!r} is not ready")
        self.description = f"Triton server at {url} (tritonclient HTTP): tokenizer, then each model"

    def _infer(self, model: str, arrays: Mapping[str, np.ndarray], outputs: Sequence[str]):
        from tritonclient.utils import InferenceServerException

        inputs = []
        for k, a in arrays.items():
            dtype = "BYTES" if a.dtype == np.object_ else "INT64"
            inputs.append(self._http.InferInput(k, list(a.shape), dtype))
            inputs[-1].set_data_from_numpy(a)
        try:
            r = self.client.infer(model, inputs)
        except InferenceServerException as e:
            raise ParityError(f"{model}: {e}") from e
        return [r.as_numpy(o) for o in outputs]

    def encode(self, texts: Sequence[str]):
        arr = np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)
        ids, mask = self._infer("tokenizer", {"TEXT": arr}, ["input_ids", "attention_mask"])
        return ids.astype(np.int64), mask.astype(np.int64)

    def run(self, model: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._infer(model, {"input_ids": ids, "attention_mask": mask}, ["logits"])[0]

    def close(self) -> None:
        self.client.close()


def score_all(
    backend,
    models: Sequence[str],
    texts: Sequence[str],
    batch_size: int = BATCH_SIZE,
    timing_passes: int = 1,
    progress: Optional[Callable[[int], None]] = None,
) -> tuple[dict, dict, list]:
    """Run ``texts`` through ``backend`` for every model; return ``(logits, latency, batches)``.

    Batches: ``batch_size`` consecutive texts, encoded once and fed to every model. Each model
    first runs the first batch once untimed (warm-up); then per batch the models run in
    rotating order (batch i starts with model i mod m) so drifts in machine load hit all
    alike. ``timing_passes`` > 1 repeats the timed loop (logits from the first pass).
    ``logits``: model -> float32 [n, K]. ``latency``: model -> ``{"batches", "median_ms",
    "mean_ms", "p90_ms", "total_s", "texts_per_s", "per_batch_ms"}`` (wall clock of the ``run``
    call per batch, ms; ``per_batch_ms[j]`` is the same batch for every model, so
    :func:`paired_ratio` can compare them pairwise). ``batches``: ``[(rows, padded length)]``.
    """
    enc = []
    for start in range(0, len(texts), batch_size):
        enc.append(backend.encode(texts[start : start + batch_size]))
    for m in models:
        backend.run(m, *enc[0])
    times = {m: [] for m in models}
    logits = {m: [] for m in models}
    for p in range(max(1, timing_passes)):
        for i, (ids, mask) in enumerate(enc):
            k = i % len(models)
            for m in list(models[k:]) + list(models[:k]):
                t0 = time.perf_counter()
                out = backend.run(m, ids, mask)
                times[m].append((time.perf_counter() - t0) * 1000.0)
                if p == 0:
                    if out.dtype != np.float32 or out.ndim != 2 or out.shape[0] != len(ids):
                        raise ParityError(f"{m}: logits {out.dtype} {out.shape}, expected float32 [{len(ids)}, K]")
                    logits[m].append(out)
            if progress:
                progress(len(ids))
    latency = {}
    for m in models:
        t = np.asarray(times[m])
        latency[m] = {"batches": int(len(t)), "median_ms": float(np.median(t)), "mean_ms": float(np.mean(t)),
                      "p90_ms": float(np.percentile(t, 90)), "total_s": float(t.sum() / 1000.0),
                      "texts_per_s": float(len(texts) * max(1, timing_passes) / (t.sum() / 1000.0)),
                      "per_batch_ms": [round(float(x), 3) for x in t]}
    return ({m: np.concatenate(v) for m, v in logits.items()}, latency,
            [(int(ids.shape[0]), int(ids.shape[1])) for ids, _ in enc])


# --------------------------------------------------------------------------- report


def _environment() -> dict:
    import importlib.metadata as md

    from orchestrator.tooling.bench import cpu_model

    cpu = cpu_model()
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu": cpu,
           "cores": _num_cores(),
           "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
    for p in ("onnxruntime", "transformers", "tokenizers", "numpy", "tritonclient"):
        try:
            env[p] = md.version(p)
        except md.PackageNotFoundError:
            env[p] = None
    return env


def _fmt(x, nd=4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _confusion_md(c: dict, ref: str, cand: str) -> list:
    return [
        f"| `{ref}` \\ `{cand}` | positive | negative |",
        "|---|---:|---:|",
        f"| positive | {c['ref_pos_cand_pos']} | {c['ref_pos_cand_neg']} |",
        f"| negative | {c['ref_neg_cand_pos']} | {c['ref_neg_cand_neg']} |",
    ]


def render_markdown(report: dict) -> str:
    """``report.md`` from the ``report.json`` dict."""
    r = report["result"]
    ref = r["reference"]["name"]
    rec = report["recommendation"]
    L = [f"# Parity report: {', '.join(f'`{c}`' for c in r['candidates'])} vs `{ref}`", ""]
    L += [f"Created {report['created_utc']} UTC by `{report['command']}`.", ""]
    d = report["data"]
    L += [f"- Data: {d['source']}; {d['texts']:,} texts, {d['positives']:,} positive "
          f"(sha256 of the label/text lines `{d['sha256'][:16]}...`).",
          f"- Backend: {report['backend']}.",
          f"- Machine: {report['environment']['cpu']}, {report['environment']['cores']} cores, 1-minute load "
          f"{report['environment']['load_average_1min']} at the start; onnxruntime {report['environment']['onnxruntime']}.",
          f"- Batches: {len(report['batches'])} of up to {report['batch_size']} texts, each padded to its longest text "
          f"(lengths {min(b[1] for b in report['batches'])} to {max(b[1] for b in report['batches'])} tokens).", ""]
    L += ["## Recommendation", "", rec["reason"], ""]
    L += ["## Logit agreement", "",
          "d = candidate logit - reference logit, over every text.", "",
          "| candidate | mean \\|d\\| | max d | min d | max \\|d\\| | max \\|probability diff\\| |",
          "|---|---:|---:|---:|---:|---:|"]
    for name, c in r["candidates"].items():
        g = c["logits"]
        L.append(f"| `{name}` | {g['mean_abs_diff']:.3g} | {g['max_diff']:.3g} | {g['min_diff']:.3g} | "
                 f"{g['max_abs_diff']:.3g} | {g['max_abs_prob_diff']:.3g} |")
    L += ["", "![candidate vs reference scores and their differences](logits.png)", ""]
    rr = r["reference"]
    m = rr["vs_labels"]
    L += ["## Reference threshold", "",
          f"Target precision {r['target_precision']}: the smallest threshold among `{ref}`'s probabilities whose "
          f"precision against the labels is at least the target is **{rr['threshold']:.6f}** "
          f"(logit {_fmt(rr['threshold_logit'])}). There `{ref}` calls {rr['positive_verdicts']:,} of "
          f"{r['texts']:,} texts positive: precision {_fmt(m['precision'])}, recall {_fmt(m['recall'])}, "
          f"accuracy {_fmt(m['accuracy'])} (at 0.5: precision {_fmt(rr['at_0_5']['precision'])}, recall "
          f"{_fmt(rr['at_0_5']['recall'])}, accuracy {_fmt(rr['at_0_5']['accuracy'])}).", ""]
    L += ["## Candidates at the reference threshold", "",
          "| model | flips | ref+ cand- | ref- cand+ | accuracy | precision | recall |",
          "|---|---:|---:|---:|---:|---:|---:|",
          f"| `{ref}` (reference) | - | - | - | {_fmt(m['accuracy'])} | {_fmt(m['precision'])} | {_fmt(m['recall'])} |"]
    for name, c in r["candidates"].items():
        a = c["at_reference_threshold"]
        L.append(f"| `{name}` | {a['vs_reference']['flips']} | {a['vs_reference']['ref_pos_cand_neg']} | "
                 f"{a['vs_reference']['ref_neg_cand_pos']} | {_fmt(a['vs_labels']['accuracy'])} | "
                 f"{_fmt(a['vs_labels']['precision'])} | {_fmt(a['vs_labels']['recall'])} |")
    L.append("")
    for name, c in r["candidates"].items():
        L += [f"Confusion of `{name}` against `{ref}`'s verdicts (rows: reference):", ""]
        L += _confusion_md(c["at_reference_threshold"]["vs_reference"], ref, name) + [""]
    L += ["## Re-tuned thresholds", ""]
    retuned = {n: c for n, c in r["candidates"].items() if c["best_threshold"]}
    if not retuned:
        L += ["Every candidate gives the reference's verdicts at the reference threshold: nothing to re-tune.", ""]
    for name, c in retuned.items():
        b = c["best_threshold"]
        same = " (the reference threshold is already the best)" if b["threshold"] == rr["threshold"] else ""
        L += [f"`{name}`: threshold **{b['threshold']:.6f}**{same} (logit {_fmt(b['threshold_logit'])}) gives "
              f"{b['vs_reference']['flips']} flip(s) (was {c['at_reference_threshold']['vs_reference']['flips']}); "
              f"precision {_fmt(b['vs_labels']['precision'])}, recall {_fmt(b['vs_labels']['recall'])}, "
              f"accuracy {_fmt(b['vs_labels']['accuracy'])}.", ""]
        L += _confusion_md(b["vs_reference"], ref, name) + [""]
    L += ["## Speed and size", "", f"Measured in this run: {report['latency_source']}.", "",
          "| model | file bytes | median ms/batch | mean | p90 | texts/s | vs reference (paired) |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    lat = report["latency"]
    for name in [ref, *r["candidates"]]:
        mdl = report["models"][name]
        la = lat.get(name)
        if la:
            rel = paired_ratio(la, lat[ref])
            L.append(f"| `{name}` | {mdl['bytes']:,} | {la['median_ms']:.1f} | {la['mean_ms']:.1f} | "
                     f"{la['p90_ms']:.1f} | {la['texts_per_s']:.0f} | {rel:.2f}x |")
        else:
            L.append(f"| `{name}` | {mdl['bytes']:,} | n/a | n/a | n/a | n/a | n/a |")
    L += ["", f"ms per batch of up to {report['batch_size']} texts, {report['timing_passes']} timed pass(es) over the "
          "data after one warm-up batch, models interleaved batch by batch; \"vs reference\" is the median over "
          "batches of the per-batch time ratio.", ""]
    if report.get("cross_check"):
        cc = report["cross_check"]
        L += ["## Cross-check", "", f"The same batches through {cc['backend']}: token ids identical: "
              f"{cc['token_ids_identical']}; max |logit difference| to the main run: "
              + ", ".join(f"`{k}` {v:.3g}" for k, v in cc["max_abs_logit_diff"].items()) + ".", ""]
        if cc.get("latency"):
            L += ["Round-trip latency there (HTTP; not comparable with in-process numbers): "
                  + ", ".join(f"`{k}` {v['median_ms']:.1f} ms/batch median" for k, v in cc["latency"].items()) + ".", ""]
    L += ["## Thresholds", "", "`thresholds.json` (probabilities for the `THRESHOLD` input; candidates: "
          "their operating threshold):", "", "```json", json.dumps(report["thresholds"], indent=2), "```", ""]
    L += ["## Definitions", "",
          "- Score: the logit (one-logit models) or logit[1] - logit[0] (two-logit models); probability = "
          "sigmoid(score) in float64 rounded to float32, verdict = probability >= threshold (the `postprocess` model's rule).",
          "- Reference threshold: the smallest threshold among the reference's probabilities on these texts whose "
          "precision TP/(TP+FP) against the labels is at least the target (any threshold between the next lower "
          "probability and it gives the same verdicts).",
          "- Flips: texts whose candidate verdict differs from the reference's at the same threshold.",
          "- Best candidate threshold (only when there are flips): among the reference threshold, the candidate's "
          "probabilities and a value just above its largest one, the threshold with the fewest flips; ties go to the "
          "one closest to the reference threshold, then the smaller.",
          f"- Recommendation: a candidate qualifies with at most {rec['rule']['max_flip_rate']:.2%} of the texts "
          "flipped at its operating threshold (its precision there is reported, not a condition: the reference "
          "threshold sits exactly at the target, so one flip can move a candidate just below it); it replaces the reference "
          f"if its latency (median of per-batch ratios) is at most {1 - rec['rule']['speed_margin']:.2f}x the reference's, or "
          f"within {rec['rule']['speed_margin']:.0%} with a file at most {rec['rule']['size_margin']:.1f}x the size. "
          "Speed is the one measured here; other hardware (a GPU, TensorRT) needs its own run.",
          "", "Source: `orchestrator/tooling/modeling/parity.py` (`orchestrator parity`).", ""]
    return "\n".join(L)


def plot_logits(path: Path, ref_name: str, ref_scores: np.ndarray, cand_scores: Mapping[str, np.ndarray],
                ref_threshold: float) -> None:
    """PNG, one row per candidate: candidate vs reference score (with y = x and the reference
    threshold's logit), the difference vs the reference score, and a histogram of the
    differences (log count axis). Scores in logits (:func:`binary_scores`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(cand_scores)
    fig, axes = plt.subplots(n, 3, figsize=(13, 3.6 * n), squeeze=False)
    t_logit = _logit(ref_threshold)
    for row, (name, s) in enumerate(cand_scores.items()):
        ax = axes[row][0]
        ax.scatter(ref_scores, s, s=4, alpha=0.5, linewidths=0)
        lo, hi = float(min(ref_scores.min(), s.min())), float(max(ref_scores.max(), s.max()))
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="y = x")
        if t_logit is not None:
            ax.axvline(t_logit, color="red", linewidth=0.8, linestyle="--", label="reference threshold")
            ax.axhline(t_logit, color="red", linewidth=0.8, linestyle="--")
        ax.set_xlabel(f"{ref_name} score (logit)")
        ax.set_ylabel(f"{name} score (logit)")
        ax.set_title(f"{name} vs {ref_name}")
        ax.legend(loc="upper left", fontsize=8)
        d = s - ref_scores
        ax = axes[row][1]
        ax.scatter(ref_scores, d, s=4, alpha=0.5, linewidths=0, color="tab:green")
        ax.axhline(0, color="black", linewidth=0.8)
        if t_logit is not None:
            ax.axvline(t_logit, color="red", linewidth=0.8, linestyle="--")
        ax.set_xlabel(f"{ref_name} score (logit)")
        ax.set_ylabel(f"d = {name} - {ref_name}")
        ax.set_title("difference vs reference score")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax = axes[row][2]
        ax.hist(d, bins=60, color="tab:orange")
        ax.set_yscale("log")
        ax.set_xlabel(f"d = {name} - {ref_name} (logit)")
        ax.set_ylabel("texts")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
        ax.set_title(f"max |d| {np.max(np.abs(d)):.2g}, mean |d| {np.mean(np.abs(d)):.2g}")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    os.replace(tmp, path)


def write_report(report: dict, out: Path, ref_scores: np.ndarray, cand_scores: Mapping[str, np.ndarray]) -> dict:
    """Write ``report.json``, ``report.md``, ``logits.png``, ``thresholds.json`` into ``out``;
    return ``{name: path}``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / k for k in ("report.json", "report.md", "logits.png", "thresholds.json")}
    paths["report.json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    paths["report.md"].write_text(render_markdown(report), encoding="utf-8")
    paths["thresholds.json"].write_text(json.dumps(report["thresholds"], indent=2) + "\n", encoding="utf-8")
    plot_logits(paths["logits.png"], report["result"]["reference"]["name"], ref_scores, cand_scores,
                report["result"]["reference"]["threshold"])
    return paths


# --------------------------------------------------------------------------- run


def run_parity(
    reference: str,
    candidates: Sequence[str],
    data: LabeledData,
    repo: os.PathLike | str,
    out: Optional[os.PathLike | str],
    *,
    target_precision: float = DEFAULT_TARGET_PRECISION,
    max_flip_rate: float = DEFAULT_MAX_FLIP_RATE,
    url: Optional[str] = None,
    embedded_server: bool = False,
    cross_check: bool = False,
    batch_size: int = BATCH_SIZE,
    timing_passes: int = 1,
    threads: Optional[int] = None,
    command: Optional[str] = None,
    quiet: bool = False,
) -> dict:
    """Score ``data`` with every model, compare, recommend, and write the report to ``out``
    (``None``: no files). Returns the report dict (what ``report.json`` holds).

    Main backend: in-process, or the server at ``url``, or an embedded server on ``repo``
    (``embedded_server``). ``cross_check``: also the other kind (in-process when the main one
    is a server; an embedded server otherwise). Raises :class:`ParityError`, and
    ``orchestrator.tooling.server.ServerError`` when the embedded server fails to start.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    repo = Path(repo)
    models = [reference, *candidates]
    if len(set(models)) != len(models):
        raise ParityError(f"model names repeat: {models}")
    if not candidates:
        raise ParityError("no candidates")
    if url and embedded_server:
        raise ParityError("give --url or --embedded-server, not both")
    server = None
    console = Console(stderr=True, quiet=quiet)
    env = _environment()

    def start_server():
        from orchestrator.tooling.server import TritonServer

        nonlocal server
        console.print(f"starting the embedded Triton server on {repo} ({', '.join(['tokenizer', *models])})")
        server = TritonServer(repo, models=["tokenizer", *models]).start()
        return server.http_url

    def run_backend(backend, passes):
        with Progress(TextColumn(f"{backend.kind}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, disable=quiet) as prog:
            task = prog.add_task("texts", total=len(data.texts) * max(1, passes))
            return score_all(backend, models, data.texts, batch_size, passes,
                             progress=lambda k: prog.advance(task, k))

    try:
        if url or embedded_server:
            main = TritonBackend(url or start_server(), models)
        else:
            main = InProcessBackend(repo, models, threads)
        try:
            logits, latency, batches = run_backend(main, timing_passes)
            main_desc = main.description
            main_kind = main.kind
            main_ids = [main.encode(data.texts[s : s + batch_size])[0] for s in range(0, min(len(data.texts), batch_size * 4), batch_size)] if cross_check else None
        finally:
            main.close()
        cc = None
        if cross_check:
            other = InProcessBackend(repo, models, threads) if main_kind == "triton" else TritonBackend(start_server(), models)
            try:
                logits2, latency2, _ = run_backend(other, 1)
                ids2 = [other.encode(data.texts[s : s + batch_size])[0] for s in range(0, min(len(data.texts), batch_size * 4), batch_size)]
            finally:
                other.close()
            cc = {"backend": other.description,
                  "token_ids_identical": all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(main_ids, ids2)),
                  "token_ids_checked_batches": len(ids2),
                  "max_abs_logit_diff": {m: float(np.max(np.abs(logits[m].astype(np.float64) - logits2[m]))) for m in models},
                  "latency": latency2 if other.kind == "triton" else None}
            if other.kind == "in-process":  # prefer in-process timing for the recommendation
                latency, latency2 = latency2, latency
                cc["latency"] = latency2
                latency_source = other.description
            else:
                latency_source = main_desc
        else:
            latency_source = main_desc
    finally:
        if server is not None:
            server.stop()

    result = compare(logits[reference], {c: logits[c] for c in candidates}, data.labels, target_precision, reference)
    model_files = {}
    for m in models:
        p = _onnx_file(repo / m)
        model_files[m] = {"file": str(p), "bytes": p.stat().st_size if p.is_file() else None,
                          "sha256": sha256_file(p) if p.is_file() else None}
    sizes = {m: v["bytes"] for m, v in model_files.items() if v["bytes"] is not None}
    rec = recommend(result, latency, sizes, max_flip_rate)
    thresholds = {reference: result["reference"]["threshold"]}
    thresholds.update({c: result["candidates"][c]["operating_threshold"] for c in candidates})
    report = {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "command": command or "orchestrator parity",
        "data": {"source": data.source, "texts": len(data.texts), "positives": int(data.labels.sum()),
                 "sha256": data.digest()},
        "backend": main_desc,
        "latency_source": latency_source,
        "batch_size": batch_size,
        "timing_passes": timing_passes,
        "batches": batches,
        "environment": env,
        "models": model_files,
        "latency": latency,
        "result": result,
        "recommendation": rec,
        "thresholds": thresholds,
        "cross_check": cc,
    }
    if out is not None:
        ref_s = binary_scores(logits[reference])
        write_report(report, Path(out), ref_s, {c: binary_scores(logits[c]) for c in candidates})
    return report


# --------------------------------------------------------------------------- CLI


def _default_repo() -> Path:
    return default_model_repository()


def add_parity_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator parity`` options to ``parser`` (returned for chaining)."""
    parser.add_argument("--reference", default="classifier", help="reference model (default: %(default)s)")
    parser.add_argument("--candidates", nargs="+", default=None, metavar="MODEL",
                        help="models to compare with the reference (default: <reference>_fp16)")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--data", type=Path, default=None,
                     help="labeled texts: .jsonl ({\"text\", \"label\"}) or .tsv (label<TAB>text)")
    src.add_argument("--held-out", action="store_true",
                     help="use the held-out test split of orchestrator.tooling.modeling.data (all corpora)")
    src.add_argument("--write-held-out", type=Path, default=None, metavar="FILE",
                     help="only write the held-out test split to FILE (.jsonl or .tsv) and exit")
    parser.add_argument("--target-precision", type=float, default=DEFAULT_TARGET_PRECISION,
                        help="precision the reference threshold must reach (default: %(default)s)")
    parser.add_argument("--max-flip-rate", type=float, default=DEFAULT_MAX_FLIP_RATE,
                        help="flips (fraction of texts) a shippable candidate may have (default: %(default)s)")
    be = parser.add_mutually_exclusive_group()
    be.add_argument("--in-process", action="store_true", help="onnxruntime in this process (the default)")
    be.add_argument("--url", default=None, help="host:port of a running Triton server (HTTP)")
    be.add_argument("--embedded-server", action="store_true", help="start the embedded Triton server on --repo")
    parser.add_argument("--cross-check", action="store_true",
                        help="also run the other backend (embedded server or in-process) and compare logits")
    parser.add_argument("--repo", default=None,
                        help="model repository (default: ./model_repository, else the one in this checkout)")
    parser.add_argument("--out", type=Path, default=Path("docs/parity"), help="report directory (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="texts per batch (default: %(default)s)")
    parser.add_argument("--timing-passes", type=int, default=1,
                        help="timed passes over the data (logits from the first; default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    return parser


def parity_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator parity``. Returns 0 on success, 1 on :class:`ParityError` or a server
    or data error (message on stderr), 2 on bad arguments."""
    from orchestrator.tooling.modeling import data as D
    from orchestrator.tooling.server import ServerError

    try:
        if args.write_held_out:
            d, extra = held_out_data()
            path = write_labeled(args.write_held_out, d, extra if args.write_held_out.suffix == ".jsonl" else None)
            print(f"wrote {len(d.texts):,} held-out texts ({int(d.labels.sum()):,} positive) to {path}")
            return 0
        if not args.data and not args.held_out:
            print("error: --data FILE or --held-out is required", file=sys.stderr)
            return 2
        if (args.url or args.embedded_server or args.cross_check) and not 1 <= args.batch_size <= BATCH_SIZE:
            print(f"error: --batch-size must be in [1, {BATCH_SIZE}] (the models' max_batch_size)", file=sys.stderr)
            return 2
        data = held_out_data()[0] if args.held_out else read_labeled(args.data)
        candidates = args.candidates or [f"{args.reference}_fp16"]
        repo = Path(args.repo) if args.repo else _default_repo()
        command = "orchestrator parity " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "parity"
                                                       else sys.argv[1:])
        report = run_parity(
            args.reference, candidates, data, repo, args.out, target_precision=args.target_precision,
            max_flip_rate=args.max_flip_rate, url=args.url, embedded_server=args.embedded_server,
            cross_check=args.cross_check, batch_size=args.batch_size, timing_passes=args.timing_passes,
            threads=args.threads, command=command, quiet=args.quiet,
        )
    except (ParityError, ServerError, D.DataUnavailableError, OSError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    r = report["result"]
    print(f"reference {args.reference}: threshold {r['reference']['threshold']:.6f} for precision >= "
          f"{r['target_precision']} on {r['texts']} texts")
    for c, block in r["candidates"].items():
        g, a = block["logits"], block["at_reference_threshold"]["vs_reference"]
        print(f"{c}: mean |d| {g['mean_abs_diff']:.3g}, max |d| {g['max_abs_diff']:.3g}, flips {a['flips']}, "
              f"operating threshold {block['operating_threshold']:.6f}")
    print(report["recommendation"]["reason"])
    if args.out:
        print(f"report: {args.out}/report.md")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.tooling.modeling.parity", description=__doc__.split("\n")[0])
    add_parity_arguments(p)
    return parity_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
