"""Every Triton model configuration of the checkout, parsed strictly against Triton's
``model_config.proto`` (orchestrator.tooling.repository) and checked across files; the
classifier configurations equal what their generator (orchestrator.tooling.modeling.configs)
writes; broken configurations fail with the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc.model_config_pb2 import TYPE_FP32, ModelInstanceGroup

from orchestrator.tooling import repository
from orchestrator.tooling.errors import ConfigError, ToolingError
from orchestrator.tooling.modeling import configs
from tests.helpers import FIXTURES, REPO, ROOT

CONFIG_FILES = sorted(
    p for base in (REPO, FIXTURES) for pattern in ("**/config.pbtxt", "**/configs/*.pbtxt") for p in base.glob(pattern)
)


def _model_dir(path: Path) -> Path:
    return path.parent if path.name == "config.pbtxt" else path.parent.parent


#: Directories that hold model directories: the parents of the models of CONFIG_FILES.
REPOSITORIES = sorted({_model_dir(p).parent for p in CONFIG_FILES})
CLASSIFIERS = sorted(d.name for d in REPO.iterdir() if (d / "1" / "model.onnx").is_file())


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_checkout_has_the_configs_we_expect():
    names = {_rel(p) for p in CONFIG_FILES}
    assert {"model_repository/router/config.pbtxt", "model_repository/ensemble/config.pbtxt",
            "model_repository/classifier/configs/embedded.pbtxt", "tests/fixtures/mock/repo/pipeline/config.pbtxt",
            "tests/fixtures/server/models/doubler/config.pbtxt"} <= names
    assert {"model_repository", "tests/fixtures/mock/repo", "tests/fixtures/server/models"} <= {_rel(r) for r in REPOSITORIES}
    assert CLASSIFIERS == ["classifier", "classifier_fast", "classifier_fp16"]


@pytest.mark.parametrize("path", CONFIG_FILES, ids=_rel)
def test_config_parses_strictly(path):
    config = repository.read_config(path)
    assert config.name or path.name == "config.pbtxt"
    assert config.backend or config.platform, "Triton needs a backend or a platform"


@pytest.mark.parametrize("repo", REPOSITORIES, ids=_rel)
def test_repository_is_consistent(repo):
    """Names match directories, Python models have 1/model.py, ensemble steps call existing
    models with their input/output names (tooling.repository.check_repository)."""
    checked = repository.check_repository(repo)
    assert set(checked) == {p for p in CONFIG_FILES if _model_dir(p).parent == repo}


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_native_config_is_onnxruntime_on_the_gpu(name):
    native = repository.read_config(REPO / name / "config.pbtxt")
    assert native.platform == "onnxruntime_onnx" and not native.backend
    assert [g.kind for g in native.instance_group] == [ModelInstanceGroup.KIND_GPU]
    embedded = repository.read_config(REPO / name / "configs" / "embedded.pbtxt")
    assert repository.is_python_model(embedded) and repository.get_parameter(embedded, "onnx_file") == "model.onnx"
    # the two configs serve the same file with the same tensors
    assert (native.input, native.output, native.max_batch_size) == (embedded.input, embedded.output, embedded.max_batch_size)


def test_committed_classifier_configs_are_the_generators_output():
    expected = configs.committed_classifier_files(REPO)
    assert {_rel(p) for p in expected} == {f"model_repository/{n}/{rel}" for n in CLASSIFIERS
                                           for rel in ("config.pbtxt", "configs/embedded.pbtxt", "head.json")}
    for path, text in expected.items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{_rel(path)} differs from the generator: run `python -m orchestrator.tooling.modeling.configs`")
    assert "exported by `orchestrator export`: float16 weights (fp32 io) converted from classifier/1/model.onnx" \
        in (REPO / "classifier_fp16" / "config.pbtxt").read_text()
    assert configs.main(["--repo", str(REPO), "--check"]) == 0


def test_committed_tokenizer_config_is_the_generators():
    """The tokenizer config export writes for a repository without one is the committed one."""
    committed = repository.read_config(REPO / "tokenizer" / "config.pbtxt")
    assert committed == configs.tokenizer_config(tokenizer_dir=REPO / "tokenizer" / "1")
    assert committed.model_warmup and not committed.response_cache.enable


# ----------------------------------------------------------------------------- broken configs


@pytest.mark.parametrize("line, message", [
    ('nmae: "x"', 'has no field named "nmae"'),
    ("instance_group [ { count: 1 kind: KIND_GPUU } ]", "has no value named KIND_GPUU"),
    ("max_batch_size: many", "Couldn't parse integer"),
])
def test_a_broken_config_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "m" / "config.pbtxt"
    path.parent.mkdir()
    path.write_text(f'# a comment\nname: "m"\nbackend: "python"\n{line}\n')
    with pytest.raises(ConfigError, match=rf"^{path}:4:\d+ : .*{message}") as err:
        repository.read_config(path)
    assert isinstance(err.value, ToolingError)
    with pytest.raises(ConfigError, match=rf"^{path}:4:"):
        repository.check_repository(tmp_path)


def _model(repo: Path, name: str, text: str, model_py: bool = True) -> Path:
    (repo / name / "1").mkdir(parents=True)
    if model_py:
        (repo / name / "1" / "model.py").write_text("")
    (repo / name / "config.pbtxt").write_text(text)
    return repo / name


def test_check_repository_reports_every_broken_rule_with_its_file(tmp_path):
    io = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    _model(tmp_path, "a", f'name: "a" backend: "python" {io}')
    _model(tmp_path, "b", f'name: "not_b" backend: "python" {io}')
    _model(tmp_path, "c", f'name: "c" backend: "python" {io}', model_py=False)
    _model(tmp_path, "d", 'name: "d" backend: "python" input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] '
           'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "labels.txt" } ]')
    _model(tmp_path, "e", 'name: "e" platform: "ensemble" '
           'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ] '
           'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "LOST" data_type: TYPE_FP32 dims: [ 1 ] } ] '
           'ensemble_scheduling { step [ '
           '{ model_name: "a" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } }, '
           '{ model_name: "a" model_version: -1 input_map { key: "W" value: "NOWHERE" } output_map { key: "Z" value: "t" } }, '
           '{ model_name: "ghost" model_version: -1 input_map { key: "X" value: "IN" } } ] }', model_py=False)
    with pytest.raises(ConfigError) as err:
        repository.check_repository(tmp_path)
    problems = str(err.value).splitlines()
    e = tmp_path / "e" / "config.pbtxt"
    assert problems == [
        f"{tmp_path / 'b' / 'config.pbtxt'}: name 'not_b' is not the directory's name 'b' "
        "(Triton refuses the repository: set name: \"b\" or remove the line)",
        f"{tmp_path / 'c' / 'config.pbtxt'}: Python model without 1/model.py",
        f"{tmp_path / 'd' / 'config.pbtxt'}: output 'Y' names the label file 'labels.txt', which is not in {tmp_path / 'd'}",
        f"{e}: step 2 (a): input_map key 'W' is not an input of {tmp_path / 'a' / 'config.pbtxt'}",
        f"{e}: step 2 (a): output_map key 'Z' is not an output of {tmp_path / 'a' / 'config.pbtxt'}",
        f"{e}: step 2 (a): reads 'NOWHERE', neither an ensemble input nor a step's output",
        f"{e}: step 3 (ghost): no model 'ghost' in {tmp_path}",
        f"{e}: output 'LOST' is produced by no step",
    ]


# ----------------------------------------------------------------------------- editing


def test_copy_model_renames_every_config_and_rename_steps(tmp_path):
    repo = tmp_path / "repo"
    repository.copy_model(REPO / "ensemble", repo / "ensemble")
    written = repository.copy_model(REPO / "classifier_fast", repo / "classifier_spare")
    assert [p.relative_to(repo).as_posix() for p in written] == ["classifier_spare/config.pbtxt",
                                                                 "classifier_spare/configs/embedded.pbtxt"]
    for path in written:
        config = repository.read_config(path)
        original = repository.read_config(REPO / "classifier_fast" / path.relative_to(repo / "classifier_spare"))
        assert config.name == "classifier_spare"
        config.name = original.name
        assert config == original
        assert path.read_text().startswith("# Copy of classifier_fast/")
    assert (repo / "classifier_spare" / "1" / "model.onnx").read_bytes() == \
        (REPO / "classifier_fast" / "1" / "model.onnx").read_bytes()
    ensemble = repository.read_config(repo / "ensemble" / "config.pbtxt")
    assert repository.rename_steps(ensemble, {"classifier": "classifier_spare", "absent": "x"}) == 1
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == ["tokenizer", "classifier_spare", "postprocess"]
    with pytest.raises(OSError):  # never over an existing model
        repository.copy_model(REPO / "classifier_fast", repo / "classifier_spare")


def test_write_classifier_configs_generates_then_updates_in_place(tmp_path):
    model = tmp_path / "topic"
    written = configs.write_classifier_configs(model, 3, "a comment")
    assert [p.relative_to(model).as_posix() for p in written] == ["config.pbtxt", "configs/embedded.pbtxt"]
    assert written[0].read_text() == configs.classifier_files("topic", 3, "a comment")["config.pbtxt"]
    native = repository.read_config(written[0])
    assert native == configs.native_config("topic", 3) and list(native.output[0].dims) == [3]
    native.instance_group[0].count = 2  # a setting of the user's: kept by the next export
    repository.write_config(written[0], native)
    configs.write_classifier_configs(model, 1, "another", tensorrt=True)
    native = repository.read_config(written[0])
    assert list(native.output[0].dims) == [1] and native.instance_group[0].count == 2
    assert written[0].read_text().count(f"# {configs.EXPORT_MARK}") == 1 and "another" in written[0].read_text()
    trt = repository.read_config(model / "configs" / "tensorrt.pbtxt")
    assert trt == configs.tensorrt_config("topic", 1)
    repository.write_config(written[1], configs.embedded_config("other", 1))
    with pytest.raises(ConfigError, match="name 'other' is not 'topic'"):
        configs.write_classifier_configs(model, 1)
    bad = configs.embedded_config("topic", 1)
    bad.output[0].data_type = TYPE_FP32 + 1
    repository.write_config(written[1], bad)
    with pytest.raises(ConfigError, match="no single FP32 output 'logits'"):
        configs.write_classifier_configs(model, 1)
