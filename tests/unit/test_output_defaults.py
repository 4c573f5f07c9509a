"""Commands write outside the tracked tree by default (``.cache/...``); only an explicit
``--out docs/results`` (``BENCH_OUT=docs/results``, ``SOAK_OUT=docs/results``, ``LOCK_OUT=deploy``) rewrites the
committed reports and lock. Issue 26: `parity --held-out`, `make bench`, `make soak` and
`make deploy-lock` rewrote tracked files."""

from __future__ import annotations

import argparse
import re
import subprocess

import pytest

from orchestrator.tooling.paths import PROJECT_ROOT

TRACKED_ROOTS = ("docs", "deploy", "model_repository", "env", "orchestrator", "tests")


def _tracked(path: str) -> bool:
    rel = path.replace(str(PROJECT_ROOT) + "/", "").lstrip("./")
    return rel.split("/")[0] in TRACKED_ROOTS


def test_out_options_default_outside_the_tracked_tree():
    found = {}
    for path in sorted((PROJECT_ROOT / "orchestrator").rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r'add_argument\(\s*"--out",(.*?)\)\n', text, re.S):
            default = re.search(r'default=(?:Path\()?(?:str\()?(?:PROJECT_ROOT / )?"([^"]*)"', m.group(1))
            if default:
                found[f"{path.relative_to(PROJECT_ROOT)}"] = default.group(1)
    assert "orchestrator/tooling/modeling/parity/run.py" in found and "orchestrator/tooling/bench/cli.py" in found
    # `make model` exists to rebuild the committed demo models: its default is the repository
    allowed = {"orchestrator/tooling/modeling/train/run.py": "model_repository"}
    assert {k: v for k, v in found.items() if _tracked(v) and allowed.get(k) != v} == {}, found


def test_parity_and_bench_defaults_parse_to_the_cache():
    from orchestrator.tooling.bench.cli import add_bench_arguments
    from orchestrator.tooling.modeling.parity.run import add_parity_arguments

    parity = add_parity_arguments(argparse.ArgumentParser()).parse_args(["--reference", "classifier", "--held-out"])
    assert str(parity.out) == ".cache/parity"
    assert add_bench_arguments(argparse.ArgumentParser()).parse_args([]).out == ".cache/docs"


def test_makefile_outputs_default_to_the_cache():
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    defaults = dict(re.findall(r"^(\w+_OUT) \?= (\S+)$", makefile, re.M))
    assert defaults == {"BENCH_OUT": ".cache/docs", "SOAK_OUT": ".cache/docs", "LOCK_OUT": ".cache/deploy"}
    for line in makefile.splitlines():
        if line.startswith("\t") and "--out" in line:
            value = line.split("--out", 1)[1].split()[0]
            assert value.startswith("$(") or not _tracked(value), line


@pytest.mark.skipif(not (PROJECT_ROOT / ".git").exists(), reason="not a git checkout")
def test_nothing_tracked_lives_under_the_default_output_dirs():
    listed = subprocess.run(["git", "ls-files", ".cache"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    assert listed.stdout == ""
