"""``orchestrator policy check PATH`` and ``orchestrator policy show --url``.

``policy check`` validates the policy offline, then, against a model repository:

- every pinned model ``version``: the version directory exists and the model's
  ``version_policy`` (in the configuration Triton reads with ``--model-config-name``)
  serves it;
- with ``--repo``, or for a policy beside a model's configuration (a router's): every
  model the policy names is in the repository, and the policy binds to the models' heads
  (``orchestrator.runtime.routing.policy.bind_heads`` with ``<repo>/<model>/head.json``, the
  legacy one-logit head where there is none): one head for every answer, ``max_length``
  within each model's, calibrations that fit. Errors are located
  (``root.steps[1].stages[0].model: ...``). For a router's policy, its ``labels.txt`` (the
  label file of its ``PROBABILITIES``) must list the policy's output labels;
  ``--write-labels`` writes it;
- the repository as Triton loads it (``tooling.repository.check_repository``): a copied
  router whose config still says another model's ``name``, a missing label file, a Python
  model without ``model.py``, an ensemble whose steps do not fit: what would fail the server
  start is refused here first.

The repository is ``--repo``, else the one holding the policy file, else the project's
``model_repository``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

from orchestrator.runtime.request import POLICY_OUTPUT
from orchestrator.runtime.routing import heads as H
from orchestrator.runtime.routing import policy as P
from orchestrator.runtime.routing.heads import LABEL_FILE, Head, HeadError
from orchestrator.tooling.errors import ConfigError, ToolingError
from orchestrator.tooling.paths import default_model_repository
from orchestrator.tooling.repository import (
    config_path,
    get_parameter,
    is_python_model,
    read_config,
    repository_problems,
    served_versions,
    write_label_file,
)

POLICY_FILE = "policy.yaml"


def report_policy_errors(path: str, errors: List[str]) -> int:
    """Print each of ``errors`` for the policy at ``path`` (stderr) or that it is valid: 1 or 0."""
    for error in errors:
        print(f"invalid policy: {path}: {error}", file=sys.stderr)
    if errors:
        return 1
    print("policy is valid")
    return 0


def version_errors(policy: P.Policy, repo: Path, config_name: Optional[str] = "embedded") -> List[str]:
    """One located message per model node whose pinned ``version`` the repository does
    not serve (``root.cases[0].then.version: ...``); empty when all are served."""
    errors = []
    for node in policy.model_nodes():
        if node.version is None:
            continue
        where, model_dir = f"{node.where}.version", repo / node.model
        path = config_path(model_dir, config_name) if model_dir.is_dir() else None
        if path is None:
            errors.append(f"{where}: model '{node.model}' is not in {repo}")
            continue
        try:
            config = read_config(path)
        except ConfigError as exc:
            errors.append(f"{where}: {exc}")
            continue
        served = served_versions(model_dir, config)
        if node.version not in served:
            present = sorted(p.name for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
            errors.append(
                f"{where}: version {node.version} of '{node.model}' is not served from {model_dir} "
                f"(version directories: {', '.join(present) or 'none'}; served by its version_policy: "
                f"{', '.join(map(str, served)) or 'none'}; to serve several, e.g. version_policy: "
                "{ specific: { versions: [1, 2] } })"
            )
    return errors


def model_errors(policy: P.Policy, repo: Path, config_name: Optional[str] = "embedded") -> List[str]:
    """One located message per ``model`` node whose model has no configuration in
    ``repo`` (``root.steps[1].model: model 'x' is not in R``), and for the ``tokenizer``
    the document names when the repository lacks it (``policy.tokenizer``)."""
    errors = []
    for node in policy.model_nodes():
        if config_path(repo / node.model, config_name) is None:
            errors.append(f"{node.where}.model: model '{node.model}' is not in {repo}")
    if policy.tokenizer and config_path(repo / policy.tokenizer, config_name) is None:
        errors.append(f"policy.tokenizer: model '{policy.tokenizer}' is not in {repo}")
    return errors


def tokenizer_errors(policy: P.Policy, repo: Path, config_name: Optional[str] = "embedded") -> List[str]:
    """After binding: the tokenizer models the policy's heads name must be in ``repo``
    (called through BLS), or have their files in ``<tokenizer>/1`` (``inline``)."""
    errors = []
    for name in policy.tokenizers():
        if policy.inline_tokenizer and not (repo / name / "1" / "tokenizer_config.json").is_file():
            errors.append(f"policy.inline.tokenizer: no tokenizer files in {repo / name / '1'} (tokenizer model '{name}', from the heads)")
        elif not policy.inline_tokenizer and config_path(repo / name, config_name) is None:
            errors.append(f"tokenizer model '{name}' (named by the heads) is not in {repo}")
    return errors


def repository_heads(policy: P.Policy, repo: Path) -> Dict[str, Head]:
    """The head of every model the policy's ``model`` nodes name: ``<repo>/<model>/head.json``,
    :data:`~orchestrator.runtime.routing.heads.LEGACY` where there is none.

    Raises:
        PolicyError: a ``head.json`` is invalid (located at the first node naming it).
    """
    heads = {}
    for node in policy.model_nodes():
        if node.model not in heads:
            try:
                heads.update(H.repository_heads(repo, [node.model]))
            except HeadError as exc:
                raise P.PolicyError(f"{node.where}.model: {exc}") from None
    return heads


def bind_repository(policy: P.Policy, repo: Path, config_name: Optional[str] = "embedded") -> tuple:
    """``(plan, errors)``: the policy bound to the heads of ``repo``'s models
    (:func:`orchestrator.runtime.routing.policy.bind_heads`; its ``head`` answers every text)
    when every model it names is in ``repo`` and it binds to them, else None and the located
    errors."""
    errors = model_errors(policy, repo, config_name)
    if errors:
        return None, errors
    try:
        plan = P.bind_heads(policy, repository_heads(policy, repo))
    except P.PolicyError as exc:
        return None, [str(exc)]
    errors = tokenizer_errors(plan, repo, config_name)
    return (None, errors) if errors else (plan, [])


def router_policies(repo: Path, config_name: Optional[str] = "embedded") -> Dict[str, Path]:
    """Router name -> its policy file, for every model directory of ``repo`` with a
    Python-backend configuration and the policy file it names (parameter ``policy``,
    default :data:`POLICY_FILE`) beside it."""
    out = {}
    for model_dir in sorted(p for p in Path(repo).iterdir() if p.is_dir() and not p.name.startswith(".")):
        path = config_path(model_dir, config_name)
        if path is None:
            continue
        try:
            config = read_config(path)
        except ConfigError:
            continue
        policy = model_dir / (get_parameter(config, "policy") or POLICY_FILE)
        if is_python_model(config) and policy.is_file():
            out[model_dir.name] = policy
    return out


def repository_errors(repo: Path) -> List[str]:
    """What Triton would refuse in ``repo`` when it loads it (:func:`repository_problems`: a
    config whose ``name`` is not its directory's, a missing label file, a Python model without
    its ``model.py``, an ensemble step that does not fit), one message each."""
    return [f"the repository: {line}" for line in repository_problems(repo)]


def label_file_problems(repo: Path, config_name: Optional[str] = "embedded") -> List[str]:
    """Each router of ``repo`` whose ``labels.txt`` (its ``PROBABILITIES``' label file) is not
    the labels its policy answers with (``policy check`` compares the same), or is missing
    while its config names it; one message each. Routers whose policies do not bind are
    left out (``policy check`` names why)."""
    out = []
    for router, policy_path in router_policies(repo, config_name).items():
        try:
            plan, errors = bind_repository(P.load_policy(policy_path), repo, config_name)
        except P.PolicyError:
            continue
        if plan is None:
            continue
        want = list(plan.head.output_labels())
        labels_path = policy_path.parent / LABEL_FILE
        have = read_labels(labels_path)
        fix = f"orchestrator policy check {policy_path} --repo {repo} --write-labels"
        if have is not None and have != want:
            out.append(f"router {router}: {labels_path} lists {have}, but its policy answers {want} "
                       f"(clients asking class_count get the wrong names): {fix}")
        elif have is None and _labels_declared(policy_path.parent, config_name):
            out.append(f"router {router}: {labels_path} does not exist (its config's label_filename): {fix}")
    return out


def read_labels(path: Path) -> Optional[List[str]]:
    """The labels of a label file, one a line; None when it does not exist."""
    return path.read_text(encoding="utf-8").splitlines() if path.is_file() else None


def _labels_declared(model_dir: Path, config_name: Optional[str]) -> bool:
    path = config_path(model_dir, config_name)
    try:
        return path is not None and any(o.label_filename for o in read_config(path).output)
    except ConfigError:
        return False


def _beside_a_model(policy_path: Path) -> bool:
    model_dir = policy_path.resolve().parent
    return (model_dir / "config.pbtxt").is_file() or (model_dir / "configs").is_dir()


def _repository_for(policy_path: Path, repo: Optional[str]) -> Path:
    if repo:
        return Path(repo)
    model_dir = policy_path.resolve().parent
    if (model_dir / "config.pbtxt").is_file() or (model_dir / "configs").is_dir():
        return model_dir.parent
    return default_model_repository()


def _metadata_io(client, model: str, protocol: str, key: str) -> List[tuple]:
    """``(name, datatype, shape)`` of the model's inputs or outputs (``key``) from its KServe v2
    metadata (the model config is restricted to the admin key in the image)."""
    meta = client.get_model_metadata(model)
    if protocol == "http":
        return [(t["name"], t["datatype"], [int(d) for d in t.get("shape", [])]) for t in meta[key]]
    return [(t.name, t.datatype, [int(d) for d in t.shape]) for t in getattr(meta, key)]


def fetch_policy(url: str, model: str = "router", protocol: str = "http") -> dict:
    """The policy document the running ``model`` uses, from its optional ``POLICY`` output.

    A text router gets one empty text (answered without any model by policies that guard
    empty texts); a pipeline router one row of zeros (empty bytes) of each of its inputs,
    variable dims as 1, asking for ``POLICY`` only, which runs no step. Both with the request
    parameter ``describe_policy: true``.

    Raises:
        tritonclient.utils.InferenceServerException: the server is unreachable or the model
            refuses the request (a pipeline router without a ``POLICY`` output says so).
        RuntimeError: the model has no ``POLICY`` output (not an orchestrator router, or a
            pipeline router whose config declares none).
    """
    import numpy as np
    from tritonclient.utils import triton_to_np_dtype

    from orchestrator.tooling.client import client_module, text_inputs

    tc = client_module(protocol)
    client = tc.InferenceServerClient(url)
    try:
        if POLICY_OUTPUT not in [name for name, _, _ in _metadata_io(client, model, protocol, "outputs")]:
            raise RuntimeError(f"model '{model}' has no {POLICY_OUTPUT} output: it is not an orchestrator router, or a "
                               f"pipeline router whose config.pbtxt declares none (add {{ name: \"{POLICY_OUTPUT}\" "
                               "data_type: TYPE_STRING dims: [ 1 ] } to its outputs)")
        declared = _metadata_io(client, model, protocol, "inputs")
        if {name for name, _, _ in declared} <= {"TEXT", "THRESHOLD"}:
            inputs = text_inputs(tc, [""])
        else:
            inputs = []
            for name, datatype, shape in declared:
                dims = [max(d, 1) for d in shape]
                array = (np.full(dims, b"", dtype=np.object_) if datatype == "BYTES"
                         else np.zeros(dims, dtype=triton_to_np_dtype(datatype)))
                inputs.append(tc.InferInput(name, dims, datatype))
                inputs[-1].set_data_from_numpy(array)
        outputs = [tc.InferRequestedOutput(POLICY_OUTPUT)]
        result = client.infer(model, inputs, outputs=outputs, parameters={"describe_policy": True})
    finally:
        client.close()
    value = result.as_numpy(POLICY_OUTPUT)
    if value is None:
        raise RuntimeError(f"model '{model}' returned no POLICY output: is it an orchestrator router?")
    return json.loads(value.reshape(-1)[0])


def add_policy_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="policy_command", required=True)
    check = sub.add_parser("check", help="validate a policy file offline and print its graph")
    check.add_argument("path", help="policy file (.yaml, .yml or .json)")
    check.add_argument("--repo", default=None, help="model repository for pinned versions (default: the one "
                       "holding the policy file, else the project's model_repository)")
    check.add_argument("--model-config-name", default="embedded",
                       help="configuration whose version_policy counts (default: %(default)s; '' for config.pbtxt)")
    check.add_argument("--write-labels", action="store_true",
                       help="write the policy's output labels to labels.txt beside it (the router's label file)")
    show = sub.add_parser("show", help="print the policy a running router uses")
    show.add_argument("--url", default=None, help="host:port (default 127.0.0.1:8000 http, :8001 grpc)")
    show.add_argument("--model", default="router")
    show.add_argument("--protocol", choices=("http", "grpc"), default="http")
    show.add_argument("--json", action="store_true", help="print the policy document as JSON instead of the graph")


def step_errors(policy: "P.PipelinePolicy", repo: Path, config_name: Optional[str] = "embedded") -> List[str]:
    """What Triton would refuse at a pipeline's first request, per step (located
    ``pipeline.steps[1]...``): a pinned version its model does not serve, an ``inputs`` or
    ``outputs`` key that is not one of the model's inputs or outputs, a ``model_dims`` that
    is not the model's ``max_batch_size`` and input dims (steps whose model is not in
    ``repo`` are left to :func:`check_pipeline`'s own message)."""
    errors = []
    for step in policy.pipeline.step_nodes():
        model_dir = repo / step.model
        path = config_path(model_dir, config_name) if model_dir.is_dir() else None
        if path is None:
            continue
        try:
            config = read_config(path)
        except ConfigError as exc:
            errors.append(f"{step.where}.model: {exc}")
            continue
        if step.version >= 0 and step.version not in served_versions(model_dir, config):
            errors.append(f"{step.where}.version: version {step.version} of '{step.model}' is not served from "
                          f"{model_dir} (served by its version_policy: "
                          f"{', '.join(map(str, served_versions(model_dir, config))) or 'none'})")
        names = {"inputs": {t.name for t in config.input}, "outputs": {t.name for t in config.output}}
        for key, pairs in (("inputs", step.inputs), ("outputs", step.outputs)):
            errors += [f"{step.where}.{key}.{name}: '{step.model}' has no {key[:-1]} '{name}' ({path})"
                       for name, _ in pairs if name not in names[key]]
        if step.model_dims is not None:
            dims = {t.name: tuple(int(d) for d in t.dims) for t in config.input}
            if step.model_dims.max_batch_size != config.max_batch_size:
                errors.append(f"{step.where}.model_dims.max_batch_size: {step.model_dims.max_batch_size}, but "
                              f"'{step.model}' has max_batch_size {config.max_batch_size} ({path})")
            errors += [f"{step.where}.model_dims.inputs.{name}: {list(d)}, but '{step.model}' input '{name}' has dims "
                       f"{list(dims[name])} ({path})" for name, d in step.model_dims.inputs if name in dims and dims[name] != d]
    return errors


