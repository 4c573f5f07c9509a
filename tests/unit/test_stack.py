"""The "stack" of the benchmark and soak reports (lab.bench.stack): what a
server serves, read from its metadata and model configurations, whether the tool started the
server or was pointed at one with --url; and the soak's fault steps left out against a server
it did not start."""

from __future__ import annotations

import pytest

from lab.bench import stack as S
from lab.soak import runner
from orchestrator.testing.mock import MockTriton
from tests.helpers import REPO

META = {"name": "triton", "version": "2.51.0", "extensions": ["classification", "model_repository", "parameters"]}


class MockClient:
    """tritonclient.http's InferenceServerClient, answered from a MockTriton (real configs)."""

    mock: MockTriton
    meta = META

    def __init__(self, url, **kwargs):
        self.url = url

    def get_server_metadata(self):
        return dict(self.meta)

    def get_model_repository_index(self, headers=None):
        return self.mock.repository_index()

    def get_model_config(self, name, headers=None):
        return self.mock.model_config(name)

    def close(self):
        pass


@pytest.fixture
def mock_client(monkeypatch):
    import tritonclient.http as httpclient

    with MockTriton(REPO, models=["classifier", "classifier_fast", "router"]) as mock:
        MockClient.mock = mock
        monkeypatch.setattr(httpclient, "InferenceServerClient", MockClient)
        yield mock


def test_read_stack_from_the_embedded_configs(mock_client):
    server = S.ExternalServer(http_url="127.0.0.1:9")
    got = S.read_stack(server, embedded=True)
    assert got["server"] == {"name": "triton", "version": "2.51.0", "extensions": META["extensions"]}
    assert sorted(got["models"]) == ["classifier", "classifier_fast", "router"]  # READY ones only
    assert got["models"]["classifier"]["instance_groups"] == [{"kind": "KIND_CPU", "count": 1, "gpus": []}]
    assert got["models"]["router"]["backend"] == "python"
    assert S.describe(got) == "embedded Triton 2.51.0, classifiers: python backend (onnxruntime in Python), CPU"
    table = S.markdown(got)
    assert "| classifier | 1 | python backend (onnxruntime in Python) | 1x KIND_CPU |" in table
    assert "extensions: classification, model_repository, parameters" in table[2]


def native_gpu_config(name):
    return {"name": name, "backend": "onnxruntime", "platform": "onnxruntime_onnx",
            "instance_group": [{"name": name, "kind": "KIND_GPU", "count": 2, "gpus": [0]}]}


def test_describe_an_external_native_gpu_stack():
    stack = {"embedded": False, "url": "gpu-node:8001", "server": {"version": "2.72.0", "extensions": []},
             "models": {n: S.model_summary(native_gpu_config(n), "1") for n in ("classifier", "classifier_fast")}}
    assert S.describe(stack) == "server at gpu-node:8001 (Triton 2.72.0), classifiers: onnxruntime backend, GPU"
    assert "| classifier | 1 | onnxruntime backend | 2x KIND_GPU gpus [0] |" in S.markdown(stack)
    assert S.header_line(stack).startswith("Stack: **server at gpu-node:8001 (Triton 2.72.0)")
    assert S.header_line(None) == f"Stack: **{S.LEGACY}** (a run from before the stack was read from the server)."
    empty = {**stack, "models": {"router": S.model_summary({"backend": "python"})}}
    assert S.describe(empty).endswith("classifiers: none of classifier, classifier_fast, classifier_fp16 loaded")


def test_parse_urls():
    both = S.parse_urls(["http://h:8000", "grpc://h:8001"], probe=False)
    assert (both.http_url, both.grpc_url, both.pid, both.external) == ("h:8000", "h:8001", None, True)
    assert S.parse_urls(["h:8001"], probe=False).grpc_url == "h:8001"  # bare, not asked: gRPC
    for bad, message in ((["h"], "expected host:port"), (["ftp://h:1"], "scheme must be http or grpc"),
                         (["grpc://a:1", "grpc://b:2"], "given twice"), ([], "no --url")):
        with pytest.raises(S.StackError, match=message):
            S.parse_urls(bad, probe=False)
    with pytest.raises(S.StackError, match="needs the server's grpc port"):
        S.server_or_url(["http://h:8000"], lambda: None, need="grpc")
    started = object()
    assert S.server_or_url([], lambda: started) is started


def test_served_names_the_missing_models():
    stack = {"url": "h:1", "models": {"router": {}}}
    S.served(stack, ["router"], "hint")
    with pytest.raises(S.StackError, match=r"does not serve router_single, ensemble \(READY\): load it"):
        S.served(stack, ["router", "router_single", "ensemble"], "load it")


class _Pool:
    texts: list = []


def test_soak_leaves_out_the_local_fault_steps_against_an_external_server():
    external = runner.Soak(S.ExternalServer(http_url="h:1", grpc_url="h:2"), runner.SHORT, _Pool(), 0.15)
    assert set(external.not_run) == {"classifier_unloaded", "stub_killed", "router_reload", "oversized"}
    assert "needs the server's processes on this machine" in external.not_run["stub_killed"]

    class Started:
        pid = 1

    assert runner.Soak(Started(), runner.SHORT, _Pool(), 0.15).not_run == {}
