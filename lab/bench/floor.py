"""The router against its physics (``python -m lab.bench.instances --compare floor``): the
platform's floor, the cascade's cost model, and load and repair time, in one run of one
embedded server.

1. **The floor.** ``hand_bls`` (``lab/bench/hand_bls``: the smallest hand-written BLS model,
   python_backend's BLS example's shape: tokenize in-process, one ``exec`` of ``classifier``,
   sigmoid, respond) beside ``router_single`` (the router with the ensemble's compute),
   the shipped ``router`` and the ensemble, closed loop at c=1 and c=16, rounds one after
   another with the model order rotated. Goals, judged by the distribution-free interval of
   the median per-round ratio (:func:`lab.bench.instances.median_interval`):
   ``router_single`` p50 at c=1 at most :data:`FLOOR_P50_GOAL` x ``hand_bls``'s, its
   throughput at c=16 at least :data:`FLOOR_THROUGHPUT_GOAL` x. Beside the goals, the server's
   own split of a request's time at c=1 (:func:`server_split`: Triton's statistics before and
   after each measurement of ``router_single`` and ``hand_bls``): the ``execute`` less the
   classifier's time, so the router's own time is read on the server, not only on the mock.
2. **The cascade's cost model.** In every round, at c=16, ``classifier_fast`` and
   ``classifier`` on the held-out texts tokenized, one text a request at its own length
   (:func:`classifier_input_json`, :data:`PAD_GROUP`): ``c_fast`` and ``c_accurate``, seconds per text
   (1 / throughput). ``e``: the shipped router's escalation rate on the held-out texts (its
   ``ROUTE`` values: :func:`escalation`). The router's own cost has a part per text and a
   part per escalated text (its second BLS call, tensors and answers) with a curvature (one
   second call per execute carries all its escalated texts), fitted as ``orchestrator tune
   --url --overhead-shares 0.1 0.4 0.7`` fits them: three copies of the shipped router
   (:data:`ESCALATION_VARIANTS`, the same policy and margin) on three lists of the held-out
   texts in which the shares :data:`ESCALATION_SHARES` of the texts are ones the router
   escalates (:func:`share_lists`), 1/T(s) = c_fast + o_first + s * (c_accurate + o_escalated)
   + s**2 * q_escalated through the three. Predicted throughput of the shipped router = 1 /
   (c_fast + o_first + e * (c_accurate + o_escalated) + e**2 * q_escalated); measured /
   predicted per round (:func:`stage_cost_model`), goal at least :data:`COST_MODEL_GOAL`.
   Beside it, reported, not judged: the line through the lowest and highest share alone (the
   model before the curvature), and the model before the parts (:func:`cost_model`): one
   constant ``overhead`` = 1/T(router_single) - c_accurate, predicted 1 / (c_fast + e *
   c_accurate + overhead). :func:`summarize` recomputes a run's summaries from its
   ``floor.json`` (``--summarize``), measuring nothing.
3. **Load time** (:func:`load_times`, ``lab/load_time.py``'s rounds on this checkout): the
   router's and the tokenizer's load-to-ready time over the postprocess model's (the floor
   a Python model costs), medians of several fresh starts, goal at most :data:`LOAD_GOAL` x.
4. **Repair**: the soak's router-reload downtime (``lab.soak.report.router_repair``), read
   from a soak report (``--soak-report``), goal at most ``ROUTER_REPAIR_S`` seconds.

Units: throughput in inferences (texts) per second, latency in milliseconds, costs in
milliseconds per text in the report (seconds in the arithmetic).
"""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from lab.bench.measurement import failed_note, max_load
from lab.bench.plan import REPO, Spec
from orchestrator.tooling.tune_throughput import OVERHEAD_SHARES, fit_overhead

#: ``router_single`` p50 at c=1 over ``hand_bls``'s: at most.
FLOOR_P50_GOAL = 1.05
#: ``router_single`` throughput at c=16 over ``hand_bls``'s: at least.
FLOOR_THROUGHPUT_GOAL = 0.95
#: The shipped router's measured throughput at c=16 over its cost model's prediction: at least.
COST_MODEL_GOAL = 0.9
#: Router and tokenizer load-to-ready over the postprocess model's: at most.
LOAD_GOAL = 1.5
#: ``router_single_no_route``: ``router_single`` with ``ROUTE`` left out of its config (never built): the output's
#: cost, since ``hand_bls`` answers without it; the goals judge ``router_single`` as shipped.
FLOOR_MODELS = ("ensemble", "router", "router_single", "hand_bls", "router_single_no_route")
CLASSIFIERS = ("classifier_fast", "classifier")
FLOOR_CONCURRENCIES = (1, 16)
COST_CONCURRENCY = 16
FLOOR_ROUNDS = 8
#: The classifier inputs are padded in groups of this many consecutive texts (1: each text
#: at its own length, the tokenized held-out inputs as they are). Padding in groups of 16, as
#: the router pads one ``exec``'s batch, was tried: on 2 shared cores ``classifier`` at c=16
#: did 106 texts/s padded in groups of 16 against 245 unpadded (the held-out texts are
#: 27.5 tokens on average, some 128), so the cost model charges padding to the router's
#: overhead instead of to the classifiers.
PAD_GROUP = 1
FAST, ACCURATE = CLASSIFIERS
#: Three copies of the shipped router (same policy, same margin), measured on the text lists of
#: :func:`share_lists` (datasets ``share_low``, ``share_mid`` and ``share_high``): the per-stage
#: cost model separates the router's own cost per text from its extra cost per escalated text
#: and that cost's curvature with them (:func:`stage_cost_model`). Copies, so each has its own
#: row per round; variants of :func:`lab.bench.variants.make_bench_repository`.
LOW_SHARE, MID_SHARE, HIGH_SHARE = "router_share_low", "router_share_mid", "router_share_high"
ESCALATION_VARIANTS: Dict[str, dict] = {LOW_SHARE: {"base": "router"}, MID_SHARE: {"base": "router"},
                                        HIGH_SHARE: {"base": "router"}}
#: The escalated shares of the three lists: ``orchestrator tune --url``'s two
#: (``tune_throughput.OVERHEAD_SHARES``) and one between them, around the shipped router's
#: rate on the held-out texts (about a third), where the extremes (no text, every text) would
#: fit the router's batches at shares it never serves. The third share fits the curvature
#: (``tune --url --overhead-shares 0.1 0.4 0.7``), which the rounds here make more than noise.
ESCALATION_SHARES: Tuple[float, ...] = (OVERHEAD_SHARES[0], 0.4, OVERHEAD_SHARES[-1])
SHARE_DATASETS = {LOW_SHARE: "share_low", MID_SHARE: "share_mid", HIGH_SHARE: "share_high"}


