"""``orchestrator deploy render``: every piece of ``deploy/`` that names a router, written from
``deploy/routers.yaml``; and the check that nothing still names another one.

What names a router, and what :func:`render_deploy` writes there (``R`` = the routers, ``R0``
the first; the rest of each file is left as it is, comments included):

- the probes (Deployment, ServingRuntime, the front door's readiness) and the image's
  ``HEALTHCHECK``: ``/v2/models/R0/ready`` (any ``/v2/models/NAME/ready|infer`` in a
  manifest, a comment or the Dockerfile);
- ``LOAD_MODELS`` and ``HTTP_MAX_INPUT_SIZE`` in every manifest and the Dockerfile's ``ENV``:
  :func:`~orchestrator.tooling.deploy_models.always_on_models` and
  :func:`~orchestrator.tooling.deploy_models.http_max_input_size` of ``R``;
- every PromQL label matcher on ``model`` or ``router`` (the KEDA ScaledObject, the
  Prometheus adapter's rules, the PrometheusRule, any manifest): ``model="R0"`` for one
  router, ``model=~"R0|R1"`` for several. In deploy/'s queries these two labels always
  select the routers (Triton's ``nv_*`` series carry the model as ``model``, the router's own
  ``orchestrator_*`` series as ``router``);
- the Grafana dashboard's queries: ``model=~"$router"`` and ``router=~"$router"``, the
  dashboard variable ``router`` listing the routers that report (``label_values(..., router)``,
  no catch-all value, so "All" is those routers and never every model);
- the front door's configuration (``deploy/k8s/base/frontdoor/nginx.conf``:
  :func:`orchestrator.tooling.frontdoor.render` with ``R``).

:func:`check_router_names` (part of ``orchestrator deploy check``) finds every one of those
places naming anything else. Errors: :class:`~orchestrator.tooling.deploy_models.DeployError`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from orchestrator.tooling.deploy_models import DeployError, always_on_models, http_max_input_size
from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.routers import load_routers

#: The dashboard (relative to ``deploy/``) and its variable for the routers.
DASHBOARD = "grafana/orchestrator-dashboard.json"
DASHBOARD_VARIABLE = "router"
#: The front door's rendered configuration and its quotas (relative to ``deploy/``).
FRONTDOOR_CONF = "k8s/base/frontdoor/nginx.conf"
FRONTDOOR_QUOTAS = "frontdoor/quotas.yaml"
#: A Triton model endpoint in a probe, a health check or a comment.
MODEL_PATH = re.compile(r"/v2/models/([A-Za-z0-9_.-]+)/(ready|infer)\b")
#: A PromQL matcher on ``model`` or ``router`` (quotes JSON-escaped in the dashboard's text).
MATCHER = re.compile(r"(?<![\w.])(model|router)\s*(=~|=|!~|!=)\s*(\\?\")((?:[^\"\\]|\\\\.)*)(\\?\")")
_ENV_YAML = re.compile(r"(- name: (LOAD_MODELS|HTTP_MAX_INPUT_SIZE)\n\s+value: )(.*)")
_ENV_DOCKER = re.compile(r"\b(LOAD_MODELS|HTTP_MAX_INPUT_SIZE)=(\S+)")


def deploy_routers(deploy_dir: Path) -> Tuple[str, ...]:
    """The routers of ``<deploy_dir>/routers.yaml``. Raises DeployError when it is malformed."""

    try:
        return load_routers(Path(deploy_dir) / "routers.yaml")
    except ConfigError as exc:
        raise DeployError(str(exc)) from None


def promql_matcher(label: str, routers: Sequence[str]) -> str:
    """The matcher selecting ``routers`` on ``label``: ``label="a"`` or ``label=~"a|b"``
    (names regex-escaped)."""
    if len(routers) == 1:
        return f'{label}="{routers[0]}"'
    return f'{label}=~"{"|".join(re.escape(r).replace(chr(92), chr(92) * 2) for r in routers)}"'


def query_files(deploy_dir: Path) -> List[Path]:
    """The text files of ``deploy_dir`` whose queries, probes or ``ENV`` may name a router: every
    YAML under ``k8s/``, ``kserve/`` and ``prometheus-adapter/``, and the ``Dockerfile``."""
    deploy_dir = Path(deploy_dir)
    out = [p for sub in ("k8s", "kserve", "prometheus-adapter") for p in sorted((deploy_dir / sub).rglob("*.yaml"))]
    return out + [deploy_dir / "Dockerfile"]


def _rewrite_text(text: str, routers: Sequence[str], load_models: str, max_input: str, dockerfile: bool) -> str:
    text = MODEL_PATH.sub(lambda m: f"/v2/models/{routers[0]}/{m.group(2)}", text)

    def matcher(m: "re.Match[str]") -> str:
        if m.group(2) not in ("=", "=~") or m.group(4).startswith("$"):
            return m.group(0)
        return promql_matcher(m.group(1), routers)

    text = MATCHER.sub(matcher, text)
    if dockerfile:
        return _ENV_DOCKER.sub(lambda m: f"{m.group(1)}={load_models if m.group(1) == 'LOAD_MODELS' else max_input}", text)
    return _ENV_YAML.sub(lambda m: m.group(1) + (load_models if m.group(2) == "LOAD_MODELS" else f'"{max_input}"'), text)


def _dashboard_matcher(m: "re.Match[str]") -> str:
    if m.group(2) not in ("=", "=~") or m.group(4) == f"${DASHBOARD_VARIABLE}":
        return m.group(0)
    q = m.group(3)
    return f"{m.group(1)}=~{q}${DASHBOARD_VARIABLE}{m.group(5)}"


def render_dashboard(text: str) -> str:
    """The dashboard's JSON with every ``model``/``router`` matcher on ``$router`` and the
    variable ``router`` without a catch-all value (``allValue``) or a saved selection."""
    dashboard = json.loads(MATCHER.sub(_dashboard_matcher, text))
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("name") == DASHBOARD_VARIABLE:
            for key in ("allValue", "current", "options"):
                var.pop(key, None)
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def render_deploy(deploy_dir: Path, repo: Path, routers: Optional[Sequence[str]] = None) -> List[Path]:
    """Write every router-naming piece of ``deploy_dir`` (module docstring) from ``routers``
    (default: ``<deploy_dir>/routers.yaml``) and the policies in ``repo``; returns the files
    whose text changed. Raises DeployError when a router's config or policy cannot be read."""
    from orchestrator.tooling import frontdoor

    deploy_dir, repo = Path(deploy_dir), Path(repo)
    routers = tuple(routers or deploy_routers(deploy_dir))
    load_models = ",".join(always_on_models(repo, routers))
    max_input = str(http_max_input_size(repo, routers))
    new = {}
    for path in query_files(deploy_dir):
        if path.is_file():
            new[path] = _rewrite_text(path.read_text(), routers, load_models, max_input, path.name == "Dockerfile")
    dashboard = deploy_dir / DASHBOARD
    if dashboard.is_file():
        new[dashboard] = render_dashboard(dashboard.read_text())
    conf = deploy_dir / FRONTDOOR_CONF
    try:
        new[conf] = frontdoor.render(frontdoor.load_quotas(deploy_dir / FRONTDOOR_QUOTAS),
                                     frontdoor.body_limits(repo, routers), routers=routers)
    except frontdoor.FrontDoorError as exc:
        raise DeployError(f"the front door's configuration: {exc}") from None
    changed = []
    for path, text in new.items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def _matcher_findings(source: str, text: str, routers: Sequence[str], dashboard: bool) -> List[Tuple[str, str]]:
    out = []
    want = {label: promql_matcher(label, routers) for label in ("model", "router")}
    for m in MATCHER.finditer(text):
        label, found = m.group(1), m.group(0).replace('\\"', '"')
        if dashboard:
            if found != f'{label}=~"${DASHBOARD_VARIABLE}"':
                out.append((source, f"{found} selects no router variable: {label}=~\"${DASHBOARD_VARIABLE}\" "
                                    "(orchestrator deploy render)"))
        elif re.sub(r"\s+", "", found) != want[label]:
            out.append((source, f"{found} does not select the routers of deploy/routers.yaml ({want[label]}): "
                                "orchestrator deploy render"))
    return out


