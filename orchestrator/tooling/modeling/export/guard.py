"""What ``orchestrator export`` may change in a repository, checked around it.

- :func:`planned_models`: the model directories an export writes; :func:`replace_refusal`
  the one line that refuses to replace existing ones without ``--replace`` (the command
  exits 2 before loading anything).
- :func:`router_states` before and after the export, compared by :func:`newly_broken`: a
  router that loaded before (or is new) and would not load now fails the command. The
  checks are ``orchestrator policy check``'s (:mod:`orchestrator.tooling.policy_cli`).
- :func:`routers_using`: the routers whose policies name a model; a running server keeps
  serving them with the model's old tokenizer and head until they are loaded again (a
  router reads both when it loads).
- :func:`stage_repository`, :func:`swap_in`, :func:`discard`: the export is all-or-nothing.
  It writes into a staging repository beside ``repo`` (the models it writes and every
  ensemble, which it may re-point, copied; every other entry a symbolic link to the
  original), is checked there, and only then are the changed model directories renamed
  into ``repo``; on any failure the staging directory is removed and ``repo`` is as it was.
"""

from __future__ import annotations

import filecmp
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from orchestrator.runtime.routing import policy as P
from orchestrator.tooling.errors import ConfigError
from orchestrator.tooling.modeling.export import pipeline
from orchestrator.tooling.modeling.export.starter import router_name
from orchestrator.tooling.repository import model_config_paths, read_config

#: :func:`router_states`' key for what the repository as a whole would refuse
REPOSITORY = "the repository"


def planned_models(name: str, fp16: bool = False, router: bool = False, router_model: Optional[str] = None) -> List[str]:
    """The model directories ``orchestrator export SOURCE --name NAME`` writes (the router:
    ``router_model``, default ``NAME_router``)."""
    variants = [name] + ([f"{name}_fp16"] if fp16 else [])
    models = [name, pipeline.tokenizer_name(name), pipeline.postprocess_name(name)]
    models += variants[1:] + [pipeline.ensemble_name(v) for v in variants]
    return models + ([router_model or router_name(name)] if router else [])


def existing(repo: Path, models: Iterable[str]) -> List[str]:
    """Those of ``models`` that have a directory in ``repo``."""
    return [m for m in models if (Path(repo) / m).exists()]


def ensembles_calling(repo: Path, models: Iterable[str], skip: Iterable[str] = ()) -> List[str]:
    """The ensembles of ``repo`` (but ``skip``) with a step calling one of ``models``: the
    export re-points their other steps."""
    models, skip, out = set(models), set(skip), []
    for model_dir in sorted(p for p in Path(repo).iterdir() if p.is_dir() and p.name not in skip):
        for path in model_config_paths(model_dir):
            try:
                config = read_config(path)
            except ConfigError:
                continue
            if config.platform == "ensemble" and any(s.model_name in models for s in config.ensemble_scheduling.step):
                out.append(model_dir.name)
                break
    return out


def replace_refusal(repo: Path, present: List[str], repointed: List[str] = ()) -> str:
    """The refusal to replace ``present`` (one line)."""
    which = "ensembles" if len(repointed) > 1 else "ensemble"
    also = f"; it would also re-point the {which} {', '.join(repointed)}" if repointed else ""
    return (f"error: export would replace {', '.join(present)} in {repo}{also}. Choose another --name, "
            "or pass --replace to replace them (an edited NAME_router/policy.yaml is kept)")


def router_states(repo: Path) -> Dict[str, List[str]]:
    """Router -> why it would not load (empty: it loads), for every router of ``repo``
    (``policy_cli.router_policies``), plus :data:`REPOSITORY` -> what Triton would refuse in
    the repository (``policy_cli.repository_errors``)."""
    from orchestrator.tooling.policy_cli import bind_repository, repository_errors, router_policies

    states = {}
    for router, path in router_policies(repo).items():
        try:
            _, errors = bind_repository(P.load_policy(path), repo)
        except P.PolicyError as exc:
            errors = [str(exc)]
        states[router] = errors
    states[REPOSITORY] = repository_errors(repo)
    return states


def newly_broken(before: Dict[str, List[str]], after: Dict[str, List[str]]) -> Dict[str, List[str]]:
    """What does not load after the export but did before (a new router counts as loading
    before): router -> its errors; :data:`REPOSITORY` -> only its new errors."""
    out = {}
    for router, errors in after.items():
        if router == REPOSITORY:
            errors = [e for e in errors if e not in before.get(REPOSITORY, [])]
        elif before.get(router):
            continue
        if errors:
            out[router] = errors
    return out


