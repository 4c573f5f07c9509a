"""The name a user installs: the distribution is ``triton-orchestrator`` (``orchestrator`` on
PyPI is an unrelated project with its own top-level module ``orchestrator``). No user page, no
message of the package and no Makefile line tells a user to ``pip install orchestrator`` or
an ``orchestrator[extra]``; the README says how to install from a checkout or a wheel and
what happens beside the unrelated project."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = "triton-orchestrator"
README = ROOT / "README.md"
#: Pages and files a user reads or runs (the changelog is history: it keeps the old name).
USER_FILES = sorted([README, ROOT / "Makefile", *(p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts),
                     *(ROOT / "orchestrator").rglob("*.py"), *(ROOT / "lab").rglob("*.py")])
#: ``pip install orchestrator``, ``pip install -U "orchestrator[serve]"``, ``'orchestrator[export]'``:
#: the unrelated project's name where one installs (not ``triton-orchestrator``, not a path).
WRONG_NAME = re.compile(r"pip3? install\s+(?:-\S+\s+)*[\"']?orchestrator(?![\w./-])|(?<![\w./-])[\"'`]?orchestrator\[[a-z,]+\]")


def test_the_distribution_name_is_ours_and_the_import_package_stays():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST
    assert project["scripts"] == {"orchestrator": "orchestrator.tooling.cli:main"}
    assert (ROOT / "orchestrator" / "__init__.py").is_file()


@pytest.mark.parametrize("path", USER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_or_message_installs_the_unrelated_orchestrator(path):
    hits = [f"{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1) if WRONG_NAME.search(line)]
    assert hits == [], f"{path.relative_to(ROOT)} tells a user to install PyPI's unrelated 'orchestrator' (use {DIST}): {hits}"


@pytest.mark.parametrize("line,wrong", [
    ("pip install orchestrator", True),
    ("pip install orchestrator   # the runtime", True),
    ('pip install "orchestrator[serve]"', True),
    ("pip install -U 'orchestrator[export]'", True),
    ("needs the 'export' extra: pip install 'orchestrator[export]'", True),
    ("`orchestrator[serve]` the embedded server", True),
    ("pip install triton-orchestrator", False),
    ('pip install "triton-orchestrator[serve]"', False),
    ("pip install -e '.[env]'", False),
    ("pip install orchestrator/ .", False),
    ("orchestrator export --router-name sentiment", False),
])
def test_the_wrong_name_pattern_catches_what_it_should(line, wrong):
    assert bool(WRONG_NAME.search(line)) is wrong


def test_the_missing_extra_hint_names_the_distribution():
    from orchestrator.tooling.cli import missing_extra_message

    assert missing_extra_message("export", "export").endswith(f"pip install '{DIST}[export]'")


def test_the_readme_says_how_to_install_before_a_release_and_beside_the_unrelated_project():
    text = README.read_text()
    install = text[text.index("To use the package in your own environment"):text.index("## Calling it")]
    for extra in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]:
        if extra not in ("test", "train"):
            assert f'pip install "{DIST}[{extra}]"' in install, extra
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"dist/{DIST.replace('-', '_')}-{version}-py3-none-any.whl" in install  # the wheel pip wheel names
    assert 'pip install ".[serve]"' in install
    assert "pip uninstall orchestrator" in install


def test_the_readme_says_which_extra_the_classifiers_embedded_models_need():
    """The base install is the router's, tokenizer's and postprocess' runtime; the classifiers'
    embedded model.py imports onnxruntime, which the serve extra brings."""
    import ast

    adapter = ROOT / "model_repository" / "classifier" / "1" / "model.py"
    module = next(n.module for n in ast.walk(ast.parse(adapter.read_text())) if isinstance(n, ast.ImportFrom))
    source = (ROOT / Path(*module.split("."))).with_suffix(".py").read_text()
    imported = {a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
    assert "onnxruntime" in imported
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("onnxruntime") for r in extras["serve"])
    lines = README.read_text().splitlines()
    base = next(ln for ln in lines if ln.startswith(f"pip install {DIST} "))
    serve = next(ln for ln in lines if ln.startswith(f'pip install "{DIST}[serve]"'))
    assert "the models import" not in base and "onnxruntime" in serve