def make_floor_repository(dest: Path, repo: Path = REPO, also: Sequence[str] = ()) -> Path:
    """The benchmark repository with ``router_single``, ``router_single_no_route`` and ``hand_bls`` (``VARIANTS``) and the
    three routers of :data:`ESCALATION_VARIANTS`; ``also``: more ``VARIANTS`` by name."""
    from lab.bench.plan import VARIANTS
    from lab.bench.variants import make_bench_repository

    names = ("router_single", "hand_bls", "router_single_no_route", *also)
    return make_bench_repository(dest, repo, variants={**{k: VARIANTS[k] for k in names}, **ESCALATION_VARIANTS})


def floor_plan(rounds: int, models: Sequence[str] = FLOOR_MODELS,
               concurrencies: Sequence[int] = FLOOR_CONCURRENCIES) -> List[Spec]:
    """Per round: every model at every concurrency (model order rotated by one each round),
    then the two classifiers at :data:`COST_CONCURRENCY` (order alternating) on the
    tokenized texts (dataset ``tokens``), then the three routers of :data:`ESCALATION_VARIANTS`
    at :data:`COST_CONCURRENCY` (order rotated by one each round), each on its list
    (:data:`SHARE_DATASETS`)."""
    out: List[Spec] = []
    for r in range(rounds):
        order = list(models[r % len(models):]) + list(models[:r % len(models)])
        for c in concurrencies:
            out += [Spec("floor", m, "held_out", c, 1, r) for m in order]
        out += [Spec("cost", m, "tokens", COST_CONCURRENCY, 1, r) for m in (CLASSIFIERS if r % 2 == 0 else CLASSIFIERS[::-1])]
        routers = list(ESCALATION_VARIANTS)
        routers = routers[r % len(routers):] + routers[:r % len(routers)]  # rotated: none always first
        out += [Spec("cost", m, SHARE_DATASETS[m], COST_CONCURRENCY, 1, r) for m in routers]
    return out


def classifier_input_json(ids: Sequence[Sequence[int]], pad_id: int = 0, group: int = PAD_GROUP) -> dict:
    """perf_analyzer ``--input-data`` for a classifier: one step per text (``input_ids`` and
    ``attention_mask``, INT64), each text padded with ``pad_id`` to the longest of its group
    of ``group`` consecutive texts, as the router pads the batch of one ``exec`` (the
    classifier's dynamic batcher can then batch a group's requests, which have one shape).
    Raises ValueError on no texts or an empty one."""
    if not ids or any(len(x) == 0 for x in ids):
        raise ValueError("classifier inputs need at least one text, none empty")
    steps = []
    for start in range(0, len(ids), group):
        chunk = ids[start:start + group]
        width = max(len(x) for x in chunk)
        for x in chunk:
            pad = width - len(x)
            steps.append({"input_ids": {"content": [int(v) for v in x] + [pad_id] * pad, "shape": [width]},
                          "attention_mask": {"content": [1] * len(x) + [0] * pad, "shape": [width]}})
    return {"data": steps}


def tokenize_held_out(texts: Sequence[str], repo: Path = REPO) -> Tuple[List[List[int]], int]:
    """Token ids of ``texts`` as the classifier sees them (the repository's tokenizer,
    truncated to ``classifier/head.json``'s ``max_length``; empty texts left out: the router
    answers them without a model), and the pad id."""
    from tokenizers import Tokenizer

    head = json.loads((repo / "classifier" / "head.json").read_text())
    tok = Tokenizer.from_file(str(repo / "tokenizer" / "1" / "tokenizer.json"))
    tok.enable_truncation(int(head["max_length"]))
    ids = [e.ids for t, e in zip(texts, tok.encode_batch([t for t in texts])) if t.strip()]
    return ids, int(head["pad_token_id"])


def escalation(routes: Sequence[str]) -> Dict[str, Any]:
    """The shipped router's escalation rate from its ``ROUTE`` values (one per text):
    ``texts``, ``empty`` (answered without a model), ``fast`` (answered by
    ``classifier_fast``), ``accurate`` (answered by ``classifier``: escalated), ``other``,
    and ``e`` = accurate / (fast + accurate), None without any."""
    from lab.soak.workload import route_model

    count = {"texts": len(routes), "empty": 0, "fast": 0, "accurate": 0, "other": 0}
    for r in routes:
        model = route_model(r)
        key = {FAST: "fast", ACCURATE: "accurate", "empty": "empty"}.get(model, "other")
        count[key] += 1
    n = count["fast"] + count["accurate"]
    return {**count, "e": round(count["accurate"] / n, 4) if n else None}


def cost_model(t_fast: float, t_accurate: float, t_single: float, t_router: float, e: float) -> Dict[str, float]:
    """The cascade's cost model from throughputs (texts/s) at one concurrency: ``c_fast`` =
    1/t_fast and ``c_accurate`` = 1/t_accurate (s/text), ``overhead`` = 1/t_single -
    c_accurate (the router's own per-text cost: ``router_single`` is the router calling
    ``classifier`` for every text), ``predicted`` = 1 / (c_fast + e * c_accurate +
    overhead) (texts/s), ``measured`` = t_router, ``ratio`` = measured / predicted.
    Raises ValueError on a throughput that is not positive or ``e`` outside [0, 1]."""
    if min(t_fast, t_accurate, t_single, t_router) <= 0:
        raise ValueError("throughputs must be positive")
    if not 0.0 <= e <= 1.0:
        raise ValueError(f"escalation rate {e} outside [0, 1]")
    c_fast, c_accurate = 1.0 / t_fast, 1.0 / t_accurate
    overhead = 1.0 / t_single - c_accurate
    cost = c_fast + e * c_accurate + overhead
    predicted = 1.0 / cost if cost > 0 else None  # None: no prediction (a negative overhead larger than the rest)
    return {"c_fast": c_fast, "c_accurate": c_accurate, "overhead": overhead, "predicted": predicted,
            "measured": t_router, "ratio": None if predicted is None else t_router / predicted}


