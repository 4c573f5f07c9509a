"""Which repository-API request brings a new stub soonest after a stub died, and what it
costs other models' traffic: ``python -m lab.soak.repairs``.

Under the shipped image's conditions (:mod:`orchestrator.tooling.production`: bytecode
compiled, a read-only copy of the repository, the restricted control plane with a key),
the ``classifier_fast`` stub is SIGKILLed ``--trials`` times per method, and the method
is sent over gRPC (as the router sends it):

- ``load``: a plain load of the loaded model;
- ``load+same-config``: a load carrying the model's loaded configuration unchanged;
- ``load+config``: a load carrying it with one parameter changed
  (``control.repair_config``, what the router sends);
- ``unload+load``: an unload, a wait until the model is not ready, a load.

Meanwhile 2 HTTP and 2 gRPC client threads send the router requests that do not need
``classifier_fast`` (``route=accurate``, 4 texts each). Reported per method, in seconds
from the kill (the method is sent 0.2 s after it): when a new stub process appeared, when
the model was ready on it (the last request returned), how long the requests took, and
the latency of the traffic sent from the kill until 0.5 s after that, against the same
traffic before any kill. A method that brings no new stub is given ``--no-stub-wait``
seconds, then the model is healed with ``load+config`` before the next trial (not
counted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from lab.soak import procs
from lab.soak.clients import Client, make_inputs
from lab.soak.report import latency_stats
from orchestrator.runtime.bls.control import repair_config

MODEL = "classifier_fast"
INSTANCE = f"{MODEL}_0_0"
METHODS = ("load", "load+same-config", "load+config", "unload+load")


class Traffic:
    """Client threads sending ``route=accurate`` requests; ``(sent, latency_s, ok)`` each."""

    def __init__(self, server, texts: List[bytes], threads_per_protocol: int = 2):
        self.server, self.texts = server, texts
        self.records: List[tuple] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(p, i), daemon=True)
                        for p in ("http", "grpc") for i in range(threads_per_protocol)]

    def _run(self, protocol: str, index: int) -> None:
        client = Client(protocol, self.server.http_url if protocol == "http" else self.server.grpc_url, 30.0)
        seq = 0
        try:
            while not self.stop.is_set():
                seq += 1
                box: dict = {}
                sent = time.monotonic()
                client.send(f"repairs-{protocol}-{index}-{seq}", make_inputs(protocol, self.texts, [0.5] * len(self.texts)),
                            {"route": "accurate"}, lambda r, t, b=box: b.update(t=t, ok=True),
                            lambda s, m, t, b=box: b.update(t=t, ok=False), lambda reason, b=box: b.update(t=time.monotonic(), ok=False))
                self.records.append((sent, box.get("t", time.monotonic()) - sent, box.get("ok", False)))
        finally:
            client.close()

    def between(self, start: float, end: float) -> dict:
        rows = [r for r in list(self.records) if start <= r[0] < end]
        return {**latency_stats([r[1] for r in rows]), "errors": sum(1 for r in rows if not r[2])}


def _grpc(server):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(server.grpc_url)


def send_method(server, method: str) -> Dict[str, float]:
    """Send ``method`` for :data:`MODEL` over gRPC with the server's key; seconds per step."""
    client = _grpc(server)
    headers = server.control_headers("grpc")
    steps: Dict[str, float] = {}
    try:
        t = time.monotonic()
        if method == "load":
            client.load_model(MODEL, headers=headers)
        elif method in ("load+same-config", "load+config"):
            config = client.get_model_config(MODEL, headers=headers, as_json=True)["config"]
            if method == "load+config":
                config = repair_config(config, str(time.time_ns()))
            steps["config_s"] = time.monotonic() - t
            t = time.monotonic()
            client.load_model(MODEL, headers=headers, config=json.dumps(config))
        else:
            client.unload_model(MODEL, headers=headers, unload_dependents=False)
            while client.is_model_ready(MODEL) and time.monotonic() - t < 60:
                time.sleep(0.01)
            steps["unload_s"] = time.monotonic() - t
            t = time.monotonic()
            client.load_model(MODEL, headers=headers)
        steps["load_s"] = time.monotonic() - t
    finally:
        client.close()
    return steps


def new_stub(server, old: int) -> Optional[int]:
    """A live stub of :data:`INSTANCE` other than ``old``, or None."""
    pid = procs.find_stub(server.pid, INSTANCE)
    return pid if pid is not None and pid != old else None


