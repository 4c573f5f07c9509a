"""Overload benchmark: open-loop Poisson load at 1x, 2x and 4x a model's
capacity (``--capacity-model``, default the shipped ``router``'s own) against ``ensemble``,
``router`` (the shipped one: no queue policy on Triton 2.51), ``router_admit`` (with the
router's own admission control, :data:`ADMISSION`), ``router_queue`` (with the recommended
queue policy, ``repository.QUEUE_POLICY``), ``router_timeout`` and ``router_two``, in one
run of one server
(``--models``: fewer).

``make bench-overload`` or ``python -m lab.bench.overload [--quick] [--out docs/results]``:

1. copies ``model_repository/`` and adds ``router_admit``: the shipped router whose policy
   gets ``admission`` = :data:`ADMISSION`; ``router_queue``: the shipped router with
   ``repository.QUEUE_POLICY``; ``router_timeout``: ``router_queue`` with its queue bounded by time instead of
   size (:data:`TIMEOUT_QUEUE`); ``router_two``: ``router_queue`` with two instances
   (:data:`TWO_INSTANCES`);
2. starts one embedded server with every model the three need;
3. **unloaded**: each model alone, one request at a time (closed loop, concurrency 1):
   the latency floor (p50, p99) each is compared with;
4. **capacity**: the capacity model's throughput in closed loop at concurrency
   :data:`CAPACITY_CONCURRENCY` (answered requests per second): 1x;
5. **open loop**: for each of 1x, 2x, 4x (:func:`rate_plan`) and each model in turn,
   Poisson arrivals (exponential gaps, a fixed seed per level) for ``level_s`` seconds,
   each request one labeled held-out text with threshold 0.5 (the same arrivals and texts
   for every model of a level), sent whether or not the
   earlier ones were answered (``tritonclient.grpc.aio``, one channel); requests still
   unanswered ``grace_s`` after the last arrival are cancelled and counted as unfinished
   (their latency is at least the time they waited, which the percentiles use), then the
   server drains before the next level;
6. writes ``<out>/bench/overload.json`` and the section between :data:`OVERLOAD_START` and
   :data:`OVERLOAD_END` of ``<out>/benchmarks.md`` (``make bench`` keeps it).

Why not perf_analyzer for the open loop: perf_analyzer 2.41 (the one that ships in a
wheel) ends a run at the first failed request (client r23.12 ``LoadWorker::ShouldExit``:
any non-OK ``cb_status_``), so it cannot measure a server that refuses excess load, and it
never looks at answers. The generator here counts refusals by their gRPC code and checks
every answer's verdict against the text's label: accuracy is over every answered request
of a level (a refused request has no answer and is not in it).

Units: latency in milliseconds from the client (send to answer), throughput in answered
requests per second of the level's arrival window. Errors: :class:`BenchError`, the
server's ``ServerError``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import yaml

from lab.bench.machine import machine_info
from lab.bench.plan import BenchError
from lab.bench.report import OVERLOAD_END, OVERLOAD_START, add_out_argument, write_kept_outputs
from lab.bench.stack import StackError, add_url_argument, header_line, read_stack, served, server_or_url
from orchestrator.tooling.paths import PROJECT_ROOT

REPO = PROJECT_ROOT / "model_repository"
COMMAND = "make bench-overload  (python -m lab.bench.overload --out docs/results)"
MODELS = ("ensemble", "router", "router_admit", "router_queue", "router_timeout", "router_two")
#: ``router_admit``: the shipped router with this ``admission`` (runtime/serving/admission.py): 30 ms
#: is :data:`P99_GOAL` times the router's unloaded p99 as measured on the embedded server
#: (about 10 ms, docs/results/benchmarks.md), the bound of the answered-requests goal.
ADMISSION = {"max_wait_ms": 30}
#: The routers given ``repository.QUEUE_POLICY`` (the shipped ``router`` has none).
QUEUED = ("router_queue", "router_timeout", "router_two")
#: ``router_timeout``: ``router_queue`` with its queue bounded by time instead of size
#: (Triton 2.51's batcher can stall up to 500 ms while a size-bounded queue is full;
#: docs/guides/reliability.md "Overload"): these ``default_queue_policy`` fields replaced.
TIMEOUT_QUEUE = {"max_queue_size": 1024, "default_timeout_microseconds": 40000}
#: ``router_two``: ``router_queue`` with two instances (``instance_group`` count), the
#: other mitigation of that stall: a second idle instance makes the batcher's wait end.
TWO_INSTANCES = 2
MULTIPLIERS = (1.0, 2.0, 4.0)
CAPACITY_CONCURRENCY = 16
THRESHOLD = 0.5
#: The p99 goal: under load, the router's p99 at most this times its unloaded p99 (the
#: every-request goal, :func:`goal`: at 4x, every request; the answered-requests goal,
#: :func:`goal_answered`: at 2x and 4x, answered requests, none lost).
P99_GOAL = 3.0
SERVER_MODELS = ("tokenizer", "postprocess", "classifier", "classifier_fast", *MODELS)


@dataclass
class Record:
    """One request of a level: ``start``/``end`` seconds (monotonic; ``end`` None:
    unfinished), ``code`` (``"OK"``, a gRPC status name, or ``"UNFINISHED"``), the text's
    ``label``, the answer's ``verdict`` and ``route`` (None without an answer)."""

    start: float
    end: Optional[float]
    code: str
    label: int
    verdict: Optional[bool] = None
    route: Optional[str] = None
    message: str = ""


