"""``lab.bench.features`` offline: the repeated workload, the benchmark
repository's copies and the report section (the measurements need a server: ``make
bench-features``)."""

from __future__ import annotations

import random

import pytest
import yaml

from lab.bench.features import make_features_repository, repeated_workload
from lab.bench.plan import BenchError
from lab.bench.report import FEATURES_END, FEATURES_START, render_report, replace_section
from orchestrator.runtime.routing.policy import load_policy
from orchestrator.tooling.repository import config_path, read_config


def test_repeated_workload_repeats_about_the_share_asked_and_never_runs_out_silently():
    pool = [f"text {i}" for i in range(2000)]
    seq = repeated_workload(pool, 1000, 0.3, random.Random(1))
    assert len(seq) == 1000
    repeated = 1 - len(set(seq)) / len(seq)
    assert 0.25 < repeated < 0.35
    assert seq[0] == "text 0" and set(seq) <= set(pool)
    with pytest.raises(BenchError, match="more than 10 distinct texts"):
        repeated_workload(pool[:10], 100, 0.3, random.Random(1))


def test_features_repository_has_warm_and_cold_copies_and_an_uncached_router(tmp_path):
    repo = make_features_repository(tmp_path / "model_repository")
    for m in ("tokenizer", "classifier_fast", "postprocess", "router"):
        warm = read_config(config_path(repo / f"{m}_warm", "embedded"))
        cold = read_config(config_path(repo / f"{m}_cold", "embedded"))
        assert (warm.name, cold.name) == (f"{m}_warm", f"{m}_cold")
        assert len(warm.model_warmup) == 1 and len(cold.model_warmup) == 0
        assert not (repo / f"{m}_cold" / "warmup").exists()
    for m in ("classifier", "classifier_fast"):
        assert read_config(config_path(repo / m, "embedded")).response_cache.enable
        assert not read_config(config_path(repo / f"{m}_nc", "embedded")).response_cache.enable
    assert load_policy(repo / "router_nc" / "policy.yaml").models() == ["classifier_fast_nc", "classifier_nc"]
    samples = [yaml.safe_load((repo / m / "policy.yaml").read_text())["root"]["steps"][1]["sample"]
               for m in ("router_shadow_off", "router_shadow_10", "router_shadow_on")]
    assert samples == [0.0, 0.1, 1.0]
    assert load_policy(repo / "router_od_cold" / "policy.yaml").on_demand().keys() == {"spare_cold"}


def test_the_section_is_replaced_in_place_and_kept_by_make_bench(tmp_path):
    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\nbody\n")
    replace_section(report, f"{FEATURES_START}\nfirst\n{FEATURES_END}", FEATURES_START, FEATURES_END)
    replace_section(report, f"{FEATURES_START}\nsecond\n{FEATURES_END}", FEATURES_START, FEATURES_END)
    text = report.read_text()
    assert text.count(FEATURES_START) == 1 and "second" in text and "first" not in text
    from tests.helpers import bench_results  # a complete results.json of `make bench`

    assert f"{FEATURES_START}\nsecond\n{FEATURES_END}" in render_report(bench_results(), existing=text)
