"""The clip store: every video decoded once into resized JPEG frames, packed one file per video and view.

Layout of a store folder::

    index.json                 the VideoIndex (entry key = the entry's relative video path)
    store.json                 format marker and metadata (short side, JPEG quality, flow bounds, ...)
    .lock                      held while a process updates store.json or index.json
    failed_<view>.json         the entries of a view whose job failed, with the reason (see record_failures)
    notes_<view>.json          what decoding noted about entries written (damaged frames, a turn), see record_notes
    <view>/ab/<hash>.frames    one file per entry and view ("rgb", "flow", other flow backends' names)

An entry file is named by a hash of its key, so no video name (a 255-byte one, deep folders) can make a path
the file system refuses, and it holds its key in its header, so an entry can always be told from another. Stores
of the first version (``<view>/<key>.frames``, no key in the header) are still read and resumed.

An entry file is a small header, a table of frame offsets, the checksum of each frame and of the header, and the
concatenated encoded frames, so a random 32-frame clip is two small reads and one contiguous read of one file
(``docs/store.md`` compares this with LMDB and sharded tar, measured). Entry files are written atomically
(temporary file + ``os.replace``): an entry file that exists is complete, which makes long jobs resumable by
skipping existing entries (:mod:`coclr.store.jobs` runs them).

The index of a store may be replaced by an updated one (videos added or removed): entries are keyed by video
path, so the work done for the videos both indexes hold is kept.

Every read checks the bytes it reads against their checksums (XXH3-64): a damaged entry raises
:class:`DamagedEntryError` naming it in one line and is listed in the store's failure list, so training and
evaluation leave it out and the next job on its view rebuilds it (``docs/store.md``, "Integrity").

Reading is safe from DataLoader worker processes: no file stays open between reads (each read opens,
``pread``s and closes), and the per-process header cache is dropped when a store is pickled.

Example::

    store = ClipStore("stores/ucf101")
    clip = store.read(store.keys()[0], "rgb", range(32))   # uint8 [32, 128, 171, 3]
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import struct
import tempfile
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from coclr.atomic import atomic_open, atomic_write_json, file_state, read_json_record
from coclr.errors import DataError
from coclr.filelock import exclusive_lock
from coclr.runfolder import LOCK_FILE, FolderRecord, FolderRule, check_folder
from coclr.store.jpeg import decode_jpeg, decode_jpeg_strict
from coclr.text import from_bytes, to_bytes
from coclr.video.indexes import VideoEntry, VideoIndex, is_relative_key

try:
    import xxhash
except ImportError:  # optional: a bare GPU machine writes entries without checksums (version 2)
    xxhash = None

STORE_FORMAT = "coclr-clip-store"
STORE_VERSION = 2
"""Version of new stores: 2 names entry files by a hash of their key; 1 (still read) by the key itself."""
READABLE_VERSIONS = (1, 2)
ENTRY_VERSION = 3
"""Version of new entry files (in stores of every version): 3 adds a checksum per frame and one of the header;
1 (no key) and 2 (key, no checksums) are still read, unverified."""
READABLE_ENTRY_VERSIONS = (1, 2, 3)
INDEX_FILE = "index.json"
META_FILE = "store.json"
ENTRY_SUFFIX = ".frames"
FAILED_PREFIX = "failed_"
NOTES_PREFIX = "notes_"

# Entry file: magic, version, frame count, height, width, fps (version >= 2: then the key's length and the key,
# UTF-8); then uint64 offsets [count + 1] (absolute, offsets[i]..offsets[i+1] is frame i); (version 3:) uint64
# checksums [count] of the frames' bytes, then the uint64 checksum of every byte before it (the entry's checksum);
# then the encoded frames back to back. Little-endian. Checksums are XXH3-64 (docs/store.md: why).
_MAGIC = b"COCLRFRM"
_HEADER = struct.Struct("<8sIIIId")
_KEY_LENGTH = struct.Struct("<I")
_CHECKSUM = struct.Struct("<Q")
_VIEW_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HEADER_CACHE_SIZE = 4096
_HASH_CHARS = 32


def checksum(data: bytes) -> int:
    """The checksum of stored bytes (a frame, an entry's header): XXH3-64, as an integer."""
    if xxhash is None:
        raise DataError("this store's entries carry XXH3 checksums, and reading them needs the xxhash package: "
                        "pip install xxhash")
    return xxhash.xxh3_64_intdigest(data)


def format_checksum(value: int) -> str:
    """A checksum as the 16 hex digits messages and cache keys show."""
    return f"{int(value):016x}"


class DamagedEntryError(DataError):
    """An entry file whose bytes do not match their checksum (bit rot, a torn copy, a bad sector), or that is no
    valid entry file (a header cut short, a frame table past the end of the file).

    The message is one line: the store, the video, the entry file, then the part (header or frame) and the expected
    and found checksums, or what is wrong. ``key`` and ``view`` name the entry for the code that leaves it out.
    """

    def __init__(self, message: str, key: str = "", view: str = "") -> None:
        # A DataLoader worker's error comes back as this class built from its whole traceback: keep its one line.
        message = message.rpartition(f"{type(self).__name__}: ")[2].strip() if "\n" in message else message
        super().__init__(message)
        self.key, self.view = key, view

    def __reduce__(self):
        return type(self), (str(self), self.key, self.view)


def _damaged(path: Path | str, key: str | None, part: str, expected: int, found: int) -> DamagedEntryError:
    """The error of a ``part`` ("header", "frame 3") of an entry file whose checksum does not match."""
    return _broken(path, key, f"{part} checksum expected {format_checksum(expected)}, found {format_checksum(found)}")


def _broken(path: Path | str, key: str | None, problem: str) -> DamagedEntryError:
    """The error of an entry file that is damaged: ``problem`` located by store, video and entry file."""
    path = Path(path)
    view, root = path.parent.parent.name, path.parent.parent.parent
    if key is not None and path.name == Path(key).name + ENTRY_SUFFIX:  # version-1 layout: <view>/<key>.frames
        parts = Path(key).parts
        view, root = path.parents[len(parts) - 1].name, path.parents[len(parts)]
    return DamagedEntryError(f"damaged entry: store {root}, video {key!r}, entry {path.relative_to(root)}: {problem}",
                             key or "", view)


# ----------------------------------------------------------------------------------------- store layout

@contextmanager
def metadata_lock(root: Path) -> Iterator[None]:
    """Hold ``root/.lock`` while a process reads and rewrites the store's metadata or index (waiting for another
    holder), so that jobs started side by side on one store (flow extraction of two views, say) do not lose each
    other's keys."""
    with exclusive_lock(root / LOCK_FILE):
        yield


@dataclass(frozen=True)
class IndexUpdate:
    """How a store's index changed when an updated one replaced it: entry keys added and removed, and those that
    left the train split for a split evaluation tests on (val, as Kinetics is evaluated, or test)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    from_train: tuple[tuple[str, str], ...] = ()
    """``(key, split)`` of each video that was in the train split and is now in ``split``."""
    relabelled: tuple[str, ...] = ()
    """Videos of both whose class changed: its number (a class added, or the classes ordered otherwise) or its
    name (a class renamed)."""

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.from_train or self.relabelled)

    def __str__(self) -> str:
        text = (f"index updated: {len(self.added)} video(s) added, {len(self.removed)} removed (the entries of "
                "removed videos stay on disk, unlisted)")
        if self.from_train:
            splits = " and ".join(sorted({split for _, split in self.from_train}))
            text += (f"; warning: {len(self.from_train)} video(s) moved from the train split to the {splits} split "
                     f"(e.g. {self.from_train[0][0]}): an encoder trained on this store before saw them, so its "
                     "scores there would count them; evaluate it with the index it was trained on, or train again")
        if self.relabelled:
            text += (f"; note: {len(self.relabelled)} video(s) have another class than before (its number or name; "
                     f"e.g. {self.relabelled[0]}): a classifier trained on this store before names its classes "
                     "otherwise")
        return text


class _Plain(str):
    """Text a refusal shows as it is (not quoted as a typed string would be)."""

    def __repr__(self) -> str:
        return str(self)


def _as_store_options(meta: dict[str, Any]) -> dict[str, Any]:
    """A store's metadata as a refusal names it: the frames' settings in the words of ``coclr data store``'s options
    (a short side or rate of None read "given null" where ``--short-side 0`` or no ``--fps`` was typed)."""
    named = {"short_side": ("--short-side", _Plain("0 (the decoded size)")),
             "fps": ("--fps", _Plain("none (every frame)")), "quality": ("--quality", None)}
    shown = {}
    for key, value in meta.items():
        option, instead = named.get(key, (key, None))
        shown[option] = instead if value is None and instead is not None else value
    return shown


STORE_FOLDER = FolderRule("data store", "a clip store", may_add=True, other="another output folder",
                          shown=_as_store_options)
"""How a store's metadata is continued or refused (:mod:`coclr.runfolder`): it may only gain keys."""


def _conflicts(root: Path, index: VideoIndex, meta: dict[str, Any], replace_index: bool) -> tuple[dict, bool]:
    """The keys of ``meta`` that the existing store ``root`` does not record yet, and whether its index differs
    from ``index``. Raises :class:`DataError` if the store records one of the keys with another value, or holds
    another index and ``replace_index`` is false."""
    existing = _read_meta(root)["meta"]
    STORE_FOLDER.check(root, existing, meta)
    return {k: v for k, v in meta.items() if k not in existing}, _index_changed(root, index, replace_index)


def _index_changed(root: Path, index: VideoIndex, replace_index: bool) -> bool:
    """Whether the store ``root`` holds another index than ``index``; refused (:class:`DataError`) unless
    ``replace_index``."""
    stored = _load_index(root)
    changed = stored.to_dict() != index.to_dict()
    if changed and not replace_index:
        raise DataError(f"{root} already holds a store of a different index ({stored.name!r}, "
                        f"{len(stored)} videos; given {index.name!r}, {len(index)} videos): use another output "
                        "folder (`coclr data store` updates the index of a store it built)")
    return changed


def _same_index(path: Path, index: VideoIndex) -> bool:
    """Whether ``path`` is the store's ``index.json`` holding ``index`` (written by a build killed before its
    ``store.json``, or the same index the user put there): rewriting it changes nothing."""
    if path.name != INDEX_FILE or not path.is_file():
        return False
    try:
        return VideoIndex.load(path).to_dict() == index.to_dict()
    except DataError:
        return False


def store_record(index: VideoIndex, replace_index: bool = False, written: Callable[[IndexUpdate], Any] | None = None,
                 **meta: Any) -> FolderRecord:
    """How a store records its settings (:func:`~coclr.runfolder.claim_folder`): the metadata of ``store.json``,
    which may only gain keys, beside the index; a new store's folder may already hold that same index
    (:func:`_same_index`), an existing one must hold ``index`` unless ``replace_index``. Recording is
    :func:`create_store`, whose update of the index goes to ``written``."""
    def read(folder: Path) -> dict[str, Any] | None:
        return _read_meta(folder)["meta"] if (folder / META_FILE).is_file() else None

    def write(folder: Path, held: bool) -> None:
        update = create_store(folder, index, replace_index=replace_index, **meta)
        if written is not None:
            written(update)

    return FolderRecord(META_FILE, read, write, ours=lambda path: _same_index(path, index),
                        check=lambda folder: _index_changed(folder, index, replace_index))


def check_store(root: str | Path, index: VideoIndex, *, replace_index: bool = False, **meta: Any) -> bool:
    """What :func:`create_store` would refuse, found by reading only (so that a job is refused before it takes a
    lock or writes; :func:`~coclr.runfolder.check_folder` with :func:`store_record`): whether the store must be
    written (created, or given new keys or the index). A new store's folder must hold nothing but coclr's lock files
    (or that same index: see :func:`_same_index`), and lie in no other command's folder (:mod:`coclr.runfolder`): a
    user's own ``index.json`` there is refused, not replaced."""
    root = Path(root)
    meta = recorded_meta(meta)
    if not check_folder(root, STORE_FOLDER, meta, record=store_record(index, replace_index, **meta)):
        return True
    new, changed = _conflicts(root, index, meta, replace_index)
    return bool(new or changed)


def create_store(root: str | Path, index: VideoIndex, *, replace_index: bool = False, **meta: Any) -> IndexUpdate:
    """Create the store folder ``root`` for ``index``, with JSON-serialisable metadata ``meta``.

    Idempotent: on an existing store with the same index, new metadata keys are added and existing keys must
    have the same value (so a resumed job cannot mix, e.g., two JPEG qualities; :class:`DataError` names each
    differing key). Another index raises :class:`DataError`, unless ``replace_index``: then it replaces the
    stored one and the entries of the videos both hold are kept. Returns what changed in the index. Processes
    that call it at the same time on one store each add their keys, and a store that records every key and the
    same index is only read (it may be read-only). A job that writes a view calls it holding the view's lock
    (:func:`coclr.store.jobs.writing_view`), so that a job refused by that lock has changed nothing.
    """
    root = Path(root)
    meta = recorded_meta(meta)
    meta_file = root / META_FILE
    if not check_store(root, index, replace_index=replace_index, **meta):
        return IndexUpdate((), ())
    root.mkdir(parents=True, exist_ok=True)
    with metadata_lock(root):
        if not meta_file.is_file():
            with storage_errors(root / INDEX_FILE):
                index.save(root / INDEX_FILE)
            with storage_errors(meta_file):
                atomic_write_json(meta_file, {"format": STORE_FORMAT, "version": STORE_VERSION, "meta": meta})
            return IndexUpdate((), ())
        new, changed = _conflicts(root, index, meta, replace_index)  # again under the lock: others may have written
        update = IndexUpdate((), ())
        if changed:
            stored = _load_index(root)
            old = {entry.path: entry for entry in stored.entries}
            before = {path: entry.split for path, entry in old.items()}
            after = [entry.path for entry in index.entries]

            def relabelled(entry: VideoEntry) -> bool:
                was = old[entry.path]
                return (was.label != entry.label  # (a class renamed kept its number: said by its name)
                        or stored.classes[was.label] != index.classes[entry.label])

            update = IndexUpdate(tuple(k for k in after if k not in before),
                                 tuple(sorted(set(before) - set(after))),
                                 tuple((e.path, e.split) for e in index.entries if e.split != "train"
                                       and before.get(e.path) == "train"),  # (val too: it was test only)
                                 tuple(e.path for e in index.entries if e.path in old and e.label is not None
                                       and old[e.path].label is not None and relabelled(e)))
            with storage_errors(root / INDEX_FILE):
                index.save(root / INDEX_FILE)
        if new:
            record = _read_meta(root)
            record["meta"].update(new)
            with storage_errors(meta_file):
                atomic_write_json(meta_file, record)
        return update


def check_view_name(view: str) -> None:
    """Raise DataError unless ``view`` is a valid view (folder) name."""
    if not _VIEW_NAME.match(view):  # (".lock" was refused naming only allowed characters: the first one says)
        raise DataError(f"invalid view name {view!r} (letters, digits, '_', '-', '.', beginning with a letter or a "
                        "digit)")
    if view.lower().endswith(".json"):  # (the store's own files are: index.json, failed_<view>.json, ...)
        raise DataError(f"invalid view name {view!r}: a name ending in .json is one of the store's own files; "
                        "choose another (e.g. flow_dis)")


def _check_key(key: str) -> None:
    if not is_relative_key(key):
        raise DataError(f"invalid entry key {key!r}: must be a relative path without '..'")


def entry_file_name(key: str) -> str:
    """The file of entry ``key`` within its view folder, in a version-2 store: ``ab/<hash>.frames``, whatever the
    length or characters of the key."""
    digest = hashlib.sha256(to_bytes(key)).hexdigest()[:_HASH_CHARS]
    return f"{digest[:2]}/{digest}{ENTRY_SUFFIX}"


def _entry_path(root: Path, key: str, view: str, version: int) -> Path:
    check_view_name(view)
    _check_key(key)
    name = key + ENTRY_SUFFIX if version == 1 else entry_file_name(key)
    return root / view / name


def entry_path(root: str | Path, key: str, view: str) -> Path:
    """The file of entry ``key`` in ``view`` of the store at ``root`` (validating both names)."""
    return _entry_path(Path(root), key, view, store_version(root))


ENTRY_BUFFER_BYTES = 8 * 2**20
"""Encoded bytes of an entry kept in memory while it is written; past them, the frames go to a scratch file beside
the entry (:class:`EntryWriter`), so writing an entry of any length holds at most this much of its frames."""


class EntryWriter:
    """Writes one entry frame by frame in bounded memory, atomically: ``with EntryWriter(root, key, view) as w:
    w.add(frame) ...; w.commit(fps)``.

    The header (frame offsets and checksums) comes first in an entry file and needs every frame's size, so frames
    are held until :meth:`commit`: in memory up to ``buffer_bytes`` (default :data:`ENTRY_BUFFER_BYTES`; a short
    video is written in one go, as before), then in an unnamed scratch file in the entry's folder
    (``tempfile.TemporaryFile``: nothing is left behind when the process is killed, and it is on the store's file
    system). Memory per entry is then
    ``buffer_bytes`` plus 16 bytes per frame (its size and checksum), whatever the video's length. :meth:`commit`
    writes the header and the frames to a temporary file and renames it onto the entry (:func:`atomic_open`): the
    bytes are those :func:`write_entry` writes for the same frames. Leaving the ``with`` block without a commit
    (an error while the frames were made) writes nothing. State: the frames' sizes and checksums, the frames held.
    """

    def __init__(self, root: str | Path, key: str, view: str, buffer_bytes: int | None = None) -> None:
        self.root, self.key, self.view = Path(root), key, view
        self.path = _entry_path(self.root, key, view, store_version(root))
        self.buffer_bytes = ENTRY_BUFFER_BYTES if buffer_bytes is None else buffer_bytes
        self.frames = 0
        self.size = 0  # bytes of the frames added
        self.frame_size: tuple[int, int] | None = None  # (height, width), from the first frame
        self._sizes = array("Q")
        self._sums = array("Q") if xxhash is not None else None  # without xxhash: an entry without checksums
        self._held: list[bytes] = []
        self._spool: IO[bytes] | None = None

    def __enter__(self) -> EntryWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.discard()

    def add(self, frame: bytes) -> None:
        """Add the next encoded frame (all frames of an entry have the first one's size)."""
        if self.frame_size is None:
            try:
                self.frame_size = decode_jpeg(frame).shape[:2]
            except ValueError as error:
                raise DataError(f"entry {self.key!r} ({self.view}): first frame: {error}") from None
        self._sizes.append(len(frame))
        if self._sums is not None:
            self._sums.append(checksum(frame))
        self.frames += 1
        self.size += len(frame)
        if self._spool is None and self.size > self.buffer_bytes:
            with storage_errors(self.path, self.size):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._spool = tempfile.TemporaryFile(dir=self.path.parent)
            self._write_spool(b"".join(self._held))
            self._held = []
        if self._spool is None:
            self._held.append(frame)
        else:
            self._write_spool(frame)

    def _write_spool(self, data: bytes) -> None:
        assert self._spool is not None
        with storage_errors(self.path, self.size):
            self._spool.write(data)

    def commit(self, fps: float) -> int:
        """Write the entry (atomically) with the frames added; returns their number."""
        if not fps > 0:
            raise DataError(f"entry {self.key!r} ({self.view}): fps must be positive, got {fps!r}")
        if self.frames == 0:
            raise DataError(f"entry {self.key!r} ({self.view}): no frames to write")
        assert self.frame_size is not None
        height, width = self.frame_size
        header = _entry_header(self.key, height, width, fps, np.frombuffer(self._sizes, np.uint64),
                               None if self._sums is None else np.frombuffer(self._sums, np.uint64))
        with storage_errors(self.path, len(header) + self.size), atomic_open(self.path, "wb") as file:
            file.write(header)
            if self._spool is None:
                for frame in self._held:
                    file.write(frame)
            else:
                self._spool.flush()
                file.flush()
                _copy_file(self._spool.fileno(), file.fileno(), self.size, len(header))
        self.discard()
        return self.frames

    def discard(self) -> None:
        """Drop the frames held (the scratch file too); an entry committed before stays."""
        self._held = []
        if self._spool is not None:
            self._spool.close()
            self._spool = None


def _copy_file(source: int, target: int, size: int, target_offset: int) -> None:
    """Copy the first ``size`` bytes of the file ``source`` into ``target`` at ``target_offset`` (in the kernel
    where it can: ``os.copy_file_range``; else through a 1 MiB buffer)."""
    done = 0
    copy_range = getattr(os, "copy_file_range", None)
    while done < size and copy_range is not None:
        try:
            copied = copy_range(source, target, size - done, done, target_offset + done)
        except OSError as error:
            if error.errno in FULL_ERRNOS:
                raise
            break  # not supported between these files: copy through user space
        if copied == 0:
            break
        done += copied
    while done < size:
        data = os.pread(source, min(2**20, size - done), done)
        if not data:
            raise DataError(f"scratch file of an entry ended after {done} of its {size} bytes")
        done += os.pwrite(target, data, target_offset + done)


def write_entry(root: str | Path, key: str, view: str, encoded_frames: Iterable[bytes], fps: float,
                notes: dict[str, Any] | None = None) -> int:
    """Write one entry atomically (a temporary file in the same folder, fsync, then ``os.replace``); returns its
    number of frames.

    ``encoded_frames`` may be any iterable (a generator that decodes and encodes a video as it goes): it is
    consumed frame by frame through :class:`EntryWriter`, so memory does not grow with the entry's length, and an
    error raised while it is consumed writes nothing. The frame size is read from the first frame; all frames of
    an entry must have that size. ``notes`` (what the job notes about the entry, complete once its frames are
    made), when not empty, are written beside the entry before it is put in place (:func:`pending_notes_path`): a
    job killed before it records them (``kill -9``) leaves them for the next (:func:`adopt_pending_notes`).
    """
    if not fps > 0:
        raise DataError(f"entry {key!r} ({view}): fps must be positive, got {fps!r}")
    with EntryWriter(root, key, view) as writer:
        for frame in encoded_frames:
            writer.add(frame)
        if notes:  # (not synced: a killed process's writes stand; a machine's crash may lose them, not the entry)
            path = _pending(writer.path)
            with storage_errors(path), atomic_open(path, "w", fsync=False) as file:
                json.dump({"key": key, "notes": notes}, file)
        return writer.commit(fps)


PENDING_NOTES_SUFFIX = ".notes"
"""What an entry's file name gains for the file of its notes not yet recorded in ``notes_<view>.json``."""


def pending_notes_path(root: str | Path, key: str, view: str) -> Path:
    """The file beside the entry ``key`` of ``view`` holding what its job noted (:func:`write_entry`) until the
    job records it in the view's notes (:func:`record_notes`, then :func:`drop_pending_notes`)."""
    return _pending(entry_path(root, key, view))


def _pending(entry: Path) -> Path:
    return entry.with_name(entry.name + PENDING_NOTES_SUFFIX)


def adopt_pending_notes(store: ClipStore, view: str, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Record in the view's notes what a killed job left beside the entries of ``keys`` it wrote
    (:func:`write_entry`), and remove those files, with those of entries never put in place; returns the notes
    recorded. Run by the job writing ``view`` (holding its lock) on the keys it owns, before it starts: one scan of
    the view's folder finds them (none, unless a job was killed)."""
    folder = store.root / view
    files = sorted(folder.rglob("*" + ENTRY_SUFFIX + PENDING_NOTES_SUFFIX)) if folder.is_dir() else []
    if not files:
        return {}
    mine = set(keys)
    found: dict[str, dict[str, Any]] = {}
    for path in files:
        try:
            record = read_json_record(path) or {}
        except DataError:  # (damaged: its entry is noted as a job without notes would note it)
            record = {}
        key = record.get("key")
        if isinstance(key, str) and key not in mine:
            continue  # (another process's, or a video no longer indexed: left as found)
        if isinstance(key, str) and isinstance(record.get("notes"), dict) and store.has(key, view):
            found[key] = record["notes"]
        path.unlink(missing_ok=True)
    if found:
        record_notes(store.root, view, list(found), found)
    return found


def drop_pending_notes(store: ClipStore, view: str, keys: Iterable[str]) -> None:
    """Remove the notes left beside the entries of ``keys`` (:func:`write_entry`) once the job recorded them."""
    for key in keys:
        _pending(store.entry_path(key, view)).unlink(missing_ok=True)


def encode_header(key: str, height: int, width: int, fps: float, encoded_frames: Sequence[bytes]) -> bytes:
    """The header of a new entry file (version :data:`ENTRY_VERSION`): fields, key, frame offsets, the frames'
    checksums and the checksum of all of these."""
    count = len(encoded_frames)
    sizes = np.fromiter((len(f) for f in encoded_frames), np.uint64, count)
    sums = np.fromiter((checksum(f) for f in encoded_frames), np.uint64, count) if xxhash is not None else None
    return _entry_header(key, height, width, fps, sizes, sums)


def _entry_header(key: str, height: int, width: int, fps: float, sizes: np.ndarray, sums: np.ndarray | None) -> bytes:
    """The header of an entry of frames of ``sizes`` bytes with checksums ``sums`` (None: version 2, none)."""
    count = len(sizes)
    key_bytes = to_bytes(key)
    version = ENTRY_VERSION if sums is not None else 2  # without xxhash: no checksums, read as unverified
    header = (_HEADER.pack(_MAGIC, version, count, height, width, float(fps))
              + _KEY_LENGTH.pack(len(key_bytes)) + key_bytes)
    data_start = len(header) + 8 * (count + 1) + ((8 * count + _CHECKSUM.size) if version >= 3 else 0)
    offsets = np.empty(count + 1, "<u8")
    offsets[0] = data_start
    np.cumsum(sizes, out=offsets[1:])
    offsets[1:] += data_start
    if version < 3:
        return header + offsets.tobytes()
    header += offsets.tobytes() + np.asarray(sums).astype("<u8").tobytes()
    return header + _CHECKSUM.pack(checksum(header))


FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
"""Write errors that are the storage's, not the entry's: no space left, file too large, quota exceeded."""
UNWRITABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)
"""Write errors of a store (or a part of it) that may not be written: no video is to blame either."""


@contextmanager
def storage_errors(path: Path, needed: int | None = None) -> Iterator[None]:
    """Turn a write's :data:`FULL_ERRNOS` into :class:`StorageFullError` (see :meth:`StorageFullError.of`), and
    its :data:`UNWRITABLE_ERRNOS` into :class:`StorageUnwritableError`."""
    try:
        yield
    except OSError as error:
        if error.errno in FULL_ERRNOS:
            raise StorageFullError.of(Path(path), error, needed) from None
        if error.errno in UNWRITABLE_ERRNOS:
            where = error.filename or path
            raise StorageUnwritableError(f"{where}: {os.strerror(error.errno)} "
                                         f"({errno.errorcode.get(error.errno, error.errno)}): the store may not be "
                                         "written there") from None
        raise


class StorageFullError(DataError):
    """A store write failed because the storage is full (or the file too large for it): no video is to blame, so
    a job stops at once (:mod:`coclr.store.jobs`) and the same command, run again with space freed, goes on."""

    def __init__(self, message: str, needed: int = 0) -> None:
        super().__init__(message)
        self.needed = needed

    def __reduce__(self):
        return type(self), (str(self), self.needed)

    @classmethod
    def of(cls, path: Path, error: OSError, needed: int | None = None) -> StorageFullError:
        """The error of writing ``path`` (an entry of ``needed`` bytes, or a metadata file when None): one line
        naming the folder, the space needed and the space free."""
        folder = next((p for p in (path.parent, *path.parents) if p.is_dir()), path.parent)
        try:
            free = f"{human_size(shutil.disk_usage(folder).free)} free"
        except OSError:
            free = "free space unknown"
        name = errno.errorcode.get(error.errno, str(error.errno))
        what = f"{path.name}" if needed is None else f"an entry of {human_size(needed)}"
        return cls(f"{path.parent}: {os.strerror(error.errno)} ({name}) writing {what} ({free} in {folder})",
                   needed or 0)

    def with_remaining(self, entries: int) -> StorageFullError:
        """This error, saying how much the ``entries`` left of the job need at this entry's size, and what to do."""
        estimate = f", about {human_size(entries * self.needed)} at this entry's size" if self.needed else ""
        return StorageFullError(f"{self}; the job stopped with {entries} entries left{estimate}: free space there "
                                "(or move the store), then run the same command again to continue", self.needed)


class StorageUnwritableError(StorageFullError):
    """A store write refused by the file system (permissions, a read-only mount): the storage's fault, as a full
    disk is, so a job stops at once, blaming no video."""

    def with_remaining(self, entries: int) -> StorageUnwritableError:
        return StorageUnwritableError(f"{self}; the job stopped with {entries} entries left: make the store's "
                                      "folders writable (or copy the store where they are), then run the same "
                                      "command again to continue")


def human_size(size: float) -> str:
    """``size`` bytes as "12.3 kB", "4.5 MB", "1.2 GB" (decimal units)."""
    for unit in ("bytes", "kB", "MB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


# ---------------------------------------------------------------------------------------- failure records

def failures_path(root: str | Path, view: str) -> Path:
    """The file listing the entries of ``view`` whose job failed (``{"view", "failed": {key: reason}}``)."""
    check_view_name(view)
    return Path(root) / f"{FAILED_PREFIX}{view}.json"


def read_failures(root: str | Path, view: str) -> dict[str, str]:
    """The entries of ``view`` whose last job failed, with the reason (empty when none failed)."""
    path = failures_path(root, view)
    failed = (read_json_record(path, "delete it and run the job again") or {"failed": {}}).get("failed")
    if not isinstance(failed, dict):
        raise DataError(f"{path}: not a failure list (no mapping 'failed'); delete it and run the job again")
    return {str(key): str(reason) for key, reason in failed.items()}


def record_failures(root: str | Path, view: str, attempted: Iterable[str], failed: Iterable[tuple[str, str]]) -> Path:
    """Update the failure list of ``view`` after a job attempted the entries ``attempted``: their earlier failures
    are dropped and the new ones (``(key, reason)``) recorded; entries the job did not attempt keep theirs.
    Written atomically under the metadata lock (jobs of several processes may finish at once)."""
    return _update_entries(root, view, attempted, dict(failed), "failed", read_failures, failures_path)


def notes_path(root: str | Path, view: str) -> Path:
    """The file of what the job of ``view`` noted about the entries it wrote (``{"view", "notes": {key: {...}}}``):
    for the rgb view, ``damaged_frames`` (frames the decoder reported damaged, kept within its tolerance) and
    ``rotation``/``mirrored`` (how the frames were turned upright, as the video's display matrix asks) and
    ``pixel_aspect`` (a pixel's width over its height as a player shows it, as a fraction, where not square: the
    frames keep their coded width)."""
    check_view_name(view)
    return Path(root) / f"{NOTES_PREFIX}{view}.json"


def read_notes(root: str | Path, view: str) -> dict[str, dict[str, Any]]:
    """The notes of the entries of ``view`` (empty when there are none)."""
    path = notes_path(root, view)
    notes = (read_json_record(path, "delete it and run the job again") or {"notes": {}}).get("notes")
    if not isinstance(notes, dict) or not all(isinstance(note, dict) for note in notes.values()):
        raise DataError(f"{path}: not a notes file (no mapping 'notes' of mappings); delete it and run the job again")
    return {str(key): dict(note) for key, note in notes.items()}


def record_notes(root: str | Path, view: str, attempted: Iterable[str], notes: dict[str, dict[str, Any]]) -> Path:
    """Update the notes of ``view`` after a job attempted the entries ``attempted``: their earlier notes are dropped
    and the new ones recorded (as :func:`record_failures`, under the metadata lock)."""
    return _update_entries(root, view, attempted, notes, "notes", read_notes, notes_path)


def _update_entries(root: str | Path, view: str, attempted: Iterable[str], new: dict[str, Any], name: str,
                    read: Callable[[Path, str], dict[str, Any]], where: Callable[[Path, str], Path]) -> Path:
    """The update of :func:`record_failures` and :func:`record_notes`: under the metadata lock, the entries of the
    file ``where(root, view)`` (``{"view", name: {key: value}}``, read by ``read``) that a job attempted are dropped
    and ``new`` added; written atomically, and only when it has an entry or was there before."""
    root = Path(root)
    attempted = set(attempted)
    with metadata_lock(root):
        kept = {k: v for k, v in read(root, view).items() if k not in attempted}
        kept.update(new)
        path = where(root, view)
        if kept or path.exists():
            with storage_errors(path):
                atomic_write_json(path, {"view": view, name: dict(sorted(kept.items()))})
    return path


def _record_quietly(root: Path, view: str, key: str, reason: str) -> None:
    """List ``key`` as failed in ``view`` when the store can be written (a read-only one is only read)."""
    try:
        record_failures(root, view, [], [(key, reason)])
    except (OSError, StorageFullError):
        pass


# ------------------------------------------------------------------------------------------------ reading

@dataclass(frozen=True)
class _EntryHeader:
    path: str
    where: str  # the entry's key and file, for messages
    key: str | None  # None in version-1 entries
    height: int
    width: int
    fps: float
    offsets: np.ndarray  # uint64 [frames + 1]
    checksums: list[int] | None = None  # of each frame; None in entries written before checksums (versions 1, 2)
    checksum: int | None = None  # of the header (which holds the frames' checksums): the entry's checksum
    inode: int = 0  # of the file the header was read from: a file replaced since then is read afresh

    @property
    def frames(self) -> int:
        return len(self.offsets) - 1


class ClipStore:
    """Read access to a clip store (see the module docstring for the layout).

    State: the root, the format version, the index (loaded once), and a per-process LRU cache of entry headers
    (frame offsets), which is not pickled, so a store can be handed to DataLoader worker processes.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        record = _read_meta(self.root)
        self.version: int = record["version"]
        self.meta: dict[str, Any] = record["meta"]
        self.index: VideoIndex = _load_index(self.root)
        self._positions = {entry.path: i for i, entry in enumerate(self.index.entries)}
        self._headers: OrderedDict[tuple[str, str], _EntryHeader] = OrderedDict()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_headers"] = OrderedDict()
        return state

    def __repr__(self) -> str:
        return f"ClipStore({str(self.root)!r}: {self.index.name}, {len(self.index)} videos, views {self.views()})"

    def keys(self) -> list[str]:
        """Entry keys (the index's relative video paths), in index order."""
        return [entry.path for entry in self.index.entries]

    def entry(self, key: str):
        """The index entry (label, split, group) of ``key``."""
        return self.index.entries[self._position(key)]

    def rgb_command(self) -> str:
        """The command that writes the store's rgb entries: ``coclr data synth`` for a synthetic store (its frames are
        drawn, from its recorded config), else ``coclr data store`` (decoded from the videos)."""
        return "coclr data synth" if self.meta.get("generator") == "coclr.synth" else "coclr data store"

    def views(self) -> list[str]:
        """Names of the views that have a folder in the store."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _VIEW_NAME.match(p.name))

    def entry_path(self, key: str, view: str) -> Path:
        """The file of entry ``key`` in ``view`` (validating both names)."""
        return _entry_path(self.root, key, view, self.version)

    def has(self, key: str, view: str) -> bool:
        """Whether entry ``key`` of ``view`` is complete (written files are always complete)."""
        return self.entry_path(key, view).is_file()

    def failed(self, view: str) -> dict[str, str]:
        """The entries of ``view`` whose job failed, with the reason (:func:`read_failures`)."""
        return read_failures(self.root, view)

    def failed_inputs(self, *views: str) -> dict[str, str]:
        """The entries whose job failed in any of ``views``, each once, with the reason of the first of ``views`` it
        failed in: a view computed from an earlier one (flow from rgb) fails where that one did, and the earlier
        reason is the cause."""
        failed: dict[str, str] = {}
        for view in reversed(views):
            failed.update(self.failed(view))
        return {key: failed[key] for key in sorted(failed)}

    def notes(self, view: str) -> dict[str, dict[str, Any]]:
        """What decoding noted about the entries of ``view`` (:func:`read_notes`: damaged frames, a turn)."""
        return read_notes(self.root, view)

    def num_frames(self, key: str, view: str) -> int:
        return self._header(key, view).frames

    def frame_size(self, key: str, view: str) -> tuple[int, int]:
        """``(height, width)`` of the frames of entry ``key`` in ``view``."""
        header = self._header(key, view)
        return header.height, header.width

    def fps(self, key: str, view: str) -> float:
        return self._header(key, view).fps

    def checksum(self, key: str, view: str) -> str | None:
        """The checksum of entry ``key`` of ``view`` (of its header, which holds its frames' checksums, so it
        changes with any stored byte), or None for an entry written before checksums (unverified)."""
        value = self._header(key, view).checksum
        return None if value is None else format_checksum(value)

    def read_encoded(self, key: str, view: str, indices: Iterable[int] | np.ndarray) -> list[bytes]:
        """The encoded frames at ``indices`` (repeats allowed); consecutive indices are read in one call."""
        indices = _as_indices(indices)
        blobs = self._read_blobs(key, view, indices)
        return [blobs[i] for i in indices]

    def read(self, key: str, view: str, indices: Iterable[int] | np.ndarray) -> np.ndarray:
        """Decoded frames at ``indices`` as ``uint8 [T, H, W, 3]`` (RGB, or the flow view's u, v, 128). A frame that
        does not decode, or is not of the entry's size, is a :class:`DamagedEntryError`, its entry listed as failed
        (the job that writes the view rebuilds it on its next run)."""
        indices = _as_indices(indices)
        blobs = self._read_blobs(key, view, indices)
        header = self._header(key, view)
        out = np.empty((len(indices), header.height, header.width, 3), np.uint8)
        first_row: dict[int, int] = {}
        for row, index in enumerate(indices):
            if index in first_row:
                out[row] = out[first_row[index]]
                continue
            first_row[index] = row
            try:
                frame = decode_jpeg(blobs[index])
            except ValueError as error:  # (an entry from before checksums is read unchecked: its damage shows here)
                raise self._recorded(_broken(header.path, key, f"frame {index} does not decode ({error})")) from None
            if frame.shape != out.shape[1:]:
                size = f"{frame.shape[1]}x{frame.shape[0]}"
                raise self._recorded(_broken(header.path, key, f"frame {index} is {size}, the entry's frames are "
                                                               f"{header.width}x{header.height}"))
            out[row] = frame
        return out

    def _read_blobs(self, key: str, view: str, indices: list[int]) -> dict[int, bytes]:
        """Encoded frames by index, reading each run of consecutive indices with one ``pread``."""
        header = self._header(key, view)
        if not indices:
            return {}
        descriptor = _open_entry(header.path)
        try:
            if os.fstat(descriptor).st_ino != header.inode:  # replaced since (rebuilt, or checksums added): reload
                self._headers.pop((key, view), None)
                header = self._header(key, view)
            return self._read_runs(descriptor, key, header, indices)
        finally:
            os.close(descriptor)

    def _read_runs(self, descriptor: int, key: str, header: _EntryHeader, indices: list[int]) -> dict[int, bytes]:
        wanted = sorted(set(indices))
        if wanted[0] < 0 or wanted[-1] >= header.frames:
            raise DataError(f"{header.where}: the entry has {header.frames} frames; asked for indices "
                            f"{wanted[0]}..{wanted[-1]}")
        runs, run_start = [], wanted[0]
        for previous, current in zip(wanted, wanted[1:]):
            if current != previous + 1:
                runs.append((run_start, previous))
                run_start = current
        runs.append((run_start, wanted[-1]))
        offsets = header.offsets
        blobs: dict[int, bytes] = {}
        for first, last in runs:
            start, stop = int(offsets[first]), int(offsets[last + 1])
            data = os.pread(descriptor, stop - start, start)
            if len(data) != stop - start:
                raise self._recorded(_broken(header.path, key, "file shorter than its frame table"))
            bounds = (offsets[first: last + 2] - start).tolist()
            for i in range(first, last + 1):
                blobs[i] = data[bounds[i - first]: bounds[i - first + 1]]
        if header.checksums is not None:
            expected = header.checksums
            for i, blob in blobs.items():
                found = checksum(blob)
                if found != expected[i]:
                    raise self._recorded(_damaged(header.path, key, f"frame {i}", expected[i], found))
        return blobs

    def _recorded(self, error: DamagedEntryError) -> DamagedEntryError:
        """``error``, after listing its entry in the store's failure list (so a rerun of the job that writes the
        view rebuilds it, and training and evaluation leave it out) and forgetting its cached header."""
        self._headers.pop((error.key, error.view), None)
        _record_quietly(self.root, error.view, error.key, str(error))
        return error

    def verify(self, view: str, decode: bool = False) -> list[tuple[str, str]]:
        """``(key, problem)`` for every entry of ``view`` that is missing (problem "missing"), damaged (a checksum
        that does not match, a bad header, another key, a size that does not match the offsets table) or (with
        ``decode``) has a frame that does not decode cleanly to the entry's frame size. Damaged entries are
        recorded in the store's failure list (:meth:`check_entry`)."""
        problems = []
        for key in self.keys():
            problem = self.check_entry(key, view, decode)
            if problem is not None:
                problems.append((key, problem))
        return problems

    def check_entry(self, key: str, view: str, decode: bool = False) -> str | None:
        """What is wrong with entry ``key`` of ``view`` (see :meth:`verify`), or None: every byte is read and
        checked against its checksum (entries written before checksums only structurally), and with ``decode``
        every frame is decoded, a JPEG decoder's warning of corrupt data counting as damage. A damaged entry is
        listed in the store's failure list, so the job that writes the view rebuilds it on its next run."""
        path = self.entry_path(key, view)
        if not path.is_file():
            return "missing"
        self._headers.pop((key, view), None)
        try:
            header = self._header(key, view)
            size = path.stat().st_size
            if header.offsets[-1] != size:
                raise _broken(path, key, f"size {size} bytes, the frame table says {int(header.offsets[-1])}")
            for start in range(0, header.frames, 64):
                indices = list(range(start, min(start + 64, header.frames)))
                blobs = self._read_blobs(key, view, indices)
                if decode:
                    for index in indices:
                        self._decode_strict(key, header, index, blobs[index])
        except DamagedEntryError as error:
            _record_quietly(self.root, view, key, str(error))
            return str(error)
        except (DataError, OSError) as error:  # a file that cannot be read
            problem = str(_broken(path, key, str(error)))
            _record_quietly(self.root, view, key, problem)
            return problem
        return None

    def add_checksums(self, key: str, view: str) -> bool:
        """Rewrite entry ``key`` of ``view``, written before checksums, with them (the same frames, frame rate and
        key; atomically); False when it has them already. The caller holds the view's writing lock
        (:func:`coclr.store.jobs.view_lock`) and has checked the entry (:meth:`check_entry` with ``decode``): the
        checksums vouch for the bytes as they are now."""
        self._headers.pop((key, view), None)
        header = self._header(key, view)
        if header.checksums is not None:
            return False
        blobs = self._read_blobs(key, view, list(range(header.frames)))
        write_entry(self.root, key, view, [blobs[i] for i in range(header.frames)], header.fps)
        self._headers.pop((key, view), None)
        return True

    @staticmethod
    def _decode_strict(key: str, header: _EntryHeader, index: int, blob: bytes) -> None:
        try:
            frame = decode_jpeg_strict(blob)
        except ValueError as error:
            raise _broken(header.path, key, f"frame {index}: {error}") from None
        if frame.shape[:2] != (header.height, header.width):
            raise _broken(header.path, key, f"frame {index} is {frame.shape[1]}x{frame.shape[0]}, the entry's "
                          f"frames are {header.width}x{header.height}")

    def unlisted(self, view: str) -> list[str]:
        """Keys of the entry files of ``view`` that are not in the index (videos removed from it by an update);
        their files are kept, so that adding the videos back costs nothing. Version-1 stores: always []."""
        if self.version < 2 or not (self.root / view).is_dir():
            return []
        found = []
        for path in (self.root / view).glob(f"*/*{ENTRY_SUFFIX}"):
            try:
                key = _read_header(path).key
            except (DataError, OSError):  # (a folder where an entry's file belongs: "Is a directory", naming none)
                continue
            if key is not None and key not in self._positions:
                found.append(key)
        return sorted(found)

    def check_keys(self, keys: Iterable[str]) -> None:
        """A :class:`DataError` naming the keys (up to 20) that are not in the index, if any."""
        unknown = [key for key in keys if key not in self._positions]
        if unknown:
            raise DataError(f"{len(unknown)} keys are not in the index of {self.root}: {', '.join(unknown[:20])}")

    def _position(self, key: str) -> int:
        try:
            return self._positions[key]
        except KeyError:
            raise DataError(f"{self.root}: no entry {key!r} in the index") from None

    def _header(self, key: str, view: str) -> _EntryHeader:
        cache_key = (key, view)
        header = self._headers.get(cache_key)
        if header is not None:
            self._headers.move_to_end(cache_key)
            return header
        self._position(key)
        path = self.entry_path(key, view)
        if not path.is_file():
            raise DataError(f"{self.root}: no {view!r} entry of {key!r} (not built yet, or its job failed)")
        try:
            header = _read_header(path, key)
        except DamagedEntryError as error:
            raise self._recorded(error) from None
        self._headers[cache_key] = header
        if len(self._headers) > _HEADER_CACHE_SIZE:
            self._headers.popitem(last=False)
        return header


def open_store(store: ClipStore | str | Path) -> ClipStore:
    """``store`` itself, or the :class:`ClipStore` at that folder, with a clear error when it is not a store."""
    if isinstance(store, ClipStore):
        return store
    root = Path(store)
    if not root.is_dir():
        raise DataError(f"clip store not found: {root}")
    return ClipStore(root)


def _as_indices(indices: Iterable[int] | np.ndarray) -> list[int]:
    array = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices))
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"frame indices must be a 1-D sequence of integers, got {array.dtype} {array.shape}")
    return array.tolist()


