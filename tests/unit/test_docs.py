"""The docs are for users: README.md and docs/ hold no lab diary (dates, UTC times, load
averages, "issue N") outside the results pages and CHANGELOG.md; the README stays short;
every page is in mkdocs.yml's nav; every relative link resolves, anchors included. The link
checker is written here (no network, no mkdocs); with mkdocs installed (the `test` extra)
``mkdocs build --strict`` must pass too. The code is held to the same rule: no issue number
in a tracked source or build file, no ISO date in a Python comment or docstring."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
#: Where dated runs, machines and load averages belong: generated reports and the changelog.
RESULTS = DOCS / "results"
CHANGELOG = ROOT / "CHANGELOG.md"
README_MAX_BYTES = 12 * 1024

PAGES = sorted(DOCS.rglob("*.md"))
USER_PAGES = [README, *(p for p in PAGES if RESULTS not in p.parents)]

#: An ISO date (YYYY-MM-DD).
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
#: An issue number (:data:`ISSUE_SHAPES`): "issue N", "issues N and M", "Issue #N", "issue_Ns" in
#: a test name, "issue-N" in an anchor. An upstream reference is written owner/repo#N or "PR #N".
ISSUE = re.compile(r"(?<![a-z])issues?[ _-]?#?\d+", re.I)
#: A line of lab diary: an ISO date, a UTC time, a load average, an issue number.
DIARY = [
    ("a date", DATE),
    ("a UTC time", re.compile(r"\b\d{1,2}:\d\d(?::\d\d)?\s*UTC\b|\bUTC\b")),
    ("a load average", re.compile(r"\bload average\b|\bload \d+(?:\.\d+)?\b", re.I)),
    ("an issue number", ISSUE),
]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if not fence:
            yield n, line


def data_lines() -> set:
    """Lines whose dates are data, not a diary: the CVE table of docs/guides/security.md
    (each bulletin's publication date), generated from deploy/triton-cves.yaml."""
    from orchestrator.tooling import cves

    return set(cves.markdown_table(cves.load_cves()).splitlines())


@pytest.mark.parametrize("page", USER_PAGES, ids=rel)
def test_no_lab_diary_outside_the_results_pages(page):
    data = data_lines()
    found = [f"{rel(page)}:{n}: {what}: {line.strip()[:120]}"
             for n, line in enumerate(page.read_text().splitlines(), 1) if line not in data
             for what, pattern in DIARY if pattern.search(line)]
    assert not found, ("dated runs, load averages and issue numbers go to docs/results/ (the measurement) "
                       "or CHANGELOG.md (the change):\n" + "\n".join(found))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_issue_number_in_any_page(page):
    """Not on the results pages either: a run is dated there, but which issue asked for it is
    the team's workflow; a goal is named by what it asks."""
    found = [f"{rel(page)}:{n}: {line.strip()[:120]}" for n, line in enumerate(page.read_text().splitlines(), 1) if ISSUE.search(line)]
    assert not found, "say what the goal or change was instead of its issue's number:\n" + "\n".join(found)


#: Issue mentions the pattern must catch, ``N`` standing for the number so that this file
#: passes its own check (:func:`test_no_issue_number_in_source_or_build_files`).
ISSUE_SHAPES = ["issue N's goal", "issues N and 25", "Issue #N", "(issue N)", "def test_issue_Ns_goal", "#overload-issue-N"]


def test_the_diary_patterns_catch_what_they_should():
    caught = ["run of 2026-11-27", "at 05:10 UTC", "load average 0.96", "load 1.63 before",
              *(shape.replace("N", "29") for shape in ISSUE_SHAPES)]
    missed = ["Triton 2.51", "numpy 1.26.4", "PR #394", "p50 1.03x", "loads the model", "ISSUE_TEMPLATE",
              "huggingface/tokenizers#1794", "tissue 5", "known-issues.md#numpy"]
    for line in caught:
        assert any(p.search(line) for _, p in DIARY), line
    for line in missed:
        assert not any(p.search(line) for _, p in DIARY), line


def test_the_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move details into docs/"


def test_the_changelog_has_an_unreleased_section():
    text = CHANGELOG.read_text()
    assert text.startswith("# Changelog") and "\n## [Unreleased]" in text


# ----------------------------------------------------------------------------- navigation


def nav_pages(nav) -> list:
    out = []
    for item in nav:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                out.extend(nav_pages(value) if isinstance(value, list) else [value])
    return out


def mkdocs_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = mkdocs_config()
    assert config["docs_dir"] == "docs" and config["strict"] is True
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page is listed twice in mkdocs.yml's nav"
    pages = {str(p.relative_to(DOCS)) for p in PAGES}
    assert sorted(pages - set(listed)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(listed) - pages) == [], "mkdocs.yml's nav names pages that do not exist"


# ----------------------------------------------------------------------------- links

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slugs(text: str) -> set:
    """Anchors of a page's headings: Python-Markdown's toc slug (what mkdocs serves) and
    GitHub's (what the README is read on), duplicates numbered as each numbers them."""
    out: set = set()
    seen: dict = {}
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        title = re.sub(r"`([^`]*)`", r"\1", m.group(2))
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        plain = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
        toc = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", plain).strip().lower())
        github = re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title.lower()).strip())
        for slug, sep in ((toc, "_"), (github, "-")):
            n = seen.get((slug, sep), 0)
            out.add(slug if n == 0 else f"{slug}{sep}{n}")
            seen[(slug, sep)] = n + 1
    return out


