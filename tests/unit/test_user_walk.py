"""The user's last mile, walked as the docs tell it, from a fresh virtualenv.

A copy of the checkout (its tracked files: the manifests, the Dockerfile's build context and
the shipped model repository); the package built as a wheel and installed by its documented
name (README: ``pip wheel --no-deps -w dist .``, then ``pip install
"dist/triton_orchestrator-...whl[export,client]"``) into a new virtualenv; two models with
different heads exported behind two routers of their own names (a 5-class BERT behind
``sentiment``, a 2-label RoBERTa behind ``moderation``: one head per router); both routers
put into ``deploy/routers.yaml``, the user's only edit of deploy/; ``orchestrator deploy
render``; ``orchestrator deploy check`` clean; and no rendered query, manifest or dashboard
names the router ``router`` any more.

Slow (a virtualenv with torch, two exports, the deployment checks) and network (pip may
download what the local wheel cache lacks)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest
import yaml

from tests.helpers import ROOT
from tests.unit.test_deploy_render import rendered_files, router_values
from tests.unit.test_packaging import _source_copy

DIST = "triton-orchestrator"


def run(cmd, cwd, env=None, timeout=1800):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, f"`{' '.join(map(str, cmd))}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
@pytest.mark.network
def test_from_a_fresh_virtualenv_to_a_clean_deploy_check_with_routers_of_your_own_names(tmp_path):
    pytest.importorskip("torch", reason="the test builds its checkpoints with torch (the `train` extra)")
    from orchestrator.tooling import deploy as D
    from orchestrator.tooling import deploy_render as R
    from tests.byom import build_checkpoint

    tools = D.ensure_tools()  # the validators, shared with the walk through ORCHESTRATOR_TOOLS_DIR
    user = _source_copy(tmp_path / "checkout")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    # install by the documented name, from a wheel built from the checkout
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], user)
    pip = [venv / "bin" / "python", "-m", "pip"]
    run(pip + ["wheel", "--no-deps", "-q", "-w", "dist", "."], user)
    wheel = user / "dist" / f"{DIST.replace('-', '_')}-{version}-py3-none-any.whl"
    assert wheel.is_file(), sorted(p.name for p in (user / "dist").iterdir())
    run(pip + ["install", "-q", f"{wheel}[export,client]"], user)
    shown = run(pip + ["show", DIST], user).stdout
    assert f"Name: {DIST}" in shown
    cli = venv / "bin" / "orchestrator"
    where = run([venv / "bin" / "python", "-c", "import orchestrator; print(orchestrator.__file__)"], tmp_path).stdout
    assert str(venv) in where  # the installed package, not the checkout

    # two heads, two routers of the user's names
    stars = build_checkpoint("stars5", tmp_path / "ckpt" / "stars5")
    roberta = build_checkpoint("roberta2", tmp_path / "ckpt" / "roberta2")
    repo = user / "model_repository"
    run([cli, "export", stars, "--name", "stars", "--repo", repo, "--router-name", "sentiment", "--quiet"], user)
    run([cli, "export", roberta, "--name", "roberta", "--repo", repo, "--router-name", "moderation", "--quiet"], user)
    for router in ("sentiment", "moderation"):
        run([cli, "policy", "check", repo / router / "policy.yaml", "--repo", repo], user)
    assert (repo / "sentiment" / "labels.txt").read_text().count("\n") == 5
    assert (repo / "moderation" / "labels.txt").read_text().count("\n") == 1

    # the one edit of deploy/, then render and check
    deploy = user / "deploy"
    (deploy / "routers.yaml").write_text(yaml.safe_dump({"routers": ["sentiment", "moderation"]}))
    out = run([cli, "deploy", "render", "--deploy-dir", deploy, "--repo", repo], user).stdout
    assert "deploy render: routers sentiment, moderation" in out
    check = run([cli, "deploy", "check", "--deploy-dir", deploy, "--repo", repo], user,
                env={"ORCHESTRATOR_TOOLS_DIR": str(tools.root)}, timeout=1800)
    assert "deploy check: 0 finding(s)" in check.stdout, check.stdout[-3000:]

    # no rendered query, manifest or dashboard names the router 'router'
    for rel, text in rendered_files(deploy).items():
        names = router_values(text)
        assert "router" not in names, f"{rel} still names 'router': {names}"
    for rel in D.KUSTOMIZATIONS:
        names = router_values(D.render(deploy / rel, tools))
        assert "sentiment" in names and "router" not in names, (rel, names)
    keda = (deploy / "k8s" / "components" / "keda" / "scaledobject.yaml").read_text()
    assert 'model=~"sentiment|moderation"' in keda and 'router=~"sentiment|moderation"' in keda
    assert "LOAD_MODELS=sentiment,stars," in (deploy / "Dockerfile").read_text()
    assert R.check_router_names(deploy) == []
