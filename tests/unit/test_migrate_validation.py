"""``orchestrator migrate`` refuses every invalid ensemble as Triton 2.51 refuses it, with
Triton's reason, and writes nothing: one case per kind of invalid configuration built here
(the kinds of Triton's QA cases, server ``qa/L0_model_config/autofill_noplatform/ensemble``),
and, where ``ORCHESTRATOR_TRITON_SERVER_SRC`` names an extracted tree of
triton-inference-server/server, every QA case itself against its ``expected`` message."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Callable, Dict

import pytest

from orchestrator.tooling.cli import main
from orchestrator.tooling.ensembles import Repository, check_ensemble
from orchestrator.tooling.repository import ModelConfig, format_config, parse_config

MODELS = {
    "one": 'name: "one" backend: "python" max_batch_size: 4 '
           'input [{ name: "input" data_type: TYPE_FP32 dims: [16] }] '
           'output [{ name: "output" data_type: TYPE_FP32 dims: [16] }]',
    "split": 'name: "split" backend: "python" max_batch_size: 4 '
             'input [{ name: "input" data_type: TYPE_FP32 dims: [16] }] '
             'output [{ name: "output1" data_type: TYPE_FP32 dims: [16] }, '
             '{ name: "output2" data_type: TYPE_FP32 dims: [16] }]',
    "join": 'name: "join" backend: "python" max_batch_size: 4 '
            'input [{ name: "input1" data_type: TYPE_FP32 dims: [16] }, '
            '{ name: "input2" data_type: TYPE_FP32 dims: [16] }] '
            'output [{ name: "output" data_type: TYPE_FP32 dims: [16] }]',
    "ints": 'name: "ints" backend: "python" max_batch_size: 4 '
            'input [{ name: "input" data_type: TYPE_INT32 dims: [16] }] '
            'output [{ name: "output" data_type: TYPE_INT32 dims: [16] }]',
    "cube": 'name: "cube" backend: "python" max_batch_size: 4 '
            'input [{ name: "input" data_type: TYPE_FP32 dims: [16, 16] }] '
            'output [{ name: "output" data_type: TYPE_FP32 dims: [16, 16] }]',
    "small": 'name: "small" backend: "python" max_batch_size: 2 '
             'input [{ name: "input" data_type: TYPE_FP32 dims: [16] }] '
             'output [{ name: "output" data_type: TYPE_FP32 dims: [16] }]',
    "stream": 'name: "stream" backend: "python" max_batch_size: 0 model_transaction_policy { decoupled: true } '
              'input [{ name: "input" data_type: TYPE_FP32 dims: [16] }] '
              'output [{ name: "output" data_type: TYPE_FP32 dims: [16] }]',
}

ENSEMBLE = '''name: "ens" platform: "ensemble" max_batch_size: 4
input [{ name: "data" data_type: TYPE_FP32 dims: [16] }]
output [{ name: "prob" data_type: TYPE_FP32 dims: [16] }]
ensemble_scheduling { step [
  { model_name: "one" model_version: -1 input_map { key: "input" value: "data" } output_map { key: "output" value: "t1" } },
  { model_name: "split" model_version: -1 input_map { key: "input" value: "t1" }
    output_map { key: "output1" value: "t2" } output_map { key: "output2" value: "t3" } },
  { model_name: "join" model_version: -1 input_map { key: "input1" value: "t2" } input_map { key: "input2" value: "t3" }
    output_map { key: "output" value: "prob" } }
] }'''


def build(root: Path, ensemble: ModelConfig, extra: Dict[str, str] = ()) -> Path:
    """A repository of :data:`MODELS`, ``extra`` (name -> pbtxt) and ``ensemble`` as ``ens``,
    each with a version directory 1 (an empty ``model.py`` in the Python models')."""
    for name, text in {**MODELS, **dict(extra)}.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
        if 'backend: "python"' in text:
            (root / name / "1" / "model.py").write_text("")
    (root / "ens" / "1").mkdir(parents=True)
    (root / "ens" / "config.pbtxt").write_text(format_config(ensemble))
    return root / "ens"


def step(config: ModelConfig, index: int):
    return config.ensemble_scheduling.step[index]


def _set(field: str, value) -> Callable[[ModelConfig], None]:
    return lambda c: setattr(c, field, value)


def _clear_step_field(index: int, field: str) -> Callable[[ModelConfig], None]:
    return lambda c: step(c, index).ClearField(field)


def _remap_input(index: int, key: str, tensor: str) -> Callable[[ModelConfig], None]:
    def edit(c):
        step(c, index).input_map[key] = tensor
    return edit


def _rename_input_key(index: int, old: str, new: str) -> Callable[[ModelConfig], None]:
    def edit(c):
        s = step(c, index)
        s.input_map[new] = s.input_map.pop(old)
    return edit


def _rename_output_key(index: int, old: str, new: str) -> Callable[[ModelConfig], None]:
    def edit(c):
        s = step(c, index)
        s.output_map[new] = s.output_map.pop(old)
    return edit


def _model(index: int, name: str) -> Callable[[ModelConfig], None]:
    return lambda c: setattr(step(c, index), "model_name", name)


def _add_output(name: str) -> Callable[[ModelConfig], None]:
    def edit(c):
        o = c.output.add()
        o.name, o.data_type = name, c.output[0].data_type
        o.dims.extend([16])
    return edit


def _add_input(name: str) -> Callable[[ModelConfig], None]:
    def edit(c):
        i = c.input.add()
        i.name, i.data_type = name, c.input[0].data_type
        i.dims.extend([16])
    return edit


def _data_cycle(c):
    # step 0 reads what it writes: t1 waits on itself and 'prob' is never written
    step(c, 0).input_map["input"] = "t1"
    _add_input_unused_fix(c)


def _add_input_unused_fix(c):
    # keep 'data' used: a fourth step reads it and writes an extra output
    s = c.ensemble_scheduling.step.add()
    s.model_name = "one"
    s.input_map["input"] = "data"
    s.output_map["output"] = "extra"
    _add_output("extra")(c)


def _not_connected(c):
    step(c, 0).input_map["input"] = "nowhere"
    _add_input_unused_fix(c)


def _version(v: int) -> Callable[[ModelConfig], None]:
    return lambda c: setattr(step(c, 0), "model_version", v)


def _both(*edits):
    def edit(c):
        for e in edits:
            e(c)
    return edit


def _nested_circle(c):
    step(c, 0).model_name = "inner"


INNER_BACK = ('name: "inner" platform: "ensemble" max_batch_size: 4 '
              'input [{ name: "input" data_type: TYPE_FP32 dims: [16] }] '
              'output [{ name: "output" data_type: TYPE_FP32 dims: [16] }] '
              'ensemble_scheduling { step [ { model_name: "ens" model_version: -1 '
              'input_map { key: "data" value: "input" } output_map { key: "prob" value: "output" } } ] }')

STREAM_FORK = '''name: "ens" platform: "ensemble" max_batch_size: 0
input [{ name: "data" data_type: TYPE_FP32 dims: [16] }]
output [{ name: "prob" data_type: TYPE_FP32 dims: [16] }]
ensemble_scheduling { step [
  { model_name: "stream" model_version: -1 input_map { key: "input" value: "data" } output_map { key: "output" value: "a" } },
  { model_name: "stream" model_version: -1 input_map { key: "input" value: "data" } output_map { key: "output" value: "b" } },
  { model_name: "join" model_version: -1 input_map { key: "input1" value: "a" } input_map { key: "input2" value: "b" }
    output_map { key: "output" value: "prob" } }
] }'''

#: kind -> (edit of the valid ensemble, or a whole ensemble text; extra models; Triton's message)
CASES = {
    "circular_dependency": (_nested_circle, {"inner": INNER_BACK},
                            "circular dependency between ensembles: ens -> ... -> inner -> ens"),
    "self_circular_dependency": (_model(0, "ens"), {},
                                 "circular dependency between ensembles: ens -> ... -> ens -> ens"),
    "data_cycle": (_data_cycle, {}, "output 'prob' for ensemble 'ens' is not written"),
    "not_connected": (_not_connected, {}, "output 'prob' for ensemble 'ens' is not written: at least one of its "
                                          "depending tensors, 'nowhere', is not connected"),
    "unmapped_input": (lambda c: step(c, 2).input_map.pop("input2") and None,
                       {}, None),  # filled below: t3 then unused
    "unmapped_model_input": (_both(_rename_input_key(2, "input2", "input1"), _remap_input(2, "input1", "t2"),
                                   lambda c: step(c, 1).output_map.pop("output2") and None),
                             {}, "in ensemble ens, input input2 in model join is not mapped to any ensemble tensors"),
    "unknown_input": (_rename_input_key(2, "input2", "bogus"), {},
                      "in ensemble ens, ensemble tensor t3 is mapping to non-existing input bogus in model join"),
    "unknown_output": (_rename_output_key(1, "output2", "bogus"), {},
                       "in ensemble ens, ensemble tensor t3 is mapped from non-existing output bogus in model split"),
    "unused_tensor": (lambda c: step(c, 1).output_map.__setitem__("output2", "t_unused") or
                      step(c, 2).input_map.__setitem__("input2", "t2"), {},
                      "ensemble tensor 't_unused' is unused in ensemble 'ens'"),
    "unused_input": (_add_input("data_2"), {}, "ensemble input 'data_2' for ensemble ens' is not used"),
    "unused_output": (_add_output("prob_2"), {}, "ensemble output 'prob_2' for ensemble ens' is not used"),
    "inconsistent_data_type": (_model(0, "ints"), {},
                               "in ensemble ens, ensemble tensor data: inconsistent data type: TYPE_FP32 is inferred "
                               "from model ens while TYPE_INT32 is inferred from model ints"),
    "inconsistent_shape": (_model(0, "cube"), {},
                           "in ensemble ens, ensemble tensor data: inconsistent shape: [-1,16] is inferred from model "
                           "ens while [-1,16,16] is inferred from model cube"),
    "no_step": (lambda c: c.ensemble_scheduling.ClearField("step"), {}, "must specify 'step' for ensemble 'ens'"),
    "no_model_name": (_clear_step_field(1, "model_name"), {}, "must specify 'model_name' in step 1 of ensemble 'ens'"),
    "no_input_map": (_clear_step_field(1, "input_map"), {}, "must specify 'input_map' in step 1 of ensemble 'ens'"),
    "no_output_map": (_clear_step_field(1, "output_map"), {}, "must specify 'output_map' in step 1 of ensemble 'ens'"),
    "invalid_batch_size": (_model(0, "small"), {}, "ensemble ens allows maximum batch size 4, but it contains model "
                                                   "small which only allows maximum batch size to be 2"),
    "no_required_version": (_version(2), {}, "ensemble 'ens' depends on 'one' whose required version 2 is not loaded"),
    "non_existing_model": (_model(1, "missing"), {},
                           "ensemble ens contains models that are not available or ambiguous: missing"),
    "output_overmapped": (lambda c: step(c, 1).output_map.__setitem__("output2", "t2"), {},
                          "ensemble tensor 't2' can appear in an output map only once for ensemble 'ens' step 1"),
    "decoupled_branching": (STREAM_FORK, {}, "in ensemble ens, step of model 'ens' receives inputs originated from "
                                             "different decoupled models"),
    "has_backend": (_set("backend", "onnxruntime"), {},
                    "Ensemble model 'ens' must have platform type 'ensemble' and empty backend type"),
    "no_scheduling": (lambda c: c.ClearField("ensemble_scheduling"), {},
                      "ensemble scheduling must be set for ensemble ens whose platform is ensemble"),
    "instance_group": (lambda c: c.instance_group.add() and None, {},
                       "instance group should not be specified for ensemble 'ens'"),
    "optimization": (lambda c: setattr(c.optimization, "priority", 1), {},
                     "optimization should not be specified for ensemble 'ens'"),
    "model_warmup": (lambda c: setattr(c.model_warmup.add(), "name", "w"), {},
                     "model_warmup can not be specified for ensemble 'ens'"),
}
CASES["unmapped_input"] = (lambda c: step(c, 2).input_map.pop("input2") and None, {},
                           "ensemble tensor 't3' is unused in ensemble 'ens'")


def ensemble_for(edit) -> ModelConfig:
    if isinstance(edit, str):
        return parse_config(edit)
    config = parse_config(ENSEMBLE)
    edit(config)
    return config


def test_the_valid_ensemble_passes(tmp_path):
    ens = build(tmp_path, parse_config(ENSEMBLE))
    assert check_ensemble("ens", Repository(tmp_path)).name == "ens"
    assert main(["migrate", str(ens), "--name", "r", "--repo", str(tmp_path / "out"), "--model-config-name", ""]) == 0
    assert (tmp_path / "out" / "r" / "policy.yaml").is_file()


@pytest.mark.parametrize("kind", sorted(CASES))
def test_migrate_refuses_what_triton_refuses(tmp_path, capsys, kind):
    edit, extra, message = CASES[kind]
    ens = build(tmp_path / "repo", ensemble_for(edit), extra)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code = main(["migrate", str(ens), "--name", "router", "--repo", str(tmp_path / "repo")])
    err = capsys.readouterr().err
    assert code == 1
    assert message in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_a_decoupled_step_is_refused_naming_the_model(tmp_path, capsys):
    text = STREAM_FORK.split("ensemble_scheduling")[0] + (
        'ensemble_scheduling { step [ { model_name: "stream" model_version: -1 input_map { key: "input" value: "data" } '
        'output_map { key: "output" value: "prob" } } ] }')
    ens = build(tmp_path, parse_config(text))
    assert main(["migrate", str(ens), "--name", "router", "--repo", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "calls model 'stream', which is decoupled" in err
    assert not (tmp_path / "router").exists()


def test_an_existing_target_is_refused(tmp_path, capsys):
    ens = build(tmp_path, parse_config(ENSEMBLE))
    (tmp_path / "router").mkdir()
    assert main(["migrate", str(ens), "--name", "router", "--repo", str(tmp_path)]) == 1
    assert "exists" in capsys.readouterr().err
    assert list((tmp_path / "router").iterdir()) == []


QA = os.environ.get("ORCHESTRATOR_TRITON_SERVER_SRC")
QA_DIR = Path(QA or ".") / "qa" / "L0_model_config" / "autofill_noplatform" / "ensemble"
QA_OK = Path(QA or ".") / "qa" / "L0_model_config" / "autofill_noplatform_success" / "ensemble"


def _qa_cases(root: Path):
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if QA and root.is_dir() else []


def _qa_repository(case: Path, dest: Path) -> str:
    """The case as L0_model_config/test.sh serves it: a single configuration is the model
    (named by its config); else each subdirectory is a model, the one named like the case
    the ensemble under test; every model gets a version directory 1."""
    if (case / "config.pbtxt").is_file():
        name = parse_config((case / "config.pbtxt").read_text()).name or case.name
        shutil.copytree(case, dest / name)
    else:
        name = case.name
        for sub in case.iterdir():
            if sub.is_dir():
                shutil.copytree(sub, dest / sub.name)
    for model in dest.iterdir():
        (model / "1").mkdir(exist_ok=True)
    return name


@pytest.mark.skipif(not QA, reason="set ORCHESTRATOR_TRITON_SERVER_SRC to an extracted triton-inference-server/server "
                                   "tree (v2.51.0) to run Triton's own QA cases")
@pytest.mark.parametrize("case", _qa_cases(QA_DIR) or ["none"])
def test_triton_qa_invalid_ensembles_are_refused(tmp_path, capsys, case):
    expected = (QA_DIR / case / "expected").read_text().strip()
    name = _qa_repository(QA_DIR / case, tmp_path / "repo")
    before = sorted(tmp_path.rglob("*"))
    code = main(["migrate", str(tmp_path / "repo" / name), "--name", "router", "--repo", str(tmp_path / "repo")])
    err = capsys.readouterr().err
    assert code == 1
    assert re.search(expected, err), (expected, err)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.skipif(not QA, reason="set ORCHESTRATOR_TRITON_SERVER_SRC to an extracted triton-inference-server/server "
                                   "tree (v2.51.0) to run Triton's own QA cases")
@pytest.mark.parametrize("case", _qa_cases(QA_OK) or ["none"])
def test_triton_qa_valid_ensembles_pass(tmp_path, case):
    name = _qa_repository(QA_OK / case, tmp_path)
    assert check_ensemble(name, Repository(tmp_path)).name == name


def test_an_unmapped_optional_input_is_allowed(tmp_path):
    """Triton 2.51 loads an ensemble whose step leaves an optional model input unmapped
    (checked on the embedded server); migrate does too."""
    optional = MODELS["join"].replace('{ name: "input2" data_type: TYPE_FP32 dims: [16] }',
                                      '{ name: "input2" data_type: TYPE_FP32 dims: [16] optional: true }')
    config = parse_config(ENSEMBLE)
    step(config, 2).input_map.pop("input2")
    step(config, 1).output_map.pop("output2")
    build(tmp_path, config, {"join": optional})
    assert check_ensemble("ens", Repository(tmp_path)).name == "ens"


def test_a_step_model_without_a_configuration_file_is_named(tmp_path, capsys):
    """Triton can fill in some models' configurations from the model file; migrate needs the
    file, and says so instead of calling the model missing."""
    ens = build(tmp_path, parse_config(ENSEMBLE))
    (tmp_path / "split" / "config.pbtxt").unlink()
    assert main(["migrate", str(ens), "--name", "r", "--repo", str(tmp_path), "--model-config-name", ""]) == 1
    assert "model 'split' of ensemble 'ens' has no configuration file" in capsys.readouterr().err
