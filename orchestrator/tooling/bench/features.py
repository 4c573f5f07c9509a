"""Benchmarks of the model-configuration features (issue 13): warmup, the response cache and
the cost of a shadow node, each side by side in one run of one embedded server.

``make bench-features`` or ``python -m orchestrator.tooling.bench.features [--quick] [--out docs/results]``:

1. copies ``model_repository/`` to a temporary directory and adds benchmark-only copies
   (:func:`make_features_repository`): ``<m>_warm`` and ``<m>_cold`` of the tokenizer,
   ``classifier_fast``, postprocess and the router (``_cold``: the ``model_warmup`` sample
   removed), two on-demand routers whose spare classifier is warm or cold, ``router_nc``
   (the shipped router over classifier copies without ``response_cache``), and two copies
   of ``docs/policies/shadow_fp16.yaml``: ``router_shadow_on`` (every request mirrored to
   ``classifier_fp16``), ``router_shadow_10`` (10%, the example's sample) and
   ``router_shadow_off`` (the same tree, ``sample: 0``);
2. starts one server with a 64 MiB response cache (:class:`~orchestrator.tooling.server.TritonServer`);
3. **warmup**: per round, loads each warm and cold copy (interleaved), sends one held-out
   text (or its token ids) and records the client latency of that first request, the
   server's compute time for it (``/v2/models/<m>/stats``, ``compute_infer``) and the
   median of 10 more; the on-demand routers: the first request that makes the router load
   its spare classifier, the second, and the median of 10 more;
4. **response cache**: a workload of held-out texts in which 30% of the requests repeat an
   earlier text (chosen uniformly among those already sent), sent once, never wrapped, to
   ``router`` and ``router_nc`` in interleaved blocks of 100 requests, at concurrency 1
   and 4 with fresh texts for each level; throughput (requests / wall time), p50 and p90,
   and the cache hits of the classifiers;
5. **shadow**: 400 held-out texts (one per request with its own id, concurrency 1) to
   ``router_shadow_off``, ``router_shadow_10`` and ``router_shadow_on`` (``sample`` 0, 0.1,
   1) in rotating blocks of 50: the primary's latency and the shadow counters;
6. writes ``<out>/bench/features.json`` and the section between
   :data:`~orchestrator.tooling.bench.FEATURES_START` and ``FEATURES_END`` of
   ``<out>/benchmarks.md`` (``make bench`` keeps it).

Units: milliseconds for latency (client side: ``time.perf_counter`` around one
``tritonclient.http`` call on an open connection), requests per second for throughput.
Errors: :class:`~orchestrator.tooling.bench.BenchError` (a repository copy cannot be made);
``ServerError`` from the server.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import yaml

from orchestrator.tooling.bench.machine import machine_info
from orchestrator.tooling.bench.plan import BenchError
from orchestrator.tooling.bench.report import FEATURES_END, FEATURES_START, add_out_argument, write_kept_outputs
from orchestrator.tooling.bench.stack import header_line, read_stack
from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.repository import read_config, write_config

REPO = PROJECT_ROOT / "model_repository"
WARM_MODELS = ("tokenizer", "classifier_fast", "postprocess", "router")
COMMAND = "make bench-features  (python -m orchestrator.tooling.bench.features --out docs/results)"
REPEAT_SHARE = 0.3
CACHE_CONCURRENCY = (1, 4)
#: router copy -> the shadow example's ``sample`` (0: the same tree, never mirroring)
SHADOW_VARIANTS = {"router_shadow_off": 0.0, "router_shadow_10": 0.1, "router_shadow_on": 1.0}


# ----------------------------------------------------------------------------- the repository


def _copy(repo: Path, source: str, name: str) -> Path:
    """Copy model ``source`` to ``name`` (top-level ``name:`` of every config changed)."""
    dest = repo / name
    if dest.exists():
        raise BenchError(f"{dest} already exists")
    shutil.copytree(repo / source, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for cfg in [dest / "config.pbtxt", *sorted((dest / "configs").glob("*.pbtxt"))]:
        text, n = re.subn(rf'(?m)^name:\s*"{re.escape(source)}"', f'name: "{name}"', cfg.read_text())
        if n != 1:
            raise BenchError(f"{cfg}: no top-level name \"{source}\"")
        cfg.write_text(text)
    return dest


def _rewrite_configs(model_dir: Path, change: Callable, note: str) -> None:
    """Apply ``change(config)`` to every configuration of ``model_dir`` through the proto."""
    for cfg in [model_dir / "config.pbtxt", *sorted((model_dir / "configs").glob("*.pbtxt"))]:
        config = read_config(cfg)
        change(config)
        write_config(cfg, config, header=[f"Benchmark copy (orchestrator.tooling.bench.features): {note}"])


def _policy(model_dir: Path, document: Mapping) -> None:
    (model_dir / "policy.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(document)), sort_keys=False))


def _renamed_models(node, names: Mapping[str, str]):
    if isinstance(node, dict):
        return {k: (names.get(v, v) if k == "model" else _renamed_models(v, names)) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed_models(v, names) for v in node]
    return node


def _ondemand_policy(spare: str) -> dict:
    return {
        "version": 1, "inline": {"tokenizer": "../tokenizer/1", "postprocess": True},
        "request_parameters": {"route": ["spare"]},
        "root": {"kind": "switch", "cases": [
            {"when": {"param": {"name": "route", "equals": "spare"}},
             "then": {"kind": "model", "name": "spare", "model": spare, "on_demand": {"idle_timeout_s": 3600}}}],
            "default": {"kind": "model", "name": "fast", "model": "classifier_fast"}},
    }


def make_features_repository(dest: Path, source: Path = REPO) -> Path:
    """Copy ``source`` to ``dest`` with the benchmark-only models of the module docstring."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(
        "__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"))
    no_warmup = lambda c: c.ClearField("model_warmup")  # noqa: E731
    no_cache = lambda c: c.ClearField("response_cache")  # noqa: E731
    for m in WARM_MODELS:
        _copy(dest, m, f"{m}_warm")
        cold = _copy(dest, m, f"{m}_cold")
        _rewrite_configs(cold, no_warmup, "model_warmup removed")
        shutil.rmtree(cold / "warmup")
    _copy(dest, "classifier_fast", "spare_warm")
    spare_cold = _copy(dest, "classifier_fast", "spare_cold")
    _rewrite_configs(spare_cold, no_warmup, "model_warmup removed")
    for variant in ("warm", "cold"):
        _policy(_copy(dest, "router", f"router_od_{variant}"), _ondemand_policy(f"spare_{variant}"))
    for m in ("classifier", "classifier_fast"):
        _rewrite_configs(_copy(dest, m, f"{m}_nc"), no_cache, "response_cache removed")
    shipped = yaml.safe_load((source / "router" / "policy.yaml").read_text())
    _policy(_copy(dest, "router", "router_nc"), _renamed_models(shipped, {"classifier": "classifier_nc",
                                                                          "classifier_fast": "classifier_fast_nc"}))
    shadow = yaml.safe_load((PROJECT_ROOT / "docs" / "policies" / "shadow_fp16.yaml").read_text())
    for name, sample in SHADOW_VARIANTS.items():
        shadow["root"]["steps"][1]["sample"] = sample
        _policy(_copy(dest, "router", name), shadow)
    return dest


