"""Exceptions the library raises for bad input.

Every error a user can cause (a bad option, a missing file, an unreadable video, a checkpoint that does not
match) is a :class:`CoclrError`, so the CLI can print it as one clear line instead of a traceback.
"""


class CoclrError(Exception):
    """Base class of the errors caused by user input (files, options, checkpoints)."""


class ConfigError(CoclrError, ValueError):
    """An option is unknown, has the wrong type, or an invalid value; the message names the key."""


class CheckpointError(CoclrError, ValueError):
    """A checkpoint cannot be loaded: unknown format, or missing, unexpected or mis-shaped keys."""


class DataError(CoclrError):
    """A dataset, index, store or video file is missing or unreadable; the message names the file."""


class VideoDecodeError(DataError):
    """A video file cannot be decoded (corrupt, truncated, empty, or not a video)."""
