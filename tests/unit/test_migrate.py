"""What ``orchestrator migrate`` writes for a valid ensemble: the router's configuration
(the ensemble's interface), its version directories and label files, and the pipeline
policy (steps, versions, batch dimensions, Triton's output order)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from orchestrator.tooling.cli import main
from orchestrator.tooling.migrate import MODEL_PY, MigrateError, plan_migration, router_config
from orchestrator.tooling.repository import model_config_pb2, parse_config, read_config
from tests.helpers import REPO
from tests.unit.test_migrate_validation import ENSEMBLE, build

NO_BATCH = '''name: "ens" platform: "ensemble" max_batch_size: 0
version_policy { specific { versions: [1, 3] } }
parameters { key: "team" value: { string_value: "vision" } }
input [{ name: "data" data_type: TYPE_FP32 dims: [16] }]
output [{ name: "prob" data_type: TYPE_FP32 dims: [16] label_filename: "labels.txt" },
        { name: "aux" data_type: TYPE_FP32 dims: [16] }]
ensemble_scheduling { step [
  { model_name: "one" model_version: 1 input_map { key: "input" value: "data" } output_map { key: "output" value: "t1" } },
  { model_name: "one" model_version: -1 input_map { key: "input" value: "t1" } output_map { key: "output" value: "aux" } },
  { model_name: "inner" model_version: -1 input_map { key: "x" value: "data" } output_map { key: "y" value: "prob" } }
] }'''

INNER = ('name: "inner" platform: "ensemble" max_batch_size: 0 '
         'input [{ name: "x" data_type: TYPE_FP32 dims: [16] }] output [{ name: "y" data_type: TYPE_FP32 dims: [16] }] '
         'ensemble_scheduling { step [ { model_name: "unbatched" model_version: -1 input_map { key: "input" value: "x" } '
         'output_map { key: "output" value: "y" } } ] }')
UNBATCHED = ('name: "unbatched" backend: "python" max_batch_size: 0 '
             'input [{ name: "input" data_type: TYPE_FP32 dims: [16] }] '
             'output [{ name: "output" data_type: TYPE_FP32 dims: [16] }]')


@pytest.fixture
def nested(tmp_path) -> Path:
    ens = build(tmp_path, parse_config(NO_BATCH), {"inner": INNER, "unbatched": UNBATCHED})
    (ens / "3").mkdir()
    (ens / "labels.txt").write_text("a\nb\n")
    return ens


def test_the_router_keeps_the_ensembles_interface(nested, tmp_path):
    code = main(["migrate", str(nested), "--name", "vision_router", "--repo", str(tmp_path), "--model-config-name", ""])
    assert code == 0
    router = tmp_path / "vision_router"
    config, ensemble = read_config(router / "config.pbtxt"), read_config(nested / "config.pbtxt")
    assert config.name == "vision_router" and config.backend == "python" and not config.platform
    assert config.max_batch_size == 0
    assert list(config.input) == list(ensemble.input) and list(config.output) == list(ensemble.output)
    assert config.version_policy == ensemble.version_policy
    assert config.parameters["team"].string_value == "vision"
    assert config.parameters["policy"].string_value == "policy.yaml"
    assert [(g.kind, g.count) for g in config.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_CPU, 1)]
    assert not config.HasField("dynamic_batching")  # an ensemble never merges requests
    assert sorted(p.name for p in router.iterdir()) == ["1", "3", "config.pbtxt", "labels.txt", "policy.yaml"]
    assert (router / "1" / "model.py").read_text() == (router / "3" / "model.py").read_text() == MODEL_PY
    assert (router / "labels.txt").read_text() == "a\nb\n"
    assert not list(tmp_path.glob(".vision_router.*"))  # the temporary directory went


def test_the_policy_has_one_step_per_ensemble_step(nested, tmp_path):
    migration = plan_migration(nested, "r", config_name=None)
    document = migration.policy
    assert document["version"] == 1 and document["ignored_parameters"] == ["*"]
    steps = document["pipeline"]["steps"]
    assert [(s["name"], s["model"], s.get("version")) for s in steps] == [
        ("one_1", "one", 1), ("one_2", "one", None), ("inner", "inner", None)]
    assert steps[0]["inputs"] == {"input": "data"} and steps[0]["outputs"] == {"output": "t1"}
    # max_batch_size 0 router around batching steps: every step's model's batching and input
    # dims, from which the router reshapes per tensor as Triton does
    assert [s["model_dims"] for s in steps] == [{"max_batch_size": 4, "inputs": {"input": [16]}}] * 2 + [
        {"max_batch_size": 0, "inputs": {"x": [16]}}]
    assert document["pipeline"]["outputs"] == ["aux", "prob"]  # Triton's order: the reverse of the config's here
    assert all(set(s) <= {"kind", "name", "model", "version", "inputs", "outputs", "model_dims"} for s in steps)


def test_a_batching_router_adds_no_batch_dimension(tmp_path):
    migration = plan_migration(build(tmp_path, parse_config(ENSEMBLE)), "r", config_name=None)
    assert [s["name"] for s in migration.policy["pipeline"]["steps"]] == ["one", "split", "join"]
    assert not any("add_batch_dim" in s or "model_dims" in s for s in migration.policy["pipeline"]["steps"])
    assert migration.config.max_batch_size == 4


def test_the_written_policy_reads_back(nested, tmp_path):
    main(["migrate", str(nested), "--name", "r", "--repo", str(tmp_path), "--model-config-name", ""])
    written = yaml.safe_load((tmp_path / "r" / "policy.yaml").read_text())
    assert written == plan_migration(nested, "r", config_name=None).policy


def test_a_parameter_named_policy_is_refused(tmp_path):
    config = parse_config(ENSEMBLE)
    config.parameters["policy"].string_value = "mine"
    with pytest.raises(MigrateError, match="parameter 'policy'"):
        plan_migration(build(tmp_path, config), "r", config_name=None)


def test_the_shipped_ensemble_plan():
    migration = plan_migration(REPO / "ensemble", "migrated")
    assert migration.outputs == ["VERDICTS", "PROBABILITIES"]  # as Triton's ensemble answers
    assert [s["model"] for s in migration.policy["pipeline"]["steps"]] == ["tokenizer", "classifier", "postprocess"]
    assert migration.label_files == ["labels.txt"] and migration.versions == ["1"]
    # a batching ensemble's router batches at its own door (the migrate guide says why)
    assert migration.config.HasField("dynamic_batching") and migration.config.max_batch_size == 64
    assert not plan_migration(REPO / "ensemble", "m", dynamic_batching=False).config.HasField("dynamic_batching")


def test_a_router_of_an_ensemble_without_batching_gets_no_dynamic_batching(tmp_path):
    config = parse_config(ENSEMBLE)
    config.max_batch_size = 0
    assert not router_config(config, "r").HasField("dynamic_batching")


def test_migrate_without_the_client_extra_says_which(tmp_path):
    from tests.unit.test_cli_surface import _run_without

    proc = _run_without(["tritonclient"], ["migrate", str(REPO / "ensemble"), "--name", "n", "--repo", str(tmp_path)],
                        tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == "error: orchestrator migrate needs the 'client' extra: pip install 'triton-orchestrator[client]'\n"
    assert list(tmp_path.iterdir()) == []


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "migrate-an-ensemble.md"


def _blocks(lang: str):
    """The guide's fenced blocks of language ``lang`` ('' for none), in order."""
    blocks, current, inside = [], [], None
    for line in GUIDE.read_text().splitlines():
        if line.startswith("```"):
            if inside is None:
                inside, current = line[3:].strip(), []
            else:
                if inside == lang:
                    blocks.append("\n".join(current) + "\n")
                inside = None
        elif inside is not None:
            current.append(line)
    return blocks