def stage_cost_model(t_fast: float, t_accurate: float, t_shares: Sequence[float], t_router: float,
                     e: float, shares: Sequence[float] = ESCALATION_SHARES) -> Dict[str, Any]:
    """The cascade's cost model with the router's cost per stage, from throughputs (texts/s)
    at one concurrency: ``c_fast`` = 1/t_fast, ``c_accurate`` = 1/t_accurate (s/text); the
    router on lists escalating ``shares`` measured ``t_shares`` (one each), fitted as ``tune
    --url`` fits it (``tune_throughput.fit_overhead``): 1/T(s) = c_fast + o_first + s *
    (c_accurate + o_escalated) + s**2 * q_escalated, least squares (``q_escalated`` with at
    least three distinct shares above 0, else 0: the line through two). ``predicted`` = 1 /
    (c_fast + o_first + e * (c_accurate + o_escalated) + e**2 * q_escalated) (texts/s, None
    where that cost is not positive), ``measured`` = t_router, ``ratio`` = measured /
    predicted.
    Raises ValueError on a throughput that is not positive, ``e`` outside [0, 1], not one
    throughput per share, or fewer than two distinct shares within [0, 1]."""
    if min(t_fast, t_accurate, t_router, *t_shares) <= 0:
        raise ValueError("throughputs must be positive")
    if not 0.0 <= e <= 1.0:
        raise ValueError(f"escalation rate {e} outside [0, 1]")
    if len(t_shares) != len(shares) or len(set(shares)) < 2 or not all(0.0 <= s <= 1.0 for s in shares):
        raise ValueError(f"shares {tuple(shares)} for {len(t_shares)} throughputs: need one each, two or more distinct in [0, 1]")
    c_fast, c_accurate = 1.0 / t_fast, 1.0 / t_accurate
    (o_first, o_escalated), (_, q_escalated) = fit_overhead([[1.0, s] for s in shares], t_shares, [c_fast, c_accurate], [0, 1])
    cost = c_fast + o_first + e * (c_accurate + o_escalated) + e * e * q_escalated
    predicted = 1.0 / cost if cost > 0 else None
    return {"c_fast": c_fast, "c_accurate": c_accurate, "o_first": o_first, "o_escalated": o_escalated,
            "q_escalated": q_escalated, "predicted": predicted, "measured": t_router,
            "ratio": None if predicted is None else t_router / predicted}


def _by_round(measurements: Sequence[Mapping[str, Any]], model: str, concurrency: int) -> Dict[int, Mapping[str, Any]]:
    return {int(m["round"]): m for m in measurements
            if not m.get("error") and m["model"] == model and int(m["concurrency"]) == concurrency}


def pair_ratios(measurements: Sequence[Mapping[str, Any]], model: str, base: str, concurrency: int,
                key: str) -> List[float]:
    """``model``'s ``key`` (``throughput`` or ``p50_ms``) over ``base``'s in each round both
    were measured at ``concurrency`` (failures left out), in round order."""
    a, b = _by_round(measurements, model, concurrency), _by_round(measurements, base, concurrency)
    return [a[r][key] / b[r][key] for r in sorted(set(a) & set(b)) if b[r][key]]


def round_cost_models(measurements: Sequence[Mapping[str, Any]], e: float,
                      concurrency: int = COST_CONCURRENCY) -> List[Dict[str, Any]]:
    """:func:`cost_model` of each round in which the classifiers, ``router_single`` and
    ``router`` were all measured at ``concurrency``, with its ``round``."""
    tables = {m: _by_round(measurements, m, concurrency) for m in (FAST, ACCURATE, "router_single", "router")}
    rounds = sorted(set.intersection(*(set(t) for t in tables.values())))
    return [{"round": r, **cost_model(tables[FAST][r]["throughput"], tables[ACCURATE][r]["throughput"],
                                      tables["router_single"][r]["throughput"], tables["router"][r]["throughput"], e)}
            for r in rounds]


def round_stage_cost_models(measurements: Sequence[Mapping[str, Any]], e: float, shares: Sequence[float],
                            concurrency: int = COST_CONCURRENCY, ends: bool = False) -> List[Dict[str, Any]]:
    """:func:`stage_cost_model` of each round in which the classifiers, the routers of
    :data:`ESCALATION_VARIANTS` (at the escalated ``shares``, in that order) and ``router`` were
    all measured at ``concurrency``, with its ``round``; ``ends``: through the first and last
    of them only (the line, without the curvature)."""
    share_models = list(ESCALATION_VARIANTS)
    if len(shares) != len(share_models):
        raise ValueError(f"shares {tuple(shares)}: one per router of ESCALATION_VARIANTS ({len(share_models)})")
    if ends:
        share_models, shares = [share_models[0], share_models[-1]], [shares[0], shares[-1]]
    tables = {m: _by_round(measurements, m, concurrency) for m in (FAST, ACCURATE, *share_models, "router")}
    rounds = sorted(set.intersection(*(set(t) for t in tables.values())))
    return [{"round": r, **stage_cost_model(tables[FAST][r]["throughput"], tables[ACCURATE][r]["throughput"],
                                            [tables[m][r]["throughput"] for m in share_models],
                                            tables["router"][r]["throughput"], e, shares)}
            for r in rounds]


def share_lists(routes: Sequence[str], shares: Sequence[float] = ESCALATION_SHARES) -> List[Dict[str, Any]]:
    """Per escalated share, a list of as many text indices as ``routes`` (the shipped router's
    ``ROUTE`` of each held-out text): that share of them texts it escalates (answered by
    ``classifier``), spread evenly, the rest texts ``classifier_fast`` answers, each group
    cycled (``tune_throughput.mixture``, as ``tune --url`` builds its lists); ``{"share" (as
    built), "texts"}``. Raises ValueError when a group a share needs is empty."""
    from lab.soak.workload import route_model
    from orchestrator.tooling.tune_throughput import mixture

    fast = [i for i, r in enumerate(routes) if route_model(r) == FAST]
    escalated = [i for i, r in enumerate(routes) if route_model(r) == ACCURATE]
    lists = []
    for share in shares:
        idx = mixture(fast, escalated, share, len(routes))
        lists.append({"share": round(sum(route_model(routes[i]) == ACCURATE for i in idx) / len(idx), 4), "texts": idx})
    return lists


def judge_at_least(interval: Optional[Sequence[float]], goal: float) -> str:
    """A goal "ratio at least ``goal``" judged by a median's ``(median, low, high)``: ``met``
    (the low end at or above it), ``not met`` (the high end below it), else ``not
    decided`` (also without an interval)."""
    if interval is None or not all(v is not None and np.isfinite(v) for v in interval[1:3]):
        return "not decided"
    if interval[1] >= goal:
        return "met"
    return "not met" if interval[2] < goal else "not decided"


