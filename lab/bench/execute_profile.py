"""Where one ``execute`` of the router spends its time, phase by phase, without a server:
``python -m lab.bench.execute_profile [--executes N] [--models router router_single] [--json PATH]``.

The router (this checkout's ``TritonPythonModel``) runs on the in-process mock
(``orchestrator.testing.mock``) in the benchmark repository (``router`` with the shipped policy,
``router_single`` with one classifier call per text: ``lab.bench.plan.VARIANTS``), one request of
one short text per ``execute`` (c=1), ``--executes`` times after ``--warmup``. Two passes per model:

* **bare**: only ``execute`` and the BLS ``exec``/``async_exec`` are timed
  (``time.perf_counter_ns``); the router's own time of one execute is ``execute`` less the time
  inside BLS calls (the downstream model and the mock's side of the call). Its median is the
  number to compare.
* **phases**: every phase below is wrapped too, and each execute's time is split into
  *exclusive* times (a phase's time less that of the phases inside it), so the phases add up
  to the execute. The wrappers cost about a microsecond each, so this pass's total is above the
  bare one; read it for shares, the bare pass for the total.

Phases (what each wraps): ``parse`` (``_parse``: input tensors, ``parse_request``, the request
context), ``tokenize`` (the inline tokenizer's ``encode``), ``plan`` (``Run.run`` itself: items,
the policy's entry, results), ``deadlines`` (``Deadlines``), ``nodes`` (each node kind's handler
and ``Run.run_node``), ``model call`` (``ModelCalls.classify``/``batched``: padding, input
tensors), ``bls build`` (``Downstream.infer``/``_call``/``_bls`` and the circuit breaker: the
``InferenceRequest``, its ``Tensor``s, reading the response), ``heads`` (``Head`` methods:
sigmoid, verdicts, margins), ``metrics`` (``Metrics`` and the run's counters, observations and
stage timings), ``response`` (``_response``: output tensors, the ``InferenceResponse``),
``adapter`` (``execute``, ``_timed_execute``, ``_execute`` themselves and the event loop's
``run_until_complete`` or the router's ``run_eagerly``: what no other phase holds), and ``bls exec`` (the downstream call
itself: not the router's).

The mock's ``Tensor``/``InferenceRequest``/``InferenceResponse`` are Python, where the stub's
are C++ bindings, so ``bls build`` and ``response`` here are an upper bound of the stub's;
everything else is the code the stub runs. Prints one JSON document (also to ``--json``).

``--ablate FEATURE...``: what one feature costs at c=1 (:func:`ablation`): the bare pass in
alternating blocks (ABBA) with the feature on and patched off. One "feature" is the platform's,
not the router's: ``downstream_run``, the downstream model's ``onnxruntime`` run between two
executes; off, each session answers the profile's one input from its first answer
(:func:`replayed_runs`), so the caches hold the calling model's code and data from one execute to
the next. Its cost is what a classifier's run (some megabytes of weights through the caches)
adds to the calling model's own time. Another is a restructuring, not a feature:
``fused_line``, off, puts the straight stand-in of ``lab.bench.fused_line`` in place of
``Run.run``; its cost is what fusing the run's layers for a one-way policy could save. Each
ablation reports the median of the paired block differences with its distribution-free 95%
interval (``cost_us_interval``) beside the blocks' 5th-95th percentiles.

``--models hand_bls`` (``lab/bench/hand_bls``, the floor model of ``make bench-floor``) profiles
the hand-written BLS model beside the router: the bare pass and ablations time its ``execute``
(its own time: ``execute`` less its BLS call), with no phases (it has none of the router's).

``--compare BASELINE``: this checkout's router beside another checkout's (a ``git worktree`` of
the commit before a change), the bare pass of one ``--models`` model in interleaved blocks
(:func:`compare`): two worker processes, each importing only its checkout, run
``--block`` executes in turn (ABBA), ``--blocks`` pairs; the verdict is the median per-pair
ratio after / before with its distribution-free 95% interval. Interleaving blocks of a
fraction of a second keeps a shared machine's load changes out of the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from lab.bench.machine import load_average

TEXT = "A gorgeous, witty film."
PHASES = ("parse", "tokenize", "plan", "deadlines", "nodes", "model call", "bls build", "heads", "metrics",
          "response", "adapter", "bls exec")


class Clock:
    """Exclusive time per phase on the thread that runs ``execute`` (a stack of open phases)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.totals: Dict[str, int] = {}

    def _stack(self) -> List[List[Any]]:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def enter(self, phase: str) -> None:
        self._stack().append([phase, time.perf_counter_ns(), 0])

    def leave(self) -> None:
        now = time.perf_counter_ns()
        stack = self._stack()
        phase, began, inner = stack.pop()
        elapsed = now - began
        self.totals[phase] = self.totals.get(phase, 0) + elapsed - inner
        if stack:
            stack[-1][2] += elapsed

    def take(self) -> Dict[str, int]:
        totals, self.totals = self.totals, {}
        return totals


