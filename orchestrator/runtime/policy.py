"""Declarative routing policy: a YAML or JSON file the router reads at ``initialize``.

A policy is a tree of nodes. Every node receives a set of texts and answers each with a
probability (and the route that answered); the router then turns logits into
``PROBABILITIES`` and ``VERDICTS`` with the ``postprocess`` model. Node kinds:

``model``     classify with one model: ``model`` (name), optional ``route`` (the ``ROUTE``
              value, default the model name), ``max_length`` (tokens; longer inputs are
              truncated like the ensemble does; default the policy's
              ``max_sequence_length``), ``on_demand`` (``idle_timeout_s``,
              ``retry_after_s``: load with ``pb_utils.load_model`` on first use, unload
              when idle), ``calibration`` (``reference_threshold``, ``threshold``: this
              variant's threshold that reproduces the reference model's verdicts at the
              reference threshold, e.g. from ``orchestrator parity``; the variant's logits
              are shifted by ``logit(reference_threshold) - logit(threshold)`` so that
              comparing with the client's threshold gives the reference's verdicts).
``constant``  answer without a model: ``probability``, optional ``verdict`` (default:
              probability >= threshold), ``route`` (default the node's name).
``sequence``  ``steps``: each step answers what it can; texts a step leaves unanswered
              (a ``switch`` without ``default``) go to the next step.
``switch``    ``cases``: list of ``{when: CONDITION, then: NODE}``, first match wins;
              ``default``: NODE for the rest (without it the rest stays unanswered);
              ``score``: NODE run first on all texts, whose answer stands for texts no case
              takes and whose probability the ``margin_below`` condition reads.
              CONDITION keys (all given must hold): ``empty`` (bool: text empty or
              whitespace), ``tokens`` (``{min, max}`` inclusive token count),
              ``param`` (``{name, equals}`` or ``{name, in: [..]}``: a request parameter),
              ``margin_below`` (|score probability - threshold| < value).
``cascade``   ``stages`` (2+ nodes), ``margin``: every text goes to the first stage; texts
              whose probability is within ``margin`` of their threshold (strictly) go on
              to the next stage, and so on.
``chunk``     ``window``, ``stride`` (tokens), ``aggregation`` (``length_weighted_mean``,
              ``mean``, ``max``), ``node``: texts longer than ``window`` tokens are split
              into overlapping windows (see ``orchestrator.runtime.router.token_windows``) that
              ``node`` classifies; the text's probability aggregates the windows'.
              ``ROUTE`` gets the prefix ``chunked:``.
``split``     ``branches``: list of ``{weight, node}``: weighted A/B or canary split per
              request; deterministic per request id (SHA-256 of node name and id) when
              the request has one, random otherwise.
``parallel``  ``nodes`` (2+), ``combine`` (``mean``, ``max``, ``vote``): all nodes run
              concurrently on every text; ``vote`` gives the share of nodes whose
              probability reaches the threshold, positive when more than half do.
``fallback``  ``nodes`` (2+): try in order; the next one answers when one fails, times
              out or its model is not ready.

Every node may have ``name`` (unique; used in metrics, errors and routes; default: its
path in the tree) and ``timeout_ms`` (the node fails when it takes longer).

Top level: ``version`` (1), ``root`` (NODE), ``tokenizer`` and ``postprocess`` (model
names, default ``tokenizer`` and ``postprocess``), ``inline`` (``tokenizer``: a directory
of tokenizer files, relative to the router's model directory, e.g. ``../tokenizer/1``,
to tokenize in the router's process instead of a BLS call; ``postprocess: true`` to apply
``orchestrator.runtime.models.postprocess.probabilities_and_verdicts``, the postprocess model's
own function, in-process: each saves one BLS round trip per ``execute``), ``max_sequence_length`` (default 128,
the demo tokenizer's ``model_max_length``), ``bls_max_batch_size`` (rows per BLS call,
default 64: the downstream models' ``max_batch_size``), ``request_parameters``: a map
from a request parameter's name to the values clients may send (``param`` conditions may
only use these; a request with another value is refused), so clients choose among routes
the policy exposes and never name a model.

Errors: :class:`PolicyError`, whose message starts with the location of the bad key
(``root.steps[1].stages[0].model``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

AGGREGATIONS = ("length_weighted_mean", "mean", "max")
COMBINES = ("mean", "max", "vote")


class PolicyError(ValueError):
    """An invalid policy; the message starts with the location of the bad key."""


@dataclass
class OnDemand:
    idle_timeout_s: float = 300.0
    retry_after_s: float = 30.0


@dataclass
class Node:
    kind: str
    name: str
    timeout_ms: Optional[float] = None


@dataclass
class ModelNode(Node):
    model: str = ""
    route: str = ""
    max_length: int = 0
    on_demand: Optional[OnDemand] = None
    logit_shift: float = 0.0  # from calibration: logit(reference_threshold) - logit(threshold)


@dataclass
class ConstantNode(Node):
    probability: float = 0.5
    verdict: Optional[bool] = None
    route: str = ""


@dataclass
class SequenceNode(Node):
    steps: List[Node] = field(default_factory=list)


@dataclass
class Condition:
    empty: Optional[bool] = None
    tokens_min: Optional[int] = None
    tokens_max: Optional[int] = None
    param_name: Optional[str] = None
    param_values: Tuple[str, ...] = ()
    margin_below: Optional[float] = None

    @property
    def needs_tokens(self) -> bool:
        return self.tokens_min is not None or self.tokens_max is not None


@dataclass
class Case:
    when: Condition
    then: Node


@dataclass
class SwitchNode(Node):
    cases: List[Case] = field(default_factory=list)
    default: Optional[Node] = None
    score: Optional[Node] = None


@dataclass
class CascadeNode(Node):
    stages: List[Node] = field(default_factory=list)
    margin: float = 0.15


@dataclass
class ChunkNode(Node):
    window: int = 128
    stride: int = 96
    aggregation: str = "length_weighted_mean"
    node: Optional[Node] = None


@dataclass
class SplitNode(Node):
    branches: List[Tuple[float, Node]] = field(default_factory=list)


@dataclass
class ParallelNode(Node):
    nodes: List[Node] = field(default_factory=list)
    combine: str = "mean"


@dataclass
class FallbackNode(Node):
    nodes: List[Node] = field(default_factory=list)


@dataclass
class Policy:
    root: Node
    tokenizer: str = "tokenizer"
    postprocess: str = "postprocess"
    max_sequence_length: int = 128
    bls_max_batch_size: int = 64
    request_parameters: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    inline_tokenizer: Optional[str] = None  # tokenizer files dir, relative to the router's model dir
    inline_postprocess: bool = False
    source: Dict[str, Any] = field(default_factory=dict)  # the validated document, for `policy show`

    def nodes(self) -> List[Node]:
        """Every node, depth first from the root."""
        return list(_walk(self.root))

    def models(self) -> List[str]:
        """Names of every model the policy may call (BLS), tokenizer and postprocess included."""
        names = [] if self.inline_tokenizer else [self.tokenizer]
        names += [] if self.inline_postprocess else [self.postprocess]
        names += [n.model for n in self.nodes() if isinstance(n, ModelNode)]
        return list(dict.fromkeys(names))

    def on_demand(self) -> Dict[str, OnDemand]:
        """Models marked ``on_demand``, with their settings (the first mention wins)."""
        out: Dict[str, OnDemand] = {}
        for n in self.nodes():
            if isinstance(n, ModelNode) and n.on_demand is not None:
                out.setdefault(n.model, n.on_demand)
        return out


def children(node: Node) -> List[Node]:
    """The direct child nodes of ``node`` (score first for a switch)."""
    if isinstance(node, SequenceNode):
        return list(node.steps)
    if isinstance(node, SwitchNode):
        out = [node.score] if node.score else []
        out += [c.then for c in node.cases]
        return out + ([node.default] if node.default else [])
    if isinstance(node, CascadeNode):
        return list(node.stages)
    if isinstance(node, ChunkNode):
        return [node.node]
    if isinstance(node, SplitNode):
        return [n for _, n in node.branches]
    if isinstance(node, (ParallelNode, FallbackNode)):
        return list(node.nodes)
    return []


def _walk(node: Node):
    yield node
    for child in children(node):
        yield from _walk(child)


def may_decline(node: Node) -> bool:
    """True when ``node`` can leave texts unanswered (a switch without default or score)."""
    if isinstance(node, SwitchNode):
        return node.default is None and node.score is None
    if isinstance(node, SequenceNode):
        return may_decline(node.steps[-1]) and all(may_decline(s) for s in node.steps)
    return False


# ----------------------------------------------------------------------------- parsing


class _Reader:
    """Typed access to one mapping of the document, with its location for errors."""

    def __init__(self, data: Any, where: str, allowed: Tuple[str, ...]):
        if not isinstance(data, Mapping):
            raise PolicyError(f"{where}: expected a mapping, got {type(data).__name__}")
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise PolicyError(f"{where}.{unknown[0]}: unknown key (expected one of: {', '.join(allowed)})")
        self.data, self.where = data, where

    def get(self, key, kind, default=None, required=False):
        if key not in self.data:
            if required:
                raise PolicyError(f"{self.where}.{key}: required key is missing")
            return default
        value = self.data[key]
        where = f"{self.where}.{key}"
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PolicyError(f"{where}: expected a finite number, got {value!r}")
            return float(value)
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise PolicyError(f"{where}: expected an integer, got {value!r}")
            return value
        if kind is bool:
            if not isinstance(value, bool):
                raise PolicyError(f"{where}: expected true or false, got {value!r}")
            return value
        if kind is str:
            if not isinstance(value, str) or not value:
                raise PolicyError(f"{where}: expected a non-empty string, got {value!r}")
            return value
        if kind is list:
            if not isinstance(value, list):
                raise PolicyError(f"{where}: expected a list, got {type(value).__name__}")
            return value
        return value

    def number_in(self, key, low, high, default=None, required=False, kind=float):
        value = self.get(key, kind, default, required)
        if value is not None and not (low <= value <= high):
            raise PolicyError(f"{self.where}.{key}: {value!r} is outside [{low}, {high}]")
        return value


_COMMON = ("kind", "name", "timeout_ms")
_KEYS = {
    "model": _COMMON + ("model", "route", "max_length", "on_demand", "calibration"),
    "constant": _COMMON + ("probability", "verdict", "route"),
    "sequence": _COMMON + ("steps",),
    "switch": _COMMON + ("cases", "default", "score"),
    "cascade": _COMMON + ("stages", "margin"),
    "chunk": _COMMON + ("window", "stride", "aggregation", "node"),
    "split": _COMMON + ("branches",),
    "parallel": _COMMON + ("nodes", "combine"),
    "fallback": _COMMON + ("nodes",),
}
KINDS = tuple(_KEYS)


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


class _Parser:
    def __init__(self, max_sequence_length: int, request_parameters: Mapping[str, Tuple[str, ...]]):
        self.max_sequence_length = max_sequence_length
        self.request_parameters = request_parameters
        self.names: Dict[str, str] = {}

    def node(self, data: Any, where: str) -> Node:
        if not isinstance(data, Mapping):
            raise PolicyError(f"{where}: expected a node (a mapping with 'kind'), got {type(data).__name__}")
        kind = data.get("kind")
        if kind not in _KEYS:
            raise PolicyError(f"{where}.kind: {kind!r} is not a node kind (expected one of: {', '.join(KINDS)})")
        r = _Reader(data, where, _KEYS[kind])
        name = r.get("name", str, where)
        if name in self.names:
            raise PolicyError(f"{where}.name: {name!r} is already used by {self.names[name]}")
        self.names[name] = where
        timeout = r.get("timeout_ms", float)
        if timeout is not None and timeout <= 0:
            raise PolicyError(f"{where}.timeout_ms: must be > 0, got {timeout}")
        common = dict(kind=kind, name=name, timeout_ms=timeout)
        return getattr(self, f"_{kind}")(r, where, common)

    def _list(self, r: _Reader, key: str, minimum: int) -> List[Any]:
        items = r.get(key, list, required=True)
        if len(items) < minimum:
            raise PolicyError(f"{r.where}.{key}: needs at least {minimum} entries, got {len(items)}")
        return items

    def _model(self, r, where, common):
        on_demand = None
        if "on_demand" in r.data:
            od = _Reader(r.data["on_demand"] if r.data["on_demand"] is not True else {}, f"{where}.on_demand", ("idle_timeout_s", "retry_after_s"))
            on_demand = OnDemand(
                idle_timeout_s=od.number_in("idle_timeout_s", 0.0, 86400.0, 300.0),
                retry_after_s=od.number_in("retry_after_s", 0.0, 86400.0, 30.0),
            )
        shift = 0.0
        if "calibration" in r.data:
            cal = _Reader(r.data["calibration"], f"{where}.calibration", ("reference_threshold", "threshold"))
            ref = cal.number_in("reference_threshold", 1e-6, 1 - 1e-6, required=True)
            own = cal.number_in("threshold", 1e-6, 1 - 1e-6, required=True)
            shift = _logit(ref) - _logit(own)
        model = r.get("model", str, required=True)
        return ModelNode(
            **common,
            model=model,
            route=r.get("route", str, model),
            max_length=r.number_in("max_length", 3, 1 << 20, self.max_sequence_length, kind=int),
            on_demand=on_demand,
            logit_shift=shift,
        )

    def _constant(self, r, where, common):
        return ConstantNode(
            **common,
            probability=r.number_in("probability", 0.0, 1.0, required=True),
            verdict=r.get("verdict", bool),
            route=r.get("route", str, common["name"]),
        )

    def _sequence(self, r, where, common):
        steps = [self.node(s, f"{where}.steps[{i}]") for i, s in enumerate(self._list(r, "steps", 1))]
        for i, step in enumerate(steps[:-1]):
            if not may_decline(step):
                raise PolicyError(f"{where}.steps[{i + 1}]: unreachable, steps[{i}] answers every text")
        return SequenceNode(**common, steps=steps)

    def _condition(self, data, where, has_score):
        r = _Reader(data, where, ("empty", "tokens", "param", "margin_below"))
        if not r.data:
            raise PolicyError(f"{where}: empty condition (use the switch's default instead)")
        cond = Condition(empty=r.get("empty", bool), margin_below=r.number_in("margin_below", 0.0, 1.0))
        if cond.margin_below is not None and not has_score:
            raise PolicyError(f"{where}.margin_below: needs a 'score' node on the switch")
        if "tokens" in r.data:
            t = _Reader(r.data["tokens"], f"{where}.tokens", ("min", "max"))
            cond.tokens_min = t.number_in("min", 0, 1 << 30, kind=int)
            cond.tokens_max = t.number_in("max", 0, 1 << 30, kind=int)
            if cond.tokens_min is None and cond.tokens_max is None:
                raise PolicyError(f"{where}.tokens: give min, max or both")
        if "param" in r.data:
            p = _Reader(r.data["param"], f"{where}.param", ("name", "equals", "in"))
            cond.param_name = p.get("name", str, required=True)
            if cond.param_name not in self.request_parameters:
                raise PolicyError(
                    f"{where}.param.name: {cond.param_name!r} is not declared in request_parameters"
                )
            if ("equals" in p.data) == ("in" in p.data):
                raise PolicyError(f"{where}.param: give exactly one of 'equals' or 'in'")
            values = [p.get("equals", str)] if "equals" in p.data else p.get("in", list)
            allowed = self.request_parameters[cond.param_name]
            for v in values:
                if v not in allowed:
                    raise PolicyError(
                        f"{where}.param: value {v!r} is not declared in request_parameters.{cond.param_name} {list(allowed)}"
                    )
            cond.param_values = tuple(values)
        return cond

    def _switch(self, r, where, common):
        score = self.node(r.data["score"], f"{where}.score") if "score" in r.data else None
        cases = []
        for i, c in enumerate(self._list(r, "cases", 1)):
            cr = _Reader(c, f"{where}.cases[{i}]", ("when", "then"))
            cond = self._condition(cr.get("when", dict, required=True), f"{where}.cases[{i}].when", score is not None)
            cases.append(Case(when=cond, then=self.node(cr.get("then", dict, required=True), f"{where}.cases[{i}].then")))
        default = self.node(r.data["default"], f"{where}.default") if "default" in r.data else None
        return SwitchNode(**common, cases=cases, default=default, score=score)

    def _cascade(self, r, where, common):
        stages = [self.node(s, f"{where}.stages[{i}]") for i, s in enumerate(self._list(r, "stages", 2))]
        return CascadeNode(**common, stages=stages, margin=r.number_in("margin", 0.0, 1.0, required=True))

    def _chunk(self, r, where, common):
        window = r.number_in("window", 3, 1 << 20, self.max_sequence_length, kind=int)
        stride = r.number_in("stride", 1, window - 2, max(1, (window - 2) * 3 // 4), kind=int)
        aggregation = r.get("aggregation", str, "length_weighted_mean")
        if aggregation not in AGGREGATIONS:
            raise PolicyError(f"{where}.aggregation: {aggregation!r}, expected one of {', '.join(AGGREGATIONS)}")
        inner = self.node(r.get("node", dict, required=True), f"{where}.node")
        return ChunkNode(**common, window=window, stride=stride, aggregation=aggregation, node=inner)

    def _split(self, r, where, common):
        branches = []
        for i, b in enumerate(self._list(r, "branches", 2)):
            br = _Reader(b, f"{where}.branches[{i}]", ("weight", "node"))
            weight = br.number_in("weight", 0.0, 1e9, required=True)
            if weight <= 0:
                raise PolicyError(f"{where}.branches[{i}].weight: must be > 0")
            branches.append((weight, self.node(br.get("node", dict, required=True), f"{where}.branches[{i}].node")))
        return SplitNode(**common, branches=branches)

    def _parallel(self, r, where, common):
        nodes = [self.node(n, f"{where}.nodes[{i}]") for i, n in enumerate(self._list(r, "nodes", 2))]
        combine = r.get("combine", str, "mean")
        if combine not in COMBINES:
            raise PolicyError(f"{where}.combine: {combine!r}, expected one of {', '.join(COMBINES)}")
        return ParallelNode(**common, nodes=nodes, combine=combine)

    def _fallback(self, r, where, common):
        nodes = [self.node(n, f"{where}.nodes[{i}]") for i, n in enumerate(self._list(r, "nodes", 2))]
        return FallbackNode(**common, nodes=nodes)


def parse_policy(document: Any) -> Policy:
    """Validate a policy document (the parsed YAML/JSON) and build the node tree.

    Raises:
        PolicyError: the first problem found, with its location.
    """
    r = _Reader(
        document,
        "policy",
        ("version", "root", "tokenizer", "postprocess", "max_sequence_length", "bls_max_batch_size", "request_parameters", "description", "inline"),
    )
    inline = _Reader(r.get("inline", dict, {}) or {}, "policy.inline", ("tokenizer", "postprocess"))
    version = r.get("version", int, 1)
    if version != 1:
        raise PolicyError(f"policy.version: {version} is not supported (expected 1)")
    params: Dict[str, Tuple[str, ...]] = {}
    for name, values in (r.get("request_parameters", dict, {}) or {}).items():
        where = f"policy.request_parameters.{name}"
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise PolicyError(f"{where}: expected a non-empty list of strings")
        params[str(name)] = tuple(values)
    max_len = r.number_in("max_sequence_length", 3, 1 << 20, 128, kind=int)
    root = _Parser(max_len, params).node(r.get("root", dict, required=True), "root")
    if may_decline(root):
        raise PolicyError("root: some texts may get no answer (a switch without default ends the policy)")
    for node in _walk(root):
        for child in children(node):
            if may_decline(child) and not isinstance(node, SequenceNode):
                raise PolicyError(f"{child.name}: a switch without default may only be a step of a sequence")
    return Policy(
        root=root,
        tokenizer=r.get("tokenizer", str, "tokenizer"),
        postprocess=r.get("postprocess", str, "postprocess"),
        max_sequence_length=max_len,
        bls_max_batch_size=r.number_in("bls_max_batch_size", 1, 1 << 20, 64, kind=int),
        request_parameters=params,
        inline_tokenizer=inline.get("tokenizer", str),
        inline_postprocess=inline.get("postprocess", bool, False),
        source=json.loads(json.dumps(document)),
    )


def read_document(path: Union[str, Path]) -> Any:
    """Parse a policy file: JSON for ``.json``, YAML otherwise.

    Raises:
        PolicyError: the file is missing or is not valid YAML/JSON.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read policy file: {exc.strerror}") from None
    try:
        if path.suffix == ".json":
            return json.loads(text)
        import yaml

        return yaml.safe_load(text)
    except Exception as exc:  # yaml and json raise different types
        raise PolicyError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None


