"""``pb_utils.MetricFamily`` and its metrics, kept per :class:`MockTriton` (r24.10 rules).

Names must match Prometheus' metric and label name patterns; a family name is shared
only with the same kind and help text; counters only increase and cannot be set;
histograms need strictly increasing ``buckets`` and only ``observe``. A series lives as
long as a ``Metric`` object for it, a family as long as a ``MetricFamily`` object or one
of its series, as in Triton (see the package docs). Read the values with
:func:`snapshot` (``MockTriton.metrics()``).
"""

from __future__ import annotations

import enum
import re
import threading
from typing import Any, Dict, List, Optional

from orchestrator.testing.mock.context import current_server
from orchestrator.testing.mock.errors import TritonModelException


class _MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class _Series:
    __slots__ = ("value", "bounds", "bucket_counts", "count", "sum", "refs")

    def __init__(self, bounds: Optional[List[float]]):
        self.value = 0.0
        self.bounds = bounds
        self.bucket_counts = [0] * (len(bounds) + 1) if bounds is not None else None
        self.count = 0
        self.sum = 0.0
        self.refs = 0


class _FamilyRecord:
    __slots__ = ("name", "description", "kind", "series", "refs")

    def __init__(self, name: str, description: str, kind: _MetricKind):
        self.name = name
        self.description = description
        self.kind = kind
        self.series: Dict[frozenset, _Series] = {}
        self.refs = 0


