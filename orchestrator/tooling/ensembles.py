"""An ensemble's configuration checked as Triton 2.51 checks it when it loads the ensemble.

``orchestrator migrate`` refuses what Triton refuses, with Triton's reason, before it writes
anything. The checks and their messages follow Triton's core (github.com/triton-inference-
server/core, BSD-3-Clause): ``model_config_utils.cc`` (``ValidateEnsembleSchedulingConfig``,
``BuildEnsembleGraph``: the ensemble's own configuration), the model repository manager's
dependency graph (models not available, required versions, circular dependencies between
ensembles) and ``ensemble_utils.cc`` (``ValidateEnsembleConfig``: each step against its
model's configuration: names, data types, shapes, batch sizes, decoupled branches). Triton's
own QA cases (server ``qa/L0_model_config/autofill_noplatform/ensemble``) are refused with
their expected messages (tests/unit/test_migrate_validation.py).

Where Triton's message depends on the iteration order of a hash map (several unused tensors),
every offending tensor is named, one message each, joined by ``"; "``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.repository import ModelConfig, config_path, model_config_pb2, read_config, served_versions

ENSEMBLE_PLATFORM = "ensemble"
WILDCARD = -1

__all__ = ["EnsembleError", "RepoModel", "Repository", "served_versions", "check_ensemble", "dims_text"]


class EnsembleError(ToolingError):
    """Triton would refuse to load the ensemble; the message is Triton's reason."""


@dataclass
class RepoModel:
    """One model of a repository: its name (the directory's), configuration and the
    versions Triton serves of it."""

    name: str
    directory: Path
    config: ModelConfig
    versions: List[int]

    @property
    def is_ensemble(self) -> bool:
        return self.config.platform == ENSEMBLE_PLATFORM

    @property
    def decoupled(self) -> bool:
        return bool(self.config.model_transaction_policy.decoupled)


class Repository:
    """The models of a model repository, read on first use with the configuration Triton
    reads for ``--model-config-name=config_name`` (``configs/<name>.pbtxt``, else
    ``config.pbtxt``)."""

    def __init__(self, root: Path, config_name: Optional[str] = None):
        self.root = Path(root)
        self.config_name = config_name
        self._models: Dict[str, Optional[RepoModel]] = {}

    def get(self, name: str) -> Optional[RepoModel]:
        """The model ``name``, or None when the repository has no configuration for it.

        Raises:
            ConfigError: its configuration does not parse.
        """
        if name not in self._models:
            directory = self.root / name
            path = config_path(directory, self.config_name) if name and directory.is_dir() else None
            if path is None:
                self._models[name] = None
            else:
                config = read_config(path)
                if not config.name:
                    config.name = name
                self._models[name] = RepoModel(name, directory, config, served_versions(directory, config))
        return self._models[name]


def dims_text(dims: Sequence[int]) -> str:
    """Triton's ``DimsListToString``: ``[-1,16]``."""
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def _dtype(value: int) -> str:
    return model_config_pb2.DataType.Name(value)


def check_ensemble(name: str, repo: Repository) -> RepoModel:
    """Check the ensemble ``name`` of ``repo`` as Triton loads it: its configuration, its
    steps' models (present, the versions it requires served; nested ensembles checked the
    same way, and no circle between ensembles), then each step's maps, data types and
    shapes against its model. Returns the ensemble.

    Raises:
        EnsembleError: Triton's reason for refusing it (the first, in Triton's order).
        ConfigError: a configuration file does not parse.
    """
    model = repo.get(name)
    if model is None:
        raise EnsembleError(f"no model configuration for '{name}' in {repo.root}")
    if not model.is_ensemble:
        if model.config.HasField("ensemble_scheduling"):
            raise EnsembleError(f"ensemble scheduling cannot be set for model '{model.config.name}' whose platform is not "
                                f"{ENSEMBLE_PLATFORM}")
        raise EnsembleError(f"model '{name}' is not an ensemble (platform '{model.config.platform}', "
                            f"backend '{model.config.backend}'): only ensembles are migrated")
    _check_dependencies(model, repo, [])
    return model


