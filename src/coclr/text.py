"""How text meets bytes, in one place: UTF-8, a file name's bytes that are not UTF-8 carried through.

Python gives the bytes of a file name that are not UTF-8 (an archive from another system) as lone surrogates
(``os.listdir``, PEP 383). Wherever such text becomes bytes (a hash, a store entry's key, a text file, the CLI's
standard output) it becomes the very bytes again (``surrogateescape``), whatever the locale: a CSV names the very
file, a hash of a UTF-8 name is what it always was. A page shows those bytes as U+FFFD, as browsers do.
"""

from __future__ import annotations

ENCODING = "utf-8"
ERRORS = "surrogateescape"
TEXT = {"encoding": ENCODING, "errors": ERRORS}
"""How text files are opened for writing: ``open(path, "w", **TEXT)``."""


def to_bytes(text: str) -> bytes:
    """``text`` as bytes: UTF-8, its surrogates as the bytes of the file name they stand for."""
    return text.encode(ENCODING, ERRORS)


def from_bytes(data: bytes) -> str:
    """Bytes as text: UTF-8, bytes that are not as surrogates (the inverse of :func:`to_bytes`)."""
    return data.decode(ENCODING, ERRORS)