# ----------------------------------------------------------------------------- pure parts


def rate_plan(capacity: float, multipliers: Sequence[float] = MULTIPLIERS) -> List[Dict[str, float]]:
    """``[{"multiplier", "rate"}]``: request rates (requests/s) at ``multipliers`` x
    ``capacity``. Raises BenchError when ``capacity`` is not a positive finite number."""
    if not (isinstance(capacity, (int, float)) and math.isfinite(capacity) and capacity > 0):
        raise BenchError(f"the capacity must be a positive number of requests/s, got {capacity!r}")
    return [{"multiplier": float(m), "rate": round(float(m) * float(capacity), 2)} for m in multipliers]


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> List[float]:
    """Arrival times (seconds from 0, increasing, all < ``duration_s``) of a Poisson
    process of ``rate`` per second: exponential gaps from ``random.Random(seed)``."""
    if rate <= 0 or duration_s <= 0:
        raise BenchError(f"rate and duration must be positive, got {rate}, {duration_s}")
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _pct(values: Sequence[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)), 1) if len(values) else None


def summarize(records: Sequence[Record], window_s: float, now: Optional[float] = None) -> Dict[str, Any]:
    """One level's figures from its ``records``.

    Returns ``{"sent", "answered", "refused" (UNAVAILABLE: the queue policy), "errors"
    (other codes), "unfinished", "throughput" (answered / window_s, requests/s),
    "p50_ms", "p99_ms" (over answered and unfinished requests; an unfinished one counts
    with the time it waited until ``now`` or its cancel, a lower bound), "p99_lower_bound"
    (True with unfinished requests: a percentile of values some of which are lower bounds is
    itself a lower bound), "answered_p99_ms", "accuracy_pct"
    (verdict == label over answered requests), "overload_share_pct" (answers whose ROUTE
    ends ``:overload``), "escalated_share_pct" (ROUTE ``classifier``), "codes" (count per
    code), "refusal_messages" (distinct texts, at most 3)}``.
    """
    answered = [r for r in records if r.code == "OK"]
    unfinished = [r for r in records if r.code == "UNFINISHED"]
    refused = [r for r in records if r.code == "UNAVAILABLE"]
    lat = [(r.end - r.start) * 1000.0 for r in answered if r.end is not None]
    waited = [((r.end if r.end is not None else (now or r.start)) - r.start) * 1000.0 for r in unfinished]
    both = lat + waited
    codes: Dict[str, int] = {}
    for r in records:
        codes[r.code] = codes.get(r.code, 0) + 1
    correct = sum(1 for r in answered if r.verdict == bool(r.label))
    routes = [r.route or "" for r in answered]
    share = (lambda n: round(100.0 * n / len(answered), 1) if answered else None)  # noqa: E731
    return {
        "sent": len(records),
        "answered": len(answered),
        "refused": len(refused),
        "errors": len(records) - len(answered) - len(refused) - len(unfinished),
        "unfinished": len(unfinished),
        "throughput": round(len(answered) / window_s, 1) if window_s > 0 else None,
        "p50_ms": _pct(both, 50),
        "p99_ms": _pct(both, 99),
        "p99_lower_bound": bool(unfinished),
        "answered_p99_ms": _pct(lat, 99),
        "accuracy_pct": round(100.0 * correct / len(answered), 2) if answered else None,
        "overload_share_pct": share(sum(1 for r in routes if r.endswith(":overload"))),
        "escalated_share_pct": share(sum(1 for r in routes if r.split(":")[-1] == "classifier"
                                          or r == "chunked:classifier")),
        "codes": dict(sorted(codes.items())),
        "refusal_messages": sorted({r.message for r in refused})[:3],
    }


