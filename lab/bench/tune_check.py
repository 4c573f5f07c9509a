"""``orchestrator tune --url`` checked against what it then measures, on the embedded stack
(``make bench-tune-check`` or ``python -m lab.bench.tune_check [--margins A B C] [--concurrency 16]
[--duration 5] [--out DIR]``).

1. copies ``model_repository/`` (:func:`lab.bench.variants.make_bench_repository`, no variants) and
   starts one embedded Triton on it (:class:`orchestrator.tooling.server.TritonServer`, explicit
   model control) serving ``classifier``, ``classifier_fast`` and ``router``, and warms it: a
   closed loop against ``router`` for ``--warmup`` seconds (:data:`WARMUP_S`), its figures kept
   apart. A freshly started server, and a router that has served nothing yet, answer slower for
   their first seconds of traffic: on 2 shared cores, consecutive 1-second loops at concurrency 2
   measured the router right after start at 97, then 151, then about 200 texts/s; a second
   router loaded with it and first sent traffic after 8 s of loop against the first (the
   classifiers warm) at 135 and 122, then about 170;
2. runs ``orchestrator tune`` on the copy's ``router/policy.yaml`` with ``--url``
   (:func:`orchestrator.tooling.tune.tune`, ``--data`` default ``split:validation``, ``--target``
   default ``noninferior:0.5``: what the shipped margin was tuned with): each stage's cost per
   text ``c_i`` (its model alone in a closed loop), the router's own overhead parts ``o_1`` (per
   text) and ``o_2`` (per escalated text), fitted from the router's closed loop at the margin it
   serves (the shipped one) on lists of the tuning texts with a known share escalated there
   (:func:`orchestrator.tooling.tune_throughput.router_overhead`), the share of the tuning texts
   reaching each stage at every margin tune sweeps, and the chosen margin (run by tune itself
   when the router serves it);
3. checks three operating points (:func:`choose_margins`): the chosen margin and the margins
   whose escalation shares are nearest :data:`SHARES` (0.2 and 0.6), or ``--margins``. Each is
   served by its own router variant ``router_margin_<m>`` (a copy of ``router`` whose cascade
   margin is set by tune's own policy editor: :func:`write_margin_variant`), loaded alone (the
   other routers unloaded), its margin read back from the server
   (:func:`orchestrator.tooling.tune_throughput.served_cascade`), warmed as ``router`` was, then
   measured with the same closed loop on the same texts
   (:func:`orchestrator.tooling.tune_throughput.measure_router`);
4. per point (:func:`checks`): predicted ``1 / (o + sum(e_i * c_i))``
   (:func:`orchestrator.tooling.tune_throughput.predicted`) with tune's fitted
   ``o = o_1 + e * o_2`` (``+ e**2 * q_2`` with three shares or more:
   :func:`orchestrator.tooling.tune_throughput.overhead_at`), measured,
   measured/predicted and whether that is within :data:`TOLERANCE` (15%). The fit ran on other
   text lists than any point's, so every point checks the model. For comparison, the model
   before the parts, one constant: the point predicted with the ``o`` implied by tune's own run
   of the chosen point (where it ran: the constant tune measured before, at the margin served)
   and with the ``o`` implied by each other checked point
   (:func:`orchestrator.tooling.tune_throughput.overhead_from` of its measurement).

Goal (:func:`verdict`): every point within 15% with tune's fitted overhead: met or not met;
not decided when a point could not be measured. The one-constant checks are counted beside it,
not judged. One closed loop per point (no rounds): on a shared machine the figures say little.

Units: throughput in texts (requests of one text) per second; costs and overheads in seconds
per text in the arithmetic, milliseconds in the report. Writes ``<out>/bench/tune_check.json``
and its section of ``<out>/benchmarks.md``.

Errors: :class:`lab.bench.plan.BenchError` (a margin tune does not sweep, fewer than two
margins, a router variant that does not serve its margin, no overhead fitted);
``TuneError``/``ServerError`` from the tooling.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from lab.bench.plan import REPO, BenchError
from lab.bench.report import TUNE_CHECK_END, TUNE_CHECK_START
from orchestrator.tooling import tune_throughput as TT

#: measured/predicted within 1 +- this: the goal.
TOLERANCE = 0.15
#: Escalation shares the two points beside the chosen one are nearest to.
SHARES = (0.2, 0.6)
ROUTER = "router"
STAGE_MODELS = ("classifier", "classifier_fast")
DATA = "split:validation"
#: The target the shipped margin was chosen with (model_repository/router/policy.yaml's comment).
TARGET = "noninferior:0.5"
COMMAND = "python -m lab.bench.tune_check"
#: Seconds of untimed closed loop against each router before it is measured (module docstring).
WARMUP_S = 10.0
_SAME = 1e-9  # margins this close are the same margin


def within(ratio: float, tolerance: float = TOLERANCE) -> bool:
    """measured/predicted within ``1 +- tolerance``."""
    return abs(ratio - 1.0) <= tolerance + 1e-12


def point_at(points: Sequence[Mapping[str, Any]], margin: float) -> Mapping[str, Any]:
    """Tune's point (``curves.json``'s ``"throughput"`` points: ``margin``, ``escalation_rate``,
    ``reach``, ...) at ``margin``.

    Raises:
        BenchError: tune does not sweep that margin.
    """
    for p in points:
        if abs(p["margin"] - margin) <= _SAME:
            return p
    swept = sorted(p["margin"] for p in points)
    step = f" in steps of {swept[1] - swept[0]:g}" if len(swept) > 1 else ""
    raise BenchError(f"--margins: {margin:g} is not a margin tune sweeps ({swept[0]:g} to {swept[-1]:g}{step})"
                     if swept else "tune swept no margin")


def choose_margins(points: Sequence[Mapping[str, Any]], chosen: float,
                   shares: Sequence[float] = SHARES) -> List[Tuple[float, str]]:
    """``[(margin, role)]``: the ``chosen`` margin (role ``"chosen"``), then per share in
    ``shares`` the margin whose ``escalation_rate`` is nearest it (role ``"near <share>"``):
    a margin not picked yet, of an escalation rate not picked yet where one is left (two
    margins escalating the same texts predict and measure the same thing); ties: the smaller
    margin. ``points``: tune's points (``margin``, ``escalation_rate``)."""
    picked = [(float(point_at(points, chosen)["margin"]), "chosen")]
    rates = [point_at(points, chosen)["escalation_rate"]]
    for share in shares:
        free = [p for p in points if all(abs(p["margin"] - m) > _SAME for m, _ in picked)]
        if not free:
            break
        fresh = [p for p in free if p["escalation_rate"] not in rates] or free
        best = min(fresh, key=lambda p: (abs(p["escalation_rate"] - share), p["margin"]))
        picked.append((float(best["margin"]), f"near {share:g}"))
        rates.append(best["escalation_rate"])
    return picked


