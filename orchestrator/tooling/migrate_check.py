"""``orchestrator migrate --check URL``: the same inputs through an ensemble and the router
migrated from it, on a running server, compared output by output.

Inputs are random, drawn from the ensemble's configuration with a seed: per request one
length ``n`` in 1..4 for every variable dimension (-1) of every input, so inputs whose
variable dimensions must agree (an element-wise step) do; ``max_batch_size`` > 0 adds a
batch dimension of ``--batch-size`` rows. Values: floating point uniform in [0, 1) (so a
threshold input is a probability), integers in [0, 100), booleans, and BYTES elements of
one to six short ASCII words. BF16 inputs are not generated (numpy holds no bfloat16).

Per output the report gives whether the outputs present are the same, and for each output
dtype, shape, bytes identical and the largest absolute difference (floats and integers, as
float64; BYTES: the number of elements that differ); a request that fails on one side and
not the other is a difference; one that fails on both reports both errors (the codes may
differ where BLS cannot carry the ensemble's: docs/guides/migrate-an-ensemble.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from orchestrator.tooling.ensembles import RepoModel
from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.repository import model_config_pb2

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "good", "bad", "film", "plot", "fine")

__all__ = ["Probe", "Report", "random_inputs", "response_names"]


def _np_dtype(data_type: int):
    name = model_config_pb2.DataType.Name(data_type)[len("TYPE_"):]
    if name == "STRING":
        return np.object_
    if name == "BF16":
        raise ToolingError("a BF16 input cannot be generated with numpy; check this ensemble with your own client")
    return np.dtype({"BOOL": "bool", "FP16": "float16", "FP32": "float32", "FP64": "float64"}.get(name, name.lower()))


def _wire_dtype(data_type: int) -> str:
    name = model_config_pb2.DataType.Name(data_type)[len("TYPE_"):]
    return "BYTES" if name == "STRING" else name


def random_inputs(ensemble: RepoModel, requests: int, batch_size: Optional[int], seed: int) -> List[Dict[str, np.ndarray]]:
    """``requests`` dictionaries input name -> array for the ensemble's inputs (module
    docstring: shapes and values)."""
    rng = np.random.default_rng(seed)
    config = ensemble.config
    rows = batch_size if batch_size is not None else min(4, config.max_batch_size)
    out = []
    for _ in range(requests):
        n = int(rng.integers(1, 5))
        request = {}
        for io in config.input:
            dims = [n if d == -1 else int(d) for d in io.dims]
            shape = ([rows] if config.max_batch_size > 0 else []) + dims
            dtype = _np_dtype(io.data_type)
            if dtype is np.object_:
                flat = [" ".join(rng.choice(WORDS, int(rng.integers(1, 7)))).encode() for _ in range(int(np.prod(shape)))]
                value = np.array(flat, dtype=np.object_).reshape(shape)
            elif dtype == np.bool_:
                value = rng.integers(0, 2, shape).astype(bool)
            elif np.issubdtype(dtype, np.floating):
                value = rng.random(shape).astype(dtype)
            else:
                value = rng.integers(0, 100, shape).astype(dtype)
            request[io.name] = value
        out.append(request)
    return out


def response_names(result) -> List[str]:
    """The output names of a tritonclient result (HTTP or gRPC), in the response's order."""
    response = result.get_response()
    if isinstance(response, dict):
        return [o["name"] for o in response.get("outputs", [])]
    return [o.name for o in response.outputs]


@dataclass
class OutputStats:
    """One output over every request: identical so far, the largest difference seen."""

    identical: bool = True
    max_diff: float = 0.0
    notes: List[str] = field(default_factory=list)


@dataclass
class Report:
    """The comparison of the ensemble and the router (:meth:`text`)."""

    ensemble: str
    router: str
    requests: int = 0
    outputs: Dict[str, OutputStats] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.problems and all(s.identical for s in self.outputs.values())

    def text(self) -> str:
        lines = [f"--check: {self.requests} requests through '{self.ensemble}' and '{self.router}'"]
        for name, stats in self.outputs.items():
            verdict = "bytes identical" if stats.identical else "DIFFERENT"
            lines.append(f"  {name}: largest difference {stats.max_diff:g}, {verdict}"
                         + (f" ({'; '.join(stats.notes[:3])})" if stats.notes else ""))
        lines += [f"  {p}" for p in self.problems[:10]]
        lines.append("every output byte-identical" if self.identical else "the router's answers differ from the ensemble's")
        return "\n".join(lines)


