"""Declarative routing policy: a YAML or JSON file the router reads at ``initialize``.

A policy is a tree of nodes. Every node receives a set of texts and answers each with a
probability and the route that answered; the router then turns scores into
``PROBABILITIES`` and ``VERDICTS``. The node kinds, each with its keys and units, are
defined in ``orchestrator/runtime/nodes/`` (one module per kind; the table is in that
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

Top-level keys:
    version               1
    description           free text
    root                  NODE (required)
    tokenizer             the tokenizer model whose tokens ``switch`` ``tokens`` conditions
                          count (default: the first model's, from its head). Model and
                          chunk nodes always use their own model's tokenizer (its head).
    inline                ``tokenizer: true``: tokenize in the router's process with each
                          tokenizer model's own files (``<repository>/<tokenizer>/1``)
                          instead of a BLS call, saving one round trip per ``execute``;
                          a path (the older form, e.g. ``../tokenizer/1``) is accepted
                          when it is those files. ``postprocess: true`` (the only value):
                          kept for older policies; the router always turns logits into
                          answers with its models' heads (``orchestrator.runtime.heads``,
                          the postprocess model's own functions) in-process.
    max_sequence_length   tokens (default 128, the demo tokenizer's ``model_max_length``);
                          at most each model's ``max_length`` (its head)
    bls_max_batch_size    rows per BLS call (default 64, the downstream models'
                          ``max_batch_size``)
    request_parameters    request parameter name -> the values clients may send; ``param``
                          conditions may only use these, and a request with another value
                          is refused, so clients choose among routes and never name a model
    ignored_parameters    request parameters accepted and ignored (``fnmatch`` patterns, e.g.
                          headers forwarded by ``--http-header-forward-pattern``); any
                          other parameter that is not declared is refused
    limits                input sizes (``request.Limits``): ``max_text_bytes`` (65536),
                          ``max_request_bytes`` (4194304), ``max_windows_per_text`` (256)
    circuit_breaker       per downstream model (``health.BreakerSettings``):
                          ``consecutive_failures`` (3), ``open_s`` (5), ``reload_unhealthy``
                          (true), ``reload_interval_s`` (30), ``watch_stubs`` (true)

Every answer of a policy has its models' head (``heads.Head``, from ``<model>/head.json``):
:func:`bind_heads` checks the policy against the repository's heads when the router loads
(and in ``orchestrator policy check --repo``).

Errors: :class:`PolicyError`, whose message starts with the location of the bad key
(``root.steps[1].stages[0].model``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from orchestrator.runtime import nodes as N
from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.heads import LEGACY, Head
from orchestrator.runtime.health import BreakerSettings
from orchestrator.runtime.nodes.base import BindContext, Node, ParseContext, Reader
from orchestrator.runtime.nodes.model import ModelNode, OnDemand
from orchestrator.runtime.request import Limits

__all__ = ["Policy", "PolicyError", "OnDemand", "parse_policy", "read_document", "load_policy", "describe", "bind_heads"]

TOP_LEVEL_KEYS = (
    "version", "root", "tokenizer", "max_sequence_length", "bls_max_batch_size",
    "request_parameters", "description", "inline", "ignored_parameters", "limits", "circuit_breaker",
)


@dataclass
class Policy:
    """A validated policy.

    Attributes:
        root: the node every text enters.
        tokenizer: the tokenizer model of ``switch`` ``tokens`` conditions (None: the
            first model's, set by :func:`bind_heads`).
        max_sequence_length: default token limit of model and chunk nodes (tokens).
        bls_max_batch_size: rows per BLS call.
        request_parameters: request parameter name -> the values clients may send.
        inline_tokenizer: True (or the older form, a tokenizer files directory relative to
            the router's model directory): tokenize in-process; None: through BLS.
        ignored_parameters: ``fnmatch`` patterns of request parameters accepted and ignored.
        limits: input size limits.
        breaker: circuit breaker settings.
        source: the validated document, for ``policy show``.
        head: the head of every answer, set by :func:`bind_heads` (None before).
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
    source: Dict[str, Any] = field(default_factory=dict)
    head: Optional[Head] = None

    def nodes(self) -> List[Node]:
        """Every node, depth first from the root."""
        return list(N.walk(self.root))

    def models(self) -> List[str]:
        """Every downstream call target of the policy (BLS), tokenizer models included
        unless tokenization is inline: model names, ``name@version`` for pinned versions
        (``nodes.model.target``)."""
        names = [] if self.inline_tokenizer else self.tokenizers()
        names += [n.target for n in self.nodes() if isinstance(n, ModelNode)]
        return list(dict.fromkeys(names))

    def tokenizers(self) -> List[str]:
        """The tokenizer models the policy needs: its models' (their heads), the
        ``tokenizer`` of ``tokens`` conditions when a switch has one."""
        names = [n.head.tokenizer for n in self.model_nodes()]
        if any(getattr(c.when, "needs_tokens", False) for n in self.nodes() if n.kind == "switch" for c in n.cases):
            names.append(self.tokenizer or (names[0] if names else "tokenizer"))
        return list(dict.fromkeys(names))

    def model_nodes(self) -> List[ModelNode]:
        """Every ``model`` node, depth first (shadow candidates included)."""
        return [n for n in self.nodes() if isinstance(n, ModelNode)]

    def on_demand(self) -> Dict[str, OnDemand]:
        """Models marked ``on_demand``, with their settings (the first mention wins)."""
        out: Dict[str, OnDemand] = {}
        for n in self.nodes():
            if isinstance(n, ModelNode) and n.on_demand is not None:
                out.setdefault(n.model, n.on_demand)
        return out


def _request_parameters(r: Reader) -> Dict[str, Tuple[str, ...]]:
    params: Dict[str, Tuple[str, ...]] = {}
    for name, values in (r.get("request_parameters", dict, {}) or {}).items():
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise PolicyError(f"policy.request_parameters.{name}: expected a non-empty list of strings")
        params[str(name)] = tuple(values)
    return params


def _limits(r: Reader) -> Limits:
    d = Limits()
    lr = Reader(r.get("limits", dict, {}) or {}, "policy.limits", ("max_text_bytes", "max_request_bytes", "max_windows_per_text"))
    return Limits(
        max_text_bytes=lr.number_in("max_text_bytes", 1, 1 << 31, d.max_text_bytes, kind=int),
        max_request_bytes=lr.number_in("max_request_bytes", 1, 1 << 31, d.max_request_bytes, kind=int),
        max_windows_per_text=lr.number_in("max_windows_per_text", 1, 1 << 20, d.max_windows_per_text, kind=int),
    )


def _breaker(r: Reader) -> BreakerSettings:
    d = BreakerSettings()
    keys = ("consecutive_failures", "open_s", "reload_unhealthy", "reload_interval_s", "watch_stubs")
    br = Reader(r.get("circuit_breaker", dict, {}) or {}, "policy.circuit_breaker", keys)
    return BreakerSettings(
        consecutive_failures=br.number_in("consecutive_failures", 1, 1000, d.consecutive_failures, kind=int),
        open_s=br.number_in("open_s", 0.0, 3600.0, d.open_s),
        reload_unhealthy=br.get("reload_unhealthy", bool, d.reload_unhealthy),
        reload_interval_s=br.number_in("reload_interval_s", 0.0, 86400.0, d.reload_interval_s),
        watch_stubs=br.get("watch_stubs", bool, d.watch_stubs),
    )


def _ignored_parameters(r: Reader) -> Tuple[str, ...]:
    patterns = r.get("ignored_parameters", list, [])
    for i, p in enumerate(patterns):
        if not isinstance(p, str) or not p:
            raise PolicyError(f"policy.ignored_parameters[{i}]: expected a non-empty string, got {p!r}")
    return tuple(patterns)


def _check_declining(root: Node) -> None:
    if N.may_decline(root):
        raise PolicyError("root: some texts may get no answer (a switch without default ends the policy)")
    for node in N.walk(root):
        for child in N.children(node):
            if N.may_decline(child) and node.kind != "sequence":
                raise PolicyError(f"{child.name}: a switch without default may only be a step of a sequence")


def parse_policy(document: Any) -> Policy:
    """Validate a policy document (the parsed YAML/JSON) and build the node tree.

    Raises:
        PolicyError: the first problem found, with its location.
    """
    r = Reader(document, "policy", TOP_LEVEL_KEYS)
    inline = Reader(r.get("inline", dict, {}) or {}, "policy.inline", ("tokenizer", "postprocess"))
    if inline.get("postprocess", bool, True) is not True:
        raise PolicyError(
            "policy.inline.postprocess: false is no longer offered: the router turns logits into answers with each "
            "model's head (orchestrator.runtime.heads) in-process; delete the key"
        )
    inline_tokenizer = inline.data.get("tokenizer")
    if inline_tokenizer is not None and not (inline_tokenizer is True or inline_tokenizer is False):
        inline_tokenizer = inline.get("tokenizer", str)
    if "postprocess" in r.data:
        raise PolicyError("policy.postprocess: no longer a key: each model's head decides its answers (delete the key)")
    version = r.get("version", int, 1)
    if version != 1:
        raise PolicyError(f"policy.version: {version} is not supported (expected 1)")
    params = _request_parameters(r)
    max_len = r.number_in("max_sequence_length", 3, 1 << 20, 128, kind=int)
    names: Dict[str, str] = {}
    ctx = ParseContext(max_len, params, lambda data, where: N.parse_node(data, where, ctx, names))
    root = ctx.parse_node(r.get("root", dict, required=True), "root")
    _check_declining(root)
    return Policy(
        root=root,
        tokenizer=r.get("tokenizer", str),
        max_sequence_length=max_len,
        bls_max_batch_size=r.number_in("bls_max_batch_size", 1, 1 << 20, 64, kind=int),
        request_parameters=params,
        inline_tokenizer=inline_tokenizer or None,
        ignored_parameters=_ignored_parameters(r),
        limits=_limits(r),
        breaker=_breaker(r),
        source=json.loads(json.dumps(document)),
    )


def bind_heads(policy: Policy, heads: Mapping[str, Head]) -> Head:
    """Give every ``model`` node its model's head and check that the policy can answer with
    them; returns the policy's head (the one every answer has; set as ``policy.head``).

    Args:
        policy: a parsed policy.
        heads: model name -> its head (``heads.read_head`` of ``<repo>/<model>``, or
            ``heads.LEGACY`` for a model directory without ``head.json``); every model the
            policy names must be a key.

    Checks, each a PolicyError naming the node's location:
        - every model node's head is compatible (``Head.compatible``) with the first one's:
          a router answers every text in the same columns, so cascade stages, fallbacks,
          split arms, switch cases and shadow candidates must agree on kind and labels;
        - ``max_length`` of a model node, and ``window`` of a chunk node, at most its
          model's ``max_length`` (a longer input would be cut by the tokenizer elsewhere,
          or fail in the model);
        - a chunk node's models share one tokenizer (windows are token windows);
        - ``calibration`` fits the head: one value for binary heads, one per label (or
          one for all) for multilabel heads, none for multiclass heads;
        - a constant's ``probability`` has one value or one per output column.

    Raises:
        PolicyError: the first problem found, with its location.
    """
    model_nodes = policy.model_nodes()
    if not model_nodes:  # constants only: one column, as a binary head answers
        policy.head = LEGACY
        return LEGACY
    for node in model_nodes:
        if node.model not in heads:
            raise PolicyError(f"{node.where}.model: model '{node.model}' is not in the model repository")
        node.head = heads[node.model]
    first = model_nodes[0]
    for node in model_nodes:
        if not node.head.compatible(first.head):
            raise PolicyError(
                f"{node.where}.model: '{node.model}' has a {node.head.describe()} head, but '{first.model}' "
                f"({first.where}) has a {first.head.describe()} head; a router answers every text with one head"
            )
        if node.max_length > node.head.max_length:
            raise PolicyError(
                f"{node.where}.max_length: {node.max_length} tokens, over model '{node.model}''s maximum of "
                f"{node.head.max_length} (its head.json max_length); lower max_sequence_length or the node's max_length"
            )
        node.check_calibration()
    ctx = BindContext(first.head, policy.tokenizer or first.head.tokenizer)
    for node in policy.nodes():
        N.KINDS[node.kind].bind(node, ctx)
    policy.head = first.head
    return first.head


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
    )

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