def check_pipeline(path: Path, args) -> int:
    """``orchestrator policy check`` of a pipeline policy: parsed, and with the router's config
    beside it (or ``--repo``), checked against it as the router checks it at load; every step's
    model must be in the repository."""
    from google.protobuf.json_format import MessageToDict

    from orchestrator.runtime.routing.pipeline_plan import bind_pipeline, describe_pipeline
    from orchestrator.runtime.routing.tensors import router_spec
    from orchestrator.tooling.repository import config_path, read_config

    try:
        policy = P.load_any(path)
    except P.PolicyError as exc:
        print(f"invalid policy: {exc}", file=sys.stderr)
        return 1
    assert isinstance(policy, P.PipelinePolicy)
    print(describe_pipeline(policy.pipeline))
    config_name = getattr(args, "model_config_name", "embedded") or None
    router_config = config_path(path.resolve().parent, config_name) if _beside_a_model(path) else None
    errors = []
    if router_config is not None:
        try:
            config = MessageToDict(read_config(router_config), preserving_proto_field_name=True)
            bind_pipeline(policy.pipeline, router_spec(config))
            print(f"the pipeline fits the router's config {router_config}")
        except (P.PolicyError, ToolingError) as exc:
            errors.append(str(exc))
    if getattr(args, "repo", None) or router_config is not None:
        repo = _repository_for(path, getattr(args, "repo", None))
        named = dict.fromkeys(m for s in policy.pipeline.step_nodes() for m in (s.model, *s.fallback))
        missing = [m for m in named if config_path(repo / m, config_name) is None]
        errors += [f"model '{m}' is not in the model repository {repo}" for m in missing]
        if not missing:
            print(f"models {', '.join(policy.models())} are in {repo}")
        errors += step_errors(policy, repo, config_name) + repository_errors(repo)
    return report_policy_errors(args.path, errors)


