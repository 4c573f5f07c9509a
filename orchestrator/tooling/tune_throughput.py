"""``orchestrator tune --url``: each operating point's throughput predicted on the user's server.

Each cascade stage's model is measured on the server alone: a closed loop of ``concurrency``
clients (tritonclient), each sending one text per request, tokenized as the router sends it
(the model's tokenizer, the first ``max_sequence_length`` tokens, ``input_ids`` and
``attention_mask`` int64 [1, T]), for ``duration_s`` seconds after one untimed request per
client. A stage's cost per text is ``c = 1 / throughput`` (seconds). A point that sends a
share ``e_i`` of the texts to stage ``i`` (``e_0 = 1``; for two stages ``e_1`` is the
escalation rate) is predicted to serve ``1 / (o + sum(e_i * c_i))`` texts per second, where
``o`` is the router's own cost per text on that server (:func:`predicted`): its Python work
on each execute (parsing, the policy, tokenizing, BLS requests, responses, metrics) and the
stub's hand-offs, which share the server's CPUs with the stage models.

The router's own cost grows with the texts it escalates (a second BLS call per escalated
batch, its tensors, the second stage's answers: measured on the embedded stack, one constant
``o`` fitted at the served margin predicted the point escalating 59% of the texts 23% too
high), so ``o`` has a part per stage (:func:`overhead_at`): ``o = o_1 + sum(e_i * o_i + e_i**2
* q_i)`` for the later stages ``i``, ``o_1`` the router's cost per text, ``o_i`` its extra cost
per text reaching stage ``i`` and ``q_i`` that cost's curvature. It grows less than in
proportion: one call per execute carries every text of it that reaches the stage, and the
stage's model answers a larger batch at a lower cost per row, so the cost between two shares
lies above the line through them (docs/results/benchmarks.md, "The cascade's cost model":
on the embedded stack the shipped router measured about 0.9x the line through 10% and 70% at
the third of its held-out texts it escalates).

The parts are fitted on the server (:func:`router_overhead`, :func:`fit_overhead`) from the
router as it is served (``--router-model``, default the policy file's directory name), at
the margin it serves (its ``describe_policy`` answer), with no second router and no request
parameter (a policy's margin is not one): tune knows from its own answers which tuning
texts that margin sends to which stage, so it builds text lists in which a known share of
the texts escalates (:func:`mixture`: ``--overhead-shares``, default :data:`OVERHEAD_SHARES`,
of the texts that reach the stage, spread evenly among texts that stay at the first one, as
a margin mixes them in the router's batches) and runs the same closed loop on each. Each
list ``j`` has stage shares ``r_j``; ``1 / T_j - sum(r_j * c) = o_1 + sum(r_ji * o_i + r_ji**2 *
q_i)`` is solved for the parts by least squares, ``q_i`` only for a stage whose lists have at
least three distinct shares (else 0: the line through two). The two default shares span the
range tuned cascades use, far enough apart that the slope is more than noise; the ends (0
and 1) batch unlike any operating point (no second call at all, or one full one per batch).
A third share (``--overhead-shares 0.1 0.4 0.7``) fits the curvature too, which needs each
closed loop to repeat within a few percent: on 2 shared cores the default 5-second loops
repeated to 10-25%, and ``make bench-tune-check`` found as many points within 15% with the
curvature as with the line fitted from the same loops (docs/results/benchmarks.md), so the
default stays two shares.
Outside the shares measured the curve is extrapolated. The fit rests on the
server answering as tune's in-process models do (the texts escalated by the served margin
are those tune computes); a stage no tuning text reaches at the served margin has no part
measured (0, and the result says so). ``--router-overhead-ms`` gives ``o_1`` instead and
``--router-stage-overhead-ms`` the later parts (0 when not given: one constant, the model
before the parts). Without a router that answers, ``o`` is 0 and the result says why: the
predictions are then upper bounds.

When the router serves the chosen margin, one more closed loop runs against it on the tuning
texts as they are and the measured throughput is printed beside the predicted one (the
parts were fitted on other text lists, so this checks the model at that margin's own mix);
otherwise the result says what could not run and why.

Errors: :class:`orchestrator.tooling.errors.TuneError` (a bad ``--url``, a stage model the
server does not answer, given stage parts not one per later stage).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

#: Default closed-loop clients and timed seconds per model.
CONCURRENCY = 16
DURATION_S = 5.0
#: Untimed seconds of the same loop before each measurement: a model (and the router's stub)
#: just loaded answers its first second of load markedly slower (about 0.5x to 0.7x the
#: throughput of later seconds, measured on the embedded stack), which one call per client
#: does not absorb.
WARMUP_S = 2.0
#: Shares of the texts that reach a later stage in the text lists the router's overhead is
#: fitted from (module docstring).
OVERHEAD_SHARES = (0.1, 0.7)
FORMULA = ("1 / (o + c_1 + e_2 * c_2 + ...): c_i seconds per text of stage i alone (1 / its throughput), e_i the share "
           "of texts reaching stage i, o = o_1 + e_2 * o_2 + e_2^2 * q_2 + ... the router's own overhead per text (o_1) "
           "and per text reaching each later stage (o_i, with its curvature q_i), fitted on the server from the router's "
           "closed loop on text lists whose escalated share is known")


def check_overhead_arguments(first_ms: Optional[float], stages_ms: Optional[Sequence[float]],
                              shares: Optional[Sequence[float]]) -> None:
    """``tune``'s overhead arguments checked before anything is measured.

    Raises:
        TuneError: stage parts without the first, or not two distinct shares in [0, 1].
    """
    from orchestrator.tooling.errors import TuneError

    if stages_ms is not None and first_ms is None:
        raise TuneError("--router-stage-overhead-ms: give --router-overhead-ms (the router's milliseconds per text) with it")
    if shares is not None and (len(set(shares)) < 2 or not all(0.0 <= x <= 1.0 for x in shares)):
        raise TuneError(f"--overhead-shares {' '.join(f'{x:g}' for x in shares)}: give at least two distinct shares in [0, 1]")


def add_url_arguments(parser: Any) -> None:
    """``orchestrator tune``'s ``--url`` options on ``parser`` (an ``argparse.ArgumentParser``)."""
    parser.add_argument("--url", default=None,
                        help="grpc://HOST:PORT or http://HOST:PORT: measure each stage model's throughput on that server "
                             "and predict every point's; run the chosen point there if its router serves that margin")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="--url: closed-loop clients (default %(default)s)")
    parser.add_argument("--duration", type=float, default=DURATION_S, help="--url: timed seconds per model (default %(default)s)")
    parser.add_argument("--router-model", default=None,
                        help="--url: the router serving the policy (default: the policy file's directory name)")
    parser.add_argument("--router-overhead-ms", type=float, default=None,
                        help="--url: the router's own milliseconds per text (o_1) to predict with, instead of fitting "
                             "it on the router as served (e.g. one fitted on an earlier run)")
    parser.add_argument("--router-stage-overhead-ms", type=float, nargs="+", default=None, metavar="MS",
                        help="--url, with --router-overhead-ms: the router's extra milliseconds per text reaching each "
                             "later stage (o_2 ...; one value per stage after the first; default 0 each)")
    parser.add_argument("--overhead-shares", type=float, nargs="+", default=None, metavar="SHARE",
                        help="--url: the escalated shares of the text lists the router's overhead is fitted from "
                             f"(default {' '.join(f'{x:g}' for x in OVERHEAD_SHARES)})")


