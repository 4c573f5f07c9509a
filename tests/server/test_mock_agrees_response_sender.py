"""The response sender on the in-process mock and on the real embedded Triton 2.51: how
a client sees what a model sends through ``request.get_response_sender()``.

Decoupled models: every response as sent, the final flag with one or alone. Models that
are not decoupled (python_backend allows the sender there: one response, then the final
flag) are where the frontends buffer: the response reaches the client only when the
final flag comes, a gRPC stream shows ``triton_final_response`` false when the flag came
alone and nothing after the response, and a second response (the error of an
``execute`` that failed after a response without the flag) makes ``infer`` answer
``expected a single response, got 2``.

Our own model (tests/fixtures/mock/response_sender) always runs; python_backend's QA
models ``response_sender``, ``response_sender_complete_final`` and
``response_sender_error`` run when ``ORCHESTRATOR_TRITON_SERVER_SRC`` names an extracted
triton-inference-server/server tree (v2.51.0): every combination of their five inputs
(responses before and after ``execute`` returns, the final flag before and after, a
returned response) on the model decoupled and not, synchronous and ``async``.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import random
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.tooling.server import TritonServer
from tests.helpers import FIXTURES

pytestmark = pytest.mark.server
QUIET = 1.2  # seconds of silence that end a stream (the QA model's late sends come 0.5 s after execute)
OWN = FIXTURES / "mock" / "response_sender"
# Not compared: "final_then_raise" (the final response, then execute raises): on 2.51 the
# instance's next execute never returns (every later request hangs); the mock answers them
# (docs/reference/testing.md lists it).
OWN_CASES = ["with_final", "final_alone", "final_from_thread", "all_from_thread", "two_sends", "send_then_return",
             "final_then_return", "send_then_raise", "error_then_final", "final_first", "returned", "never_final", "empty_with_final"]
QA = os.environ.get("ORCHESTRATOR_TRITON_SERVER_SRC", "")
QA_MODELS = Path(QA) / "qa" / "python_models"
needs_qa = pytest.mark.skipif(
    not QA or not (QA_MODELS / "response_sender").is_dir(),
    reason="set ORCHESTRATOR_TRITON_SERVER_SRC to an extracted triton-inference-server/server tree (v2.51.0) "
           "to run its qa/python_models/response_sender* models; tests/fixtures/mock/response_sender covers the same")


def _plain(array):
    """An output as a list, BYTES elements as text (HTTP's JSON has no bytes)."""
    values = np.asarray(array).tolist()
    if np.asarray(array).dtype == np.object_:
        return [v.decode() if isinstance(v, bytes) else v for v in values]
    return values


def _grpc_inputs(inputs):
    out = []
    for name, array in inputs.items():
        out.append(grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
        out[-1].set_data_from_numpy(array)
    return out


def real_stream(url, model, inputs):
    """One request on a gRPC stream with ``enable_empty_final_response``: ``[(outputs,
    final) | ("error", first line)]`` up to a final response or ``QUIET`` seconds of
    silence (then ``"open"`` when nothing came at all)."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    out: list = []
    try:
        client.async_stream_infer(model, _grpc_inputs(inputs), enable_empty_final_response=True)
        while True:
            try:
                result, error = got.get(timeout=QUIET)
            except queue.Empty:
                return out or ["open"]
            if error is not None:
                out.append(("error", error.message().splitlines()[0]))
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            out.append(({o.name: result.as_numpy(o.name).tolist() for o in response.outputs}, final))
            if final:
                return out
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def mock_stream(mock, model, inputs):
    """:meth:`MockTriton.infer_stream` in :func:`real_stream`'s shape; the mock's error
    for a request Triton keeps open is ``"open"``."""
    out: list = []
    for item in mock.infer_stream(model, inputs):
        if item.error is not None:
            if item.error.message.startswith("mock_triton: "):
                return out or ["open"]
            out.append(("error", item.error.message.splitlines()[0]))
        else:
            out.append(({k: v.tolist() for k, v in item.outputs.items()}, item.final))
    return out


def real_unary(server, model, inputs):
    """gRPC ``infer`` and the HTTP body, each ``outputs`` / ``("error", first line)`` /
    ``"open"`` (no answer within ``QUIET`` seconds)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, _grpc_inputs(inputs), client_timeout=QUIET)
        grpc = {o.name: _plain(result.as_numpy(o.name)) for o in result.get_response().outputs}
    except InferenceServerException as exc:
        grpc = "open" if "Deadline" in exc.message() else ("error", exc.message().splitlines()[0])
    finally:
        client.close()
    body = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": np_to_triton_dtype(a.dtype),
                        "data": [v.decode() if isinstance(v, bytes) else v for v in a.reshape(-1).tolist()]}
                       for n, a in inputs.items()]}
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/infer",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=QUIET) as answer:
            http = {o["name"]: np.array(o["data"], dtype=object if o["datatype"] == "BYTES" else None)
                    .reshape(o["shape"]).tolist() for o in json.loads(answer.read())["outputs"]}
    except urllib.error.HTTPError as exc:
        # 2.51 writes the first response's JSON, then the error's: the error is the last object
        text = exc.read().decode(errors="replace")
        http = ("error", json.loads(text[text.rindex('{"error"'):])["error"].splitlines()[0])
    except OSError:  # timed out
        http = "open"
    return grpc, http


