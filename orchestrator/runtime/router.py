"""The router: one Python-backend model that replaces the ``ensemble`` DAG.

Same inputs and outputs as ``ensemble`` plus ``ROUTE``, so a client switches by model name:
    TEXT           TYPE_STRING [N, 1]  UTF-8 texts
    THRESHOLD      FP32        [N, 1]  decision threshold per text, in [0, 1]
    PROBABILITIES  FP32        [N, 1]  probability of the positive class
    VERDICTS       BOOL        [N, 1]  PROBABILITIES >= THRESHOLD (unless a constant says)
    ROUTE          TYPE_STRING [N, 1]  the branch that answered
    POLICY         TYPE_STRING [N, 1]  optional: the policy as JSON, only for requests with
                                       the parameter ``describe_policy: true``

What happens to each text is decided by the routing policy (``orchestrator.runtime.policy``), a
YAML file in the model directory named by the config parameter ``policy``. The default
policy (``model_repository/router/policy.yaml``) answers empty texts without a model
(probability 0.5, verdict false, ROUTE ``empty``), chunks texts over 128 tokens into
overlapping windows (ROUTE ``chunked:<model>``), and cascades from ``classifier_fast`` to
``classifier`` for texts whose probability is within 0.15 of their threshold.

Batching: the texts of all requests in one ``execute`` call go through the policy
together: one tokenization (whole texts, no truncation), one BLS call per model node, one
postprocess step; BLS calls are split at ``bls_max_batch_size`` rows and sent
concurrently, with rows sorted by length so each call pads as little as possible. The
shipped policy tokenizes and post-processes in this process (policy option ``inline``,
the tokenizer model's own files and the postprocess model's own function); without it
both are BLS calls to the ``tokenizer`` and ``postprocess`` models.

Errors: bad input gives that request an INVALID_ARG error naming the input (or the request
parameter). A failing downstream model gives an INTERNAL error naming the model, unless a
``fallback`` node answers instead; when several requests were batched together, each is
retried alone so only the requests that fail get the error. Every request gets exactly
one response.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import math
import os
import random
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from orchestrator.runtime import policy as P
from orchestrator.runtime.scores import probabilities_and_verdicts, sigmoid
from orchestrator.runtime.validation import (
    InputError,
    check_thresholds,
    config_parameters,
    decode_texts,
    parse_bool,
    request_parameters,
)

# Request parameter that asks for the optional POLICY output (``orchestrator policy show``).
DESCRIBE_PARAMETER = "describe_policy"
# Latency histogram buckets in seconds: 1 ms to 10 s, roughly x2.5 apart.
LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


class DownstreamError(RuntimeError):
    """A BLS call failed or a node timed out; the message names the model or node."""


# ----------------------------------------------------------------------------- pure helpers


def token_windows(ids: np.ndarray, max_length: int, stride: int) -> List[np.ndarray]:
    """Split one tokenized text into overlapping windows of at most ``max_length`` tokens.

    Args:
        ids: int64 [T] token ids of the whole text, first and last being special tokens
            ([CLS] ... [SEP] for BERT).
        max_length: window length in tokens, special tokens included.
        stride: content tokens between the starts of consecutive windows.

    Returns:
        A list of int64 arrays, each ``[first] + content slice + [last]``; together they
        cover every content token, the last window ends at the text's last content token.
        A text of at most ``max_length`` tokens comes back as one window, itself.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.shape[0] <= max_length:
        return [ids]
    body, width = ids[1:-1], max_length - 2
    starts = list(range(0, body.shape[0] - width + 1, stride))
    if starts[-1] + width < body.shape[0]:
        starts.append(body.shape[0] - width)
    return [np.concatenate([ids[:1], body[s : s + width], ids[-1:]]) for s in starts]


def truncate(ids: np.ndarray, max_length: int) -> np.ndarray:
    """Keep the first ``max_length - 1`` tokens and the last (special) one, as a tokenizer's
    truncation does; shorter inputs are returned unchanged."""
    if ids.shape[0] <= max_length:
        return ids
    return np.concatenate([ids[: max_length - 1], ids[-1:]])


