"""``orchestrator deploy render``: a router renamed in deploy/routers.yaml is the user's only
edit. In a temporary copy of deploy/ and of the model repository (the router copied to
``sentiment``), render writes every piece that names a router (probes, LOAD_MODELS, the
image's HEALTHCHECK and ENV, the KEDA and Prometheus adapter queries, the dashboard, the
front door) and nothing still names ``router``; ``deploy check``'s router-name check finds
what a hand edit missed; with the validators, the whole ``deploy check`` is clean."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from orchestrator.tooling import deploy as D
from orchestrator.tooling import deploy_render as R
from orchestrator.tooling.repository import copy_model
from tests.helpers import ROOT

RENAMED = "sentiment"


def renamed_copy(tmp: Path, routers=(RENAMED,)) -> tuple:
    """deploy/ and model_repository/ copied under ``tmp``, the shipped router copied to each
    name of ``routers`` and routers.yaml naming them (as the user does); returns (deploy, repo)."""
    deploy = tmp / "deploy"
    repo = tmp / "model_repository"
    shutil.copytree(ROOT / "deploy", deploy)
    shutil.copytree(ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
    for name in routers:
        copy_model(repo / "router", repo / name)
    (deploy / "routers.yaml").write_text(yaml.safe_dump({"routers": list(routers)}))
    for src in D.copy_sources(deploy / "Dockerfile"):  # the rest of the image's build context
        top = Path(src).parts[0]
        if not (tmp / top).exists():
            (tmp / top).symlink_to(ROOT / top)
    return deploy, repo


def router_values(text: str) -> List[str]:
    """Every value in ``text`` that names a router model: a ``/v2/models/NAME/`` path, a
    ``model``/``router`` PromQL matcher's value, a ``LOAD_MODELS`` entry, the front door's
    location regex and Lua allowlist."""
    text = text.replace('\\"', '"')
    out = [m.group(1) for m in R.MODEL_PATH.finditer(text)]
    out += [n for m in R.MATCHER.finditer(text) for n in re.split(r"\|", m.group(4).replace("\\\\", "").replace("\\", ""))]
    out += [n for m in re.finditer(r"LOAD_MODELS(?:=|\n\s+value: )(\S+)", text) for n in m.group(1).split(",")]
    out += re.findall(r"\^/v2/models/\(?([A-Za-z0-9_.|\\-]+?)\)?\(", text)
    out += re.findall(r"\[\"([A-Za-z0-9_.-]+)\"\] = true", text)
    return out


def rendered_files(deploy: Path) -> Dict[str, str]:
    files = [*R.query_files(deploy), deploy / R.DASHBOARD, deploy / R.FRONTDOOR_CONF]
    return {str(p.relative_to(deploy)): p.read_text() for p in files}


def test_render_of_the_shipped_deploy_changes_nothing(tmp_path):
    """The committed files are what render writes from deploy/routers.yaml."""
    deploy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", deploy)
    assert R.render_deploy(deploy, ROOT / "model_repository") == []
    assert R.check_router_names(ROOT / "deploy") == []


def test_a_renamed_router_is_the_only_edit_render_writes_the_rest(tmp_path):
    deploy, repo = renamed_copy(tmp_path)
    stale = R.check_router_names(deploy)
    sources = {s for s, _ in stale}
    # before render, the check names every file that still says router
    assert {"deploy/k8s/components/keda/scaledobject.yaml", "deploy/prometheus-adapter/values.yaml",
            "deploy/k8s/base/deployment.yaml", "deploy/kserve/servingruntime.yaml", "deploy/Dockerfile"} <= sources, stale
    assert any('model="router"' in m and 'model="sentiment"' in m for _, m in stale), stale
    changed = {str(p.relative_to(deploy)) for p in R.render_deploy(deploy, repo)}
    assert {"k8s/components/keda/scaledobject.yaml", "prometheus-adapter/values.yaml", "k8s/base/deployment.yaml",
            "kserve/servingruntime.yaml", "kserve/inferenceservice.yaml", "Dockerfile", R.FRONTDOOR_CONF} <= changed
    assert R.check_router_names(deploy) == []
    for rel, text in rendered_files(deploy).items():
        names = router_values(text)
        assert "router" not in names, f"{rel} still names the router 'router': {names}"
    texts = rendered_files(deploy)
    assert 'model="sentiment"' in texts["k8s/components/keda/scaledobject.yaml"]
    assert 'router="sentiment"' in texts["prometheus-adapter/values.yaml"]
    assert "LOAD_MODELS=sentiment,classifier_fast,classifier" in texts["Dockerfile"]
    assert "/v2/models/sentiment/ready" in texts["Dockerfile"]
    assert texts["k8s/base/deployment.yaml"].count("/v2/models/sentiment/ready") >= 4  # 3 probes + the front door's
    assert "value: sentiment,classifier_fast,classifier" in texts["kserve/servingruntime.yaml"]
    assert '["sentiment"] = true' in texts[R.FRONTDOOR_CONF]
    # and the consistency check agrees with what render wrote (no kubectl: the raw manifests)
    raw = {"base": texts["k8s/base/deployment.yaml"], "kserve": texts["kserve/servingruntime.yaml"]}
    assert [str(f) for f in D.check_consistency(raw, deploy, repo)] == []
    assert [str(f) for f in D.check_security(raw, (RENAMED,)) if "must be /v2/models" in f.message] == []
    assert R.render_deploy(deploy, repo) == []  # a second render changes nothing


def test_two_routers_are_selected_by_one_regex_matcher(tmp_path):
    deploy, repo = renamed_copy(tmp_path, routers=("sentiment", "topic.v2"))
    R.render_deploy(deploy, repo)
    keda = (deploy / "k8s/components/keda/scaledobject.yaml").read_text()
    assert 'model=~"sentiment|topic\\\\.v2"' in keda, keda
    assert "LOAD_MODELS=sentiment,classifier_fast,classifier,topic.v2" in (deploy / "Dockerfile").read_text()
    assert R.check_router_names(deploy) == []


@pytest.mark.parametrize("rel,old,new,message", [
    ("k8s/components/keda/scaledobject.yaml", 'model="sentiment"', 'model="router"', 'model="router" does not select'),
    ("prometheus-adapter/values.yaml", 'router="sentiment"', 'router="router"', 'router="router" does not select'),
    ("k8s/base/prometheusrule.yaml", 'deployment="orchestrator-triton"} == 0', 'model="classifier"} == 0', 'model="classifier" does not select'),
    (R.DASHBOARD, 'model=~\\"$router\\"', 'model=\\"router\\"', 'model="router" selects no router variable'),
    (R.DASHBOARD, '"includeAll": true,\n        "sort"', '"includeAll": true,\n        "allValue": ".*",\n        "sort"', "allValue"),
    ("kserve/inferenceservice.yaml", "/v2/models/sentiment/infer", "/v2/models/router/infer", "the first router of deploy/routers.yaml is 'sentiment'"),
])
def test_a_hand_edit_that_names_another_router_is_found(tmp_path, rel, old, new, message):
    deploy, repo = renamed_copy(tmp_path)
    R.render_deploy(deploy, repo)
    path = deploy / rel
    text = path.read_text()
    assert old in text, (rel, old)
    path.write_text(text.replace(old, new, 1))
    found = R.check_router_names(deploy)
    assert any(message in m for _, m in found), found


def test_the_dashboard_variable_must_list_the_routers(tmp_path):
    deploy, repo = renamed_copy(tmp_path)
    R.render_deploy(deploy, repo)
    path = deploy / R.DASHBOARD
    dash = json.loads(path.read_text())
    var = next(v for v in dash["templating"]["list"] if v["name"] == "router")
    var["current"] = {"text": "router", "value": ["router"]}
    path.write_text(json.dumps(dash, indent=2) + "\n")
    assert any("saves ['router']" in m for _, m in R.check_router_names(deploy))
    dash["templating"]["list"].remove(var)
    path.write_text(json.dumps(dash, indent=2) + "\n")
    assert any("no dashboard variable 'router'" in m for _, m in R.check_router_names(deploy))


def test_deploy_render_and_check_on_the_command_line(tmp_path, capsys):
    from orchestrator.tooling.cli import main

    deploy, repo = renamed_copy(tmp_path)
    assert main(["deploy", "render", "--deploy-dir", str(deploy), "--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "deploy render: routers sentiment" in out and "wrote " in out


def test_deploy_check_is_clean_after_a_rename_and_a_render(tmp_path):
    """The whole `deploy check` (schemas of the rendered overlays, checkov, hadolint, the front
    door, consistency, router names, security, supply chain) on the renamed copy: no finding,
    and the rendered overlays name no router 'router'."""
    tools = D.ensure_tools()
    deploy, repo = renamed_copy(tmp_path)
    R.render_deploy(deploy, repo)
    findings = D.check_all(tools, deploy_dir=deploy, repo=repo)
    assert [str(f) for f in findings] == []
    for rel in D.KUSTOMIZATIONS:
        names = router_values(D.render(deploy / rel, tools))
        assert RENAMED in names and "router" not in names, (rel, names)
