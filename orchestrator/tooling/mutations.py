"""One-line mutations of the runtime that the fast tests must catch (issue 19).

Each mutation replaces one exact piece of text in one file of ``orchestrator/runtime`` and
runs the fast test files that cover it; a mutation is *caught* when they fail. The run
happens in a throw-away copy of the tracked files, so the working tree is never changed.

    python -m orchestrator.tooling.mutations            # all, about 2 minutes on 2 cores
    python -m orchestrator.tooling.mutations -k shadow  # those whose name contains "shadow"

Exit status 1 when a mutation is not caught (or its text is no longer found).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = "tests/mock/test_router_adapter.py"
ERRORS = "tests/mock/test_router_errors.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: Tuple[str, ...]


MUTATIONS: Tuple[Mutation, ...] = (
    Mutation("POLICY output always", "orchestrator/runtime/router.py", "        if describe:", "        if True:", (ADAPTER,)),
    Mutation("POLICY output never", "orchestrator/runtime/router.py", "        if describe:", "        if False:", (ADAPTER,)),
    Mutation("no retry alone", "orchestrator/runtime/router.py", "            if len(keys) == 1:", "            if len(keys) >= 1:",
             (ADAPTER,)),
    Mutation("UNAVAILABLE answered as INTERNAL", "orchestrator/runtime/errors.py", '    code: ClassVar[str] = "UNAVAILABLE"',
             '    code: ClassVar[str] = "INTERNAL"', (ERRORS,)),
    Mutation("a model that cannot serve does not open its circuit", "orchestrator/runtime/health.py",
             "or cause is not None or", "or False or", ("tests/unit/test_health.py", ERRORS)),
    Mutation("shadow candidates share the primary's breakers", "orchestrator/runtime/downstream.py",
             "return await self.shadow_breaker.call(", "return await self.breaker.call(", (ERRORS,)),
    Mutation("circuit_state gauge values swapped", "orchestrator/runtime/health.py", "{CLOSED: 0, OPEN: 1, HALF_OPEN: 2}",
             "{CLOSED: 0, OPEN: 2, HALF_OPEN: 1}", ("tests/unit/test_health.py", ERRORS)),
    Mutation("circuit_state never updated", "orchestrator/runtime/downstream.py",
             '        self.metrics.set("orchestrator_circuit_state", new.gauge, model=model)', "        pass", (ERRORS,)),
    Mutation("idle unload of models the router did not load", "orchestrator/runtime/ondemand.py", "                for m in self.ours\n",
             "                for m in self.settings\n", ("tests/unit/test_server_options.py",)),
    Mutation("models outside the allowlist treated as on-demand", "orchestrator/runtime/ondemand.py",
             "        if model not in self.settings:\n            return\n",
             "        if model not in self.settings:\n            self.in_use.setdefault(model, 0)\n",
             ("tests/unit/test_server_options.py",)),
    Mutation("concurrent first loads not shared", "orchestrator/runtime/ondemand.py", "                event = self.loading.get(model)\n",
             "                event = None\n", ("tests/unit/test_server_options.py",)),
    Mutation("request ids dropped from BLS calls", "orchestrator/runtime/downstream.py", "            request_id=request_id,\n",
             '            request_id="",\n', (ADAPTER,)),
)


def _copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.split()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run(mutations: Sequence[Mutation]) -> List[Tuple[Mutation, str]]:
    """``(mutation, "caught" | "NOT caught" | "text not found")`` for each mutation."""
    results = []
    with tempfile.TemporaryDirectory(prefix="mutations-") as tmp:
        copy = Path(tmp)
        _copy(copy)
        for m in mutations:
            target = copy / m.path
            original = target.read_text()
            if original.count(m.old) != 1:
                results.append((m, "text not found"))
                continue
            target.write_text(original.replace(m.old, m.new))
            try:
                # the copy's package comes first on sys.path (cwd), before the editable install
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.tests],
                                      cwd=copy, capture_output=True, text=True, timeout=900)
            finally:
                target.write_text(original)
            results.append((m, "NOT caught" if done.returncode == 0 else "caught"))
            print(f"{results[-1][1]:>14}  {m.name}", flush=True)
    return results


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this text")
    args = parser.parse_args(list(argv) or None)
    chosen = [m for m in MUTATIONS if args.k.lower() in m.name.lower()]
    results = run(chosen)
    missed = [m.name for m, outcome in results if outcome != "caught"]
    print(f"{len(results) - len(missed)} of {len(results)} caught" + (f"; not: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
