"""An hour of memory: ``make soak-memory`` / ``python -m lab.soak.memory``.

Starts its own embedded server the way the fault-injection soak does (a read-only,
compiled copy of the model repository, the control plane restricted as in the image:
:func:`lab.soak.runner.run_soak`), drives the soak's mixed workload with
no faults (HTTP and gRPC client threads, the cascade, ``route=fast``/``accurate``, long
chunked texts, empty texts; :mod:`~lab.soak.workload`) plus one bad
request every ``bad_every_s`` seconds (a threshold out of [0, 1], a NaN threshold, a text
that is not UTF-8, an unknown parameter: each must get an error response), and every
``interval_s`` seconds samples:

- RSS (``VmRSS``) and PSS (``/proc/<pid>/smaps_rollup``) of every Python-backend stub
  process of that server (children of its pid whose command line is a model instance's
  stub, :func:`orchestrator.runtime.bls.stubs.parse_stub_argv`), by instance name;
- RSS and PSS of ``tritonserver`` itself;
- the ``/dev/shm`` files of that server (the shared-memory regions named in its stubs'
  command lines and every ``/dev/shm`` file mapped by the server or a stub): total size
  (``st_size``) and allocated bytes (``st_blocks``); the machine's ``/dev/shm`` use is
  recorded too, not judged (other servers share it);
- requests answered, errors, and the load average.

After the warm-up, a least-squares line (``numpy.polyfit``) per series gives its slope in
MiB per 10 minutes; :data:`BOUNDS` says which slopes fail the run (hard) and which are
only reported (advisory). The run also fails on any lost, duplicated, mismatched or wrong
response (the soak's ledger), an error to a good request, a bad request answered 200, or a
stub that was restarted (a new pid resets its RSS and would hide growth).

Writes ``memory.json`` and ``memory.png`` under ``.cache/soak-memory/`` (``--out docs/results``:
``docs/results/soak/memory.{json,png}``). Exit status 0 pass, 1 fail, 2 could not run.
docs/results/reliability.md ("An hour of memory") holds a run and the reasons for the bounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from lab.soak import procs
from orchestrator.runtime.bls.stubs import parse_stub_argv
from orchestrator.tooling.errors import ToolingError

MIB = 1024 * 1024
SHM_ROOT = "/dev/shm"
#: Slopes are reported in MiB per this many seconds (10 minutes).
SLOPE_UNIT_S = 600.0


@dataclass(frozen=True)
class Bound:
    """A series' limit after warm-up: ``slope_mib`` MiB per 10 minutes (least squares) and,
    when set, ``growth_mib`` MiB of net growth (last sample minus the first after warm-up).
    ``hard``: exceeding it fails the run; otherwise it is reported only."""

    slope_mib: float
    growth_mib: Optional[float] = None
    hard: bool = True


#: Series kind -> bound (docs/results/reliability.md, "An hour of memory", says why these).
BOUNDS: Dict[str, Bound] = {
    "stub_rss": Bound(2.0),
    "stub_pss": Bound(2.0, hard=False),
    "triton_rss": Bound(5.0),
    "triton_pss": Bound(5.0, hard=False),
    "shm_size": Bound(1.0, growth_mib=2.0),
    "shm_allocated": Bound(1.0, growth_mib=2.0, hard=False),
}
#: Tries at the healthy reference answers before the run gives up.
REFERENCE_TRIES = 3
#: Fewer samples than this after warm-up cannot be judged (a hard series then fails).
MIN_POINTS = 3


@dataclass(frozen=True)
class MemoryConfig:
    """The run: ``minutes`` of traffic, a sample every ``interval_s`` seconds, the first
    ``warmup_minutes`` not judged; ``threads`` client threads per protocol (HTTP and gRPC;
    2 + 2 = concurrency 4); a bad request every ``bad_every_s`` seconds."""

    minutes: float = 60.0
    interval_s: float = 60.0
    warmup_minutes: float = 10.0
    threads: int = 2
    bad_every_s: float = 2.0
    client_timeout_s: float = 30.0
    n_short: int = 400
    n_long: int = 40
    seed: int = 0


# ----------------------------------------------------------------------------- sampling


def _kib_field(path: str, key: str) -> Optional[int]:
    """``key:`` of a ``/proc`` status-like file, in bytes; None when absent/unreadable."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def pss_bytes(pid: int, proc: str = "/proc") -> Optional[int]:
    """Proportional set size of ``pid`` in bytes (``Pss`` of ``smaps_rollup``, Linux 4.14+:
    shared pages divided among the processes mapping them); None when unreadable."""
    return _kib_field(f"{proc}/{pid}/smaps_rollup", "Pss")


