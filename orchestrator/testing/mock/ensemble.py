"""Ensembles: checked and ordered when loaded, run step by step.

At load time every composing model is loaded and each step's tensors are checked
against the composing models' configurations (names and datatypes), in dependency
order, as Triton's ensemble scheduler does when it builds the pipeline. A request runs
the steps one after the other in that order (Triton may run independent steps
concurrently; a documented difference), less those Triton 2.51 prunes from a request that
asks for some outputs only (:func:`_pruned`, its algorithm, flaws included: an unrequested
output that a later step also reads prunes its step, which then fails the request as
Triton does, INVALID_ARG "unexpected deadlock"); parameters, id, correlation id, flags and
timeout go to every step.

The response, as Triton 2.51's ensemble scheduler builds it (core
``src/ensemble_scheduler/ensemble_scheduler.cc``):

- each output has the dtype and shape its step produced (Triton never checks a composing
  model's output dtype against the ensemble's configuration);
- an output no step produced is left out of the response (no error); a later step reading
  such a tensor gets no input of that name, and the composing model's own validation
  answers (a non-optional input: its "missing required input" error);
- where a tensor goes between something that batches and something that does not
  (``ReshapeTensorDims``, for step inputs and the ensemble's outputs): into a batching model,
  a tensor whose shape is the per-row dims gets a batch dimension of 1; into a model or an
  ensemble output without batching, a tensor of batch size 1 whose shape is not the dims
  loses its batch dimension;
- the outputs come in the order of :func:`response_order`: Triton builds the response by
  iterating a ``std::unordered_map`` of the configuration's outputs, so its order is the
  iteration order of libstdc++'s hash table after inserting the outputs in configuration
  order (two outputs whose hashes fall in different buckets: the reverse of the
  configuration's order). Checked on Triton 2.51 (tests/server/test_migrate_server.py).
"""

from __future__ import annotations

import bisect
from typing import Callable, Dict, List, Optional, Sequence

from orchestrator.testing.mock.config import validate_io
from orchestrator.testing.mock.errors import ErrorCode, LoadError
from orchestrator.testing.mock.instances import LoadedModel, Step
from orchestrator.testing.mock.records import Err, Ok, Req, Result

_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995  # libstdc++ hash_bytes.cc, 64-bit size_t
_SEED = 0xC70F6907  # std::hash<std::string>'s seed (libstdc++ functional_hash.h)
# libstdc++ hashtable_c++0x.cc / hashtable-aux.cc: the bucket counts of _Prime_rehash_policy
_FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103,
           109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313, 337, 359, 383,
           409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953, 1031, 1109, 1193, 1289, 1381, 1493, 1613,
           1741, 1879, 2029, 2179, 2357, 2549, 2753, 2971, 3209, 3469, 3739, 4027, 4349, 4703, 5087, 5503, 5953)


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def std_hash(name: str) -> int:
    """``std::hash<std::string>`` of libstdc++ on a 64-bit platform (``_Hash_bytes``, a
    MurmurHash64A variant) of ``name``'s UTF-8 bytes."""
    data = name.encode("utf-8")
    n, aligned = len(data), len(data) & ~7
    h = _SEED ^ ((n * _MUL) & _MASK)
    for i in range(0, aligned, 8):
        h ^= (_shift_mix((int.from_bytes(data[i:i + 8], "little") * _MUL) & _MASK) * _MUL) & _MASK
        h = (h * _MUL) & _MASK
    if n & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * _MUL) & _MASK
    return _shift_mix((_shift_mix(h) * _MUL) & _MASK)


def _next_buckets(want: int) -> int:
    return _FAST_BUCKETS[want] if want < len(_FAST_BUCKETS) else _PRIMES[bisect.bisect_left(_PRIMES, want)]


