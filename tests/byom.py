"""Bring-your-own-model checkpoints for the export, parity and server tests.

Tiny Hugging Face sequence classifiers built here from ``transformers`` configs (random
weights, no download) with tokenizers trained here with the ``tokenizers`` library, each
saved with ``save_pretrained`` like a user's checkpoint directory:

| name | model | labels | tokenizer |
|---|---|---|---|
| ``bert1`` | BERT | 1 logit (``LABEL_0``) | WordPiece |
| ``bert2`` | BERT | ``NEGATIVE``, ``POSITIVE`` | WordPiece |
| ``distilbert2`` | DistilBERT | ``LABEL_0``, ``LABEL_1`` | WordPiece |
| ``roberta2`` | RoBERTa | ``LABEL_0``, ``LABEL_1`` | byte-level BPE, pad id 1 |
| ``stars5`` | BERT | ``1 star`` .. ``5 stars`` | WordPiece |
| ``toxic6`` | BERT, ``multi_label_classification`` | the six toxic-comment labels | WordPiece |

:func:`expected_probabilities` is what a served head must answer for :data:`TEXTS`,
computed with torch from the checkpoint: sigmoid of one logit, the softmax's positive
column for two, softmax for more, sigmoid per label for multilabel.
:func:`build_checkpoints` builds all of them; the ``byom_checkpoints`` fixture (import it
into a test module) returns ``{name: (checkpoint_dir, expected probabilities)}`` once a
session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import pytest

SENTENCES = [
    "a good movie with great acting",
    "a bad movie with a terrible plot",
    "great fun for the whole family",
    "not worth the ticket",
    "the acting was fine but the story was boring",
    "I loved it and would watch it again",
    "you are an idiot and I hate you",
    "thank you for the kind and helpful answer",
]
#: Texts the tests classify: known words, unknown words, empty, punctuation, over-long.
TEXTS = [
    "a good movie with great acting",
    "TERRIBLE, boring plot!",
    "unseen words: zebra quantum",
    "",
    "you are an idiot",
    "movie " * 120,
]
MAX_LENGTH = 48  # the tokenizers' model_max_length
TOXIC_LABELS = ("toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate")
STAR_LABELS = ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")
#: name -> (architecture, labels or a count, problem_type)
SPECS = {
    "bert1": ("bert", 1, None),
    "bert2": ("bert", ("NEGATIVE", "POSITIVE"), "single_label_classification"),
    "distilbert2": ("distilbert", 2, None),
    "roberta2": ("roberta", 2, None),
    "stars5": ("bert", STAR_LABELS, "single_label_classification"),
    "toxic6": ("bert", TOXIC_LABELS, "multi_label_classification"),
    # the labels of bert2: a router may serve the two side by side (tests/server/test_byom.py)
    "roberta_sst2": ("roberta", ("NEGATIVE", "POSITIVE"), "single_label_classification"),
}


def wordpiece_tokenizer(max_length: int = MAX_LENGTH, vocab_size: int = 150):
    """A lower-casing BERT WordPiece tokenizer trained on :data:`SENTENCES` (pad id 0)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(SENTENCES * 3, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                                     show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return BertTokenizerFast(tokenizer_object=tok, do_lower_case=True, model_max_length=max_length,
                             model_input_names=["input_ids", "attention_mask"])


def bpe_tokenizer(max_length: int = MAX_LENGTH, vocab_size: int = 300):
    """A RoBERTa byte-level BPE tokenizer trained on :data:`SENTENCES` (``<s>`` 0, pad 1)."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES * 3, vocab_size=vocab_size, min_frequency=1, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, model_max_length=max_length,
                                bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
                                unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                                model_input_names=["input_ids", "attention_mask"])


def _labels(spec) -> Tuple[int, dict]:
    if isinstance(spec, int):
        return spec, {}
    return len(spec), {"id2label": dict(enumerate(spec)), "label2id": {x: i for i, x in enumerate(spec)}}


def build_checkpoint(name: str, path: Path, seed: int = 0, spec=None) -> Path:
    """Build checkpoint ``name`` of :data:`SPECS` (or ``spec``, a tuple like theirs) into
    ``path`` (``save_pretrained``)."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        DistilBertConfig,
        DistilBertForSequenceClassification,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    arch, labels, problem = spec or SPECS[name]
    num_labels, label_kwargs = _labels(labels)
    extra = dict(label_kwargs, **({"problem_type": problem} if problem else {}))
    tok = bpe_tokenizer() if arch == "roberta" else wordpiece_tokenizer()
    vocab = len(tok.get_vocab())
    torch.manual_seed(seed + num_labels)
    if arch == "bert":
        cfg = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, num_labels=num_labels, pad_token_id=0, **extra)
        model = BertForSequenceClassification(cfg)
        last = model.classifier
    elif arch == "distilbert":
        cfg = DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                               max_position_embeddings=64, num_labels=num_labels, pad_token_id=0, **extra)
        model = DistilBertForSequenceClassification(cfg)
        last = model.classifier
    else:  # RoBERTa positions start after the padding index: max_length + 2 positions
        cfg = RobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=MAX_LENGTH + 2, num_labels=num_labels,
                            pad_token_id=1, bos_token_id=0, eos_token_id=2, **extra)
        model = RobertaForSequenceClassification(cfg)
        last = model.classifier.out_proj
    with torch.no_grad():  # logits of a few units, so probabilities spread over (0, 1)
        last.weight.mul_(40.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def torch_logits(checkpoint: Path, texts=TEXTS) -> np.ndarray:
    """float64 logits [N, K] of the checkpoint, texts truncated to the tokenizer's
    ``model_max_length``, each text alone (no padding)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint), attn_implementation="eager").eval()
    rows = []
    with torch.inference_mode():
        for text in texts:
            enc = tok([text], truncation=True, return_tensors="pt")
            rows.append(model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.double().numpy()[0])
    return np.stack(rows)


def expected_probabilities(checkpoint: Path, texts=TEXTS) -> np.ndarray:
    """float64 [N, C]: what the served head answers, from torch's logits (see the module doc)."""
    import torch
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(checkpoint))
    z = torch.from_numpy(torch_logits(checkpoint, texts))
    if cfg.problem_type == "multi_label_classification" or cfg.num_labels == 1:
        return torch.sigmoid(z).numpy()
    p = torch.softmax(z, dim=1).numpy()
    if cfg.num_labels == 2:
        labels = [cfg.id2label[i] for i in range(2)]
        named = [i for i, x in enumerate(labels) if x.lower() == "positive"]
        return p[:, [named[0] if named else 1]]
    return p


