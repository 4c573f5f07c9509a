"""The models an exported classifier is served with, and what the export changes around it.

For model ``NAME`` with head ``head`` (``orchestrator.runtime.routing.heads``):

- ``NAME_tokenizer``: the checkpoint's own tokenizer as a tokenizer model
  (:func:`orchestrator.tooling.modeling.export.source.save_tokenizer`);
- ``NAME_postprocess``: the postprocess model serving ``head`` (config parameter ``head``,
  ``labels.txt``) (:func:`write_postprocess`);
- ``NAME_ensemble``: ``NAME_tokenizer`` -> ``NAME`` -> ``NAME_postprocess``
  (:func:`write_ensemble`);
- every other ensemble of the repository with a step calling ``NAME`` gets its tokenizer
  and postprocess steps re-pointed (:func:`repoint_ensembles`);
- every router whose policy names ``NAME`` is checked against the models' heads, and its
  ``labels.txt`` updated when the policy binds (:func:`check_routers`).

Configurations are read and written through :mod:`orchestrator.tooling.repository`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional

from orchestrator.runtime.routing import policy as P
from orchestrator.runtime.routing.heads import Head
from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.files import write_atomic
from orchestrator.tooling.modeling.configs import ensemble_config, postprocess_config, write_head
from orchestrator.tooling.modeling.contract import INPUT_NAMES, OUTPUT_NAME, ExportError
from orchestrator.tooling.repository import header_lines, model_config_paths, read_config, write_config, write_label_file

POSTPROCESS_ADAPTER = ('"""Triton Python-backend adapter; the implementation is orchestrator.runtime.models.postprocess."""\n\n'
                       "from orchestrator.runtime.models.postprocess import TritonPythonModel  # noqa: F401\n")
POSTPROCESS_HEADER = (
    "Logits to PROBABILITIES and VERDICTS for one classifier head (orchestrator.runtime.models.postprocess;",
    "parameter head: the classifier's head.json); written by `orchestrator export`",
    "(orchestrator.tooling.modeling.configs.postprocess_config). Labels of PROBABILITIES: labels.txt.",
)
ENSEMBLE_HEADER = (
    "tokenizer -> classifier -> postprocess for one exported classifier, the inputs and outputs of",
    "the shipped ensemble; written by `orchestrator export` (orchestrator.tooling.modeling.configs.ensemble_config).",
)
#: Whether an ensemble's ``PROBABILITIES`` gets ``label_filename``: Triton 2.51 (the
#: embedded server) answers the classification extension from an ensemble's own label
#: file (tests/server/test_byom.py).
ENSEMBLE_LABELS = True


def postprocess_name(name: str) -> str:
    return f"{name}_postprocess"


def tokenizer_name(name: str) -> str:
    return f"{name}_tokenizer"


def ensemble_name(name: str) -> str:
    return f"{name}_ensemble"


def write_postprocess(repo: Path, name: str, head: Head) -> List[Path]:
    """``<repo>/<name>``: the postprocess model of ``head`` (config, ``1/model.py``,
    ``labels.txt``, ``head.json``, warmup files); returns the files written."""
    from orchestrator.tooling.warmup import write_warmup_files

    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    write_atomic(model_dir / "1" / "model.py", POSTPROCESS_ADAPTER.encode("utf-8"), 0o644)
    written = [model_dir / "1" / "model.py",
               write_config(model_dir / "config.pbtxt", postprocess_config(name, head), POSTPROCESS_HEADER),
               write_label_file(model_dir, head)]
    written += write_head(model_dir, head)
    written += write_warmup_files(model_dir, "postprocess", None, head.num_logits)
    return written


def write_ensemble(repo: Path, name: str, tokenizer: str, model: str, postprocess: str, head: Head) -> List[Path]:
    """``<repo>/<name>``: the ensemble ``tokenizer`` -> ``model`` -> ``postprocess`` (config,
    an empty version directory ``1/``, ``labels.txt``); returns the files written."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    config = ensemble_config(name, tokenizer, model, postprocess, head, labels=ENSEMBLE_LABELS)
    written = [write_config(model_dir / "config.pbtxt", config, ENSEMBLE_HEADER)]
    if ENSEMBLE_LABELS:
        written.append(write_label_file(model_dir, head))
    return written


@dataclass
class Repointed:
    """One ensemble configuration whose steps an export changed (or could not change)."""

    path: Path
    changes: List[str]
    problems: List[str]


def _feeds(step, tensors: Iterable[str]) -> bool:
    return bool(set(step.output_map.values()) & set(tensors))


def _reads(step, tensors: Iterable[str]) -> bool:
    return bool(set(step.input_map.values()) & set(tensors))


