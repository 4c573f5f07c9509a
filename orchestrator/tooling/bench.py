"""Benchmarks (issue 6): ``router`` against ``ensemble`` and the raw ONNX model, with perf_analyzer.

``make bench`` or ``python -m orchestrator.tooling.bench [--quick] [--out docs]``:

1. copies ``model_repository/`` to a temporary directory and adds the benchmark-only
   variants of :data:`VARIANTS` (``tokenizer_pad512`` + ``ensemble_pad512``: the seeds'
   ensemble, padding every text to 512 tokens; ``router_single``: the router sending every
   text to ``classifier``, i.e. the routing overhead alone);
2. starts one embedded Triton 2.51 server (:class:`orchestrator.tooling.server.TritonServer`) on it;
3. sends the held-out test split (:func:`orchestrator.tooling.modeling.data.held_out_examples`) through
   ``ensemble``, ``router`` and ``router_single`` with tritonclient and scores their verdicts
   against the human labels (accuracy);
4. runs Triton's load generator ``perf_analyzer`` (2.41.0, from the ``tritonclient==2.41.0``
   wheel, installed by :func:`install_perf_analyzer` into ``.cache/tools/perf_analyzer/``)
   against each model: gRPC, one text per request, ``--input-data`` JSON made of real
   held-out texts (THRESHOLD 0.5), concurrency 1, 4 and 16 (:func:`bench_plan`), plus a
   length sweep (short, medium, over 128 tokens) and a client batch sweep (1, 4, 16);
5. times the raw ONNX classifiers in this process through onnxruntime on the same token
   batches (the compute floor);
6. writes ``<out>/benchmarks.md``, ``<out>/bench/results.json`` and PNG plots in
   ``<out>/bench/``.

Units everywhere: latency in milliseconds (perf_analyzer reports microseconds; converted),
throughput in inferences (texts) per second, ``infer/s``. Every number in the report comes
from ``results.json`` of the same run: perf_analyzer's CSV (``-f``) for throughput and
p50/p90/p95/p99, its profile export (``--profile-export-file``) for per-window throughput,
tritonclient for accuracy and routes, ``time.perf_counter`` around
``onnxruntime.InferenceSession.run`` for the raw floor, ``/proc`` and the server's metadata
for the machine description.

Errors: :class:`BenchError` (perf_analyzer cannot be installed or run, a variant cannot be
built, the data cannot be read); :class:`orchestrator.tooling.server.ServerError` from the server.
A single perf_analyzer measurement that fails is recorded with its error and the run goes
on; the report shows it as failed.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.files import sha256_file, write_atomic

__all__ = [
    "BenchError",
    "VARIANTS",
    "GOALS",
    "PASettings",
    "Spec",
    "install_perf_analyzer",
    "perf_analyzer_env",
    "make_bench_repository",
    "set_config_parameter",
    "input_data_json",
    "write_input_data",
    "length_sets",
    "bench_plan",
    "perf_analyzer_command",
    "parse_perf_csv",
    "window_stats",
    "measure",
    "combine_rounds",
    "paired_ratios",
    "paired_median",
    "latency_summary",
    "ratio",
    "compute_ratios",
    "evaluate_goals",
    "render_report",
    "write_plots",
    "run_benchmark",
    "add_bench_arguments",
    "bench_command",
    "main",
]

ROOT = PROJECT_ROOT
REPO = ROOT / "model_repository"
DEFAULT_TOOL_DIR = ROOT / ".cache" / "tools" / "perf_analyzer"

# perf_analyzer: only the tritonclient 2.41.0 manylinux1 wheel ships it (FIELD_NOTES, "Benchmarks").
PA_REQUIREMENT = "tritonclient==2.41.0"
PA_WHEEL = "tritonclient-2.41.0-py3-none-manylinux1_x86_64.whl"
PA_WHEEL_SHA256 = "cf4ed5df836fa99937678a9fd852f86ba05c7b83656dd0a540e20afdb9ab4629"
PA_MEMBER = "tritonclient-2.41.0.data/data/bin/perf_analyzer"
# The binary's two libraries not on a Debian base system: file name -> glob in nvidia_pytriton.libs.
PA_LIBRARIES = {"libb64.so.0d": "libb64*.so.0d*", "libcudart.so.12": "libcudart*.so.12*"}
CUDART_REQUIREMENT = "nvidia-cuda-runtime-cu12"
CUDART_MEMBER = "nvidia/cuda_runtime/lib/libcudart.so.12"

#: ``router_single``'s routing tree (format: ``orchestrator/runtime/policy.py``), put in place of the
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

#: Policy option ``inline`` turned off: tokenizer and postprocess models through BLS.
NO_INLINE: dict = {}

#: The benchmark-only models added to the copy of the repository. ``base``: the model
#: directory copied; ``parameters``: config ``parameters`` whose ``string_value`` is replaced
#: (the base config must have them); ``replace_models``: ``model_name`` values replaced in
#: an ensemble's steps; ``policy_root``: a routing-policy tree that replaces the ``root``
#: of the base's policy file (the one the config's ``policy`` parameter names);
#: ``policy_extra``: top-level policy keys set as well (e.g. ``inline``).
VARIANTS: Dict[str, dict] = {
    # the seeds' tokenizer: every text padded to 512 tokens
    "tokenizer_pad512": {"base": "tokenizer", "parameters": {"padding": "max_length", "max_length": "512"}},
    # the seeds' ensemble: tokenizer_pad512 -> classifier -> postprocess
    "ensemble_pad512": {"base": "ensemble", "replace_models": {"tokenizer": "tokenizer_pad512"}},
    # the single-classifier policy: the router with the ensemble's compute (routing overhead)
    "router_single": {"base": "router", "policy_root": SINGLE_CLASSIFIER_ROOT},
    # the same two policies calling the tokenizer and postprocess models through BLS
    # (the shipped policy tokenizes and post-processes in the router's process: ``inline``)
    "router_single_bls": {"base": "router", "policy_root": SINGLE_CLASSIFIER_ROOT, "policy_extra": {"inline": NO_INLINE}},
    "router_bls": {"base": "router", "policy_extra": {"inline": NO_INLINE}},
}

#: The models compared at every concurrency, in plot/table order.
GRID_MODELS = ("ensemble_pad512", "ensemble", "router_single", "router_single_bls", "router", "router_bls")
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
LENGTH_BOUNDS = {"short": (1, 16), "medium": (48, 128), "long": (256, 384)}
MAX_SEQUENCE_LENGTH = 128  # the classifiers' limit (tokenizer model_max_length)

#: The issue's goals: ``ratio`` key of :func:`compute_ratios`, comparison, bound.
GOALS = (
    {
        "key": "router_single_p50_c1_vs_ensemble",
        "goal": "router (single-classifier) p50 latency at c=1 within 1.10x of ensemble",
        "op": "<=",
        "bound": 1.10,
    },
    {
        "key": "router_single_throughput_c16_vs_ensemble",
        "goal": "router (single-classifier) throughput at c=16 >= 0.95x ensemble",
        "op": ">=",
        "bound": 0.95,
    },
    {
        "key": "router_throughput_c16_vs_ensemble_pad512",
        "goal": "default router throughput at c=16 >= 3x ensemble_pad512 (the seeds')",
        "op": ">=",
        "bound": 3.0,
    },
    {
        "key": "router_accuracy_points_vs_ensemble",
        "goal": "default router accuracy within 1 point of the accurate classifier (ensemble)",
        "op": ">=",
        "bound": -1.0,
    },
)

WHAT_WE_TRIED_START = "<!-- what-we-tried:start (kept across runs: edit freely) -->"
WHAT_WE_TRIED_END = "<!-- what-we-tried:end -->"
# The section `make bench-features` writes (orchestrator.tooling.bench_features), kept across runs.
FEATURES_START = "<!-- bench-features:start (written by `make bench-features`) -->"
FEATURES_END = "<!-- bench-features:end -->"
WHAT_WE_TRIED_PLACEHOLDER = """\
> **Placeholder, to be filled by the router's optimisation work.** One row per change
> tried, with the figures from the run of `make bench` that measured it.

