"""How long one ``MockTriton.infer`` of python_backend's add_sub example takes (the point of
the mock: a test suite of hundreds of model calls in seconds). Run on a quiet machine::

    ORCHESTRATOR_PYTHON_BACKEND_SRC=<python_backend checkout> python -m lab.bench.mock_infer [--n 5000]

Prints the median, p90 and p99 in microseconds of ``n`` calls after 200 warm-up calls, and
the load average per core before the run (lab/bench/machine.py's rule: above 0.5 the number
says little).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from orchestrator.testing.mock import MockTriton


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5000, help="timed calls (default 5000)")
    args = parser.parse_args()
    source = os.environ.get("ORCHESTRATOR_PYTHON_BACKEND_SRC", "")
    examples = Path(source) / "examples" / "add_sub"
    if not examples.is_dir():
        raise SystemExit("set ORCHESTRATOR_PYTHON_BACKEND_SRC to a python_backend checkout (examples/add_sub)")
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "add_sub"
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_bytes((examples / "config.pbtxt").read_bytes())
        (model / "1" / "model.py").write_bytes((examples / "model.py").read_bytes())
        inputs = {"INPUT0": np.float32([1, 2, 3, 4]), "INPUT1": np.float32([4, 3, 2, 1])}
        with MockTriton(tmp, model_config_name=None, models=["add_sub"]) as mock:
            for _ in range(200):
                mock.infer("add_sub", inputs)
            times = []
            for _ in range(args.n):
                start = time.perf_counter()
                mock.infer("add_sub", inputs)
                times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    print(f"add_sub through MockTriton.infer, {args.n} calls: median {statistics.median(times):.0f} us, "
          f"p90 {times[int(0.9 * len(times))]:.0f} us, p99 {times[int(0.99 * len(times))]:.0f} us "
          f"(load per core before: {load:.2f})")


if __name__ == "__main__":
    main()
