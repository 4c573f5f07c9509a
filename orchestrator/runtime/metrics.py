"""Prometheus metrics on Triton's ``/metrics`` endpoint through ``pb_utils.MetricFamily``."""

from __future__ import annotations

import functools
import random
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

#: A series' labels other than ``router``: sorted ``(name, value)`` pairs.
Labels = Tuple[Tuple[str, str], ...]

# Latency histogram buckets in seconds: 1 ms to 10 s, roughly x2.5 apart.
LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
# |p_candidate - p_primary| buckets (a probability distance), fine near 0 where an fp16
# variant or a retrained version of one model lands.
DIFFERENCE_BUCKETS = [0.0001, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
# Stage buckets in seconds: 50 us to 1 s; parsing and responding take tens of microseconds.
STAGE_BUCKETS = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
#: The stages of ``orchestrator_stage_seconds``: ``parse`` (the requests of one execute into
#: work), ``tokenize`` (every text with each tokenizer model), ``bls`` (one batched group of
#: downstream calls, send to last answer), ``results`` (probabilities and verdicts from the
#: answers), ``respond`` (the response objects).
STAGES = ("parse", "tokenize", "bls", "results", "respond")
#: Histograms of timings whose observations are sampled at flush (:class:`Metrics`); the
#: shadow difference histogram is not: its count is the number of texts compared.
SAMPLED_HISTOGRAMS = frozenset({"orchestrator_node_latency_seconds", "orchestrator_stage_seconds"})
#: At most this many observations per series of :data:`SAMPLED_HISTOGRAMS` per flush, by
#: default (``make profile`` found one stub-server round trip per observation in 8% of the
#: router stub's samples; ``make bench-flush`` measures the two side by side).
MAX_SAMPLED = 8
#: The router's config parameter that sets the sample: a positive integer, ``all``, or ``off``
#: (no timing observation is taken at all: the histograms stay empty, and each execute skips
#: their clock reads and bookkeeping; ``lab.bench.execute_profile --ablate timing`` measures it).
SAMPLE_PARAMETER = "metrics_timing_sample"
#: The router's config parameter that turns its own metrics off: ``off`` (``on``, the default).
ENABLED_PARAMETER = "metrics"


def metrics_enabled(params: Mapping[str, str]) -> bool:
    """Whether the config parameters ``params`` leave the router's metrics on
    (:data:`ENABLED_PARAMETER`: absent, ``on``, ``true`` or ``yes``; off: ``off``, ``false``
    or ``no``, any case).

    Raises:
        ValueError: any other value (the router then fails to load, naming the parameter).
    """
    raw = params.get(ENABLED_PARAMETER)
    value = "on" if raw is None or raw.strip() == "" else raw.strip().lower()
    if value in ("on", "true", "yes"):
        return True
    if value in ("off", "false", "no"):
        return False
    raise ValueError(f"router: parameter {ENABLED_PARAMETER}={raw!r}: expected 'on' or 'off'")


def timing_sample(params: Mapping[str, str]) -> Optional[int]:
    """The number of timing observations per series per flush that the config parameters
    ``params`` ask for (:data:`SAMPLE_PARAMETER`): :data:`MAX_SAMPLED` when absent, None
    (send every one) for ``all``, 0 (take none) for ``off``.

    Raises:
        ValueError: the value is neither a positive integer, ``all`` nor ``off`` (the router
            then fails to load, naming the parameter).
    """
    raw = params.get(SAMPLE_PARAMETER)
    if raw is None or raw == "":
        return MAX_SAMPLED
    if raw.strip().lower() == "all":
        return None
    if raw.strip().lower() == "off":
        return 0
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"router: parameter {SAMPLE_PARAMETER}={raw!r}: expected a positive integer, 'all' or 'off'")
    return n


#: A series: its family and its labels, sorted (``Metrics.inc``, ``observe``, ``set``, ``record``).
Key = Tuple[str, Tuple[Tuple[str, str], ...]]


@functools.lru_cache(maxsize=4096)  # the engine's stage and node timings, on every execute: made once
def series(family: str, label: str, value: str) -> Key:
    """The series of ``family`` with the one label ``label=value``."""
    return family, ((label, value),)


#: The series the router updates on every execute, made once (``Metrics.inc_series``, ``set_series``).
QUEUE_DELAY: Key = ("orchestrator_queue_delay_seconds", ())
SUCCEEDED: Key = series("orchestrator_requests_total", "outcome", "success")


