"""The ``orchestrator`` command surface: every user-facing tool is a verb, the lab's are not;
a verb whose extra is missing says which to install in one line (exit 2, no traceback); a
closed stdout pipe ends the command quietly; the package never imports the lab."""

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.tooling import cli

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository"


def _verbs():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices


def test_every_user_facing_tool_is_a_verb_and_the_labs_are_not():
    verbs = _verbs()
    for verb in ("serve", "classify", "policy", "env", "stub", "doctor", "export", "parity", "calibrate", "tune",
                 "warmup", "deploy", "frontdoor"):
        assert verb in verbs, verb
        assert verb in cli.VERB_EXTRA, verb  # each verb names the extra it needs
    for lab_verb in ("bench", "soak", "gpu-check", "profile", "mutations", "train"):
        assert lab_verb not in verbs
    parser = cli.build_parser()
    assert parser.parse_args(["deploy", "load-models"]).func.__name__ == "deploy_command"
    assert parser.parse_args(["frontdoor", "check"]).func.__name__ == "frontdoor_command"
    assert parser.parse_args(["warmup", "--repo", "x"]).func.__name__ == "warmup_command"


def test_deploy_verb_prints_the_load_models(capsys):
    assert cli.main(["deploy", "load-models", "--repo", str(REPO)]) == 0
    assert capsys.readouterr().out.strip() == "router,classifier_fast,classifier"


def test_the_extras_named_exist_in_pyproject():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(cli.VERB_EXTRA.values()) <= set(extras)
    assert set(cli.EXTRA_MODULES) <= set(extras)


def _run_without(modules, argv, cwd):
    """``orchestrator <argv>`` in a fresh interpreter where importing ``modules`` fails as if
    they were not installed (``None`` in ``sys.modules``)."""
    code = textwrap.dedent(f"""
        import sys
        for name in {list(modules)!r}:
            sys.modules[name] = None
        from orchestrator.tooling.cli import main
        sys.exit(main({list(argv)!r}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_export_without_its_extra_is_one_line_and_exit_2(tmp_path):
    """The verb's own import of transformers fails (it runs after the checks of the
    checkpoint directory): one line naming the extra, no traceback."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    shutil.copy(REPO / "tokenizer" / "1" / "tokenizer.json", ckpt / "tokenizer.json")
    (tmp_path / "repo").mkdir()
    proc = _run_without(["transformers", "torch"], ["export", str(ckpt), "--name", "m", "--repo", str(tmp_path / "repo"), "--quiet"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "error: orchestrator export needs the 'export' extra: pip install 'triton-orchestrator[export]'\n"
    assert proc.stdout == ""


def test_a_verb_whose_module_needs_a_missing_extra_says_so_and_the_others_still_work(tmp_path):
    """Without tritonclient the policy verb cannot even be imported: it still parses its
    arguments, prints the one line and exits 2; ``--help`` still lists every verb."""
    proc = _run_without(["tritonclient"], ["policy", "check", str(REPO / "router" / "policy.yaml")], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == "error: orchestrator policy needs the 'client' extra: pip install 'triton-orchestrator[client]'\n"
    helped = _run_without(["tritonclient"], ["--help"], tmp_path)
    assert helped.returncode == 0 and "Traceback" not in helped.stderr
    assert "policy" in helped.stdout and "(needs the 'client' extra)" in helped.stdout


def test_calibrate_without_scipy_names_the_tune_extra(tmp_path):
    proc = _run_without(["scipy", "matplotlib"], ["calibrate", str(REPO / "classifier"), "--data", "split:validation"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == "error: orchestrator calibrate needs the 'tune' extra: pip install 'triton-orchestrator[tune]'\n"


def test_a_missing_module_no_extra_brings_is_a_real_error():
    assert cli.missing_extra("export", ModuleNotFoundError("x", name="transformers")) == "export"
    assert cli.missing_extra("tune", ModuleNotFoundError("x", name="scipy.stats")) == "tune"
    assert cli.missing_extra("tune", ModuleNotFoundError("x", name="transformers.models")) == "export"  # not the tune extra's
    assert cli.missing_extra("export", ModuleNotFoundError("x", name="pytriton")) == "serve"
    assert cli.missing_extra("export", ModuleNotFoundError("x", name="no_such_module")) is None

    def broken(args):
        raise ModuleNotFoundError("No module named 'no_such_module'", name="no_such_module")

    import argparse

    with pytest.raises(ModuleNotFoundError):
        cli.run(argparse.Namespace(command="export", func=broken))


def test_a_closed_stdout_pipe_ends_quietly(tmp_path):
    """``orchestrator deploy load-models | head -0``: the reader is gone before the
    command writes; no traceback, exit 141 (128 + SIGPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "orchestrator.tooling.cli", "deploy", "load-models", "--repo", str(REPO)],
                              stdout=write, stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write)
    assert proc.returncode == 141
    assert proc.stderr == ""


def _imports(text: str):
    """The absolute module names ``text`` imports: import, from-import, ``import_module("...")``."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                yield node.args[0].value


def test_the_package_never_imports_the_lab():
    """The lab imports the package, never the reverse: the wheel ships without it."""
    assert list(_imports("from lab.bench import x\nimport lab\nimportlib.import_module('lab.soak')\n")) == ["lab.bench", "lab", "lab.soak"]
    files = sorted((ROOT / "orchestrator").rglob("*.py"))
    assert len(files) > 100
    found = [(str(p.relative_to(ROOT)), name) for p in files
             for name in _imports(p.read_text(encoding="utf-8")) if name == "lab" or name.startswith("lab.")]
    assert found == []
