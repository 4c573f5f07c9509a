"""``make gpu-check`` (``python -m lab.gpu_check``): the shipped configs on a GPU, against CPU.

What it does, on a machine with an NVIDIA GPU (``nvidia-smi`` lists one):

1. CPU reference: the embedded Triton serves a copy of ``model_repository/`` with the
   embedded configs (classifiers: Python models running onnxruntime, ``KIND_CPU``); the
   held-out texts go through ``ensemble`` and ``router`` (gRPC, 64 texts a request).
2. GPU run: the same texts through a server whose classifiers are ``KIND_GPU``: with
   ``--backend-dir DIR`` (a directory holding Triton's native ``onnxruntime`` backend) the
   shipped ``config.pbtxt`` files as they are (native backend, ``KIND_GPU``); without it the
   embedded configs with ``kind: KIND_GPU`` (the Python classifiers then use onnxruntime's
   CUDA provider when the stub's onnxruntime has one, which the report says).
   ``--gpu-outputs`` (embedded configs only): each classifier answers its logits in GPU
   memory (``lab.gpu_models.GpuOutputClassifier``, torch with CUDA in the
   stub), as Triton's onnxruntime backend does on a ``KIND_GPU`` instance, so the router's
   BLS calls and the ensemble's next step receive GPU tensors.
3. Compares the answers (largest probability difference, verdicts and routes that differ),
   times one text per request through each model (p50/p99 ms), and reads the GPU memory
   used (``nvidia-smi``) before and after.
4. With ``--gpu-outputs``, the negative control: a ``KIND_GPU`` model answers in GPU memory
   and a BLS caller reads it with and without CPU memory asked for
   (``releases.cpu_outputs``, what the router does); the result records both outcomes and
   whether the refusal's text is the one the in-process mock raises (``GPU_AS_NUMPY``).

Without a GPU it runs no server and ends with ``gpu-check: no GPU: not run (<why>)``, exit
status 0, and the same outcome in the result file. Exit status: 0 no GPU, or answers within
tolerance; 1 answers differ beyond ``--tolerance``; 2 the check could not run.
Output: ``.cache/gpu_check/result.json`` (``--out DIR`` for another place).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from orchestrator.tooling.paths import PROJECT_ROOT

DEFAULT_OUT = PROJECT_ROOT / ".cache" / "gpu_check"
CLASSIFIERS = ("classifier", "classifier_fast", "classifier_fp16")
MODELS = ("ensemble", "router")
NO_GPU = "no GPU: not run"


def gpus(run: Callable[..., Any] = subprocess.run) -> tuple:
    """``(gpus, why)``: the GPUs ``nvidia-smi`` lists (``{index, name, memory_total_mib,
    memory_used_mib}``) and, when there are none, why (no ``nvidia-smi``, it failed, no
    device)."""
    if shutil.which("nvidia-smi") is None:
        return [], "nvidia-smi not found"
    try:
        proc = run(["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader,nounits"],
                   capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if proc.returncode != 0:
        return [], f"nvidia-smi failed: {(proc.stderr or proc.stdout).strip()[:200]}"
    found = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            found.append({"index": int(parts[0]), "name": parts[1],
                          "memory_total_mib": float(parts[2]), "memory_used_mib": float(parts[3])})
    return found, ("" if found else "nvidia-smi lists no GPU")


GPU_OUTPUT_ADAPTER = (
    '"""Written by make gpu-check: the classifier with its outputs in GPU memory."""\n\n'
    "from lab.gpu_models import GpuOutputClassifier as TritonPythonModel  # noqa: F401\n"
)


def gpu_repository(dest: Path, source: Path, native: bool, gpu_outputs: bool = False) -> Path:
    """A copy of ``source`` for the GPU run: ``native``: the shipped ``config.pbtxt`` files as
    they are (``KIND_GPU``); else each classifier's ``configs/embedded.pbtxt`` with its
    instance groups set to ``KIND_GPU`` (through ``model_config.proto``), and with
    ``gpu_outputs`` its ``1/model.py`` replaced by :data:`GPU_OUTPUT_ADAPTER`. Raises
    ValueError for ``gpu_outputs`` with ``native`` (that backend places its outputs itself)."""
    from orchestrator.tooling import repository

    if native and gpu_outputs:
        raise ValueError("--gpu-outputs is for the embedded configs; the native backend answers in GPU memory itself")
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if not native:
        for name in CLASSIFIERS:
            path = dest / name / "configs" / "embedded.pbtxt"
            if path.is_file():
                config = repository.read_config(path)
                for group in config.instance_group:
                    group.kind = group.KIND_GPU
                repository.write_config(path, config, repository.header_lines(path))
                if gpu_outputs:
                    (dest / name / "1" / "model.py").write_text(GPU_OUTPUT_ADAPTER)
    return dest


PROBE_CONFIGS = {
    "gpu_echo": (
        'name: "gpu_echo"\nbackend: "python"\nmax_batch_size: 0\n'
        'input { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }\n'
        'output { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }\n'
        "instance_group { count: 1 kind: KIND_GPU }\n",
        "GpuEcho",
    ),
    "bls_caller": (
        'name: "bls_caller"\nbackend: "python"\nmax_batch_size: 0\n'
        'input { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }\n'
        'input { name: "ASK_CPU" data_type: TYPE_BOOL dims: [ 1 ] }\n'
        'output { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }\n'
        "instance_group { count: 1 kind: KIND_CPU }\n",
        "BlsCaller",
    ),
}


def probe_repository(dest: Path) -> Path:
    """The negative control's repository: ``gpu_echo`` (KIND_GPU, answers in GPU memory) and
    ``bls_caller`` (calls it through BLS), both from :mod:`lab.gpu_models`."""
    for name, (config, cls) in PROBE_CONFIGS.items():
        (dest / name / "1").mkdir(parents=True)
        (dest / name / "config.pbtxt").write_text(config)
        (dest / name / "1" / "model.py").write_text(
            f"from lab.gpu_models import {cls} as TritonPythonModel  # noqa: F401\n")
    return dest


def probe(url: str) -> Dict[str, Any]:
    """Send ``X`` through ``bls_caller`` with and without CPU memory asked for; per side the
    answer (``ok``: ``Y == 2 X``) or the error text, and whether the refusal without CPU memory
    carries the text the in-process mock raises (:data:`orchestrator.testing.mock.tensors.GPU_AS_NUMPY`)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from orchestrator.testing.mock.tensors import GPU_AS_NUMPY

    x = np.arange(6, dtype=np.float32)
    out: Dict[str, Any] = {}
    client = grpcclient.InferenceServerClient(url.split("://", 1)[-1])
    try:
        for side, ask in (("with_cpu_memory", True), ("without_cpu_memory", False)):
            inputs = [grpcclient.InferInput("X", [6], "FP32"), grpcclient.InferInput("ASK_CPU", [1], "BOOL")]
            inputs[0].set_data_from_numpy(x)
            inputs[1].set_data_from_numpy(np.array([ask]))
            try:
                y = client.infer("bls_caller", inputs).as_numpy("Y")
                out[side] = {"ok": bool(np.array_equal(y, 2 * x)), "answer": y.tolist()}
            except InferenceServerException as exc:
                out[side] = {"ok": False, "error": str(exc.message())}
    finally:
        client.close()
    refusal = out["without_cpu_memory"].get("error", "")
    out["refusal_matches_mock"] = GPU_AS_NUMPY in refusal
    out["router_path_safe"] = bool(out["with_cpu_memory"]["ok"])
    return out


