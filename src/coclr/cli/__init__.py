"""The ``coclr`` command.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``, which adds
its parser and sets ``func`` to the function that runs it. Modules import heavy dependencies (torch, PyAV)
inside that function, so ``coclr --help`` stays fast. Importing this package sets OpenMP's wait policy and
PyTorch's huge-page allocations (:func:`coclr.threads.apply_process_policy`) before any subcommand imports torch,
for every entry point.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from coclr.cli._world import run_command
from coclr.errors import CoclrError
from coclr.interrupts import interrupted
from coclr.threads import apply_process_policy

apply_process_policy()  # before any subcommand imports torch: OpenMP and torch's allocator read it once

EXIT_DONE = 0
"""Every input done (or nothing left to do)."""
EXIT_ERROR = 2
"""Refused or stopped by an error, named in one line on stderr (bad option, input, checkpoint, folder, disk):
argparse's status for a bad command line, kept for every error the command reports itself."""
EXIT_SOME_FAILED = 3
"""A per-input job (``embed``, ``data store``, ``flow`` ...) that went through all its inputs, some of which
failed: they are listed, recorded for the next run, and the rest is done."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT): stopped within seconds, what was finished kept, one line saying what; the same command
continues where it stopped (:mod:`coclr.interrupts`)."""
EXIT_TERMINATED = 143
"""SIGTERM (``kill``, ``timeout``, a batch scheduler): as Ctrl-C, with the shell's status of SIGTERM."""
EXIT_CODES = (f"exit status: {EXIT_DONE} all done; {EXIT_SOME_FAILED} finished, but some inputs failed (each "
              f"listed with its reason); {EXIT_ERROR} refused or stopped by an error (one line on stderr); "
              f"{EXIT_INTERRUPTED} interrupted (Ctrl-C), {EXIT_TERMINATED} stopped by SIGTERM (what was done is kept: "
              "run the same command to continue); 1 an unexpected error (a traceback: please report it)")
"""The one exit-status rule of every command, shown at the end of every ``--help``."""


def job_status(failed: int) -> int:
    """The exit status of a per-input job that went through all its inputs, ``failed`` of which failed."""
    return EXIT_SOME_FAILED if failed else EXIT_DONE


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand found in this package."""
    parser = argparse.ArgumentParser(
        prog="coclr",
        description="Self-supervised co-training for video representation learning (CoCLR).",
        epilog=EXIT_CODES,
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    _add_epilog(parser, EXIT_CODES)
    return parser


def _add_epilog(parser: argparse.ArgumentParser, text: str) -> None:
    """Append ``text`` to the ``--help`` of ``parser`` and of every subcommand under it."""
    if text not in (parser.epilog or ""):
        parser.epilog = f"{parser.epilog}\n\n{text}" if parser.epilog else text
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _add_epilog(child, text)


def main(argv: list[str] | None = None) -> int:
    """Run the ``coclr`` command line; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = run_command(args)
    except CoclrError as error:
        _close_progress_bars()
        print(f"coclr {args.command}: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as error:  # SIGINT or SIGTERM (run_command): the work stopped, what it finished kept
        stopped = interrupted(error, "what was finished is kept")
        _close_progress_bars()
        print(f"coclr {args.command}: interrupted ({stopped.signal_name}); {stopped.kept}; run the same command to "
              "continue", file=sys.stderr)
        return stopped.exit_status
    return int(status or EXIT_DONE)


def _close_progress_bars() -> None:
    """Close the progress bars a stopped command left open, so that its one line is a line of its own (not the end
    of a bar's line, nor erased by a bar closed later)."""
    module = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(module, "tqdm", None), "_instances", ())):
        bar.close()