# ----------------------------------------------------------------------------- requests


class Client:
    """One open ``tritonclient.http`` connection and the inputs of each model kind."""

    def __init__(self, url: str, tokenizer):
        import tritonclient.http as http

        self.http, self.tokenizer = http, tokenizer
        self.client = http.InferenceServerClient(url, network_timeout=300)
        self.client.is_server_ready()  # open the connection before anything is timed

    def inputs(self, model: str, text: str, threshold: float = 0.5) -> list:
        http = self.http
        if model.startswith(("classifier", "spare")):
            ids = np.asarray([self.tokenizer(text)["input_ids"]], np.int64)
            pairs = [("input_ids", ids), ("attention_mask", np.ones_like(ids))]
        elif model.startswith("postprocess"):
            pairs = [("logits", np.array([[0.7]], np.float32)), ("THRESHOLD", np.array([[threshold]], np.float32))]
        else:
            pairs = [("TEXT", np.array([[text.encode()]], dtype=np.object_))]
            if not model.startswith("tokenizer"):
                pairs.append(("THRESHOLD", np.array([[threshold]], np.float32)))
        out = []
        for name, value in pairs:
            kind = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32"}.get(value.dtype, "BYTES")
            out.append(http.InferInput(name, list(value.shape), kind))
            out[-1].set_data_from_numpy(value)
        return out

    def timed(self, model: str, text: str, parameters: Optional[dict] = None, request_id: str = ""):
        """``(milliseconds, result)`` of one request."""
        inputs = self.inputs(model, text)
        start = time.perf_counter()
        result = self.client.infer(model, inputs, parameters=parameters, request_id=request_id)
        return (time.perf_counter() - start) * 1000.0, result

    def compute_ns(self, model: str) -> int:
        return int(self.client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]["compute_infer"]["ns"])

    def cache_hits(self, model: str) -> int:
        return int(self.client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]["cache_hit"]["count"])

    def close(self) -> None:
        self.client.close()


