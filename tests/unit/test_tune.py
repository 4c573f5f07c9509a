"""``orchestrator tune``: targets, the cascade and stop_margin curves on fake answers, the
choice of the cheapest point, the runtime's stopping rules reused, the comment-keeping
policy edit, turning long texts, and one end-to-end run on a BYOM 2-label checkpoint pair
exported here (orchestrator/tooling/tune.py)."""

from __future__ import annotations

import argparse
import difflib
import inspect
import time

import numpy as np
import pytest
import yaml

from lab.bench.long_texts import turning_long_texts
from orchestrator.runtime.routing import policy as P
from orchestrator.runtime.routing.heads import BINARY, MULTICLASS, MULTILABEL, Head
from orchestrator.runtime.routing.nodes.chunk import ChunkNode
from orchestrator.tooling import tune as T

BIN = Head(BINARY, ("positive",))


def test_targets_parse_and_bad_ones_are_named():
    assert T.parse_target("accuracy>=last") == T.Target("accuracy", None)
    assert T.parse_target(" agreement >= 0.99 ") == T.Target("agreement", 0.99)
    assert T.parse_target("noninferior:0.5") == T.Target("noninferior", 0.5)
    assert str(T.parse_target(" noninferior : 1 ")) == "noninferior:1"
    for bad in ("accuracy>last", "agreement>=last", "accuracy>=1.5", "speed>=1", "noninferior:101", "noninferior", "noninferior:-1"):
        with pytest.raises(T.TuneError, match="--target"):
            T.parse_target(bad)


