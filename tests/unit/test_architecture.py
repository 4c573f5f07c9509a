"""docs/development/architecture.md and the policy guide as a contract with the code: every runtime
module has a row in the module table, every node-kind list is the registry's
(``orchestrator.runtime.routing.nodes.KINDS``), the node protocol is listed as the class declares
it, and the size caps are the ones ``test_layout`` applies. Each failure says what to add or
remove where."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import List

from orchestrator.runtime.routing import nodes
from orchestrator.runtime.routing.nodes import base
from tests.helpers import ROOT

ARCH = ROOT / "docs" / "development" / "architecture.md"
POLICY_GUIDE = ROOT / "docs" / "guides" / "write-a-policy.md"
RUNTIME = ROOT / "orchestrator" / "runtime"


def table_after(text: str, header: str) -> List[str]:
    """The rows (lines starting with ``|``) of the Markdown table whose header line starts
    with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def first_cells(rows: List[str]) -> List[str]:
    return [row.split("|")[1].strip() for row in rows]


def runtime_modules() -> List[str]:
    """``runtime/...py`` for every runtime module; an ``__init__.py`` counts when it has more
    than a docstring."""
    out = []
    for path in sorted(RUNTIME.rglob("*.py")):
        if path.name == "__init__.py":
            body = ast.parse(path.read_text()).body
            if all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body):
                continue
        out.append(path.relative_to(RUNTIME.parent).as_posix())
    return out


def test_every_runtime_module_has_a_row_in_the_module_table():
    cells = " ".join(first_cells(table_after(ARCH.read_text(), "| module | role |")))
    named = set(re.findall(r"`(runtime/[\w/]+\.py)`", cells))
    modules = runtime_modules()
    missing = [m for m in modules if m not in named]
    assert not missing, (
        "docs/development/architecture.md, section 'Package', table '| module | role |': no row names "
        + ", ".join(f"`{m}`" for m in missing)
        + "; add one per module: | `" + missing[0] + "` | <its job in one line> |"
    )
    gone = sorted(named - set(modules))
    assert not gone, f"docs/development/architecture.md's module table names {gone}, which are not in orchestrator/: remove or rename those rows"


def test_every_runtime_module_is_in_the_request_order_tree():
    text = ARCH.read_text()
    tree = text[text.index("  runtime/"): text.index("  tooling/")]
    words = set(re.findall(r"[\w]+\.py|[\w]+/", tree))
    missing = [m for m in runtime_modules() if Path(m).name not in words and m != "runtime/routing/nodes/__init__.py"]
    assert not missing, (
        f"docs/development/architecture.md, section 'Package', the orchestrator/ tree under runtime/: add {missing} "
        "(its file name and, when a request passes through it, its place in the numbered order)"
    )


def test_the_tree_lists_each_runtime_subpackage_with_its_own_modules():
    """Under ``runtime/`` the tree names each subpackage (a folder with an ``__init__.py``)
    and, one line each, indented under it, exactly the modules and folders it holds."""
    text = ARCH.read_text()
    lines = text[text.index("  runtime/"): text.index("  tooling/")].splitlines()[1:]
    listed: dict = {}
    current = None
    for line in lines:
        indent, words = len(line) - len(line.lstrip()), line.split()
        if indent == 4:
            current = words[0].rstrip("/") if words[0].endswith("/") else None
            if current is not None:
                listed[current] = set()
        elif indent == 6 and current is not None:
            listed[current].add(words[0])
    folders = {p.name: {m.name for m in p.glob("*.py") if m.name != "__init__.py"} | {d.name + "/" for d in p.iterdir() if (d / "__init__.py").is_file()}
               for p in RUNTIME.iterdir() if (p / "__init__.py").is_file()}
    assert set(listed) == set(folders), (
        f"docs/development/architecture.md, the orchestrator/ tree under runtime/, lists the subpackages {sorted(listed)}; "
        f"orchestrator/runtime/ has {sorted(folders)}: make them agree"
    )
    for name, modules in folders.items():
        assert listed[name] == modules or name == "models", (
            f"docs/development/architecture.md, the tree under runtime/{name}/: one line per module, {sorted(modules)} "
            f"(it lists {sorted(listed[name])})"
        )


