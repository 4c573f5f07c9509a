"""A torch classifier to one ONNX file: what ``orchestrator export`` (a torch source) and the
lab's training of the demo models both run (one code path; the contract: modeling.contract)."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np

from orchestrator.tooling.files import copy_atomic
from orchestrator.tooling.modeling.contract import ExportValidationError

#: The ONNX opset of the exported models (``export.validate.DEFAULT_OPSET`` is the same).
OPSET = 17


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
