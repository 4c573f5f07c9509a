"""Temperature scaling fitted on labeled data, and how calibrated a model is.

``orchestrator calibrate MODEL_DIR --data LABELED`` (docs/guides/bring-your-own-model.md "Calibration"):

1. runs the model's ONNX file in this process (onnxruntime, the tokenizer files its
   ``head.json`` names: :class:`~.backends.InProcessBackend`) over the labeled texts;
2. fits temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural
   Networks"): the ``T`` > 0 minimising the negative log-likelihood of the labels under
   the head's probabilities of ``logits / T`` (:func:`fit_temperature`,
   ``scipy.optimize.minimize_scalar``, bounded, on ``log T``): one ``T`` for binary and
   multiclass heads, one per label for multilabel heads;
3. reports ECE, Brier score and a reliability diagram before and after (on ``--eval-data``
   when given, else on the fitting data), under ``--report`` (default
   ``.cache/calibrate/<model>``: ``calibration.md``, ``calibration.json``,
   ``reliability.png``);
4. with ``--write``: stores ``{"method": "temperature", "temperature": ..., "fitted_on":
   ..., "ece_before": ..., "ece_after": ...}`` as ``calibration`` in ``MODEL_DIR/head.json``
   and in the ``head`` parameter of the postprocess model that follows the model in each
   ensemble of the repository, so the router and the ensemble answer alike
   (``orchestrator.runtime.routing.heads``).

``--data`` / ``--eval-data`` take a labeled file (``.jsonl`` or TSV, ``labeled.read_labeled``)
or ``split:validation`` / ``split:test``: the project's corpus split
(``orchestrator.tooling.modeling.data``), for the demo classifiers.

Definitions (equal-width bins, :data:`BINS` of them): binary and multilabel heads: ECE over
the positive probability, ``sum_b n_b/n |mean p_b - fraction positive_b|`` (multilabel: the
mean over labels); multiclass: over the top label's probability against its accuracy.
Brier: mean squared error of the probabilities against 0/1 (multiclass: summed over the
classes, then averaged over texts; multilabel: averaged over labels too).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from orchestrator.runtime.routing.heads import BINARY, MULTICLASS, MULTILABEL, Head, read_head
from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.modeling.parity.labeled import LabeledData, read_labeled
from orchestrator.tooling.paths import PROJECT_ROOT

BINS = 15
#: Search interval of the temperature (``minimize_scalar`` bounded on ``log T``).
T_BOUNDS = (0.05, 20.0)
SPLIT_PREFIX = "split:"


class CalibrationError(ToolingError):
    """Bad data, a missing model, or a head that cannot be calibrated (message says which)."""


# ----------------------------------------------------------------------------- fitting


def _binary_nll(score: np.ndarray, y: np.ndarray, t: float) -> float:
    z = score / t
    # log(1 + e^z) - y z, stable
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def _softmax_nll(z: np.ndarray, y: np.ndarray, t: float) -> float:
    s = z / t
    s = s - s.max(axis=1, keepdims=True)
    logp = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    return float(-np.mean(logp[np.arange(len(y)), y]))


def _minimize(nll) -> float:
    from scipy.optimize import minimize_scalar

    lo, hi = np.log(T_BOUNDS[0]), np.log(T_BOUNDS[1])
    res = minimize_scalar(lambda u: nll(float(np.exp(u))), bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-6})
    return float(np.exp(res.x))


def binary_score(head: Head, logits: np.ndarray) -> np.ndarray:
    """A binary head's score float64 [N]: the positive logit (1 logit) or positive minus
    negative (2 logits); sigmoid of it is the head's probability."""
    z = np.asarray(logits, dtype=np.float64).reshape(len(logits), -1)
    if head.num_logits == 1:
        return z[:, 0]
    return z[:, head.positive_index] - z[:, 1 - head.positive_index]


