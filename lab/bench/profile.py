"""``make profile``: where the router's own Python stub spends its time.

Starts the embedded Triton on the benchmark repository (``make bench``'s, the shipped policy
as ``router``), finds the router's stub process (the child of ``tritonserver`` serving
``router_0_0``), and for each concurrency level drives perf_analyzer at ``router`` (gRPC,
held-out texts, one per request) while py-spy (a sampling profiler, attached to that process
only) records it twice in a row: collapsed stacks (``--format raw``) for the tables, then a
flame graph (SVG). The router's own ``orchestrator_stage_seconds`` histogram is read from
``/metrics`` before and after each level.

Output under ``--out`` (default ``.cache/docs``): ``bench/profile_c<N>.svg`` and
``bench/profile_c<N>.txt`` per level, ``bench/profile.json``, and the "profile" section of
``benchmarks.md``. What the tables say (:func:`summarize`): a frame's *self* share is the
share of samples in which it was the innermost frame (where the time went); its *total*
share, of samples in which it was on the stack at all; idle samples (py-spy's default
leaves out threads that are not running) are not recorded.

Needs py-spy (``pip install py-spy``, in the ``test`` extra) and ptrace permission on the
stub (root, or ``kernel.yama.ptrace_scope`` 0). Raises BenchError when either is missing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lab.bench.machine import load_average
from lab.bench.perf_analyzer import install_perf_analyzer, measure
from lab.bench.plan import DEFAULT_TOOL_DIR, FULL_SETTINGS, REPO, BenchError, Spec
from lab.bench.report import PROFILE_END, PROFILE_START, replace_section
from orchestrator.runtime.metrics import STAGES
from orchestrator.tooling import prometheus

NO_PYTHON_FRAME = "(no Python frame: the stub's C++ code)"


def py_spy_binary() -> Path:
    """py-spy beside this interpreter, else on PATH. Raises BenchError when absent."""
    here = Path(sys.executable).parent / "py-spy"
    found = here if here.is_file() else (Path(p) if (p := shutil.which("py-spy")) else None)
    if found is None:
        raise BenchError("py-spy is not installed: pip install py-spy (it is in the project's test extra)")
    return found


def parse_collapsed(text: str) -> List[Tuple[List[str], int]]:
    """Collapsed stacks (``frame;frame;...;innermost COUNT`` per line, py-spy's ``raw``
    format, Brendan Gregg's flame graph input) as ``(frames outermost first, samples)``.
    Raises ValueError on a line without a count."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        stack, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit():
            raise ValueError(f"not a collapsed stack line: {line[:120]!r}")
        # py-spy writes a sample with no Python frame (the stub's own C++ code) as " COUNT"
        out.append((stack.split(";") if stack else [NO_PYTHON_FRAME], int(count)))
    return out


def _frame_name(frame: str) -> str:
    """``function (file.py:line)`` -> ``function (file.py)``: lines merged per function."""
    name, sep, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].rsplit('/', 1)[-1].rstrip(')')})" if sep else frame


def summarize(stacks: Sequence[Tuple[List[str], int]], top: int = 12) -> Dict[str, Any]:
    """``samples`` in all, and the ``top`` functions by ``self`` and by ``total`` share of
    them (fractions in [0, 1]; a function counted once per sample however deep it recurs).
    Thread frames (py-spy's ``process``/``thread`` roots) are not functions and are left out."""
    samples = sum(n for _, n in stacks)
    self_counts: Counter = Counter()
    total_counts: Counter = Counter()
    for frames, n in stacks:
        names = [_frame_name(f) for f in frames if not f.startswith(("process ", "thread "))]
        if not names:
            continue
        self_counts[names[-1]] += n
        for name in set(names):
            total_counts[name] += n

    def table(counts: Counter) -> List[Dict[str, Any]]:
        return [{"function": f, "share": round(c / samples, 4), "samples": c} for f, c in counts.most_common(top)] if samples else []

    return {"samples": samples, "self": table(self_counts), "total": table(total_counts)}


def stage_means(before: prometheus.Samples, after: prometheus.Samples, router: str = "router") -> Dict[str, Dict[str, float]]:
    """Per stage of ``orchestrator_stage_seconds``: observations and mean microseconds between
    two scrapes."""
    out = {}
    for stage in STAGES:
        labels = {"router": router, "stage": stage}
        count = prometheus.value(after, "orchestrator_stage_seconds_count", **labels) - \
            prometheus.value(before, "orchestrator_stage_seconds_count", **labels)
        total = prometheus.value(after, "orchestrator_stage_seconds_sum", **labels) - \
            prometheus.value(before, "orchestrator_stage_seconds_sum", **labels)
        out[stage] = {"count": count, "mean_us": round(total / count * 1e6, 1) if count else 0.0}
    return out


