"""The training export to ONNX and its check against torch (the contract: modeling.contract)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from lab.train.classifier import pad, sorted_batches, torch_logits
from lab.train.specs import PAD_TO, TOL
from orchestrator.tooling.modeling.contract import OUTPUT_NAME, ExportValidationError, check_onnx_contract, ort_session
from orchestrator.tooling.modeling.torch_export import export_onnx  # noqa: F401 (the training export, here as before)


def ort_logits(sess, seqs: Sequence[Sequence[int]], batch_size: int = 64, pad_to: Optional[int] = None) -> np.ndarray:
    """float32 logits [n] from an ONNX session; batches padded to longest or to ``pad_to``."""
    out = np.zeros(len(seqs), dtype=np.float32)
    for b in sorted_batches([len(s) for s in seqs], batch_size):
        ids, mask = pad([seqs[i] for i in b], pad_to)
        lg = sess.run([OUTPUT_NAME], {"input_ids": ids, "attention_mask": mask})[0]
        if lg.dtype != np.float32 or lg.shape != (len(b), 1):
            raise ExportValidationError(f"ONNX logits {lg.dtype} {lg.shape}, expected float32 ({len(b)}, 1)")
        out[b] = lg[:, 0]
    return out


def validate_onnx(model, path: Path, seqs: Sequence[Sequence[int]]) -> dict:
    """Compare the ONNX model with torch and with itself under padding; return the diffs.

    Checks: the contract with one logit (:func:`orchestrator.tooling.modeling.contract.check_onnx_contract`),
    then each max abs logit difference < 1e-4: onnxruntime vs torch (batches padded to
    longest); onnxruntime padded to 512 vs padded to longest; batch of one vs batched.
    Raises :class:`ExportValidationError` on any failure.
    """
    sess = ort_session(path)
    check_onnx_contract(path, num_labels=1, session=sess)
    ref = torch_logits(model, seqs, batch_size=32)
    got = ort_logits(sess, seqs, batch_size=32)
    padded = ort_logits(sess, seqs, batch_size=32, pad_to=PAD_TO)
    single = np.array([ort_logits(sess, [s])[0] for s in seqs[:16]], dtype=np.float32)
    diffs = {
        "examples": len(seqs),
        "max_abs_diff_onnx_vs_torch": float(np.max(np.abs(got - ref))),
        "max_abs_diff_pad512_vs_longest": float(np.max(np.abs(padded - got))),
        "max_abs_diff_batch1_vs_batched": float(np.max(np.abs(single - got[:16]))),
    }
    bad = {k: v for k, v in diffs.items() if k != "examples" and not v < TOL}
    if bad:
        raise ExportValidationError(f"{path}: logit differences over {TOL}: {bad}")
    return diffs