def load_policy(path: Union[str, Path]) -> Policy:
    """Read and validate a policy file; errors are prefixed with the file name."""
    try:
        return parse_policy(read_document(path))
    except PolicyError as exc:
        msg = str(exc)
        raise PolicyError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


# ----------------------------------------------------------------------------- rendering


def _describe(node: Node) -> str:
    t = f" timeout={node.timeout_ms:g}ms" if node.timeout_ms else ""
    if isinstance(node, ModelNode):
        extra = f" route={node.route}" if node.route != node.model else ""
        if node.on_demand:
            extra += f" on_demand(idle={node.on_demand.idle_timeout_s:g}s, retry={node.on_demand.retry_after_s:g}s)"
        if node.logit_shift:
            extra += f" logit_shift={node.logit_shift:+.4f}"
        return f"model {node.model}{extra} max_length={node.max_length}{t}"
    if isinstance(node, ConstantNode):
        v = "" if node.verdict is None else f" verdict={str(node.verdict).lower()}"
        return f"constant p={node.probability:g}{v} route={node.route}{t}"
    if isinstance(node, CascadeNode):
        return f"cascade margin={node.margin:g}{t}"
    if isinstance(node, ChunkNode):
        return f"chunk window={node.window} stride={node.stride} aggregation={node.aggregation}{t}"
    if isinstance(node, ParallelNode):
        return f"parallel combine={node.combine}{t}"
    return f"{node.kind}{t}"


