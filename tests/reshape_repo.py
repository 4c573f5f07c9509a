"""An ensemble with ``max_batch_size: 0`` whose steps mix batching and non-batching models
both ways, for Triton's per-tensor reshape (``ReshapeTensorDims``): a batch dimension of 1
added going into a batching model, stripped going into a model without batching, kept where
the tensor already fits, and the ensemble's outputs reshaped against their own dims."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator

import numpy as np

DOUBLE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * np.float32(2))]) for r in requests]
'''
INC = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Z", pb_utils.get_input_tensor_by_name(r, "Y").as_numpy() + np.float32(1))]) for r in requests]
'''
KEEP = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "K", pb_utils.get_input_tensor_by_name(r, "P").as_numpy() - np.float32(3))]) for r in requests]
'''


def _io(kind: str, name: str, dims: str) -> str:
    return f'{kind} [{{ name: "{name}" data_type: TYPE_FP32 dims: {dims} }}]'


def _step(model: str, inp: str, src: str, out: str, dst: str) -> str:
    return (f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "{inp}" value: "{src}" }} '
            f'output_map {{ key: "{out}" value: "{dst}" }} }}')


#: model -> (config.pbtxt, model.py or None for the ensemble)
MODELS: Dict[str, tuple] = {
    # batching, per-row [4]
    "double": ('name: "double" backend: "python" max_batch_size: 8 ' + _io("input", "X", "[4]") + " "
               + _io("output", "Y", "[4]") + ' instance_group [{ kind: KIND_CPU }]', DOUBLE),
    # no batching, [4]: a batching step's [1, 4] loses its batch dimension going in
    "inc": ('name: "inc" backend: "python" max_batch_size: 0 ' + _io("input", "Y", "[4]") + " "
            + _io("output", "Z", "[4]") + ' instance_group [{ kind: KIND_CPU }]', INC),
    # no batching, [1, 4]: a batching step's [1, 4] fits as it is and keeps it
    "keep": ('name: "keep" backend: "python" max_batch_size: 0 ' + _io("input", "P", "[1, 4]") + " "
             + _io("output", "K", "[1, 4]") + ' instance_group [{ kind: KIND_CPU }]', KEEP),
    "bothways": ('name: "bothways" platform: "ensemble" max_batch_size: 0 ' + _io("input", "A", "[4]") + " "
                 'output [{ name: "Y" data_type: TYPE_FP32 dims: [4] }, { name: "Z" data_type: TYPE_FP32 dims: [4] }, '
                 '{ name: "K" data_type: TYPE_FP32 dims: [1, 4] }, { name: "V" data_type: TYPE_FP32 dims: [4] }] '
                 'ensemble_scheduling { step [ '
                 + ", ".join([
                     _step("double", "X", "A", "Y", "Y"),   # [4] -> [1, 4] in; Y [1, 4] batch 1
                     _step("inc", "Y", "Y", "Z", "Z"),      # [1, 4] -> [4] in; Z [4] no batch
                     _step("double", "X", "Z", "Y", "W"),   # [4] -> [1, 4] in; W [1, 4] batch 1
                     _step("keep", "P", "W", "K", "K"),     # [1, 4] fits [1, 4]: as is; K [1, 4] no batch
                     _step("double", "X", "K", "Y", "V"),   # [1, 4] is not a row [4]: as is (a batch of 1)
                 ]) + ' ] }', None),
}


def write(repo: Path) -> Path:
    """The models in ``repo`` (created); the ensemble is ``bothways``."""
    for name, (config, model) in MODELS.items():
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(config)
        if model:
            (repo / name / "1" / "model.py").write_text(model)
    return repo


def requests(n: int, seed: int = 7) -> Iterator[Dict[str, np.ndarray]]:
    """``n`` random requests of ``bothways``."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {"A": rng.standard_normal(4).astype(np.float32)}
