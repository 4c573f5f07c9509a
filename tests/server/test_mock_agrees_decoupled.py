"""Decoupled models on the in-process mock and on the real embedded Triton 2.51: the
same fixture models (tests/fixtures/mock/decoupled, after python_backend's ``decoupled``
and ``bls_decoupled`` examples) must give the same responses -- how many, their
outputs, the final flag, the errors -- through a gRPC stream
(``async_stream_infer(..., enable_empty_final_response=True)``) on the server and
:meth:`MockTriton.infer_stream` on the mock. Also upstream's own example models when
``ORCHESTRATOR_PYTHON_BACKEND_SRC`` names a python_backend checkout.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.tooling.server import TritonServer
from tests.mock.test_decoupled_mock import (
    BLS_CASES,
    DECOUPLED,
    MODELS,
    PROBE_CASES,
    case_input,
    first_lines,
    normalized,
    repeat_input,
)

pytestmark = pytest.mark.server
QUIET = 2.0  # seconds of silence after which a stream that sent no final is "open"


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled") / "repo"
    shutil.copytree(DECOUPLED, repo)
    with TritonServer(repo, models=list(MODELS), model_config_name=None) as server:
        with MockTriton(repo, model_config_name=None, models=MODELS, response_timeout=QUIET) as mock:
            yield server, mock


def real_stream(url, model, inputs, quiet=QUIET):
    """One request on a gRPC stream: ``[(outputs | None, error message | None, final)]``
    up to the final response, then ``"open"`` when none came within ``quiet`` seconds."""
    got: queue.Queue = queue.Queue()
    open_requests = False  # stop_stream waits for open requests unless it cancels them
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        infer_inputs = []
        for name, array in inputs.items():
            infer_inputs.append(grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
            infer_inputs[-1].set_data_from_numpy(array)
        client.async_stream_infer(model, infer_inputs, enable_empty_final_response=True)
        out = []
        while True:
            try:
                result, error = got.get(timeout=quiet)
            except queue.Empty:
                # the client shows no final flag with an error: silence after one is its end
                if not (out and out[-1][1] is not None):
                    out.append("open")
                open_requests = True
                return out
            if error is not None:  # the client shows no final flag with an error
                out.append((None, error.message(), None))
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            outputs = {o.name: result.as_numpy(o.name) for o in response.outputs}
            out.append((outputs, None, final))
            if final:
                return out
    finally:
        client.stop_stream(cancel_requests=open_requests)
        client.close()


def mock_stream(mock, model, inputs):
    """The mock's answer in :func:`real_stream`'s shape (an error's final flag left out;
    the mock's "never sent COMPLETE_FINAL" error is ``"open"``)."""
    out = []
    for item in mock.infer_stream(model, inputs):
        if item.error is not None:
            if item.error.message.startswith("mock_triton: decoupled model"):
                out.append("open")
                break
            out.append((None, item.error.message, None))
        else:
            out.append((item.outputs, None, item.final))
    return out


def _grpc_infer(url, model, inputs):
    client = grpcclient.InferenceServerClient(url)
    try:
        infer_inputs = []
        for name, array in inputs.items():
            infer_inputs.append(grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
            infer_inputs[-1].set_data_from_numpy(array)
        result = client.infer(model, infer_inputs, client_timeout=30)
        return {o.name: result.as_numpy(o.name).tolist() for o in result.get_response().outputs}
    finally:
        client.close()


@pytest.mark.parametrize("case", PROBE_CASES)
def test_the_response_sender_agrees(both, case):
    """Each case on its own; after them all, what the probe saw later (sends refused after
    the final response, or after execute raised) agrees too."""
    server, mock = both
    real = real_stream(server.grpc_url, "decoupled_probe", case_input(case))
    fake = mock_stream(mock, "decoupled_probe", case_input(case))
    assert normalized(fake) == normalized(real)


def test_what_the_probe_saw_later_agrees(both):
    server, mock = both
    for case in ("send_after_final", "raise_then_late_send", "late_final"):
        real_stream(server.grpc_url, "decoupled_probe", case_input(case))
        mock_stream(mock, "decoupled_probe", case_input(case))
    time.sleep(0.6)  # the probe's threads send 0.2 s later
    real = real_stream(server.grpc_url, "decoupled_probe", case_input("report"))
    fake = mock_stream(mock, "decoupled_probe", case_input("report"))
    assert normalized(fake) == normalized(real)


@pytest.mark.parametrize("case", ["count:3", "count:0", "bls:3", "bls:-1", "raise", "return_list"])
def test_async_decoupled_execute_agrees(both, case):
    server, mock = both
    real = real_stream(server.grpc_url, "async_decoupled", case_input(case))
    fake = mock_stream(mock, "async_decoupled", case_input(case))
    assert normalized(fake) == normalized(real)


def _concurrently(fn, n=2):
    results = [None] * n
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, fn())) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_one_instance_runs_async_decoupled_requests_at_once_on_both(both):
    """The stub does not wait for a decoupled model's coroutine: a second request enters
    execute while the first still sleeps in it."""
    server, mock = both
    real_stream(server.grpc_url, "async_decoupled", case_input("reset"))
    real = _concurrently(lambda: real_stream(server.grpc_url, "async_decoupled", case_input("inflight:1500")))
    mock_stream(mock, "async_decoupled", case_input("reset"))
    fake = _concurrently(lambda: mock_stream(mock, "async_decoupled", case_input("inflight:1500")))
    most = lambda got: max(json.loads(r[0][0]["OUT"][0])["most_at_once"] for r in got)  # noqa: E731
    assert most(real) == most(fake) == 2


