"""The classifier contract every ONNX model of the repository honours, and its one check.

Contract (docs/development/architecture.md; what ``make model`` and ``orchestrator export`` write, what
the ``tokenizer`` model feeds and the ``onnx_classifier`` model and the native ONNX Runtime
backend serve):

- inputs exactly ``input_ids`` and ``attention_mask``: ``tensor(int64)``, two dynamic
  (symbolic) dims ``[batch, sequence]``;
- one output ``logits``: ``tensor(float)`` (float32), dynamic batch dim and a fixed label
  dim ``[batch, num_labels]``.

:func:`check_onnx_contract` checks it for both ``train`` and ``export``; a model that breaks
it, or disagrees with its reference, raises :class:`ExportValidationError`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from orchestrator.tooling.errors import ToolingError

__all__ = [
    "INPUT_NAMES",
    "OUTPUT_NAME",
    "ExportError",
    "SourceError",
    "ExportValidationError",
    "num_cores",
    "ort_session",
    "check_onnx_contract",
    "encode",
]

INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "logits"


class ExportError(ToolingError):
    """An export could not be done (bad source, bad arguments, unexpected config files)."""


class SourceError(ExportError):
    """``SOURCE`` is neither a checkpoint directory nor a hub id that could be downloaded."""


class ExportValidationError(ExportError):
    """An exported model breaks the contract (names, dtypes, dynamic axes) or disagrees with
    its reference (torch, the fp32 model, itself under padding) beyond the tolerance; the
    message gives the numbers. Raised by ``export`` and by ``train`` alike."""


def num_cores() -> int:
    """CPU cores this process may run on (``sched_getaffinity``; ``os.cpu_count`` elsewhere), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def ort_session(path: Path | str, threads: Optional[int] = None):
    """An onnxruntime ``InferenceSession`` for ``path`` on ``CPUExecutionProvider``:
    ``threads`` intra-op threads (default :func:`num_cores`), one inter-op thread, warnings
    and below not logged."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or num_cores()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def check_onnx_contract(path: Path | str, num_labels: Optional[int] = None, session=None) -> int:
    """Check the ONNX file at ``path`` against the contract; return its ``num_labels``.

    ``num_labels``: the label dim ``logits`` must have (any fixed dim when None).
    ``session``: an open ``InferenceSession`` of ``path`` (one is opened when None).

    Raises:
        ExportValidationError: names, dtypes or dims differ from the contract (the message
            names the file and what it found).
    """
    sess = session if session is not None else ort_session(path)
    ins = {i.name: i for i in sess.get_inputs()}
    outs = {o.name: o for o in sess.get_outputs()}
    if set(ins) != set(INPUT_NAMES) or list(outs) != [OUTPUT_NAME]:
        raise ExportValidationError(f"{path}: inputs {sorted(ins)}, outputs {list(outs)}; "
                                    "expected input_ids, attention_mask -> logits")
    for name, i in ins.items():
        if i.type != "tensor(int64)" or len(i.shape) != 2 or not all(isinstance(d, str) for d in i.shape):
            raise ExportValidationError(f"{path}: input {name} is {i.type} {i.shape}; expected int64 "
                                        "[batch, sequence] with dynamic axes")
    lg = outs[OUTPUT_NAME]
    if lg.type != "tensor(float)" or len(lg.shape) != 2 or not isinstance(lg.shape[0], str) \
            or not isinstance(lg.shape[1], int):
        raise ExportValidationError(f"{path}: output logits is {lg.type} {lg.shape}; expected float32 "
                                    "[batch, num_labels]")
    if num_labels is not None and lg.shape[1] != num_labels:
        raise ExportValidationError(f"{path}: logits has {lg.shape[1]} labels, expected {num_labels}")
    return int(lg.shape[1])


def encode(tokenizer, texts: Sequence[str], max_length: int, pad_to: Optional[int] = None):
    """int64 ``(input_ids, attention_mask)`` [n, L] as the ``tokenizer`` model makes them:
    each text truncated to ``max_length`` tokens, then right-padded to the longest text of
    ``texts`` (or to ``pad_to`` tokens, when that is longer)."""
    enc = tokenizer(list(texts), truncation=True, max_length=max_length, padding=False)
    longest = max(len(ids) for ids in enc["input_ids"])
    padded = tokenizer.pad(enc, padding="max_length", max_length=max(longest, pad_to or 0), return_tensors="np")
    return padded["input_ids"].astype(np.int64), padded["attention_mask"].astype(np.int64)
