"""The ``orchestrator`` command line: every user-facing tool is one of its verbs.

``pip install triton-orchestrator`` (the distribution's name; the import package and the
command are ``orchestrator``) brings the runtime (numpy, PyYAML, tokenizers); each verb's
other packages come with an extra (pyproject.toml, ``[project.optional-dependencies]``).
A verb whose extra is missing says which one to install, in one line, and exits 2.
"""

# Only the console script imports this module; the command modules share helpers through
# orchestrator.tooling.cliutil, so none of them imports cli (no import circle).

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Callable, Dict, List, Optional, Tuple

from orchestrator.tooling.client import request_parameter
from orchestrator.tooling.cliutil import add_subcommand

#: The extra each verb needs beyond the base install.
VERB_EXTRA: Dict[str, str] = {
    "serve": "serve",
    "classify": "client",
    "policy": "client",
    "deploy": "client",
    "frontdoor": "client",
    "migrate": "client",
    "env": "env",
    "stub": "env",
    "doctor": "env",
    "export": "export",
    "parity": "export",
    "warmup": "export",
    "calibrate": "tune",
    "tune": "tune",
}

#: The top-level modules each extra brings (``grpc`` and ``google.protobuf`` come with
#: ``tritonclient[grpc]``, ``huggingface_hub`` and ``safetensors`` with transformers).
EXTRA_MODULES: Dict[str, frozenset] = {
    "client": frozenset({"tritonclient", "grpc", "google"}),
    "serve": frozenset({"pytriton", "tritonclient", "grpc", "google", "prometheus_client", "rich"}),
    "env": frozenset({"venv_pack", "conda_pack", "pytriton", "tritonclient", "grpc", "google", "rich"}),
    "export": frozenset({"transformers", "huggingface_hub", "safetensors", "torch", "onnx", "onnxruntime",
                         "tritonclient", "grpc", "google", "rich", "matplotlib"}),
    "tune": frozenset({"scipy", "matplotlib", "onnxruntime", "tritonclient", "grpc", "google", "rich"}),
}

#: Exit status of a verb whose extra is not installed (as for a usage error).
MISSING_EXTRA = 2


def missing_extra(verb: str, exc: ModuleNotFoundError) -> Optional[str]:
    """The extra that brings the module ``exc`` could not find, for ``verb``: the verb's own
    extra when it holds that module, else the first other extra that does; None when no
    extra brings it (a bug, not an install to suggest)."""
    top = (exc.name or "").split(".")[0]
    own = VERB_EXTRA.get(verb)
    if own is not None and top in EXTRA_MODULES[own]:
        return own
    for extra, modules in EXTRA_MODULES.items():
        if top in modules:
            return extra
    return None


def missing_extra_message(verb: str, extra: str) -> str:
    """The one line printed when ``verb`` needs ``extra``."""
    return f"error: orchestrator {verb} needs the '{extra}' extra: pip install 'triton-orchestrator[{extra}]'"


def _classify(args) -> int:
    from tritonclient.utils import InferenceServerException

    from orchestrator.tooling.client import ServerUnavailable, classify, format_prediction

    try:
        predictions = classify(args.texts, model=args.model, url=args.url, protocol=args.protocol, threshold=args.threshold,
                               parameters=dict(args.param) or None)
    except ServerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except InferenceServerException as exc:
        print(f"error: {args.model}: {exc.message() if hasattr(exc, 'message') else exc}", file=sys.stderr)
        return 1
    for pred in predictions:
        print(format_prediction(pred))
    return 0


def _add_classify_arguments(cls: argparse.ArgumentParser) -> argparse.ArgumentParser:
    cls.add_argument("texts", nargs="+", help="texts to classify (one line of output each)")
    cls.add_argument("--model", default="router", help="router (default), ensemble or NAME_ensemble")
    cls.add_argument("--url", default=None, help="host:port (default 127.0.0.1:8000 http, :8001 grpc)")
    cls.add_argument("--protocol", choices=("http", "grpc"), default="http")
    cls.add_argument("--threshold", type=float, default=0.5, help="decision threshold in [0, 1]")
    cls.add_argument("--param", action="append", default=[], type=request_parameter, metavar="KEY=VALUE",
                     help="request parameter (repeatable), e.g. route=fast; true/false, numbers typed")
    return cls


