"""The soak's report: counts, per-phase latency, recovery times, oversized requests, memory,
and the bounds it is judged by, as a JSON-able dict (:func:`summarize`), Markdown
(:func:`markdown`) and files (:func:`write_report`: ``<out>/soak/report.json`` and
``<out>/soak/report.md``). Latencies are in milliseconds, from sending a request to its
first response (``time.monotonic``); memory in bytes (MB = 2**20 bytes in the text).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from lab.bench.stack import header_line
from lab.soak.ledger import OUTCOMES, Record, error_key
from lab.soak.runner import BROKEN, PHASES
from lab.soak.workload import ACCURATE, FAST, fast_texts, route_model
from orchestrator.tooling.files import write_atomic
from orchestrator.tooling.paths import PROJECT_ROOT

#: The soak's bounds, the numbers the report checks (:func:`goals` says what each one bounds).
KILL_TO_CLASSIFIER_S = 2.0
KILL_TO_HEALTHY_S = 30.0
LATENCY_RATIO = 2.0
RSS_GROWTH_BYTES = 50 * 2**20
OVERSIZED_AT_ONCE_S = 1.0
INVALID_ARG = ("400", "StatusCode.INVALID_ARGUMENT")  # HTTP status, gRPC status code
#: The front door's refusal of a body over its limit (--front-door; docs/guides/front-door.md).
FRONT_DOOR_TOO_LARGE = ("413", "StatusCode.RESOURCE_EXHAUSTED")


def latency_stats(latencies_s: Sequence[float]) -> dict:
    """``{n, p50, p95, p99, max}`` in ms (linear-interpolated percentiles); None values
    when there is nothing to measure."""
    if not len(latencies_s):
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    ms = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {"n": int(ms.size), "p50": round(float(p50), 2), "p95": round(float(p95), 2),
            "p99": round(float(p99), 2), "max": round(float(ms.max()), 2)}


def _group(records: Iterable[Record]) -> dict:
    records = list(records)
    counts = Counter(r.outcome for r in records)
    out = {"sent": len(records), **{k: counts.get(k, 0) for k in OUTCOMES}}
    out["latency_ms"] = latency_stats([r.latency_s for r in records if r.latency_s is not None])
    return out


def totals(records: Sequence[Record]) -> dict:
    """Run totals: sent, answered (200s), correct, wrong, errors, lost, duplicated (a
    second response), mismatched (a response with another request's id), late (a
    response after the client gave up)."""
    counts = Counter(r.outcome for r in records)
    return {
        "sent": len(records),
        "answered": counts["ok"] + counts["wrong"],
        "correct": counts["ok"],
        "wrong": counts["wrong"],
        "errors": counts["error"],
        "lost": counts["lost"],
        "duplicated": sum(1 for r in records if r.responses > 1),
        "mismatched": sum(1 for r in records if r.mismatched_ids),
        "late": sum(1 for r in records if r.outcome == "lost" and r.responses),
        "unanswered": sum(1 for r in records if r.outcome is None),
    }


def phase_table(records: Sequence[Record]) -> Dict[str, dict]:
    """Per phase: all requests, and split by whether they need ``classifier_fast`` /
    ``classifier``; routes seen (text answers by ROUTE)."""
    by_phase: Dict[str, List[Record]] = defaultdict(list)
    for r in records:
        by_phase[r.phase].append(r)
    out = {}
    for phase in [p for p in PHASES if p in by_phase] + sorted(set(by_phase) - set(PHASES)):
        rs = by_phase[phase]
        routes = Counter(x for r in rs for x in (r.routes or ()))
        out[phase] = {
            "broken": BROKEN.get(phase),
            "all": _group(rs),
            "split": {m: {"needs": _group(r for r in rs if m in r.needs), "no": _group(r for r in rs if m not in r.needs)}
                      for m in (FAST, ACCURATE)},
            "routes": dict(routes.most_common()),
        }
    return out


def slowest(records: Sequence[Record], t0: float, n: int = 3) -> Dict[str, List[dict]]:
    """Per phase, the ``n`` slowest answered requests: id, when sent (s after the healthy
    phase began), latency (ms), protocol, route parameter, texts, models needed."""
    out: Dict[str, List[dict]] = {}
    for phase in PHASES:
        rs = sorted((r for r in records if r.phase == phase and r.latency_s is not None), key=lambda r: -r.latency_s)[:n]
        out[phase] = [{"id": r.spec.request_id, "sent_s": round(r.sent - t0, 3), "latency_ms": round(r.latency_s * 1000, 1),
                       "protocol": r.spec.protocol, "route": r.spec.route, "texts": len(r.spec.texts), "needs": sorted(r.needs)}
                      for r in rs]
    return out


def errors_by_message(records: Sequence[Record]) -> List[dict]:
    """Error responses and lost requests grouped by :func:`error_key`, most frequent first."""
    groups: Dict[tuple, dict] = {}
    for r in records:
        if r.outcome not in ("error", "lost"):
            continue
        key = (r.outcome, r.status or "", error_key(r.error or ""))
        g = groups.setdefault(key, {"outcome": r.outcome, "status": r.status, "message": key[2], "count": 0,
                                    "example": (r.error or "")[:500], "phases": Counter()})
        g["count"] += 1
        g["phases"][r.phase] += 1
    out = sorted(groups.values(), key=lambda g: -g["count"])
    for g in out:
        g["phases"] = dict(g["phases"])
    return out


def recovery(records: Sequence[Record], kill_time: Optional[float], pool, margin) -> dict:
    """Seconds from the SIGKILL of the ``classifier_fast`` stub to the first answer from
    ``classifier`` for a text a healthy router answers from ``classifier_fast`` alone
    (``to_classifier_s``), and to the first ``classifier_fast`` answer to a request sent
    after the kill (``to_fast_s``); None when it never happened."""
    if kill_time is None:
        return {"to_classifier_s": None, "to_fast_s": None}

    def needed_fast_got_classifier(r: Record) -> bool:
        return any(route_model(r.routes[pos]) == ACCURATE for pos in fast_texts(r.spec, pool, margin))

    ok = [r for r in records if r.outcome == "ok" and r.done is not None and r.done >= kill_time]
    to_cls = [r.done - kill_time for r in ok if needed_fast_got_classifier(r)]
    to_fast = [r.done - kill_time for r in ok if r.sent >= kill_time and any(route_model(x) == FAST for x in r.routes)]
    return {"to_classifier_s": round(min(to_cls), 3) if to_cls else None,
            "to_fast_s": round(min(to_fast), 3) if to_fast else None}


#: The router-repair goal: at most this many seconds without an answer around a router reload.
ROUTER_REPAIR_S = 3.0


def router_repair(records: Sequence[Record], window: Optional[Sequence[float]]) -> dict:
    """The router reload's downtime, from ``window`` = (the reload sent, the reload returned),
    ``time.monotonic`` seconds. ``first_answer_after_s``: from the reload's return to the
    first successful answer to a request sent after it returned (the repaired router's
    first answer); ``downtime_s``: the longest stretch without any successful answer from
    the reload being sent to that first answer (the gaps between successive answers,
    counted from the reload's sending); ``reload_s``: the reload call's duration;
    ``errors``: error or lost outcomes of requests sent in the window or until that first
    answer. All None without a reload (or without an answer after it)."""
    none = {"reload_s": None, "first_answer_after_s": None, "downtime_s": None, "errors": None}
    if not window:
        return none
    began, returned = float(window[0]), float(window[1])
    after = [r.done for r in records if r.outcome == "ok" and r.done is not None and r.sent >= returned]
    if not after:
        return {**none, "reload_s": round(returned - began, 3)}
    first = min(after)
    answers = sorted(r.done for r in records if r.outcome == "ok" and r.done is not None and began <= r.done <= first)
    marks = [began, *answers]
    gap = max(b - a for a, b in zip(marks, marks[1:])) if len(marks) > 1 else first - began
    errors = sum(1 for r in records if r.outcome in ("error", "lost") and began <= r.sent <= first)
    return {"reload_s": round(returned - began, 3), "first_answer_after_s": round(first - returned, 3),
            "downtime_s": round(gap, 3), "errors": errors}


def oversized_summary(items: Sequence[Mapping], front_door: bool = False) -> dict:
    """The oversized requests: how many, refused with INVALID_ARG (or, through the front
    door, its size refusal), their latency, the messages, and the probes sent while one
    was in flight."""
    refused = INVALID_ARG + (FRONT_DOOR_TOO_LARGE if front_door else ())
    invalid = [o for o in items if o.get("outcome") == "error" and o.get("status") in refused]
    overlapped = [o for o in items if o.get("probe_sent_in_flight")]
    return {
        "sent": len(items),
        "invalid_arg": len(invalid),
        "outcomes": dict(Counter(f"{o.get('outcome')} {o.get('status') or ''}".strip() for o in items)),
        "latency_ms": latency_stats([o["latency_s"] for o in items if o.get("latency_s") is not None]),
        "messages": sorted({error_key(o.get("message") or "") for o in items if o.get("message")})[:5],
        "example_message": next((o["message"] for o in items if o.get("message")), None),
        "probe_latency_ms": latency_stats([o["probe_latency_s"] for o in items if o.get("probe_latency_s") is not None]),
        "probe_in_flight": len(overlapped),
        "probe_in_flight_latency_ms": latency_stats([o["probe_latency_s"] for o in overlapped if o.get("probe_latency_s") is not None]),
        "probe_outcomes": dict(Counter(str(o.get("probe_outcome")) for o in items)),
    }


def _p99(phases: Mapping, phase: str, model: str, which: str = "no") -> Optional[float]:
    return ((phases.get(phase) or {}).get("split", {}).get(model, {}).get(which, {}).get("latency_ms") or {}).get("p99")


def goals(summary: Mapping) -> List[dict]:
    """The soak's bounds (:data:`KILL_TO_CLASSIFIER_S` and after), each ``{goal, measured, bound, met}`` (``met`` None:
    not measured in this run)."""
    t, phases, rec, over, rss = summary["totals"], summary["phases"], summary["recovery"], summary["oversized"], summary["rss"]
    bad = {k: t[k] for k in ("lost", "duplicated", "mismatched", "wrong")}
    healthy, killed = _p99(phases, "healthy", FAST), _p99(phases, "stub_killed", FAST)
    ratio = killed / healthy if healthy and killed is not None else None
    growth = (rss["after_bytes"] - rss["before_bytes"]) if rss.get("after_bytes") and rss.get("before_bytes") else None
    healthy_all = ((phases.get("healthy") or {}).get("all", {}).get("latency_ms") or {}).get("p99")
    probe_max = over["probe_in_flight_latency_ms"]["max"]

    def at_most(x, bound):
        return None if x is None else x <= bound

    repair = summary.get("router_repair") or {}
    out = [
        {"goal": "0 lost, duplicated, mismatched or wrong answers through every fault",
         "measured": ", ".join(f"{k} {v}" for k, v in bad.items()), "bound": "0 each", "met": not any(bad.values()),
         "gates": True},  # the only bound that fails the run (`failed`); the others are advisory
        {"goal": "classifier_fast stub killed: p99 of requests that do not need it within 2x of the healthy phase",
         "measured": None if ratio is None else f"{ratio:.2f}x ({killed:.0f} ms vs {healthy:.0f} ms)",
         "bound": f"<= {LATENCY_RATIO:g}x", "met": at_most(ratio, LATENCY_RATIO)},
        {"goal": "texts that need classifier_fast answered by classifier after the kill",
         "measured": None if rec["to_classifier_s"] is None else f"{rec['to_classifier_s']:.2f} s",
         "bound": f"<= {KILL_TO_CLASSIFIER_S:g} s", "met": at_most(rec["to_classifier_s"], KILL_TO_CLASSIFIER_S)},
        {"goal": "classifier_fast answers again without an operator",
         "measured": None if rec["to_fast_s"] is None else f"{rec['to_fast_s']:.2f} s",
         "bound": f"<= {KILL_TO_HEALTHY_S:g} s", "met": at_most(rec["to_fast_s"], KILL_TO_HEALTHY_S)},
        {"goal": "every kill healed by a new stub process, `classifier_fast` answering again (slowest heal)",
         "measured": _heals_measured(rec.get("heals") or []),
         "bound": f"<= {KILL_TO_HEALTHY_S:g} s each",
         "met": None if not rec.get("heals") else all(h.get("new_pid") and h.get("fast_after_s") is not None
                                                       and h["fast_after_s"] <= KILL_TO_HEALTHY_S for h in rec["heals"])},
        {"goal": "an 8 MiB text refused at once with INVALID_ARG",
         "measured": f"{over['invalid_arg']}/{over['sent']} INVALID_ARG, slowest {over['latency_ms']['max']} ms",
         "bound": f"all, <= {OVERSIZED_AT_ONCE_S * 1000:g} ms",
         "met": None if not over["sent"] else over["invalid_arg"] == over["sent"]
         and (over["latency_ms"]["max"] or 0) <= OVERSIZED_AT_ONCE_S * 1000},
        {"goal": f"router RSS after {over['sent']} oversized requests within 50 MB of before",
         "measured": None if growth is None else f"{growth / 2**20:+.1f} MB", "bound": "<= +50 MB",
         "met": at_most(growth, RSS_GROWTH_BYTES)},
        {"goal": "a request sent while an oversized one is in flight is not delayed (slowest within 2x the healthy p99)",
         "measured": None if probe_max is None or not healthy_all else f"{probe_max:.0f} ms vs healthy p99 {healthy_all:.0f} ms",
         "bound": f"<= {LATENCY_RATIO:g}x",
         "met": None if probe_max is None or not healthy_all else probe_max <= LATENCY_RATIO * healthy_all},
        {"goal": "router reloaded: the longest stretch without an answer, until the reloaded router's first answer",
         "measured": None if repair.get("downtime_s") is None else
         f"{repair['downtime_s']:.2f} s (first answer {repair['first_answer_after_s']:.2f} s after the "
         f"{repair['reload_s']:.2f} s reload returned, {repair['errors']} errors)",
         "bound": f"<= {ROUTER_REPAIR_S:g} s", "met": at_most(repair.get("downtime_s"), ROUTER_REPAIR_S)},
    ]
    return out


def _heals_measured(heals: Sequence[Mapping]) -> Optional[str]:
    if not heals:
        return None
    done = [h["fast_after_s"] for h in heals if h.get("new_pid") and h.get("fast_after_s") is not None]
    return f"{len(done)}/{len(heals)} healed" + (f", slowest {max(done):.2f} s" if done else "")


def _git_revision() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def summarize(result: Mapping, command: str = "python -m lab.soak") -> dict:
    """The report of one :func:`~lab.soak.runner.run_soak` result (JSON-able)."""
    records: List[Record] = result["records"]
    pool = result["pool"]
    summary = {
        "command": command,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "duration_s": round(result["duration_s"], 1),
        "machine": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
                    "python": platform.python_version(), "platform": platform.platform(), "code": _git_revision()},
        "config": result["config"],
        "models": result.get("models"),
        "cascade_margin": result.get("margin"),
        "pool": pool.summary(),
        "totals": totals(records),
        "by_protocol": {p: totals([r for r in records if r.spec.protocol == p]) for p in ("http", "grpc")},
        "phases": phase_table(records),
        "errors": errors_by_message(records),
        "slowest": slowest(records, result.get("t0", 0.0)),
        "wrong_examples": [{"request_id": r.spec.request_id, "phase": r.phase, "problems": r.problems[:3]}
                           for r in records if r.outcome == "wrong"][:10],
        "mismatched_examples": [{"request_id": r.spec.request_id, "carried": r.mismatched_ids[:3]}
                                for r in records if r.mismatched_ids][:10],
        "recovery": {**recovery(records, result.get("kill_time"), pool, result.get("margin")),
                     "new_stub": result.get("new_stub"), "heals": list(result.get("heals") or [])},
        "router_repair": router_repair(records, result.get("reload_window")),
        "oversized": oversized_summary(result.get("oversized") or [], bool((result.get("config") or {}).get("front_door"))),
        "rss": dict(result.get("rss") or {}),
        "events": result["events"],
        "skipped": result.get("skipped") or [],
        "not_run": dict(result.get("not_run") or {}),
        "stack": result.get("stack"),
        "server_log": result.get("server_log"),
    }
    summary["goals"] = goals(summary)
    summary["failed"] = failed(summary)
    return summary


def failed(summary: Mapping) -> List[str]:
    """Why the run fails (empty: it passes): lost, duplicated, mismatched or wrong
    responses, and requests that never got an outcome."""
    t = summary["totals"]
    return [f"{t[k]} {k}" for k in ("lost", "duplicated", "mismatched", "wrong", "unanswered") if t[k]]


# ----------------------------------------------------------------------------- Markdown


def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _phase_lines(summary: Mapping) -> List[str]:
    lines = ["## Latency by phase (ms)", "",
             "A request belongs to the phase in which it was sent; *needs X*: a healthy router calls model X for it.", "",
             _row("phase", "requests", "sent", "ok", "errors", "lost", "wrong", "p50", "p95", "p99", "max"),
             _row("---", "---", *["---:"] * 9)]
    for phase, p in summary["phases"].items():
        groups = [("all", p["all"])]
        split = [FAST, ACCURATE] if phase == "healthy" else [m for m in (p["broken"],) if m in (FAST, ACCURATE)]
        for model in split:
            groups += [(f"needs {model}", p["split"][model]["needs"]), (f"no {model}", p["split"][model]["no"])]
        for name, g in groups:
            lat = g["latency_ms"]
            lines.append(_row(phase, name, g["sent"], g["ok"], g["error"], g["lost"], g["wrong"],
                              _ms(lat["p50"]), _ms(lat["p95"]), _ms(lat["p99"]), _ms(lat["max"])))
    lines += ["", "Routes answered per phase (texts):", ""]
    lines += [f"- {phase}: " + ", ".join(f"`{k}` {v}" for k, v in p["routes"].items()) for phase, p in summary["phases"].items()]
    return lines + [""]


def _fault_lines(summary: Mapping) -> List[str]:
    rec, over, rss, cfg = summary["recovery"], summary["oversized"], summary["rss"], summary["config"]
    probe = over["probe_in_flight_latency_ms"]
    return ["## Stub kill, oversized texts, memory", "",
            f"- SIGKILL of the `classifier_fast` stub -> first `classifier` answer for a text that needed `classifier_fast`: "
            f"{_sec(rec['to_classifier_s'])}; -> `classifier_fast` answering again: {_sec(rec['to_fast_s'])}; "
            f"new stub process: {rec['new_stub'] or 'none seen'}.",
            *[f"- Kill {h['kill']} at {h['at_s']:.1f} s (stub {h['pid']}): new stub process "
              f"{h['new_pid'] or 'none'} after {_sec(h['new_stub_after_s'])}, `classifier_fast` answering again after "
              f"{_sec(h['fast_after_s'])}." for h in rec.get("heals") or []],
            f"- {over['sent']} oversized requests ({cfg['oversized_bytes']} bytes, one text): {over['outcomes']}; latency p50 "
            f"{_ms(over['latency_ms']['p50'])} ms, max {_ms(over['latency_ms']['max'])} ms. Message: `{over['example_message']}`",
            f"- Probe requests (one short text) sent while an oversized one was in flight: {over['probe_in_flight']}, "
            f"p50 {_ms(probe['p50'])} ms, max {_ms(probe['max'])} ms (all probes: {over['probe_outcomes']}).",
            f"- Router stub RSS: {_mb(rss.get('before_bytes'))} before, {_mb(rss.get('after_bytes'))} after "
            f"(pid {rss.get('pid')}, after: {rss.get('pid_after')}).", ""]


def _problem_lines(summary: Mapping) -> List[str]:
    lines: List[str] = []
    if summary["errors"]:
        lines += ["## Errors and lost requests by message", "", _row("outcome", "status", "count", "phases", "message"),
                  _row("---", "---", "---:", "---", "---")]
        lines += [_row(e["outcome"], e["status"] or "-", e["count"], ", ".join(f"{k} {v}" for k, v in e["phases"].items()),
                       e["message"].replace("|", "\\|")) for e in summary["errors"]]
        lines.append("")
    if summary["wrong_examples"]:
        lines += ["## Wrong answers (first ones)", ""]
        lines += [f"- `{w['request_id']}` ({w['phase']}): {'; '.join(w['problems'])}" for w in summary["wrong_examples"]] + [""]
    return lines


def _timeline_lines(summary: Mapping) -> List[str]:
    lines = ["## Slowest requests per phase", "",
             _row("phase", "request", "sent (s)", "latency (ms)", "protocol", "route", "texts", "needs"),
             _row("---", "---", "---:", "---:", "---", "---", "---:", "---")]
    for phase, rows in summary.get("slowest", {}).items():
        lines += [_row(phase, x["id"], f"{x['sent_s']:.2f}", x["latency_ms"], x["protocol"], x["route"] or "cascade",
                       x["texts"], ", ".join(x["needs"]) or "-") for x in rows]
    lines += ["", "## Timeline", "", "Seconds since the healthy phase began; the wall clock (local time) matches the server log.", "",
              _row("t (s)", "wall clock", "event"), _row("---:", "---", "---")]
    for e in summary["events"]:
        detail = {k: v for k, v in e.items() if k not in ("t_s", "wall", "event")}
        lines.append(_row(f"{e['t_s']:.2f}", e.get("wall", "-"), e["event"] + (f" {detail}" if detail else "")))
    if summary["skipped"]:
        lines += ["", f"Skipped (time bound reached): {', '.join(summary['skipped'])}."]
    for name, reason in (summary.get("not_run") or {}).items():
        lines += ["", f"Not run: {name} ({reason})."]
    return lines


def markdown(summary: Mapping) -> str:
    """The report as Markdown (the tables of docs/results/reliability.md come from it)."""
    t, cfg, machine = summary["totals"], summary["config"], summary["machine"]
    lines = [
        "# Fault-injection soak report",
        "",
        f"Generated by `{summary['command']}` on {summary['date_utc']} (UTC), {summary['duration_s']} s; "
        f"code {machine['code']}, {machine['cpus']} CPUs, load average "
        f"{', '.join(map(str, machine['loadavg']))} at the end, Python {machine['python']}. "
        f"{cfg['http_threads']} HTTP + {cfg['grpc_threads']} gRPC client threads, client timeout {cfg['client_timeout_s']:g} s; "
        f"texts: {summary['pool']}; 1-{cfg['mix']['max_texts']} texts a request. What the soak does: docs/results/reliability.md.",
        "",
        header_line(summary.get("stack")),
        "",
        "## Totals",
        "",
        _row("sent", "answered", "correct", "wrong", "errors", "lost", "duplicated", "mismatched"),
        _row(*["---:"] * 8),
        _row(t["sent"], t["answered"], t["correct"], t["wrong"], t["errors"], t["lost"], t["duplicated"], t["mismatched"]),
        "",
        "## Bounds",
        "",
        _row("goal", "measured", "bound", ""),
        _row("---", "---", "---", "---"),
    ]
    for g in summary["goals"]:
        verdict = "not measured" if g["met"] is None else "**met**" if g["met"] else "**not met**"
        verdict += "" if g.get("gates") else " (advisory)"
        lines.append(_row(g["goal"], g["measured"] or "-", g["bound"], verdict))
    lines += [""] + _phase_lines(summary) + _fault_lines(summary) + _problem_lines(summary) + _timeline_lines(summary)
    lines += ["", f"Result: {'FAILED: ' + ', '.join(summary['failed']) if summary['failed'] else 'passed'}.", ""]
    return "\n".join(lines)


def _sec(x) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _mb(x) -> str:
    return "-" if not x else f"{x / 2**20:.1f} MB"


def write_report(summary: Mapping, out: Path) -> Dict[str, Path]:
    """Write ``<out>/soak/report.json`` and ``<out>/soak/report.md``; returns their paths."""
    target = Path(out) / "soak"
    target.mkdir(parents=True, exist_ok=True)
    paths = {"json": target / "report.json", "md": target / "report.md"}
    write_atomic(paths["json"], (json.dumps(summary, indent=1, default=str) + "\n").encode(), 0o644)
    write_atomic(paths["md"], markdown(summary).encode(), 0o644)
    return paths


def print_summary(summary: Mapping, stream=None) -> None:
    """The numbers on ``stream`` (default stdout): totals, bounds, per-phase p99."""
    stream = stream or sys.stdout
    t = summary["totals"]
    names = ("sent", "answered", "correct", "wrong", "errors", "lost", "duplicated", "mismatched")
    print("soak: " + ", ".join(f"{k} {t[k]}" for k in names), file=stream)
    for e in summary["errors"][:8]:
        print(f"  {e['outcome']} x{e['count']} [{e['status']}] {e['message'][:160]}", file=stream)
    for phase, p in summary["phases"].items():
        lat = p["all"]["latency_ms"]
        print(f"  {phase:20s} sent {p['all']['sent']:6d}  p50 {_ms(lat['p50']):>8s} ms  p99 {_ms(lat['p99']):>8s} ms", file=stream)
    for g in summary["goals"]:
        mark = "n/a " if g["met"] is None else "met " if g["met"] else "MISS"
        kind = "gate" if g.get("gates") else "advisory"
        print(f"  [{mark}] ({kind}) {g['goal']}: {g['measured'] or '-'} (bound {g['bound']})", file=stream)
    print("  (gate: fails the run; advisory: timing bounds reported, never failing it: latency on a shared machine "
          "varies, docs/results/reliability.md)", file=stream)
    for name, reason in (summary.get("not_run") or {}).items():
        print(f"  not run: {name} ({reason})", file=stream)
    print("soak " + ("FAILED: " + ", ".join(summary["failed"]) if summary["failed"] else "passed"), file=stream, flush=True)