def mock_unary(mock, model, inputs):
    try:
        return {k: _plain(v) for k, v in mock.infer(model, inputs).items()}
    except InferError as exc:
        return "open" if exc.message.startswith("mock_triton: ") else ("error", exc.message.splitlines()[0])


# ------------------------------------------------------------------------- our own model


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sender") / "repo"
    shutil.copytree(OWN, repo)
    models = ["sender_unary", "sender_caller"]
    with TritonServer(repo, models=models, model_config_name=None) as server:
        with MockTriton(repo, model_config_name=None, models=models, response_timeout=QUIET) as mock:
            yield server, mock


def _case(case):
    return {"CASE": np.array([case.encode()], dtype=np.object_)}


@pytest.mark.parametrize("case", OWN_CASES)
def test_a_non_decoupled_models_sender_agrees(own, case):
    server, mock = own
    fake_stream = mock_stream(mock, "sender_unary", _case(case))
    real = real_stream(server.grpc_url, "sender_unary", _case(case))
    assert fake_stream == real
    grpc, http = real_unary(server, "sender_unary", _case(case))
    fake = mock_unary(mock, "sender_unary", _case(case))
    assert fake == http
    # 2.51's gRPC infer loses an error response sent without the final flag: an empty success
    assert grpc == ({} if case == "error_then_final" else fake)
    time.sleep(0.4)  # the model's late thread is done before the next case


# Only single final responses: 2.51 dies with SIGSEGV when a BLS request gets a second
# response (two_sends, send_then_return, send_then_raise, error_then_final), and hung,
# then died, once in three runs when the final flag came apart from the response
# (final_alone); the mock's caller gets the first response as it is sent (tests/mock).
@pytest.mark.parametrize("case", ["with_final", "returned"])
def test_a_bls_caller_of_the_sender_agrees(own, case):
    """BLS ``exec()`` of a model answering through its sender; the caller reports
    whether the response came within 0.2 s."""
    server, mock = own
    grpc, http = real_unary(server, "sender_caller", _case(case))
    assert mock_unary(mock, "sender_caller", _case(case)) == grpc == http
    time.sleep(0.4)


def test_what_the_buffering_looks_like(own):
    """The agreed answers, spelled out (a regression in both would pass the above)."""
    _, mock = own
    assert mock_stream(mock, "sender_unary", _case("final_alone")) == [({"OUT": [2]}, False)]
    assert mock_stream(mock, "sender_unary", _case("with_final")) == [({"OUT": [1]}, True)]
    assert mock_stream(mock, "sender_unary", _case("two_sends")) == [({"OUT": [5]}, False)]
    assert mock_unary(mock, "sender_unary", _case("two_sends")) == ("error", "expected a single response, got 2")
    assert mock_unary(mock, "sender_unary", _case("final_from_thread")) == {"OUT": [3]}
    assert mock_stream(mock, "sender_unary", _case("never_final")) == ["open"]


# ------------------------------------------------------------------------- upstream's QA models

INPUT_NAMES = ["NUMBER_OF_RESPONSE_BEFORE_RETURN", "SEND_COMPLETE_FINAL_FLAG_BEFORE_RETURN", "RETURN_A_RESPONSE",
               "NUMBER_OF_RESPONSE_AFTER_RETURN", "SEND_COMPLETE_FINAL_FLAG_AFTER_RETURN"]
COMBOS = list(itertools.product([0, 1, 2], [False, True], [False, True], [0, 1, 2], [False, True]))  # 72
# combinations drawn per run (each case costs up to 2 s of waiting for late sends and silence)
PER_RUN = {"response_sender": 24, "response_sender_decoupled": 12, "response_sender_async": 8,
           "response_sender_decoupled_async": 8}
