"""``lab.bench.long_texts`` offline: the same-label and turning long texts, the
all-windows router copy, the report section and that ``make bench`` keeps it (the
measurements need a server: ``make bench-long``)."""

from __future__ import annotations

import yaml

from lab.bench.long_texts import (
    ALL_WINDOWS,
    KINDS,
    MODELS,
    chunk_nodes,
    long_text_sets,
    make_long_repository,
    render_section,
    same_label_long_texts,
    without_stopping,
)
from lab.bench.report import FEATURES_END, FEATURES_START, LONG_END, LONG_START, render_report, replace_section
from orchestrator.runtime.routing.policy import load_policy
from tests.helpers import REPO, bench_results


def words(n: int, tag: str) -> str:
    return " ".join([tag] * n)


def test_long_texts_join_only_sentences_of_one_label():
    # token count of a sentence = words + 2; a join of k sentences: sum - 2 (k - 1)
    texts = [words(8, "p1"), words(8, "n1"), words(8, "p2"), words(8, "n2"), words(8, "p3"), words(30, "n3"), words(8, "p4")]
    labels = [1, 0, 1, 0, 1, 0, 1]
    lengths = [len(t.split()) + 2 for t in texts]
    count = lambda t: len(t.split()) + 2  # noqa: E731
    out = same_label_long_texts(texts, labels, lengths, count, bounds=(26, 40))
    # positives: 10 + 10 - 2 + 10 - 2 = 26 after p1 p2 p3 (kept); negatives: n1 n2 n3 = 10 + 8 + 32 = 50 > 40 (dropped)
    assert out == [(" ".join([texts[0], texts[2], texts[4]]), 1)]
    assert same_label_long_texts(texts, labels, lengths, count, bounds=(26, 60)) == [
        (" ".join([texts[0], texts[2], texts[4]]), 1), (" ".join([texts[1], texts[3], texts[5]]), 0)]
    assert len(same_label_long_texts(texts, labels, lengths, count, bounds=(26, 60), n=1)) == 1
    # the real count decides: a join the estimate keeps but the tokenizer counts over is dropped
    assert same_label_long_texts(texts, labels, lengths, lambda t: 99, bounds=(26, 60)) == []


def test_all_windows_copy_drops_only_the_stopping_keys(tmp_path):
    shipped = make_long_repository(tmp_path / "repo")
    stopped = [c for c in chunk_nodes(shipped["root"]) if c.get("stop_margin") is not None or c.get("stop_when_decided")]
    assert {c["name"] for c in stopped} == {"chunk_long", "chunk_fast", "chunk_accurate"}  # the shipped policy opts in
    copy = yaml.safe_load((tmp_path / "repo" / ALL_WINDOWS / "policy.yaml").read_text())
    assert copy["root"] == without_stopping(shipped["root"])
    for c in chunk_nodes(copy["root"]):
        assert not {"stop_when_decided", "stop_margin", "max_windows"} & set(c), c
        assert c["node"] and c.get("name")
    load_policy(tmp_path / "repo" / ALL_WINDOWS / "policy.yaml")  # valid
    assert without_stopping({"kind": "model", "stop_margin": 1}) == {"kind": "model", "stop_margin": 1}  # chunk keys only
    assert (tmp_path / "repo" / "router" / "policy.yaml").read_text() == (REPO / "router" / "policy.yaml").read_text()


