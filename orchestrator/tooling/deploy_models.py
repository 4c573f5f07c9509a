"""The models a deployment loads and the request size its routers accept, from each router's
policy: what ``orchestrator deploy`` writes into the manifests and ``deploy render`` into
``deploy/`` (LOAD_MODELS, HTTP_MAX_INPUT_SIZE). Errors: :class:`DeployError`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from orchestrator.runtime.routing.heads import HeadError, repository_heads
from orchestrator.runtime.routing.policy import PipelinePolicy, PolicyError, bind_heads, load_any
from orchestrator.tooling.errors import ConfigError, ToolingError
from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.repository import get_parameter, read_config
from orchestrator.tooling.routers import load_routers

MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
#: deploy/routers.yaml's routers
ROUTERS = load_routers()


class DeployError(ToolingError):
    """A deployment check could not run (validators not installable, a tool failed), or the
    load list cannot be computed; the message says what to do."""



def always_on_models(repo: Path = MODEL_REPOSITORY, routers: Optional[Sequence[str]] = None) -> List[str]:
    """The ``--load-model`` names for ``routers``: each router, then every model its policy
    may call (``Policy.models()``) that is not ``on_demand``, in policy order, without repeats.

    The policy file is the router config's parameter ``policy`` (default ``policy.yaml``),
    relative to the router's model directory, as the router reads it. Raises DeployError
    when a router's config or policy cannot be read, or a named model is not in ``repo``.
    """
    repo = Path(repo)
    names: List[str] = []
    for router in routers or ROUTERS:
        policy = router_policy(repo, router)
        on_demand = policy.on_demand()
        names += [router] + [m for m in policy.models() if m not in on_demand]
    names = list(dict.fromkeys(names))
    missing = [n for n in names if not (repo / n / "config.pbtxt").is_file()]
    if missing:
        raise DeployError(f"not in the model repository {repo}: {', '.join(missing)}")
    return names


def router_policy(repo: Path, router: str):
    """The policy a router model reads: its config's parameter ``policy`` (default
    ``policy.yaml``) relative to its model directory, bound to the repository's heads as
    the router binds it (so its models' tokenizer models are known); a pipeline as parsed.
    Raises DeployError."""
    try:
        config = read_config(Path(repo) / router / "config.pbtxt")
        policy = load_any(Path(repo) / router / (get_parameter(config, "policy") or "policy.yaml"))
        return policy if isinstance(policy, PipelinePolicy) else bind_heads(policy, repository_heads(repo, [n.model for n in policy.model_nodes()]))
    except (ConfigError, PolicyError, HeadError, OSError) as exc:
        raise DeployError(f"router {router!r}: {exc}") from None


#: --http-max-input-size over the policy's ``limits.max_request_bytes``: twice that, plus
#: 64 KiB. Triton checks it against the JSON part of a request and the decoded input data
#: (r26.08 src/http_server.cc). Binary-tensor requests (tritonclient's default) carry the
#: texts plus 4 bytes of length per text and 4 per THRESHOLD (512 bytes at 64 texts) and a
#: JSON header of a few hundred bytes; JSON requests escape their texts (quotes, backslashes,
#: ``\uXXXX`` for what the client's encoder escapes), so twice the texts' bytes is allowed.
HTTP_INPUT_HEADROOM = 64 * 1024


def http_max_input_size(repo: Path = MODEL_REPOSITORY, routers: Optional[Sequence[str]] = None) -> int:
    """``HTTP_MAX_INPUT_SIZE`` for the manifests: ``2 * max_request_bytes + 64 KiB`` of the
    largest ``limits.max_request_bytes`` among ``routers``' policies."""
    largest = max(router_policy(Path(repo), r).limits.max_request_bytes for r in routers or ROUTERS)
    return 2 * largest + HTTP_INPUT_HEADROOM
