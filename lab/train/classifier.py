"""Training one classifier: batching, the CPU thread governor, the loop with its best epoch."""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict
from typing import Optional, Sequence

import numpy as np

from lab.train.specs import MAX_LENGTH, MAX_POSITIONS, ModelSpec, log, seed_everything
from orchestrator.tooling.modeling.contract import num_cores


def encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return tokenizer(list(texts), truncation=True, max_length=MAX_LENGTH)["input_ids"]


def pad(seqs: Sequence[Sequence[int]], length: Optional[int] = None):
    """Right-pad id lists with 0; return int64 ``input_ids`` and ``attention_mask`` [b, length]."""
    n = max(len(s) for s in seqs) if length is None else length
    ids = np.zeros((len(seqs), n), dtype=np.int64)
    mask = np.zeros((len(seqs), n), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def length_batches(lengths: Sequence[int], batch_size: int, rng: np.random.RandomState) -> list[np.ndarray]:
    """Shuffled batches of similar length (chunks of 50 batches sorted by length)."""
    order = rng.permutation(len(lengths))
    chunk = batch_size * 50
    batches = []
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        part = part[np.argsort([lengths[i] for i in part], kind="stable")]
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
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
        for b in sorted_batches([len(s) for s in seqs], batch_size):
            ids, mask = pad([seqs[i] for i in b])
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

    seed_everything(seed)
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
    gov = ThreadGovernor(num_cores(), fixed=threads)
    t0 = time.perf_counter()
    for epoch in range(1, spec.epochs + 1):
        model.train()
        te = time.perf_counter()
        losses = []
        batches = length_batches(lengths, spec.batch_size, rng)
        bar = tqdm(batches, desc=f"{name} epoch {epoch}/{spec.epochs}", unit="batch",
                   mininterval=5.0, leave=False, file=sys.stderr)
        for b in bar:
            ids, mask = pad([train_seqs[i] for i in b])
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
        log(f"{name} epoch {epoch}/{spec.epochs}: loss {rec['train_loss']:.4f} "
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
    torch.set_num_threads(num_cores())
    return model, report
