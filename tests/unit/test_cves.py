"""The CVE gate (issue 27): deploy/triton-cves.yaml, the table in docs/guides/security.md made from
it, and make deploy-check refusing a base release that cannot hold a listed fix."""

from __future__ import annotations

import re

import pytest
import yaml

from orchestrator.tooling import cves as C
from orchestrator.tooling import deploy as D
from tests.helpers import ROOT

DOC = ROOT / "docs" / "guides" / "security.md"


def test_the_docs_table_is_the_data():
    assert C.markdown_table(C.load_cves()) in DOC.read_text(), (
        "docs/guides/security.md's CVE table differs from deploy/triton-cves.yaml: python -m orchestrator.tooling.cves prints it")


def test_every_row_is_from_an_nvidia_bulletin_and_every_unconfirmed_fix_says_so():
    rows = C.load_cves()
    by_cve = {c.cve: c for c in rows}
    # the rows that were "not confirmed" before NVIDIA's own bulletins were read
    assert {"CVE-2025-33201", "CVE-2026-24146", "CVE-2026-24173", "CVE-2026-24206", "CVE-2026-24207",
            "CVE-2026-24208", "CVE-2026-24209"} <= set(by_cve)
    for c in rows:
        assert c.fixed_in is not None or c.source.startswith("not confirmed"), c
        assert re.search(r"https?://|bulletin|same as", c.source), c
        if c.bulletin is not None:
            year = c.published.year if c.published else None
            assert f"https://github.com/NVIDIA/product-security/blob/main/{year}/{c.bulletin}/{c.bulletin}.json" in c.source, c
    c = by_cve["CVE-2026-24207"]
    assert (c.component, c.cvss, c.fixed_in, c.bulletin) == ("server", 9.8, (26, 3), "5828")
    assert {c.component for c in rows if c.cve in {"CVE-2026-24213", "CVE-2026-24214", "CVE-2026-24215"}} == {"dali_backend"}


def _check(tmp_path, tag=None, cves=C.CVE_FILE):
    """The gate's findings on the shipped Dockerfile, its base moved to NGC ``tag``."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    path = tmp_path / "Dockerfile"
    path.write_text(text if tag is None else re.sub(r"tritonserver:\d\d\.\d\d-py3", f"tritonserver:{tag}-py3", text))
    base = D.base_image(path)
    return C.check_base(base.reference, base.release, cves)


def _named(findings):
    return {f.split(": ")[1].split()[0] for f in findings}


def test_the_shipped_base_passes_and_the_minimum_follows_the_newest_gated_fix(tmp_path):
    assert _check(tmp_path) == []
    assert C.minimum_release(C.load_cves()) == (26, 6)  # bulletin 5865 (2026-08-18)


@pytest.mark.parametrize("tag, named", [
    ("26.05", {"CVE-2026-47606", "CVE-2026-47627", "CVE-2026-47628", "CVE-2026-47629", "CVE-2026-47630"}),
    ("26.04", {"CVE-2026-47606", "CVE-2026-47627", "CVE-2026-47628", "CVE-2026-47629", "CVE-2026-47630",
               "CVE-2026-47476", "CVE-2026-47477", "CVE-2026-47478", "CVE-2026-47479", "CVE-2026-47480",
               "CVE-2026-47481", "CVE-2026-47482"}),
])
def test_a_base_older_than_the_newest_fix_is_refused(tmp_path, tag, named):
    findings = _check(tmp_path, tag)
    assert _named(findings) == named
    assert all("(server) fixed in 26.0" in f for f in findings), findings


def test_a_base_older_than_a_confirmed_fix_is_refused(tmp_path):
    messages = _check(tmp_path, "25.07")
    assert any("CVE-2025-23316 (python_backend) fixed in 25.08" in m for m in messages), messages
    assert not any("CVE-2025-23310" in m for m in messages)


def test_dali_backend_rows_are_listed_but_not_gated(tmp_path):
    named = _named(_check(tmp_path, "26.02"))
    assert {"CVE-2026-24206", "CVE-2026-24207", "CVE-2026-24208", "CVE-2026-24209", "CVE-2026-24210"} <= named
    assert not named & {"CVE-2026-24213", "CVE-2026-24214", "CVE-2026-24215"}  # DALI backend, same bulletin
    rows = yaml.safe_load(C.CVE_FILE.read_text())
    dali = next(r for r in rows if r["component"] == "dali_backend")
    dali["fixed_in"] = "26.09"  # past the shipped 26.08: gated, the shipped base would fail
    path = tmp_path / "cves.yaml"
    path.write_text(yaml.safe_dump(rows))
    assert _check(tmp_path, cves=path) == []
    dali["component"] = "server"
    path.write_text(yaml.safe_dump(rows))
    assert _named(_check(tmp_path, cves=path)) == {dali["cve"]}
    assert "| dali_backend (not gated: no model in this repository uses the DALI backend) |" in DOC.read_text()


def test_an_unconfirmed_fix_refuses_a_base_released_before_the_month_after(tmp_path):
    rows = yaml.safe_load(C.CVE_FILE.read_text())
    rows.append({"cve": "CVE-2026-99999", "component": "python_backend", "cvss": None, "what": "x",
                 "published": "2026-08-20", "fixed_in": None, "bulletin": None, "source": "not confirmed (test)"})
    path = tmp_path / "cves.yaml"
    path.write_text(yaml.safe_dump(rows).replace("'2026-08-20'", "2026-08-20"))
    findings = _check(tmp_path, cves=path)
    assert _named(findings) == {"CVE-2026-99999"}
    assert "fixed release not confirmed: a base released before 26.09" in findings[0]
    assert _check(tmp_path, "26.09", cves=path) == []
    assert C.minimum_release(C.load_cves(path)) == (26, 9)


@pytest.mark.parametrize("change, words", [
    (lambda r: r.update(fixed_in="26.6"), "fixed_in '26.6' is not an NGC release YY.MM"),
    (lambda r: r.update(fixed_in=None, published=None), "neither fixed_in nor published"),
    (lambda r: r.update(cve="CVE-26-1"), "is not CVE-YYYY-NNNN"),
    (lambda r: r.update(source=" "), "no source"),
    (lambda r: r.pop("what"), "keys must be"),
    (lambda r: r.update(component="tensorflow"), "component 'tensorflow' is not one of"),
    (lambda r: r.update(bulletin="May 2026"), "bulletin 'May 2026' is not an NVIDIA bulletin id"),
])
def test_a_bad_row_is_named(tmp_path, change, words):
    rows = yaml.safe_load(C.CVE_FILE.read_text())
    change(rows[0])
    path = tmp_path / "cves.yaml"
    path.write_text(yaml.safe_dump(rows))
    with pytest.raises(C.CveError, match=re.escape(words)):
        C.load_cves(path)