SEED = int(os.environ.get("ORCHESTRATOR_DIFF_SEED", "0") or 0) or int.from_bytes(os.urandom(4), "little")


def _qa_inputs(combo):
    dtypes = [np.uint8, bool, bool, np.uint8, bool]
    return {name: np.array([[value]], dtype) for name, value, dtype in zip(INPUT_NAMES, combo, dtypes)}


def _qa_repository(where: Path) -> Path:
    """The QA models laid out as qa/L0_backend_python/response_sender/test.sh does (the
    decoupled variants with ``decoupled: True`` appended), model_common.py beside each."""
    src = QA_MODELS
    for name, model_py, decoupled in (("response_sender", "model.py", False),
                                      ("response_sender_async", "model_async.py", False),
                                      ("response_sender_decoupled", "model.py", True),
                                      ("response_sender_decoupled_async", "model_async.py", True)):
        (where / name / "1").mkdir(parents=True)
        shutil.copy(src / "response_sender" / model_py, where / name / "1" / "model.py")
        shutil.copy(src / "response_sender" / "model_common.py", where / name / "1" / "model_common.py")
        config = (src / "response_sender" / "config.pbtxt").read_text()
        if decoupled:
            config += "\nmodel_transaction_policy { decoupled: True }\n"
        (where / name / "config.pbtxt").write_text(config)
    for name in ("response_sender_complete_final", "response_sender_error"):
        shutil.copytree(src / name, where / name)
        (where / name / "1").mkdir(exist_ok=True)
        shutil.move(str(where / name / "model.py"), where / name / "1" / "model.py")
    return where


@pytest.fixture(scope="module")
def qa(tmp_path_factory):
    repo = _qa_repository(tmp_path_factory.mktemp("qa") / "repo")
    names = sorted(p.name for p in repo.iterdir())
    with TritonServer(repo, models=names, model_config_name=None) as server:
        with MockTriton(repo, model_config_name=None, models=names, response_timeout=QUIET) as mock:
            yield server, mock


@needs_qa
def test_qa_response_sender_agrees(qa):
    """Random combinations of the QA model's five inputs (responses before and after
    execute returns, the final flag before and after, a returned response), decoupled and
    not, synchronous and async: the same stream on both, and the same ``infer`` answer for
    the models that are not decoupled."""
    server, mock = qa
    rng = random.Random(SEED)
    disagreements = []
    for model, count in PER_RUN.items():
        for combo in rng.sample(COMBOS, count):
            inputs = _qa_inputs(combo)
            fake = mock_stream(mock, model, inputs)
            time.sleep(0.6)  # the model's late sends (0.5 s after execute) are over
            real = real_stream(server.grpc_url, model, inputs)
            if fake != real:
                disagreements.append((model, combo, "stream", fake, real))
            if "decoupled" not in model:
                grpc, http = real_unary(server, model, inputs)
                fake_unary = mock_unary(mock, model, inputs)
                if not fake_unary == grpc == http:
                    disagreements.append((model, combo, "infer", fake_unary, grpc, http))
            time.sleep(0.6)
    assert not disagreements, (f"seed {SEED} (ORCHESTRATOR_DIFF_SEED={SEED} replays it): "
                               + "\n".join(map(str, disagreements)))


@needs_qa
def test_qa_complete_final_and_error_models_agree(qa):
    server, mock = qa
    x = {"INPUT0": np.float32([[123.5]])}
    assert mock_stream(mock, "response_sender_complete_final", x) == real_stream(server.grpc_url, "response_sender_complete_final", x) \
        == [({"OUTPUT0": [[123.5]]}, True)]
    assert "Test Passed" in [r.message for r in mock.logs if r.model == "response_sender_complete_final"]
    # a non-decoupled model that sends, then calls a close() the sender does not have
    x = {"INPUT0": np.ones(16, np.float32), "INPUT1": np.ones(16, np.float32)}
    fake = mock_stream(mock, "response_sender_error", x)
    assert fake == real_stream(server.grpc_url, "response_sender_error", x)
    assert fake == [({"OUTPUT0": [2.0] * 16, "OUTPUT1": [0.0] * 16}, False)]
    grpc, http = real_unary(server, "response_sender_error", x)
    assert mock_unary(mock, "response_sender_error", x) == grpc == http == ("error", "expected a single response, got 2")
