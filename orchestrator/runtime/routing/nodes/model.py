"""``model``: classify with one model (optionally one version of it) through BLS."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.heads import LEGACY, Head, logit
from orchestrator.runtime.routing.nodes.base import (
    VERSION_SEP,
    Answer,
    Answers,
    BindContext,
    Engine,
    Item,
    ModelCall,
    Node,
    NodeKind,
    ParseContext,
    split_target,
    target,
)
from orchestrator.runtime.routing.schema import REQUIRED, Int, Key, Number, Probabilities, Str, Struct, TrueOr

# target and split_target live in base (the engine uses them); kept importable here.
__all__ = ["ModelNode", "OnDemand", "KIND", "VERSION_SEP", "target", "split_target"]


@dataclass(frozen=True)
class OnDemand:
    """Load a model with ``pb_utils.load_model`` on first use, unload it when idle (the
    ``on_demand`` key; its keys' meanings: :data:`ON_DEMAND`).

    Attributes:
        idle_timeout_s: seconds without use before the router unloads a model it loaded.
        retry_after_s: seconds after a failed load before the next load is tried.
    """

    idle_timeout_s: float = 300.0
    retry_after_s: float = 30.0


#: The ``on_demand`` mapping (defaults: :class:`OnDemand`'s fields).
ON_DEMAND = Struct(
    "model.on_demand",
    [
        Key("idle_timeout_s", Number(0.0, 86400.0), "seconds without use before the router unloads a model it loaded"),
        Key("retry_after_s", Number(0.0, 86400.0), "seconds after a failed load before the next load is tried"),
    ],
    target=OnDemand,
    build=lambda values, where: OnDemand(**values),
    doc="Load the model with `pb_utils.load_model` on first use (concurrent first uses share one load), "
        "unload it when idle; needs `--model-control-mode=explicit`.",
)


def _calibration(values: Dict[str, Any], where: str) -> Union[float, Tuple[float, ...]]:
    """``logit(reference_threshold) - logit(threshold)``: one number, or a tuple, one per
    label, when either key is a list (multilabel heads; a number stands for every label)."""
    (ref, ref_list), (own, own_list) = values["reference_threshold"], values["threshold"]
    if len(ref) != len(own) and 1 not in (len(ref), len(own)):
        raise PolicyError(f"{where}: {len(ref)} reference thresholds but {len(own)} thresholds")
    shifts = tuple(logit(ref[min(i, len(ref) - 1)]) - logit(own[min(i, len(own) - 1)]) for i in range(max(len(ref), len(own))))
    return shifts if ref_list or own_list else shifts[0]


_THRESHOLD = Probabilities(1e-6, 1 - 1e-6)

#: The ``calibration`` mapping; read as the logit shift.
CALIBRATION = Struct(
    "model.calibration",
    [
        Key("reference_threshold", _THRESHOLD, "the reference model's operating threshold (one, or one per label)",
            required=True),
        Key("threshold", _THRESHOLD, "this variant's threshold that reproduces the reference's verdicts there, "
                                     "e.g. from `orchestrator parity` (one, or one per label)", required=True),
    ],
    build=_calibration,
    doc="A variant's own threshold: its logits are shifted by `logit(reference_threshold) - logit(threshold)`, "
        "so a client sending the reference threshold gets this variant's verdicts at `threshold`. Binary and "
        "multilabel heads only.",
)


@dataclass(frozen=True)
class ModelNode(Node):
    """Classify every text with one model (its keys: :data:`KIND` ``.keys``, docs/reference/policy.md).

    Attributes:
        model: the model's name in the repository.
        version: the model version to call, or None (the highest ready version).
        route: the ``ROUTE`` value of its answers.
        max_length: tokens per input row, special tokens included.
        on_demand: on-demand loading settings, or None (always loaded).
        logit_shift: added to the model's logits: ``logit(reference_threshold) -
            logit(threshold)`` from ``calibration`` (0 without), so comparing with the
            client's threshold gives the reference model's verdicts.
        head: the model's head (``heads.Head``): in the plan, the repository's
            ``<model>/head.json`` (``policy.bind_heads``); the legacy one-logit head before.
    """

    model: str = REQUIRED
    version: Optional[int] = None
    route: str = REQUIRED
    max_length: int = REQUIRED
    on_demand: Optional[OnDemand] = None
    logit_shift: Union[float, Tuple[float, ...]] = 0.0
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
        """The downstream call target (:func:`~orchestrator.runtime.routing.nodes.base.target`'s
        rule, spelt out: the property is read on every call)."""
        return self.model if self.version is None else f"{self.model}{VERSION_SEP}{self.version}"


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> ModelNode:
    model, version = values["model"], values["version"]
    if VERSION_SEP in model:
        raise PolicyError(f"{common['where']}.model: {model!r} contains {VERSION_SEP!r}; name a version with the key 'version'")
    return ModelNode(
        **common,
        model=model,
        version=version,
        route=values["route"] or target(model, version),
        max_length=values["max_length"] or ctx.max_sequence_length,
        on_demand=values["on_demand"],
        logit_shift=values["calibration"] if values["calibration"] is not None else 0.0,
    )


def _bind(node: ModelNode, ctx: BindContext) -> ModelNode:
    node = replace(node, head=ctx.heads.get(node.model, node.head))
    if node.max_length > node.head.max_length:
        raise PolicyError(
            f"{node.where}.max_length: {node.max_length} tokens, over model '{node.model}''s maximum of "
            f"{node.head.max_length} (its head.json max_length); lower max_sequence_length or the node's max_length"
        )
    node.check_calibration()
    return node


async def _run(engine: Engine, node: ModelNode, items: List[Item]) -> Answers:
    await engine.calls.ensure_tokens(items, node.head.tokenizer)
    return answers_of(node, items, await engine.calls.classify(node.target, items, node.max_length, node.head))


def answers_of(node: ModelNode, items: Sequence[Item], logits: NDArray[Any]) -> Answers:
    """``node``'s answers of ``items`` from its model's ``logits`` (float32 [len(items),
    num_logits]): its head's probabilities with its ``logit_shift``, route ``node.route``.
    Also the compiled line's (``execution.line``), so both paths answer alike."""
    shift = node.logit_shift
    probs = node.head.probabilities(logits, shift if isinstance(shift, float) else np.asarray(shift, dtype=np.float64))
    route = node.route
    return {it.idx: Answer(p, route) for it, p in zip(items, probs)}


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
    doc="Classify with one model, or one version of it, through BLS (loaded on demand, calibrated).",
    keys=(
        Key("model", Str(), "the model's name in the repository (no `@`: pin a version with `version`)"),
        Key("version", Int(1, 1 << 62), "call this version of the model (served next to others with "
            "`version_policy: { specific: { versions: [1, 2] } }`); absent: Triton calls the highest ready version"),
        Key("route", Str(), "the `ROUTE` value of its answers",
            computed="the model's name, `<model>@<version>` with `version`"),
        Key("max_length", Int(3, 1 << 20), "tokens per input row, special tokens included; longer inputs are "
            "truncated as the tokenizer does", computed="the policy's `max_sequence_length`"),
        Key("on_demand", TrueOr(ON_DEMAND), "load the model on first use and unload it when idle"),
        Key("calibration", CALIBRATION, "this variant's own threshold (see `model.calibration`)"),
    ),
    build=_build,
    run=_run,
    describe=_describe,
    bind=_bind,
    tokens=lambda node: (node.head.tokenizer,),
    calls=lambda node: (ModelCall(node.model, node.version, node.where, node.on_demand),),
)
