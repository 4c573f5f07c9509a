"""Evaluation on the test split (the two ONNX models and VADER) and ``MODEL_CARD.md``."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Sequence

import numpy as np

from lab.train.specs import MODEL_NAMES, OPSET, SIZE_LIMIT_BYTES, TOKENIZER_FILES
from orchestrator.tooling.modeling import data as D
from orchestrator.tooling.modeling.contract import num_cores


def binary_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict:
    """Accuracy, precision, recall, F1 (positive class = 1) and the confusion counts."""
    y_true = np.asarray(y_true).astype(bool)
    y_pred = np.asarray(y_pred).astype(bool)
    tp = int(np.sum(y_true & y_pred))
    fp = int(np.sum(~y_true & y_pred))
    fn = int(np.sum(y_true & ~y_pred))
    tn = int(np.sum(~y_true & ~y_pred))
    n = tp + fp + fn + tn
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    return {
        "n": n, "accuracy": round((tp + tn) / n, 4) if n else 0.0,
        "precision": round(prec, 4), "recall": round(rec, 4), "f1": round(f1, 4),
        "tp": tp, "fp": fp, "fn": fn, "tn": tn,
    }


def vader_predictions(texts: Sequence[str]) -> np.ndarray:
    """VADER binary predictions (bool [n]): compound score >= 0 -> positive."""
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    sia = SentimentIntensityAnalyzer()
    return np.array([sia.polarity_scores(t)["compound"] >= 0 for t in texts], dtype=bool)


def evaluate(examples: Sequence[D.Example], predictions: dict[str, np.ndarray]) -> dict:
    """``{system: {corpus | "all": binary_metrics}}`` for boolean predictions [n] per system."""
    y = np.array([e.label == 1 for e in examples], dtype=bool)
    corp = np.array([e.corpus for e in examples])
    out = {}
    for system, pred in predictions.items():
        out[system] = {c: binary_metrics(y[corp == c], pred[corp == c]) for c in D.CORPORA}
        out[system]["all"] = binary_metrics(y, pred)
    return out


# --------------------------------------------------------------------------- report


def fmt_table(test: dict, systems: Sequence[str]) -> str:
    lines = [
        "| corpus | n | system | accuracy | precision | recall | F1 |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for c in list(D.CORPORA) + ["all"]:
        for s in systems:
            m = test[s][c]
            lines.append(
                f"| {c} | {m['n']} | {s} | {m['accuracy']:.4f} | {m['precision']:.4f} "
                f"| {m['recall']:.4f} | {m['f1']:.4f} |"
            )
    return "\n".join(lines)


def write_model_card(metrics: dict, path: Path) -> None:
    """Render ``MODEL_CARD.md`` from the metrics dict written to ``training_metrics.json``."""
    sizes = metrics["data"]["split_sizes"]
    split_lines = [
        "| corpus | train (pos/neg) | validation (pos/neg) | test (pos/neg) |",
        "|---|---|---|---|",
    ]
    for c in list(D.CORPORA) + ["all"]:
        cells = [f"{sizes[s][c]['n']} ({sizes[s][c]['positive']}/{sizes[s][c]['negative']})" for s in D.SPLITS]
        split_lines.append(f"| {c} | " + " | ".join(cells) + " |")
    arch_lines = [
        "| model | hidden | layers | heads | intermediate | dropout | parameters | ONNX bytes "
        "| epochs (best) | peak lr | train time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name in MODEL_NAMES:
        r = metrics["models"][name]
        s = r["spec"]
        arch_lines.append(
            f"| `{name}` | {s['hidden_size']} | {s['num_hidden_layers']} | {s['num_attention_heads']} "
            f"| {s['intermediate_size']} | {s['hidden_dropout_prob']:g} | {r['parameters']:,} "
            f"| {r['onnx_bytes']:,} | {s['epochs']} ({r['best_epoch']}) | {s['learning_rate']:g} "
            f"| {r['train_seconds']:.0f} s |"
        )
    hist_lines = ["| model | epoch | train loss | validation accuracy | seconds |", "|---|---:|---:|---:|---:|"]
    for name in MODEL_NAMES:
        for h in metrics["models"][name]["history"]:
            hist_lines.append(
                f"| `{name}` | {h['epoch']} | {h['train_loss']:.4f} | {h['validation_accuracy']:.4f} "
                f"| {h['seconds']:.0f} |"
            )
    val_lines = []
    for name in MODEL_NAMES:
        v = metrics["models"][name]["onnx_validation"]
        val_lines.append(
            f"- `{name}`: onnxruntime vs torch {v['max_abs_diff_onnx_vs_torch']:.1e}; padded to 512 vs "
            f"padded to longest {v['max_abs_diff_pad512_vs_longest']:.1e}; batch of 1 vs batched "
            f"{v['max_abs_diff_batch1_vs_batched']:.1e} (max abs logit difference over "
            f"{v['examples']} validation texts, the longest included)."
        )
    d = metrics["data"]
    t = metrics["timing"]
    env = metrics["environment"]
    test = metrics["test"]
    quick_note = (
        "\n> **This is a `--quick` smoke run** (small sample, one epoch): its numbers mean "
        "nothing. `make model` writes the real models.\n"
        if metrics["quick"] else ""
    )
    extra = f"\n- Extra training data: {d['extra_training_data']}" if d.get("extra_training_data") else ""
    movie = {s: test[s]["movie_reviews"]["accuracy"] for s in ("classifier", "classifier_fast", "vader")}
    threads_used = "; ".join(
        f"`{n}` " + ", ".join(f"{v} with {k}" for k, v in metrics["models"][n].get("steps_by_torch_threads", {}).items())
        for n in MODEL_NAMES
    )
    text = f"""# Model card: demo sentiment classifiers

