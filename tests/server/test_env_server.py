"""A model in a packed env of another CPython version than the server's, in a real server.

The env is the 3.12 one (3.11 when the server itself runs 3.12) with the matching stub in
its model directory; tritonclient checks that the model really ran that interpreter and a
package only that env has, and that numpy 2 in the env loses every output (Triton 2.51).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.tooling.env import install
from tests.envhelpers import ENV_PY, SERVER_PY, probe_repo


def test_model_runs_in_env_of_another_python_version(packed_env, packed_env_numpy2, tmp_path):
    import tritonclient.http as httpclient

    from orchestrator.tooling.env import doctor
    from orchestrator.tooling.server import TritonServer

    repo = probe_repo(probe_repo(tmp_path / "repo"), "probe_numpy2")
    install.install_env(repo, ["probe"], tarball=packed_env.path, base_config_name=None)
    install.install_env(repo, ["probe_numpy2"], tarball=packed_env_numpy2.path, base_config_name=None)
    x = np.array([[1.0, 2.0], [3.0, 4.5]], dtype=np.float32)

    def infer(client, model, outputs=("Y", "VERSION", "DETAILS")):
        inp = httpclient.InferInput("X", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp], outputs=[httpclient.InferRequestedOutput(o) for o in outputs])

    with TritonServer(repo, models=["probe", "probe_numpy2"], model_config_name="env") as server:
        client = server.client()
        try:
            result = infer(client, "probe")
            np.testing.assert_allclose(result.as_numpy("Y"), x * 3)
            versions = {v.decode() for v in result.as_numpy("VERSION").ravel()}
            assert len(versions) == 1 and versions.pop().startswith(ENV_PY + ".")
            details = json.loads(result.as_numpy("DETAILS")[0, 0])
            # The env's own interpreter, found on PATH after `source bin/activate`: the
            # embedded server's stub environment (first on PATH before) did not hijack it.
            assert details["executable"].startswith("/tmp/python_env_") and details["executable"].endswith("/bin/python3")
            assert details["probe"] == f"envprobe-0.1.0 on Python {packed_env.python}"
            assert details["numpy"] == "1.26.4"
            # numpy 2 under this stub (pybind11 2.10): every output leaves the stub with
            # 0 bytes, BYTES and FP32 alike, under the right shape.
            broken = infer(client, "probe_numpy2")
            for name in ("Y", "VERSION", "DETAILS"):
                output = broken.get_output(name)
                assert output["shape"] == [2, 2 if name == "Y" else 1]
                assert output["parameters"]["binary_data_size"] == 0
                with pytest.raises(ValueError, match="cannot reshape array of size 0"):
                    broken.as_numpy(name)
        finally:
            client.close()
    reports = {r.name: r for r in doctor.diagnose(repo, "env")[0]}
    assert reports["probe"].healthy and reports["probe"].env_python == ENV_PY
    assert [f.kind for f in reports["probe_numpy2"].findings if f.is_problem] == ["numpy"]

    # The same model directory with its default config (no env): the dispatcher runs the
    # server's stub, so the model runs on the server's Python, without envprobe.
    assert all(r.healthy for r in doctor.diagnose(repo, None)[0])
    with TritonServer(repo, models=["probe"], model_config_name=None) as server:
        client = server.client()
        try:
            result = infer(client, "probe")
            assert result.as_numpy("VERSION")[0, 0].decode().startswith(SERVER_PY + ".")
            assert json.loads(result.as_numpy("DETAILS")[0, 0])["probe"] is None
            np.testing.assert_allclose(result.as_numpy("Y"), x * 3)
        finally:
            client.close()


