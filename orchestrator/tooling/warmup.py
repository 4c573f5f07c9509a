"""Warmup samples and the response cache in the model configurations.

**Warmup.** Triton runs a model's ``model_warmup`` samples on every instance when it loads
the model, before the model is ready (core r24.10 ``TritonModelInstance::WarmUp``), so the
first client request does not pay for the first execution. Measured on the embedded
server (docs/results/benchmarks.md, "Warmup"): a Python-backend classifier answers its first
request after a load in tens of milliseconds without warmup and at its warm latency with
it; in-process ONNX Runtime alone is warm after one run of any shape, so one sample of a
typical request is enough. Every model of the repository except ``ensemble`` (an ensemble
has no instances to warm) declares one sample, named :data:`SAMPLE_NAME`: one text of
the held-out median length (:data:`SAMPLE_TEXT`, 26 tokens; the held-out split's median
is 27) in the shape its first request will have, batch 1:

    tokenizer     TEXT [1]                      the text
    classifier*   input_ids, attention_mask [L]  its token ids (from the tokenizer its
                                                head.json names; 26 for the demo's) and
                                                a mask of ones
    postprocess   logits [K], THRESHOLD [1]     K logits 0.0 (K: the width of its logits
                                                input, 1 for the demo's) and threshold 0.5
    router        TEXT [1], THRESHOLD [1]       the text and the threshold NaN: the mark
                                                by which the router knows its sample
                                                (``orchestrator/runtime/serving/router.py``, "Warmup")

The data are raw files in ``<model>/warmup/`` (``input_data_file``; the format of
``model_config.proto``, ``ModelWarmup.Input.input_data_file``: row-major values,
little-endian; a ``TYPE_STRING`` element is a 4-byte unsigned length followed by its
bytes). :func:`write_warmup_files` writes them (``orchestrator warmup``);
:func:`warmup_sample` is the ``model_warmup`` entry a configuration must hold (the unit
tests compare the shipped configurations with it).

**Response cache.** Triton's cache key is the model name, the version, each input's name
and its bytes (core r24.10 ``TritonCache::Hash``): not the request parameters, not the
requested outputs, not the shapes. So only models whose answer is a function of their
input bytes may use it (:data:`CACHED_KINDS`): the classifiers. Not the router (its
answer depends on the request parameter ``route`` and, for ``describe_policy``, on
the requested outputs: a cached answer would be returned for a request that asked for
another route, ``tests/server/test_model_features.py`` shows it), not the tokenizer (its
answer depends on the request parameter ``truncation``: the ensemble's truncated ids
would be returned to the router, which asks for whole texts), not ``postprocess`` (a
sigmoid over a few floats is cheaper than a cache lookup and insert). The shape blind
spot remains for the classifiers: one text of 6 tokens and two texts of 3 can share a
key; the router checks the rows of every answer (``ModelCalls.batched``).
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from tritonclient.grpc import model_config_pb2

from orchestrator.runtime.routing.heads import LEGACY, read_head
from orchestrator.tooling.paths import default_model_repository
from orchestrator.tooling.repository import ModelConfig, config_path, read_config

__all__ = [
    "SAMPLE_NAME",
    "SAMPLE_TEXT",
    "SAMPLE_THRESHOLD",
    "WARMUP_DIR",
    "CACHED_KINDS",
    "model_kind",
    "string_bytes",
    "warmup_data",
    "warmup_sample",
    "logits_width",
    "add_model_features",
    "write_warmup_files",
    "main",
]

SAMPLE_NAME = "one_review"
#: A review of the held-out median length in tokens (26 here, the median is 27).
SAMPLE_TEXT = "The staff were friendly and the room was clean, but breakfast was cold and far too expensive for what it was."
SAMPLE_THRESHOLD = 0.5
SAMPLE_LOGIT = 0.0
WARMUP_DIR = "warmup"
#: Model kinds whose answer depends only on their input bytes (see the module doc).
CACHED_KINDS = ("classifier",)

_TYPES = {"TYPE_STRING": None, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}


def model_kind(config: ModelConfig) -> Optional[str]:
    """``tokenizer``, ``classifier``, ``postprocess`` or ``router`` from a configuration's
    input names; None for other models (``ensemble``: no instances to warm)."""
    if config.platform == "ensemble":
        return None
    names = {i.name for i in config.input}
    for kind, inputs in (("router", {"TEXT", "THRESHOLD"}), ("tokenizer", {"TEXT"}),
                         ("classifier", {"input_ids", "attention_mask"}), ("postprocess", {"logits", "THRESHOLD"})):
        if names == inputs:
            return kind
    return None


def string_bytes(texts: Sequence[str]) -> bytes:
    """``TYPE_STRING`` elements as ``input_data_file`` holds them: per element a 4-byte
    little-endian unsigned length, then its UTF-8 bytes."""
    out = b""
    for text in texts:
        raw = text.encode("utf-8")
        out += struct.pack("<I", len(raw)) + raw
    return out


def _sample_ids(tokenizer_dir: Path) -> np.ndarray:
    from orchestrator.runtime.execution.tokenize import TextTokenizer

    return TextTokenizer(tokenizer_dir).encode([SAMPLE_TEXT])[0]


def warmup_data(kind: str, tokenizer_dir: Optional[Path], logits: int = 1) -> Dict[str, Tuple[str, List[int], bytes]]:
    """Input name -> ``(data_type, dims without batch, file content)`` of the sample of
    ``kind`` (see the module doc); ``tokenizer_dir``: the tokenizer files (classifier ids:
    the model's own tokenizer, so every id is in its vocabulary); ``logits``: the logit
    columns of a postprocess sample (the head's ``num_logits``; all 0.0).

    Raises:
        ValueError: an unknown kind.
    """
    text = ("TYPE_STRING", [1], string_bytes([SAMPLE_TEXT]))
    threshold = ("TYPE_FP32", [1], np.array([SAMPLE_THRESHOLD], "<f4").tobytes())
    if kind == "tokenizer":
        return {"TEXT": text}
    if kind == "router":
        return {"TEXT": text, "THRESHOLD": ("TYPE_FP32", [1], np.array([np.nan], "<f4").tobytes())}
    if kind == "postprocess":
        return {"logits": ("TYPE_FP32", [logits], np.full(logits, SAMPLE_LOGIT, "<f4").tobytes()), "THRESHOLD": threshold}
    if kind == "classifier":
        ids = _sample_ids(tokenizer_dir)
        dims = [int(ids.shape[0])]
        return {"input_ids": ("TYPE_INT64", dims, ids.astype("<i8").tobytes()),
                "attention_mask": ("TYPE_INT64", dims, np.ones_like(ids).astype("<i8").tobytes())}
    raise ValueError(f"no warmup sample for model kind {kind!r}")


def logits_width(config: ModelConfig) -> int:
    """Columns of the ``logits`` input of a postprocess configuration: its fixed dim, 1
    when it has none or a variable one (``[-1]``, the legacy one-logit postprocess)."""
    dims = [list(i.dims) for i in config.input if i.name == "logits"]
    return dims[0][0] if dims and len(dims[0]) == 1 and dims[0][0] > 0 else 1


def warmup_sample(kind: str, tokenizer_dir: Optional[Path], logits: int = 1) -> "model_config_pb2.ModelWarmup":
    """The ``model_warmup`` entry of ``kind``: :data:`SAMPLE_NAME`, batch 1, one
    ``input_data_file`` per input named like the input."""
    sample = model_config_pb2.ModelWarmup(name=SAMPLE_NAME, batch_size=1)
    for name, (data_type, dims, _) in warmup_data(kind, tokenizer_dir, logits).items():
        entry = sample.inputs[name]
        entry.data_type = model_config_pb2.DataType.Value(data_type)
        entry.dims.extend(dims)
        entry.input_data_file = name
    return sample


def add_model_features(config: ModelConfig, tokenizer_dir: Path) -> ModelConfig:
    """Give ``config`` (in place; returned) its warmup sample and, for the kinds of
    :data:`CACHED_KINDS`, ``response_cache { enable: true }``: what the shipped
    configurations hold, for a generator of configurations to apply."""
    kind = model_kind(config)
    if kind is None:
        return config
    del config.model_warmup[:]
    config.model_warmup.append(warmup_sample(kind, tokenizer_dir, logits_width(config)))
    if kind in CACHED_KINDS:
        config.response_cache.enable = True
    return config


def write_warmup_files(model_dir: Path, kind: str, tokenizer_dir: Optional[Path], logits: int = 1) -> List[Path]:
    """Write the sample's files of ``kind`` into ``<model_dir>/warmup/``; returns them."""
    out = []
    (model_dir / WARMUP_DIR).mkdir(exist_ok=True)
    for name, (_, _, content) in warmup_data(kind, tokenizer_dir, logits).items():
        path = model_dir / WARMUP_DIR / name
        path.write_bytes(content)
        out.append(path)
    return out


def add_warmup_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``orchestrator warmup``'s options; returns ``parser``."""
    parser.add_argument("--repo", type=Path, default=None, help="model repository (default: ./model_repository, else the project's)")
    return parser


def warmup_command(args: argparse.Namespace) -> int:
    """``orchestrator warmup [--repo DIR]``: write the warmup files of every model of the
    repository whose configuration has a ``model_warmup`` sample; prints each file written."""
    repo = args.repo or default_model_repository()
    for model_dir in sorted(p for p in repo.iterdir() if p.is_dir()):
        path = config_path(model_dir, "embedded")
        if path is None:
            continue
        config = read_config(path)
        kind = model_kind(config)
        if kind is None or not config.model_warmup:
            continue
        head = read_head(model_dir) or LEGACY  # a classifier's ids come from its own tokenizer
        for written in write_warmup_files(model_dir, kind, repo / head.tokenizer / "1", logits_width(config)):
            print(written)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m orchestrator.tooling.warmup ...``: the same as ``orchestrator warmup ...``."""
    parser = add_warmup_arguments(argparse.ArgumentParser(prog="orchestrator warmup", description=warmup_command.__doc__))
    return warmup_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