| change | router_single p50 c=1 / ensemble | router_single thr c=16 / ensemble | router thr c=16 / ensemble_pad512 | accuracy (router - ensemble, points) | kept? |
|---|---|---|---|---|---|"""


class BenchError(RuntimeError):
    """The benchmark cannot proceed; the message says what failed and how to fix it."""


# ----------------------------------------------------------------------------------------
# perf_analyzer


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
    script = f'#!/bin/sh\n# Written by orchestrator.tooling.bench.\nLD_LIBRARY_PATH="{tool_dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "{binary}" "$@"\n'
    if not wrapper.is_file() or wrapper.read_text() != script:
        write_atomic(wrapper, script.encode(), 0o755)
    perf_analyzer_version(binary)
    return binary


# ----------------------------------------------------------------------------------------
# The benchmark repository


def set_config_parameter(config: str, key: str, value: str, *, where: str = "config") -> str:
    """Return ``config`` (a config.pbtxt text) with parameter ``key``'s ``string_value`` set.

    Raises BenchError naming ``where`` and ``key`` when the config has no such parameter.
    """
    pattern = re.compile(r'(key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*")([^"]*)(")')
    new, count = pattern.subn(lambda m: m.group(1) + value + m.group(3), config)
    if count != 1:
        raise BenchError(
            f"{where}: expected exactly one parameter {key!r} in the base config, found {count}; "
            "update orchestrator.tooling.bench.VARIANTS"
        )
    return new


def _rename(config: str, old: str, new: str, where: str) -> str:
    text, count = re.subn(r'(?m)^(\s*name:\s*)"' + re.escape(old) + '"', lambda m: f'{m.group(1)}"{new}"', config)
    if count != 1:
        raise BenchError(f"{where}: no top-level name: \"{old}\" in the base config")
    return text


def make_bench_repository(dest: Path | str, source: Path | str = REPO,
                          variants: Mapping[str, dict] = VARIANTS) -> Path:
    """Copy ``source`` to ``dest`` and add ``variants`` (see :data:`VARIANTS`); returns ``dest``.

    Each variant is a copy of its base model's directory with ``name``, parameters and
    ensemble step models changed in ``config.pbtxt`` and every ``configs/*.pbtxt``.
    Raises BenchError if a base model, its name or a parameter is missing, or ``dest`` exists.
    """
    source, dest = Path(source), Path(dest)
    if dest.exists():
        raise BenchError(f"{dest} already exists")
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name, spec in variants.items():
        base = spec["base"]
        where = f"variant {name} (base {base})"
        if not (dest / base / "config.pbtxt").is_file():
            raise BenchError(f"{where}: {source / base / 'config.pbtxt'} not found")
        target = dest / name
        if target.exists():
            raise BenchError(f"{where}: the repository already has a model {name!r}")
        shutil.copytree(dest / base, target)
        for config_path in [target / "config.pbtxt", *sorted((target / "configs").glob("*.pbtxt"))]:
            text = _rename(config_path.read_text(), base, name, f"{where}, {config_path.name}")
            for key, value in spec.get("parameters", {}).items():
                text = set_config_parameter(text, key, value, where=f"{where}, {config_path.name}")
            for old, new in spec.get("replace_models", {}).items():
                text, count = re.subn(r'model_name:\s*"' + re.escape(old) + '"', f'model_name: "{new}"', text)
                if count == 0:
                    raise BenchError(f"{where}: no ensemble step model_name: \"{old}\"")
            config_path.write_text(text)
        if "policy_root" in spec or "policy_extra" in spec:
            _replace_policy_root(target, spec.get("policy_root"), where, spec.get("policy_extra"))
    return dest


def _replace_policy_root(model_dir: Path, root: Optional[Mapping], where: str, extra: Optional[Mapping] = None) -> None:
    """Replace the ``root`` of the model's policy file (named by the config's ``policy``
    parameter; YAML, or JSON for ``.json``), keeping its other settings; the result is
    validated with ``orchestrator.runtime.policy``. Raises BenchError."""
    import yaml

    config = (model_dir / "config.pbtxt").read_text()
    m = re.search(r'key:\s*"policy"\s*value:\s*\{\s*string_value:\s*"([^"]+)"', config)
    if not m:
        raise BenchError(f"{where}: the base config has no 'policy' parameter; update orchestrator.tooling.bench.VARIANTS")
    path = model_dir / m.group(1)
    try:
        text = path.read_text()
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise BenchError(f"{where}: cannot read the base policy {path.name}: {exc}") from exc
    if not isinstance(document, dict):
        raise BenchError(f"{where}: the base policy {path.name} is not a mapping")
    if root is not None:
        document = {**document, "root": json.loads(json.dumps(root))}
    document = {**document, **json.loads(json.dumps(extra or {})),
                "description": f"Benchmark only (orchestrator.tooling.bench): {where}, derived from the base policy."}
    try:
        from orchestrator.runtime.policy import PolicyError, parse_policy
    except ImportError:  # no policy module: the server reports a bad policy at load
        pass
    else:
        try:
            parse_policy(document)
        except PolicyError as exc:
            raise BenchError(f"{where}: invalid policy: {exc}") from exc
    path.write_text(json.dumps(document, indent=1) if path.suffix == ".json" else yaml.safe_dump(document, sort_keys=False))


def _model_files(repo: Path) -> Dict[str, dict]:
    """sha256 and size of each ``*/1/model.onnx`` (identifies the models measured)."""
    out = {}
    for path in sorted(repo.glob("*/1/model.onnx")):
        out[path.parent.parent.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return out


# ----------------------------------------------------------------------------------------
# Input data


def input_data_json(texts: Sequence[str], threshold: float = THRESHOLD) -> dict:
    """perf_analyzer ``--input-data`` JSON: one entry (step) per text, batch-1 shapes.

    ``{"data": [{"TEXT": {"content": [text], "shape": [1]},
    "THRESHOLD": {"content": [threshold], "shape": [1]}}, ...]}``; TEXT is sent as BYTES
    (UTF-8). Raises ValueError on an empty list or a threshold outside [0, 1].
    """
    if not texts:
        raise ValueError("input data needs at least one text")
    if not 0.0 <= float(threshold) <= 1.0:
        raise ValueError(f"threshold {threshold} outside [0, 1]")
    return {
        "data": [
            {"TEXT": {"content": [str(t)], "shape": [1]}, "THRESHOLD": {"content": [float(threshold)], "shape": [1]}}
            for t in texts
        ]
    }


def write_input_data(path: Path | str, texts: Sequence[str], threshold: float = THRESHOLD) -> Path:
    """Write :func:`input_data_json` to ``path`` (UTF-8 JSON); returns the path."""
    path = Path(path)
    path.write_text(json.dumps(input_data_json(texts, threshold), ensure_ascii=False), encoding="utf-8")
    return path


def _token_lengths(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Tokens per text, special tokens included, without truncation."""
    if not texts:
        return np.zeros(0, dtype=np.int64)
    enc = tokenizer(list(texts), truncation=False, padding=False, verbose=False)
    return np.array([len(ids) for ids in enc["input_ids"]], dtype=np.int64)


def length_sets(texts: Sequence[str], lengths: Sequence[int], n: int, *, join_length=None,
                bounds: Mapping[str, Tuple[int, int]] = LENGTH_BOUNDS) -> Dict[str, List[str]]:
    """Three input sets by token length from real texts, ``n`` texts each at most.

    ``short`` and ``medium``: texts whose token count (``lengths``) is within the bounds,
    in the given order. ``long``: consecutive texts joined with a space until the joined
    token count (``join_length(text)``; default: the sum of ``lengths`` minus 2 per join,
    the shared [CLS]/[SEP]) reaches the lower bound; joins over the upper bound are
    dropped. Raises ValueError when a set would be empty.
    """
    lengths = [int(x) for x in lengths]
    if len(lengths) != len(texts):
        raise ValueError("texts and lengths differ in length")
    out: Dict[str, List[str]] = {}
    for name in ("short", "medium"):
        lo, hi = bounds[name]
        out[name] = [t for t, k in zip(texts, lengths) if lo <= k <= hi][:n]
    lo, hi = bounds["long"]
    long_texts: List[str] = []
    parts: List[str] = []
    total = 0
    for t, k in zip(texts, lengths):
        parts.append(t)
        total = k if len(parts) == 1 else total + k - 2
        if total >= lo:
            joined = " ".join(parts)
            real = join_length(joined) if join_length else total
            if lo <= real <= hi:
                long_texts.append(joined)
            parts, total = [], 0
            if len(long_texts) >= n:
                break
    out["long"] = long_texts
    for name, sel in out.items():
        if not sel:
            raise ValueError(f"length set {name!r} {bounds[name]} is empty")
    return out