def parse_url(url: str) -> Tuple[str, str]:
    """``grpc://HOST:PORT``, ``http://HOST:PORT`` or ``HOST:PORT`` (HTTP) -> ``(protocol,
    "HOST:PORT")``.

    Raises:
        TuneError: another scheme, or no port.
    """
    from orchestrator.tooling.errors import TuneError

    protocol, sep, address = url.partition("://")
    if not sep:
        protocol, address = "http", url
    if protocol not in ("http", "grpc") or ":" not in address or not address.rsplit(":", 1)[1].isdigit():
        raise TuneError(f"--url {url!r}: expected grpc://HOST:PORT or http://HOST:PORT")
    return protocol, address.rstrip("/")


def closed_loop(make_client: Callable[[], Any], send: Callable[[Any, int], None], concurrency: int,
                duration_s: float, warmup_s: float = 0.0) -> Dict[str, Any]:
    """``concurrency`` threads, each with its own client (``make_client()``), calling
    ``send(client, k)`` (``k``: a request counter, distinct across threads) back to back: one
    untimed call each, untimed calls until ``warmup_s`` seconds have passed since the loop
    began, then ``duration_s`` seconds timed from when every thread is ready.
    Returns ``{"requests" (completed in the window), "errors", "seconds", "throughput"
    (requests per second), "first_error" (str or None)}``."""
    window: List[float] = []
    # the action runs once, before any thread passes: every thread sees the same start
    ready = threading.Barrier(concurrency + 1, action=lambda: window.append(time.perf_counter()))
    state: Dict[str, Any] = {"ok": 0, "errors": 0, "first_error": None}
    lock = threading.Lock()
    warm_until = time.perf_counter() + warmup_s

    def worker(w: int) -> None:
        client, k = make_client(), w
        try:
            while True:
                try:
                    send(client, k)  # warm: connections, the model's first batches
                except Exception:  # noqa: BLE001 - counted below in the timed window
                    pass
                if time.perf_counter() >= warm_until:
                    break
                k += concurrency
            ready.wait()
            end = window[0] + duration_s
            while time.perf_counter() < end:
                k += concurrency
                try:
                    send(client, k)
                    done = time.perf_counter() <= end
                    with lock:
                        state["ok"] += int(done)
                except Exception as exc:  # noqa: BLE001 - the report names the first error
                    with lock:
                        state["errors"] += 1
                        state["first_error"] = state["first_error"] or f"{type(exc).__name__}: {exc}"
        finally:
            close = getattr(client, "close", None)
            if close:
                close()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(concurrency)]
    for t in threads:
        t.start()
    ready.wait()
    for t in threads:
        t.join()
    return {"requests": state["ok"], "errors": state["errors"], "seconds": duration_s,
            "throughput": state["ok"] / duration_s, "first_error": state["first_error"]}


