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

``o`` is measured on the server (:func:`router_overhead`): the same closed loop runs against
the router (``--router-model``, default the policy file's directory name) at the margin it
serves now (its ``describe_policy`` answer), and ``o = 1 / T_router - sum(e_i * c_i)`` at that
margin's stage shares (computed on the tuning texts), at least 0. ``--router-overhead-ms``
gives ``o`` instead (one measured earlier, at another margin): a point checked with an ``o``
measured at another margin checks the model, not the calibration. Without a router that
answers, ``o`` is 0 and the result says why: the predictions are then upper bounds.

When the router serves the chosen margin, a second closed loop runs against it and the
measured throughput is printed beside the predicted one; otherwise the result says what
could not run and why.

Errors: :class:`orchestrator.tooling.errors.TuneError` (a bad ``--url``, a stage model the
server does not answer).
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
FORMULA = ("1 / (o + c_1 + e_2 * c_2 + ...): c_i seconds per text of stage i alone (1 / its throughput), e_i the share "
           "of texts reaching stage i, o the router's own overhead per text (measured on the server at the margin it serves)")


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
    """The router's own seconds per text: ``1 / router_throughput`` (texts per second, the
    router's closed loop at a margin whose stage shares are ``reach``) less what its stages
    cost there (``sum(reach * costs)``), at least 0 (a router measured faster than its stages
    alone: noise, or stages whose batches fill better behind the router)."""
    return max(0.0, 1.0 / router_throughput - float(np.dot(reach, costs)))


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
                      cascades_of: Callable[[Any], Sequence[Any]], router_overhead_s: Optional[float] = None) -> Dict[str, Any]:
    """``curves.json``'s ``"throughput"``: each stage model measured on the server, every
    cascade point's predicted throughput (texts/s) beside its accuracy, and the chosen point
    run through ``router`` where it serves that margin (else ``"router_not_run"``: why).

    ``head``: the policy's head (the stages' answers read with it); ``result``: tune's document (its ``"cascades"`` entries, the chosen points); ``plan``:
    (cascade node, stages); ``answers_of``: cascade name -> (stage answers float64 [N,
    columns] each, the measured texts); ``models``: :class:`orchestrator.tooling.tune.Models`;
    ``cascade_answers``, ``cascades_of``: ``tune``'s (passed in: this module does not import
    ``tune``, which imports it); ``router_overhead_s``: the router's own seconds per text to
    use instead of measuring it (:func:`router_overhead`).

    Each cascade's ``"overhead"``: ``{"overhead_s", "source"}`` (``given``, ``measured``: with
    the router's closed loop, ``margin``, ``reach`` and ``stage_cost_s``, or ``none``: with
    ``reason``); each point's ``predicted_throughput`` includes ``overhead_s``.

    Raises:
        TuneError: a bad ``url``, or a stage model with no successful request.
    """
    from orchestrator.runtime.execution.tokenize import truncate

    protocol, address = parse_url(url)
    out: Dict[str, Any] = {"url": url, "concurrency": concurrency, "duration_s": duration_s, "formula": FORMULA,
                           "request": "one text per request, tokenized as the router sends it", "models": {}, "cascades": []}
    for (cascade, stages), entry in zip(plan, result["cascades"]):
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

        def reach_at(margin: float, answers: Sequence[np.ndarray] = answers) -> List[float]:
            return [float(r.mean()) for r in cascade_answers(head, answers, margin, threshold)[1]]

        served, why = served_cascade(protocol, address, router, cascade.name, cascades_of)
        overhead = router_overhead(protocol, address, router, served, why, reach_at, costs, measured.texts, threshold,
                                   concurrency, duration_s, router_overhead_s)
        points = []
        for p in entry["points"]:
            reach = reach_at(p["margin"])
            points.append({"margin": p["margin"], "escalation_rate": p["escalation_rate"], "accuracy": p["accuracy"],
                           "reach": reach, "predicted_throughput": predicted(reach, costs, overhead["overhead_s"])})
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
                           "measured_over_predicted": run["throughput"] / chosen["predicted_throughput"],
                           # o measured at this very margin: the check is of repeatability, not of the model
                           "overhead_measured_here": overhead["source"] == "measured"
                           and abs(overhead["margin"] - chosen["margin"]) <= 1e-9}
        out["cascades"].append(c)
    return out


def router_overhead(protocol: str, address: str, router: str, served: Optional[Any], why: str,
                    reach_at: Callable[[float], List[float]], costs: Sequence[float], texts: Sequence[str],
                    threshold: float, concurrency: int, duration_s: float,
                    given_s: Optional[float] = None) -> Dict[str, Any]:
    """The router's own seconds per text on the server (module docstring): ``given_s`` when
    set; else :func:`overhead_from` the router's closed loop (:func:`measure_router`) at the
    margin its ``served`` cascade has (``reach_at(margin)``: the stage shares there; ``costs``:
    the stages' seconds per text); else 0, with the reason (``why``: the served cascade's,
    or the closed loop answered nothing)."""
    if given_s is not None:
        return {"overhead_s": float(given_s), "source": "given"}
    if served is None:
        return {"overhead_s": 0.0, "source": "none", "reason": why}
    run = measure_router(protocol, address, router, texts, threshold, concurrency, duration_s)
    if run["requests"] == 0:
        return {"overhead_s": 0.0, "source": "none",
                "reason": f"model '{router}' answered no request" + (f" ({run['first_error']})" if run["first_error"] else "")}
    reach = reach_at(served.margin)
    return {"overhead_s": overhead_from(run["throughput"], reach, costs), "source": "measured", "margin": served.margin,
            "reach": reach, "stage_cost_s": float(np.dot(reach, costs)), "router": run}


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
        o = c.get("overhead", {"overhead_s": 0.0, "source": "none", "reason": "not measured"})
        if o["source"] == "measured":
            L += ["", f"Router overhead o = {1000 * o['overhead_s']:.3f} ms per text: the router's closed loop at the margin it "
                  f"serves ({o['margin']:g}) measured {o['router']['throughput']:.1f} texts/s, its stages there cost "
                  f"{1000 * o['stage_cost_s']:.3f} ms per text."]
        elif o["source"] == "given":
            L += ["", f"Router overhead o = {1000 * o['overhead_s']:.3f} ms per text (given: --router-overhead-ms)."]
        else:
            L += ["", f"Router overhead not measured ({o['reason']}): o = 0, every prediction is an upper bound."]
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
                  f"{r['predicted_throughput']:.1f}: measured/predicted {r['measured_over_predicted']:.2f}"
                  + (" (o was measured at this margin: this checks repeatability; check the model at another margin "
                     "with --router-overhead-ms)." if r.get("overhead_measured_here") else ".")]
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
