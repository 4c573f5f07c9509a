"""``model``: classify with one model (optionally one version of it) through BLS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.heads import LEGACY, Head
from orchestrator.runtime.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext, Reader
from orchestrator.runtime.scores import logit

#: Separates a model's name from a pinned version in targets and default routes
#: (``classifier@1``); ``:`` already qualifies routes (``chunked:``, ``:degraded``).
VERSION_SEP = "@"


def target(model: str, version: Optional[int] = None) -> str:
    """The downstream call target of a model node: ``model`` (Triton's choice of version:
    the highest ready one) or ``model@version`` (that version). Circuit breakers, metrics
    labels and errors use it, so two versions of one model are told apart."""
    return f"{model}{VERSION_SEP}{version}" if version is not None else model


def split_target(name: str) -> Tuple[str, Optional[int]]:
    """``(model, version or None)`` of a :func:`target` string."""
    model, sep, version = name.rpartition(VERSION_SEP)
    if sep and model and version.isdigit():
        return model, int(version)
    return name, None


@dataclass
class OnDemand:
    """Load a model with ``pb_utils.load_model`` on first use, unload it when idle.

    Attributes:
        idle_timeout_s: seconds without use before the router unloads a model it loaded
            (default 300).
        retry_after_s: seconds after a failed load before the next load is tried
            (default 30).
    """

    idle_timeout_s: float = 300.0
    retry_after_s: float = 30.0


@dataclass
class ModelNode(Node):
    """Classify every text with one model.

    Policy keys: ``model`` (name, required), ``version`` (an integer >= 1: call that
    version of the model, as Triton users ship a new version next to the old one with
    ``version_policy: { specific: { versions: [1, 2] } }``; default: no version, Triton
    calls the highest ready version), ``route`` (the ``ROUTE`` value; default the model
    name, ``<model>@<version>`` when ``version`` is set, e.g. ``classifier@1``: a bare
    model name in ``ROUTE`` always means the latest version),
    ``max_length`` (tokens; longer inputs are truncated as the ensemble's
    tokenizer does; default the policy's ``max_sequence_length``), ``on_demand``
    (``{idle_timeout_s, retry_after_s}``, see :class:`OnDemand`; ``true`` for the
    defaults), ``calibration`` (``{reference_threshold, threshold}``: this variant's
    threshold that reproduces the reference model's verdicts at the reference threshold,
    e.g. from ``orchestrator parity``).

    Attributes:
        model: the model's name in the repository.
        version: the model version to call, or None (the highest ready version).
        route: the ``ROUTE`` value of its answers.
        max_length: tokens per input row, special tokens included.
        on_demand: on-demand loading settings, or None (always loaded).
        logit_shift: added to the model's logits: ``logit(reference_threshold) -
            logit(threshold)`` from ``calibration`` (0 without), so comparing with the
            client's threshold gives the reference model's verdicts.
        where: the node's location in the policy document (``root.steps[1]``), for
            errors found after parsing (``orchestrator policy check`` against a repository).
        head: the model's head (``heads.Head``), bound from the repository's
            ``<model>/head.json`` by ``policy.bind_heads`` (default: the legacy one-logit head).
    """

    model: str = ""
    version: Optional[int] = None
    route: str = ""
    max_length: int = 0
    on_demand: Optional[OnDemand] = None
    logit_shift: Union[float, Tuple[float, ...]] = 0.0
    where: str = ""
    head: Head = LEGACY

    def check_calibration(self) -> None:
        """Check ``logit_shift`` against ``head``: one value for a binary head, one per label
        (or one for all) for a multilabel head, none for a multiclass head.

        Raises:
            PolicyError: naming ``where``.
        """
        shift = np.atleast_1d(np.asarray(self.logit_shift, dtype=np.float64))
        if not shift.any():
            return
        k = self.head.columns
        if self.head.kind == "multiclass":
            raise PolicyError(f"{self.where}.calibration: a multiclass head ('{self.model}') has no threshold to calibrate")
        if shift.size not in (1, k):
            raise PolicyError(f"{self.where}.calibration: {shift.size} values for the {k} label(s) of '{self.model}'")

    @property
    def target(self) -> str:
        """The downstream call target (see :func:`target`)."""
        return target(self.model, self.version)


def truncate(ids: np.ndarray, max_length: int) -> np.ndarray:
    """Keep the first ``max_length - 1`` tokens and the last (special) one, as a tokenizer's
    truncation does; int64 [T] in, int64 [min(T, max_length)] out."""
    if ids.shape[0] <= max_length:
        return ids
    return np.concatenate([ids[: max_length - 1], ids[-1:]])


def _calibration(cal: Reader) -> Union[float, Tuple[float, ...]]:
    """``logit(reference_threshold) - logit(threshold)``: one number, or a tuple, one per
    label, when either key is a list (multilabel heads; a number stands for every label)."""
    ref, ref_list = cal.numbers_in("reference_threshold", 1e-6, 1 - 1e-6)
    own, own_list = cal.numbers_in("threshold", 1e-6, 1 - 1e-6)
    if len(ref) != len(own) and 1 not in (len(ref), len(own)):
        raise PolicyError(f"{cal.where}: {len(ref)} reference thresholds but {len(own)} thresholds")
    shifts = tuple(logit(ref[min(i, len(ref) - 1)]) - logit(own[min(i, len(own) - 1)]) for i in range(max(len(ref), len(own))))
    return shifts if ref_list or own_list else shifts[0]


def _parse(r: Reader, ctx: ParseContext, common: Dict[str, Any]) -> ModelNode:
    on_demand = None
    if "on_demand" in r.data:
        raw = r.data["on_demand"]
        od = Reader({} if raw is True else raw, f"{r.where}.on_demand", ("idle_timeout_s", "retry_after_s"))
        on_demand = OnDemand(
            idle_timeout_s=od.number_in("idle_timeout_s", 0.0, 86400.0, 300.0),
            retry_after_s=od.number_in("retry_after_s", 0.0, 86400.0, 30.0),
        )
    shift: Union[float, Tuple[float, ...]] = 0.0
    if "calibration" in r.data:
        shift = _calibration(Reader(r.data["calibration"], f"{r.where}.calibration", ("reference_threshold", "threshold")))
    model = r.get("model", str, required=True)
    if VERSION_SEP in model:
        raise PolicyError(f"{r.where}.model: {model!r} contains {VERSION_SEP!r}; name a version with the key 'version'")
    version = r.number_in("version", 1, 1 << 62, kind=int)
    return ModelNode(
        **common,
        model=model,
        version=version,
        route=r.get("route", str, target(model, version)),
        max_length=r.number_in("max_length", 3, 1 << 20, ctx.max_sequence_length, kind=int),
        on_demand=on_demand,
        logit_shift=shift,
        where=r.where,
    )


async def _run(engine: Engine, node: ModelNode, items: List[Item]) -> Answers:
    await engine.ensure_tokens(items, node.head.tokenizer)
    logits = await engine.classify(node.target, items, node.max_length, node.head)
    probs = node.head.probabilities(logits, np.asarray(node.logit_shift, dtype=np.float64))
    return {it.idx: Answer(p, node.route) for it, p in zip(items, probs)}


def _describe(node: ModelNode) -> str:
    extra = f" route={node.route}" if node.route != node.target else ""
    if node.on_demand:
        extra += f" on_demand(idle={node.on_demand.idle_timeout_s:g}s, retry={node.on_demand.retry_after_s:g}s)"
    shifts = np.atleast_1d(np.asarray(node.logit_shift, dtype=np.float64))
    if shifts.any():
        extra += " logit_shift=" + ",".join(f"{x:+.4f}" for x in shifts)
    return f"model {node.target}{extra} max_length={node.max_length}"


KIND = NodeKind(
    name="model",
    node_type=ModelNode,
    keys=("model", "version", "route", "max_length", "on_demand", "calibration"),
    parse=_parse,
    run=_run,
    describe=_describe,
)
