"""Tests of orchestrator.testing.mock with the tiny repository in tests/fixtures/mock/repo."""

from __future__ import annotations

import gc
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from orchestrator.testing.mock import InferError, LoadError, MockTriton, install
from tests.helpers import FIXTURES

REPO = FIXTURES / "mock" / "repo"


def f32(*shape, value=1.0):
    return np.full(shape, value, dtype=np.float32)


def text(*items):
    return np.array([[t] for t in items], dtype=np.object_)


@pytest.fixture
def mock():
    with MockTriton(REPO) as server:
        yield server


@pytest.fixture
def pb():
    return install()


# -- install / module surface ----------------------------------------------------------


def test_install_is_idempotent_and_exposes_the_real_surface():
    module = install()
    assert install() is module
    assert sys.modules["triton_python_backend_utils"] is module
    for name in (
        "Tensor", "InferenceRequest", "InferenceResponse", "TritonError",
        "TritonModelException", "Logger", "MetricFamily", "load_model", "unload_model",
        "is_model_ready", "get_model_dir", "PreferredMemory", "TRITONSERVER_MEMORY_CPU",
    ):
        assert hasattr(module, name), name
    # pure-python helpers come from Triton's own file
    assert module.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert module.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert module.get_output_config_by_name({"output": [{"name": "Y"}]}, "Y") == {"name": "Y"}
    # names the real module does not have are not invented
    assert not hasattr(module, "LogLevel")


def test_tensor_behaves_like_the_stub(pb):
    array = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = pb.Tensor("X", array)
    assert tensor.name() == "X" and tensor.as_numpy() is array
    assert tensor.shape() == [2, 4] and tensor.is_cpu() and tensor.triton_dtype() == 11
    assert pb.Tensor("T", array.T).as_numpy().flags.c_contiguous
    assert pb.Tensor("S", np.array([b"a"], dtype=object)).triton_dtype() == 13
    with pytest.raises(pb.TritonModelException, match="NumPy dtype is not supported"):
        pb.Tensor("U", np.array(["unicode"]))
    with pytest.raises(pb.TritonModelException, match="empty string"):
        pb.Tensor("", array)
    roundtrip = pb.Tensor.from_dlpack("D", pb.Tensor("X", array))
    np.testing.assert_array_equal(roundtrip.as_numpy(), array)


def test_triton_error_and_response(pb):
    error = pb.TritonError("nope", pb.TritonError.INVALID_ARG)
    assert error.message() == "nope" and error.code() == pb.TritonError.INVALID_ARG
    assert pb.TritonError("x").code() == pb.TritonError.INTERNAL
    response = pb.InferenceResponse(error=error)
    assert response.has_error() and response.error() is error and response.output_tensors() == []
    with pytest.raises(TypeError):
        pb.InferenceResponse(output_tensors=[np.zeros(1)])


def test_request_parameters_must_be_a_dict_in_r24_10(mock, pb):
    tensor = pb.Tensor("INPUT0", f32(1, 4))
    request = pb.InferenceRequest(
        model_name="add_one", inputs=[tensor], requested_output_names=[],
        parameters={"a": 1, "b": "x", "c": True},
    )
    assert json.loads(request.parameters()) == {"a": 1, "b": "x", "c": True}
    with pytest.raises(pb.TritonModelException, match="Expect"):
        pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters='{"a": 1}')
    with pytest.raises(pb.TritonModelException, match="bool/int/str"):
        pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters={"a": 1.5})
    with pytest.raises(TypeError, match="missing"):
        pb.InferenceRequest(inputs=[], requested_output_names=[])


def test_async_exec_needs_a_running_loop(mock, pb):
    request = pb.InferenceRequest(model_name="add_one", inputs=[], requested_output_names=[])
    with pytest.raises(RuntimeError):
        request.async_exec()


def test_package_exports_are_the_installed_stand_ins():
    import orchestrator.testing.mock as package

    module = install()
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    for name in ("Tensor", "InferenceRequest", "InferenceResponse", "TritonError",
                 "TritonModelException", "Logger", "MetricFamily"):
        assert getattr(module, name) is getattr(package, name), name
    call = package.Call("add_one", (2, 1))
    assert call == ("add_one", (2, 1)) and call.requests == 2


# -- loading ----------------------------------------------------------------------------


