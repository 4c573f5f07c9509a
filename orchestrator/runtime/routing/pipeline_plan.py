"""A parsed pipeline (``routing.pipeline``) bound to its router: checked against the router's
config (every tensor written once before it is read, no cycles, outputs declared, what a
branch may leave unwritten filled or omitted, literals cast to their tensors' dtypes) and
compiled into the plan ``execution.pipeline`` runs; and described for logs and
``orchestrator policy check``. Errors: :class:`~orchestrator.runtime.errors.PolicyError`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.conditions import check_literals
from orchestrator.runtime.routing.pipeline import Case, Pipeline, PNode, Step, Switch, node_reads, node_writes
from orchestrator.runtime.routing.tensors import RouterSpec, fill_array

__all__ = ["bind_pipeline", "fill_rows", "with_batches", "describe_pipeline", "switch_exports", "unneeded_nodes", "Pruning"]

# ----------------------------------------------------------------------------- binding


def switch_exports(pipeline: Pipeline) -> Dict[str, Tuple[str, ...]]:
    """Switch name -> the tensors it puts back for the nodes after it: those its branches
    write (or it fills) that a node outside it reads or that are pipeline outputs. A
    tensor only its own branches read stays inside the branch (it needs no fill)."""
    out: Dict[str, Tuple[str, ...]] = {}
    nodes = pipeline.nodes()
    for sw in (n for n in nodes if isinstance(n, Switch)):
        inside = {id(n) for n in Pipeline((), (sw,)).nodes()}
        read = set(pipeline.outputs)
        for n in nodes:
            if id(n) not in inside:
                read |= {t for _, t in n.inputs} if isinstance(n, Step) else {t for c in n.cases for t in c.when.tensors()}
        out[sw.name] = tuple(t for t in node_writes(sw) if t in read)
    return out


def _check_list(nodes: Sequence[PNode], available: Set[str], router: RouterSpec, dtypes: Mapping[str, Any], where: str,
                exports: Mapping[str, Tuple[str, ...]]) -> None:
    """Dataflow checks of one node list (the top level or a branch); see the module docstring."""
    writer: Dict[str, PNode] = {}
    inputs = {i.name for i in router.inputs}
    for n in nodes:
        for t in node_writes(n):
            if t in inputs:
                raise PolicyError(f"{n.where}: writes '{t}', which is a router input")
            if t in writer:
                raise PolicyError(f"{n.where}: writes '{t}', which {writer[t].where} writes too (one writer per tensor)")
            writer[t] = n
    deps: Dict[str, Set[str]] = {}
    for n in nodes:
        for t in node_reads(n):
            if t not in available and (t not in writer or writer[t] is n):
                raise PolicyError(f"{n.where}: reads '{t}', which is not a router input nor written by another node "
                                  f"before it (tensors here: {', '.join(sorted(available | set(writer))) or 'none'})")
        deps[n.name] = {writer[t].name for t in node_reads(n) if t in writer and writer[t] is not n}
    done: Set[str] = set()
    while len(done) < len(nodes):
        ready = [n for n in nodes if n.name not in done and deps[n.name] <= done]
        if not ready:
            stuck = [n.where for n in nodes if n.name not in done]
            raise PolicyError(f"{where}: a cycle: {', '.join(stuck)} each wait for another's tensors")
        done |= {n.name for n in ready}
    for n in nodes:
        if isinstance(n, Switch):
            _check_switch(n, available | set(writer), router, dtypes, exports)


def _check_cases(sw: Switch, available: Set[str], dtypes: Mapping[str, Any]) -> None:
    for i, c in enumerate(sw.cases):
        check_literals(c.when, dtypes)
        for t in c.when.tensors():
            if t not in available:
                raise PolicyError(f"{sw.where}.cases[{i}].when: reads '{t}', which is not a router input nor written "
                                  "before the switch")


def _check_switch(sw: Switch, available: Set[str], router: RouterSpec, dtypes: Mapping[str, Any],
                  exports: Mapping[str, Tuple[str, ...]]) -> None:
    request_scope = sw.scope == "request" or router.max_batch_size == 0
    _check_cases(sw, available, dtypes)
    for i, branch in enumerate(sw.branches()):
        _check_list(branch, available, router, dtypes, f"{sw.where}.branch[{i}]", exports)
    written = [t for b in sw.branches() for n in b for t in node_writes(n) if t in exports[sw.name]]
    fill = dict(sw.fill)
    for t in fill:
        spec = router.output(t)
        if spec is None:
            raise PolicyError(f"{sw.where}.fill.{t}: only a router output can be filled (its config gives the data "
                              "type and row shape); an inner tensor can be omitted (absent) instead")
        fill_array(fill[t], spec, router.max_batch_size > 0, f"{sw.where}.fill.{t}")
    for t in sw.omit:
        if not request_scope:
            raise PolicyError(f"{sw.where}.omit: only in request scope (a row cannot lack '{t}' while other rows of "
                              "its request have it); give it a fill")
        if t in fill:
            raise PolicyError(f"{sw.where}.omit: '{t}' is filled too")
    labels = [f"cases[{i}]" for i in range(len(sw.cases))] + ["default" if sw.default is not None else "no case"]
    for label, branch in zip(labels, sw.branches()):
        own = {t for n in branch for t in node_writes(n)}
        for t in dict.fromkeys(written):
            if t not in own and t not in fill and t not in sw.omit:
                raise PolicyError(
                    f"{sw.where}: '{t}' is not written when {label} is taken; declare it: "
                    + ("`omit: [" + t + "]` (left out of the response) or " if request_scope else "")
                    + f"`fill: {{{t}: VALUE}}`")


def bind_pipeline(pipeline: Pipeline, router: RouterSpec) -> Pipeline:
    """Check ``pipeline`` against the router's configuration (module docstring).

    Raises:
        PolicyError: the first problem, naming its location.
    """
    bf16 = [t.name for t in router.inputs + router.outputs if t.data_type == "TYPE_BF16"]
    if bf16:
        raise PolicyError(f"pipeline: {', '.join(bf16)} of router '{router.name}' is TYPE_BF16, which numpy cannot "
                          "hold in the Python backend's stub (it refuses as_numpy() on BF16); declare it TYPE_FP32 "
                          "or TYPE_FP16 in the router and its models")
    unknown = [t.data_type for t in router.inputs + router.outputs if t.dtype is None]
    if unknown:
        raise PolicyError(f"pipeline: router '{router.name}' has a tensor of unknown data type {unknown[0]}")
    outputs = {o.name for o in router.outputs}
    for i, o in enumerate(pipeline.outputs):
        if o not in outputs:
            raise PolicyError(f"pipeline.outputs[{i}]: '{o}' is not an output of router '{router.name}' "
                              f"(its config has: {', '.join(sorted(outputs))})")
    if len(set(pipeline.outputs)) != len(pipeline.outputs):
        raise PolicyError("pipeline.outputs: a tensor is listed twice")
    if router.max_batch_size > 0:
        for step in pipeline.step_nodes():
            if step.model_dims is not None:
                raise PolicyError(f"{step.where}.model_dims: router '{router.name}' batches (max_batch_size "
                                  f"{router.max_batch_size}); model_dims reshapes for a router with max_batch_size 0")
    dtypes = {t.name: np.dtype(t.dtype) for t in router.inputs}
    _check_list(pipeline.steps, {i.name for i in router.inputs}, router, dtypes, "pipeline.steps", switch_exports(pipeline))
    written = {t for n in pipeline.steps for t in node_writes(n)}
    for i, o in enumerate(pipeline.outputs):
        if o not in written and o not in dtypes:
            raise PolicyError(f"pipeline.outputs[{i}]: no node writes '{o}'")
    return pipeline


def unneeded_nodes(pipeline: Pipeline, requested: Sequence[str]) -> FrozenSet[str]:
    """The names of the nodes a request asking for ``requested`` outputs (empty: all of
    ``pipeline.outputs``) need not run: those whose written tensors feed none of those
    outputs, directly or through the nodes after them (a switch: its conditions too), as
    Triton's ensemble scheduler prunes the steps of a request that asks for some outputs."""
    wanted = set(pipeline.outputs) & set(requested) if requested else set(pipeline.outputs)
    nodes = pipeline.nodes()
    if wanted == set(pipeline.outputs):
        return frozenset()
    tensors, needed = set(wanted), set()
    changed = True
    while changed:  # a fixpoint: a needed node's reads make their writers needed
        changed = False
        for n in nodes:
            if n.name not in needed and tensors & set(node_writes(n)):
                needed.add(n.name)
                tensors |= {t for _, t in n.inputs} if isinstance(n, Step) else {t for c in n.cases for t in c.when.tensors()}
                changed = True
    return frozenset(n.name for n in nodes if n.name not in needed)