def _median(values: Sequence[float]) -> Optional[float]:
    return round(float(np.median(values)), 2) if len(values) else None


def _pct(values: Sequence[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)), 2) if len(values) else None


# ----------------------------------------------------------------------------- sections


def bench_warmup(server, client: Client, texts: Sequence[str], rounds: int) -> dict:
    """First request after an explicit load, warm against cold copies (see module doc)."""
    rows: Dict[str, Dict[str, list]] = {}
    k = 0
    for r in range(rounds):
        for m in WARM_MODELS:
            for variant in (("warm", "cold") if r % 2 == 0 else ("cold", "warm")):
                name = f"{m}_{variant}"
                row = rows.setdefault(name, {"load_s": [], "first_ms": [], "first_compute_ms": [], "warm_ms": []})
                start = time.perf_counter()
                server.load_model(name)
                row["load_s"].append(time.perf_counter() - start)
                before = client.compute_ns(name)
                ms, _ = client.timed(name, texts[k % len(texts)])
                time.sleep(0.2)  # the backend reports a request's statistics after its response
                row["first_compute_ms"].append((client.compute_ns(name) - before) / 1e6)
                row["first_ms"].append(ms)
                row["warm_ms"].extend(client.timed(name, texts[(k + j) % len(texts)])[0] for j in range(1, 11))
                k += 11
                server.unload_model(name)
    on_demand: Dict[str, Dict[str, list]] = {}
    for r in range(rounds):
        for variant in (("warm", "cold") if r % 2 == 0 else ("cold", "warm")):
            router, spare = f"router_od_{variant}", f"spare_{variant}"
            row = on_demand.setdefault(variant, {"first_ms": [], "second_ms": [], "warm_ms": []})
            server.load_model(router)
            client.timed(router, texts[k % len(texts)])  # the router's own first request, on the default route
            spare_param = {"route": "spare"}
            row["first_ms"].append(client.timed(router, texts[(k + 1) % len(texts)], spare_param)[0])
            row["second_ms"].append(client.timed(router, texts[(k + 2) % len(texts)], spare_param)[0])
            row["warm_ms"].extend(client.timed(router, texts[(k + j) % len(texts)], spare_param)[0] for j in range(3, 13))
            k += 13
            server.unload_model(router)
            server.unload_model(spare)
    summary = {name: {key: _median(v) for key, v in row.items()} for name, row in rows.items()}
    return {"rounds": rounds, "models": summary, "raw": rows,
            "on_demand": {v: {key: _median(x) for key, x in row.items()} for v, row in on_demand.items()},
            "on_demand_raw": on_demand}


def repeated_workload(pool: Sequence[str], n: int, share: float, rng: random.Random) -> List[str]:
    """``n`` requests: each repeats a text already sent with probability ``share``
    (uniformly among those), else takes the next unused text of ``pool``.

    Raises:
        BenchError: ``pool`` runs out.
    """
    sent: List[str] = []
    fresh = iter(pool)
    for _ in range(n):
        if sent and rng.random() < share:
            sent.append(rng.choice(sent))
            continue
        try:
            sent.append(next(fresh))
        except StopIteration:
            raise BenchError(f"the workload needs more than {len(pool)} distinct texts") from None
    return sent


def _run_block(url: str, tokenizer, model: str, texts: Sequence[str], concurrency: int,
               request_ids: Optional[Sequence[str]] = None):
    """Send ``texts`` to ``model`` from ``concurrency`` threads (closed loop), with
    ``request_ids`` when given; returns ``(latencies_ms by position, probabilities by
    position, wall seconds)``."""
    latencies = [0.0] * len(texts)
    probs = [0.0] * len(texts)
    nxt = iter(range(len(texts)))
    lock = threading.Lock()
    errors: List[str] = []

    def worker():
        client = Client(url, tokenizer)
        try:
            while True:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                ms, result = client.timed(model, texts[i], request_id=request_ids[i] if request_ids else "")
                latencies[i], probs[i] = ms, float(result.as_numpy("PROBABILITIES").reshape(-1)[0])
        except Exception as exc:  # reported after the block
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchError(f"{model}: {errors[0]}")
    return latencies, probs, time.perf_counter() - start