def _repo_copy(tmp_path, *models):
    repo = tmp_path / "repo"
    for name in models:
        shutil.copytree(REPO / name, repo / name)
    return repo


def test_invalid_config_is_a_load_error_naming_file_and_line(tmp_path):
    repo = _repo_copy(tmp_path, "add_one")
    config = repo / "add_one" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_sise: 8"))
    with MockTriton(repo) as server:
        with pytest.raises(LoadError) as info:
            server.load("add_one")
        message = str(info.value)
        assert message.startswith("failed to load 'add_one': cannot parse ")
        assert f"{config}:3:" in message and "max_batch_sise" in message  # file:line from the parser
        assert {m["name"]: m["state"] for m in server.repository_index()} == {"add_one": "UNAVAILABLE"}


def test_config_name_must_match_the_directory(tmp_path):
    repo = _repo_copy(tmp_path, "add_one")
    config = repo / "add_one" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_one"', 'name: "other"'))
    with MockTriton(repo) as server:
        with pytest.raises(LoadError, match="unexpected directory name 'add_one' for model 'other'"):
            server.load("add_one")


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ('input [ { name: "INPUT0" data_type: TYPE_FP32', 'input [ { name: "INPUT0" data_type: TYPE_INT32',
         "ensemble tensor 'INPUT0' is TYPE_INT32 but 'add_one' input 'INPUT0' is TYPE_FP32"),
        ('input_map { key: "INPUT0" value: "INPUT0" }', 'input_map { key: "X" value: "INPUT0" }',
         "in ensemble step for 'add_one', 'X' is not an input of that model"),
        ('output_map { key: "OUTPUT0" value: "added" }', 'output_map { key: "Y" value: "added" }',
         "in ensemble step for 'add_one', 'Y' is not an output of that model"),
    ],
    ids=["dtype", "unknown input", "unknown output"],
)
def test_ensemble_steps_are_checked_at_load(tmp_path, old, new, expected):
    repo = _repo_copy(tmp_path, "add_one", "double", "pipeline")
    config = repo / "pipeline" / "config.pbtxt"
    assert old in config.read_text()
    config.write_text(config.read_text().replace(old, new))
    with MockTriton(repo) as server:
        with pytest.raises(LoadError) as info:
            server.load("pipeline")
        assert expected in str(info.value)
        assert not server.is_model_ready("pipeline")


def test_load_with_config_override_reloads(mock):
    mock.load("add_one")
    first = mock.instance("add_one")
    override = mock.model_config("add_one")
    override["max_batch_size"] = 2
    mock.load("add_one", config=json.dumps(override))
    assert mock.instance("add_one") is not first  # reloaded: finalize, then a new instance
    assert ("add_one", "INFO", "add_one finalized") in mock.logs
    assert mock.model_config("add_one")["max_batch_size"] == 2
    with pytest.raises(InferError, match="batch-size must be <= 2"):
        mock.infer("add_one", {"INPUT0": f32(3, 4)})
    with pytest.raises(LoadError, match="invalid config override"):
        mock.load("add_one", config="{not json")


def test_initialize_gets_triton_args(mock):
    mock.load("add_one")
    args = mock.instance("add_one").args
    assert args["model_name"] == "add_one"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_name"] == "add_one_0_0"
    assert args["model_instance_device_id"] == "0"
    assert Path(args["model_repository"]) == REPO.resolve() / "add_one"
    config = json.loads(args["model_config"])
    assert config["name"] == "add_one" and config["backend"] == "python"
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [4]  # int64 dims as ints, like Triton
    assert config["input"][0]["optional"] is False  # default fields are printed
    assert mock.model_config("add_one") == config


def test_default_instance_name_and_max_batch_size(mock):
    mock.load("raiser")  # no instance_group in its config
    assert mock.model_config("raiser")["instance_group"][0]["name"] == "raiser"
    mock.load("no_batch")
    assert mock.model_config("no_batch")["max_batch_size"] == 0


def test_model_config_name_selects_configs_dir(mock):
    mock.load("double")  # configs/embedded.pbtxt: python
    np.testing.assert_array_equal(mock.infer("double", {"INPUT0": f32(1, 4)})["OUTPUT0"], f32(1, 4, value=2))
    with MockTriton(REPO, model_config_name=None) as plain:
        with pytest.raises(LoadError, match="only runs Python-backend.*onnxruntime_onnx"):
            plain.load("double")


