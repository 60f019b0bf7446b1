"""How text meets bytes, in one place: UTF-8, a file name's bytes that are not UTF-8 carried through.

Python gives the bytes of a file name that are not UTF-8 (an archive from another system) as lone surrogates
(``os.listdir``, PEP 383). Wherever such text becomes bytes (a hash, a store entry's key, a text file, the CLI's
standard output) it becomes the very bytes again (``surrogateescape``), whatever the locale: a CSV names the very
file, a hash of a UTF-8 name is what it always was. A page shows those bytes as U+FFFD, as browsers do, and each
name isolated from the text around it (:func:`on_page`, :func:`html_name`). A line for the terminal shows a name's
control characters as escapes (:func:`shown`), as ``ls`` does.
"""

from __future__ import annotations

import html
import re

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


_ESCAPES = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)]}
_ESCAPES.update({ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"})
_ESCAPES.update({code: f"\\u{code:04x}" for code in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                                       *range(0x2066, 0x206A))})  # the bidirectional controls


_ESCAPES_BUT_NEWLINES = {code: text for code, text in _ESCAPES.items() if code != ord("\n")}


def shown(text: object, newlines: bool = False) -> str:
    """``text`` (a name, or a line naming files) as a terminal shows it: its control characters as escapes (``\\n``,
    ``\\x1b``, the bidirectional ones as ``\\u202e``), so that a file named with a newline stays on its line, one
    named with an escape sequence does not command the terminal, and one with a right-to-left override does not
    show the rest of the line reversed. ``newlines``: keep the line breaks of a text of several lines (the rest
    escaped). Pages, CSVs and JSON keep a name as it is."""
    return str(text).translate(_ESCAPES_BUT_NEWLINES if newlines else _ESCAPES)


_SURROGATES = re.compile("[\ud800-\udfff]")


def on_page(text: object) -> str:
    """``text`` as a page shows it: the bytes of a name that are not UTF-8 as U+FFFD, as a browser shows them (a
    page's script data holds no lone surrogate: a browser may refuse such text)."""
    return _SURROGATES.sub("\ufffd", str(text))


def html_name(text: object) -> str:
    """A name as a page's HTML: escaped, as :func:`on_page` shows it, and isolated (``<bdi>``), so that a
    right-to-left mark or override in one name does not turn the page's text around it, or the next name."""
    return f"<bdi>{html.escape(on_page(text))}</bdi>"
