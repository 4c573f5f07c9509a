"""Helpers shared by the test layers (unit/, mock/, server/); fixtures live in conftest.py.

- paths: ``ROOT`` (the checkout), ``REPO`` (its ``model_repository``), ``FIXTURES``;
- router variants for a test copy of the model repository (:func:`make_test_repository`);
- :class:`FakeBLS`: a fake downstream ``infer`` function for the engine's unit tests;
- :func:`call` / :func:`routes`: one HTTP request to a real server's router or ensemble;
- :func:`stub_pid`, :func:`rss_bytes`: the real server's processes;
- :func:`eventually`: a real server's statistics or metrics once they caught up;
- :data:`MIXED_TEXTS`, :func:`text_request`, :func:`executes_answered`: the mock differential tests' requests
  (one router execute run two ways) and their answers in a form to compare.

The execution-environment tests' helpers are in ``tests/envhelpers.py``.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import time
from pathlib import Path

import numpy as np
import yaml

from orchestrator.tooling import repository

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "model_repository"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


# ----------------------------------------------------------------------------- router variants

# Test-only router variants added to a copy of the repository: same code, the default
# policy with the cascade margin changed.
ROUTER_VARIANTS = {
    # every non-empty text escalates: its answers must equal the ensemble's
    "router_accurate": {"cascade": {"margin": 1.0}},
    # never escalates
    "router_fast": {"cascade": {"margin": 0.0}},
}
# The shipped policy with the tokenizer models called through BLS.
BLS_VARIANT = "router_bls"
# The shipped policy without its fallbacks: a broken model fails the texts that need it.
STRICT_VARIANT = "router_strict"


def without_fallbacks(node):
    """A policy node tree with every ``fallback`` node replaced by its first option."""
    if isinstance(node, dict):
        if node.get("kind") == "fallback":
            return without_fallbacks(node["nodes"][0])
        return {k: without_fallbacks(v) for k, v in node.items()}
    if isinstance(node, list):
        return [without_fallbacks(v) for v in node]
    return node


def set_node_fields(node, changes):
    """Apply ``{node name: {field: value}}`` to a policy document's node tree, in place."""
    if isinstance(node, dict):
        if node.get("name") in changes:
            node.update(changes[node["name"]])
        for value in node.values():
            set_node_fields(value, changes)
    elif isinstance(node, list):
        for value in node:
            set_node_fields(value, changes)


def add_router_variant(repo: Path, name: str, policy_document) -> Path:
    """Add model ``name``: the router's code, config (renamed, through the repository
    module) and warmup data with its own policy document."""
    dest = repo / name
    (dest / "1").mkdir(parents=True)
    shutil.copy(REPO / "router" / "1" / "model.py", dest / "1" / "model.py")
    shutil.copytree(REPO / "router" / "warmup", dest / "warmup")
    shutil.copy(REPO / "router" / "labels.txt", dest / "labels.txt")
    config = repository.read_config(REPO / "router" / "config.pbtxt")
    config.name = name
    repository.write_config(dest / "config.pbtxt", config, [f"Test-only router variant {name} (tests/helpers.py)."])
    (dest / "policy.yaml").write_text(yaml.safe_dump(policy_document, sort_keys=False))
    return dest


def copy_model(repo: Path, source: str, name: str) -> Path:
    """Copy model directory ``source`` to ``name`` within ``repo``, renaming it in its configs."""
    repository.copy_model(repo / source, repo / name)
    return repo / name


def _ondemand_policy(model: str, idle: float) -> dict:
    fast = {"kind": "model", "model": "classifier_fast"}
    return {
        "version": 1,
        "request_parameters": {"route": ["spare"]},
        "root": {
            "kind": "switch",
            "cases": [
                {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False}},
                {
                    "when": {"param": {"name": "route", "equals": "spare"}},
                    "then": {"kind": "model", "model": model, "on_demand": {"idle_timeout_s": idle, "retry_after_s": 30}},
                },
            ],
            "default": fast,
        },
    }