def _unloaded_p99(results: Mapping[str, Any], model: str) -> tuple:
    """``(p99_ms, stalled)`` of ``model`` unloaded: ``stalled`` when its p99 is over 10x its
    p50 (a stall among the unloaded requests makes any bound on it meaningless)."""
    unloaded = (results.get("unloaded") or {}).get(model) or {}
    p99, p50 = unloaded.get("p99_ms"), unloaded.get("p50_ms")
    return p99, bool(p99 and p50 and p99 > 10 * p50)


def goal(results: Mapping[str, Any], model: str = "router_admit") -> Dict[str, Any]:
    """The every-request goal for ``model``: its p99 at 4x over its unloaded p99, against
    :data:`P99_GOAL`; ``{"model", "ratio", "bound", "met", "stalled"}``. ``met`` is None
    when not measured, or when the unloaded p99 is over 10x the unloaded p50 (``stalled``:
    a stall among the unloaded requests makes the bound meaningless)."""
    top = max(results.get("levels") or [{}], key=lambda lv: lv.get("multiplier", 0))
    loaded = (top.get("models") or {}).get(model, {}).get("p99_ms")
    p99, stalled = _unloaded_p99(results, model)
    ratio = round(loaded / p99, 2) if loaded and p99 else None
    met = None if ratio is None or stalled else ratio <= P99_GOAL
    return {"model": model, "ratio": ratio, "bound": P99_GOAL, "met": met, "stalled": stalled}


def goal_answered(results: Mapping[str, Any], model: str) -> Dict[str, Any]:
    """The answered-requests goal for ``model``: at every level of 2x and more, the p99 of its
    *answered* requests at most :data:`P99_GOAL` times its unloaded p99, and no request
    unfinished or failed other than a refusal (UNAVAILABLE, counted). Returns ``{"model",
    "ratios" (multiplier -> ratio), "bound", "lost" (unfinished + other errors at those
    levels), "refused", "met", "stalled"}``; ``met`` is None when a level lacks the figures
    or the unloaded p99 is over 10x the unloaded p50 (``stalled``, as in :func:`goal`)."""
    p99, stalled = _unloaded_p99(results, model)
    ratios: Dict[str, Optional[float]] = {}
    lost = refused = 0
    for lv in results.get("levels") or []:
        if lv.get("multiplier", 0) < 2:
            continue
        x = (lv.get("models") or {}).get(model)
        if x is None:
            continue
        loaded = x.get("answered_p99_ms")
        ratios[f"{lv['multiplier']:g}x"] = round(loaded / p99, 2) if loaded and p99 else None
        lost += int(x.get("unfinished", 0)) + int(x.get("errors", 0))
        refused += int(x.get("refused", 0))
    met = None if stalled or not ratios or None in ratios.values() else (
        all(r <= P99_GOAL for r in ratios.values() if r is not None) and lost == 0)
    return {"model": model, "ratios": ratios, "bound": P99_GOAL, "lost": lost, "refused": refused, "met": met,
            "stalled": stalled}