def _known_noninferiority_case(n=2000, seed=3):
    """Binary stage answers where the margin sets what the cascade loses, by construction:
    the first stage sure (0.05 or 0.95) on the texts it gets right; unsure by 0.05 (p 0.45 or
    0.55, the wrong side) on 60 texts the last stage gets right, and by 0.15 (p 0.35 or 0.65,
    the wrong side) on another 60; the last stage right on every text."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 2, n)
    sign = np.where(labels == 1, 1.0, -1.0)
    first = 0.5 + 0.45 * sign
    near, far = np.arange(60), np.arange(60, 120)
    first[near] = 0.5 - 0.05 * sign[near]
    first[far] = 0.5 - 0.15 * sign[far]
    last = 0.5 + 0.3 * sign
    return [first.reshape(-1, 1), last.reshape(-1, 1)], labels


def test_noninferior_keeps_the_fewest_escalations_whose_lower_bound_is_above_minus_the_margin():
    stages, labels = _known_noninferiority_case()
    pts = T.cascade_curve(BIN, stages, labels, [0.0, 0.06, 0.16, 0.5])
    T.noninferiority(BIN, stages, labels, pts)
    by = {p["margin"]: p for p in pts}
    # margin 0: 120 of 2000 wrong (-6 points); 0.06: the 60 far ones wrong (-3 points); 0.16: none
    assert by[0.0]["difference"] == pytest.approx(-0.06) and by[0.06]["difference"] == pytest.approx(-0.03)
    assert by[0.16]["difference"] == 0.0 and by[0.16]["difference_low"] == 0.0  # no text differs: exact
    assert by[0.06]["difference_low"] < -0.03 < by[0.06]["difference"] + 1e-12  # the bound sits below the difference
    # every changed text goes one way, so the bound stays near the difference (within a point here)
    assert by[0.06]["difference_low"] > -0.04
    assert T.choose(pts, T.parse_target("noninferior:0.5"), 1.0, "escalation_rate")["margin"] == 0.16
    assert T.choose(pts, T.parse_target("noninferior:4"), 1.0, "escalation_rate")["margin"] == 0.06
    assert T.choose(pts, T.parse_target("noninferior:8"), 1.0, "escalation_rate")["margin"] == 0.0
    again = T.cascade_curve(BIN, stages, labels, [0.06])
    T.noninferiority(BIN, stages, labels, again)
    assert again[0]["difference_low"] == by[0.06]["difference_low"]  # seeded: the same bound every run


def test_noninferior_works_for_multiclass_and_multilabel_heads():
    stages, labels = _known_noninferiority_case(n=1000)
    p1 = stages[0].reshape(-1)
    # multiclass: a third label never chosen; the top-two gap is twice the binary distance (0.1 and 0.3)
    mc = Head(MULTICLASS, ("neg", "pos", "other"))
    mstages = [np.stack([1 - s.reshape(-1), s.reshape(-1), np.zeros(len(s))], axis=1) for s in stages]
    pts = T.cascade_curve(mc, mstages, labels, [0.0, 0.2, 0.4])
    T.noninferiority(mc, mstages, labels, pts)
    assert [round(p["difference"], 4) for p in pts] == [-0.12, -0.06, 0.0]
    assert T.choose(pts, T.parse_target("noninferior:0.5"), 1.0, "escalation_rate")["margin"] == 0.4
    # multilabel: the same verdicts on one label, a second label always sure and right
    ml = Head(MULTILABEL, ("pos", "other"))
    other = np.full(len(p1), 0.9)
    lstages = [np.stack([s.reshape(-1), other], axis=1) for s in stages]
    mlabels = np.stack([labels.astype(bool), np.ones(len(labels), dtype=bool)], axis=1)
    pts = T.cascade_curve(ml, lstages, mlabels, [0.0, 0.06, 0.16])
    T.noninferiority(ml, lstages, mlabels, pts)
    assert [round(p["difference"], 4) for p in pts] == [-0.12, -0.06, 0.0]
    assert T.choose(pts, T.parse_target("noninferior:0.5"), 1.0, "escalation_rate")["margin"] == 0.16


def test_a_one_sided_bound_is_the_lower_end_of_a_wider_two_sided_interval():
    rng = np.random.RandomState(1)
    last = rng.rand(1936) < 0.79
    mixed = last.copy()
    mixed[np.flatnonzero(last)[:60]] = False
    mixed[np.flatnonzero(~last)[:50]] = True
    two = T.paired_difference(mixed, last)
    one = T.paired_difference(mixed, last, alternative="greater")
    assert one["high"] is None and one["difference"] == two["difference"]
    assert two["low"] < one["low"] < one["difference"]  # 95% one-sided: the 5% tail, not the 2.5% one
    with pytest.raises(ValueError, match="alternative"):
        T.paired_difference(mixed, last, alternative="less")


def test_cascade_curve_escalates_unsure_texts_and_counts_the_rate():
    first = np.array([[0.9], [0.55], [0.45], [0.2]])
    last = np.array([[0.8], [0.1], [0.9], [0.3]])
    labels = np.array([1, 0, 1, 0])
    pts = {p["margin"]: p for p in T.cascade_curve(BIN, [first, last], labels, [0.0, 0.1, 0.4, 0.5])}
    assert pts[0.0] == {"margin": 0.0, "escalation_rate": 0.0, "accuracy": 0.5, "agreement": 0.5}
    assert pts[0.1] == {"margin": 0.1, "escalation_rate": 0.5, "accuracy": 1.0, "agreement": 1.0}
    assert pts[0.4]["escalation_rate"] == 0.75 and pts[0.5]["escalation_rate"] == 1.0


def test_a_third_stage_is_reached_only_by_texts_still_unsure_after_the_second():
    first = np.array([[0.52], [0.51], [0.9], [0.48]])
    second = np.array([[0.95], [0.49], [0.1], [0.53]])  # text 2 is never asked; its 0.1 must not count
    third = np.array([[0.0], [0.2], [0.0], [0.7]])
    answer, reached = T.cascade_answers(BIN, [first, second, third], 0.1)
    assert [r.tolist() for r in reached] == [[True] * 4, [True, True, False, True], [False, True, False, True]]
    np.testing.assert_array_equal(answer.reshape(-1), [0.95, 0.2, 0.9, 0.7])
    (p,) = T.cascade_curve(BIN, [first, second, third], np.array([1, 0, 1, 1]), [0.1])
    assert p["escalation_rate"] == 0.75 and p["accuracy"] == 1.0 and p["agreement"] == 0.5


def test_multiclass_cascades_escalate_on_the_top_two_gap_and_multilabel_on_any_label():
    mc = Head(MULTICLASS, ("a", "b", "c"))
    first = np.array([[0.5, 0.45, 0.05], [0.8, 0.1, 0.1]])
    last = np.array([[0.1, 0.8, 0.1], [0.1, 0.8, 0.1]])
    (p,) = T.cascade_curve(mc, [first, last], np.array([1, 0]), [0.1])
    assert p["escalation_rate"] == 0.5 and p["accuracy"] == 1.0
    ml = Head(MULTILABEL, ("x", "y"))
    first = np.array([[0.9, 0.52], [0.9, 0.1]])
    last = np.array([[0.9, 0.1], [0.1, 0.1]])
    (p,) = T.cascade_curve(ml, [first, last], np.array([[True, False], [True, False]]), [0.1])
    assert p["escalation_rate"] == 0.5 and p["accuracy"] == 1.0 and p["agreement"] == 0.5


def test_the_cheapest_point_meeting_the_target_is_chosen():
    pts = [{"margin": m, "escalation_rate": e, "accuracy": a, "agreement": g}
           for m, e, a, g in [(0.0, 0.0, 0.70, 0.8), (0.1, 0.2, 0.79, 0.95), (0.2, 0.4, 0.80, 0.99), (0.3, 0.6, 0.80, 1.0)]]
    assert T.choose(pts, T.parse_target("accuracy>=last"), 0.80, "escalation_rate")["margin"] == 0.2
    assert T.choose(pts, T.parse_target("agreement>=0.95"), 0.80, "escalation_rate")["margin"] == 0.1
    assert T.choose(pts, T.parse_target("accuracy>=0.9"), 0.80, "escalation_rate") is None


def _chunk(**kw):
    return ChunkNode(kind="chunk", name="c", window=8, stride=6, node=None, aggregation="mean", **kw)


def test_chunk_answers_follow_the_runtimes_stopping_rules():
    sure_then_turn = [np.array([0.95]), np.array([0.1]), np.array([0.1])]
    p, used = T.chunk_answer(BIN, _chunk(stop_margin=0.35), sure_then_turn, [1, 1, 1])
    assert used == 1 and p[0] == pytest.approx(0.95)
    p, used = T.chunk_answer(BIN, _chunk(), sure_then_turn, [1, 1, 1])
    assert used == 3 and p[0] == pytest.approx(1.15 / 3)
    decided = [np.array([0.9])] * 3 + [np.array([0.1])]
    p, used = T.chunk_answer(BIN, _chunk(stop_when_decided=True), decided, [1, 1, 1, 1])
    assert used == 3  # (0.9 * 3 + 0) / 4 >= 0.5 whatever the last window says


def test_stop_curve_draws_windows_against_accuracy_and_removing_stop_margin_is_the_exact_point():
    windows = [[np.array([0.9]), np.array([0.1]), np.array([0.1])], [np.array([0.25]), np.array([0.3]), np.array([0.2])]]
    pts, ref = T.stop_curve(BIN, _chunk(stop_margin=0.3), windows, [[1, 1, 1]] * 2, np.array([0, 0]), [None, 0.3])
    assert ref == {"windows_per_text": 3.0, "accuracy": 1.0}
    by = {p["stop_margin"]: p for p in pts}
    assert by[None]["accuracy"] == 1.0 and by[None]["windows_per_text"] == 3.0
    assert by[0.3]["accuracy"] == 0.5 and by[0.3]["windows_per_text"] == 2.0  # the first stops at once, wrongly
    assert T.choose(pts, T.parse_target("accuracy>=last"), ref["accuracy"], "windows_per_text")["stop_margin"] is None


POLICY = """\
# top comment
version: 1
root:
  kind: cascade
  name: c1
  margin: 0.15   # hand-set
  # about the stages
  stages:
    - kind: chunk
      name: k1
      stop_when_decided: true
      stop_margin: 0.35
      node: {kind: model, name: a, model: fast}
    - {kind: chunk, name: k2, node: {kind: model, name: b, model: slow}}