def routers_using(repo: Path, models: Iterable[str], skip: Iterable[str] = ()) -> List[str]:
    """The routers of ``repo`` (but ``skip``) whose policies name one of ``models``
    (policies that do not parse are left out: :func:`router_states` reports them)."""
    from orchestrator.tooling.policy_cli import router_policies

    models, skip, out = set(models), set(skip), []
    for router, path in router_policies(repo).items():
        if router in skip:
            continue
        try:
            policy = P.load_policy(path)
        except P.PolicyError:
            continue
        if models & {n.model for n in policy.model_nodes()}:
            out.append(router)
    return out


def breakage_lines(repo: Path, before: Dict[str, List[str]], after: Dict[str, List[str]]) -> List[str]:
    """One ``error:`` line per router :func:`newly_broken` names (or per new repository
    error), then one ``warning:`` line per router that did not load before the export either."""
    from orchestrator.tooling.policy_cli import router_policies

    lines, policies = [], router_policies(repo)
    for router, errors in newly_broken(before, after).items():
        if router == REPOSITORY:
            lines += [f"error: after this export Triton would refuse {e.removeprefix(REPOSITORY + ': ')}" for e in errors]
            continue
        policy = policies.get(router, Path(repo) / router / "policy.yaml")
        lines.append(f"error: after this export router {router} cannot load: {'; '.join(errors)}. Change its policy "
                     f"(or the models) and check it: orchestrator policy check {policy} --repo {repo}")
    for router, errors in after.items():
        if errors and router != REPOSITORY and before.get(router):
            lines.append(f"warning: router {router} could not load before this export either: {'; '.join(errors)}")
    return lines


def _is_ensemble(model_dir: Path) -> bool:
    for path in model_config_paths(model_dir):
        try:
            if read_config(path).platform == "ensemble":
                return True
        except ConfigError:
            continue
    return False


def stage_repository(repo: Path, planned: Iterable[str]) -> Path:
    """A staging repository beside ``repo`` (``.<repo>.export-*`` in its parent directory):
    ``planned`` and every ensemble copied (the export writes or re-points them), every other
    entry of ``repo`` a symbolic link to the original (read, never written). Raises OSError
    when the parent directory is not writable."""
    repo = Path(repo).resolve()
    stage = Path(tempfile.mkdtemp(prefix=f".{repo.name}.export-", dir=repo.parent))
    planned = set(planned)
    try:
        for entry in sorted(repo.iterdir()):
            if entry.is_dir() and not entry.is_symlink() and (entry.name in planned or _is_ensemble(entry)):
                shutil.copytree(entry, stage / entry.name, symlinks=True)
            else:
                (stage / entry.name).symlink_to(entry)
    except BaseException:
        discard(stage)
        raise
    return stage


def _same_tree(a: Path, b: Path) -> bool:
    if not b.is_dir():
        return False
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])

    def same(c: filecmp.dircmp) -> bool:
        if c.left_only or c.right_only or c.funny_files:
            return False
        _, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files, shallow=False)
        return not mismatch and not errors and all(same(s) for s in c.subdirs.values())

    return same(cmp)


def swap_in(repo: Path, stage: Path) -> List[str]:
    """Move the model directories of ``stage`` that differ from ``repo``'s (or are new) into
    ``repo``, each a rename (the old one set aside, removed once all are in); returns their
    names. On an error the ones already moved are put back and the error raised; ``stage``
    is removed in every case."""
    repo, stage = Path(repo).resolve(), Path(stage)
    changed = [e.name for e in sorted(stage.iterdir())
               if e.is_dir() and not e.is_symlink() and not _same_tree(e, repo / e.name)]
    aside = Path(tempfile.mkdtemp(prefix=f".{repo.name}.replaced-", dir=repo.parent))
    done: List[str] = []
    try:
        for name in changed:
            if (repo / name).exists() or (repo / name).is_symlink():
                (repo / name).rename(aside / name)
            (stage / name).rename(repo / name)
            done.append(name)
    except BaseException:
        for name in reversed(done):
            shutil.rmtree(repo / name, ignore_errors=True)
        for name in changed:
            if (aside / name).exists() and not (repo / name).exists():
                (aside / name).rename(repo / name)
        raise
    finally:
        discard(stage)
        if len(done) == len(changed) or not any(aside.iterdir()):
            shutil.rmtree(aside, ignore_errors=True)
    return changed


def discard(stage: Path) -> None:
    """Remove a staging repository (its links, never what they point to)."""
    shutil.rmtree(stage, ignore_errors=True)
