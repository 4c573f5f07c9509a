"""``make model``: train the demo tokenizer and two sentiment classifiers, export them to ONNX.

Usage::

    python -m orchestrator.tooling.modeling.train [--quick] [--out model_repository] [--epochs N] [--seed 0] [--threads N]

Steps (each timed; numbers land in ``<out>/training_metrics.json`` and ``<out>/MODEL_CARD.md``):

1. Data: :mod:`orchestrator.tooling.modeling.data` (Hutto & Gilbert 2014 ground truth from the
   ``vaderSentiment==3.3.2`` sdist), labels ``rating >= 0.5`` -> 1, ``<= -0.5`` -> 0,
   near-neutral dropped; fixed-seed 80/10/10 split stratified by (corpus, label).
2. Tokenizer: WordPiece trained with ``tokenizers`` on the train split only (BERT
   normalizer with lower-casing, BERT pre-tokenizer, ``[CLS] ... [SEP]`` post-processor,
   special tokens ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``), wrapped as
   ``transformers.BertTokenizerFast`` with ``model_max_length=128`` and saved to
   ``<out>/tokenizer/1/`` (plus ``vocab.txt`` and ``special_tokens_map.json``).
3. Two ``BertForSequenceClassification(num_labels=1)`` models from scratch
   (``max_position_embeddings=512``), BCE-with-logits on the binary label, AdamW with
   linear warmup/decay, dynamic padding, max length 128, best epoch by validation accuracy:
   ``classifier`` (accurate) and ``classifier_fast`` (small).
4. ONNX export (opset 17, TorchScript exporter ``dynamo=False``): inputs ``input_ids``,
   ``attention_mask`` int64 ``[batch, sequence]``, output ``logits`` float32 ``[batch, 1]``,
   dynamic batch and sequence axes, to ``<out>/<model>/1/model.onnx``. Checked with
   onnxruntime against torch and padded-to-512 against padded-to-longest (max abs logit
   difference < 1e-4 each, else :class:`ExportValidationError`).
5. Test-split accuracy/precision/recall/F1 per corpus for both ONNX models (onnxruntime,
   what is served; positive iff logit >= 0, i.e. probability >= 0.5) and for VADER
   (compound >= 0 -> positive) on the same examples.

Reproducibility: fixed seeds (``random``, numpy, ``torch.manual_seed``), a deterministic
tokenizer (see :func:`train_tokenizer`); torch threads follow :class:`ThreadGovernor` (the
cores other processes leave idle; ``--threads N`` pins them), and identical thread counts
give identical weights.

Raises :class:`ArtifactSizeError` if the artifacts total more than 25 MB (25,000,000 bytes),
and :class:`BaselineNotBeatenError` (full runs only) if ``classifier`` does not beat VADER's
accuracy on the movie-review test split. ``--quick`` trains on a small sample for a smoke
run (about a minute); its numbers are meaningless.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import random
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from orchestrator.tooling.modeling import data as D
from orchestrator.tooling.paths import PROJECT_ROOT

MAX_LENGTH = 128  # tokenizer model_max_length and training max sequence length
MAX_POSITIONS = 512  # so inputs padded to 512 (the seeds' pad length) still run
PAD_TO = 512
OPSET = 17
SIZE_LIMIT_BYTES = 25_000_000
TOL = 1e-4  # max abs logit difference accepted in export validation
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
MODEL_NAMES = ("classifier", "classifier_fast")


class ExportValidationError(RuntimeError):
    """An exported ONNX model disagrees with torch or with itself under padding."""


class ArtifactSizeError(RuntimeError):
    """The artifacts exceed :data:`SIZE_LIMIT_BYTES`."""


class BaselineNotBeatenError(RuntimeError):
    """``classifier`` is not more accurate than VADER on the movie-review test split."""


@dataclass(frozen=True)
class ModelSpec:
    """Architecture and optimisation settings of one classifier (BERT-style encoder)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_dropout_prob: float
    attention_probs_dropout_prob: float
    learning_rate: float
    epochs: int
    batch_size: int
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1


SPECS: dict[str, ModelSpec] = {
    "classifier": ModelSpec(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        learning_rate=5e-4, epochs=6, batch_size=32,
    ),
    "classifier_fast": ModelSpec(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        learning_rate=1e-3, epochs=5, batch_size=32,
    ),
}
VOCAB_SIZE = 8000
QUICK_TRAIN = 1500  # examples per --quick run
QUICK_VALIDATION = 300


