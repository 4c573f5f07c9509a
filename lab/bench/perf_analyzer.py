"""perf_analyzer: installed from the tritonclient 2.41.0 wheel, run per level, its output parsed."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from lab.bench.plan import DEFAULT_TOOL_DIR, FULL_SETTINGS, NO_STABILITY, BenchError, PASettings, Spec
from orchestrator.tooling.files import sha256_file, write_atomic

# Of the tritonclient wheels on PyPI, only the 2.41.0 manylinux1 one ships the perf_analyzer
# binary (as tritonclient-2.41.0.data/data/bin/perf_analyzer).
PA_REQUIREMENT = "tritonclient==2.41.0"
PA_WHEEL = "tritonclient-2.41.0-py3-none-manylinux1_x86_64.whl"
PA_WHEEL_SHA256 = "cf4ed5df836fa99937678a9fd852f86ba05c7b83656dd0a540e20afdb9ab4629"
PA_MEMBER = "tritonclient-2.41.0.data/data/bin/perf_analyzer"
# The binary's two libraries not on a Debian base system: file name -> glob in nvidia_pytriton.libs.
PA_LIBRARIES = {"libb64.so.0d": "libb64*.so.0d*", "libcudart.so.12": "libcudart*.so.12*"}
CUDART_REQUIREMENT = "nvidia-cuda-runtime-cu12"
CUDART_MEMBER = "nvidia/cuda_runtime/lib/libcudart.so.12"


def _pip_download(requirement: str, dest: Path, platform_tag: Optional[str] = None) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), requirement]
    if platform_tag:
        cmd[4:4] = ["--platform", platform_tag]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"cannot run {shlex.join(cmd)}: {exc}") from exc
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise BenchError(f"`{shlex.join(cmd)}` failed (exit {proc.returncode}): {tail}")


def _library_candidates(pattern: str) -> List[Path]:
    """Copies of a library shipped in pip packages (``nvidia_pytriton.libs``), then the system's."""
    found = []
    try:
        from orchestrator.tooling.server import find_embedded_server

        found += sorted(find_embedded_server().libs.glob(pattern))
    except Exception:  # the wheel missing is reported by the caller if nothing else is found
        pass
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        found += sorted(Path(d).glob(pattern))
    return [p for p in found if p.is_file()]


def _provide_libraries(tool_dir: Path, download: bool) -> None:
    for name, pattern in PA_LIBRARIES.items():
        target = tool_dir / name
        if target.is_file():
            continue
        candidates = _library_candidates(pattern)
        if candidates:
            write_atomic(target, candidates[0].read_bytes(), 0o755)
            continue
        if name == "libcudart.so.12" and download:
            with tempfile.TemporaryDirectory(dir=tool_dir) as tmp:
                _pip_download(CUDART_REQUIREMENT, Path(tmp), "manylinux2014_x86_64")
                wheel = next(Path(tmp).glob("*.whl"))
                with zipfile.ZipFile(wheel) as zf:
                    write_atomic(target, zf.read(CUDART_MEMBER), 0o755)
            continue
        hint = "apt-get install libb64-0d" if name.startswith("libb64") else f"pip download {CUDART_REQUIREMENT}"
        raise BenchError(
            f"perf_analyzer needs {name}: not found in nvidia_pytriton.libs nor the system ({hint})"
        )


