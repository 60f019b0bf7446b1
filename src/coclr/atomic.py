"""Atomic file writes: a temporary file in the destination's folder, flushed to disk, then renamed onto it.

A reader, or a job resumed after a kill, sees either the old file or the complete new one, never a part.
Every output of the library's long jobs (store entries, flow, checkpoints, caches, reports) is written here.
Temporary files are named ``.<name>.<pid>.<random>.partial``, so a cleaner can tell whether their writer
still runs (:func:`remove_stale_partials`, when a job claims its folder again); a process that exits deletes its own.
Append-only JSON-lines logs are the exception: :func:`read_json_lines` reads them back whatever a kill left.
:func:`read_json_record` is the one reader of the JSON records these writes leave (a folder's settings, a store's
metadata, an index, a result), :func:`file_sha256` the one content hash of a file they name (a checkpoint),
:func:`file_state` the one rule for whether a file changed.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from glob import escape as glob_escape
from pathlib import Path
from typing import IO, Any, NamedTuple

from coclr.errors import DataError
from coclr.interrupts import deferred_interrupts
from coclr.text import TEXT

PARTIAL_SUFFIX = ".partial"

_UNFINISHED: set[tuple[int, Path]] = set()
"""The temporary files of this process's writes in flight, as ``(pid, path)``: named here before they are made,
forgotten once renamed or deleted. A write's own cleanup deletes its file; an interruption raised where that
cleanup cannot run (the signal's handler runs at the next call, which may be the start of a context manager's
exit, or just after the system call that made the file) leaves it here, and :func:`_remove_unfinished` deletes it
as the process exits."""


def _temporary(path: Path) -> tuple[int, Path]:
    """A new temporary name for ``path`` (in its folder, hidden, naming the writing process) with its writer's
    pid; registered in :data:`_UNFINISHED` before any file has it."""
    key = (os.getpid(), path.parent / f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}{PARTIAL_SUFFIX}")
    _UNFINISHED.add(key)
    return key


def _discard(key: tuple[int, Path], delete: bool = True) -> None:
    """The temporary file ``key`` is renamed (``delete`` false) or is deleted now, by the process that made it
    only: a forked child that inherited a write in flight (and would run its cleanup as it exits) leaves it to
    its parent."""
    pid, temp = key
    if pid != os.getpid():
        return
    if delete:
        temp.unlink(missing_ok=True)
    _UNFINISHED.discard(key)


@atexit.register
def _remove_unfinished() -> None:
    """Delete this process's temporary files whose writes did not finish (see :data:`_UNFINISHED`)."""
    for key in list(_UNFINISHED):
        _discard(key)


@contextmanager
def atomic_open(path: str | Path, mode: str = "wb", fsync: bool = True) -> Iterator[IO]:
    """Open a temporary file for writing; on a clean exit it replaces ``path``, on an error it is deleted (at the
    latest as the process exits: :data:`_UNFINISHED`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = _temporary(path)
    temp = key[1]
    try:
        handle = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)  # as mkstemp, but the umask applies
        with os.fdopen(handle, mode, **({} if "b" in mode else TEXT)) as file:
            yield file
            file.flush()
            if fsync:
                os.fsync(file.fileno())
        os.replace(temp, path)
        _discard(key, delete=False)
    except OSError as error:
        _discard(key)
        if error.filename is None:  # a failed write or flush (disk full, file too large) names no file: name it
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise
    except BaseException:
        _discard(key)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    with atomic_open(path, "w") as file:
        file.write(text)
    return Path(path)


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` atomically (checkpoints: a kill during the write keeps the previous file). Ctrl-C or SIGTERM
    during the write waits for it to end (:func:`~coclr.interrupts.deferred_interrupts`), then stops the command
    with the file discarded: raised inside ``torch.save``, the interruption made its zip writer fail as it closed,
    and a traceback replaced the one-line stop."""
    import torch  # noqa: PLC0415 (heavy)

    try:
        with atomic_open(path, "wb") as file, deferred_interrupts():
            torch.save(obj, file)
    except RuntimeError as error:  # torch's zip writer hides a failed write (the disk full) behind its own error
        cause = error.__context__
        if isinstance(cause, OSError) and cause.errno is not None:
            raise OSError(cause.errno, cause.strerror, str(path)) from None
        raise
    return Path(path)


