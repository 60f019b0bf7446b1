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
import os
import pkgutil
import signal
import sys

from coclr.cli._options import given_once
from coclr.cli._status import (
    EXIT_CODES,
    EXIT_DONE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_PIPE,
    EXIT_SOME_FAILED,
    EXIT_TERMINATED,
    job_status,
)
from coclr.cli._world import TORCHRUN_COMMANDS, run_command, tell_the_others
from coclr.config import refuse_repeated
from coclr.errors import CoclrError, ConfigError
from coclr.interrupts import interrupted, stop_with_launcher
from coclr.text import ERRORS, shown
from coclr.threads import apply_process_policy
from coclr.version import __version__

apply_process_policy()  # before any subcommand imports torch: OpenMP and torch's allocator read it once

__all__ = ["EXIT_CODES", "EXIT_DONE", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_PIPE", "EXIT_SOME_FAILED",
           "EXIT_TERMINATED", "build_parser", "job_status", "main"]

def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand found in this package."""
    parser = argparse.ArgumentParser(
        prog="coclr",
        description="Self-supervised co-training for video representation learning (CoCLR).",
        epilog=EXIT_CODES,
    )
    parser.add_argument("--version", action=_Version,
                        help="print coclr's version and those of Python and the libraries it runs on, then exit")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    _add_epilog(parser, EXIT_CODES)
    given_once(parser)
    return parser


def version_line() -> str:
    """``coclr X (Python Y; torch Z, ...)``: what a bug report needs, from the installed packages' metadata
    (importing torch would make ``coclr --help`` slow)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    def installed(*names: str) -> str:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                continue
        return "not installed"

    opencv = installed("opencv-contrib-python-headless", "opencv-contrib-python", "opencv-python-headless",
                       "opencv-python")
    return (f"coclr {__version__} (Python {sys.version.split()[0]}; torch {installed('torch')}, PyAV "
            f"{installed('av')}, OpenCV {opencv}, NumPy {installed('numpy')})")


class _Version(argparse.Action):
    """``--version``: :func:`version_line` on a line of its own (argparse's own action wraps it), then exit 0."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        try:
            print(version_line(), flush=True)
        except BrokenPipeError:  # (``coclr --version | head -c0``: a traceback, status 1)
            parser.exit(_reader_gone())
        parser.exit()


def _add_epilog(parser: argparse.ArgumentParser, text: str) -> None:
    """Append ``text`` to the ``--help`` of ``parser`` and of every subcommand under it."""
    if text not in (parser.epilog or ""):
        parser.epilog = f"{parser.epilog}\n\n{text}" if parser.epilog else text
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _add_epilog(child, text)


def main(argv: list[str] | None = None) -> int:
    """Run the ``coclr`` command line; returns the process exit status. As the program (``argv`` None: the
    ``coclr`` script, ``python -m coclr``), once interrupted it ignores further SIGINT and SIGTERM while it exits
    (a second Ctrl-C printed a traceback from the interpreter's exit handlers after the one-line stop)."""
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors=ERRORS)  # a file name that is not UTF-8, printed as its own bytes
    try:
        parser = build_parser()  # (the subcommands' imports: a second or two)
    except KeyboardInterrupt:
        _exiting(argv)
        _say("coclr: interrupted (SIGINT) while starting; nothing was done")
        return EXIT_INTERRUPTED
    try:
        args = _parse(parser, argv)
    except SystemExit as stop:  # (argparse said why)
        _refused_line(stop, next((token for token in (sys.argv[1:] if argv is None else argv)
                                  if not token.startswith("-")), ""))
        raise
    try:
        refuse_repeated(getattr(args, "overrides", None) or [])
        _check_launcher(args.command)
        status = run_command(args)
        sys.stdout.flush()  # here, where a reader that went away is caught, not at the interpreter's exit
    except SystemExit as stop:  # (a command that parses the rest of its line itself: coclr flow)
        _refused_line(stop, args.command)
        raise
    except BrokenPipeError:
        return _reader_gone()
    except CoclrError as error:
        _close_progress_bars()
        if getattr(error, "said", True):  # (a refusal of another torchrun process: said once on each machine)
            _say(f"coclr {args.command}: error: {shown(error, newlines=error.lines)}")  # (a file named with a
            # newline broke a one-line refusal in two)
        tell_the_others(args.command, str(error))
        return EXIT_ERROR
    except KeyboardInterrupt as error:  # SIGINT or SIGTERM (run_command): the work stopped, what it finished kept
        _exiting(argv)
        stopped = interrupted(error, "what was finished is kept")
        _close_progress_bars()
        again = ("the same command without --restart (which would start over)" if getattr(args, "restart", False)
                 else "the same command")
        _say(f"coclr {args.command}: interrupted ({stopped.signal_name}); {stopped.kept}; run {again} to continue")
        return stopped.exit_status
    return int(status or EXIT_DONE)


