"""Settings of ``make model``: lengths, limits, the two classifiers' architectures, its errors."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.modeling.torch_export import OPSET  # noqa: F401 (the exported models' opset)

MAX_LENGTH = 128  # tokenizer model_max_length and training max sequence length
MAX_POSITIONS = 512  # so inputs padded to 512 (the seeds' pad length) still run
PAD_TO = 512
SIZE_LIMIT_BYTES = 25_000_000
TOL = 1e-4  # max abs logit difference accepted in export validation
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
MODEL_NAMES = ("classifier", "classifier_fast")


class ArtifactSizeError(ToolingError):
    """The artifacts exceed :data:`SIZE_LIMIT_BYTES`."""


class BaselineNotBeatenError(ToolingError):
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


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

