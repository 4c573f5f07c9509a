"""The model repository: Triton's model configurations read and written with Triton's own
definitions, and which configuration Triton reads for which model.

Configurations are parsed into ``inference.ModelConfig`` messages from Triton's
``model_config.proto`` (the generated module ``tritonclient.grpc.model_config_pb2`` that
ships with ``tritonclient``, a project dependency; source:
github.com/triton-inference-server/common, ``protobuf/model_config.proto``, BSD-3-Clause)
with protobuf ``text_format``, the same parser Triton's core uses for ``config.pbtxt``, so a
misspelled field or a wrong type fails here as it would in the server. The tritonclient
module is a newer revision of the proto than Triton 2.51's (it only adds fields); the
real-server tests load every shipped configuration in a Triton 2.51 server.

Writing goes through ``text_format.MessageToString``: comments are not kept, so a written
file starts with the header lines the caller gives.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, List, Optional, Union

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.files import write_atomic

ModelConfig = model_config_pb2.ModelConfig
PathLike = Union[str, os.PathLike]

__all__ = [
    "ModelConfig",
    "ConfigError",
    "parse_config",
    "read_config",
    "format_config",
    "write_config",
    "config_path",
    "list_models",
    "is_python_model",
    "get_parameter",
    "set_parameter",
]


def parse_config(text: str, where: str = "config.pbtxt") -> ModelConfig:
    """Parse pbtxt ``text`` into a ``ModelConfig``.

    Raises:
        ConfigError: the text is not a valid ``ModelConfig`` (unknown field, wrong type,
            syntax); the message starts with ``where`` and the line:column.
    """
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"{where}:{exc}") from None
    return config


def read_config(path: PathLike) -> ModelConfig:
    """Read and parse the configuration file at ``path``.

    Raises:
        ConfigError: the file cannot be read or is not a valid ``ModelConfig``.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read model configuration: {exc.strerror}") from None
    return parse_config(text, str(path))


def format_config(config: ModelConfig, header: Optional[Iterable[str]] = None) -> str:
    """``config`` as pbtxt, preceded by ``header`` lines written as ``#`` comments."""
    lines = [f"# {h}".rstrip() for h in (header or ())]
    return "\n".join(lines + [text_format.MessageToString(config).rstrip()]) + "\n"


def write_config(path: PathLike, config: ModelConfig, header: Optional[Iterable[str]] = None) -> Path:
    """Write ``config`` to ``path`` atomically (see :func:`format_config`); returns ``path``.

    Raises:
        OSError: the file cannot be written.
    """
    path = Path(path)
    write_atomic(path, format_config(config, header).encode("utf-8"), 0o644)
    return path


def config_path(model_dir: PathLike, config_name: Optional[str] = None) -> Optional[Path]:
    """The configuration file Triton reads for ``--model-config-name=config_name``:
    ``configs/<name>.pbtxt`` where it exists, else ``config.pbtxt``; None if neither."""
    model_dir = Path(model_dir)
    if config_name:
        candidate = model_dir / "configs" / f"{config_name}.pbtxt"
        if candidate.is_file():
            return candidate
    default = model_dir / "config.pbtxt"
    return default if default.is_file() else None


def list_models(model_repository: PathLike, config_name: Optional[str] = "embedded") -> List[str]:
    """Names of the model directories of a repository, sorted: subdirectories (not hidden)
    holding a ``config.pbtxt`` or ``configs/<config_name>.pbtxt``."""
    repo = Path(model_repository)
    if not repo.is_dir():
        return []
    return [
        child.name
        for child in sorted(repo.iterdir())
        if child.is_dir() and not child.name.startswith(".") and config_path(child, config_name) is not None
    ]


def is_python_model(config: ModelConfig) -> bool:
    """True when ``config`` is served by the Python backend."""
    return config.backend == "python"


def get_parameter(config: ModelConfig, key: str) -> Optional[str]:
    """The ``string_value`` of parameter ``key``, or None when it is not set."""
    if key in config.parameters:
        return config.parameters[key].string_value
    return None


def set_parameter(config: ModelConfig, key: str, value: str) -> None:
    """Set parameter ``key`` to the string ``value`` (added when missing)."""
    config.parameters[key].string_value = value