# Models of the test repository that the session server does not load at start.
#: The shipped router with ``repository.QUEUE_POLICY`` (the shipped one has none).
QUEUE_VARIANT = "router_queue"
#: The shipped router with admission control (``admission``: :data:`ADMIT_WAIT_MS`).
ADMIT_VARIANT = "router_admit"
#: Small enough that a burst of long texts is over it after the first execute.
ADMIT_WAIT_MS = 5
#: The shipped router with the config parameter ``metrics_timing_sample: all``.
TIMINGS_VARIANT = "router_all_timings"
#: The shipped router with the config parameter ``metrics: off``.
NO_METRICS_VARIANT = "router_no_metrics"
# A router whose metrics_timing_sample is neither a count nor "all": its load must fail.
BAD_SAMPLE_VARIANT = "router_bad_timing_sample"
NOT_LOADED_AT_START = ("classifier_spare", "router_bad_policy", BAD_SAMPLE_VARIANT)


def make_test_repository(dest: Path) -> Path:
    """Copy ``model_repository`` to ``dest`` and add the test-only models: the
    :data:`ROUTER_VARIANTS`, the shipped A/B example (``router_ab``), on-demand routers and
    their spare classifier, a router whose on-demand model is in no repository, a
    router with an invalid policy, one with an invalid ``metrics_timing_sample`` and one with
    its metrics off."""
    # not the execution-environment artifacts `make env` may have installed (~120 MB a model)
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"))
    for name, changes in ROUTER_VARIANTS.items():
        document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
        set_node_fields(document, changes)
        add_router_variant(dest, name, document)
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    document.pop("inline")
    add_router_variant(dest, BLS_VARIANT, document)
    add_router_variant(dest, STRICT_VARIANT, without_fallbacks(yaml.safe_load((REPO / "router" / "policy.yaml").read_text())))
    add_router_variant(dest, "router_ab", yaml.safe_load((ROOT / "docs" / "policies" / "ab_fallback.yaml").read_text()))
    # the shipped router with the recommended queue policy (docs/guides/reliability.md "Overload")
    queued = add_router_variant(dest, QUEUE_VARIANT, yaml.safe_load((REPO / "router" / "policy.yaml").read_text()))
    repository.add_queue_policy(queued / "config.pbtxt")
    admit = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    admit["admission"] = {"max_wait_ms": ADMIT_WAIT_MS}
    add_router_variant(dest, ADMIT_VARIANT, admit)
    timings = add_router_variant(dest, TIMINGS_VARIANT, yaml.safe_load((REPO / "router" / "policy.yaml").read_text()))
    config = repository.read_config(timings / "config.pbtxt")
    config.parameters["metrics_timing_sample"].string_value = "all"
    repository.write_config(timings / "config.pbtxt", config, [f"Test-only router variant {TIMINGS_VARIANT} (tests/helpers.py)."])
    quiet = add_router_variant(dest, NO_METRICS_VARIANT, yaml.safe_load((REPO / "router" / "policy.yaml").read_text()))
    config = repository.read_config(quiet / "config.pbtxt")
    config.parameters["metrics"].string_value = "off"
    repository.write_config(quiet / "config.pbtxt", config, [f"Test-only router variant {NO_METRICS_VARIANT} (tests/helpers.py)."])
    bad = add_router_variant(dest, BAD_SAMPLE_VARIANT, yaml.safe_load((REPO / "router" / "policy.yaml").read_text()))
    config = repository.read_config(bad / "config.pbtxt")
    config.parameters["metrics_timing_sample"].string_value = "every"
    repository.write_config(bad / "config.pbtxt", config, [f"Test-only router variant {BAD_SAMPLE_VARIANT} (tests/helpers.py)."])
    copy_model(dest, "classifier_fast", "classifier_spare")
    add_router_variant(dest, "router_ondemand", _ondemand_policy("classifier_spare", idle=2.0))
    # on_demand on a model the server loaded itself: the router must never unload it
    add_router_variant(dest, "router_not_owner", _ondemand_policy("classifier_fast", idle=0.5))
    # on_demand on a model in no repository, retried at once: no load request may be sent
    absent = {"kind": "model", "model": "classifier_absent", "on_demand": {"idle_timeout_s": 60, "retry_after_s": 0}}
    spare = {"kind": "model", "name": "spare", "model": "classifier_fast", "route": "fallback"}
    add_router_variant(dest, "router_absent", {"version": 1, "root": {"kind": "fallback", "nodes": [absent, spare]}})
    add_router_variant(dest, "router_bad_policy", {"version": 1, "root": {"kind": "cascade", "margin": 0.1, "stages": [{"kind": "model"}]}})
    return dest