def aggregate(probabilities: Sequence[float], lengths: Sequence[int], how: str) -> float:
    """Combine window probabilities of one text into one (see ``policy.AGGREGATIONS``)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if how == "max":
        return float(p.max())
    if how == "mean":
        return float(p.mean())
    w = np.asarray(lengths, dtype=np.float64)
    return float((p * w).sum() / w.sum())


def logit(p: float) -> float:
    """Inverse sigmoid, with p clipped to [1e-12, 1 - 1e-12] so it stays finite."""
    p = min(max(p, 1e-12), 1.0 - 1e-12)
    return math.log(p) - math.log1p(-p)


def split_fraction(node_name: str, request_id: str) -> float:
    """A request's deterministic position in [0, 1) for a ``split`` node: the first 8 bytes
    of SHA-256(node name, request id), so the same id always takes the same branch."""
    digest = hashlib.sha256(f"{node_name}\0{request_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


# ----------------------------------------------------------------------------- data


@dataclass
class Work:
    """One request's validated input: ``texts`` (N strings), ``thresholds`` (float32 [N]),
    request ``parameters`` and ``request_id`` (Triton's, may be empty)."""

    texts: List[str]
    thresholds: np.ndarray
    parameters: Mapping[str, object]
    request_id: str = ""
    describe: bool = False  # request parameter describe_policy: add the POLICY output


@dataclass
class Result:
    """One request's answer: PROBABILITIES float32 [N, 1], VERDICTS bool [N, 1], ROUTE [N]."""

    probabilities: np.ndarray
    verdicts: np.ndarray
    routes: List[str]


@dataclass
class Item:
    """One text (or one window of a text) travelling through the policy."""

    idx: int
    req: int
    text: str
    threshold: float
    params: Mapping[str, object]
    request_id: str
    ids: Optional[np.ndarray] = None


@dataclass
class Answer:
    """A node's answer for one item; ``logit`` goes to postprocess unless ``verdict`` is set."""

    probability: float
    logit: Optional[float]
    route: str
    verdict: Optional[bool] = None


# infer(model_name, inputs, parameters, request_id, alone) -> outputs; raises DownstreamError.
# ``alone``: no other downstream call of this execute can be in flight meanwhile, so the call
# may block the event loop (the adapter then uses the blocking BLS ``exec``).
InferFn = Callable[[str, Dict[str, np.ndarray], Optional[dict], str, bool], Awaitable[Dict[str, np.ndarray]]]

# True inside a branch that runs beside others (gather) or under a timeout (wait_for must be
# able to give up on it): its downstream calls must not block the event loop.
_CONCURRENT: contextvars.ContextVar[bool] = contextvars.ContextVar("orchestrator_concurrent", default=False)


async def _as_concurrent(coro):
    token = _CONCURRENT.set(True)  # reset: Python 3.12's wait_for awaits in the caller's task
    try:
        return await coro
    finally:
        _CONCURRENT.reset(token)


async def gather(coros: Sequence[Awaitable]) -> list:
    """``asyncio.gather`` of ``coros``, marking them concurrent when there is more than one."""
    coros = list(coros)
    if len(coros) == 1:
        return [await coros[0]]
    return await asyncio.gather(*(_as_concurrent(c) for c in coros))


# ----------------------------------------------------------------------------- metrics


class Metrics:
    """Prometheus metrics on Triton's ``/metrics`` through ``pb_utils.MetricFamily``.

    Every family has the label ``router`` (the model name). Names and meaning:
        orchestrator_requests_total{outcome}        requests answered (success | error)
        orchestrator_texts_total{route}             texts answered, per ROUTE value
        orchestrator_escalations_total{node}        texts a cascade sent to a later stage
        orchestrator_chunked_texts_total{node}      texts a chunk node split into windows
        orchestrator_chunks_total{node}             windows those texts became
        orchestrator_model_loads_total{model,outcome}   on-demand loads (success | failure)
        orchestrator_model_unloads_total{model}     idle unloads
        orchestrator_node_errors_total{node}        node failures (error or timeout)
        orchestrator_node_latency_seconds{node}     histogram of node run time, seconds

    Each ``Metric.increment``/``observe`` is a round trip from the stub to the server, so
    updates are buffered in memory and sent by a background thread every
    ``flush_interval_s`` (0.5 s), off the request path: ``/metrics`` lags by at most that.
    Without ``MetricFamily`` (old stubs) every call is a no-op.
    """

    COUNTERS = {
        "orchestrator_requests_total": "Requests answered by the router, by outcome",
        "orchestrator_texts_total": "Texts answered by the router, by route",
        "orchestrator_escalations_total": "Texts a cascade node sent on to a later stage",
        "orchestrator_chunked_texts_total": "Texts a chunk node split into windows",
        "orchestrator_chunks_total": "Windows made by a chunk node",
        "orchestrator_model_loads_total": "On-demand model loads by the router, by outcome",
        "orchestrator_model_unloads_total": "Idle on-demand models unloaded by the router",
        "orchestrator_node_errors_total": "Policy node failures (downstream error or timeout)",
    }

    def __init__(self, pb, router_name: str, flush_interval_s: float = 0.5):
        self.router = router_name
        self.families = {}
        self.metrics = {}
        self.lock = threading.Lock()
        self.counts: Dict[tuple, float] = {}
        self.observations: Dict[tuple, list] = {}
        self.stop = threading.Event()
        family = getattr(pb, "MetricFamily", None)
        if family is None:
            return
        for name, doc in self.COUNTERS.items():
            self.families[name] = family(name=name, description=doc, kind=family.COUNTER)
        if hasattr(family, "HISTOGRAM"):
            self.families["orchestrator_node_latency_seconds"] = family(
                name="orchestrator_node_latency_seconds",
                description="Run time of each policy node, seconds",
                kind=family.HISTOGRAM,
            )
        self.flusher = threading.Thread(target=self._flush_loop, args=(flush_interval_s,), name="orchestrator-metrics", daemon=True)
        self.flusher.start()

    def _metric(self, key):
        family, labels = key
        m = self.metrics.get(key)
        if m is None:
            full = {"router": self.router, **dict(labels)}
            if family.endswith("_seconds"):
                m = self.families[family].Metric(labels=full, buckets=LATENCY_BUCKETS)
            else:
                m = self.families[family].Metric(labels=full)
            self.metrics[key] = m
        return m

    def inc(self, family: str, value: float = 1.0, **labels) -> None:
        if family in self.families and value:
            key = (family, tuple(sorted(labels.items())))
            with self.lock:
                self.counts[key] = self.counts.get(key, 0.0) + value

    def observe(self, family: str, value: float, **labels) -> None:
        if family in self.families:
            key = (family, tuple(sorted(labels.items())))
            with self.lock:
                self.observations.setdefault(key, []).append(value)

    def flush(self) -> None:
        """Send the buffered updates to the server now."""
        with self.lock:
            counts, self.counts = self.counts, {}
            observations, self.observations = self.observations, {}
        for key, value in counts.items():
            self._metric(key).increment(value)
        for key, values in observations.items():
            m = self._metric(key)
            for v in values:
                m.observe(v)

    def _flush_loop(self, interval: float) -> None:
        while not self.stop.wait(interval):
            self.flush()

    def close(self) -> None:
        self.stop.set()
        self.flush()


# ----------------------------------------------------------------------------- on-demand models


@dataclass(frozen=True)
class ServerOptions:
    """What the hosting ``tritonserver``'s command line says about model control.

    ``mode``: the ``--model-control-mode`` value (``none`` when the flag is absent, as in
    Triton), or None when the command line could not be read. ``repositories``: the
    ``--model-repository``/``--model-store`` paths, absolute, or None when unknown or when
    any of them is not a local path (``s3://``, ``gs://``, ``as://``).

    Why the router reads them: in Triton 2.51 (python_backend ``ProcessMessage``) a
    ``pb_utils.load_model`` that fails frees the error text in shared memory before the
    stub reads it; the stub then frees it again, the shared-memory allocator is corrupted
    and the server aborts (``boost::interprocess::lock_exception``). A refused load in
    ``--model-control-mode=none`` and a load of a model that is in no repository are
    failures known in advance, so the router does not ask for them. docs/deployment.md
    has the details and the reproduction.
    """

    mode: Optional[str] = None
    repositories: Optional[tuple] = None

    @classmethod
    def parse(cls, argv: Sequence[str], cwd: Path) -> "ServerOptions":
        """Options from ``tritonserver`` arguments (``--flag=value`` or ``--flag value``;
        the last occurrence of ``--model-control-mode`` wins, as in Triton)."""
        mode, repositories = "none", []
        args = list(argv[1:])
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            if flag == "--model-control-mode":
                mode = value.strip().lower()
            elif flag in ("--model-repository", "--model-store"):
                repositories.append(value)
        local = None
        if repositories and not any("://" in r for r in repositories):
            local = tuple((cwd / r).resolve() for r in repositories)
        return cls(mode, local)

    @classmethod
    def of_parent(cls) -> "ServerOptions":
        """Options of this process's parent when it is ``tritonserver`` (Linux ``/proc``);
        empty options (all unknown) otherwise, e.g. under the in-process mock."""
        proc = Path("/proc") / str(os.getppid())
        try:
            argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            if not argv or not Path(argv[0]).name.startswith("tritonserver"):
                return cls()
            return cls.parse(argv, Path(os.readlink(proc / "cwd")))
        except (OSError, UnicodeDecodeError):
            return cls()

    def missing(self, model: str) -> Optional[str]:
        """Why loading ``model`` must fail, when the local repositories show it; else None."""
        if self.repositories is None or any((r / model).is_dir() for r in self.repositories):
            return None
        return f"model '{model}' is in no model repository ({', '.join(map(str, self.repositories))})"


class ModelManager:
    """Loads ``on_demand`` models on first use and unloads them after their idle timeout.

    Only models the policy marks ``on_demand`` are ever loaded or unloaded, and only models
    this router loaded itself are unloaded. Concurrent first uses share one load. A failed
    load fails the texts that needed it (a ``fallback`` node may answer them) and is not
    retried before ``retry_after_s``. Needs ``--model-control-mode=explicit``: under any
    other mode (read from the server's command line, see :class:`ServerOptions`), or when
    the server refuses a load, the router logs it once and treats those models as always
    loaded. A model that is in none of the server's local repositories fails without a
    load request.
    """

    def __init__(self, pb, on_demand: Mapping[str, P.OnDemand], metrics: Metrics, logger, server: Optional[ServerOptions] = None):
        self.pb, self.settings, self.metrics, self.logger = pb, dict(on_demand), metrics, logger
        self.server = ServerOptions.of_parent() if server is None else server
        self.enabled = bool(self.settings)
        if self.enabled and self.server.mode not in (None, "explicit"):
            self._disable(f"the server runs with --model-control-mode={self.server.mode}; pb_utils.load_model needs explicit")
        self.ours = set()
        self.last_used: Dict[str, float] = {}
        self.in_use: Dict[str, int] = {m: 0 for m in self.settings}
        self.failed: Dict[str, tuple] = {}  # model -> (monotonic time, message)
        self.guard = threading.Lock()
        self.loading: Dict[str, threading.Event] = {}
        self.stop = threading.Event()
        self.reaper = None
        if self.enabled:
            self.reaper = threading.Thread(target=self._reap_loop, name="orchestrator-unloader", daemon=True)
            self.reaper.start()

    def _disable(self, reason: str) -> None:
        """Stop loading and unloading; on-demand models count as always loaded from now on."""
        self.enabled = False
        self.logger.log_warn(f"router: on-demand loading is unavailable ({reason}); treating {sorted(self.settings)} as always loaded")

    def _load_failed(self, model: str, message: str) -> DownstreamError:
        """Record a failed load (no retry before ``retry_after_s``); the error to raise. Hold ``guard``."""
        self.failed[model] = (time.monotonic(), message)
        self.metrics.inc("orchestrator_model_loads_total", model=model, outcome="failure")
        return DownstreamError(f"model '{model}' failed to load: {message}")

    def _load_blocking(self, model: str) -> None:
        """Load ``model`` unless ready; one thread loads, the others wait for it."""
        while True:
            with self.guard:
                if self.pb.is_model_ready(model):
                    return
                event = self.loading.get(model)
                if event is None:
                    failed = self.failed.get(model)
                    if failed and time.monotonic() - failed[0] < self.settings[model].retry_after_s:
                        wait = self.settings[model].retry_after_s - (time.monotonic() - failed[0])
                        raise DownstreamError(f"model '{model}' failed to load: {failed[1]} (next try in {wait:.0f} s)")
                    missing = self.server.missing(model)
                    if missing:  # a load request that must fail can crash the server (ServerOptions)
                        raise self._load_failed(model, missing)
                    event = self.loading[model] = threading.Event()
                    break
            event.wait()
        try:
            self.pb.load_model(model_name=model)
        except Exception as exc:  # the stub raises TritonModelException
            message = str(exc)
            with self.guard:
                self.loading.pop(model).set()
                if "explicit model load" in message or "not allowed" in message:
                    self._disable(message)
                    raise DownstreamError(f"model '{model}' is not ready and on-demand loading is unavailable: {message}")
                raise self._load_failed(model, message) from None
        with self.guard:
            self.ours.add(model)
            self.failed.pop(model, None)
            self.loading.pop(model).set()
        self.metrics.inc("orchestrator_model_loads_total", model=model, outcome="success")
        self.logger.log_info(f"router: loaded on-demand model '{model}'")

    async def acquire(self, model: str) -> None:
        """Mark ``model`` in use and make sure it is loaded (no-op unless on-demand)."""
        if model not in self.settings:
            return
        with self.guard:
            self.in_use[model] += 1
            self.last_used[model] = time.monotonic()
        if not self.enabled:
            return
        try:
            if not self.pb.is_model_ready(model):
                await asyncio.get_running_loop().run_in_executor(None, self._load_blocking, model)
        except BaseException:
            self.release(model)
            raise

    def release(self, model: str) -> None:
        if model in self.settings:
            with self.guard:
                self.in_use[model] -= 1
                self.last_used[model] = time.monotonic()

    def reap(self, now: Optional[float] = None) -> List[str]:
        """Unload our idle models; returns their names."""
        now = time.monotonic() if now is None else now
        with self.guard:
            idle = [
                m
                for m in self.ours
                if self.in_use[m] == 0 and now - self.last_used.get(m, now) >= self.settings[m].idle_timeout_s
            ]
            for m in idle:
                self.ours.discard(m)
        for m in idle:
            try:
                self.pb.unload_model(model_name=m)
                self.metrics.inc("orchestrator_model_unloads_total", model=m)
                self.logger.log_info(f"router: unloaded idle on-demand model '{m}'")
            except Exception as exc:
                self.logger.log_warn(f"router: unloading '{m}' failed: {exc}")
        return idle

    def _reap_loop(self) -> None:
        period = max(0.2, min(s.idle_timeout_s for s in self.settings.values()) / 4)
        while not self.stop.wait(min(period, 5.0)):
            self.reap()

    def close(self) -> None:
        self.stop.set()


# ----------------------------------------------------------------------------- the engine


class Engine:
    """Runs a :class:`~orchestrator.runtime.policy.Policy` over the texts of one ``execute`` call."""

    def __init__(
        self,
        policy: P.Policy,
        infer: InferFn,
        metrics: Optional[Metrics] = None,
        models: Optional[ModelManager] = None,
        model_dir: Optional[Path] = None,
    ):
        self.policy = policy
        self.tokenizer = None
        if policy.inline_tokenizer:
            from transformers import AutoTokenizer

            path = (Path(model_dir or ".") / policy.inline_tokenizer).resolve()
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.infer = infer
        self.metrics = metrics
        self.models = models
        self.counter = 0
        self.split_rng = random.Random()
        self.needs_tokens = any(
            isinstance(n, (P.ModelNode, P.ChunkNode))
            or (isinstance(n, P.SwitchNode) and any(c.when.needs_tokens for c in n.cases))
            for n in policy.nodes()
        )

    def _inc(self, family, value=1.0, **labels):
        if self.metrics:
            self.metrics.inc(family, value, **labels)

    async def _batched(self, model, rows, make_inputs, parameters, items_of):
        """Send ``rows`` to ``model`` in concurrent calls of at most ``bls_max_batch_size``.

        Each call carries the Triton request ids of its rows (``items_of(part)``), and, when
        all its rows come from one request, that request's parameters too (ours win), so a
        trace can follow a request downstream.
        """
        size = self.policy.bls_max_batch_size
        parts = [rows[i : i + size] for i in range(0, len(rows), size)]

        def context(part):
            items = items_of(part)
            ids = ",".join(dict.fromkeys(it.request_id for it in items if it.request_id))
            forwarded = {}
            if len({it.req for it in items}) == 1:  # BLS parameters take str, int and bool only
                forwarded = {k: v for k, v in items[0].params.items() if isinstance(v, (str, int, bool))}
            forwarded.update(parameters or {})
            return forwarded, ids

        calls = []
        for part in parts:
            forwarded, ids = context(part)
            calls.append(self.infer(model, make_inputs(part), forwarded, ids, len(parts) == 1 and not _CONCURRENT.get()))
        return await gather(calls)

    @staticmethod
    def _rows_of(items: Sequence[Item]):
        return lambda part: [items[i] for i in part]

    async def ensure_tokens(self, items: Sequence[Item]) -> None:
        """Tokenize (one batched BLS call, no truncation) the items that have no ids yet."""
        todo = [it for it in items if it.ids is None]
        if not todo:
            return
        if self.tokenizer is not None:  # in-process: the same files and call as the tokenizer model
            encoded = self.tokenizer([it.text for it in todo], truncation=False, padding=False)["input_ids"]
            for it, ids in zip(todo, encoded):
                it.ids = np.asarray(ids, dtype=np.int64)
            return

        def inputs(part):
            arr = np.array([todo[i].text.encode("utf-8") for i in part], dtype=np.object_).reshape(-1, 1)
            return {"TEXT": arr}

        outs = await self._batched(
            self.policy.tokenizer, list(range(len(todo))), inputs, {"truncation": False}, self._rows_of(todo)
        )
        k = 0
        for out in outs:
            ids, mask = out["input_ids"], out["attention_mask"]
            lengths = mask.sum(axis=1)
            for row in range(ids.shape[0]):
                todo[k].ids = ids[row, : int(lengths[row])]
                k += 1

    async def classify(self, model: str, items: Sequence[Item], max_length: int) -> np.ndarray:
        """Logits (float32 [len(items)]) of ``model``; rows sorted by length, padded per call."""
        seqs = [truncate(it.ids, max_length) for it in items]
        order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])

        def inputs(part):
            width = max(seqs[order[i]].shape[0] for i in part)
            ids = np.zeros((len(part), width), dtype=np.int64)
            mask = np.zeros((len(part), width), dtype=np.int64)
            for row, i in enumerate(part):
                s = seqs[order[i]]
                ids[row, : s.shape[0]] = s
                mask[row, : s.shape[0]] = 1
            return {"input_ids": ids, "attention_mask": mask}

        sorted_items = [items[i] for i in order]
        outs = await self._batched(model, list(range(len(order))), inputs, None, self._rows_of(sorted_items))
        logits = np.empty(len(seqs), dtype=np.float32)
        logits[order] = np.concatenate([o["logits"].reshape(o["logits"].shape[0], -1)[:, 0] for o in outs])
        return logits

    # -- node dispatch

    async def run_node(self, node: P.Node, items: List[Item]) -> Dict[int, Answer]:
        if not items:
            return {}
        start = time.perf_counter()
        try:
            coro = getattr(self, f"_run_{node.kind}")(node, items)
            if node.timeout_ms:
                try:
                    return await asyncio.wait_for(_as_concurrent(coro), node.timeout_ms / 1000.0)
                except asyncio.TimeoutError:
                    raise DownstreamError(f"node '{node.name}' timed out after {node.timeout_ms:g} ms") from None
            return await coro
        except DownstreamError:
            self._inc("orchestrator_node_errors_total", node=node.name)
            raise
        finally:
            if self.metrics:
                self.metrics.observe("orchestrator_node_latency_seconds", time.perf_counter() - start, node=node.name)

    async def _run_constant(self, node: P.ConstantNode, items):
        p = node.probability
        return {it.idx: Answer(p, logit(p), node.route, node.verdict) for it in items}

    async def _run_model(self, node: P.ModelNode, items):
        await self.ensure_tokens(items)
        if self.models:
            await self.models.acquire(node.model)
        try:
            z = (await self.classify(node.model, items, node.max_length)).astype(np.float64) + node.logit_shift
        finally:
            if self.models:
                self.models.release(node.model)
        probs = sigmoid(z)
        return {it.idx: Answer(float(p), float(zz), node.route) for it, p, zz in zip(items, probs, z)}

    async def _run_sequence(self, node: P.SequenceNode, items):
        answers: Dict[int, Answer] = {}
        remaining = list(items)
        for step in node.steps:
            answers.update(await self.run_node(step, remaining))
            remaining = [it for it in remaining if it.idx not in answers]
            if not remaining:
                break
        return answers

    def _matches(self, cond: P.Condition, it: Item, score: Optional[Answer]) -> bool:
        if cond.empty is not None and (not it.text.strip()) != cond.empty:
            return False
        if cond.needs_tokens:
            n = 0 if not it.text.strip() and it.ids is None else int(it.ids.shape[0])
            if cond.tokens_min is not None and n < cond.tokens_min:
                return False
            if cond.tokens_max is not None and n > cond.tokens_max:
                return False
        if cond.param_name is not None and str(it.params.get(cond.param_name, "")) not in cond.param_values:
            return False
        if cond.margin_below is not None and not abs(score.probability - it.threshold) < cond.margin_below:
            return False
        return True

    async def _run_switch(self, node: P.SwitchNode, items):
        scores = await self.run_node(node.score, items) if node.score else {}
        if any(c.when.needs_tokens for c in node.cases):
            await self.ensure_tokens([it for it in items if it.text.strip()])
        groups: List[List[Item]] = [[] for _ in node.cases]
        rest: List[Item] = []
        for it in items:
            for k, case in enumerate(node.cases):
                if self._matches(case.when, it, scores.get(it.idx)):
                    groups[k].append(it)
                    break
            else:
                rest.append(it)
        jobs = [self.run_node(c.then, g) for c, g in zip(node.cases, groups) if g]
        if node.default and rest:
            jobs.append(self.run_node(node.default, rest))
        answers: Dict[int, Answer] = {}
        if node.score and not node.default:
            answers.update({it.idx: scores[it.idx] for it in rest})
        for part in await gather(jobs):
            answers.update(part)
        return answers

    async def _run_cascade(self, node: P.CascadeNode, items):
        answers = await self.run_node(node.stages[0], items)
        by_idx = {it.idx: it for it in items}
        for stage in node.stages[1:]:
            unsure = [by_idx[i] for i, a in answers.items() if a.verdict is None and abs(a.probability - by_idx[i].threshold) < node.margin]
            if not unsure:
                break
            self._inc("orchestrator_escalations_total", len(unsure), node=node.name)
            answers.update(await self.run_node(stage, unsure))
        return answers

    async def _run_chunk(self, node: P.ChunkNode, items):
        await self.ensure_tokens(items)
        windows: List[Item] = []
        owner: Dict[int, int] = {}
        chunked = set()
        for it in items:
            pieces = token_windows(it.ids, node.window, node.stride)
            if len(pieces) == 1:
                windows.append(it)
                owner[it.idx] = it.idx
                continue
            chunked.add(it.idx)
            for piece in pieces:
                self.counter += 1
                w = Item(-self.counter, it.req, it.text, it.threshold, it.params, it.request_id, piece)
                windows.append(w)
                owner[w.idx] = it.idx
        if chunked:
            self._inc("orchestrator_chunked_texts_total", len(chunked), node=node.name)
            self._inc("orchestrator_chunks_total", len(windows) - (len(items) - len(chunked)), node=node.name)
        inner = await self.run_node(node.node, windows)
        per_text: Dict[int, list] = {}
        for w in windows:
            per_text.setdefault(owner[w.idx], []).append((inner[w.idx], int(w.ids.shape[0])))
        answers = {}
        for idx, parts in per_text.items():
            if idx not in chunked:
                answers[idx] = parts[0][0]
                continue
            p = aggregate([a.probability for a, _ in parts], [n for _, n in parts], node.aggregation)
            routes = list(dict.fromkeys(a.route for a, _ in parts))
            answers[idx] = Answer(p, logit(p), "chunked:" + "+".join(routes))
        return answers

    async def _run_split(self, node: P.SplitNode, items):
        total = sum(w for w, _ in node.branches)
        choice: Dict[int, int] = {}
        groups: List[List[Item]] = [[] for _ in node.branches]
        for it in items:
            if it.req not in choice:
                x = split_fraction(node.name, it.request_id) if it.request_id else self.split_rng.random()
                acc = 0.0
                for k, (w, _) in enumerate(node.branches):
                    acc += w / total
                    if x < acc or k == len(node.branches) - 1:
                        choice[it.req] = k
                        break
            groups[choice[it.req]].append(it)
        answers: Dict[int, Answer] = {}
        for part in await gather(self.run_node(n, g) for (_, n), g in zip(node.branches, groups) if g):
            answers.update(part)
        return answers

    async def _run_parallel(self, node: P.ParallelNode, items):
        results = await gather(self.run_node(n, items) for n in node.nodes)
        answers = {}
        for it in items:
            parts = [r[it.idx] for r in results]
            probs = [a.probability for a in parts]
            route = f"parallel:{node.combine}(" + ",".join(a.route for a in parts) + ")"
            if node.combine == "vote":
                share = sum(p >= it.threshold for p in probs) / len(probs)
                answers[it.idx] = Answer(share, logit(share), route, share > 0.5)
            else:
                p = float(np.mean(probs)) if node.combine == "mean" else float(max(probs))
                answers[it.idx] = Answer(p, logit(p), route)
        return answers

    async def _run_fallback(self, node: P.FallbackNode, items):
        errors = []
        for child in node.nodes:
            try:
                return await self.run_node(child, items)
            except DownstreamError as exc:
                errors.append(str(exc))
        raise DownstreamError(f"all options of fallback '{node.name}' failed: " + "; ".join(errors))

    # -- one execute call

    async def run(self, works: List[Work]) -> List[Result]:
        """Answer every request in ``works``; raises DownstreamError if the policy fails."""
        items: List[Item] = []
        for k, w in enumerate(works):
            for text, thr in zip(w.texts, w.thresholds):
                items.append(Item(len(items), k, text, float(thr), w.parameters, w.request_id))
        if self.needs_tokens:
            await self.ensure_tokens([it for it in items if it.text.strip()])
        answers = await self.run_node(self.policy.root, items)
        missing = [it.idx for it in items if it.idx not in answers]
        if missing:
            raise DownstreamError(f"the policy answered no route for {len(missing)} text(s)")
        probs = np.array([answers[it.idx].probability for it in items], dtype=np.float64)
        verdicts = np.zeros(len(items), dtype=bool)
        post = [it for it in items if answers[it.idx].verdict is None]
        idx = [it.idx for it in post]
        for it in items:
            if answers[it.idx].verdict is not None:
                verdicts[it.idx] = answers[it.idx].verdict
        if post and self.policy.inline_postprocess:
            p, v = probabilities_and_verdicts(
                np.array([[answers[i].logit] for i in idx], dtype=np.float32), np.array([it.threshold for it in post], np.float32)
            )
            probs[idx], verdicts[idx] = p.reshape(-1), v.reshape(-1)
        elif post:
            outs = await self._batched(
                self.policy.postprocess,
                list(range(len(post))),
                lambda part: {
                    "logits": np.array([[answers[post[i].idx].logit] for i in part], dtype=np.float32),
                    "THRESHOLD": np.array([[post[i].threshold] for i in part], dtype=np.float32),
                },
                None,
                self._rows_of(post),
            )
            probs[idx] = np.concatenate([o["PROBABILITIES"].reshape(-1) for o in outs])
            verdicts[idx] = np.concatenate([o["VERDICTS"].reshape(-1) for o in outs])
        results, start = [], 0
        for w in works:
            end = start + len(w.texts)
            routes = [answers[i].route for i in range(start, end)]
            for r in routes:
                self._inc("orchestrator_texts_total", route=r)
            results.append(Result(probs[start:end].astype(np.float32).reshape(-1, 1), verdicts[start:end].reshape(-1, 1), routes))
            start = end
        return results