def _cell(x: Any, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x}{suffix}"


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section for the results ``r`` of one run (pure)."""
    cap = r["capacity"]
    whose = cap.get("model", "ensemble")
    L = [OVERLOAD_START, f"## Overload: open-loop load at 1x, 2x and 4x `{whose}`'s capacity", ""]
    L.append(f"One run of `{COMMAND}` at {r['started_utc']} UTC on {r['machine']['cores']} cores "
             f"({r['machine']['cpu_model']}), load average {r['load_start']} at start and {r['load_end']} at the end; "
             f"raw figures in `bench/overload.json`.")
    L += ["", header_line(r.get("stack"))]
    if r.get("quick"):
        L += ["", "> **`--quick` run**: short levels; the figures are a smoke test, not a benchmark."]
    L += ["", f"Capacity (1x): `{whose}`'s throughput in closed loop at concurrency {cap['concurrency']}, "
          f"{cap['throughput']} requests/s ({cap['answered']} answered in {cap['seconds']} s). Each level sends Poisson "
          f"arrivals for {r['level_s']} s per model (one labeled held-out text per request, threshold {THRESHOLD}, "
          "gRPC; within a level every model gets the same arrival times and texts, and the unloaded runs the same "
          "texts); "
          f"requests unanswered {r['grace_s']} s after the last arrival are cancelled and counted as unfinished, "
          "with the time they waited (a lower bound) in the percentiles (marked >=). Refused: gRPC UNAVAILABLE from "
          "the router's queue policy (`max_queue_size`, `default_timeout_microseconds`) or its admission control "
          "(retryable). Accuracy: verdict "
          "against label over the answered requests of the level. `router`: the shipped router (no queue policy). "
          f"`router_admit`: the shipped router with admission control, `admission: {json.dumps(r.get('admission', ADMISSION))}` "
          "(docs/guides/reliability.md \"Admission control\"). "
          "`router_queue`: the shipped router with the recommended queue policy (`repository.QUEUE_POLICY`: a queue "
          "of 16, a 5 s REJECT timeout, two priority levels). `router_timeout`: "
          f"`router_queue` with its queue bounded by time instead of size ({json.dumps(r.get('timeout_queue', TIMEOUT_QUEUE))}). "
          f"`router_two`: `router_queue` with {r.get('two_instances', TWO_INSTANCES)} instances. Why the shipped "
          "router has no queue policy, and why those variants: docs/guides/reliability.md, \"Overload\" (under any queue "
          "policy Triton 2.51's batcher can idle 500 ms between executes).", "",
          "| model | unloaded p50, ms | unloaded p99, ms | unloaded accuracy, % |", "|---|---|---|---|"]
    for m in r["models"]:
        u = r["unloaded"][m]
        L.append(f"| `{m}` | {_cell(u['p50_ms'])} | {_cell(u['p99_ms'])} | {_cell(u['accuracy_pct'])} |")
    L += ["", "| load | model | rate, req/s | sent | answered/s | p50, ms | p99, ms | answered p99, ms | refused | "
          "other errors | unfinished | accuracy, % | kept for load, % | escalated, % | server queue, ms | server compute, ms |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for lv in r["levels"]:
        for m in r["models"]:
            x = lv["models"][m]
            p99 = ("&ge; " if x["p99_lower_bound"] else "") + _cell(x["p99_ms"])
            L.append(f"| {lv['multiplier']:g}x | `{m}` | {lv['rate']} | {x['sent']} | {_cell(x['throughput'])} | "
                     f"{_cell(x['p50_ms'])} | {p99} | {_cell(x.get('answered_p99_ms'))} | {x['refused']} | {x['errors']} | {x['unfinished']} | "
                     f"{_cell(x['accuracy_pct'])} | {_cell(x['overload_share_pct'])} | {_cell(x['escalated_share_pct'])} | "
                     f"{_cell(x.get('queue_ms'))} | {_cell(x.get('compute_ms'))} |")
    L += [""]
    for g in r["goals"]:
        u = r["unloaded"].get(g["model"], {})
        met = {True: "**met**", False: "**not met**", None: "not judged"}[g["met"]]
        note = (f" (its unloaded p99, {u.get('p99_ms')} ms, is over 10x its p50, {u.get('p50_ms')} ms: a stall among "
                "the unloaded requests makes the bound meaningless)") if g.get("stalled") else ""
        L.append(f"- Goal, every request: at 4x, `{g['model']}`'s p99 at most {g['bound']:g}x its unloaded p99: "
                 f"{_cell(g['ratio'], 'x')}, {met}{note}.")
    for g in r.get("goals_answered", []):
        met = {True: "**met**", False: "**not met**", None: "not judged"}[g["met"]]
        ratios = ", ".join(f"{k} {_cell(v, 'x')}" for k, v in g["ratios"].items()) or "n/a"
        note = " (its unloaded p99 is over 10x its p50: a stall, so the bound is meaningless)" if g.get("stalled") else ""
        L.append(f"- Goal, answered requests: at 2x and 4x, `{g['model']}`'s p99 of answered requests at most {g['bound']:g}x "
                 f"its unloaded p99, none lost: {ratios}; {g['refused']} refused, {g['lost']} unfinished or failed; "
                 f"{met}{note}.")
    msgs = sorted({m for lv in r["levels"] for x in lv["models"].values() for m in x["refusal_messages"]})
    if msgs:
        L += ["", "Refusal texts seen: " + "; ".join(f"`{m}`" for m in msgs[:3]) + "."]
    L += ["", OVERLOAD_END]
    return "\n".join(L)


def set_queue_policy(config_path: Path, fields: Mapping[str, int]) -> None:
    """Give the router at ``config_path`` the recommended queue policy
    (``repository.QUEUE_POLICY``, two priority levels) with ``fields`` over it (through
    ``model_config.proto``). Raises BenchError when the config has no ``dynamic_batching``."""
    from orchestrator.tooling.errors import ConfigError
    from orchestrator.tooling.repository import add_queue_policy

    header = [f"Benchmark variant (lab.bench.overload): queue policy repository.QUEUE_POLICY "
              f"with {dict(fields)}."]
    try:
        add_queue_policy(config_path, fields, header=header)
    except ConfigError as exc:
        raise BenchError(str(exc)) from None


def set_instances(config_path: Path, count: int) -> None:
    """Set the first ``instance_group``'s ``count`` in ``config_path`` (through the proto).
    Raises BenchError when the config has no instance group."""
    from orchestrator.tooling.repository import read_config, write_config

    config = read_config(config_path)
    if not config.instance_group:
        raise BenchError(f"{config_path}: no instance_group to change")
    config.instance_group[0].count = count
    write_config(config_path, config, [f"Benchmark variant (lab.bench.overload): {count} instances."])


# ----------------------------------------------------------------------------- requests


def _bytes_tensor(value: bytes) -> bytes:
    """One BYTES element as the KServe v2 gRPC raw contents: 4-byte little-endian length + bytes."""
    return len(value).to_bytes(4, "little") + value


class Sender:
    """One ``grpc.aio`` channel to Triton's ``GRPCInferenceService`` (tritonclient's
    generated ``service_pb2``), each request built once per (model, text) and reused: the
    client's own CPU cost per request stays small on a machine it shares with the server."""

    def __init__(self, url: str) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self.grpc, self.pb = grpc, service_pb2
        self.channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", 1 << 24)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.cache: Dict[tuple, Any] = {}
        self.threshold = np.array([THRESHOLD], "<f4").tobytes()

    def request(self, model: str, text: str) -> Any:
        key = (model, text)
        req = self.cache.get(key)
        if req is None:
            req = self.pb.ModelInferRequest(model_name=model)
            for name, dtype in (("TEXT", "BYTES"), ("THRESHOLD", "FP32")):
                t = req.inputs.add()
                t.name, t.datatype = name, dtype
                t.shape.extend([1, 1])
            req.raw_input_contents.extend([_bytes_tensor(text.encode()), self.threshold])
            for name in ("VERDICTS", "ROUTE") if model != "ensemble" else ("VERDICTS",):
                req.outputs.add().name = name
            self.cache[key] = req
        return req

    async def one(self, model: str, text: str, label: int) -> Record:
        start = time.monotonic()
        try:
            resp = await self.stub.ModelInfer(self.request(model, text))
        except self.grpc.aio.AioRpcError as exc:
            return Record(start, time.monotonic(), exc.code().name, label, message=(exc.details() or "")[:200])
        except asyncio.CancelledError:
            return Record(start, None, "UNFINISHED", label)
        end = time.monotonic()
        raw = {o.name: resp.raw_output_contents[i] for i, o in enumerate(resp.outputs)}
        route = raw["ROUTE"][4:].decode() if "ROUTE" in raw else model
        return Record(start, end, "OK", label, bool(raw["VERDICTS"][0]), route)

    async def close(self) -> None:
        await self.channel.close()


