"""``env install``: put a packed env into model directories and write their env config variant.

Configs are read and written through Triton's ``model_config.proto``
(:mod:`orchestrator.tooling.repository`): ``configs/env.pbtxt`` is the model's effective
config with the ``EXECUTION_ENV_PATH`` parameter set, so a real server loads it as it
loads the base config (``tests/server/test_env_server.py``).

Errors are :class:`~orchestrator.tooling.env.common.EnvError`;
:class:`~orchestrator.tooling.errors.ConfigError` for a config that does not parse.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from orchestrator.tooling.env.common import (
    DEFAULT_ENV_OUTPUT,
    EMBEDDED_TRITON_RELEASE,
    ENV_CONFIG_NAME,
    ENV_PATH_PARAMETER,
    ENV_PATH_VALUE,
    ENV_TARBALL_NAME,
    EnvError,
    parse_version,
    version_text,
)
from orchestrator.tooling.env.inspection import inspect_env
from orchestrator.tooling.env.stubs import place_stub, stub_for
from orchestrator.tooling.repository import (
    config_path,
    get_parameter,
    is_python_model,
    list_models,
    read_config,
    set_parameter,
    write_config,
)

__all__ = ["InstalledModel", "install_env", "python_models", "models_missing_env_config", "env_install_command"]


@dataclass
class InstalledModel:
    """One model directory after :func:`install_env`: the env config written, the tarball,
    the stub placed there (None when the server's own stub matches) and how the tarball got
    there (``hardlink`` or ``copy``)."""

    name: str
    config: Path
    tarball: Path
    stub: Path | None
    how: str


def python_models(repo: str | os.PathLike, config_name: str | None) -> list[str]:
    """The models of ``repo`` whose effective config for ``--model-config-name=config_name``
    is a Python-backend one, sorted. Raises ConfigError for a config that does not parse."""
    repo = Path(repo)
    names = []
    for name in list_models(repo, config_name):
        path = config_path(repo / name, config_name)
        if path is not None and is_python_model(read_config(path)):
            names.append(name)
    return names


def models_missing_env_config(repo: str | os.PathLike, config_name: str = ENV_CONFIG_NAME,
                              base_config_name: str | None = "embedded") -> list[str]:
    """The Python models (by ``base_config_name``) of ``repo`` without
    ``configs/<config_name>.pbtxt`` while other models have one: models added (exported)
    after ``env install``. A server started with ``--model-config-name=config_name`` would
    load their ``config.pbtxt`` instead (for an exported classifier: Triton's native
    ``onnxruntime`` backend, absent from the embedded server). Empty when no model has the
    variant (no env installed). Raises ConfigError for a config that does not parse."""
    repo = Path(repo)

    def variant(name: str) -> Path:
        return repo / name / "configs" / f"{config_name}.pbtxt"

    installed = [n for n in list_models(repo, config_name)
                 if variant(n).is_file() and get_parameter(read_config(variant(n)), ENV_PATH_PARAMETER) is not None]
    if not installed:
        return []
    return [name for name in python_models(repo, base_config_name) if not variant(name).is_file()]


def env_install_command(repo: str | os.PathLike, models: Sequence[str]) -> str:
    """The command that installs the env (``.cache/env``, from ``make env``) into ``models``."""
    return f"orchestrator env install --repo {repo} --models {','.join(models)}"


def _place(source: Path, target: Path, link: bool) -> str:
    """Put ``source`` at ``target``: a hard link when possible (one copy on disk; Triton
    still extracts per path), else a copy; atomic either way."""
    if target.exists() and os.path.samefile(source, target):
        return "hardlink"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    how = "copy"
    if link:
        try:
            os.link(source, tmp)
            how = "hardlink"
        except OSError:
            pass
    if how == "copy":
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return how


def install_env(
    repo: str | os.PathLike,
    models: Sequence[str] | None = None,
    *,
    tarball: str | os.PathLike | None = None,
    stub: str | os.PathLike | None = None,
    server_python: str | Sequence[int] | None = None,
    base_config_name: str | None = "embedded",
    config_name: str = ENV_CONFIG_NAME,
    link: bool = True,
    triton: str = EMBEDDED_TRITON_RELEASE,
    dispatch: bool = True,
) -> list[InstalledModel]:
    """Install a packed env into model directories and write their env config variant.

    For each model of ``models`` (default: every model whose effective config for
    ``base_config_name`` is a Python-backend one): ``<model>/triton_env.tar.gz`` (a hard link
    to ``tarball`` where possible, default ``.cache/env/triton_env.tar.gz``);
    ``<model>/configs/<config_name>.pbtxt`` = that effective config with
    ``EXECUTION_ENV_PATH = $$TRITON_MODEL_DIRECTORY/triton_env.tar.gz`` (replacing any
    existing one), after two ``#`` lines that say where it came from; and, when the env's
    Python version differs from ``server_python`` (the version of the server's own stub;
    default: this interpreter's, as for the embedded server), the stub of the env's
    version (:func:`~orchestrator.tooling.env.stubs.stub_for`: ``stub`` if given, else
    ``stub_build/out/<3.x>/`` for release ``triton``, else the wheel's), placed by
    :func:`~orchestrator.tooling.env.stubs.place_stub` behind a dispatcher with
    ``dispatch`` (default; the default configs keep working) or as the binary itself.

    Raises EnvError: no tarball, an unknown or non-Python model, no stub for that version,
    or a stub whose libpython does not match the env's Python; ConfigError: a config that
    does not parse.
    """
    repo = Path(repo)
    tarball = Path(tarball or DEFAULT_ENV_OUTPUT)
    if not tarball.is_file():
        raise EnvError(f"no env tarball at {tarball}: build one first (make env, or orchestrator env build)")
    info = inspect_env(tarball)
    if info.python_version is None:
        raise EnvError(f"{tarball}: cannot tell the env's Python version")
    env_py = info.python_version
    server_py = parse_version(server_python) if server_python else tuple(sys.version_info[:2])
    stub_source = stub_for(env_py, triton, stub) if env_py != server_py else None
    if models is None:
        models = python_models(repo, base_config_name)
    results = []
    for name in models:
        model_dir = repo / name
        base = config_path(model_dir, base_config_name)
        if base is None:
            raise EnvError(f"{model_dir}: no config.pbtxt (not a model of {repo})")
        config = read_config(base)
        if not is_python_model(config):
            raise EnvError(f"{base}: not a Python-backend model (EXECUTION_ENV_PATH applies to backend: \"python\" only)")
        how = _place(tarball, model_dir / ENV_TARBALL_NAME, link)
        placed_stub = place_stub(model_dir, stub_source, env_py, dispatch)
        set_parameter(config, ENV_PATH_PARAMETER, ENV_PATH_VALUE)
        header = [
            f"Generated by `orchestrator env install` from {base.relative_to(model_dir).as_posix()}: the same model with its own",
            f"packed Python environment (env Python {version_text(env_py)}). Used with --model-config-name={config_name}.",
        ]
        target = model_dir / "configs" / f"{config_name}.pbtxt"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_config(target, config, header)
        results.append(InstalledModel(name, target, model_dir / ENV_TARBALL_NAME, placed_stub, how))
    return results
