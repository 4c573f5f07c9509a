"""The router's warmup sample on the in-process mock, which runs no warmup itself: the
marked sample (THRESHOLD NaN, the router's ``warmup/`` data) is answered without any
downstream call and never with an error, only among an instance's first executes; a
client's NaN threshold afterwards is refused as always."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest

from orchestrator.testing.mock import InferError, MockTriton
from tests.helpers import REPO


def warmup_inputs(model_dir):
    """The sample exactly as Triton builds it from ``<model>/warmup/`` (batch 1)."""
    raw = (model_dir / "warmup" / "TEXT").read_bytes()
    (length,) = struct.unpack("<I", raw[:4])
    text = np.array([[raw[4:4 + length]]], dtype=np.object_)
    threshold = np.frombuffer((model_dir / "warmup" / "THRESHOLD").read_bytes(), "<f4").reshape(1, 1)
    return {"TEXT": text, "THRESHOLD": threshold}


@pytest.fixture
def mock(tmp_path):
    repo = tmp_path / "model_repository"
    for name in ("router", "tokenizer"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    with MockTriton(repo) as m:
        m.load("router")  # no classifier loaded: any downstream call would fail
        yield m


def test_the_marked_sample_is_answered_without_downstream_calls(mock):
    sample = warmup_inputs(REPO / "router")
    assert np.isnan(sample["THRESHOLD"]).all()
    out = mock.infer("router", sample)
    assert [r.decode() for r in out["ROUTE"].reshape(-1)] == ["warmup"]
    assert any("warmup sample answered up to the first downstream call" in rec[2] for rec in mock.logs)
    with pytest.raises(InferError, match="THRESHOLD"):  # later, a NaN threshold is a client's mistake
        mock.infer("router", sample)
