"""Exceptions the library raises for bad input.

Every error a user can cause (a bad option, a missing file, an unreadable video, a checkpoint that does not
match) is a :class:`CoclrError`, so the CLI can print it as one clear line instead of a traceback.
"""

import errno
import os

EXIT_SOME_FAILED = 3
"""The exit status of a per-input job (``embed``, ``data store``, ``flow`` ...) that went through all its inputs,
some of which failed: they are listed, recorded for the next run, and the rest is done; or of a job that finished
with a result that carries nothing (``learn``: every stage of a view collapsed; ``study``: every row), said in
one line. (The other statuses: :mod:`coclr.cli._status`.)"""


class CoclrError(Exception):
    """Base class of the errors caused by user input (files, options, checkpoints). Said on one line (a name's
    newline escaped, as every name in a line is) unless ``lines``: a message of several lines (jobs' log tails)."""

    lines = False


class ConfigError(CoclrError, ValueError):
    """An option is unknown, has the wrong type, or an invalid value; the message names the key."""


class CheckpointError(CoclrError, ValueError):
    """A checkpoint cannot be loaded: unknown format, or missing, unexpected or mis-shaped keys."""


class DataError(CoclrError):
    """A dataset, index, store or video file is missing or unreadable; the message names the file."""


class VideoDecodeError(DataError):
    """A video file cannot be decoded (corrupt, truncated, empty, or not a video)."""


def why_no_file(path: str | os.PathLike[str], what: str = "file") -> str:
    """Why ``path`` names no ``what`` to read (one clause, for a message naming the path): a folder, a symbolic link
    to nothing or in a loop, or nothing there."""
    if os.path.isdir(path):
        return f"a folder, not a {what}"
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as error:
            if error.errno == errno.ELOOP:
                return "a symbolic link in a loop (it leads back to itself), not a " + what
        return f"a link to {os.readlink(path)}, which does not exist"
    if os.path.exists(path):
        return f"not a regular file (a pipe, a socket or a device), not a {what}"
    return f"{what} not found"


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation this machine (or its GPU) could not make: the job's condition, not an
    input's (a batch too large fails every video alike), so a job stops on it instead of listing inputs as failed."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    if isinstance(error, OSError):
        return error.errno == errno.ENOMEM
    if not isinstance(error, RuntimeError):  # (an input's error names its file, which may say "out of memory")
        return False
    text = " ".join(str(error).split())  # torch's allocators say it in a RuntimeError
    return "can't allocate memory" in text or "out of memory" in text.lower()