def backend_directory(native_dir: Path, work: Path) -> Path:
    """A ``--backend-directory`` with the embedded server's ``python`` backend and the
    ``onnxruntime`` backend of ``native_dir`` (symbolic links). Raises ValueError when
    ``native_dir`` has no ``onnxruntime`` backend."""
    from orchestrator.tooling.embedded import prepare_backend_directory

    ort_dir = native_dir / "onnxruntime" if (native_dir / "onnxruntime").is_dir() else native_dir
    if not any(ort_dir.glob("libtriton_onnxruntime.so")):
        raise ValueError(f"--backend-dir {native_dir}: no libtriton_onnxruntime.so in {ort_dir}")
    out = work / "backends"
    out.mkdir(parents=True)
    (out / "python").symlink_to(prepare_backend_directory() / "python")
    (out / "onnxruntime").symlink_to(ort_dir.resolve())
    return out


def percentiles(values: Sequence[float]) -> Dict[str, Optional[float]]:
    if not values:
        return {"p50_ms": None, "p99_ms": None}
    return {"p50_ms": round(float(np.percentile(values, 50)), 3), "p99_ms": round(float(np.percentile(values, 99)), 3)}


def measure(url: str, texts: Sequence[str], timed: int) -> Dict[str, Any]:
    """Answers of each of :data:`MODELS` for ``texts`` and the latency of ``timed`` one-text
    requests (ms)."""
    from lab.bench.measurement import classify_all

    out: Dict[str, Any] = {}
    for model in MODELS:
        answers = classify_all(url, model, list(texts))
        latencies = []
        for text in texts[:timed]:
            t0 = time.perf_counter()
            classify_all(url, model, [text])
            latencies.append((time.perf_counter() - t0) * 1000.0)
        out[model] = {"probabilities": answers["probabilities"], "verdicts": answers["verdicts"],
                      "routes": answers["routes"], **percentiles(latencies[1:])}
    return out


