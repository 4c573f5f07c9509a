"""The shipped ``config.pbtxt`` files served by Triton's own ONNX Runtime backend, answer for
answer against the embedded configs (``--model-config-name=embedded``: the classifiers as
Python models running onnxruntime).

Every other test serves the embedded configs, because the nvidia-pytriton wheel has no
``onnxruntime`` backend. These tests run when ``ORCHESTRATOR_ORT_BACKEND_DIR`` names a backend
directory holding ``onnxruntime/libtriton_onnxruntime.so`` built for Triton 2.51 (r24.10)
(docs/guides/gpu.md, "Serving the production configs with Triton's ONNX Runtime backend");
without it they skip, saying so. A variable naming a directory without that backend fails.

Two servers run side by side on the same copy of the repository: the native one reads
``config.pbtxt`` (no ``--model-config-name``) with the onnxruntime backend beside the
Python backend, the embedded one reads ``configs/embedded.pbtxt``. Both classifiers' paths
end in the same ``libonnxruntime`` (the native backend is linked against the library the
``onnxruntime`` wheel carries) on the CPU execution provider, with the same ONNX files and
the same token ids, one request at a time (so dynamic batching forms the same batches), so
every answer is expected bit for bit, not within a tolerance.

On a machine with a GPU the shipped repository is served as it is (``KIND_GPU``); CUDA
kernels sum in another order than the CPU's, so floats are then compared within
:data:`GPU_ATOL`, an allowance not yet checked on a GPU (docs/guides/gpu.md says
``KIND_GPU`` is untested); verdicts and routes are still compared exactly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from orchestrator.tooling import repository
from orchestrator.tooling.modeling import data
from orchestrator.tooling.serve import cpu_instance_copy
from orchestrator.tooling.server import TritonServer
from tests.helpers import REPO, call

ENV = "ORCHESTRATOR_ORT_BACKEND_DIR"
SECTION = "docs/guides/gpu.md, 'Serving the production configs with Triton's ONNX Runtime backend'"
BACKEND_DIR = os.environ.get(ENV, "")

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        not BACKEND_DIR,
        reason=f"{ENV} is not set: it names a backend directory holding onnxruntime/libtriton_onnxruntime.so "
        f"built for Triton 2.51 ({SECTION})",
    ),
]

CLASSIFIERS = ("classifier", "classifier_fast", "classifier_fp16")
BATCH = 16  # texts a request
GPU_ATOL = 1e-4  # see the module doc


def gpu_present() -> bool:
    """True when ``nvidia-smi -L`` lists a GPU."""
    if not shutil.which("nvidia-smi"):
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


@pytest.fixture(scope="module")
def texts():
    """64 held-out texts, one empty text and two long ones (chunked by the router)."""
    reviews = data.held_out_texts(n=40, corpus="movie_reviews", seed=24)
    long_texts = [" ".join(reviews[:20]), " ".join(reviews[20:])]
    return data.held_out_texts(n=64, seed=24) + [""] + long_texts


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The served repository. Without a GPU, a copy of model_repository whose KIND_GPU
    instance groups are KIND_CPU: Triton refuses a KIND_GPU model on a machine without a
    GPU ("no GPUs are available") and has no flag to override the kind, so the only change
    is the kind, made on a copy (cpu_instance_copy) because the shipped files must stay as
    they ship; everything else (ONNX files, warmup data, policy, labels) is copied as it
    is. With a GPU, the shipped repository itself."""
    directory = Path(BACKEND_DIR)
    if not (directory / "onnxruntime" / "libtriton_onnxruntime.so").is_file():
        pytest.fail(f"{ENV}={BACKEND_DIR} holds no onnxruntime/libtriton_onnxruntime.so ({SECTION})")
    if gpu_present():
        return REPO
    dest = tmp_path_factory.mktemp("native") / "model_repository"
    changed = cpu_instance_copy(REPO, dest)
    assert sorted(p.parent.name for p in changed if p.name == "config.pbtxt") == sorted(CLASSIFIERS)
    return dest


def start(server: TritonServer) -> tuple:
    """Start ``server``; return it and each model's inference statistics right after
    start, before any client request (what warmup executed)."""
    server.start()
    client = server.client()
    try:
        stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    finally:
        client.close()
    return server, stats


@pytest.fixture(scope="module")
def atol(repo):
    return 0.0 if repo != REPO else GPU_ATOL


@pytest.fixture(scope="module")
def native(repo):
    server, stats = start(TritonServer(repo, model_config_name=None, backend_dirs=[BACKEND_DIR]))
    yield server, stats
    server.stop()


@pytest.fixture(scope="module")
def embedded(repo):
    server, stats = start(TritonServer(repo, model_config_name="embedded"))
    yield server, stats
    server.stop()


def config_of(server, model):
    client = server.client()
    try:
        return client.get_model_config(model)
    finally:
        client.close()


