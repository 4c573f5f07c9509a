"""Reading a Triton server's Prometheus endpoint (``GET /metrics``).

The text exposition format is parsed with ``prometheus_client``'s own parser, not regexes.
A scrape is a :data:`Samples` mapping ``(sample name, frozenset of (label, value))`` to the
sample's value: ``("orchestrator_requests_total", frozenset({("router", "router"),
("outcome", "success")}))`` -> ``12.0``. Histogram samples keep their suffixes
(``..._bucket``, ``..._sum``, ``..._count``), and every sample keeps the name it is
exposed (and stored by Prometheus) under.
"""

from __future__ import annotations

import urllib.request
from typing import Dict, FrozenSet, Tuple

from prometheus_client.parser import text_string_to_metric_families

Samples = Dict[Tuple[str, FrozenSet[Tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, named as exposed. Raises ValueError on
    malformed text."""
    # Without its TYPE lines: the parser renames counters to the OpenMetrics form
    # (nv_inference_request_success -> ..._success_total), unlike what Prometheus stores.
    untyped = "\n".join(line for line in text.splitlines() if not line.startswith("# TYPE "))
    out: Samples = {}
    for family in text_string_to_metric_families(untyped):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return out


def scrape(url: str, timeout: float = 10.0) -> Samples:
    """:func:`parse` of ``GET url`` (``http://host:8002/metrics``), without any HTTP proxy.
    Raises OSError when the endpoint does not answer within ``timeout`` seconds."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return parse(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` whose labels are exactly ``labels``; 0.0 when absent (a counter
    that has not been incremented yet is not exported)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels`` (others may differ)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)
