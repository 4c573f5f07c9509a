"""Tensor pipelines: a policy whose top-level key is ``pipeline`` (a text policy has ``root``).

A pipeline moves named tensors between models as a Triton ensemble's
``ensemble_scheduling`` does, plus what an ensemble cannot express (conditions,
``routing.conditions``)::

    pipeline:
      outputs: [LABELS, SCORES]          # the response's outputs, in this order
      steps:                             # nodes, run in dataflow order
        - kind: step
          model: detector                # name: default the model's
          inputs: {IMAGE: IMAGE}         # model input -> pipeline tensor (input_map)
          outputs: {SCORES: SCORES}      # model output -> pipeline tensor (output_map)
        - kind: switch
          scope: row                     # row | request
          cases:
            - when: {tensor: SCORES, reduce: argmax, op: eq, value: 0}
              then: [{kind: step, model: cats, inputs: {IMAGE: IMAGE}, outputs: {LABEL: LABELS}}]
          default: [{kind: step, model: others, inputs: {IMAGE: IMAGE}, outputs: {LABEL: LABELS}}]

Pipeline tensors form one flat namespace: the router's inputs (its ``config.pbtxt``) and
every step's mapped outputs, each written by one node (the branches of one switch may
write the same tensor). A node runs once every tensor it reads exists (or is known to be
absent); nodes that do not depend on each other run concurrently.

At load (:func:`~orchestrator.runtime.routing.pipeline_plan.bind_pipeline`, with the router's configuration) the pipeline is checked:
every tensor read exists upstream, no two nodes write one tensor, no cycle, the outputs
are router outputs written by some node, every tensor a switch's branch may leave
unwritten is declared (``fill``, or ``omit`` in request scope), condition literals fit the
router inputs' data types, and no router tensor is BF16 (numpy cannot hold it in the
Python backend's stub). Errors are ``PolicyError`` naming the location.

A step's ``when`` is a switch of one case around the step (same ``scope``, ``fill``, ``omit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing import schema as S
from orchestrator.runtime.routing.conditions import Cond, CondRef
from orchestrator.runtime.routing.nodes.model import ON_DEMAND, OnDemand

__all__ = [
    "Step", "Case", "Switch", "PNode", "Pipeline", "PIPELINE", "read_pipeline", "node_reads", "node_writes",
    "pipeline_json_definitions",
]

# ----------------------------------------------------------------------------- the nodes


@dataclass(frozen=True)
class Step:
    """One model call (an ensemble step).

    Attributes:
        name: unique in the pipeline (default: the model's name).
        model: the model called through BLS.
        version: the model version; -1: the one Triton picks (its latest ready).
        inputs: (model input, pipeline tensor) pairs.
        outputs: (model output, pipeline tensor) pairs; only these outputs are requested.
        parameters: ``forward`` (every request parameter BLS can carry: bool, int, str),
            ``none``, or the names forwarded.
        add_batch_dim: prepend a batch dimension of 1 to each input (a router with
            ``max_batch_size: 0`` calling a batching model); such outputs lose it again in the
            response when the router's output dims lack it. ``model_dims`` supersedes it.
        model_dims: the called model's ``max_batch_size`` and input dims, from which the
            router reshapes each tensor as Triton's ensembles do (``ReshapeTensorDims``):
            a batch dimension of 1 added or stripped per tensor, going in and coming back
            (``max_batch_size: 0`` routers only; None: tensors go as they are).
        max_batch_size: rows per BLS call (None: the callee's ``max_batch_size`` from its
            ``config.pbtxt`` in the repository when found, else the rows of one request per call).
        where: its location in the policy.
        fallback: models tried in turn, with the same inputs and outputs, for the requests
            whose call to ``model`` failed (its error, or its circuit open).
        on_demand: load ``model`` on first use and unload it when idle (None: always loaded).
        timeout_ms: milliseconds each call of the step may take (None: no limit but the
            request's deadline): the call carries the sooner of it and the request's
            deadline as its BLS ``timeout`` and is cut then; its requests fail
            (``DeadlineExceeded``, naming the step) or go to ``fallback``.
    """

    name: str
    model: str
    inputs: Tuple[Tuple[str, str], ...]
    outputs: Tuple[Tuple[str, str], ...]
    version: int = -1
    parameters: Union[str, Tuple[str, ...]] = "forward"
    add_batch_dim: bool = False
    max_batch_size: Optional[int] = None
    where: str = ""
    kind: str = "step"
    fallback: Tuple[str, ...] = ()
    on_demand: Optional[OnDemand] = None
    model_dims: Optional["ModelDims"] = None
    timeout_ms: Optional[float] = None

    @property
    def target(self) -> str:
        """The call target: ``model`` or ``model@version`` (the circuit breaker's key)."""
        return self.model if self.version < 0 else f"{self.model}@{self.version}"


@dataclass(frozen=True)
class ModelDims:
    """A step model's batching and input dims, as its ``config.pbtxt`` declares them.

    Attributes:
        max_batch_size: the model's ``max_batch_size`` (> 0: it batches; its ``dims`` are
            per row).
        inputs: (model input, its ``dims``) pairs; -1: any size. An input not listed goes
            as it is.
    """

    max_batch_size: int
    inputs: Tuple[Tuple[str, Tuple[int, ...]], ...]

    def dims(self, name: str) -> Optional[Tuple[int, ...]]:
        """The dims of input ``name`` (None: not listed)."""
        return next((d for n, d in self.inputs if n == name), None)


@dataclass(frozen=True)
class Case:
    """A switch case: ``then`` runs for the rows where ``when`` holds (and no earlier case did)."""

    when: Cond
    then: Tuple["PNode", ...]


@dataclass(frozen=True)
class Switch:
    """If-else between sub-pipelines, per row or per request.

    Attributes:
        name: unique in the pipeline.
        scope: ``row`` (each batch row takes its own branch) or ``request``.
        cases: tried in order; a row takes the first whose condition holds.
        default: the branch of rows no case took (None: they take no branch).
        fill: tensor -> the value rows get when their branch did not write it (a router
            output: its data type and row shape from the router's config; a scalar fills the
            row shape, a list is the row).
        omit: tensors left out of the response of a request whose branch did not write them
            (``scope: request``, or a router with ``max_batch_size: 0``).
        where: its location in the policy.
    """

    name: str
    cases: Tuple[Case, ...]
    scope: str = "row"
    default: Optional[Tuple["PNode", ...]] = None
    fill: Tuple[Tuple[str, Any], ...] = ()
    omit: Tuple[str, ...] = ()
    where: str = ""
    kind: str = "switch"

    def branches(self) -> List[Tuple["PNode", ...]]:
        """Every branch: each case's, then the default's (empty when there is none)."""
        return [c.then for c in self.cases] + [self.default or ()]


PNode = Union[Step, Switch]


@dataclass(frozen=True)
class Pipeline:
    """A parsed pipeline (``outputs`` in response order, ``steps`` its top-level nodes)."""

    outputs: Tuple[str, ...]
    steps: Tuple[PNode, ...]

    def nodes(self) -> List[PNode]:
        """Every node, depth first."""
        out: List[PNode] = []

        def visit(nodes: Sequence[PNode]) -> None:
            for n in nodes:
                out.append(n)
                if isinstance(n, Switch):
                    for b in n.branches():
                        visit(b)
        visit(self.steps)
        return out

    def step_nodes(self) -> List[Step]:
        """Every step, depth first."""
        return [n for n in self.nodes() if isinstance(n, Step)]

    def models(self) -> List[str]:
        """Every call target (``model`` or ``model@version``, and fallbacks), without repeats."""
        return list(dict.fromkeys(t for s in self.step_nodes() for t in (s.target, *s.fallback)))


def node_writes(node: PNode) -> List[str]:
    """The tensors ``node`` may write (a switch: every branch's and its ``fill``)."""
    if isinstance(node, Step):
        return [t for _, t in node.outputs]
    out = [t for b in node.branches() for n in b for t in node_writes(n)] + [t for t, _ in node.fill]
    return list(dict.fromkeys(out))


def node_reads(node: PNode) -> List[str]:
    """The tensors ``node`` reads from outside itself (a switch: its conditions' and what
    its branches read and do not write themselves)."""
    if isinstance(node, Step):
        return list(dict.fromkeys(t for _, t in node.inputs))
    out = [t for c in node.cases for t in c.when.tensors()]
    for branch in node.branches():
        inner = {t for n in branch for t in node_writes(n)}
        out += [t for n in branch for t in node_reads(n) if t not in inner]
    return list(dict.fromkeys(out))


# ----------------------------------------------------------------------------- declaration


class _StrMap(S.Type):
    """A non-empty mapping of non-empty strings to non-empty strings, read as pairs."""

    def __init__(self, what: str):
        self.what = what

    def read(self, value: Any, where: str, ctx: Any) -> Tuple[Tuple[str, str], ...]:
        if not isinstance(value, Mapping) or not value:
            raise PolicyError(f"{where}: expected a non-empty mapping ({self.what})")
        for k, v in value.items():
            if not isinstance(k, str) or not k or not isinstance(v, str) or not v:
                raise PolicyError(f"{where}.{k}: expected a non-empty tensor name, got {v!r}")
        return tuple((str(k), str(v)) for k, v in value.items())

    def json(self) -> Dict[str, Any]:
        return {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string", "minLength": 1}}

    def text(self) -> str:
        return f"mapping: {self.what}"


class _DimsMap(S.Type):
    """A mapping of model input names to dims: lists of integers >= -1."""

    def read(self, value: Any, where: str, ctx: Any) -> Tuple[Tuple[str, Tuple[int, ...]], ...]:
        if not isinstance(value, Mapping) or not value:
            raise PolicyError(f"{where}: expected a non-empty mapping (model input -> dims)")
        out = []
        for k, v in value.items():
            if (not isinstance(k, str) or not k or not isinstance(v, list)
                    or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in v)):
                raise PolicyError(f"{where}.{k}: expected a list of dims (integers, -1: any size), got {v!r}")
            out.append((str(k), tuple(int(d) for d in v)))
        return tuple(out)

    def json(self) -> Dict[str, Any]:
        return {"type": "object", "minProperties": 1,
                "additionalProperties": {"type": "array", "items": {"type": "integer", "minimum": -1}}}

    def text(self) -> str:
        return "mapping: model input -> dims"


#: A step's ``model_dims``.
MODEL_DIMS = S.Struct("pipeline.step.model_dims", [
    S.Key("max_batch_size", S.Int(0, 1 << 31), "the model's `max_batch_size` (> 0: it batches, its dims are per row)",
          required=True),
    S.Key("inputs", _DimsMap(), "model input -> its config `dims` (-1: any size); an input not listed goes as it is",
          required=True),
], build=lambda v, where: ModelDims(v["max_batch_size"], v["inputs"]),
    doc="The step model's batching and input dims: the router adds or strips a batch dimension of 1 per tensor as "
        "Triton's ensembles do (`ReshapeTensorDims`). Only for a router with `max_batch_size: 0`.")


class _FillValues(S.Type):
    """Tensor -> a scalar (number, boolean, string) or a nested list of them."""

    def read(self, value: Any, where: str, ctx: Any) -> Tuple[Tuple[str, Any], ...]:
        if not isinstance(value, Mapping):
            raise PolicyError(f"{where}: expected a mapping: tensor -> value")

        def ok(v: Any) -> bool:
            return isinstance(v, (bool, int, float, str)) or (isinstance(v, list) and bool(v) and all(ok(x) for x in v))

        for k, v in value.items():
            if not ok(v):
                raise PolicyError(f"{where}.{k}: expected a number, boolean, string or a nested list of them, got {v!r}")
        return tuple((str(k), v) for k, v in value.items())

    def json(self) -> Dict[str, Any]:
        return {"type": "object", "additionalProperties": {"type": ["number", "boolean", "string", "array"]}}

    def text(self) -> str:
        return "mapping: tensor -> scalar or nested list"


class _Parameters(S.Type):
    def read(self, value: Any, where: str, ctx: Any) -> Union[str, Tuple[str, ...]]:
        if value in ("forward", "none"):
            return str(value)
        return tuple(S.Strings().read(value, where, ctx)) if isinstance(value, list) else S.Choice(("forward", "none")).read(value, where, ctx)

    def json(self) -> Dict[str, Any]:
        return {"anyOf": [{"enum": ["forward", "none"]}, S.Strings().json()]}

    def text(self) -> str:
        return "`forward`, `none`, or a list of parameter names"


class _PNodeRef(S.Type):
    """A pipeline node (``kind: step`` or ``kind: switch``)."""

    has_nodes = True

    def read(self, value: Any, where: str, ctx: Any) -> PNode:
        return _read_node(value, where, ctx)

    def json(self) -> Dict[str, Any]:
        return {"$ref": "#/definitions/pipeline.node"}

    def text(self) -> str:
        return "pipeline node (`step` or `switch`)"


_NODES = S.ListOf(_PNodeRef(), 1)
_SCOPE = S.Choice(("row", "request"))
_GUARD_KEYS = [
    S.Key("scope", _SCOPE, "`row`: each batch row on its own; `request`: the request as a whole (a router with "
          "`max_batch_size: 0` always has request scope)"),
    S.Key("fill", _FillValues(), "tensor -> the value of rows whose branch did not write it (a router output; a "
          "scalar fills its row shape, a list is the row)"),
    S.Key("omit", S.Strings(), "tensors left out of the response of a request whose branch did not write them "
          "(request scope), as an ensemble omits an output no step produced"),
]

#: The ``step`` node.
STEP = S.Struct("pipeline.step", [
    S.Key("kind", S.Const(S.Str(), "step", "expected step"), "`step`", required=True),
    S.Key("name", S.Str(), "unique node name (metrics, errors)", computed="the model's name"),
    S.Key("model", S.Str(), "the model called (BLS)", required=True),
    S.Key("version", S.Int(-1, 1 << 31), "the model version; -1: the latest ready"),
    S.Key("inputs", _StrMap("model input -> pipeline tensor"), "model input -> pipeline tensor (an ensemble step's "
          "`input_map`)", required=True),
    S.Key("outputs", _StrMap("model output -> pipeline tensor"), "model output -> pipeline tensor (`output_map`); "
          "only these outputs are requested", required=True),
    S.Key("parameters", _Parameters(), "request parameters passed on: `forward` (all that BLS can carry: bool, int, "
          "string; an ensemble passes every one), `none`, or these names"),
    S.Key("add_batch_dim", S.Bool(), "prepend a batch dimension of 1 to each input (a router with `max_batch_size: 0` "
          "calling a batching model); a router output keeps it only when its dims have it. `model_dims` does this "
          "per tensor, as Triton does; not both"),
    S.Key("model_dims", MODEL_DIMS, "the model's `max_batch_size` and input dims: each tensor gets or loses a batch "
          "dimension of 1 going in and coming back as in Triton's ensembles (into a batching model: 1 prepended to "
          "a tensor without one whose shape is the input's per-row dims; into a model without batching: a leading 1 "
          "stripped from a tensor of a batching step that does not match the input's dims; the router's outputs "
          "likewise against its own dims); `orchestrator migrate` writes it"),
    S.Key("max_batch_size", S.Int(0, 1 << 20), "rows per BLS call; 0: one call per request",
          computed="the model's `max_batch_size` from its config.pbtxt, else one call per request"),
    S.Key("fallback", S.Strings(1), "models tried in turn, with the same `inputs` and `outputs`, for the requests "
          "whose call failed (an error, or the model's circuit open)"),
    S.Key("on_demand", S.TrueOr(ON_DEMAND), "load the model on first use and unload it when idle (needs "
          "`--model-control-mode=explicit`)"),
    S.Key("timeout_ms", S.Number(above=0.0), "milliseconds each call may take: it carries the sooner of this and the "
          "request's deadline as its BLS `timeout` and is cut then; its requests fail UNAVAILABLE (a deadline, "
          "naming the step) or go to `fallback`, each model with the same limit. A cut call counts against the "
          "model's circuit only with `circuit_breaker.count_timeouts`"),
    S.Key("when", CondRef(), "run the step only for the rows (or requests) where this holds"),
] + _GUARD_KEYS, doc="A model call: tensors in, tensors out.")

_CASE = S.Struct("pipeline.switch.case", [
    S.Key("when", CondRef(), "the condition", required=True),
    S.Key("then", _NODES, "the branch: a sub-pipeline", required=True),
], doc="One case: a condition and its branch.")

#: The ``switch`` node.
SWITCH = S.Struct("pipeline.switch", [
    S.Key("kind", S.Const(S.Str(), "switch", "expected switch"), "`switch`", required=True),
    S.Key("name", S.Str(), "unique node name", computed="its location"),
    S.Key("cases", S.ListOf(_CASE, 1), "tried in order: a row takes the first that holds", required=True),
    S.Key("default", _NODES, "the branch of rows no case took (absent: they take none)"),
] + _GUARD_KEYS, doc="If-else between sub-pipelines, per row or per request.")

#: The ``pipeline`` top-level mapping.
PIPELINE = S.Struct("pipeline", [
    S.Key("outputs", S.Strings(1), "the router outputs the response carries, in this order; one no node produced "
          "for a request is left out of its response", required=True),
    S.Key("steps", _NODES, "the nodes (`step`, `switch`), run in dataflow order", required=True),
], doc="A tensor pipeline (instead of `root`): steps moving named tensors between models, as an ensemble's "
       "`ensemble_scheduling`, with conditions. A request that asks for some outputs runs only the nodes they need "
       "(directly or through later nodes), as an ensemble prunes its steps. The request parameter "
       "`describe_policy: true` adds the router's optional `POLICY` output (this document as JSON, BYTES, one per "
       "row; `orchestrator policy show` reads it) where the router's config declares an output `POLICY` of "
       "`TYPE_STRING` that is not a pipeline output; a router without one refuses the parameter, naming why.")


def pipeline_json_definitions() -> Dict[str, Any]:
    """The JSON Schema definitions the ``pipeline`` key refers to."""
    from orchestrator.runtime.routing.conditions import CONDITION

    step, switch = STEP.json(), SWITCH.json()
    return {
        "pipeline.node": {"type": "object", "required": ["kind"],
                          "properties": {"kind": {"enum": ["step", "switch"]}},
                          "allOf": [{"if": {"properties": {"kind": {"const": "step"}}}, "then": {"$ref": "#/definitions/pipeline.step"}},
                                    {"if": {"properties": {"kind": {"const": "switch"}}}, "then": {"$ref": "#/definitions/pipeline.switch"}}]},
        "pipeline.step": step,
        "pipeline.switch": switch,
        "condition": CONDITION.json(),
    }


class _Names:
    """Node names seen while parsing (unique in the pipeline)."""

    def __init__(self) -> None:
        self.seen: Dict[str, str] = {}

    def claim(self, name: str, where: str) -> str:
        if name in self.seen:
            raise PolicyError(f"{where}.name: '{name}' is also the name of {self.seen[name]} (names are unique; "
                              "give one of them a `name`)")
        self.seen[name] = where
        return name


def _read_node(value: Any, where: str, names: _Names) -> PNode:
    kind = value.get("kind") if isinstance(value, Mapping) else None
    if kind not in ("step", "switch"):
        raise PolicyError(f"{where}.kind: expected step or switch, got {kind!r}")
    if kind == "switch":
        v = SWITCH.read(value, where, names)
        cases = tuple(Case(c["when"], tuple(c["then"])) for c in v["cases"])
        sw = Switch(names.claim(v["name"] or where, where), cases, v["scope"] or "row",
                    None if v["default"] is None else tuple(v["default"]), v["fill"] or (), tuple(v["omit"] or ()), where)
        return sw
    v = STEP.read(value, where, names)
    step = Step(names.claim(v["name"] or v["model"], where), v["model"], v["inputs"], v["outputs"],
                -1 if v["version"] is None else v["version"], v["parameters"] or "forward",
                bool(v["add_batch_dim"]), v["max_batch_size"], where, fallback=tuple(v["fallback"] or ()),
                on_demand=v["on_demand"], model_dims=v["model_dims"], timeout_ms=v["timeout_ms"])
    if step.model_dims is not None:
        if step.add_batch_dim:
            raise PolicyError(f"{where}: add_batch_dim and model_dims together; model_dims alone reshapes per tensor")
        step_inputs = {m for m, _ in step.inputs}
        for name, _ in step.model_dims.inputs:
            if name not in step_inputs:
                raise PolicyError(f"{where}.model_dims.inputs.{name}: not one of the step's inputs "
                                  f"({', '.join(sorted(step_inputs))})")
    if v["when"] is None:
        if v["scope"] is not None or v["fill"] is not None or v["omit"] is not None:
            raise PolicyError(f"{where}: scope, fill and omit go with `when`")
        return step
    return Switch(f"{step.name}:when", (Case(v["when"], (step,)),), v["scope"] or "row", None, v["fill"] or (),
                  tuple(v["omit"] or ()), where)


def read_pipeline(value: Any, where: str = "pipeline") -> Pipeline:
    """Parse the ``pipeline`` mapping (raises PolicyError naming the location)."""
    v = PIPELINE.read(value, where, _Names())
    return Pipeline(tuple(v["outputs"]), tuple(v["steps"]))