def links(text: str):
    """(line number, target) of the Markdown links outside code."""
    for n, line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "", line)
        for m in LINK.finditer(line):
            yield n, m.group(1) or m.group(2)


@pytest.mark.parametrize("page", [README, CHANGELOG, *PAGES], ids=rel)
def test_every_relative_link_resolves(page):
    broken = []
    for n, target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{rel(page)}:{n}: ({target})"
        if not dest.exists():
            broken.append(f"{where}: no such file")
            continue
        if page != README and DOCS not in [dest, *dest.parents]:
            broken.append(f"{where}: outside docs/ (mkdocs cannot serve it; name the file in `code` instead)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in slugs(dest.read_text()):
            broken.append(f"{where}: no heading with the anchor #{anchor} in {rel(dest)}")
    assert not broken, "\n".join(broken)


def test_the_link_checker_finds_a_broken_link_and_anchor(tmp_path):
    text = "# Title\n\n## A `b` c, d\n\n[ok](#a-b-c-d) [bad](#nope) `[code](x.md)`\n```\n[fenced](y.md)\n```\n"
    assert [t for _, t in links(text)] == ["#a-b-c-d", "#nope"]
    assert "a-b-c-d" in slugs(text) and "nope" not in slugs(text)


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the `test` extra has it); the link checker above still ran")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                             "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_readme_policy_example_parses():
    from orchestrator.runtime.routing.policy import parse_policy

    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md: the policy example of 'Route your own model' is missing"
    for block in blocks:
        parse_policy(yaml.safe_load(block))


def test_one_compatibility_table_and_every_recipe_agrees_with_it():
    """docs/reference/compatibility.md states the image's NGC release (the Dockerfile's FROM),
    the CVE gate's minimum (deploy/triton-cves.yaml) and the release the tests run (the
    embedded server's); every container recipe in the README and the guides uses the image's
    release."""
    import re

    from orchestrator.tooling import cves
    from orchestrator.tooling.env.stubs import EMBEDDED_TRITON_RELEASE

    image = re.search(r"^FROM nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-py3@", (ROOT / "deploy" / "Dockerfile").read_text(), re.M).group(1)
    gate = "%d.%02d" % cves.minimum_release(cves.load_cves())
    table = (ROOT / "docs" / "reference" / "compatibility.md").read_text().split("## Releases")[0]
    row = next(line for line in table.splitlines() if line.startswith("| the container image"))
    assert f"NGC {image}" in row and f"{gate} or later" in row, row
    tested = EMBEDDED_TRITON_RELEASE.lstrip("r")
    assert any(line.startswith("| the tests") and f"({tested})" in line for line in table.splitlines())
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if "results" in page.relative_to(ROOT).parts:
            continue
        for used in re.findall(r"tritonserver:(\d\d\.\d\d)-py3", page.read_text()):
            assert used == image, f"{page.relative_to(ROOT)} runs tritonserver:{used}-py3, the image is {image}"


