"""Tensor pipelines in a real tritonserver (the embedded 2.51): the routers of
``tests/pipeline_repo.py`` answer byte-identically to the ensembles making the same calls,
and to the in-process mock; the three public asks for branching answer as specified, and
Triton's own per-model statistics show each branch model received exactly the rows that
chose it."""

from __future__ import annotations

import concurrent.futures as cf
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from orchestrator.testing.mock import MockTriton
from orchestrator.tooling import prometheus
from tests.mock.test_pipeline_mock import img, same, typed_inputs, unbatched_inputs
from tests.pipeline_repo import CLASSES, MODELS, RECOGNIZERS, make_pipeline_repository

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_pipeline_repository(tmp_path_factory.mktemp("pipelines") / "model_repository")


@pytest.fixture(scope="module")
def server(repo):
    from orchestrator.tooling.server import TritonServer

    with TritonServer(repo, models=MODELS, model_config_name=None) as srv:
        yield srv


@pytest.fixture(scope="module")
def mock(repo):
    with MockTriton(repo, model_config_name=None, models=MODELS) as m:
        yield m


def infer(server, model, inputs, parameters=None, protocol="http", outputs=None):
    """``{output: array}`` of one request (``outputs``: those requested; None: all; raises
    InferenceServerException)."""
    lib = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = lib.InferenceServerClient(url)
    try:
        items = []
        for name, array in inputs.items():
            item = lib.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            item.set_data_from_numpy(array)
            items.append(item)
        wanted = None if outputs is None else [lib.InferRequestedOutput(n) for n in outputs]
        result = client.infer(model, items, parameters=parameters, outputs=wanted)
        response = result.get_response()
        names = [o["name"] for o in response["outputs"]] if protocol == "http" else [o.name for o in response.outputs]
        return {n: result.as_numpy(n) for n in names}
    finally:
        client.close()


def rows_served(server, model) -> int:
    """Rows ``model`` has run (Triton's statistics: ``inference_count``), once settled."""
    client = server.client()
    try:
        last = -1
        for _ in range(50):
            now = int(client.get_inference_statistics(model)["model_stats"][0]["inference_count"])
            if now == last:
                return now
            last = now
            time.sleep(0.2)
        return now
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("rows,width", [(1, 1), (3, 5), (8, 2)])
def test_a_typed_pipeline_answers_as_its_ensemble_and_as_the_mock(server, mock, protocol, rows, width):
    inputs = typed_inputs(rows, width, seed=rows)
    got = infer(server, "typed", inputs, protocol=protocol)
    same(got, infer(server, "typed_ensemble", inputs, protocol=protocol))
    same(got, mock.infer("typed", inputs))


def test_max_batch_size_zero_routers_answer_as_their_ensembles(server, mock):
    v = np.array([0.5, -1.0, 2.25])
    same(infer(server, "flat_router", {"V": v}), infer(server, "flat_ensemble", {"V": v}))
    same(infer(server, "flat_router", {"V": v}), mock.infer("flat_router", {"V": v}))
    x = unbatched_inputs()
    got = infer(server, "unbatched", x)
    # Triton's ReshapeTensorDims: Y [3], CODE [1, 1], LABEL [1], ECHO [1, 1]; FP16, INT8, BYTES, BOOL
    same(got, infer(server, "unbatched_ensemble", x))
    assert set(got) == {"Y", "CODE", "LABEL", "ECHO"}
    same(got, mock.infer("unbatched", x))


def test_bad_input_names_the_input_and_the_server_stays_ready(server):
    with pytest.raises(InferenceServerException, match="X"):
        infer(server, "typed", dict(typed_inputs(2), X=np.zeros((2, 3), dtype=np.float32)))
    assert server.is_ready()


def test_stop_early(server, mock):
    before = rows_served(server, "second")
    x = img([[1, 1, 1, 1], [0, 0, 0, 0], [2, 0, 0, 0]])
    out = infer(server, "stop_early", {"IMG": x})
    assert out["OUT"].tolist() == [[11.0, 11.0], [-1.0, -1.0], [-1.0, -1.0]]
    assert rows_served(server, "second") - before == 1
    same(out, mock.infer("stop_early", {"IMG": x}))


def branch_rows(server, branch):
    time.sleep(1.2)  # the router's metrics flush every 0.5 s
    return prometheus.value(server.metrics(), "orchestrator_branch_rows_total", router="per_class", node="by_class", branch=branch)


def test_a_detector_then_a_per_class_model(server, mock):
    x = img([[5, 0, 0, 1], [0, 5, 0, 2], [0, 0, 5, 3], [6, 0, 0, 4], [0, 7, 0, 0]])
    before = {c: rows_served(server, f"cls_{c}") for c in CLASSES}
    none = branch_rows(server, "none")
    out = infer(server, "per_class", {"IMG": x})
    assert [bytes(e) for e in out["LABEL"].reshape(-1)] == [b"cat:6", b"dog:7", b"none", b"cat:10", b"dog:7"]
    assert {c: rows_served(server, f"cls_{c}") - before[c] for c in CLASSES} == {"cat": 2, "dog": 2}
    assert branch_rows(server, "none") - none == 1  # on /metrics
    same(out, mock.infer("per_class", {"IMG": x}))