def logits(server, model, ids, mask):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    inputs = [httpclient.InferInput("input_ids", list(ids.shape), "INT64"),
              httpclient.InferInput("attention_mask", list(mask.shape), "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask)
    try:
        return client.infer(model, inputs).as_numpy("logits")
    finally:
        client.close()


def answers(server, model, texts, parameters=None) -> dict:
    """Every output of ``model`` for ``texts``, sent BATCH texts a request, in order, one
    request at a time; outputs concatenated along the batch."""
    parts: dict = {}
    for start_ in range(0, len(texts), BATCH):
        out = call(server, model, texts[start_ : start_ + BATCH], parameters=parameters)
        for name, value in out.items():
            parts.setdefault(name, []).append(value)
    return {name: np.concatenate(values) for name, values in parts.items()}


def assert_same(native_out: dict, embedded_out: dict, what: str, atol: float = 0.0) -> None:
    assert sorted(native_out) == sorted(embedded_out), what
    for name in native_out:
        a, b = native_out[name], embedded_out[name]
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name, a.dtype, b.dtype, a.shape, b.shape)
        if a.dtype.kind == "f":
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            assert (np.array_equal(a, b) if atol == 0.0 else diff <= atol), f"{what} {name}: max abs diff {diff}"
        else:
            assert np.array_equal(a, b), f"{what} {name}: {a.reshape(-1)[:8]} != {b.reshape(-1)[:8]}"


def test_the_classifiers_are_served_by_the_onnxruntime_backend(native, embedded, repo):
    """What is compared is what it says: config.pbtxt through Triton's onnxruntime backend
    against configs/embedded.pbtxt through the Python backend."""
    for model in CLASSIFIERS:
        served = config_of(native[0], model)
        assert (served["platform"], served["backend"]) == ("onnxruntime_onnx", "onnxruntime"), served
        kinds = {g["kind"] for g in served["instance_group"]}
        assert kinds == ({"KIND_GPU"} if repo == REPO else {"KIND_CPU"}), kinds
        assert config_of(embedded[0], model)["backend"] == "python"


def test_every_model_is_ready_and_ran_its_warmup(native, repo):
    """All models of config.pbtxt are READY, and every model with a warmup sample executed it
    while loading (its statistics before any client request: one execution)."""
    server, stats = native
    index = {m["name"]: m.get("state") for m in server.repository_index()}
    expected = repository.list_models(repo, None)
    assert len(expected) == 7 and all(index.get(m) == "READY" for m in expected), index
    for model in expected:
        warmed = bool(repository.read_config(repo / model / "config.pbtxt").model_warmup)
        counts = (stats[model]["execution_count"], stats[model]["inference_stats"]["success"]["count"])
        assert counts == ((1, 1) if warmed else (0, 0)), (model, counts)
    assert any(repository.read_config(repo / m / "config.pbtxt").model_warmup for m in CLASSIFIERS)


@pytest.mark.parametrize(
    "model,parameters",
    [("ensemble", None), ("router", None), ("router", {"route": "fast"}), ("router", {"route": "accurate"})],
    ids=["ensemble", "router", "router-route-fast", "router-route-accurate"],
)
def test_answers_are_bit_identical_to_the_embedded_configs(native, embedded, texts, atol, model, parameters):
    """PROBABILITIES, VERDICTS and (router) ROUTE of every text, chunked long texts and the
    empty text included."""
    mine = answers(native[0], model, texts, parameters)
    theirs = answers(embedded[0], model, texts, parameters)
    assert mine["PROBABILITIES"].shape[0] == len(texts)
    if model == "router":
        routes = {r.decode().split(":")[0] for r in mine["ROUTE"].reshape(-1)}
        assert "empty" in routes and "chunked" in routes, routes
    assert_same(mine, theirs, f"{model} {parameters}", atol)


def test_classifier_logits_are_bit_identical(native, embedded, texts, atol):
    """Each classifier, asked directly with the tokenizer's ids (padded batches of BATCH)."""
    for start_ in range(0, 64, BATCH):
        batch = texts[start_ : start_ + BATCH]
        tokens = call(embedded[0], "tokenizer", batch, thr_array=False)
        assert_same(call(native[0], "tokenizer", batch, thr_array=False), tokens, "tokenizer")
        ids, mask = tokens["input_ids"], tokens["attention_mask"]
        assert (mask == 0).any(), "a batch without padding would not test the mask"
        for model in CLASSIFIERS:
            a, b = logits(native[0], model, ids, mask), logits(embedded[0], model, ids, mask)
            assert a.dtype == np.float32 and a.shape == (len(batch), 1)
            diff = float(np.max(np.abs(a - b)))
            assert (np.array_equal(a, b) if atol == 0.0 else diff <= atol), f"{model}: max abs diff {diff}"
