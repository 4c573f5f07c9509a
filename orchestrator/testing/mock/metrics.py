"""``pb_utils.MetricFamily`` and its metrics, kept per :class:`MockTriton` (r24.10 rules).

Names must match Prometheus' metric and label name patterns; a family name is shared
by families of the same kind (the first help text stays); counters only increase and
cannot be set; histograms need strictly increasing ``buckets`` and only ``observe``. As
in the stub's ``MetricFamily`` (which keeps every ``Metric`` it made), a series lives as
long as the ``MetricFamily`` object it came from; once that object is deleted its
metrics raise on every use. Read the values with
:func:`~orchestrator.testing.mock.metric_store.snapshot` (``MockTriton.metrics()``).
"""

from __future__ import annotations

from typing import Any, List, Optional

from orchestrator.testing.mock.context import current_model, current_server
from orchestrator.testing.mock.errors import TritonModelException
from orchestrator.testing.mock.metric_store import (
    LABEL_NAME_RE,
    FamilyRecord,
    MetricKind,
    MetricRegistry,
    Series,
)

_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
    "been deleted."
)


class _Metric:
    """Mirror of the ``Metric`` object returned by ``MetricFamily.Metric(...)``."""

    def __init__(self, registry: MetricRegistry, family: FamilyRecord, key: frozenset):
        self._registry = registry
        self._family = family
        self._key = key
        self._cleared = False

    def _series(self, what: str) -> Series:
        series = self._family.series.get(self._key)
        if self._cleared or series is None:
            raise TritonModelException(f"Failed to {what} metric value: {_DELETED}")
        return series

    def _clear(self) -> None:
        """Drop this metric's series (its family object is going away)."""
        if not self._cleared:
            self._cleared = True
            self._registry.release_series(self._family, self._key)

    @staticmethod
    def _number(value: Any, what: str) -> float:
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError(f"{what}(): incompatible function arguments: expected a float")
        return float(value)

    def increment(self, value: float) -> None:
        value = self._number(value, "increment")
        kind = self._family.kind
        with self._registry.lock:
            if kind == MetricKind.COUNTER:
                if value < 0.0:
                    raise TritonModelException(
                        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can "
                        "only be incremented monotonically by non-negative values."
                    )
                self._series("increment").value += value
            elif kind == MetricKind.GAUGE:
                self._series("increment").value += value
            else:
                raise TritonModelException(
                    "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does "
                    "not support Increment"
                )

    def set(self, value: float) -> None:
        value = self._number(value, "set")
        kind = self._family.kind
        with self._registry.lock:
            if kind == MetricKind.GAUGE:
                self._series("set").value = value
            else:
                raise TritonModelException(
                    f"Failed to set metric value: TRITONSERVER_METRIC_KIND_{kind.name} does not "
                    "support Set"
                )

    def observe(self, value: float) -> None:
        value = self._number(value, "observe")
        kind = self._family.kind
        with self._registry.lock:
            if kind != MetricKind.HISTOGRAM:
                raise TritonModelException(
                    f"Failed to observe metric value: TRITONSERVER_METRIC_KIND_{kind.name} does "
                    "not support Observe"
                )
            series = self._series("observe")
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
            if self._family.kind == MetricKind.HISTOGRAM:
                raise TritonModelException(
                    "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not "
                    "support Value"
                )
            return float(self._series("get").value)


class MetricFamily:
    """Mirror of ``pb_utils.MetricFamily(name, description, kind)``.

    ``kind`` is ``MetricFamily.COUNTER``, ``GAUGE`` or ``HISTOGRAM``;
    ``family.Metric(labels=None, buckets=None)`` returns a metric with ``increment``,
    ``set``, ``observe`` and ``value`` and the r24.10 rules (counters never decrease and
    cannot be set; histograms need ``buckets`` and only ``observe``). Values go to the
    current :class:`MockTriton` (see :meth:`MockTriton.metrics`). Families are shared by
    name (the first help text is kept; another kind raises ``TritonModelException``),
    metrics by label set. Deleting this object clears the metrics it made: their series
    disappear and using them raises ``TritonModelException``, as in the stub.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind):
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        if not isinstance(kind, MetricKind):
            raise TypeError(
                "MetricFamily(): kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM"
            )
        self._registry = current_server().metric_registry
        model = current_model()
        self._record = self._registry.family(name, description, kind, model.instance_name if model else "")
        self._metrics: List[_Metric] = []  # kept alive with the family, as the stub's metric_map_

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
            if not LABEL_NAME_RE.match(key) or key.startswith("__"):
                raise TritonModelException(
                    f"Error when creating Metric: Invalid label name '{key}'"
                )
        bounds: Optional[List[float]] = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if kind in (MetricKind.COUNTER, MetricKind.GAUGE):
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = [float(b) for b in buckets]
            if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
                raise TritonModelException(
                    "Error when creating Metric: Bucket Boundaries must be strictly sorted"
                )
        elif kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        key = frozenset(labels.items())
        with self._registry.lock:
            series = self._record.series.get(key)
            if series is None:
                series = Series(bounds)
                self._record.series[key] = series
            series.refs += 1
        metric = _Metric(self._registry, self._record, key)
        self._metrics.append(metric)
        return metric

    def __del__(self) -> None:
        try:
            for metric in self._metrics:
                metric._clear()
            self._registry.release_family(self._record)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