def bench_cache(server, client: Client, pool: Sequence[str], n: int, block: int = 100) -> dict:
    """``router`` (cached classifiers) against ``router_nc`` on the repeated workload."""
    rng = random.Random(13)
    out = {}
    pools = [pool[i::len(CACHE_CONCURRENCY)] for i in range(len(CACHE_CONCURRENCY))]
    for c, part in zip(CACHE_CONCURRENCY, pools):
        seq = repeated_workload(part, n, REPEAT_SHARE, rng)
        hits0 = {m: client.cache_hits(m) for m in ("classifier", "classifier_fast")}
        acc = {m: {"lat": [], "probs": [], "wall": 0.0} for m in ("router", "router_nc")}
        for b, i in enumerate(range(0, len(seq), block)):
            for model in (("router_nc", "router") if b % 2 == 0 else ("router", "router_nc")):
                lat, probs, wall = _run_block(server.http_url, client.tokenizer, model, seq[i:i + block], c)
                acc[model]["lat"] += lat
                acc[model]["probs"] += probs
                acc[model]["wall"] += wall
        hits = {m: client.cache_hits(m) - hits0[m] for m in hits0}
        out[f"c{c}"] = {
            "concurrency": c, "requests": len(seq), "distinct_texts": len(set(seq)),
            "repeated_share": round(1 - len(set(seq)) / len(seq), 3), "cache_hits": hits,
            "max_abs_probability_difference": float(np.max(np.abs(np.array(acc["router"]["probs"]) - acc["router_nc"]["probs"]))),
            **{("cached" if m == "router" else "uncached"): {
                "throughput": round(len(seq) / a["wall"], 1), "p50_ms": _pct(a["lat"], 50), "p90_ms": _pct(a["lat"], 90),
            } for m, a in acc.items()},
        }
    return out


def bench_shadow(server, client: Client, texts: Sequence[str], block: int = 50) -> dict:
    """The primary's latency with no request, 10% and every request mirrored to
    ``classifier_fp16`` (:data:`SHADOW_VARIANTS`), in rotating order per block."""
    names = list(SHADOW_VARIANTS)
    acc = {m: [] for m in names}
    for b, i in enumerate(range(0, len(texts), block)):
        for model in names[b % len(names):] + names[:b % len(names)]:
            ids = [f"{model}-{i + j}" for j in range(len(texts[i:i + block]))]
            acc[model] += _run_block(server.http_url, client.tokenizer, model, texts[i:i + block], 1, ids)[0]
    time.sleep(2.0)  # the last mirrored batches and the 0.5 s metrics flush
    out = {"requests": len(texts)}
    for model, latencies in acc.items():
        labels = {"router": model, "node": "fp16_shadow"}
        out[model] = {"sample": SHADOW_VARIANTS[model], "p50_ms": _pct(latencies, 50), "p90_ms": _pct(latencies, 90),
                      "p99_ms": _pct(latencies, 99),
                      **{k: server.metric(f"orchestrator_shadow_{k}_total", **labels) for k in ("texts", "flips", "errors", "dropped")}}
    return out


# ----------------------------------------------------------------------------- report


