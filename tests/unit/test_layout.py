"""The package's layout rules (docs/development/architecture.md), checked on the source: the runtime
imports nothing of the tooling, no module imports another that imports it back, and no
file is too big to read."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "orchestrator"


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _type_checking_lines(tree: ast.AST) -> set:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def import_graph(type_checking: bool = False) -> dict:
    """Module -> the modules of this package it imports (at any depth in the file, so
    imports inside functions count; ``TYPE_CHECKING`` imports only with ``type_checking``)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = set() if type_checking else _type_checking_lines(tree)
        targets = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("orchestrator"):
                targets.update(resolve(f"{node.module}.{a.name}") for a in node.names)
            elif isinstance(node, ast.Import):
                targets.update(resolve(a.name) for a in node.names if a.name.startswith("orchestrator"))
        graph[name] = {t for t in targets if t and t != name}
    return graph


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_runtime_imports_nothing_outside_itself():
    graph = import_graph()
    outside = {(m, t) for m, ts in graph.items() if m.startswith("orchestrator.runtime") for t in ts
               if not t.startswith("orchestrator.runtime")}
    assert outside == set()


def test_the_mock_imports_nothing_from_the_tooling():
    graph = import_graph(type_checking=True)
    outside = {(m, t) for m, ts in graph.items() if m.startswith("orchestrator.testing.mock") for t in ts
               if t.startswith("orchestrator.tooling")}
    assert outside == set()


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_no_import_circles_in_the_mock_type_only_imports_included():
    """The mock's parts reach the server through its interface module (mock/host.py),
    not by importing the server back, not even for annotations."""
    mock = "orchestrator.testing.mock"
    graph = {m: {t for t in ts if t.startswith(mock + ".")} for m, ts in import_graph(type_checking=True).items()
             if m.startswith(mock + ".")}
    assert len(graph) > 10 and cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_file_sizes():
    """No runtime file over 600 lines, no file of the package over 900 (docs/development/architecture.md); the lab's files too."""
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "lab").rglob("*.py")]
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in files}
    assert {f: n for f, n in sizes.items() if f.startswith("orchestrator/runtime/") and n > 600} == {}
    assert {f: n for f, n in sizes.items() if n > 900} == {}