# ----------------------------------------------------------------------------- source and build files

#: The tracked files held to the rule besides the docs: source, build and configuration files
#: (by suffix, plus ``Makefile``, ``Dockerfile*`` and ``requirements*.txt``) and the Markdown
#: outside docs/ (env/README.md, stub_build/README.md, the model card).
SOURCE_SUFFIXES = (".py", ".sh", ".toml", ".yaml", ".yml", ".pbtxt", ".cfg", ".md")



def tracked_sources() -> list:
    """The tracked files of :data:`SOURCE_SUFFIXES` and the build files, outside docs/results/
    and CHANGELOG.md (where the runs and the changes are recorded, issue numbers included)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"not a git checkout (git ls-files: {exc})")
    files = []
    for name in filter(None, out.split("\0")):
        path = ROOT / name
        if name.startswith("docs/") or name == "CHANGELOG.md" or not path.is_file():
            continue  # docs/ outside the results pages: test_no_lab_diary_outside_the_results_pages
        if (path.suffix in SOURCE_SUFFIXES or path.name == "Makefile" or path.name.startswith("Dockerfile")
                or (path.suffix == ".txt" and path.name.startswith("requirements"))):
            files.append(name)
    return files


def test_no_issue_number_in_source_or_build_files():
    """Code, comments, docstrings, test names, config and build files say what a change means
    (the feature, the goal, the reason); which issue asked for it is the team's workflow and
    goes to CHANGELOG.md."""
    found = []
    for name in tracked_sources():
        found += [f"{name}:{n}: {line.strip()[:120]}"
                  for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1) if ISSUE.search(line)]
    assert not found, "say what the issue meant instead of its number:\n" + "\n".join(found)


def python_prose(text: str) -> dict:
    """{line number: line} of a Python source's prose: its comments and its bare string
    statements (module, class and function docstrings, and the strings documenting an
    attribute). A string the code uses (an assignment, an argument, test data) is data and may
    hold a date; a comment or a docstring is read as the code's contract, where a date is a
    run's diary."""
    lines = text.splitlines()
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and DATE.search(tok.string):
            found[tok.start[0]] = lines[tok.start[0] - 1]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for n in range(node.lineno, node.end_lineno + 1):
                if DATE.search(lines[n - 1]):
                    found[n] = lines[n - 1]
    return found


def test_python_prose_is_comments_and_docstrings():
    source = ('"""Module docstring, measured 2026-11-25."""\n'
              'RELEASED = "2026-08-18"  # the value is data; this comment of 2026-11-26 is not\n'
              "def f():\n"
              '    """A docstring."""\n'
              '    return {"created": "2026-01-01"}\n'
              "Y = 2\n"
              '"""Attribute docstring of 2026-11-27."""\n')
    assert sorted(python_prose(source)) == [1, 2, 7]
    assert python_prose('X = "2026-08-18"\n') == {}


def test_no_date_in_python_comments_or_docstrings():
    """A date in a comment or docstring is a run's (when it was measured); the reason stays
    and the run goes to docs/results/. Dates in data (strings the code uses) are allowed."""
    found = []
    for name in tracked_sources():
        if name.endswith(".py"):
            found += [f"{name}:{n}: {line.strip()[:120]}" for n, line in sorted(python_prose((ROOT / name).read_text()).items())]
    assert not found, "keep the reason, drop the date (the run belongs in docs/results/):\n" + "\n".join(found)