def results():
    perf = [{"model": m, "dataset": f"long_{k}", "throughput": t, "p50_ms": 10.0, "p99_ms": 30.0, "stable": True}
            for k in KINDS for m, t in zip(MODELS, (100.0, 40.0, 120.0))]
    acc = {k: {m: {"n": 10, "correct": c, "accuracy_pct": 10.0 * c, "routes": {"chunked:classifier_fast:windows=1/3": 9}}
               for m, c in zip(MODELS, cs)} for k, cs in (("same_label", (8, 10, 9)), ("turning", (2, 8, 7)))}
    ds = {"n": 10, "positive": 5, "tokens_min": 256, "tokens_max": 300, "tokens_p50": 270.0,
          "windows_min": 3, "windows_max": 3, "windows_mean": 3.0}
    win = {"router_all_windows": {"classified_per_text": 3.2, "skipped_per_text": 0.0},
           "router": {"classified_per_text": 1.3, "skipped_per_text": 1.9}}
    return {"started_utc": "2026-01-01 00:00", "machine": {"cores": 2, "cpu_model": "cpu"}, "load_start": [1.0],
            "load_end": [1.0], "wall_s": 300.0, "quick": False, "concurrency": 4, "rounds": 2, "bounds": [256, 384],
            "datasets": {"same_label": ds, "turning": ds}, "loaded": True,
            "stopping": [{"name": "chunk_fast", "keys": {"stop_when_decided": True}}], "measurements": perf, "accuracy": acc,
            "windows": {"same_label": win, "turning": win},
            "goal": {"ratio": 1.2, "router_accuracy_pct": 90.0, "ensemble_accuracy_pct": 80.0, "met": True},
            "turning_goal": {"router_accuracy_pct": 70.0, "all_windows_accuracy_pct": 80.0, "met": False}}


def test_section_reports_both_kinds_each_model_and_the_goals():
    text = render_section(results())
    assert text.startswith(LONG_START) and text.endswith(LONG_END)
    assert "| same-label | `router` | 90.00% (9/10) | 1.30 | 1.90 | 120.0 | 1.20x | 10.00 | 30.00 | yes |" in text
    assert "| turning | `router_all_windows` | 80.00% (8/10) | 3.20 | 0.00 |" in text
    assert "| turning | `ensemble` | 20.00% (2/10) | 1 (truncated) |" in text
    assert "**met** (throughput 1.20x, accuracy 90.00% vs 80.00%)" in text
    assert "within 2 points of `router_all_windows`: **not met** (70.00% vs 80.00%)" in text
    assert "the text's label is the later, longer part's" in text and "not valid: the machine was loaded" in text
    assert "- turning: `chunked:classifier_fast:windows=1/3` 9" in text
    assert "10 texts (5 positive) of 256 to 300 tokens" in text and "3 windows a text" in text
    assert "`chunk_fast` `stop_when_decided: true`." in text


def test_both_kinds_of_long_text_come_from_the_held_out_order_with_their_label_rules():
    from transformers import AutoTokenizer

    from orchestrator.tooling.modeling import data

    tok = AutoTokenizer.from_pretrained(str(REPO / "tokenizer" / "1"))
    held = data.held_out_examples()[:600]
    sets = long_text_sets(tok, held, n=5)
    assert len(sets["same_label"]) == 5 and len(sets["turning"]) == 5
    by_text = {e.text: int(e.label) for e in held}
    for text, label in sets["turning"]:
        parts = [t for t in by_text if t in text]
        # the opening's sentences have the other label, the later part's this one
        assert text.startswith(tuple(t for t in parts if by_text[t] != label))
        assert text.endswith(tuple(t for t in parts if by_text[t] == label))


def test_make_bench_keeps_the_long_texts_and_features_sections(tmp_path):
    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n")
    replace_section(report, f"{LONG_START}\nfirst\n{LONG_END}", LONG_START, LONG_END)
    replace_section(report, f"{LONG_START}\nsecond\n{LONG_END}", LONG_START, LONG_END)
    text = report.read_text()
    assert text.count(LONG_START) == 1 and "second" in text and "first" not in text
    text += f"\n{FEATURES_START}\nfeatures\n{FEATURES_END}\n"
    rendered = render_report(bench_results(), existing=text)
    assert f"{LONG_START}\nsecond\n{LONG_END}" in rendered and f"{FEATURES_START}\nfeatures\n{FEATURES_END}" in rendered