Generated by `{metrics['command']}` ({metrics['created_utc']} UTC). Every number here comes
from that run and is also in `training_metrics.json`.
{quick_note}
## What they are

Two small BERT-style binary sentiment classifiers for English sentences, trained from
scratch, and their tokenizer; the router demo serves them.

- `tokenizer/1/`: WordPiece, {metrics['tokenizer']['vocab_size']} tokens, trained on the train
  split only; lower-cases (BERT normalizer), BERT pre-tokenizer, adds `[CLS] ... [SEP]`;
  `model_max_length` 128 (longer texts are truncated to 128 tokens); `[PAD]` id 0.
- `classifier/1/model.onnx` (accurate) and `classifier_fast/1/model.onnx` (small, fast):
  `BertForSequenceClassification` with one output. Inputs `input_ids`, `attention_mask`
  int64 `[batch, sequence]`; output `logits` float32 `[batch, 1]`; dynamic batch and
  sequence axes; opset {OPSET}; `max_position_embeddings` 512, so inputs padded to 512 run
  and give the logits of inputs padded to the longest text.
- Output: P(positive) = sigmoid(logit). Every number below counts a text as positive iff
  logit >= 0 (probability >= 0.5).

## Data

- Source: the ground truth of Hutto & Gilbert (2014), shipped in the `vaderSentiment==3.3.2`
  source distribution on PyPI as `additional_resources/hutto_ICWSM_2014.tar.gz` (sdist
  sha256 `{D.SDIST_SHA256}`); `orchestrator/tooling/modeling/data.py` fetches it with
  `pip download --no-deps --no-binary :all: vaderSentiment==3.3.2`.
- License: MIT (`LICENSE.txt` of the `vaderSentiment` package).
- Citation: Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based Model for
  Sentiment Analysis of Social Media Text. Eighth International Conference on Weblogs and
  Social Media (ICWSM-14). Ann Arbor, MI, June 2014.
- Texts (per the dataset README): sentence-level snippets, each rated by at least 20 people
  on [-4, 4]; the files give the mean. Movie review snippets (10,605; rotten.tomatoes.com
  reviews of Pang & Lee 2004), tweet-like texts (4,200: 4,000 inspired by public tweets
  plus 200 contrived to test sentiment rules), Amazon product review snippets (3,708; Hu &
  Liu 2004), NYT editorial snippets (5,190).
- Labeling rule: positive (1) if mean rating >= 0.5; negative (0) if mean rating <= -0.5;
  near-neutral texts (-0.5 < rating < 0.5; {d['near_neutral_excluded']:,} of
  {d['texts']:,}) are excluded from training and evaluation. Repeated texts (equal after
  case-folding and whitespace collapsing) are kept once ({d['duplicate_texts_dropped']}
  dropped), so no text is in two splits.
- Split: 80/10/10 train/validation/test, stratified by (corpus, label), seed
  {metrics['seed']}: a `numpy.random.RandomState` permutation of the examples sorted by
  corpus and id, identical on every machine. Validation picks the best epoch; the test split
  is used only for the results below.{extra}

{chr(10).join(split_lines)}

## Architectures and training

{chr(10).join(arch_lines)}