def compare(cpu: Dict[str, Any], gpu: Dict[str, Any], tolerance: float) -> Dict[str, Any]:
    """Per model: the largest |probability difference|, verdicts and routes that differ, and
    whether the largest difference is within ``tolerance``."""
    out = {}
    for model in MODELS:
        a, b = cpu[model], gpu[model]
        diff = float(np.abs(np.asarray(a["probabilities"]) - np.asarray(b["probabilities"])).max()) if len(a["probabilities"]) else 0.0
        routes = sum(1 for x, y in zip(a["routes"] or [], b["routes"] or []) if x != y)
        out[model] = {"max_abs_probability_diff": diff,
                      "verdicts_differ": int((np.asarray(a["verdicts"]) != np.asarray(b["verdicts"])).sum()),
                      "routes_differ": routes, "within_tolerance": diff <= tolerance}
    return out


def run_check(out: Path, n: int, timed: int, tolerance: float, backend_dir: Optional[Path],
              source: Path, log: Callable[[str], None] = print, find_gpus: Callable[[], tuple] = gpus,
              gpu_outputs: bool = False) -> Dict[str, Any]:
    """The whole check (module docstring); writes ``out/result.json`` and returns the result."""
    found, why = find_gpus()
    result: Dict[str, Any] = {"created_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "gpus": found}
    if not found:
        result.update(outcome="no-gpu", message=f"{NO_GPU} ({why})")
        return _write(out, result)
    from lab.bench.stack import describe, read_stack
    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    texts = [e.text for e in data.held_out_examples(n=n)]
    result.update(texts=len(texts), timed_per_model=timed, tolerance=tolerance, native=backend_dir is not None,
                  gpu_outputs=gpu_outputs)
    try:
        import onnxruntime as ort

        result["onnxruntime_providers"] = list(ort.get_available_providers())
    except ImportError:
        result["onnxruntime_providers"] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        cpu_repo = work / "cpu"
        shutil.copytree(source, cpu_repo, ignore=shutil.ignore_patterns("__pycache__"))
        log(f"gpu-check: CPU reference on {len(texts)} held-out texts")
        with TritonServer(cpu_repo) as server:
            result["cpu_stack"] = describe(read_stack(server, embedded=True))
            cpu = measure(server.grpc_url, texts, timed)
        native = backend_dir is not None
        gpu_repo = gpu_repository(work / "gpu", source, native, gpu_outputs)
        extra = [f"--backend-directory={backend_directory(backend_dir, work)}"] if backend_dir is not None else []
        before = find_gpus()[0]
        log("gpu-check: GPU run (" + ("native onnxruntime backend, config.pbtxt" if native else "embedded configs, KIND_GPU")
            + (", classifier outputs in GPU memory" if gpu_outputs else "") + ")")
        with TritonServer(gpu_repo, model_config_name=None if native else "embedded", extra_args=extra) as server:
            result["gpu_stack"] = describe(read_stack(server, embedded=True))
            gpu = measure(server.grpc_url, texts, timed)
            during = find_gpus()[0]
        if gpu_outputs:
            log("gpu-check: BLS outputs in GPU memory, with and without CPU memory asked for")
            with TritonServer(probe_repository(work / "probe"), model_config_name=None) as server:
                result["bls_gpu_tensors"] = probe(server.grpc_url)
    result["gpu_memory_used_mib"] = {"before": [g["memory_used_mib"] for g in before],
                                     "serving": [g["memory_used_mib"] for g in during]}
    result["latency"] = {side: {m: {k: v[m][k] for k in ("p50_ms", "p99_ms")} for m in MODELS}
                         for side, v in (("cpu", cpu), ("gpu", gpu))}
    result["comparison"] = compare(cpu, gpu, tolerance)
    ok = all(c["within_tolerance"] for c in result["comparison"].values())
    if "bls_gpu_tensors" in result:
        ok = ok and result["bls_gpu_tensors"]["router_path_safe"]
    result.update(outcome="ok" if ok else "differs",
                  message="GPU answers match the CPU answers" if ok else f"GPU answers differ from CPU beyond {tolerance:g}")
    return _write(out, result)


def _write(out: Path, result: Dict[str, Any]) -> Dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    result["path"] = str(out / "result.json")
    return result


def add_gpu_check_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where result.json goes (default: .cache/gpu_check)")
    parser.add_argument("--n", type=int, default=200, help="held-out texts to compare (default: %(default)s)")
    parser.add_argument("--timed", type=int, default=100, help="one-text requests timed per model (default: %(default)s)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest |probability difference| allowed")
    parser.add_argument("--backend-dir", type=Path, default=None,
                        help="a directory with Triton's native onnxruntime backend: serve the shipped config.pbtxt files")
    parser.add_argument("--repo", type=Path, default=PROJECT_ROOT / "model_repository", help="model repository to copy")
    parser.add_argument("--gpu-outputs", action="store_true",
                        help="embedded configs: classifiers answer in GPU memory (torch with CUDA in the stub), "
                             "and the BLS negative control runs")
    return parser


def gpu_check_command(args: argparse.Namespace) -> int:
    """Run the check; exit status in the module docstring."""
    from orchestrator.tooling.server import ServerError

    try:
        result = run_check(args.out, args.n, args.timed, args.tolerance, args.backend_dir, args.repo,
                           gpu_outputs=args.gpu_outputs)
    except (ServerError, OSError, ValueError) as exc:
        print(f"gpu-check: could not run: {exc}", file=sys.stderr)
        return 2
    print(f"gpu-check: {result['message']}; {result['path']}")
    if result["outcome"] == "no-gpu":
        return 0
    for model, c in result["comparison"].items():
        lat = result["latency"]
        print(f"  {model}: max |dp| {c['max_abs_probability_diff']:.2e}, verdicts differ {c['verdicts_differ']}, "
              f"routes differ {c['routes_differ']}; p50/p99 ms CPU {lat['cpu'][model]['p50_ms']}/{lat['cpu'][model]['p99_ms']}, "
              f"GPU {lat['gpu'][model]['p50_ms']}/{lat['gpu'][model]['p99_ms']}")
    print(f"  GPU memory used (MiB): {result['gpu_memory_used_mib']}; stack: {result['gpu_stack']}")
    if "bls_gpu_tensors" in result:
        print(f"  BLS outputs in GPU memory: {json.dumps(result['bls_gpu_tensors'])}")
    return 0 if result["outcome"] == "ok" else 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = add_gpu_check_arguments(argparse.ArgumentParser(prog="python -m lab.gpu_check",
                                                             description=(__doc__ or "").split("\n")[0]))
    return gpu_check_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