def _load() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def render_section(r: Mapping) -> str:
    """The ``benchmarks.md`` section for the results ``r`` of one run."""
    w, c, s = r["warmup"], r["cache"], r["shadow"]
    L = [FEATURES_START, "## Model-configuration features: warmup, response cache, shadow (issue 13)", "",
         f"One run of `{COMMAND}` at {r['started_utc']} UTC on {r['machine']['cores']} cores "
         f"({r['machine']['cpu_model']}), load average {r['load_start']} at start and {r['load_end']} at the end; "
         f"figures in `bench/features.json`. Client-side latency on an open HTTP connection, ms; warmup "
         f"figures are medians over {w['rounds']} load(s) of each copy.", "", header_line(r.get("stack")), "",
         "### Warmup: the first request after a load", "",
         "| model | load, s | first request, ms | its compute on the server, ms | warm request (median), ms |",
         "|---|---|---|---|---|"]
    for m in WARM_MODELS:
        for variant in ("warm", "cold"):
            row = w["models"][f"{m}_{variant}"]
            label = f"`{m}` {'with' if variant == 'warm' else 'without'} warmup"
            L.append(f"| {label} | {row['load_s']} | {row['first_ms']} | {row['first_compute_ms']} | {row['warm_ms']} |")
    L += ["", "An on-demand model loaded by the router (`model` node with `on_demand`; the first request waits for "
          "the load):", "", "| spare classifier | first request (load + inference), ms | second request, ms | "
          "warm request (median), ms |", "|---|---|---|---|"]
    for variant in ("warm", "cold"):
        row = w["on_demand"][variant]
        L.append(f"| {'with' if variant == 'warm' else 'without'} warmup | {row['first_ms']} | {row['second_ms']} | {row['warm_ms']} |")
    L += ["", f"### Response cache: {int(REPEAT_SHARE * 100)}% repeated texts", "",
          "The shipped `router` (its classifiers with `response_cache`, server with a 64 MiB `local` cache) against "
          "`router_nc` (the same policy over copies without it), the same request sequence sent once to each in "
          "interleaved blocks of 100.", "",
          "| concurrency | requests (distinct texts) | cached: req/s | p50 | p90 | not cached: req/s | p50 | p90 | "
          "cache hits (classifier_fast, classifier) | largest answer difference |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(c):
        x = c[key]
        L.append(f"| {x['concurrency']} | {x['requests']} ({x['distinct_texts']}) | {x['cached']['throughput']} | "
                 f"{x['cached']['p50_ms']} | {x['cached']['p90_ms']} | {x['uncached']['throughput']} | {x['uncached']['p50_ms']} | "
                 f"{x['uncached']['p90_ms']} | {x['cache_hits']['classifier_fast']}, {x['cache_hits']['classifier']} | "
                 f"{x['max_abs_probability_difference']:.2g} |")
    on = s["router_shadow_on"]
    L += ["", "### Shadow: what mirroring costs the primary", "",
          f"`docs/policies/shadow_fp16.yaml` (primary `classifier`, candidate `classifier_fp16`) with `sample` 0 (the "
          f"same tree, never mirroring), 0.1 (the example's) and 1, {s['requests']} held-out texts each, one per request "
          f"with its own request id, concurrency 1, in rotating blocks of 50. With `sample: 1` the candidate compared "
          f"{int(on['texts'])} texts ({int(on['flips'])} verdict flips, {int(on['errors'])} errors, {int(on['dropped'])} "
          "dropped).", "", "| sample | texts compared | p50, ms | p90, ms | p99, ms |", "|---|---|---|---|---|"]
    for name in SHADOW_VARIANTS:
        x = s[name]
        L.append(f"| {x['sample']:g} | {int(x['texts'])} | {x['p50_ms']} | {x['p90_ms']} | {x['p99_ms']} |")
    L += ["", FEATURES_END]
    return "\n".join(L)


# ----------------------------------------------------------------------------- run


def run(out: Path, quick: bool = False) -> dict:
    """The whole benchmark (module docstring); writes the outputs and returns the results."""
    from transformers import AutoTokenizer

    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.server import TritonServer

    results = {"started_utc": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), "load_start": _load(),
               "machine": machine_info(), "command": COMMAND, "quick": quick}
    texts = data.held_out_texts(n=1936, seed=7)
    tokenizer = AutoTokenizer.from_pretrained(str(REPO / "tokenizer" / "1"))
    with tempfile.TemporaryDirectory(prefix="bench-features-") as tmp:
        repo = make_features_repository(Path(tmp) / "model_repository")
        start = ["tokenizer", "postprocess", "classifier", "classifier_fast", "classifier_fp16", "classifier_nc",
                 "classifier_fast_nc", "router", "router_nc", *SHADOW_VARIANTS]
        with TritonServer(repo, models=start, response_cache_bytes=64 << 20) as server:
            results["stack"] = read_stack(server, embedded=True)
            client = Client(server.http_url, tokenizer)
            try:
                results["warmup"] = bench_warmup(server, client, texts[:200], rounds=1 if quick else 3)
                results["cache"] = bench_cache(server, client, texts[200:1400], n=200 if quick else 500)
                results["shadow"] = bench_shadow(server, client, texts[1400:1500 if quick else 1800])
            finally:
                client.close()
    results["load_end"] = _load()
    write_kept_outputs(out, "features", results, render_section(results), FEATURES_START, FEATURES_END)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.tooling.bench.features", description=__doc__.split("\n")[0])
    add_out_argument(parser)
    parser.add_argument("--quick", action="store_true", help="one warmup round and shorter workloads (a smoke run)")
    args = parser.parse_args(argv)
    results = run(args.out, quick=args.quick)
    print(render_section(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