def given_margins(points: Sequence[Mapping[str, Any]], margins: Sequence[float], chosen: float) -> List[Tuple[float, str]]:
    """``[(margin, role)]`` of ``--margins`` (role ``"chosen"`` where it is tune's chosen margin,
    else ``"given"``).

    Raises:
        BenchError: fewer than two distinct margins, or one tune does not sweep.
    """
    out: List[Tuple[float, str]] = []
    for m in margins:
        p = point_at(points, m)
        if any(abs(p["margin"] - q) <= _SAME for q, _ in out):
            raise BenchError(f"--margins: {m:g} given twice")
        out.append((float(p["margin"]), "chosen" if abs(p["margin"] - chosen) <= _SAME else "given"))
    if len(out) < 2:
        raise BenchError("--margins: give at least two margins (each is checked against the overhead measured at another)")
    return out


def variant_name(margin: float) -> str:
    """The router variant serving ``margin``: ``router_margin_0_295`` for 0.295."""
    return f"{ROUTER}_margin_{margin:g}".replace(".", "_").replace("-", "m")


def write_margin_variant(repo: Path, cascade: str, margin: float, base: str = ROUTER) -> str:
    """Copy model ``base`` of ``repo`` to :func:`variant_name` (``copy_model``: the name set in
    every config) with the cascade node ``cascade`` of its policy (the file its config's
    ``policy`` parameter names) at ``margin``, edited by tune's own editor
    (:func:`orchestrator.tooling.tune.edit_policy_text`: every other byte kept) and checked by
    the policy parser; returns the variant's name.

    Raises:
        BenchError: the base has no ``policy`` parameter, the policy no such cascade, or the
            edited policy does not parse.
    """
    import yaml

    from orchestrator.runtime.routing import policy as P
    from orchestrator.tooling.errors import TuneError
    from orchestrator.tooling.repository import copy_model, get_parameter, read_config
    from orchestrator.tooling.tune import edit_policy_text

    name = variant_name(margin)
    where = f"router variant {name} (of {base})"
    policy = get_parameter(read_config(repo / base / "config.pbtxt"), "policy")
    if not policy:
        raise BenchError(f"{where}: {base}/config.pbtxt has no 'policy' parameter")
    copy_model(repo / base, repo / name, [f"Benchmark variant {name} of {base}: cascade '{cascade}' at margin {margin:g} "
                                          "(lab.bench.tune_check)."])
    path = repo / name / policy
    try:
        text = edit_policy_text(path.read_text(encoding="utf-8"),
                                [("cascade", cascade, "margin", margin, f"lab.bench.tune_check: operating point {margin:g}")])
        P.parse_policy(yaml.safe_load(text))
    except (TuneError, P.PolicyError) as exc:
        raise BenchError(f"{where}: {exc}") from None
    path.write_text(text, encoding="utf-8")
    return name