def _open_entry(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise DataError(f"{path}: entry not in the store (not built yet?)") from None


def _read_header(path: Path, key: str | None = None) -> _EntryHeader:
    """The header of an entry file; with ``key``, a version-2 entry must hold that key. A version-3 header must
    match its checksum. A file that is no valid entry raises :class:`DamagedEntryError`."""
    descriptor = _open_entry(str(path))
    try:
        size = os.fstat(descriptor).st_size
        inode = os.fstat(descriptor).st_ino
        raw = os.pread(descriptor, _HEADER.size + _KEY_LENGTH.size, 0)
        if len(raw) < _HEADER.size:
            raise _broken(path, key, "file shorter than its header")
        magic, version, count, height, width, fps = _HEADER.unpack(raw[:_HEADER.size])
        if magic != _MAGIC or version not in READABLE_ENTRY_VERSIONS:
            raise _broken(path, key, f"not a coclr entry file of a version this library reads "
                          f"({', '.join(map(str, READABLE_ENTRY_VERSIONS))})")
        table_start, stored_key, key_bytes = _HEADER.size, None, b""
        if version >= 2:
            if len(raw) < _HEADER.size + _KEY_LENGTH.size:
                raise _broken(path, key, "file shorter than its header")
            (length,) = _KEY_LENGTH.unpack(raw[_HEADER.size:])
            table_start = _HEADER.size + _KEY_LENGTH.size + length
            if table_start > size:
                raise _broken(path, key, "key longer than the file")
            key_bytes = os.pread(descriptor, length, _HEADER.size + _KEY_LENGTH.size)
        table_size = 8 * (count + 1) + ((8 * count + _CHECKSUM.size) if version >= 3 else 0)
        if table_start + table_size > size:  # checked first: a damaged count must not make a huge read
            raise _broken(path, key, f"frame table of {count} frames longer than the file")
        table = os.pread(descriptor, table_size, table_start)
    finally:
        os.close(descriptor)
    entry_checksum = sums = None
    if version >= 3:
        (entry_checksum,) = _CHECKSUM.unpack(table[-_CHECKSUM.size:])
        found = checksum(raw[:_HEADER.size + _KEY_LENGTH.size] + key_bytes + table[:-_CHECKSUM.size])
        if found != entry_checksum:
            raise _damaged(path, key if key is not None else _guess_key(key_bytes), "header", entry_checksum, found)
        sums = np.frombuffer(table, "<u8", count, 8 * (count + 1)).tolist()  # ints: compared per read
    if version >= 2:
        stored_key = from_bytes(key_bytes)  # a file name's bytes, UTF-8 or not, as os.listdir gives it
    if key is not None and stored_key is not None and stored_key != key:
        raise _broken(path, key, f"holds the entry of {stored_key!r}")
    offsets = np.frombuffer(table, "<u8", count + 1)
    if count == 0 or np.any(np.diff(offsets.astype(np.int64)) <= 0):
        raise _broken(path, key, "bad frame table")
    where = f"entry {key or stored_key or path.name!r} ({path})"
    return _EntryHeader(str(path), where, stored_key, height, width, fps, offsets, sums, entry_checksum, inode)


def _guess_key(key_bytes: bytes) -> str | None:
    return key_bytes.decode("utf-8", "replace") or None


def _read_meta(root: Path) -> dict:
    path = root / META_FILE
    record = read_json_record(path)
    if record is None:
        raise DataError(f"not a clip store (no {META_FILE}): {root}")
    if record.get("format") != STORE_FORMAT:
        raise DataError(f"{path}: not a coclr clip store")
    if record.get("version") not in READABLE_VERSIONS:
        raise DataError(f"{path}: unsupported store version {record.get('version')!r} (this library reads "
                        f"{', '.join(map(str, READABLE_VERSIONS))})")
    record.setdefault("meta", {})
    if not isinstance(record["meta"], dict):  # (a hand-edited file: a traceback where it was read)
        raise DataError(f"{path}: \"meta\" must be a mapping, got {record['meta']!r}; restore the file (or build "
                        "the store again)")
    return record


_VERSIONS: dict[tuple[str, int, int], int] = {}


def store_version(root: str | Path) -> int:
    """The format version of the store at ``root`` (cached per state of its ``store.json``)."""
    path = Path(root) / META_FILE
    state = file_state(path)
    if state is None:
        raise DataError(f"not a clip store (no {META_FILE}): {root}")
    cache_key = (str(path.resolve()), *state)
    if cache_key not in _VERSIONS:
        _VERSIONS[cache_key] = _read_meta(Path(root))["version"]
    return _VERSIONS[cache_key]


def _load_index(root: Path) -> VideoIndex:
    return VideoIndex.load(root / INDEX_FILE)


def recorded_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` as ``store.json`` records it (a JSON round trip: tuples become lists), to compare with a record."""
    try:
        return json.loads(json.dumps(meta))
    except TypeError as error:
        raise DataError(f"store metadata must be JSON-serialisable: {error}") from None
