"""The numbers and paths a user page shows are checked, so they cannot drift: the answers
docs/getting-started.md quotes are what the shipped router answers now (computed by the
real router code on the shipped models in the in-process mock, embedded configs as
``orchestrator serve`` loads them on CPU), its accuracies are the model card's, and every
path of the project a user page names exists."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
USER_PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").rglob("*.md")) if "results" not in p.parts)]

#: The sentences of getting-started.md that quote the router: (pattern, texts, routes).
ANSWERS = re.compile(r"answer those two right \(positive (\d\.\d{3}) and (\d\.\d{3}), both from `(\w+)`\)")
ESCALATED = re.compile(r'"(Not worth the ticket\.)" comes back positive (\d\.\d{3}) after the cascade escalates it to `(\w+)`')
TWO = ["A gorgeous, witty film.", "A dull, lifeless film."]


@pytest.fixture(scope="module")
def router():
    """The shipped router in the mock: ``ask(texts) -> (probabilities, routes)``."""
    pytest.importorskip("onnxruntime", reason="the classifiers' embedded model.py needs onnxruntime (the serve extra)")
    from orchestrator.testing.mock import MockTriton

    with MockTriton(REPO) as mock:
        for model in ("tokenizer", "classifier_fast", "classifier", "router"):
            mock.load(model)

        def ask(texts):
            out = mock.infer("router", {"TEXT": np.array([[t.encode()] for t in texts], dtype=object),
                                        "THRESHOLD": np.full((len(texts), 1), 0.5, np.float32)})
            return out["PROBABILITIES"][:, 0], [r.decode() for r in out["ROUTE"].ravel()]

        yield ask


def test_getting_started_quotes_what_the_router_answers(router):
    text = " ".join(GETTING_STARTED.read_text().split())
    assert all(t in text for t in TWO), "the classify example's texts moved: update this test with the page"
    m = ANSWERS.search(text)
    assert m, "getting-started.md no longer quotes the two answers in the expected sentence"
    probs, routes = router(TWO)
    assert [f"{p:.3f}" for p in probs] == [m.group(1), m.group(2)]
    assert routes == [m.group(3)] * 2
    e = ESCALATED.search(text)
    assert e, "getting-started.md no longer quotes the escalated negation"
    probs, routes = router([e.group(1)])
    assert f"{probs[0]:.3f}" == e.group(2) and routes == [e.group(3)]
    assert probs[0] >= 0.5  # "comes back positive": the page calls it a wrong answer


def test_getting_started_accuracies_are_the_model_cards():
    card = (REPO / "MODEL_CARD.md").read_text()
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\| all \| \d+ \| (\w+) \| (0\.\d+) \|", card, re.M)}
    text = " ".join(GETTING_STARTED.read_text().split())
    m = re.search(r"test-split accuracy ([\d.]+)% `classifier`, ([\d.]+)% `classifier_fast`", text)
    assert m, "getting-started.md no longer quotes the test-split accuracies"
    assert (m.group(1), m.group(2)) == (f"{rows['classifier'] * 100:.1f}", f"{rows['classifier_fast'] * 100:.1f}")


#: Top-level folders of the checkout; a page's path under one of them must exist.
TOPS = ("orchestrator/", "lab/", "deploy/", "docs/", "model_repository/", "tests/", "env/", "stub_build/")
PATH = re.compile(r"(?<![\w./-])((?:%s)[A-Za-z0-9_./-]*)" % "|".join(map(re.escape, TOPS)))
#: Paths a page may name that are not in the checkout: what a command writes, a user's own
#: model, a file-name prefix (``env/requirements-*``), Triton's own docs tree.
NOT_IN_CHECKOUT = (
    re.compile(r"^stub_build/out/"),  # make stub writes it
    re.compile(r"^docs/user_guide/"),  # Triton server's docs tree (upstream)
    re.compile(r"[-_]$"),  # a prefix, the page goes on with a pattern
)


def _not_shipped_model(path: str) -> bool:
    parts = path.split("/")
    return parts[0] == "model_repository" and len(parts) > 1 and not (REPO / parts[1]).exists()


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_project_path_a_page_names_exists(page):
    missing = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in PATH.finditer(line):
            path = m.group(1).rstrip(".,:;)")
            if any(c in line[m.end():m.end() + 1] for c in "*<{$") or any(p.search(path) for p in NOT_IN_CHECKOUT):
                continue
            if _not_shipped_model(path):
                continue
            if not (ROOT / path).exists():
                missing.append(f"{n}: {path}")
    assert missing == [], f"{page.relative_to(ROOT)} names paths that are not in the checkout: {missing}"


def test_the_path_check_finds_a_moved_file(tmp_path):
    line = "Both commands check this first (`orchestrator/tooling/preflight.py`)"
    found = [m.group(1) for m in PATH.finditer(line)]
    assert found == ["orchestrator/tooling/preflight.py"] and not (ROOT / found[0]).exists()
    assert (ROOT / "lab" / "preflight.py").is_file()


def _pins() -> dict:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: dict = {}
    for req in project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]:
        m = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;,]+)", req)
        if m:
            pins.setdefault(m.group(1).lower().replace("_", "-"), set()).add(m.group(2))
    return pins


PIN = re.compile(r"(?<![\w.-])([A-Za-z][A-Za-z0-9_.-]*)==([0-9][0-9A-Za-z.+-]*[0-9A-Za-z])")


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_pinned_version_a_page_names_is_pyprojects(page):
    pins = _pins()
    wrong = [f"{n}: {m.group(0)} (pyproject.toml: {sorted(pins[m.group(1).lower().replace('_', '-')])})"
             for n, line in enumerate(page.read_text().splitlines(), 1) for m in PIN.finditer(line)
             if m.group(1).lower().replace("_", "-") in pins and m.group(2) not in pins[m.group(1).lower().replace("_", "-")]]
    assert wrong == [], f"{page.relative_to(ROOT)} names other versions than pyproject.toml pins: {wrong}"


def test_the_pin_check_reads_the_pins():
    pins = _pins()
    assert pins["torch"] == {"2.13.0"} and "onnxruntime" in pins
    assert [m.group(0) for m in PIN.finditer("install torch==2.12.0 --index-url x, `onnxruntime==1.31.1`")] == [
        "torch==2.12.0", "onnxruntime==1.31.1"]
