"""lab/bench/fused_line.py: the straight stand-in for ``Run.run`` answers as the runtime does,
with the same metrics and cost estimates, for the executes it takes, and leaves the others to
the runtime."""

from __future__ import annotations

import numpy as np
import pytest

from lab.bench import execute_profile as X
from lab.bench.fused_line import fused

TEXTS = [
    [b"A gorgeous, witty film."],  # the fused path
    [b""],  # the guard's constant: the runtime's path
    [" ".join(["good"] * 200).encode()],  # over the chunk's window: the runtime's path
    [b"A gorgeous, witty film.", b"Dull."],  # two texts: the runtime's path
]


def _record(mock, stand_in):
    """Each input's outputs, the metrics buffered for it, the engine's cost-estimate keys, and
    (``stand_in``) whether the stand-in answered it without the runtime's ``Run.run``."""
    from orchestrator.runtime.execution import engine

    router = mock.instance("router_single")
    metrics = router.metrics
    real = engine.Run.run
    handed = []

    async def runtime(self, works):  # the stand-in's way back to the runtime, counted
        handed.append(1)
        return await real(self, works)

    if stand_in:
        engine.Run.run = fused(runtime)
    out, taken = [], []
    try:
        for texts in TEXTS:
            with metrics.lock:
                metrics.counts, metrics.observations = {}, {}
            router.engine.costs.clear()  # the nodes this input's run measured
            inputs = {"TEXT": np.array([[t] for t in texts], dtype=np.object_),
                      "THRESHOLD": np.full((len(texts), 1), 0.5, np.float32)}
            before = len(handed)
            answer = mock.infer("router_single", inputs)
            taken.append(len(handed) == before)
            with metrics.lock:
                counts = dict(metrics.counts)
                observed = sorted(metrics.observations)
            out.append(({k: v.tolist() for k, v in answer.items()}, counts, observed, sorted(router.engine.costs)))
    finally:
        engine.Run.run = real
    return out, taken


def test_the_stand_in_answers_and_counts_as_the_runtime_and_takes_only_the_one_way_execute():
    from orchestrator.runtime.execution.engine import Run

    run = Run.run
    undo = X.ablate("fused_line")  # the profile's switch puts it in place and takes it out
    assert Run.run is not run
    undo()
    assert Run.run is run
    with X.bench_mock(["router_single"]) as mock:
        plain, _ = _record(mock, stand_in=False)
        stood_in, taken = _record(mock, stand_in=True)
    assert taken == [True, False, False, False]
    for (a_out, a_counts, a_obs, a_costs), (b_out, b_counts, b_obs, b_costs) in zip(plain, stood_in):
        assert a_out == b_out
        assert a_counts == b_counts and a_obs == b_obs and a_costs == b_costs
    assert plain[0][0]["ROUTE"] == [[b"classifier"]] and plain[1][0]["ROUTE"] != plain[0][0]["ROUTE"]


def test_a_failing_model_fails_the_execute_and_counts_every_node_around_it():
    import asyncio

    from orchestrator.runtime.errors import DownstreamError
    from orchestrator.runtime.execution import engine
    from orchestrator.runtime.request import Work

    async def failing(*args, **kwargs):
        raise DownstreamError("model 'classifier' failed: injected")

    with X.bench_mock(["router_single"]) as mock:
        router = mock.instance("router_single")
        run = router.engine.start(failing, None, router.metrics)
        with router.metrics.lock:
            router.metrics.counts = {}
        with pytest.raises(DownstreamError, match="injected"):
            asyncio.run(fused(engine.Run.run)(run, [Work(["A gorgeous, witty film."], np.full((1, 1), 0.5, np.float32), {})]))
        with router.metrics.lock:
            errors = sorted(dict(k[1])["node"] for k in router.metrics.counts if k[0] == "orchestrator_node_errors_total")
        assert errors == sorted(n.name for n in router.engine.line.around)