def test_repeat_agrees(both):
    server, mock = both
    inputs = repeat_input([4, 5, 6], [30, 10, 20])
    assert normalized(mock_stream(mock, "repeat_int32", inputs)) == normalized(real_stream(server.grpc_url, "repeat_int32", inputs))
    empty = repeat_input([], [])
    assert normalized(mock_stream(mock, "repeat_int32", empty)) == normalized(real_stream(server.grpc_url, "repeat_int32", empty))
    bad = {**repeat_input([1, 2], [1, 1]), "DELAY": np.array([1], dtype=np.uint32)}
    assert first_lines(normalized(mock_stream(mock, "repeat_int32", bad))) == first_lines(normalized(real_stream(server.grpc_url, "repeat_int32", bad)))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_square_agrees(both, n):
    server, mock = both
    inputs = {"IN": np.array([n], dtype=np.int32)}
    assert normalized(mock_stream(mock, "square_int32", inputs)) == normalized(real_stream(server.grpc_url, "square_int32", inputs))


@pytest.mark.parametrize("model", ["bls_decoupled_sync", "bls_decoupled_async"])
@pytest.mark.parametrize("n", [0, 3, 4, -2])
def test_bls_decoupled_examples_agree(both, model, n):
    server, mock = both
    inputs = {"IN": np.array([n], dtype=np.int32)}
    try:
        real = _grpc_infer(server.grpc_url, model, inputs)
    except InferenceServerException as exc:
        real = {"error": exc.message()}
    try:
        fake = {k: v.tolist() for k, v in mock.infer(model, inputs).items()}
    except InferError as exc:
        fake = {"error": exc.message}
    assert fake == real
    if n >= 0:
        assert fake == {"SUM": [2 * n * n]}


@pytest.mark.parametrize("case", BLS_CASES)
def test_bls_to_decoupled_models_agrees(both, case):
    server, mock = both
    real = json.loads(_grpc_infer(server.grpc_url, "bls_probe", case_input(case))["OUT"][0])
    fake = json.loads(mock.infer("bls_probe", case_input(case))["OUT"][0])
    assert first_lines(fake) == first_lines(real)


def test_unary_clients_are_refused_alike(both):
    """Triton 2.51's unary endpoints refuse decoupled models; the mock's infer() too."""
    server, mock = both
    inputs = {"IN": np.array([2], dtype=np.int32)}
    with pytest.raises(InferenceServerException) as grpc_error:
        _grpc_infer(server.grpc_url, "square_int32", inputs)
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        infer_input = httpclient.InferInput("IN", [1], "INT32")
        infer_input.set_data_from_numpy(inputs["IN"])
        with pytest.raises(InferenceServerException) as http_error:
            http.infer("square_int32", [infer_input])
    finally:
        http.close()
    with pytest.raises(InferError) as fake:
        mock.infer("square_int32", inputs)
    assert fake.value.message == grpc_error.value.message()
    assert "doesn't support models with decoupled transaction policy" in http_error.value.message()


# ----------------------------------------------------------------------------- upstream's examples

UPSTREAM = os.environ.get("ORCHESTRATOR_PYTHON_BACKEND_SRC", "")


def _upstream_repo(tmp: Path) -> Path:
    """A model repository of upstream's examples/decoupled and examples/bls_decoupled
    models, laid out as their READMEs say."""
    src = Path(UPSTREAM) / "examples"
    layout = {
        "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
        "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
        "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
        "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    }
    for name, (model_py, config) in layout.items():
        (tmp / name / "1").mkdir(parents=True)
        shutil.copy(src / model_py, tmp / name / "1" / "model.py")
        shutil.copy(src / config, tmp / name / "config.pbtxt")
    return tmp


@pytest.mark.skipif(
    not UPSTREAM or not (Path(UPSTREAM) / "examples" / "bls_decoupled").is_dir(),
    reason="set ORCHESTRATOR_PYTHON_BACKEND_SRC to a triton-inference-server/python_backend "
           "checkout (r24.10) to run its examples/decoupled and examples/bls_decoupled models; "
           "the fixture models above cover the same semantics",
)
def test_upstream_examples_agree(tmp_path):
    repo = _upstream_repo(tmp_path / "repo")
    names = ["repeat_int32", "square_int32", "bls_decoupled_sync", "bls_decoupled_async"]
    with TritonServer(repo, models=names, model_config_name=None) as server:
        # upstream's bls_decoupled models return INT64 for a TYPE_INT32 output, which only
        # the mock's strict_outputs check refuses
        with MockTriton(repo, model_config_name=None, models=names, response_timeout=QUIET,
                        strict_outputs=False) as mock:
            inputs = {**repeat_input([4, 2, 0, 1], [1, 2, 3, 4]), "WAIT": np.array([5], dtype=np.uint32)}
            assert normalized(mock_stream(mock, "repeat_int32", inputs)) == normalized(real_stream(server.grpc_url, "repeat_int32", inputs))
            for n in (0, 1, 4):
                inputs = {"IN": np.array([n], dtype=np.int32)}
                assert normalized(mock_stream(mock, "square_int32", inputs)) == normalized(real_stream(server.grpc_url, "square_int32", inputs))
                # upstream's sync model makes one BLS request, its async model two
                for model, calls in (("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)):
                    real = _grpc_infer(server.grpc_url, model, inputs)
                    assert {k: v.tolist() for k, v in mock.infer(model, inputs).items()} == real == {"SUM": [calls * n * n]}