def test_the_policy_guide_node_kind_table_is_the_registry():
    kinds = list(nodes.KINDS)
    guide = first_cells(table_after(POLICY_GUIDE.read_text(), "| kind | does |"))
    assert guide == [f"`{k}`" for k in kinds], (
        f"docs/guides/write-a-policy.md, 'How to change or add a route', table '| kind | does |' lists {guide}; the registry "
        f"(orchestrator/runtime/routing/nodes/__init__.py KINDS) has {kinds}, in that order: add, remove or reorder rows to match"
    )


def test_the_node_kind_lists_in_architecture_md_and_the_nodes_package_are_the_registry():
    kinds = list(nodes.KINDS)
    modules = [f"{k}.py" for k in kinds]
    text = ARCH.read_text()
    tree = text[text.index("      nodes/"): text.index("      heads.py")]
    listed = [w for w in re.findall(r"\b(\w+\.py)\b", tree) if w not in ("base.py", "__init__.py")]
    assert listed == modules, (
        f"docs/development/architecture.md, the orchestrator/ tree under runtime/routing/nodes/, lists {listed}; the registry (nodes.KINDS) "
        f"has the modules {modules}: list them in that order"
    )
    row = next(r for r in table_after(text, "| module | role |") if "`runtime/routing/nodes/model.py`" in r)
    in_row = re.findall(r"`runtime/routing/nodes/(\w+)\.py`", row.split("|")[1])
    assert in_row == kinds, f"docs/development/architecture.md's module table, the node kinds' row, names {in_row}: make it {kinds}"
    doc_table = [c.strip("`") for c in first_cells(table_after(nodes.__doc__ or "", "| kind | module | does |"))]
    assert doc_table == kinds, f"orchestrator/runtime/routing/nodes/__init__.py's docstring table lists {doc_table}: make it {kinds}"


def test_the_node_protocol_is_listed_as_declared():
    def members(cls):
        return {name for name, value in vars(cls).items()
                if not name.startswith("_") and (callable(value) or isinstance(value, property))} | set(cls.__annotations__)

    declared = members(base.Engine) | members(base.ModelCallView) | members(base.DeadlineView)
    assert {"calls", "deadlines"} <= members(base.Engine)
    text = ARCH.read_text()
    start = text.index("- The node protocol")
    bullet = text[start: text.index("\n- ", start + 1)]
    listed = set(re.findall(r"`(\w+)`", bullet)) - {"Engine"}
    assert listed == declared, (
        "docs/development/architecture.md, 'Contracts inside the runtime', the bullet 'The node protocol': "
        f"add {sorted(declared - listed)}, remove {sorted(listed - declared)} (nodes.base.Engine declares {sorted(declared)})"
    )


def test_the_size_caps_are_the_ones_the_layout_test_applies():
    layout = (ROOT / "tests" / "unit" / "test_layout.py").read_text()
    runtime_cap, package_cap = re.search(r"No runtime file over (\d+) lines, no file of the package over (\d+)", layout).groups()
    text = ARCH.read_text()
    stated = re.search(r"`orchestrator/runtime/` is over (\d+) lines or\s+any file of the package over (\d+)", text)
    assert stated is not None and stated.groups() == (runtime_cap, package_cap), (
        f"docs/development/architecture.md, '### Size caps': state the caps tests/unit/test_layout.py applies ({runtime_cap} lines "
        f"for a runtime file, {package_cap} for any file of the package)"
    )


#: The runtime's layers, top first (docs/development/architecture.md, "Package"): a module
#: imports from its own subpackage or from layers below its own, never above.
LAYERS = ("serving", "models", "execution", "bls", "routing", "request", "metrics", "errors")


def test_the_runtime_subpackages_import_downward_only():
    from tests.unit.test_layout import import_graph

    def layer(module: str):
        parts = module.split(".")
        if parts[:2] != ["orchestrator", "runtime"] or len(parts) < 3:
            return None
        return parts[2]

    upward = []
    for module, targets in import_graph().items():
        own = layer(module)
        if own is None:
            continue
        assert own in LAYERS, f"orchestrator/runtime/{own}: add it to LAYERS in tests/unit/test_architecture.py and to the layers in architecture.md"
        for target in targets:
            other = layer(target)
            if other is not None and other != own and LAYERS.index(other) < LAYERS.index(own):
                upward.append(f"{module} -> {target}")
    assert not upward, f"runtime imports against the layers {' > '.join(LAYERS)}: {sorted(upward)}"
    text = " ".join(ARCH.read_text().split())
    assert " > ".join(f"`{name}`" for name in LAYERS) in text, "docs/development/architecture.md states the layers in LAYERS' order"