def test_non_python_model_is_a_clear_load_error(mock):
    with pytest.raises(LoadError) as info:
        mock.load("onnx_only")
    assert "onnx_only" in str(info.value) and "onnxruntime_onnx" in str(info.value)
    assert "ensemble" in str(info.value)


def test_initialize_failure(mock):
    with pytest.raises(LoadError) as info:
        mock.load("bad_init")
    assert "bad_init" in str(info.value) and "cannot find weights.bin" in str(info.value)
    assert not mock.is_model_ready("bad_init")
    index = {m["name"]: m for m in mock.repository_index()}
    assert index["bad_init"]["state"] == "UNAVAILABLE"
    assert index["upper"]["state"] == ""
    with pytest.raises(InferError, match="'bad_init' has no available versions"):
        mock.infer("bad_init", {"INPUT0": f32(4)})
    with pytest.raises(LoadError, match="failed to poll"):
        mock.load("does_not_exist")


def test_unload_calls_finalize_and_close_unloads_everything():
    server = MockTriton(REPO, models=["add_one", "upper"])
    assert server.is_model_ready("add_one") and server.is_model_ready("upper", "1")
    assert not server.is_model_ready("add_one", "2")
    server.unload("add_one")
    assert ("add_one", "INFO", "add_one finalized") in server.logs
    with pytest.raises(InferError, match="Request for unknown model: 'add_one' has no available versions"):
        server.infer("add_one", {"INPUT0": f32(1, 4)})
    server.close()
    assert not server.is_model_ready("upper")
    with pytest.raises(RuntimeError, match="closed"):
        server.infer("upper", {"TEXT": text(b"a")})


def test_model_module_is_imported_fresh_per_load(mock):
    mock.load("add_one")
    first = type(mock.instance("add_one"))
    mock.unload("add_one")
    mock.load("add_one")
    assert type(mock.instance("add_one")) is not first
    assert not list(REPO.rglob("__pycache__"))  # the stub sets dont_write_bytecode too


# -- inference and validation ----------------------------------------------------------


def test_add_one_outputs(mock):
    mock.load("add_one")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = mock.infer("add_one", {"INPUT0": x})
    assert set(out) == {"OUTPUT0"}
    np.testing.assert_array_equal(out["OUTPUT0"], x + 1)
    assert out["OUTPUT0"].dtype == np.float32
    assert mock.calls == [("add_one", (2,))]
    out = mock.infer("add_one", {"INPUT0": x}, parameters={"add": 5})
    np.testing.assert_array_equal(out["OUTPUT0"], x + 5)


def test_strings_are_bytes_on_both_sides(mock):
    mock.load("upper")
    out = mock.infer("upper", {"TEXT": text("héllo", b"abc")})  # str elements become UTF-8 bytes
    assert out["UPPER"].dtype == object
    assert out["UPPER"].tolist() == [["HÉLLO".encode()], [b"ABC"]]  # str outputs come back as bytes
    assert out["LENGTH"].tolist() == [[6], [3]]
    out = mock.infer("upper", {"TEXT": text(b"x")}, outputs=["LENGTH"])
    assert set(out) == {"LENGTH"}
    with pytest.raises(ValueError, match="dtype=object"):
        mock.infer("upper", {"TEXT": np.array([["unicode"]])})  # tritonclient refuses <U too


@pytest.mark.parametrize(
    "inputs, expected",
    [
        ({"INPUT0": np.ones((1, 4), np.float64)},
         "inference input 'INPUT0' data-type is 'FP64', but model 'add_one' expects 'FP32'"),
        ({}, "expected 1 inputs but got 0 inputs for model 'add_one'. Got input(s) [], but missing "
             "required input(s) ['INPUT0']"),
        ({"WRONG": f32(1, 4)}, "unexpected inference input 'WRONG' for model 'add_one'"),
        ({"INPUT0": f32(1, 3)}, "unexpected shape for input 'INPUT0' for model 'add_one'. Expected "
                                "[-1,4], got [1,3]"),
        ({"INPUT0": f32(4)}, "unexpected shape for input 'INPUT0' for model 'add_one'. Expected "
                             "[-1,4], got [4]"),
        ({"INPUT0": f32(9, 4)}, "inference request batch-size must be <= 8 for 'add_one'"),
        ({"INPUT0": f32(1, 4), "EXTRA": f32(1, 4)}, "expected 1 inputs but got 2 inputs"),
    ],
)
def test_validation_errors_like_triton(mock, inputs, expected):
    mock.load("add_one")
    with pytest.raises(InferError) as info:
        mock.infer("add_one", inputs)
    assert expected in info.value.message
    assert info.value.code == "INVALID_ARG"
    assert mock.calls == []  # execute never saw the request