def _client_maker(protocol: str, address: str) -> Callable[[], Any]:
    from orchestrator.tooling.client import client_module

    tc = client_module(protocol)
    return lambda: tc.InferenceServerClient(address)


def measure_model(protocol: str, address: str, model: str, rows: Sequence[np.ndarray], pad_id: int = 0,
                  version: Optional[int] = None, concurrency: int = CONCURRENCY,
                  duration_s: float = DURATION_S, warmup_s: float = WARMUP_S) -> Dict[str, Any]:
    """A classifier model's closed-loop throughput on the server: one text per request,
    ``rows[k % len(rows)]`` (token ids int64 [T]) as ``input_ids``/``attention_mask`` int64
    [1, T]. Returns :func:`closed_loop`'s result with ``"model"`` and ``"cost_s"`` (seconds
    per text, 1 / throughput; None when nothing completed).

    Raises:
        TuneError: no request succeeded (the first error named).
    """
    from orchestrator.tooling.client import client_module
    from orchestrator.tooling.errors import TuneError

    tc = client_module(protocol)
    rows = [np.asarray(r, dtype=np.int64).reshape(1, -1) for r in rows] or [np.array([[pad_id]], dtype=np.int64)]

    def send(client: Any, k: int) -> None:
        ids = rows[k % len(rows)]
        inputs = [tc.InferInput("input_ids", list(ids.shape), "INT64"), tc.InferInput("attention_mask", list(ids.shape), "INT64")]
        inputs[0].set_data_from_numpy(ids)
        inputs[1].set_data_from_numpy(np.ones_like(ids))
        client.infer(model, inputs, model_version="" if version is None else str(version),
                     outputs=[tc.InferRequestedOutput("logits")])

    r = closed_loop(_client_maker(protocol, address), send, concurrency, duration_s, warmup_s)
    if r["requests"] == 0:
        raise TuneError(f"model '{model}' at {protocol}://{address}: no request succeeded in {duration_s:g} s"
                        + (f" ({r['first_error']})" if r["first_error"] else ""))
    return {"model": model, **r, "cost_s": 1.0 / r["throughput"]}


def measure_router(protocol: str, address: str, model: str, texts: Sequence[str], threshold: float = 0.5,
                   concurrency: int = CONCURRENCY, duration_s: float = DURATION_S,
                   warmup_s: float = WARMUP_S) -> Dict[str, Any]:
    """The router's closed-loop throughput: one text per request (``texts[k % len(texts)]``,
    TEXT BYTES [1, 1], THRESHOLD FP32 [1, 1]), after ``warmup_s`` untimed seconds;
    :func:`closed_loop`'s result."""
    from orchestrator.tooling.client import client_module, text_inputs

    tc = client_module(protocol)

    def send(client: Any, k: int) -> None:
        client.infer(model, text_inputs(tc, [texts[k % len(texts)]], threshold), outputs=[tc.InferRequestedOutput("VERDICTS")])

    return {"model": model, **closed_loop(_client_maker(protocol, address), send, concurrency, duration_s, warmup_s)}


