"""The policy format's generated documents, from its one declaration (``schema``,
``policy.TOP``, ``nodes.KINDS``): the JSON Schema ``docs/policy.schema.json`` (editors:
``# yaml-language-server: $schema=...``) and the table ``docs/reference/policy.md``.

``python -m orchestrator.runtime.routing.policy_docs`` writes both; ``--check`` only compares (exit
1 when one is not current). Tests check the committed files are current.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from orchestrator.runtime.routing import nodes as N
from orchestrator.runtime.routing.conditions import CONDITION
from orchestrator.runtime.routing.nodes.base import Node
from orchestrator.runtime.routing.pipeline import STEP, SWITCH, pipeline_json_definitions
from orchestrator.runtime.routing.policy import TOP
from orchestrator.runtime.routing.schema import Key, Struct, json_text

__all__ = ["json_schema", "markdown", "generated_docs"]


def default_text(key: Key) -> str:
    """The default column of ``docs/reference/policy.md``."""
    if key.required:
        return "required"
    if key.computed:
        return key.computed
    if isinstance(key.type, Struct) and key.type.always:
        return f"see `{key.type.name}`"
    if key.default is None or (isinstance(key.default, (dict, list, tuple)) and not key.default):
        return "—"
    return f"`{json_text(key.default)}`"


# ----------------------------------------------------------------------------- documents


def _json_schema(top: Struct, node_kinds: Mapping[str, Tuple[str, Struct]]) -> Dict[str, Any]:
    """The JSON Schema (draft-07) of a policy document.

    Args:
        top: the top-level mapping.
        node_kinds: kind name -> (one line of doc, the kind's mapping with the common keys).
    """
    kinds = list(node_kinds)
    node = {
        "type": "object",
        "description": "A policy node: 'kind' selects its keys.",
        "required": ["kind"],
        "properties": {"kind": {"enum": kinds, "description": "the node kind"}},
        "allOf": [
            {"if": {"required": ["kind"], "properties": {"kind": {"const": k}}}, "then": {"$ref": f"#/definitions/{k}"}}
            for k in kinds
        ],
    }
    definitions: Dict[str, Any] = {"node": node}
    for k, (doc, struct) in node_kinds.items():
        d = struct.json()
        d["properties"]["kind"] = {"const": k, "description": doc}
        d["description"] = doc
        definitions[k] = d
    out: Dict[str, Any] = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "orchestrator routing policy",
        "description": "The router's routing policy (model_repository/router/policy.yaml). Generated from "
                       "orchestrator/runtime/routing/schema.py by 'python -m orchestrator.runtime.routing.policy_docs'; do not edit.",
    }
    out.update(top.json())
    definitions.update(pipeline_json_definitions())
    out["definitions"] = definitions
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(struct: Struct) -> List[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k in struct.keys:
        lines.append(f"| `{k.name}` | {_cell(k.type.text())} | {_cell(default_text(k))} | {_cell(k.doc)} |")
    return lines


def _nested(struct: Struct, seen: Set[str], level: str) -> List[str]:
    out: List[str] = []
    for k in struct.keys:
        for inner in k.type.structs():
            if inner.name in seen:
                continue
            seen.add(inner.name)
            out += ["", f"{level} `{inner.name}`", ""] + ([inner.doc, ""] if inner.doc else []) + _table(inner)
            out += _nested(inner, seen, level)
    return out


def _markdown(top: Struct, common: Struct, node_kinds: Mapping[str, Tuple[str, Struct]]) -> str:
    """``docs/reference/policy.md``: a table per mapping (top level, nested blocks, every kind)."""
    lines = [
        "# Policy format",
        "",
        "<!-- Generated from orchestrator/runtime/routing/schema.py, policy.py and nodes/*.py by",
        "     `python -m orchestrator.runtime.routing.policy_docs`; a test checks it is current. Do not edit. -->",
        "",
        "The router's routing policy (`model_repository/router/policy.yaml`), key by key. The same",
        "declaration gives the parser and the JSON Schema `docs/policy.schema.json` (editors: the",
        "`# yaml-language-server: $schema=...` line at the top of a policy file). The parser also",
        "checks what a schema cannot: unique node names, `stride` below `window - 1`, `param`",
        "values declared in `request_parameters`, steps that can never run, a `switch` without",
        "`default` outside a `sequence`, and, at router load, the models' heads.",
        "",
        "## Top level",
        "",
    ]
    seen: Set[str] = set()
    lines += _table(top) + _nested(top, seen, "###")
    lines += ["", "## Node kinds", "", "Keys every node has:", ""] + _table(common)
    for name, (doc, struct) in node_kinds.items():
        own = Struct(struct.name, [k for k in struct.keys if k.name not in {c.name for c in common.keys}])
        lines += ["", f"### `{name}`", "", doc, ""] + _table(own) + _nested(own, seen, "####")
    lines += ["", "## Pipeline nodes and conditions", "",
              "The nodes of `pipeline.steps` (a tensor pipeline, [branching pipelines](../guides/branching-pipelines.md)) "
              "and the conditions of their `when`.", ""]
    for struct in (STEP, SWITCH, CONDITION):
        seen.add(struct.name)
        lines += ["", f"### `{struct.name}`", "", struct.doc, ""] + _table(struct) + _nested(struct, seen, "####")
    return "\n".join(lines) + "\n"


def _kind_structs() -> Dict[str, Tuple[str, Struct]]:
    return {name: (kind.doc, kind.spec) for name, kind in N.KINDS.items()}


def json_schema() -> Dict[str, Any]:
    """The JSON Schema (draft-07) of policy documents, from ``policy.TOP`` and
    ``nodes.KINDS`` as they are now (a kind registered later is in it too). It checks every
    key's type, bounds and presence; ``policy.parse_policy`` also checks rules across keys."""
    return _json_schema(TOP, _kind_structs())


def markdown() -> str:
    """The policy format as Markdown tables (``docs/reference/policy.md``), from the same declarations."""
    return _markdown(TOP, Struct("node", N.COMMON_KEYS, target=Node), _kind_structs())


def generated_docs() -> Dict[str, str]:
    """File name (under ``docs/``) -> its generated text: the JSON Schema and the table."""
    return {"policy.schema.json": json.dumps(json_schema(), indent=2) + "\n", "reference/policy.md": markdown()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write (or with ``--check``, compare) the generated files under ``--docs`` (default:
    the project's ``docs/``); returns 1 when a file is not current."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m orchestrator.runtime.routing.policy_docs")
    parser.add_argument("--docs", default=str(Path(__file__).resolve().parents[3] / "docs"))
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a file differs")
    args = parser.parse_args(argv)
    stale = 0
    for name, text in generated_docs().items():
        path = Path(args.docs) / name
        if not args.check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
        elif not path.is_file() or path.read_text(encoding="utf-8") != text:
            print(f"{path}: not current (run python -m orchestrator.runtime.routing.policy_docs)")
            stale = 1
    return stale


if __name__ == "__main__":
    raise SystemExit(main())
