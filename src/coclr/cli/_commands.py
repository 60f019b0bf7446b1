"""Commands a job of the study starts as child processes (``python -m coclr ARGV``), checked by the parser the
children will use before any of them starts."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Sequence

from coclr.errors import CoclrError
from coclr.jobs.scheduler import Job


def check_commands(jobs: Sequence[Job], parser: argparse.ArgumentParser) -> None:
    """Refuse, before any of them starts, a job whose arguments ``coclr`` would not take (a flag renamed since the
    plan was written, a value of the wrong type): a :class:`CoclrError` naming the job and argparse's reason,
    instead of a failure hours into a run. ``parser``: coclr's (:func:`coclr.cli.build_parser`)."""
    for job in jobs:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                parser.parse_args(job.argv)
        except (SystemExit, argparse.ArgumentError):
            reason = said.getvalue().strip().splitlines()[-1:] or ["not a coclr command"]
            raise CoclrError(f"job {job.name}: `coclr {' '.join(job.argv)}` would be refused: {reason[0]}") from None