# ----------------------------------------------------------------------------- a fake BLS function

# Fake downstream models for the engine's unit tests, arithmetic on the text:
# - ``tokenizer``: ``[101] + one id per word + [102]``; ``good`` is 2000, ``bad`` 3000,
#   other words ``1000 + len(word)``; the ``truncation`` parameter must be false.
# - classifier ``m``: logit = ``GAIN[m] * (#good - #bad) + BIAS[m]`` over the row's ids
#   (``m`` may be a pinned version, ``fast@2``: a call target of ``nodes.model.target``).
GAIN = {"fast": 1.0, "accurate": 2.0, "third": 0.5, "fast@1": 1.0, "fast@2": 3.0}
BIAS = {"fast": 0.1, "accurate": -0.2, "third": 0.3, "fast@1": 0.1, "fast@2": -0.4}


def word_id(word: str) -> int:
    return {"good": 2000, "bad": 3000}.get(word, 1000 + len(word))


def ids_of(text: str) -> list:
    return [101] + [word_id(w) for w in text.split()] + [102]


def expected_logit(model: str, ids) -> float:
    ids = list(ids)
    return GAIN[model] * (ids.count(2000) - ids.count(3000)) + BIAS[model]


def sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


class Log:
    """A ``pb_utils.Logger`` stand-in that keeps every line (any level) in ``lines``."""

    def __init__(self):
        self.lines = []

    def log_info(self, m):
        self.lines.append(m)

    log_warn = log_error = log_verbose = log_info


class FakeBLS:
    """The ``infer`` function the engine calls; records every call."""

    def __init__(self, fail=(), delay=None):
        self.calls = []
        self.fail = set(fail)
        self.delay = delay or {}

    async def __call__(self, model, inputs, parameters, request_id, alone, options=None):
        self.calls.append({"model": model, "rows": next(iter(inputs.values())).shape[0], "parameters": dict(parameters or {}),
                           "request_id": request_id, "alone": alone, "inputs": inputs, "options": options})
        if model in self.delay:
            await asyncio.sleep(self.delay[model])
        if model in self.fail:
            from orchestrator.runtime.errors import DownstreamError

            raise DownstreamError(f"model '{model}' failed: injected")
        if model == "tokenizer":
            seqs = [ids_of(t.decode()) for t in inputs["TEXT"].reshape(-1)]
            width = max(len(s) for s in seqs)
            ids = np.zeros((len(seqs), width), np.int64)
            mask = np.zeros((len(seqs), width), np.int64)
            for r, s in enumerate(seqs):
                ids[r, : len(s)], mask[r, : len(s)] = s, 1
            assert parameters.get("truncation") is False
            return {"input_ids": ids, "attention_mask": mask}
        if model == "postprocess":
            p = 1.0 / (1.0 + np.exp(-inputs["logits"].astype(np.float64)))
            return {"PROBABILITIES": p.astype(np.float32), "VERDICTS": p.astype(np.float32) >= inputs["THRESHOLD"]}
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        logits = [expected_logit(model, row[m.astype(bool)]) for row, m in zip(ids, mask)]
        return {"logits": np.array(logits, np.float32).reshape(-1, 1)}

    def models_called(self):
        return [c["model"] for c in self.calls]


# ----------------------------------------------------------------------------- benchmark results


