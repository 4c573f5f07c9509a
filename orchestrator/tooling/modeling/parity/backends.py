"""Where parity's logits come from: onnxruntime in this process, or a Triton server."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.modeling.contract import num_cores, ort_session
from orchestrator.tooling.modeling.parity.labeled import ParityError
from orchestrator.tooling.repository import get_parameter, read_config

BATCH_SIZE = 64  # max_batch_size of the repository's models


def onnx_file(model_dir: Path) -> Path:
    """``1/<onnx_file>``: the ``onnx_file`` parameter of ``configs/embedded.pbtxt`` (the
    Python-backend config that names the file), default ``model.onnx``. Raises
    :class:`ParityError` when that config is invalid."""
    cfg = model_dir / "configs" / "embedded.pbtxt"
    name = None
    if cfg.is_file():
        try:
            name = get_parameter(read_config(cfg), "onnx_file")
        except ConfigError as e:
            raise ParityError(str(e)) from None
    return model_dir / "1" / (name or "model.onnx")


class InProcessBackend:
    """The tokenizer files and ONNX models of ``repo`` run in this process (CPU).

    ``encode(texts)``: int64 ``(input_ids, attention_mask)`` [n, L] like the ``tokenizer``
    model (the files of ``<repo>/<tokenizer>/1``: the tokenizer model the models' heads name) (truncation to ``model_max_length``, padding to the longest text). ``run(model,
    ids, mask)``: float32 logits [n, K]. onnxruntime ``CPUExecutionProvider``,
    ``intra_op_num_threads`` = ``threads`` (default: the usable cores). Raises
    :class:`ParityError` for a missing model or tokenizer.
    """

    kind = "in-process"

    def __init__(self, repo: os.PathLike | str, models: Sequence[str], threads: Optional[int] = None,
                 tokenizer: str = "tokenizer"):
        import onnxruntime as ort

        from orchestrator.runtime.execution.tokenize import TextTokenizer

        self.repo = Path(repo)
        tok_dir = self.repo / tokenizer / "1"
        if not (tok_dir / "tokenizer.json").is_file():
            raise ParityError(f"{tok_dir}: no tokenizer.json")
        self.tokenizer = TextTokenizer(tok_dir)  # as the tokenizer model serves it
        self.max_length = self.tokenizer.model_max_length
        self.threads = threads or num_cores()
        self.paths, self.sessions = {}, {}
        for m in models:
            path = onnx_file(self.repo / m)
            if not path.is_file():
                raise ParityError(f"model {m!r}: {path} does not exist")
            self.paths[m] = path
            self.sessions[m] = ort_session(path, self.threads)
        self.description = (f"in-process: onnxruntime {ort.__version__} CPUExecutionProvider, "
                            f"{self.threads} intra-op thread(s), tokenizer {tok_dir}")

    def encode(self, texts: Sequence[str]):
        return self.tokenizer.pad(self.tokenizer.encode(list(texts)), 0)

    def run(self, model: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.sessions[model].run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]

    def close(self) -> None:
        self.sessions.clear()


class TritonBackend:
    """The tokenizer model (``tokenizer``) and classifier models of a Triton server, through
    tritonclient HTTP.

    Latency measured with it is a client round trip (HTTP, serialisation, the server's
    queue), not comparable with in-process numbers. Raises :class:`ParityError` if a model
    is not ready or a request fails.
    """

    kind = "triton"

    def __init__(self, url: str, models: Sequence[str], timeout_s: float = 300.0, tokenizer: str = "tokenizer"):
        import tritonclient.http as httpclient

        self._http = httpclient
        self.url = url
        self.tokenizer = tokenizer
        self.client = httpclient.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)
        for m in [tokenizer, *models]:
            try:
                ready = self.client.is_model_ready(m)
            except Exception as e:  # connection refused etc.
                raise ParityError(f"Triton server at {url}: {e}") from e
            if not ready:
                raise ParityError(f"Triton server at {url}: model {m!r} is not ready")
        self.description = f"Triton server at {url} (tritonclient HTTP): {tokenizer}, then each model"

    def _infer(self, model: str, arrays: Mapping[str, np.ndarray], outputs: Sequence[str]):
        from tritonclient.utils import InferenceServerException

        inputs = []
        for k, a in arrays.items():
            dtype = "BYTES" if a.dtype == np.object_ else "INT64"
            inputs.append(self._http.InferInput(k, list(a.shape), dtype))
            inputs[-1].set_data_from_numpy(a)
        try:
            r = self.client.infer(model, inputs)
        except InferenceServerException as e:
            raise ParityError(f"{model}: {e}") from e
        return [r.as_numpy(o) for o in outputs]

    def encode(self, texts: Sequence[str]):
        arr = np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)
        ids, mask = self._infer(self.tokenizer, {"TEXT": arr}, ["input_ids", "attention_mask"])
        return ids.astype(np.int64), mask.astype(np.int64)

    def run(self, model: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._infer(model, {"input_ids": ids, "attention_mask": mask}, ["logits"])[0]

    def close(self) -> None:
        self.client.close()


def score_all(
    backend,
    models: Sequence[str],
    texts: Sequence[str],
    batch_size: int = BATCH_SIZE,
    timing_passes: int = 1,
    progress: Optional[Callable[[int], None]] = None,
) -> tuple[dict, dict, list]:
    """Run ``texts`` through ``backend`` for every model; return ``(logits, latency, batches)``.

    Batches: ``batch_size`` consecutive texts, encoded once and fed to every model. Each model
    first runs the first batch once untimed (warm-up); then per batch the models run in
    rotating order (batch i starts with model i mod m) so drifts in machine load hit all
    alike. ``timing_passes`` > 1 repeats the timed loop (logits from the first pass).
    ``logits``: model -> float32 [n, K]. ``latency``: model -> ``{"batches", "median_ms",
    "mean_ms", "p90_ms", "total_s", "texts_per_s", "per_batch_ms"}`` (wall clock of the ``run``
    call per batch, ms; ``per_batch_ms[j]`` is the same batch for every model, so
    :func:`paired_ratio` can compare them pairwise). ``batches``: ``[(rows, padded length)]``.
    """
    enc = []
    for start in range(0, len(texts), batch_size):
        enc.append(backend.encode(texts[start : start + batch_size]))
    for m in models:
        backend.run(m, *enc[0])
    times = {m: [] for m in models}
    logits = {m: [] for m in models}
    for p in range(max(1, timing_passes)):
        for i, (ids, mask) in enumerate(enc):
            k = i % len(models)
            for m in list(models[k:]) + list(models[:k]):
                t0 = time.perf_counter()
                out = backend.run(m, ids, mask)
                times[m].append((time.perf_counter() - t0) * 1000.0)
                if p == 0:
                    if out.dtype != np.float32 or out.ndim != 2 or out.shape[0] != len(ids):
                        raise ParityError(f"{m}: logits {out.dtype} {out.shape}, expected float32 [{len(ids)}, K]")
                    logits[m].append(out)
            if progress:
                progress(len(ids))
    latency = {}
    for m in models:
        t = np.asarray(times[m])
        latency[m] = {"batches": int(len(t)), "median_ms": float(np.median(t)), "mean_ms": float(np.mean(t)),
                      "p90_ms": float(np.percentile(t, 90)), "total_s": float(t.sum() / 1000.0),
                      "texts_per_s": float(len(texts) * max(1, timing_passes) / (t.sum() / 1000.0)),
                      "per_batch_ms": [round(float(x), 3) for x in t]}
    return ({m: np.concatenate(v) for m, v in logits.items()}, latency,
            [(int(ids.shape[0]), int(ids.shape[1])) for ids, _ in enc])

