"""Ensembles on the real Triton 2.51 and the mock agree (output order, unproduced outputs,
produced dtypes, ``max_batch_size: 0`` reshapes), and routers made by ``orchestrator
migrate`` answer byte-identically to their ensembles: dtype, shape, bytes, the same outputs
present, in the same order."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.testing.mock.ensemble import response_order
from orchestrator.tooling.server import TritonServer
from tests.mock.test_mock_ensemble import MANY_ORDER, write_repository

pytestmark = pytest.mark.server

CLIENTS = {"http": httpclient, "grpc": grpcclient}


def infer(server, protocol, model, inputs, outputs=None, parameters=None):
    """One request; ``[(name, array)]`` in the response's order."""
    tc = CLIENTS[protocol]
    client = tc.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        tensors = []
        for name, value in inputs.items():
            dtype = "BYTES" if value.dtype == np.object_ else {"bool": "BOOL"}.get(value.dtype.name,
                                                                                   value.dtype.name.upper())
            dtype = {"FLOAT32": "FP32", "FLOAT64": "FP64", "FLOAT16": "FP16"}.get(dtype, dtype)
            tensors.append(tc.InferInput(name, list(value.shape), dtype))
            tensors[-1].set_data_from_numpy(value)
        requested = [tc.InferRequestedOutput(n) for n in outputs] if outputs else None
        result = client.infer(model, tensors, outputs=requested, parameters=parameters)
        response = result.get_response()
        names = [o["name"] for o in response["outputs"]] if protocol == "http" else [o.name for o in response.outputs]
        return [(n, result.as_numpy(n)) for n in names]
    finally:
        client.close()


@pytest.fixture(scope="module")
def ensembles(tmp_path_factory):
    repo = write_repository(tmp_path_factory.mktemp("ensembles"))
    with TritonServer(repo, models=["fan", "many_out", "strip"]) as server:
        yield server, repo


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_answers_in_the_order_of_the_rule(ensembles, protocol):
    server, _ = ensembles
    x = {"X": np.array([1.0], np.float32)}
    assert [n for n, _ in infer(server, protocol, "many_out", x)] == response_order(MANY_ORDER)
    some = [MANY_ORDER[3], MANY_ORDER[0], MANY_ORDER[7]]
    assert [n for n, _ in infer(server, protocol, "many_out", x, some)] == [n for n in response_order(MANY_ORDER)
                                                                          if n in some]
    assert [n for n, _ in infer(server, protocol, "fan", {"X": np.ones(3, np.float32)})] == ["MID", "ALPHA", "ZETA"]


def test_the_mock_answers_as_triton(ensembles):
    server, repo = ensembles
    x = np.array([1.0, 2.0, 3.0], np.float32)
    cases = [({}, None), ({"as_f64": True}, None), ({"skip_b": True}, ["ZETA", "ALPHA"]), ({}, ["ZETA", "MID"])]
    with MockTriton(repo, strict_outputs=False) as mock:
        mock.load("fan")
        for parameters, outputs in cases:
            real = infer(server, "http", "fan", {"X": x}, outputs, parameters)
            mocked = mock.infer("fan", {"X": x}, outputs=outputs, parameters=parameters)
            assert [n for n, _ in real] == list(mocked), parameters
            for name, value in real:
                assert (value.dtype, value.shape, value.tobytes()) == (
                    mocked[name].dtype, mocked[name].shape, mocked[name].tobytes()), (parameters, name)
        mock.load("strip")
        x16 = {"X": np.arange(16, dtype=np.float32)}
        real, mocked = infer(server, "grpc", "strip", x16), mock.infer("strip", x16)
        assert [(n, v.shape, v.tobytes()) for n, v in real] == [(n, v.shape, v.tobytes()) for n, v in mocked.items()]
        with pytest.raises(InferenceServerException, match="expected 1 inputs but got 0 inputs") as real_error:
            infer(server, "http", "fan", {"X": x}, None, {"skip_b": True})
        with pytest.raises(InferError, match="expected 1 inputs but got 0 inputs"):
            mock.infer("fan", {"X": x}, parameters={"skip_b": True})
        assert "plus_one" in str(real_error.value)


# -------------------------------------------------------------------------- migrated routers


