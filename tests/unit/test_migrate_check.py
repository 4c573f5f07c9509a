"""``orchestrator migrate --check``'s parts without a server: the random inputs, the
comparison of two answers and the report (the live comparison: tests/server/test_migrate_server.py)."""

from __future__ import annotations

import numpy as np

from orchestrator.tooling.ensembles import Repository, check_ensemble
from orchestrator.tooling.migrate_check import OutputStats, Report, _compare, random_inputs
from orchestrator.tooling.repository import parse_config
from tests.helpers import REPO
from tests.unit.test_migrate_validation import build

# only its inputs matter here (the ensemble is never checked)
VARIABLE = '''name: "ens" platform: "ensemble" max_batch_size: 0
input [{ name: "a" data_type: TYPE_FP16 dims: [-1, 2] }, { name: "b" data_type: TYPE_INT8 dims: [-1] },
       { name: "c" data_type: TYPE_BOOL dims: [3] }, { name: "d" data_type: TYPE_STRING dims: [-1] }]
output [{ name: "prob" data_type: TYPE_FP32 dims: [16] }]
ensemble_scheduling { step [ { model_name: "one" model_version: -1 input_map { key: "input" value: "a" }
  input_map { key: "x" value: "b" } input_map { key: "y" value: "c" } input_map { key: "z" value: "d" }
  output_map { key: "output" value: "prob" } } ] }'''


def test_random_inputs_follow_the_configuration(tmp_path):
    build(tmp_path, parse_config(VARIABLE))
    ensemble = Repository(tmp_path).get("ens")
    requests = random_inputs(ensemble, 20, None, seed=1)
    assert len(requests) == 20
    for request in requests:
        n = request["b"].shape[0]
        assert 1 <= n <= 4
        assert request["a"].shape == (n, 2) and request["a"].dtype == np.float16  # one n for every -1
        assert request["b"].dtype == np.int8 and request["c"].shape == (3,) and request["c"].dtype == np.bool_
        assert request["d"].dtype == np.object_ and all(isinstance(x, bytes) and x for x in request["d"])
        assert ((request["a"] >= 0) & (request["a"] < 1)).all()
    again = random_inputs(ensemble, 20, None, seed=1)
    assert all(np.array_equal(x["a"], y["a"]) for x, y in zip(requests, again))  # the seed decides


def test_a_batching_ensemble_gets_a_batch_dimension():
    ensemble = check_ensemble("ensemble", Repository(REPO, "embedded"))
    (request,) = random_inputs(ensemble, 1, None, seed=0)
    assert request["TEXT"].shape == (4, 1) and request["THRESHOLD"].shape == (4, 1)
    (request,) = random_inputs(ensemble, 1, 64, seed=0)
    assert request["TEXT"].shape == (64, 1)


def test_the_comparison_sees_dtype_shape_and_bytes():
    x = np.array([0.5, 1.0], np.float32)
    same, off, wider, longer = OutputStats(), OutputStats(), OutputStats(), OutputStats()
    _compare(same, x, x.copy())
    _compare(off, x, x + np.float32(1e-7))
    _compare(wider, x, x.astype(np.float64))
    _compare(longer, x, np.append(x, x))
    assert same.identical and same.max_diff == 0
    assert not off.identical and 0 < off.max_diff < 1e-6
    assert not wider.identical and "router float64" in wider.notes[0]
    assert not longer.identical and "[4]" in longer.notes[0]
    text = OutputStats()
    _compare(text, np.array([b"a", b"b\x00"], dtype=object), np.array([b"a", b"b"], dtype=object))
    assert not text.identical and text.max_diff == 1  # a trailing NUL is a difference


def test_the_report_says_when_anything_differs():
    report = Report("e", "r", 3, {"A": OutputStats(), "B": OutputStats(identical=False, max_diff=0.25)})
    assert not report.identical
    assert "  B: largest difference 0.25, DIFFERENT" in report.text()
    assert report.text().endswith("the router's answers differ from the ensemble's")
    assert not Report("e", "r", 1, {"A": OutputStats()}, ["request 0: outputs ensemble ['A'], router []"]).identical


class FakeProbe:
    """Stands in for :class:`Probe`: a live ensemble answering ``order``, a comparison
    finding ``identical``."""

    order = ["prob"]
    identical = True
    compared = []

    def __init__(self, url, protocol, ensemble, requests, batch_size, seed):
        self.ensemble = ensemble

    def ensemble_order(self):
        return list(self.order)

    def compare(self, router):
        FakeProbe.compared.append(router)
        stats = OutputStats(identical=self.identical, max_diff=0.0 if self.identical else 0.5)
        return Report(self.ensemble.name, router, 2, {name: stats for name in self.order})


def test_check_uses_the_live_order_and_fails_on_a_difference(tmp_path, capsys, monkeypatch):
    from orchestrator.tooling import migrate_check
    from orchestrator.tooling.cli import main
    from tests.unit.test_migrate import INNER, NO_BATCH, UNBATCHED

    ens = build(tmp_path, parse_config(NO_BATCH), {"inner": INNER, "unbatched": UNBATCHED})
    (ens / "labels.txt").write_text("a\n")
    monkeypatch.setattr(migrate_check, "Probe", FakeProbe)
    monkeypatch.setattr(FakeProbe, "compared", [])
    monkeypatch.setattr(FakeProbe, "order", ["prob", "aux"])  # the rule says aux, prob
    code = main(["migrate", str(ens), "--name", "r1", "--repo", str(tmp_path), "--model-config-name", "",
                 "--check", "127.0.0.1:1"])
    out = capsys.readouterr().out
    assert code == 0 and FakeProbe.compared == ["r1"]
    assert "the live ensemble answers prob, aux (the rule gave aux, prob): using the live order" in out
    import yaml

    assert yaml.safe_load((tmp_path / "r1" / "policy.yaml").read_text())["pipeline"]["outputs"] == ["prob", "aux"]
    monkeypatch.setattr(FakeProbe, "identical", False)
    assert main(["migrate", str(ens), "--name", "r2", "--repo", str(tmp_path), "--model-config-name", "",
                 "--check", "127.0.0.1:1"]) == 1
    assert "DIFFERENT" in capsys.readouterr().out