def observe_stage(metrics: "Metrics | None", stage: str, began: float) -> None:
    """Observe ``orchestrator_stage_seconds{stage}`` (one of :data:`STAGES`): the seconds of
    ``time.perf_counter()`` since ``began``; nothing when ``metrics`` is None."""
    if metrics and metrics.timing:
        metrics.observe_series(series("orchestrator_stage_seconds", "stage", stage), time.perf_counter() - began)


class Metrics:
    """Prometheus metrics on Triton's ``/metrics`` through ``pb_utils.MetricFamily``.

    Every family has the label ``router`` (the model name). Names and meaning:
        orchestrator_requests_total{outcome}        requests answered (success | error)
        orchestrator_texts_total{route}             texts answered, per ROUTE value
        orchestrator_escalations_total{node}        texts a cascade sent to a later stage
        orchestrator_budget_kept_total{node}        texts a cascade's escalation budget kept at
                                                    an earlier stage (ROUTE ends ``:budget``)
        orchestrator_cascade_margin{node}           gauge: the margin a cascade with a budget
                                                    used for its latest batch (probability)
        orchestrator_escalation_rate{node}          gauge: the share of the budget window's
                                                    texts that cascade escalated
        orchestrator_parallel_partial_total{node}   texts a quorum parallel answered without
                                                    every branch
        orchestrator_queue_delay_seconds            gauge: the router's estimated queue delay
                                                    (``orchestrator.runtime.serving.router.QueueDelay``)
        orchestrator_shed_requests_total            requests admission control refused
                                                    (``orchestrator.runtime.serving.admission``)
        orchestrator_chunked_texts_total{node}      texts a chunk node split into windows
        orchestrator_chunks_total{node}             windows of those texts it classified
        orchestrator_chunks_skipped_total{node,reason}  windows it did not: the text stopped
                                                    early (``nodes.chunk``: decided, margin,
                                                    max_windows)
        orchestrator_model_loads_total{model,outcome}   on-demand loads (success | failure)
        orchestrator_model_unloads_total{model}     idle unloads
        orchestrator_node_errors_total{node}        node failures (error or timeout)
        orchestrator_node_latency_seconds{node}     histogram of node run time, seconds
        orchestrator_stage_seconds{stage}           histogram of each stage of an execute
                                                    (:data:`STAGES`), seconds
        orchestrator_circuit_state{model}           gauge: 0 closed, 1 open, 2 half-open
        orchestrator_circuit_transitions_total{model,state}  circuit state changes, by new state
        orchestrator_model_reloads_total{model,outcome}  reloads of models whose stub died
        orchestrator_cancelled_requests_total       requests answered CANCELLED: the client
                                                    cancelled them and a later stage was skipped
        orchestrator_expired_requests_total         requests answered UNAVAILABLE: no stage
                                                    answered before their timeout
        orchestrator_deadline_texts_total{node}     texts answered from an earlier stage for
                                                    their request's deadline (ROUTE ``:deadline``)
        orchestrator_rejected_requests_total{limit} requests refused by an input limit
                                                    (max_text_bytes | max_request_bytes |
                                                    max_windows_per_text)
        orchestrator_shadow_texts_total{node,candidate}    texts a shadow node compared
        orchestrator_shadow_flips_total{node,candidate}    of those, verdicts that differ
        orchestrator_shadow_probability_difference{node,candidate}
                                                    histogram of |p_candidate - p_primary|
        orchestrator_shadow_errors_total{node,candidate}   mirrored texts the candidate
                                                    did not answer
        orchestrator_shadow_dropped_total{node,candidate}  texts not mirrored (queue full)
        orchestrator_shadow_queued_texts{node}      gauge: mirrored texts queued or running
                                                    (``orchestrator.runtime.execution.mirror``)
        orchestrator_step_rows_total{node,model}    rows a pipeline step sent to its model
        orchestrator_branch_rows_total{node,branch} rows that took each branch of a pipeline
                                                    switch (``case<i>``, ``default``, ``none``)

    Each ``Metric.increment``/``observe`` is a round trip from the stub to the server, so
    updates are buffered in memory and sent by a background thread every
    ``flush_interval_s`` (0.5 s), off the request path: ``/metrics`` lags by at most that.
    Counters and gauges cost one round trip per series per flush; a histogram costs one per
    observation, so the timing histograms (:data:`SAMPLED_HISTOGRAMS`) send at most
    ``max_sampled`` (:data:`MAX_SAMPLED`; None: all) observations per series per flush, a
    uniform sample of the interval's (``make profile`` found the flush thread in 8% of the
    router stub's samples at concurrency 1 with every observation sent). Their means and
    quantiles stay unbiased; their ``_count`` counts the sample, not every execute, under
    load (the router's config parameter ``metrics_timing_sample: all`` sends every one).
    Without ``MetricFamily`` (old stubs) every call is a no-op.
    """

    COUNTERS = {
        "orchestrator_requests_total": "Requests answered by the router, by outcome",
        "orchestrator_texts_total": "Texts answered by the router, by route",
        "orchestrator_escalations_total": "Texts a cascade node sent on to a later stage",
        "orchestrator_budget_kept_total": "Texts a cascade node's escalation budget kept at an earlier stage",
        "orchestrator_parallel_partial_total": "Texts a parallel node with a quorum answered without every branch",
        "orchestrator_chunked_texts_total": "Texts a chunk node split into windows",
        "orchestrator_chunks_total": "Windows of chunked texts a chunk node classified",
        "orchestrator_chunks_skipped_total": "Windows of chunked texts a chunk node did not classify: the text stopped early, by reason",
        "orchestrator_model_loads_total": "On-demand model loads by the router, by outcome",
        "orchestrator_model_unloads_total": "Idle on-demand models unloaded by the router",
        "orchestrator_node_errors_total": "Policy node failures (downstream error or timeout)",
        "orchestrator_circuit_transitions_total": "Circuit breaker state changes per downstream model, by new state",
        "orchestrator_model_reloads_total": "Reloads of downstream models whose stub process died, by outcome",
        "orchestrator_rejected_requests_total": "Requests refused by an input limit, by limit",
        "orchestrator_cancelled_requests_total": "Requests cancelled by their client and answered CANCELLED before their next stage",
        "orchestrator_expired_requests_total": "Requests answered UNAVAILABLE because no stage answered before their timeout",
        "orchestrator_shed_requests_total": "Requests the router's admission control refused (UNAVAILABLE) before any model ran",
        "orchestrator_deadline_texts_total": "Texts answered from an earlier stage because of their request's deadline",
        "orchestrator_shadow_texts_total": "Texts a shadow node's candidate answered, compared with the primary's answers",
        "orchestrator_shadow_flips_total": "Compared texts whose candidate verdict differs from the primary's",
        "orchestrator_shadow_errors_total": "Mirrored texts a shadow node's candidate did not answer (error or timeout)",
        "orchestrator_shadow_dropped_total": "Texts not mirrored to a shadow node's candidate because its queue was full",
        "orchestrator_step_rows_total": "Rows a pipeline step sent to its model",
        "orchestrator_branch_rows_total": "Rows that took each branch of a pipeline switch (case<i>, default, none)",
    }
    GAUGES = {
        "orchestrator_circuit_state": "Circuit breaker state per downstream model: 0 closed, 1 open, 2 half-open",
        "orchestrator_cascade_margin": "The margin a cascade node with an escalation budget used for its latest batch",
        "orchestrator_escalation_rate": "The share of a cascade node's budget window that it sent on to a later stage",
        "orchestrator_queue_delay_seconds": "The router's estimated queue delay at the start of its latest execute, seconds",
        "orchestrator_shadow_queued_texts": "Mirrored texts queued or running per shadow node",
    }
    #: name -> (description, buckets)
    HISTOGRAMS = {
        "orchestrator_node_latency_seconds": ("Run time of each policy node, seconds", LATENCY_BUCKETS),
        "orchestrator_stage_seconds": (
            "Time of each stage of the router's execute (parse, tokenize, bls, results, respond), seconds", STAGE_BUCKETS,
        ),
        "orchestrator_shadow_probability_difference": (
            "Absolute difference between a shadow node's candidate and primary probabilities", DIFFERENCE_BUCKETS,
        ),
    }

    def __init__(self, pb: Any, router_name: str, flush_interval_s: float = 0.5,
                 max_sampled: Optional[int] = MAX_SAMPLED, enabled: bool = True):
        self.router = router_name
        self.enabled = enabled  # False (config parameter ``metrics: off``): no family, every call a no-op
        self.max_sampled = max_sampled  # None: every timing observation (timing_sample)
        self.timing = enabled and max_sampled != 0  # False: no timing observation is taken (``off``)
        self.families = {}
        self.metrics: Dict[Tuple[str, Labels], Any] = {}  # pb_utils.Metric by (family, labels)
        self.lock = threading.Lock()
        self.counts: Dict[Tuple[str, Labels], float] = {}
        self.observations: Dict[Tuple[str, Labels], List[float]] = {}
        self.gauges: Dict[Tuple[str, Labels], float] = {}
        self.stop = threading.Event()
        self.rng = random.Random()  # the flush's sample of timing observations
        family = getattr(pb, "MetricFamily", None)
        if family is None or not enabled:
            return
        for name, doc in self.COUNTERS.items():
            self.families[name] = family(name=name, description=doc, kind=family.COUNTER)
        for name, doc in self.GAUGES.items():
            self.families[name] = family(name=name, description=doc, kind=family.GAUGE)
        if hasattr(family, "HISTOGRAM"):
            for name, (doc, _) in self.HISTOGRAMS.items():
                self.families[name] = family(name=name, description=doc, kind=family.HISTOGRAM)
        self.flusher = threading.Thread(target=self._flush_loop, args=(flush_interval_s,), name="orchestrator-metrics", daemon=True)
        self.flusher.start()

    def _metric(self, key: Tuple[str, Labels]) -> Any:
        family, labels = key
        m = self.metrics.get(key)
        if m is None:
            full = {"router": self.router, **dict(labels)}
            if family in self.HISTOGRAMS:
                m = self.families[family].Metric(labels=full, buckets=self.HISTOGRAMS[family][1])
            else:
                m = self.families[family].Metric(labels=full)
            self.metrics[key] = m
        return m

    def inc(self, family: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to counter ``family`` (sent at the next flush)."""
        self.inc_series((family, tuple(sorted(labels.items()))), value)

    def observe(self, family: str, value: float, **labels: str) -> None:
        """Add one observation to histogram ``family`` (sent at the next flush; none of a
        timing histogram when :attr:`timing` is off)."""
        self.observe_series((family, tuple(sorted(labels.items()))), value)

    def set(self, family: str, value: float, **labels: str) -> None:
        """Set gauge ``family`` to ``value`` (sent at the next flush; the last value wins)."""
        self.set_series((family, tuple(sorted(labels.items()))), value)

    # the same with the series' key made once (``(family, labels sorted)``: :func:`series`), so nothing is sorted

    def inc_series(self, key: Key, value: float = 1.0) -> None:
        """:meth:`inc` of the series ``key``."""
        if key[0] in self.families and value:
            with self.lock:
                self.counts[key] = self.counts.get(key, 0.0) + value

    def observe_series(self, key: Key, value: float) -> None:
        """:meth:`observe` of the series ``key``."""
        if key[0] in self.families and (self.timing or key[0] not in SAMPLED_HISTOGRAMS):
            with self.lock:
                self.observations.setdefault(key, []).append(value)

    def set_series(self, key: Key, value: float) -> None:
        """:meth:`set` of the series ``key``."""
        if key[0] in self.families:
            with self.lock:
                self.gauges[key] = value

    def record(self, counts: Dict[Key, float], observations: Dict[Key, List[float]], gauges: Dict[Key, float]) -> None:
        """What one run counted, observed and set (``execution.engine.Run``), buffered at
        once as by :meth:`inc`, :meth:`observe` and :meth:`set` (sent at the next flush)."""
        with self.lock:
            for key, value in counts.items():
                if key[0] in self.families and value:
                    self.counts[key] = self.counts.get(key, 0.0) + value
            for key, values in observations.items():
                if key[0] in self.families and (self.timing or key[0] not in SAMPLED_HISTOGRAMS):
                    self.observations.setdefault(key, []).extend(values)
            for key, value in gauges.items():
                if key[0] in self.families:
                    self.gauges[key] = value

    def flush(self) -> None:
        """Send the buffered updates to the server now."""
        with self.lock:
            counts, self.counts = self.counts, {}
            observations, self.observations = self.observations, {}
            gauges, self.gauges = self.gauges, {}
        for key, value in counts.items():
            self._metric(key).increment(value)
        for key, value in gauges.items():
            self._metric(key).set(value)
        for key, values in observations.items():
            if self.max_sampled is not None and key[0] in SAMPLED_HISTOGRAMS and len(values) > self.max_sampled:
                values = self.rng.sample(values, self.max_sampled)
            m = self._metric(key)
            for v in values:
                m.observe(v)

    def _flush_loop(self, interval: float) -> None:
        while not self.stop.wait(interval):
            self.flush()

    def close(self) -> None:
        """Stop the flusher and send what is buffered."""
        self.stop.set()
        self.flush()


def router_metrics(pb: Any, name: str, params: Mapping[str, str]) -> Metrics:
    """The metrics of router ``name`` as its config parameters ``params`` ask
    (:data:`ENABLED_PARAMETER`, :data:`SAMPLE_PARAMETER`).

    Raises:
        ValueError: a bad value of either, named (the router then fails to load).
    """
    return Metrics(pb, name, max_sampled=timing_sample(params), enabled=metrics_enabled(params))
