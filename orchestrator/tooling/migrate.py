"""``orchestrator migrate ENSEMBLE_DIR --name NAME --repo REPO [--check URL]``: an ensemble
made a router model.

1. The ensemble's ``config.pbtxt`` and its steps' models (in the ensemble's repository,
   ``ENSEMBLE_DIR``'s parent, with the configuration Triton reads for
   ``--model-config-name``) are checked as Triton checks them at load
   (:mod:`orchestrator.tooling.ensembles`). What Triton refuses is refused here with
   Triton's reason: exit 1, nothing written. A step whose model is decoupled is refused too,
   naming the model: the router takes one response per call (streaming is not migrated).
   A step calling another ensemble calls it as a model (the inner ensemble keeps running in
   Triton's ensemble scheduler).
2. ``REPO/NAME`` is written (all at once: a temporary directory renamed into place; an
   existing ``REPO/NAME`` is refused):

   - ``config.pbtxt``: ``backend: "python"``, the ensemble's ``max_batch_size``, inputs,
     outputs (names, data types, dims, reshape, optional, label files), ``version_policy``
     and ``parameters``, one ``KIND_CPU`` instance, the parameter ``policy: policy.yaml``;
     ``dynamic_batching { }`` when the ensemble batches (``max_batch_size`` > 0; not with
     ``--no-dynamic-batching``): an ensemble has no scheduler of its own, each request goes
     straight to its steps' models and they batch; the router is one model whose instance
     runs one ``execute`` at a time, so without a batcher of its own it serves one request at
     a time, where with one, the requests that queued while it was busy share its next
     ``execute`` and each step's call carries all their rows (no delay is added: a request
     waits only while the router is busy);
   - one version directory per version directory of the ensemble, each with the one-line
     ``model.py`` of every router;
   - the label files the outputs name, copied;
   - ``policy.yaml``: with ``--call-ensemble``, one ``step`` calling the ensemble itself
     (:func:`whole_policy`: one BLS round trip per request; the ensemble must stay served,
     under its own name); else a pipeline policy with one ``step`` node per ensemble step (model,
     pinned version, ``inputs`` = ``input_map``, ``outputs`` = ``output_map``; every request
     parameter forwarded, as the ensemble forwards them; where the router has
     ``max_batch_size: 0`` and a step's model batches, every step's ``model_dims``: its
     model's ``max_batch_size`` and input dims, from which the router adds or strips a batch
     dimension per tensor as Triton does) and ``pipeline.outputs`` in the
     order the ensemble answers (:func:`orchestrator.testing.mock.ensemble.response_order`:
     Triton iterates a hash map; with ``--check``, the live ensemble's order, probed).
3. The router is checked offline as ``orchestrator policy check REPO/NAME/policy.yaml --repo
   ENSEMBLE_REPO`` checks it (the step models are the ensemble's repository's; ``REPO`` is
   usually that repository, or another one the same server serves); with ``--check URL`` (or
   ``--check embedded``: the embedded Triton on REPO, started here)
   the same inputs go through the ensemble and the router, and the largest difference per
   output is reported (:mod:`migrate_check`).

Exit status: 0 done (and, with ``--check``, every output byte-identical), 1 refused, the
offline check failed, or an output differed; 2 usage.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from orchestrator.testing.mock.ensemble import response_order
from orchestrator.tooling.ensembles import EnsembleError, RepoModel, Repository, check_ensemble
from orchestrator.tooling.errors import ConfigError, ToolingError
from orchestrator.tooling.repository import ModelConfig, format_config, model_config_pb2

POLICY_FILE = "policy.yaml"
#: ``--check embedded``: the embedded Triton on REPO instead of a running server's URL.
EMBEDDED = "embedded"
MODEL_PY = ('"""Triton Python-backend adapter; the implementation is orchestrator.runtime.serving.router."""\n\n'
            "from orchestrator.runtime.serving.router import TritonPythonModel  # noqa: F401\n")

__all__ = ["MigrateError", "Migration", "plan_migration", "router_config", "pipeline_policy", "whole_policy", "write_router",
           "migrate", "add_migrate_arguments", "migrate_command"]


class MigrateError(ToolingError):
    """The ensemble cannot be migrated (Triton refuses it, a step is decoupled, the target
    exists); the message says why."""


class Migration:
    """What ``migrate`` writes for one ensemble: the router's name, configuration, policy
    document, version directories and label files."""

    def __init__(self, ensemble: RepoModel, name: str, config: ModelConfig, policy: Dict[str, Any],
                 versions: List[str], label_files: List[str]):
        self.ensemble = ensemble
        self.name = name
        self.config = config
        self.policy = policy
        self.versions = versions
        self.label_files = label_files

    @property
    def outputs(self) -> List[str]:
        """The response's outputs in the ensemble's answering order."""
        return list(self.policy["pipeline"]["outputs"])


def _refuse_decoupled(ensemble: RepoModel, repo: Repository) -> None:
    for index, step in enumerate(ensemble.config.ensemble_scheduling.step):
        sub = repo.get(step.model_name)
        if sub is not None and sub.decoupled:
            kind = "an ensemble with a decoupled step" if sub.is_ensemble else "decoupled"
            raise MigrateError(
                f"step {index} of ensemble '{ensemble.name}' calls model '{step.model_name}', which is {kind}: the router "
                "calls each step once and takes its one response, so a decoupled model (0 or several responses per "
                "request) is not migrated; keep this ensemble, or make the step's model answer once per request")


def router_config(ensemble: ModelConfig, name: str, dynamic_batching: bool = True) -> ModelConfig:
    """The router's configuration: the ensemble's interface, served by the Python backend;
    ``dynamic_batching``: with ``dynamic_batching { }`` when the ensemble batches (module
    docstring).

    Raises:
        MigrateError: the ensemble's parameters already hold ``policy`` (the router's own).
    """
    if "policy" in ensemble.parameters:
        raise MigrateError("the ensemble's configuration has a parameter 'policy', which the router uses for its policy "
                           "file; rename that parameter first")
    config = ModelConfig()
    config.name = name
    config.backend = "python"
    config.max_batch_size = ensemble.max_batch_size
    config.input.extend(ensemble.input)
    config.output.extend(ensemble.output)
    if ensemble.HasField("version_policy"):
        config.version_policy.CopyFrom(ensemble.version_policy)
    for key in ensemble.parameters:
        config.parameters[key].CopyFrom(ensemble.parameters[key])
    config.parameters["policy"].string_value = POLICY_FILE
    if dynamic_batching and config.max_batch_size > 0:
        config.dynamic_batching.SetInParent()
    group = config.instance_group.add()
    group.count = 1
    group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
    return config


def output_order(config: ModelConfig, outputs: Optional[Sequence[str]] = None) -> List[str]:
    """``pipeline.outputs`` of a router migrated from the ensemble ``config``: ``outputs``
    (the order probed on a live ensemble) or :func:`response_order` of its outputs."""
    return list(outputs) if outputs is not None else response_order([o.name for o in config.output])


def pipeline_policy(ensemble: RepoModel, repo: Repository, outputs: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The pipeline policy of ``ensemble``: one ``step`` node per step, in the
    configuration's order (the router runs them in dataflow order, as the ensemble does),
    and ``pipeline.outputs``: ``outputs`` (the order probed on a live ensemble) or
    :func:`response_order` of the configuration's outputs."""
    config = ensemble.config
    counts: Dict[str, int] = {}
    for step in config.ensemble_scheduling.step:
        counts[step.model_name] = counts.get(step.model_name, 0) + 1
    seen: Dict[str, int] = {}
    steps = []
    subs = [repo.get(step.model_name) for step in config.ensemble_scheduling.step]
    # max_batch_size 0 around a batching model: Triton reshapes per tensor (ReshapeTensorDims)
    reshapes = config.max_batch_size == 0 and any(sub is not None and sub.config.max_batch_size > 0 for sub in subs)
    for step in config.ensemble_scheduling.step:
        node: Dict[str, Any] = {"kind": "step"}
        if counts[step.model_name] > 1:
            seen[step.model_name] = seen.get(step.model_name, 0) + 1
            node["name"] = f"{step.model_name}_{seen[step.model_name]}"
        else:
            node["name"] = step.model_name
        node["model"] = step.model_name
        if step.model_version >= 0:
            node["version"] = int(step.model_version)
        node["inputs"] = {k: step.input_map[k] for k in sorted(step.input_map)}
        node["outputs"] = {k: step.output_map[k] for k in sorted(step.output_map)}
        sub = repo.get(step.model_name)
        if reshapes and sub is not None:
            wanted = {io.name: [int(d) for d in io.dims] for io in sub.config.input}
            node["model_dims"] = {"max_batch_size": int(sub.config.max_batch_size),
                                  "inputs": {k: wanted[k] for k in node["inputs"] if k in wanted}}
        steps.append(node)
    order = output_order(config, outputs)
    return {
        "version": 1,
        "description": f"Migrated from the ensemble '{ensemble.name}' by orchestrator migrate: its steps, run "
                       "in dataflow order as the ensemble runs them.",
        "ignored_parameters": ["*"],
        "pipeline": {"outputs": order, "steps": steps},
    }


