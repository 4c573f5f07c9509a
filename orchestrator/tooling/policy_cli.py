"""``orchestrator policy check PATH`` and ``orchestrator policy show --url``.

``policy check`` validates the policy offline, then checks every pinned model ``version``
against a model repository: the version directory exists and the model's
``version_policy`` (in the configuration Triton reads with ``--model-config-name``) serves
it. The repository is ``--repo``, else the one holding the policy file (a policy beside a
model's ``config.pbtxt``), else the project's ``model_repository``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

from orchestrator.runtime import policy as P
from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.paths import default_model_repository
from orchestrator.tooling.repository import ModelConfig, config_path, read_config


def served_versions(model_dir: Path, config: ModelConfig) -> List[int]:
    """The versions Triton serves of the model in ``model_dir``: its numeric version
    directories filtered by ``version_policy`` (``latest`` n, default 1: the n highest;
    ``all``; ``specific``: those listed), ascending."""
    present = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)
    which = config.version_policy.WhichOneof("policy_choice")
    if which == "all":
        return present
    if which == "specific":
        return [v for v in present if v in set(config.version_policy.specific.versions)]
    n = config.version_policy.latest.num_versions if which == "latest" else 1
    return present[-max(1, n):] if present else []


def version_errors(policy: P.Policy, repo: Path, config_name: Optional[str] = "embedded") -> List[str]:
    """One located message per model node whose pinned ``version`` the repository does
    not serve (``root.cases[0].then.version: ...``); empty when all are served."""
    errors = []
    for node in policy.model_nodes():
        if node.version is None:
            continue
        where, model_dir = f"{node.where}.version", repo / node.model
        path = config_path(model_dir, config_name) if model_dir.is_dir() else None
        if path is None:
            errors.append(f"{where}: model '{node.model}' is not in {repo}")
            continue
        try:
            config = read_config(path)
        except ConfigError as exc:
            errors.append(f"{where}: {exc}")
            continue
        served = served_versions(model_dir, config)
        if node.version not in served:
            present = sorted(p.name for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
            errors.append(
                f"{where}: version {node.version} of '{node.model}' is not served from {model_dir} "
                f"(version directories: {', '.join(present) or 'none'}; served by its version_policy: "
                f"{', '.join(map(str, served)) or 'none'}; to serve several, e.g. version_policy: "
                "{ specific: { versions: [1, 2] } })"
            )
    return errors


def _repository_for(policy_path: Path, repo: Optional[str]) -> Path:
    if repo:
        return Path(repo)
    model_dir = policy_path.resolve().parent
    if (model_dir / "config.pbtxt").is_file() or (model_dir / "configs").is_dir():
        return model_dir.parent
    return default_model_repository()


def fetch_policy(url: str, model: str = "router", protocol: str = "http") -> dict:
    """The policy document the running ``model`` uses, from its optional ``POLICY`` output.

    Sends one empty text (answered without any model by policies that guard empty texts)
    with the request parameter ``describe_policy: true``.

    Raises:
        tritonclient.utils.InferenceServerException: the server is unreachable or the model
            refuses the request.
        RuntimeError: the model has no ``POLICY`` output (not an orchestrator router).
    """
    from orchestrator.tooling.client import client_module, text_inputs

    tc = client_module(protocol)
    client = tc.InferenceServerClient(url)
    try:
        inputs = text_inputs(tc, [""])
        outputs = [tc.InferRequestedOutput("POLICY")]
        result = client.infer(model, inputs, outputs=outputs, parameters={"describe_policy": True})
    finally:
        client.close()
    value = result.as_numpy("POLICY")
    if value is None:
        raise RuntimeError(f"model '{model}' returned no POLICY output: is it an orchestrator router?")
    return json.loads(value.reshape(-1)[0])


def add_policy_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="policy_command", required=True)
    check = sub.add_parser("check", help="validate a policy file offline and print its graph")
    check.add_argument("path", help="policy file (.yaml, .yml or .json)")
    check.add_argument("--repo", default=None, help="model repository for pinned versions (default: the one "
                       "holding the policy file, else the project's model_repository)")
    check.add_argument("--model-config-name", default="embedded",
                       help="configuration whose version_policy counts (default: %(default)s; '' for config.pbtxt)")
    show = sub.add_parser("show", help="print the policy a running router uses")
    show.add_argument("--url", default=None, help="host:port (default 127.0.0.1:8000 http, :8001 grpc)")
    show.add_argument("--model", default="router")
    show.add_argument("--protocol", choices=("http", "grpc"), default="http")
    show.add_argument("--json", action="store_true", help="print the policy document as JSON instead of the graph")


def policy_command(args) -> int:
    if args.policy_command == "check":
        try:
            policy = P.load_policy(args.path)
        except P.PolicyError as exc:
            print(f"invalid policy: {exc}", file=sys.stderr)
            return 1
        print(P.describe(policy))
        if any(n.version is not None for n in policy.model_nodes()):
            repo = _repository_for(Path(args.path), getattr(args, "repo", None))
            errors = version_errors(policy, repo, getattr(args, "model_config_name", "embedded") or None)
            for error in errors:
                print(f"invalid policy: {args.path}: {error}", file=sys.stderr)
            if errors:
                return 1
            print(f"pinned model versions are served from {repo}")
        print("policy is valid")
        return 0
    from tritonclient.utils import InferenceServerException

    from orchestrator.tooling.client import DEFAULT_URLS

    try:
        document = fetch_policy(args.url or DEFAULT_URLS[args.protocol], args.model, args.protocol)
    except (InferenceServerException, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(document, indent=2) if args.json else P.describe(P.parse_policy(document)))
    return 0