@functools.lru_cache(maxsize=None)
def _order_interval(n: int, confidence: float = 0.95) -> Optional[Tuple[int, int]]:
    """1-based ranks ``(k, n - k + 1)`` of the distribution-free interval of a median of
    ``n`` values (the narrowest symmetric one with coverage >= ``confidence``); None when
    even the extremes do not reach it."""
    from scipy import stats

    ks = np.arange(1, n // 2 + 1)
    covered = ks[1.0 - 2.0 * stats.binom.cdf(ks - 1, n, 0.5) >= confidence]  # one vectorized call: cdf grows with k
    if covered.size == 0:
        return None
    k = int(covered[-1])
    return k, n - k + 1


def rounds_to_decide(values: Sequence[float], goal: float, at_most: bool, limit: int = 400,
                     confidence: float = 0.95) -> Optional[int]:
    """An estimate of how many rounds would decide a goal that ``values`` (this run's per-round
    ratios) leave undecided: the smallest ``n`` over ``len(values)`` (these rounds did not
    decide it) and at least 6 whose distribution-free interval of the
    median, its ends read as this run's quantiles at ranks ``k/(n+1)`` and
    ``(n-k+1)/(n+1)``, lies on one side of ``goal``; None when none up to ``limit`` does
    (the median too close to the goal for this spread), or with fewer than 2 values.
    ``at_most`` only names the goal's direction; either side decides it."""
    del at_most  # met or not met: both are decisions
    return first_deciding_rounds(values, lambda lo, hi: hi < goal or lo > goal, limit, confidence)


def projected_intervals(values: Sequence[float], limit: int = 400,
                        confidence: float = 0.95) -> Iterator[Tuple[int, float, float]]:
    """``(n, low, high)`` for ``n`` from past ``len(values)`` (and at least 6) to ``limit``:
    the distribution-free interval of the median of ``n`` rounds, its ends read as the
    quantiles of ``values`` (this run's per-round ratios) at ranks ``k/(n+1)`` and
    ``(n-k+1)/(n+1)``: the interval ``n`` rounds would give at this run's spread. Nothing
    for fewer than 2 values."""
    if len(values) < 2:
        return
    x = np.asarray(values, dtype=float)
    for n in range(max(6, len(x) + 1), limit + 1):
        ranks = _order_interval(n, confidence)
        if ranks is None:
            continue
        lo, hi = np.quantile(x, [ranks[0] / (n + 1), ranks[1] / (n + 1)])
        yield n, float(lo), float(hi)


def first_deciding_rounds(values: Sequence[float], decides: Callable[[float, float], bool], limit: int = 400,
                          confidence: float = 0.95) -> Optional[int]:
    """The first ``n`` of :func:`projected_intervals` whose ``(low, high)`` ``decides``; None
    when none up to ``limit`` does, or with fewer than 2 values."""
    return next((n for n, lo, hi in projected_intervals(values, limit, confidence) if decides(lo, hi)), None)


def decide(values: Sequence[float], goal: float, at_most: bool) -> Dict[str, Any]:
    """``{"n", "median", "low", "high", "verdict", "rounds_needed"}`` for per-round ratios
    ``values`` against ``goal`` (``at_most``: ratio <= goal, else ratio >= goal);
    ``rounds_needed`` only when not decided (:func:`rounds_to_decide`)."""
    from lab.bench.instances import judge, median_interval, rounded_interval

    iv = median_interval(values)
    verdict = judge(iv, goal) if at_most else judge_at_least(iv, goal)
    clean = rounded_interval(iv)
    return {"n": len(values), "median": clean[0], "low": clean[1], "high": clean[2], "verdict": verdict,
            "goal": goal, "at_most": at_most,
            "rounds_needed": rounds_to_decide(values, goal, at_most) if verdict == "not decided" else None}


def floor_goals(measurements: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The two floor goals (module docstring) with their per-round ratios."""
    p50 = pair_ratios(measurements, "router_single", "hand_bls", 1, "p50_ms")
    thr = pair_ratios(measurements, "router_single", "hand_bls", 16, "throughput")
    return {"p50_c1": {**decide(p50, FLOOR_P50_GOAL, True), "per_round": [round(v, 3) for v in p50]},
            "throughput_c16": {**decide(thr, FLOOR_THROUGHPUT_GOAL, False), "per_round": [round(v, 3) for v in thr]}}


def cost_summary(measurements: Sequence[Mapping[str, Any]], e: Optional[float],
                 shares: Sequence[float] = ESCALATION_SHARES) -> Dict[str, Any]:
    """The cost model with the router's cost per stage (:func:`round_stage_cost_models` at the
    lists' escalated ``shares``: its
    per-round figures, their medians (ms/text) and the goal's decision); under ``line``, the
    same through the lowest and highest share only (the model before the curvature, not
    judged); under ``one_constant``, the model before the parts (:func:`round_cost_models`,
    the same); and the router / ensemble throughput at c=16 (median of per-round ratios)."""
    out: Dict[str, Any] = {"e": e, "shares": list(shares), "rounds": [], "median": None, "goal": None,
                           "line": {"rounds": [], "median": None, "goal": None},
                           "one_constant": {"rounds": [], "median": None, "goal": None}}
    vs_ensemble = pair_ratios(measurements, "router", "ensemble", COST_CONCURRENCY, "throughput")
    out["router_vs_ensemble_c16"] = round(statistics.median(vs_ensemble), 3) if vs_ensemble else None
    if e is None:
        return out
    stage = ("c_fast", "c_accurate", "o_first", "o_escalated", "q_escalated")
    for into, rounds, parts in ((out, round_stage_cost_models(measurements, e, shares), stage),
                                (out["line"], round_stage_cost_models(measurements, e, shares, ends=True), stage),
                                (out["one_constant"], round_cost_models(measurements, e), ("c_fast", "c_accurate", "overhead"))):
        rounds = [r for r in rounds if r["predicted"] is not None]
        into["rounds"] = [{k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()} for r in rounds]
        if rounds:
            med = {k: statistics.median(r[k] for r in rounds) for k in (*parts, "predicted", "measured")}
            into["median"] = {**{f"{k}_ms": round(1000 * med[k], 3) for k in parts},
                              "predicted": round(med["predicted"], 1), "measured": round(med["measured"], 1)}
            into["goal"] = {**decide([r["ratio"] for r in rounds], COST_MODEL_GOAL, False),
                            "per_round": [round(r["ratio"], 3) for r in rounds]}
    return out


def load_summary(records: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per model of ``lab/load_time.py``'s records: median, min, max seconds, the count, and
    the median's ratio to the postprocess model's with the goal (at most :data:`LOAD_GOAL`)."""
    out: Dict[str, Any] = {}
    for model in dict.fromkeys(r["model"] for r in records):
        secs = [float(r["seconds"]) for r in records if r["model"] == model]
        out[model] = {"median_s": round(statistics.median(secs), 3), "min_s": round(min(secs), 3),
                      "max_s": round(max(secs), 3), "n": len(secs)}
    base = (out.get("postprocess") or {}).get("median_s")
    for model, x in out.items():
        x["vs_postprocess"] = round(x["median_s"] / base, 2) if base else None
        if model != "postprocess":
            x["met"] = None if x["vs_postprocess"] is None else x["vs_postprocess"] <= LOAD_GOAL
    return out


def load_times(rounds: int, warmup_rounds: int = 1, root: Optional[Path] = None) -> Dict[str, Any]:
    """``lab/load_time.py``'s measurement for this checkout: ``rounds`` fresh servers (after
    ``warmup_rounds`` not counted), each loading postprocess, tokenizer and router one at a
    time in a rotating order; ``{"records", "summary", "load_during"}``."""
    from lab.load_time import measure_loads
    from orchestrator.tooling.paths import PROJECT_ROOT

    records = measure_loads([("this", Path(root or PROJECT_ROOT).resolve())], rounds, warmup_rounds)
    during = [r["load1_after"] for r in records]
    return {"rounds": rounds, "records": records, "summary": load_summary(records),
            "load_during": [round(min(during), 2), round(max(during), 2)] if during else None}


def read_repair(path: Optional[Path]) -> Optional[Dict[str, Any]]:
    """The router reload's downtime from a soak report (``<out>/soak/report.json``): its
    ``router_repair``, ``command``, ``date_utc`` and load average; None when the file is
    absent or has no ``router_repair`` (a report from before it was recorded)."""
    if path is None or not Path(path).is_file():
        return None
    report = json.loads(Path(path).read_text())
    repair = report.get("router_repair")
    if not repair:
        return None
    return {**repair, "command": report.get("command"), "date_utc": report.get("date_utc"),
            "loadavg": (report.get("machine") or {}).get("loadavg"), "source": str(path)}


def _fmt_decision(d: Mapping[str, Any]) -> str:
    if d.get("median") is None:
        return "no rounds"
    iv = f"median {d['median']}x over {d['n']} rounds, 95% interval " + (
        f"{d['low']}x to {d['high']}x" if d.get("low") is not None else "none (under 6 rounds)")
    tail = ""
    if d["verdict"] == "not decided":
        tail = (f"; at this run's spread about {d['rounds_needed']} rounds would decide it" if d.get("rounds_needed")
                else "; at this run's spread no number of rounds up to 400 would: the median is too close to the goal")
    return f"{iv}: **{d['verdict']}**{tail}"


def render_floor(r: Mapping[str, Any]) -> List[str]:
    """The floor and cost-model parts of the section (pure)."""
    from lab.bench.instances import _cell

    L = ["### The platform's floor: router_single against a hand-written BLS model", "",
         "`hand_bls` (`lab/bench/hand_bls`): python_backend's BLS example's shape: tokenize in-process with "
         "`tokenizers`, one `exec` of `classifier` for the whole execute, the calibrated sigmoid, respond; no "
         "policy, limits, breaker or deadlines. `router_single`: the router with the single-classifier policy "
         "(the same compute). perf_analyzer (gRPC), closed loop, one held-out text per request; medians over "
         "the rounds; ratios are medians of per-round ratios.", "",
         "| concurrency | model | throughput, infer/s | p50, ms | p99, ms | throughput / hand_bls | p50 / hand_bls |",
         "|---|---|---|---|---|---|---|"]
    ms = r["measurements"]
    for c in FLOOR_CONCURRENCIES:
        for model in FLOOR_MODELS:
            rows = [m for m in ms if m["model"] == model and int(m["concurrency"]) == c and not m.get("error")]
            if not rows:
                continue
            med = {k: round(statistics.median(float(m[k]) for m in rows), 2) for k in ("throughput", "p50_ms", "p99_ms")}
            thr = pair_ratios(ms, model, "hand_bls", c, "throughput")
            p50 = pair_ratios(ms, model, "hand_bls", c, "p50_ms")
            L.append(f"| {c} | `{model}` | {med['throughput']} | {med['p50_ms']} | {med['p99_ms']} | "
                     f"{_cell(round(statistics.median(thr), 3) if thr else None, 'x')} | "
                     f"{_cell(round(statistics.median(p50), 3) if p50 else None, 'x')} |")
    g = r["floor_goals"]
    L += ["", f"- `router_single` p50 at c=1 at most {FLOOR_P50_GOAL}x `hand_bls`'s: {_fmt_decision(g['p50_c1'])}. "
          f"Per round: {', '.join(map(str, g['p50_c1']['per_round']))}.",
          f"- `router_single` throughput at c=16 at least {FLOOR_THROUGHPUT_GOAL}x `hand_bls`'s: "
          f"{_fmt_decision(g['throughput_c16'])}. Per round: {', '.join(map(str, g['throughput_c16']['per_round']))}.",
          *render_split(r),
          "", "Decisions: the distribution-free 95% interval of the median per-round ratio (`scipy.stats.quantile_test`); "
          "met / not met when the whole interval is on one side of the goal. Rounds needed: the interval's ends "
          "read as this run's quantiles for a larger number of rounds (an estimate that assumes this run's spread).",
          "", "### The cascade's cost model", ""]
    cm = r["cost"]
    esc = r.get("escalation") or {}
    group = r.get("pad_group", PAD_GROUP)
    how = ("one text a request at its own length (no padding: the router's padding of a batch to its longest text "
           "is charged to its overhead)" if group == 1 else
           f"each padded to the longest of its group of {group} consecutive texts, as the router pads one `exec`'s batch")
    L.append(f"`classifier_fast` and `classifier` at c={COST_CONCURRENCY} in every round, on the held-out texts "
             f"tokenized (perf_analyzer, gRPC; truncated to 128 tokens, empty texts left out), {how}: "
             "c = 1 / throughput. "
             f"e: the shipped router's `ROUTE` values on the {esc.get('texts', 'n/a')} held-out texts "
             f"({esc.get('fast', 'n/a')} answered by `classifier_fast`, {esc.get('accurate', 'n/a')} escalated to "
             f"`classifier`, {esc.get('empty', 'n/a')} empty, {esc.get('other', 'n/a')} other). The router's own cost "
             f"per stage, fitted as `orchestrator tune --url --overhead-shares {_share_args()}` fits it: "
             f"{_share_models()} (copies of the "
             f"shipped router, its margin) on lists of as many held-out texts, {_shares(cm)} of them texts it "
             "escalates (spread evenly, the rest texts `classifier_fast` answers), 1/T(s) = c_fast + o_first + s * "
             "(c_accurate + o_escalated) + s^2 * q_escalated through them (least squares; q_escalated 0 with two "
             "lists); predicted = 1 / (c_fast + o_first + e * (c_accurate + o_escalated) + e^2 * q_escalated). "
             "Beside it, not judged: the same through the lowest and highest share alone (the line, the model "
             "before the curvature), and the model before the parts: one "
             "overhead = 1/T(`router_single`) - c_accurate, predicted = 1 / (c_fast + e * c_accurate + overhead). "
             "Measured: the shipped `router`'s throughput, all at c=16 in the same round.")
    med, old = cm.get("median"), (cm.get("one_constant") or {}).get("median")
    if med:
        L += ["", "| model | c_fast, ms/text | c_accurate, ms/text | e | router's own, ms/text | predicted, infer/s | "
              "measured, infer/s | measured / predicted |", "|---|---|---|---|---|---|---|---|",
              f"| per stage | {med['c_fast_ms']} | {med['c_accurate_ms']} | {cm['e']} | {med['o_first_ms']} + e * "
              f"{med['o_escalated_ms']}{_curve(med)} | {med['predicted']} | {med['measured']} | {_x(cm['goal']['median'])} |"]
        line = (cm.get("line") or {}).get("median")
        if line:
            ends = cm.get("shares") or ESCALATION_SHARES
            low, high = f"{round(100 * ends[0])}%", f"{round(100 * ends[-1])}%"
            L.append(f"| line ({low} and {high} only) | {line['c_fast_ms']} | {line['c_accurate_ms']} | {cm['e']} | "
                     f"{line['o_first_ms']} + e * {line['o_escalated_ms']} | {line['predicted']} | {line['measured']} | "
                     f"{_x(cm['line']['goal']['median'])} |")
        if old:
            L.append(f"| one constant | {old['c_fast_ms']} | {old['c_accurate_ms']} | {cm['e']} | {old['overhead_ms']} | "
                     f"{old['predicted']} | {old['measured']} | {_x(cm['one_constant']['goal']['median'])} |")
        L += ["", "(Medians over the rounds of each round's figures; the ratio is the median of the per-round ratios.)", "",
              f"- The shipped router at least {COST_MODEL_GOAL}x its cost model's prediction at c=16 (per stage): "
              f"{_fmt_decision(cm['goal'])}. Per round: {', '.join(map(str, cm['goal']['per_round']))}."]
        if line:
            L.append(f"- The line through the lowest and highest share alone (the model before the curvature), not "
                     f"judged: {_x(cm['line']['goal']['median'])}; per round: "
                     f"{', '.join(map(str, cm['line']['goal']['per_round']))}.")
        if old:
            L.append(f"- The model before the parts (one constant), not judged: {_x(cm['one_constant']['goal']['median'])}; "
                     f"per round: {', '.join(map(str, cm['one_constant']['goal']['per_round']))}.")
    else:
        L += ["", "No round measured every model the cost model needs: not computed."]
    L += [f"- Router / ensemble throughput at c=16 (median of per-round ratios): {_cell(cm.get('router_vs_ensemble_c16'), 'x')}."]
    return L


def _shares(cost: Mapping[str, Any]) -> str:
    shares = [f"{round(100 * s)}%" for s in (cost.get("shares") or ESCALATION_SHARES)]
    return ", ".join(shares[:-1]) + " and " + shares[-1]


def _share_args() -> str:  # the command's shares (a run's ``cost["shares"]`` are as built)
    return " ".join(f"{s:g}" for s in ESCALATION_SHARES)


def _curve(med: Mapping[str, Any]) -> str:
    q = med.get("q_escalated_ms")  # absent in a run before the curvature
    return "" if not q else f" + e^2 * {q}"


def _share_models() -> str:
    models = [f"`{m}`" for m in ESCALATION_VARIANTS]
    return ", ".join(models[:-1]) + " and " + models[-1]


def render_load_and_repair(r: Mapping[str, Any]) -> List[str]:
    """The load-time and repair parts of the section (pure)."""
    from lab.soak.report import ROUTER_REPAIR_S

    L = ["", "### Load and repair time", ""]
    lt = r.get("load_time")
    if lt:
        L += [f"`lab/load_time.py`'s measurement on this checkout, run by this command after the perf_analyzer rounds: "
              f"{lt['rounds']} fresh embedded servers (one more first, not counted), each loading `postprocess`, "
              "`tokenizer` and `router` one at a time through the repository API in a rotating order; a load's time "
              "is its load call (returns once the model is ready). 1-minute load average during the loads "
              f"{lt['load_during'][0]} to {lt['load_during'][1]}.", "",
              "| model | median, s | min, s | max, s | starts | / postprocess | goal (<= 1.5x) |", "|---|---|---|---|---|---|---|"]
        for model, x in lt["summary"].items():
            met = "" if model == "postprocess" else ("**met**" if x.get("met") else "**not met**")
            L.append(f"| `{model}` | {x['median_s']} | {x['min_s']} | {x['max_s']} | {x['n']} | {_x(x['vs_postprocess'])} | {met} |")
    else:
        L.append("Load time not measured in this run (`--load-rounds 0`).")
    rep = r.get("repair")
    L.append("")
    if rep:
        met = rep.get("downtime_s") is not None and rep["downtime_s"] <= ROUTER_REPAIR_S
        L.append(f"Router repair (from `{rep['source']}`: `{rep['command']}`, {rep['date_utc']} UTC, load average "
                 f"{rep.get('loadavg')} at its end): the router reloaded under the soak's traffic (repository API, "
                 f"forced new instances) took {rep['reload_s']} s; the reloaded router's first answer came "
                 f"{rep['first_answer_after_s']} s after the reload returned; the longest stretch without any answer, "
                 f"from the reload being sent to that first answer, **{rep['downtime_s']} s** ({rep['errors']} errors): "
                 f"goal at most {ROUTER_REPAIR_S:g} s **{'met' if met else 'not met'}**.")
    else:
        L.append("Router repair: no soak report with the router reload's downtime was given (`--soak-report`).")
    return L


def _x(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v}x"


from lab.bench.report import FLOOR_END, FLOOR_START  # noqa: E402  (kept across make bench runs)

COMMAND = "python -m lab.bench.instances --compare floor"


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section of one floor run ``r`` (pure)."""
    from lab.bench.stack import header_line

    L = [FLOOR_START, "## The router against its physics: the platform's floor, the cascade's cost model, load and repair", "",
         f"One run of `{r['command']}` at {r['started_utc']} UTC on {r['machine']['cores']} cores "
         f"({r['machine']['cpu_model']}), 1-minute load average {r['load_before']} before, highest "
         f"{r['load_max_during']} during the perf_analyzer rounds (that counts the server and perf_analyzer "
         f"themselves, which share the cores), {r['rounds']} rounds, perf_analyzer windows of {r['window_ms']} ms "
         f"(3 per measurement, no stability rule); raw figures in `bench/floor.json`.", "", header_line(r.get("stack"))]
    if r.get("quick"):
        L += ["", "> **`--quick` run**: a smoke test, not a benchmark."]
    if r.get("summarized"):
        L += ["", f"Summarized again by `{r['summarized']}` (the same measurements, this checkout's summaries)."]
    L += ["", *render_floor(r), *render_load_and_repair(r)]
    L += [*failed_note(r["measurements"]), "", FLOOR_END]
    return "\n".join(L)


def summarize(path: Path, out: Path, command: str) -> Dict[str, Any]:
    """A run's results (``path``: its ``bench/floor.json``) summarized again by this checkout's
    code, measuring nothing: the floor goals, the server split and the cost models recomputed
    from its measurements, ``command`` noted in the section, ``<out>/bench/floor.json`` and the
    section of ``<out>/benchmarks.md`` rewritten; returns the results."""
    from lab.bench.report import write_kept_outputs

    results = json.loads(Path(path).read_text(encoding="utf-8"))
    ms = results["measurements"]
    results.update(floor_goals=floor_goals(ms), server_split=split_summary(ms), summarized=command,
                   cost=cost_summary(ms, (results.get("escalation") or {}).get("e"), tuple(results["shares"])))
    write_kept_outputs(out, "floor", results, render_section(results), FLOOR_START, FLOOR_END)
    return results


#: The models whose time per request the server's statistics split at c=1
#: (:func:`server_split`), and the model their BLS calls reach.
SPLIT_MODELS = ("router_single", "hand_bls")
SPLIT_DOWNSTREAM = "classifier"
_STAT_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def server_stats(url: str, models: Sequence[str]) -> Dict[str, Dict[str, int]]:
    """Triton's cumulative statistics of ``models`` (statistics extension, gRPC, version
    1): per model ``count`` (successful requests) and the nanoseconds of each phase of
    :data:`_STAT_PHASES`."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        out = {}
        for model in models:
            st = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
            # protobuf's JSON leaves out zeros (a model that has not answered yet)
            out[model] = {"count": int(st.get("success", {}).get("count", 0)),
                          **{k: int(st.get(k, {}).get("ns", 0)) for k in _STAT_PHASES}}
        return out
    finally:
        client.close()


def server_split(before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]], model: str,
                 downstream: str = SPLIT_DOWNSTREAM) -> Optional[Dict[str, float]]:
    """Microseconds per request of ``model`` between two :func:`server_stats` snapshots, as
    the server counts them: ``execute_us`` (its ``compute_infer``: the ``execute`` call, one
    request each at c=1), ``downstream_us`` (all of ``downstream``'s time, queue to output,
    spent on the BLS calls made meanwhile, per request of ``model``) and ``own_us``, the
    first less the second: the model's own Python plus the BLS round trips. None when no
    request of ``model`` finished between them."""
    n = after[model]["count"] - before[model]["count"]
    if n <= 0:
        return None
    execute = (after[model]["compute_infer"] - before[model]["compute_infer"]) / n / 1e3
    down = sum(after[downstream][k] - before[downstream][k] for k in _STAT_PHASES) / n / 1e3
    return {"requests": n, "execute_us": round(execute, 1), "downstream_us": round(down, 1), "own_us": round(execute - down, 1)}


