"""The CVE gate (issue 27): ``deploy/triton-cves.yaml`` lists Triton CVEs with the component
and the NGC release that fixes each (NVIDIA's bulletins); :func:`check_base` refuses a
``deploy/Dockerfile`` base older than the newest confirmed fix of a gated component
(:data:`GATED`), or released before the month after an unconfirmed CVE of one was published
(it cannot hold a later fix); ``make deploy-check``
runs it (``orchestrator.tooling.deploy``, check ``cve``). docs/guides/security.md,
"Security", holds the same table (:func:`markdown_table`; tests/unit/test_cves.py)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import yaml

from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.paths import PROJECT_ROOT

# Not imported from orchestrator.tooling.deploy, which calls this module's check.
CVE_FILE = PROJECT_ROOT / "deploy" / "triton-cves.yaml"


class CveError(ToolingError):
    """The CVE table cannot be read; the message names the row and field."""

#: The components whose CVEs the gate holds the base to: what this image's models run on.
GATED = frozenset({"server", "python_backend", "onnxruntime_backend"})
#: The other components a bulletin may name, with why their CVEs are listed but not gated.
NOT_GATED = {"dali_backend": "no model in this repository uses the DALI backend"}
_KEYS = ("cve", "component", "cvss", "what", "published", "fixed_in", "bulletin", "source")
_CVE = re.compile(r"^CVE-\d{4}-\d{4,}$")
_RELEASE = re.compile(r"^(\d\d)\.(\d\d)$")


@dataclass(frozen=True)
class Cve:
    """One row: ``fixed_in`` (YY, MM) or None (not confirmed); ``published`` a date or None;
    ``bulletin`` NVIDIA's bulletin id or None."""

    cve: str
    component: str
    cvss: Optional[float]
    what: str
    published: Optional[dt.date]
    fixed_in: Optional[Tuple[int, int]]
    bulletin: Optional[str]
    source: str

    @property
    def gated(self) -> bool:
        return self.component in GATED

    @property
    def needs(self) -> Tuple[int, int]:
        """The oldest NGC release the gate accepts for this CVE: its fix, else the month
        after its publication."""
        if self.fixed_in is not None:
            return self.fixed_in
        assert self.published is not None
        y, m = self.published.year % 100, self.published.month + 1
        return (y + 1, 1) if m == 13 else (y, m)


def load_cves(path: Path = CVE_FILE) -> List[Cve]:
    """The table; :class:`CveError` naming the row and field that is wrong."""
    try:
        rows = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CveError(f"{path}: {exc}") from None
    if not isinstance(rows, list) or not rows:
        raise CveError(f"{path}: a list of CVE rows")
    out = []
    for i, row in enumerate(rows):
        where = f"{path}: row {i + 1}"
        if not isinstance(row, dict) or set(row) != set(_KEYS):
            raise CveError(f"{where}: keys must be {', '.join(_KEYS)}")
        if not _CVE.match(str(row["cve"])):
            raise CveError(f"{where}: cve {row['cve']!r} is not CVE-YYYY-NNNN")
        if row["component"] not in GATED | set(NOT_GATED):
            raise CveError(f"{where} ({row['cve']}): component {row['component']!r} is not one of "
                           f"{', '.join(sorted(GATED | set(NOT_GATED)))}")
        if row["bulletin"] is not None and not re.fullmatch(r"\d+", str(row["bulletin"])):
            raise CveError(f"{where} ({row['cve']}): bulletin {row['bulletin']!r} is not an NVIDIA bulletin id (digits) or null")
        fixed = row["fixed_in"]
        m = _RELEASE.match(str(fixed)) if fixed is not None else None
        if fixed is not None and not m:
            raise CveError(f"{where} ({row['cve']}): fixed_in {fixed!r} is not an NGC release YY.MM (quote it) or null")
        published = row["published"]
        if published is not None and not isinstance(published, dt.date):
            raise CveError(f"{where} ({row['cve']}): published {published!r} is not a date YYYY-MM-DD")
        if fixed is None and published is None:
            raise CveError(f"{where} ({row['cve']}): neither fixed_in nor published: the gate has nothing to hold a base to")
        if not str(row["source"]).strip():
            raise CveError(f"{where} ({row['cve']}): no source")
        out.append(Cve(row["cve"], str(row["component"]), row["cvss"], str(row["what"]), published,
                       (int(m.group(1)), int(m.group(2))) if m else None,
                       None if row["bulletin"] is None else str(row["bulletin"]), str(row["source"])))
    return out


def minimum_release(cves: List[Cve]) -> Tuple[int, int]:
    """The oldest NGC release the gate accepts: the newest need of a gated row."""
    return max(c.needs for c in cves if c.gated)


def check_base(reference: str, release: Optional[Tuple[int, int]], path: Path = CVE_FILE) -> List[str]:
    """A message per CVE whose gate the base image ``reference`` (NGC ``release`` (YY, MM),
    None when its tag is no release) does not pass; rows of components not in :data:`GATED`
    are not checked."""
    out = []
    for c in load_cves(path):
        if not c.gated:
            continue
        if release is None or release < c.needs:
            why = (f"fixed in {c.fixed_in[0]}.{c.fixed_in[1]:02d}" if c.fixed_in else
                   f"published {c.published}, fixed release not confirmed: a base released before {c.needs[0]}.{c.needs[1]:02d} cannot hold the fix")
            out.append(f"FROM {reference}: {c.cve} ({c.component}) {why}")
    return out


def markdown_table(cves: List[Cve]) -> str:
    """The docs' table, one row per CVE."""
    lines = ["| CVE | component | CVSS | what | published | fixed in NGC release | bulletin | source |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cves:
        fixed = f"{c.fixed_in[0]}.{c.fixed_in[1]:02d}" if c.fixed_in else "not confirmed"
        component = c.component if c.gated else f"{c.component} (not gated: {NOT_GATED[c.component]})"
        lines.append(f"| {c.cve} | {component} | {c.cvss if c.cvss is not None else 'not confirmed'} | {c.what} | "
                     f"{c.published or 'not read'} | {fixed} | {c.bulletin or 'none'} | {c.source} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table(load_cves()))