def test_validation_batch_dim_must_agree_and_request_id_is_logged(mock):
    mock.load("async_bls")
    with pytest.raises(InferError) as info:
        mock.infer("async_bls", {"INPUT0": f32(2, 4), "TEXT": text(b"a")}, request_id="r-7")
    assert info.value.message.startswith("[request id: r-7] ")
    assert "batch size does not match other inputs for 'async_bls'" in info.value.message


def test_unknown_output_and_unknown_model(mock):
    mock.load("add_one")
    with pytest.raises(InferError, match="unexpected inference output 'NOPE' for model 'add_one'"):
        mock.infer("add_one", {"INPUT0": f32(1, 4)}, outputs=["NOPE"])
    with pytest.raises(InferError, match="Request for unknown model: 'upper' is not found"):
        mock.infer("upper", {"TEXT": text(b"a")})


def test_model_without_batching(mock):
    mock.load("no_batch")
    out = mock.infer("no_batch", {"X": np.array([-1, 0, 3], dtype=np.int64)})
    assert out["Y"].dtype == np.bool_ and out["Y"].tolist() == [False, False, True]
    with pytest.raises(InferError, match="Expected \\[-1\\], got \\[1,3\\]"):
        mock.infer("no_batch", {"X": np.ones((1, 3), dtype=np.int64)})


def test_optional_inputs(mock):
    mock.load("opt_input")
    a = np.ones((1, 3), dtype=np.int32)
    assert mock.infer("opt_input", {"A": a})["N"].tolist() == [[1]]
    assert mock.infer("opt_input", {"A": a, "B": np.ones((1, 1), np.int32)})["N"].tolist() == [[2]]
    with pytest.raises(InferError, match="expected number of inputs between 1 and 2 but got 0"):
        mock.infer("opt_input", {})


# -- execute contract ----------------------------------------------------------------------


def test_exception_text_is_propagated_to_every_request(mock):
    mock.load("raiser")
    results = mock.infer_batch("raiser", [{"INPUT0": f32(1, 4)}] * 3)
    assert len(results) == 3 and mock.calls == [("raiser", (1, 1, 1))]
    for result in results:
        assert isinstance(result, InferError)
        assert result.message.startswith("Failed to process the request(s) for model 'raiser_0', message: ")
        assert "ValueError: boom: the model blew up" in result.message
        assert "model.py" in result.message  # the traceback's "At:" part


def test_one_response_per_request(mock):
    mock.load("raiser")
    items = [{"inputs": {"INPUT0": f32(1, 4)}, "parameters": {"mode": "short"}}] * 3
    results = mock.infer_batch("raiser", items)
    assert all(isinstance(r, InferError) for r in results)
    assert ("InferenceRequest(s) size is:3, and InferenceResponse(s) size is:2"
            in results[0].message)
    with pytest.raises(InferError, match="Expected a list in the execute return, found type '<class 'tuple'>'"):
        mock.infer("raiser", {"INPUT0": f32(1, 4)}, parameters={"mode": "tuple"})
    mock.response_timeout = 0.1  # no response will come: do not wait the default 5 s
    with pytest.raises(InferError, match="returned no response for request 0"):
        mock.infer("raiser", {"INPUT0": f32(1, 4)}, parameters={"mode": "none"})


def test_error_responses_and_response_sender(mock):
    mock.load("raiser")
    with pytest.raises(InferError) as info:
        mock.infer("raiser", {"INPUT0": f32(1, 4)}, parameters={"mode": "error_response"})
    assert info.value.message == "bad value" and info.value.code == "INVALID_ARG"
    out = mock.infer("raiser", {"INPUT0": f32(2, 4)}, parameters={"mode": "sender"})
    np.testing.assert_array_equal(out["OUTPUT0"], f32(2, 4))
    with pytest.raises(InferError, match="TritonModelException: NumPy dtype is not supported"):
        mock.infer("raiser", {"INPUT0": f32(1, 4)}, parameters={"mode": "unicode"})


