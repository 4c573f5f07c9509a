"""The machine a report was made on (a parity run's environment, the lab's benchmarks)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def cpu_model() -> Optional[str]:
    """The CPU's ``model name`` from ``/proc/cpuinfo``, or None where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