def trial(server, traffic: Traffic, method: str, no_stub_wait_s: float) -> dict:
    """Kill the stub, send ``method`` 0.2 s later (as the router would), watch for a new
    stub process meanwhile; seconds are counted from the kill."""
    old = procs.kill_stub(server.pid, INSTANCE)
    killed = time.monotonic()
    time.sleep(0.2)
    box: dict = {}
    sender = threading.Thread(target=lambda: box.update(steps=send_method(server, method)), daemon=True)
    start = time.monotonic()
    sender.start()
    started = None
    while sender.is_alive():
        if started is None and new_stub(server, old):
            started = time.monotonic() - killed
        time.sleep(0.005)
    returned = time.monotonic()
    deadline = returned + no_stub_wait_s
    while new_stub(server, old) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    up = new_stub(server, old) is not None
    if up and started is None:
        started = time.monotonic() - killed
    end = returned + 0.5
    time.sleep(max(0.0, end - time.monotonic()))
    out = {"method": method, "sent_after_kill_s": round(start - killed, 3),
           **{k: round(v, 3) for k, v in box.get("steps", {}).items()},
           "new_stub_started_after_kill_s": None if started is None else round(started, 3),
           "ready_after_kill_s": round(returned - killed, 3) if up else None}
    if not up:  # heal it for the next trial (not measured)
        send_method(server, "load+config")
    time.sleep(2.0)  # requests sent in the window have come back (a stalled one included)
    out["traffic"] = traffic.between(killed, end)
    return out


def run(trials: int = 3, no_stub_wait_s: float = 5.0, baseline_s: float = 10.0, log: Callable[[str], None] = print) -> dict:
    """Start a server under production conditions, measure every method ``trials`` times."""
    from lab.soak.runner import copy_repository
    from orchestrator.tooling import production
    from orchestrator.tooling.modeling import data
    from orchestrator.tooling.paths import default_model_repository
    from orchestrator.tooling.server import TritonServer

    with tempfile.TemporaryDirectory(prefix="repairs-") as tmp:
        repo = production.freeze(copy_repository(Path(default_model_repository()), Path(tmp) / "model_repository"))
        try:
            server = TritonServer(repo, models=["classifier", MODEL, "router"], control_key=production.new_key())
            server.start()
            try:
                texts = [t.encode() for t in data.held_out_texts(n=4, seed=11)]
                traffic = Traffic(server, texts)
                for t in traffic.threads:
                    t.start()
                time.sleep(2.0)  # warm
                t0 = time.monotonic()
                time.sleep(baseline_s)
                baseline = traffic.between(t0, time.monotonic())
                log(f"[repairs] baseline: {baseline}")
                results = []
                for method in METHODS:
                    for i in range(trials):
                        results.append(trial(server, traffic, method, no_stub_wait_s))
                        log(f"[repairs] {method} #{i + 1}: {results[-1]}")
                traffic.stop.set()
                for t in traffic.threads:
                    t.join(35)
            finally:
                server.stop()
        finally:
            production.thaw(repo)
    return {"baseline": baseline, "trials": results, "log": str(server.log_path), "load_average": os.getloadavg()}


def summary_rows(result: dict) -> List[dict]:
    """One row per method: medians and ranges of the trials."""
    rows = []
    for method in METHODS:
        ts = [t for t in result["trials"] if t["method"] == method]
        new = [t["ready_after_kill_s"] for t in ts if t["ready_after_kill_s"] is not None]
        forked = [t["new_stub_started_after_kill_s"] for t in ts if t["new_stub_started_after_kill_s"] is not None]
        p99 = [t["traffic"]["p99"] for t in ts if t["traffic"]["p99"] is not None]
        rows.append({"method": method, "trials": len(ts), "new_stub": f"{len(new)}/{len(ts)}",
                     "stub_started_after_kill_s": [min(forked), float(np.median(forked)), max(forked)] if forked else None,
                     "ready_after_kill_s": [min(new), float(np.median(new)), max(new)] if new else None,
                     "request_s": [round(min(t.get("load_s", 0) + t.get("unload_s", 0) + t.get("config_s", 0) for t in ts), 3),
                                   round(max(t.get("load_s", 0) + t.get("unload_s", 0) + t.get("config_s", 0) for t in ts), 3)],
                     "traffic_p99_ms": [min(p99), max(p99)] if p99 else None,
                     "traffic_max_ms": max((t["traffic"]["max"] or 0) for t in ts),
                     "traffic_errors": sum(t["traffic"]["errors"] for t in ts)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.soak.repairs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="kills per method (default 3)")
    parser.add_argument("--no-stub-wait", type=float, default=5.0, metavar="S",
                        help="seconds to wait for a new stub after a method that brings none (default 5)")
    parser.add_argument("--out", default=None, metavar="FILE", help="write the raw results and the summary as JSON")
    args = parser.parse_args(argv)
    result = run(args.trials, args.no_stub_wait)
    result["summary"] = summary_rows(result)
    result["command"] = " ".join(["python -m lab.soak.repairs", *(sys.argv[1:] if argv is None else argv)])
    print(f"baseline traffic (ms): {result['baseline']}")
    for row in result["summary"]:
        print(json.dumps(row))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