class MetricRegistry:
    """The metric families of one MockTriton (one lock for all of them)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.families: Dict[str, _FamilyRecord] = {}

    def family(self, name: str, description: str, kind: _MetricKind) -> _FamilyRecord:
        with self.lock:
            if not _METRIC_NAME_RE.match(name):
                raise TritonModelException(
                    f"Error when creating MetricFamily: Invalid metric name '{name}'"
                )
            record = self.families.get(name)
            if record is None:
                record = _FamilyRecord(name, description, kind)
                self.families[name] = record
            elif record.kind != kind or record.description != description:
                raise TritonModelException(
                    "Error when creating MetricFamily: Family name already exists with "
                    f"different type or help text ('{name}')"
                )
            record.refs += 1
            return record

    def release_family(self, record: _FamilyRecord) -> None:
        with self.lock:
            record.refs -= 1
            if record.refs <= 0 and not record.series and self.families.get(record.name) is record:
                del self.families[record.name]

    def release_series(self, record: _FamilyRecord, key: frozenset) -> None:
        with self.lock:
            series = record.series.get(key)
            if series is None:
                return
            series.refs -= 1
            if series.refs <= 0:
                del record.series[key]
                if record.refs <= 0 and not record.series and self.families.get(record.name) is record:
                    del self.families[record.name]


class _Metric:
    """Mirror of the ``Metric`` object returned by ``MetricFamily.Metric(...)``."""

    def __init__(self, registry: MetricRegistry, family: _FamilyRecord, key: frozenset):
        self._registry = registry
        self._family = family
        self._key = key

    def _series(self) -> _Series:
        series = self._family.series.get(self._key)
        if series is None:  # pragma: no cover - defensive
            raise TritonModelException("Could not get metric value. Metric has been invalidated.")
        return series

    @staticmethod
    def _number(value: Any, what: str) -> float:
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError(f"{what}(): incompatible function arguments: expected a float")
        return float(value)

    def increment(self, value: float) -> None:
        value = self._number(value, "increment")
        kind = self._family.kind
        with self._registry.lock:
            if kind == _MetricKind.COUNTER:
                if value < 0.0:
                    raise TritonModelException(
                        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can "
                        "only be incremented monotonically by non-negative values."
                    )
                self._series().value += value
            elif kind == _MetricKind.GAUGE:
                self._series().value += value
            else:
                raise TritonModelException(
                    "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does "
                    "not support Increment"
                )

    def set(self, value: float) -> None:
        value = self._number(value, "set")
        kind = self._family.kind
        with self._registry.lock:
            if kind == _MetricKind.GAUGE:
                self._series().value = value
            else:
                raise TritonModelException(
                    f"Failed to set metric value: TRITONSERVER_METRIC_KIND_{kind.name} does not "
                    "support Set"
                )

    def observe(self, value: float) -> None:
        value = self._number(value, "observe")
        kind = self._family.kind
        with self._registry.lock:
            if kind != _MetricKind.HISTOGRAM:
                raise TritonModelException(
                    f"Failed to observe metric value: TRITONSERVER_METRIC_KIND_{kind.name} does "
                    "not support Observe"
                )
            series = self._series()
            assert series.bounds is not None and series.bucket_counts is not None
            index = len(series.bounds)
            for i, bound in enumerate(series.bounds):
                if value <= bound:
                    index = i
                    break
            series.bucket_counts[index] += 1
            series.count += 1
            series.sum += value

    def value(self) -> float:
        with self._registry.lock:
            if self._family.kind == _MetricKind.HISTOGRAM:
                raise TritonModelException(
                    "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not "
                    "support Value"
                )
            return float(self._series().value)

    def __del__(self) -> None:
        try:
            self._registry.release_series(self._family, self._key)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class MetricFamily:
    """Mirror of ``pb_utils.MetricFamily(name, description, kind)``.

    ``kind`` is ``MetricFamily.COUNTER``, ``GAUGE`` or ``HISTOGRAM``;
    ``family.Metric(labels=None, buckets=None)`` returns a metric with ``increment``,
    ``set``, ``observe`` and ``value`` and the r24.10 rules (counters never decrease and
    cannot be set; histograms need ``buckets`` and only ``observe``). Values go to the
    current :class:`MockTriton` (see :meth:`MockTriton.metrics`). Families are shared by
    name, metrics by label set, as in Prometheus.
    """

    COUNTER = _MetricKind.COUNTER
    GAUGE = _MetricKind.GAUGE
    HISTOGRAM = _MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: _MetricKind):
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        if not isinstance(kind, _MetricKind):
            raise TypeError(
                "MetricFamily(): kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM"
            )
        self._registry = current_server()._metrics
        self._record = self._registry.family(name, description, kind)

    def Metric(self, labels: Optional[dict] = None, buckets: Optional[list] = None) -> _Metric:  # noqa: N802
        kind = self._record.kind
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TritonModelException(
                    "Error when creating Metric: label names and values must be strings"
                )
            if not _LABEL_NAME_RE.match(key) or key.startswith("__"):
                raise TritonModelException(
                    f"Error when creating Metric: Invalid label name '{key}'"
                )
        bounds: Optional[List[float]] = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if kind in (_MetricKind.COUNTER, _MetricKind.GAUGE):
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = [float(b) for b in buckets]
            if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
                raise TritonModelException(
                    "Error when creating Metric: Bucket Boundaries must be strictly sorted"
                )
        elif kind == _MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        key = frozenset(labels.items())
        with self._registry.lock:
            series = self._record.series.get(key)
            if series is None:
                series = _Series(bounds)
                self._record.series[key] = series
            series.refs += 1
        return _Metric(self._registry, self._record, key)

    def __del__(self) -> None:
        try:
            self._registry.release_family(self._record)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def snapshot(registry: MetricRegistry) -> Dict[str, Dict[frozenset, Any]]:
    """The values in ``registry``: ``{family: {frozenset(labels.items()): value}}``.

    Counter and gauge values are floats; a histogram value is a dict ``{"count": int,
    "sum": float, "buckets": {upper_bound: cumulative_count, ..., inf: count}}``.
    """
    out: Dict[str, Dict[frozenset, Any]] = {}
    with registry.lock:
        for name, family in registry.families.items():
            values: Dict[frozenset, Any] = {}
            for key, series in family.series.items():
                if family.kind == _MetricKind.HISTOGRAM:
                    assert series.bounds is not None and series.bucket_counts is not None
                    cumulative, buckets = 0, {}
                    for bound, n in zip(series.bounds + [float("inf")], series.bucket_counts):
                        cumulative += n
                        buckets[bound] = cumulative
                    values[key] = {"count": series.count, "sum": series.sum, "buckets": buckets}
                else:
                    values[key] = series.value
            out[name] = values
    return out