def wrap(clock: Clock, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` timed as ``phase`` (a coroutine function stays one: its awaits count to it,
    which at c=1 with the blocking ``exec`` never suspend)."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            clock.enter(phase)
            try:
                return await fn(*args, **kwargs)
            finally:
                clock.leave()
        return timed_async

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        clock.enter(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            clock.leave()
    return timed


def patch(undo: List[Callable[[], None]], owner: Any, name: str, new: Any) -> None:
    old = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)
    setattr(owner, name, new)
    undo.append(lambda: setattr(owner, name, old))


def instrument(clock: Clock, full: bool, others: Sequence[type] = ()) -> Callable[[], None]:
    """Wrap the phases (``full``) or only execute and the BLS exec; returns the undo.
    ``others``: the ``TritonPythonModel`` classes of other models (``hand_bls``) whose
    ``execute`` is timed too, as the router's ``adapter``."""
    import triton_python_backend_utils as pb

    from orchestrator.runtime.bls import downstream
    from orchestrator.runtime.execution import engine, tokenize
    from orchestrator.runtime.metrics import Metrics
    from orchestrator.runtime.request import Deadlines
    from orchestrator.runtime.routing import heads
    from orchestrator.runtime.routing import nodes as N
    from orchestrator.runtime.serving import router

    undo: List[Callable[[], None]] = []

    def methods(owner: Any, phase: str, names: Sequence[str]) -> None:
        for name in names:
            if name in owner.__dict__:
                raw = owner.__dict__[name]
                if isinstance(raw, staticmethod):
                    patch(undo, owner, name, staticmethod(wrap(clock, phase, raw.__func__)))
                else:
                    patch(undo, owner, name, wrap(clock, phase, raw))

    methods(router.TritonPythonModel, "adapter", ["execute"])
    for cls in others:
        methods(cls, "adapter", ["execute"])
    methods(pb.InferenceRequest, "bls exec", ["exec", "async_exec"])
    if not full:
        return lambda: [u() for u in reversed(undo)] and None
    methods(router.TritonPythonModel, "adapter", ["_timed_execute", "_execute"])
    methods(router.TritonPythonModel, "parse", ["_parse"])
    methods(router.TritonPythonModel, "response", ["_response"])
    methods(tokenize.TextTokenizer, "tokenize", ["encode", "pad"])
    methods(engine.Run, "plan", ["run"])
    methods(engine.Run, "nodes", ["run_node"])
    methods(engine.Run, "metrics", ["count", "gauge", "observe", "stage", "flush"])
    methods(engine.ModelCalls, "model call", ["classify", "batched", "ensure_tokens"])
    methods(Deadlines, "deadlines", [n for n, v in vars(Deadlines).items() if inspect.isfunction(v) and not n.startswith("__")])
    methods(downstream.Downstream, "bls build", ["infer", "_call", "_bls"])
    methods(downstream.CallGuard, "bls build", ["__aenter__", "__aexit__", "enter", "exit"])
    methods(downstream.CircuitBreaker, "bls build", ["before_call", "on_success", "state"])
    methods(heads.Head, "heads", ["probabilities", "verdicts", "unsure", "thresholds", "combine", "flipped"])
    methods(Metrics, "metrics", ["inc", "observe", "set", "inc_series", "observe_series", "set_series", "record"])
    patch(undo, router, "observe_stage", wrap(clock, "metrics", router.observe_stage))
    if hasattr(router, "run_eagerly"):  # the execute's first step outside the loop (a checkout before it: none)
        patch(undo, router, "run_eagerly", wrap(clock, "adapter", router.run_eagerly))
    kinds = dict(N.KINDS)
    N.KINDS.update({name: replace(kind, run=wrap(clock, "nodes", kind.run)) for name, kind in kinds.items()})
    undo.append(lambda: N.KINDS.update(kinds))
    loop_cls = asyncio.BaseEventLoop
    patch(undo, loop_cls, "run_until_complete", wrap(clock, "adapter", loop_cls.run_until_complete))
    return lambda: [u() for u in reversed(undo)] and None


def others(mock: Any, model: str) -> List[type]:
    """``model``'s ``TritonPythonModel`` class when it is not the router's (``hand_bls``), for
    :func:`instrument`'s ``others``; else none."""
    from orchestrator.runtime.serving import router

    cls = type(mock.instance(model))
    return [] if issubclass(cls, router.TritonPythonModel) else [cls]


def replayed_runs() -> Callable[[], None]:
    """``onnxruntime.InferenceSession.run`` answering from a replay: each session's first
    answer to an input of the same names, shapes and values is returned again without a run
    (the profile sends one text, so every execute's classifier input is the same). Returns the
    undo."""
    import onnxruntime as ort

    real = ort.InferenceSession.run
    answers: Dict[Any, Any] = {}

    def run(self: Any, output_names: Any, input_feed: Dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        key = (id(self), repr(output_names), tuple((k, np.asarray(v).shape, np.asarray(v).tobytes()) for k, v in sorted(input_feed.items())))
        if key not in answers:
            answers[key] = real(self, output_names, input_feed, *args, **kwargs)
        return answers[key]

    undo: List[Callable[[], None]] = []
    patch(undo, ort.InferenceSession, "run", run)
    return undo[0]


def ablate(feature: str) -> Callable[[], None]:
    """Turn ``feature`` off by patching (the lab's stand-in for a switch): ``timing`` (the
    ``orchestrator_stage_seconds`` and ``orchestrator_node_latency_seconds`` observations),
    ``metrics`` (every counter, gauge and observation), ``queue_delay`` (the queue-delay
    estimate and its gauge), ``eager``, ``downstream_run`` (the downstream models'
    ``onnxruntime`` runs: :func:`replayed_runs`), ``fused_line`` (``Run.run``'s layers for a
    one-way policy: off, the straight stand-in ``lab.bench.fused_line``), ``route`` (the
    ``ROUTE`` output: off, every request names its outputs without it), ``deadlines`` (the
    request deadlines and cancellation flags before, during and after the run), ``breaker``
    (the circuit breaker and the dead-stub watch around each BLS call), ``input_checks``
    (the size limits, the thresholds' range and the parameters' check; the texts are still
    decoded). Returns the undo."""
    if feature == "downstream_run":
        return replayed_runs()
    from orchestrator.runtime.execution import engine
    from orchestrator.runtime.metrics import SAMPLED_HISTOGRAMS, Metrics
    from orchestrator.runtime.serving import router

    undo: List[Callable[[], None]] = []
    if feature in ("timing", "metrics"):
        observe = engine.Run.observe

        def run_observe(self: Any, family: str, value: float, **labels: str) -> None:
            if feature == "timing" and family not in SAMPLED_HISTOGRAMS:
                observe(self, family, value, **labels)

        patch(undo, engine.Run, "stage", lambda self, stage, began: None)
        patch(undo, engine.Run, "observe", run_observe)
        patch(undo, router, "observe_stage", lambda metrics, stage, began: None)
    if feature == "metrics":
        for name in ("count", "gauge", "flush"):
            patch(undo, engine.Run, name, lambda self, *a, **k: None)
        for name in ("inc", "set", "observe", "inc_series", "set_series", "observe_series", "record"):
            patch(undo, Metrics, name, lambda self, *a, **k: None)
    _ablate_part(undo, feature)
    if not undo:
        raise SystemExit(f"--ablate {feature}: expected one of {', '.join(ABLATIONS)}")
    return lambda: [u() for u in reversed(undo)] and None


#: What ``--ablate`` can turn off (:func:`ablate`).
ABLATIONS = ("timing", "metrics", "queue_delay", "eager", "downstream_run", "fused_line", "route", "deadlines", "breaker",
             "input_checks")


def _ablate_part(undo: List[Callable[[], None]], feature: str) -> None:
    """What :func:`ablate` patches out besides the metrics (its docstring), into ``undo``."""
    from orchestrator.runtime import request
    from orchestrator.runtime.bls import downstream
    from orchestrator.runtime.execution import engine
    from orchestrator.runtime.serving import router

    if feature == "eager":  # every execute on loop.run_until_complete, as before run_eagerly
        patch(undo, router, "run_eagerly", lambda loop, coro: loop.run_until_complete(coro))
    if feature == "queue_delay":
        patch(undo, router.QueueDelay, "begin", lambda self: 0.0)
        patch(undo, router.QueueDelay, "end", lambda self: None)
    if feature == "fused_line":
        from lab.bench.fused_line import fused

        patch(undo, engine.Run, "run", fused(engine.Run.run))
    if feature == "route":  # as a client that names PROBABILITIES and VERDICTS only
        parse = router.TritonPythonModel._parse

        def without_route(self: Any, *args: Any, **kwargs: Any) -> Any:
            work = parse(self, *args, **kwargs)
            work.outputs = frozenset(o for o in (work.outputs or self.outputs) if o != "ROUTE")
            return work

        patch(undo, router.TritonPythonModel, "_parse", without_route)
    if feature == "deadlines":
        none = request.CallOptions()
        patch(undo, request.Deadlines, "before_run", lambda self, works: {})
        patch(undo, request.Deadlines, "stopped", lambda self, works, refused: {})
        patch(undo, request.Deadlines, "call_options", lambda self, rows: none)
        patch(undo, request.Deadlines, "arrived", lambda self, items: None)
    if feature == "breaker":
        async def bare_call(self: Any, breaker: Any, model: str, inputs: Any, parameters: Any, request_id: str, alone: bool,
                            options: Any) -> Any:
            return await self._bls(model, inputs, parameters, request_id, alone, options)

        patch(undo, downstream.Downstream, "_call", bare_call)
    if feature == "input_checks":
        patch(undo, request, "check_sizes", lambda texts_array, limits, name="TEXT": None)
        patch(undo, request, "check_thresholds",
              lambda array, count, name="THRESHOLD", columns=1: np.asarray(array, dtype=np.float32).reshape(count, -1))
        patch(undo, request, "check_parameters", lambda parameters, exposed, ignored: dict(parameters))


def one_text_inputs() -> Dict[str, Any]:
    """One request of :data:`TEXT` at threshold 0.5: TEXT object [1, 1], THRESHOLD float32 [1, 1]."""
    return {"TEXT": np.array([[TEXT.encode()]], dtype=np.object_), "THRESHOLD": np.full((1, 1), 0.5, np.float32)}


def block_own_us(mock: Any, model: str, inputs: Dict[str, Any], clock: "Clock", block: int) -> float:
    """The median own time, microseconds, of ``block`` executes of ``model``: each one's
    ``execute`` less its BLS calls, as ``clock`` (:func:`instrument`'s bare pass) took them."""
    clock.take()  # nothing from before the block
    own = []
    for _ in range(block):
        mock.infer(model, inputs)
        p = clock.take()
        own.append(sum(p.values()) - p.get("bls exec", 0))
    return statistics.median(own) / 1e3


def ablation(mock: Any, model: str, feature: str, blocks: int, block: int, warmup: int) -> Dict[str, Any]:
    """The router's own time with ``feature`` on and off (:func:`ablate`), in alternating
    blocks of ``block`` executes: the median of each block, and the median of the paired
    block differences (on - off) with the blocks' 5th and 95th percentiles of it."""
    inputs = one_text_inputs()
    for _ in range(warmup):
        mock.infer(model, inputs)
    clock = Clock()
    undo = instrument(clock, False, others(mock, model))
    on: List[float] = []
    off: List[float] = []
    try:
        for b in range(2 * blocks):
            turned_off = (b % 2 == 1) if (b // 2) % 2 == 0 else (b % 2 == 0)  # ABBA: neither side always first
            restore = ablate(feature) if turned_off else None
            try:
                (off if turned_off else on).append(block_own_us(mock, model, inputs, clock, block))
            finally:
                if restore:
                    restore()
    finally:
        undo()
    from lab.bench.instances import median_interval, rounded_interval

    diffs = sorted(a - b for a, b in zip(on, off))
    q = statistics.quantiles(diffs, n=20) if len(diffs) >= 2 else [diffs[0]] * 19
    iv = rounded_interval(median_interval(diffs))
    return {"feature": feature, "blocks": blocks, "block": block, "on_us": round(statistics.median(on), 1),
            "off_us": round(statistics.median(off), 1), "cost_us": round(statistics.median(diffs), 1),
            "cost_us_p5_p95": [round(q[0], 1), round(q[-1], 1)],
            "cost_us_interval": [None if v is None else round(v, 1) for v in iv[1:]]}


def interleaved(mock: Any, models: Sequence[str], blocks: int, block: int, warmup: int) -> Dict[str, Any]:
    """The bare pass of several models in interleaved blocks of ``block`` executes, the order
    reversed every other block, ``blocks`` rounds: each model's median own time over its
    blocks and, for each model after the first, the median of its per-round difference from
    the first with the distribution-free 95% interval (``--interleave``: two configurations of
    one router, side by side)."""
    from lab.bench.instances import median_interval, rounded_interval

    inputs = one_text_inputs()
    for model in models:
        for _ in range(warmup):
            mock.infer(model, inputs)
    clock = Clock()
    undo = instrument(clock, False, [c for m in models for c in others(mock, m)])
    own: Dict[str, List[float]] = {m: [] for m in models}
    try:
        for b in range(blocks):
            for model in (models if b % 2 == 0 else list(reversed(models))):
                own[model].append(block_own_us(mock, model, inputs, clock, block))
    finally:
        undo()
    base = models[0]
    out: Dict[str, Any] = {"blocks": blocks, "block": block, "own_us": {m: round(statistics.median(v), 1) for m, v in own.items()},
                           "difference_us": {}}
    for model in models[1:]:
        iv = rounded_interval(median_interval([a - b for a, b in zip(own[model], own[base])]), 1)
        out["difference_us"][model] = {"median": iv[0], "interval": iv[1:]}
    return out


def measure(mock: Any, model: str, executes: int, warmup: int, full: bool) -> Dict[str, Any]:
    """One pass over ``model`` (module docstring); medians in microseconds."""
    inputs = one_text_inputs()
    for _ in range(warmup):
        mock.infer(model, inputs)
    clock = Clock()
    undo = instrument(clock, full, others(mock, model))
    per_execute: List[Dict[str, int]] = []
    try:
        for _ in range(warmup // 5):
            mock.infer(model, inputs)
        clock.take()
        for _ in range(executes):
            mock.infer(model, inputs)
            per_execute.append(clock.take())
    finally:
        undo()
    totals = [sum(p.values()) for p in per_execute]
    own = [t - p.get("bls exec", 0) for t, p in zip(totals, per_execute)]
    out: Dict[str, Any] = {
        "executes": executes,
        "execute_us": round(statistics.median(totals) / 1e3, 1),
        "own_us": round(statistics.median(own) / 1e3, 1),
        "own_us_quartiles": [round(q / 1e3, 1) for q in statistics.quantiles(own, n=4)],
    }
    if full:
        out["phases_median_us"] = {ph: round(statistics.median(p.get(ph, 0) for p in per_execute) / 1e3, 1) for ph in PHASES}
        out["phases_mean_us"] = {ph: round(statistics.fmean(p.get(ph, 0) for p in per_execute) / 1e3, 1) for ph in PHASES}
    return out


@contextlib.contextmanager
def bench_mock(models: Sequence[str]) -> Iterator[Any]:
    """The in-process mock on a fresh benchmark repository (``models``' variants added),
    with the stage models and ``models`` loaded."""
    from lab.bench.plan import VARIANTS
    from lab.bench.variants import make_bench_repository
    from orchestrator.testing.mock import MockTriton

    with tempfile.TemporaryDirectory() as tmp:
        repo = make_bench_repository(Path(tmp) / "model_repository", variants={k: VARIANTS[k] for k in models if k in VARIANTS})
        with MockTriton(repo) as mock:
            for name in ("tokenizer", "classifier", "classifier_fast", *models):
                mock.load(name)
            yield mock


def emit(result: Dict[str, Any], path: Optional[Path]) -> None:
    """Print ``result`` as JSON, and write it to ``path`` too when given."""
    text = json.dumps(result, indent=2)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    print(text)


def serve(model: str, warmup: int) -> None:
    """A :func:`compare` worker: ``model`` of the checkout this process imports, on the mock;
    prints ``ready``, then for each line of stdin (a block size) the block's median own time."""
    with bench_mock([model]) as mock:
        measure(mock, model, max(2, warmup // 5), warmup, full=False)
        print("ready", flush=True)
        for line in sys.stdin:
            print(json.dumps(measure(mock, model, int(line), 20, full=False)["own_us"]), flush=True)


def compare(baseline: Path, model: str, blocks: int, block: int, warmup: int) -> Dict[str, Any]:
    """This checkout's own time beside ``baseline``'s (module docstring): each pair's block
    medians (microseconds) and ratio after / before, and their median with its 95% interval."""
    from lab.bench.instances import median_interval

    def start(root: Path) -> "subprocess.Popen[str]":
        worker = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", "--models", model,
                                   "--warmup", str(warmup)], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert worker.stdout is not None and worker.stdin is not None
        if worker.stdout.readline().strip() != "ready":
            raise SystemExit(f"--compare: the worker in {root} did not start")
        return worker

    root = Path(__file__).resolve().parents[2]
    workers = {"after": start(root), "before": start(Path(baseline).resolve())}
    pairs = []
    try:
        for b in range(blocks):
            got = {}
            for side in (("after", "before") if b % 2 == 0 else ("before", "after")):
                w = workers[side]
                w.stdin.write(f"{block}\n")  # type: ignore[union-attr]
                w.stdin.flush()  # type: ignore[union-attr]
                got[side] = float(w.stdout.readline())  # type: ignore[union-attr]
            pairs.append({**got, "ratio": round(got["after"] / got["before"], 4)})
    finally:
        for w in workers.values():
            w.stdin.close()  # type: ignore[union-attr]
            w.wait(timeout=60)
    summary = median_interval([p["ratio"] for p in pairs])
    return {"model": model, "after": str(root), "before": str(Path(baseline).resolve()), "blocks": blocks, "block": block,
            "pairs": pairs, "median_ratio": None if summary is None else round(summary[0], 4),
            "interval": None if summary is None else [round(v, 4) if np.isfinite(v) else None for v in summary[1:]],
            "after_us": round(statistics.median(p["after"] for p in pairs), 1),
            "before_us": round(statistics.median(p["before"] for p in pairs), 1)}


def render(before: Dict[str, Any], after: Dict[str, Any]) -> List[str]:
    """Markdown tables of two reports (``--json`` files) side by side: per model, the bare
    own time and each phase's median, before and after; then each ablation of ``after``."""
    L = []
    for model in after["models"]:
        b, a = before["models"].get(model), after["models"][model]
        L += ["", f"`{model}` (medians over {a['bare']['executes']} executes, microseconds):", "",
              "| | before | after |", "|---|---:|---:|"]
        L.append(f"| own time per execute (bare pass) | {b['bare']['own_us'] if b else '-'} | {a['bare']['own_us']} |")
        if "phases" in a:  # the router's (``hand_bls`` has none)
            bp = b.get("phases") if b else None
            L.append(f"| own time per execute (phases pass) | {bp['own_us'] if bp else '-'} | {a['phases']['own_us']} |")
            for ph in PHASES:
                L.append(f"| {ph} | {bp['phases_median_us'][ph] if bp else '-'} | {a['phases']['phases_median_us'][ph]} |")
        for ab in a.get("ablations", []):
            L.append(f"\n`{ab['feature']}` on / off: {ab['on_us']} / {ab['off_us']} us; cost {ab['cost_us']} us "
                     f"(5th-95th percentile of {ab['blocks']} paired blocks of {ab['block']}: {ab['cost_us_p5_p95'][0]} "
                     f"to {ab['cost_us_p5_p95'][1]}"
                     + (f"; 95% interval of the median {iv[0]} to {iv[1]}" if (iv := ab.get("cost_us_interval")) and None not in iv
                        else "") + ")")
    return L


def main(argv: Sequence[str] | None = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--executes", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--models", nargs="+", default=["router", "router_single"])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--ablate", nargs="*", default=[], help="features to time on and off: " + ", ".join(ABLATIONS))
    ap.add_argument("--blocks", type=int, default=20, help="--ablate: blocks per side; --compare: pairs (default %(default)s)")
    ap.add_argument("--bare", action="store_true", help="only the bare pass (no phases): for rounds across checkouts")
    ap.add_argument("--render", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                    help="print two --json reports side by side as markdown, and measure nothing")
    ap.add_argument("--compare", type=Path, metavar="BASELINE",
                    help="this checkout beside another's, interleaved blocks of the bare pass of the first --models model")
    ap.add_argument("--block", type=int, default=150, help="--compare: executes per block (default %(default)s)")
    ap.add_argument("--interleave", action="store_true",
                    help="the bare pass of every --models model in interleaved blocks (--blocks rounds of --block executes), "
                         "each model's difference from the first with its interval")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a --compare worker
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.models[0], args.warmup)
        return {}
    if args.compare:
        result = compare(args.compare, args.models[0], args.blocks, args.block, args.warmup)
        emit(result, args.json)
        return result
    if args.render:
        docs = [json.loads(p.read_text()) for p in args.render]
        print("\n".join(render(*docs)))
        return {"rendered": [str(p) for p in args.render]}

    import orchestrator

    report: Dict[str, Any] = {"orchestrator": str(Path(orchestrator.__file__).parent), "python": sys.version.split()[0],
                              "load_before": load_average(), "text": TEXT, "models": {}}
    with bench_mock(args.models) as mock:
        if args.interleave:
            report["interleaved"] = interleaved(mock, args.models, args.blocks, args.block, args.warmup)
        for model in args.models if not args.interleave else ():
            bare = measure(mock, model, args.executes, args.warmup, full=False)
            report["models"][model] = {"bare": bare}
            if not args.bare and not others(mock, model):  # the router's phases; hand_bls has none
                report["models"][model]["phases"] = measure(mock, model, args.executes, args.warmup, full=True)
            for feature in args.ablate:
                report["models"][model].setdefault("ablations", []).append(
                    ablation(mock, model, feature, args.blocks, max(1, args.executes // (2 * args.blocks)), args.warmup // 5))
    report["load_after"] = load_average()
    emit(report, args.json)
    return report


if __name__ == "__main__":
    main()