_NONE: FrozenSet[str] = frozenset()


class Pruning:
    """:func:`unneeded_nodes` per set of requested outputs, computed once each (at most
    ``limit`` sets kept: a pipeline with many outputs has many subsets)."""

    def __init__(self, pipeline: Pipeline, limit: int = 256) -> None:
        self.pipeline, self.limit = pipeline, limit
        self.known: Dict[FrozenSet[str], FrozenSet[str]] = {}

    def skip(self, requested: Sequence[str]) -> FrozenSet[str]:
        """The node names a request for ``requested`` outputs (empty: all) skips."""
        if not requested:
            return _NONE
        key = frozenset(requested)
        out = self.known.get(key)
        if out is None:
            out = unneeded_nodes(self.pipeline, tuple(key))
            if len(self.known) < self.limit:
                self.known[key] = out
        return out


def fill_rows(sw: Switch, router: RouterSpec) -> Dict[str, Any]:
    """The switch's fill values as rows (numpy arrays of the outputs' data types and row
    shapes), after :func:`bind_pipeline` checked them."""
    out = {}
    for t, v in sw.fill:
        spec = router.output(t)
        assert spec is not None, "bind_pipeline checked fills name router outputs"
        out[t] = fill_array(v, spec, router.max_batch_size > 0, f"{sw.where}.fill.{t}")
    return out