@pytest.mark.parametrize(
    "mode, strict_message",
    [
        ("fp64", "returned output 'OUTPUT0' with datatype FP64, but its configuration declares TYPE_FP32"),
        ("flat", "returned output 'OUTPUT0' with shape [4], but its configuration says [-1,4]"),
        ("extra", "returned output 'OUTPUT1', which is not in its configuration"),
    ],
)
def test_output_checks_strict_and_triton_like(mode, strict_message):
    inputs = {"INPUT0": f32(1, 4)}
    with MockTriton(REPO, models=["raiser"]) as strict:
        with pytest.raises(InferError) as info:
            strict.infer("raiser", inputs, parameters={"mode": mode})
        assert strict_message in info.value.message and "strict_outputs" in info.value.message
    with MockTriton(REPO, models=["raiser"], strict_outputs=False) as lax:
        out = lax.infer("raiser", inputs, parameters={"mode": mode})
        assert set(out) == {"OUTPUT0"}  # unrequested OUTPUT1 is pruned, as the stub does
        if mode == "fp64":
            assert out["OUTPUT0"].dtype == np.float64  # Triton passes the dtype through


# -- dynamic batching ----------------------------------------------------------------------


def test_infer_batch_sends_requests_to_one_execute(mock):
    mock.load("add_one")
    requests = [
        {"INPUT0": f32(2, 4)},
        {"inputs": {"INPUT0": f32(1, 4)}, "parameters": {"add": 3}, "request_id": "b"},
        {"INPUT0": np.ones((1, 4), np.float64)},  # invalid: never reaches execute
        {"INPUT0": f32(1, 4, value=5)},
    ]
    results = mock.infer_batch("add_one", requests)
    assert mock.calls == [("add_one", (2, 1, 1))]
    np.testing.assert_array_equal(results[0]["OUTPUT0"], f32(2, 4, value=2))
    np.testing.assert_array_equal(results[1]["OUTPUT0"], f32(1, 4, value=4))
    assert isinstance(results[2], InferError) and "FP64" in results[2].message
    np.testing.assert_array_equal(results[3]["OUTPUT0"], f32(1, 4, value=6))
    assert mock.metric("add_one_requests_total", {"model": "add_one"}) == 3.0


def test_infer_batch_splits_where_the_batcher_would(mock):
    mock.load("add_one")
    mock.infer_batch("add_one", [{"INPUT0": f32(5, 4)}, {"INPUT0": f32(4, 4)}, {"INPUT0": f32(3, 4)}])
    assert mock.calls_to("add_one") == [(5,), (4, 3)]  # max_batch_size 8
    mock.load("opt_input")  # variable-size A without allow_ragged_batch: equal shapes only
    a2, a3 = np.ones((1, 2), np.int32), np.ones((1, 3), np.int32)
    mock.infer_batch("opt_input", [{"A": a2}, {"A": a2}, {"A": a3}])
    assert mock.calls_to("opt_input") == [(1, 1), (1,)]
    mock.load("bls_sync")  # no dynamic_batching: one request per execute
    mock.load("add_one")
    mock.reset_calls()
    mock.infer_batch("bls_sync", [{"INPUT0": f32(1, 4)}, {"INPUT0": f32(1, 4)}])
    assert mock.calls_to("bls_sync") == [(1,), (1,)]


# -- BLS ---------------------------------------------------------------------------------------


def test_async_bls_with_gather_runs_concurrently(mock):
    for name in ("add_one", "upper", "async_bls"):
        mock.load(name)
    mock.set_delay("add_one", 0.4)
    mock.set_delay("upper", 0.4)
    start = time.perf_counter()
    out = mock.infer("async_bls", {"INPUT0": f32(1, 4), "TEXT": text(b"hi")})
    elapsed = time.perf_counter() - start
    np.testing.assert_array_equal(out["SUM"], f32(1, 4, value=2))
    assert out["UPPER"].tolist() == [[b"HI"]]
    assert 0.4 <= elapsed < 0.75, elapsed  # both BLS calls were in flight together
    assert sorted(c for c in mock.calls if c.model != "async_bls") == [("add_one", (1,)), ("upper", (1,))]