def test_one_of_n_recognizers_each_receives_exactly_the_rows_that_chose_it(server, mock):
    def req(scripts, seed):
        t = np.empty((len(scripts), 1), dtype=object)
        t[:, 0] = [f"w{seed}{i}{s}".encode() for i, s in enumerate(scripts)]
        return {"TEXT_IN": t, "SCRIPT": np.array(scripts, dtype=np.int32).reshape(-1, 1)}

    requests = [req([0, 1, 2, 0], 1), req([1, 1], 2), req([2, 0, 0, 0, 0], 3), req([5], 4)] * 4
    before = {m: rows_served(server, m) for m in RECOGNIZERS}
    with cf.ThreadPoolExecutor(8) as pool:  # concurrent: Triton's batcher may merge them into one execute
        answers = list(pool.map(lambda r: infer(server, "one_of_n", r), requests))
    for r, a in zip(requests, answers):
        want = [RECOGNIZERS[min(s, 2)].encode() + b":" + bytes(t)[::-1] for t, s in zip(r["TEXT_IN"].reshape(-1), r["SCRIPT"].reshape(-1))]
        assert [bytes(e) for e in a["TEXT"].reshape(-1)] == want
        same(a, mock.infer("one_of_n", r))
    served = {m: rows_served(server, m) - before[m] for m in RECOGNIZERS}
    assert served == {"rec_latin": 6 * 4, "rec_greek": 3 * 4, "rec_cjk": 3 * 4}


def test_stop_early_per_request_omits_the_output(server, mock):
    x = img([[0, 0, 0, 0], [0.5, 0.5, 0.5, 0.5]])
    out = infer(server, "stop_early_request", {"IMG": x})
    assert set(out) == {"SCORE"}
    same(out, mock.infer("stop_early_request", {"IMG": x}))


def test_warmup_samples_are_answered_without_downstream_calls(server):
    assert "router 'typed_warm': warmup sample answered without downstream calls" in server.log_path.read_text()
    inputs = typed_inputs(2, 3)
    same(infer(server, "typed_warm", inputs), infer(server, "typed", inputs))


def test_optional_inputs_and_parameters_reach_the_steps_as_on_the_mock(server, mock):
    from tests.mock.test_pipeline_mock import echo

    def on_server(model, inputs, parameters):
        return infer(server, model, inputs, parameters)

    params = {"mode": "a", "x_n": 3, "x_b": True, "x_f": 0.5, "x_s": "s"}
    out = echo(on_server, params)
    assert bytes(out["P"][0, 0]) == b'{"mode": "a", "x_b": true, "x_n": 3, "x_s": "s"}'
    same(out, echo(mock.infer, params))
    same(echo(on_server, b=False), echo(mock.infer, b=False))
    with pytest.raises(InferenceServerException, match="parameter 'other': not a parameter of this router"):
        echo(on_server, {"other": 1})


def test_a_failing_step_fails_only_its_request_naming_the_step_and_model(server):
    bad = {"A": np.array([[-1.0]], dtype=np.float32)}
    good = {"A": np.array([[1.0]], dtype=np.float32)}
    with cf.ThreadPoolExecutor(8) as pool:  # batched together or not, only the bad ones fail
        futures = [pool.submit(infer, server, "echo_router", r) for r in [bad, good] * 4]
    for i, f in enumerate(futures):
        if i % 2:
            assert f.result()["S"].tolist() == [[101.0]]
        else:
            with pytest.raises(InferenceServerException, match=r"step '(echo|echo_named|echo_none)' failed: model 'echo'.*A = -1 refused"):
                f.result()
    with pytest.raises(InferenceServerException, match="B"):  # Triton's own check of the router's input
        infer(server, "echo_router", dict(good, B=np.array([[1.0, 2.0]], dtype=np.float32)))
    assert server.is_ready()


def test_only_the_requested_outputs_are_answered_as_by_the_ensemble(server, mock):
    inputs = typed_inputs(2, 3)
    got = infer(server, "typed", inputs, outputs=["LABEL", "Y"])
    assert set(got) == {"LABEL", "Y"}
    same(got, infer(server, "typed_ensemble", inputs, outputs=["LABEL", "Y"]))
    same(got, mock.infer("typed", inputs, outputs=["LABEL", "Y"]))


def test_an_on_demand_step_model_is_loaded_at_first_use(server):
    assert not server.client().is_model_ready("labeler_lazy")
    inputs = typed_inputs(2, 3)
    same(infer(server, "typed_on_demand", inputs), infer(server, "typed_ensemble", inputs))