def fit_temperature(head: Head, logits: np.ndarray, labels: np.ndarray) -> List[float]:
    """The temperature(s) minimising the labels' negative log-likelihood: ``[T]`` for
    binary (labels int [N] 0/1) and multiclass heads (labels int [N] class index), ``[T_1..T_K]``
    for multilabel heads (labels bool [N, K]). Logits [N, num_logits], uncalibrated.

    Raises:
        CalibrationError: no texts, or a binary label set of one class only.
    """
    z = np.asarray(logits, dtype=np.float64).reshape(len(logits), -1)
    y = np.asarray(labels)
    if len(z) == 0 or len(z) != len(y):
        raise CalibrationError(f"{len(z)} logit rows for {len(y)} labels: need the same number, at least one")
    if head.kind == BINARY:
        s, yy = binary_score(head, z), y.astype(np.float64).reshape(-1)
        if yy.min() == yy.max():
            raise CalibrationError("every label is the same: a temperature cannot be fitted on one class")
        return [_minimize(lambda t: _binary_nll(s, yy, t))]
    if head.kind == MULTICLASS:
        yi = y.astype(np.int64).reshape(-1)
        return [_minimize(lambda t: _softmax_nll(z, yi, t))]
    yb = y.astype(np.float64).reshape(len(z), -1)
    out = []
    for k in range(z.shape[1]):
        col, lab = z[:, k], yb[:, k]
        # a label that never (or always) applies: any T fits; keep the logits as they are
        out.append(1.0 if lab.min() == lab.max() else _minimize(lambda t, c=col, lb=lab: _binary_nll(c, lb, t)))
    return out


def with_temperature(head: Head, temperature: Sequence[float], **provenance: Any) -> Head:
    """``head`` with ``calibration`` = temperature scaling by ``temperature`` (one value, or
    one per label for multilabel heads) plus ``provenance`` keys."""
    t: Any = [round(float(x), 6) for x in temperature]
    if head.kind != MULTILABEL or len(t) == 1:
        t = t[0]
    return dataclasses.replace(head, calibration={"method": "temperature", "temperature": t, **provenance})


def uncalibrated(head: Head) -> Head:
    """``head`` without its calibration."""
    return dataclasses.replace(head, calibration=None)


# ----------------------------------------------------------------------------- measuring


def _ece_binary(p: np.ndarray, y: np.ndarray, bins: int) -> float:
    idx = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.sum() / len(p) * abs(float(p[m].mean()) - float(y[m].mean()))
    return total


def ece(head: Head, probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error of ``probabilities`` [N, columns] (``head.probabilities``)
    against ``labels`` (module docstring)."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(len(probabilities), -1)
    y = np.asarray(labels)
    if head.kind == MULTICLASS:
        conf, pred = p.max(axis=1), p.argmax(axis=1)
        return _ece_binary(conf, (pred == y.reshape(-1)).astype(np.float64), bins)
    yb = y.astype(np.float64).reshape(len(p), -1)
    return float(np.mean([_ece_binary(p[:, k], yb[:, k], bins) for k in range(p.shape[1])]))


def brier(head: Head, probabilities: np.ndarray, labels: np.ndarray) -> float:
    """Brier score of ``probabilities`` [N, columns] against ``labels`` (module docstring)."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(len(probabilities), -1)
    y = np.asarray(labels)
    if head.kind == MULTICLASS:
        onehot = np.zeros_like(p)
        onehot[np.arange(len(p)), y.astype(np.int64).reshape(-1)] = 1.0
        return float(np.mean(((p - onehot) ** 2).sum(axis=1)))
    return float(np.mean((p - y.astype(np.float64).reshape(len(p), -1)) ** 2))


def accuracy(head: Head, probabilities: np.ndarray, labels: np.ndarray, threshold: float = 0.5) -> float:
    """Share of texts answered right at ``threshold`` (multiclass: the top label; multilabel:
    every label's verdict right)."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(len(probabilities), -1)
    y = np.asarray(labels)
    if head.kind == MULTICLASS:
        return float(np.mean(p.argmax(axis=1) == y.reshape(-1)))
    v = head.verdicts(p, np.full((len(p), 1), threshold))
    return float(np.mean((v == y.astype(bool).reshape(len(p), -1)).all(axis=1)))


def reliability(head: Head, probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS) -> List[Dict[str, float]]:
    """The reliability diagram's points: per non-empty bin ``{"confidence", "frequency",
    "n"}`` (binary/multilabel: mean positive probability and fraction positive, labels
    pooled; multiclass: mean top probability and accuracy)."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(len(probabilities), -1)
    y = np.asarray(labels)
    if head.kind == MULTICLASS:
        conf, hit = p.max(axis=1), (p.argmax(axis=1) == y.reshape(-1)).astype(np.float64)
    else:
        conf, hit = p.reshape(-1), y.astype(np.float64).reshape(-1)
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    return [{"confidence": float(conf[idx == b].mean()), "frequency": float(hit[idx == b].mean()), "n": int((idx == b).sum())}
            for b in range(bins) if (idx == b).any()]


def summary(head: Head, logits: np.ndarray, labels: np.ndarray) -> Dict[str, Any]:
    """ECE, Brier score, accuracy and the reliability points of ``head`` (its calibration
    applied, if any) on ``logits`` [N, num_logits] against ``labels``."""
    p = head.probabilities(logits)
    return {"ece": ece(head, p, labels), "brier": brier(head, p, labels), "accuracy": accuracy(head, p, labels),
            "reliability": reliability(head, p, labels), "n": int(len(p))}


def plot_reliability(path: Path, curves: Dict[str, List[Dict[str, float]]], title: str, multiclass: bool = False) -> Path:
    """Write a reliability diagram (PNG, matplotlib): one line per name in ``curves``
    (:func:`reliability` points) and the diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], ":", color="grey", label="perfectly calibrated")
    for name, pts in curves.items():
        ax.plot([q["confidence"] for q in pts], [q["frequency"] for q in pts], "o-", label=name)
    ax.set_xlabel("mean top-label probability" if multiclass else "mean predicted probability (positive)")
    ax.set_ylabel("accuracy" if multiclass else "fraction positive")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- data and models


