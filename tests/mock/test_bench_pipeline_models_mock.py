"""The pipeline benchmark's side-by-side models answer as the ensemble they are measured
against (the in-process mock; the same repository ``make bench-pipeline`` serves): a
benchmark of models that answered differently would compare different work."""

from __future__ import annotations

import numpy as np

from lab.bench import pipeline as P
from orchestrator.testing.mock import MockTriton

TEXTS = ["A gorgeous, witty film.", "The plot is dull and the acting worse than that.", "fine", ""]


def test_every_side_model_answers_byte_identically_to_the_ensemble(tmp_path):
    repo = P.make_pipeline_repository(tmp_path / "repo", 21)
    with MockTriton(repo, models=["tokenizer", "classifier", "postprocess", *P.SIDE_MODELS]) as server:
        for i, text in enumerate(TEXTS):
            inputs = {"TEXT": np.array([[text.encode()]], dtype=object), "THRESHOLD": np.array([[0.2 * (i + 1)]], np.float32)}
            want = server.infer(P.ENSEMBLE, inputs)
            for model in P.SIDE_MODELS[1:]:
                got = server.infer(model, inputs)
                assert sorted(got) == sorted(want), model
                for name, array in want.items():
                    assert (got[name].dtype, got[name].shape, got[name].tobytes()) == (array.dtype, array.shape, array.tobytes()), (
                        model, name, text)
