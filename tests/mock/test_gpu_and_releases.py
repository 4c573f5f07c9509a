"""GPU outputs and release profiles in the mock: the router asks every BLS call for CPU
outputs (a KIND_GPU classifier's answer would otherwise be a GPU tensor, which ``as_numpy()``
refuses with python_backend's own message), and it uses newer python_backend features
(response parameters, ``is_ready()``) only where the stub has them (orchestrator.runtime
.releases), behaving as before on the 2.51 profile."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.runtime.serving.releases import route_parameters
from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.testing.mock import pb_utils as mock_pb
from orchestrator.testing.mock.releases import resolve
from orchestrator.testing.mock.tensors import GPU_AS_NUMPY
from tests.helpers import REPO, ROOT, STRICT_VARIANT, add_router_variant, without_fallbacks

CLASSIFIERS = ("classifier", "classifier_fast")
TEXTS = ["A gorgeous, witty film.", "Not worth the ticket.", "plain"]


def gpu_repository(dest: Path) -> Path:
    """A copy of the repository whose classifiers' embedded configs are KIND_GPU (gpus: [0])."""
    repo = dest / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    for name in CLASSIFIERS:
        path = repo / name / "configs" / "embedded.pbtxt"
        text, n = re.subn(r"kind: KIND_CPU", "kind: KIND_GPU\n  gpus: 0", path.read_text())
        assert n == 1, path
        path.write_text(text)
    add_router_variant(repo, STRICT_VARIANT, without_fallbacks(yaml.safe_load((REPO / "router" / "policy.yaml").read_text())))
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return gpu_repository(tmp_path_factory.mktemp("gpu"))


def inputs(texts, threshold=0.5):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    return {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), threshold, np.float32)}


def classifier_request(pb):
    ids = np.array([[101, 2023, 102]], dtype=np.int64)
    return dict(model_name="classifier", requested_output_names=["logits"],
                inputs=[pb.Tensor("input_ids", ids), pb.Tensor("attention_mask", np.ones_like(ids))])


# -- the mock's GPU tensors, as python_backend r24.10 (pb_tensor.cc, request_executor.cc)


def test_gpu_output_refuses_as_numpy_unless_cpu_memory_was_asked_for(repo):
    pb = mock_pb.install()
    assert GPU_AS_NUMPY == "Tensor is stored in GPU and cannot be converted to NumPy."
    with MockTriton(repo, models=["classifier"]) as mock:
        assert mock.instance("classifier") is not None
        [gpu] = pb.InferenceRequest(**classifier_request(pb)).exec().output_tensors()
        assert not gpu.is_cpu() and gpu.__dlpack_device__() == (2, 0)
        with pytest.raises(pb.TritonModelException, match=re.escape(GPU_AS_NUMPY)):
            gpu.as_numpy()
        cpu_memory = pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0)
        [cpu] = pb.InferenceRequest(preferred_memory=cpu_memory, **classifier_request(pb)).exec().output_tensors()
        assert cpu.is_cpu() and cpu.as_numpy().shape == (1, 1) and cpu.as_numpy().dtype == np.float32
        # a client request is answered over the wire: CPU memory
        out = mock.infer("classifier", {"input_ids": np.array([[101, 2023, 102]], np.int64),
                                        "attention_mask": np.ones((1, 3), np.int64)})
        np.testing.assert_array_equal(out["logits"], cpu.as_numpy())
        with pytest.raises(TypeError, match="incompatible constructor arguments"):
            pb.PreferredMemory(None, 0)
        with pytest.raises(TypeError, match="incompatible constructor arguments"):
            pb.InferenceRequest(preferred_memory="CPU", **classifier_request(pb))


def test_router_answers_with_kind_gpu_classifiers(repo):
    with MockTriton(repo) as mock:
        for name in ("classifier", "classifier_fast", "router", STRICT_VARIANT):
            mock.load(name)
        for model in ("router", STRICT_VARIANT):
            for parameters in (None, {"route": "fast"}, {"route": "accurate"}):
                out = mock.infer(model, inputs(TEXTS), parameters)
                assert out["PROBABILITIES"].shape == (3, 1)
                routes = [r.decode() for r in out["ROUTE"].ravel()]
                assert not any("degraded" in r for r in routes), routes  # no model failed


