"""The image's start-up, run here: deploy/entrypoint.sh (the image's CMD) starts the embedded
tritonserver with the environment the cpu overlay gives the container (rendered with
kubectl kustomize) and an admin key in a file as the Secret mounts it, on loopback ports.
There is no Docker engine on these machines, so the image itself is not built; this runs the
same script with the same variables against Triton 2.51 (the embedded server; the image is
NGC 26.08, Triton 2.72): the admin APIs refuse a request without the key and serve one with
it, the router answers inference as before, and 2.51 gets no --http-max-input-size.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from orchestrator.tooling import deploy as D
from orchestrator.tooling import prometheus
from orchestrator.tooling.server import (
    find_embedded_server,
    find_free_ports,
    prepare_backend_directory,
    prepare_stub_environment,
    server_environment,
)
from tests.helpers import ROOT

pytestmark = pytest.mark.server


def overlay_env(overlay: str) -> dict:
    try:
        tools = D.ensure_tools()
    except D.DeployError as exc:
        pytest.fail(f"the deployment validators could not be installed: {exc}", pytrace=False)
    docs = D.documents(D.render(ROOT / "deploy" / overlay, tools))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    return {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def get(url: str, method: str = "GET", headers: Optional[dict] = None, body: Optional[bytes] = None) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


KEY = "entrypoint-test-key_0123456789abcdef"  # in the key file only; must show up in no log
ADMIN = {"admin-key": KEY}


@pytest.fixture(scope="module")
def entrypoint_server(test_repository, tmp_path_factory):
    env_vars = overlay_env("k8s/overlays/cpu")
    assert env_vars["MODEL_CONFIG_NAME"] == "embedded" and env_vars["MODEL_CONTROL_MODE"] == "explicit"
    embedded = find_embedded_server()
    backends = prepare_backend_directory(embedded=embedded)
    http, grpc, metrics = find_free_ports(3)
    env = server_environment(
        embedded,
        {
            **env_vars,
            "MODEL_REPOSITORY": str(test_repository),  # /models in the image
            "TRITONSERVER": str(embedded.server),
            "BIND_ADDRESS": "127.0.0.1",
            "HTTP_PORT": str(http), "GRPC_PORT": str(grpc), "METRICS_PORT": str(metrics),
            "LOG_VERBOSE": "1",  # the key must stay out of Triton's verbose log too
        },
        stub_env=prepare_stub_environment(),
    )
    assert env["HTTP_MAX_INPUT_SIZE"] == str(D.http_max_input_size()) and "TRITON_SERVER_VERSION" not in env
    where = tmp_path_factory.mktemp("entrypoint")
    key_file = where / "secret" / "admin-key"  # /var/run/secrets/orchestrator/admin/admin-key in the pod
    key_file.parent.mkdir()
    key_file.write_text(KEY + "\n")
    env["TRITON_ADMIN_KEY_FILE"] = str(key_file)
    log = where / "tritonserver.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "deploy" / "entrypoint.sh"), f"--backend-directory={backends}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    base = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 240
        while get(f"{base}{D.READY_PATH}") != 200:  # the manifests' readiness probe
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the entrypoint's server did not get ready (status {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield {"proc": proc, "env": env_vars, "http": http, "grpc": grpc, "metrics": metrics, "log": log}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_entrypoint_execs_tritonserver_with_explicit_control_and_the_load_list(entrypoint_server):
    proc = entrypoint_server["proc"]
    argv = open(f"/proc/{proc.pid}/cmdline", "rb").read().split(b"\0")
    assert argv[0].decode().endswith("/tritonserver")  # exec'd: the shell's pid is the server's
    flags = {a.decode() for a in argv}
    want = entrypoint_server["env"]["LOAD_MODELS"].split(",")
    assert {"--model-control-mode=explicit", "--model-config-name=embedded", "--strict-readiness=true", "--allow-metrics=true"} <= flags
    assert {f"--load-model={m}" for m in want} <= flags
    groups = "model-repository,model-config,shared-memory,statistics,trace,logging"
    assert {f"--http-restricted-api={groups}:admin-key={KEY}", f"--grpc-restricted-protocol={groups}:admin-key={KEY}"} <= flags
    # Triton 2.51 has no --http-max-input-size: the entrypoint asked the binary and left it out
    assert not [f for f in flags if f.startswith("--http-max-input-size")]
    assert "has no --http-max-input-size" in entrypoint_server["log"].read_text()
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{entrypoint_server['http']}")
    try:
        ready = {m["name"] for m in client.get_model_repository_index(headers=ADMIN) if m.get("state") == "READY"}
    finally:
        client.close()
    assert ready == set(want)  # the always-on models, nothing else (no ensemble, no tokenizer)
    assert get(f"http://127.0.0.1:{entrypoint_server['http']}/v2/health/live") == 200


def test_the_entrypoints_server_answers_over_http_and_grpc_and_serves_metrics(entrypoint_server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    metrics_url = f"http://127.0.0.1:{entrypoint_server['metrics']}/metrics"

    def router_successes():
        return prometheus.value(prometheus.scrape(metrics_url), "nv_inference_request_success", model="router", version="1")

    before = router_successes()  # the router's warmup sample counts as one
    texts = np.array([[b"A gorgeous, witty film."], [b""]], dtype=np.object_)
    thr = np.full((2, 1), 0.5, dtype=np.float32)
    routes = []
    for tc, url in ((httpclient, f"127.0.0.1:{entrypoint_server['http']}"), (grpcclient, f"127.0.0.1:{entrypoint_server['grpc']}")):
        client = tc.InferenceServerClient(url)
        try:
            ins = [tc.InferInput("TEXT", [2, 1], "BYTES"), tc.InferInput("THRESHOLD", [2, 1], "FP32")]
            ins[0].set_data_from_numpy(texts)
            ins[1].set_data_from_numpy(thr)
            r = client.infer("router", ins)
            routes.append([x.decode() for x in r.as_numpy("ROUTE").reshape(-1)])
        finally:
            client.close()
    assert routes[0] == routes[1] and routes[0][1] == "empty" and routes[0][0] in ("classifier_fast", "classifier")
    time.sleep(1.2)  # the router flushes its metrics every 0.5 s
    assert prometheus.value(prometheus.scrape(metrics_url), "orchestrator_requests_total", outcome="success", router="router") == 2
    assert router_successes() - before == 2


def test_the_readiness_probe_follows_the_router_not_every_model(entrypoint_server):
    """Why the probes ask /v2/models/router/ready and not /v2/health/ready (strict readiness),
    measured on Triton 2.51 on the entrypoint's fresh server (this test runs before the other
    admin calls): once any model was unloaded (what the router does to an idle on-demand model)
    or failed to load (an optional on-demand model), /v2/health/ready says not ready for good
    while the router serves; the router's endpoint says ready then, and not ready exactly
    while the router is unloaded."""
    base = f"http://127.0.0.1:{entrypoint_server['http']}"
    admin = {"Content-Type": "application/json", **ADMIN}

    def probes():
        return get(base + D.READY_PATH), get(base + "/v2/health/ready")

    def wait_router(ready):
        deadline = time.monotonic() + 60
        while (get(base + D.READY_PATH) == 200) != ready and time.monotonic() < deadline:
            time.sleep(0.2)

    assert probes() == (200, 200)
    assert get(base + "/v2/repository/models/postprocess/load", "POST", admin, b"{}") == 200
    assert get(base + "/v2/repository/models/postprocess/unload", "POST", admin, b"{}") == 200
    deadline = time.monotonic() + 30
    while get(base + "/v2/models/postprocess/ready") == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert probes() == (200, 400)  # an idle-style unload: the old probe would take a serving pod out
    assert get(base + "/v2/repository/models/router_bad_policy/load", "POST", admin, b"{}") == 400
    assert probes() == (200, 400)  # a failed optional load: the router still serves
    assert get(base + "/v2/repository/models/router/unload", "POST", admin, b"{}") == 200
    wait_router(False)
    assert probes()[0] != 200  # no router: out of service
    assert get(base + "/v2/repository/models/router/load", "POST", admin, b"{}") == 200
    wait_router(True)
    assert probes() == (200, 400)  # back in service by the router's probe; never by the old one


def test_the_admin_apis_refuse_anonymous_requests_and_serve_the_key(entrypoint_server):
    """HTTP: every restricted group answers 403 without the header `admin-key`, and serves the
    request with it; the health, metadata and inference APIs stay open. gRPC: a load without
    the header triton-grpc-protocol-admin-key is refused, with it the model loads. The router
    stays ready and answering through anonymous unload attempts. The key is in no log line."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    base = f"http://127.0.0.1:{entrypoint_server['http']}"
    json_body = {"Content-Type": "application/json"}
    restricted = [
        ("POST", "/v2/repository/index", b"{}"),  # model-repository
        ("POST", "/v2/repository/models/router/unload", b"{}"),
        ("POST", "/v2/repository/models/tokenizer/load", b"{}"),
        ("GET", "/v2/models/router/config", None),  # model-config
        ("GET", "/v2/systemsharedmemory/status", None),  # shared-memory
        ("GET", "/v2/models/router/stats", None),  # statistics
        ("GET", "/v2/trace/setting", None),  # trace
        ("GET", "/v2/logging", None),  # logging
    ]
    for method, path, body in restricted:
        assert get(base + path, method, json_body, body) == 403, path
        assert get(base + path, method, {**json_body, "admin-key": "wrong-" + KEY}, body) == 403, path
    for path in ("/v2/health/live", D.READY_PATH, "/v2", "/v2/models/router"):
        assert get(base + path) == 200, path
    assert get(base + "/v2/models/tokenizer/ready") != 200  # the refused load did nothing

    # with the key: the read-only ones, then a real load and unload (HTTP), over the same APIs
    for method, path, body in restricted:
        if "/load" not in path and "/unload" not in path:
            assert get(base + path, method, {**json_body, **ADMIN}, body) == 200, path
    assert get(base + "/v2/repository/models/tokenizer/load", "POST", {**json_body, **ADMIN}, b"{}") == 200
    assert get(base + "/v2/models/tokenizer/ready") == 200
    assert get(base + "/v2/repository/models/tokenizer/unload", "POST", {**json_body, **ADMIN}, b"{}") == 200

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{entrypoint_server['grpc']}")
    try:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.load_model("tokenizer")
        with pytest.raises(InferenceServerException, match="restricted"):
            client.unload_model("router")
        client.load_model("tokenizer", headers={"triton-grpc-protocol-admin-key": KEY})
        assert client.is_model_ready("tokenizer")
        client.unload_model("tokenizer", headers={"triton-grpc-protocol-admin-key": KEY})
    finally:
        client.close()
    deadline = time.monotonic() + 30
    while get(base + "/v2/models/tokenizer/ready") == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert get(base + D.READY_PATH) == 200  # the router was never unloaded
    log = entrypoint_server["log"].read_text()
    assert KEY not in log and log.count("admin-key=<redacted>") == 2