def check_router_names(deploy_dir: Path, routers: Optional[Sequence[str]] = None) -> List[Tuple[str, str]]:
    """Every place of ``deploy_dir`` that should name the routers (module docstring) and names
    another model, as ``(source, message)``: a ``/v2/models/NAME/...`` path, a PromQL matcher
    on ``model`` or ``router``, the dashboard's queries and its ``router`` variable. (The
    ``LOAD_MODELS``, ``HTTP_MAX_INPUT_SIZE``, probes and the front door are checked against the
    policies by ``deploy check``'s consistency, security and front-door checks.)"""
    deploy_dir = Path(deploy_dir)
    routers = tuple(routers or deploy_routers(deploy_dir))
    out: List[Tuple[str, str]] = []
    for path in query_files(deploy_dir):
        if not path.is_file():
            continue
        source = str(path.relative_to(deploy_dir.parent))
        text = path.read_text()
        for m in MODEL_PATH.finditer(text):
            if m.group(1) != routers[0]:
                out.append((source, f"{m.group(0)}: the first router of deploy/routers.yaml is {routers[0]!r} "
                                    "(orchestrator deploy render)"))
        out += _matcher_findings(source, text, routers, dashboard=False)
    dashboard = deploy_dir / DASHBOARD
    if dashboard.is_file():
        source = str(dashboard.relative_to(deploy_dir.parent))
        text = dashboard.read_text()
        out += _matcher_findings(source, text, routers, dashboard=True)
        variables = {v.get("name"): v for v in (json.loads(text).get("templating") or {}).get("list") or []}
        var = variables.get(DASHBOARD_VARIABLE)
        if var is None:
            out.append((source, f"no dashboard variable {DASHBOARD_VARIABLE!r}: its queries select the routers through it"))
        else:
            query = json.dumps(var.get("query", ""))
            if not re.search(r"label_values\([^)]*,\s*router\)", query):
                out.append((source, f"variable {DASHBOARD_VARIABLE!r} must list the reporting routers "
                                    f"(label_values(orchestrator_requests_total, router)), not {query}"))
            if var.get("allValue") is not None:
                out.append((source, f"variable {DASHBOARD_VARIABLE!r} has allValue {var['allValue']!r}: \"All\" would select "
                                    "every model on the model label (orchestrator deploy render)"))
            saved = [o.get("value") for o in var.get("options") or []] + [(var.get("current") or {}).get("value")]
            names = {str(n) for v in saved if v for n in (v if isinstance(v, list) else [v])}
            stale = sorted(names - set(routers) - {"$__all"})
            if stale:
                out.append((source, f"variable {DASHBOARD_VARIABLE!r} saves {stale}, not routers of deploy/routers.yaml"))
    return out