def _check_dependencies(model: RepoModel, repo: Repository, stack: List[str]) -> None:
    """Triton's order for one ensemble: its configuration, then its dependency graph
    (circles, models not available, versions), then the steps against their models; the
    nested ensembles are checked first, as Triton loads them first. An ensemble with a
    decoupled step is decoupled (Triton sets it so in the configuration it serves; here in
    ``model.config``)."""
    check_scheduling_config(model.config)
    stack = stack + [model.name]
    steps = model.config.ensemble_scheduling.step
    missing = []
    for step in steps:
        if step.model_name in stack:
            raise EnsembleError(f"circular dependency between ensembles: {step.model_name} -> ... -> {model.name} -> "
                                f"{step.model_name}")
        sub = repo.get(step.model_name)
        if sub is None:
            if step.model_name not in missing:
                missing.append(step.model_name)
        elif sub.is_ensemble:
            _check_dependencies(sub, repo, stack)
    autofilled = [m for m in missing if (repo.root / m).is_dir()]
    if autofilled:
        raise EnsembleError(f"model '{autofilled[0]}' of ensemble '{model.config.name}' has no configuration file in "
                            f"{repo.root / autofilled[0]}: Triton may fill one in from the model file, migrate needs "
                            "it written (the server's: GET /v2/models/<model>/config, as config.pbtxt)")
    if missing:
        raise EnsembleError(f"ensemble {model.config.name} contains models that are not available or ambiguous: "
                            f"{', '.join(missing)}")
    for step in steps:
        sub = repo.get(step.model_name)
        assert sub is not None
        version = int(step.model_version)
        if version >= 0 and version not in sub.versions or version < 0 and not sub.versions:
            raise EnsembleError(f"ensemble '{model.config.name}' depends on '{step.model_name}' whose required version "
                                f"{version} is not loaded")
    if check_steps(model.config, {s.model_name: repo.get(s.model_name).config for s in steps}):  # type: ignore[union-attr]
        model.config.model_transaction_policy.decoupled = True
    if not model.versions:
        raise EnsembleError(f"ensemble '{model.config.name}' has no version directory to serve in {model.directory} "
                            "(Triton serves an ensemble from an empty version directory such as 1/)")


@dataclass
class _Tensor:
    """A node of the ensemble's data-flow graph (model_config_utils.cc ``EnsembleTensor``)."""

    is_output: bool
    ready: bool = False
    prev: List["_Tensor"] = field(default_factory=list)
    next: List["_Tensor"] = field(default_factory=list)


def check_scheduling_config(config: ModelConfig) -> None:
    """The checks Triton makes on an ensemble's own configuration (no other model read).

    Raises:
        EnsembleError: Triton's message.
    """
    _check_fields(config)
    _check_dataflow(config, _build_graph(config))