async def closed_loop(sender: Sender, model: str, examples: Sequence[tuple], concurrency: int, seconds: float) -> List[Record]:
    """``concurrency`` workers sending the next example as soon as their last is answered."""
    out: List[Record] = []
    nxt = iter(range(10 ** 9))
    stop = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < stop:
            i = next(nxt)
            text, label = examples[i % len(examples)]
            out.append(await sender.one(model, text, label))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def open_loop(sender: Sender, model: str, examples: Sequence[tuple], arrivals: Sequence[float],
                    grace_s: float) -> tuple:
    """Send example ``i`` at ``arrivals[i]`` seconds; returns ``(records, window_s, end)``."""
    tasks: List[asyncio.Task] = []
    t0 = time.monotonic()
    for i, at in enumerate(arrivals):
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        text, label = examples[i % len(examples)]
        tasks.append(asyncio.ensure_future(sender.one(model, text, label)))
    window = max(arrivals[-1] if arrivals else 0.0, time.monotonic() - t0)
    done, pending = await asyncio.wait(tasks, timeout=grace_s) if tasks else (set(), set())
    now = time.monotonic()
    for t in pending:
        t.cancel()
    records = list(await asyncio.gather(*tasks))
    for r in records:  # a cancelled request waited until the cancel
        if r.code == "UNFINISHED":
            r.end = now
    return records, window, now