def test_a_bls_call_without_cpu_memory_fails_on_a_kind_gpu_model(repo, monkeypatch):
    """What happens if a call site forgets ``preferred_memory``: the classifier's GPU output
    cannot be read, and the request (no fallback) fails naming python_backend's message."""
    pb = mock_pb.install()
    real = pb.InferenceRequest

    class Forgetful(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            kwargs.pop("preferred_memory", None)
            super().__init__(*args, **kwargs)

    with MockTriton(repo) as mock:
        for name in ("classifier", "classifier_fast", STRICT_VARIANT):
            mock.load(name)
        assert mock.infer(STRICT_VARIANT, inputs(TEXTS[:1]))["ROUTE"].shape == (1, 1)
        monkeypatch.setattr(pb, "InferenceRequest", Forgetful)
        with pytest.raises(InferError) as err:
            mock.infer(STRICT_VARIANT, inputs(TEXTS[:1]))
        assert GPU_AS_NUMPY in err.value.message


def test_every_bls_request_in_the_runtime_asks_for_cpu_memory():
    """Each ``InferenceRequest(...)`` built in orchestrator/runtime passes ``preferred_memory``
    (a new call site without it fails here before any GPU run)."""
    calls = []
    for path in (ROOT / "orchestrator" / "runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "InferenceRequest":
                calls.append((path.name, node.lineno, {k.arg for k in node.keywords}))
    assert calls, "no InferenceRequest call found"
    for name, line, keywords in calls:
        assert "preferred_memory" in keywords, f"{name}:{line} builds a BLS request without preferred_memory"


# -- release profiles: 24.10 (Triton 2.51) and a current one


def test_profiles_resolve(monkeypatch):
    assert resolve("2.51") == "24.10" and resolve("26.08") == "26.08"
    monkeypatch.setenv("MOCK_TRITON_RELEASE", "26.08")
    assert resolve(None) == "26.08"
    with pytest.raises(ValueError, match="unknown mock release '25.99'"):
        resolve("25.99")


@pytest.mark.parametrize("release", ["24.10", "26.08"])
def test_router_on_both_profiles(repo, release):
    """Same answers on both; response parameters with the route only where the stub has them."""
    pb = mock_pb.install()
    with MockTriton(repo, release=release) as mock:
        for name in ("classifier", "classifier_fast", "router"):
            mock.load(name)
        newer = release == "26.08"
        if not newer:
            with pytest.raises(TypeError, match="incompatible constructor arguments"):
                pb.InferenceResponse(output_tensors=[], parameters={"a": 1})
        for texts, parameters in ((TEXTS[:1], None), (TEXTS, None), (TEXTS, {"route": "fast"}), (["", "x"], None)):
            out, params = mock.infer_response("router", inputs(texts), parameters)
            routes = [r.decode() for r in out["ROUTE"].ravel()]
            assert params == (route_parameters(routes) if newer else {})
            if newer:
                assert params["route"] == (routes[0] if len(set(routes)) == 1 else json.dumps(routes))
        with MockTriton(repo, release="24.10") as old:  # the same answers on 2.51
            for name in ("classifier", "classifier_fast", "router"):
                old.load(name)
            a = mock.infer("router", inputs(TEXTS))
            b = old.infer("router", inputs(TEXTS))
        for key in ("PROBABILITIES", "VERDICTS", "ROUTE"):
            np.testing.assert_array_equal(a[key], b[key])


def test_route_parameters_flags():
    assert route_parameters(["classifier_fast"]) == {"route": "classifier_fast"}
    got = route_parameters(["chunked:classifier:windows=2/5", "classifier_fast:degraded", "classifier_fast:deadline",
                            "chunked:classifier:windows=1/3"])
    assert got == {
        "route": json.dumps(["chunked:classifier:windows=2/5", "classifier_fast:degraded", "classifier_fast:deadline",
                             "chunked:classifier:windows=1/3"]),
        "degraded": True, "deadline": True, "windows_used": 3, "windows_made": 8,
    }


def open_circuits(router, models):
    for model in models:
        for _ in range(50):
            if router.downstream.breaker.state(model).value == "open":
                break
            router.downstream.breaker.on_failure(model, "injected by the test")
        assert router.downstream.breaker.state(model).value == "open"


@pytest.mark.parametrize("release", ["24.10", "26.08"])
def test_router_readiness_hook(repo, release):
    """r26.03 and later ask the router's is_ready(): not ready while its policy cannot answer
    (a required model missing; every model's circuit open); 2.51 never asks."""
    newer = release == "26.08"
    with MockTriton(repo, release=release) as mock:
        for name in ("classifier", "classifier_fast", "router", STRICT_VARIANT):
            mock.load(name)
        assert mock.is_model_ready("router") and mock.is_model_ready(STRICT_VARIANT)
        mock.unload("classifier")  # required by the strict variant; the shipped one degrades
        assert mock.is_model_ready("router")
        assert mock.is_model_ready(STRICT_VARIANT) is (not newer)
        mock.load("classifier")
        assert mock.is_model_ready(STRICT_VARIANT)
        open_circuits(mock.instance("router"), CLASSIFIERS)  # every route's circuit open
        assert mock.is_model_ready("router") is (not newer)
        if newer:
            assert any("not ready: no model can answer" in r.message for r in mock.logs if r.model == "router")


def test_python_models_keep_their_inputs_in_cpu_memory():
    """python_backend moves a Python model's inputs to CPU unless its config sets
    FORCE_CPU_ONLY_INPUT_TENSORS "no" (r24.10 python_be.cc; default "yes"): every shipped
    Python model reads its inputs with as_numpy(), so none may turn it off."""
    from orchestrator.tooling import repository

    checked = []
    for model_dir in sorted(p for p in REPO.iterdir() if p.is_dir()):
        for path in repository.model_config_paths(model_dir):
            config = repository.read_config(path)
            if repository.is_python_model(config):
                assert repository.get_parameter(config, "FORCE_CPU_ONLY_INPUT_TENSORS") in (None, "yes"), path
                checked.append(model_dir.name)
    assert {"router", "tokenizer", "postprocess", "classifier"} <= set(checked)


def test_required_and_answering_models_of_a_policy():
    """What the readiness hook checks: BLS tokenizers and models outside fallbacks are
    required; a shadow candidate neither answers nor is required; tokenizers never answer."""
    from orchestrator.runtime.bls.downstream import _answer_models
    from orchestrator.runtime.routing.policy import parse_policy

    shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    assert _answer_models(parse_policy(shipped)) == ([], ["classifier_fast", "classifier"])
    strict = {k: v for k, v in shipped.items() if k != "inline"}
    strict["root"] = {"kind": "shadow", "name": "mirror", "primary": without_fallbacks(shipped["root"]),
                      "candidate": {"kind": "model", "name": "candidate", "model": "classifier_fp16"}}
    required, answering = _answer_models(parse_policy(strict))
    assert required == ["tokenizer", "classifier_fast", "classifier"]
    assert answering == ["classifier_fast", "classifier"]


def test_gpu_checks_bls_caller_on_the_mock(tmp_path):
    """gpu-check's negative control (lab.gpu_models.BlsCaller) on the mock:
    its KIND_GPU ``gpu_echo`` answers in GPU memory (the mock places it there as the stub does;
    torch is not needed here), and the caller reads it only when it asked for CPU memory."""
    from lab import gpu_check

    repo = gpu_check.probe_repository(tmp_path / "probe")
    (repo / "gpu_echo" / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(\n"
        "            'Y', pb_utils.get_input_tensor_by_name(r, 'X').as_numpy() * 2)]) for r in requests]\n")
    x = np.arange(6, dtype=np.float32)
    with MockTriton(repo) as mock:
        mock.load("gpu_echo")
        mock.load("bls_caller")
        out = mock.infer("bls_caller", {"X": x, "ASK_CPU": np.array([True])})
        np.testing.assert_array_equal(out["Y"], 2 * x)
        with pytest.raises(InferError) as refused:
            mock.infer("bls_caller", {"X": x, "ASK_CPU": np.array([False])})
    assert GPU_AS_NUMPY in str(refused.value) and "is_cpu=False" in str(refused.value)
