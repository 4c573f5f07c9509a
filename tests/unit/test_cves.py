"""The CVE gate (issue 27): deploy/triton-cves.yaml, the table in docs/deployment.md made from
it, and make deploy-check refusing a base release that cannot hold a listed fix."""

from __future__ import annotations

import re

import pytest
import yaml

from orchestrator.tooling import cves as C
from orchestrator.tooling import deploy as D
from tests.helpers import ROOT

DOC = ROOT / "docs" / "deployment.md"


def test_the_docs_table_is_the_data():
    assert C.markdown_table(C.load_cves()) in DOC.read_text(), (
        "docs/deployment.md's CVE table differs from deploy/triton-cves.yaml: python -m orchestrator.tooling.cves prints it")


def test_every_unconfirmed_fix_says_so_and_every_row_has_a_source():
    rows = C.load_cves()
    assert {"CVE-2026-24146", "CVE-2026-24206", "CVE-2026-24207", "CVE-2026-24208", "CVE-2026-24209"} <= {c.cve for c in rows}
    for c in rows:
        assert c.fixed_in is not None or c.source.startswith("not confirmed"), c
        assert re.search(r"https?://|bulletin|same as", c.source), c


def _check(tmp_path, tag=None):
    """The gate's findings on the shipped Dockerfile, its base moved to NGC ``tag``."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    path = tmp_path / "Dockerfile"
    path.write_text(text if tag is None else re.sub(r"tritonserver:\d\d\.\d\d-py3", f"tritonserver:{tag}-py3", text))
    base = D.base_image(path)
    return C.check_base(base.reference, base.release)


def test_the_shipped_base_passes_and_the_minimum_follows_the_newest_entry(tmp_path):
    assert _check(tmp_path) == []
    assert C.minimum_release(C.load_cves()) == (26, 6)  # bulletin 5828 (2026-05-20): the month after


@pytest.mark.parametrize("tag, named", [
    ("26.05", {"CVE-2026-24206", "CVE-2026-24207", "CVE-2026-24208", "CVE-2026-24209"}),
    ("26.04", {"CVE-2026-24146", "CVE-2026-24173", "CVE-2026-24206", "CVE-2026-24207", "CVE-2026-24208", "CVE-2026-24209"}),
])
def test_a_base_released_before_a_bulletin_is_refused(tmp_path, tag, named):
    findings = _check(tmp_path, tag)
    assert {f.split(": ")[1].split()[0] for f in findings} == named
    assert "fixed release not confirmed" in findings[0]


def test_a_base_older_than_a_confirmed_fix_is_refused(tmp_path):
    messages = _check(tmp_path, "25.07")
    assert any("CVE-2025-23316 fixed in 25.08" in m for m in messages), messages
    assert not any("CVE-2025-23310" in m for m in messages)


@pytest.mark.parametrize("change, words", [
    (lambda r: r.update(fixed_in="26.6"), "fixed_in '26.6' is not an NGC release YY.MM"),
    (lambda r: r.update(fixed_in=None, published=None), "neither fixed_in nor published"),
    (lambda r: r.update(cve="CVE-26-1"), "is not CVE-YYYY-NNNN"),
    (lambda r: r.update(source=" "), "no source"),
    (lambda r: r.pop("what"), "keys must be"),
])
def test_a_bad_row_is_named(tmp_path, change, words):
    rows = yaml.safe_load(C.CVE_FILE.read_text())
    change(rows[0])
    path = tmp_path / "cves.yaml"
    path.write_text(yaml.safe_dump(rows))
    with pytest.raises(C.CveError, match=re.escape(words)):
        C.load_cves(path)