def test_sigterm_stops_the_server_cleanly_within_the_grace_period(entrypoint_server):
    """What the kubelet does after preStop: SIGTERM to the container's process. Triton
    unloads the models and exits 0 well within terminationGracePeriodSeconds."""
    proc = entrypoint_server["proc"]
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=int(entrypoint_server["env"]["EXIT_TIMEOUT_SECS"]) + 30)
    assert code == 0, entrypoint_server["log"].read_text()[-2000:]
    assert time.monotonic() - started < int(entrypoint_server["env"]["EXIT_TIMEOUT_SECS"]) + 10


# ----------------------------------------------------------------------------- the image's Python


IMAGE_PY = "3.12"  # the Python of nvcr.io/nvidia/tritonserver:26.08-py3 (Ubuntu 24.04)
TEXTS = ["A gorgeous, witty, seductive movie.", "Not worth the ticket.", "It was fine, I guess.", "",
         " ".join(["The plot wanders but the performances are wonderful."] * 20)]


@pytest.fixture(scope="module")
def image_env(tmp_path_factory):
    """deploy/requirements-image.lock and this checkout's package in a Python 3.12 env
    (venv-pack'ed, verified: every module imports), installed as the Dockerfile does:
    pip --require-hashes --no-deps, so the lock alone must be complete and its hashes right."""
    from orchestrator.tooling.env.build import build_env
    from orchestrator.tooling.env.common import ENV_TARBALL_NAME, EnvError
    from orchestrator.tooling.env.interpreters import find_python

    try:
        find_python(IMAGE_PY)
    except EnvError as exc:
        pytest.skip(f"no Python {IMAGE_PY} on this machine: {exc}")
    try:
        return build_env(
            IMAGE_PY,
            requirements=["-r", str(ROOT / "deploy" / "requirements-image.lock")],
            pip_args=["--require-hashes", "--no-deps"],
            install_project=True,
            imports=["numpy", "yaml", "tokenizers", "onnxruntime", "tritonclient.grpc", "orchestrator.runtime.serving.router", "triton_python_backend_utils"],
            verify=True,
            output=tmp_path_factory.mktemp("image-env") / ENV_TARBALL_NAME,
            quiet=True,
        )
    except EnvError as exc:
        pytest.fail(f"deploy/requirements-image.lock does not install on Python {IMAGE_PY}: {exc}", pytrace=False)


