"""The models' metric families on the embedded Triton 2.51's /metrics and in
``MockTriton.metrics_text()``: each family's ``# HELP``/``# TYPE`` lines and each series'
lines the same, byte for byte. The order of families and of a family's series is compared
apart: the server's is its hash maps' (a documented difference)."""

from __future__ import annotations

import shutil
import urllib.request
from typing import Dict

import numpy as np
import pytest
import tritonclient.http as httpclient

from orchestrator.testing.mock import MockTriton
from orchestrator.tooling.server import TritonServer
from tests.mock.test_metrics_text import REPO, VALUES, run

pytestmark = pytest.mark.server


def _blocks(text: str, prefix: str) -> Dict[str, tuple]:
    """Family name -> (its header text, its series: each one's lines, sorted) for families
    ``prefix*`` (a family's block runs from its ``# HELP`` to the next)."""
    out: Dict[str, tuple] = {}
    for block in ("\n" + text).split("\n# HELP ")[1:]:
        name = block.split(" ", 1)[0]
        if not name.startswith(prefix):
            continue
        header, _, body = block.partition(f"\n# TYPE {name} ")
        kind, _, samples = body.partition("\n")
        series: Dict[str, list] = {}
        for line in samples.strip("\n").splitlines():
            labels = line[line.find("{"):line.rfind("}") + 1] if "{" in line else ""
            key = ",".join(p for p in labels.strip("{}").split(",") if not p.startswith("le="))
            series.setdefault(key, []).append(line)
        out[name] = (header, kind, sorted(series.values()))
    return out


def test_metric_families_agree_with_the_server(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo)
    with TritonServer(repo, models=["mx"], model_config_name=None) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        for x in VALUES:
            request = httpclient.InferInput("X", [1], "FP64")
            request.set_data_from_numpy(np.array([x]))
            client.infer("mx", [request])
        client.close()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        real = opener.open(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    with MockTriton(repo, model_config_name=None, models=["mx"]) as mock:
        run(mock)
        fake = mock.metrics_text()
    assert _blocks(fake, "mx_") == _blocks(real, "mx_")
    assert "mx_empty" not in real and "mx_empty" not in fake