def _check(reach: Sequence[float], costs: Sequence[float], overhead_s: float, measured: float) -> Dict[str, Any]:
    pred = TT.predicted(reach, costs, overhead_s)
    return {"overhead_s": overhead_s, "predicted": pred, "ratio": measured / pred, "within": within(measured / pred)}


def checks(points: Sequence[Mapping[str, Any]], costs: Sequence[float], overhead: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Each point checked (module docstring, step 4). ``points``: ``{"margin", "role",
    "escalation_rate", "reach" (share of texts per stage), "router" (its closed loop:
    ``measure_router``), "warmup" (optional: the untimed loop before it, kept as it is)}``;
    ``costs``: the stages' seconds per text; ``overhead``: tune's (``{"parts_s"}``, its
    ``"curvature_s"`` where fitted, and
    ``"constant_s"``, ``"constant_margin"`` where tune ran its chosen point: the one constant
    that run implies).

    Returns per point: the point's fields and ``measured`` (texts/s), ``requests``,
    ``errors``; with requests, ``implied_overhead_s`` (:func:`overhead_from` of its
    measurement), ``tune`` (:func:`_check` with tune's fitted overhead at the point's reach),
    ``constant`` (with tune's one constant, where there is one; ``overhead_margin``,
    ``same_margin``) and ``others`` (one check per other measured point, with that point's
    implied overhead and margin); without, ``error``."""
    out: List[Dict[str, Any]] = []
    constant = overhead.get("constant_s")
    for p in points:
        run = p["router"]
        row: Dict[str, Any] = {k: p[k] for k in ("margin", "role", "escalation_rate", "reach")}
        row.update(model=run.get("model"), measured=run["throughput"], requests=run["requests"], errors=run["errors"])
        if p.get("warmup") is not None:
            row["warmup"] = p["warmup"]
        if run["requests"] == 0:
            row["error"] = run.get("first_error") or "no request succeeded"
        else:
            row["implied_overhead_s"] = TT.overhead_from(run["throughput"], p["reach"], costs)
            o = TT.overhead_at(overhead["parts_s"], p["reach"], overhead.get("curvature_s"))
            row["tune"] = _check(p["reach"], costs, o, run["throughput"])
            if constant is not None:
                row["constant"] = {**_check(p["reach"], costs, constant, run["throughput"]),
                                   "overhead_margin": overhead["constant_margin"],
                                   "same_margin": abs(overhead["constant_margin"] - p["margin"]) <= _SAME}
        out.append(row)
    for row in out:
        if "error" in row:
            continue
        row["others"] = [{**_check(row["reach"], costs, other["implied_overhead_s"], row["measured"]),
                          "overhead_margin": other["margin"]}
                         for other in out if other is not row and "error" not in other]
    return out


def verdict(rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The goal over :func:`checks`' rows: ``{"checks", "within", "verdict"}`` of every point
    with tune's fitted overhead, ``verdict`` ``met`` (all within), ``not met`` or ``not
    decided`` (a point not measured, or none); ``constant``: the same counts (not judged) of
    the one-constant checks with an overhead measured at another margin (tune's constant where
    the point is at another margin, and every other point's)."""
    fitted = [r["tune"]["within"] for r in rows if "error" not in r]
    constant: List[bool] = []
    for r in rows:
        if "error" in r:
            continue
        if "constant" in r and not r["constant"]["same_margin"]:
            constant.append(r["constant"]["within"])
        constant += [c["within"] for c in r["others"]]
    failed = [r["margin"] for r in rows if "error" in r]
    if failed or not fitted:
        v = "not decided"
    else:
        v = "met" if all(fitted) else "not met"
    return {"checks": len(fitted), "within": sum(fitted), "verdict": v, "unmeasured_margins": failed,
            "constant": {"checks": len(constant), "within": sum(constant)}}


def tune_summary(o: Mapping[str, Any], c: Mapping[str, Any], costs: Sequence[float],
                 models: Mapping[str, Any]) -> Dict[str, Any]:
    """``results["tune"]`` from tune's cascade ``c`` (``curves.json``'s ``"throughput"``
    cascade) and its fitted overhead ``o``: the parts, the served margin, each list's share and
    closed loop, the chosen margin and tune's run of it, and (where that ran) the one constant
    it implies (``constant_s``, at ``constant_margin``: the model before the parts)."""
    run = c.get("router")
    out: Dict[str, Any] = {
        "parts_s": o["parts_s"], "curvature_s": o.get("curvature_s"), "margin": o["margin"], "notes": o.get("notes", []),
        "lists": [{"stage": li["stage"], "share": li["share"], "reach": li["reach"], "texts": li["texts"],
                   "throughput": li["router"]["throughput"], "requests": li["router"]["requests"],
                   "errors": li["router"]["errors"], "implied_s": li["implied_s"]} for li in o["lists"]],
        "chosen_margin": c["chosen"]["margin"], "chosen_run": run, "chosen_not_run": c.get("router_not_run"), "models": models}
    if run and run["requests"]:
        out.update(constant_s=TT.overhead_from(run["throughput"], c["chosen"]["reach"], costs),
                   constant_margin=c["chosen"]["margin"])
    return out


def tuning_texts(policy_path: Path, repo: Path, data: str) -> List[str]:
    """The texts tune measured with (its ``--data`` read as tune reads it): the same list, in
    the same order, its router closed loop sent."""
    from orchestrator.runtime.routing import policy as P
    from orchestrator.tooling.modeling.parity.calibration import load_data
    from orchestrator.tooling.policy_cli import bind_repository

    bound, errors = bind_repository(P.load_policy(policy_path), repo, "embedded")
    if bound is None:
        raise BenchError(f"{policy_path} with {repo}: " + "; ".join(errors))
    return list(load_data(data, bound.head).texts)


def _ms(seconds: Optional[float]) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds:.3f}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section of one run ``r`` (pure)."""
    from lab.bench.stack import header_line

    t = r["tune"]
    pct = f"{100 * r['tolerance']:g}%"
    L = [TUNE_CHECK_START, "## `orchestrator tune --url` against what it then measures", "",
         f"One run of `{r['command']}` at {r['started_utc']} UTC on {r['machine']['cores']} cores "
         f"({r['machine']['cpu_model']}), 1-minute load average {r['load_before']} before, highest "
         f"{r['load_max_during']} during; every closed loop {r['concurrency']} clients for {r['duration_s']:g} s, one text "
         f"per request, the {r['texts']} texts of `{r['data']}` (tune's `--target {r['target']}`), each router first "
         f"warmed by {r.get('warmup_s', 0):g} s of the same loop, untimed; raw figures in `bench/tune_check.json`.", "",
         header_line(r.get("stack"))]
    if r["concurrency"] < 16 or r["duration_s"] < 5:
        L += ["", "> **Short loops**: a smoke run of the mechanics, not the check."]
    costs = ", ".join(f"`{m}` {_ms(c)} ms" for m, c in zip(r["stages"], r["stage_costs_s"]))
    terms = TT.overhead_terms(t["parts_s"], t.get("curvature_s"))
    lists = "; ".join(f"{100 * li['share']:.0f}% escalated: {li['throughput']:.1f} texts/s" for li in t["lists"])
    L += ["", f"Tune on the server, cascade `{r['cascade']}`: each stage alone per text {costs}; the router's own "
          f"overhead o = {terms} ms per text, fitted from its closed loop at the margin it serves ({t['margin']:g}) "
          f"on lists of the tuning texts with a known share escalated ({lists}); chosen margin {t['chosen_margin']:g}."]
    if t.get("chosen_run"):
        c = t["chosen_run"]
        L.append(f"Tune's own run of the chosen point: measured {c['throughput']:.1f}, predicted "
                 f"{c['predicted_throughput']:.1f}, measured/predicted {c['measured_over_predicted']:.2f}; the one "
                 f"constant it implies (the model before the parts, as tune measured it at the margin served): "
                 f"o = {_ms(t.get('constant_s'))} ms.")
    has_constant = any("constant" in p for p in r["points"])
    L += ["", "Each point served by its own router variant and measured with the same closed loop, predicted with "
          "tune's fitted o" + (" and, for comparison, with the one constant" if has_constant else "") + ":", "",
          "| margin | point | escalation share | o, ms | predicted, texts/s | measured, texts/s | measured/predicted | "
          f"within {pct} |" + (" one constant: measured/predicted |" if has_constant else "") + " implied o, ms |",
          "|---|---|---|---|---|---|---|---|" + ("---|" if has_constant else "") + "---|"]
    for p in r["points"]:
        head = f"| {p['margin']:g} | {p['role']} | {p['escalation_rate']:.3f} |"
        if "error" in p:
            L.append(f"{head} n/a | n/a | not measured: {p['error']} | n/a | n/a |" + (" n/a |" if has_constant else "")
                     + " n/a |")
            continue
        c = p["tune"]
        const = ""
        if has_constant:
            k = p.get("constant")
            const = (" n/a |" if k is None else
                     f" {k['ratio']:.3f}{' (same margin: repeats)' if k['same_margin'] else ''} |")
        L.append(f"{head} {_ms(c['overhead_s'])} | {c['predicted']:.1f} | {p['measured']:.1f} | {c['ratio']:.3f} | "
                 f"{_yes(c['within'])} |{const} {_ms(p['implied_overhead_s'])} |")
    L += ["", "One constant, for comparison: each point predicted with the overhead implied by another checked point "
          "(1 / its measured throughput less its stages' cost there):", "",
          "| margin | o from margin | o, ms | predicted, texts/s | measured, texts/s | measured/predicted | "
          f"within {pct} |", "|---|---|---|---|---|---|---|"]
    for p in r["points"]:
        for c in p.get("others", []):
            L.append(f"| {p['margin']:g} | {c['overhead_margin']:g} | {_ms(c['overhead_s'])} | {c['predicted']:.1f} | "
                     f"{p['measured']:.1f} | {c['ratio']:.3f} | {_yes(c['within'])} |")
    v = r["verdict"]
    label = {"met": "**met**", "not met": "**not met**", "not decided": "not decided"}[v["verdict"]]
    L += ["", f"- Predicted within {pct} of the measured throughput with tune's fitted overhead: "
          f"{v['within']} of {v['checks']} points: {label}"
          + (f" (not measured: margins {', '.join(f'{m:g}' for m in v['unmeasured_margins'])})" if v["unmeasured_margins"] else "")
          + f". With one constant measured at another margin (the model before the parts): {v['constant']['within']} of "
          f"{v['constant']['checks']} checks within {pct}. One closed loop per point, no rounds.", "", TUNE_CHECK_END]
    return "\n".join(L)


def _log(msg: str) -> None:
    print(f"[tune-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(out: Path, margins: Optional[Sequence[float]] = None, concurrency: int = TT.CONCURRENCY,
        duration_s: float = TT.DURATION_S, data: str = DATA, target: str = TARGET, long_n: Optional[int] = None,
        warmup_s: float = WARMUP_S, command: str = COMMAND) -> Dict[str, Any]:
    """The whole check (module docstring); writes its outputs under ``out``; returns the results."""
    import datetime
    import tempfile

    from lab.bench.machine import load_average, machine_info
    from lab.bench.report import write_kept_outputs
    from lab.bench.stack import read_stack
    from lab.bench.variants import make_bench_repository
    from orchestrator.tooling import tune as T
    from orchestrator.tooling.server import TritonServer

    results: Dict[str, Any] = {
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_before": load_average(), "machine": machine_info(), "command": command, "concurrency": concurrency,
        "duration_s": duration_s, "warmup_s": warmup_s, "data": data, "target": target, "tolerance": TOLERANCE}
    loads: List[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-tune-check-") as tmp:
        repo = make_bench_repository(Path(tmp) / "model_repository", REPO, variants={})
        policy = repo / ROUTER / "policy.yaml"
        texts = tuning_texts(policy, repo, data)
        results["texts"] = len(texts)
        with TritonServer(repo, models=[*STAGE_MODELS, ROUTER]) as server:
            results["stack"] = read_stack(server, embedded=True)
            url = f"grpc://{server.grpc_url}"
            results["warmup"] = _warm(server, ROUTER, texts, concurrency, warmup_s)
            _log(f"orchestrator tune {policy} --data {data} --target {target} --url {url}")
            tuned = T.tune(policy, data, repo=repo, target=target, out=Path(tmp) / "tune", url=url, concurrency=concurrency,
                           duration_s=duration_s, **({"long_n": long_n} if long_n is not None else {}))
            loads += load_average()[:1]
            thr, entry = tuned["throughput"], tuned["cascades"][0]
            c = thr["cascades"][0]
            o = c["overhead"]
            if o["source"] != "fitted":
                raise BenchError(f"tune fitted no router overhead: {o.get('reason', o['source'])}")
            costs = [thr["models"][m]["cost_s"] for m in entry["stages"]]
            chosen = c["chosen"]["margin"]
            picked = (given_margins(c["points"], margins, chosen) if margins else choose_margins(c["points"], chosen))
            results.update(cascade=c["name"], stages=entry["stages"], stage_costs_s=costs,
                           tune=tune_summary(o, c, costs, thr["models"]))
            server.unload_model(ROUTER)  # each point's router alone, as the router was when tune measured o
            points = []
            for margin, role in picked:
                name = write_margin_variant(repo, c["name"], margin)
                server.load_model(name)
                served, why = TT.served_cascade("grpc", server.grpc_url, name, c["name"], T.cascades)
                if served is None:
                    raise BenchError(f"router variant '{name}': {why}")
                if abs(served.margin - margin) > _SAME:
                    raise BenchError(f"router variant '{name}' serves margin {served.margin:g}, not {margin:g}")
                p = point_at(c["points"], margin)
                warm = _warm(server, name, texts, concurrency, warmup_s)
                measured = TT.measure_router("grpc", server.grpc_url, name, texts, concurrency=concurrency,
                                             duration_s=duration_s)
                loads += load_average()[:1]
                server.unload_model(name)
                _log(f"margin {margin:g} ({role}): {measured['throughput']:.1f} texts/s, {measured['errors']} errors")
                points.append({"margin": margin, "role": role, "escalation_rate": p["escalation_rate"], "reach": p["reach"],
                               "router": measured, "warmup": warm})
    rows = checks(points, costs, results["tune"])
    results.update(points=rows, verdict=verdict(rows), load_max_during=max(loads) if loads else None)
    write_kept_outputs(out, "tune_check", results, render_section(results), TUNE_CHECK_START, TUNE_CHECK_END)
    return results


def _warm(server: Any, model: str, texts: Sequence[str], concurrency: int, seconds: float) -> Optional[Dict[str, Any]]:
    """The untimed closed loop against ``model`` (module docstring, step 1), or None for 0 s."""
    if seconds <= 0:
        return None
    r = TT.measure_router("grpc", server.grpc_url, model, texts, concurrency=concurrency, duration_s=seconds)
    _log(f"{model} warmed: {r['requests']} requests in {seconds:g} s, {r['errors']} errors")
    return r


def command_line(args: argparse.Namespace) -> str:
    """The command as the report shows it: the options that differ from the defaults (``--out`` left out)."""
    parts = [COMMAND]
    if args.margins:
        parts += ["--margins", *(f"{m:g}" for m in args.margins)]
    for flag, value, default in (("--concurrency", args.concurrency, TT.CONCURRENCY), ("--duration", args.duration, TT.DURATION_S),
                                 ("--data", args.data, DATA), ("--target", args.target, TARGET),
                                 ("--long-texts", args.long_texts, None), ("--warmup", args.warmup, WARMUP_S)):
        if value != default:
            parts += [flag, shlex.quote(f"{value:g}" if isinstance(value, float) else str(value))]
    return " ".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line (module docstring)."""
    from lab.bench.report import add_out_argument

    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--margins", type=float, nargs="+", default=None,
                        help="the cascade margins to check (default: tune's chosen one and those escalating nearest "
                             + " and ".join(f"{s:g}" for s in SHARES) + " of the texts)")
    parser.add_argument("--concurrency", type=int, default=TT.CONCURRENCY, help="closed-loop clients (default %(default)s)")
    parser.add_argument("--duration", type=float, default=TT.DURATION_S, help="timed seconds per loop (default %(default)s)")
    parser.add_argument("--data", default=DATA, help="tune's --data (default %(default)s)")
    parser.add_argument("--target", default=TARGET, help="tune's --target (default %(default)s)")
    parser.add_argument("--long-texts", type=int, default=None, help="tune's --long-texts (default: tune's)")
    parser.add_argument("--warmup", type=float, default=WARMUP_S,
                        help="untimed seconds of closed loop against each router before it is measured (default %(default)s)")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    r = run(args.out, args.margins, args.concurrency, args.duration, args.data, args.target, args.long_texts,
            args.warmup, command=command_line(args))
    print(render_section(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
