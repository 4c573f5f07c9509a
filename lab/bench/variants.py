"""The benchmark's copy of the model repository with the variant models of
:data:`lab.bench.plan.VARIANTS` added."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from lab.bench.plan import REPO, ROOT, VARIANTS, BenchError
from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.files import sha256_file
from orchestrator.tooling.repository import copy_model, get_parameter, read_config, rename_steps, set_parameter, write_config


def make_bench_repository(dest: Path | str, source: Path | str = REPO,
                          variants: Mapping[str, dict] = VARIANTS) -> Path:
    """Copy ``source`` to ``dest`` and add ``variants`` (see :data:`VARIANTS`); returns ``dest``.

    A variant with ``source`` is a model directory kept outside the repository (relative to
    the project root), copied as it is (:func:`copy_source_model`). Any other variant is a
    copy of its base model's directory (:func:`orchestrator.tooling.repository.copy_model`:
    ``name`` set in ``config.pbtxt`` and every ``configs/*.pbtxt``) with its parameters and
    ensemble step models changed there, through ``model_config.proto``.
    Raises BenchError if a base model or a parameter or step it changes is missing, a
    config is invalid, or ``dest`` exists.
    """
    source, dest = Path(source), Path(dest)
    if dest.exists():
        raise BenchError(f"{dest} already exists")
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name, spec in variants.items():
        target = dest / name
        if "source" in spec:
            copy_source_model(name, spec["source"], target)
            continue
        _copy_variant(dest, source, name, spec, target)
    return dest


def _copy_variant(dest: Path, source: Path, name: str, spec: Mapping, target: Path) -> None:
    """One ``base`` variant of :func:`make_bench_repository`, written to ``target``."""
    base = spec["base"]
    where = f"variant {name} (base {base})"
    if not (dest / base / "config.pbtxt").is_file():
        raise BenchError(f"{where}: {source / base / 'config.pbtxt'} not found")
    if target.exists():
        raise BenchError(f"{where}: the repository already has a model {name!r}")
    header = [f"Benchmark variant {name} of {base} (lab.bench.VARIANTS)."]
    try:
        for path in copy_model(dest / base, target, header):
            config = read_config(path)
            for key, value in spec.get("parameters", {}).items():
                if get_parameter(config, key) is None:
                    raise BenchError(f"{where}, {path.name}: the base config has no parameter {key!r}; "
                                     "update lab.bench.VARIANTS")
                set_parameter(config, key, value)
            for key, value in spec.get("add_parameters", {}).items():  # set whether or not the base has it
                set_parameter(config, key, value)
            for old, new in spec.get("replace_models", {}).items():
                if not rename_steps(config, {old: new}):
                    raise BenchError(f"{where}, {path.name}: no ensemble step with model_name {old!r}")
            _drop_outputs(config, spec.get("drop_outputs", ()), f"{where}, {path.name}")
            write_config(path, config, header)
    except ConfigError as exc:
        raise BenchError(f"{where}: {exc}") from None
    if "policy_root" in spec or "policy_extra" in spec:
        _replace_policy_root(target, spec.get("policy_root"), where, spec.get("policy_extra"))
    if "cascade_margins" in spec:
        set_cascade_margins(target, spec["cascade_margins"], where)


def _drop_outputs(config: Any, outputs: Sequence[str], where: str) -> None:
    """Remove ``outputs`` from ``config`` (a ``ModelConfig``); BenchError naming one it lacks."""
    for output in outputs:
        names = [o.name for o in config.output]
        if output not in names:
            raise BenchError(f"{where}: the base config has no output {output!r}")
        del config.output[names.index(output)]


def copy_source_model(name: str, source: Path | str, target: Path) -> None:
    """Copy a model directory kept outside the model repository (a :data:`VARIANTS` entry's
    ``source``, relative to the project root, e.g. ``lab/bench/hand_bls``) to ``target``,
    named ``name`` in its ``config.pbtxt``. Raises BenchError when ``source`` has no
    ``config.pbtxt``, its config is invalid, or ``target`` exists."""
    path = Path(source)
    path = path if path.is_absolute() else ROOT / path
    where = f"variant {name} (source {source})"
    if not (path / "config.pbtxt").is_file():
        raise BenchError(f"{where}: {path / 'config.pbtxt'} not found")
    if target.exists():
        raise BenchError(f"{where}: the repository already has a model {name!r}")
    try:
        copy_model(path, target, [f"Benchmark model {name}, copied from {source} (lab.bench.VARIANTS)."])
    except ConfigError as exc:
        raise BenchError(f"{where}: {exc}") from None


def _replace_policy_root(model_dir: Path, root: Optional[Mapping], where: str, extra: Optional[Mapping] = None) -> None:
    """Replace the ``root`` of the model's policy file (named by the config's ``policy``
    parameter; YAML, or JSON for ``.json``), keeping its other settings; the result is
    validated with ``orchestrator.runtime.routing.policy``. Raises BenchError."""
    import yaml

    policy = get_parameter(read_config(model_dir / "config.pbtxt"), "policy")
    if not policy:
        raise BenchError(f"{where}: the base config has no 'policy' parameter; update lab.bench.VARIANTS")
    path = model_dir / policy
    try:
        text = path.read_text()
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise BenchError(f"{where}: cannot read the base policy {path.name}: {exc}") from exc
    if not isinstance(document, dict):
        raise BenchError(f"{where}: the base policy {path.name} is not a mapping")
    if root is not None:
        document = {**document, "root": json.loads(json.dumps(root))}
    document = {**document, **json.loads(json.dumps(extra or {})),
                "description": f"Benchmark only (lab.bench): {where}, derived from the base policy."}
    try:
        from orchestrator.runtime.routing.policy import PolicyError, parse_policy
    except ImportError:  # no policy module: the server reports a bad policy at load
        pass
    else:
        try:
            parse_policy(document)
        except PolicyError as exc:
            raise BenchError(f"{where}: invalid policy: {exc}") from exc
    path.write_text(json.dumps(document, indent=1) if path.suffix == ".json" else yaml.safe_dump(document, sort_keys=False))


def set_cascade_margins(model_dir: Path, margins: Mapping[str, float], where: str) -> None:
    """Set the ``margin`` of each cascade node named in ``margins`` (name -> margin) in the
    model's policy file (named by the config's ``policy`` parameter), edited by tune's own
    editor (:func:`orchestrator.tooling.tune.edit_policy_text`: every other byte kept) and
    checked by the policy parser. Raises BenchError: no ``policy`` parameter, no such
    cascade, or an edit that does not parse."""
    import yaml

    from orchestrator.runtime.routing.policy import PolicyError, parse_policy
    from orchestrator.tooling.errors import TuneError
    from orchestrator.tooling.tune import edit_policy_text

    policy = get_parameter(read_config(model_dir / "config.pbtxt"), "policy")
    if not policy:
        raise BenchError(f"{where}: the base config has no 'policy' parameter; update lab.bench.VARIANTS")
    path = model_dir / policy
    edits = [("cascade", name, "margin", float(m), f"lab.bench variant: margin {m:g}") for name, m in margins.items()]
    try:
        text = edit_policy_text(path.read_text(encoding="utf-8"), edits)
        parse_policy(yaml.safe_load(text))
    except (TuneError, PolicyError) as exc:
        raise BenchError(f"{where}: {exc}") from None
    path.write_text(text, encoding="utf-8")


def model_files(repo: Path) -> Dict[str, dict]:
    """sha256 and size of each ``*/1/model.onnx`` (identifies the models measured)."""
    out = {}
    for path in sorted(repo.glob("*/1/model.onnx")):
        out[path.parent.parent.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return out