# ----------------------------------------------------------------------------- request parsing


def parse_request(
    texts_array: Optional[np.ndarray],
    thresholds_array: Optional[np.ndarray],
    parameters: Optional[Mapping[str, object]] = None,
    exposed: Optional[Mapping[str, Sequence[str]]] = None,
    request_id: str = "",
) -> Work:
    """Validate one request's ``TEXT``, ``THRESHOLD`` and the request parameters the policy
    exposes.

    Raises:
        InputError: a missing input, an empty batch, invalid UTF-8, a threshold that is not
            one finite probability per text, or an exposed request parameter with a value
            the policy does not offer.
    """
    if texts_array is None:
        raise InputError("TEXT: required input is missing")
    if thresholds_array is None:
        raise InputError("THRESHOLD: required input is missing")
    texts = decode_texts(texts_array, "TEXT")
    thresholds = check_thresholds(thresholds_array, len(texts), "THRESHOLD")
    parameters = dict(parameters or {})
    for name, allowed in (exposed or {}).items():
        if name in parameters and str(parameters[name]) not in allowed:
            raise InputError(
                f"parameter {name}={parameters[name]!r}: not a route this policy exposes (choose one of: {', '.join(allowed)})"
            )
    describe = parse_bool(parameters.pop(DESCRIBE_PARAMETER, False), DESCRIBE_PARAMETER)
    return Work(texts=texts, thresholds=thresholds, parameters=parameters, request_id=request_id, describe=describe)