def test_async_bls_batch_of_requests(mock):
    for name in ("add_one", "upper", "async_bls"):
        mock.load(name)
    results = mock.infer_batch(
        "async_bls",
        [{"INPUT0": f32(1, 4, value=i), "TEXT": text(f"t{i}")} for i in range(3)],
    )
    assert mock.calls_to("async_bls") == [(1, 1, 1)]
    assert len(mock.calls_to("add_one")) == 3 and len(mock.calls_to("upper")) == 3
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["SUM"], f32(1, 4, value=i + 1))
        assert result["UPPER"].tolist() == [[f"T{i}".encode()]]


def test_bls_to_a_model_that_is_not_loaded(mock):
    mock.load("bls_sync")
    with pytest.raises(InferError) as info:
        mock.infer("bls_sync", {"INPUT0": f32(1, 4)})
    assert info.value.message == (
        "Model add_one - Error when running inference: Failed for execute the inference "
        "request. Model 'add_one' is not ready."
    )
    mock.load("async_bls")
    mock.load("upper")
    with pytest.raises(InferError, match="Model 'add_one' is not ready"):
        mock.infer("async_bls", {"INPUT0": f32(1, 4), "TEXT": text(b"a")})


def test_load_model_from_inside_a_model(mock):
    mock.load("bls_sync")
    assert not mock.is_model_ready("add_one")
    out = mock.infer("bls_sync", {"INPUT0": f32(1, 4)}, parameters={"load": True})
    np.testing.assert_array_equal(out["OUTPUT0"], f32(1, 4, value=2))
    assert mock.is_model_ready("add_one")
    assert [c.model for c in mock.calls] == ["bls_sync", "add_one"]


def test_bls_parameters_and_validation_errors(mock):
    mock.load("bls_sync")
    mock.load("add_one")
    out = mock.infer("bls_sync", {"INPUT0": f32(1, 4)}, parameters={"add10": True})
    np.testing.assert_array_equal(out["OUTPUT0"], f32(1, 4, value=11))
    mock.load("upper")
    with pytest.raises(InferError) as info:
        mock.infer("bls_sync", {"INPUT0": f32(1, 4)}, parameters={"target": "upper"})
    assert info.value.message.startswith("Model upper - Error when running inference: ")
    assert "unexpected inference output 'OUTPUT0' for model 'upper'" in info.value.message


def test_bls_is_refused_in_initialize(mock):
    mock.load("bls_sync")
    assert mock.instance("bls_sync").init_bls_error == "BLS is only supported during the 'execute' function."


def test_bls_gets_execute_errors_of_the_target(mock):
    mock.load("bls_sync")
    mock.load("raiser")
    with pytest.raises(InferError) as info:
        mock.infer("bls_sync", {"INPUT0": f32(1, 4)}, parameters={"target": "raiser"})
    assert "Failed to process the request(s) for model 'raiser_0'" in info.value.message
    assert "boom" in info.value.message


# -- failure injection -----------------------------------------------------------------------


def test_fail_next_makes_bls_calls_fail(mock):
    for name in ("add_one", "upper", "async_bls"):
        mock.load(name)
    mock.fail_next("add_one", "add_one is flaky", count=1)
    inputs = {"INPUT0": f32(1, 4), "TEXT": text(b"a")}
    with pytest.raises(InferError, match="add_one is flaky"):
        mock.infer("async_bls", inputs)
    assert mock.calls_to("add_one") == []  # the failed request never reached execute
    assert mock.infer("async_bls", inputs)["SUM"].tolist() == [[2.0] * 4]
    assert mock.calls_to("add_one") == [(1,)]


def test_set_failure_with_message_or_predicate(mock):
    mock.load("add_one")
    mock.set_failure("add_one", "down for maintenance", code="UNAVAILABLE")
    with pytest.raises(InferError) as info:
        mock.infer("add_one", {"INPUT0": f32(1, 4)})
    assert info.value.message == "down for maintenance" and info.value.code == "UNAVAILABLE"
    mock.set_failure("add_one", lambda inputs, params: params.get("add") == 7 and "no sevens")
    assert mock.infer("add_one", {"INPUT0": f32(1, 4)})["OUTPUT0"].tolist() == [[2.0] * 4]
    results = mock.infer_batch(
        "add_one",
        [{"inputs": {"INPUT0": f32(1, 4)}, "parameters": {"add": 7}}, {"INPUT0": f32(1, 4)}],
    )
    assert isinstance(results[0], InferError) and results[0].message == "no sevens"
    assert isinstance(results[1], dict)
    mock.set_failure("add_one", None)
    mock.infer("add_one", {"INPUT0": f32(1, 4)}, parameters={"add": 7})


