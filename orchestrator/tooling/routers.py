"""The routers a deployment serves: ``deploy/routers.yaml``, the one setting the front door's
allowlist, ``LOAD_MODELS``, the probes and the image's health check take the router names
from (docs/guides/kubernetes.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Tuple

import yaml

from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.paths import PROJECT_ROOT

ROUTERS_FILE = PROJECT_ROOT / "deploy" / "routers.yaml"
#: Triton model names a path and a Lua string can hold as they are.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def parse_routers(data: object, source: str = "routers.yaml") -> Tuple[str, ...]:
    """The router names of the file's YAML ``{routers: [NAME, ...]}``, in order.

    Raises:
        ConfigError: not that shape, an empty list, a duplicate, or a name that is not a
            model name (letters, digits, ``_``, ``.``, ``-``; at most 128).
    """
    if not isinstance(data, dict) or set(data) != {"routers"} or not isinstance(data["routers"], list) or not data["routers"]:
        raise ConfigError(f"{source}: expected {{routers: [NAME, ...]}} with at least one router, not {data!r}")
    names = data["routers"]
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{source}: router {name!r} is not a model name (letters, digits, _ . -)")
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: a router is listed twice: {names}")
    return tuple(names)


def load_routers(path: Path = ROUTERS_FILE) -> Tuple[str, ...]:
    """:func:`parse_routers` of ``path``; ``("router",)`` where the file does not exist (a
    package installed without the checkout's ``deploy/``).

    Raises:
        ConfigError: the file is not valid YAML or not of that shape.
    """
    if not Path(path).is_file():
        return ("router",)
    try:
        return parse_routers(yaml.safe_load(Path(path).read_text()), str(path))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {exc}") from None
