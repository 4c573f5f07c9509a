"""Ensembles: checked and ordered when loaded, run step by step.

At load time every composing model is loaded and each step's tensors are checked
against the composing models' configurations (names and datatypes), in dependency
order, as Triton's ensemble scheduler does when it builds the pipeline. A request runs
the steps one after the other in that order (Triton may run independent steps
concurrently); parameters, id, correlation id, flags and timeout go to every step.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

from orchestrator.testing.mock.config import validate_io
from orchestrator.testing.mock.errors import ErrorCode, LoadError
from orchestrator.testing.mock.instances import LoadedModel, Step
from orchestrator.testing.mock.records import Err, Ok, Req, Result


def _steps(model: LoadedModel) -> List[Step]:
    raw = (model.config.get("ensemble_scheduling") or {}).get("step") or []
    if not raw:
        raise LoadError(
            f"failed to load '{model.name}': ensemble must specify 'ensemble_scheduling.step'"
        )
    return [
        Step(
            s.get("model_name", ""), int(s.get("model_version", -1)),
            dict(s.get("input_map") or {}), dict(s.get("output_map") or {}),
        )
        for s in raw
    ]


def _io_config(name: str, step: Step, ios: Dict[str, dict], io_name: str, kind: str) -> dict:
    cfg = ios.get(io_name)
    if cfg is None:
        raise LoadError(
            f"failed to load '{name}': in ensemble step for '{step.model_name}', "
            f"'{io_name}' is not an {kind} of that model"
        )
    return cfg


def _check_step(name: str, step: Step, sub: LoadedModel, produced: Dict[str, str]) -> None:
    """Check one step's maps against its model; record the dtypes it produces."""
    for model_input, tensor in step.input_map.items():
        cfg = _io_config(name, step, sub.inputs, model_input, "input")
        if cfg["data_type"] != produced[tensor]:
            raise LoadError(
                f"failed to load '{name}': ensemble tensor '{tensor}' is "
                f"{produced[tensor]} but '{step.model_name}' input '{model_input}' "
                f"is {cfg['data_type']}"
            )
    for model_output, tensor in step.output_map.items():
        produced[tensor] = _io_config(name, step, sub.outputs, model_output, "output")["data_type"]


def _load_composing(name: str, step_model: str, load: Callable[[str], LoadedModel]) -> LoadedModel:
    try:
        model = load(step_model)
    except LoadError as exc:
        raise LoadError(
            f"failed to load '{name}': composing model '{step_model}' failed to load: {exc}"
        ) from exc
    if model.decoupled:  # Triton runs these; the mock does not
        raise LoadError(
            f"failed to load '{name}': composing model '{step_model}' is decoupled; the "
            "mock does not run decoupled models inside ensembles"
        )
    return model


def load_ensemble(model: LoadedModel, load: Callable[[str], LoadedModel]) -> LoadedModel:
    """Check an ensemble and order its steps; ``load(name)`` loads a composing model
    and returns it. Returns ``model``, initialized. Raises :class:`LoadError`."""
    name = model.name
    model.version_dir = None
    validate_io(name, model.config)
    steps = _steps(model)
    composing: Dict[str, LoadedModel] = {}
    for step in steps:
        if step.model_name == name:
            raise LoadError(f"failed to load '{name}': ensemble step refers to the ensemble itself")
        if step.model_name not in composing:
            composing[step.model_name] = _load_composing(name, step.model_name, load)
    # dtypes of ensemble tensors as they are produced
    produced: Dict[str, str] = {n: io["data_type"] for n, io in model.inputs.items()}
    order: List[Step] = []
    remaining = list(steps)
    while remaining:
        progressed = False
        for step in list(remaining):  # a step can use what an earlier one in this pass made
            if not all(t in produced for t in step.input_map.values()):
                continue
            _check_step(name, step, composing[step.model_name], produced)
            order.append(step)
            remaining.remove(step)
            progressed = True
        if not progressed:
            missing = sorted(
                {t for s in remaining for t in s.input_map.values() if t not in produced}
            )
            raise LoadError(
                f"failed to load '{name}': ensemble steps for "
                f"{sorted({s.model_name for s in remaining})} can never run: no step or "
                f"ensemble input produces {missing}"
            )
    for out_name, cfg in model.outputs.items():
        if out_name not in produced:
            raise LoadError(
                f"failed to load '{name}': ensemble output '{out_name}' is produced by no step"
            )
        if produced[out_name] != cfg["data_type"]:
            raise LoadError(
                f"failed to load '{name}': ensemble output '{out_name}' is "
                f"{produced[out_name]} where produced but {cfg['data_type']} in the ensemble "
                "configuration"
            )
    model.steps = order
    model.initialized = True
    return model


def run_ensemble(
    ensemble: LoadedModel,
    req: Req,
    lookup: Callable[[str, int], Optional[LoadedModel]],
    run: Callable[[LoadedModel, List[Req]], List[Result]],
) -> Result:
    """Run ``req`` (already validated against the ensemble) through the steps.

    ``lookup(name, version)``: the READY model of that name and version (-1: the
    highest) or None; ``run(model, reqs)``: the
    server's validation and execution. Step errors come back with stage ``"exec"`` (a
    client sees the composing model's message as is).
    """
    tensors: Dict[str, tuple] = {name: (dtype, array) for name, dtype, array in req.inputs}
    for step in ensemble.steps:
        sub = lookup(step.model_name, step.model_version)
        if sub is None or not sub.ready:
            return Err(
                f"Request for unknown model: '{step.model_name}' has no available versions",
                ErrorCode.NOT_FOUND, "exec",
            )
        absent = [v for v in step.input_map.values() if v not in tensors]
        if absent:
            return Err(
                f"in ensemble '{ensemble.name}', tensor(s) {absent} needed by model "
                f"'{step.model_name}' are not available (optional ensemble inputs that "
                "were not sent are not supported by the mock)",
                ErrorCode.INVALID_ARG, "exec",
            )
        sub_req = req.derived(
            [(k, tensors[v][0], tensors[v][1]) for k, v in step.input_map.items()],
            list(step.output_map.keys()),
        )
        result = run(sub, [sub_req])[0]
        if isinstance(result, Err):
            return Err(result.message, result.code, "exec")
        produced = {name: (dtype, array) for name, dtype, array in result.outputs}
        for model_output, tensor in step.output_map.items():
            if model_output not in produced:
                return Err(
                    f"in ensemble '{ensemble.name}', model '{step.model_name}' did not "
                    f"return output '{model_output}' (ensemble tensor '{tensor}')",
                    ErrorCode.INTERNAL, "exec",
                )
            tensors[tensor] = produced[model_output]
    wanted = req.requested or list(ensemble.outputs)
    return Ok([(name, tensors[name][0], tensors[name][1]) for name in wanted])
