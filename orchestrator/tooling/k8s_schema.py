"""Validate Kubernetes manifests offline against published schemas (run in the deploy tools venv).

This module runs under the interpreter of the deploy tools virtualenv
(``.cache/tools/deploy``, made by :func:`orchestrator.tooling.deploy.ensure_tools` from
``deploy/tools/requirements*.txt``), never in the project's: the validators pin their own
dependencies. It imports nothing from the rest of the package. Input: a JSON list of
``{"source": str, "document": {...}}`` on stdin; output: a JSON list of
``{"source", "kind", "name", "schema", "errors": [str]}`` on stdout, one per document.
``python -m orchestrator.tooling.k8s_schema < docs.json``.

Where each schema comes from (all installed from PyPI at set-up, nothing vendored):

- Kubernetes kinds (Deployment, Service, HorizontalPodAutoscaler, ...): ``kubernetes-validate``
  (1.37.0), its bundled JSON schemas of the Kubernetes 1.37 API in their *strict* variant
  (``additionalProperties: false`` everywhere), through ``kubernetes_validate.validate``.
- ``ServiceMonitor`` (monitoring.coreos.com/v1) and ``ScaledObject`` (keda.sh/v1alpha1):
  the pydantic models of ``cloudcoil-models-prometheus-operator`` and
  ``cloudcoil-models-keda`` (Apache-2.0), generated from those projects' CRD
  ``openAPIV3Schema``; their JSON schema (``model_json_schema``) is made strict the same way
  (an object with ``properties`` accepts no other key), which is what ``kubectl apply``'s
  default ``--validate=strict`` asks of the API server for a structural CRD schema.
- ``InferenceService`` (serving.kserve.io/v1beta1) and ``ServingRuntime`` (v1alpha1): the
  KServe SDK (``kserve`` on PyPI, Apache-2.0, installed without its dependencies and never
  imported): the ``openapi_types``/``attribute_map`` tables of its generated model classes
  (``kserve/models/*.py``, read with ``ast``), which come from the same Go API types as
  KServe's CRDs; fields its setters declare required are required; Kubernetes types inside
  (``V1Container``, ``V1ResourceRequirements``, ...) resolve to kubernetes-validate's strict
  definitions.

A document of any other kind is an error ("no schema"), never a silent pass.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

KUBERNETES_VERSION = "1.37.0"
_K8S_DEFS_URI = "/api/_definitions.json"


# ----------------------------------------------------------------------------------------
# Kubernetes' own kinds


def _k8s_definitions() -> dict:
    """kubernetes-validate's strict ``_definitions.json`` for :data:`KUBERNETES_VERSION`."""
    import importlib_resources

    path = (
        importlib_resources.files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{KUBERNETES_VERSION}-local-strict"
        / "_definitions.json"
    )
    return json.loads(path.read_text())


def _validate_core(document: dict) -> Optional[List[str]]:
    """Errors against the Kubernetes API schema; None when kubernetes-validate has no
    schema for the kind (a CRD)."""
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except SchemaNotFoundError:
        return None
    except kubernetes_validate.ValidationError as exc:
        return [f"{_path(exc.absolute_path)}: {exc.message}"]
    return []


# ----------------------------------------------------------------------------------------
# CRDs from pydantic models (cloudcoil)