def split_summary(measurements: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per model of :data:`SPLIT_MODELS`, the median over the rounds of each figure of
    :func:`server_split` at c=1, and per round ``router_single``'s ``own_us`` less
    ``hand_bls``'s (its median and distribution-free 95% interval)."""
    from lab.bench.instances import median_interval, rounded_interval

    by_round: Dict[str, Dict[int, Mapping[str, float]]] = {m: {} for m in SPLIT_MODELS}
    for m in measurements:
        if m.get("server_split") and int(m["concurrency"]) == 1 and m["model"] in by_round:
            by_round[m["model"]][int(m["round"])] = m["server_split"]
    out: Dict[str, Any] = {"models": {}}
    for model, rounds in by_round.items():
        if rounds:
            out["models"][model] = {k: round(statistics.median(r[k] for r in rounds.values()), 1)
                                    for k in ("execute_us", "downstream_us", "own_us")}
    a, b = by_round.values()
    diffs = [a[r]["own_us"] - b[r]["own_us"] for r in sorted(a) if r in b]
    _, low, high = rounded_interval(median_interval(diffs), 1)
    out["own_difference_us"] = {"n": len(diffs), "per_round": [round(d, 1) for d in diffs],
                                "median": round(statistics.median(diffs), 1) if diffs else None, "low": low, "high": high}
    return out


def render_split(r: Mapping[str, Any]) -> List[str]:
    """The server's split of one request's time at c=1 (:func:`split_summary`), pure."""
    sp = r.get("server_split") or {}
    models = sp.get("models") or {}
    if not models:
        return []
    L = ["", "Where one request's time goes, as the server counts it (Triton's statistics before and after each c=1 "
         f"measurement; microseconds per request, medians over the rounds): `execute` is the model's "
         f"`compute_infer`, `{SPLIT_DOWNSTREAM}` all of the classifier's time spent on its BLS calls, own the "
         "difference (the model's Python and the BLS round trip).", "",
         f"| model | execute, us | {SPLIT_DOWNSTREAM}, us | own, us |", "|---|---|---|---|"]
    for model, x in models.items():
        L.append(f"| `{model}` | {x['execute_us']} | {x['downstream_us']} | {x['own_us']} |")
    d = sp.get("own_difference_us") or {}
    if d.get("median") is not None:
        iv = f" (95% interval {d['low']} to {d['high']})" if d.get("low") is not None else ""
        L += ["", f"`router_single`'s own time less `hand_bls`'s, per round: median {d['median']} us{iv} over {d['n']} rounds."]
    return L


def router_routes(url: str, texts: Sequence[str], batch: int = 32) -> List[str]:
    """The shipped router's ``ROUTE`` for each of ``texts`` (gRPC, ``batch`` texts a request)."""
    import tritonclient.grpc as grpcclient

    from orchestrator.tooling.client import text_inputs

    client = grpcclient.InferenceServerClient(url)
    routes: List[str] = []
    try:
        for i in range(0, len(texts), batch):
            out = client.infer("router", text_inputs(grpcclient, list(texts[i:i + batch])),
                               outputs=[grpcclient.InferRequestedOutput("ROUTE")])
            routes += [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in out.as_numpy("ROUTE").reshape(-1)]
    finally:
        client.close()
    return routes


def held_out_order() -> List[str]:
    """The held-out texts in the floor runs' one fixed order (a permutation seeded 0)."""
    from orchestrator.tooling.modeling import data

    held_out = data.held_out_examples()
    return [held_out[i].text for i in np.random.RandomState(0).permutation(len(held_out))]


def run_header(command: str, rounds: int, window_ms: int) -> Dict[str, Any]:
    """What a floor run records before it measures: when, the load, the machine, the command."""
    import datetime

    from lab.bench.machine import load_average, machine_info

    return {"started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "load_before": load_average(), "machine": machine_info(), "command": command, "rounds": rounds,
            "window_ms": window_ms}


def measure_specs(specs: Sequence[Spec], server: Any, inputs: Mapping[str, Path], workdir: Path, window_ms: int,
                  warm: Mapping[Tuple[str, str], float], split: Callable[[Spec], bool], tag: str) -> List[Dict[str, Any]]:
    """perf_analyzer on each of ``specs`` in turn against ``server`` (``inputs``: input data by
    dataset), windows of ``window_ms``; a spec that ``split`` names gets the server's split of
    its requests (:func:`server_split`). Returns the measurements, in order (a failure is a
    measurement with ``error``); logs one line each, ``[tag i/n]``."""
    from lab.bench.instances import _log
    from lab.bench.measurement import measure_next, outcome
    from lab.bench.perf_analyzer import install_perf_analyzer
    from lab.bench.plan import PASettings

    settings = PASettings(measurement_interval_ms=window_ms, check_stability=False, fallback=False,
                          latencies_per_window=10, max_interval_ms=2 * window_ms)
    binary = install_perf_analyzer()
    measurements: List[Dict[str, Any]] = []
    for i, spec in enumerate(specs, 1):
        before = server_stats(server.grpc_url, (spec.model, SPLIT_DOWNSTREAM)) if split(spec) else None
        m = measure_next(binary, spec, server.grpc_url, inputs[spec.dataset], workdir, settings, measurements, warm)
        if before is not None and not m.get("error"):
            m["server_split"] = server_split(before, server_stats(server.grpc_url, (spec.model, SPLIT_DOWNSTREAM)), spec.model)
        _log(f"[{tag} {i}/{len(specs)}] {spec.model} c={spec.concurrency} round {spec.round + 1}: {outcome(m)}")
    return measurements


def run(out: Path, quick: bool = False, rounds: Optional[int] = None, load_rounds: int = 5,
        soak_report: Optional[Path] = None, window_ms: int = 1000, command: str = COMMAND) -> Dict[str, Any]:
    """The whole benchmark (module docstring); writes ``<out>/bench/floor.json`` and the
    section of ``<out>/benchmarks.md``; returns the results."""
    import tempfile
    import time

    from lab.bench.instances import _log
    from lab.bench.measurement import write_input_data
    from lab.bench.report import write_kept_outputs
    from lab.bench.stack import read_stack
    from orchestrator.tooling.server import TritonServer

    rounds = rounds or (1 if quick else FLOOR_ROUNDS)
    started = time.monotonic()
    results: Dict[str, Any] = {
        **run_header(command, rounds, window_ms), "quick": quick,
        "models": [*FLOOR_MODELS, *CLASSIFIERS, *ESCALATION_VARIANTS], "pad_group": PAD_GROUP}
    texts = held_out_order()
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        repo = make_floor_repository(Path(tmp) / "model_repository")
        inputs = {"held_out": write_input_data(Path(tmp) / "input.json", texts)}
        ids, pad = tokenize_held_out(texts, repo)
        inputs["tokens"] = Path(tmp) / "tokens.json"
        inputs["tokens"].write_text(json.dumps(classifier_input_json(ids, pad)))
        with TritonServer(repo, models=["tokenizer", "postprocess", *CLASSIFIERS, *FLOOR_MODELS,
                                        *ESCALATION_VARIANTS]) as server:
            results["stack"] = read_stack(server, embedded=True)
            routes = router_routes(server.grpc_url, texts)
            results["escalation"] = escalation(routes)
            _log(f"[floor] escalation on {len(texts)} held-out texts: {results['escalation']}")
            lists = share_lists(routes)
            results["shares"] = [x["share"] for x in lists]
            for dataset, x in zip(SHARE_DATASETS.values(), lists):
                inputs[dataset] = write_input_data(Path(tmp) / f"{dataset}.json", [texts[i] for i in x["texts"]])
            warm = {**{(m, "held_out"): 10.0 for m in FLOOR_MODELS}, **{(m, d): 10.0 for m, d in SHARE_DATASETS.items()},
                    **{(m, "tokens"): 5.0 for m in CLASSIFIERS}}
            measurements = measure_specs(floor_plan(rounds), server, inputs, Path(tmp) / "pa", window_ms, warm,
                                         lambda spec: spec.concurrency == 1 and spec.model in SPLIT_MODELS, "floor")
    results.update(measurements=measurements, load_max_during=max_load(measurements),
                   floor_goals=floor_goals(measurements), server_split=split_summary(measurements),
                   cost=cost_summary(measurements, (results.get("escalation") or {}).get("e"), tuple(results["shares"])))
    if load_rounds:
        _log(f"[floor] load time: {load_rounds} rounds")
        results["load_time"] = load_times(load_rounds)
    results["repair"] = read_repair(soak_report)
    results["wall_s"] = round(time.monotonic() - started, 1)
    write_kept_outputs(out, "floor", results, render_section(results), FLOOR_START, FLOOR_END)
    return results