def predicted(reach: Sequence[float], costs: Sequence[float], overhead_s: float = 0.0) -> float:
    """Texts per second of a cascade whose stage ``i`` sees the share ``reach[i]`` of the
    texts (``reach[0]`` = 1) and costs ``costs[i]`` seconds per text, behind a router that
    costs ``overhead_s`` seconds per text itself: ``1 / (overhead_s + sum(reach * cost))``."""
    return 1.0 / (overhead_s + float(np.dot(reach, costs)))


def overhead_from(router_throughput: float, reach: Sequence[float], costs: Sequence[float]) -> float:
    """The router's own seconds per text implied by one closed loop: ``1 / router_throughput``
    (texts per second, at stage shares ``reach``) less what its stages cost there
    (``sum(reach * costs)``), at least 0 (a router measured faster than its stages alone:
    noise, or stages whose batches fill better behind the router). One constant: the model
    before :func:`fit_overhead`'s parts."""
    return max(0.0, 1.0 / router_throughput - float(np.dot(reach, costs)))


def overhead_at(parts: Sequence[float], reach: Sequence[float], curvature: Optional[Sequence[float]] = None) -> float:
    """The router's own seconds per text at stage shares ``reach`` (``reach[0]`` = 1):
    ``sum(parts * reach + curvature * reach**2)`` (``parts[0]``: per text; ``parts[i]``: per
    text reaching stage ``i``; ``curvature[i]``: that part's curvature, 0 for stage 0; None:
    0 each), at least 0."""
    r = np.asarray(reach, dtype=np.float64)
    o = float(np.dot(parts, r))
    if curvature is not None:
        o += float(np.dot(np.asarray(curvature, dtype=np.float64)[1:], r[1:] ** 2))
    return max(0.0, o)


