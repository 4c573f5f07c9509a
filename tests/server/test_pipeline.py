"""The whole pipeline in a real tritonserver: every model, every router branch, bad input."""

from __future__ import annotations

import concurrent.futures as cf
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from orchestrator.runtime.routing.heads import read_head, sigmoid
from orchestrator.runtime.routing.nodes.base import descendants
from orchestrator.runtime.routing.nodes.chunk import token_windows, window_weights
from orchestrator.runtime.routing.policy import load_policy
from orchestrator.tooling.modeling import data
from tests.helpers import REPO, call, routes

pytestmark = pytest.mark.server

MODELS = ["tokenizer", "classifier", "classifier_fast", "postprocess", "ensemble", "router"]


@pytest.fixture(scope="module")
def held_out():
    return data.held_out_texts(n=60, seed=1)


@pytest.fixture(scope="module")
def long_negative_text():
    negative = [e.text for e in data.held_out_examples(corpus="movie_reviews") if e.rating <= -1.0][:20]
    return "\n\n".join(" ".join(negative[i : i + 5]) for i in range(0, 20, 5))


def test_every_model_loads(triton):
    index = {m["name"]: m.get("state") for m in triton.repository_index()}
    for name in MODELS:
        assert index.get(name) == "READY", f"{name}: {index.get(name)}"


def test_router_equals_ensemble_on_the_classifier_path(triton, held_out):
    ens = call(triton, "ensemble", held_out)
    rtr = call(triton, "router_accurate", held_out)
    r = routes(rtr)
    on_path = [i for i, route in enumerate(r) if route == "classifier"]
    assert len(on_path) >= 55, r  # held-out sentences are short: nearly all unchunked
    np.testing.assert_allclose(rtr["PROBABILITIES"][on_path], ens["PROBABILITIES"][on_path], atol=1e-5)
    assert np.array_equal(rtr["VERDICTS"][on_path], ens["VERDICTS"][on_path])
    # the default router's escalated texts match too
    dflt = call(triton, "router", held_out)
    esc = [i for i, route in enumerate(routes(dflt)) if route == "classifier"]
    assert esc, "expected some escalations among 60 held-out texts"
    np.testing.assert_allclose(dflt["PROBABILITIES"][esc], ens["PROBABILITIES"][esc], atol=1e-5)


def test_cascade_escalates_exactly_the_unsure_texts(triton, held_out):
    thresholds = 0.5
    fast = call(triton, "router_fast", held_out, thresholds)["PROBABILITIES"].reshape(-1)
    out = call(triton, "router", held_out, thresholds)
    (margin,) = [n.margin for n in descendants(load_policy(REPO / "router" / "policy.yaml").root) if n.kind == "cascade"]
    unsure = np.abs(fast - thresholds) < margin
    expected = ["classifier" if u else "classifier_fast" for u in unsure]
    got = [r.replace("chunked:", "") for r in routes(out)]
    assert got == expected
    assert 0 < unsure.sum() < len(held_out)
    confident = ~unsure
    np.testing.assert_allclose(out["PROBABILITIES"].reshape(-1)[confident], fast[confident], atol=1e-6)


def test_empty_and_whitespace_texts_answer_without_a_model(triton):
    out = call(triton, "router", ["", "   \n\t ", "fine"], thresholds=0.0)
    assert routes(out)[:2] == ["empty", "empty"]
    assert out["PROBABILITIES"].reshape(-1)[:2].tolist() == [0.5, 0.5]
    assert out["VERDICTS"].reshape(-1)[:2].tolist() == [False, False]  # even with threshold 0
    assert routes(out)[2] != "empty"


def direct_window_probs(triton, text):
    """Independent of the router: the text's whole-text tokens (the tokenizer model), its
    windows of 128 every 96, classifier_fast's calibrated probability of each (one direct
    call a window) and the content tokens each window adds (the length weights)."""
    tok = call(triton, "tokenizer", [text], thr_array=False, parameters={"truncation": False})
    ids = tok["input_ids"][0][: int(tok["attention_mask"][0].sum())]
    assert ids.shape[0] > 128
    windows = token_windows(ids, 128, 96)
    probs = []
    for w in windows:
        client = httpclient.InferenceServerClient(triton.http_url)
        ins = [httpclient.InferInput(n, [1, len(w)], "INT64") for n in ("input_ids", "attention_mask")]
        ins[0].set_data_from_numpy(w.reshape(1, -1))
        ins[1].set_data_from_numpy(np.ones((1, len(w)), dtype=np.int64))
        z = client.infer("classifier_fast", ins).as_numpy("logits")[0, 0] / read_head(REPO / "classifier_fast").temperature[0]
        probs.append(float(sigmoid(z)))
        client.close()
    weights = window_weights(ids.shape[0], 128, 96)
    assert sum(weights) == ids.shape[0] - 2 and len(weights) == len(windows)
    return probs, weights


