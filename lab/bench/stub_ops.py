"""What each ``pb_utils`` call a router makes costs inside a real Python-backend stub:
``python -m lab.bench.stub_ops [--executes 5] [--calls 200] [--json PATH]``.

Starts the embedded Triton on a temporary repository holding the shipped ``tokenizer`` and a
probe model (``stub_ops``) whose ``execute`` times, with ``time.perf_counter``, ``--calls``
repetitions of each operation on the request it was given (``is_cancelled()``,
``parameters()``, ``trace()``, ``timeout()``, ``pb_utils.Tensor`` from numpy,
``InferenceRequest``, a blocking ``exec`` of ``tokenizer``, ``InferenceResponse``, ...) and
answers the per-call means in microseconds. Prints, per operation, the median over
``--executes`` executes (one gRPC request each), and the load average before and after
(lab/bench/machine.py: above 0.5 per core the numbers say little).

Why: the in-process mock's ``pb_utils`` is Python, so it cannot show what a call that crosses
to the server costs in the stub (``is_cancelled()`` is an IPC round trip there); the router's
choices about what to ask per request rest on these numbers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from lab.bench.machine import load_average
from lab.bench.plan import REPO

CONFIG = """name: "stub_ops"
backend: "python"
max_batch_size: 64
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "calls" value: { string_value: "%d" } }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

MODEL_PY = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def mean_us(fn, n):
    began = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - began) / n * 1e6


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.n = int(config["parameters"]["calls"]["string_value"])
        self.cpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)

    def execute(self, requests):
        r, n = requests[0], self.n
        text = pb_utils.get_input_tensor_by_name(r, "TEXT")
        ids = np.arange(12, dtype=np.int64).reshape(1, 12)
        words = np.array([[b"A gorgeous, witty film."]], dtype=np.object_)
        small = np.zeros((1, 1), np.float32)
        trace = r.trace()
        call = pb_utils.InferenceRequest(model_name="tokenizer", inputs=[text], preferred_memory=self.cpu,
                                         requested_output_names=["input_ids", "attention_mask"])
        answer = call.exec()
        outputs = answer.output_tensors()
        ops = {
            "request.is_cancelled()": lambda: r.is_cancelled(),
            "request.parameters()": lambda: r.parameters(),
            "request.trace()": lambda: r.trace(),
            "request.timeout()": lambda: r.timeout(),
            "request.request_id()": lambda: r.request_id(),
            "request.requested_output_names()": lambda: r.requested_output_names(),
            "get_input_tensor_by_name": lambda: pb_utils.get_input_tensor_by_name(r, "TEXT"),
            "Tensor.as_numpy() (BYTES input)": lambda: text.as_numpy(),
            "pb_utils.Tensor (INT64 1x12)": lambda: pb_utils.Tensor("input_ids", ids),
            "pb_utils.Tensor (BYTES 1x1)": lambda: pb_utils.Tensor("TEXT", words),
            "InferenceRequest (1 input)": lambda: pb_utils.InferenceRequest(
                model_name="tokenizer", inputs=[text], requested_output_names=["input_ids", "attention_mask"],
                preferred_memory=self.cpu, trace=trace, parameters={}, request_id=""),
            "response outputs by name (2, as_numpy)": lambda: {o.name(): o.as_numpy() for o in outputs},
            "InferenceResponse (2 tensors from numpy)": lambda: pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("P", small), pb_utils.Tensor("V", small > 0)]),
        }
        out = {name: mean_us(fn, n) for name, fn in ops.items()}
        out["exec() of tokenizer (one text)"] = mean_us(lambda: call.exec(), max(1, n // 4))
        data = np.array([[json.dumps(out).encode()]], dtype=np.object_)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", data)]) for _ in requests]
'''


def make_repository(dest: Path, calls: int, repo: Path = REPO) -> Path:
    """``tokenizer`` (copied from ``repo``) and the probe model ``stub_ops`` under ``dest``."""
    shutil.copytree(repo / "tokenizer", dest / "tokenizer", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "stub_ops" / "1").mkdir(parents=True)
    (dest / "stub_ops" / "config.pbtxt").write_text(CONFIG % calls)
    (dest / "stub_ops" / "1" / "model.py").write_text(MODEL_PY)
    return dest


def run(executes: int = 5, calls: int = 200) -> Dict[str, Any]:
    """Start the server, send ``executes`` requests, return the medians (module docstring)."""
    import tritonclient.grpc as grpcclient

    from orchestrator.tooling.server import TritonServer

    before = load_average()
    samples: List[Dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="stub-ops-") as tmp:
        repo = make_repository(Path(tmp) / "model_repository", calls)
        with TritonServer(repo, models=["tokenizer", "stub_ops"]) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url.replace("grpc://", ""))
            text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[b"A gorgeous, witty film."]], dtype=np.object_))
            for _ in range(executes):
                answer = client.infer("stub_ops", [text]).as_numpy("OUT")
                samples.append(json.loads(answer.reshape(-1)[0]))
    medians = {name: round(statistics.median(s[name] for s in samples), 2) for name in samples[0]}
    return {"executes": executes, "calls": calls, "median_us": medians, "load_before": before, "load_after": load_average()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--executes", type=int, default=5, help="requests, one execute each (default 5)")
    parser.add_argument("--calls", type=int, default=200, help="repetitions of each operation per execute (default 200)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    result = run(args.executes, args.calls)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
