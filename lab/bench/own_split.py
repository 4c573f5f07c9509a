"""Where the router's extra time at c=1 goes on a real server, beside the hand-written BLS
model: ``python -m lab.bench.own_split [--rounds 20] [--requests 400] [--json PATH]``.

``make bench-floor`` reads, from Triton's statistics, a model's *own* time per request: its
``execute`` (``compute_infer``) less all of the classifier's time spent on its BLS calls.
This splits that own time further, on the embedded server, for ``router_single`` and
``hand_bls`` (:data:`MODELS`, from the floor's benchmark repository), by serving a timed copy
of each (:func:`add_timed_copy`: the model's own ``model.py`` loaded unchanged, its
``execute`` and the BLS ``exec`` timed with ``time.perf_counter_ns`` inside the stub):

* ``python_us``: the model's Python inside ``execute``, less the time inside its BLS ``exec``
  calls (what the in-process profile, ``lab.bench.execute_profile``, calls own time);
* ``bls_overhead_us``: the time inside ``exec`` less the classifier's time (queue to output)
  as the server counts it: the BLS request and response crossing between the processes;
* ``outside_python_us``: ``compute_infer`` less the Python ``execute``: the stub's handing of
  the request in and the responses out (C++ and shared memory);
* ``classifier_us``: the classifier's time per request (queue to output) on the BLS call;
* ``execute_us``: ``compute_infer`` per request.

One request of one held-out-like text at a time (tritonclient gRPC, :data:`TEXTS` in turn),
``--requests`` per model per round, the two models alternating first and second each round.
Per round each figure's difference (``router_single`` less ``hand_bls``), and its median
with the distribution-free 95% interval over the rounds (:func:`summarize`). Units:
microseconds per request.

The timed copies cost each execute two ``perf_counter_ns`` pairs and, every
:data:`DUMP_EVERY` executes, one small file written after the timed part (the driver reads
the sums only at those boundaries). They are copies: ``make bench-floor``'s goals are read on
the models as they ship.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from lab.bench.floor import make_floor_repository, server_split, server_stats
from lab.bench.machine import load_average

MODELS = ("router_single", "hand_bls")
DOWNSTREAM = "classifier"
SUFFIX = "_timed"
#: The timed copy writes its sums every this many executes.
DUMP_EVERY = 100
TIMINGS = "timings.json"
TEXTS = ("A gorgeous, witty film.", "The plot is dull and the acting worse than that.", "fine",
         "I did not expect to like it, but by the end I was won over completely.")
FIGURES = ("execute_us", "python_us", "bls_overhead_us", "outside_python_us", "classifier_us")

#: The timed copy's model.py: the original, beside it as ``_timed_original.py``, subclassed.
TIMED_MODEL = '''"""A timed copy (lab.bench.own_split): the model beside this file, its execute and BLS exec timed."""

import importlib.util
import json
import os
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

_spec = importlib.util.spec_from_file_location("_timed_original", Path(__file__).with_name("_timed_original.py"))
_original = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_original)

SUMS = {"executes": 0, "execute_ns": 0, "bls_ns": 0, "bls_calls": 0}
DUMP_EVERY = %(every)d


def _timed(exec_):
    def timed_exec(self, *args, **kwargs):
        began = time.perf_counter_ns()
        try:
            return exec_(self, *args, **kwargs)
        finally:
            SUMS["bls_ns"] += time.perf_counter_ns() - began
            SUMS["bls_calls"] += 1
    return timed_exec


class TritonPythonModel(_original.TritonPythonModel):
    def initialize(self, args):
        # the stub adds InferenceRequest to the module after model.py is imported
        if not getattr(pb_utils.InferenceRequest.exec, "_timed", False):
            pb_utils.InferenceRequest.exec = _timed(pb_utils.InferenceRequest.exec)
            pb_utils.InferenceRequest.exec._timed = True
        self._timings = Path(args["model_repository"]) / %(file)r
        return super().initialize(args)

    def execute(self, requests):
        began = time.perf_counter_ns()
        responses = super().execute(requests)
        SUMS["execute_ns"] += time.perf_counter_ns() - began
        SUMS["executes"] += 1
        if SUMS["executes"] %% DUMP_EVERY == 0:
            tmp = self._timings.with_suffix(".tmp")
            tmp.write_text(json.dumps(SUMS))
            os.replace(tmp, self._timings)
        return responses
'''


def add_timed_copy(repo: Path, model: str) -> str:
    """Add ``<model>_timed`` to ``repo``: a copy of ``model`` (named in its configs) whose
    ``model.py`` is :data:`TIMED_MODEL` over the original (kept as ``_timed_original.py``).
    Returns the copy's name. Raises FileNotFoundError when ``model`` has no ``1/model.py``."""
    from orchestrator.tooling.repository import copy_model

    name = model + SUFFIX
    copy_model(repo / model, repo / name, [f"Timed copy of {model} (lab.bench.own_split)."])
    code = repo / name / "1" / "model.py"
    code.rename(code.with_name("_timed_original.py"))
    code.write_text(TIMED_MODEL % {"every": DUMP_EVERY, "file": TIMINGS})
    return name