def _length_stats(lengths: Sequence[int]) -> dict:
    a = np.asarray(lengths, dtype=np.float64)
    return {
        "n": int(a.size),
        "tokens_min": int(a.min()),
        "tokens_p50": float(np.percentile(a, 50)),
        "tokens_p90": float(np.percentile(a, 90)),
        "tokens_max": int(a.max()),
        "over_limit": int((a > MAX_SEQUENCE_LENGTH).sum()),
    }


# ----------------------------------------------------------------------------------------
# perf_analyzer runs


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
_NO_STABILITY = ("1000", "3")


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
    keep = [l.strip() for l in output.splitlines()
            if re.search(r"error|failed|unable|invalid|no valid requests|larger time window", l, re.I)]
    if not keep:
        keep = [l.strip() for l in output.splitlines() if l.strip()][-3:]
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
    attempts = [None if settings.check_stability else _NO_STABILITY]
    if settings.check_stability and settings.fallback:
        attempts.append(_NO_STABILITY)
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


_FIGURES = ("throughput", "p50_ms", "p90_ms", "p95_ms", "p99_ms")


def combine_rounds(measurements: Sequence[Mapping]) -> List[dict]:
    """Merge the rounds of each (section, model, dataset, concurrency, batch size) into one entry.

    A level measured once is returned as it is. A level with several rounds becomes one
    dict with the median over its successful rounds of ``throughput`` and each percentile,
    ``stable`` (False if any round was unstable, None if not checked, else True), the
    largest ``throughput_spread_pct`` and ``load_1min``, the summed ``wall_s``, the first
    round's ``command`` and ``interval_ms``, ``error`` (None unless every round failed) and
    ``rounds``: the rounds' own dicts in order. Order: first appearance of each level.
    """
    groups: Dict[tuple, List[Mapping]] = {}
    for m in measurements:
        key = (m.get("section"), m.get("model"), m.get("dataset"), m.get("concurrency"), m.get("batch_size"))
        groups.setdefault(key, []).append(m)
    out = []
    for ms in groups.values():
        if len(ms) == 1:
            out.append(dict(ms[0]))
            continue
        ok = [m for m in ms if not m.get("error")]
        merged = {k: ms[0].get(k) for k in ("section", "model", "dataset", "concurrency", "batch_size", "command", "interval_ms")}
        merged["rounds"] = [dict(m) for m in ms]
        merged["wall_s"] = round(sum(m.get("wall_s") or 0.0 for m in ms), 2)
        loads = [m["load_1min"] for m in ms if m.get("load_1min") is not None]
        merged["load_1min"] = max(loads) if loads else None
        if not ok:
            merged["error"] = ms[-1].get("error")
            out.append(merged)
            continue
        merged["error"] = None
        for k in _FIGURES:
            vals = [m[k] for m in ok if m.get(k) is not None]
            merged[k] = float(np.median(vals)) if vals else None
        stables = [m.get("stable") for m in ok]
        merged["stable"] = False if False in stables else (None if None in stables else True)
        spreads = [m["throughput_spread_pct"] for m in ok if m.get("throughput_spread_pct") is not None]
        merged["throughput_spread_pct"] = max(spreads) if spreads else None
        out.append(merged)
    return out


def paired_ratios(measurements: Sequence[Mapping], model: str, base: str, metric: str, **where) -> List[float]:
    """Per-round ``metric`` ratios of ``model`` over ``base`` at the level ``where`` (e.g.
    section="grid", concurrency=1), pairing the rounds by number: each pair ran back to
    back. Reads ``rounds`` of :func:`combine_rounds` entries (a single measurement is
    round 0); rounds where either failed are skipped."""
    def by_round(name):
        m = next((x for x in measurements if x.get("model") == name and all(x.get(k) == v for k, v in where.items())), None)
        if m is None:
            return {}
        return {x.get("round", 0): x.get(metric) for x in (m.get("rounds") or [m]) if not x.get("error")}

    a, b = by_round(model), by_round(base)
    return [v for r in sorted(set(a) & set(b)) if (v := ratio(a[r], b[r])) is not None]


def paired_median(measurements: Sequence[Mapping], model: str, base: str, metric: str, **where) -> Optional[float]:
    """The median of :func:`paired_ratios` (same arguments); None when there is no pair."""
    rs = paired_ratios(measurements, model, base, metric, **where)
    return float(np.median(rs)) if rs else None


def expected_latency_ms(spec: Spec, measurements: Sequence[Mapping], warmup_ms: Mapping[Tuple[str, str], float]) -> Optional[float]:
    """Expected request latency (ms) of ``spec``, to size its windows.

    From the latest successful measurement of the same model, data and batch size, scaled
    to this concurrency by Little's law (in-flight requests / throughput); else
    ``concurrency * batch_size *`` the warm-up latency of one text (``warmup_ms`` keyed by
    (model, dataset)); None if neither is known.
    """
    for m in reversed(measurements):
        if (m.get("model"), m.get("dataset"), m.get("batch_size")) == (spec.model, spec.dataset, spec.batch_size) \
                and not m.get("error") and m.get("throughput"):
            return max(m["p50_ms"], 1000.0 * spec.concurrency * spec.batch_size / m["throughput"])
    w = warmup_ms.get((spec.model, spec.dataset))
    return None if w is None else spec.concurrency * spec.batch_size * w


# ----------------------------------------------------------------------------------------
# Accuracy (tritonclient) and the raw floor (onnxruntime in-process)


def classify_all(url: str, model: str, texts: Sequence[str], threshold: float = THRESHOLD,
                 batch: int = 64) -> dict:
    """Send ``texts`` through ``model`` over gRPC, ``batch`` texts per request.

    Returns ``{"probabilities": float array, "verdicts": bool array, "routes": list or
    None}``. Raises tritonclient's InferenceServerException on an error response.
    """
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    probs, verdicts, routes = [], [], []
    try:
        outputs = [o["name"] for o in client.get_model_metadata(model, as_json=True)["outputs"]]
        for i in range(0, len(texts), batch):
            part = texts[i : i + batch]
            arr = np.array([t.encode("utf-8") for t in part], dtype=np.object_).reshape(-1, 1)
            thr = np.full((len(part), 1), threshold, dtype=np.float32)
            inputs = [grpcclient.InferInput("TEXT", list(arr.shape), "BYTES"),
                      grpcclient.InferInput("THRESHOLD", list(thr.shape), "FP32")]
            inputs[0].set_data_from_numpy(arr)
            inputs[1].set_data_from_numpy(thr)
            res = client.infer(model, inputs)
            probs.append(res.as_numpy("PROBABILITIES").reshape(-1))
            verdicts.append(res.as_numpy("VERDICTS").reshape(-1))
            if "ROUTE" in outputs:
                routes += [r.decode() if isinstance(r, bytes) else str(r) for r in res.as_numpy("ROUTE").reshape(-1)]
    finally:
        client.close()
    return {
        "probabilities": np.concatenate(probs).astype(np.float64),
        "verdicts": np.concatenate(verdicts).astype(bool),
        "routes": routes if routes else None,
    }


def accuracy_summary(labels: Sequence[int], verdicts: Sequence[bool], routes: Optional[Sequence[str]] = None) -> dict:
    """``{"n", "correct", "accuracy_pct"}`` (+ ``"routes"``: count per route) of verdicts vs labels."""
    y = np.asarray(labels, dtype=bool)
    v = np.asarray(verdicts, dtype=bool)
    out = {"n": int(y.size), "correct": int((y == v).sum()), "accuracy_pct": 100.0 * float((y == v).mean())}
    if routes is not None:
        counts: Dict[str, int] = {}
        for r in routes:
            counts[r] = counts.get(r, 0) + 1
        out["routes"] = dict(sorted(counts.items()))
    return out


def token_batches(tokenizer, texts: Sequence[str], batch_size: int = 1, pad_to: Optional[int] = None,
                  max_length: int = MAX_SEQUENCE_LENGTH) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``(input_ids, attention_mask)`` int64 batches as the ensemble's tokenizer makes them:
    truncated to ``max_length`` tokens, padded to the batch's longest text (or ``pad_to``)."""
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[i : i + batch_size]), truncation=True, max_length=max_length, padding=False)
        longest = max(len(x) for x in enc["input_ids"])
        padded = tokenizer.pad(enc, padding="max_length", max_length=max(longest, pad_to or 0), return_tensors="np")
        out.append((padded["input_ids"].astype(np.int64), padded["attention_mask"].astype(np.int64)))
    return out