def _record(spy: Path, pid: int, seconds: float, fmt: str, path: Path, rate: int) -> subprocess.Popen:
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(int(seconds)),
                             "--format", fmt, "--output", str(path), "--nonblocking"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def profile_level(server: Any, spy: Path, pa: Path, pid: int, concurrency: int, input_data: Path, work: Path,
                  out: Path, seconds: float, rate: int) -> Dict[str, Any]:
    """One concurrency level: perf_analyzer keeps the router busy while py-spy records the
    stub twice (raw, then SVG); returns the level's figures."""
    spec = Spec("profile", "router", "held_out", concurrency)
    stop = threading.Event()
    runs: List[dict] = []

    def load() -> None:
        while not stop.is_set():
            runs.append(measure(pa, spec, server.grpc_url, input_data, work / f"pa-c{concurrency}", FULL_SETTINGS))

    metrics_url = f"http://{server.metrics_url}/metrics"
    before, load_before = prometheus.scrape(metrics_url), load_average()
    driver = threading.Thread(target=load, daemon=True)
    driver.start()
    time.sleep(2.0)  # perf_analyzer's warm-up
    raw, svg = out / f"profile_c{concurrency}.txt", out / f"profile_c{concurrency}.svg"
    for fmt, path in (("raw", raw), ("flamegraph", svg)):
        proc = _record(spy, pid, seconds, fmt, path, rate)
        output, _ = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0 or not path.is_file():
            stop.set()
            raise BenchError(f"py-spy record failed (exit {proc.returncode}): {output.strip()[-400:]}")
    load_during = load_average()
    stop.set()
    driver.join(timeout=180)
    after = prometheus.scrape(metrics_url)
    ok = [r for r in runs if not r.get("error")]
    return {"concurrency": concurrency, "load_before": load_before, "load_during": load_during,
            "throughput": ok[-1]["throughput"] if ok else None, "p50_ms": ok[-1]["p50_ms"] if ok else None,
            "profile": summarize(parse_collapsed(raw.read_text())), "stages": stage_means(before, after),
            "files": [raw.name, svg.name]}


def run_profile(out: Path, levels: Sequence[int], seconds: float, rate: int, repo: Path = REPO,
                tool_dir: Path = DEFAULT_TOOL_DIR, log: Any = print) -> Dict[str, Any]:
    """The whole profile (module docstring); returns what ``bench/profile.json`` holds."""
    from lab.bench.measurement import write_input_data
    from lab.bench.stack import describe, read_stack
    from lab.bench.variants import make_bench_repository
    from lab.soak.procs import find_stub
    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    spy, pa = py_spy_binary(), install_perf_analyzer(tool_dir)
    bench_dir = out / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    result: Dict[str, Any] = {"created_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "seconds": seconds,
                              "rate_hz": rate, "levels": []}
    with tempfile.TemporaryDirectory(prefix="orchestrator-profile-") as tmp:
        work = Path(tmp)
        bench_repo = make_bench_repository(work / "model_repository", repo)
        input_data = write_input_data(work / "input.json", [e.text for e in data.held_out_examples(n=200)])
        with TritonServer(bench_repo, models=["tokenizer", "classifier", "classifier_fast", "postprocess", "router"]) as server:
            result["stack"] = describe(read_stack(server, embedded=True))
            pid = find_stub(server.pid or 0, "router_0_0")
            if pid is None:
                raise BenchError("no stub process of router_0_0 among the server's children")
            for c in levels:
                log(f"profile: concurrency {c}, py-spy on pid {pid} for 2 x {seconds:g} s")
                level = profile_level(server, spy, pa, pid, c, input_data, work, bench_dir, seconds, rate)
                log(f"  {level['throughput']} infer/s, load {level['load_before']} -> {level['load_during']}; top self: "
                    + ", ".join(f"{r['function']} {r['share']:.0%}" for r in level["profile"]["self"][:3]))
                result["levels"].append(level)
    (bench_dir / "profile.json").write_text(json.dumps(result, indent=1) + "\n")
    replace_section(out / "benchmarks.md", render(result), PROFILE_START, PROFILE_END)
    return result


def render(result: Dict[str, Any]) -> str:
    """The "profile" section of benchmarks.md."""
    lines = [PROFILE_START, "## Profile: where the router's stub spends its time", "",
             f"One run of `make profile` at {result['created_utc']} UTC: py-spy {result['rate_hz']} Hz on the router's stub "
             f"process, 2 x {result['seconds']:g} s per level while perf_analyzer (gRPC, held-out texts, one per request) "
             f"kept `router` busy. Stack: **{result.get('stack', 'unknown')}**. Flame graphs: `bench/profile_c<N>.svg`; "
             "collapsed stacks: `bench/profile_c<N>.txt`; figures: `bench/profile.json`.", ""]
    for level in result["levels"]:
        prof = level["profile"]
        lines += [f"### Concurrency {level['concurrency']}", "",
                  f"{level['throughput']} infer/s, p50 {level['p50_ms']} ms (the last perf_analyzer run of the level); "
                  f"load average {level['load_before']} before, {level['load_during']} during; {prof['samples']} samples.", "",
                  "| function (self) | share | function (total) | share |", "|---|---:|---|---:|"]
        for a, b in zip(prof["self"][:10], prof["total"][:10]):
            lines.append(f"| `{a['function']}` | {a['share']:.1%} | `{b['function']}` | {b['share']:.1%} |")
        lines += ["", "Stages of the router's execute (`orchestrator_stage_seconds`, mean per observation):", "",
                  "| stage | observations | mean (us) |", "|---|---:|---:|"]
        lines += [f"| {s} | {v['count']:.0f} | {v['mean_us']} |" for s, v in level["stages"].items()]
        lines.append("")
    lines.append(PROFILE_END)
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.profile", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO.parent / ".cache" / "docs", help="where benchmarks.md and bench/ go")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 16], help="concurrency levels (default: 1 16)")
    parser.add_argument("--seconds", type=float, default=20.0, help="py-spy recording per format and level (default: 20)")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second (default: 200)")
    args = parser.parse_args(argv)
    try:
        run_profile(args.out, args.levels, args.seconds, args.rate)
    except BenchError as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 2
    print(f"profile: wrote {args.out / 'benchmarks.md'} and {args.out / 'bench'}/profile_c*.{{svg,txt}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
