"""``runtime.metrics.Metrics.flush``: counters aggregate to one update per series, the timing
histograms send at most ``MAX_SAMPLED`` observations per series per flush (a sample of the
interval's), the shadow difference histogram every one."""

from __future__ import annotations

from orchestrator.runtime import metrics as M


class Recorder:
    """A ``pb_utils.MetricFamily`` stand-in that records every round trip."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    calls: list = []

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels, buckets=None):  # noqa: N802 (pb_utils' name)
        family = self.name

        class One:
            def increment(self, v):
                Recorder.calls.append((family, "increment", v))

            def set(self, v):
                Recorder.calls.append((family, "set", v))

            def observe(self, v):
                Recorder.calls.append((family, "observe", v))

        return One()


def test_flush_sends_a_bounded_sample_of_timings_and_every_shadow_difference():
    pb = type("PB", (), {"MetricFamily": Recorder})
    Recorder.calls = []
    m = M.Metrics(pb, "router", flush_interval_s=3600)
    try:
        for i in range(50):
            m.observe("orchestrator_stage_seconds", i / 1000, stage="parse")
            m.observe("orchestrator_node_latency_seconds", i / 1000, node="n")
            m.observe("orchestrator_shadow_probability_difference", 0.01, node="s", candidate="c")
            m.inc("orchestrator_requests_total", outcome="success")
        m.flush()
    finally:
        m.stop.set()
    by = {}
    for family, what, value in Recorder.calls:
        by.setdefault((family, what), []).append(value)
    assert len(by[("orchestrator_stage_seconds", "observe")]) == M.MAX_SAMPLED
    assert set(by[("orchestrator_stage_seconds", "observe")]) <= {i / 1000 for i in range(50)}
    assert len(by[("orchestrator_node_latency_seconds", "observe")]) == M.MAX_SAMPLED
    assert len(by[("orchestrator_shadow_probability_difference", "observe")]) == 50
    assert by[("orchestrator_requests_total", "increment")] == [50.0]  # one round trip for 50 increments


def _flushed_stage_observations(max_sampled):
    pb = type("PB", (), {"MetricFamily": Recorder})
    Recorder.calls = []
    m = M.Metrics(pb, "router", flush_interval_s=3600, max_sampled=max_sampled)
    try:
        for i in range(50):
            m.observe("orchestrator_stage_seconds", i / 1000, stage="parse")
        m.flush()
    finally:
        m.stop.set()
    return [v for family, what, v in Recorder.calls if family == "orchestrator_stage_seconds" and what == "observe"]


def test_the_config_parameter_sets_the_sample_or_sends_every_observation():
    assert M.timing_sample({}) == M.MAX_SAMPLED
    assert M.timing_sample({"metrics_timing_sample": "3"}) == 3
    assert M.timing_sample({"metrics_timing_sample": "ALL"}) is None
    assert M.timing_sample({"metrics_timing_sample": "off"}) == 0
    assert len(_flushed_stage_observations(3)) == 3
    assert sorted(_flushed_stage_observations(None)) == [i / 1000 for i in range(50)]
    assert len(_flushed_stage_observations(50)) == 50  # a sample as large as the interval's: all


def test_a_bad_sample_parameter_is_refused_by_name():
    import pytest

    for bad in ("0", "-2", "many", "1.5"):
        with pytest.raises(ValueError, match="metrics_timing_sample=.*positive integer, 'all' or 'off'"):
            M.timing_sample({"metrics_timing_sample": bad})
