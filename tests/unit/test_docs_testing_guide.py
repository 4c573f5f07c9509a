"""The "test your Python models" guide runs as written: its model.py is the example
repository's, its test is the example's test file (<= 20 lines) and passes under the plugin
alone; the reference names only fixtures, markers, options and methods that exist."""

from __future__ import annotations

import re
import shutil

from orchestrator.testing.harness import TritonMock
from orchestrator.testing.mock import install
from tests.helpers import ROOT

GUIDE = ROOT / "docs" / "guides" / "test-your-python-models.md"
REFERENCE = ROOT / "docs" / "reference" / "testing.md"
EXAMPLE = ROOT / "examples" / "test-your-python-models"


def _blocks(language: str) -> list:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)


def test_the_guides_model_and_test_are_the_example_repositorys():
    model, test = _blocks("python")[:2]
    assert model == (EXAMPLE / "model_repository" / "pipeline" / "1" / "model.py").read_text(encoding="utf-8")
    assert test == (EXAMPLE / "test_pipeline.py").read_text(encoding="utf-8")
    assert len(test.strip().splitlines()) <= 20


def test_the_guides_test_passes_as_written(pytester):
    shutil.copytree(EXAMPLE / "model_repository", pytester.path / "model_repository")
    test = _blocks("python")[1]
    pytester.makepyfile(test_pipeline=test)
    command = _blocks("bash")[1].strip()
    assert command == "pytest test_pipeline.py"
    result = pytester.runpytest_inprocess("-p", "orchestrator.testing.pytest_plugin", "-p", "no:cacheprovider",
                                          "test_pipeline.py")
    result.assert_outcomes(passed=1)
    assert _blocks("text")[1].strip() == "1 passed"


def test_the_install_line_names_the_testing_extra():
    assert re.fullmatch(r'pip install "[a-z-]+\[testing\]"', _blocks("bash")[0].strip())
    assert re.search(r"^testing = \[", (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)


def test_the_reference_names_what_exists(pytester):
    text = REFERENCE.read_text(encoding="utf-8")
    methods = set(re.findall(r"^\| `([a-z_]+)\(", text, re.M))
    methods |= {m for cell in re.findall(r"^\| `[^|]*\|", text, re.M) for m in re.findall(r"`([a-z_]+)\(", cell)}
    assert {"fake", "add_model", "infer", "kill_stub", "fail_next"} <= methods
    pb_utils = install()
    missing = sorted(m for m in methods if not hasattr(TritonMock, m) and not hasattr(pb_utils, m) and m not in {"make", "f"})
    assert not missing, missing
    pytester.makepyfile("def test_x(): pass")
    help_text = pytester.runpytest_inprocess("-p", "orchestrator.testing.pytest_plugin", "--help").stdout.str()
    markers = pytester.runpytest_inprocess("-p", "orchestrator.testing.pytest_plugin", "--markers").stdout.str()
    for option in re.findall(r"`(--triton-[a-z]+)", text):
        assert option in help_text, option
    for marker in re.findall(r"@pytest\.mark\.([a-z_]+)\(", text):
        assert f"@pytest.mark.{marker}(" in markers, marker
