"""The training export to ONNX and its check against torch (the contract: modeling.contract)."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from orchestrator.tooling.files import copy_atomic
from orchestrator.tooling.modeling.contract import OUTPUT_NAME, ExportValidationError, check_onnx_contract, ort_session
from orchestrator.tooling.modeling.train.classifier import pad, sorted_batches, torch_logits
from orchestrator.tooling.modeling.train.specs import OPSET, PAD_TO, TOL


def _logits_module(model):
    """Wrap ``model`` as a torch module ``(input_ids, attention_mask) -> logits [batch, 1]``."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).logits

    return LogitsOnly(model).eval()


def export_onnx(model, path: Path, opset: int = OPSET, example=None) -> None:
    """Export ``model`` to ``path`` (one self-contained file, dynamic batch/sequence).

    Inputs ``input_ids``, ``attention_mask``: int64 [batch, sequence]; output ``logits``:
    float32 [batch, num_labels]. ``example``: ``(input_ids, attention_mask)`` int64 arrays
    to trace with (default: two short rows). Written to a temporary file first, then moved
    into place.

    Raises:
        ExportValidationError: the exporter wrote external data files (models over 2 GB).
    """
    import onnx
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    if example is None:
        ids = torch.tensor([[2, 10, 11, 12, 3, 0], [2, 13, 14, 15, 16, 3]], dtype=torch.long)
        mask = (ids != 0).long()
    else:
        ids, mask = (torch.as_tensor(np.asarray(a, dtype=np.int64)) for a in example)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        tmp_path = Path(tmp) / "model.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _logits_module(model), (ids, mask), str(tmp_path),
                input_names=["input_ids", "attention_mask"], output_names=["logits"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "logits": {0: "batch"},
                },
                opset_version=opset, do_constant_folding=True, dynamo=False,
            )
        extra = [p.name for p in Path(tmp).iterdir() if p.name != "model.onnx"]
        if extra:  # > 2 GB models get external data; not supported by this layout
            raise ExportValidationError(f"export wrote external data files {extra}; expected one file")
        onnx.checker.check_model(onnx.load(str(tmp_path)))
        copy_atomic(tmp_path, path, 0o644)


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
