"""Declarative routing policy: a YAML or JSON file the router reads at ``initialize``.

A policy is a tree of nodes. Every node receives a set of texts and answers each with a
probability and the route that answered; the router then turns scores into
``PROBABILITIES`` and ``VERDICTS``. The node kinds, each with its keys and units, are
defined in ``orchestrator/runtime/routing/nodes/`` (one module per kind; the table is in that
package's docstring): ``model`` (``version`` pins a model version, ROUTE ``<model>@<n>``),
``constant``, ``sequence``, ``switch``, ``cascade``, ``chunk``, ``split``, ``parallel``,
``fallback`` and ``shadow`` (answer from ``primary``; ``candidate`` runs on a ``sample`` of
the requests in the background, bounded by ``queue_size``, and is compared in metrics).
Every node may have ``name`` (unique; used in metrics, errors and routes; default: its
path in the tree) and ``timeout_ms`` (the node fails when it takes longer).

Whether a pinned ``version`` exists in the model repository and is served by the model's
``version_policy`` is checked by ``orchestrator policy check`` (which reads the
repository); the router itself finds out at the first call (a BLS error names the model
and version).

Top-level keys (:data:`TOP`; every key's type, bounds, default and meaning, generated:
``docs/reference/policy.md``, and as JSON Schema for editors: ``docs/policy.schema.json``):
``version``, ``description``, ``root`` (required), ``tokenizer``, ``inline``,
``max_sequence_length``, ``bls_max_batch_size``, ``request_parameters``,
``ignored_parameters``, ``limits`` (``request.Limits``), ``circuit_breaker``
(``settings.BreakerSettings``), ``admission`` (``settings.AdmissionSettings``) and ``defaults`` (kind -> keys every node of that kind gets
unless it sets them: ``defaults: {chunk: {window: 128, stride: 96}}``). Both files are
written by ``python -m orchestrator.runtime.routing.policy_docs`` (``--check`` compares).

Every answer of a policy has its models' head (``heads.Head``, from ``<model>/head.json``):
:func:`bind_heads` checks the policy against the repository's heads when the router loads
(and in ``orchestrator policy check --repo``) and compiles it into the plan the engine runs:
a new, bound policy. Policies and their nodes are immutable (frozen dataclasses); what
changes while the router serves (a cascade's escalation budget) is held by the engine
(``nodes.base.Engine.state``).

A document with ``pipeline`` instead of ``root`` is a tensor pipeline (``routing.pipeline``):
:func:`parse_pipeline_policy` reads it into a :class:`PipelinePolicy` (the text-only keys
``tokenizer``, ``inline``, ``max_sequence_length``, ``bls_max_batch_size`` and ``defaults``
are refused there); :func:`load_any` reads either kind.

Errors: :class:`PolicyError`, whose message starts with the location of the bad key
(``root.steps[1].stages[0].model``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.request import Limits
from orchestrator.runtime.routing import nodes as N
from orchestrator.runtime.routing import schema as S
from orchestrator.runtime.routing.heads import LEGACY, Head
from orchestrator.runtime.routing.nodes.base import BindContext, ModelCall, Node, ParseContext, Windows
from orchestrator.runtime.routing.nodes.model import OnDemand
from orchestrator.runtime.routing.pipeline import PIPELINE, Pipeline, read_pipeline
from orchestrator.runtime.routing.settings import AdmissionSettings, BreakerSettings

__all__ = [
    "Policy", "PolicyError", "OnDemand", "TOP", "parse_policy", "read_document", "load_policy", "describe", "bind_heads",
    "PipelinePolicy", "parse_pipeline_policy", "parse_any", "load_any", "is_pipeline",
]


@dataclass(frozen=True)
class Policy:
    """A validated policy: as parsed (:func:`parse_policy`, ``head`` None), or the plan
    :func:`bind_heads` compiles from it (``head`` set, every node bound). Immutable
    (assigning a field raises ``dataclasses.FrozenInstanceError``).

    Attributes:
        root: the node every text enters.
        tokenizer: the tokenizer model of ``switch`` ``tokens`` conditions (None: the
            first model's, from its head).
        max_sequence_length: default token limit of model and chunk nodes (tokens).
        bls_max_batch_size: rows per BLS call.
        request_parameters: request parameter name -> the values clients may send.
        inline_tokenizer: True (or the older form, a tokenizer files directory relative to
            the router's model directory): tokenize in-process; None: through BLS.
        ignored_parameters: ``fnmatch`` patterns of request parameters accepted and ignored.
        limits: input size limits.
        breaker: circuit breaker settings.
        admission: admission control (None: every request runs; ``admission``).
        check_cancelled: ask ``request.is_cancelled()`` before a request's later stages
            (default True; False: never ask, and a cancelled request runs to its end).
        source: the validated document, for ``policy show``.
        head: the head of every answer: set in the plan :func:`bind_heads` returns (None
            in a parsed policy).
        version: the policy format's version.
    """

    root: Node
    tokenizer: Optional[str] = None
    max_sequence_length: int = 128
    bls_max_batch_size: int = 64
    request_parameters: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    inline_tokenizer: Union[bool, str, None] = None
    ignored_parameters: Tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    admission: Optional[AdmissionSettings] = None
    check_cancelled: bool = True
    source: Dict[str, Any] = field(default_factory=dict)
    head: Optional[Head] = None
    version: int = 1

    def nodes(self) -> List[Node]:
        """Every node, depth first from the root."""
        return list(N.walk(self.root))

    def calls(self) -> List[ModelCall]:
        """Every model call of the policy's nodes (``NodeKind.calls``), depth first."""
        return [c for n in self.nodes() for c in N.KINDS[n.kind].calls(n)]

    def models(self) -> List[str]:
        """Every downstream call target of the policy (BLS), tokenizer models included
        unless tokenization is inline: model names, ``name@version`` for pinned versions
        (``nodes.base.target``)."""
        names = [] if self.inline_tokenizer else self.tokenizers()
        names += [c.target for c in self.calls()]
        return list(dict.fromkeys(names))

    def tokenizers(self) -> List[str]:
        """The tokenizer models the policy's nodes read tokens of (``NodeKind.tokens``:
        models their heads', ``tokens`` conditions and windows the policy's ``tokenizer``,
        by default the first model's)."""
        default = self.tokenizer or (self.head.tokenizer if self.head else LEGACY.tokenizer)
        nodes = self.nodes()
        calling = [n for n in nodes if N.KINDS[n.kind].calls(n)]  # the models' tokenizers come first
        rest = [n for n in nodes if not N.KINDS[n.kind].calls(n)]
        names = [t or default for n in calling + rest for t in N.KINDS[n.kind].tokens(n)]
        return list(dict.fromkeys(names))

    def windows(self) -> List[Windows]:
        """How the policy's nodes window texts (``NodeKind.windows``): one per node that
        does, nodes that window one tokenizer's tokens alike (one ``functools.partial`` of
        the same function and arguments) counted once."""
        seen: Dict[Any, Windows] = {}
        for n in self.nodes():
            w = N.KINDS[n.kind].windows(n)
            if w is not None:
                c = w.count
                alike = (c.func, c.args, tuple(sorted(c.keywords.items()))) if isinstance(c, partial) else id(c)
                seen.setdefault((w.tokenizer, alike), w)
        return list(seen.values())

    def model_nodes(self) -> List[Node]:
        """Every node that calls a model itself (``NodeKind.calls``: ``model`` nodes),
        depth first (shadow candidates included)."""
        return [n for n in self.nodes() if N.KINDS[n.kind].calls(n)]

    def on_demand(self) -> Dict[str, OnDemand]:
        """Models marked ``on_demand``, with their settings (the first mention wins)."""
        out: Dict[str, OnDemand] = {}
        for c in self.calls():
            if c.on_demand is not None:
                out.setdefault(c.model, c.on_demand)
        return out


def _inline(values: Dict[str, Any], where: str) -> Union[bool, str, None]:
    return values["tokenizer"] or None


#: The ``inline`` mapping; read as the policy's ``inline_tokenizer``.
INLINE = S.Struct(
    "inline",
    [
        S.Key("tokenizer", S.AnyOf(S.Bool(), S.Str()), "`true`: tokenize in the router's process with each tokenizer "
              "model's own files (`<repository>/<tokenizer>/1`) instead of a BLS call, one round trip fewer per "
              "execute; a path (the older form, e.g. `../tokenizer/1`) is accepted when it is those files", nullable=True),
        S.Key("postprocess", S.Const(S.Bool(), True, "false is no longer offered: the router turns logits into answers "
              "with each model's head (orchestrator.runtime.routing.heads) in-process; delete the key"),
              "kept for older policies: the router always turns logits into answers with its models' heads in-process"),
    ],
    build=_inline,
    always=True,
    doc="What the router does in its own process instead of a BLS call.",
)

#: The ``limits`` mapping (defaults: ``request.Limits``).
LIMITS = S.Struct(
    "limits",
    [
        S.Key("max_text_bytes", S.Int(1, 1 << 31), "UTF-8 bytes per text (64 KiB is about 10,000 English words); "
              "checked before decoding"),
        S.Key("max_request_bytes", S.Int(1, 1 << 31), "UTF-8 bytes of all texts of one request (4 MiB: 64 texts, "
              "the router's max_batch_size, of 64 KiB)"),
        S.Key("max_windows_per_text", S.Int(1, 1 << 20), "windows a chunk node may make of one text (256: about "
              "24,600 tokens at window 128, stride 96), which bounds a text's model time"),
    ],
    target=Limits,
    build=lambda values, where: Limits(**values),
    always=True,
    doc="Input sizes the router accepts; a request over one gets INVALID_ARG naming the text, its size and the limit.",
)

#: The ``circuit_breaker`` mapping (defaults: ``settings.BreakerSettings``).
BREAKER = S.Struct(
    "circuit_breaker",
    [
        S.Key("consecutive_failures", S.Int(1, 1000), "failures in a row that open a model's circuit (at once when "
              "the model cannot serve: stub dead, not ready)"),
        S.Key("open_s", S.Number(0.0, 3600.0), "seconds an open circuit fails fast before one probe call"),
        S.Key("reload_unhealthy", S.Bool(), "reload a model whose stub process died (needs "
              "`--model-control-mode=explicit`)"),
        S.Key("reload_interval_s", S.Number(0.0, 86400.0), "seconds: the longest wait between two tries of a "
              "repair that keeps failing (back-off), and how long a repaired model must stay up before its next "
              "repair starts without delay"),
        S.Key("watch_stubs", S.Bool(), "see a dead stub in /proc before calling it instead of waiting Triton's "
              "1 s health timeout"),
        S.Key("count_timeouts", S.Bool(), "count a call cancelled by a node's or a pipeline step's timeout_ms (or the request's deadline) "
              "as a failure of its model; default false: a node's deadline is its own, and its expiries do not "
              "close a healthy model to the other nodes"),
    ],
    target=BreakerSettings,
    build=lambda values, where: BreakerSettings(**values),
    always=True,
    doc="Per downstream model (docs/guides/reliability.md).",
)

#: The ``admission`` mapping (``settings.AdmissionSettings``).
ADMISSION = S.Struct(
    "admission",
    [
        S.Key("max_wait_ms", S.Number(above=0.0, high=3.6e6), "milliseconds from a request's arrival to its answer "
              "that the router aims to keep: at the start of each execute it runs as many of the waiting requests "
              "as its estimated queue delay plus its measured cost per request allow (at least one) and refuses "
              "the others at once with UNAVAILABLE, before any model runs for them", required=True),
    ],
    target=AdmissionSettings,
    build=lambda values, where: AdmissionSettings(**values),
    doc="Admission control (docs/guides/reliability.md \"Admission control\"): refuse what cannot be answered in time; "
        "refusals count in `orchestrator_shed_requests_total`. Absent: every request runs.",
)

#: The top level of a policy document; ``root`` is read last (its nodes need the rest).
TOP = S.Struct(
    "policy",
    [
        S.Key("version", S.Const(S.Int(1, 1 << 20), 1, "{value} is not supported (expected 1)"), "the format's version"),
        S.Key("description", S.Str(empty=True), "free text"),
        S.Key("tokenizer", S.Str(), "the tokenizer model whose tokens `switch` `tokens` conditions count "
              "(model and chunk nodes always use their models' own, from their heads)",
              computed="the first model's, from its head"),
        S.Key("inline", INLINE, "in-process work instead of BLS calls", nullable=True),
        S.Key("max_sequence_length", S.Int(3, 1 << 20), "tokens: default `max_length` of model nodes and `window` "
              "of chunk nodes (the demo tokenizer's `model_max_length`); at most each model's `max_length` (its head)"),
        S.Key("bls_max_batch_size", S.Int(1, 1 << 20), "rows per BLS call (the downstream models' `max_batch_size`)"),
        S.Key("request_parameters", S.Params(), "request parameter name -> the values clients may send; `param` "
              "conditions may only use these, and a request with another value is refused", nullable=True),
        S.Key("ignored_parameters", S.Strings(), "request parameters accepted and ignored (`fnmatch` patterns, e.g. "
              "headers forwarded by `--http-header-forward-pattern`); any other undeclared parameter is refused"),
        S.Key("limits", LIMITS, "input sizes", nullable=True),
        S.Key("circuit_breaker", BREAKER, "circuit breaker settings", attr="breaker", nullable=True),
        S.Key("admission", ADMISSION, "admission control under overload", nullable=True),
        S.Key("check_cancelled", S.Bool(), "before each later stage of a request (a node or step after its first "
              "downstream call), ask Triton whether its client cancelled it, and answer CANCELLED without running "
              "the rest; each ask is an IPC round trip of the stub (about 0.1 ms): false never asks, and a cancelled "
              "request runs to its end"),
        S.Key("defaults", N.KindDefaults(), "kind -> keys every node of that kind gets unless it sets them, e.g. "
              "`{chunk: {window: 128, stride: 96}}` (optional keys without nodes; not `name`)", nullable=True),
        S.Key("root", S.NodeRef(), "the node every text enters (a text policy; exactly one of `root`, `pipeline`)",
              location="root", attr="_root"),
        S.Key("pipeline", PIPELINE, "a tensor pipeline instead of `root`: steps moving named tensors between models "
              "(docs/guides/branching-pipelines.md)"),
    ],
    target=Policy,
    one_of=(("root", "pipeline"), "give exactly one of root (a text policy) or pipeline (a tensor pipeline)"),
)

#: Top-level keys of text policies only (a pipeline policy refuses them).
TEXT_ONLY = ("tokenizer", "inline", "max_sequence_length", "bls_max_batch_size", "defaults")


@dataclass(frozen=True)
class PipelinePolicy:
    """A validated pipeline policy (top-level ``pipeline``; ``routing.pipeline``).

    Attributes:
        pipeline: the parsed pipeline (bound to the router's config by the router at load).
        request_parameters: request parameter name -> the values clients may send.
        ignored_parameters: ``fnmatch`` patterns of request parameters accepted (and
            forwarded by steps with ``parameters: forward``).
        breaker: circuit breaker settings (per model).
        admission: admission control (None: every request runs).
        check_cancelled: ask ``request.is_cancelled()`` before a request's later steps.
        source: the validated document.
        version: the policy format's version.
        limits: only ``max_request_bytes`` counts for a pipeline: the request body the front
            door (``orchestrator frontdoor``) and ``orchestrator deploy`` size for this router.
    """

    pipeline: Pipeline
    request_parameters: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    ignored_parameters: Tuple[str, ...] = ()
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    admission: Optional[AdmissionSettings] = None
    check_cancelled: bool = True
    source: Dict[str, Any] = field(default_factory=dict)
    version: int = 1
    inline_tokenizer: Union[bool, str, None] = None  # none: the Downstream's readiness reads it
    limits: Limits = field(default_factory=Limits)

    def models(self) -> List[str]:
        """Every call target of the pipeline's steps (``model`` or ``model@version``)."""
        return self.pipeline.models()

    def on_demand(self) -> Dict[str, OnDemand]:
        """Step models marked ``on_demand``, with their settings (the first mention wins)."""
        out: Dict[str, OnDemand] = {}
        for s in self.pipeline.step_nodes():
            if s.on_demand is not None:
                out.setdefault(s.model, s.on_demand)
        return out

    def tokenizers(self) -> List[str]:
        """A pipeline has no tokenizer models of its own."""
        return []


def _check_top(document: Any) -> None:
    """``root`` or ``pipeline``, exactly one (before the other keys are read)."""
    if isinstance(document, Mapping):
        if "root" in document and "pipeline" in document:
            raise PolicyError("policy: give only one of root (a text policy) and pipeline (a tensor pipeline)")
        if "root" not in document and "pipeline" not in document:
            raise PolicyError("policy.root: required key is missing (or `pipeline`, for a tensor pipeline)")
    TOP.check(document, "policy")


def is_pipeline(document: Any) -> bool:
    """True for a pipeline policy document (a mapping with the top-level key ``pipeline``)."""
    return isinstance(document, Mapping) and "pipeline" in document


def parse_pipeline_policy(document: Any) -> PipelinePolicy:
    """Validate a pipeline policy document (top-level ``pipeline``).

    Raises:
        PolicyError: the first problem found, with its location.
    """
    _check_top(document)
    text_only = [k for k in TEXT_ONLY if k in document]
    if text_only:
        raise PolicyError(f"policy.{text_only[0]}: a key of text policies (root); a pipeline policy does not use it")
    v = {k.name: TOP.read_key(k, document, "policy", None) for k in TOP.keys if k.name not in ("root", "pipeline")}
    return PipelinePolicy(
        pipeline=read_pipeline(document["pipeline"]),
        request_parameters=v["request_parameters"],
        ignored_parameters=tuple(v["ignored_parameters"]),
        breaker=v["circuit_breaker"],
        admission=v["admission"],
        check_cancelled=v["check_cancelled"],
        source=json.loads(json.dumps(document)),
        version=v["version"],
        limits=v["limits"],
    )


def parse_any(document: Any) -> Union[Policy, PipelinePolicy]:
    """A text policy (:func:`parse_policy`) or a pipeline policy (:func:`parse_pipeline_policy`),
    by its top-level key (raises PolicyError)."""
    return parse_pipeline_policy(document) if is_pipeline(document) else parse_policy(document)


def load_any(path: Union[str, Path]) -> Union[Policy, PipelinePolicy]:
    """Read and validate a policy file of either kind; errors are prefixed with the file name.

    Raises:
        PolicyError: unreadable, not YAML/JSON, or invalid (with the location).
    """
    try:
        return parse_any(read_document(path))
    except PolicyError as exc:
        msg = str(exc)
        raise PolicyError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def _check_declining(root: Node) -> None:
    if N.may_decline(root):
        raise PolicyError("root: some texts may get no answer (a switch without default ends the policy)")
    for node in N.walk(root):
        for child in N.children(node):
            if N.may_decline(child) and not N.KINDS[node.kind].accepts_declining:
                raise PolicyError(f"{child.name}: a switch without default may only be a step of a sequence")


def parse_policy(document: Any) -> Policy:
    """Validate a policy document (the parsed YAML/JSON) against :data:`TOP` and the node
    kinds, and build the node tree.

    Raises:
        PolicyError: the first problem found, with its location.
    """
    _check_top(document)
    if is_pipeline(document):
        raise PolicyError("policy.pipeline: a tensor pipeline, not a text policy (read it with load_any or "
                          "parse_pipeline_policy)")
    v = {k.name: TOP.read_key(k, document, "policy", None) for k in TOP.keys if k.name not in ("root", "pipeline")}
    names: Dict[str, str] = {}
    ctx = ParseContext(
        v["max_sequence_length"], v["request_parameters"], lambda data, where: N.parse_node(data, where, ctx, names),
        v["defaults"] or {},
    )
    root = TOP.read_key(TOP.key("root"), document, "policy", ctx)
    _check_declining(root)
    return Policy(
        root=root,
        tokenizer=v["tokenizer"],
        max_sequence_length=v["max_sequence_length"],
        bls_max_batch_size=v["bls_max_batch_size"],
        request_parameters=v["request_parameters"],
        inline_tokenizer=v["inline"],
        ignored_parameters=tuple(v["ignored_parameters"]),
        limits=v["limits"],
        breaker=v["circuit_breaker"],
        admission=v["admission"],
        check_cancelled=v["check_cancelled"],
        source=json.loads(json.dumps(document)),
        version=v["version"],
    )


def bind_heads(policy: Policy, heads: Mapping[str, Head]) -> Policy:
    """Compile ``policy`` into the plan the engine runs: check that the policy can answer
    with its models' heads and return a new policy whose ``head`` is the one every answer
    has and whose nodes are bound (``NodeKind.bind``: every ``model`` node has its model's
    head, switch and chunk nodes their tokenizer). ``policy`` is left as it is.

    Args:
        policy: a parsed policy.
        heads: model name -> its head (``heads.read_head`` of ``<repo>/<model>``, or
            ``heads.LEGACY`` for a model directory without ``head.json``); every model the
            policy names must be a key.

    Checks, each a PolicyError naming the node's location:
        - every model node's head is compatible (``Head.compatible``) with the first one's:
          a router answers every text in the same columns, so cascade stages, fallbacks,
          split arms, switch cases and shadow candidates must agree on kind and labels;
          except a model node whose answers are only read to route (``NodeKind.reads_only``:
          a switch's ``score`` when the switch has a ``default``), which may have its own
          head (a domain or language model before specialists); the switch checks the
          labels its cases name against it;
        - ``max_length`` of a model node, and ``window`` of a chunk node, at most its
          model's ``max_length`` (a longer input would be cut by the tokenizer elsewhere,
          or fail in the model);
        - a chunk node's models share one tokenizer (windows are token windows);
        - ``calibration`` fits the head: one value for binary heads, one per label (or
          one for all) for multilabel heads, none for multiclass heads;
        - a constant's ``probability`` has one value or one per output column.

    Returns:
        The plan: ``policy`` with ``head`` set and its tree bound (``nodes.bind_tree``).

    Raises:
        PolicyError: the first problem found, with its location.
    """
    calls = policy.calls()
    if not calls:  # constants only: one column, as a binary head answers
        return replace(policy, head=LEGACY)
    for call in calls:
        if call.model not in heads:
            raise PolicyError(f"{call.where}.model: model '{call.model}' is not in the model repository")
    # a model node whose answers are only read to route (a switch's score) may have its own head
    routing = {id(r) for n in policy.nodes() for r in N.KINDS[n.kind].reads_only(n) if N.KINDS[r.kind].calls(r)
               and not N.children(r)}
    answering = [c for n in policy.nodes() if id(n) not in routing for c in N.KINDS[n.kind].calls(n)]
    first = answering[0] if answering else calls[0]
    if heads[calls[0].model].compatible(heads[first.model]):
        first = calls[0]  # the first model's head, as without routing (its tokenizer is the default)
    head = heads[first.model]
    for call in answering:
        if not heads[call.model].compatible(head):
            raise PolicyError(
                f"{call.where}.model: '{call.model}' has a {heads[call.model].describe()} head, but '{first.model}' "
                f"({first.where}) has a {head.describe()} head; a router answers every text with one head"
            )
    ctx = BindContext(head, policy.tokenizer or head.tokenizer, {c.model: heads[c.model] for c in calls})
    return replace(policy, root=N.bind_tree(policy.root, ctx), head=head)


def inline_tokenizer_dirs(policy: Policy, model_dir: Path) -> Dict[str, Path]:
    """Tokenizer model name -> the directory of its files (``<repository>/<name>/1``, the
    repository being the router's model directory's parent), for in-process tokenization.

    Raises:
        PolicyError: ``inline.tokenizer`` is a path that is not the files of the one
            tokenizer the policy's models use.
    """
    repo = Path(model_dir).resolve().parent
    dirs = {name: repo / name / "1" for name in policy.tokenizers()}
    if isinstance(policy.inline_tokenizer, str):
        given = (Path(model_dir) / policy.inline_tokenizer).resolve()
        if list(dirs.values()) != [given]:
            raise PolicyError(
                f"policy.inline.tokenizer: {policy.inline_tokenizer!r} is not the files of the tokenizer model(s) the "
                f"policy's models use ({', '.join(dirs)}, from their heads); write 'tokenizer: true'"
            )
    return dirs


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
    """Read and validate a policy file; errors are prefixed with the file name.

    Raises:
        PolicyError: unreadable, not YAML/JSON, or invalid (with the location).
    """
    try:
        return parse_policy(read_document(path))
    except PolicyError as exc:
        msg = str(exc)
        raise PolicyError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def describe(policy: Policy) -> str:
    """The policy as an indented text tree (what ``orchestrator policy check`` prints)."""
    toks = ",".join(policy.tokenizers())
    tok = f"inline({toks})" if policy.inline_tokenizer else toks
    head = f" head={policy.head.describe()}" if policy.head else ""
    lines = [
        f"policy: tokenizer={tok}{head} "
        f"max_sequence_length={policy.max_sequence_length} bls_max_batch_size={policy.bls_max_batch_size}"
    ]
    for name, values in policy.request_parameters.items():
        lines.append(f"request parameter {name}: {', '.join(values)}")
    if policy.ignored_parameters:
        lines.append(f"ignored parameters: {', '.join(policy.ignored_parameters)}")
    lim, cb = policy.limits, policy.breaker
    lines.append(
        f"limits: {lim.max_text_bytes} bytes per text, {lim.max_request_bytes} bytes per request, "
        f"{lim.max_windows_per_text} windows per text"
    )
    lines.append(
        f"circuit breaker: open after {cb.consecutive_failures} failures in a row, probe after {cb.open_s:g} s, "
        + (f"reload a model whose stub died (failed tries retried with back-off up to {cb.reload_interval_s:g} s)" if cb.reload_unhealthy else "no reloads")
        + (", dead stubs seen in /proc before a call" if cb.watch_stubs else "")
        + (", a call cancelled by a node's timeout counts as a failure" if cb.count_timeouts else "")
    )

    if policy.admission is not None:
        lines.append(f"admission: refuse what would wait over {policy.admission.max_wait_ms:g} ms (UNAVAILABLE)")

    def emit(node: Node, prefix: str, label: str) -> None:
        lines.append(f"{prefix}{label}[{node.name}] {N.describe(node)}")
        for child_label, child in N.labelled_children(node):
            emit(child, prefix + "    ", child_label)

    emit(policy.root, "", "root ")
    lines.append(f"models called: {', '.join(policy.models())}")
    od = policy.on_demand()
    if od:
        lines.append("on-demand models: " + ", ".join(f"{m} (idle {o.idle_timeout_s:g}s)" for m, o in od.items()))
    return "\n".join(lines)