def build_checkpoints(base: Path) -> Dict[str, Tuple[Path, np.ndarray]]:
    """Every checkpoint of :data:`SPECS` under ``base/<name>``, with its expected
    probabilities for :data:`TEXTS`."""
    out = {}
    for name in SPECS:
        path = build_checkpoint(name, base / name)
        out[name] = (path, expected_probabilities(path))
    return out


@pytest.fixture(scope="session")
def byom_checkpoints(tmp_path_factory) -> Dict[str, Tuple[Path, np.ndarray]]:
    """``{name: (checkpoint_dir, expected probabilities [len(TEXTS), C])}`` for :data:`SPECS`."""
    pytest.importorskip("torch", reason="needs torch (the `train` extra: make test installs it, make demo does not)")
    return build_checkpoints(tmp_path_factory.mktemp("byom"))


def export_all(checkpoints: Dict[str, Tuple[Path, np.ndarray]], repo: Path) -> dict:
    """Export every checkpoint into ``repo`` under its name; ``{name: ExportResult}``."""
    from orchestrator.tooling.modeling.export import export_checkpoint

    return {name: export_checkpoint(str(ckpt), repo, name, quiet=True, tensorrt=False)
            for name, (ckpt, _) in checkpoints.items()}


def served_models(names) -> list:
    """The models ``NAME_ensemble`` needs for each of ``names``, ensembles last."""
    parts = [f"{n}_{suffix}" for n in names for suffix in ("tokenizer", "postprocess")]
    return parts + list(names) + [f"{n}_ensemble" for n in names]


def start_server(repo: Path, models):
    """A started ``orchestrator.tooling.server.TritonServer`` on ``repo`` loading ``models``
    (the caller stops it)."""
    from orchestrator.tooling.server import TritonServer

    return TritonServer(repo, models=list(models)).start()


def infer(url: str, model: str, texts, thresholds: np.ndarray, class_count: int = 0):
    """One HTTP request to an ensemble or router: ``(PROBABILITIES, VERDICTS)`` as numpy, or
    with ``class_count`` the classification extension's ``score:index:label`` strings
    instead of the probabilities."""
    import tritonclient.http as http

    client = http.InferenceServerClient(url)
    try:
        data = np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)
        inputs = [http.InferInput("TEXT", list(data.shape), "BYTES"),
                  http.InferInput("THRESHOLD", list(thresholds.shape), "FP32")]
        inputs[0].set_data_from_numpy(data)
        inputs[1].set_data_from_numpy(thresholds.astype(np.float32))
        outputs = [http.InferRequestedOutput("PROBABILITIES", class_count=class_count), http.InferRequestedOutput("VERDICTS")]
        result = client.infer(model, inputs, outputs=outputs)
    finally:
        client.close()
    return result.as_numpy("PROBABILITIES"), result.as_numpy("VERDICTS")