def whole_policy(ensemble: RepoModel, outputs: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The policy of a router that calls ``ensemble`` as it is, in one ``step`` (``migrate
    --call-ensemble``): every input and output of the ensemble under its own name,
    ``pipeline.outputs`` as in :func:`pipeline_policy`. One BLS round trip per request
    instead of one per step; the ensemble stays served and runs its steps itself."""
    config = ensemble.config
    order = output_order(config, outputs)
    step = {"kind": "step", "name": ensemble.name, "model": ensemble.name,
            "inputs": {i.name: i.name for i in config.input}, "outputs": {o.name: o.name for o in config.output}}
    return {
        "version": 1,
        "description": f"Migrated from the ensemble '{ensemble.name}' by orchestrator migrate --call-ensemble: "
                       "the ensemble called whole, in one step.",
        "ignored_parameters": ["*"],
        "pipeline": {"outputs": order, "steps": [step]},
    }


def plan_migration(ensemble_dir: Path, name: str, config_name: Optional[str] = "embedded",
                   outputs: Optional[Sequence[str]] = None, dynamic_batching: bool = True,
                   call_ensemble: bool = False) -> Migration:
    """Check the ensemble in ``ensemble_dir`` (its repository: the directory's parent) and
    make what ``migrate`` writes for a router named ``name`` (``dynamic_batching``:
    :func:`router_config`; ``call_ensemble``: :func:`whole_policy` instead of one step per
    ensemble step).

    Raises:
        MigrateError: Triton refuses the ensemble (its reason), or a step is decoupled.
        ConfigError: a configuration does not parse.
    """
    ensemble_dir = Path(ensemble_dir).resolve()
    repo = Repository(ensemble_dir.parent, config_name)
    try:
        ensemble = check_ensemble(ensemble_dir.name, repo)
    except EnsembleError as exc:
        raise MigrateError(str(exc)) from None
    _refuse_decoupled(ensemble, repo)
    config = router_config(ensemble.config, name, dynamic_batching)
    versions = sorted((p.name for p in ensemble.directory.iterdir() if p.is_dir() and p.name.isdigit()), key=int)
    labels = sorted({o.label_filename for o in ensemble.config.output if o.label_filename})
    for label in labels:
        if not (ensemble.directory / label).is_file():
            raise MigrateError(f"output label file {label} is not in {ensemble.directory} (Triton fails the ensemble's load)")
    if call_ensemble and name == ensemble.name:
        raise MigrateError(f"--call-ensemble: the router calls the ensemble '{ensemble.name}', so it needs another name")
    policy = whole_policy(ensemble, outputs) if call_ensemble else pipeline_policy(ensemble, repo, outputs)
    return Migration(ensemble, name, config, policy, versions, labels)


def write_router(migration: Migration, repo: Path) -> Path:
    """Write the router of ``migration`` into ``repo/<name>``, all at once (a temporary
    directory in ``repo`` renamed into place). Returns the model directory.

    Raises:
        MigrateError: ``repo/<name>`` exists.
        OSError: it cannot be written.
    """
    repo = Path(repo)
    target = repo / migration.name
    if target.exists():
        raise MigrateError(f"{target} exists: choose another --name, or remove it first")
    repo.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{migration.name}.", dir=repo))
    try:
        header = [f"The router migrated from the ensemble '{migration.ensemble.name}' by orchestrator migrate: the same",
                  "inputs, outputs, max_batch_size, version_policy and parameters; its steps in policy.yaml."]
        (tmp / "config.pbtxt").write_text(format_config(migration.config, header), encoding="utf-8")
        (tmp / POLICY_FILE).write_text(
            f"# {header[0]}\n" + yaml.safe_dump(migration.policy, sort_keys=False, width=100), encoding="utf-8")
        for version in migration.versions:
            (tmp / version).mkdir()
            (tmp / version / "model.py").write_text(MODEL_PY, encoding="utf-8")
        for label in migration.label_files:
            shutil.copyfile(migration.ensemble.directory / label, tmp / label)
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def check_offline(model_dir: Path, repo: Path, config_name: Optional[str] = "embedded") -> tuple:
    """``orchestrator policy check MODEL_DIR/policy.yaml --repo REPO``: ``(ok, output)``."""
    from orchestrator.tooling.policy_cli import policy_command

    args = argparse.Namespace(policy_command="check", path=str(model_dir / POLICY_FILE), repo=str(repo),
                              model_config_name=config_name or "", write_labels=False)
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = policy_command(args)
    return code == 0, out.getvalue()


def migrate(ensemble_dir: Path, name: str, repo: Path, config_name: Optional[str] = "embedded",
            outputs: Optional[Sequence[str]] = None, dynamic_batching: bool = True,
            call_ensemble: bool = False) -> Migration:
    """:func:`plan_migration` then :func:`write_router`; nothing is written when the plan
    is refused. Returns the migration."""
    migration = plan_migration(ensemble_dir, name, config_name, outputs, dynamic_batching, call_ensemble)
    write_router(migration, repo)
    return migration


def add_migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ensemble_dir", metavar="ENSEMBLE_DIR", help="the ensemble's model directory (its config.pbtxt "
                        "and version directories; its step models beside it)")
    parser.add_argument("--name", required=True, help="the router's model name")
    parser.add_argument("--repo", required=True, help="the model repository to write the router into (REPO/NAME)")
    parser.add_argument("--model-config-name", default="embedded",
                        help="the configuration Triton reads for each model, as the server's --model-config-name "
                             "(configs/<name>.pbtxt, else config.pbtxt; default: %(default)s; '' for config.pbtxt)")
    parser.add_argument("--no-dynamic-batching", dest="dynamic_batching", action="store_false",
                        help="write no dynamic_batching in the router's config.pbtxt: one request per execute "
                             "(by default a batching ensemble's router batches: see the guide)")
    parser.add_argument("--call-ensemble", action="store_true",
                        help="a policy of one step calling the ensemble as it is (one BLS round trip per request "
                             "instead of one per step; the ensemble stays served): see the guide")
    parser.add_argument("--check", metavar="URL", default=None,
                        help="a running server (host:port) serving the ensemble and REPO, or 'embedded' (the embedded "
                             "Triton on REPO, started and stopped here; the 'serve' extra): probe the ensemble's output "
                             "order, load the router, send the same inputs through both, report the largest "
                             "difference per output")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http", help="for --check (default: http)")
    parser.add_argument("--requests", type=int, default=8, help="for --check: requests of random inputs (default: 8)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="for --check: rows per request (default: min(4, max_batch_size); no batch dimension "
                             "for max_batch_size 0)")
    parser.add_argument("--seed", type=int, default=0, help="for --check: the random inputs' seed")


def migrate_command(args: argparse.Namespace) -> int:
    if args.check != EMBEDDED:
        return _migrate(args, args.check)
    from orchestrator.tooling.server import ServerError, TritonServer

    repo = Path(args.repo).resolve()
    try:  # refused before a server starts: Triton's reason, not a failed start
        plan_migration(Path(args.ensemble_dir), args.name, args.model_config_name or None,
                       call_ensemble=args.call_ensemble)
    except (MigrateError, ConfigError) as exc:
        print(f"error: {args.ensemble_dir}: {exc}", file=sys.stderr)
        return 1
    if Path(args.ensemble_dir).resolve().parent != repo:
        print("error: --check embedded serves one repository: REPO must be the ensemble's", file=sys.stderr)
        return 1
    try:
        with TritonServer(repo, models=[Path(args.ensemble_dir).name],
                          model_config_name=args.model_config_name or None) as server:
            return _migrate(args, server.http_url if args.protocol == "http" else server.grpc_url)
    except ServerError as exc:
        print(f"error: --check embedded: {exc}", file=sys.stderr)
        return 1


def _migrate(args: argparse.Namespace, check_url: Optional[str]) -> int:
    config_name = args.model_config_name or None
    ensemble_dir, repo = Path(args.ensemble_dir), Path(args.repo)
    try:
        migration = plan_migration(ensemble_dir, args.name, config_name, dynamic_batching=args.dynamic_batching,
                                   call_ensemble=args.call_ensemble)
    except (MigrateError, ConfigError) as exc:
        print(f"error: {ensemble_dir}: {exc}", file=sys.stderr)
        return 1
    probe = None
    if check_url:
        from orchestrator.tooling import migrate_check

        try:
            probe = migrate_check.Probe(check_url, args.protocol, migration.ensemble, args.requests,
                                        args.batch_size, args.seed)
            order = probe.ensemble_order()
        except ToolingError as exc:
            print(f"error: --check {args.check}: {exc}", file=sys.stderr)
            return 1
        if order != migration.outputs:
            print(f"the live ensemble answers {', '.join(order)} (the rule gave {', '.join(migration.outputs)}): "
                  "using the live order")
            migration = plan_migration(ensemble_dir, args.name, config_name, order, args.dynamic_batching,
                                       args.call_ensemble)
    try:
        target = write_router(migration, repo)
    except (MigrateError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {target}: router '{args.name}' from ensemble '{migration.ensemble.name}' "
          f"({len(migration.policy['pipeline']['steps'])} steps; outputs in order {', '.join(migration.outputs)})")
    # the step models are the ensemble's repository's (REPO may be another one the server serves)
    ok, output = check_offline(target, migration.ensemble.directory.parent, config_name)
    print(output.rstrip())
    if not ok:
        print(f"error: the migrated router does not pass `orchestrator policy check {target / POLICY_FILE} "
              f"--repo {migration.ensemble.directory.parent}` (above)", file=sys.stderr)
        return 1
    if probe is None:
        return 0
    try:
        report = probe.compare(args.name)
    except ToolingError as exc:
        print(f"error: --check {args.check}: {exc}", file=sys.stderr)
        return 1
    print(report.text())
    return 0 if report.identical else 1
