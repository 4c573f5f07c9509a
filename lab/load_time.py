"""Load-to-ready time of the router, the tokenizer and the postprocess model on the embedded
Triton (explicit model control), for one or more checkouts of the code side by side.

Each round starts a fresh server per variant (a checkout: its ``orchestrator`` package first
on the stubs' ``PYTHONPATH``, its ``model_repository`` copied to a temporary directory) with
no model loaded, then loads the three models one at a time through the repository API in a
rotating order. A model's time is the duration of its load call, which returns once the
model is ready (the stub started, ``initialize`` and warmup done). Variants alternate within
a round and swap order every round, so a busy machine slows both alike. The server runs
from a temporary working directory: the stubs' ``sys.path`` starts with ``''`` (that
directory), which would otherwise put the current checkout's package ahead of the variant's. The postprocess
model imports numpy only: the floor a Python model costs here. For each load it also records
the stub's resident memory and whether it mapped libtorch (``import transformers`` does where
torch is installed).

Prints a line per load, then per variant and model the median, minimum and maximum, the
median's ratio to the postprocess model's, and the load average before and during the rounds.

Usage::

    PYTHONPATH=. python lab/load_time.py --variant before=/tmp/before --variant after=. --rounds 7

The product never imports this module.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

MODELS = ("postprocess", "tokenizer", "router")


def stub_facts(server_pid: int, model: str) -> Tuple[int, bool]:
    """(RSS bytes, libtorch mapped) of the model's first stub process; (0, False) if none."""
    from lab.soak.procs import find_stub, rss_bytes

    pid = find_stub(server_pid, f"{model}_0_0")
    if pid is None:
        return 0, False
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        maps = ""
    return int(rss_bytes(pid) or 0), "libtorch" in maps


def stub_pythonpath(root: Path) -> str:
    """The stubs' PYTHONPATH with ``root``'s package first in place of this checkout's."""
    from orchestrator.tooling.embedded import PROJECT_ROOT, find_embedded_server, server_environment

    rest = [p for p in server_environment(find_embedded_server())["PYTHONPATH"].split(os.pathsep)
            if p and Path(p).resolve() != Path(PROJECT_ROOT).resolve()]
    return os.pathsep.join([str(root), *rest])


def one_round(name: str, root: Path, repo: Path, order: List[str], log_dir: Path) -> List[dict]:
    """Start a server for variant ``name``, load ``order`` one by one, stop it; one record per load."""
    from orchestrator.tooling.server import TritonServer

    server = TritonServer(repo, models=[], env={"PYTHONPATH": stub_pythonpath(root)},
                          log_path=log_dir / f"{name}.log", startup_timeout=120)
    records = []
    with server:
        for model in order:
            load_before = os.getloadavg()[0]
            began = time.perf_counter()
            server.load_model(model)
            seconds = time.perf_counter() - began
            rss, torch = stub_facts(server.pid, model)
            records.append({"variant": name, "model": model, "seconds": seconds, "rss_mb": rss / 2**20,
                            "libtorch": torch, "load1_before": load_before, "load1_after": os.getloadavg()[0]})
    return records


def measure_loads(variants: List[Tuple[str, Path]], rounds: int, warmup_rounds: int = 1, echo: bool = True) -> List[dict]:
    """The rounds of :func:`main` for ``variants`` ``(name, checkout)``: the counted records
    (``round`` 0-based), each load printed when ``echo``. Runs in a temporary working
    directory (module docstring) and returns to the current one."""
    records: List[dict] = []
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="load_time-") as tmp:
        # The stubs' sys.path starts with '' (the server's working directory): run from a
        # directory without an orchestrator package, so each variant's PYTHONPATH decides.
        os.chdir(tmp)
        try:
            repos = {}
            for name, root in variants:
                repos[name] = Path(tmp) / name / "model_repository"
                shutil.copytree(root / "model_repository", repos[name], ignore=shutil.ignore_patterns("__pycache__"))
            for r in range(warmup_rounds + rounds):
                counted = r >= warmup_rounds
                order = list(MODELS[r % 3:] + MODELS[: r % 3])
                for name, root in (variants if r % 2 == 0 else list(reversed(variants))):
                    for rec in one_round(name, root, repos[name], order, Path(tmp)):
                        rec["round"] = r - warmup_rounds
                        if echo:
                            print(f"{'round' if counted else 'warmup'} {rec['round']:2d} {name:8} {rec['model']:12} "
                                  f"{rec['seconds']:6.2f} s  rss {rec['rss_mb']:5.0f} MB  libtorch {rec['libtorch']!s:5}  "
                                  f"load {rec['load1_before']:.2f}->{rec['load1_after']:.2f}", flush=True)
                        if counted:
                            records.append(rec)
        finally:
            os.chdir(cwd)
    return records


def summarize(records: List[dict], variants: List[str]) -> None:
    """Print per variant and model the median, min and max seconds, the ratio to
    postprocess, and each later variant's medians over the first's."""
    print("\nvariant  model         median_s  min_s   max_s   x_postprocess  rss_mb  libtorch")
    for v in variants:
        medians: Dict[str, float] = {}
        for model in MODELS:
            rows = [r for r in records if r["variant"] == v and r["model"] == model]
            secs = [r["seconds"] for r in rows]
            medians[model] = statistics.median(secs)
            ratio = medians[model] / medians["postprocess"]
            print(f"{v:8} {model:12} {medians[model]:8.2f} {min(secs):7.2f} {max(secs):7.2f} {ratio:14.2f} "
                  f"{statistics.median(r['rss_mb'] for r in rows):7.0f}  {sum(r['libtorch'] for r in rows)}/{len(rows)}")
    if len(variants) > 1:
        base = variants[0]
        for v in variants[1:]:
            for model in MODELS:
                a = statistics.median(r["seconds"] for r in records if r["variant"] == base and r["model"] == model)
                b = statistics.median(r["seconds"] for r in records if r["variant"] == v and r["model"] == model)
                print(f"{model}: {v} / {base} = {b / a:.2f}x ({b:.2f} s vs {a:.2f} s)")


def main() -> None:
    """Parse the arguments, run the rounds, print the loads and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", required=True, metavar="NAME=CHECKOUT",
                        help="a checkout whose orchestrator package and model_repository are measured")
    parser.add_argument("--rounds", type=int, default=5, help="fresh server starts per variant (default 5)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="rounds run first and not counted (page cache)")
    parser.add_argument("--json", type=Path, help="write every record here")
    args = parser.parse_args()
    variants = [(v.split("=", 1)[0], Path(v.split("=", 1)[1]).resolve()) for v in args.variant]
    load_start = os.getloadavg()
    print(f"load average before: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} (1/5/15 min), "
          f"{os.cpu_count()} CPUs")
    json_path = args.json.resolve() if args.json else None
    records = measure_loads(variants, args.rounds, args.warmup_rounds)
    during = [r["load1_after"] for r in records]
    load_end = os.getloadavg()
    print(f"\nload average (1 min) during the counted loads: median {statistics.median(during):.2f}, "
          f"min {min(during):.2f}, max {max(during):.2f}; after: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    summarize(records, [n for n, _ in variants])
    if json_path:
        json_path.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
