"""The demo tokenizer: WordPiece trained on the train split, saved in the BERT layout."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Sequence

from lab.train.specs import MAX_LENGTH, SPECIAL_TOKENS, TOKENIZER_FILES, VOCAB_SIZE
from orchestrator.tooling.files import copy_atomic


def train_tokenizer(texts: Sequence[str], vocab_size: int = VOCAB_SIZE):
    """Train a lower-casing WordPiece tokenizer on ``texts``; return a ``BertTokenizerFast``.

    ``model_max_length`` 128, ``do_lower_case`` True, ``[PAD]`` id 0; the model inputs it
    returns are ``input_ids`` and ``attention_mask`` (no ``token_type_ids``).

    Deterministic: ``WordPieceTrainer`` gives ``##``-continuation tokens ids in hash-map
    order, which breaks merge ties differently from run to run (upstream:
    huggingface/tokenizers#1794). Seeding every ``##<char>`` of the training alphabet, in sorted order, as
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
            copy_atomic(src, dst, 0o644)
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