def mixture(base: Sequence[int], reaching: Sequence[int], share: float, n: int) -> List[int]:
    """``n`` text indices, ``round(share * n)`` of them taken in turn from ``reaching`` and
    the rest from ``base`` (each list cycled), the ``reaching`` ones spread evenly (the
    ``k``-th text is one of them when ``floor((k + 1) * share)`` passes a whole number), as a
    margin mixes escalated texts into the router's batches.

    Raises:
        ValueError: ``share`` outside [0, 1], or a list it needs empty.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share {share!r}: not in [0, 1]")
    if (share > 0 and not reaching) or (share < 1 and not base):
        raise ValueError("mixture: a list it draws from is empty")
    out: List[int] = []
    taken = [0, 0]
    for k in range(n):
        pick = int(np.floor((k + 1) * share + 1e-9)) > int(np.floor(k * share + 1e-9))
        src = reaching if pick else base
        out.append(src[taken[pick] % len(src)])
        taken[pick] += 1
    return out


def overhead_lists(reached: Sequence[np.ndarray], shares: Sequence[float] = OVERHEAD_SHARES
                   ) -> Tuple[List[Dict[str, Any]], List[int], List[str]]:
    """The text lists the router's overhead is fitted from (module docstring), for texts
    whose stage masks at the served margin are ``reached`` (bool [N] per stage, ``reached[0]``
    all true: :func:`orchestrator.tooling.tune.cascade_answers`'s).

    Groups the texts by the last stage each reaches; the lowest group present is the base.
    Per later group present and per share: a :func:`mixture` of it into the base, ``N``
    texts. Returns ``(lists, fitted, notes)``: each list ``{"stage" (the group, 0-based),
    "share" (of texts of that group, as built), "reach" (share per stage), "texts" (indices)}``;
    ``fitted``: the stages whose part the lists separate (0 first); ``notes``: why a part is
    not measured."""
    n, stages = len(reached[0]), len(reached)
    deepest = np.zeros(n, dtype=int)
    for i in range(1, stages):
        deepest[np.asarray(reached[i], dtype=bool)] = i
    groups = {g: [int(x) for x in np.flatnonzero(deepest == g)] for g in range(stages)}
    present = [g for g in range(stages) if groups[g]]
    notes: List[str] = []
    if not present:
        return [], [], ["no tuning texts"]
    base = present[0]
    if base > 0:
        notes.append(f"every tuning text reaches stage {base + 1} at the served margin: the router's cost for stages "
                     f"2 to {base + 1} is counted in o_1")
    for g in range(base + 1, stages):
        if not groups[g] and not any(groups[h] for h in range(g + 1, stages)):
            notes.append(f"no tuning text reaches stage {g + 1} at the served margin: o_{g + 1} not measured (0; give it "
                         "with --router-stage-overhead-ms)")
        elif not groups[g]:
            notes.append(f"no tuning text stops at stage {g + 1} at the served margin: its cost is counted in the next "
                         "stage's part")
    lists: List[Dict[str, Any]] = []
    for g in present[1:] or [base]:
        for share in (shares if g != base else (0.0,)):
            idx = mixture(groups[base], groups[g], share, n)
            got = float(np.mean([deepest[i] == g for i in idx])) if g != base else 0.0
            reach = [1.0 if i <= base else (got if i <= g else 0.0) for i in range(stages)]
            lists.append({"stage": g, "share": got, "reach": reach, "texts": idx})
    return lists, [0] + present[1:], notes


def fit_overhead(reaches: Sequence[Sequence[float]], throughputs: Sequence[float], costs: Sequence[float],
                 fitted: Sequence[int]) -> Tuple[List[float], List[float]]:
    """The router's overhead parts and their curvatures (seconds per text, one each per stage:
    :func:`overhead_at`) from its closed loops on text lists with stage shares ``reaches``
    (one per list) that measured ``throughputs`` (texts/s), the stages costing ``costs``
    (seconds per text alone): ``1 / T_j - reach_j . costs = reach_j . parts + reach_j**2 .
    curvature`` solved by least squares over the stages in ``fitted`` (the others 0), a later
    stage's curvature only where its lists have at least three distinct shares above 0 (else
    0: two shares fit a line). A part may come out below 0 (noise, or a stage whose batches
    fill better behind the router); :func:`overhead_at` keeps the sum at least 0.

    Raises:
        ValueError: fewer lists than the unknowns fitted, or a throughput not above 0.
    """
    r = np.asarray(reaches, dtype=np.float64).reshape(len(reaches), -1)
    curved = [i for i in fitted if i > 0 and len({round(float(v), 9) for v in r[:, i] if v > 0}) >= 3]
    if len(reaches) < len(fitted) + len(curved) or any(t <= 0 for t in throughputs):
        raise ValueError(f"fit_overhead: {len(reaches)} lists for {len(fitted) + len(curved)} unknowns, throughputs {list(throughputs)}")
    y = 1.0 / np.asarray(throughputs, dtype=np.float64) - r @ np.asarray(costs, dtype=np.float64)
    design = np.hstack([r[:, list(fitted)], r[:, curved] ** 2])
    solved = np.linalg.lstsq(design, y, rcond=None)[0]
    parts, curvature = [0.0] * len(costs), [0.0] * len(costs)
    for i, v in zip(fitted, solved):
        parts[i] = float(v)
    for i, v in zip(curved, solved[len(fitted):]):
        curvature[i] = float(v)
    return parts, curvature


def served_cascade(protocol: str, address: str, router: str, cascade: str,
                   cascades: Callable[[Any], Sequence[Any]]) -> Tuple[Optional[Any], str]:
    """The cascade node named ``cascade`` in the policy ``router`` serves (its
    ``describe_policy`` answer), or None and why not; ``cascades``: a policy's cascade nodes
    (``tune.cascades``)."""
    from orchestrator.runtime.routing import policy as P
    from orchestrator.tooling.policy_cli import fetch_policy

    try:
        document = fetch_policy(address, router, protocol)
        served = P.parse_policy(document)
    except Exception as exc:  # noqa: BLE001 - the reason is reported, the tune itself stands
        return None, f"could not read the policy of model '{router}' ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    found = [c for c in cascades(served) if c.name == cascade]
    if not found:
        return None, f"the policy '{router}' serves has no cascade named '{cascade}'"
    return found[0], ""


def throughput_report(url: str, head: Any, result: Mapping[str, Any], plan: Sequence[Tuple[Any, Sequence[Any]]],
                      answers_of: Mapping[str, Tuple[Sequence[np.ndarray], Any]], models: Any, router: str,
                      max_length: int, threshold: float = 0.5, concurrency: int = CONCURRENCY,
                      duration_s: float = DURATION_S, *, cascade_answers: Callable[..., Any],
                      cascades_of: Callable[[Any], Sequence[Any]], router_overhead_s: Optional[float] = None,
                      router_stage_overhead_s: Optional[Sequence[float]] = None,
                      overhead_shares: Sequence[float] = OVERHEAD_SHARES) -> Dict[str, Any]:
    """``curves.json``'s ``"throughput"``: each stage model measured on the server, every
    cascade point's predicted throughput (texts/s) beside its accuracy, and the chosen point
    run through ``router`` where it serves that margin (else ``"router_not_run"``: why).

    ``head``: the policy's head (the stages' answers read with it); ``result``: tune's
    document (its ``"cascades"`` entries, the chosen points); ``plan``: (cascade node,
    stages); ``answers_of``: cascade name -> (stage answers float64 [N, columns] each, the
    measured texts); ``models``: :class:`orchestrator.tooling.tune.Models`;
    ``cascade_answers``, ``cascades_of``: ``tune``'s (passed in: this module does not import
    ``tune``, which imports it); ``router_overhead_s``, ``router_stage_overhead_s``: the
    router's own seconds per text and per text reaching each later stage, to use instead of
    fitting them (:func:`router_overhead`); ``overhead_shares``: the escalated shares of the
    text lists the parts are fitted from.

    Each cascade's ``"overhead"``: ``{"parts_s" (seconds, one per stage), "curvature_s" (the
    same, 0 where not fitted), "source"}``
    (``given``; ``fitted``: with ``margin`` (served), ``lists`` (each list's ``stage``,
    ``share``, ``reach``, ``texts``, ``stage_cost_s``, the router's closed loop and the one
    constant it implies, ``implied_s``) and ``notes``; or ``none``: with ``reason``); each
    point's ``overhead_s`` (:func:`overhead_at` its reach) is in its ``predicted_throughput``.

    Raises:
        TuneError: a bad ``url``, a stage model with no successful request, or
            ``router_stage_overhead_s`` not one value per later stage.
    """
    from orchestrator.runtime.execution.tokenize import truncate
    from orchestrator.tooling.errors import TuneError

    protocol, address = parse_url(url)
    out: Dict[str, Any] = {"url": url, "concurrency": concurrency, "duration_s": duration_s, "formula": FORMULA,
                           "request": "one text per request, tokenized as the router sends it", "models": {}, "cascades": []}
    given: Optional[List[float]] = None
    for (cascade, stages), entry in zip(plan, result["cascades"]):
        if router_overhead_s is not None:
            later = list(router_stage_overhead_s or [0.0] * (len(stages) - 1))
            if len(later) != len(stages) - 1:
                raise TuneError(f"--router-stage-overhead-ms: {len(later)} values for cascade '{cascade.name}', which has "
                                f"{len(stages) - 1} stage(s) after the first (one value each)")
            given = [float(router_overhead_s)] + [float(x) for x in later]
        answers, measured = answers_of[cascade.name]
        costs = []
        for s in stages:
            name = s.model.model
            if name not in out["models"]:
                mh = models.heads[name]
                rows = [truncate(x, min(max_length, mh.max_length)) for x in models.ids(mh.tokenizer, measured.texts)]
                out["models"][name] = measure_model(protocol, address, name, rows, mh.pad_token_id, s.model.version,
                                                    concurrency, duration_s)
            costs.append(out["models"][name]["cost_s"])

        def reached_at(margin: float, answers: Sequence[np.ndarray] = answers) -> List[np.ndarray]:
            return [np.asarray(r, dtype=bool) for r in cascade_answers(head, answers, margin, threshold)[1]]

        served, why = served_cascade(protocol, address, router, cascade.name, cascades_of)
        overhead = router_overhead(protocol, address, router, served, why, reached_at, costs, measured.texts, threshold,
                                   concurrency, duration_s, given, overhead_shares)
        points = []
        for p in entry["points"]:
            reach = [float(r.mean()) for r in reached_at(p["margin"])]
            o = overhead_at(overhead["parts_s"], reach, overhead.get("curvature_s"))
            points.append({"margin": p["margin"], "escalation_rate": p["escalation_rate"], "accuracy": p["accuracy"],
                           "reach": reach, "overhead_s": o, "predicted_throughput": predicted(reach, costs, o)})
        chosen = next(q for q in points if q["margin"] == entry["chosen"]["margin"])
        c = {"name": cascade.name, "points": points, "chosen": chosen, "overhead": overhead,
             "last_stage_alone": {"accuracy": entry["last_stage_accuracy"], "predicted_throughput": 1.0 / costs[-1]},
             "first_stage_alone": {"predicted_throughput": 1.0 / costs[0]}}
        if served is not None and abs(served.margin - chosen["margin"]) > 1e-9:
            why = (f"model '{router}' serves cascade '{cascade.name}' with margin {served.margin:g}, not the chosen "
                   f"{chosen['margin']:g} (serve the tuned policy and run again)")
            served = None
        if served is None:
            c["router_not_run"] = why
        else:
            run = measure_router(protocol, address, router, measured.texts, threshold, concurrency, duration_s)
            c["router"] = {**run, "predicted_throughput": chosen["predicted_throughput"],
                           "measured_over_predicted": run["throughput"] / chosen["predicted_throughput"]}
        out["cascades"].append(c)
    return out


def router_overhead(protocol: str, address: str, router: str, served: Optional[Any], why: str,
                    reached_at: Callable[[float], List[np.ndarray]], costs: Sequence[float], texts: Sequence[str],
                    threshold: float, concurrency: int, duration_s: float, given_s: Optional[Sequence[float]] = None,
                    shares: Sequence[float] = OVERHEAD_SHARES) -> Dict[str, Any]:
    """The router's own overhead parts on the server (module docstring): ``given_s`` (seconds,
    one per stage) when set; else fitted (:func:`fit_overhead`) from the router's closed loop
    (:func:`measure_router`) on each of :func:`overhead_lists`' text lists at the margin its
    ``served`` cascade has (``reached_at(margin)``: bool [N] per stage, the texts reaching it;
    ``costs``: the stages' seconds per text); else 0, with the reason (``why``: the served
    cascade's, or a closed loop answered nothing)."""
    zero = [0.0] * len(costs)
    if given_s is not None:
        return {"parts_s": [float(x) for x in given_s], "curvature_s": zero, "source": "given"}
    if served is None:
        return {"parts_s": zero, "curvature_s": zero, "source": "none", "reason": why}
    lists, fitted, notes = overhead_lists(reached_at(served.margin), shares)
    for li in lists:
        run = measure_router(protocol, address, router, [texts[i] for i in li["texts"]], threshold, concurrency, duration_s)
        if run["requests"] == 0:
            return {"parts_s": zero, "curvature_s": zero, "source": "none",
                    "reason": f"model '{router}' answered no request" + (f" ({run['first_error']})" if run["first_error"] else "")}
        li.update(texts=len(li["texts"]), stage_cost_s=float(np.dot(li["reach"], costs)), router=run,
                  implied_s=overhead_from(run["throughput"], li["reach"], costs))
    if not lists:
        return {"parts_s": zero, "curvature_s": zero, "source": "none", "reason": "; ".join(notes)}
    parts, curvature = fit_overhead([li["reach"] for li in lists], [li["router"]["throughput"] for li in lists], costs, fitted)
    return {"parts_s": parts, "curvature_s": curvature, "source": "fitted", "margin": served.margin, "lists": lists,
            "notes": notes}


def overhead_terms(parts: Sequence[float], curvature: Optional[Sequence[float]] = None) -> str:
    """The overhead ``o`` (:func:`overhead_at`) as milliseconds per text, e.g.
    ``0.051 + e_2 * 1.364 + e_2^2 * -0.154``: a curvature term only where it is not 0 at
    that precision (``curvature`` None: none)."""
    curvature = curvature or [0.0] * len(parts)
    return " + ".join([f"{1000 * parts[0]:.3f}"] + [f"e_{i + 1} * {1000 * x:.3f}" for i, x in enumerate(parts) if i]
                      + [f"e_{i + 1}^2 * {1000 * q:.3f}" for i, q in enumerate(curvature) if i and round(1000 * q, 3)])


def describe_overhead(o: Mapping[str, Any]) -> str:
    """One line on the router overhead's parts and where they came from (``tune.md``)."""
    terms = overhead_terms(o["parts_s"], o.get("curvature_s"))
    if o["source"] == "fitted":
        runs = "; ".join(f"{100 * li['share']:.0f}% reaching stage {li['stage'] + 1}: {li['router']['throughput']:.1f} "
                         f"texts/s, stages {1000 * li['stage_cost_s']:.3f} ms" if li["stage"] else
                         f"none escalated: {li['router']['throughput']:.1f} texts/s, stages {1000 * li['stage_cost_s']:.3f} ms"
                         for li in o["lists"])
        notes = "".join(f" {n[0].upper()}{n[1:]}." for n in o.get("notes", []))
        return (f"Router overhead o = {terms} ms per text, fitted from the router's closed loop at the margin it serves "
                f"({o['margin']:g}) on {len(o['lists'])} lists of the tuning texts with a known share escalated ({runs}).{notes}")
    if o["source"] == "given":
        return f"Router overhead o = {terms} ms per text (given: --router-overhead-ms, --router-stage-overhead-ms)."
    return f"Router overhead not measured ({o['reason']}): o = 0, every prediction is an upper bound."


def render_throughput(t: Mapping[str, Any], step: float = 0.025) -> List[str]:
    """``tune.md``'s throughput section: per cascade a table of the points at every ``step``
    of margin and the chosen one (every point is in ``curves.json``), then measured against
    predicted at the chosen point, or why it did not run."""
    L = ["", f"## Throughput predicted on {t['url']}", "",
         f"Each stage model measured alone: closed loop, concurrency {t['concurrency']}, {t['duration_s']:g} s per model, "
         f"{t['request']}. Predicted throughput = {t['formula']}.", "",
         "| model | requests | errors | texts/s | cost per text (ms) |", "|---|---:|---:|---:|---:|"]
    for name, m in t["models"].items():
        L.append(f"| {name} | {m['requests']} | {m['errors']} | {m['throughput']:.1f} | {1000 * m['cost_s']:.2f} |")
    for c in t["cascades"]:
        o = c.get("overhead", {"parts_s": [0.0], "source": "none", "reason": "not measured"})
        L += ["", describe_overhead(o)]
        L += ["", f"Cascade `{c['name']}` (every {step:g} of margin and the chosen point; all in curves.json):", "",
              "| margin | escalation rate | accuracy | predicted texts/s |", "|---:|---:|---:|---:|"]
        for p in c["points"]:
            on_step = abs(p["margin"] / step - round(p["margin"] / step)) < 1e-6
            if on_step or p is c["chosen"] or p["margin"] == c["chosen"]["margin"]:
                star = " **(chosen)**" if p["margin"] == c["chosen"]["margin"] else ""
                L.append(f"| {p['margin']:g}{star} | {100 * p['escalation_rate']:.2f}% | {100 * p['accuracy']:.2f}% | "
                         f"{p['predicted_throughput']:.1f} |")
        last = c["last_stage_alone"]
        L.append(f"| last stage alone | 100% | {100 * last['accuracy']:.2f}% | {last['predicted_throughput']:.1f} |")
        if "router" in c:
            r = c["router"]
            L += ["", f"Chosen point on the server (router '{r['model']}', same closed loop): measured "
                  f"{r['throughput']:.1f} texts/s ({r['requests']} requests, {r['errors']} errors), predicted "
                  f"{r['predicted_throughput']:.1f}: measured/predicted {r['measured_over_predicted']:.2f}."]
        else:
            L += ["", f"Chosen point not run on the server: {c['router_not_run']}."]
    return L


def plot_throughput(path: Any, c: Mapping[str, Any], title: str) -> Any:
    """Accuracy against predicted throughput of one cascade's points (PNG), the chosen point
    starred, the last stage alone and, where run, the router's measured throughput marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["predicted_throughput"] for p in c["points"]], [p["accuracy"] for p in c["points"]], ".", label="margin points (predicted)")
    ch, last = c["chosen"], c["last_stage_alone"]
    ax.plot([ch["predicted_throughput"]], [ch["accuracy"]], "r*", markersize=12, label=f"chosen (margin {ch['margin']:g})")
    ax.plot([last["predicted_throughput"]], [last["accuracy"]], "ks", label="last stage alone (predicted)")
    if "router" in c:
        ax.plot([c["router"]["throughput"]], [ch["accuracy"]], "gx", markersize=10, label="router, measured")
    ax.set_xlabel("texts per second (predicted on the server)")
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
