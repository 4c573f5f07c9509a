"""Labeled texts for parity: files (``.jsonl``, TSV) and the held-out test split."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from orchestrator.tooling.errors import ToolingError


class ParityError(ToolingError):
    """Bad data or models (message says which), or a target precision no threshold reaches."""



@dataclass
class LabeledData:
    """Texts with labels. ``labels``: int64 [n], 0 or 1 (binary heads) or the label's index
    (multiclass heads), or bool [n, K] (multilabel heads: which labels apply). ``source``:
    where they came from."""

    texts: list
    labels: np.ndarray
    source: str

    def digest(self) -> str:
        """sha256 over ``label TAB text LF`` lines (a multilabel row as its 0/1 values joined
        by commas): identifies the exact data of a report."""
        h = hashlib.sha256()
        for t, y in zip(self.texts, self.labels):
            lab = ",".join(str(int(v)) for v in y) if np.ndim(y) else str(int(y))
            h.update(f"{lab}\t{t}\n".encode("utf-8"))
        return h.hexdigest()


def _parse_label(value, where: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false"):
        return int(value.strip().lower() in ("1", "true"))
    raise ParityError(f"{where}: label {value!r} is not 0/1")


def _parse_class(value, where: str, labels: Sequence[str]) -> int:
    if isinstance(value, str) and value in labels:
        return labels.index(value)
    if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).strip().isdigit() \
            and int(value) < len(labels):
        return int(value)
    raise ParityError(f"{where}: label {value!r} is neither one of {list(labels)} nor an index below {len(labels)}")


def _parse_labels(value, where: str, labels: Sequence[str]) -> list:
    names = [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else value
    if not isinstance(names, list) or any(not isinstance(x, str) or x not in labels for x in names):
        raise ParityError(f"{where}: label {value!r}: expected a list of labels among {list(labels)} "
                          "(TSV: comma-separated, empty for none)")
    return [x in names for x in labels]


def label_parser(head=None):
    """``parse(value, where)`` of one text's label for ``head`` (``orchestrator.runtime.routing.heads``;
    None or binary: 0/1)."""
    if head is None or head.kind == "binary":
        return _parse_label
    if head.kind == "multiclass":
        return lambda v, where: _parse_class(v, where, head.labels)
    return lambda v, where: _parse_labels(v, where, head.labels)


def read_labeled(path: os.PathLike | str, head=None) -> LabeledData:
    """Read labeled texts for the models' ``head`` (default: binary).

    Formats (by extension): ``.jsonl`` one JSON object a line with ``text`` (string) and
    ``label`` (other keys ignored); ``.tsv`` (or anything else) one ``label<TAB>text`` a
    line, split at the first tab so texts may contain tabs, an optional header line
    ``label<TAB>text``. Blank lines are skipped. Labels: binary heads 0/1 (true/false);
    multiclass heads the label's name or index; multilabel heads the labels that apply
    (JSON: a list of names; TSV: names separated by commas, empty for none). Raises
    :class:`ParityError` (file and line) on a malformed line, a label that does not fit the
    head, or no data; ``OSError``.
    """
    parse = label_parser(head)
    path = Path(path)
    texts, labels = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        where = f"{path.name}:{n}"
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ParityError(f"{where}: not JSON: {e}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or "label" not in obj:
                raise ParityError(f"{where}: expected an object with string 'text' and 'label'")
            texts.append(obj["text"])
            labels.append(parse(obj["label"], where))
        else:
            if "\t" not in line:
                raise ParityError(f"{where}: expected label<TAB>text")
            lab, text = line.split("\t", 1)
            if n == 1 and lab.strip().lower() == "label":
                continue
            texts.append(text)
            labels.append(parse(lab, where))
    if not texts:
        raise ParityError(f"{path}: no labeled texts")
    dtype = bool if head is not None and head.kind == "multilabel" else np.int64
    return LabeledData(texts, np.asarray(labels, dtype=dtype), f"file {path}")


def write_labeled(path: os.PathLike | str, data: LabeledData, extra: Optional[Sequence[dict]] = None) -> Path:
    """Write ``data`` as ``.jsonl`` (``{"text", "label", **extra[i]}``) or TSV (``label<TAB>text``
    with a header; texts containing a newline cannot be TSV: :class:`ParityError`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        lines = [json.dumps({"text": t, "label": int(y), **(extra[i] if extra else {})}, ensure_ascii=False)
                 for i, (t, y) in enumerate(zip(data.texts, data.labels))]
    else:
        bad = [i for i, t in enumerate(data.texts) if "\n" in t or "\r" in t]
        if bad:
            raise ParityError(f"text {bad[0]} contains a line break; write .jsonl instead")
        lines = ["label\ttext"] + [f"{int(y)}\t{t}" for t, y in zip(data.texts, data.labels)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def held_out_data(data_dir=None) -> tuple[LabeledData, list[dict]]:
    """The test split of :mod:`orchestrator.tooling.modeling.data` (``held_out_examples()``: every corpus,
    ``sort_key`` order), as data plus per-text ``{"corpus", "id", "rating"}``. Raises what
    :func:`orchestrator.tooling.modeling.data.held_out_examples` raises (``DataUnavailableError``)."""
    from orchestrator.tooling.modeling import data as D

    ex = D.held_out_examples(data_dir=data_dir)
    d = LabeledData([e.text for e in ex], np.array([e.label for e in ex], dtype=np.int64),
                    "orchestrator.tooling.modeling.data.held_out_examples(): the test split (seed 0) of the vaderSentiment 3.3.2 "
                    "ground truth, all four corpora")
    return d, [{"corpus": e.corpus, "id": e.id, "rating": e.rating} for e in ex]