def split(stats0: Mapping[str, Mapping[str, int]], stats1: Mapping[str, Mapping[str, int]],
          sums0: Mapping[str, int], sums1: Mapping[str, int], model: str) -> Dict[str, float]:
    """The figures (:data:`FIGURES`, microseconds per request) of ``model``'s timed copy
    between two snapshots of the server's statistics (``lab.bench.floor.server_stats``, with
    :data:`DOWNSTREAM`; ``execute_us`` and ``classifier_us`` as ``lab.bench.floor.server_split``
    counts them) and of the copy's sums. Raises ValueError when the server counted
    another number of requests than the copy executed (one request an execute at c=1)."""
    n = stats1[model]["count"] - stats0[model]["count"]
    executes = sums1["executes"] - sums0["executes"]
    server = server_split(stats0, stats1, model, DOWNSTREAM)
    if server is None or executes != n:
        raise ValueError(f"{model}: the server counted {n} requests, the timed copy {executes} executes")
    execute, down = server["execute_us"], server["downstream_us"]
    python_execute = (sums1["execute_ns"] - sums0["execute_ns"]) / n / 1e3
    bls = (sums1["bls_ns"] - sums0["bls_ns"]) / n / 1e3
    return {"execute_us": execute, "python_us": python_execute - bls, "bls_overhead_us": bls - down,
            "outside_python_us": execute - python_execute, "classifier_us": down}


def summarize(rounds: Sequence[Mapping[str, Mapping[str, float]]], models: Sequence[str] = MODELS) -> Dict[str, Any]:
    """Per model the median of each figure over ``rounds`` (each ``{model: split(...)}``),
    and per figure the per-round difference ``models[0]`` less ``models[1]`` with its median
    and distribution-free 95% interval (None ends: too few rounds)."""
    from lab.bench.instances import median_interval, rounded_interval

    a, b = models
    out: Dict[str, Any] = {"rounds": len(rounds), "models": {}, "difference": {}}
    for m in models:
        out["models"][m] = {f: round(statistics.median(r[m][f] for r in rounds), 1) for f in FIGURES}
    for f in FIGURES:
        diffs = [r[a][f] - r[b][f] for r in rounds]
        _, low, high = rounded_interval(median_interval(diffs), 1)
        out["difference"][f] = {"median": round(statistics.median(diffs), 1), "low": low, "high": high,
                                "per_round": [round(d, 1) for d in diffs]}
    return out


def render(summary: Mapping[str, Any], models: Sequence[str] = MODELS) -> List[str]:
    """The summary as a markdown table (microseconds per request), pure."""
    a, b = models
    names = {"execute_us": "`execute` (`compute_infer`)", "python_us": "Python in `execute`, less the BLS `exec`",
             "bls_overhead_us": "BLS `exec` less the classifier's time", "outside_python_us": "the stub around `execute`",
             "classifier_us": "the classifier (queue to output)"}
    lines = [f"| per request, us (medians of {summary['rounds']} rounds) | `{a}` | `{b}` | difference (95% interval) |",
             "|---|---:|---:|---|"]
    for f in FIGURES:
        d = summary["difference"][f]
        span = f"{d['low']} to {d['high']}" if d["low"] is not None else "too few rounds"
        lines.append(f"| {names[f]} | {summary['models'][a][f]} | {summary['models'][b][f]} | {d['median']} ({span}) |")
    return lines


def measure(rounds: int, requests: int, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Serve the timed copies on the embedded server and measure ``rounds`` rounds (module
    docstring). Returns the report (``summary`` and the per-round ``splits``)."""
    import tritonclient.grpc as grpcclient

    from orchestrator.tooling.client import text_inputs
    from orchestrator.tooling.server import TritonServer

    with tempfile.TemporaryDirectory() as tmp:
        repo = make_floor_repository(Path(tmp) / "model_repository")
        timed = {m: add_timed_copy(repo, m) for m in MODELS}
        files = {m: repo / t / TIMINGS for m, t in timed.items()}
        report: Dict[str, Any] = {"load_before": load_average(), "rounds": rounds, "requests": requests}
        with TritonServer(repo, models=["tokenizer", DOWNSTREAM, *timed.values()]) as server:
            url = server.grpc_url.replace("grpc://", "")
            client = grpcclient.InferenceServerClient(url)

            def one(name: str, k: int) -> None:
                client.infer(name, text_inputs(grpcclient, [TEXTS[k % len(TEXTS)]]))

            def sums(m: str) -> Dict[str, int]:
                return dict(json.loads(files[m].read_text()))

            per_round = requests - requests % DUMP_EVERY or DUMP_EVERY
            for m, name in timed.items():  # warm up, then stop on a dump: the sums read are then exact
                for k in range(2 * DUMP_EVERY):
                    one(name, k)
                last, k = sums(m)["executes"], 0
                while sums(m)["executes"] == last:
                    one(name, k)
                    k += 1
                    if k > DUMP_EVERY:
                        raise RuntimeError(f"{name}: the timed copy wrote no sums in {DUMP_EVERY} executes")
            splits: List[Dict[str, Dict[str, float]]] = []
            for r in range(rounds):
                row = {}
                for m in (MODELS if r % 2 == 0 else MODELS[::-1]):
                    name = timed[m]
                    s0, t0 = server_stats(url, [name, DOWNSTREAM]), sums(m)
                    for k in range(per_round):
                        one(name, k)
                    time.sleep(0.05)  # the last statistics update
                    s1, t1 = server_stats(url, [name, DOWNSTREAM]), sums(m)
                    row[m] = split({m: s0[name], DOWNSTREAM: s0[DOWNSTREAM]}, {m: s1[name], DOWNSTREAM: s1[DOWNSTREAM]}, t0, t1, m)
                splits.append(row)
                log(f"round {r + 1}/{rounds}: " + ", ".join(f"{m} python {row[m]['python_us']:.0f} us" for m in MODELS))
            client.close()
        report["load_after"] = load_average()
    report["summary"] = summarize(splits)
    report["splits"] = [{m: {f: round(v, 1) for f, v in row[m].items()} for m in MODELS} for row in splits]
    return report


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--requests", type=int, default=400, help="per model per round (a multiple of %d)" % DUMP_EVERY)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    report = measure(args.rounds, args.requests, log=lambda s: print(s, file=sys.stderr))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(render(report["summary"])))
    return report


if __name__ == "__main__":
    main()
