"""Progress bars that a job made of other jobs can follow: one line for the whole job instead of one per part.

Every long loop of the library shows its progress with :func:`bar` (a ``tqdm`` bar). A command that runs several
such jobs in one process (``coclr learn``: store, flow, training stages, embedding) follows them with
:func:`observed`: while it is active the parts' bars are not drawn, and each of their updates is passed to the
observer, which draws one line with the ETA of the whole job (:func:`job_line`).

Example::

    with observed(lambda desc, n, total: print(desc, n, total)):
        run_entry_jobs(...)        # its bar is silent; the observer sees every update
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

from coclr.text import shown

Observer = Callable[..., None]
"""Called with a bar's description, the count it advanced by and its total (None: unknown); and, as a bar starts
where earlier work left it (tqdm's ``initial``: a resumed job), with that count and a fourth argument, True: work
done before, not in the time the observer sees."""

_observers: list[Observer] = []
_lock = threading.Lock()


class _Bar(tqdm):
    """A tqdm bar that passes each update to the active observers (and is not drawn while there are any)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.label = str(kwargs.get("desc") or "")  # a disabled tqdm keeps no description
        super().__init__(*args, **kwargs)
        if kwargs.get("initial"):
            for observer in list(_observers):
                observer(self.label, int(kwargs["initial"]), self.total, True)

    def __iter__(self) -> Iterator[Any]:
        if not _observers:  # tqdm's own loop, which counts without calling update
            yield from super().__iter__()
            return
        for item in self.iterable:
            yield item
            self.update(1)

    def update(self, n: float | None = 1) -> bool | None:
        for observer in list(_observers):
            observer(self.label, int(n or 0), self.total)
        if self.disable:  # a disabled tqdm counts nothing: count here, so that ``n`` means the same drawn or not
            self.n += n or 0
            return None
        return super().update(n)


def bar(*args: Any, **kwargs: Any) -> tqdm:
    """A ``tqdm`` bar with tqdm's arguments; not drawn while a job observes its parts (:func:`observed`)."""
    if _observers:
        kwargs["disable"] = True
    return _Bar(*args, **kwargs)


def job_line(**kwargs: Any) -> tqdm:
    """The one line of a job that observes its parts (:func:`observed`), with tqdm's arguments: drawn while it
    observes them (the parts' own bars are not)."""
    return tqdm(**kwargs)


def clock(seconds: float | None) -> str:
    """``seconds`` as a clock shows them ("01:05", "1:02:03"); "?" for None."""
    return "?" if seconds is None else tqdm.format_interval(max(0.0, seconds))


def duration(seconds: float) -> str:
    """``seconds`` in words, as an ETA says them: "45 s", "12 min", "1.5 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def write(text: str, file: Any = None) -> None:
    """Print a line (to ``file``, default stdout) without breaking the progress line under it; the names in it as a
    terminal shows them (:func:`coclr.text.shown`)."""
    tqdm.write(shown(text, newlines=True), file=file)


@contextmanager
def observed(observer: Observer) -> Iterator[None]:
    """Pass the updates of every :func:`bar` made in this process to ``observer`` while the block runs."""
    with _lock:
        _observers.append(observer)
    try:
        yield
    finally:
        with _lock:
            _observers.remove(observer)
