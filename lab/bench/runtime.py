"""The runtime before and after a change (``python -m lab.bench.instances --compare runtime
--baseline DIR``): this checkout's router beside the router of another checkout of this
project, in one embedded server, to show a restructuring left the speed unchanged.

The benchmark repository (:func:`make_runtime_repository`) gets ``router_before``: the
baseline's ``model_repository/router`` copied as it is (``config.pbtxt`` renamed, ``1/`` and
the other files kept) but with THIS checkout's policy, so both routers run the same policy;
the baseline must accept it (:func:`check_policy`, then the server's load). Each
Python-backend model instance is its own stub process, and the embedded server's stubs find
``orchestrator`` through ``PYTHONPATH`` (``orchestrator.tooling.embedded.server_environment``
puts this checkout first; a ``.pth`` in the stub environment copies it onto ``sys.path``).
So both routers' ``1/model.py`` are pinned (:func:`pinned_model_py`): the checkout's
directory first on ``sys.path`` before the model's import, then a check that
``orchestrator`` came from there (else the model refuses to load) and one line in the
server's log naming the file (:data:`PIN_MARK`), which the run reads back
(:func:`pinned_files`) and records.

``router`` (after) and ``router_before`` (before) are measured one after the other in each
round, the order alternating, at concurrency 1 and 16 (perf_analyzer, gRPC, closed loop,
one held-out text per request: ``lab.bench.instances.run``). The verdict
(:func:`verdict`) is judged on the median per-round ratio after / before of the p50 at c=1
and of the throughput at c=16, by its distribution-free 95% interval
(``lab.bench.instances.median_interval``): within :data:`UNCHANGED` -> unchanged; entirely
outside -> changed (faster or slower); else undecided, with an estimate of the rounds that
would decide it (``lab.bench.floor.first_deciding_rounds``).

Then the engine alone (:func:`engine_rounds`): ``engine_time.py`` times each checkout's own
``Engine.run`` of one short text through the shipped policy with an instant fake BLS, in a
fresh interpreter importing only that checkout, as many rounds, the order alternating: the
runtime's own CPU time per execute, judged the same way and counted in the overall verdict.

Units: throughput in inferences (texts) per second, latency in milliseconds; ratios
dimensionless.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from lab.bench.machine import QUIET_LOAD_PER_CORE
from lab.bench.measurement import failed_note
from lab.bench.plan import REPO, ROOT, BenchError

AFTER, BEFORE = "router", "router_before"
MODELS = (AFTER, BEFORE)
CONCURRENCIES = (1, 16)
#: Rounds of a full run: with 15 per-round ratios the 95% interval of their median runs from
#: the 4th to the 12th smallest (binomial, p=0.5), so an unchanged speed needs the middle
#: half of the rounds within 5%.
ROUNDS = 15
#: After / before within this band (both ends included): speed unchanged. The 5% is the
#: lab's bound for an overhead that does not matter (``SINGLE_P50_GOAL``, ``FLOOR_P50_GOAL``).
UNCHANGED = (0.95, 1.05)
#: The metric judged at each concurrency: latency alone at c=1, throughput under load at c=16.
JUDGED = {1: "p50_ms", 16: "throughput"}
#: The line a pinned model.py writes to the server's log at import.
PIN_MARK = "lab.bench.runtime pin:"
#: Where a checkout's policy module may be (this layout first, then the one before the
#: runtime was split into subpackages): :func:`check_policy` calls its ``load_policy``.
POLICY_MODULES = ("orchestrator.runtime.routing.policy", "orchestrator.runtime.policy")


# ------------------------------------------------------------------------------ the repository

def check_checkout(path: Path | str) -> Path:
    """``path`` resolved, when it is a checkout of this project (``orchestrator/__init__.py``
    and ``model_repository/router/config.pbtxt`` and ``1/model.py``); BenchError otherwise."""
    root = Path(path).expanduser().resolve()
    need = [root / "orchestrator" / "__init__.py", root / "model_repository" / "router" / "config.pbtxt",
            root / "model_repository" / "router" / "1" / "model.py"]
    missing = [str(p.relative_to(root)) for p in need if not p.is_file()]
    if missing:
        raise BenchError(f"--baseline {path}: not a checkout of this project (no {', '.join(missing)}); "
                         "make one with: git worktree add DIR COMMIT")
    return root


def pinned_model_py(source: str, checkout: Path | str, model: str) -> str:
    """``source`` (a router's ``1/model.py``) made to import ``orchestrator`` from ``checkout``:
    ``checkout`` first on ``sys.path`` before the source's first statement (after its
    docstring and ``from __future__`` imports, which must stay first; an ``orchestrator``
    already imported is an ImportError), and after the source a check that ``orchestrator``
    came from ``checkout`` (ImportError otherwise: the model does not load) and one line on
    stderr, which the server's log keeps: ``<PIN_MARK> <model> <file>``. Raises SyntaxError
    on a source that does not parse."""
    tree = ast.parse(source)
    cut = 0  # source lines kept above the prelude
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
            and isinstance(node.value.value, str)
        if not (docstring or (isinstance(node, ast.ImportFrom) and node.module == "__future__")):
            break
        cut = node.end_lineno or cut
    lines = source.splitlines(keepends=True)
    head, body = "".join(lines[:cut]), "".join(lines[cut:])
    if head and not head.endswith("\n"):
        head += "\n"
    root = repr(str(checkout))
    prelude = (
        f"# Pinned by lab.bench.runtime: orchestrator is imported from {checkout}, not from the serving checkout.\n"
        "import sys as _pin_sys\n"
        "if 'orchestrator' in _pin_sys.modules:  # already imported, from whichever checkout came first\n"
        f"    raise ImportError({model!r} + ': orchestrator was imported before its model.py could pin it')\n"
        f"_pin_sys.path.insert(0, {root})\n")
    postlude = (
        "\n# Pinned by lab.bench.runtime: where orchestrator came from, checked and logged.\n"
        "import os as _pin_os\n"
        "_pin_file = _pin_os.path.realpath(_pin_sys.modules['orchestrator'].__file__)\n"
        f"if not _pin_file.startswith(_pin_os.path.join(_pin_os.path.realpath({root}), '')):\n"
        f"    raise ImportError({model!r} + ': orchestrator came from ' + _pin_file + ', not from ' + {root})\n"
        f"print({PIN_MARK!r}, {model!r}, _pin_file, file=_pin_sys.stderr, flush=True)\n")
    if body and not body.endswith("\n"):
        body += "\n"
    return head + prelude + body + postlude


def pinned_files(log: str) -> Dict[str, str]:
    """``{model: orchestrator's __init__.py}`` from the :data:`PIN_MARK` lines of a server log
    (the last line of each model wins)."""
    pattern = re.compile(rf"^{re.escape(PIN_MARK)} (\S+) (.+)$", re.MULTILINE)
    return {m.group(1): m.group(2).strip() for m in pattern.finditer(log)}


def check_policy(checkout: Path, policy: Path) -> str:
    """Load ``policy`` with ``checkout``'s own policy module (a subprocess with ``checkout``
    first on ``sys.path``; the first of :data:`POLICY_MODULES` the checkout has); returns
    the module's name, or ``""`` when the checkout has none of them (the server's load still
    checks the policy). Raises BenchError when the checkout refuses the policy or its
    ``orchestrator`` is not the one imported."""
    module = next((m for m in POLICY_MODULES if (checkout / (m.replace(".", "/") + ".py")).is_file()), "")
    if not module:
        return ""
    script = (
        "import importlib, os, sys\n"
        "root, module, path = sys.argv[1:4]\n"
        "sys.path.insert(0, root)\n"
        "import orchestrator\n"
        "where = os.path.realpath(orchestrator.__file__)\n"
        "if not where.startswith(os.path.join(os.path.realpath(root), '')):\n"
        "    sys.exit('orchestrator was imported from ' + where)\n"
        "try:\n"
        "    importlib.import_module(module).load_policy(path)\n"
        "except Exception as exc:\n"
        "    sys.exit(type(exc).__name__ + ': ' + str(exc))\n")
    try:
        done = subprocess.run([sys.executable, "-c", script, str(checkout), module, str(policy)], cwd=checkout,
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"cannot check the policy with the baseline {checkout}: {exc}") from exc
    if done.returncode:
        detail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise BenchError(f"the baseline {checkout} refuses this checkout's policy {policy.name} "
                         f"({module}.load_policy): {detail}")
    return module


def _policy_name(model_dir: Path, where: str) -> str:
    from orchestrator.tooling.errors import ConfigError
    from orchestrator.tooling.repository import get_parameter, read_config

    try:
        name = get_parameter(read_config(model_dir / "config.pbtxt"), "policy")
    except ConfigError as exc:
        raise BenchError(f"{where}: {exc}") from exc
    if not name:
        raise BenchError(f"{where}: {model_dir / 'config.pbtxt'} has no 'policy' parameter")
    return name


def make_runtime_repository(dest: Path, baseline: Path | str, repo: Path = REPO, check: bool = True) -> Path:
    """The benchmark repository (``make bench``'s copy of ``repo``, no variants) with
    ``router_before`` (module docstring) from the checkout ``baseline``, both routers'
    ``model.py`` pinned to their checkouts (``router``: :data:`ROOT`); written to ``dest``.
    ``check``: the baseline loads the policy first (:func:`check_policy`). Returns ``dest``.
    Raises BenchError (not a checkout, no policy parameter, a policy the baseline refuses)."""
    from lab.bench.variants import make_bench_repository
    from orchestrator.tooling.errors import ConfigError
    from orchestrator.tooling.repository import copy_model

    base = check_checkout(baseline)
    out = make_bench_repository(dest, repo, variants={})
    source = base / "model_repository" / "router"
    target = out / BEFORE
    try:
        copy_model(source, target, [f"Benchmark model {BEFORE}: the router of the baseline checkout {base} "
                                    "(lab.bench.runtime), with this checkout's policy."])
    except ConfigError as exc:
        raise BenchError(f"{BEFORE} from {source}: {exc}") from exc
    mine = out / AFTER / _policy_name(out / AFTER, AFTER)
    theirs = target / _policy_name(target, f"{BEFORE} (baseline {base})")
    shutil.copyfile(mine, theirs)
    if check:
        check_policy(base, theirs)
    for model, checkout in ((AFTER, ROOT), (BEFORE, base)):
        path = out / model / "1" / "model.py"
        path.write_text(pinned_model_py(path.read_text(), checkout, model))
    return out


# ------------------------------------------------------------------------------ the verdict

def verdict(values: Sequence[float], higher_is_faster: bool,
            band: Tuple[float, float] = UNCHANGED) -> Dict[str, Any]:
    """The verdict on per-round ratios after / before ``values`` (``higher_is_faster``: a
    throughput ratio; else a latency ratio): ``{"n", "median", "low", "high", "verdict",
    "direction", "rounds_needed"}``. ``low``..``high``: the median's distribution-free 95%
    interval (None under 6 values). ``unchanged``: the interval within ``band``;
    ``changed``: entirely outside it, ``direction`` ``faster`` or ``slower``;
    ``undecided`` otherwise (also without an interval), with ``rounds_needed``: the rounds
    whose interval at this run's spread would lie within or entirely outside the band
    (None: none up to 400)."""
    from lab.bench.floor import first_deciding_rounds
    from lab.bench.instances import median_interval, rounded_interval

    lo_band, hi_band = band
    clean = rounded_interval(median_interval(values))
    out: Dict[str, Any] = {"n": len(values), "median": clean[0], "low": clean[1], "high": clean[2],
                           "verdict": "undecided", "direction": None, "rounds_needed": None}
    low, high = clean[1], clean[2]
    if low is not None and high is not None and lo_band <= low and high <= hi_band:
        out["verdict"] = "unchanged"
    elif low is not None and high is not None and (high < lo_band or low > hi_band):
        out["verdict"] = "changed"
        out["direction"] = "faster" if (low > hi_band) == higher_is_faster else "slower"
    else:
        out["rounds_needed"] = first_deciding_rounds(
            values, lambda a, b: (lo_band <= a and b <= hi_band) or b < lo_band or a > hi_band)
    return out


def overall(decisions: Sequence[Mapping[str, Any]]) -> str:
    """``changed`` when any decision is, ``unchanged`` when all are (and there is one),
    else ``undecided``."""
    kinds = [d["verdict"] for d in decisions]
    if "changed" in kinds:
        return "changed"
    return "unchanged" if kinds and all(k == "unchanged" for k in kinds) else "undecided"


def runtime_summary(measurements: Sequence[Mapping[str, Any]], engine: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Per concurrency (string key): each model's medians over the rounds (``throughput``,
    ``p50_ms``, ``p99_ms``, ``rounds``) and, per metric, the per-round ratios after / before
    (``per_round``, round order) with their :func:`verdict`; ``judged``: the metric of
    :data:`JUDGED`. ``overall``: :func:`overall` of the judged verdicts and of ``engine``'s
    (:func:`engine_rounds`), if given. Failed measurements (``error``) are left out."""
    from lab.bench.floor import pair_ratios

    ok = [m for m in measurements if not m.get("error")]
    out: Dict[str, Any] = {"concurrency": {}}
    judged = []
    for c in sorted({int(m["concurrency"]) for m in ok}):
        cell: Dict[str, Any] = {"models": {}, "ratios": {}, "judged": JUDGED.get(c)}
        for model in MODELS:
            mine = [m for m in ok if m["model"] == model and int(m["concurrency"]) == c]
            if mine:
                cell["models"][model] = {k: round(statistics.median(float(m[k]) for m in mine), 2)
                                         for k in ("throughput", "p50_ms", "p99_ms")}
                cell["models"][model]["rounds"] = len(mine)
        for key in ("throughput", "p50_ms"):
            values = pair_ratios(ok, AFTER, BEFORE, c, key)
            cell["ratios"][key] = {**verdict(values, higher_is_faster=key == "throughput"),
                                   "per_round": [round(v, 3) for v in values]}
        if cell["judged"]:
            judged.append(cell["ratios"][cell["judged"]])
        out["concurrency"][str(c)] = cell
    out["overall"] = overall(judged + ([engine] if engine else []))
    return out


# ------------------------------------------------------------------------------ the engine alone

#: ``Engine.run`` calls per engine measurement (their median is the round's figure).
ENGINE_RUNS = 3000
ENGINE_SCRIPT = Path(__file__).with_name("engine_time.py")


def engine_time(checkout: Path | str, runs: int = ENGINE_RUNS) -> Dict[str, Any]:
    """``{"median_us", "runs", "orchestrator"}``: ``engine_time.py`` on ``checkout`` in a fresh
    interpreter whose ``PYTHONPATH`` is ``checkout`` alone (microseconds per ``Engine.run`` of
    one short text, instant fake BLS); BenchError when it fails."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    try:
        done = subprocess.run([sys.executable, str(ENGINE_SCRIPT), str(checkout), str(runs)], capture_output=True,
                              text=True, env=env, cwd=str(checkout), timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"engine_time.py on {checkout}: no answer in {exc.timeout:.0f} s") from None
    if done.returncode != 0:
        raise BenchError(f"engine_time.py on {checkout} failed: {(done.stderr or done.stdout).strip()[-400:]}")
    out: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def engine_rounds(after: Path | str, before: Path | str, rounds: int, runs: int = ENGINE_RUNS) -> Dict[str, Any]:
    """The engine alone, after beside before: per round one :func:`engine_time` of each (the
    order alternating), ``{"runs", "rounds": [{"after_us", "before_us"}], "per_round"}`` (the
    ratios after / before, round order) and the :func:`verdict` of those ratios (a ratio over
    1 is slower)."""
    rows = []
    for r in range(rounds):
        pair = [(AFTER, after), (BEFORE, before)]
        got = {name: engine_time(path, runs)["median_us"] for name, path in (pair if r % 2 == 0 else pair[::-1])}
        rows.append({"after_us": got[AFTER], "before_us": got[BEFORE]})
    ratios = [row["after_us"] / row["before_us"] for row in rows]
    return {"runs": runs, "rounds": rows, "per_round": [round(v, 3) for v in ratios],
            **verdict(ratios, higher_is_faster=False)}


# ------------------------------------------------------------------------------ git and the section

def checkout_commit(path: Path | str) -> Dict[str, Any]:
    """``{"path", "commit", "dirty"}`` of a checkout: ``git rev-parse HEAD`` and whether
    tracked files differ from it (None for both when git cannot tell)."""
    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"path": str(path), "commit": commit, "dirty": None if status is None else bool(status)}


def _commit(c: Mapping[str, Any]) -> str:
    if not c.get("commit"):
        return f"`{c['path']}` (commit unknown: not a git checkout)"
    return f"`{c['path']}` at commit `{c['commit']}`" + (" **with uncommitted changes**" if c.get("dirty") else "")


_METRIC = {"throughput": "throughput", "p50_ms": "p50"}


def _decision(d: Mapping[str, Any]) -> str:
    if d["verdict"] == "changed":
        return f"**changed: {d['direction']}**"
    if d["verdict"] == "unchanged":
        return "**unchanged**"
    if d.get("rounds_needed"):
        more = f"; about {d['rounds_needed']} rounds would decide it at this run's spread"
    elif d.get("n", 0) < 2:
        more = "; under 2 rounds there is no spread to tell how many would decide it"
    else:
        more = "; no number of rounds up to 400 would at this run's spread"
    return f"**undecided**{more}"


def render_section(r: Mapping[str, Any]) -> str:
    """The ``benchmarks.md`` section of one runtime run ``r`` (pure)."""
    from lab.bench.report import RUNTIME_END, RUNTIME_START
    from lab.bench.stack import header_line

    s, co = r["summary"], r["checkouts"]
    lo, hi = UNCHANGED
    L = [RUNTIME_START, "## The runtime before and after: this checkout's router beside a baseline's", "",
         f"One run of `{r['command']}` at {r['started_utc']} UTC on {r['machine']['cores']} cores "
         f"({r['machine']['cpu_model']}), 1-minute load average {r['load_before']} before, highest "
         f"{r['load_max_during']} during (that counts the server and perf_analyzer themselves, which keep every core "
         f"busy, so it cannot show other work), {r['rounds']} rounds; raw figures in `bench/runtime.json`.", "",
         header_line(r.get("stack"))]
    if r.get("quick"):
        L += ["", "> **`--quick` run**: one round, short windows; a smoke test, not a benchmark."]
    cores = r["machine"].get("cores") or 0
    before = (r.get("load_before") or [None])[0]
    if before is not None and cores and before > QUIET_LOAD_PER_CORE * cores:
        L += ["", f"> Other work was running when the run began: a 1-minute load of {before} on {cores} cores (the "
                  f"level this report flags: over {QUIET_LOAD_PER_CORE:g} per core). Ratios from a shared machine can mislead; "
                  "re-run on a quiet one."]
    files = r.get("orchestrator_files") or {}
    L += ["", f"- after, `{AFTER}`: this checkout, {_commit(co['after'])}; its stub imported `orchestrator` from "
              f"`{files.get(AFTER, 'n/a')}`.",
          f"- before, `{BEFORE}`: the baseline, {_commit(co['before'])}; its stub imported `orchestrator` from "
          f"`{files.get(BEFORE, 'n/a')}`. Its `config.pbtxt` (renamed) and `1/` as the baseline has them, this "
          "checkout's policy.",
          "", "perf_analyzer (gRPC), closed loop, one held-out text per request; in each round the two routers one "
          "after the other, the order alternating; medians over the rounds.", "",
          "| concurrency | model | throughput, infer/s | p50, ms | p99, ms |", "|---|---|---|---|---|"]
    for c, cell in s["concurrency"].items():
        for model, x in cell["models"].items():
            L.append(f"| {c} | `{model}` | {x['throughput']} | {x['p50_ms']} | {x['p99_ms']} |")
    L += ["", "| concurrency | after / before | median of per-round ratios | 95% interval | verdict |", "|---|---|---|---|---|"]
    for c, cell in s["concurrency"].items():
        key = cell.get("judged")
        if not key:
            continue
        d = cell["ratios"][key]
        iv = f"{d['low']}x to {d['high']}x" if d.get("low") is not None else "none (under 6 rounds)"
        med = "n/a" if d.get("median") is None else f"{d['median']}x"
        L.append(f"| {c} | {_METRIC[key]} | {med} | {iv} | {_decision(d)} |")
    L += ["", {"unchanged": "**Speed unchanged** by this run.",
               "changed": "**Speed changed** by this run (table above).",
               "undecided": "**Not decided** by this run: more rounds, or a quieter machine."}[s["overall"]],
          "", f"Verdict: the distribution-free 95% interval of the median per-round ratio (`scipy.stats.quantile_test`) "
              f"within [{lo}, {hi}]: unchanged; entirely outside it: changed (p50: a ratio over 1 is slower; "
              "throughput: over 1 is faster); otherwise undecided. Rounds needed: the interval's ends read as this "
              "run's quantiles for a larger number of rounds (an estimate that assumes this run's spread)."]
    engine = r.get("engine")
    if engine:
        med = lambda key: round(statistics.median(row[key] for row in engine["rounds"]), 1)  # noqa: E731
        iv = f"{engine['low']}x to {engine['high']}x" if engine.get("low") is not None else "none (under 6 rounds)"
        L += ["", f"The engine alone (`lab/bench/engine_time.py`: `Engine.run` of one short text through the shipped "
                  f"policy, an instant fake BLS, the router's metrics; no server, no model; the median of {engine['runs']} "
                  f"runs per checkout and round, {len(engine['rounds'])} rounds, the order alternating): after "
                  f"{med('after_us')} us, before {med('before_us')} us.", "",
              "| measure | median of per-round ratios | 95% interval | verdict |", "|---|---|---|---|",
              f"| engine time after / before | {engine['median']}x | {iv} | {_decision(engine)} |", "",
              "Per-round ratios of the engine alone: " + ", ".join(map(str, engine["per_round"])) + "."]
    rounds = [f"c={c} {_METRIC[k]} {', '.join(map(str, cell['ratios'][k]['per_round']))}"
              for c, cell in s["concurrency"].items() for k in ("p50_ms", "throughput")]
    if rounds:
        L += ["", "Per-round ratios after / before, in round order: " + "; ".join(rounds) + "."]
    L += [*failed_note(r["measurements"]), "", RUNTIME_END]
    return "\n".join(L)


def served_from(log: str, baseline: Path) -> Dict[str, str]:
    """:func:`pinned_files` of the server's log, checked: both routers logged theirs and
    ``router_before``'s lies under ``baseline``; BenchError otherwise."""
    files = pinned_files(log)
    missing = [m for m in MODELS if m not in files]
    if missing:
        raise BenchError(f"the server's log has no {PIN_MARK!r} line of {', '.join(missing)}: "
                         "cannot tell which orchestrator it imported")
    if not Path(files[BEFORE]).resolve().is_relative_to(Path(baseline).resolve()):
        raise BenchError(f"{BEFORE} imported orchestrator from {files[BEFORE]}, not from the baseline {baseline}")
    return files


def prepare(baseline: Path | str) -> Tuple[Path, Dict[str, Any]]:
    """The baseline checkout resolved and both checkouts' commits (``{"after", "before"}``)."""
    base = check_checkout(baseline)
    return base, {"after": checkout_commit(ROOT), "before": checkout_commit(base)}