def _is_pipeline_file(path: Path) -> bool:
    try:
        return P.is_pipeline(P.read_document(path))
    except P.PolicyError:
        return False  # reported by the text policy's check, as before


def check_command(args) -> int:
    """``orchestrator policy check``: 0 when valid, 1 with located errors on stderr."""
    path = Path(args.path)
    try:
        policy = P.load_policy(path)
    except P.PolicyError as exc:
        print(f"invalid policy: {exc}", file=sys.stderr)
        return 1
    print(P.describe(policy))
    config_name = getattr(args, "model_config_name", "embedded") or None
    repo = _repository_for(path, getattr(args, "repo", None))
    errors = []
    if any(n.version is not None for n in policy.model_nodes()):
        errors += version_errors(policy, repo, config_name)
        if not errors:
            print(f"pinned model versions are served from {repo}")
    router_dir = path.resolve().parent if _beside_a_model(path) else None
    write = getattr(args, "write_labels", False)
    if getattr(args, "repo", None) or router_dir is not None or write:
        plan, bind_errors = bind_repository(policy, repo, config_name)
        errors += [e for e in bind_errors if e not in errors]
        if plan is not None:
            head = plan.head
            models = sorted({n.model for n in policy.model_nodes()})
            print(f"models {', '.join(models)} are in {repo}; every answer: {head.describe()}")
            labels_path = path.resolve().parent / LABEL_FILE
            have = read_labels(labels_path)
            if write:
                print(f"wrote {write_label_file(labels_path.parent, head)}: {', '.join(head.output_labels())}")
            elif have is not None and have != list(head.output_labels()):
                errors.append(f"{labels_path} lists {have}, but the policy answers {list(head.output_labels())}; "
                              f"run `orchestrator policy check {args.path} --repo {repo} --write-labels`")
            elif have is None and router_dir is not None and _labels_declared(router_dir, config_name):
                errors.append(f"{labels_path} does not exist (its config's label_filename); "
                              f"run `orchestrator policy check {args.path} --repo {repo} --write-labels`")
    if getattr(args, "repo", None) or router_dir is not None:
        errors += repository_errors(repo)
    return report_policy_errors(args.path, errors)


def policy_command(args) -> int:
    if args.policy_command == "check":
        return check_pipeline(Path(args.path), args) if _is_pipeline_file(Path(args.path)) else check_command(args)
    from tritonclient.utils import InferenceServerException

    from orchestrator.tooling.client import DEFAULT_URLS

    try:
        document = fetch_policy(args.url or DEFAULT_URLS[args.protocol], args.model, args.protocol)
    except (InferenceServerException, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    policy = P.parse_any(document)
    if isinstance(policy, P.PipelinePolicy):
        from orchestrator.runtime.routing.pipeline_plan import describe_pipeline

        print(describe_pipeline(policy.pipeline))
    else:
        print(P.describe(policy))
    return 0
