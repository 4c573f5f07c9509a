"""A model directory without config.pbtxt: with auto-complete (Triton's default) the
configuration starts as ``backend: "python"`` and the model's ``auto_complete_config`` fills
it in; without auto-complete, or without a ``<version>/model.py``, the load fails."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.testing.mock import LoadError

MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(8)
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [2]})
        config.add_output({"name": "Y", "data_type": "TYPE_INT32", "dims": [2]})
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)])
                for r in requests]
'''


def _write(mock, name="auto"):
    (mock.model_repository / name / "1").mkdir(parents=True)
    (mock.model_repository / name / "1" / "model.py").write_text(MODEL, encoding="utf-8")


def test_a_model_py_without_config_is_completed_by_the_model(triton_mock):
    _write(triton_mock)
    triton_mock.load("auto")
    config = triton_mock.model_config("auto")
    assert (config["name"], config["backend"], config["max_batch_size"]) == ("auto", "python", 8)
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    # normalized after auto-complete as core r24.10 does (tests/server/test_mock_agrees_upstream_examples.py)
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]
    assert config["default_model_filename"] == "model.py"
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    assert config["optimization"]["output_pinned_memory"] == {"enable": True}
    assert triton_mock.infer("auto", {"X": np.int32([[1, 2]])})["Y"].tolist() == [[2, 3]]


def test_without_auto_complete_or_model_py_the_load_fails(triton_mock_factory):
    mock = triton_mock_factory(auto_complete=False)
    _write(mock)
    with pytest.raises(LoadError, match="no model configuration at"):
        mock.load("auto")
    with_auto_complete = triton_mock_factory()
    (with_auto_complete.model_repository / "empty" / "1").mkdir(parents=True)
    with pytest.raises(LoadError, match="no model configuration at"):
        with_auto_complete.load("empty")