async def wait_drained(url: str, quiet_s: float = 1.0, limit_s: float = 120.0) -> float:
    """Wait until no model's execution count changes for ``quiet_s``; returns seconds waited."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    start = time.monotonic()
    try:
        last, stable_since = None, time.monotonic()
        while time.monotonic() - start < limit_s:
            stats = await client.get_inference_statistics(as_json=True)
            total = sum(int(m.get("execution_count", 0)) for m in stats.get("model_stats", []))
            if total != last:
                last, stable_since = total, time.monotonic()
            elif time.monotonic() - stable_since >= quiet_s:
                break
            await asyncio.sleep(0.25)
    finally:
        await client.close()
    return round(time.monotonic() - start, 1)


async def model_stats(url: str, model: str) -> Dict[str, float]:
    """Triton's cumulative statistics of ``model`` (version 1, statistics extension):
    ``{"success", "fail", "executions", "queue_ns", "compute_ns"}`` (queue and compute
    input + infer + output, summed over successful requests)."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        stats = await client.get_inference_statistics(model, as_json=True)
    finally:
        await client.close()
    found = (stats.get("model_stats") or [{}])[0]
    inf = found.get("inference_stats", {})

    def part(name: str, key: str) -> float:
        return float((inf.get(name) or {}).get(key, 0) or 0)

    return {"success": part("success", "count"), "fail": part("fail", "count"),
            "executions": float(found.get("execution_count", 0) or 0), "queue_ns": part("queue", "ns"),
            "compute_ns": sum(part(p, "ns") for p in ("compute_input", "compute_infer", "compute_output"))}