def test_the_images_packages_on_python_312_give_the_projects_answers(image_env, triton, tmp_path):
    """The router and the CPU classifiers run in the image's locked package set on Python 3.12
    (the embedded wheel's 3.12 stub, Triton 2.51) and answer as the project's own environment."""
    from orchestrator.tooling.env.install import install_env
    from orchestrator.tooling.server import TritonServer
    from tests.helpers import REPO, call, routes

    repo = tmp_path / "model_repository"
    for model in ("router", "tokenizer", "classifier", "classifier_fast"):
        shutil.copytree(REPO / model, repo / model, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"))
    install_env(repo, ["router", "classifier", "classifier_fast"], tarball=image_env.path)
    # No PYTHONPATH (the embedded server sets it to this checkout and the 3.11 venv): the
    # wheel's 3.10 stub was seen to honour it and import the venv's numpy; in the image
    # there is none, everything comes from the image's Python.
    with TritonServer(repo, models=["router", "classifier_fast", "classifier"], model_config_name="env", env={"PYTHONPATH": ""}) as server:
        stubs = set()
        for pid in subprocess.run(["pgrep", "-g", str(server.pid)], capture_output=True, text=True).stdout.split():
            try:
                stubs.add(os.path.basename(os.readlink(f"/proc/{pid}/exe")))
            except OSError:
                pass
        assert f"triton_python_backend_stub.py{IMAGE_PY}" in stubs  # the models ran the 3.12 stub
        got = call(server, "router", TEXTS)
    want = call(triton, "router", TEXTS)
    assert routes(got) == routes(want)
    assert got["VERDICTS"].tolist() == want["VERDICTS"].tolist()
    np.testing.assert_allclose(got["PROBABILITIES"], want["PROBABILITIES"], rtol=0, atol=1e-5)


def test_the_dockerfiles_pip_steps_run_as_written_on_python_312(tmp_path):
    """The Dockerfile's own COPY and RUN pip lines, word for word, in a Python 3.12 venv in
    place of the image's Python (/opt/... under tmp_path): the hashed lock installs with
    --require-hashes --no-deps --ignore-installed, the .pth step puts the copied runtime on
    the interpreter's path, and the router imports from it, where the tooling and the lab
    are not (no PYTHONPATH: the stub ignores it)."""
    from orchestrator.tooling.env.common import EnvError
    from orchestrator.tooling.env.interpreters import find_python

    try:
        python = find_python(IMAGE_PY)
    except EnvError as exc:
        pytest.skip(f"no Python {IMAGE_PY} on this machine: {exc}")
    root = tmp_path / "image"
    venv = tmp_path / "venv"
    subprocess.run([str(python.executable), "-m", "venv", str(venv)], check=True)
    ran = []
    for words in D._instructions(ROOT / "deploy" / "Dockerfile"):
        args = [w for w in words[1:] if not w.startswith("--chmod")]
        if words[0] == "COPY" and args[-1].startswith("/opt/orchestrator"):
            dest = root / args[-1].lstrip("/")
            for src in args[:-1]:
                target = dest / Path(src).name if args[-1].endswith("/") else dest
                target.parent.mkdir(parents=True, exist_ok=True)
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / src, target)
        elif words[0] == "RUN":
            command = args if "pip" not in words else " ".join(args).split("&&")[0].split()  # `rm -rf` cleans the image only
            assert command[:4] == ["python3", "-m", "pip", "install"] or command[:2] == ["python3", "-c"], command
            command = [str(venv / "bin" / "python")] + [str(root) + w if w.startswith("/opt/") else w for w in command[1:]]
            proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"{' '.join(command)}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            ran.append(command)
    assert len(ran) == 2 and "--require-hashes" in ran[0] and "-c" in ran[1]
    check = ("import importlib.util, numpy, tokenizers, onnxruntime, tritonclient.grpc, yaml, orchestrator.runtime.serving.router; "
             "assert importlib.util.find_spec('orchestrator.tooling') is None and importlib.util.find_spec('lab') is None; "
             "print(numpy.__version__)")
    proc = subprocess.run([str(venv / "bin" / "python"), "-I", "-c", check], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0 and proc.stdout.strip() == "1.26.4", proc.stderr[-2000:]
