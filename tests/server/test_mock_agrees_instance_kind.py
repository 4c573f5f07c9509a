"""python_backend's ``examples/instance_kind`` (``ORCHESTRATOR_PYTHON_BACKEND_SRC``),
unmodified, through the pytest plugin and on the embedded Triton 2.51: the same answers.

The example loads ResNet-50 with ``torch.hub.load("pytorch/vision:v0.14.1", ...,
weights="IMAGENET1K_V2")``; both run it with ``TORCH_HOME`` pointing at a local hub
cache (tests/torch_hub_standin.py: a torch-only ResNet-50 with torchvision's layout and a
checkpoint of deterministic random weights standing in for ImageNet's), so nothing is
downloaded. Needs torch (the ``train`` extra).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from orchestrator.tooling.server import TritonServer
from tests.upstream_examples import needs_upstream, upstream_repository

pytestmark = [pytest.mark.server, needs_upstream]


def test_instance_kind_answers_alike(tmp_path, monkeypatch, triton_mock_factory):
    pytest.importorskip("torch", reason="examples/instance_kind needs torch (the `train` extra)")
    from tests.torch_hub_standin import prepare_torch_home

    home = prepare_torch_home(tmp_path / "torch_home")
    monkeypatch.setenv("TORCH_HOME", str(home))  # the mock runs the model in this process
    repo = upstream_repository(tmp_path / "repo", names={"resnet50"}, pytorch_standin=False)
    images = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)

    mock = triton_mock_factory(repo, load=["resnet50"])
    fake = mock.infer("resnet50", {"INPUT": images})["OUTPUT"]
    assert fake.shape == (2, 1000) and fake.dtype == np.float32
    assert not np.array_equal(fake[0], fake[1])
    with TritonServer(repo, models=["resnet50"], model_config_name=None, env={"TORCH_HOME": str(home)}) as server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        try:
            request = httpclient.InferInput("INPUT", list(images.shape), "FP32")
            request.set_data_from_numpy(images)
            real = client.infer("resnet50", [request]).as_numpy("OUTPUT")
            # and one image alone
            one = httpclient.InferInput("INPUT", [1, 3, 224, 224], "FP32")
            one.set_data_from_numpy(images[:1])
            real_one = client.infer("resnet50", [one]).as_numpy("OUTPUT")
        finally:
            client.close()
    np.testing.assert_array_equal(fake, real)  # the same torch on the same CPU: bit-identical
    np.testing.assert_array_equal(mock.infer("resnet50", {"INPUT": images[:1]})["OUTPUT"], real_one)