def _strict(node: Any) -> Any:
    """Every object schema with ``properties`` and no ``additionalProperties`` gets
    ``additionalProperties: false`` (in place; returns ``node``)."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


def _pydantic_schema(module: str, name: str) -> dict:
    model = getattr(importlib.import_module(module), name)
    return _strict(model.model_json_schema(by_alias=True, mode="validation"))


# ----------------------------------------------------------------------------------------
# CRDs from the KServe SDK's generated model tables


def _kserve_models_dir() -> Path:
    spec = importlib.util.find_spec("kserve")  # a top-level find_spec does not import it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the kserve package is not installed in the deploy tools venv")
    return Path(next(iter(spec.submodule_search_locations))) / "models"


_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")


def _kserve_tables() -> Dict[str, Tuple[dict, dict, List[str]]]:
    """``{class name: (openapi_types, attribute_map, required json keys)}`` of every model."""
    tables = {}
    for path in sorted(_kserve_models_dir().glob("*.py")):
        source = path.read_text()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.ClassDef):
                continue
            types = amap = None
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                    if stmt.targets[0].id == "openapi_types":
                        types = ast.literal_eval(stmt.value)
                    elif stmt.targets[0].id == "attribute_map":
                        amap = ast.literal_eval(stmt.value)
            if types is not None and amap is not None:
                segment = ast.get_source_segment(source, node) or ""
                required = sorted({amap[a] for a in _REQUIRED.findall(segment) if a in amap})
                tables[node.name] = (types, amap, required)
    return tables


class _KServeSchemas:
    """JSON schemas built from the KServe SDK's tables (see the module docstring)."""

    _PRIMITIVES = {
        "str": {"type": "string"},
        "int": {"type": "integer"},
        "float": {"type": "number"},
        "bool": {"type": "boolean"},
        "object": {},
        "datetime": {"type": "string"},
        "date": {"type": "string"},
    }

    def __init__(self, k8s_defs: dict):
        self.tables = _kserve_tables()
        self.k8s_names = list(k8s_defs["$defs"])
        self.defs: Dict[str, dict] = {}
        self.gaps: set = set()

    def _k8s_ref(self, name: str) -> Optional[dict]:
        m = re.match(r"^(V\d+(?:alpha\d+|beta\d+)?)([A-Z]\w*)$", name)
        if not m:
            return None
        suffix = f".{m.group(1).lower()}.{m.group(2)}"
        found = [k for k in self.k8s_names if k.endswith(suffix)]
        for prefix in ("io.k8s.api.core.", "io.k8s.apimachinery.pkg.apis.meta."):
            preferred = [k for k in found if k.startswith(prefix)]
            if preferred:
                found = preferred
                break
        return {"$ref": f"{_K8S_DEFS_URI}#/$defs/{found[0]}"} if len(found) == 1 else None

    def type_schema(self, text: str) -> dict:
        text = text.strip()
        if text.startswith("list[") and text.endswith("]"):
            return {"type": "array", "items": self.type_schema(text[5:-1])}
        if text.startswith("dict(") and text.endswith(")"):
            _, value = text[5:-1].split(",", 1)
            return {"type": "object", "additionalProperties": self.type_schema(value)}
        if text in self._PRIMITIVES:
            return dict(self._PRIMITIVES[text])
        if text == "ResourceQuantity":
            return {"$ref": f"{_K8S_DEFS_URI}#/$defs/io.k8s.apimachinery.pkg.api.resource.Quantity"}
        if text in self.tables:
            self._define(text)
            return {"$ref": f"#/$defs/{text}"}
        ref = self._k8s_ref(text)
        if ref is None:
            # The SDK names a few types it has no model for (V1alpha1WorkerSpec in 0.21.0):
            # their fields are known, their content is not checked.
            self.gaps.add(text)
            return {"type": "object"}
        return ref

    def _define(self, name: str) -> None:
        if name in self.defs:
            return
        types, amap, required = self.tables[name]
        schema: dict = {"type": "object", "properties": {}, "additionalProperties": False}
        self.defs[name] = schema
        for attr, text in types.items():
            schema["properties"][amap[attr]] = self.type_schema(text)
        if required:
            schema["required"] = required

    def schema(self, name: str, api_version: str, kind: str) -> dict:
        self._define(name)
        root = json.loads(json.dumps(self.defs[name]))
        root["properties"]["apiVersion"] = {"const": api_version}
        root["properties"]["kind"] = {"const": kind}
        root["required"] = sorted(set(root.get("required", [])) | {"apiVersion", "kind", "spec"})
        root["$defs"] = self.defs
        root["$id"] = f"https://kubernetes.io/api/kserve-{kind.lower()}.json"
        return root


# ----------------------------------------------------------------------------------------
# Dispatch

#: (apiVersion, kind) -> (where the schema comes from, how to build it)
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("cloudcoil-models-prometheus-operator", "cloudcoil.models.prometheus_operator.v1"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("cloudcoil-models-prometheus-operator", "cloudcoil.models.prometheus_operator.v1"),
    ("keda.sh/v1alpha1", "ScaledObject"): ("cloudcoil-models-keda", "cloudcoil.models.keda.v1alpha1"),
    ("serving.kserve.io/v1beta1", "InferenceService"): ("kserve SDK", "V1beta1InferenceService"),
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): ("kserve SDK", "V1alpha1ServingRuntime"),
}


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


class Validator:
    """Validates documents; schemas are built once per validator."""

    def __init__(self):
        self._k8s_defs = None
        self._kserve = None
        self._schemas: Dict[Tuple[str, str], dict] = {}

    @property
    def k8s_defs(self) -> dict:
        if self._k8s_defs is None:
            self._k8s_defs = _k8s_definitions()
        return self._k8s_defs

    def _crd_schema(self, key: Tuple[str, str]) -> dict:
        if key not in self._schemas:
            origin, target = CRDS[key]
            if origin == "kserve SDK":
                if self._kserve is None:
                    self._kserve = _KServeSchemas(self.k8s_defs)
                self._schemas[key] = self._kserve.schema(target, *key)
            else:
                self._schemas[key] = _pydantic_schema(target, key[1])
        return self._schemas[key]

    def validate(self, document: Any) -> Tuple[str, List[str]]:
        """``(schema origin, errors)`` for one manifest document."""
        if not isinstance(document, dict) or not document.get("apiVersion") or not document.get("kind"):
            return "none", ["not a Kubernetes object (apiVersion and kind are required)"]
        key = (document["apiVersion"], document["kind"])
        if key in CRDS:
            import jsonschema
            from referencing import Registry, Resource

            schema = self._crd_schema(key)
            registry = Registry().with_resources(
                [(self.k8s_defs["$id"], Resource.from_contents(self.k8s_defs))]
            )
            validator = jsonschema.Draft202012Validator(schema, registry=registry)
            errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
            return CRDS[key][0], [f"{_path(e.absolute_path)}: {e.message}" for e in errors]
        errors = _validate_core(document)
        if errors is None:
            return "none", [f"no schema for {key[1]} {key[0]}: neither a Kubernetes {KUBERNETES_VERSION} kind nor a known CRD"]
        return f"kubernetes-validate {KUBERNETES_VERSION} strict", errors


def main() -> int:
    items = json.load(sys.stdin)
    validator = Validator()
    results = []
    for item in items:
        doc = item.get("document")
        origin, errors = validator.validate(doc)
        meta = doc.get("metadata") or {} if isinstance(doc, dict) else {}
        results.append({
            "source": item.get("source", ""),
            "kind": doc.get("kind", "") if isinstance(doc, dict) else "",
            "name": meta.get("name", "") if isinstance(meta, dict) else "",
            "schema": origin,
            "errors": errors,
        })
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