def bench_grid(values):
    """values: {(model, c): (throughput, p50_ms)} -> grid measurements of ``make bench``."""
    return [
        {"section": "grid", "model": m, "dataset": "held_out", "concurrency": c, "batch_size": 1,
         "throughput": t, "p50_ms": p, "error": None}
        for (m, c), (t, p) in values.items()
    ]


def bench_results():
    """A complete, made-up ``results.json`` of ``make bench`` (every section, one error)."""
    from dataclasses import asdict

    from lab.bench.goals import compute_ratios, evaluate_goals
    from lab.bench.plan import BATCH_SIZES, FULL_SETTINGS, GRID_MODELS, LENGTH_MODELS

    meas = bench_grid({(m, c): (100.0 * (i + 1), 10.0 / (i + 1)) for i, m in enumerate(GRID_MODELS) for c in (1, 4, 16)})
    for m in meas:
        m.update(p90_ms=m["p50_ms"] * 2, p95_ms=m["p50_ms"] * 3, p99_ms=m["p50_ms"] * 4, stable=True, command="pa -m x")
    for d in ("short", "medium", "long"):
        for model in LENGTH_MODELS:
            meas.append({"section": "length", "model": model, "dataset": d, "concurrency": 4, "batch_size": 1,
                         "throughput": 50.0, "p50_ms": 5.0, "p90_ms": 6.0, "p95_ms": 7.0, "p99_ms": 8.0, "stable": False, "error": None})
    for b in BATCH_SIZES:
        meas.append({"section": "batch", "model": "router", "dataset": "held_out", "concurrency": 4, "batch_size": b,
                     "throughput": 40.0 * b, "p50_ms": 5.0 * b, "p90_ms": 6.0, "p95_ms": 7.0, "p99_ms": 8.0 * b, "stable": None, "error": None})
    meas.append({"section": "batch", "model": "router", "dataset": "held_out", "concurrency": 4, "batch_size": 64,
                 "error": "Thread [0] had error: boom"})
    acc = {"ensemble": {"n": 10, "accuracy_pct": 80.0}, "router": {"n": 10, "accuracy_pct": 79.0, "routes": {"classifier_fast": 7, "classifier": 3}},
           "ensemble_pad512_agreement": {"n": 4, "same_verdicts": 4, "max_abs_probability_diff": 1e-7}}
    raw = {"classifier": {"p50_ms": 2.0, "p99_ms": 3.0, "calls": 10}, "classifier_fast": {"p50_ms": 1.0, "p99_ms": 1.5, "calls": 10}}
    ratios = compute_ratios(meas, acc, raw)
    stats = {"n": 10, "tokens_min": 3, "tokens_p50": 20.0, "tokens_p90": 30.0, "tokens_max": 50, "over_limit": 0}
    return {
        "command": "python -m lab.bench --out docs", "quick": False, "created_utc": "2026-01-01 00:00:00", "wall_s": 600.0,
        "machine": {"cores": 2, "cpu_model": "Test CPU", "memory_gib": 8.0, "kernel": "k", "os": "o", "python": "3.11"},
        "load": {"before": [0.1, 0.2, 0.3], "after": [1.0, 1.0, 1.0]}, "git": "abc",
        "triton": {"version": "2.51.0"}, "software": {"perf_analyzer": "Perf Analyzer Version 2.41.0", "onnxruntime": "1"},
        "settings": asdict(FULL_SETTINGS), "models": {"onnx": {"classifier": {"sha256": "f" * 64, "bytes": 1}}, "training": {}},
        "datasets": {"held_out": stats, "short": stats, "medium": stats, "long": stats},
        "measurements": meas, "accuracy": acc, "raw": raw, "ratios": ratios, "goals": evaluate_goals(ratios),
    }


# ----------------------------------------------------------------------------- requests


