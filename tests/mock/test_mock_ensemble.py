"""The mock's ensembles answer as Triton 2.51's: outputs in Triton's order, an output no step
produced left out, dtypes and shapes as the steps produced them, ``max_batch_size: 0``
reshapes. The same repository on the real server: tests/server/test_migrate_server.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.testing.mock.ensemble import response_order, std_hash

PAIR = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            params = request.parameters()
            a = (x * 2).astype(np.float64) if '"as_f64"' in params else x * 2
            out = [pb_utils.Tensor("A", a)]
            if '"skip_b"' not in params:
                out.append(pb_utils.Tensor("B", x + 1))
            responses.append(pb_utils.InferenceResponse(out))
        return responses
'''

PLUS_ONE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
'''

CONFIGS = {
    "pair": ('name: "pair" backend: "python" max_batch_size: 0 input [{ name: "X" data_type: TYPE_FP32 dims: [-1] }] '
             'output [{ name: "A" data_type: TYPE_FP32 dims: [-1] }, { name: "B" data_type: TYPE_FP32 dims: [-1] }] '
             'instance_group [{ kind: KIND_CPU }]', PAIR),
    "plus_one": ('name: "plus_one" backend: "python" max_batch_size: 4 input [{ name: "X" data_type: TYPE_FP32 '
                 'dims: [-1] }] output [{ name: "Y" data_type: TYPE_FP32 dims: [-1] }] instance_group [{ kind: KIND_CPU }]',
                 PLUS_ONE),
    # outputs in configuration order ZETA, ALPHA, MID: Triton answers MID, ALPHA, ZETA
    "fan": ('name: "fan" platform: "ensemble" max_batch_size: 0 input [{ name: "X" data_type: TYPE_FP32 dims: [-1] }] '
            'output [{ name: "ZETA" data_type: TYPE_FP32 dims: [-1] }, { name: "ALPHA" data_type: TYPE_FP32 dims: [-1] }, '
            '{ name: "MID" data_type: TYPE_FP32 dims: [-1] }] ensemble_scheduling { step [ '
            '{ model_name: "pair" model_version: -1 input_map { key: "X" value: "X" } '
            'output_map { key: "A" value: "ZETA" } output_map { key: "B" value: "ALPHA" } }, '
            '{ model_name: "plus_one" model_version: -1 input_map { key: "X" value: "ALPHA" } '
            'output_map { key: "Y" value: "MID" } } ] }', None),
}


MANY = [f"OUT_{w}" for w in ("zeta alpha mid params one two three four five six seven eight nine ten eleven twelve "
                               "thirteen fourteen fifteen sixteen").split()]
#: MANY shuffled: the configuration order of the outputs of ``many_out`` (20 outputs: the
#: hash table rehashes from 13 to 29 buckets on the way)
MANY_ORDER = [
    "OUT_five",
    "OUT_params",
    "OUT_three",
    "OUT_two",
    "OUT_twelve",
    "OUT_thirteen",
    "OUT_mid",
    "OUT_nine",
    "OUT_zeta",
    "OUT_alpha",
    "OUT_ten",
    "OUT_seven",
    "OUT_sixteen",
    "OUT_six",
    "OUT_eleven",
    "OUT_eight",
    "OUT_one",
    "OUT_fourteen",
    "OUT_fifteen",
    "OUT_four",
]

MANY_PY = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.names = [o["name"] for o in json.loads(args["model_config"])["output"]]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(n, pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + i)
                                            for i, n in enumerate(self.names)]) for r in requests]
'''


def _io(names):
    return ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [1] }}' for n in names)


CONFIGS["many"] = (f'name: "many" backend: "python" max_batch_size: 0 input [{{ name: "X" data_type: TYPE_FP32 '
                   f'dims: [1] }}] output [{_io(MANY)}] instance_group [{{ kind: KIND_CPU }}]', MANY_PY)
CONFIGS["many_out"] = (
    f'name: "many_out" platform: "ensemble" max_batch_size: 0 input [{{ name: "X" data_type: TYPE_FP32 dims: [1] }}] '
    f'output [{_io(MANY_ORDER)}] ensemble_scheduling {{ step [ {{ model_name: "many" model_version: -1 '
    'input_map { key: "X" value: "X" } '
    + " ".join(f'output_map {{ key: "{n}" value: "{n}" }}' for n in MANY) + " } ] }", None)


PLUS_ONE_IO = ('input [{ name: "X" data_type: TYPE_FP32 dims: [16] }] '
               'output [{ name: "Y" data_type: TYPE_FP32 dims: [16] }] ')
# a batching model's [1, 16] answer reaches a model without batching as [16] (Triton strips it)
CONFIGS["b4"] = ('name: "b4" backend: "python" max_batch_size: 4 ' + PLUS_ONE_IO + 'instance_group [{ kind: KIND_CPU }]',
                 PLUS_ONE)
CONFIGS["nb"] = ('name: "nb" backend: "python" max_batch_size: 0 ' + PLUS_ONE_IO + 'instance_group [{ kind: KIND_CPU }]',
                 PLUS_ONE)
CONFIGS["strip"] = ('name: "strip" platform: "ensemble" max_batch_size: 0 ' + PLUS_ONE_IO.replace('"Y"', '"OUT"')
                    + 'ensemble_scheduling { step [ { model_name: "b4" model_version: -1 input_map { key: "X" '
                    'value: "X" } output_map { key: "Y" value: "T" } }, { model_name: "nb" model_version: -1 '
                    'input_map { key: "X" value: "T" } output_map { key: "Y" value: "OUT" } } ] }', None)


def write_repository(dest: Path) -> Path:
    """The models of these tests in ``dest`` (also served by the real server in
    tests/server/test_migrate_server.py)."""
    for name, (config, model) in CONFIGS.items():
        (dest / name / "1").mkdir(parents=True)
        (dest / name / "config.pbtxt").write_text(config)
        if model:
            (dest / name / "1" / "model.py").write_text(model)
    return dest


@pytest.fixture
def repo(tmp_path) -> Path:
    return write_repository(tmp_path)


def test_the_order_rule_on_the_checked_cases():
    assert response_order(["PROBABILITIES", "VERDICTS"]) == ["VERDICTS", "PROBABILITIES"]
    assert response_order(["ZETA", "ALPHA", "MID", "PARAMS"]) == ["PARAMS", "MID", "ALPHA", "ZETA"]
    names = [f"O{i}" for i in range(30)]  # past 13 buckets: a rehash
    assert sorted(response_order(names)) == sorted(names) and response_order(names) != names[::-1]
    assert std_hash("") == 6142509188972423790  # libstdc++ std::hash<std::string>("") on x86-64


def test_outputs_come_in_triton_order_with_dtypes_and_shapes_as_produced(repo):
    with MockTriton(repo, strict_outputs=False) as mock:  # as Triton: output dtypes unchecked
        mock.load("fan")
        x = np.array([1.0, 2.0, 3.0], np.float32)
        out = mock.infer("fan", {"X": x})
        assert list(out) == ["MID", "ALPHA", "ZETA"]
        # plus_one batches (max_batch_size 4) inside an ensemble without: it saw [1, 3], the
        # client gets [3] back (the output's dims [-1] do not match [1, 3])
        assert out["MID"].shape == (3,)
        np.testing.assert_array_equal(out["MID"], x + 2)
        out = mock.infer("fan", {"X": x}, parameters={"as_f64": True})
        assert out["ZETA"].dtype == np.float64  # declared FP32: Triton passes what the step made
        assert list(mock.infer("fan", {"X": x}, outputs=["ZETA", "MID"])) == ["MID", "ZETA"]


def test_twenty_outputs_come_in_triton_order(repo):
    with MockTriton(repo) as mock:
        mock.load("many_out")
        out = mock.infer("many_out", {"X": np.array([1.0], np.float32)})
        assert list(out) == response_order(MANY_ORDER)
        assert list(out)[:4] == ["OUT_fifteen", "OUT_fourteen", "OUT_one", "OUT_six"]  # seen on Triton 2.51


def test_a_batch_dimension_is_stripped_into_a_model_without_batching(repo):
    with MockTriton(repo) as mock:
        mock.load("strip")
        out = mock.infer("strip", {"X": np.zeros(16, np.float32)})
        assert out["OUT"].shape == (16,) and out["OUT"][0] == 2.0


def test_an_output_no_step_produced_is_left_out(repo):
    with MockTriton(repo) as mock:
        mock.load("fan")
        x = np.array([1.0], np.float32)
        out = mock.infer("fan", {"X": x}, outputs=["ZETA", "ALPHA"], parameters={"skip_b": True})
        assert list(out) == ["ZETA"]
        # a later step that needs the missing tensor: the step model's own validation answers
        with pytest.raises(InferError, match="expected 1 inputs but got 0 inputs"):
            mock.infer("fan", {"X": x}, parameters={"skip_b": True})


#: fan's requested outputs -> (the steps that run, or the error), as Triton 2.51 answers them
#: (tests/server/test_pipeline_pruning.py checks the same table on the server): its pruning
#: counts an unrequested output against its step even where a later step reads it.
FAN_PRUNING = {
    ("ZETA", "ALPHA"): ["pair"],
    ("ZETA", "MID"): ["pair", "plus_one"],
    ("ALPHA", "MID"): ["pair", "plus_one"],
    ("ZETA",): "unexpected deadlock",
    ("ALPHA",): "unexpected deadlock",
    ("MID",): "unexpected deadlock",
}


@pytest.mark.parametrize("outputs,expected", list(FAN_PRUNING.items()))
def test_unrequested_steps_are_pruned_as_triton_prunes_them(repo, outputs, expected):
    with MockTriton(repo) as mock:
        mock.load("fan")
        mock.calls.clear()
        x = {"X": np.array([1.0], np.float32)}
        if isinstance(expected, str):
            with pytest.raises(InferError, match=f"in ensemble 'fan', .request id: <id_unknown>. {expected}") as err:
                mock.infer("fan", x, outputs=list(outputs))
            assert err.value.code == "INVALID_ARG" and mock.calls == []
        else:
            assert sorted(mock.infer("fan", x, outputs=list(outputs))) == sorted(outputs)
            assert [c.model for c in mock.calls] == expected