def _repoint(path: Path, steps: list, models: set, tokenizer: str, postprocess: str) -> tuple:
    """Re-point, in place, the steps around the steps calling ``models``; returns
    ``(changes, problems)`` as lines."""
    changes, problems = [], []
    for step in [s for s in steps if s.model_name in models]:
        ids = [step.input_map[k] for k in INPUT_NAMES if k in step.input_map]
        logits = [step.output_map[k] for k in (OUTPUT_NAME,) if k in step.output_map]
        around = [(s, tokenizer, "tokenizer", _feeds(s, ids)) for s in steps if s is not step]
        around += [(s, postprocess, "postprocess", _reads(s, logits)) for s in steps if s is not step]
        for other, new, kind, linked in around:
            if not linked or other.model_name == new:
                continue
            # another step fed by (or feeding) this one would change too
            others = [s for s in steps if s is not step and s is not other and s.model_name not in models
                      and (_reads(s, other.output_map.values()) if kind == "tokenizer"
                           else _feeds(s, other.input_map.values()))]
            if others:
                problems.append(f"{path}: the {kind} step {other.model_name!r} also serves "
                                f"{', '.join(repr(s.model_name) for s in others)}; left as it is")
                continue
            changes.append(f"{other.model_name} -> {new}")
            other.model_name = new
    return changes, problems


def repoint_ensembles(repo: Path, models: Iterable[str], tokenizer: str, postprocess: str, head: Head,
                      skip: Iterable[str] = ()) -> List[Repointed]:
    """Re-point the steps around ``models`` in every ensemble of ``repo`` (but ``skip``):
    the step that makes a model step's ``input_ids``/``attention_mask`` now calls
    ``tokenizer``, the step that reads its ``logits`` calls ``postprocess``; an ensemble
    output with ``label_filename`` gets that file rewritten with ``head.output_labels()``.
    A step that also serves another step of the ensemble is left as it is and reported
    (re-pointing it would change what that step gets). The header comments are kept,
    with a line saying what changed.

    Raises:
        ExportError: a configuration is invalid.
    """
    models, skip = set(models), set(skip)
    out = []
    for model_dir in sorted(p for p in repo.iterdir() if p.is_dir() and p.name not in skip):
        for path in model_config_paths(model_dir):
            try:
                config = read_config(path)
            except ConfigError as exc:
                raise ExportError(str(exc)) from None
            if config.platform != "ensemble":
                continue
            changes, problems = _repoint(path, list(config.ensemble_scheduling.step), models, tokenizer, postprocess)
            if changes:
                lines = [*header_lines(path), f"Steps re-pointed by `orchestrator export`: {'; '.join(changes)}."]
                write_config(path, config, lines)
                for label_file in sorted({o.label_filename for o in config.output if o.label_filename}):
                    write_label_file(model_dir, head, label_file)
            if changes or problems:
                out.append(Repointed(path, changes, problems))
    return out


@dataclass
class RouterCheck:
    """What an export means for one router whose policy names the exported model."""

    router: str
    policy: Path
    binds: bool
    message: str
    labels_written: Optional[Path] = None


def check_routers(repo: Path, names: Iterable[str]) -> List[RouterCheck]:
    """For every router of ``repo`` (``policy_cli.router_policies``) whose policy names one
    of ``names``: whether the policy binds to its models' heads now; when it does, its
    ``labels.txt`` is rewritten with the policy's output labels. An invalid policy is
    reported, not raised."""
    from orchestrator.tooling.policy_cli import bind_repository, repository_heads, router_policies

    names = set(names)
    out = []
    for router, path in router_policies(repo).items():
        try:
            policy = P.load_policy(path)
        except P.PolicyError as exc:
            out.append(RouterCheck(router, path, False, f"{router}: its policy is invalid: {exc}"))
            continue
        used = sorted({n.model for n in policy.model_nodes()})
        if not names & set(used):
            continue
        plan, errors = bind_repository(policy, repo)
        head = plan.head if plan is not None else None
        try:
            heads = repository_heads(policy, repo)
        except P.PolicyError:
            heads = {}
        models = "; ".join(f"{m}: {heads[m].describe()}" for m in used if m in heads)
        where = f"{router} ({path.relative_to(repo)})"
        if head is None:
            out.append(RouterCheck(router, path, False,
                                   f"{where} names {', '.join(sorted(names & set(used)))}; its models' heads: {models}. "
                                   f"The policy no longer binds: {'; '.join(errors)}. The router will refuse to load "
                                   "until the policy or the models change."))
            continue
        labels = write_label_file(path.parent, head)
        out.append(RouterCheck(router, path, True,
                               f"{where} names {', '.join(sorted(names & set(used)))}; its models' heads: {models}. "
                               f"They agree: every answer is {head.describe()}; wrote {labels.relative_to(repo)} "
                               f"({', '.join(head.output_labels())}).", labels))
    return out
