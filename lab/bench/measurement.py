"""Inputs and measurements: perf_analyzer input data and length sets, merging rounds, accuracy
through tritonclient, and the raw ONNX floor in this process."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from lab.bench.plan import BATCH_SIZES, LENGTH_BOUNDS, MAX_SEQUENCE_LENGTH, THRESHOLD, Spec
from orchestrator.tooling.modeling.contract import encode


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


def token_lengths(tokenizer, texts: Sequence[str]) -> np.ndarray:
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


def length_stats(lengths: Sequence[int]) -> dict:
    a = np.asarray(lengths, dtype=np.float64)
    return {
        "n": int(a.size),
        "tokens_min": int(a.min()),
        "tokens_p50": float(np.percentile(a, 50)),
        "tokens_p90": float(np.percentile(a, 90)),
        "tokens_max": int(a.max()),
        "over_limit": int((a > MAX_SEQUENCE_LENGTH).sum()),
    }


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


def measure_next(binary: Path | str, spec: Spec, url: str, input_data: Path | str, workdir: Path | str, settings,
                 measurements: List[dict], warmup_ms: Mapping[Tuple[str, str], float]) -> dict:
    """``perf_analyzer.measure`` of ``spec``, its first windows sized by :func:`expected_latency_ms`
    of the ``measurements`` so far, with the 1-minute load average at its end (``load_1min``);
    appended to ``measurements`` and returned (a failure is a measurement with ``error``)."""
    from lab.bench.machine import load_average
    from lab.bench.perf_analyzer import measure

    m = measure(binary, spec, url, input_data, workdir, settings, latency_ms=expected_latency_ms(spec, measurements, warmup_ms))
    m["load_1min"] = (load_average() or [None])[0]
    measurements.append(m)
    return m


def outcome(m: Mapping) -> str:
    """One measurement for a progress line: ``FAILED <error>``, or throughput, p50 and p99."""
    if m.get("error"):
        return f"FAILED {m['error']}"
    return f"{m['throughput']:.1f} infer/s, p50 {m['p50_ms']:.2f} ms, p99 {m['p99_ms']:.2f} ms"


def max_load(measurements: Sequence[Mapping]) -> Optional[float]:
    """The highest 1-minute load average recorded with ``measurements`` (``load_1min``); None without one."""
    during = [m["load_1min"] for m in measurements if m.get("load_1min") is not None]
    return max(during) if during else None


def failed_note(measurements: Sequence[Mapping], rounds: bool = True) -> List[str]:
    """The report lines naming the failed measurements (the first three), or none; ``rounds``:
    with each one's round."""
    failed = [m for m in measurements if m.get("error")]
    if not failed:
        return []
    where = (lambda m: f" round {m['round'] + 1}") if rounds else (lambda m: "")
    return ["", f"{len(failed)} measurement(s) failed: " + "; ".join(
        f"{m['model']} c={m['concurrency']}{where(m)}: {m['error']}" for m in failed[:3])]



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
    return [encode(tokenizer, texts[i : i + batch_size], max_length, pad_to) for i in range(0, len(texts), batch_size)]


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