def response_order(outputs: Sequence[str]) -> List[str]:
    """The order in which Triton 2.51's ensemble answers ``outputs`` (the configuration's
    output names, in configuration order): the iteration order of a libstdc++
    ``std::unordered_map<std::string, ...>`` after inserting them in that order (unique
    keys, max load factor 1, the prime rehash policy). A request that asks for some outputs
    gets them in this order too."""
    buckets, next_resize, items = 1, 0, []  # items: the hash table's one list, in iteration order

    def bucket(key: str) -> int:
        return std_hash(key) % buckets

    def insert(key: str) -> None:
        # _M_insert_bucket_begin: first of its bucket's group, else the front of the list
        same = [i for i, other in enumerate(items) if bucket(other) == bucket(key)]
        items.insert(same[0] if same else 0, key)

    for count, name in enumerate(outputs):
        if count + 1 > next_resize:  # _Prime_rehash_policy::_M_need_rehash
            least = max(count + 1, 0 if next_resize else 11)
            if least >= buckets:
                buckets = next_resize = _next_buckets(max(least + 1, buckets * 2))
                old, items = items, []
                for key in old:  # _M_rehash_aux: the same insertion rule, in the old order
                    insert(key)
            else:
                next_resize = buckets
        insert(name)
    return items


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
    ens_batching = ensemble.config.get("max_batch_size", 0) > 0
    # tensor -> (dtype, array, the batch size it came with: 0 from what does not batch)
    tensors: Dict[str, tuple] = {name: (dtype, array, _batch(array, ens_batching))
                                 for name, dtype, array in req.inputs}
    order = response_order(list(ensemble.outputs))
    wanted = [name for name in order if not req.requested or name in req.requested]
    pruned = _pruned(_steps(ensemble), list(ensemble.outputs), wanted)
    # tensors set (a placeholder included: an absent optional input, an output a step did not produce)
    ready = set(tensors) | {n for n, io in ensemble.inputs.items() if io.get("optional")}
    for step in ensemble.steps:
        if step in pruned or not ready.issuperset(step.input_map.values()):
            continue  # pruned, or never ready: Triton prunes the step that writes its input
        ready |= set(step.output_map.values())
        sub = lookup(step.model_name, step.model_version)
        if sub is None or not sub.ready:
            return Err(
                f"Request for unknown model: '{step.model_name}' has no available versions",
                ErrorCode.NOT_FOUND, "exec",
            )
        batching = sub.config.get("max_batch_size", 0) > 0
        # an input no step produced is not sent: the model's own validation answers
        inputs = [(k, tensors[v][0], _reshape(tensors[v][1], _config_dims(sub.inputs.get(k), False), batching,
                                              tensors[v][2])) for k, v in step.input_map.items() if v in tensors]
        sub_req = req.derived(inputs, list(step.output_map.keys()))
        result = run(sub, [sub_req])[0]
        if isinstance(result, Err):
            return Err(result.message, result.code, "exec")
        produced = {name: (dtype, array) for name, dtype, array in result.outputs}
        size = _batch(inputs[0][2], batching) if inputs else 0
        for model_output, tensor in step.output_map.items():
            if model_output in produced:  # else: Triton logs "did not output tensor" and goes on
                dtype, array = produced[model_output]
                tensors[tensor] = (dtype, array, size)
    if not ready.issuperset(wanted):
        return Err(f"in ensemble '{ensemble.name}', [request id: {req.request_id or '<id_unknown>'}] unexpected "
                   "deadlock, at least one output is not set while no more ensemble steps can be made",
                   ErrorCode.INVALID_ARG, "exec")
    return Ok([(name, tensors[name][0], _reshape(tensors[name][1], _config_dims(ensemble.outputs.get(name), True),
                                                 ens_batching, tensors[name][2]))
               for name in wanted if name in tensors])


def _batch(array, batching: bool) -> int:
    """The batch size a tensor carries: its first dimension where it comes from (or goes
    through) something that batches, else 0."""
    return int(array.shape[0]) if batching and getattr(array, "ndim", 0) >= 1 else 0


def _pruned(steps: List[Step], outputs: List[str], wanted: List[str]) -> List[Step]:
    """The steps Triton 2.51 prunes from a request for the ``wanted`` outputs (core
    ``ensemble_scheduler.cc``, ``EnsembleContext``'s backward traversal; ``steps`` in
    configuration order): each output not wanted, then each tensor no unpruned step
    reads any more, takes one off its writer's count of mapped outputs, and a step whose
    count reaches 0 is pruned. Its flaws kept: an output not wanted counts against its
    writer even where a later step reads it, and a tensor no step writes (an ensemble
    input) counts against step 0 (``std::map::operator[]``'s default)."""
    ignored = {o for o in outputs if o not in wanted}
    writer: Dict[str, int] = {}
    readers: Dict[str, set] = {}
    for i, step in enumerate(steps):
        for tensor in step.input_map.values():
            readers.setdefault(tensor, set()).add(i)
        for tensor in step.output_map.values():
            writer.setdefault(tensor, i)
    left: Dict[int, int] = {}
    pruned: List[Step] = []
    while ignored:
        again = set()
        for tensor in ignored:
            i = writer.get(tensor, 0)
            left[i] = left.get(i, len(steps[i].output_map)) - 1
            if left[i] == 0:
                pruned.append(steps[i])
                for t in steps[i].input_map.values():
                    readers.setdefault(t, set()).discard(i)
                    if not readers[t]:
                        again.add(t)
        ignored = again
    return pruned


def _config_dims(config: Optional[dict], reshaped: bool) -> Optional[List[int]]:
    """A config entry's dims (``reshaped``: its ``reshape`` where it has one, as Triton keeps
    an ensemble output's expected shape)."""
    if config is None:
        return None
    reshape = config.get("reshape") if reshaped else None
    return [int(d) for d in (reshape["shape"] if reshape else config.get("dims", []))]


def _matches(shape, dims: List[int]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims))


def _reshape(array, dims: Optional[List[int]], batching: bool, batch_size: int):
    """Triton's ``ReshapeTensorDims`` (core ``ensemble_scheduler.cc``): only where one side
    batches and the other does not. Into something that batches, a tensor whose shape is the
    per-row ``dims`` gets a batch dimension of 1; into something that does not, a tensor of
    batch size 1 whose shape is not ``dims`` loses its batch dimension."""
    if dims is None or not hasattr(array, "shape") or batching == (batch_size != 0):
        return array
    if batching:
        return array.reshape((1, *array.shape)) if _matches(array.shape, dims) else array
    if batch_size == 1 and not _matches(array.shape, dims):
        return array.reshape(array.shape[1:])
    return array
