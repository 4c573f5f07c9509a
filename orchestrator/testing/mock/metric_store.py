"""The metric values of one server: families, their series, and a snapshot of them.

Kept apart from :mod:`~orchestrator.testing.mock.metrics` (the ``pb_utils`` classes) so
the server's interface (:mod:`~orchestrator.testing.mock.host`) can name the registry
without importing model-facing code.
"""

from __future__ import annotations

import enum
import re
import threading
from typing import Any, Dict, List, Optional

from orchestrator.testing.mock.errors import TritonModelException


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class Series:
    __slots__ = ("value", "bounds", "bucket_counts", "count", "sum", "refs")

    def __init__(self, bounds: Optional[List[float]]):
        self.value = 0.0
        self.bounds = bounds
        self.bucket_counts = [0] * (len(bounds) + 1) if bounds is not None else None
        self.count = 0
        self.sum = 0.0
        self.refs = 0


class FamilyRecord:
    __slots__ = ("name", "description", "kind", "series", "refs")

    def __init__(self, name: str, description: str, kind: MetricKind):
        self.name = name
        self.description = description
        self.kind = kind
        self.series: Dict[frozenset, Series] = {}
        self.refs = 0


class MetricRegistry:
    """The metric families of one MockTriton (one lock for all of them)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.families: Dict[str, FamilyRecord] = {}

    def family(self, name: str, description: str, kind: MetricKind, owner: str = "") -> FamilyRecord:
        """The family ``name``, created or shared. As in Triton 2.51 a second family of the
        same name and kind shares the first one (its help text is kept, the new one
        ignored); another kind raises, naming ``owner`` (the calling model instance)."""
        with self.lock:
            if not METRIC_NAME_RE.match(name):
                raise TritonModelException(
                    f"Error when creating MetricFamily: Invalid metric name '{name}'"
                )
            record = self.families.get(name)
            if record is None:
                record = FamilyRecord(name, description, kind)
                self.families[name] = record
            elif record.kind != kind:
                raise TritonModelException(
                    "Error when creating MetricFamily: Failed to process the request for "
                    f"model '{owner}', message: Family name already exists with different type"
                )
            record.refs += 1
            return record

    def release_family(self, record: FamilyRecord) -> None:
        with self.lock:
            record.refs -= 1
            if record.refs <= 0 and not record.series and self.families.get(record.name) is record:
                del self.families[record.name]

    def release_series(self, record: FamilyRecord, key: frozenset) -> None:
        with self.lock:
            series = record.series.get(key)
            if series is None:
                return
            series.refs -= 1
            if series.refs <= 0:
                del record.series[key]
                if record.refs <= 0 and not record.series and self.families.get(record.name) is record:
                    del self.families[record.name]


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
                if family.kind == MetricKind.HISTOGRAM:
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


def _number(value: float) -> str:
    """A sample value as prometheus-cpp writes it (16 significant digits, ``+Inf``)."""
    if value != value:
        return "Nan"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return format(value, ".16g")


def _labels(pairs: List[tuple]) -> str:
    if not pairs:
        return ""
    escaped = (
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace(chr(10), chr(92) + "n")}"'
        for k, v in pairs
    )
    return "{" + ",".join(escaped) + "}"


def exposition(registry: MetricRegistry) -> str:
    """The models' metric families as Triton 2.51's ``/metrics`` shows them (Prometheus text
    format, as prometheus-cpp writes it): ``# HELP`` (the description as given, not escaped)
    and ``# TYPE`` lines, then each series with its labels sorted by name; a histogram as
    ``_count``, ``_sum`` and cumulative ``_bucket`` lines with ``le`` last. A family without
    series is left out. Families and their series come in creation order; Triton lists both
    in its hash maps' order (prometheus-cpp keys a family's series by a hash of their labels),
    which a test should not rely on."""
    lines: List[str] = []
    with registry.lock:
        for family in registry.families.values():
            if not family.series:
                continue
            kind = family.kind.name.lower()
            lines += [f"# HELP {family.name} {family.description}", f"# TYPE {family.name} {kind}"]
            for key, series in family.series.items():
                pairs = sorted(key)
                if family.kind != MetricKind.HISTOGRAM:
                    lines.append(f"{family.name}{_labels(pairs)} {_number(series.value)}")
                    continue
                assert series.bounds is not None and series.bucket_counts is not None
                lines.append(f"{family.name}_count{_labels(pairs)} {series.count}")
                lines.append(f"{family.name}_sum{_labels(pairs)} {_number(series.sum)}")
                cumulative = 0
                for bound, n in zip(series.bounds + [float("inf")], series.bucket_counts):
                    cumulative += n
                    lines.append(f"{family.name}_bucket{_labels(pairs + [('le', _number(bound))])} {cumulative}")
    return "".join(line + "\n" for line in lines)