"""


def test_policy_edits_keep_every_other_byte():
    out = T.edit_policy_text(POLICY, [("cascade", "c1", "margin", 0.3, "tuned"), ("chunk", "k1", "stop_margin", None, ""),
                                      ("chunk", "k2", "stop_margin", 0.4, "tuned")])
    assert "  margin: 0.3  # tuned\n" in out and "stop_margin: 0.35" not in out
    assert "# top comment" in out and "# about the stages" in out
    doc = yaml.safe_load(out)
    assert doc["root"]["margin"] == 0.3 and "stop_margin" not in doc["root"]["stages"][0]
    assert doc["root"]["stages"][1]["stop_margin"] == 0.4
    added = T.edit_policy_text(out, [("chunk", "k1", "stop_margin", 0.45, "back")])
    assert yaml.safe_load(added)["root"]["stages"][0]["stop_margin"] == 0.45 and "      stop_margin: 0.45  # back\n" in added
    flow = T.edit_policy_text(out, [("chunk", "k2", "stop_margin", None, "")])
    assert "    - {kind: chunk, name: k2, node: {kind: model, name: b, model: slow}}\n" in flow
    with pytest.raises(T.TuneError, match="no cascade node named 'zz'"):
        T.edit_policy_text(POLICY, [("cascade", "zz", "margin", 0.1, "")])


def test_the_shipped_policy_edit_is_valid_and_changes_only_those_lines():
    from tests.helpers import REPO

    text = (REPO / "router" / "policy.yaml").read_text()
    out = T.edit_policy_text(text, [("cascade", "cascade", "margin", 0.2, "x"), ("chunk", "chunk_fast", "stop_margin", 0.4, "y")])
    policy = P.parse_policy(yaml.safe_load(out))
    (cascade,) = T.cascades(policy)
    assert cascade.margin == 0.2 and T.resolve_stage(cascade.stages[0], "s").chunk.stop_margin == 0.4
    assert T.resolve_stage(cascade.stages[1], "s").model.model == "classifier"  # the fallback's first node
    diff = [d for d in difflib.ndiff(text.splitlines(), out.splitlines()) if d[:2] in ("- ", "+ ")]
    assert [d[:2] for d in diff] == ["- ", "+ ", "+ "]  # the margin line replaced, stop_margin added
    assert diff[2].strip("+ ").startswith("stop_margin: 0.4  # y")


def test_turning_texts_open_with_one_label_and_take_the_later_longer_parts():
    texts = [f"s{i} " + "w " * 9 for i in range(200)]
    labels = [i % 2 for i in range(200)]
    made = turning_long_texts(texts, labels, [12] * 200, lambda s: len(s.split()) + 2, bounds=(30, 400),
                              opening=30, factor=2.0)
    assert made
    for text, label in made:
        ids = [int(w[1:]) for w in text.split() if w.startswith("s")]
        first, later = [i % 2 for i in ids[:3]], [i % 2 for i in ids[3:]]
        assert set(first) == {1 - label} and set(later) == {label} and len(later) > len(first)
    assert {label for _, label in made} == {0, 1}


# -- end to end on a BYOM checkpoint pair -----------------------------------------------------------------


WORDS_GOOD = ["good", "great", "fun", "loved", "kind", "helpful", "acting"]
WORDS_BAD = ["bad", "terrible", "boring", "hate", "idiot", "worth", "plot"]


def _labeled(path, n, seed):
    rng = np.random.default_rng(seed)
    lines = ["label\ttext"]
    for _ in range(n):
        y = int(rng.integers(2))
        words = list(rng.choice(WORDS_GOOD if y else WORDS_BAD, 4)) + list(rng.choice(WORDS_GOOD + WORDS_BAD, 2))
        lines.append(f"{y}\t{' '.join(words)}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("checkpoint", ["bert2", "stars5"])  # a 2-label pair, a 5-class pair
def test_tune_end_to_end_on_an_exported_checkpoint_pair(tmp_path, checkpoint):
    pytest.importorskip("torch")
    pytest.importorskip("scipy")
    from orchestrator.tooling.modeling.export import export_checkpoint
    from orchestrator.tooling.policy_cli import check_command
    from tests.byom import build_checkpoint

    repo = tmp_path / "repo"
    repo.mkdir()
    for name, seed in (("small", 0), ("large", 1)):
        ckpt = build_checkpoint(checkpoint, tmp_path / f"ckpt_{name}", seed=seed)
        export_checkpoint(str(ckpt), repo, name, quiet=True, tensorrt=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("# a BYOM cascade\nversion: 1\nmax_sequence_length: 48\nroot:\n  kind: cascade\n  name: cas\n"
                      "  margin: 0.1  # a guess\n  stages:\n"
                      "    - {kind: chunk, name: ch_small, window: 24, stride: 16, stop_when_decided: true, stop_margin: 0.2,"
                      " node: {kind: model, name: m_small, model: small}}\n"
                      "    - kind: chunk\n      name: ch_large\n      window: 24\n      stride: 16\n      stop_when_decided: true\n"
                      "      node: {kind: model, name: m_large, model: large}\n")
    data = _labeled(tmp_path / "val.tsv", 400, 0)
    # the BYOM path: calibrate the exported model, head.json and its ensemble's postprocess config
    from orchestrator.runtime.routing.heads import read_head
    from orchestrator.tooling import repository
    from orchestrator.tooling.modeling.parity.calibration import calibrate

    cal = calibrate(repo / "small", str(data), report=tmp_path / "cal", write=True)
    head = read_head(repo / "small")
    assert head.calibration["temperature"] == cal["temperature"] and (tmp_path / "cal" / "reliability.png").is_file()
    served = repository.get_parameter(repository.read_config(repo / "small_postprocess" / "config.pbtxt"), "head")
    assert Head.from_json(served).calibration == head.calibration
    assert '"temperature"' in served and str(repo / "small_postprocess" / "config.pbtxt") in cal["written"]
    result = T.tune(policy, str(data), repo=repo, target="agreement>=0.9", report_data=str(_labeled(tmp_path / "test.tsv", 300, 1)),
                    out=tmp_path / "out", write=True, long_n=10)
    (cascade,) = result["cascades"]
    assert cascade["chosen"]["agreement"] >= 0.9 and len(cascade["points"]) == len(T.MARGINS)
    assert {c["name"] for c in result["chunks"]} == {"ch_small", "ch_large"}
    assert result["chunks"][0]["long_texts"] > 0
    for f in ("curves.json", "tune.md", "policy.yaml", "cascade_cas.png", "chunk_ch_small.png"):
        assert (tmp_path / "out" / f).is_file()
    text = policy.read_text()
    assert "# a BYOM cascade" in text and f"margin: {cascade['chosen']['margin']:g}  # orchestrator tune" in text
    loaded = P.load_policy(policy)
    assert T.cascades(loaded)[0].margin == cascade["chosen"]["margin"]
    assert check_command(argparse.Namespace(path=str(policy), repo=str(repo), model_config_name="embedded",
                                            write_labels=False)) == 0
    assert set(result["report"]["cascades"][0]["sets"]) >= {"short"}


def test_the_paired_difference_says_whether_a_gap_is_more_than_the_noise():
    from orchestrator.tooling.tune import paired_difference

    rng = np.random.RandomState(1)
    last = rng.rand(1936) < 0.79
    same = paired_difference(last, last)
    assert same == {"difference": 0.0, "low": 0.0, "high": 0.0}
    three_fewer = last.copy()
    three_fewer[np.flatnonzero(last)[:3]] = False  # 3 texts of 1936 wrong that the last stage got right
    d = paired_difference(three_fewer, last)
    assert d["difference"] == pytest.approx(-3 / 1936)
    assert d["low"] < d["difference"] <= d["high"] <= 0.0  # one-sided changes: never above 0
    mixed = last.copy()
    mixed[np.flatnonzero(last)[:100]] = False
    mixed[np.flatnonzero(~last)[:98]] = True  # 198 texts changed, 2 more for the worse
    d = paired_difference(mixed, last)
    assert d["low"] < 0.0 < d["high"]  # a gap of a few texts either way is within the noise
    worse = last.copy()
    worse[np.flatnonzero(last)[:100]] = False
    assert paired_difference(worse, last)["high"] < 0.0  # 100 texts worse: clearly below


def test_throughput_urls_formula_and_the_closed_loop():
    from orchestrator.tooling import tune_throughput as TT

    assert TT.parse_url("grpc://127.0.0.1:8001") == ("grpc", "127.0.0.1:8001")
    assert TT.parse_url("localhost:8000") == ("http", "localhost:8000")
    for bad in ("ftp://h:1", "grpc://host", "http://h:port"):
        with pytest.raises(T.TuneError, match="--url"):
            TT.parse_url(bad)
    # 1 / (c_fast + e * c_accurate): 2 ms and 8 ms a text, a quarter escalated -> 250 texts/s
    assert TT.predicted([1.0, 0.25], [0.002, 0.008]) == pytest.approx(250.0)
    seen = []

    class Client:
        def close(self):
            seen.append("closed")

    def send(client, k):
        if k == 5:
            raise RuntimeError("refused")
        seen.append(k)

    r = TT.closed_loop(Client, send, concurrency=3, duration_s=0.05)
    assert r["requests"] > 0 and r["errors"] == 1 and r["first_error"] == "RuntimeError: refused"
    assert r["throughput"] == r["requests"] / 0.05 and seen.count("closed") == 3
    # warm-up calls are made (distinct counters) and not counted: only the timed window is
    calls = []

    def timed_send(client, k):
        calls.append(time.perf_counter())
        time.sleep(0.002)

    began = time.perf_counter()
    r = TT.closed_loop(Client, timed_send, concurrency=2, duration_s=0.05, warmup_s=0.1)
    warm = [t for t in calls if t < began + 0.1 - 0.003]
    assert len(warm) >= 20 and r["requests"] <= len(calls) - len(warm)
    assert TT.WARMUP_S > 0 and "warmup_s" in inspect.signature(TT.measure_router).parameters


def test_noninferior_on_a_byom_distilbert_to_bert_cascade(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("scipy")
    from orchestrator.tooling.modeling.export import export_checkpoint
    from tests.byom import build_checkpoint

    repo = tmp_path / "repo"
    repo.mkdir()
    labels = ("NEGATIVE", "POSITIVE")
    for name, arch, seed in (("fast", "distilbert", 0), ("accurate", "bert", 1)):
        ckpt = build_checkpoint(f"{arch}2", tmp_path / f"ckpt_{name}", seed=seed, spec=(arch, labels, "single_label_classification"))
        export_checkpoint(str(ckpt), repo, name, quiet=True, tensorrt=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nmax_sequence_length: 48\nroot:\n  kind: cascade\n  name: cas\n  margin: 0.1\n  stages:\n"
                      "    - {kind: model, name: m_fast, model: fast}\n    - {kind: model, name: m_accurate, model: accurate}\n")
    result = T.tune(policy, str(_labeled(tmp_path / "val.tsv", 400, 0)), repo=repo, target="noninferior:0.5",
                    report_data=str(_labeled(tmp_path / "test.tsv", 300, 1)), out=tmp_path / "out", write=True, long_n=5)
    (c,) = result["cascades"]
    ni, chosen = c["noninferiority"], c["chosen"]
    assert ni == {"margin_points": 0.5, "confidence": 0.95, "one_sided": True, "resamples": T.RESAMPLES, "seed": 0,
                  "method": "paired bootstrap over the tuning texts (scipy.stats.bootstrap, BCa)"}
    assert chosen["difference_low"] > -0.005 and chosen["difference_low"] <= chosen["difference"] + 1e-12
    assert chosen["difference"] == pytest.approx(chosen["accuracy"] - c["last_stage_accuracy"])
    cheaper = [p for p in c["points"] if p["escalation_rate"] < chosen["escalation_rate"]]
    assert all(p["difference_low"] <= -0.005 for p in cheaper)  # the fewest escalations meeting it
    assert "one-sided 95% lower bound" in policy.read_text() and "noninferior:0.5" in policy.read_text()
    short = result["report"]["cascades"][0]["sets"]["short"]
    assert short["router_minus_last_stage_low_one_sided"] >= short["router_minus_last_stage"]["low"]
    assert "one-sided 95% lower bound" in (tmp_path / "out" / "tune.md").read_text()


def test_router_overhead_arithmetic():
    from orchestrator.tooling import tune_throughput as TT

    # 2 ms + a quarter of 8 ms = 4 ms of stages a text; 1 ms of router on top -> 200 texts/s
    assert TT.predicted([1.0, 0.25], [0.002, 0.008], 0.001) == pytest.approx(200.0)
    assert TT.predicted([1.0, 0.25], [0.002, 0.008]) == pytest.approx(250.0)  # o = 0: the upper bound
    # a router measured at 200 texts/s where its stages cost 4 ms a text spends 1 ms itself
    assert TT.overhead_from(200.0, [1.0, 0.25], [0.002, 0.008]) == pytest.approx(0.001)
    assert TT.overhead_from(300.0, [1.0, 0.25], [0.002, 0.008]) == 0.0  # faster than its stages: noise, not < 0
    # what the overhead measured at one margin predicts at another: 1 / (1 + 2 + 0.5 * 8) ms
    o = TT.overhead_from(200.0, [1.0, 0.25], [0.002, 0.008])
    assert TT.predicted([1.0, 0.5], [0.002, 0.008], o) == pytest.approx(1000.0 / 7.0)


class _Served:
    def __init__(self, name, margin):
        self.name, self.margin = name, margin


O_PARTS = (0.001, 0.003)  # the fake router: 1 ms per text, 3 ms more per text it escalates


def _throughput_with_fakes(monkeypatch, served_margin, given_s=None, given_stages=None, shares=None):
    """throughput_report on fakes: stages cost 2 ms (fast) and 8 ms (accurate) a text; 20 texts
    ``t0``..``t19``, the first ``20 * m`` of them escalated at margin m (so the escalation rate
    is the margin itself); the router's cascade serves ``served_margin`` and spends
    :data:`O_PARTS` itself, so a closed loop on texts of which a share e escalate at the served
    margin answers 1 / (1 + 2 + e * (3 + 8)) ms texts/s."""
    from types import SimpleNamespace

    from orchestrator.tooling import tune_throughput as TT

    costs = {"fast": 0.002, "accurate": 0.008}
    calls = []
    monkeypatch.setattr(TT, "measure_model", lambda p, a, name, *args, **kw: {"model": name, "requests": 10, "errors": 0,
                                                                              "throughput": 1 / costs[name], "cost_s": costs[name]})
    texts = [f"t{i}" for i in range(20)]
    escalated = set(texts[:int(served_margin * 20)])

    def measure_router(protocol, address, model, sent, threshold, concurrency, duration_s):
        calls.append(list(sent))
        e = sum(t in escalated for t in sent) / len(sent)
        per_text = O_PARTS[0] + costs["fast"] + e * (O_PARTS[1] + costs["accurate"])
        return {"model": model, "requests": 100, "errors": 0, "seconds": 1.0, "throughput": 1 / per_text, "first_error": None}

    monkeypatch.setattr(TT, "measure_router", measure_router)
    monkeypatch.setattr(TT, "served_cascade", lambda *a: (_Served("cas", served_margin), ""))
    stages = [SimpleNamespace(model=SimpleNamespace(model=m, version=None)) for m in ("fast", "accurate")]
    cascade = SimpleNamespace(name="cas")
    heads = {m: SimpleNamespace(max_length=128, tokenizer="tok", pad_token_id=0) for m in costs}
    models = SimpleNamespace(heads=heads, ids=lambda tok, texts: [np.array([1, 2, 3])] * len(texts))
    margins = (0.1, 0.25, 0.5)
    result = {"cascades": [{"points": [{"margin": m, "escalation_rate": m, "accuracy": 0.9} for m in margins],
                            "chosen": {"margin": 0.25}, "last_stage_accuracy": 0.91}]}
    measured = SimpleNamespace(texts=texts)

    def cascade_answers(head, answers, margin, threshold):
        k = int(round(margin * 20))
        return None, [np.ones(20, dtype=bool), np.array([True] * k + [False] * (20 - k))]

    kw = {} if shares is None else {"overhead_shares": shares}
    t = TT.throughput_report("grpc://127.0.0.1:1", None, result, [(cascade, stages)], {"cas": ([], measured)}, models,
                             "router", 128, concurrency=2, duration_s=0.1, cascade_answers=cascade_answers,
                             cascades_of=lambda p: [], router_overhead_s=given_s, router_stage_overhead_s=given_stages, **kw)
    return t, calls


def test_the_router_overhead_parts_are_fitted_from_text_lists_escalated_at_the_served_margin(monkeypatch):
    # served at 0.5: t0..t9 escalate there; two lists of 20 texts, 10% and 70% of them escalated
    t, calls = _throughput_with_fakes(monkeypatch, served_margin=0.5)
    (c,) = t["cascades"]
    o = c["overhead"]
    assert o["source"] == "fitted" and o["margin"] == 0.5 and o["notes"] == []
    assert [li["share"] for li in o["lists"]] == [0.1, 0.7] and [li["reach"] for li in o["lists"]] == [[1.0, 0.1], [1.0, 0.7]]
    assert [sum(x in {f"t{i}" for i in range(10)} for x in sent) for sent in calls[:2]] == [2, 14]  # the lists as sent
    assert o["parts_s"] == pytest.approx(list(O_PARTS))  # the fake router's own costs, recovered
    assert o["curvature_s"] == [0.0, 0.0]  # two shares: the line
    for li in o["lists"]:  # the one constant each list implies grows with its escalated share
        assert li["implied_s"] == pytest.approx(O_PARTS[0] + li["share"] * O_PARTS[1])
    for p in c["points"]:
        e = p["reach"][1]
        assert p["overhead_s"] == pytest.approx(0.001 + e * 0.003)
        assert p["predicted_throughput"] == pytest.approx(1 / (0.001 + 0.002 + e * (0.003 + 0.008)))
    # the router serves 0.5, not the chosen 0.25: only the fit's two closed loops ran
    assert len(calls) == 2 and "router" not in c and "not the chosen 0.25" in c["router_not_run"]
    text = "\n".join(_render(t))
    assert "Router overhead o = 1.000 + e_2 * 3.000 ms per text, fitted" in text and "margin it serves (0.5)" in text
    assert "10% reaching stage 2" in text and "70% reaching stage 2" in text


def test_the_chosen_point_runs_on_the_tuning_texts_and_checks_the_fitted_model(monkeypatch):
    t, calls = _throughput_with_fakes(monkeypatch, served_margin=0.25, shares=(0.2, 0.5, 0.9))
    (c,) = t["cascades"]
    assert len(c["overhead"]["lists"]) == 3 and len(calls) == 4 and calls[-1] == [f"t{i}" for i in range(20)]
    assert c["overhead"]["curvature_s"] == pytest.approx([0.0, 0.0], abs=1e-12)  # three shares: fitted, and 0 here
    r = c["router"]  # the fake is linear: the fitted model predicts it exactly
    assert c["chosen"]["predicted_throughput"] == pytest.approx(1 / (0.003 + 0.25 * 0.011))
    assert r["measured_over_predicted"] == pytest.approx(1.0)


def test_given_overhead_parts_replace_the_fit(monkeypatch):
    from orchestrator.tooling.errors import TuneError

    # o_1 alone: one constant (the later parts 0); no closed loop for it, one for the chosen point
    t, calls = _throughput_with_fakes(monkeypatch, served_margin=0.25, given_s=0.001)
    (c,) = t["cascades"]
    assert c["overhead"] == {"parts_s": [0.001, 0.0], "curvature_s": [0.0, 0.0], "source": "given"} and len(calls) == 1
    assert c["chosen"]["predicted_throughput"] == pytest.approx(1 / (0.001 + 0.002 + 0.25 * 0.008))
    assert c["router"]["measured_over_predicted"] == pytest.approx((0.001 + 0.002 + 0.25 * 0.008) / (0.003 + 0.25 * 0.011))
    t, calls = _throughput_with_fakes(monkeypatch, served_margin=0.25, given_s=0.001, given_stages=[0.003])
    (c,) = t["cascades"]
    assert c["overhead"]["parts_s"] == [0.001, 0.003] and c["router"]["measured_over_predicted"] == pytest.approx(1.0)
    assert "o = 1.000 + e_2 * 3.000 ms per text (given" in "\n".join(_render(t))
    with pytest.raises(TuneError, match="2 values for cascade 'cas', which has 1 stage"):
        _throughput_with_fakes(monkeypatch, served_margin=0.25, given_s=0.001, given_stages=[0.003, 0.001])


def test_a_served_margin_that_escalates_nothing_leaves_the_stage_part_unmeasured(monkeypatch):
    t, calls = _throughput_with_fakes(monkeypatch, served_margin=0.0)
    o = t["cascades"][0]["overhead"]
    assert o["source"] == "fitted" and len(calls) == 1 and o["parts_s"] == pytest.approx([0.001, 0.0])
    assert "o_2 not measured" in o["notes"][0]
    assert "none escalated: " in "\n".join(_render(t)) and " No tuning text reaches stage 2 at the served margin" in "\n".join(_render(t))


def test_overhead_lists_mix_escalated_texts_evenly_and_separate_every_stage():
    from orchestrator.tooling import tune_throughput as TT

    assert TT.mixture([0, 1, 2], [7, 8], 0.25, 8) == [0, 1, 2, 7, 0, 1, 2, 8]
    assert TT.mixture([0], [7], 0.0, 3) == [0, 0, 0] and TT.mixture([], [7], 1.0, 2) == [7, 7]
    with pytest.raises(ValueError):
        TT.mixture([], [7], 0.5, 4)
    # three stages: texts 0-5 stop at the first, 6-7 at the second, 8-9 go on to the third
    reached = [np.ones(10, bool), np.arange(10) >= 6, np.arange(10) >= 8]
    lists, fitted, notes = TT.overhead_lists(reached, (0.1, 0.5))
    assert fitted == [0, 1, 2] and notes == []
    assert [(li["stage"], li["reach"]) for li in lists] == [(1, [1.0, 0.1, 0.0]), (1, [1.0, 0.5, 0.0]),
                                                            (2, [1.0, 0.1, 0.1]), (2, [1.0, 0.5, 0.5])]
    assert set(lists[3]["texts"]) == {0, 1, 2, 3, 4, 8, 9}
    # a linear router is recovered exactly: 1 + 2 e_2 + 4 e_3 ms own cost, stages 1, 5, 10 ms
    costs, parts = [0.001, 0.005, 0.010], [0.001, 0.002, 0.004]
    thr = [1 / float(np.dot(li["reach"], np.add(costs, parts))) for li in lists]
    fit, curvature = TT.fit_overhead([li["reach"] for li in lists], thr, costs, fitted)
    assert fit == pytest.approx(parts) and curvature == [0.0, 0.0, 0.0]  # two shares a stage: lines
    assert TT.overhead_at(parts, [1.0, 0.5, 0.25]) == pytest.approx(0.003)
    assert TT.overhead_at([0.001, -0.004], [1.0, 0.5]) == 0.0  # a negative part never makes the router free
    # every text escalates at the served margin: the first part takes the second's cost
    lists, fitted, notes = TT.overhead_lists([np.ones(4, bool), np.ones(4, bool)])
    assert fitted == [0] and [li["reach"] for li in lists] == [[1.0, 1.0]] and "counted in o_1" in notes[0]
    with pytest.raises(ValueError, match="2 lists for 3 unknowns"):
        TT.fit_overhead([[1, 0, 0], [1, 1, 0]], [1.0, 1.0], costs, [0, 1, 2])
    # three shares a stage: each later part's curvature too, recovered from a router whose cost bends
    # (1 + 2 e_2 - 1 e_2^2 + 4 e_3 - 3 e_3^2 ms)
    lists, fitted, _ = TT.overhead_lists(reached, (0.1, 0.4, 0.7))
    bend = [0.0, -0.001, -0.003]
    thr = [1 / (float(np.dot(li["reach"], np.add(costs, parts))) + float(np.dot(bend, np.square(li["reach"]))))
           for li in lists]
    fit, curvature = TT.fit_overhead([li["reach"] for li in lists], thr, costs, fitted)
    assert fit == pytest.approx(parts) and curvature == pytest.approx(bend)
    assert TT.overhead_at(parts, [1.0, 0.5, 0.25], bend) == pytest.approx(0.003 - 0.00025 - 0.0001875)
    with pytest.raises(ValueError, match="3 lists for 5 unknowns"):  # two curved stages from three lists
        TT.fit_overhead([[1, 0.1, 0.1], [1, 0.4, 0.4], [1, 0.7, 0.7]], [1.0, 1.0, 1.0], costs, [0, 1, 2])


def test_stage_overheads_need_the_first_part_and_shares_must_be_two_in_range(tmp_path):
    from orchestrator.tooling.errors import TuneError
    from tests.helpers import REPO

    policy = REPO / "router" / "policy.yaml"
    with pytest.raises(TuneError, match="give --router-overhead-ms"):
        T.tune(policy, "split:validation", router_stage_overhead_ms=[1.0], out=tmp_path)
    for bad in ([0.5], [0.2, 1.5], [0.3, 0.3]):
        with pytest.raises(TuneError, match="at least two distinct shares"):
            T.tune(policy, "split:validation", overhead_shares=bad, out=tmp_path)


def _render(t):
    from orchestrator.tooling.tune_throughput import render_throughput

    return render_throughput(t)


def test_the_tune_guide_names_the_url_flags_and_defaults_the_command_has():
    import re

    from orchestrator.tooling import tune_throughput as TT
    from tests.helpers import ROOT

    guide = (ROOT / "docs" / "guides" / "tune.md").read_text()
    section = guide[guide.index("## Throughput on your server"):guide.index("## The shipped policy")]
    parser = T.add_tune_arguments(argparse.ArgumentParser())
    flags = {o for a in parser._actions for o in a.option_strings}
    named = set(re.findall(r"`(--[a-z-]+)", section))
    assert named and named <= flags, named - flags
    shares = [f"{x:g}" for x in TT.OVERHEAD_SHARES]
    assert f"`--overhead-shares`, default {', '.join(shares[:-1])} and {shares[-1]}," in section
    assert f"(default {TT.CONCURRENCY}) for `--duration` seconds (default {TT.DURATION_S:g})" in section
    assert f"after {TT.WARMUP_S:g} seconds of the same" in section
    assert parser.parse_args(["p", "--data", "d"]).concurrency == TT.CONCURRENCY