def batch_sizes(triton, model) -> dict:
    """Executions of ``model`` per batch size (Triton's statistics extension, batch_stats)."""
    client = triton.client()
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}
    finally:
        client.close()


def settled_batch_sizes(triton, model) -> dict:
    """``batch_sizes`` once two reads 0.2 s apart agree: the statistics of calls answered
    before now (a backend reports them after the client has its answer) are all counted."""
    now = batch_sizes(triton, model)
    for _ in range(50):
        time.sleep(0.2)
        now, last = batch_sizes(triton, model), now
        if now == last:
            break
    return now


def test_long_text_is_chunked_and_aggregated(triton, long_negative_text):
    out = call(triton, "router", [long_negative_text], parameters={"route": "fast"})  # every window
    assert routes(out) == ["chunked:classifier_fast"]
    probs, weights = direct_window_probs(triton, long_negative_text)
    expected = sum(p * n for p, n in zip(probs, weights)) / sum(weights)  # length_weighted_mean
    assert float(out["PROBABILITIES"][0, 0]) == pytest.approx(expected, abs=1e-5)
    # the shipped cascade's chunk node may stop early (never escalating here): its answer
    # is the same aggregate of the windows its ROUTE says it used, the first ones
    [route] = routes(call(triton, "router_fast", [long_negative_text]))
    used = int(route.split(":windows=")[1].split("/")[0]) if ":windows=" in route else len(probs)
    assert route in ("chunked:classifier_fast", f"chunked:classifier_fast:windows={used}/{len(probs)}")
    early = sum(p * n for p, n in zip(probs[:used], weights)) / sum(weights[:used])
    assert float(call(triton, "router_fast", [long_negative_text])["PROBABILITIES"][0, 0]) == pytest.approx(early, abs=1e-5)
    # the default router classifies it as a person would: negative
    assert call(triton, "router", [long_negative_text])["VERDICTS"].tolist() == [[False]]


def test_a_long_text_stops_where_its_verdict_is_settled_and_sends_only_those_windows(triton, long_negative_text):
    """The default router's ``chunk_long`` (``stop_when_decided``) on the real server,
    checked against Triton's own batch statistics of classifier_fast: the windows it
    sent (the sum of its executions' batch sizes) are the windows its ROUTE says it used,
    in at most that many executions; route=fast sends every window in one execution.
    Independently of the router: with the windows used, no answer of the unread ones
    could move the length-weighted mean across the threshold; with one fewer, some could."""
    from tests.helpers import eventually

    def delta(before):
        now = batch_sizes(triton, "classifier_fast")
        return {b: c - before.get(b, 0) for b, c in now.items() if c != before.get(b, 0)}

    before = settled_batch_sizes(triton, "classifier_fast")
    probs, weights = direct_window_probs(triton, long_negative_text)
    n = len(probs)
    # the direct calls are counted when their backend reports, which can come after the
    # client has the last answer: wait for all n before taking the router's baseline
    assert eventually(lambda: delta(before), {1: n}, timeout=5) == {1: n}

    before = batch_sizes(triton, "classifier_fast")
    assert routes(call(triton, "router", [long_negative_text], parameters={"route": "fast"})) == ["chunked:classifier_fast"]
    assert eventually(lambda: delta(before), {n: 1}, timeout=5) == {n: 1}

    before = batch_sizes(triton, "classifier_fast")
    [route] = routes(call(triton, "router", [long_negative_text]))
    used = int(route.split(":windows=")[1].split("/")[0]) if ":windows=" in route else n
    assert route in ("chunked:classifier_fast", f"chunked:classifier_fast:windows={used}/{n}")
    sent = eventually(lambda: sum(b * c for b, c in delta(before).items()), used, timeout=5)
    assert sent == used, delta(before)
    assert 1 <= sum(delta(before).values()) <= used
    print(f"{n} windows, {used} used, executions by batch size {delta(before)}")

    def settled(k):  # the verdict at threshold 0.5 is the same whatever the unread windows say
        read, rest = sum(p * w for p, w in zip(probs[:k], weights[:k])), sum(weights[k:])
        low, high = read / sum(weights), (read + rest) / sum(weights)
        return (low >= 0.5) == (high >= 0.5)

    assert settled(used) and not settled(used - 1)


def test_tokenizer_truncates_unless_told_not_to(triton, long_negative_text):
    trunc = call(triton, "tokenizer", [long_negative_text], thr_array=False)
    full = call(triton, "tokenizer", [long_negative_text], thr_array=False, parameters={"truncation": False})
    assert trunc["input_ids"].shape[1] == 128
    assert full["input_ids"].shape[1] > 128


