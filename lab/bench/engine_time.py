"""The policy engine alone, timed: ``python lab/bench/engine_time.py CHECKOUT RUNS``.

Runs one short text through ``CHECKOUT``'s shipped policy (``model_repository/router/
policy.yaml``, bound to its repository's heads) with ``CHECKOUT``'s own engine ``RUNS``
times, after 500 to warm up, with an instant fake BLS (every classifier answers the logit
3.0 at once) and the router's metrics class (its sink a no-op), and prints one JSON line:
``{"median_us", "runs", "orchestrator"}`` (microseconds per ``Engine.run``; the file the
package was imported from). No server and no model runs, so what is timed is the runtime's
own work on one execute: parsing aside, the engine, its nodes, heads, deadlines and metrics.

Run it in a fresh interpreter with ``PYTHONPATH=CHECKOUT``: it imports ``orchestrator``
from ``CHECKOUT`` only (checked), in either layout (``orchestrator.runtime.routing`` and
``execution`` subpackages, or the flat runtime before them). ``lab.bench.runtime`` runs it
for the checkouts it compares.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

TEXT = "A gorgeous, witty film."
WARMUP = 500


class _Metric:
    def __getattr__(self, name):  # increment, set, observe: the server's side, not timed
        return lambda *args, **kwargs: None


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, **kwargs):
        pass

    def Metric(self, **kwargs):  # noqa: N802 - pb_utils.MetricFamily's name
        return _Metric()


class _Pb:
    MetricFamily = _Family


def main(checkout: Path, runs: int) -> dict:
    sys.path.insert(0, str(checkout))
    import numpy as np

    import orchestrator

    if not Path(orchestrator.__file__).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"orchestrator came from {orchestrator.__file__}, not from {checkout}")
    try:  # the runtime in subpackages
        from orchestrator.runtime.execution.engine import Engine
        from orchestrator.runtime.routing.heads import repository_heads
        from orchestrator.runtime.routing.policy import bind_heads, load_policy
    except ImportError:  # the flat runtime before them
        from orchestrator.runtime.engine import Engine  # type: ignore[no-redef]
        from orchestrator.runtime.heads import repository_heads  # type: ignore[no-redef]
        from orchestrator.runtime.policy import bind_heads, load_policy  # type: ignore[no-redef]
    from orchestrator.runtime.metrics import Metrics
    from orchestrator.runtime.request import Work

    repo = checkout / "model_repository"
    policy = load_policy(repo / "router" / "policy.yaml")
    bound = bind_heads(policy, repository_heads(repo, [c.model for c in policy.calls()]))
    if hasattr(bound, "root"):  # the plan bind_heads returns; before it returned the head and bound in place
        policy = bound

    async def infer(model, inputs, parameters, request_id, alone=False, options=None):
        return {"logits": np.full((next(iter(inputs.values())).shape[0], 1), 3.0, np.float32)}

    engine = Engine(policy, infer, Metrics(_Pb(), "router", flush_interval_s=3600.0), None, repo / "router")
    loop = asyncio.new_event_loop()
    threshold = np.full((1, 1), 0.5, np.float32)

    def one() -> None:
        loop.run_until_complete(engine.run([Work([TEXT], threshold, {})]))

    for _ in range(WARMUP):
        one()
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        one()
        times.append(time.perf_counter() - began)
    return {"median_us": round(statistics.median(times) * 1e6, 1), "runs": runs, "orchestrator": orchestrator.__file__}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]))))
