"""The mock behaves like Triton 2.51 where it used to differ, with the fixture models in
tests/fixtures/mock/like_triton (the ``probe`` model runs one named use of the stub's API
and answers what it saw as JSON).

The expected values here are what the embedded Triton 2.51 server answered for the same
models; tests/server/test_mock_agrees_with_server.py runs the same cases on both and
compares them.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys

import numpy as np
import pytest

from orchestrator.testing.mock import InferError, LoadError, MockTriton, install
from tests.helpers import FIXTURES

LIKE_TRITON = FIXTURES / "mock" / "like_triton"
#: Everything but bad_init, which fails to load on purpose.
MODELS = ("probe", "slow", "slow_plain", "slow_nodefault", "versioned", "helper_a", "helper_b",
          "late_sender", "send_then_raise")
NOT_CONTIGUOUS = ("DLPack tensor is not contiguous. Only contiguous DLPack tensors that are "
                  "stored in C-Order are supported.")
DELETED_FAMILY = (
    "Failed to set metric value: Invalid metric operation as the corresponding 'MetricFamily' "
    "has been deleted. The 'MetricFamily' object should be deleted AFTER its corresponding "
    "'Metric' objects have been deleted."
)


def probe_input(case: str) -> dict:
    return {"CASE": np.array([case.encode()], dtype=np.object_)}


def x_input(value: int = 5) -> dict:
    return {"X": np.array([value], dtype=np.int32)}


def probe(mock: MockTriton, case: str):
    return json.loads(mock.infer("probe", probe_input(case))["OUT"][0])


@pytest.fixture(scope="module")
def mock():
    with MockTriton(LIKE_TRITON, model_config_name=None, models=MODELS) as server:
        yield server


# -- a request's timeout -----------------------------------------------------------------


def test_a_queued_request_past_its_timeout_is_refused_where_the_queue_policy_allows(mock):
    assert probe(mock, "timeout:slow") == {"error": "Request timeout expired"}
    # no queue policy, or override allowed without a default timeout: never applied
    assert probe(mock, "timeout:slow_plain") == {"ok": [[0.0]]}
    assert probe(mock, "timeout:slow_nodefault") == {"ok": [[0.0]]}
    # only the wait for the instance counts, not the execute itself
    assert probe(mock, "timeout:idle") == {"ok": [[pytest.approx(0.3)]]}


# -- versions ------------------------------------------------------------------------------


def test_every_version_the_policy_names_is_served(mock):
    assert probe(mock, "versions") == {
        "ready": {"": True, "1": True, "2": True, "3": False},
        "infer": {
            "-1": {"ok": [2]}, "1": {"ok": [1]}, "2": {"ok": [2]},
            "3": {"error": "Model versioned - Error when running inference: Failed for execute the "
                           "inference request. Model 'versioned' is not ready."},
        },
    }
    assert mock.infer("versioned", x_input(), model_version="1")["VERSION"].tolist() == [1]
    assert mock.infer("versioned", x_input())["VERSION"].tolist() == [2]
    with pytest.raises(InferError) as info:
        mock.infer("versioned", x_input(), model_version="3")
    assert (info.value.message, info.value.code) == (
        "Request for unknown model: 'versioned' version 3 is not found", "NOT_FOUND")
    rows = [(r["version"], r["state"]) for r in mock.repository_index() if r["name"] == "versioned"]
    assert rows == [("1", "READY"), ("2", "READY")]


@pytest.mark.parametrize("policy, served", [
    ("", ["3"]),
    ("version_policy: { latest { num_versions: 2 } }", ["2", "3"]),
    ("version_policy: { specific { versions: [1, 3] } }", ["1", "3"]),
])
def test_version_policies(tmp_path, policy, served):
    model = tmp_path / "versioned"
    shutil.copytree(LIKE_TRITON / "versioned", model)
    shutil.copytree(model / "2", model / "3")
    config = (model / "config.pbtxt").read_text().replace("version_policy: { all { } }", policy)
    (model / "config.pbtxt").write_text(config)
    with MockTriton(tmp_path, model_config_name=None, models=["versioned"]) as server:
        assert [v for v in "123" if server.is_model_ready("versioned", v)] == served
        for version in served:
            out = server.infer("versioned", x_input(), model_version=version)
            assert out["VERSION"].tolist() == [int(version)]


# -- custom metrics -----------------------------------------------------------------------


def test_a_family_name_used_again_shares_the_first_family(mock):
    assert probe(mock, "metrics:shared") == {"values": [5.0, 5.0]}
    pb = install()
    first = pb.MetricFamily("again_total", "first help", pb.MetricFamily.COUNTER)
    second = pb.MetricFamily("again_total", "second help", pb.MetricFamily.COUNTER)
    assert mock.metric_registry.families["again_total"].description == "first help"
    with pytest.raises(pb.TritonModelException, match="Family name already exists with different type"):
        pb.MetricFamily("again_total", "first help", pb.MetricFamily.GAUGE)
    del first, second


def test_a_metric_of_a_deleted_family_raises_and_its_series_is_gone(mock):
    assert probe(mock, "metrics:deleted") == {"error": "TritonModelException", "message": DELETED_FAMILY}
    assert "probe_deleted" not in mock.metrics()
    pb = install()
    family = pb.MetricFamily("kept_by_family", "k", pb.MetricFamily.GAUGE)
    family.Metric(labels={"a": "b"}).set(4)  # the Metric object is dropped at once
    gc.collect()
    assert mock.metric("kept_by_family", {"a": "b"}) == 4.0


# -- arguments as pybind11 takes them ---------------------------------------------------------


def test_arguments_are_taken_and_refused_as_pybind11_does(mock):
    seen = probe(mock, "arguments")
    assert seen.pop("bytes_model_name") == {"ok": 0.0}  # bytes are a str argument too
    for name, outcome in seen.items():
        assert outcome["error"] == "TypeError", name
        assert "(): incompatible " in outcome["message"].splitlines()[0], name
    pb = install()
    with pytest.raises(TypeError, match=r"^__init__\(\): incompatible constructor arguments"):
        pb.Tensor("X", [1.0, 2.0])  # a list is not a numpy.ndarray
    assert pb.Tensor(b"X", np.zeros(1)).name() == "X"


# -- load errors -----------------------------------------------------------------------------


def test_load_errors_are_worded_as_triton_words_them():
    with MockTriton(LIKE_TRITON, model_config_name=None) as server:
        with pytest.raises(LoadError) as info:
            server.load("bad_init")
        path = LIKE_TRITON / "bad_init" / "1" / "model.py"
        reason = f"Internal: RuntimeError: cannot find weights.bin\n\nAt:\n  {path}(3): initialize\n"
        assert str(info.value) == (
            f"load failed for model 'bad_init': version 1 is at UNAVAILABLE state: {reason};\n")
        row = next(r for r in server.repository_index() if r["name"] == "bad_init")
        assert row == {"name": "bad_init", "version": "1", "state": "UNAVAILABLE", "reason": reason}


def test_load_model_from_a_model_names_the_calling_instance(mock):
    outcome = probe(mock, "load_error")["bad_init"]
    assert outcome["error"] == "TritonModelException"
    assert outcome["message"].startswith(
        "Failed to load model: Failed to process the request for model 'probe_0', message: ")


# -- each model its own helper modules ----------------------------------------------------------


def test_a_helper_module_of_one_model_is_not_reused_by_another(mock):
    assert mock.infer("helper_a", x_input())["VALUE"].tolist() == [b"from helper_a"]
    assert mock.infer("helper_b", x_input())["VALUE"].tolist() == [b"from helper_b"]
    assert "helper" not in sys.modules


# -- logs ------------------------------------------------------------------------------------


def test_verbose_log_messages_are_dropped_at_the_default_verbosity(mock):
    assert probe(mock, "log") == {"logged": True}
    messages = [(r.level, r.message) for r in mock.logs if r.model == "probe"]
    assert ("INFO", "probe log INFO line") in messages
    assert not any(level == "VERBOSE" for level, _ in messages)


# -- the response sender ------------------------------------------------------------------------


def test_a_response_sent_after_execute_returned_answers_the_request(mock):
    assert mock.infer("late_sender", x_input(5))["Y"].tolist() == [6]


def test_a_response_sent_before_execute_raised_is_delivered(mock):
    assert mock.infer("send_then_raise", x_input(5))["Y"].tolist() == [6]


# -- DLPack --------------------------------------------------------------------------------------


def test_from_dlpack_shares_writable_memory_and_refuses_what_the_stub_refuses(mock):
    assert probe(mock, "dlpack:writeable") == {"writeable": True, "shares_memory": True}
    assert probe(mock, "dlpack:to_dlpack") == {"ok": "list"}
    assert probe(mock, "dlpack:of_tensor") == {"writeable": True, "values": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]}
    for case in ("dlpack:transposed", "dlpack:column_slice"):
        assert probe(mock, case) == {"error": "TritonModelException", "message": NOT_CONTIGUOUS}
    assert probe(mock, "dlpack:numpy_transposed") == {"ok": "list"}  # Tensor() copies instead
    pb = install()
    with pytest.raises(pb.TritonModelException, match="Provided tensor is not supported"):
        pb.Tensor.from_dlpack("X", [1, 2])