def mapped_files(pid: int, root: str = SHM_ROOT, proc: str = "/proc") -> List[str]:
    """The files under ``root`` that ``pid`` maps (``/proc/<pid>/maps``), sorted, no
    duplicates; [] when unreadable. A deleted file (`` (deleted)``) is left out."""
    prefix = root.rstrip("/") + "/"
    found = set()
    try:
        with open(f"{proc}/{pid}/maps") as fh:
            for line in fh:
                parts = line.rstrip("\n").split(None, 5)
                if len(parts) == 6 and parts[5].startswith(prefix) and not parts[5].endswith(" (deleted)"):
                    found.add(parts[5])
    except OSError:
        return []
    return sorted(found)


def files_usage(paths: Iterable[str]) -> Tuple[int, int, int]:
    """``(files, total size, allocated bytes)`` of the existing files among ``paths``
    (``st_size``; ``st_blocks`` * 512, what a tmpfs file actually holds)."""
    count = size = allocated = 0
    for path in set(paths):
        try:
            st = os.stat(path)
        except OSError:
            continue
        count += 1
        size += st.st_size
        allocated += st.st_blocks * 512
    return count, size, allocated


def stub_region(argv: Sequence[str], root: str = SHM_ROOT) -> Optional[str]:
    """The ``/dev/shm`` file of a stub's shared-memory region (its second argument, a
    POSIX shm name such as ``/triton_python_backend_shm_region_...``); None if absent."""
    if len(argv) < 3 or not argv[2]:
        return None
    return os.path.join(root, argv[2].lstrip("/"))


def server_stubs(server_pid: int) -> Dict[str, procs.Proc]:
    """Instance name -> the live stub process of that model instance among the children
    of ``server_pid`` (the newest when a reload left two)."""
    out: Dict[str, procs.Proc] = {}
    for p in procs.children(server_pid):
        parsed = parse_stub_argv(p.argv)
        if parsed is None or p.state == "Z":
            continue
        old = out.get(parsed[1])
        if old is None or (p.start, p.pid) > (old.start, old.pid):
            out[parsed[1]] = p
    return out


def left_behind(samples: List[dict]) -> List[str]:
    """The ``/dev/shm`` files seen in ``samples`` that still exist (call it once the
    server has stopped: python_backend removes its regions on a clean shutdown; a server
    that aborts leaves them, and a container restart in the same pod keeps ``/dev/shm``)."""
    seen = {path for s in samples for path in s["shm"].get("paths", ())}
    return sorted(path for path in seen if os.path.exists(path))


def shm_used_bytes(root: str = SHM_ROOT) -> Optional[int]:
    """Bytes used on the file system of ``root`` (``statvfs``); None when unreadable."""
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def sample(server_pid: int, root: str = SHM_ROOT) -> dict:
    """One sample of the server's memory (see the module doc); bytes."""
    stubs = server_stubs(server_pid)
    shm_paths = set(mapped_files(server_pid, root))
    stub_rows = {}
    for name, p in sorted(stubs.items()):
        stub_rows[name] = {"pid": p.pid, "rss": procs.rss_bytes(p.pid), "pss": pss_bytes(p.pid)}
        shm_paths.update(mapped_files(p.pid, root))
        region = stub_region(p.argv, root)
        if region is not None:
            shm_paths.add(region)
    files, size, allocated = files_usage(shm_paths)
    return {
        "stubs": stub_rows,
        "triton": {"pid": server_pid, "rss": procs.rss_bytes(server_pid), "pss": pss_bytes(server_pid)},
        "shm": {"files": files, "size": size, "allocated": allocated, "machine_used": shm_used_bytes(root),
                "paths": sorted(shm_paths)},
        "loadavg": list(os.getloadavg()),
    }


# ----------------------------------------------------------------------------- judgement