def perf_analyzer_env(tool_dir: Path = DEFAULT_TOOL_DIR) -> Dict[str, str]:
    """The environment to run perf_analyzer in: ``tool_dir`` first on ``LD_LIBRARY_PATH``."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(tool_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def perf_analyzer_version(binary: Path) -> str:
    """``perf_analyzer --version``, e.g. ``Perf Analyzer Version 2.41.0 (commit fbb030e)``.

    Raises BenchError when the binary does not run (a missing library, wrong platform).
    """
    try:
        proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30,
                              env=perf_analyzer_env(binary.parent))
    except OSError as exc:
        raise BenchError(f"cannot run {binary}: {exc}") from exc
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "Perf Analyzer" not in out:
        raise BenchError(f"{binary} --version failed (exit {proc.returncode}): {out[-500:]}")
    return out.splitlines()[0].strip()


def install_perf_analyzer(tool_dir: Path | str = DEFAULT_TOOL_DIR, *, download: bool = True) -> Path:
    """Install perf_analyzer into ``tool_dir`` (once) and return the binary's path.

    Steps: ``pip download --no-deps tritonclient==2.41.0 --platform manylinux1_x86_64
    --only-binary=:all:`` (sha256 checked; nothing is installed into any environment), the
    wheel's ``tritonclient-2.41.0.data/data/bin/perf_analyzer`` extracted into ``tool_dir``,
    and its libraries ``libb64.so.0d`` and ``libcudart.so.12`` copied there from the
    ``nvidia-pytriton`` wheel's ``nvidia_pytriton.libs`` (hashed names), else from the
    system, else (cudart) from the ``nvidia-cuda-runtime-cu12`` wheel. Run it with
    :func:`perf_analyzer_env` (``tool_dir`` on ``LD_LIBRARY_PATH``) or with the
    ``perf_analyzer.sh`` wrapper written next to it.

    Raises BenchError when a download, the hash check, a library or ``--version`` fails.
    """
    tool_dir = Path(tool_dir)
    binary = tool_dir / "perf_analyzer"
    tool_dir.mkdir(parents=True, exist_ok=True)
    if not binary.is_file():
        if not download:
            raise BenchError(f"perf_analyzer is not installed in {tool_dir} and download=False")
        with tempfile.TemporaryDirectory(dir=tool_dir, prefix=".download-") as tmp:
            _pip_download(PA_REQUIREMENT, Path(tmp), "manylinux1_x86_64")
            wheel = Path(tmp) / PA_WHEEL
            if not wheel.is_file():
                raise BenchError(f"pip download {PA_REQUIREMENT} did not produce {PA_WHEEL}")
            digest = sha256_file(wheel)
            if digest != PA_WHEEL_SHA256:
                raise BenchError(f"{PA_WHEEL}: sha256 {digest} != expected {PA_WHEEL_SHA256}")
            with zipfile.ZipFile(wheel) as zf:
                write_atomic(binary, zf.read(PA_MEMBER), 0o755)
    _provide_libraries(tool_dir, download)
    wrapper = tool_dir / "perf_analyzer.sh"
    script = f'#!/bin/sh\n# Written by lab.bench.\nLD_LIBRARY_PATH="{tool_dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "{binary}" "$@"\n'
    if not wrapper.is_file() or wrapper.read_text() != script:
        write_atomic(wrapper, script.encode(), 0o755)
    perf_analyzer_version(binary)
    return binary


def perf_analyzer_command(binary: Path | str, spec: Spec, url: str, input_data: Path | str, csv_path: Path | str,
                          export_path: Path | str, settings: PASettings, *, stability: Optional[Tuple[str, str]] = None,
                          interval_ms: Optional[int] = None) -> List[str]:
    """The perf_analyzer command line for ``spec`` (``stability``: ``(-s, -r)`` override;
    ``interval_ms``: window length, default ``settings.measurement_interval_ms``)."""
    s, r = stability or (f"{settings.stability_percentage:g}", str(settings.max_trials))
    return [
        str(binary), "-m", spec.model, "-u", url, "-i", settings.protocol,
        "--input-data", str(input_data), "-b", str(spec.batch_size),
        "--concurrency-range", str(spec.concurrency),
        "--measurement-mode", "time_windows", "--measurement-interval", str(interval_ms or settings.measurement_interval_ms),
        "--stability-percentage", s, "--max-trials", r, "--percentile", "50",
        "-f", str(csv_path), "--profile-export-file", str(export_path),
    ]


# perf_analyzer -f columns (2.41): latencies and components in microseconds.
_CSV_REQUIRED = ("Concurrency", "Inferences/Second", "p50 latency", "p90 latency", "p95 latency", "p99 latency")


def parse_perf_csv(text: str) -> List[dict]:
    """Parse perf_analyzer's ``-f`` CSV report into one dict per concurrency row.

    Returns ``{"concurrency", "throughput" (infer/s), "p50_ms", "p90_ms", "p95_ms",
    "p99_ms", "avg_ms" (only with --verbose-csv, else None), "components_us" (the other
    columns, microseconds)}``. Rows end at the first blank line (server-metric sections
    follow there with ``--collect-metrics``). Raises BenchError on a missing column or no row.
    """
    lines = []
    for line in text.splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line)
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    missing = [c for c in _CSV_REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise BenchError(f"perf_analyzer CSV lacks columns {missing}; header: {reader.fieldnames}")
    rows = []
    for raw in reader:
        try:
            row = {
                "concurrency": int(raw["Concurrency"]),
                "throughput": float(raw["Inferences/Second"]),
                **{f"p{p}_ms": float(raw[f"p{p} latency"]) / 1000.0 for p in (50, 90, 95, 99)},
                "avg_ms": float(raw["Avg latency"]) / 1000.0 if raw.get("Avg latency") else None,
                "components_us": {
                    k: float(v) for k, v in raw.items()
                    if k not in _CSV_REQUIRED and k != "Avg latency" and v not in (None, "")
                },
            }
        except (TypeError, ValueError) as exc:
            raise BenchError(f"perf_analyzer CSV row {raw}: {exc}") from exc
        rows.append(row)
    if not rows:
        raise BenchError("perf_analyzer CSV has no data row")
    return rows


def window_stats(export: Mapping, batch_size: int = 1) -> dict:
    """Per-window figures from a perf_analyzer profile export (``--profile-export-file``).

    A request belongs to the window in which its last response arrived (perf_analyzer
    counts completed requests). Returns ``{"windows", "window_throughput" (infer/s per
    window), "window_p50_ms", "throughput_spread_pct" (100 * (max / min - 1) over the last
    3 windows, the ones perf_analyzer reports), "requests"}``. Raises BenchError when the
    export has no window.
    """
    try:
        exp = export["experiments"][0]
        bounds = [int(b) for b in exp["window_boundaries"]]
        requests = exp["requests"]
    except (KeyError, IndexError, TypeError) as exc:
        raise BenchError(f"profile export without experiments/window_boundaries: {exc}") from exc
    if len(bounds) < 2:
        raise BenchError("profile export has no complete window")
    starts = np.array([int(r["timestamp"]) for r in requests if r.get("response_timestamps")], dtype=np.int64)
    ends = np.array([int(r["response_timestamps"][-1]) for r in requests if r.get("response_timestamps")], dtype=np.int64)
    thr, p50 = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        sel = (ends >= lo) & (ends < hi)
        thr.append(float(sel.sum()) * batch_size / ((hi - lo) / 1e9))
        lat = (ends[sel] - starts[sel]) / 1e6
        p50.append(float(np.percentile(lat, 50)) if lat.size else float("nan"))
    last = thr[-3:]  # perf_analyzer reports the last 3 windows
    spread = 100.0 * (max(last) / min(last) - 1.0) if min(last) > 0 else float("inf")
    return {
        "windows": len(thr),
        "window_throughput": thr,
        "window_p50_ms": p50,
        "throughput_spread_pct": spread,
        "requests": int(ends.size),
    }


def _run_pa(cmd: List[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=dict(env), timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"perf_analyzer ran over {timeout:g} s: {shlex.join(cmd)}") from exc
    except OSError as exc:
        raise BenchError(f"cannot run perf_analyzer: {exc}") from exc


def _pa_error(output: str) -> str:
    keep = [line.strip() for line in output.splitlines()
            if re.search(r"error|failed|unable|invalid|no valid requests|larger time window", line, re.I)]
    if not keep:
        keep = [line.strip() for line in output.splitlines() if line.strip()][-3:]
    return " | ".join(dict.fromkeys(keep))[:1500]


def measure(binary: Path | str, spec: Spec, url: str, input_data: Path | str, workdir: Path | str,
            settings: PASettings = FULL_SETTINGS, latency_ms: Optional[float] = None) -> dict:
    """Run perf_analyzer for ``spec`` against the server at ``url`` (gRPC host:port).

    ``latency_ms``: the expected request latency, which sets the window length
    (:meth:`PASettings.interval_for`); a window in which no request completed is retried
    once with twice the length.

    Returns a dict: the spec's fields, ``throughput`` (infer/s), ``p50_ms`` ... ``p99_ms``
    (ms, client-side, from the CSV), ``stable`` (True: perf_analyzer's stability rule was
    met; False: it was not and the figures are from the 3-window fallback; None: not
    checked), ``interval_ms``, ``windows``, ``window_throughput`` and
    ``throughput_spread_pct`` (from the profile export), ``command``, ``wall_s`` and
    ``error`` (None, or perf_analyzer's error lines; the figures are then absent).
    Raises BenchError only if perf_analyzer cannot be run.
    """
    binary, workdir = Path(binary), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = perf_analyzer_env(binary.parent)
    stem = f"{spec.section}-{spec.model}-{spec.dataset}-c{spec.concurrency}-b{spec.batch_size}"
    interval = settings.interval_for(latency_ms)
    result = {**asdict(spec), "stable": None, "error": None}
    t0 = time.monotonic()
    attempts = [None if settings.check_stability else NO_STABILITY]
    if settings.check_stability and settings.fallback:
        attempts.append(NO_STABILITY)
    n, empty_retried = 0, False
    while attempts:
        stability = attempts[0]
        n += 1
        csv_path, export_path = workdir / f"{stem}-{n}.csv", workdir / f"{stem}-{n}.json"
        for p in (csv_path, export_path):
            p.unlink(missing_ok=True)  # perf_analyzer refuses an existing export path
        cmd = perf_analyzer_command(binary, spec, url, input_data, csv_path, export_path, settings,
                                    stability=stability, interval_ms=interval)
        windows = 3 if stability else settings.max_trials
        proc = _run_pa(cmd, env, timeout=90.0 + 2.0 * windows * interval / 1000.0)
        result.update(command=shlex.join(cmd), interval_ms=interval)
        output = proc.stdout + proc.stderr
        if proc.returncode == 0 and csv_path.is_file():
            row = parse_perf_csv(csv_path.read_text())[0]
            result.update({k: row[k] for k in ("throughput", "p50_ms", "p90_ms", "p95_ms", "p99_ms")})
            try:
                result.update(window_stats(json.loads(export_path.read_text()), spec.batch_size))
            except (OSError, ValueError, BenchError) as exc:
                result["windows_error"] = str(exc)
            if settings.check_stability:
                result["stable"] = stability is None
            result["error"] = None
            break
        if "No valid requests recorded" in output and not empty_retried:
            empty_retried, interval = True, interval * 2
            result["error"] = _pa_error(output)
            continue
        unstable = "Failed to obtain stable measurement" in output
        result["error"] = f"unstable after {settings.max_trials} windows" if unstable else _pa_error(output)
        if not unstable:
            break
        attempts.pop(0)
    result["wall_s"] = round(time.monotonic() - t0, 2)
    return result

