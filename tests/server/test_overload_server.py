"""The router's recommended queue policy (``repository.QUEUE_POLICY``, on the test
repository's ``router_queue``: the shipped router has none on 2.51, docs/guides/reliability.md
"Overload") on a real tritonserver (Triton 2.51): a burst larger than the
queue gets retryable refusals (gRPC UNAVAILABLE ``Exceeds maximum queue size``) while every
other request is answered as it is alone, none lost; requests of priority 1 have their own
queue and are not refused by a burst of default-priority ones; HTTP reports 503."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import numpy as np
import pytest

from orchestrator.tooling.repository import QUEUE_POLICY, read_config
from tests.helpers import ADMIT_VARIANT, ADMIT_WAIT_MS, QUEUE_VARIANT, REPO

MODEL = QUEUE_VARIANT

BURST = 160  # ten times the queue: the router cannot take them all in one execute


def queue_size() -> int:
    return int(QUEUE_POLICY["max_queue_size"])


def texts(n: int) -> list:
    # long enough that each router execute takes a while, so the burst queues behind it
    return [f"review {i}: " + "a slow, thoughtful and at times wonderful film that drags " * 12 for i in range(n)]


async def burst(url: str, items: list, priority: int = 0, model: str = MODEL) -> list:
    """Send every ``(request_id, text)`` at once on one channel; one outcome per request:
    ``("OK", probabilities, route)`` or ``(grpc code name, message)``."""
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)

    async def one(rid: str, text: str):
        t = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
        thr = grpcclient.InferInput("THRESHOLD", [1, 1], "FP32")
        thr.set_data_from_numpy(np.array([[0.5]], np.float32))
        try:
            r = await client.infer(model, [t, thr], request_id=rid, priority=priority)
        except InferenceServerException as exc:
            return (str(exc.status()).replace("StatusCode.", ""), exc.message())
        assert r.get_response().id == rid
        return ("OK", float(r.as_numpy("PROBABILITIES")[0, 0]), r.as_numpy("ROUTE")[0, 0].decode())

    try:
        return await asyncio.gather(*(one(rid, text) for rid, text in items))
    finally:
        await client.close()


def burst_outcomes(url: str, prefix: str, never_refused: str, model: str = MODEL) -> tuple:
    """A burst of :data:`BURST` long texts to ``model``: ``(answered, refused)``, each a
    list of ``((request_id, text), outcome)``; asserts one outcome per request and some of
    each (``never_refused``: the failure message when none was refused)."""
    items = [(f"{prefix}-{i}", t) for i, t in enumerate(texts(BURST))]
    outcomes = asyncio.run(burst(url, items, model=model))
    assert len(outcomes) == BURST  # one outcome per request: none lost
    answered = [(items[i], o) for i, o in enumerate(outcomes) if o[0] == "OK"]
    refused = [(items[i], o) for i, o in enumerate(outcomes) if o[0] != "OK"]
    assert refused, never_refused
    assert answered, "nothing was answered"
    return answered, refused


def assert_answered_as_alone(url: str, answered: list, model: str = MODEL) -> None:
    """The first and last five answered requests: the probability the same text gets alone."""
    for (rid, text), (_, p, route) in answered[:5] + answered[-5:]:
        assert p == pytest.approx(alone(url, text, model=model), abs=1e-5), rid
        assert route


def alone(url: str, text: str, model: str = MODEL) -> float:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        t = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
        thr = grpcclient.InferInput("THRESHOLD", [1, 1], "FP32")
        thr.set_data_from_numpy(np.array([[0.5]], np.float32))
        return float(client.infer(model, [t, thr]).as_numpy("PROBABILITIES")[0, 0])
    finally:
        client.close()


def test_the_shipped_router_has_no_queue_policy_and_the_variant_the_recommended_one(test_repository):
    """Triton 2.51's batcher without prefetching (any queue policy) stalls the router
    (docs/guides/reliability.md "Overload"), so the shipped config has none; ``router_queue`` is the
    shipped router with exactly ``QUEUE_POLICY``."""
    shipped = read_config(REPO / "router" / "config.pbtxt").dynamic_batching
    assert not shipped.HasField("default_queue_policy") and shipped.priority_levels == 0
    variant = read_config(test_repository / MODEL / "config.pbtxt").dynamic_batching
    assert variant.default_queue_policy.max_queue_size == queue_size() <= read_config(REPO / "router" / "config.pbtxt").max_batch_size
    assert variant.priority_levels == 2 and variant.default_priority_level == 2


def test_a_burst_over_the_queue_is_refused_with_unavailable_and_the_rest_answered_correctly(triton):
    answered, refused = burst_outcomes(triton.grpc_url, "burst", "the burst never filled the queue")
    for (rid, _), (code, message) in refused:
        assert code == "UNAVAILABLE", (rid, code, message)
        assert message == f"[request id: {rid}] Exceeds maximum queue size"
    assert_answered_as_alone(triton.grpc_url, answered)
    assert triton.is_ready()


def test_priority_1_has_its_own_queue_while_default_traffic_is_refused(triton):
    low = [(f"low-{i}", t) for i, t in enumerate(texts(BURST))]
    high = [(f"high-{i}", t) for i, t in enumerate(texts(queue_size() // 2))]

    async def both():
        low_task = asyncio.ensure_future(burst(triton.grpc_url, low))
        await asyncio.sleep(0.05)  # the default-priority burst fills its queue first
        high_out = await burst(triton.grpc_url, high, priority=1)
        return await low_task, high_out

    low_out, high_out = asyncio.run(both())
    assert any(o[0] == "UNAVAILABLE" for o in low_out), "the default-priority burst was never refused"
    assert [o[0] for o in high_out] == ["OK"] * len(high)


def test_http_reports_a_refusal_as_503(triton):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    items = texts(BURST)

    def one(i: int):
        client = httpclient.InferenceServerClient(triton.http_url)
        try:
            t = httpclient.InferInput("TEXT", [1, 1], "BYTES")
            t.set_data_from_numpy(np.array([[items[i].encode()]], dtype=np.object_))
            thr = httpclient.InferInput("THRESHOLD", [1, 1], "FP32")
            thr.set_data_from_numpy(np.array([[0.5]], np.float32))
            client.infer(MODEL, [t, thr])
            return None
        except InferenceServerException as exc:
            return (exc.status(), exc.message())
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        errors = [e for e in pool.map(one, range(BURST)) if e is not None]
    assert errors, "64 blocking HTTP clients never filled the queue"
    assert {e[0] for e in errors} == {"503"}, errors[:3]
    assert all("Exceeds maximum queue size" in e[1] for e in errors)


def test_admission_control_refuses_a_burst_it_cannot_answer_in_time_and_answers_the_rest_correctly(triton):
    """The router's own admission control (``admission``, runtime/serving/admission.py) on the
    shipped router without a queue policy: a burst gets UNAVAILABLE refusals naming the
    bound, each request exactly one response, the answered ones as they are alone, and
    the refusals counted in ``orchestrator_shed_requests_total``."""
    before = triton.metric("orchestrator_shed_requests_total", router=ADMIT_VARIANT) or 0.0
    for _ in range(3):  # a few executes first: the cost model needs a measured one
        alone(triton.grpc_url, texts(1)[0], model=ADMIT_VARIANT)
    answered, refused = burst_outcomes(triton.grpc_url, "admit", "the burst was never over the admission bound",
                                       model=ADMIT_VARIANT)
    for (rid, _), (code, message) in refused:
        assert code == "UNAVAILABLE", (rid, code, message)
        assert message.startswith(f"router: overloaded: this request would wait past the router's "
                                  f"admission.max_wait_ms ({ADMIT_WAIT_MS} ms;"), message
    assert_answered_as_alone(triton.grpc_url, answered, model="router")
    deadline = time.monotonic() + 5.0  # the router flushes its metrics every 0.5 s
    while (triton.metric("orchestrator_shed_requests_total", router=ADMIT_VARIANT) or 0.0) - before < len(refused) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (triton.metric("orchestrator_shed_requests_total", router=ADMIT_VARIANT) or 0.0) - before == len(refused)
    assert triton.is_ready()