def _condition_text(c: Condition) -> str:
    parts = []
    if c.empty is not None:
        parts.append("empty" if c.empty else "not empty")
    if c.needs_tokens:
        parts.append(f"tokens in [{c.tokens_min if c.tokens_min is not None else 0}, {c.tokens_max if c.tokens_max is not None else 'inf'}]")
    if c.param_name:
        parts.append(f"param {c.param_name} in {list(c.param_values)}")
    if c.margin_below is not None:
        parts.append(f"|score - threshold| < {c.margin_below:g}")
    return " and ".join(parts)


def describe(policy: Policy) -> str:
    """The policy as an indented text tree (what ``orchestrator policy check`` prints)."""
    tok = f"inline({policy.inline_tokenizer})" if policy.inline_tokenizer else policy.tokenizer
    post = "inline" if policy.inline_postprocess else policy.postprocess
    lines = [
        f"policy: tokenizer={tok} postprocess={post} "
        f"max_sequence_length={policy.max_sequence_length} bls_max_batch_size={policy.bls_max_batch_size}"
    ]
    for name, values in policy.request_parameters.items():
        lines.append(f"request parameter {name}: {', '.join(values)}")

    def emit(node: Node, prefix: str, label: str):
        lines.append(f"{prefix}{label}[{node.name}] {_describe(node)}")
        sub = prefix + "    "
        if isinstance(node, SwitchNode):
            if node.score:
                emit(node.score, sub, "score: ")
            for c in node.cases:
                emit(c.then, sub, f"when {_condition_text(c.when)}: ")
            if node.default:
                emit(node.default, sub, "default: ")
        elif isinstance(node, SplitNode):
            total = sum(w for w, _ in node.branches)
            for w, n in node.branches:
                emit(n, sub, f"{100 * w / total:.1f}%: ")
        elif isinstance(node, SequenceNode):
            for i, n in enumerate(node.steps):
                emit(n, sub, f"{i + 1}. ")
        elif isinstance(node, CascadeNode):
            for i, n in enumerate(node.stages):
                emit(n, sub, "first: " if i == 0 else "then: ")
        elif isinstance(node, FallbackNode):
            for i, n in enumerate(node.nodes):
                emit(n, sub, "try: " if i == 0 else "else: ")
        else:
            for n in children(node):
                emit(n, sub, "")

    emit(policy.root, "", "root ")
    models = ", ".join(policy.models())
    lines.append(f"models called: {models}")
    od = policy.on_demand()
    if od:
        lines.append("on-demand models: " + ", ".join(f"{m} (idle {o.idle_timeout_s:g}s)" for m, o in od.items()))
    return "\n".join(lines)
