"""The cost of the front door's stream layer (the per-address connection cap): the same calls
through two doors in front of one embedded server, one rendered as shipped (a stream server on
the public port, the HTTP side behind a unix socket with the PROXY protocol) and one with
``stream=False`` (the HTTP side on the port itself), interleaved round by round.

    python -m lab.frontdoor_hop [--rounds 5] [--calls 40]

Prints, per call kind, the median latency in milliseconds through each door and the ratio
(stream / plain); a kind's figure is the median over rounds of each round's median. Kinds:
``live`` (HTTP ``/v2/health/live``: the proxying alone), ``infer`` (HTTP router call, one
short text), ``body_1mb`` (an HTTP router call whose JSON body is about 1 MiB and names an input the
router does not have: Triton reads the whole body and answers 400, so the figure is the
body's way through the door and Triton's parse, not the model), ``grpc`` (gRPC ``ModelInfer`` of the router, one short text, one HTTP/2
connection). Each call is sequential (concurrency 1), so the figures are latencies, not
throughput. On a loaded machine the ratio is indicative only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.error
import urllib.request
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from orchestrator.tooling import frontdoor as F
from orchestrator.tooling import frontdoor_nginx as N
from orchestrator.tooling.deploy import always_on_models
from orchestrator.tooling.server import TritonServer, find_free_ports

KINDS = ("live", "infer", "body_1mb", "grpc")


def _body(texts: Sequence[str]) -> bytes:
    return json.dumps({"inputs": [
        {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": list(texts)},
        {"name": "THRESHOLD", "shape": [len(texts), 1], "datatype": "FP32", "data": [0.5] * len(texts)},
    ]}).encode()


def _calls(door: N.FrontDoor) -> Dict[str, Callable[[], None]]:
    import tritonclient.grpc as grpcclient

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    base = f"http://127.0.0.1:{door.ports.http}"
    small = _body(["great hotel, lovely staff"])
    large = json.dumps({"inputs": [{"name": "NOT_AN_INPUT", "shape": [1, 1], "datatype": "BYTES", "data": ["x" * 2**20]}]}).encode()

    def post(body: bytes, status: int = 200) -> Callable[[], None]:
        def call() -> None:
            request = urllib.request.Request(f"{base}/v2/models/router/infer", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with opener.open(request, timeout=60) as resp:
                    resp.read()
                    got = resp.status
            except urllib.error.HTTPError as exc:
                exc.read()
                got = exc.code
            if got != status:
                raise RuntimeError(f"HTTP {got}, expected {status}")
        return call

    def live() -> None:
        with opener.open(f"{base}/v2/health/live", timeout=60) as resp:
            resp.read()

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{door.ports.grpc}", channel_args=[("grpc.enable_http_proxy", 0)])
    text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"great hotel, lovely staff"]], dtype=object))
    threshold = grpcclient.InferInput("THRESHOLD", [1, 1], "FP32")
    threshold.set_data_from_numpy(np.array([[0.5]], dtype=np.float32))

    def grpc() -> None:
        client.infer("router", [text, threshold])

    return {"live": live, "infer": post(small), "body_1mb": post(large, 400), "grpc": grpc}


def _median_ms(call: Callable[[], None], n: int) -> float:
    times: List[float] = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.frontdoor_hop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40, help="calls of each kind per door per round")
    args = parser.parse_args(argv)
    if not F.nginx_ready():
        print(f"nginx or its modules are not installed: {F.INSTALL_HINT}")
        return 1
    t_http, t_grpc, t_metrics = find_free_ports(3)
    server = TritonServer(F.MODEL_REPOSITORY, models=always_on_models(F.MODEL_REPOSITORY, F.ROUTERS), http_port=t_http,
                          grpc_port=t_grpc, metrics_port=t_metrics)
    quotas = F.Quotas("x-client-id", F.Quota(100000, 100000))
    doors: Dict[str, N.FrontDoor] = {}
    try:
        server.start()
        limits = F.body_limits()
        for name, stream in (("stream", True), ("plain", False)):
            ports = F.Ports("127.0.0.1", *find_free_ports(3), t_http, t_grpc, t_metrics)
            doors[name] = N.FrontDoor(F.render(quotas, limits, ports, stream=stream), ports).start()
        calls = {name: _calls(door) for name, door in doors.items()}
        for name in doors:  # warm up: connections, the router's first calls
            for kind in KINDS:
                _median_ms(calls[name][kind], 5)
        rounds: Dict[str, Dict[str, List[float]]] = {name: {k: [] for k in KINDS} for name in doors}
        for r in range(args.rounds):
            order = list(doors) if r % 2 == 0 else list(doors)[::-1]
            for kind in KINDS:
                for name in order:
                    rounds[name][kind].append(_median_ms(calls[name][kind], args.calls))
    finally:
        for door in doors.values():
            door.stop()
        server.stop()
    print(f"{'kind':<10} {'stream ms':>10} {'plain ms':>10} {'ratio':>6}   ({args.rounds} rounds x {args.calls} calls, c=1)")
    for kind in KINDS:
        s, p = statistics.median(rounds["stream"][kind]), statistics.median(rounds["plain"][kind])
        print(f"{kind:<10} {s:>10.2f} {p:>10.2f} {s / p:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