def server_side(before: Mapping[str, float], after: Mapping[str, float]) -> Dict[str, Any]:
    """Where a level's time went inside the server, from two :func:`model_stats`: mean
    queue and compute milliseconds per successful request, and requests per execute."""
    d = {k: after[k] - before[k] for k in after}
    ok = d["success"]
    return {"server_success": int(ok), "server_fail": int(d["fail"]), "executions": int(d["executions"]),
            "queue_ms": round(d["queue_ns"] / ok / 1e6, 2) if ok else None,
            "compute_ms": round(d["compute_ns"] / ok / 1e6, 2) if ok else None,
            "requests_per_execute": round((ok + d["fail"]) / d["executions"], 1) if d["executions"] else None}


def _load() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _log(msg: str) -> None:
    print(f"[bench-overload {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def measure_all(url: str, examples: Sequence[tuple], *, level_s: float, grace_s: float, unloaded_n: int,
                      capacity_s: float, multipliers: Sequence[float] = MULTIPLIERS,
                      models: Sequence[str] = MODELS, capacity_model: str = "router") -> Dict[str, Any]:
    """Steps 3-5 of the module docstring against the server at ``url`` (gRPC host:port)."""
    sender = Sender(url)
    out: Dict[str, Any] = {"unloaded": {}, "levels": []}
    k = unloaded_n
    try:
        for m in models:  # warm each model's path once
            for text, label in examples[:8]:
                await sender.one(m, text, label)
        for m in models:  # the same texts for every model
            recs = [await sender.one(m, *examples[i % len(examples)]) for i in range(unloaded_n)]
            s = summarize(recs, 1.0)
            out["unloaded"][m] = {key: s[key] for key in ("answered", "p50_ms", "p99_ms", "accuracy_pct", "codes")}
            _log(f"unloaded {m}: p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms")
        recs = await closed_loop(sender, capacity_model, examples[k:], CAPACITY_CONCURRENCY, capacity_s)
        k += len(recs)
        cap = summarize(recs, capacity_s)
        if cap["answered"] != len(recs):
            raise BenchError(f"{capacity_model} refused or failed {len(recs) - cap['answered']} requests in closed loop: {cap['codes']}")
        out["capacity"] = {"model": capacity_model, "concurrency": CAPACITY_CONCURRENCY, "seconds": capacity_s, "answered": cap["answered"],
                           "throughput": cap["throughput"], "p50_ms": cap["p50_ms"], "p99_ms": cap["p99_ms"]}
        _log(f"capacity: {cap['throughput']} req/s")
        await wait_drained(url)
        for j, plan in enumerate(rate_plan(cap["throughput"], multipliers)):
            level: Dict[str, Any] = {**plan, "models": {}}
            arrivals = poisson_arrivals(plan["rate"], level_s, seed=20 + j)
            shift = k % len(examples)  # each level its own texts, the same for every model
            level_examples = list(examples[shift:]) + list(examples[:shift])
            k += len(arrivals)
            for m in models:
                before = await model_stats(url, m)
                recs, window, now = await open_loop(sender, m, level_examples, arrivals, grace_s)
                s = summarize(recs, window, now)
                s["drain_s"] = await wait_drained(url)
                s.update(server_side(before, await model_stats(url, m)))
                level["models"][m] = s
                _log(f"{plan['multiplier']:g}x {m}: {s['throughput']} answered/s, p99 {s['p99_ms']} ms, "
                     f"refused {s['refused']}, unfinished {s['unfinished']}, accuracy {s['accuracy_pct']}; server: "
                     f"queue {s['queue_ms']} ms, compute {s['compute_ms']} ms, {s['requests_per_execute']} requests per execute")
            out["levels"].append(level)
    finally:
        await sender.close()
    return out


