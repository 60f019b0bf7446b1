"""Errors of the world (disk full, file too large, a path that is a folder or cannot be created): one line naming the
path and what to do, never a traceback; SIGINT and SIGTERM stop the command as Ctrl-C does
(:func:`coclr.interrupts.signals_interrupt`). :func:`run_command` is what :func:`coclr.cli.main` runs a command
through."""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable

from coclr import progress
from coclr.errors import out_of_memory
from coclr.interrupts import signals_interrupt
from coclr.text import shown

TORCHRUN_COMMANDS = ("embed", "flow", "learn", "pipeline", "pretrain", "task")
"""The commands that share their work among the processes torchrun starts (``task``: a study's or learn's job,
which is one of them); any other, run by each process whole, raced them on one folder (one refused by its sibling's
lock, or the result written once per process): refused under torchrun before any work."""

WORLD_ERRORS = {
    errno.ENOSPC: "the disk is full: free space there (or write elsewhere), then rerun the same command",
    errno.EDQUOT: "the disk quota is used up: free space there (or write elsewhere), then rerun the same command",
    errno.EFBIG: "a file grew past what the file system or the file size limit (ulimit -f) allows: write to "
                 "another file system or raise the limit, then rerun the same command",
    errno.EISDIR: "this is a folder, where a file is needed: give a file path",
    errno.ENOTDIR: "a part of this path is a file, where a folder is needed: give another path",
    errno.EEXIST: "this exists and is not a folder: give another path",
    errno.EACCES: "permission denied: give a path you may read (or write, for an output), or change its permissions",
    errno.EPERM: "operation not permitted: give a path you may read (or write, for an output), or change its "
                 "permissions",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.ENAMETOOLONG: "the path is too long: give a shorter one",
    errno.ENOENT: "no such file or folder, and none can be made there: give another path",
    errno.EMFILE: "too many open files for this process: raise the limit (ulimit -n) or give fewer workers, then "
                  "rerun the same command",
    errno.ENFILE: "too many open files on this machine: close some programs or give fewer workers, then rerun the "
                  "same command",
}
"""The errors of the world (``OSError`` errnos) that :func:`main` turns into one line naming the path, and what to
do. Every write of the library is atomic (:mod:`coclr.atomic`), so after one of them the folders hold what they held
before the failed write, and the same command run again continues."""

WORLD_ERROR_STATUS = 2
"""Exit status after an error of the world: that of every error a command reports in one line (bad input, a
:class:`~coclr.errors.CoclrError`, too); 1 stays the status of an unexpected error (a traceback)."""


def world_error_line(error: OSError) -> str | None:
    """One line for an error of the world (:data:`WORLD_ERRORS`), naming the path; None for any other error."""
    if error.errno not in WORLD_ERRORS:
        return None
    paths = [str(path) for path in (error.filename, error.filename2) if path is not None]
    where = " -> ".join(paths) + ": " if paths else ""
    dangling = next((path for path in paths if os.path.islink(path) and not os.path.exists(path)), None)
    if error.errno == errno.EEXIST and dangling is not None:  # (what `mkdir` says of a link to nothing)
        return (f"{where}a link to {os.readlink(dangling)}, which does not exist: make what it names, or give "
                "another path")
    return f"{where}{error.strerror or errno.errorcode.get(error.errno, '')} ({WORLD_ERRORS[error.errno]})"


def one_line_warnings(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints a warning as one line, ``coclr COMMAND: warning: MESSAGE``, without
    breaking a progress bar (a library caller still gets Python's warnings: only the command line shows them so)."""
    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 (warnings' API)
        text = " ".join(str(message).split())
        progress.write(f"coclr {command}: warning: {text}", file=file or sys.stderr)

    return show


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; an error of the world (:data:`WORLD_ERRORS`) becomes one line naming the path and
    :data:`WORLD_ERROR_STATUS`, and so do a collective failed under torchrun because another process is gone
    (:func:`coclr.distributed.lost_process_line`), an allocation the machine cannot make (:func:`memory_line`) and
    a data-loading worker killed or out of file descriptors (:func:`worker_line`);
    any other error goes on to :func:`main` (bad input: one line too), and so does the
    :class:`~coclr.interrupts.Interrupted` that SIGINT or SIGTERM raise. Warnings are one line each
    (:func:`one_line_warnings`)."""
    if hasattr(signal, "SIGXFSZ"):  # past ``ulimit -f`` a write fails with EFBIG (one line) instead of killing us
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        with signals_interrupt(), warnings.catch_warnings():
            warnings.showwarning = one_line_warnings(args.command)
            return args.func(args)
    except OSError as error:
        line = world_error_line(error)
        if line is None:
            raise
        print(f"coclr {args.command}: error: {shown(line)}", file=sys.stderr)
        tell_the_others(args.command, line)
        return WORLD_ERROR_STATUS
    except (RuntimeError, MemoryError) as error:
        line = _lost_process_line(error) or memory_line(error) or worker_line(error)
        if line is None:
            raise
        progress.write(f"coclr {args.command}: error: {shown(line)}", file=sys.stderr)
        return WORLD_ERROR_STATUS


def tell_the_others(command: str, line: str) -> None:
    """Under torchrun, where ``command`` shares its work: tell the job's other processes that this one stopped on
    ``line`` before it joined their group, where they wait for it (:func:`coclr.distributed.share_refusal`)."""
    if "WORLD_SIZE" not in os.environ:
        return
    from coclr.distributed import share_refusal  # noqa: PLC0415 (heavy: torch)

    if command in TORCHRUN_COMMANDS:
        share_refusal(line)


def memory_line(error: BaseException) -> str | None:
    """One line for an allocation this machine (or its GPU) cannot make: the size asked for, and what to do; None
    for any other error."""
    if not out_of_memory(error):
        return None
    text = " ".join(str(error).split())
    asked = re.search(r"(?:you tried to allocate|Tried to allocate) ([0-9.]+ ?[A-Za-z]*)", text)
    return (f"not enough memory{f' for {asked.group(1)}' if asked else ''}: give smaller sizes (a batch, a queue, "
            "a network width, clips, workers) or free memory, then run the same command again")


def worker_line(error: BaseException) -> str | None:
    """One line for a data-loading worker process that died (killed: the out-of-memory killer's way) or that could
    not be spoken to (too many open files), as torch's DataLoader reports it; None for any other error."""
    text = " ".join(str(error).split())
    if "Too many open files" in text:
        return f"too many open files ({WORLD_ERRORS[errno.EMFILE]})"
    if "DataLoader worker" in text and ("killed by signal" in text or "exited unexpectedly" in text):
        return ("a data-loading worker process was killed (the out-of-memory killer does so when memory runs out): "
                "give fewer workers or smaller sizes, or free memory, then run the same command again")
    return None


def _lost_process_line(error: BaseException) -> str | None:
    """:func:`coclr.distributed.lost_process_line` where torch is loaded already (the command line starts without)."""
    if "torch.distributed" not in sys.modules:
        return None
    from coclr.distributed import lost_process_line

    return lost_process_line(error)
