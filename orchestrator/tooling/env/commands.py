"""The command line of the env package: ``orchestrator env build|install|verify`` and
``orchestrator stub`` (what ``make env`` and ``make stub`` run; also ``python -m
orchestrator.tooling.env env ...|stub ...``). Each command returns 0, or 1 with the error on stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from orchestrator.tooling.cliutil import add_subcommand, comma_list
from orchestrator.tooling.env.build import build_env
from orchestrator.tooling.env.common import (
    DEFAULT_ENV_OUTPUT,
    EMBEDDED_TRITON_RELEASE,
    ENV_CONFIG_NAME,
    STUB_BUILD_SCRIPT,
    STUB_OUT_DIR,
    parse_version,
    version_text,
)
from orchestrator.tooling.env.install import InstalledModel, install_env
from orchestrator.tooling.env.stubs import dispatcher_target, prepare_stub
from orchestrator.tooling.env.verify import verify_env
from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.paths import PROJECT_ROOT

__all__ = ["add_env_arguments", "env_command", "add_stub_arguments", "stub_command", "main"]


def add_env_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``orchestrator env`` subcommands (``build``, ``install``, ``verify``) to ``parser``."""
    sub = parser.add_subparsers(dest="env_command", required=True)
    build = sub.add_parser("build", help="build, pack and verify the models' execution environment")
    build.add_argument("--python", default=None, help="Python version of the env, e.g. 3.12 (default: this interpreter's)")
    build.add_argument("--target", default="cpu", help="cpu or gpu: env/requirements-<target>.txt (default: %(default)s)")
    build.add_argument("--tool", choices=("auto", "conda", "venv"), default="auto", help="conda-pack or venv-pack (default: conda where installed)")
    build.add_argument("--output", default=None, help=f"the .tar.gz (default: {DEFAULT_ENV_OUTPUT.relative_to(PROJECT_ROOT)})")
    build.add_argument("--no-verify", action="store_true", help="skip the verification of the packed env")
    build.add_argument("--install", metavar="REPO", default=None, help="then install it into REPO's Python models (env install)")
    verify = sub.add_parser("verify", help="check a packed env against the stub that will run it")
    verify.add_argument("tarball", nargs="?", default=None, help="the env (.tar.gz or directory)")
    verify.add_argument("--stub", default=None, help="the stub that will run it (default: the embedded server's for its Python)")
    verify.add_argument("--import", dest="imports", action="append", default=None, metavar="MODULE", help="module to import (repeatable)")
    install = sub.add_parser("install", help="copy the env (and a matching stub) into model directories, write configs/env.pbtxt")
    for p in (install, build):
        p.add_argument("--models", default=None, help="comma-separated model names (default: every Python model)")
        p.add_argument("--server-python", default=None, help="the server stub's Python version (default: this interpreter's)")
        p.add_argument("--stub", default=None, help="stub to place when the versions differ (default: stub_build/out or the wheel's)")
        p.add_argument("--triton", default=EMBEDDED_TRITON_RELEASE, help="the server's release branch (default: %(default)s, the embedded server)")
    install.add_argument("--repo", default="model_repository", help="model repository (default: %(default)s)")
    install.add_argument("--tarball", default=None, help=f"the env (default: {DEFAULT_ENV_OUTPUT.relative_to(PROJECT_ROOT)})")
    install.add_argument("--base-config-name", default="embedded", help="config to copy: configs/NAME.pbtxt, else config.pbtxt (default: %(default)s)")
    install.add_argument("--config-name", default=ENV_CONFIG_NAME, help="name of the written variant (default: %(default)s)")
    install.add_argument("--copy", action="store_true", help="copy the tarball instead of hard-linking it")
    install.add_argument(
        "--plain-stub",
        action="store_true",
        help="place the stub binary itself, not the dispatcher (the model then loads only with the env config)",
    )
    return parser