def latency_summary(latencies_ms: Sequence[float], rows: int) -> dict:
    """p50/p90/p99/mean of per-call latencies (ms) and ``throughput`` = rows / total time (rows/s)."""
    a = np.asarray(latencies_ms, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no latencies")
    return {
        "calls": int(a.size),
        "rows": int(rows),
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "throughput": float(rows / (a.sum() / 1000.0)),
    }


def time_raw_model(session, batches: Sequence[Tuple[np.ndarray, np.ndarray]], warmup: int = 5) -> dict:
    """Time ``session.run`` on each batch in turn (one stream, this process); see :func:`latency_summary`."""
    output = session.get_outputs()[0].name
    for ids, mask in list(batches)[:warmup]:
        session.run([output], {"input_ids": ids, "attention_mask": mask})
    lat = []
    for ids, mask in batches:
        t0 = time.perf_counter()
        session.run([output], {"input_ids": ids, "attention_mask": mask})
        lat.append((time.perf_counter() - t0) * 1000.0)
    return latency_summary(lat, sum(ids.shape[0] for ids, _ in batches))


#: Texts per raw-floor round: ``main`` (classifier and classifier_fast, batch 1), ``pad512``
#: (classifier on 512-token inputs), ``per_set`` (each length set), ``per_batch`` (texts per
#: client-batch size).
RAW_SIZES = {"main": 600, "pad512": 40, "per_set": 100, "per_batch": 256}
RAW_SIZES_QUICK = {"main": 100, "pad512": 8, "per_set": 40, "per_batch": 64}


def raw_floor_batches(tokenizer, texts: Sequence[str], sets: Mapping[str, Sequence[str]], sizes: Mapping[str, int]) -> dict:
    """``{floor name: (session key, token batches)}`` for :func:`raw_floor_round` (see the report, section 3)."""
    main = token_batches(tokenizer, texts[: sizes["main"]])
    out = {
        "classifier": ("classifier", main),
        "classifier_fast": ("classifier_fast", main),
        "classifier_pad512": ("classifier", token_batches(tokenizer, texts[: sizes["pad512"]], pad_to=512)),
    }
    for name in ("short", "medium", "long"):
        out[f"classifier_{name}"] = ("classifier", token_batches(tokenizer, list(sets[name])[: sizes["per_set"]]))
    for b in BATCH_SIZES:
        out[f"classifier_batch{b}"] = ("classifier", token_batches(tokenizer, texts[: max(sizes["per_batch"], 4 * b)], b))
    return out


def raw_floor_round(sessions: Mapping[str, object], batches: Mapping[str, tuple]) -> Dict[str, dict]:
    """One round of :func:`time_raw_model` over every floor of :func:`raw_floor_batches`."""
    return {name: time_raw_model(sessions[key], b) for name, (key, b) in batches.items()}


def combine_raw_rounds(rounds: Sequence[Mapping[str, dict]]) -> Dict[str, dict]:
    """Per floor, the round with the lowest p50 (the least disturbed by other processes:
    the floor is a minimum), plus ``round`` (its 1-based index) and ``round_p50_ms`` (every
    round's p50, ms)."""
    out = {}
    for name in rounds[0] if rounds else ():
        p50s = [r[name]["p50_ms"] for r in rounds]
        best = int(np.argmin(p50s))
        out[name] = {**rounds[best][name], "round": best + 1, "round_p50_ms": p50s}
    return out


# ----------------------------------------------------------------------------------------
# Ratios and goals


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """``numerator / denominator``; None when either is missing or the denominator is not > 0."""
    if numerator is None or denominator is None:
        return None
    try:
        if not denominator > 0 or not np.isfinite(numerator) or not np.isfinite(denominator):
            return None
    except TypeError:
        return None
    return float(numerator) / float(denominator)


def _find(measurements: Iterable[Mapping], **where) -> Optional[Mapping]:
    for m in measurements:
        if all(m.get(k) == v for k, v in where.items()) and m.get("error") is None:
            return m
    return None


def _metric(measurements, metric: str, **where) -> Optional[float]:
    m = _find(measurements, **where)
    return None if m is None else m.get(metric)


def compute_ratios(measurements: Sequence[Mapping], accuracy: Mapping[str, Mapping], raw: Mapping[str, Mapping]) -> dict:
    """The report's headline ratios, all from one run (None where a figure is missing).

    Keys: ``router_single_p50_c1_vs_ensemble`` (p50 ratio at c=1: the median of the
    per-round ratios, :func:`paired_median`; ``..._rounds`` lists them),
    ``router_single_throughput_c16_vs_ensemble``, ``router_throughput_c16_vs_ensemble_pad512``,
    ``router_throughput_c16_vs_ensemble``, ``ensemble_throughput_c16_vs_ensemble_pad512``,
    ``router_accuracy_points_vs_ensemble`` (percentage points, router - ensemble; a
    difference, not a ratio), and ``<model>_p50_c1_vs_raw`` (end-to-end p50 at c=1 over the
    raw floor's p50: ``classifier`` for the ensemble and router_single, ``classifier_pad512``
    for ensemble_pad512, ``classifier_fast`` for the router's first step).
    """
    g = [m for m in measurements if m.get("section") == "grid"]

    def val(model, metric, c):
        return _metric(g, metric, model=model, concurrency=c)

    out = {
        "router_single_p50_c1_vs_ensemble": paired_median(g, "router_single", "ensemble", "p50_ms", concurrency=1),
        "router_single_p50_c1_vs_ensemble_rounds": paired_ratios(g, "router_single", "ensemble", "p50_ms", concurrency=1),
        "router_single_throughput_c16_vs_ensemble": ratio(val("router_single", "throughput", 16), val("ensemble", "throughput", 16)),
        "router_throughput_c16_vs_ensemble_pad512": ratio(val("router", "throughput", 16), val("ensemble_pad512", "throughput", 16)),
        "router_throughput_c16_vs_ensemble": ratio(val("router", "throughput", 16), val("ensemble", "throughput", 16)),
        "ensemble_throughput_c16_vs_ensemble_pad512": ratio(val("ensemble", "throughput", 16), val("ensemble_pad512", "throughput", 16)),
        "router_single_bls_p50_c1_vs_ensemble": paired_median(g, "router_single_bls", "ensemble", "p50_ms", concurrency=1),
        "router_single_bls_throughput_c16_vs_ensemble": ratio(
            val("router_single_bls", "throughput", 16), val("ensemble", "throughput", 16)
        ),
        "router_bls_throughput_c16_vs_ensemble_pad512": ratio(
            val("router_bls", "throughput", 16), val("ensemble_pad512", "throughput", 16)
        ),
    }
    acc_r, acc_e = accuracy.get("router", {}).get("accuracy_pct"), accuracy.get("ensemble", {}).get("accuracy_pct")
    out["router_accuracy_points_vs_ensemble"] = None if acc_r is None or acc_e is None else acc_r - acc_e
    floors = {"ensemble": "classifier", "router_single": "classifier", "ensemble_pad512": "classifier_pad512",
              "router": "classifier_fast"}
    for model, floor in floors.items():
        out[f"{model}_p50_c1_vs_raw"] = ratio(val(model, "p50_ms", 1), raw.get(floor, {}).get("p50_ms"))
    return out


def evaluate_goals(ratios: Mapping[str, Optional[float]], goals: Sequence[Mapping] = GOALS) -> List[dict]:
    """Each goal with ``value`` (from ``ratios``) and ``met`` (True, False, or None if unmeasured)."""
    out = []
    for goal in goals:
        value = ratios.get(goal["key"])
        met = None if value is None else (value <= goal["bound"] if goal["op"] == "<=" else value >= goal["bound"])
        out.append({**goal, "value": value, "met": met})
    return out


# ----------------------------------------------------------------------------------------
# Machine description


def cpu_model() -> Optional[str]:
    """The CPU's ``model name`` from ``/proc/cpuinfo``, or None where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine_info() -> dict:
    """Cores, CPU model (``/proc/cpuinfo``), memory (``/proc/meminfo``), kernel, Python, load."""
    cpu = cpu_model() or "unknown"
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError):
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {
        "cores": cores,
        "cpu_model": cpu,
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
    }


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


def _git_revision() -> Optional[str]:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"{rev}{' (uncommitted changes)' if dirty else ''}" if rev else None


def _load() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# ----------------------------------------------------------------------------------------
# The report


def _fmt(x, digits=1, suffix="") -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}f}{suffix}"


def _x(x) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _met(m) -> str:
    return {True: "**met**", False: "**not met**", None: "not measured"}[m]


def _stable(m: Mapping) -> str:
    if m.get("error"):
        return "failed"
    return {True: "yes", False: "no (3-window fallback)", None: "not checked"}[m.get("stable")]


def _what_we_tried(existing: Optional[str]) -> str:
    if existing and WHAT_WE_TRIED_START in existing and WHAT_WE_TRIED_END in existing:
        start = existing.index(WHAT_WE_TRIED_START)
        end = existing.index(WHAT_WE_TRIED_END) + len(WHAT_WE_TRIED_END)
        return existing[start:end]
    return f"{WHAT_WE_TRIED_START}\n{WHAT_WE_TRIED_PLACEHOLDER}\n{WHAT_WE_TRIED_END}"


def render_report(results: Mapping, existing: Optional[str] = None, plots_dir: str = "bench") -> str:
    """``benchmarks.md`` from a run's ``results`` (pure: every figure comes from ``results``).

    ``existing``: the current file, whose "What we tried" block (between the
    ``what-we-tried`` markers) is kept as it is.
    """
    r = results
    meas = r["measurements"]
    mach = r["machine"]
    ratios = r["ratios"]
    acc = r.get("accuracy", {})
    raw = r.get("raw", {})
    L = []
    add = L.append
    add("# Benchmarks: router vs ensemble vs the raw model")
    add("")
    add(f"Generated by `{r['command']}` on {r['created_utc']} (UTC), {r['wall_s']:.0f} s wall time. "
        "Every figure below is from that one run (one server, the same data); raw results: "
        f"[`{plots_dir}/results.json`]({plots_dir}/results.json). Regenerate with `make bench` "
        "(full, under 15 minutes on 2 cores) or `python -m orchestrator.tooling.bench --quick` (under 2 minutes).")
    add("")
    if r.get("quick"):
        add("> **`--quick` run**: short windows and no stability check; the figures are a smoke test, not a benchmark.")
        add("")
    if r.get("models", {}).get("training", {}).get("quick"):
        add(f"> **The models measured are from a `--quick` training run** "
            f"(`{r['models']['training'].get('command')}`): accuracy figures are not meaningful.")
        add("")
    add("## Machine and software")
    add("")
    add("| | |")
    add("|---|---|")
    add(f"| CPU | {mach['cpu_model']}, {mach['cores']} cores |")
    add(f"| memory | {_fmt(mach.get('memory_gib'))} GiB |")
    add(f"| OS, kernel | {mach.get('os')}, {mach.get('kernel')} |")
    add(f"| Triton | {r['triton']['version']} (embedded, `nvidia-pytriton` wheel; Python backend, ONNX models through onnxruntime {r['software'].get('onnxruntime')} in Python models) |")
    add(f"| load generator | {r['software']['perf_analyzer']} (gRPC, same machine) |")
    add(f"| Python | {mach.get('python')} |")
    add(f"| code | {r.get('git') or 'n/a'} |")
    peak = r["load"].get("max_1min_during")
    add(f"| load average (1, 5, 15 min) | before: {', '.join(map(str, r['load']['before']))}; after: {', '.join(map(str, r['load']['after']))}"
        + (f"; highest 1-min value after a load run: {peak}" if peak is not None else "") + " |")
    add("")
    add("perf_analyzer, the server (tokenizer, classifiers, postprocess and router in Python-backend "
        "stub processes) and the raw-model timing share these cores; other processes on the machine "
        "add noise. The load average *before* is other processes' load; the values after and during "
        "include this benchmark's own server and perf_analyzer. Ratios of models measured in the same "
        "run are more trustworthy than absolute figures.")
    add("")

    add("## Goals (issue 6)")
    add("")
    add("| goal | measured | bound | |")
    add("|---|---|---|---|")
    for g in r["goals"]:
        v = g["value"]
        shown = "n/a" if v is None else (f"{v:+.2f} points" if "points" in g["key"] else f"{v:.2f}x")
        bound = f"{g['bound']:+.0f} points" if "points" in g["key"] else f"{g['bound']:.2f}x"
        per_round = ratios.get(f"{g['key']}_rounds") or []
        if v is not None and len(per_round) > 1:
            shown += f" (median of {len(per_round)} rounds: " + ", ".join(f"{x:.2f}x" for x in per_round) + ")"
        add(f"| {g['goal']} | {shown} | {g['op']} {bound} | {_met(g['met'])} |")
    add("")

    grid = [m for m in meas if m["section"] == "grid"]
    add("## 1. Routing overhead: the same classifier behind an ensemble and behind the router")
    add("")
    add(f"Held-out test texts ({r['datasets']['held_out']['n']} real sentences, "
        f"{r['datasets']['held_out']['tokens_p50']:.0f} tokens median, {r['datasets']['held_out']['tokens_max']} max), "
        "one text per request, THRESHOLD 0.5. `ensemble_pad512` is the seeds' ensemble (every text padded to "
        "512 tokens); `ensemble` pads to the longest text of each batch; `router_single` is the router with "
        "the single-classifier policy (every text goes to `classifier`, the ensemble's model), so its "
        "difference from `ensemble` is the routing overhead. Ratios are against `ensemble` at the same concurrency.")
    add("")
    add("| model | concurrency | throughput (infer/s) | p50 (ms) | p90 (ms) | p99 (ms) | throughput / ensemble | p50 / ensemble | stable | window spread |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for c in CONCURRENCIES:
        base = _find(grid, model="ensemble", concurrency=c)
        for model in GRID_MODELS:
            m = _find(grid, model=model, concurrency=c) or next(
                (x for x in grid if x["model"] == model and x["concurrency"] == c), None)
            if m is None:
                continue
            if m.get("error"):
                add(f"| `{model}` | {c} | failed: {m['error'][:120]} | | | | | | failed | |")
                continue
            p50_ratio = (paired_median(grid, model, "ensemble", "p50_ms", concurrency=c) if m.get("rounds")
                         else ratio(m['p50_ms'], base and base['p50_ms']))
            add(f"| `{model}` | {c} | {_fmt(m['throughput'])} | {_fmt(m['p50_ms'], 2)} | {_fmt(m['p90_ms'], 2)} | "
                f"{_fmt(m['p99_ms'], 2)} | {_x(ratio(m['throughput'], base and base['throughput']))} | "
                f"{_x(p50_ratio)} | {_stable(m)} | {_fmt(m.get('throughput_spread_pct'), 0, '%')} |")
    add("")
    multi = sorted({m["concurrency"] for m in grid if len(m.get("rounds") or []) > 1})
    if multi:
        n_rounds = max(len(m["rounds"]) for m in grid if m.get("rounds"))
        add(f"Concurrency {', '.join(map(str, multi))}: measured in {n_rounds} rounds (every model once per round, "
            "rounds back to back). The row shows the median of each figure over the rounds; *p50 / ensemble* is "
            "the median of the per-round ratios (each pair of measurements ran minutes apart at most, so "
            "drifting background load cancels); *stable* is *no* if any round was not; *window spread* is the "
            "largest of the rounds'. Per-round p50 (ms):")
        add("")
        add("| model | concurrency | " + " | ".join(f"round {k + 1}" for k in range(n_rounds)) + " |")
        add("|---|---:|" + "---:|" * n_rounds)
        for c in multi:
            for model in GRID_MODELS:
                m = next((x for x in grid if x["model"] == model and x["concurrency"] == c and x.get("rounds")), None)
                if m is None:
                    continue
                cells = [("failed" if x.get("error") else _fmt(x.get("p50_ms"), 2)) for x in m["rounds"]]
                add(f"| `{model}` | {c} | " + " | ".join(cells + [""] * (n_rounds - len(cells))) + " |")
        add("")
    add("*window spread*: how far apart the throughputs of the 3 reported windows are (100 x (max / min - 1), "
        "from perf_analyzer's profile export); a large spread means the level was disturbed.")
    add("")
    add(f"![latency percentiles per concurrency]({plots_dir}/latency.png)")
    add("")
    add(f"![throughput per concurrency]({plots_dir}/throughput.png)")
    add("")

    add("## 2. What routing buys: default router vs ensemble vs the seeds' ensemble")
    add("")
    n_acc = acc.get("ensemble", {}).get("n")
    add(f"Accuracy: verdicts (probability >= 0.5) against the human labels of the same {n_acc} held-out "
        "texts, sent through each model with tritonclient (gRPC, 64 texts per request). Throughput at c=16 from section 1.")
    add("")
    add("| model | accuracy (%) | accuracy - ensemble (points) | throughput c=16 (infer/s) | throughput / ensemble_pad512 | routes |")
    add("|---|---:|---:|---:|---:|---|")
    pad = _metric(grid, "throughput", model="ensemble_pad512", concurrency=16)
    for model in GRID_MODELS:
        a = acc.get(model, {})
        thr = _metric(grid, "throughput", model=model, concurrency=16)
        diff = None if a.get("accuracy_pct") is None or acc.get("ensemble", {}).get("accuracy_pct") is None else (
            a["accuracy_pct"] - acc["ensemble"]["accuracy_pct"])
        routes = ", ".join(f"{k}: {v}" for k, v in a.get("routes", {}).items()) or ""
        shown_acc = _fmt(a.get("accuracy_pct"), 2) if a else "not scored"
        add(f"| `{model}` | {shown_acc} | {'' if diff is None else f'{diff:+.2f}'} | {_fmt(thr)} | {_x(ratio(thr, pad))} | {routes} |")
    agree = acc.get("ensemble_pad512_agreement")
    add("")
    if agree:
        add(f"`ensemble_pad512` was not scored on all texts (padding to 512 costs minutes); on the first "
            f"{agree['n']} texts its verdicts agree with `ensemble`'s on {agree['same_verdicts']} of {agree['n']} "
            f"(largest probability difference {agree['max_abs_probability_diff']:.2e}), as the model card says "
            "(same logits with either padding), so its accuracy is the ensemble's.")
        add("")

    add("## 3. The compute floor: the raw ONNX model in-process")
    add("")
    add("The same `model.onnx` files called directly through `onnxruntime.InferenceSession.run` in the "
        "benchmark process (CPU provider, default threads, like the server's Python models), one call per "
        "text in turn, on the token batches the ensemble's tokenizer makes (truncated to 128 tokens; padded "
        "to the text's length, or to 512 for the seeds'). The floor is timed in "
        f"{r.get('raw_rounds', 1)} rounds spread over the run (server idle) and the round with the lowest p50 "
        "counts (a floor is a minimum; every round's p50 is in results.json). End-to-end figures are "
        "perf_analyzer's p50 at c=1.")
    add("")
    add("| end-to-end model | floor | floor p50 (ms) | floor p99 (ms) | end-to-end p50 (ms) | end-to-end / floor |")
    add("|---|---|---:|---:|---:|---:|")
    floors = (("ensemble", "classifier"), ("ensemble_pad512", "classifier_pad512"),
              ("router_single", "classifier"), ("router", "classifier_fast"))
    for model, floor in floors:
        f = raw.get(floor, {})
        e2e = _metric(grid, "p50_ms", model=model, concurrency=1)
        add(f"| `{model}` | `{floor}` ({f.get('calls', 'n/a')} texts) | {_fmt(f.get('p50_ms'), 2)} | {_fmt(f.get('p99_ms'), 2)} | "
            f"{_fmt(e2e, 2)} | {_x(ratios.get(f'{model}_p50_c1_vs_raw'))} |")
    add("")
    add("The router's floor is `classifier_fast` (its first step); texts it is unsure of also pay for `classifier`.")
    if any((ratios.get(f"{m}_p50_c1_vs_raw") or 2.0) < 1.0 for m, _ in floors):
        add(" A multiple below 1x means the in-process timing was slowed by other processes more than the "
            "server was: read it as \"no measurable overhead\", not as a speed-up.")
    add("")

    add("## 4. Cost growth")
    add("")
    add(f"### Text length (concurrency {SWEEP_CONCURRENCY}, one text per request)")
    add("")
    add("Sets from held-out texts by token count (special tokens included): short and medium are single "
        "sentences; long ones join consecutive held-out sentences past the classifiers' 128-token limit, "
        "so the router chunks them (128-token windows, stride 96) while the ensemble truncates them to "
        "their first 128 tokens. Floor: raw `classifier`, batch 1, on the truncated tokens.")
    add("")
    add("| set | texts | tokens (min / median / max) | model | throughput (infer/s) | p50 (ms) | p99 (ms) | throughput / same model on short | floor p50 (ms) | stable |")
    add("|---|---:|---|---|---:|---:|---:|---:|---:|---|")
    lm = [m for m in meas if m["section"] == "length"]
    for d in ("short", "medium", "long"):
        ds = r["datasets"].get(d, {})
        for model in LENGTH_MODELS:
            m = next((x for x in lm if x["model"] == model and x["dataset"] == d), None)
            if m is None:
                continue
            short = _metric(lm, "throughput", model=model, dataset="short")
            floor = raw.get(f"classifier_{d}", {}).get("p50_ms")
            if m.get("error"):
                add(f"| {d} | {ds.get('n')} | | `{model}` | failed: {m['error'][:100]} | | | | | failed |")
                continue
            add(f"| {d} | {ds.get('n')} | {ds.get('tokens_min')} / {_fmt(ds.get('tokens_p50'), 0)} / {ds.get('tokens_max')} | "
                f"`{model}` | {_fmt(m['throughput'])} | {_fmt(m['p50_ms'], 2)} | {_fmt(m['p99_ms'], 2)} | "
                f"{_x(ratio(m['throughput'], short))} | {_fmt(floor, 2)} | {_stable(m)} |")
    add("")
    add(f"![cost by text length]({plots_dir}/length.png)")
    add("")
    add(f"### Client batch (concurrency {SWEEP_CONCURRENCY}, held-out texts)")
    add("")
    add("Throughput counts texts (a request of batch 16 is 16 inferences); latency is per request. "
        "Floor: raw `classifier` on batches of the same size (padded to each batch's longest text), rows/s in one stream.")
    add("")
    add("| model | client batch | throughput (infer/s) | p50 (ms) | p99 (ms) | throughput / batch 1 | floor throughput (rows/s) | stable |")
    add("|---|---:|---:|---:|---:|---:|---:|---|")
    bm = [m for m in meas if m["section"] == "batch"]
    for m in bm:
        b1 = _metric(bm, "throughput", model=m["model"], batch_size=1)
        floor = raw.get(f"classifier_batch{m['batch_size']}", {}).get("throughput")
        if m.get("error"):
            add(f"| `{m['model']}` | {m['batch_size']} | failed: {m['error'][:100]} | | | | | failed |")
            continue
        add(f"| `{m['model']}` | {m['batch_size']} | {_fmt(m['throughput'])} | {_fmt(m['p50_ms'], 2)} | {_fmt(m['p99_ms'], 2)} | "
            f"{_x(ratio(m['throughput'], b1))} | {_fmt(floor)} | {_stable(m)} |")
    add("")
    add(f"![cost by client batch]({plots_dir}/batch.png)")
    add("")

    s = r["settings"]
    add("## Method")
    add("")
    add(f"- Server: one embedded Triton {r['triton']['version']} on a temporary copy of `model_repository/` "
        "with the benchmark-only variants of `orchestrator.tooling.bench.VARIANTS` added; every model loaded, one "
        "instance each, as configured (`configs/embedded.pbtxt` where present).")
    add(f"- Load: `perf_analyzer` over gRPC on loopback, `--input-data` JSON with one real text per entry "
        f"(THRESHOLD 0.5), `--concurrency-range` 1, 4, 16 (one invocation per level), time windows of at least "
        f"{s['measurement_interval_ms']} ms, longer for slow levels (about {s.get('latencies_per_window', 10)} request "
        f"latencies, at most {s.get('max_interval_ms', s['measurement_interval_ms'])} ms; each level's window is "
        "`interval_ms` in results.json), "
        + ("stability: the last 3 windows within "
           f"{s['stability_percentage']:g}% (`--stability-percentage`, on throughput and p50 via `--percentile 50`), "
           f"at most {s['max_trials']} windows; a level that never stabilised is measured again over exactly 3 "
           "windows and marked `no` under *stable*."
           if s["check_stability"] else "exactly 3 windows, no stability check (`--stability-percentage 1000 --max-trials 3`).")
        + " Throughput and percentiles are perf_analyzer's (`-f` CSV) over the final windows; client-side latency.")
    rounds = r.get("plan", {}).get("grid_rounds") or {}
    rounds_text = "".join(f"; concurrency {c} in {n} such rounds" for c, n in sorted((int(c), n) for c, n in rounds.items()) if n > 1)
    add("- Order: the grid runs model after model within each concurrency level, so drifting background "
        f"load falls on all models alike{rounds_text}; the sweeps follow. Before any measurement every model answered the "
        "accuracy texts (warm-up).")
    add("- Example command (paths shortened): `" + _short_command(meas) + "`")
    add("- Data: `orchestrator.tooling.modeling.data.held_out_examples()` (the test split, never seen in training), shuffled "
        "with a fixed seed so every prefix keeps the real length distribution.")
    models = r.get("models", {})
    if models.get("onnx"):
        add("- Models measured: " + ", ".join(f"`{k}` sha256 {v['sha256'][:12]}" for k, v in models["onnx"].items())
            + (f"; trained by `{models['training'].get('command')}` at {models['training'].get('created_utc')} (UTC)"
               if models.get("training") else "") + ".")
    add("")
    add("## What we tried")
    add("")
    add(_what_we_tried(existing))
    add("")
    if existing and FEATURES_START in existing and FEATURES_END in existing:
        add(existing[existing.index(FEATURES_START):existing.index(FEATURES_END) + len(FEATURES_END)])
        add("")
    return "\n".join(L)


def _short_command(meas: Sequence[Mapping]) -> str:
    m = next((x for x in meas if x.get("command")), None)
    if m is None:
        return "n/a"
    parts = shlex.split(m["command"])
    parts[0] = "perf_analyzer"
    for i, p in enumerate(parts):
        if i and parts[i - 1] in ("--input-data", "-f", "--profile-export-file"):
            parts[i] = Path(p).name
    return shlex.join(parts)


def write_plots(results: Mapping, out_dir: Path | str) -> List[Path]:
    """PNG plots (matplotlib, Agg) into ``out_dir``: latency.png (p50/p90/p99 per
    concurrency and model), throughput.png, length.png, batch.png. Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meas = [m for m in results["measurements"] if not m.get("error")]
    grid = [m for m in meas if m["section"] == "grid"]
    paths = []
    stamp = f"{results['machine']['cpu_model']}, {results['machine']['cores']} cores; {results['created_utc']} UTC"

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for ax, p in zip(axes, (50, 90, 99)):
        for model in GRID_MODELS:
            pts = sorted((m["concurrency"], m[f"p{p}_ms"]) for m in grid if m["model"] == model)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=model)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(CONCURRENCIES, [str(c) for c in CONCURRENCIES])
        ax.set_title(f"p{p} latency")
        ax.set_xlabel("concurrency")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("ms")
    axes[0].legend()
    fig.suptitle(f"Latency per concurrency (perf_analyzer, gRPC, batch 1) — {stamp}", fontsize=9)
    fig.tight_layout()
    paths.append(out_dir / "latency.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for model in GRID_MODELS:
        pts = sorted((m["concurrency"], m["throughput"]) for m in grid if m["model"] == model)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=model)
    ax.set_xscale("log", base=2)
    ax.set_xticks(CONCURRENCIES, [str(c) for c in CONCURRENCIES])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("infer/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"Throughput per concurrency\n{stamp}", fontsize=9)
    fig.tight_layout()
    paths.append(out_dir / "throughput.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    for section, key, labels, title in (
        ("length", "dataset", ("short", "medium", "long"), f"Text length (concurrency {SWEEP_CONCURRENCY})"),
        ("batch", "batch_size", BATCH_SIZES, f"Client batch (concurrency {SWEEP_CONCURRENCY})"),
    ):
        sel = [m for m in meas if m["section"] == section]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for model in dict.fromkeys(m["model"] for m in sel):
            xs = [i for i, lab in enumerate(labels) for m in sel if m["model"] == model and m[key] == lab]
            for ax, metric in zip(axes, ("throughput", "p99_ms")):
                ys = [m[metric] for lab in labels for m in sel if m["model"] == model and m[key] == lab]
                ax.plot(xs, ys, marker="o", label=model)
        if section == "length":
            ticks = [f"{lab}\n({results['datasets'].get(lab, {}).get('tokens_p50', 0):.0f} tokens median)" for lab in labels]
        else:
            ticks = [str(lab) for lab in labels]
        for ax, ylabel in zip(axes, ("throughput (infer/s)", "p99 latency (ms)")):
            ax.set_xticks(range(len(labels)), ticks)
            ax.set_xlabel("text length set" if section == "length" else "client batch size (texts per request)")
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.suptitle(f"{title} — {stamp}", fontsize=9)
        fig.tight_layout()
        paths.append(out_dir / f"{section}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


# ----------------------------------------------------------------------------------------
# The run


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _training_info(repo: Path) -> dict:
    try:
        meta = json.loads((repo / "training_metrics.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: meta.get(k) for k in ("command", "quick", "created_utc")}


def run_benchmark(out: Path | str = "docs", *, quick: bool = False, repo: Path | str = REPO,
                  tool_dir: Path | str = DEFAULT_TOOL_DIR, settings: Optional[PASettings] = None,
                  command: str = "python -m orchestrator.tooling.bench") -> dict:
    """Run the whole benchmark and write ``<out>/benchmarks.md`` and ``<out>/bench/``.

    ``quick``: fewer texts (200 for accuracy, 100 per length set, :data:`RAW_SIZES_QUICK`
    and two raw-floor rounds instead of three), :data:`QUICK_SETTINGS`.
    Returns the results dict (also ``<out>/bench/results.json``). Raises BenchError or
    ServerError (see the module docstring).
    """
    from transformers import AutoTokenizer
    import onnxruntime as ort

    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    t_start = time.monotonic()
    settings = settings or (QUICK_SETTINGS if quick else FULL_SETTINGS)
    out = Path(out)
    load_before = _load()
    _log(f"load average before: {load_before}")
    binary = install_perf_analyzer(tool_dir)
    pa_version = perf_analyzer_version(binary)

    with tempfile.TemporaryDirectory(prefix="orchestrator-bench-") as tmp:
        tmp = Path(tmp)
        bench_repo = make_bench_repository(tmp / "model_repository", repo)
        onnx_files = _model_files(bench_repo)
        tokenizer = AutoTokenizer.from_pretrained(str(bench_repo / "tokenizer" / "1"))

        # Data: the held-out split, shuffled with a fixed seed (every prefix keeps the length mix).
        try:
            held_out = data.held_out_examples()
        except Exception as exc:  # DataUnavailableError, DataFormatError
            raise BenchError(f"cannot load the held-out split: {exc}") from exc
        # the order of held_out_examples(n=len, seed=0), without loading the split twice
        examples = [held_out[i] for i in np.random.RandomState(0).permutation(len(held_out))]
        texts = [e.text for e in examples]
        labels = [int(e.label) for e in examples]
        lengths = _token_lengths(tokenizer, texts)
        n_acc = 200 if quick else len(texts)
        n_len = 100 if quick else 200
        sets = {"held_out": texts}
        sets.update(length_sets(texts, lengths, n_len, join_length=lambda t: int(_token_lengths(tokenizer, [t])[0])))
        datasets = {name: _length_stats(_token_lengths(tokenizer, sel)) for name, sel in sets.items()}
        files = {name: write_input_data(tmp / f"input-{name}.json", sel) for name, sel in sets.items()}

        # The raw floor: rounds before the server starts, after the accuracy pass and at the
        # end (server idle each time); the least-disturbed round counts (raw_floor_round).
        sessions = {m: ort.InferenceSession(str(bench_repo / m / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
                    for m in ("classifier", "classifier_fast")}
        sizes = RAW_SIZES_QUICK if quick else RAW_SIZES
        raw_batches = raw_floor_batches(tokenizer, texts, sets, sizes)
        raw_rounds = []

        def raw_round(when: str) -> None:
            _log(f"raw ONNX floor, round {len(raw_rounds) + 1} ({when}): onnxruntime in-process")
            raw_rounds.append(raw_floor_round(sessions, raw_batches))
            for k, v in raw_rounds[-1].items():
                _log(f"  {k}: p50 {v['p50_ms']:.2f} ms, {v['throughput']:.0f} rows/s ({v['calls']} calls)")

        raw_round("before the server starts")

        _log(f"starting the embedded Triton server on {bench_repo}")
        with TritonServer(bench_repo) as server:
            client = server.client()
            try:
                triton = {"version": client.get_server_metadata()["version"]}
            finally:
                client.close()
            url = server.grpc_url

            _log(f"accuracy on {n_acc} held-out texts (also the warm-up)")
            accuracy = {}
            for model in ("ensemble", "router_single", "router"):
                res = classify_all(url, model, texts[:n_acc])
                accuracy[model] = accuracy_summary(labels[:n_acc], res["verdicts"], res["routes"])
                _log(f"  {model}: {accuracy[model]['accuracy_pct']:.2f}% {accuracy[model].get('routes', '')}")
            n_agree = 16 if quick else 64
            pad_res = classify_all(url, "ensemble_pad512", texts[:n_agree], batch=16)
            ens_res = classify_all(url, "ensemble", texts[:n_agree])
            accuracy["ensemble_pad512_agreement"] = {
                "n": n_agree,
                "same_verdicts": int((pad_res["verdicts"] == ens_res["verdicts"]).sum()),
                "max_abs_probability_diff": float(np.abs(pad_res["probabilities"] - ens_res["probabilities"]).max()),
            }
            if not quick:
                raw_round("server idle, after the accuracy pass")
            plan = bench_plan(quick)
            # Warm-up of every (model, data) pair; its one-text latency sizes the first windows.
            warmup_ms = {}
            for key in dict.fromkeys((spec.model, spec.dataset) for spec in plan):
                lat = []
                for text in sets[key[1]][:6]:
                    t0 = time.perf_counter()
                    classify_all(url, key[0], [text])
                    lat.append((time.perf_counter() - t0) * 1000.0)
                warmup_ms[key] = float(np.median(lat[1:]))
            measurements = []
            for i, spec in enumerate(plan, 1):
                m = measure(binary, spec, url, files[spec.dataset], tmp / "pa", settings,
                            latency_ms=expected_latency_ms(spec, measurements, warmup_ms))
                m["load_1min"] = (_load() or [None])[0]
                measurements.append(m)
                if m.get("error"):
                    _log(f"[{i}/{len(plan)}] {spec.section} {spec.model} {spec.dataset} c={spec.concurrency} "
                         f"b={spec.batch_size} round {spec.round + 1}: FAILED {m['error']}")
                else:
                    _log(f"[{i}/{len(plan)}] {spec.section} {spec.model} {spec.dataset} c={spec.concurrency} "
                         f"b={spec.batch_size} round {spec.round + 1}: {m['throughput']:.1f} infer/s, p50 {m['p50_ms']:.2f} ms, "
                         f"p99 {m['p99_ms']:.2f} ms, stable {m['stable']}, windows of {m['interval_ms']} ms, {m['wall_s']:.0f} s")

            raw_round("server idle, after the load runs")
    measurements = combine_rounds(measurements)
    raw = combine_raw_rounds(raw_rounds)
    ratios = compute_ratios(measurements, accuracy, raw)
    during = [m["load_1min"] for m in measurements if m.get("load_1min") is not None]

    results = {
        "schema": 1,
        "command": command,
        "quick": quick,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "wall_s": round(time.monotonic() - t_start, 1),
        "machine": machine_info(),
        "load": {"before": load_before, "after": _load(), "max_1min_during": max(during) if during else None},
        "git": _git_revision(),
        "triton": triton,
        "software": {"perf_analyzer": pa_version, "onnxruntime": ort.__version__},
        "raw_rounds": len(raw_rounds),
        "settings": asdict(settings),
        "plan": {"grid_models": GRID_MODELS, "concurrencies": CONCURRENCIES, "grid_rounds": {} if quick else GRID_ROUNDS,
                 "length_models": LENGTH_MODELS,
                 "batch_models": BATCH_MODELS, "batch_sizes": BATCH_SIZES, "sweep_concurrency": SWEEP_CONCURRENCY,
                 "length_bounds": LENGTH_BOUNDS, "variants": VARIANTS},
        "models": {"onnx": onnx_files, "training": _training_info(Path(repo))},
        "datasets": datasets,
        "measurements": measurements,
        "accuracy": accuracy,
        "raw": raw,
        "ratios": ratios,
        "goals": evaluate_goals(ratios),
    }
    write_outputs(results, out)
    return results


def write_outputs(results: Mapping, out: Path | str) -> Path:
    """Write ``<out>/bench/results.json``, the plots and ``<out>/benchmarks.md``; returns the report path."""
    out = Path(out)
    bench_dir = out / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    (bench_dir / "results.json").write_text(json.dumps(results, indent=1, default=_json_default) + "\n")
    write_plots(results, bench_dir)
    report = out / "benchmarks.md"
    existing = report.read_text() if report.is_file() else None
    report.write_text(render_report(results, existing, plots_dir=bench_dir.name))
    return report


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (tuple, set)):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


# ----------------------------------------------------------------------------------------
# Command line


def add_bench_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator bench`` options to ``parser`` (returned for chaining)."""
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: short windows, no stability check, fewer texts (under 2 minutes)")
    parser.add_argument("--out", default="docs", help="where benchmarks.md and bench/ go (default: %(default)s)")
    parser.add_argument("--repo", default=str(REPO), help="model repository to copy (default: this checkout's)")
    parser.add_argument("--tool-dir", default=str(DEFAULT_TOOL_DIR),
                        help="where perf_analyzer is installed (default: .cache/tools/perf_analyzer)")
    parser.add_argument("--measurement-interval", type=int, default=None, metavar="MS",
                        help="shortest perf_analyzer window in ms (default: 3000, --quick 500)")
    parser.add_argument("--stability-percentage", type=float, default=None, metavar="PCT",
                        help="perf_analyzer stability rule in %% (default: 25; --quick: not checked)")
    parser.add_argument("--from-results", default=None, metavar="JSON",
                        help="only re-render benchmarks.md and the plots from a results.json")
    return parser


def _command_line(args: argparse.Namespace) -> str:
    parts = ["python -m orchestrator.tooling.bench"]
    if getattr(args, "quick", False):
        parts.append("--quick")
    parts.append(f"--out {shlex.quote(str(getattr(args, 'out', 'docs')))}")
    for opt in ("measurement_interval", "stability_percentage"):
        v = getattr(args, opt, None)
        if v is not None:
            parts.append(f"--{opt.replace('_', '-')} {v:g}")
    return " ".join(parts)


def bench_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator bench``; returns 0 on success, 1 on BenchError/ServerError (message on stderr).

    Goals not met do not change the exit status: the benchmark measures, it does not judge.
    """
    from orchestrator.tooling.server import ServerError

    try:
        if getattr(args, "from_results", None):
            results = json.loads(Path(args.from_results).read_text())
            report = write_outputs(results, Path(args.out))
            print(f"wrote {report}")
            return 0
        quick = bool(getattr(args, "quick", False))
        base = QUICK_SETTINGS if quick else FULL_SETTINGS
        changes = {}
        if getattr(args, "measurement_interval", None):
            changes["measurement_interval_ms"] = int(args.measurement_interval)
        if getattr(args, "stability_percentage", None):
            changes.update(stability_percentage=float(args.stability_percentage), check_stability=True, fallback=True)
        settings = PASettings(**{**asdict(base), **changes})
        results = run_benchmark(
            getattr(args, "out", "docs"), quick=quick, repo=getattr(args, "repo", REPO),
            tool_dir=getattr(args, "tool_dir", DEFAULT_TOOL_DIR), settings=settings, command=_command_line(args),
        )
    except (BenchError, ServerError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {Path(args.out) / 'benchmarks.md'} and {Path(args.out) / 'bench'}/ in {results['wall_s']:.0f} s")
    for g in results["goals"]:
        v = g["value"]
        shown = "n/a" if v is None else f"{v:.2f}"
        print(f"  {g['goal']}: {shown} ({g['op']} {g['bound']:g}) -> {_met(g['met']).strip('*')}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m orchestrator.tooling.bench [--quick] [--out docs]``."""
    parser = add_bench_arguments(argparse.ArgumentParser(prog="python -m orchestrator.tooling.bench", description=__doc__.splitlines()[0]))
    return bench_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
