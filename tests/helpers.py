"""Helpers shared by the test layers (unit/, mock/, server/); fixtures live in conftest.py.

- paths: ``ROOT`` (the checkout), ``REPO`` (its ``model_repository``), ``FIXTURES``;
- router variants for a test copy of the model repository (:func:`make_test_repository`);
- :func:`call` / :func:`routes`: one HTTP request to a real server's router or ensemble.

The execution-environment tests' helpers are in ``tests/envhelpers.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "model_repository"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


# ----------------------------------------------------------------------------- router variants

# Test-only router variants added to a copy of the repository: same code, the default
# policy with the cascade margin changed.
ROUTER_VARIANTS = {
    # every non-empty text escalates: its answers must equal the ensemble's
    "router_accurate": {"cascade": {"margin": 1.0}},
    # never escalates
    "router_fast": {"cascade": {"margin": 0.0}},
}
# The shipped policy with the tokenizer and postprocess models called through BLS.
BLS_VARIANT = "router_bls"


def set_node_fields(node, changes):
    """Apply ``{node name: {field: value}}`` to a policy document's node tree, in place."""
    if isinstance(node, dict):
        if node.get("name") in changes:
            node.update(changes[node["name"]])
        for value in node.values():
            set_node_fields(value, changes)
    elif isinstance(node, list):
        for value in node:
            set_node_fields(value, changes)


def add_router_variant(repo: Path, name: str, policy_document) -> Path:
    """Add model ``name``: the router's code and config with its own policy document."""
    dest = repo / name
    (dest / "1").mkdir(parents=True)
    shutil.copy(REPO / "router" / "1" / "model.py", dest / "1" / "model.py")
    config = (REPO / "router" / "config.pbtxt").read_text().replace('name: "router"', f'name: "{name}"')
    (dest / "config.pbtxt").write_text(config)
    (dest / "policy.yaml").write_text(yaml.safe_dump(policy_document, sort_keys=False))
    return dest


def copy_model(repo: Path, source: str, name: str) -> Path:
    """Copy model directory ``source`` to ``name`` within ``repo``, renaming it in its configs."""
    shutil.copytree(repo / source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for cfg in (repo / name).rglob("*.pbtxt"):
        cfg.write_text(cfg.read_text().replace(f'name: "{source}"', f'name: "{name}"'))
    return repo / name


def _ondemand_policy(model: str, idle: float) -> dict:
    fast = {"kind": "model", "model": "classifier_fast"}
    return {
        "version": 1,
        "request_parameters": {"route": ["spare"]},
        "root": {
            "kind": "switch",
            "cases": [
                {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False}},
                {
                    "when": {"param": {"name": "route", "equals": "spare"}},
                    "then": {"kind": "model", "model": model, "on_demand": {"idle_timeout_s": idle, "retry_after_s": 30}},
                },
            ],
            "default": fast,
        },
    }


# Models of the test repository that the session server does not load at start.
NOT_LOADED_AT_START = ("classifier_spare", "router_bad_policy")


def make_test_repository(dest: Path) -> Path:
    """Copy ``model_repository`` to ``dest`` and add the test-only models: the
    :data:`ROUTER_VARIANTS`, the shipped A/B example (``router_ab``), on-demand routers and
    their spare classifier, a router whose on-demand model is in no repository, and a
    router with an invalid policy."""
    # not the execution-environment artifacts `make env` may have installed (~120 MB a model)
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"))
    for name, changes in ROUTER_VARIANTS.items():
        document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
        set_node_fields(document, changes)
        add_router_variant(dest, name, document)
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    document.pop("inline")
    add_router_variant(dest, BLS_VARIANT, document)
    add_router_variant(dest, "router_ab", yaml.safe_load((ROOT / "docs" / "policies" / "ab_fallback.yaml").read_text()))
    copy_model(dest, "classifier_fast", "classifier_spare")
    add_router_variant(dest, "router_ondemand", _ondemand_policy("classifier_spare", idle=2.0))
    # on_demand on a model the server loaded itself: the router must never unload it
    add_router_variant(dest, "router_not_owner", _ondemand_policy("classifier_fast", idle=0.5))
    # on_demand on a model in no repository, retried at once: no load request may be sent
    absent = {"kind": "model", "model": "classifier_absent", "on_demand": {"idle_timeout_s": 60, "retry_after_s": 0}}
    spare = {"kind": "model", "name": "spare", "model": "classifier_fast", "route": "fallback"}
    add_router_variant(dest, "router_absent", {"version": 1, "root": {"kind": "fallback", "nodes": [absent, spare]}})
    add_router_variant(dest, "router_bad_policy", {"version": 1, "root": {"kind": "cascade", "margin": 0.1, "stages": [{"kind": "model"}]}})
    return dest


# ----------------------------------------------------------------------------- requests


def call(server, model, texts, thresholds=0.5, parameters=None, text_array=None, thr_array=None):
    """One request; returns dict of outputs or raises InferenceServerException."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    inputs = []
    t = text_array if text_array is not None else np.array([s.encode() if isinstance(s, str) else s for s in texts], dtype=np.object_).reshape(-1, 1)
    if t is not False:
        dtype = "BYTES" if t.dtype == np.object_ else "FP32"
        inputs.append(httpclient.InferInput("TEXT", list(t.shape), dtype))
        inputs[-1].set_data_from_numpy(t)
    thr = thr_array if thr_array is not None else np.full((len(texts), 1), thresholds, dtype=np.float32)
    if thr is not False:
        inputs.append(httpclient.InferInput("THRESHOLD", list(thr.shape), "FP32"))
        inputs[-1].set_data_from_numpy(thr)
    try:
        result = client.infer(model, inputs, parameters=parameters)
        names = [o["name"] for o in result.get_response()["outputs"]]
        return {n: result.as_numpy(n) for n in names}
    finally:
        client.close()


def routes(out):
    return [r.decode() for r in out["ROUTE"].reshape(-1)]
