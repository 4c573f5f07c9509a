"""``make model``: the whole training run and its command line (see the package docstring)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from lab.train.card import artifact_paths, environment, evaluate, fmt_table, vader_predictions, write_model_card
from lab.train.classifier import encode, train_classifier
from lab.train.onnx_export import export_onnx, ort_logits, validate_onnx
from lab.train.specs import (
    MAX_LENGTH,
    MODEL_NAMES,
    QUICK_TRAIN,
    QUICK_VALIDATION,
    SIZE_LIMIT_BYTES,
    SPECS,
    ArtifactSizeError,
    BaselineNotBeatenError,
    log,
    seed_everything,
)
from lab.train.tokenizer import save_tokenizer, train_tokenizer
from orchestrator.tooling.modeling import data as D
from orchestrator.tooling.modeling.contract import ExportValidationError, num_cores, ort_session
from orchestrator.tooling.paths import PROJECT_ROOT


def run(
    out: Path,
    *,
    quick: bool = False,
    epochs: Optional[int] = None,
    seed: int = 0,
    data_dir: Optional[Path] = None,
    command: Optional[str] = None,
    require_beat_vader: Optional[bool] = None,
    threads: Optional[int] = None,
) -> dict:
    """Run the whole pipeline into ``out``; return the metrics dict (also written as JSON).

    Raises :class:`ExportValidationError`, :class:`ArtifactSizeError`,
    :class:`BaselineNotBeatenError` (when ``require_beat_vader``, default: not ``quick``),
    and what :mod:`orchestrator.tooling.modeling.data` raises.
    """
    import torch

    t_start = time.perf_counter()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    torch.set_num_threads(num_cores())
    seed_everything(seed)
    out = Path(out)
    require_beat_vader = (not quick) if require_beat_vader is None else require_beat_vader

    log(f"loading corpus (data dir {data_dir or D.default_data_dir()})")
    examples = D.load_examples(data_dir)
    splits = D.split(examples, seed=seed)
    n_labeled = sum(1 for e in examples if e.label is not None)
    train_ex, val_ex, test_ex = splits["train"], splits["validation"], splits["test"]
    if quick:
        rs = np.random.RandomState(seed)
        train_ex = [train_ex[i] for i in sorted(rs.permutation(len(train_ex))[:QUICK_TRAIN])]
        val_ex = [val_ex[i] for i in sorted(rs.permutation(len(val_ex))[:QUICK_VALIDATION])]
    log(f"splits: train {len(train_ex)}, validation {len(val_ex)}, test {len(test_ex)}")

    t = time.perf_counter()
    tokenizer = train_tokenizer([e.text for e in splits["train"]])
    tok_dir = out / "tokenizer" / "1"
    save_tokenizer(tokenizer, tok_dir)
    tokenizer_seconds = time.perf_counter() - t
    vocab_size = len(tokenizer.get_vocab())
    log(f"tokenizer: {vocab_size} tokens -> {tok_dir} ({tokenizer_seconds:.1f}s)")

    train_seqs = encode(tokenizer, [e.text for e in train_ex])
    val_seqs = encode(tokenizer, [e.text for e in val_ex])
    test_seqs = encode(tokenizer, [e.text for e in test_ex])
    y_train = np.array([e.label for e in train_ex], dtype=np.int64)
    y_val = np.array([e.label for e in val_ex], dtype=np.int64)

    # validation texts for the export check: the longest (truncated) ones plus a sample
    by_len = np.argsort([-len(s) for s in val_seqs], kind="stable")
    check_idx = list(by_len[:16]) + list(np.random.RandomState(seed + 1).permutation(len(val_seqs))[:48])
    check_seqs = [val_seqs[i] for i in dict.fromkeys(int(i) for i in check_idx)]

    reports, preds = {}, {}
    for name in MODEL_NAMES:
        spec = SPECS[name]
        if quick:
            spec = replace(spec, epochs=1)
        if epochs is not None:
            spec = replace(spec, epochs=epochs)
        log(f"training {name}: {spec}")
        model, rep = train_classifier(name, spec, vocab_size, train_seqs, y_train, val_seqs, y_val, seed,
                                      threads=threads)
        path = out / name / "1" / "model.onnx"
        export_onnx(model, path)
        rep["onnx_validation"] = validate_onnx(model, path, check_seqs)
        rep["onnx_bytes"] = path.stat().st_size
        log(f"{name}: {rep['parameters']:,} parameters, best epoch {rep['best_epoch']} "
             f"(val acc {rep['best_validation_accuracy']:.4f}), ONNX {rep['onnx_bytes']:,} bytes, "
             f"check {rep['onnx_validation']}")
        preds[name] = ort_logits(ort_session(path), test_seqs) >= 0
        reports[name] = rep
        del model

    preds["vader"] = vader_predictions([e.text for e in test_ex])
    test_metrics = evaluate(test_ex, preds)
    print(fmt_table(test_metrics, ["classifier", "classifier_fast", "vader"]), flush=True)

    metrics = {
        "command": command or "python -m lab.train",
        "quick": quick,
        "seed": seed,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "data": {
            "source": f"PyPI sdist {D.SDIST_NAME} :: {D.INNER_ARCHIVE}",
            "sdist_sha256": D.SDIST_SHA256,
            "license": "MIT",
            "citation": "Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based Model "
                        "for Sentiment Analysis of Social Media Text. ICWSM-14.",
            "label_rule": "1 if mean rating >= 0.5; 0 if mean rating <= -0.5; else excluded",
            "texts": len(examples),
            "near_neutral_excluded": len(examples) - n_labeled,
            "duplicate_texts_dropped": n_labeled - sum(len(v) for v in splits.values()),
            "split_sizes": D.split_sizes(splits),
            "trained_on": {"train": len(train_ex), "validation": len(val_ex)},
            "extra_training_data": None,
        },
        "tokenizer": {"vocab_size": vocab_size, "model_max_length": MAX_LENGTH, "lowercase": True},
        "models": reports,
        "threshold": "positive iff logit >= 0 (sigmoid >= 0.5); VADER: compound >= 0",
        "test": test_metrics,
        "timing": {"tokenizer_seconds": round(tokenizer_seconds, 1)},
        "environment": environment(load_start),
    }
    metrics["timing"]["total_seconds"] = round(time.perf_counter() - t_start, 1)
    metrics["artifacts"] = {"total_bytes": 0, "limit_bytes": SIZE_LIMIT_BYTES}
    # two passes: the card quotes the total size, which includes the card itself
    for _ in range(2):
        (out / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        write_model_card(metrics, out / "MODEL_CARD.md")
        sizes = {str(p.relative_to(out)): p.stat().st_size for p in artifact_paths(out)}
        metrics["artifacts"] = {"total_bytes": sum(sizes.values()), "limit_bytes": SIZE_LIMIT_BYTES, "files": sizes}
    (out / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_model_card(metrics, out / "MODEL_CARD.md")
    total = sum(p.stat().st_size for p in artifact_paths(out))
    log(f"artifacts: {total:,} bytes (limit {SIZE_LIMIT_BYTES:,}); total time "
         f"{metrics['timing']['total_seconds']:.0f}s")
    if total > SIZE_LIMIT_BYTES:
        raise ArtifactSizeError(f"artifacts total {total:,} bytes > {SIZE_LIMIT_BYTES:,}")
    acc = test_metrics["classifier"]["movie_reviews"]["accuracy"]
    base = test_metrics["vader"]["movie_reviews"]["accuracy"]
    if require_beat_vader and not acc > base:
        raise BaselineNotBeatenError(f"classifier movie_reviews accuracy {acc} <= VADER {base}")
    return metrics


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the process exit status (0 on success)."""
    p = argparse.ArgumentParser(prog="python -m lab.train", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: small sample, 1 epoch")
    p.add_argument("--out", type=Path, default=PROJECT_ROOT / "model_repository",
                   help="model repository to write into (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=None, help="epochs for both models (default: per model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="pin torch threads for training (default: cores left idle by other processes, "
                        "re-checked every 25 steps)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="corpus cache (default: $ORCHESTRATOR_DATA_DIR or .cache/data)")
    args = p.parse_args(argv)
    cmd_args = list(sys.argv[1:] if argv is None else argv)
    command = "python -m lab.train" + ("" if not cmd_args else " " + shlex.join(cmd_args))
    try:
        run(args.out, quick=args.quick, epochs=args.epochs, seed=args.seed,
            data_dir=args.data_dir, command=command, threads=args.threads)
    except (ExportValidationError, ArtifactSizeError, BaselineNotBeatenError, D.DataUnavailableError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0