# (verb, help, module, its add-arguments function, its command function), in --help order
VERBS: Tuple[Tuple[str, str, str, str, str], ...] = (
    ("serve", "run the embedded Triton server on the model repository", "orchestrator.tooling.serve", "add_serve_arguments",
     "serve_command"),
    ("classify", "classify texts through a running server", __name__, "_add_classify_arguments", "_classify"),
    ("policy", "check a routing policy file, or show the one a router runs", "orchestrator.tooling.policy_cli",
     "add_policy_arguments", "policy_command"),
    ("env", "build, verify and install the models' execution environment", "orchestrator.tooling.env.commands",
     "add_env_arguments", "env_command"),
    ("stub", "Python-backend stub for another Python version", "orchestrator.tooling.env.commands", "add_stub_arguments",
     "stub_command"),
    ("doctor", "check each Python model's env, stub and libpython", "orchestrator.tooling.env.doctor", "add_doctor_arguments",
     "doctor_command"),
    ("export", "export a Hugging Face classifier (and an fp16 variant) into the model repository",
     "orchestrator.tooling.modeling.export", "add_export_arguments", "export_command"),
    ("parity", "compare candidate classifiers with a reference: logits, thresholds, flips, recommendation",
     "orchestrator.tooling.modeling.parity", "add_parity_arguments", "parity_command"),
    ("calibrate", "fit temperature scaling of a classifier on labeled texts (head.json calibration)",
     "orchestrator.tooling.modeling.parity.calibration", "add_calibrate_arguments", "calibrate_command"),
    ("tune", "choose a policy's cascade margins and chunk stop_margin from labeled texts (curves, tuned policy)",
     "orchestrator.tooling.tune", "add_tune_arguments", "tune_command"),
    ("warmup", "write the warmup sample files of every model of a repository whose config has one",
     "orchestrator.tooling.warmup", "add_warmup_arguments", "warmup_command"),
    ("deploy", "deployment: LOAD_MODELS, offline checks of deploy/, the validators, the image's lock and SBOM",
     "orchestrator.tooling.deploy", "add_deploy_arguments", "deploy_command"),
    ("frontdoor", "the front door (nginx): render its configuration, check the committed one",
     "orchestrator.tooling.frontdoor", "add_frontdoor_arguments", "frontdoor_command"),
    ("migrate", "make an ensemble a router model: checked as Triton checks it, its steps in a pipeline policy",
     "orchestrator.tooling.migrate", "add_migrate_arguments", "migrate_command"),
)


def _add_verb(sub, verb: str, help: str, module: str, adder: str, command: str) -> None:
    """Add ``verb`` from ``module``; where importing it needs a missing extra, a verb that
    takes any arguments and says which extra to install (so ``--help`` and the other verbs
    still work on the base install)."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        extra = missing_extra(verb, exc)
        if extra is None:
            raise
        parser = sub.add_parser(verb, help=f"{help} (needs the '{extra}' extra)")
        parser.set_defaults(func=_needs(verb, extra), missing_extra=extra)
        return
    add_subcommand(sub, verb, help, getattr(mod, adder), getattr(mod, command))


def _needs(verb: str, extra: str) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        print(missing_extra_message(verb, extra), file=sys.stderr)
        return MISSING_EXTRA

    return command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in VERBS:
        _add_verb(sub, *verb)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the parsed verb; a module of a missing extra is one line on stderr and exit 2."""
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        extra = missing_extra(args.command, exc)
        if extra is None:
            raise
        print(missing_extra_message(args.command, extra), file=sys.stderr)
        return MISSING_EXTRA


def main(argv: Optional[List[str]] = None) -> int:
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown and getattr(args, "missing_extra", None) is None:
            parser.parse_args(argv)  # argparse's own message for the arguments it does not know; exits 2
        code = run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`orchestrator policy check ... | head`): nothing more to say.
        # stdout goes to /dev/null so the interpreter's flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command a pipe closed
    return code


if __name__ == "__main__":
    sys.exit(main())