def load_data(spec: str, head: Optional[Head] = None) -> LabeledData:
    """Labeled texts from a file (``labeled.read_labeled``) or ``split:NAME`` (``train``,
    ``validation``, ``test`` of the project's corpus, binary labels).

    Raises:
        CalibrationError: an unknown split; ``ParityError``/``OSError`` from the file;
            ``DataUnavailableError`` when the corpus cannot be fetched.
    """
    if spec.startswith(SPLIT_PREFIX):
        from orchestrator.tooling.modeling import data as D

        name = spec[len(SPLIT_PREFIX):]
        if name not in ("train", "validation", "test"):
            raise CalibrationError(f"{spec}: unknown split {name!r}; expected train, validation or test")
        ex = D.split(D.load_examples())[name]
        return LabeledData([e.text for e in ex], np.array([e.label for e in ex], dtype=np.int64),
                           f"the {name} split (seed 0) of the project's corpus (orchestrator.tooling.modeling.data)")
    if not Path(spec).is_file():
        raise CalibrationError(f"--data {spec}: no such file (or use split:validation / split:test)")
    return read_labeled(spec, head)


def model_logits(model_dir: Path, head: Head, texts: Sequence[str]) -> np.ndarray:
    """Logits float32 [N, num_logits] of the model in ``model_dir`` (its repository is the
    parent directory) on ``texts``, in this process (:class:`~.backends.InProcessBackend`)."""
    from orchestrator.tooling.modeling.parity.backends import InProcessBackend, score_all

    backend = InProcessBackend(model_dir.parent, [model_dir.name], tokenizer=head.tokenizer)
    try:
        logits, _, _ = score_all(backend, [model_dir.name], list(texts))
    finally:
        backend.close()
    return logits[model_dir.name]


# ----------------------------------------------------------------------------- writing


_ONE_LINE_HEAD = re.compile(r'^parameters \{ key: "head" value: \{ string_value: ".*" \} \}[^\n]*$', re.M)


def set_postprocess_head(config: Path, head: Head) -> None:
    """Give the postprocess model at ``config`` (a ``config.pbtxt``) ``head`` as its
    ``head`` parameter, keeping the file's comments: a one-line ``parameters`` entry is
    replaced in place, or inserted before ``instance_group``; a file that holds the
    parameter in another layout (written by ``orchestrator export``) is rewritten with its
    header comments."""
    from orchestrator.tooling.files import write_atomic
    from orchestrator.tooling.repository import get_parameter, header_lines, read_config, set_parameter, write_config

    value = json.dumps(json.loads(head.to_json()))
    line = f'parameters {{ key: "head" value: {{ string_value: {json.dumps(value)} }} }}'
    text = config.read_text(encoding="utf-8")
    if _ONE_LINE_HEAD.search(text):
        text = _ONE_LINE_HEAD.sub(lambda _: line, text, count=1)
    elif get_parameter(read_config(config), "head") is not None:
        cfg = read_config(config)
        set_parameter(cfg, "head", value)
        write_config(config, cfg, header_lines(config))
        return
    elif re.search(r"^instance_group", text, re.M):
        text = re.sub(r"^instance_group", lambda _: "# the classifier's head (head.json, calibration included)\n" + line
                      + "\ninstance_group", text, count=1, flags=re.M)
    else:
        text = text.rstrip("\n") + "\n" + line + "\n"
    write_atomic(config, text.encode("utf-8"), 0o644)
    read_config(config)  # still a valid config (ConfigError otherwise)


