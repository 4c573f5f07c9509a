"""One error tree: every error the runtime raises on purpose is an
``OrchestratorError`` carrying its Triton code, and the engine is split by job (model calls in
``calls``, deadlines in ``deadlines``) under a size cap."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np

from orchestrator.runtime import errors
from orchestrator.runtime.request import Deadlines, RequestContext
from orchestrator.runtime.routing import heads
from orchestrator.runtime.routing.nodes.base import Item

RUNTIME = Path(errors.__file__).parent


def test_every_runtime_exception_class_has_one_root():
    found = []
    for path in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception")) or b.id in {"RequestStopped"})
                    for b in node.bases):
                found.append((path.name, node.name))
    assert len(found) >= 10, found
    classes = {**vars(errors), **vars(heads)}
    for module, name in found:
        cls = classes.get(name)
        assert cls is not None and inspect.isclass(cls), f"{module}: {name} is not importable from errors or heads"
        assert issubclass(cls, errors.OrchestratorError), f"{module}: {name} is outside the error tree"


def test_codes_of_the_tree():
    codes = {errors.InputError: "INVALID_ARG", errors.LimitError: "INVALID_ARG", errors.DownstreamError: "INTERNAL",
             errors.UnavailableError: "UNAVAILABLE", errors.RequestCancelled: "CANCELLED",
             errors.DeadlineExceeded: "UNAVAILABLE", errors.OrchestratorError: "INTERNAL"}
    for cls, code in codes.items():
        assert cls.code == code, cls
    # the old roots still hold, so callers catching ValueError or RuntimeError keep working
    assert issubclass(errors.InputError, ValueError) and issubclass(errors.PolicyError, ValueError)
    assert issubclass(errors.DownstreamError, RuntimeError) and issubclass(errors.ControlError, RuntimeError)
    assert issubclass(heads.HeadError, ValueError)


def test_in_time_leaves_out_items_whose_request_had_a_late_answer():
    clock = [0.0]
    d = Deadlines(lambda: clock[0])
    on_time, late = RequestContext(deadline=1.0), RequestContext(deadline=1.0)
    items = [Item(i, i, "t", np.array([0.5]), {}, "", {}, ctx) for i, ctx in enumerate((on_time, late, on_time))]
    d.arrived([items[0]])
    clock[0] = 1.0
    d.arrived([items[1]])  # at the deadline: late
    assert d.in_time(items) == [items[0], items[2]]
    assert d.late(items) == items  # the deadline has passed for all now


def test_the_engine_leaves_the_request_context_to_request_py():
    """The engine runs the plan and makes the model calls; a request's flags and deadline
    arithmetic are ``request.Deadlines``' alone."""
    text = (RUNTIME / "execution" / "engine.py").read_text()
    assert len(text.splitlines()) < 500
    for moved in ("def affordable", "def live", "ctx.cancelled", ".late = True", ".early = True", ".started = True"):
        assert moved not in text, moved