def make_overload_repository(dest: Path, shipped: Mapping[str, Any]) -> Path:
    """``model_repository/`` with the variants this benchmark compares (module docstring),
    written to ``dest`` (``--write-repository``: to serve it in your own Triton for ``--url``)."""
    from lab.bench.variants import make_bench_repository

    repo = make_bench_repository(dest, REPO, variants={
        "router_admit": {"base": "router", "policy_extra": {"admission": dict(ADMISSION)}},
        "router_queue": {"base": "router"},
        "router_timeout": {"base": "router"}, "router_two": {"base": "router"}})
    for name in QUEUED:
        set_queue_policy(repo / name / "config.pbtxt", TIMEOUT_QUEUE if name == "router_timeout" else {})
    set_instances(repo / "router_two" / "config.pbtxt", TWO_INSTANCES)
    return repo


def run(out: Path, quick: bool = False, urls: Sequence[str] = (), models: Sequence[str] = MODELS,
        capacity_model: str = "router") -> Dict[str, Any]:
    """The whole benchmark (module docstring); writes the outputs and returns the results.

    ``urls``: load the running server at these ``--url`` values (``stack.parse_urls``; gRPC
    needed; it must serve :data:`SERVER_MODELS`, e.g. the repository this command builds)
    instead of starting one."""
    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    started = time.monotonic()
    results: Dict[str, Any] = {"started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                               "load_start": _load(), "machine": machine_info(), "command": COMMAND, "quick": quick,
                               "models": list(models), "admission": ADMISSION, "timeout_queue": TIMEOUT_QUEUE, "two_instances": TWO_INSTANCES,
                               "level_s": 5.0 if quick else 10.0, "grace_s": 5.0 if quick else 10.0}
    held_out = data.held_out_examples()
    order = np.random.RandomState(20).permutation(len(held_out))
    examples = [(held_out[i].text, int(held_out[i].label)) for i in order]
    shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        repo = make_overload_repository(Path(tmp) / "model_repository", shipped)
        with server_or_url(urls, lambda: TritonServer(repo, models=list(SERVER_MODELS)), need="grpc") as server:
            results["stack"] = read_stack(server, embedded=not urls)
            served(results["stack"], list(SERVER_MODELS), "serve the repository of --write-repository DIR, or run without --url")
            results.update(asyncio.run(measure_all(
                server.grpc_url, examples, level_s=results["level_s"], grace_s=results["grace_s"],
                unloaded_n=50 if quick else 200, capacity_s=5.0 if quick else 15.0, models=models,
                capacity_model=capacity_model)))
    results["load_end"] = _load()
    results["goals"] = [goal(results, m) for m in models if m != "ensemble"]
    results["goals_answered"] = [goal_answered(results, m) for m in models if m != "ensemble"]
    results["wall_s"] = round(time.monotonic() - started, 1)
    write_kept_outputs(out, "overload", results, render_section(results), OVERLOAD_START, OVERLOAD_END)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.overload",
                                     description=(__doc__ or "").split("\n")[0])
    add_out_argument(parser)
    parser.add_argument("--quick", action="store_true", help="5 s levels and fewer unloaded requests (a smoke run)")
    add_url_argument(parser)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated models to load (default: all of {', '.join(MODELS)})")
    parser.add_argument("--capacity-model", default="router",
                        help="whose closed-loop throughput is 1x (default: router, the router's own capacity; "
                             "ensemble: load relative to the ensemble's capacity)")
    parser.add_argument("--write-repository", type=Path, default=None, metavar="DIR",
                        help="only write the repository this benchmark serves to DIR (to serve it yourself for --url)")
    args = parser.parse_args(argv)
    if args.write_repository:
        shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
        print(f"wrote {make_overload_repository(args.write_repository, shipped)}")
        return 0
    try:
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = sorted(set(models + [args.capacity_model]) - set(MODELS))
        if unknown:
            parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
        print(render_section(run(args.out, quick=args.quick, urls=args.url, models=models,
                                 capacity_model=args.capacity_model)))
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