def fit_slope(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` over ``times_s`` (units per second)."""
    t = np.asarray(times_s, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    return float(np.polyfit(t - t[0], v, 1)[0])


def judge(times_s: Sequence[float], values_bytes: Sequence[Optional[float]], warmup_s: float, bound: Bound) -> dict:
    """The verdict on one series (bytes at ``times_s`` seconds from the start; a None
    value, an unreadable sample, is left out): its samples from ``warmup_s`` on are
    fitted; ``slope_mib_per_10min``, ``growth_mib`` (last minus first after warm-up),
    ``points``, and ``ok`` (None when fewer than :data:`MIN_POINTS` points remain)."""
    pts = [(t, v) for t, v in zip(times_s, values_bytes) if t >= warmup_s and v is not None]
    out: dict = {"points": len(pts), "bound_slope_mib_per_10min": bound.slope_mib,
                 "bound_growth_mib": bound.growth_mib, "hard": bound.hard}
    if len(pts) < MIN_POINTS:
        return {**out, "slope_mib_per_10min": None, "growth_mib": None, "ok": None}
    ts, vs = zip(*pts)
    slope = fit_slope(ts, vs) * SLOPE_UNIT_S / MIB
    growth = (vs[-1] - vs[0]) / MIB
    ok = slope <= bound.slope_mib and (bound.growth_mib is None or growth <= bound.growth_mib)
    return {**out, "slope_mib_per_10min": round(slope, 4), "growth_mib": round(growth, 4),
            "first_mib": round(vs[0] / MIB, 3), "last_mib": round(vs[-1] / MIB, 3), "ok": bool(ok)}


def series(samples: List[dict]) -> Dict[str, Tuple[str, List[Optional[float]]]]:
    """Series name -> (bound kind, values in bytes, one per sample). A stub's series holds
    a value only while its pid is the one first seen (a restart is judged separately)."""
    out: Dict[str, Tuple[str, List[Optional[float]]]] = {}
    names = sorted({name for s in samples for name in s["stubs"]})
    for name in names:
        first_pid = next(s["stubs"][name]["pid"] for s in samples if name in s["stubs"])
        for key in ("rss", "pss"):
            out[f"stub {name} {key}"] = (f"stub_{key}", [
                s["stubs"][name][key] if name in s["stubs"] and s["stubs"][name]["pid"] == first_pid else None
                for s in samples])
    for key in ("rss", "pss"):
        out[f"tritonserver {key}"] = (f"triton_{key}", [s["triton"][key] for s in samples])
    out["/dev/shm size"] = ("shm_size", [s["shm"]["size"] for s in samples])
    out["/dev/shm allocated"] = ("shm_allocated", [s["shm"]["allocated"] for s in samples])
    return out


def restarts(samples: List[dict]) -> Dict[str, List[int]]:
    """Instance name -> the pids its stub had, for instances that had more than one."""
    pids: Dict[str, List[int]] = {}
    for s in samples:
        for name, row in s["stubs"].items():
            seen = pids.setdefault(name, [])
            if not seen or seen[-1] != row["pid"]:
                seen.append(row["pid"])
    return {k: v for k, v in pids.items() if len(v) > 1}


def verdict(samples: List[dict], warmup_s: float, bounds: Dict[str, Bound] = BOUNDS) -> dict:
    """Every series judged (:func:`judge`), and ``failures``: hard series over their
    bound or with too few points, and stub restarts. ``samples`` carry ``t_s``."""
    times = [s["t_s"] for s in samples]
    judged = {}
    failures = []
    for name, (kind, values) in series(samples).items():
        j = judge(times, values, warmup_s, bounds[kind])
        judged[name] = {"kind": kind, **j}
        if j["hard"] and j["ok"] is not True:
            why = "too few samples after warm-up" if j["ok"] is None else (
                f"slope {j['slope_mib_per_10min']:+.3f} MiB/10 min, growth {j['growth_mib']:+.3f} MiB")
            failures.append(f"{name}: {why} (bound {bounds[kind].slope_mib} MiB/10 min"
                            + (f", {bounds[kind].growth_mib} MiB growth)" if bounds[kind].growth_mib is not None else ")"))
    for name, pids in restarts(samples).items():
        failures.append(f"stub {name} restarted: pids {pids}")
    if not samples or not samples[-1]["stubs"]:
        failures.append("no stub process found")
    return {"series": judged, "restarts": restarts(samples), "failures": failures}


# ----------------------------------------------------------------------------- traffic

#: The bad requests (kind -> what is wrong); each must get an error response.
BAD_KINDS = ("threshold_out_of_range", "threshold_nan", "text_not_utf8", "unknown_parameter")


def bad_request(kind: str, protocol: str, text: bytes) -> Tuple[list, Optional[dict]]:
    """``(inputs, parameters)`` of a bad request of ``kind`` (:data:`BAD_KINDS`)."""
    from lab.soak.clients import make_inputs

    if kind == "threshold_out_of_range":
        return make_inputs(protocol, [text], [1.5]), None
    if kind == "threshold_nan":
        return make_inputs(protocol, [text], [math.nan]), None
    if kind == "text_not_utf8":
        return make_inputs(protocol, [b"\xff\xfe bad \xc3"], [0.5]), None
    if kind == "unknown_parameter":
        return make_inputs(protocol, [text], [0.5]), {"no_such_parameter": "1"}
    raise ValueError(f"bad request kind {kind!r}: expected one of {BAD_KINDS}")


class MemorySoak:
    """Traffic and sampling against a started server (``server``: a
    :class:`~orchestrator.tooling.server.TritonServer`), using a
    :class:`~lab.soak.runner.Soak` for the good requests and its ledger."""

    def __init__(self, server, config: MemoryConfig, pool, margin, log: Callable[[str], None] = print) -> None:
        from lab.soak.runner import Soak, SoakConfig

        self.config, self.server, self.log = config, server, log
        self.soak = Soak(server, SoakConfig(http_threads=config.threads, grpc_threads=config.threads,
                                            max_duration_s=config.minutes * 60.0 + 5.0, max_requests=10**9,
                                            client_timeout_s=config.client_timeout_s, seed=config.seed),
                         pool, margin, log=lambda line: None)
        self.soak.phase = "memory"
        self.bad_ids: List[str] = []
        self.samples: List[dict] = []

    def _bad_worker(self) -> None:
        from lab.soak.clients import Client, result_fields
        from lab.soak.ledger import Record
        from lab.soak.workload import RequestSpec

        soak, cfg = self.soak, self.config
        rng = random.Random(f"{cfg.seed}-bad")
        clients = {p: Client(p, self.server.http_url if p == "http" else self.server.grpc_url, cfg.client_timeout_s)
                   for p in ("http", "grpc")}
        short = soak.pool.indices("short")
        n = 0
        try:
            while not soak.stop.is_set() and time.monotonic() < soak.deadline:
                n += 1
                kind, protocol = BAD_KINDS[n % len(BAD_KINDS)], ("http", "grpc")[(n // len(BAD_KINDS)) % 2]
                rid = f"memory-bad-{kind}-{n}"
                idx = rng.choice(short)
                spec = RequestSpec(rid, (idx,), (0.5,), None, protocol)
                soak.ledger.add(Record(spec, "bad", frozenset(), time.monotonic()))
                self.bad_ids.append(rid)
                inputs, params = bad_request(kind, protocol, soak.pool.texts[idx].encode("utf-8"))

                def on_result(result, t, rid=rid, protocol=protocol):
                    carried, _, _, routes = result_fields(protocol, result)
                    soak.ledger.answer(rid, carried, t, ["a bad request was answered 200"], routes)

                clients[protocol].send(rid, inputs, params, on_result,
                                       lambda status, message, t, rid=rid: soak.ledger.fail(rid, rid, t, status, message),
                                       lambda reason, rid=rid: soak.ledger.lose(rid, reason))
                soak._sleep(cfg.bad_every_s)
        finally:
            for c in clients.values():
                c.close()

    def counts(self) -> dict:
        """Requests by outcome (good and bad apart), duplicated and mismatched responses."""
        bad = set(self.bad_ids)
        out = {"good": {k: 0 for k in ("sent", "ok", "wrong", "error", "lost", "pending")},
               "bad": {k: 0 for k in ("sent", "ok", "wrong", "error", "lost", "pending")},
               "duplicated": 0, "mismatched": 0, "errors_by_message": {}}
        from lab.soak.ledger import error_key

        for rec in self.soak.ledger.snapshot():
            side = out["bad" if rec.spec.request_id in bad else "good"]
            side["sent"] += 1
            side[rec.outcome or "pending"] += 1
            out["duplicated"] += rec.responses > 1
            out["mismatched"] += bool(rec.mismatched_ids)
            if rec.outcome == "error":
                key = ("bad: " if rec.spec.request_id in bad else "good: ") + error_key(rec.error or "")
                out["errors_by_message"][key] = out["errors_by_message"].get(key, 0) + 1
        return out

    def take_sample(self) -> dict:
        s = sample(self.server.pid)
        c = self.counts()
        s.update(t_s=round(time.monotonic() - self.soak.t0, 3),
                 wall=time.strftime("%H:%M:%S", time.gmtime()),
                 answered=c["good"]["ok"] + c["good"]["wrong"] + c["good"]["error"] + c["bad"]["error"] + c["bad"]["ok"],
                 errors=c["good"]["error"] + c["bad"]["error"], sent=c["good"]["sent"] + c["bad"]["sent"])
        self.samples.append(s)
        rss = {k: round((v["rss"] or 0) / MIB, 1) for k, v in s["stubs"].items()}
        self.log(f"[memory {s['t_s'] / 60:6.2f} min] answered {s['answered']} errors {s['errors']} "
                 f"triton {((s['triton']['rss'] or 0) / MIB):.1f} MiB shm {s['shm']['size'] / MIB:.1f} MiB "
                 f"({s['shm']['files']} files) stubs MiB {rss} load {s['loadavg'][0]:.2f}")
        return s

    def run(self) -> dict:
        cfg, soak = self.config, self.soak
        end = soak.t0 + cfg.minutes * 60.0
        soak.deadline = end
        threads = [threading.Thread(target=soak.worker, args=(i, "http" if i < cfg.threads else "grpc"),
                                    name=f"memory-{i}", daemon=True) for i in range(2 * cfg.threads)]
        threads.append(threading.Thread(target=self._bad_worker, name="memory-bad", daemon=True))
        for t in threads:
            t.start()
        try:
            self.take_sample()
            next_at = soak.t0 + cfg.interval_s
            while next_at <= end + 1e-6:
                while time.monotonic() < next_at:
                    time.sleep(min(0.5, max(0.0, next_at - time.monotonic())))
                if not self.server.running:
                    raise ToolingError(f"tritonserver exited (code {self.server.returncode}); log: {self.server.log_path}")
                self.take_sample()
                next_at += cfg.interval_s
        finally:
            soak.stop.set()
            for t in threads:
                t.join(cfg.client_timeout_s + 15.0)
        return {"samples": self.samples, "counts": self.counts(), "duration_s": time.monotonic() - soak.t0}


def run_memory(config: MemoryConfig, source_repository: Optional[Path] = None,
               log: Callable[[str], None] = print) -> dict:
    """Start a server like the soak (:func:`~lab.soak.runner.run_soak`),
    compute the healthy references, run :class:`MemorySoak`, stop the server; returns its
    result plus ``models``, ``pool`` summary and ``server_log``."""
    import tempfile

    import yaml

    from lab.soak.runner import SoakError, copy_repository, models_to_load, reference_sender
    from lab.soak.workload import build_pool, cascade_margin, chunk_stops_early, compute_references
    from orchestrator.tooling import production
    from orchestrator.tooling.paths import default_model_repository
    from orchestrator.tooling.server import TritonServer

    source = Path(source_repository or default_model_repository())
    with tempfile.TemporaryDirectory(prefix="soak-memory-") as tmp:
        repo = production.freeze(copy_repository(source, Path(tmp) / "model_repository"))
        try:
            policy = yaml.safe_load((repo / "router" / "policy.yaml").read_text())
            pool = build_pool(config.n_short, config.n_long, seed=config.seed)
            pool.early_stopping = chunk_stops_early(policy)
            models = models_to_load(policy)
            server = TritonServer(repo, models=models, control_key=production.new_key())
            log(f"[memory] starting tritonserver on a read-only, compiled copy of {source} (models: {', '.join(models)})")
            server.start()
            try:
                reference_failures = []
                for _attempt in range(REFERENCE_TRIES):
                    send, client = reference_sender(server)
                    try:
                        compute_references(send, pool)
                        break
                    except RuntimeError as exc:
                        # a classifier call that times out on a loaded machine degrades one answer
                        reference_failures.append(str(exc))
                        log(f"[memory] healthy reference failed ({exc}); trying again")
                    finally:
                        client.close()
                else:
                    raise SoakError(f"no healthy reference in {REFERENCE_TRIES} tries: {reference_failures}")
                log(f"[memory] healthy reference for {len(pool.references)} texts; pool {pool.summary()}; "
                    f"{config.minutes:g} min, a sample every {config.interval_s:g} s, warm-up {config.warmup_minutes:g} min")
                result = MemorySoak(server, config, pool, cascade_margin(policy), log).run()
            finally:
                server.stop()
        finally:
            production.thaw(repo)
    result["shm_left_after_stop"] = left_behind(result.get("samples", []))
    result.update(models=models, pool=pool.summary(), server_log=str(server.log_path),
                  reference_failures=reference_failures)
    return result


# ----------------------------------------------------------------------------- report


def summarize(result: dict, config: MemoryConfig, command: str) -> dict:
    """The JSON report: config, bounds, samples, the verdict and the pass/fail."""
    samples = result["samples"]
    judged = verdict(samples, config.warmup_minutes * 60.0)
    counts = result["counts"]
    failures = list(judged["failures"])
    for what in ("wrong", "lost", "pending"):
        if counts["good"][what] or counts["bad"][what]:
            failures.append(f"{what} responses: good {counts['good'][what]}, bad {counts['bad'][what]}")
    if counts["good"]["error"]:
        failures.append(f"{counts['good']['error']} good requests got an error")
    if counts["bad"]["ok"]:
        failures.append(f"{counts['bad']['ok']} bad requests were answered 200")
    for what in ("duplicated", "mismatched"):
        if counts[what]:
            failures.append(f"{counts[what]} {what} responses")
    if not counts["bad"]["error"]:
        failures.append("no bad request got its error (none sent?)")
    dur = result["duration_s"]
    return {
        "command": command,
        "started": samples[0]["wall"] if samples else None,
        "ended": samples[-1]["wall"] if samples else None,
        "duration_min": round(dur / 60.0, 2),
        "config": dataclasses.asdict(config),
        "bounds": {k: dataclasses.asdict(v) for k, v in BOUNDS.items()},
        "models": result.get("models"),
        "pool": result.get("pool"),
        "server_log": result.get("server_log"),
        "reference_failures": result.get("reference_failures", []),
        # advisory: Triton's shutdown, not the traffic (docs/guides/reliability.md)
        "shm_left_after_stop": result.get("shm_left_after_stop"),
        "loadavg_start": samples[0]["loadavg"] if samples else None,
        "loadavg_end": samples[-1]["loadavg"] if samples else None,
        "requests_per_s": round(samples[-1]["answered"] / max(samples[-1]["t_s"], 1e-9), 2) if samples else None,
        "counts": counts,
        "series": judged["series"],
        "restarts": judged["restarts"],
        "failures": failures,
        "passed": not failures,
        "samples": samples,
    }


def plot(summary: dict, path: Path) -> Path:
    """A PNG of the series (MiB over minutes; warm-up shaded, fitted lines dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = summary["samples"]
    minutes = np.array([s["t_s"] / 60.0 for s in samples])
    warm = summary["config"]["warmup_minutes"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)

    def draw(ax, name, label, relative=False):
        values = summary_values(samples, name)
        mask = np.array([v is not None for v in values])
        if not mask.any():
            return
        ys = np.array([v if v is not None else np.nan for v in values], dtype=np.float64) / MIB
        if relative:  # the change since the first sample: stubs differ by 150 MiB, growth by 1
            ys = ys - ys[mask][0]
        line, = ax.plot(minutes[mask], ys[mask], marker=".", label=label)
        j = summary["series"].get(name, {})
        if j.get("slope_mib_per_10min") is not None:
            sel = mask & (minutes * 60.0 >= warm * 60.0)
            coef = np.polyfit(minutes[sel], ys[sel], 1)
            ax.plot(minutes[sel], np.polyval(coef, minutes[sel]), "--", color=line.get_color(), linewidth=1)

    for name in sorted(summary["series"]):
        if name.startswith("stub ") and name.endswith(" rss"):
            first = next(v for v in summary_values(samples, name) if v is not None) / MIB
            draw(axes[0][0], name, f"{name[5:-4]} from {first:.0f} MiB "
                 f"({summary['series'][name]['slope_mib_per_10min']} MiB/10 min)", relative=True)
    axes[0][0].set_title("Python-backend stub RSS, change since the first sample (MiB)")
    draw(axes[0][1], "tritonserver rss", f"RSS ({summary['series']['tritonserver rss']['slope_mib_per_10min']} MiB/10 min)")
    draw(axes[0][1], "tritonserver pss", "PSS")
    axes[0][1].set_title("tritonserver (MiB)")
    draw(axes[1][0], "/dev/shm size", "size")
    draw(axes[1][0], "/dev/shm allocated", "allocated")
    axes[1][0].set_title("/dev/shm files of this server (MiB)")
    rate_t = minutes[1:]
    answered = np.array([s["answered"] for s in samples], dtype=np.float64)
    if len(samples) > 1:
        axes[1][1].plot(rate_t, np.diff(answered) / np.diff(minutes * 60.0), marker=".", label="answered/s")
        load = np.array([s["loadavg"][0] for s in samples])
        axes[1][1].plot(minutes, load, label="load average (1 min)")
    axes[1][1].set_title("requests answered per second; 1-minute load average")
    for ax in axes.flat:
        ax.axvspan(0, warm, color="0.9", zorder=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    verdict_text = "PASS" if summary["passed"] else "FAIL"
    fig.suptitle(f"An hour of memory: {summary['duration_min']} min, warm-up {warm:g} min (shaded), {verdict_text}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def summary_values(samples: List[dict], name: str) -> List[Optional[float]]:
    return series(samples)[name][1]


def write(summary: dict, out_dir: Path) -> Dict[str, Path]:
    """``out_dir/memory.json`` and ``out_dir/memory.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "memory.json"
    path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return {"json": path, "png": plot(summary, out_dir / "memory.png")}


def print_summary(summary: dict) -> None:
    c = summary["counts"]
    print(f"memory soak: {summary['duration_min']} min, {summary['requests_per_s']} answered/s, load "
          f"{summary['loadavg_start']} -> {summary['loadavg_end']}; good {c['good']}, bad {c['bad']}, "
          f"duplicated {c['duplicated']}, mismatched {c['mismatched']}")
    for name, j in summary["series"].items():
        flag = "hard" if j["hard"] else "advisory"
        state = {True: "ok", False: "OVER", None: "too few points"}[j["ok"]]
        print(f"  {name:40s} slope {j['slope_mib_per_10min']} MiB/10 min, growth {j['growth_mib']} MiB "
              f"(bound {j['bound_slope_mib_per_10min']}, {flag}): {state}")
    left = summary.get("shm_left_after_stop")
    if left:
        print(f"  advisory: {len(left)} /dev/shm files of this server left after it stopped: {left}")
    print("PASS" if summary["passed"] else "FAIL: " + "; ".join(summary["failures"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m lab.soak.memory [options]`` (exit 0 pass, 1 fail, 2 could not run)."""
    from orchestrator.tooling.server import ServerError

    parser = argparse.ArgumentParser(prog="python -m lab.soak.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    d = MemoryConfig()
    parser.add_argument("--minutes", type=float, default=d.minutes, help="minutes of traffic (default 60)")
    parser.add_argument("--interval", type=float, default=d.interval_s, metavar="S", help="seconds between samples (default 60)")
    parser.add_argument("--warmup", type=float, default=d.warmup_minutes, metavar="MIN",
                        help="minutes at the start that are not judged (default 10)")
    parser.add_argument("--threads", type=int, default=d.threads, help="client threads per protocol (default 2: concurrency 4)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--repo", default=None, help="model repository to copy (default: the project's model_repository)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="write DIR/soak/memory.{json,png} (make soak-memory: docs); default .cache/soak-memory/")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    parser.add_argument("--replot", default=None, metavar="JSON",
                        help="only draw the PNG beside an existing memory.json (no server, no traffic)")
    args = parser.parse_args(argv)
    if args.replot:
        summary_path = Path(args.replot)
        print(f"plot: {plot(json.loads(summary_path.read_text()), summary_path.with_suffix('.png'))}")
        return 0
    config = dataclasses.replace(d, minutes=args.minutes, interval_s=args.interval, warmup_minutes=args.warmup,
                                 threads=args.threads, seed=args.seed)
    if config.minutes <= 0 or config.interval_s <= 0 or config.warmup_minutes < 0 or config.threads < 1:
        parser.error("--minutes and --interval must be > 0, --warmup >= 0, --threads >= 1")
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    try:
        result = run_memory(config, Path(args.repo) if args.repo else None, log=log)
    except (ToolingError, ServerError, OSError, ValueError) as exc:
        print(f"error: memory soak could not run: {exc}", file=sys.stderr)
        return 2
    argv_list = list(sys.argv[1:] if argv is None else argv)
    summary = summarize(result, config, shlex.join(["python", "-m", "lab.soak.memory", *argv_list]))
    print_summary(summary)
    out = Path(args.out) / "soak" if args.out else Path(".cache") / "soak-memory"
    paths = write(summary, out)
    print(f"report: {paths['json']} and {paths['png']}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