def test_the_guides_swap_keeps_the_name_clients_call(tmp_path):
    """The guide's commands, run as written in a copy of the repository: the router ends up
    under the ensemble's name, and the repository passes Triton's load-time checks."""
    import shutil
    import subprocess
    import sys

    from orchestrator.tooling.repository import repository_problems

    (swap,) = [b for b in _blocks("bash") if "mv model_repository/ensemble" in b]
    shutil.copytree(REPO, tmp_path / "model_repository", ignore=shutil.ignore_patterns("__pycache__"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "orchestrator").write_text(f"#!/bin/sh\nexec {sys.executable} -m orchestrator.tooling.cli \"$@\"\n")
    (bindir / "orchestrator").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": str(GUIDE.parents[2])}
    proc = subprocess.run(["bash", "-ec", swap], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "wrote" in proc.stdout, proc.stdout + proc.stderr
    config = read_config(tmp_path / "model_repository" / "ensemble" / "config.pbtxt")
    assert config.name == "ensemble" and config.backend == "python"
    assert (tmp_path / "ensemble.orig" / "config.pbtxt").is_file()
    assert repository_problems(tmp_path / "model_repository") == []


def test_the_guides_check_report_is_what_check_prints():
    from orchestrator.tooling.migrate_check import OutputStats, Report

    (shown,) = [b for b in _blocks("") if b.startswith("--check:")]
    report = Report("ensemble", "ensemble_bls", 8, {"VERDICTS": OutputStats(), "PROBABILITIES": OutputStats()})
    assert report.text() + "\n" == shown
    assert plan_migration(REPO / "ensemble", "x").outputs == ["VERDICTS", "PROBABILITIES"]


def test_the_guides_policy_is_what_migrate_writes():
    shown, whole = [b for b in _blocks("yaml") if "pipeline:" in b]
    written = plan_migration(REPO / "ensemble", "ensemble_bls").policy
    assert {k: v for k, v in written.items() if k != "description"} == yaml.safe_load(shown)
    assert plan_migration(REPO / "ensemble", "ensemble_whole", call_ensemble=True).policy["pipeline"] == \
        yaml.safe_load(whole)["pipeline"]


def test_policy_check_finds_what_the_router_or_triton_would_refuse(nested, tmp_path, capsys):
    """``orchestrator policy check`` on a migrated router's pipeline: valid as written; a step
    key the model lacks, a version not served, a model not there, an output the router does
    not have: each located."""
    assert main(["migrate", str(nested), "--name", "r", "--repo", str(tmp_path), "--model-config-name", ""]) == 0
    policy = tmp_path / "r" / "policy.yaml"
    document = yaml.safe_load(policy.read_text())
    steps = document["pipeline"]["steps"]
    steps[0]["inputs"] = {"bogus": "data"}
    steps[0]["model_dims"]["inputs"] = {"bogus": [16]}
    steps[1]["version"] = 7
    steps[2]["model"] = "gone"
    steps[1]["model_dims"] = {"max_batch_size": 2, "inputs": {"input": [8]}}
    document["pipeline"]["outputs"].append("nope")
    policy.write_text(yaml.safe_dump(document))
    capsys.readouterr()
    assert main(["policy", "check", str(policy), "--repo", str(tmp_path), "--model-config-name", ""]) == 1
    err = capsys.readouterr().err
    assert "pipeline.outputs[2]: 'nope' is not an output of router 'r'" in err
    assert "pipeline.steps[0].inputs.bogus: 'one' has no input 'bogus'" in err
    assert "pipeline.steps[1].version: version 7 of 'one' is not served" in err
    assert "pipeline.steps[1].model_dims.max_batch_size: 2, but 'one' has max_batch_size 4" in err
    assert "pipeline.steps[1].model_dims.inputs.input: [8], but 'one' input 'input' has dims [16]" in err
    assert "model 'gone' is not in the model repository" in err


def test_reshapes_per_tensor_are_migrated_as_model_dims(tmp_path):
    """max_batch_size 0: an input already shaped [1, 16] into a batching model of dims [16]
    (Triton sends it as it is), and a batching step's output into a model without batching
    (Triton strips its batch dimension): migrated, each step with its model's dims."""
    text = NO_BATCH.replace('input [{ name: "data" data_type: TYPE_FP32 dims: [16] }]',
                            'input [{ name: "data" data_type: TYPE_FP32 dims: [1, 16] }]').replace(
        'input_map { key: "x" value: "data" }', 'input_map { key: "x" value: "t1" }')
    ens = build(tmp_path, parse_config(text), {"inner": INNER, "unbatched": UNBATCHED})
    (ens / "labels.txt").write_text("a\nb\n")
    steps = plan_migration(ens, "r", config_name=None).policy["pipeline"]["steps"]
    assert [(s["model"], s["model_dims"]) for s in steps] == [
        ("one", {"max_batch_size": 4, "inputs": {"input": [16]}}), ("one", {"max_batch_size": 4, "inputs": {"input": [16]}}),
        ("inner", {"max_batch_size": 0, "inputs": {"x": [16]}})]


def test_the_guides_before_block_is_the_shipped_ensemble():
    (before,) = [b for b in _blocks("") if b.startswith('name: "ensemble"')]
    config = read_config(REPO / "ensemble" / "config.pbtxt")
    dtype = model_config_pb2.DataType.Name
    for io in [*config.input, *config.output]:
        assert f"{io.name} ({dtype(io.data_type)} [{', '.join(map(str, io.dims))}]" in before, io.name
    assert f"max_batch_size: {config.max_batch_size}" in before
    assert f"step [ {', '.join(s.model_name for s in config.ensemble_scheduling.step)} ]" in before


def test_call_ensemble_writes_one_step_calling_the_ensemble_whole(nested, tmp_path):
    """``--call-ensemble``: the same configuration, one step whose inputs and outputs are the
    ensemble's own, the outputs in the order the step-by-step policy gives them."""
    assert main(["migrate", str(nested), "--name", "whole", "--repo", str(tmp_path), "--model-config-name", "",
                 "--call-ensemble"]) == 0
    policy = yaml.safe_load((tmp_path / "whole" / "policy.yaml").read_text())
    assert policy["pipeline"]["steps"] == [{"kind": "step", "name": "ens", "model": "ens", "inputs": {"data": "data"},
                                            "outputs": {"prob": "prob", "aux": "aux"}}]
    steps = plan_migration(nested, "steps", config_name=None)
    assert policy["pipeline"]["outputs"] == steps.policy["pipeline"]["outputs"]
    whole = read_config(tmp_path / "whole" / "config.pbtxt")
    assert whole.input == steps.config.input and whole.output == steps.config.output
    assert whole.version_policy == steps.config.version_policy
    assert sorted(p.name for p in (tmp_path / "whole").iterdir()) == ["1", "3", "config.pbtxt", "labels.txt", "policy.yaml"]


def test_call_ensemble_under_the_ensembles_own_name_is_refused(nested, tmp_path, capsys):
    """A router named as the ensemble it calls would call itself: refused, nothing written."""
    out = tmp_path / "out"
    assert main(["migrate", str(nested), "--name", "ens", "--repo", str(out), "--model-config-name", "",
                 "--call-ensemble"]) == 1
    assert "needs another name" in capsys.readouterr().err
    assert not out.exists()