Common settings: `transformers.BertConfig` defaults otherwise (GELU, 2 token types),
`max_position_embeddings` 512, training length at most 128 tokens with dynamic padding
(batches of similar length), batch size {metrics['models']['classifier']['spec']['batch_size']},
BCE-with-logits loss on the binary label, AdamW (weight decay
{metrics['models']['classifier']['spec']['weight_decay']:g}, none on biases and LayerNorm),
linear warmup over 10% of the steps then linear decay to 0, gradient clipping at 1.0, seeds
fixed (`torch.manual_seed`, numpy, random). The weights of the epoch with the best
validation accuracy (all corpora) are exported. Torch threads: as many as the
{env['cpu_cores']} cores minus those other processes kept busy, re-checked every 25 steps
(`ThreadGovernor`; with a busy neighbour, 2 threads on 2 cores ran 15x slower than 1);
training steps per thread count: {threads_used}.

{chr(10).join(hist_lines)}

Time (wall clock, this run, {env['cpu_cores']} CPU cores, 1-minute load average
{env['load_average_start']:.1f} at the start, so other processes may have shared the CPU):
tokenizer {t['tokenizer_seconds']:.0f} s, `classifier` {metrics['models']['classifier']['train_seconds']:.0f} s,
`classifier_fast` {metrics['models']['classifier_fast']['train_seconds']:.0f} s, whole run
including export and evaluation {t['total_seconds']:.0f} s. The artifacts (tokenizer files,
two ONNX files, this card, `training_metrics.json`) total
{metrics['artifacts']['total_bytes']:,} bytes (limit {SIZE_LIMIT_BYTES:,}).

Export check (the run fails above 1e-4):
{chr(10).join(val_lines)}

## Test-split results

Computed in the same run on the same test examples: the two ONNX models through
onnxruntime (what is served; texts tokenized by the saved tokenizer), and VADER
(`vaderSentiment` {env['vaderSentiment']}, `SentimentIntensityAnalyzer`, compound >= 0 ->
positive) on the raw texts. Positive class = positive sentiment.

On movie review snippets: `classifier` {movie['classifier']:.4f}, `classifier_fast`
{movie['classifier_fast']:.4f}, VADER {movie['vader']:.4f} accuracy.

{fmt_table(test, ['classifier', 'classifier_fast', 'vader'])}

## Limits

- Small models trained from scratch on about 15k sentences: all they know about words
  comes from this data. Expect errors on sarcasm, negation scope, words absent from the
  train split, other domains, and long texts (tokens after the 128th are cut off).
- English only; 2000s-era movie criticism dominates the training data (about 52%).
- The test split has {sizes['test']['all']['n']:,} texts; per-corpus accuracies carry
  sampling noise of roughly +/- 2.5 (movies) to +/- 5 (tweets, Amazon, NYT) points
  (95% interval).
- Binary only: near-neutral texts were excluded from training and evaluation, so the
  models have no neutral output and their scores on neutral text are arbitrary.
- VADER is rule-based and built for social-media text; the tweet corpus includes 200
  texts contrived to test such rules. It is a baseline here, not a ceiling.
- Reproducibility: data, split, tokenizer (bitwise) and seeds are fixed, and two runs with
  the same torch thread count at every step wrote identical ONNX files here. Under load
  the thread governor uses fewer threads, which changes float summation order and so the
  trained weights a little (`--threads N` pins the count); other CPUs may differ too.
- A demo artifact: not for decisions about people.

## Environment

Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}, tokenizers
{env['tokenizers']}, onnx {env['onnx']}, onnxruntime {env['onnxruntime']}, numpy
{env['numpy']}, vaderSentiment {env['vaderSentiment']}; {env['platform']}.
"""
    path.write_text(text, encoding="utf-8")


def environment(load_average_start: float) -> dict:
    """Package versions, platform, cores, torch threads and the 1-minute load at start."""
    import importlib.metadata as md

    import torch

    v = {"python": platform.python_version(), "platform": platform.platform()}
    for p in ("torch", "transformers", "tokenizers", "onnx", "onnxruntime", "numpy", "vaderSentiment"):
        try:
            v[p] = md.version(p)
        except md.PackageNotFoundError:
            v[p] = None
    v["cpu_cores"] = num_cores()
    v["load_average_start"] = round(load_average_start, 2)
    v["torch_threads"] = torch.get_num_threads()
    return v


def artifact_paths(out: Path) -> list[Path]:
    """The files this module writes under ``out`` (the ones counted against 25 MB)."""
    paths = [out / "tokenizer" / "1" / n for n in TOKENIZER_FILES]
    paths += [out / m / "1" / "model.onnx" for m in MODEL_NAMES]
    paths += [out / "training_metrics.json", out / "MODEL_CARD.md"]
    return paths