def describe_pipeline(pipeline: Pipeline) -> str:
    """The pipeline as an indented text tree (the router's load log, ``orchestrator policy check``)."""
    lines = [f"pipeline: outputs {', '.join(pipeline.outputs)}"]

    def emit(nodes: Sequence[PNode], prefix: str) -> None:
        for n in nodes:
            if isinstance(n, Step):
                ins = ", ".join(f"{t}->{m}" for m, t in n.inputs)
                outs = ", ".join(f"{m}->{t}" for m, t in n.outputs)
                batch = "" if n.max_batch_size is None else f" max_batch_size={n.max_batch_size}"
                extra = (" add_batch_dim" if n.add_batch_dim else "") + (
                    f" model_dims(max_batch_size {n.model_dims.max_batch_size})" if n.model_dims else "") + (f" fallback {', '.join(n.fallback)}" if n.fallback else "") + (
                    f" timeout={n.timeout_ms:g}ms" if n.timeout_ms else "")
                lines.append(f"{prefix}step [{n.name}] {n.target}({ins}) -> {outs}{batch}{extra}")
                continue
            fill = f" fill {', '.join(t for t, _ in n.fill)}" if n.fill else ""
            omit = f" omit {', '.join(n.omit)}" if n.omit else ""
            lines.append(f"{prefix}switch [{n.name}] scope={n.scope}{fill}{omit}")
            for c in n.cases:
                lines.append(f"{prefix}    when {c.when.text()}:")
                emit(c.then, prefix + "        ")
            if n.default is not None:
                lines.append(f"{prefix}    default:")
                emit(n.default, prefix + "        ")
    emit(pipeline.steps, "  ")
    return "\n".join(lines)


def with_batches(pipeline: Pipeline, sizes: Mapping[str, Optional[int]]) -> Pipeline:
    """``pipeline`` with each step's ``max_batch_size`` set from ``sizes`` (model -> the
    callee's, None: unknown) where the policy left it out."""

    def fix(nodes: Sequence[PNode]) -> Tuple[PNode, ...]:
        out: List[PNode] = []
        for n in nodes:
            if isinstance(n, Step):
                out.append(n if n.max_batch_size is not None else replace(n, max_batch_size=sizes.get(n.model) or 0))
            else:
                cases = tuple(Case(c.when, fix(c.then)) for c in n.cases)
                out.append(replace(n, cases=cases, default=None if n.default is None else fix(n.default)))
        return tuple(out)
    return replace(pipeline, steps=fix(pipeline.steps))
