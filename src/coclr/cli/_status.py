"""The exit status of every command: one rule, shown at the end of every ``--help``, which the subcommands that
run per-input jobs use (:func:`job_status`); a module of its own so that they need not import the package that
loads them."""

from __future__ import annotations

from coclr.errors import EXIT_SOME_FAILED  # (defined there: the jobs that run tasks read it too)

EXIT_DONE = 0
"""Every input done (or nothing left to do)."""
EXIT_ERROR = 2
"""Refused or stopped by an error, named in one line on stderr (bad option, input, checkpoint, folder, disk):
argparse's status for a bad command line, kept for every error the command reports itself."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT): stopped within seconds, what was finished kept, one line saying what; the same command
continues where it stopped (:mod:`coclr.interrupts`)."""
EXIT_TERMINATED = 143
"""SIGTERM (``kill``, ``timeout``, a batch scheduler): as Ctrl-C, with the shell's status of SIGTERM."""
EXIT_PIPE = 141
"""The standard output's reader went away (``coclr search ... | head -1``): what was done is kept, nothing more is
printed; the shell's status of a process that SIGPIPE ends."""
EXIT_CODES = (f"exit status: {EXIT_DONE} all done; {EXIT_SOME_FAILED} a job over many inputs went through them and "
              "some failed, or are missing or damaged (each listed with its reason), or every stage of a view "
              f"(learn) or every row (study) collapsed; {EXIT_ERROR} refused or stopped by an error (one line on "
              f"stderr); {EXIT_INTERRUPTED} interrupted (Ctrl-C), {EXIT_TERMINATED} stopped by SIGTERM (what was "
              "done is kept: run the same command, without --restart, to continue); "
              f"{EXIT_PIPE} the output's reader went away (a closed pipe); "
              "1 an unexpected error (a traceback: please report it)")
"""The one exit-status rule of every command, shown at the end of every ``--help``."""


def job_status(failed: int) -> int:
    """The exit status of a per-input job that went through all its inputs, ``failed`` of which failed."""
    return EXIT_SOME_FAILED if failed else EXIT_DONE