BAD_INPUTS = [
    ("missing TEXT", dict(texts=["x"], text_array=False), "TEXT"),
    ("TEXT as FP32", dict(texts=["x"], text_array=np.ones((1, 1), dtype=np.float32)), "TEXT"),
    ("empty batch", dict(texts=[], text_array=np.zeros((0, 1), dtype=np.object_), thr_array=np.zeros((0, 1), np.float32)), "THRESHOLD"),
    ("invalid UTF-8", dict(texts=[b"fine", b"bad \xff\xfe"]), "TEXT[1]: invalid UTF-8"),
    ("negative threshold", dict(texts=["x"], thresholds=-0.5), "THRESHOLD[0] = -0.5"),
    ("NaN threshold", dict(texts=["x"], thresholds=float("nan")), "THRESHOLD[0] = nan"),
    ("missing THRESHOLD", dict(texts=["x"], thr_array=False), "THRESHOLD"),
]


@pytest.mark.parametrize("model", ["router", "ensemble"])
@pytest.mark.parametrize("case,kwargs,needle", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_a_clear_error_and_the_server_stays_ready(triton, model, case, kwargs, needle):
    with pytest.raises(InferenceServerException) as info:
        call(triton, model, **kwargs)
    assert needle in str(info.value)
    assert triton.is_ready()
    assert call(triton, model, ["still answering"])["PROBABILITIES"].shape == (1, 1)


def test_a_bad_request_batched_with_good_ones_fails_alone(triton, held_out):
    good = [[t] for t in held_out[:12]]
    jobs = [("good", g, 0.5) for g in good] + [("bad", ["x"], float("nan"))] * 3
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        futures = [(kind, pool.submit(call, triton, "router", texts, thr)) for kind, texts, thr in jobs]
        for kind, fut in futures:
            if kind == "good":
                assert fut.result()["PROBABILITIES"].shape == (1, 1)
            else:
                with pytest.raises(InferenceServerException, match="THRESHOLD"):
                    fut.result()


def test_downstream_failure_fails_only_the_requests_that_need_it(triton, held_out):
    """router_strict (the shipped policy without its fallbacks): with classifier unloaded,
    requests batched together with ones that need it still get their answers."""
    confident = held_out[1]
    p_conf = float(call(triton, "router_fast", [confident])["PROBABILITIES"][0, 0])
    conf_thr = 0.0 if p_conf >= 0.5 else 1.0  # |p - thr| >= 0.5 > margin: never escalates
    unsure_text = held_out[0]
    unsure_thr = float(call(triton, "router_fast", [unsure_text])["PROBABILITIES"][0, 0])  # |p - thr| = 0
    triton.unload_model("classifier")
    try:
        jobs = [(confident, conf_thr), (unsure_text, unsure_thr)] * 4
        with cf.ThreadPoolExecutor(len(jobs)) as pool:
            futures = [pool.submit(call, triton, "router_strict", [t], thr) for t, thr in jobs]
        for k, fut in enumerate(futures):
            if k % 2 == 0:
                assert routes(fut.result()) == ["classifier_fast"]
            else:
                with pytest.raises(InferenceServerException, match="model 'classifier'") as info:
                    fut.result()
                assert info.value.status() == "503"  # UNAVAILABLE (HTTP 503): the model cannot serve now
        assert triton.is_ready()
    finally:
        triton.load_model("classifier")
    # the open circuit sees the model ready again at once (no 5 s cool-down to wait out)
    assert routes(call(triton, "router_strict", [unsure_text], unsure_thr)) == ["classifier"]


def test_shipped_policy_degrades_while_classifier_is_unloaded(triton, held_out):
    """Texts that needed classifier get classifier_fast's answer, ROUTE classifier_fast:degraded."""
    texts = held_out[:8]
    fast = call(triton, "router", texts, parameters={"route": "fast"})["PROBABILITIES"].reshape(-1)
    thr = fast.copy()  # |p - thr| = 0: every text is unsure and would escalate
    triton.unload_model("classifier")
    try:
        out = call(triton, "router", texts, thr_array=thr.reshape(-1, 1).astype(np.float32))
        assert routes(out) == ["classifier_fast:degraded"] * len(texts)
        np.testing.assert_allclose(out["PROBABILITIES"].reshape(-1), fast, atol=1e-6)
        acc = call(triton, "router", texts, parameters={"route": "accurate"})
        assert routes(acc) == ["classifier_fast:degraded"] * len(texts)
    finally:
        triton.load_model("classifier")
    assert routes(call(triton, "router", texts, thr_array=thr.reshape(-1, 1).astype(np.float32))) == ["classifier"] * len(texts)