def _same(a, b, where):
    """``a`` and ``b`` (``[(name, array)]``) byte-identical: the same outputs in the same
    order, each with the same dtype, shape and bytes."""
    assert [n for n, _ in a] == [n for n, _ in b], where
    for (name, x), (_, y) in zip(a, b):
        assert (x.dtype, x.shape) == (y.dtype, y.shape), (where, name)
        if x.dtype == np.object_:
            assert x.tolist() == y.tolist(), (where, name)
        else:
            assert x.tobytes() == y.tobytes(), (where, name)


def _text_requests(texts, batch, seed=5):
    rng = np.random.default_rng(seed)
    for start in range(0, len(texts), batch):
        chunk = texts[start:start + batch]
        yield {"TEXT": np.array([t.encode() for t in chunk], dtype=np.object_).reshape(-1, 1),
               "THRESHOLD": rng.random((len(chunk), 1)).astype(np.float32)}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The shipped repository with ``ensemble`` migrated to ``ensemble_bls`` (one call per
    step) and to ``ensemble_whole`` (``--call-ensemble``: the ensemble called in one step), served."""
    from orchestrator.tooling.cli import main
    from tests.helpers import REPO

    repo = tmp_path_factory.mktemp("shipped") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "triton_python_backend_stub*",
                                                              "env.pbtxt"))
    assert main(["migrate", str(repo / "ensemble"), "--name", "ensemble_bls", "--repo", str(repo)]) == 0
    assert main(["migrate", str(repo / "ensemble"), "--name", "ensemble_whole", "--repo", str(repo), "--call-ensemble"]) == 0
    with TritonServer(repo, models=["tokenizer", "classifier", "postprocess", "ensemble", "ensemble_bls",
                                    "ensemble_whole"]) as server:
        yield server, repo


@pytest.fixture(scope="module")
def held_out_texts():
    from orchestrator.tooling.modeling import data

    texts = data.held_out_texts()
    assert len(texts) == 1936
    return texts


@pytest.mark.parametrize("router", ["ensemble_bls", "ensemble_whole"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("batch", [1, 64])
def test_the_migrated_shipped_ensemble_is_byte_identical(shipped, held_out_texts, protocol, batch, router):
    server, _ = shipped
    for index, request in enumerate(_text_requests(held_out_texts, batch)):
        _same(infer(server, protocol, "ensemble", request), infer(server, protocol, router, request),
              (protocol, batch, index))
    some = next(_text_requests(held_out_texts, batch))
    for outputs in (["PROBABILITIES"], ["VERDICTS"], ["PROBABILITIES", "VERDICTS"]):
        _same(infer(server, protocol, "ensemble", some, outputs), infer(server, protocol, router, some, outputs),
              outputs)


def test_migrate_check_reports_identical_outputs(shipped, tmp_path, capsys):
    """``--check`` against the live server: the ensemble's order probed, the new router
    loaded through the repository API, every output bytes identical."""
    from orchestrator.tooling.cli import main

    server, repo = shipped
    code = main(["migrate", str(repo / "ensemble"), "--name", "ensemble_checked", "--repo", str(repo),
                 "--check", server.http_url.replace("http://", ""), "--requests", "6"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "VERDICTS: largest difference 0, bytes identical" in out
    assert "PROBABILITIES: largest difference 0, bytes identical" in out
    assert "every output byte-identical" in out


def test_the_migrated_shipped_ensemble_on_the_mock(shipped, held_out_texts):
    """The same comparison on the in-process mock (every 8th held-out text, batches of 1
    and 64), and the mock's answers equal the server's."""
    server, repo = shipped
    texts = held_out_texts[::8]
    with MockTriton(repo) as mock:
        mock.load("ensemble")
        mock.load("ensemble_bls")
        mock.load("ensemble_whole")
        for batch in (1, 64):
            for index, request in enumerate(_text_requests(texts, batch)):
                ens = list(mock.infer("ensemble", request).items())
                _same(ens, list(mock.infer("ensemble_bls", request).items()), ("mock", batch, index))
                _same(ens, list(mock.infer("ensemble_whole", request).items()), ("mock, whole", batch, index))
                if index % 16 == 0:
                    _same(ens, infer(server, "http", "ensemble", request), ("mock = server", batch, index))


QA = os.environ.get("ORCHESTRATOR_TRITON_SERVER_SRC")


@pytest.fixture(scope="module")
def qa_ensemble(tmp_path_factory):
    """Triton's QA ensemble of Python models (qa/L0_backend_python/ensemble: ``ensemble``
    over two ``add_sub`` models), laid out as its test.sh does, migrated to ``add_sub_bls``."""
    if not QA:
        pytest.skip("set ORCHESTRATOR_TRITON_SERVER_SRC to an extracted triton-inference-server/server tree (v2.51.0)")
    from orchestrator.tooling.cli import main

    src = Path(QA) / "qa" / "python_models"
    repo = tmp_path_factory.mktemp("qa") / "models"
    (repo / "ensemble" / "1").mkdir(parents=True)
    shutil.copy(src / "ensemble" / "config.pbtxt", repo / "ensemble")
    for name in ("add_sub_1", "add_sub_2"):
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(src / "add_sub" / "config.pbtxt", repo / name)
        shutil.copy(src / "add_sub" / "model.py", repo / name / "1")
    assert main(["migrate", str(repo / "ensemble"), "--name", "add_sub_bls", "--repo", str(repo),
                 "--model-config-name", ""]) == 0
    with TritonServer(repo, models=["add_sub_1", "add_sub_2", "ensemble", "add_sub_bls"], model_config_name=None) as srv:
        yield srv, repo


def _random_pairs(n, seed=9):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {"INPUT0": rng.standard_normal(16).astype(np.float32), "INPUT1": rng.standard_normal(16).astype(np.float32)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritons_qa_ensemble_migrated_is_byte_identical(qa_ensemble, protocol):
    server, _ = qa_ensemble
    for index, request in enumerate(_random_pairs(50)):
        ens = infer(server, protocol, "ensemble", request)
        _same(ens, infer(server, protocol, "add_sub_bls", request), (protocol, index))
        assert [n for n, _ in ens] == ["OUTPUT1", "OUTPUT0"]  # Triton's order, not the configuration's


def test_tritons_qa_ensemble_migrated_on_the_mock(qa_ensemble):
    server, repo = qa_ensemble
    with MockTriton(repo, model_config_name=None) as mock:
        mock.load("ensemble")
        mock.load("add_sub_bls")
        for index, request in enumerate(_random_pairs(20, seed=4)):
            ens = list(mock.infer("ensemble", request).items())
            _same(ens, list(mock.infer("add_sub_bls", request).items()), ("mock", index))
            _same(ens, infer(server, "http", "ensemble", request), ("mock = server", index))


# A pipeline of several data types: FP16, INT8, BOOL, BYTES; two outputs per step; a
# variable dimension; max_batch_size 0 around a batching step (add_batch_dim).
MIX = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("C", (a * np.float16(3)).astype(np.float16)),
                                                   pb_utils.Tensor("D", b > 0)]))
        return out
'''
LABEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            d = pb_utils.get_input_tensor_by_name(r, "D").as_numpy()
            s = pb_utils.get_input_tensor_by_name(r, "S").as_numpy()
            e = np.array([x if keep else b"no\\x00" for x, keep in zip(s.reshape(-1), d.reshape(-1))], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("E", e.reshape(s.shape)),
                                                   pb_utils.Tensor("F", d.astype(np.int8) - 1)]))
        return out
'''
BATCHED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "G", pb_utils.get_input_tensor_by_name(r, "C").as_numpy() + np.float16(1))]) for r in requests]
'''
MIXED = {
    "mix": ('name: "mix" backend: "python" max_batch_size: 0 input [{ name: "A" data_type: TYPE_FP16 dims: [-1] }, '
            '{ name: "B" data_type: TYPE_INT8 dims: [-1] }] output [{ name: "C" data_type: TYPE_FP16 dims: [-1] }, '
            '{ name: "D" data_type: TYPE_BOOL dims: [-1] }] instance_group [{ kind: KIND_CPU }]', MIX),
    "label": ('name: "label" backend: "python" max_batch_size: 0 input [{ name: "D" data_type: TYPE_BOOL dims: [-1] }, '
              '{ name: "S" data_type: TYPE_STRING dims: [-1] }] output [{ name: "E" data_type: TYPE_STRING dims: [-1] }, '
              '{ name: "F" data_type: TYPE_INT8 dims: [-1] }] instance_group [{ kind: KIND_CPU }]', LABEL),
    "batched": ('name: "batched" backend: "python" max_batch_size: 8 input [{ name: "C" data_type: TYPE_FP16 dims: [-1] }] '
                'output [{ name: "G" data_type: TYPE_FP16 dims: [-1] }] instance_group [{ kind: KIND_CPU }]', BATCHED),
    "mixed": ('name: "mixed" platform: "ensemble" max_batch_size: 0 '
              'input [{ name: "A" data_type: TYPE_FP16 dims: [-1] }, { name: "B" data_type: TYPE_INT8 dims: [-1] }, '
              '{ name: "S" data_type: TYPE_STRING dims: [-1] }] '
              'output [{ name: "C" data_type: TYPE_FP16 dims: [-1] }, { name: "E" data_type: TYPE_STRING dims: [-1] }, '
              '{ name: "F" data_type: TYPE_INT8 dims: [-1] }, { name: "G" data_type: TYPE_FP16 dims: [-1] }] '
              'ensemble_scheduling { step [ '
              '{ model_name: "mix" model_version: -1 input_map { key: "A" value: "A" } input_map { key: "B" value: "B" } '
              'output_map { key: "C" value: "C" } output_map { key: "D" value: "D" } }, '
              '{ model_name: "label" model_version: -1 input_map { key: "D" value: "D" } input_map { key: "S" value: "S" } '
              'output_map { key: "E" value: "E" } output_map { key: "F" value: "F" } }, '
              '{ model_name: "batched" model_version: -1 input_map { key: "C" value: "C" } '
              'output_map { key: "G" value: "G" } } ] }', None),
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    from orchestrator.tooling.cli import main

    repo = tmp_path_factory.mktemp("mixed")
    for name, (config, model) in MIXED.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        if model:
            (repo / name / "1" / "model.py").write_text(model)
    assert main(["migrate", str(repo / "mixed"), "--name", "mixed_bls", "--repo", str(repo),
                 "--model-config-name", ""]) == 0
    with TritonServer(repo, models=list(MIXED) + ["mixed_bls"]) as server:
        yield server, repo


def _mixed_requests(n, seed=2):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        k = int(rng.integers(1, 6))
        yield {"A": rng.standard_normal(k).astype(np.float16), "B": rng.integers(-5, 5, k).astype(np.int8),
               "S": np.array([bytes(rng.integers(0, 3, int(rng.integers(0, 4))).astype(np.uint8)) + b"x\x00"
                              for _ in range(k)], dtype=np.object_)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_pipeline_of_several_dtypes_migrated_is_byte_identical(mixed, protocol):
    server, repo = mixed
    for index, request in enumerate(_mixed_requests(30)):
        ens = infer(server, protocol, "mixed", request)
        assert {n: v.dtype for n, v in ens} == {"C": np.float16, "E": np.object_, "F": np.int8, "G": np.float16}
        assert dict(ens)["G"].shape == request["A"].shape  # the batch dimension added for 'batched' went again
        _same(ens, infer(server, protocol, "mixed_bls", request), (protocol, index))
    with MockTriton(repo, model_config_name=None) as mock:
        mock.load("mixed")
        mock.load("mixed_bls")
        for index, request in enumerate(_mixed_requests(10, seed=3)):
            ens = list(mock.infer("mixed", request).items())
            _same(ens, list(mock.infer("mixed_bls", request).items()), ("mock", index))
            _same(ens, infer(server, protocol, "mixed", request), ("mock = server", index))


def test_what_differs_is_what_the_guide_says(shipped):
    """docs/guides/migrate-an-ensemble.md, "What differs": a step's error is INVALID_ARG
    through the ensemble and INTERNAL through the router, with the step's message in both; a
    double parameter reaches the ensemble's steps and not the router's."""
    from tests.unit.test_migrate import GUIDE

    server, _ = shipped
    request = {"TEXT": np.array([[b"good film"]], dtype=np.object_), "THRESHOLD": np.array([[2.0]], np.float32)}
    guide = GUIDE.read_text()
    for model, status in (("ensemble", "400"), ("ensemble_bls", "500")):
        with pytest.raises(InferenceServerException) as info:
            infer(server, "http", model, request)
        assert info.value.status() == status
        assert f"| `{model}` | `{'INVALID_ARG' if status == '400' else 'INTERNAL'}` ({status}) | `{info.value.message()}` |" in guide
    request["THRESHOLD"] = np.array([[0.5]], np.float32)
    with pytest.raises(InferenceServerException, match="parameter truncation: expected true or false, got 0.5"):
        infer(server, "http", "ensemble", request, parameters={"truncation": 0.5})
    assert [n for n, _ in infer(server, "http", "ensemble_bls", request, parameters={"truncation": 0.5})] == [
        "VERDICTS", "PROBABILITIES"]


OUTER = ('name: "outer" platform: "ensemble" max_batch_size: 0 input [{ name: "X" data_type: TYPE_FP32 dims: [-1] }] '
         'output [{ name: "M" data_type: TYPE_FP32 dims: [-1] }, { name: "Z" data_type: TYPE_FP32 dims: [-1] }] '
         'ensemble_scheduling { step [ { model_name: "fan" model_version: -1 input_map { key: "X" value: "X" } '
         'output_map { key: "MID" value: "M" } output_map { key: "ZETA" value: "Z" } } ] }')


def test_a_nested_ensemble_is_called_as_a_model(tmp_path):
    """An ensemble whose step is another ensemble: the router's step calls the inner
    ensemble through BLS; the answers are byte-identical on the server and the mock."""
    from orchestrator.tooling.cli import main

    repo = write_repository(tmp_path / "repo")
    (repo / "outer" / "1").mkdir(parents=True)
    (repo / "outer" / "config.pbtxt").write_text(OUTER)
    assert main(["migrate", str(repo / "outer"), "--name", "outer_bls", "--repo", str(repo),
                 "--model-config-name", ""]) == 0
    requests = [{"X": np.arange(k, dtype=np.float32)} for k in (1, 3, 5)]
    with TritonServer(repo, models=["outer", "outer_bls"]) as server, MockTriton(repo, model_config_name=None) as mock:
        mock.load("outer")
        mock.load("outer_bls")
        for request in requests:
            for protocol in ("http", "grpc"):
                ens = infer(server, protocol, "outer", request)
                assert [n for n, _ in ens] == response_order(["M", "Z"])
                _same(ens, infer(server, protocol, "outer_bls", request), protocol)
            _same(list(mock.infer("outer", request).items()), list(mock.infer("outer_bls", request).items()), "mock")
            _same(ens, list(mock.infer("outer_bls", request).items()), "mock = server")


def test_migrate_check_embedded_starts_its_own_server(tmp_path, capsys):
    """``--check embedded``: the embedded Triton on REPO, started and stopped by migrate."""
    from orchestrator.tooling.cli import main

    repo = write_repository(tmp_path / "repo")
    code = main(["migrate", str(repo / "fan"), "--name", "fan_bls", "--repo", str(repo), "--model-config-name", "",
                 "--check", "embedded", "--protocol", "grpc", "--requests", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "every output byte-identical" in out
    assert [line.split(":")[0].strip() for line in out.splitlines() if "largest difference" in line] == ["MID", "ALPHA",
                                                                                                         "ZETA"]


def test_batch_dimensions_reshaped_per_tensor_both_ways_are_byte_identical(tmp_path):
    """max_batch_size 0 around batching and non-batching steps (tests/reshape_repo.py):
    Triton adds a batch dimension of 1 going into a batching model, strips it going into
    one without batching and from the ensemble's outputs where the dims lack it; the
    migrated router's ``model_dims`` does the same, byte-identical on the server and the mock."""
    from orchestrator.tooling.cli import main
    from tests import reshape_repo

    repo = reshape_repo.write(tmp_path / "repo")
    assert main(["migrate", str(repo / "bothways"), "--name", "bothways_bls", "--repo", str(repo),
                 "--model-config-name", ""]) == 0
    with TritonServer(repo, models=list(reshape_repo.MODELS) + ["bothways_bls"]) as server, \
            MockTriton(repo, model_config_name=None) as mock:
        mock.load("bothways")
        mock.load("bothways_bls")
        for index, request in enumerate(reshape_repo.requests(12)):
            for protocol in ("http", "grpc"):
                ens = infer(server, protocol, "bothways", request)
                assert [(n, v.shape) for n, v in sorted(ens)] == [("K", (1, 4)), ("V", (4,)), ("Y", (4,)), ("Z", (4,))]
                _same(ens, infer(server, protocol, "bothways_bls", request), (protocol, index))
            _same(ens, list(mock.infer("bothways", request).items()), ("mock = server", index))
            _same(ens, list(mock.infer("bothways_bls", request).items()), ("mock router", index))