def _num_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Sequence[str], vocab_size: int = VOCAB_SIZE):
    """Train a lower-casing WordPiece tokenizer on ``texts``; return a ``BertTokenizerFast``.

    ``model_max_length`` 128, ``do_lower_case`` True, ``[PAD]`` id 0; the model inputs it
    returns are ``input_ids`` and ``attention_mask`` (no ``token_type_ids``).

    Deterministic: ``WordPieceTrainer`` gives ``##``-continuation tokens ids in hash-map
    order, which breaks merge ties differently from run to run (huggingface/tokenizers
    issue #1794). Seeding every ``##<char>`` of the training alphabet, in sorted order, as
    trainer special tokens fixes those ids; the final tokenizer is then rebuilt from the
    learnt vocabulary with only the five real special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    def bare(model):
        tok = Tokenizer(model)
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return tok

    texts = list(texts)
    tmp = bare(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    cont_chars: set[str] = set()
    for t in texts:
        for word, _ in tmp.pre_tokenizer.pre_tokenize_str(tmp.normalizer.normalize_str(t)):
            cont_chars.update(word[1:])
    seeded = ["##" + c for c in sorted(cont_chars)]
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS + seeded,
        continuing_subword_prefix="##", show_progress=False,
    )
    tmp.train_from_iterator(texts, trainer=trainer)
    vocab = tmp.get_vocab(with_added_tokens=True)

    tok = bare(models.WordPiece(vocab=vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                max_input_chars_per_word=100))
    tok.add_special_tokens(SPECIAL_TOKENS)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    if [ids[t] for t in SPECIAL_TOKENS] != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special token ids {ids} are not 0..4")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    return BertTokenizerFast(
        tokenizer_object=tok,
        do_lower_case=True,
        model_max_length=MAX_LENGTH,
        model_input_names=["input_ids", "attention_mask"],
    )


def save_tokenizer(tokenizer, out_dir: Path) -> list[Path]:
    """Write the tokenizer files (only those) into ``out_dir``; check they reload.

    ``save_pretrained`` of transformers 5 writes ``tokenizer.json`` and
    ``tokenizer_config.json``; ``vocab.txt`` (WordPiece vocabulary, one token a line, by
    id) and ``special_tokens_map.json`` are added for readers that expect the classic
    BERT layout. Other files in ``out_dir`` (``model.py``) are left alone.

    Raises ``RuntimeError`` if the saved tokenizer does not reload with
    ``AutoTokenizer.from_pretrained`` with the same ids, lower-casing and truncation to 128.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        vocab = tokenizer.get_vocab()
        by_id = sorted(vocab.items(), key=lambda kv: kv[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise RuntimeError("tokenizer vocabulary ids are not contiguous")
        Path(tmp, "vocab.txt").write_text("".join(t + "\n" for t, _ in by_id), encoding="utf-8")
        stm = {
            "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
            "cls_token": "[CLS]", "mask_token": "[MASK]",
        }
        Path(tmp, "special_tokens_map.json").write_text(json.dumps(stm, indent=2) + "\n")
        written = []
        for name in TOKENIZER_FILES:
            src = Path(tmp, name)
            if not src.is_file():
                raise RuntimeError(f"save_pretrained did not write {name}")
            dst = out_dir / name
            shutil.copyfile(src, dst.with_suffix(dst.suffix + ".tmp"))
            os.replace(dst.with_suffix(dst.suffix + ".tmp"), dst)
            written.append(dst)
    check_tokenizer(out_dir, tokenizer)
    return written


def check_tokenizer(path: Path, reference=None) -> None:
    """Reload ``path`` with ``AutoTokenizer`` and check lower-casing and truncation to 128."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.model_max_length != MAX_LENGTH:
        raise RuntimeError(f"reloaded model_max_length {tok.model_max_length} != {MAX_LENGTH}")
    a = tok("This Movie Was GREAT")["input_ids"]
    b = tok("this movie was great")["input_ids"]
    if a != b or a[0] != tok.cls_token_id or a[-1] != tok.sep_token_id or tok.pad_token_id != 0:
        raise RuntimeError(f"reloaded tokenizer: bad lower-casing or special tokens: {a} vs {b}")
    long = tok("word " * 1000, truncation=True)["input_ids"]
    if len(long) != MAX_LENGTH:
        raise RuntimeError(f"truncation gave {len(long)} tokens, expected {MAX_LENGTH}")
    if reference is not None:
        s = "An utterly forgettable, 2-hour slog :( #fail"
        if tok(s)["input_ids"] != reference(s)["input_ids"]:
            raise RuntimeError("reloaded tokenizer encodes differently from the trained one")


# --------------------------------------------------------------------------- training


def _encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return tokenizer(list(texts), truncation=True, max_length=MAX_LENGTH)["input_ids"]


def _pad(seqs: Sequence[Sequence[int]], length: Optional[int] = None):
    """Right-pad id lists with 0; return int64 ``input_ids`` and ``attention_mask`` [b, length]."""
    n = max(len(s) for s in seqs) if length is None else length
    ids = np.zeros((len(seqs), n), dtype=np.int64)
    mask = np.zeros((len(seqs), n), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def _length_batches(lengths: Sequence[int], batch_size: int, rng: np.random.RandomState) -> list[np.ndarray]:
    """Shuffled batches of similar length (chunks of 50 batches sorted by length)."""
    order = rng.permutation(len(lengths))
    chunk = batch_size * 50
    batches = []
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        part = part[np.argsort([lengths[i] for i in part], kind="stable")]
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def _sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class ThreadGovernor:
    """Keeps torch's intra-op threads at the number of cores other processes leave idle.

    With as many OpenMP threads as cores, a busy neighbour process makes every parallel
    region wait for a descheduled thread: measured here, a training step of ``classifier``
    took 3.0 s with 2 threads and 0.2 s with 1 thread while a benchmark used about one of
    the 2 cores (0.15 s with 2 threads on an idle machine). So every ``interval`` steps the
    governor reads the CPU time of all processes (``/proc/stat``) minus this process's own
    (``os.times``), and sets ``torch.set_num_threads(cores - round(others' cores in use))``,
    at least 1. ``fixed`` pins the thread count instead. Without ``/proc/stat`` (not Linux)
    it keeps ``cores`` threads.
    """

    def __init__(self, cores: int, fixed: Optional[int] = None, interval: int = 25):
        import torch

        self.cores, self.fixed, self.interval = cores, fixed, interval
        self.threads = fixed or cores
        self.steps_by_threads: dict[int, int] = {}
        self._n = 0
        self._last = self._sample()
        if not fixed and self._last is not None:  # initial estimate over 0.5 s
            time.sleep(0.5)
            self._adjust()
        torch.set_num_threads(self.threads)

    @staticmethod
    def _sample() -> Optional[tuple[float, float, float]]:
        try:
            with open("/proc/stat") as f:
                fields = [float(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        busy = (sum(fields[0:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")
        t = os.times()
        return time.monotonic(), busy, t.user + t.system

    def step(self) -> None:
        """Count one training step; every ``interval`` steps re-check the load."""
        self.steps_by_threads[self.threads] = self.steps_by_threads.get(self.threads, 0) + 1
        self._n += 1
        if not self.fixed and self._n % self.interval == 0:
            self._adjust()

    def _adjust(self) -> None:
        import torch

        if self._last is None:
            return
        now = self._sample()
        if now is None:
            return
        wall = now[0] - self._last[0]
        if wall < 0.4:
            return
        others = max(0.0, ((now[1] - self._last[1]) - (now[2] - self._last[2])) / wall)
        self._last = now
        want = max(1, min(self.cores, self.cores - int(round(others))))
        if want != self.threads:
            self.threads = want
            torch.set_num_threads(want)


def build_model(spec: ModelSpec, vocab_size: int):
    """A fresh ``BertForSequenceClassification`` (1 logit) with eager attention."""
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        intermediate_size=spec.intermediate_size,
        hidden_dropout_prob=spec.hidden_dropout_prob,
        attention_probs_dropout_prob=spec.attention_probs_dropout_prob,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        pad_token_id=0,
        num_labels=1,
        attn_implementation="eager",
    )
    return BertForSequenceClassification(cfg)


def torch_logits(model, seqs: Sequence[Sequence[int]], batch_size: int = 128) -> np.ndarray:
    """float32 logits [n] of ``model`` in eval mode, batches padded to their longest."""
    import torch

    model.eval()
    out = np.zeros(len(seqs), dtype=np.float32)
    with torch.inference_mode():
        for b in _sorted_batches([len(s) for s in seqs], batch_size):
            ids, mask = _pad([seqs[i] for i in b])
            lg = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits
            out[b] = lg[:, 0].float().numpy()
    return out


def train_classifier(
    name: str,
    spec: ModelSpec,
    vocab_size: int,
    train_seqs: Sequence[Sequence[int]],
    train_labels: np.ndarray,
    val_seqs: Sequence[Sequence[int]],
    val_labels: np.ndarray,
    seed: int,
    threads: Optional[int] = None,
):
    """Train one classifier; return ``(best model, report dict)``.

    Loss: ``BCEWithLogitsLoss`` on logit [batch] vs label {0, 1}. AdamW (no weight decay on
    biases and LayerNorm), linear warmup over ``warmup_fraction`` of the steps then linear
    decay to 0, gradient norm clipped to 1. After each epoch the validation accuracy
    (logit >= 0 -> positive) is measured; the weights of the best epoch (first on ties)
    are returned. Torch threads: :class:`ThreadGovernor` (``threads`` pins the count).
    """
    import torch
    from tqdm.auto import tqdm

    _seed_everything(seed)
    model = build_model(spec, vocab_size)
    n_params = sum(p.numel() for p in model.parameters())
    decay, no_decay = [], []
    for pname, p in model.named_parameters():
        (no_decay if pname.endswith("bias") or "LayerNorm" in pname else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.learning_rate,
    )
    steps_per_epoch = math.ceil(len(train_seqs) / spec.batch_size)
    total = steps_per_epoch * spec.epochs
    warmup = max(1, int(spec.warmup_fraction * total))

    def lr_lambda(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng = np.random.RandomState(seed)
    lengths = [len(s) for s in train_seqs]
    history = []
    best_acc, best_epoch, best_state = -1.0, 0, None
    gov = ThreadGovernor(_num_cores(), fixed=threads)
    t0 = time.perf_counter()
    for epoch in range(1, spec.epochs + 1):
        model.train()
        te = time.perf_counter()
        losses = []
        batches = _length_batches(lengths, spec.batch_size, rng)
        bar = tqdm(batches, desc=f"{name} epoch {epoch}/{spec.epochs}", unit="batch",
                   mininterval=5.0, leave=False, file=sys.stderr)
        for b in bar:
            ids, mask = _pad([train_seqs[i] for i in b])
            y = torch.from_numpy(train_labels[b].astype(np.float32))
            logits = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits[:, 0]
            loss = loss_fn(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            gov.step()
            losses.append(float(loss.detach()))
            if len(losses) % 20 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
        bar.close()
        val_pred = torch_logits(model, val_seqs) >= 0
        val_acc = float(np.mean(val_pred == (val_labels == 1)))
        rec = {
            "epoch": epoch,
            "train_loss": round(float(np.mean(losses)), 4),
            "validation_accuracy": round(val_acc, 4),
            "seconds": round(time.perf_counter() - te, 1),
        }
        history.append(rec)
        _log(f"{name} epoch {epoch}/{spec.epochs}: loss {rec['train_loss']:.4f} "
             f"val acc {val_acc:.4f} ({rec['seconds']:.0f}s)")
        if val_acc > best_acc:
            best_acc, best_epoch = val_acc, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert best_state is not None
    model.load_state_dict(best_state)
    model.eval()
    report = {
        "parameters": int(n_params),
        "spec": asdict(spec),
        "steps": total,
        "best_epoch": best_epoch,
        "best_validation_accuracy": round(best_acc, 4),
        "history": history,
        "train_seconds": round(time.perf_counter() - t0, 1),
        "steps_by_torch_threads": {str(k): v for k, v in sorted(gov.steps_by_threads.items())},
    }
    torch.set_num_threads(_num_cores())
    return model, report


# --------------------------------------------------------------------------- ONNX


def _logits_module(model):
    """Wrap ``model`` as a torch module ``(input_ids, attention_mask) -> logits [batch, 1]``."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).logits

    return LogitsOnly(model).eval()


def export_onnx(model, path: Path, opset: int = OPSET, example=None) -> None:
    """Export ``model`` to ``path`` (one self-contained file, dynamic batch/sequence).

    Inputs ``input_ids``, ``attention_mask``: int64 [batch, sequence]; output ``logits``:
    float32 [batch, num_labels]. ``example``: ``(input_ids, attention_mask)`` int64 arrays
    to trace with (default: two short rows). Written to a temporary file first, then moved
    into place.

    Raises:
        ExportValidationError: the exporter wrote external data files (models over 2 GB).
    """
    import onnx
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    if example is None:
        ids = torch.tensor([[2, 10, 11, 12, 3, 0], [2, 13, 14, 15, 16, 3]], dtype=torch.long)
        mask = (ids != 0).long()
    else:
        ids, mask = (torch.as_tensor(np.asarray(a, dtype=np.int64)) for a in example)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        tmp_path = Path(tmp) / "model.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _logits_module(model), (ids, mask), str(tmp_path),
                input_names=["input_ids", "attention_mask"], output_names=["logits"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "logits": {0: "batch"},
                },
                opset_version=opset, do_constant_folding=True, dynamo=False,
            )
        extra = [p.name for p in Path(tmp).iterdir() if p.name != "model.onnx"]
        if extra:  # > 2 GB models get external data; not supported by this layout
            raise ExportValidationError(f"export wrote external data files {extra}; expected one file")
        onnx.checker.check_model(onnx.load(str(tmp_path)))
        os.replace(tmp_path, path)


def ort_session(path: Path, threads: Optional[int] = None):
    """An onnxruntime CPU ``InferenceSession`` for ``path``."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or _num_cores()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def ort_logits(sess, seqs: Sequence[Sequence[int]], batch_size: int = 64, pad_to: Optional[int] = None) -> np.ndarray:
    """float32 logits [n] from an ONNX session; batches padded to longest or to ``pad_to``."""
    out = np.zeros(len(seqs), dtype=np.float32)
    for b in _sorted_batches([len(s) for s in seqs], batch_size):
        ids, mask = _pad([seqs[i] for i in b], pad_to)
        lg = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
        if lg.dtype != np.float32 or lg.shape != (len(b), 1):
            raise ExportValidationError(f"ONNX logits {lg.dtype} {lg.shape}, expected float32 ({len(b)}, 1)")
        out[b] = lg[:, 0]
    return out


def validate_onnx(model, path: Path, seqs: Sequence[Sequence[int]]) -> dict:
    """Compare the ONNX model with torch and with itself under padding; return the diffs.

    Checks, each max abs logit difference < 1e-4: onnxruntime vs torch (batches padded to
    longest); onnxruntime padded to 512 vs padded to longest; batch of one vs batched;
    input/output names, dtypes and the symbolic batch/sequence dims.
    Raises :class:`ExportValidationError` on any failure.
    """
    sess = ort_session(path)
    ins = {i.name: i for i in sess.get_inputs()}
    outs = {o.name: o for o in sess.get_outputs()}
    if set(ins) != {"input_ids", "attention_mask"} or set(outs) != {"logits"}:
        raise ExportValidationError(f"ONNX names: inputs {sorted(ins)}, outputs {sorted(outs)}")
    for n in ins:
        if ins[n].type != "tensor(int64)" or not all(isinstance(d, str) for d in ins[n].shape):
            raise ExportValidationError(f"input {n}: {ins[n].type} {ins[n].shape}")
    if outs["logits"].type != "tensor(float)" or not isinstance(outs["logits"].shape[0], str) \
            or outs["logits"].shape[1] != 1:
        raise ExportValidationError(f"output logits: {outs['logits'].type} {outs['logits'].shape}")
    ref = torch_logits(model, seqs, batch_size=32)
    got = ort_logits(sess, seqs, batch_size=32)
    padded = ort_logits(sess, seqs, batch_size=32, pad_to=PAD_TO)
    single = np.array([ort_logits(sess, [s])[0] for s in seqs[:16]], dtype=np.float32)
    diffs = {
        "examples": len(seqs),
        "max_abs_diff_onnx_vs_torch": float(np.max(np.abs(got - ref))),
        "max_abs_diff_pad512_vs_longest": float(np.max(np.abs(padded - got))),
        "max_abs_diff_batch1_vs_batched": float(np.max(np.abs(single - got[:16]))),
    }
    bad = {k: v for k, v in diffs.items() if k != "examples" and not v < TOL}
    if bad:
        raise ExportValidationError(f"{path}: logit differences over {TOL}: {bad}")
    return diffs


# --------------------------------------------------------------------------- evaluation


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


def _fmt_table(test: dict, systems: Sequence[str]) -> str:
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

{_fmt_table(test, ['classifier', 'classifier_fast', 'vader'])}

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


def _environment(load_average_start: float) -> dict:
    """Package versions, platform, cores, torch threads and the 1-minute load at start."""
    import importlib.metadata as md

    import torch

    v = {"python": platform.python_version(), "platform": platform.platform()}
    for p in ("torch", "transformers", "tokenizers", "onnx", "onnxruntime", "numpy", "vaderSentiment"):
        try:
            v[p] = md.version(p)
        except md.PackageNotFoundError:
            v[p] = None
    v["cpu_cores"] = _num_cores()
    v["load_average_start"] = round(load_average_start, 2)
    v["torch_threads"] = torch.get_num_threads()
    return v


def artifact_paths(out: Path) -> list[Path]:
    """The files this module writes under ``out`` (the ones counted against 25 MB)."""
    paths = [out / "tokenizer" / "1" / n for n in TOKENIZER_FILES]
    paths += [out / m / "1" / "model.onnx" for m in MODEL_NAMES]
    paths += [out / "training_metrics.json", out / "MODEL_CARD.md"]
    return paths


# --------------------------------------------------------------------------- main


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
    torch.set_num_threads(_num_cores())
    _seed_everything(seed)
    out = Path(out)
    require_beat_vader = (not quick) if require_beat_vader is None else require_beat_vader

    _log(f"loading corpus (data dir {data_dir or D.default_data_dir()})")
    examples = D.load_examples(data_dir)
    splits = D.split(examples, seed=seed)
    n_labeled = sum(1 for e in examples if e.label is not None)
    train_ex, val_ex, test_ex = splits["train"], splits["validation"], splits["test"]
    if quick:
        rs = np.random.RandomState(seed)
        train_ex = [train_ex[i] for i in sorted(rs.permutation(len(train_ex))[:QUICK_TRAIN])]
        val_ex = [val_ex[i] for i in sorted(rs.permutation(len(val_ex))[:QUICK_VALIDATION])]
    _log(f"splits: train {len(train_ex)}, validation {len(val_ex)}, test {len(test_ex)}")

    t = time.perf_counter()
    tokenizer = train_tokenizer([e.text for e in splits["train"]])
    tok_dir = out / "tokenizer" / "1"
    save_tokenizer(tokenizer, tok_dir)
    tokenizer_seconds = time.perf_counter() - t
    vocab_size = len(tokenizer.get_vocab())
    _log(f"tokenizer: {vocab_size} tokens -> {tok_dir} ({tokenizer_seconds:.1f}s)")

    train_seqs = _encode(tokenizer, [e.text for e in train_ex])
    val_seqs = _encode(tokenizer, [e.text for e in val_ex])
    test_seqs = _encode(tokenizer, [e.text for e in test_ex])
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
        _log(f"training {name}: {spec}")
        model, rep = train_classifier(name, spec, vocab_size, train_seqs, y_train, val_seqs, y_val, seed,
                                      threads=threads)
        path = out / name / "1" / "model.onnx"
        export_onnx(model, path)
        rep["onnx_validation"] = validate_onnx(model, path, check_seqs)
        rep["onnx_bytes"] = path.stat().st_size
        _log(f"{name}: {rep['parameters']:,} parameters, best epoch {rep['best_epoch']} "
             f"(val acc {rep['best_validation_accuracy']:.4f}), ONNX {rep['onnx_bytes']:,} bytes, "
             f"check {rep['onnx_validation']}")
        preds[name] = ort_logits(ort_session(path), test_seqs) >= 0
        reports[name] = rep
        del model

    preds["vader"] = vader_predictions([e.text for e in test_ex])
    test_metrics = evaluate(test_ex, preds)
    print(_fmt_table(test_metrics, ["classifier", "classifier_fast", "vader"]), flush=True)

    metrics = {
        "command": command or "python -m orchestrator.tooling.modeling.train",
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
        "environment": _environment(load_start),
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
    _log(f"artifacts: {total:,} bytes (limit {SIZE_LIMIT_BYTES:,}); total time "
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
    p = argparse.ArgumentParser(prog="python -m orchestrator.tooling.modeling.train", description=__doc__.split("\n")[0])
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
    command = "python -m orchestrator.tooling.modeling.train" + ("" if not cmd_args else " " + shlex.join(cmd_args))
    try:
        run(args.out, quick=args.quick, epochs=args.epochs, seed=args.seed,
            data_dir=args.data_dir, command=command, threads=args.threads)
    except (ExportValidationError, ArtifactSizeError, BaselineNotBeatenError, D.DataUnavailableError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