def postprocess_models(repo: Path, model: str) -> List[str]:
    """The models that turn ``model``'s logits into answers in the repository's ensembles:
    in each ensemble config, the step after ``model``'s whose ``input_map`` takes ``logits``."""
    from orchestrator.tooling.repository import read_config

    out: List[str] = []
    for cfg in sorted(repo.glob("*/config.pbtxt")):
        try:
            c = read_config(cfg)
        except Exception:  # a config this tool cannot parse is not an ensemble it edits
            continue
        if c.platform != "ensemble":
            continue
        steps = list(c.ensemble_scheduling.step)
        for a, b in zip(steps, steps[1:]):
            if a.model_name == model and "logits" in b.input_map and b.model_name not in out:
                out.append(b.model_name)
    return out


# ----------------------------------------------------------------------------- the command


def _markdown(r: Dict[str, Any]) -> str:
    b, a = r["before"], r["after"]
    return "\n".join([
        f"# Calibration of `{r['model']}`", "",
        f"Temperature scaling fitted on {r['fitted_on']} ({r['fit_n']} texts); measured on {r['evaluated_on']} "
        f"({b['n']} texts). Temperature: {r['temperature']}.", "",
        "| | ECE | Brier | accuracy (threshold 0.5) |", "|---|---:|---:|---:|",
        f"| before | {b['ece']:.4f} | {b['brier']:.4f} | {100 * b['accuracy']:.2f}% |",
        f"| after | {a['ece']:.4f} | {a['brier']:.4f} | {100 * a['accuracy']:.2f}% |", "",
        f"ECE: {BINS} equal-width bins ({'top-label probability' if r['kind'] == MULTICLASS else 'positive probability'}). "
        "Reliability diagram: `reliability.png`.", ""])


