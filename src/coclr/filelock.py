"""The one file lock of the project: an exclusive ``flock`` on a file, held for a ``with`` block.

Store jobs hold one per view, the store's metadata one while rewriting its index, and every folder a long
command writes one (:mod:`coclr.runfolder`). The kernel releases a lock when its process ends, so a job killed
with SIGKILL leaves none stale (its forked workers hold it until they exit, soon after: a lock whose holder is
gone is waited for, :data:`ORPHAN_WAIT`). A thread that holds a lock may take it again (nested ``with`` blocks: a job
locks its view before it updates the store's index, and the engine it calls locks the view again). A refused
lock leaves the lock file as it was. Where ``fcntl`` does not exist (Windows), no lock is taken.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from coclr.errors import DataError

ORPHAN_WAIT = 30.0
"""Seconds a lock whose holder is gone (killed with SIGKILL) is waited for: the worker processes it forked hold it
until they notice and exit, within seconds."""

_HELD: dict[tuple[str, int, int], int] = {}
"""The locks held here (real path, pid, thread: a forked child holds none of its parent's, another thread waits
as another process would), with their depth of nesting."""


@contextmanager
def exclusive_lock(path: str | Path, busy: Callable[[str], str] | None = None,
                   holder: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created when missing).

    ``busy``: when given, a lock held by another process is refused at once with :class:`DataError`
    ``busy(who)``, ``who`` being the description the holder wrote into the file; without it, wait for the lock.
    ``holder``: the description written into the file while it is held (default: this process and host).
    """
    if fcntl is None:
        yield
        return
    held = (os.path.realpath(path), os.getpid(), threading.get_ident())
    if held in _HELD:
        _HELD[held] += 1
        try:
            yield
        finally:
            _HELD[held] -= 1
        return
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (fcntl.LOCK_NB if busy is not None else 0))
        except BlockingIOError:
            who = os.pread(descriptor, 200, 0).decode("utf-8", "replace").strip() or "another process"
            if not _orphans_let_go(descriptor, who):
                raise DataError(busy(who)) from None
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, (holder or f"pid {os.getpid()} on {socket.gethostname()}").encode(), 0)
        except OSError as error:  # (the disk full: the one line of the world's errors names the lock's path)
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            raise OSError(error.errno, error.strerror, str(path)) from None
        _HELD[held] = 0
        try:
            yield
        finally:
            del _HELD[held]
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def lock_holder(path: str | Path) -> str | None:
    """Who holds the lock on ``path`` (the description it wrote) when a live process does, else None: a look before
    expensive work, so that a second job is refused before it starts rather than when it claims the lock. Takes
    nothing and writes nothing (a missing file is no holder; a holder that is gone, whose workers still hold the
    lock for a moment, is none either: the lock itself waits for them)."""
    if fcntl is None:
        return None
    if (os.path.realpath(path), os.getpid(), threading.get_ident()) in _HELD:
        return None
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:  # (none there, or unreadable: the lock itself says)
        return None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)  # (shared: another look is not in its way)
        except BlockingIOError:
            who = os.pread(descriptor, 200, 0).decode("utf-8", "replace").strip() or "another process"
            return None if _holder_gone(who) else who
        except OSError:  # a file system that cannot tell (the lock itself says)
            return None
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return None
    finally:
        os.close(descriptor)


def _holder_gone(who: str) -> bool:
    """Whether ``who`` ("pid N on HOST") names a process of this host that no longer exists."""
    named = re.match(r"pid (\d+) on ([^\s,]+)", who)
    if named is None or named.group(2) != socket.gethostname():
        return False
    try:
        os.kill(int(named.group(1)), 0)
        return False
    except ProcessLookupError:
        return True
    except PermissionError:
        return False


def _orphans_let_go(descriptor: int, who: str) -> bool:
    """Whether a lock refused to us, held in the name of ``who`` ("pid N on HOST"), came to us within
    :data:`ORPHAN_WAIT` seconds because ``who`` is a process of this host that is gone (its forked workers, which
    inherited the lock, exit soon after it); False at once for a live holder or another host's."""
    if not _holder_gone(who):
        return False  # alive (a job at work), or another host's
    deadline = time.monotonic() + ORPHAN_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            continue
    return False
