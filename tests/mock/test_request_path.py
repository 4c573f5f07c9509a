"""One request's path through the runtime, measured: which runtime modules it enters and
how often it crosses from one into another, so the path cannot grow back unnoticed.

A profile hook (``sys.setprofile``) watches one short text through the shipped policy on the
in-process mock (``router.py`` ``execute`` to the BLS call and back) and records every
function that starts in a runtime module, and the module of its caller. Counted:

- modules entered: runtime modules that ran a function for the request, the node-kind
  modules (one per kind, ``nodes.KINDS``) aside, and the downstream models' own modules
  (``runtime/models/``: the mock runs the classifiers in this process) left out;
- crossings: functions started from another runtime module (node kinds included);
- back-and-forth: two modules (node kinds aside: a tree's node reaches its children
  through the engine) that call into each other.

A coroutine counts once, when it starts (its resumptions are not calls).
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Counter, Dict, List, Optional, Set, Tuple

import numpy as np
import pytest

import orchestrator.runtime as runtime
from orchestrator.runtime.routing import nodes
from orchestrator.testing.mock import MockTriton
from tests.helpers import REPO

RUNTIME = Path(runtime.__file__).parent
TEXT = "A gorgeous, witty film."

#: The path's bounds: at most 8 runtime modules besides the node kinds, at most 50 crossings
#: (half of the 101 the flat runtime made), no back-and-forth. A change that makes the path
#: longer fails here; lower them when it gets shorter.
MAX_MODULES = 8
MAX_CROSSINGS = 50
MAX_BACK_AND_FORTH = 0


def module_of(filename: str) -> Optional[str]:
    """``engine.py``, ``nodes/switch.py``: a runtime module's path inside the runtime; None
    outside it or in ``runtime/models/`` (the downstream models the mock runs in-process)."""
    path = Path(filename)
    if RUNTIME not in path.parents:
        return None
    name = path.relative_to(RUNTIME).as_posix()
    return None if name.startswith("models/") else name


def node_kind_modules() -> Set[str]:
    """The modules that define a node kind's handler."""
    out = set()
    for kind in nodes.KINDS.values():
        name = module_of(sys.modules[kind.run.__module__].__file__ or "")
        assert name is not None
        out.add(name)
    return out


class Path_:
    """What the profile hook saw of one request."""

    def __init__(self) -> None:
        self.entered: Set[str] = set()
        self.crossings: List[Tuple[str, str, str]] = []  # (caller module, callee module, function)
        self._started: Dict[int, object] = {}  # frames seen, kept alive so their ids stay theirs

    def hook(self, frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event != "call":
            return
        callee = module_of(frame.f_code.co_filename)
        if callee is None or id(frame) in self._started:  # outside, or a coroutine resumed
            return
        self._started[id(frame)] = frame
        self.entered.add(callee)
        back = frame.f_back
        caller = module_of(back.f_code.co_filename) if back is not None else None
        if caller is not None and caller != callee:
            self.crossings.append((caller, callee, frame.f_code.co_name))

    def pairs(self) -> Counter[Tuple[str, str]]:
        return collections.Counter((a, b) for a, b, _ in self.crossings)

    def back_and_forth(self, kinds: Set[str]) -> List[Tuple[str, str]]:
        pairs = self.pairs()
        return sorted({tuple(sorted(p)) for p in pairs if (p[1], p[0]) in pairs and not set(p) & kinds})  # type: ignore[misc]

    def report(self, kinds: Set[str]) -> str:
        lines = [f"{len(self.entered - kinds)} modules besides node kinds: {sorted(self.entered - kinds)}",
                 f"{len(self.crossings)} crossings:"]
        for (a, b), n in sorted(self.pairs().items()):
            names = sorted({f for x, y, f in self.crossings if (x, y) == (a, b)})
            lines.append(f"  {n:3d} {a} -> {b} {names}")
        lines.append(f"back-and-forth: {self.back_and_forth(kinds)}")
        return "\n".join(lines)


@pytest.fixture(scope="module")
def path() -> Path_:
    inputs = {"TEXT": np.array([[TEXT.encode()]], dtype=np.object_), "THRESHOLD": np.full((1, 1), 0.5, np.float32)}
    with MockTriton(REPO) as mock:
        for name in ("tokenizer", "classifier", "classifier_fast", "router"):
            mock.load(name)
        for _ in range(2):  # first calls import and set up what later ones reuse
            mock.infer("router", inputs)
        seen = Path_()
        sys.setprofile(seen.hook)
        try:
            out = mock.infer("router", inputs)
        finally:
            sys.setprofile(None)
    assert [r.decode() for r in out["ROUTE"].reshape(-1)] == ["classifier_fast"]  # the cascade's first stage answered
    return seen


def test_the_path_of_one_request_is_no_longer_than_it_was(path):
    kinds = node_kind_modules()
    report = path.report(kinds)
    print(report)
    assert len(path.entered - kinds) <= MAX_MODULES, report
    assert len(path.crossings) <= MAX_CROSSINGS, report
    assert len(path.back_and_forth(kinds)) <= MAX_BACK_AND_FORTH, report


def test_the_path_enters_the_node_kinds_the_shipped_policy_walks(path):
    """The measurement sees the walk: sequence -> switch -> fallback -> cascade -> chunk -> model."""
    walked = {m for m in node_kind_modules() if m in path.entered}
    assert {Path(m).stem for m in walked} == {"sequence", "switch", "fallback", "cascade", "chunk", "model"}