def call(server, model, texts, thresholds=0.5, parameters=None, text_array=None, thr_array=None):
    """One request; returns dict of outputs or raises InferenceServerException."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    inputs = []
    t = text_array if text_array is not None else np.array([s.encode() if isinstance(s, str) else s for s in texts], dtype=np.object_).reshape(-1, 1)
    if t is not False:
        dtype = "BYTES" if t.dtype == np.object_ else "FP32"
        inputs.append(httpclient.InferInput("TEXT", list(t.shape), dtype))
        inputs[-1].set_data_from_numpy(t)
    thr = thr_array if thr_array is not None else np.full((len(texts), 1), thresholds, dtype=np.float32)
    if thr is not False:
        inputs.append(httpclient.InferInput("THRESHOLD", list(thr.shape), "FP32"))
        inputs[-1].set_data_from_numpy(thr)
    try:
        result = client.infer(model, inputs, parameters=parameters)
        names = [o["name"] for o in result.get_response()["outputs"]]
        return {n: result.as_numpy(n) for n in names}
    finally:
        client.close()


def routes(out):
    return [r.decode() for r in out["ROUTE"].reshape(-1)]


# ----------------------------------------------------------------------------- server processes


def stub_pid(server, instance: str) -> int:
    """The pid of the Python-backend stub process of model instance ``instance`` (e.g.
    ``classifier_fast_0_0``): a live child of the server process the test started, whose
    arguments name that instance (``lab.soak.procs.find_stub``). Raises
    LookupError when there is none."""
    from lab.soak.procs import find_stub

    pid = find_stub(server.pid, instance)
    if pid is None:
        raise LookupError(f"no live stub process for {instance} under server pid {server.pid}")
    return pid


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident set size of process ``pid`` in bytes (``field``: ``RssAnon`` for its private
    anonymous part alone, ``lab.soak.procs.rss_bytes``). Raises LookupError when it is gone."""
    from lab.soak.procs import rss_bytes as rss

    value = rss(pid, field)
    if value is None:
        raise LookupError(f"process {pid} is gone")
    return value


def eventually(read, expected, timeout=20.0, interval=0.1):
    """Poll ``read()`` every ``interval`` seconds until it equals ``expected`` or ``timeout``
    seconds pass; return the last value read. A client can hold its answer before the server counted the request:
    the router flushes its metrics every 0.5 s, and Triton's statistics extension counts a
    request when its backend reports the statistics, which can come after the client has
    its response (a count one short has been read right after a refused gRPC request)."""
    deadline = time.monotonic() + timeout
    value = read()
    while value != expected and time.monotonic() < deadline:
        time.sleep(interval)
        value = read()
    return value


#: A long text (more than 128 tokens: a chunk node windows it).
LONG_TEXT = " ".join(["a gorgeous, witty and thoroughly surprising film that never once drags"] * 30)
#: Short texts, an empty one and :data:`LONG_TEXT`: what a differential test's executes mix.
MIXED_TEXTS = ["A gorgeous, witty film.", "Not worth the ticket.", "plain", "", LONG_TEXT, "so-so, really"]


def text_request(texts, thresholds=0.5, parameters=None):
    """One router request for the mock's ``infer_batch``: ``texts`` as TEXT [N, 1], ``thresholds``
    one for all or per text (a list) or per label (rows), KServe ``parameters``."""
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    thr = np.asarray(thresholds, np.float32).reshape(len(texts), -1) if np.ndim(thresholds) else np.full((len(texts), 1), thresholds, np.float32)
    return {"inputs": {"TEXT": t, "THRESHOLD": thr}, "parameters": parameters or {}}


def executes_answered(mock, model, executes):
    """Each response of ``executes`` (each a list of :func:`text_request`, one execute of ``model``)
    as ``("error", code, message)`` or ``{output: (values, dtype, shape)}``, in order."""
    from orchestrator.testing.mock import InferError

    out = []
    for execute in executes:
        for result in mock.infer_batch(model, execute):
            if isinstance(result, InferError):
                out.append(("error", result.code, result.message))
            else:
                out.append({k: (v.tolist(), str(v.dtype), v.shape) for k, v in sorted(result.items())})
    return out
