"""Model configurations as the mock loads them: read, filled in, checked.

Files are parsed into Triton's ``ModelConfig`` message (the mock's own declaration of
``model_config.proto``'s layout, :mod:`orchestrator.testing.mock.model_config`, and protobuf
``text_format``: the grammar Triton's core parses; the mock imports neither tritonclient nor
the tooling), so a
misspelled field fails here as in the server. What Triton fills in before the backend sees the configuration
(default version policy and instance group, ``KIND_AUTO`` -> ``KIND_CPU``) is filled in
here; the dict handed to the model is protobuf's JSON with default fields printed and
int64 values as numbers, like the core's ``ModelConfigToJson``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Tuple

from google.protobuf import json_format, text_format

from orchestrator.testing.mock.errors import LoadError
from orchestrator.testing.mock.model_config import ModelConfig


def config_file(model_dir: Path, config_name: Optional[str]) -> Path:
    """The file Triton reads for ``--model-config-name=config_name``
    (``configs/<name>.pbtxt`` where it exists, else ``config.pbtxt``, which may be
    missing)."""
    if config_name:
        candidate = model_dir / "configs" / f"{config_name}.pbtxt"
        if candidate.is_file():
            return candidate
    return model_dir / "config.pbtxt"


def _has_model_py(model_dir: Path) -> bool:
    return model_dir.is_dir() and any(
        p.is_dir() and p.name.isdigit() and (p / "model.py").is_file() for p in model_dir.iterdir()
    )


def read(name: str, model_dir: Path, config_name: Optional[str],
         override: Optional[str], auto_complete: bool = True) -> Tuple[ModelConfig, Path]:
    """The configuration of model ``name`` and where it came from.

    ``override``: a JSON configuration replacing the file (``pb_utils.load_model(name,
    config=...)``); its path is ``<config override>``. Without a file, with ``auto_complete``
    and a ``<version>/model.py``, the configuration is ``backend: "python"`` alone, as
    Triton's auto-complete starts it (the model's ``auto_complete_config`` completes it). Raises :class:`LoadError` for a
    missing or invalid configuration or a ``name`` field that differs from the
    directory name (Triton's message).
    """
    path = config_file(model_dir, config_name)
    if override is not None:
        config = ModelConfig()
        try:
            json_format.Parse(override, config)
        except Exception as exc:
            raise LoadError(f"failed to load '{name}': invalid config override: {exc}") from exc
        path = Path("<config override>")
    elif not path.is_file() and auto_complete and _has_model_py(model_dir):
        # Triton's auto-complete (the default): no config.pbtxt, a model.py in a version
        # directory -> the Python backend; auto_complete_config fills in the rest
        config = ModelConfig()
        config.backend = "python"
    else:
        if not path.is_file():
            raise LoadError(
                f"failed to load '{name}': no model configuration at {path} (without "
                "auto-complete or a <version>/model.py, the mock does not generate one)"
            )
        try:
            config = ModelConfig()
            text_format.Parse(path.read_text(encoding="utf-8"), config)
        except OSError as exc:
            raise LoadError(f"failed to load '{name}': cannot parse {path}: cannot read model configuration: {exc.strerror}") from exc
        except text_format.ParseError as exc:
            raise LoadError(f"failed to load '{name}': cannot parse {path}:{exc}") from exc
        except UnicodeDecodeError as exc:
            raise LoadError(f"failed to load '{name}': cannot parse {exc}") from exc
    if not config.name:
        config.name = name
    elif config.name != name:
        raise LoadError(
            f"unexpected directory name '{name}' for model '{config.name}', directory "
            "name must equal model name"
        )
    return config, path


def from_dict(data: dict) -> ModelConfig:
    """A ``ModelConfig`` from its JSON dict (what ``auto_complete_config`` returns).

    Raises protobuf's ``ParseError`` for a dict that is not a ``ModelConfig``.
    """
    config = ModelConfig()
    json_format.ParseDict(data, config)
    return config


#: core r24.10 ``SEQUENCE_IDLE_DEFAULT_MICROSECONDS`` (1 s).
SEQUENCE_IDLE_DEFAULT_US = 1000000


def _normalize_batchers(config: ModelConfig) -> None:
    if config.HasField("dynamic_batching") and not config.dynamic_batching.preferred_batch_size:
        if config.max_batch_size > 0:
            config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if sequence.HasField("oldest") and not sequence.oldest.preferred_batch_size and config.max_batch_size > 0:
            sequence.oldest.preferred_batch_size.append(config.max_batch_size)


def normalize(config: ModelConfig) -> None:
    """Fill in what Triton fills in before handing the config to the backend (core r24.10
    ``NormalizeModelConfig``, again after the backend's auto-complete, and
    ``NormalizeInstanceGroup``): the version policy; an empty ``preferred_batch_size`` of
    the dynamic batcher (and of the sequence batcher's ``oldest`` strategy) becomes
    ``[max_batch_size]``; the sequence batcher's idle time defaults to 1 s; pinned input and
    output memory are enabled unless set; the instance groups; and, from
    ``AutoCompleteBackendFields``, a Python model's ``default_model_filename`` ``model.py``."""
    if config.backend == "python" and not config.default_model_filename:
        config.default_model_filename = "model.py"
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    _normalize_batchers(config)
    if config.platform == "ensemble":
        return
    if not config.optimization.HasField("input_pinned_memory"):
        config.optimization.input_pinned_memory.enable = True
    if not config.optimization.HasField("output_pinned_memory"):
        config.optimization.output_pinned_memory.enable = True
    if not config.instance_group:
        group = config.instance_group.add()
        group.name = config.name
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == group.KIND_AUTO:
            group.kind = group.KIND_CPU
        if group.count < 1:
            group.count = 1


def to_dict(config: ModelConfig) -> dict:
    """The JSON dict the model gets in ``args["model_config"]`` (field names as in the
    proto, default fields printed, int64 as ints)."""
    try:
        data = json_format.MessageToDict(
            config,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
    except TypeError:  # protobuf < 5.26
        data = json_format.MessageToDict(
            config,
            preserving_proto_field_name=True,
            including_default_value_fields=True,
        )
    _fix_int64(config.DESCRIPTOR, data)
    return data


def _is_repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)
    if isinstance(flag, bool):
        return flag
    if callable(flag):  # pragma: no cover - other protobuf versions
        return bool(flag())
    return field.label == field.LABEL_REPEATED  # pragma: no cover


def _fix_int64(descriptor: Any, data: dict) -> None:
    """Turn protobuf-JSON int64 strings back into ints (Triton's ModelConfigToJson)."""
    from google.protobuf.descriptor import FieldDescriptor

    int64_types = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            message = field.message_type
            if message.GetOptions().map_entry:
                value_field = message.fields_by_name["value"]
                for key in list(value):
                    if value_field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                        _fix_int64(value_field.message_type, value[key])
                    elif value_field.cpp_type in int64_types:
                        value[key] = int(value[key])
            elif _is_repeated(field):
                for item in value:
                    _fix_int64(message, item)
            else:
                _fix_int64(message, value)
        elif field.cpp_type in int64_types:
            if _is_repeated(field):
                data[field.name] = [int(v) for v in value]
            else:
                data[field.name] = int(value)


def pick_versions(name: str, model_dir: Path, config: dict) -> List[str]:
    """The version directories Triton serves under ``version_policy``, lowest first:
    ``latest { num_versions: n }`` (the default, n = 1) the n highest, ``all`` every
    numeric one, ``specific { versions }`` those listed that exist. Raises
    :class:`LoadError` when none fits."""
    versions = sorted(
        int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()
    )
    policy = config.get("version_policy") or {}
    if "specific" in policy:
        wanted = {int(v) for v in policy["specific"].get("versions", [])}
        versions = [v for v in versions if v in wanted]
    elif "all" not in policy:
        latest = int((policy.get("latest") or {}).get("num_versions") or 1)
        versions = versions[-latest:]
    if not versions:
        raise LoadError(
            f"failed to load '{name}': at least one version must be available under the "
            f"version policy of model '{name}'"
        )
    return [str(v) for v in versions]


def validate_io(name: str, config: dict) -> None:
    """Triton's load-time checks of ``input``/``output``: a unique name, a ``data_type``
    and ``dims`` (or ``reshape``) each. Raises :class:`LoadError`."""
    for kind in ("input", "output"):
        seen = set()
        for io in config.get(kind, []):
            io_name = io.get("name", "")
            if not io_name:
                raise LoadError(f"failed to load '{name}': model {kind} must specify 'name'")
            if io_name in seen:
                raise LoadError(
                    f"failed to load '{name}': {kind} '{io_name}' specified more than once"
                )
            seen.add(io_name)
            if io.get("data_type", "TYPE_INVALID") == "TYPE_INVALID":
                raise LoadError(
                    f"failed to load '{name}': model {kind} '{io_name}' must specify "
                    "'data_type'"
                )
            if not io.get("dims") and "reshape" not in io:
                raise LoadError(
                    f"failed to load '{name}': model {kind} '{io_name}' must specify 'dims'"
                )