def policy_path(model_dir: Path, params: Mapping[str, str]) -> Path:
    """The policy file named by the config parameter ``policy`` (default ``policy.yaml``),
    relative to the model directory.

    Raises:
        ValueError: the path leaves the model directory.
    """
    name = params.get("policy", "policy.yaml")
    path = (model_dir / name).resolve()
    if model_dir.resolve() not in path.parents:
        raise ValueError(f"router: parameter policy={name!r} points outside the model directory")
    return path


# ----------------------------------------------------------------------------- Triton adapter


class TritonPythonModel:
    """Triton Python-backend adapter around :class:`Engine`.

    ``execute`` is a plain function that runs the engine on this instance's own event loop
    in the calling (stub main) thread. A downstream call that is the only one in flight
    uses the blocking BLS ``exec``; calls that run beside others (several parts of a batch,
    ``parallel``/``split``/``switch`` branches) or under a ``timeout_ms`` use ``async_exec``.
    Why: the stub runs an ``async def execute`` on a loop in another thread and
    ``async_exec`` in a thread pool, four thread hand-offs per request on the path that
    matters most (one text, one classifier call); docs/benchmarks.md has the measurement.
    """

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        self.logger = pb_utils.Logger
        config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        path = policy_path(model_dir, config_parameters(config))
        try:
            self.policy = P.load_policy(path)
        except P.PolicyError as exc:
            raise ValueError(f"router: invalid routing policy: {exc}") from None
        self.name = args.get("model_name", config.get("name", "router"))
        self.metrics = Metrics(pb_utils, self.name)
        self.models = ModelManager(pb_utils, self.policy.on_demand(), self.metrics, self.logger)
        self.engine = Engine(self.policy, self._infer, self.metrics, self.models, model_dir)
        self.loop = asyncio.new_event_loop()
        self.policy_json = json.dumps(self.policy.source).encode("utf-8")
        self.logger.log_info(f"router '{self.name}': policy {path}\n{P.describe(self.policy)}")
        if self.models.enabled:
            self.logger.log_info(
                f"router '{self.name}': on-demand models {sorted(self.policy.on_demand())} "
                "(needs --model-control-mode=explicit; otherwise they are treated as always loaded)"
            )

    def finalize(self):
        self.models.close()
        self.metrics.close()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())  # async_exec's threads
        self.loop.close()

    async def _infer(self, model: str, inputs: Dict[str, np.ndarray], parameters: Optional[dict], request_id: str,
                     alone: bool = False):
        pb = self.pb
        request = pb.InferenceRequest(
            model_name=model,
            inputs=[pb.Tensor(name, value) for name, value in inputs.items()],
            requested_output_names=[],
            request_id=request_id,
            parameters=parameters or {},
        )
        response = request.exec() if alone else await request.async_exec()
        if response.has_error():
            raise DownstreamError(f"model '{model}' failed: {response.error().message()}")
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def _response(self, result: Result, describe: bool = False):
        pb = self.pb
        routes = np.array([r.encode("utf-8") for r in result.routes], dtype=np.object_).reshape(-1, 1)
        tensors = [
            pb.Tensor("PROBABILITIES", result.probabilities),
            pb.Tensor("VERDICTS", result.verdicts),
            pb.Tensor("ROUTE", routes),
        ]
        if describe:  # the optional POLICY output: the policy document as JSON, one per row
            tensors.append(pb.Tensor("POLICY", np.array([self.policy_json] * len(result.routes), dtype=np.object_).reshape(-1, 1)))
        return pb.InferenceResponse(output_tensors=tensors)

    def _error(self, message: str, code: str):
        from orchestrator.runtime.models._triton import error_response

        self.metrics.inc("orchestrator_requests_total", outcome="error")
        return error_response(message, code)

    def execute(self, requests):
        """One response per request, in order (see the module docstring for errors)."""
        return self.loop.run_until_complete(self._execute(requests))

    async def _execute(self, requests):
        pb = self.pb
        responses = [None] * len(requests)
        works = {}
        for k, request in enumerate(requests):
            try:
                text = pb.get_input_tensor_by_name(request, "TEXT")
                thr = pb.get_input_tensor_by_name(request, "THRESHOLD")
                works[k] = parse_request(
                    None if text is None else text.as_numpy(),
                    None if thr is None else thr.as_numpy(),
                    request_parameters(request.parameters()),
                    self.policy.request_parameters,
                    request.request_id(),
                )
            except InputError as exc:
                responses[k] = self._error(f"router: {exc}", "INVALID_ARG")
        try:
            keys = list(works)
            for k, result in zip(keys, await self.engine.run([works[k] for k in keys])):
                responses[k] = self._response(result, works[k].describe)
        except DownstreamError as batch_error:
            # Retry each request alone so only the requests that fail get the error.
            for k in works:
                if len(works) == 1:
                    responses[k] = self._error(f"router: {batch_error}", "INTERNAL")
                    continue
                try:
                    responses[k] = self._response((await self.engine.run([works[k]]))[0], works[k].describe)
                except DownstreamError as exc:
                    responses[k] = self._error(f"router: {exc}", "INTERNAL")
        except Exception as exc:  # a bug must fail these requests, not the model instance
            self.logger.log_error(f"router: unexpected error: {traceback.format_exc()}")
            for k in works:
                responses[k] = self._error(f"router: internal error: {type(exc).__name__}: {exc}", "INTERNAL")
        ok = sum(1 for k in works if responses[k] is not None and not responses[k].has_error())
        self.metrics.inc("orchestrator_requests_total", ok, outcome="success")
        return responses