def calibrate(model_dir: Path, data: str, eval_data: Optional[str] = None, report: Optional[Path] = None,
              write: bool = False) -> Dict[str, Any]:
    """The command (module docstring); returns the report's JSON document."""
    model_dir = Path(model_dir).resolve()
    found = read_head(model_dir)
    if found is None:
        raise CalibrationError(f"{model_dir}: no head.json (export the model with `orchestrator export` first)")
    head = uncalibrated(found)
    fit_set = load_data(data, head)
    fit_logits = model_logits(model_dir, head, fit_set.texts)
    temperature = fit_temperature(head, fit_logits, fit_set.labels)
    eval_set = load_data(eval_data, head) if eval_data else fit_set
    eval_logits = model_logits(model_dir, head, eval_set.texts) if eval_data else fit_logits
    before = summary(head, eval_logits, eval_set.labels)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    calibrated = with_temperature(head, temperature, fitted_on=f"{data} ({len(fit_set.texts)} texts, sha256 "
                                  f"{fit_set.digest()[:12]}, {stamp})")
    after = summary(calibrated, eval_logits, eval_set.labels)
    calibrated = with_temperature(head, temperature, **{k: v for k, v in (calibrated.calibration or {}).items()
                                                        if k == "fitted_on"},
                                  evaluated_on=eval_data or data, ece_before=round(before["ece"], 5),
                                  ece_after=round(after["ece"], 5), brier_before=round(before["brier"], 5),
                                  brier_after=round(after["brier"], 5))
    out = Path(report) if report else PROJECT_ROOT / ".cache" / "calibrate" / model_dir.name
    out.mkdir(parents=True, exist_ok=True)
    result: Dict[str, Any] = {
        "model": model_dir.name, "kind": head.kind, "temperature": (calibrated.calibration or {})["temperature"],
        "fitted_on": data, "fit_n": len(fit_set.texts), "evaluated_on": eval_data or data,
        "before": before, "after": after, "written": [],
    }
    plot_reliability(out / "reliability.png", {f"before (ECE {before['ece']:.3f})": before["reliability"],
                                               f"after T={result['temperature']} (ECE {after['ece']:.3f})": after["reliability"]},
                     f"{model_dir.name}: reliability on {eval_data or data}", multiclass=head.kind == MULTICLASS)
    if write:
        from orchestrator.tooling.modeling.configs import write_head

        result["written"] += [str(p) for p in write_head(model_dir, calibrated)]
        for pp in postprocess_models(model_dir.parent, model_dir.name):
            cfg = model_dir.parent / pp / "config.pbtxt"
            set_postprocess_head(cfg, calibrated)
            result["written"].append(str(cfg))
    result["calibration"] = calibrated.calibration
    (out / "calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "calibration.md").write_text(_markdown(result))
    result["report"] = str(out)
    return result


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("model_dir", type=Path, help="the model's directory in the model repository (has head.json)")
    parser.add_argument("--data", required=True, help="labeled texts to fit on: a .jsonl/TSV file, or split:validation")
    parser.add_argument("--eval-data", default=None, help="labeled texts to report on (default: --data), e.g. split:test")
    parser.add_argument("--report", type=Path, default=None, help="report directory (default .cache/calibrate/MODEL)")
    parser.add_argument("--write", action="store_true",
                        help="store the calibration in MODEL_DIR/head.json and in the postprocess configs of the "
                             "repository's ensembles that use the model (default: report only)")
    return parser


def calibrate_command(args: argparse.Namespace) -> int:
    # what the fit and the plot need, before the classifier runs over the data: a missing
    # 'tune' extra is said at once (cli.missing_extra), not after minutes of inference
    import matplotlib  # noqa: F401
    import scipy.optimize  # noqa: F401

    try:
        r = calibrate(args.model_dir, args.data, args.eval_data, args.report, args.write)
    except (ToolingError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(_markdown(r))
    print(f"report: {r['report']}" + ("".join(f"\nwrote {p}" for p in r["written"]) if r["written"] else
                                      "\n(not written: add --write to store it in head.json)"))
    return 0



# ----------------------------------------------------------------------------- the parity report


def served_logits(repo: Path, models: Sequence[str], logits: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Each model's logits divided by its own ``head.json`` temperature(s) (as they are
    without calibration): what its head turns into the served probabilities with the plain
    sigmoid/softmax, so parity compares and sets thresholds on those."""
    out = {}
    for m in models:
        head = read_head(Path(repo) / m)
        t = head.temperature if head is not None else None
        out[m] = logits[m] if t is None else (np.asarray(logits[m], dtype=np.float64) / t).astype(np.float32)
    return out


def parity_calibration(repo: Path, models: Sequence[str], logits: Dict[str, np.ndarray], labels: np.ndarray,
                       out: Optional[Path]) -> Dict[str, Any]:
    """For each of ``models`` whose ``head.json`` has a calibration: ECE, Brier score and
    accuracy before (the logits as they are) and after (its temperature) on the parity
    texts, and ``calibration_<model>.png`` (reliability diagram) under ``out``; ``{}`` when
    no model is calibrated. A model whose labels do not fit its head is left out."""
    res: Dict[str, Any] = {}
    for m in models:
        head = read_head(Path(repo) / m)
        if head is None or head.calibration is None:
            continue
        try:
            before, after = summary(uncalibrated(head), logits[m], labels), summary(head, logits[m], labels)
        except (ValueError, IndexError):
            continue
        res[m] = {"temperature": head.calibration.get("temperature"), "fitted_on": head.calibration.get("fitted_on"),
                  "before": before, "after": after}
        if out is not None:
            plot_reliability(Path(out) / f"calibration_{m}.png",
                             {f"before (ECE {before['ece']:.3f})": before["reliability"],
                              f"after (ECE {after['ece']:.3f})": after["reliability"]},
                             f"{m}: reliability on the parity texts", multiclass=head.kind == MULTICLASS)
    return res


def calibration_markdown(res: Mapping[str, Any]) -> List[str]:
    """The parity report's "Calibration" section for :func:`parity_calibration`'s result."""
    if not res:
        return []
    L = ["## Calibration", "",
         f"Each model's `head.json` temperature (`orchestrator calibrate`), measured on these texts. ECE: {BINS} "
         "equal-width bins; Brier: mean squared error of the probabilities; reliability diagrams "
         "`calibration_<model>.png`.", "",
         "| model | temperature | fitted on | ECE before | ECE after | Brier before | Brier after |",
         "|---|---|---|---:|---:|---:|---:|"]
    for m, r in res.items():
        L.append(f"| `{m}` | {r['temperature']} | {r['fitted_on']} | {r['before']['ece']:.4f} | {r['after']['ece']:.4f} | "
                 f"{r['before']['brier']:.4f} | {r['after']['brier']:.4f} |")
    return L + [""]
