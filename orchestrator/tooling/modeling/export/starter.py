"""``orchestrator export --router``: a router of the exported model's own, ``NAME_router``.

The shipped ``router`` serves the demo's binary classifiers; a policy naming a model with
another head (multi-class, multi-label, other labels) is refused, by design. This writes a
copy of the shipped router (its code, config renamed, warmup) with a starter policy for the
exported model, whatever its head:

- empty texts answered without a model (``{empty: true}``; probability 0.5 for binary and
  multi-label heads, 1/K for a K-class head; verdict false);
- texts longer than the model's ``max_length`` chunked into windows of that length
  (stride 3/4 of it), ``max_sequence_length`` = the same;
- tokenized in the router's process with the model's own tokenizer (``inline``);

and its ``labels.txt`` (the head's output labels, Triton's classification extension). A
re-export keeps a ``policy.yaml`` the user edited and writes the new starter beside it
(:data:`STARTER_BESIDE`). The policy binds to the repository as ``orchestrator policy check --repo`` checks it (tested in
``tests/unit/test_export_starter.py``; served in ``tests/server/test_byom.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

from orchestrator.runtime.routing.heads import MULTICLASS, Head
from orchestrator.tooling import repository
from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.repository import write_label_file

POLICY = "policy.yaml"


def router_name(model: str) -> str:
    """The starter router's model name for ``model``."""
    return f"{model}_router"


def starter_policy(model: str, head: Head) -> str:
    """The starter policy's YAML text for ``model`` with ``head`` (comments say what to change)."""
    window = head.max_length
    stride = max(1, window * 3 // 4)
    empty_p = round(1.0 / len(head.labels), 6) if head.kind == MULTICLASS else 0.5
    labels = ", ".join(head.output_labels())
    return f"""\
# Starter routing policy for {model} ({head.describe()}), written by `orchestrator export --router`.
# Format: docs/reference/policy.md. Check a change with:
#   orchestrator policy check <repo>/{router_name(model)}/policy.yaml --repo <repo> --write-labels
version: 1
description: >
  {model}: empty texts answered without a model; texts over {window} tokens (the model's
  max_length) chunked into overlapping windows of {window} tokens, a new one every {stride}.
  Output labels: {labels}.
max_sequence_length: {window}   # the model's max_length (its head.json)
inline:
  tokenizer: true               # tokenize in the router's process with {head.tokenizer}'s files
root:
  kind: sequence
  name: main
  steps:
    - kind: switch
      name: guard
      cases:
        - when: {{empty: true}}
          # no model called; {"1/K per label for a K-class head" if head.kind == MULTICLASS else "0.5 per column"}
          then: {{kind: constant, name: empty, probability: {empty_p}, verdict: false}}
    - kind: chunk
      name: chunk
      window: {window}
      stride: {stride}
      node: {{kind: model, name: {model}, model: {model}}}
"""


#: where the starter goes when the router's ``policy.yaml`` was edited (and kept)
STARTER_BESIDE = "policy.starter.yaml"


def write_starter_router(repo: Path, model: str, head: Head, source: Path | None = None,
                         previous: Sequence[Head] = (), name: str | None = None) -> Path:
    """Write ``<repo>/<name>`` (default ``<model>_router``): the shipped router (``source``, default the repository's
    ``router``, else this checkout's) renamed, with :func:`starter_policy` and its
    ``labels.txt``. Returns its directory.

    An existing ``<model>_router`` is replaced, but for an edited ``policy.yaml``: one that
    is not the starter policy of ``head`` nor of one of ``previous`` (the heads the model
    had) is kept, the starter is written beside it as :data:`STARTER_BESIDE`, and
    ``labels.txt`` gets the kept policy's labels when it binds to the repository.

    Raises ConfigError: the source router's config does not parse; FileNotFoundError: no
    source router.
    """
    repo = Path(repo)
    if source is None:
        source = repo / "router" if (repo / "router" / "config.pbtxt").is_file() else PROJECT_ROOT / "model_repository" / "router"
    dest = repo / (name or router_name(model))
    starter = starter_policy(model, head)
    edited = _edited_policy(dest / POLICY, model, (head, *previous))
    # the old router stays aside (hidden: no tool reads it) until the new one is complete
    aside = dest.with_name(f".{dest.name}.replaced")
    if aside.exists():
        shutil.rmtree(aside)
    if dest.exists():
        dest.rename(aside)
    try:
        repository.copy_model(source, dest, [f"The router of {model}, written by `orchestrator export --router` "
                                             f"(a copy of {source.name}/config.pbtxt)."])
        # what `env install` put into the source router belongs to that install (doctor: env-config)
        shutil.rmtree(dest / "configs", ignore_errors=True)
        for leftover in [*dest.glob("triton_env*"), *dest.glob("triton_python_backend_stub*")]:
            leftover.unlink()
        if edited is None:
            (dest / POLICY).write_text(starter)
        else:
            (dest / POLICY).write_bytes(edited)
            (dest / STARTER_BESIDE).write_text(starter)
        write_label_file(dest, (_kept_head(repo, dest / POLICY) if edited is not None else None) or head)
    except BaseException:
        if aside.exists():
            shutil.rmtree(dest, ignore_errors=True)
            aside.rename(dest)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    return dest


def _edited_policy(path: Path, model: str, heads: Sequence[Head]) -> bytes | None:
    """The bytes of ``path`` when it exists and is not the starter policy of one of ``heads``."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    return None if data in {starter_policy(model, h).encode("utf-8") for h in heads} else data


def _kept_head(repo: Path, path: Path) -> Head | None:
    """The head a kept policy answers with, None when it does not bind (the export says why)."""
    from orchestrator.runtime.routing import policy as P
    from orchestrator.tooling.policy_cli import bind_repository

    try:
        plan, _ = bind_repository(P.load_policy(path), repo)
    except P.PolicyError:
        return None
    return plan.head if plan is not None else None