def _print_installed(results: Sequence[InstalledModel], repo: Path, config_name: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"execution env installed in {repo}")
    for col in ("model", "config", "tarball", "stub"):
        table.add_column(col)
    for r in results:
        if r.stub is None:
            stub = "server's"
        else:
            target = dispatcher_target(r.stub)
            stub = f"dispatcher -> {target[1].name}" if target else r.stub.name
        table.add_row(r.name, r.config.relative_to(r.config.parent.parent).as_posix(), f"{r.tarball.name} ({r.how})", stub)
    console = Console()
    console.print(table)
    console.print(f"Start the server with --model-config-name={config_name} to use it (orchestrator doctor --config-name {config_name} checks it).")


def env_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator env ...``; returns 0, or 1 with the error on stderr."""
    models = comma_list(getattr(args, "models", None))
    try:
        if args.env_command == "build":
            built = build_env(args.python, args.target, output=args.output, tool=args.tool, verify=not args.no_verify, stub=args.stub)
            if args.install:
                results = install_env(
                    args.install, models, tarball=built.path, stub=args.stub, server_python=args.server_python, triton=args.triton
                )
                _print_installed(results, Path(args.install), ENV_CONFIG_NAME)
        elif args.env_command == "install":
            results = install_env(
                args.repo,
                models,
                tarball=args.tarball,
                stub=args.stub,
                server_python=args.server_python,
                base_config_name=args.base_config_name or None,
                config_name=args.config_name,
                link=not args.copy,
                triton=args.triton,
                dispatch=not args.plain_stub,
            )
            _print_installed(results, Path(args.repo), args.config_name)
        elif args.env_command == "verify":
            report = verify_env(args.tarball or DEFAULT_ENV_OUTPUT, stub=args.stub, imports=args.imports, raise_on_problems=False)
            print(f"env Python {report.python} ({report.executable}), numpy {report.numpy}, stub {report.stub.path if report.stub else '-'}")
            for name, error in report.imports.items():
                print(f"  import {name}: {'ok' if error is None else error}")
            for problem in report.problems:
                print(f"problem: {problem}", file=sys.stderr)
            return 1 if report.problems else 0
    except ToolingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def add_stub_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator stub`` options to ``parser``."""
    parser.add_argument("--python", required=True, help="Python version the stub must embed, e.g. 3.12")
    parser.add_argument(
        "--triton",
        default=None,
        help=f"server release branch, e.g. r24.10 (default: the embedded server's, {EMBEDDED_TRITON_RELEASE}: "
        "its prebuilt stub, offline); another release is built with Docker (stub_build/build.sh)",
    )
    parser.add_argument("--out", default=None, help=f"output root (default: {STUB_OUT_DIR.relative_to(PROJECT_ROOT)})")
    return parser


def stub_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator stub``: the embedded server's stub for ``--python`` into
    ``<out>/<3.x>/`` with the ldd check, or ``stub_build/build.sh`` for another release.
    Returns 0, or the failure's exit status with the message on stderr."""
    triton = args.triton or EMBEDDED_TRITON_RELEASE
    try:
        version = parse_version(args.python)
        if args.triton and args.triton != "embedded":
            cmd = ["bash", str(STUB_BUILD_SCRIPT), version_text(version), triton]
            if args.out:
                cmd.append(str(args.out))
            return subprocess.call(cmd)
        path = prepare_stub(version, args.out)
    except ToolingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    manifest = json.loads((path.parent / "stub.json").read_text())
    print(f"stub: {path}")
    print(f"  ldd: {manifest['libpython']} => {manifest['ldd_libpython'] or 'not found on this machine (an env lib/ provides it at run time)'}")
    if manifest["numpy2_support"] is False:
        print("  built with pybind11 < 2.12: numpy<2 only in the env it runs (orchestrator doctor explains)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.tooling.env env ...|stub ...``: the same as ``orchestrator env|stub ...``."""
    parser = argparse.ArgumentParser(
        prog="orchestrator", description="Execution environments (EXECUTION_ENV_PATH) and Python-backend stubs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommand(sub, "env", "execution environments", add_env_arguments, env_command)
    add_subcommand(sub, "stub", "Python-backend stubs", add_stub_arguments, stub_command)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
