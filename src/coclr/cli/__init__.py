"""The ``coclr`` command.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``, which adds
its parser and sets ``func`` to the function that runs it. Modules import heavy dependencies (torch, PyAV)
inside that function, so ``coclr --help`` stays fast. Importing this package sets OpenMP's wait policy
(:func:`coclr.threads.apply_openmp_policy`) before any subcommand imports torch, for every entry point.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from coclr.cli._world import run_command
from coclr.errors import CoclrError
from coclr.threads import apply_openmp_policy

apply_openmp_policy()  # before any subcommand imports torch: OpenMP reads it once, when torch loads it


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand found in this package."""
    parser = argparse.ArgumentParser(
        prog="coclr",
        description="Self-supervised co-training for video representation learning (CoCLR).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``coclr`` command line; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = run_command(args)
    except CoclrError as error:
        print(f"coclr {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"coclr {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)