def _compare(stats: OutputStats, a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype or a.shape != b.shape:
        stats.identical = False
        stats.notes.append(f"ensemble {a.dtype}{list(a.shape)}, router {b.dtype}{list(b.shape)}")
        return
    if a.dtype == np.object_:
        differ = int(sum(x != y for x, y in zip(a.reshape(-1), b.reshape(-1))))
        stats.max_diff = max(stats.max_diff, float(differ))
        if differ:
            stats.identical = False
        return
    if a.size:
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        stats.max_diff = max(stats.max_diff, float(np.nanmax(diff)) if not np.all(np.isnan(diff)) else 0.0)
    if a.tobytes() != b.tobytes():
        stats.identical = False


class Probe:
    """A running server with the ensemble (and, for :meth:`compare`, the router's
    repository): ``url`` host:port, ``protocol`` http or grpc."""

    def __init__(self, url: str, protocol: str, ensemble: RepoModel, requests: int = 8,
                 batch_size: Optional[int] = None, seed: int = 0):
        from orchestrator.tooling.client import client_module

        self.tc = client_module(protocol)
        self.url, self.protocol, self.ensemble = url, protocol, ensemble
        self.inputs = random_inputs(ensemble, requests, batch_size, seed)

    def _infer(self, client, model: str, request: Dict[str, np.ndarray]) -> Tuple[object, Optional[str]]:
        from tritonclient.utils import InferenceServerException, np_to_triton_dtype

        dtypes = {io.name: _wire_dtype(io.data_type) for io in self.ensemble.config.input}
        inputs = []
        for name, value in request.items():
            tensor = self.tc.InferInput(name, list(value.shape), dtypes.get(name) or np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        try:
            return client.infer(model, inputs), None
        except InferenceServerException as exc:
            return None, f"{exc.status() or ''} {exc.message()}".strip()

    def _client(self):
        try:
            client = self.tc.InferenceServerClient(self.url)
            live = client.is_server_live()
        except Exception as exc:  # connection refused, bad address: one line for the user
            raise ToolingError(f"no server at {self.url} ({self.protocol}): {exc}") from None
        if not live:
            raise ToolingError(f"the server at {self.url} is not live")
        return client

    def ensemble_order(self) -> List[str]:
        """The order of the outputs in the live ensemble's answer to the first request (all
        outputs requested); outputs it left out are placed by the rule."""
        from orchestrator.testing.mock.ensemble import response_order

        client = self._client()
        try:
            result, error = self._infer(client, self.ensemble.name, self.inputs[0])
        finally:
            client.close()
        rule = response_order([o.name for o in self.ensemble.config.output])
        if error is not None:
            raise ToolingError(f"the ensemble '{self.ensemble.name}' refused the probe: {error}")
        live = response_names(result)
        return live + [n for n in rule if n not in live]

    def compare(self, router: str) -> Report:
        """Load ``router`` where it is not ready (explicit model control), then send every
        request through the ensemble and the router and compare."""
        from tritonclient.utils import InferenceServerException

        client = self._client()
        report = Report(self.ensemble.name, router)
        try:
            if not client.is_model_ready(router):
                try:
                    client.load_model(router)
                except InferenceServerException as exc:
                    raise ToolingError(f"cannot load '{router}': {exc.message()}") from None
            for index, request in enumerate(self.inputs):
                report.requests += 1
                ens, ens_error = self._infer(client, self.ensemble.name, request)
                rtr, rtr_error = self._infer(client, router, request)
                if ens_error or rtr_error:
                    if not (ens_error and rtr_error):
                        report.problems.append(f"request {index}: ensemble {ens_error or 'answered'}; "
                                               f"router {rtr_error or 'answered'}")
                    continue
                ens_names, rtr_names = response_names(ens), response_names(rtr)
                if ens_names != rtr_names:
                    report.problems.append(f"request {index}: outputs ensemble {ens_names}, router {rtr_names}")
                for name in ens_names:
                    stats = report.outputs.setdefault(name, OutputStats())
                    if name in rtr_names:
                        _compare(stats, ens.as_numpy(name), rtr.as_numpy(name))
        finally:
            client.close()
        return report
