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

Besides reading and writing: :func:`copy_model` (a model directory under another name),
:func:`rename_steps` (an ensemble's step models), and :func:`check_repository` (the
cross-file rules Triton only reports at load time: names, ``model.py`` files, ensemble
steps against the models they call).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Union

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from orchestrator.runtime.routing.heads import LABEL_FILE, Head
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
    "header_lines",
    "config_path",
    "list_models",
    "is_python_model",
    "get_parameter",
    "set_parameter",
    "model_config_paths",
    "rename_steps",
    "copy_model",
    "check_repository",
    "repository_problems",
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


def header_lines(path: PathLike) -> List[str]:
    """The comment lines at the top of a configuration file, without their ``#``: what
    :func:`write_config` takes as ``header`` to keep them when rewriting the file."""
    lines = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return lines


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


def model_config_paths(model_dir: PathLike) -> List[Path]:
    """Every configuration file of a model directory: ``config.pbtxt`` (when present), then
    ``configs/*.pbtxt`` sorted by name."""
    model_dir = Path(model_dir)
    default = model_dir / "config.pbtxt"
    return ([default] if default.is_file() else []) + sorted((model_dir / "configs").glob("*.pbtxt"))


def rename_steps(config: ModelConfig, models: Mapping[str, str]) -> int:
    """Replace the ``model_name`` of the ensemble steps of ``config`` per ``models`` (old ->
    new), in place; returns how many steps changed (0 for a config that is not an ensemble)."""
    changed = 0
    for step in config.ensemble_scheduling.step:
        if step.model_name in models:
            step.model_name = models[step.model_name]
            changed += 1
    return changed


def copy_model(source: PathLike, dest: PathLike, header: Optional[Iterable[str]] = None, ignore: Iterable[str] = ()) -> List[Path]:
    """Copy the model directory ``source`` to ``dest`` (without ``__pycache__`` and the glob
    patterns ``ignore``) and name the copy ``dest``'s directory name in every configuration
    file that sets a ``name`` (Triton requires the name to equal the directory's). Each
    rewritten file starts with ``header`` (default: one line saying what it was copied
    from). Returns the configuration files.

    Raises:
        ConfigError: a configuration file of ``source`` is invalid.
        OSError: ``dest`` exists or cannot be written.
    """
    source, dest = Path(source), Path(dest)
    configs = {path.relative_to(source): read_config(path) for path in model_config_paths(source)}
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", *ignore))
    written = []
    for rel, config in configs.items():
        if config.name:
            config.name = dest.name
        lines = list(header) if header is not None else [f"Copy of {source.name}/{rel.as_posix()} as model {dest.name}."]
        written.append(write_config(dest / rel, config, lines))
    return written


def _tensor_names(config: ModelConfig) -> tuple:
    return {t.name for t in config.input}, {t.name for t in config.output}


def check_repository(model_repository: PathLike) -> Dict[Path, ModelConfig]:
    """Parse every configuration file of a repository and check the rules Triton checks
    only when it loads a model; returns ``{path: config}``.

    Rules: a config that sets ``name`` names its directory; every ``label_filename`` of an
    output is a file in the model's directory (Triton reads it at load); a Python-backend model has
    ``<version>/model.py`` (or its ``default_model_filename``) in every version directory
    and at least one version; an ensemble's steps call models of this repository, map only
    inputs and outputs that every configuration file of the called model declares, read
    only the ensemble's inputs or the steps' outputs, and produce every ensemble output.

    Raises:
        ConfigError: a file does not parse (file and line:column), or the list of broken
            rules, one per line, each naming its file.
    """
    repo = Path(model_repository)
    models = {child.name: model_config_paths(child) for child in sorted(repo.iterdir())
              if child.is_dir() and not child.name.startswith(".")}
    models = {name: paths for name, paths in models.items() if paths}
    configs = {path: read_config(path) for paths in models.values() for path in paths}
    problems = []
    for path, config in configs.items():
        model_dir = path.parent if path.name == "config.pbtxt" else path.parent.parent
        if config.name and config.name != model_dir.name:
            problems.append(f"{path}: name {config.name!r} is not the directory's name {model_dir.name!r} "
                            f"(Triton refuses the repository: set name: \"{model_dir.name}\" or remove the line)")
        problems += [f"{path}: output {o.name!r} names the label file {o.label_filename!r}, which is not in {model_dir}"
                     for o in config.output if o.label_filename and not (model_dir / o.label_filename).is_file()]
        if is_python_model(config):
            filename = config.default_model_filename or "model.py"
            versions = [d for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit()]
            if not versions:
                problems.append(f"{path}: Python model without a version directory (1/{filename})")
            problems += [f"{path}: Python model without {v.name}/{filename}" for v in versions
                         if not (v / filename).is_file()]
        if config.platform == "ensemble":
            problems += _ensemble_problems(path, config, models, configs)
    if problems:
        raise ConfigError("\n".join(problems))
    return configs