def _check_fields(config: ModelConfig) -> None:
    name = config.name
    if config.backend:
        raise EnsembleError(f"Ensemble model '{name}' must have platform type 'ensemble' and empty backend type")
    if not config.HasField("ensemble_scheduling"):
        raise EnsembleError(f"ensemble scheduling must be set for ensemble {name} whose platform is ensemble")
    if len(config.instance_group):
        raise EnsembleError(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise EnsembleError(f"optimization should not be specified for ensemble '{name}'")
    if len(config.model_warmup):
        raise EnsembleError(f"model_warmup can not be specified for ensemble '{name}'")
    if not len(config.ensemble_scheduling.step):
        raise EnsembleError(f"must specify 'step' for ensemble '{name}'")


def _check_dataflow(config: ModelConfig, tensors: Dict[str, _Tensor]) -> None:
    name = config.name
    queue = []
    for io in config.input:
        node = tensors.get(io.name)
        if node is None:
            raise EnsembleError(f"ensemble input '{io.name}' for ensemble {name}' is not used")
        node.ready = True
        queue.append(node)
    while queue:
        for nxt in queue.pop(0).next:
            if not nxt.ready and all(p.ready for p in nxt.prev):
                nxt.ready = True
                queue.append(nxt)
    outputs = set()
    for io in config.output:
        node = tensors.get(io.name)
        if node is None:
            raise EnsembleError(f"ensemble output '{io.name}' for ensemble {name}' is not used")
        if not node.ready:
            cause = _unconnected(io.name, tensors, {i.name for i in config.input})
            raise EnsembleError(f"output '{io.name}' for ensemble '{name}' is not written"
                                + (f": at least one of its depending tensors, '{cause}', is not connected" if cause else ""))
        outputs.add(io.name)
    unused = [t for t, node in tensors.items() if t not in outputs and (not node.ready or not node.next)]
    if unused:
        raise EnsembleError("; ".join(f"ensemble tensor '{t}' is unused in ensemble '{name}'" for t in unused))


def _build_graph(config: ModelConfig) -> Dict[str, _Tensor]:
    tensors: Dict[str, _Tensor] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        for what in ("model_name", "input_map", "output_map"):
            if not getattr(step, what):
                raise EnsembleError(f"must specify '{what}' in step {index} of ensemble '{config.name}'")
        written = []
        for tensor in step.output_map.values():
            node = tensors.get(tensor)
            if node is None:
                node = tensors[tensor] = _Tensor(is_output=True)
            elif node.is_output:
                raise EnsembleError(f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                                    f"'{config.name}' step {index}")
            else:
                node.is_output = True
            written.append(node)
        # a protobuf map keeps one value per key: a model input mapped twice in the file is
        # mapped to the last tensor named (and the other tensor is then unused)
        for tensor in step.input_map.values():
            node = tensors.setdefault(tensor, _Tensor(is_output=False))
            for out in written:
                out.prev.append(node)
                node.next.append(out)
    return tensors


def _unconnected(output: str, tensors: Dict[str, _Tensor], inputs: set) -> Optional[str]:
    """A tensor ``output`` depends on that is neither an ensemble input nor written by a
    step (None when the output only waits on a circle)."""
    names = {id(node): t for t, node in tensors.items()}
    seen, todo = set(), [tensors[output]]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        name = names[id(node)]
        if not node.is_output and name not in inputs:
            return name
        todo.extend(p for p in node.prev if not p.ready)
    return None


@dataclass
class _Node:
    """A node of ensemble_utils.cc's graph: an ensemble tensor with the type and shape
    inferred from the first model that names it."""

    model: str
    batching: bool
    dtype: int
    dims: Tuple[int, ...]
    decoupled: bool = False
    label: int = 0
    visited: bool = False
    prev: List["_Node"] = field(default_factory=list)
    next: List["_Node"] = field(default_factory=list)
    sibling: Optional["_Node"] = None

    @property
    def full_dims(self) -> Tuple[int, ...]:
        return ((WILDCARD,) if self.batching else ()) + self.dims


def _dims_match(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or WILDCARD in (x, y) for x, y in zip(a, b))


def _consistent(lhs: _Node, rhs: _Node, prefix: str) -> None:
    if lhs.dtype != rhs.dtype:
        raise EnsembleError(f"{prefix}inconsistent data type: {_dtype(lhs.dtype)} is inferred from model {lhs.model} "
                            f"while {_dtype(rhs.dtype)} is inferred from model {rhs.model}")
    if not _dims_match(lhs.dims, rhs.dims) and not _dims_match(lhs.full_dims, rhs.full_dims):
        raise EnsembleError(f"{prefix}inconsistent shape: {dims_text(lhs.full_dims)} is inferred from model {lhs.model} "
                            f"while {dims_text(rhs.full_dims)} is inferred from model {rhs.model}")


def _io_dims(io) -> Tuple[int, ...]:
    return tuple(io.reshape.shape) if io.HasField("reshape") else tuple(io.dims)


def check_steps(config: ModelConfig, models: Dict[str, ModelConfig]) -> bool:
    """The steps of the ensemble ``config`` against their models' configurations
    (``models``: step model name -> configuration): batch sizes, every model input mapped
    once, maps naming existing inputs and outputs, one data type and a compatible shape per
    ensemble tensor, no step receiving inputs from different decoupled models. Returns
    whether the ensemble is decoupled (a step's model is).

    Raises:
        EnsembleError: Triton's message.
    """
    ens = config.name
    batching = config.max_batch_size > 0
    tensors: Dict[str, _Node] = {}
    for io in config.input:
        tensors[io.name] = _Node(ens, batching, io.data_type, _io_dims(io))
    sink = _Node(ens, False, 0, ())
    for io in config.output:
        node = tensors.setdefault(io.name, _Node(ens, batching, io.data_type, _io_dims(io)))
        sink.prev.append(node)
        node.next.append(sink)
    for step in config.ensemble_scheduling.step:
        sub = models[step.model_name]
        if sub.max_batch_size != 0 and sub.max_batch_size < config.max_batch_size:
            raise EnsembleError(f"ensemble {ens} allows maximum batch size {config.max_batch_size}, but it contains model "
                                f"{step.model_name} which only allows maximum batch size to be {sub.max_batch_size}")
        _map_step(ens, step, sub, tensors)
    return _check_decoupled(ens, config, tensors)


def _map_step(ens: str, step, sub: ModelConfig, tensors: Dict[str, _Node]) -> None:
    _map_inputs(ens, step, sub, tensors)
    _map_outputs(ens, step, sub, tensors)
    for tensor in step.output_map.values():
        node = tensors[tensor]
        node.decoupled = bool(sub.model_transaction_policy.decoupled)
        for source in step.input_map.values():
            node.prev.append(tensors[source])
            tensors[source].next.append(node)


def _map_inputs(ens: str, step, sub: ModelConfig, tensors: Dict[str, _Node]) -> None:
    batching = sub.max_batch_size > 0
    model = step.model_name
    inputs = {io.name: io for io in sub.input}
    for key, tensor in step.input_map.items():
        if key not in inputs:
            raise EnsembleError(f"in ensemble {ens}, ensemble tensor {tensor} is mapping to non-existing input {key} "
                                f"in model {model}")
    for io in sub.input:
        if io.name not in step.input_map:
            if io.optional:
                continue
            raise EnsembleError(f"in ensemble {ens}, input {io.name} in model {sub.name or model} is not mapped to any "
                                "ensemble tensors")
        tensor = step.input_map[io.name]
        node = _Node(model, batching, io.data_type, tuple(io.dims))
        if tensor in tensors:
            _consistent(tensors[tensor], node, f"in ensemble {ens}, ensemble tensor {tensor}: ")
        else:
            tensors[tensor] = node


def _map_outputs(ens: str, step, sub: ModelConfig, tensors: Dict[str, _Node]) -> None:
    batching = sub.max_batch_size > 0
    model = step.model_name
    outputs = {io.name: io for io in sub.output}
    for key, tensor in step.output_map.items():
        if key not in outputs:
            raise EnsembleError(f"in ensemble {ens}, ensemble tensor {tensor} is mapped from non-existing output {key} "
                                f"in model {model}")
    sibling = _Node(model, False, 0, ())
    for key, tensor in step.output_map.items():
        io = outputs[key]
        node = _Node(model, batching, io.data_type, tuple(io.dims))
        if tensor in tensors:
            _consistent(tensors[tensor], node, f"in ensemble {ens}, ensemble tensor {tensor}: ")
        else:
            tensors[tensor] = node
        tensors[tensor].sibling = sibling


def _check_decoupled(ens: str, config: ModelConfig, tensors: Dict[str, _Node]) -> bool:
    labels = 0
    queue = []
    for io in config.input:
        tensors[io.name].visited = True
        queue.append(tensors[io.name])
    while queue:
        for nxt in queue.pop(0).next:
            if nxt.visited or not all(p.visited for p in nxt.prev):
                continue
            label = nxt.prev[0].label
            if any(p.label != label for p in nxt.prev):
                raise EnsembleError(f"in ensemble {ens}, step of model '{nxt.model}' receives inputs originated from "
                                    "different decoupled models")
            if nxt.sibling is not None and nxt.sibling.visited:
                nxt.label = nxt.sibling.label
            else:
                if nxt.decoupled:
                    labels += 1
                    nxt.label = labels
                else:
                    nxt.label = label
                if nxt.sibling is not None:
                    nxt.sibling.label, nxt.sibling.visited = nxt.label, True
            nxt.visited = True
            queue.append(nxt)
    return labels != 0
