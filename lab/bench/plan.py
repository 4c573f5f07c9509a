"""What a benchmark run measures: the variant models, the plan of perf_analyzer levels and
their window settings, and the benchmark's error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.modeling.long_texts import LONG_BOUNDS
from orchestrator.tooling.paths import PROJECT_ROOT

ROOT = PROJECT_ROOT
REPO = ROOT / "model_repository"
DEFAULT_TOOL_DIR = ROOT / ".cache" / "tools" / "perf_analyzer"

#: ``router_single``'s routing tree (format: ``orchestrator/runtime/routing/policy.py``), put in place of the
#: ``root`` of the default router's policy (its other settings kept): empty texts answered
#: without a model, every other text to ``classifier`` (the ensemble's model; texts over 128
#: tokens chunked as the default policy does). No ``classifier_fast``, no cascade.
SINGLE_CLASSIFIER_ROOT: dict = {
    "kind": "sequence",
    "name": "main",
    "steps": [
        {"kind": "switch", "name": "guard", "cases": [
            {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False}},
        ]},
        {"kind": "chunk", "name": "chunk_accurate", "window": 128, "stride": 96, "aggregation": "length_weighted_mean",
         "node": {"kind": "model", "name": "accurate", "model": "classifier"}},
    ],
}

#: Policy option ``inline`` turned off: the tokenizer model through BLS.
NO_INLINE: dict = {}

#: The benchmark-only models added to the copy of the repository. ``base``: the model
#: directory copied; ``parameters``: config ``parameters`` whose ``string_value`` is replaced
#: (the base config must have them); ``add_parameters``: config parameters set whether or not
#: the base has them; ``replace_models``: ``model_name`` values replaced in
#: an ensemble's steps; ``drop_outputs``: outputs removed from the config; ``source``: instead of ``base``, a model directory kept outside
#: the repository (relative to the project root), copied unchanged; ``policy_root``: a routing-policy tree that replaces the ``root``
#: of the base's policy file (the one the config's ``policy`` parameter names);
#: ``policy_extra``: top-level policy keys set as well (e.g. ``inline``).
VARIANTS: Dict[str, dict] = {
    # the seeds' tokenizer: every text padded to 512 tokens
    "tokenizer_pad512": {"base": "tokenizer", "parameters": {"padding": "max_length", "max_length": "512"}},
    # the seeds' ensemble: tokenizer_pad512 -> classifier -> postprocess
    "ensemble_pad512": {"base": "ensemble", "replace_models": {"tokenizer": "tokenizer_pad512"}},
    # the single-classifier policy: the router with the ensemble's compute (routing overhead)
    "router_single": {"base": "router", "policy_root": SINGLE_CLASSIFIER_ROOT},
    # the same with the router's own metrics off (config parameter ``metrics: off``): what the switch saves
    "router_single_no_metrics": {"base": "router", "policy_root": SINGLE_CLASSIFIER_ROOT, "add_parameters": {"metrics": "off"}},
    # the same, ROUTE left out of its config.pbtxt (the router then never builds it): what that output costs
    "router_single_no_route": {"base": "router", "policy_root": SINGLE_CLASSIFIER_ROOT, "drop_outputs": ["ROUTE"]},
    # the same two policies calling the tokenizer and postprocess models through BLS
    # (the shipped policy tokenizes and post-processes in the router's process: ``inline``)
    "router_single_bls": {"base": "router", "policy_root": SINGLE_CLASSIFIER_ROOT, "policy_extra": {"inline": NO_INLINE}},
    "router_bls": {"base": "router", "policy_extra": {"inline": NO_INLINE}},
    # the platform's floor: the smallest hand-written BLS model (tokenize in-process, one
    # exec of classifier, sigmoid, respond), answering as router_single for short texts
    "hand_bls": {"source": "lab/bench/hand_bls"},
}

#: The models compared at every concurrency, in plot/table order.
#: ``hand_bls``: the platform's floor beside ``router_single`` (``python -m lab.bench.instances
#: --compare floor`` judges the pair by intervals over rounds).
GRID_MODELS = ("ensemble_pad512", "ensemble", "router_single", "router_single_bls", "router", "router_bls", "hand_bls")
CONCURRENCIES = (1, 4, 16)
#: Rounds per grid concurrency in a full run (default 1; ``--quick``: 1 everywhere): every
#: model once per round, rounds one after another, so each round compares the models under
#: the same background load. c=1 gets five: its latencies are a few ms, and on 2 shared
#: cores the ensemble's p50 moved from 2.5 to 4.0 ms between rounds of one run.
GRID_ROUNDS = {1: 5}
#: Length sweep and batch sweep: models, and the concurrency they run at.
LENGTH_MODELS = ("ensemble", "router")
BATCH_MODELS = ("router",)
BATCH_SIZES = (1, 4, 16)
SWEEP_CONCURRENCY = 4
THRESHOLD = 0.5
#: Token-length bounds (inclusive, special tokens counted) of the length sweep's sets.
LENGTH_BOUNDS = {"short": (1, 16), "medium": (48, 128), "long": LONG_BOUNDS}
MAX_SEQUENCE_LENGTH = 128  # the classifiers' limit (tokenizer model_max_length)


class BenchError(ToolingError):
    """The benchmark cannot proceed; the message says what failed and how to fix it."""



@dataclass(frozen=True)
class PASettings:
    """perf_analyzer measurement settings (time windows).

    ``measurement_interval_ms``: window length (``-p``, ms). ``stability_percentage`` and
    ``max_trials``: perf_analyzer's own stability rule (the last 3 windows' throughput and
    p50 latency within ``stability_percentage``% of each other, at most ``max_trials``
    windows). ``fallback``: when that fails (exit status 2), measure once more with exactly
    3 windows and no stability rule (``-s 1000 -r 3``) and record ``stable: false``.
    ``check_stability`` false: use ``-s 1000 -r 3`` from the start (``stable: null``).
    ``latencies_per_window``, ``max_interval_ms``: longer windows for slow levels
    (:meth:`interval_for`).
    """

    measurement_interval_ms: int = 3000
    stability_percentage: float = 25.0
    max_trials: int = 5
    check_stability: bool = True
    fallback: bool = True
    protocol: str = "grpc"
    latencies_per_window: int = 10
    max_interval_ms: int = 6000

    def interval_for(self, latency_ms: Optional[float]) -> int:
        """Window length (ms) for a level whose request latency is about ``latency_ms``:
        at least ``latencies_per_window`` latencies (a slow model still completes enough
        requests per window), within [``measurement_interval_ms``, ``max_interval_ms``]."""
        want = self.latencies_per_window * (latency_ms or 0.0)
        return int(min(max(self.measurement_interval_ms, want), max(self.max_interval_ms, self.measurement_interval_ms)))


FULL_SETTINGS = PASettings()
QUICK_SETTINGS = PASettings(measurement_interval_ms=500, check_stability=False, fallback=False,
                            latencies_per_window=4, max_interval_ms=1500)
NO_STABILITY = ("1000", "3")


@dataclass(frozen=True)
class Spec:
    """One perf_analyzer measurement: ``section`` (grid, length, batch), ``model``,
    ``dataset`` (a key of the run's input sets), ``concurrency``, client ``batch_size``,
    ``round`` (0-based, for levels measured in several rounds: :data:`GRID_ROUNDS`)."""

    section: str
    model: str
    dataset: str
    concurrency: int
    batch_size: int = 1
    round: int = 0


def bench_plan(quick: bool = False) -> List[Spec]:
    """The measurements of one run, in order.

    Grid: :data:`GRID_MODELS` x :data:`CONCURRENCIES` on the held-out texts, models
    interleaved within each concurrency so drifting background load hits them alike, in
    :data:`GRID_ROUNDS` rounds (merged afterwards by :func:`combine_rounds`).
    Length sweep: :data:`LENGTH_MODELS` on short/medium/long at :data:`SWEEP_CONCURRENCY`.
    Batch sweep: :data:`BATCH_MODELS` at client batch :data:`BATCH_SIZES`. ``quick`` runs
    the same plan in one round (and shorter windows, see :data:`QUICK_SETTINGS`).
    """
    rounds = {} if quick else GRID_ROUNDS
    plan = [Spec("grid", m, "held_out", c, 1, r) for c in CONCURRENCIES for r in range(rounds.get(c, 1))
            for m in GRID_MODELS]
    plan += [Spec("length", m, d, SWEEP_CONCURRENCY) for d in ("short", "medium", "long") for m in LENGTH_MODELS]
    plan += [Spec("batch", m, "held_out", SWEEP_CONCURRENCY, b) for m in BATCH_MODELS for b in BATCH_SIZES]
    return plan

