"""The export's numeric checks: an exported ONNX model against its reference on sample texts."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from orchestrator.tooling.modeling.contract import OUTPUT_NAME, ExportValidationError, encode, ort_session

FP32_TOLERANCE = 1e-4  # same bound as orchestrator.tooling.modeling.train.TOL
FP16_TOLERANCE = 0.05  # see the package docstring
DEFAULT_OPSET = 17  # docs/development/architecture.md

#: Texts for the export check: short, negated, mixed case, emoji, non-ASCII, empty, and one
#: long text that is truncated to the maximum length.
SAMPLE_TEXTS: tuple[str, ...] = (
    "A gorgeous, witty, seductive movie.",
    "The plot is nothing but boilerplate cliches from start to finish.",
    "ok",
    "I LOVED every minute of it!!! :)",
    "Not bad at all, though not great either.",
    "An utterly forgettable, 2-hour slog :( #fail",
    "Das war leider nichts. Très décevant.",
    "The battery died after two days and support never answered.",
    "",
    "What a waste of talent, time and money.",
    "Surprisingly moving; the lead performance is wonderful.",
    " ".join(["The film drags on and on, and every scene repeats the one before it."] * 40),
)


def ort_logits(sess, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """float32 logits [n, num_labels] of an onnxruntime session; :class:`ExportValidationError`
    for another dtype."""
    out = sess.run([OUTPUT_NAME], {"input_ids": ids, "attention_mask": mask})[0]
    if out.dtype != np.float32:
        raise ExportValidationError(f"logits dtype {out.dtype}, expected float32")
    return out


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def staging(path: Path) -> Path:
    """Hidden sibling name for a file under validation (Triton only loads ``model.onnx``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.new")


def final_path(path: Path) -> Path:
    """The name a staged file (:func:`staging`) will have."""
    n = path.name
    return path.with_name(n[1:-4]) if n.startswith(".") and n.endswith(".new") else path


def check_variant(
    label: str,
    path: Path,
    reference: Callable[[np.ndarray, np.ndarray], np.ndarray],
    tokenizer,
    texts: Sequence[str],
    max_length: int,
    tolerance: float,
    reference_name: str,
) -> dict:
    """Compare ``path`` (onnxruntime) with ``reference`` on ``texts``; return the max abs diffs.

    Three layouts: the whole batch padded to the longest text, the batch padded to
    ``max_length`` (must equal the unpadded result: padding is masked), and the first four
    texts one at a time. Raises :class:`ExportValidationError` if any diff is not below
    ``tolerance`` (fp32) / not at most ``tolerance`` (fp16), or a logit is not finite.
    """
    sess = ort_session(path)
    ids, mask = encode(tokenizer, texts, max_length)
    ref = reference(ids, mask)
    got = ort_logits(sess, ids, mask)
    if got.shape != ref.shape:
        raise ExportValidationError(f"{label}: logits shape {got.shape} != reference {ref.shape}")
    if not np.all(np.isfinite(got)):
        raise ExportValidationError(f"{label}: non-finite logits {got.ravel()[:8]}")
    pids, pmask = encode(tokenizer, texts, max_length, pad_to=max_length)
    padded = ort_logits(sess, pids, pmask)
    single = np.concatenate([ort_logits(sess, *encode(tokenizer, [t], max_length)) for t in texts[:4]])
    diffs = {
        "texts": len(texts),
        "reference": reference_name,
        f"max_abs_diff_vs_{reference_name}": _max_diff(got, ref),
        "max_abs_diff_padded_to_max_length_vs_longest": _max_diff(padded, got),
        "max_abs_diff_one_by_one_vs_batched": _max_diff(single, got[: len(single)]),
        "tolerance": tolerance,
    }
    strict = label == "fp32"
    bad = {k: v for k, v in diffs.items() if k.startswith("max_abs")
           and not (v < tolerance if strict else v <= tolerance)}
    if bad:
        raise ExportValidationError(
            f"{label} export of {final_path(path)} disagrees beyond {tolerance:g} (max abs logit difference): "
            + ", ".join(f"{k} = {v:.3g}" for k, v in bad.items())
        )
    return diffs