# -- ensembles --------------------------------------------------------------------------------


def test_ensemble_runs_steps_in_dependency_order(mock):
    mock.load("pipeline")  # loads its composing models
    assert mock.is_model_ready("add_one") and mock.is_model_ready("double")
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    out = mock.infer("pipeline", {"INPUT0": x})
    np.testing.assert_array_equal(out["OUTPUT0"], (x + 1) * 2)
    assert [c.model for c in mock.calls] == ["add_one", "double"]
    out = mock.infer("pipeline", {"INPUT0": x}, parameters={"add": 3})  # parameters are forwarded
    np.testing.assert_array_equal(out["OUTPUT0"], (x + 3) * 2)
    with pytest.raises(InferError, match="data-type is 'INT32', but model 'pipeline' expects 'FP32'"):
        mock.infer("pipeline", {"INPUT0": np.ones((1, 4), np.int32)})
    mock.fail_next("double", "double failed")
    with pytest.raises(InferError, match="^double failed$"):
        mock.infer("pipeline", {"INPUT0": x})


# -- metrics and logs -------------------------------------------------------------------------


def test_metrics_follow_triton_rules(mock, pb):
    mock.load("add_one")
    mock.infer("add_one", {"INPUT0": f32(1, 4)})
    assert mock.metrics()["add_one_requests_total"] == {frozenset({("model", "add_one")}): 1.0}
    depth = pb.MetricFamily("queue_depth", "depth", pb.MetricFamily.GAUGE)
    gauge = depth.Metric(labels={"q": "a"})
    gauge.set(5)
    gauge.increment(-2)
    assert gauge.value() == 3.0
    counts = pb.MetricFamily("c_total", "c", pb.MetricFamily.COUNTER)
    counter = counts.Metric()
    with pytest.raises(pb.TritonModelException, match="non-negative"):
        counter.increment(-1)
    with pytest.raises(pb.TritonModelException, match="does not support Set"):
        counter.set(1)
    family = pb.MetricFamily("latency", "l", pb.MetricFamily.HISTOGRAM)
    with pytest.raises(pb.TritonModelException, match="Missing required buckets"):
        family.Metric()
    histogram = family.Metric(labels={}, buckets=[0.1, 1.0])
    for value in (0.05, 0.5, 5.0):
        histogram.observe(value)
    with pytest.raises(pb.TritonModelException, match="does not support Value"):
        histogram.value()
    assert mock.metric("latency") == {
        "count": 3, "sum": pytest.approx(5.55), "buckets": {0.1: 1, 1.0: 2, float("inf"): 3}
    }
    del gauge
    gc.collect()
    assert mock.metric("queue_depth", {"q": "a"}) == 3.0  # the family keeps its metrics
    del depth
    gc.collect()
    assert "queue_depth" not in mock.metrics()  # ... until the family object goes
    mock.unload("add_one")
    gc.collect()
    assert "add_one_requests_total" not in mock.metrics()


def test_logger_writes_to_logging_per_model(mock, pb, caplog):
    with caplog.at_level(logging.DEBUG, logger="orchestrator.testing.mock"):
        mock.load("add_one")
        pb.Logger.log_verbose("outside any model")
        pb.Logger.log_info("info outside any model")
    by_logger = {(r.name, r.levelno, r.getMessage()) for r in caplog.records}
    assert ("orchestrator.testing.mock.add_one", logging.INFO, "add_one initialized") in by_logger
    assert ("orchestrator.testing.mock.stub", logging.INFO, "info outside any model") in by_logger
    # VERBOSE is dropped at Triton's default --log-verbose=0, in logging too
    assert not any(message == "outside any model" for _, _, message in by_logger)


def test_logger_records(mock, pb):
    mock.load("add_one")
    pb.Logger.log_warn("from the test")
    pb.Logger.log("verbose one", pb.Logger.VERBOSE)
    assert ("add_one", "INFO", "add_one initialized") in mock.logs
    assert (None, "WARNING", "from the test") in mock.logs
    assert all(record.level != "VERBOSE" for record in mock.logs)  # --log-verbose=0


def test_logger_keeps_verbose_records_when_asked(pb):
    with MockTriton(REPO, log_verbose=1) as server:
        pb.Logger.log_verbose("verbose one")
        assert (None, "VERBOSE", "verbose one") in server.logs