def repository_problems(model_repository: PathLike) -> List[str]:
    """What :func:`check_repository` refuses in ``model_repository``, one message a line
    (a config that does not parse too); empty when Triton would load it."""
    try:
        check_repository(model_repository)
    except ConfigError as exc:
        return str(exc).splitlines()
    return []


def _ensemble_problems(path: Path, config: ModelConfig, models: Mapping[str, List[Path]],
                       configs: Mapping[Path, ModelConfig]) -> List[str]:
    inputs, outputs = _tensor_names(config)
    steps = config.ensemble_scheduling.step
    # a dataflow graph: a step may read what a later-listed step writes
    available = set(inputs).union(*(set(s.output_map.values()) for s in steps))
    problems = []
    for n, step in enumerate(steps, 1):
        where = f"{path}: step {n} ({step.model_name})"
        if step.model_name not in models:
            problems.append(f"{where}: no model {step.model_name!r} in {path.parent.parent}")
            continue
        for called in models[step.model_name]:
            step_inputs, step_outputs = _tensor_names(configs[called])
            problems += [f"{where}: input_map key {k!r} is not an input of {called}"
                         for k in step.input_map if k not in step_inputs]
            problems += [f"{where}: output_map key {k!r} is not an output of {called}"
                         for k in step.output_map if k not in step_outputs]
        problems += [f"{where}: reads {v!r}, neither an ensemble input nor a step's output"
                     for v in step.input_map.values() if v not in available]
    problems += [f"{path}: output {o!r} is produced by no step" for o in sorted(outputs - available)]
    return problems


#: The router's recommended queue policy (docs/guides/reliability.md "Overload"): Triton's
#: ``dynamic_batching.default_queue_policy`` fields. Not in the shipped config: under any
#: queue policy Triton 2.51's dynamic batcher stops prefetching and can miss the wakeup of a
#: finished execute, idling up to 500 ms (core r24.10 ``DynamicBatchScheduler::
#: WaitForPayloadSlotAvailable``; the same code in core main of 2026-06); measured with
#: ``make bench`` on the embedded server: the router's p99 at concurrency 1 went from about
#: 10 ms to about 510 ms.
QUEUE_POLICY: Dict[str, int] = {
    "max_queue_size": 16,
    "default_timeout_microseconds": 5_000_000,
    "allow_timeout_override": True,
    "timeout_action": model_config_pb2.ModelQueuePolicy.REJECT,
}
#: Priority levels with :data:`QUEUE_POLICY`: ``priority: 1`` has its own queue, served first.
QUEUE_PRIORITY_LEVELS = 2


def add_queue_policy(path: PathLike, fields: Optional[Mapping[str, int]] = None,
                     priority_levels: int = QUEUE_PRIORITY_LEVELS, header: Optional[Iterable[str]] = None) -> Path:
    """Give the model at config ``path`` Triton's queue policy: :data:`QUEUE_POLICY` with
    ``fields`` over it, and ``priority_levels`` (the default level the lowest), through
    ``model_config.proto``; the file is rewritten with ``header`` as its comment lines
    (default: the ones it has).

    Raises:
        ConfigError: the config cannot be read or has no ``dynamic_batching``.
    """
    config = read_config(path)
    if not config.HasField("dynamic_batching"):
        raise ConfigError(f"{path}: no dynamic_batching to give a queue policy")
    policy = config.dynamic_batching.default_queue_policy
    for key, value in {**QUEUE_POLICY, **(fields or {})}.items():
        setattr(policy, key, value)
    config.dynamic_batching.priority_levels = priority_levels
    config.dynamic_batching.default_priority_level = priority_levels
    return write_config(path, config, header_lines(path) if header is None else header)


def write_label_file(model_dir: Path, head: Head, filename: str = LABEL_FILE) -> Path:
    """Write ``<model_dir>/<filename>``, the label file of Triton's classification
    extension: ``head.output_labels()``, one a line, in output column order."""
    path = Path(model_dir) / filename
    write_atomic(path, "".join(f"{x}\n" for x in head.output_labels()).encode("utf-8"), 0o644)
    return path