def _refused_line(stop: SystemExit, command: str) -> None:
    """A command line argparse refused (``stop``, not ``--help``'s exit 0): under torchrun, the job's other processes
    are told (:func:`~coclr.cli._world.tell_the_others`), which otherwise waited for this one in their group."""
    if stop.code not in (None, 0):
        tell_the_others(command, "its command line was refused (that process's output says why)")


def _check_launcher(command: str) -> None:
    """Under torchrun: refuse a command that does not share its work (:data:`TORCHRUN_COMMANDS`), and have every
    process stop with its launcher (:func:`coclr.interrupts.stop_with_launcher`). Nothing outside torchrun."""
    if "WORLD_SIZE" not in os.environ:
        return
    from coclr.distributed import launched_world_size  # noqa: PLC0415 (heavy: torch)

    if launched_world_size() <= 1:
        return
    if command not in TORCHRUN_COMMANDS:
        raise ConfigError(f"runs as one process, not under torchrun (WORLD_SIZE={os.environ['WORLD_SIZE']}): run "
                          f"`coclr {command}` without torchrun; torchrun runs {', '.join(TORCHRUN_COMMANDS[:-1])}")
    stop_with_launcher()


def _exiting(argv: list[str] | None) -> None:
    """After an interruption of the program (``argv`` None, :func:`main`): SIGINT and SIGTERM ignored from here to
    its exit; a library caller's handlers are left as they are."""
    if argv is None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _home_expanded(argv: list[str]) -> list[str]:
    """``argv`` with a home-relative value of a ``--flag=~/path`` token expanded, as the shell expands ``--flag
    ~/path`` (it leaves a ``~`` after ``=`` as typed, which made a folder named "~" here; ``key=~/x`` overrides are
    expanded by :mod:`coclr.config`)."""
    out = []
    for token in argv:
        flag, sep, value = token.partition("=")
        if token.startswith("--") and sep and (value == "~" or value.startswith("~/")):
            token = f"{flag}={os.path.expanduser(value)}"
        out.append(token)
    return out


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments, ``key=value`` overrides taken wherever they stand (``pretrain run.out=R --restart
    optim.lr=0.1``: argparse gives the positional overrides one place); anything else unknown is the chosen
    subcommand's error, with its own usage."""
    args, rest = parser.parse_known_args(_home_expanded(sys.argv[1:] if argv is None else argv))
    if not rest:
        return args
    chosen = parser
    while True:  # the deepest subcommand chosen (``data synth``, ``eval linear``)
        action = next((a for a in chosen._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, action.dest, None) if action is not None else None
        if name not in (action.choices if action is not None else {}):
            break
        chosen = action.choices[name]
    overrides = getattr(args, "overrides", None)
    if isinstance(overrides, list) and all("=" in token and not token.startswith("-") for token in rest):
        args.overrides = [*overrides, *rest]
        return args
    chosen.error(f"unrecognized arguments: {' '.join(rest)}")
    raise AssertionError("unreachable")  # (error exits)


def _say(line: str) -> None:
    """Print a command's last ``line`` on the standard error; where its reader went away (``2>&1 | head``), nothing:
    the exit status still says how the command ended (a refusal is 2, not a traceback's 1)."""
    try:  # (one write: the processes of a torchrun job that refuse at once interleaved a line and its newline)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # no second error as the interpreter flushes it at exit
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)


def _reader_gone() -> int:
    """The standard output's reader went away (``| head``): what is left to print goes nowhere (no second error as
    the interpreter flushes it at exit), and the command ends with the shell's status of SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE


def _close_progress_bars() -> None:
    """Close the progress bars a stopped command left open, so that its one line is a line of its own (not the end
    of a bar's line, nor erased by a bar closed later). A bar the signal stopped half made (tqdm lists it before it
    has a position) is left as it is: closing it raised, and the stop became a traceback."""
    module = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(module, "tqdm", None), "_instances", ())):
        if hasattr(bar, "pos"):
            bar.close()