def atomic_duplicate(source: str | Path, path: str | Path) -> Path:
    """Make ``path`` hold what ``source`` holds now, atomically: a hard link under a temporary name renamed onto
    ``path`` (no second write of the bytes), or a copy through :func:`atomic_open` where the file system has no
    hard links. A later atomic write of ``source`` gives its name a new file and leaves ``path`` as it was."""
    source, path = Path(source), Path(path)
    key = _temporary(path)
    try:
        os.link(source, key[1])
    except OSError:
        _discard(key)
        with open(source, "rb") as reader, atomic_open(path, "wb") as writer:
            shutil.copyfileobj(reader, writer)
        return path
    try:
        os.replace(key[1], path)
        _discard(key, delete=False)
    except BaseException:
        _discard(key)
        raise
    return path


class FileState(NamedTuple):
    """What ``stat`` says of a file: it is unchanged while this is (an atomic rewrite is a new inode, an edit in
    place moves the modification and change times)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @property
    def recorded(self) -> tuple[int, int]:
        """What a record written to disk keeps of it (:func:`file_identity`): size and modification time. A folder
        copied or moved to another disk keeps them (``cp -p``, ``rsync -t``); its device and inode change."""
        return self.size, self.mtime_ns


def file_state(path: str | Path) -> FileState | None:
    """The state of the file at ``path`` (:class:`FileState`), None when it cannot be read. In-process caches
    compare it whole."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return FileState(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def file_identity(path: str | Path) -> tuple[int, int] | None:
    """``(size, mtime_ns)`` of a file, as records on disk keep it (:attr:`FileState.recorded`), None when it cannot
    be read."""
    state = file_state(path)
    return None if state is None else state.recorded


def file_sha256(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's content (identifies a checkpoint whatever its name or folder)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json_record(path: str | Path, remedy: str = "") -> dict[str, Any] | None:
    """The JSON object in the file ``path``, or None when there is no such file. A file that is not a JSON object
    (bad JSON or UTF-8, absurd nesting, another value) is a :class:`~coclr.errors.DataError` naming it and what was
    wrong, then ``remedy`` (what to do, as ``"; <remedy>"``); a file that cannot be read raises its ``OSError``."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError; nesting past the stack
        raise DataError(f"{path}: not valid JSON ({error}){'; ' + remedy if remedy else ''}") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}: not a JSON object (holds {type(record).__name__}){'; ' + remedy if remedy else ''}")
    return record


def read_json_lines(path: str | Path) -> list[Any]:
    """The records of an append-only JSON-lines file (a training log, one record per line).

    A kill can cut the last line short while it is appended: that line is left out, and so are blank lines. Any
    other line that is not JSON is a :class:`~coclr.errors.DataError` naming the file and line.
    """
    lines = Path(path).read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise DataError(f"{path}: line {number} is not JSON: {error}") from None
    return records


def remove_stale_partials(folder: Path, recursive: bool = True) -> int:
    """Delete the temporary files under ``folder`` (in it alone unless ``recursive``) left by killed writers (whose
    process is gone); returns how many."""
    removed = 0
    if not folder.is_dir():
        return removed
    for directory, folders, files in os.walk(folder):
        if not recursive:
            folders.clear()
        removed += sum(_discard_stale(Path(directory, name)) for name in files if name.endswith(PARTIAL_SUFFIX))
    return removed


def remove_stale_partials_of(path: str | Path) -> int:
    """Delete the temporary files of the one file ``path`` (beside it) left by killed writers, as the next write of
    it begins (a result file in a folder of the user's, which no claim of a folder sweeps; a file there that names
    no writer is kept); returns how many."""
    path = Path(path)
    if not path.parent.is_dir():
        return 0
    return sum(_discard_stale(candidate, unnamed=False)
               for candidate in path.parent.glob(f".{glob_escape(path.name)}.*{PARTIAL_SUFFIX}"))


def _discard_stale(path: Path, unnamed: bool = True) -> bool:
    """Delete the temporary file ``path`` unless its writer still runs (``unnamed``: one that names no writer too);
    whether it did."""
    pid = _writer_pid(path.name)
    if (pid is None and not unnamed) or (pid is not None and _process_alive(pid)):
        return False
    path.unlink(missing_ok=True)
    return True


def _writer_pid(name: str) -> int | None:
    parts = name.split(".")
    for part in reversed(parts[:-2]):
        if part.isdigit():
            return int(part)
    return None


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def scratch_folder(kind: str) -> Iterator[str]:
    """A temporary folder for a ``kind`` of work (``coclr-<kind>.<pid>.<random>`` in the system's temporary folder),
    removed at the end of the ``with`` block; those a killed process left (its pid gone: SIGKILL runs no clean-up)
    are removed first."""
    import tempfile  # noqa: PLC0415

    for stale in Path(tempfile.gettempdir()).glob(f"coclr-{kind}.*.*"):
        pid = stale.name.split(".")[1]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"coclr-{kind}.{os.getpid()}.") as folder:
        yield folder
