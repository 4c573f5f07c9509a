"""Helpers the command-line modules share (``orchestrator`` subcommands and the modules'
own ``python -m`` entry points).

It imports nothing of this project, so a command module can use it without importing
:mod:`orchestrator.tooling.cli`: only the console script imports ``cli``, and ``cli``
imports the command modules, never the reverse (no import circle).
"""

from __future__ import annotations

import argparse
from typing import Callable, List, Optional

__all__ = ["add_subcommand", "comma_list"]


def add_subcommand(
    sub,
    name: str,
    help: str,
    add_arguments: Callable[[argparse.ArgumentParser], object],
    command: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` to ``sub`` (an ``add_subparsers()`` result): its options from
    ``add_arguments(parser)``, run by ``command(args) -> int`` (``args.func``). Returns its parser."""
    parser = sub.add_parser(name, help=help)
    add_arguments(parser)
    parser.set_defaults(func=command)
    return parser


def comma_list(value: Optional[str]) -> Optional[List[str]]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; None for None or an empty string (an option's
    "all of them")."""
    if not value:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]
