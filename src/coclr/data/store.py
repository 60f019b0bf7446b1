"""The clip store: every video decoded once into resized JPEG frames, packed one file per video and view.

Layout of a store folder::

    index.json                 the VideoIndex (entry key = the entry's relative video path)
    store.json                 format marker and metadata (short side, JPEG quality, ...)
    .lock                      held while a process updates store.json
    <view>/<key>.frames        one file per entry and view ("rgb", "flow", other flow backends' names)

An entry file is a small header, a table of frame offsets and the concatenated encoded frames, so a random
32-frame clip is two small reads and one contiguous read of one file (``docs/store.md`` compares this with
LMDB and sharded tar, measured). Entry files are written atomically (temporary file + ``os.replace``): an
entry file that exists is complete, which makes long jobs resumable by skipping existing entries.

Reading is safe from DataLoader worker processes: no file stays open between reads (each read opens,
``pread``s and closes), and the per-process header cache is dropped when a store is pickled.

:func:`run_entry_jobs` is the one engine for long store jobs (building the RGB view here, optical flow
extraction and the synthetic dataset elsewhere): a picklable ``job(key) -> (encoded_frames, fps)`` runs in a
process pool, finished entries are written atomically, complete ones skipped, failures listed.

Example::

    summary = build_store(ucf101_index("ucfTrainTestlist"), "UCF-101", "stores/ucf101", short_side=128)
    print(summary)   # rgb: 13320 done, 0 skipped, 0 failed in ...
    store = ClipStore("stores/ucf101")
    clip = store.read(store.keys()[0], "rgb", range(32))   # uint8 [32, 128, 171, 3]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import re
import signal
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

import cv2
import numpy as np

from coclr.atomic import PARTIAL_SUFFIX, atomic_open, atomic_write_text
from coclr.config import differences
from coclr.data.indexes import VideoIndex, check_videos_exist, is_relative_key
from coclr.errors import DataError

STORE_FORMAT = "coclr-clip-store"
STORE_VERSION = 1
INDEX_FILE = "index.json"
META_FILE = "store.json"
LOCK_FILE = ".lock"
ENTRY_SUFFIX = ".frames"

# Entry file: magic, version, frame count, height, width, fps; then uint64 offsets [count + 1] (absolute,
# offsets[i]..offsets[i+1] is frame i), then the encoded frames back to back. Little-endian.
_MAGIC = b"COCLRFRM"
_ENTRY_VERSION = 1
_HEADER = struct.Struct("<8sIIIId")
_VIEW_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HEADER_CACHE_SIZE = 4096
# OpenCV >= 4.10 decodes straight to RGB (about 8% faster than decoding to BGR and converting).
_IMREAD_RGB: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)

EntryJob = Callable[[str], tuple[Sequence[bytes], float]]
"""A store job: entry key -> (encoded frames, frames per second). Must be picklable."""


# ------------------------------------------------------------------------------------------- JPEG codec

def encode_jpeg(frame: np.ndarray, quality: int = 90) -> bytes:
    """Encode ``uint8 [H, W, 3]`` RGB as JPEG (OpenCV: deterministic for the same input and build)."""
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"expected a uint8 [H, W, 3] frame, got {frame.dtype} {tuple(frame.shape)}")
    if not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality must be in 1..100, got {quality}")
    ok, data = cv2.imencode(".jpg", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("OpenCV could not encode the frame as JPEG")
    return data.tobytes()


def decode_jpeg(data: bytes) -> np.ndarray:
    """Decode an encoded image (JPEG, or any format OpenCV reads) to ``uint8 [H, W, 3]`` RGB."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), _IMREAD_RGB or cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"cannot decode an image from {len(data)} bytes")
    return image if _IMREAD_RGB else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


# ----------------------------------------------------------------------------------------- store layout

@contextmanager
def _metadata_lock(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``root/.lock`` (``flock``) while a process reads and rewrites the store's
    metadata, so that jobs started side by side on one store (flow extraction of two views, say) do not lose
    each other's keys. Where ``fcntl`` does not exist (Windows), no lock is taken."""
    if fcntl is None:
        yield
        return
    with open(root / LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _new_metadata(root: Path, index: VideoIndex, meta: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``meta`` that the existing store ``root`` does not record yet. Raises :class:`DataError` if
    the store holds another index or records one of the keys with another value."""
    existing = _read_meta(root)["meta"]
    stored = _load_index(root)
    if stored.to_dict() != index.to_dict():
        raise DataError(f"{root} already holds a store of a different index ({stored.name!r}, "
                        f"{len(stored)} videos; given {index.name!r}, {len(index)} videos): "
                        "use another output folder")
    recorded = {k: existing[k] for k in meta if k in existing}
    conflicts = differences(recorded, {k: meta[k] for k in recorded})
    if conflicts:
        raise DataError(f"{root} was built with {', '.join(conflicts)}: use another output folder")
    return {k: v for k, v in meta.items() if k not in existing}


def create_store(root: str | Path, index: VideoIndex, **meta: Any) -> None:
    """Create the store folder ``root`` for ``index``, with JSON-serialisable metadata ``meta``.

    Idempotent: on an existing store with the same index, new metadata keys are added and existing keys
    must have the same value (so a resumed job cannot mix, e.g., two JPEG qualities). A different index
    raises :class:`DataError`. Processes that call it at the same time on one store each add their keys, and
    a store that records every key already is only read (it may be read-only).
    """
    root = Path(root)
    meta = _json_roundtrip(meta)
    meta_file = root / META_FILE
    if meta_file.is_file() and not _new_metadata(root, index, meta):
        return
    if root.exists() and not root.is_dir():
        raise DataError(f"store path exists and is not a folder: {root}")
    root.mkdir(parents=True, exist_ok=True)
    with _metadata_lock(root):
        if meta_file.is_file():  # read again under the lock: another process may have added keys
            new = _new_metadata(root, index, meta)
            if new:
                record = _read_meta(root)
                record["meta"].update(new)
                atomic_write_text(meta_file, json.dumps(record, indent=1))
        else:
            index.save(root / INDEX_FILE)
            record = {"format": STORE_FORMAT, "version": STORE_VERSION, "meta": meta}
            atomic_write_text(meta_file, json.dumps(record, indent=1))


def check_view_name(view: str) -> None:
    """Raise DataError unless ``view`` is a valid view (folder) name."""
    if not _VIEW_NAME.match(view):
        raise DataError(f"invalid view name {view!r} (letters, digits, '_', '-', '.')")


def entry_path(root: str | Path, key: str, view: str) -> Path:
    """The file of entry ``key`` in ``view`` (validating both names)."""
    check_view_name(view)
    if not is_relative_key(key):
        raise DataError(f"invalid entry key {key!r}: must be a relative path without '..'")
    return Path(root) / view / (key + ENTRY_SUFFIX)


def write_entry(root: str | Path, key: str, view: str, encoded_frames: Sequence[bytes], fps: float) -> None:
    """Write one entry atomically: a temporary file in the same folder, fsync, then ``os.replace``.

    The frame size is read from the first frame; all frames of an entry must have that size.
    """
    path = entry_path(root, key, view)
    if len(encoded_frames) == 0:
        raise DataError(f"entry {key!r} ({view}): no frames to write")
    if not fps > 0:
        raise DataError(f"entry {key!r} ({view}): fps must be positive, got {fps!r}")
    try:
        height, width = decode_jpeg(encoded_frames[0]).shape[:2]
    except ValueError as error:
        raise DataError(f"entry {key!r} ({view}): first frame: {error}") from None
    sizes = np.fromiter((len(f) for f in encoded_frames), np.uint64, len(encoded_frames))
    data_start = _HEADER.size + 8 * (len(encoded_frames) + 1)
    offsets = np.empty(len(encoded_frames) + 1, "<u8")
    offsets[0] = data_start
    np.cumsum(sizes, out=offsets[1:])
    offsets[1:] += data_start
    header = _HEADER.pack(_MAGIC, _ENTRY_VERSION, len(encoded_frames), height, width, float(fps))
    with atomic_open(path, "wb") as file:
        file.write(header)
        file.write(offsets.tobytes())
        for frame in encoded_frames:
            file.write(frame)


@dataclass(frozen=True)
class _EntryHeader:
    path: str
    height: int
    width: int
    fps: float
    offsets: np.ndarray  # uint64 [frames + 1]

    @property
    def frames(self) -> int:
        return len(self.offsets) - 1


class ClipStore:
    """Read access to a clip store (see the module docstring for the layout).

    State: the root, the index (loaded once), and a per-process LRU cache of entry headers (frame
    offsets), which is not pickled, so a store can be handed to DataLoader worker processes.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.meta: dict[str, Any] = _read_meta(self.root)["meta"]
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

    def views(self) -> list[str]:
        """Names of the views that have a folder in the store."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _VIEW_NAME.match(p.name))

    def has(self, key: str, view: str) -> bool:
        """Whether entry ``key`` of ``view`` is complete (written files are always complete)."""
        return entry_path(self.root, key, view).is_file()

    def num_frames(self, key: str, view: str) -> int:
        return self._header(key, view).frames

    def frame_size(self, key: str, view: str) -> tuple[int, int]:
        """``(height, width)`` of the frames of entry ``key`` in ``view``."""
        header = self._header(key, view)
        return header.height, header.width

    def fps(self, key: str, view: str) -> float:
        return self._header(key, view).fps

    def read_encoded(self, key: str, view: str, indices: Iterable[int] | np.ndarray) -> list[bytes]:
        """The encoded frames at ``indices`` (repeats allowed); consecutive indices are read in one call."""
        indices = _as_indices(indices)
        blobs = self._read_blobs(key, view, indices)
        return [blobs[i] for i in indices]

    def read(self, key: str, view: str, indices: Iterable[int] | np.ndarray) -> np.ndarray:
        """Decoded frames at ``indices`` as ``uint8 [T, H, W, 3]`` (RGB, or the flow view's u, v, 128)."""
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
            except ValueError as error:
                raise DataError(f"{header.path}: frame {index}: {error}") from None
            if frame.shape != out.shape[1:]:
                raise DataError(f"{header.path}: frame {index} is {frame.shape[1]}x{frame.shape[0]}, the "
                                f"entry's frames are {header.width}x{header.height}")
            out[row] = frame
        return out

    def _read_blobs(self, key: str, view: str, indices: list[int]) -> dict[int, bytes]:
        """Encoded frames by index, reading each run of consecutive indices with one ``pread``."""
        header = self._header(key, view)
        if not indices:
            return {}
        wanted = sorted(set(indices))
        if wanted[0] < 0 or wanted[-1] >= header.frames:
            raise DataError(f"{header.path}: the entry has {header.frames} frames; asked for indices "
                            f"{wanted[0]}..{wanted[-1]}")
        runs, run_start = [], wanted[0]
        for previous, current in zip(wanted, wanted[1:]):
            if current != previous + 1:
                runs.append((run_start, previous))
                run_start = current
        runs.append((run_start, wanted[-1]))
        offsets = header.offsets
        blobs: dict[int, bytes] = {}
        descriptor = _open_entry(header.path)
        try:
            for first, last in runs:
                start, stop = int(offsets[first]), int(offsets[last + 1])
                data = os.pread(descriptor, stop - start, start)
                if len(data) != stop - start:
                    raise DataError(f"{header.path}: file is shorter than its frame table (damaged entry)")
                bounds = (offsets[first: last + 2] - start).tolist()
                for i in range(first, last + 1):
                    blobs[i] = data[bounds[i - first]: bounds[i - first + 1]]
        finally:
            os.close(descriptor)
        return blobs

    def verify(self, view: str, decode: bool = False) -> list[tuple[str, str]]:
        """``(key, problem)`` for every entry of ``view`` that is missing, damaged or (with ``decode``)
        has a frame that does not decode to the entry's frame size."""
        problems = []
        for key in self.keys():
            path = entry_path(self.root, key, view)
            if not path.is_file():
                problems.append((key, "missing"))
                continue
            try:
                header = _read_header(path)
                if header.offsets[-1] != path.stat().st_size:
                    raise DataError(f"{path}: size {path.stat().st_size} bytes, the frame table says "
                                    f"{int(header.offsets[-1])}")
                if decode:
                    for start in range(0, header.frames, 64):
                        self.read(key, view, range(start, min(start + 64, header.frames)))
            except (DataError, OSError) as error:
                problems.append((key, str(error)))
        return problems

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
        header = _read_header(entry_path(self.root, key, view))
        self._headers[cache_key] = header
        if len(self._headers) > _HEADER_CACHE_SIZE:
            self._headers.popitem(last=False)
        return header



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


def _read_header(path: Path) -> _EntryHeader:
    descriptor = _open_entry(str(path))
    try:
        raw = os.pread(descriptor, _HEADER.size, 0)
        if len(raw) != _HEADER.size:
            raise DataError(f"{path}: damaged entry (file shorter than its header)")
        magic, version, count, height, width, fps = _HEADER.unpack(raw)
        if magic != _MAGIC or version != _ENTRY_VERSION:
            raise DataError(f"{path}: not a coclr entry file of version {_ENTRY_VERSION}")
        table = os.pread(descriptor, 8 * (count + 1), _HEADER.size)
        if len(table) != 8 * (count + 1):
            raise DataError(f"{path}: damaged entry (frame table cut short)")
    finally:
        os.close(descriptor)
    offsets = np.frombuffer(table, "<u8")
    if count == 0 or np.any(np.diff(offsets.astype(np.int64)) <= 0):
        raise DataError(f"{path}: damaged entry (bad frame table)")
    return _EntryHeader(str(path), height, width, fps, offsets)


def _read_meta(root: Path) -> dict:
    path = root / META_FILE
    if not path.is_file():
        raise DataError(f"not a clip store (no {META_FILE}): {root}")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: not valid JSON: {error}") from None
    if not isinstance(record, dict) or record.get("format") != STORE_FORMAT:
        raise DataError(f"{path}: not a coclr clip store")
    if record.get("version") != STORE_VERSION:
        raise DataError(f"{path}: unsupported store version {record.get('version')!r}")
    record.setdefault("meta", {})
    return record


def _load_index(root: Path) -> VideoIndex:
    return VideoIndex.load(root / INDEX_FILE)


def _json_roundtrip(meta: dict[str, Any]) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(meta))
    except TypeError as error:
        raise DataError(f"store metadata must be JSON-serialisable: {error}") from None


# ---------------------------------------------------------------------------------------------- job runner

@dataclass
class JobSummary:
    """What a store job did: entries written, skipped (already complete) and failed (key, message),
    frames written and wall-clock seconds."""

    view: str = ""
    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    frames: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        rate = self.frames / self.seconds if self.seconds > 0 else 0.0
        lines = [f"{self.view or 'entries'}: {self.done} done, {self.skipped} skipped (already complete), "
                 f"{len(self.failed)} failed; {self.frames} frames in {self.seconds:.1f} s ({rate:.1f} frames/s)"]
        lines += [f"  failed: {key}: {message}" for key, message in self.failed]
        return "\n".join(lines)


def run_entry_jobs(root: str | Path, view: str, keys: Iterable[str], job: EntryJob, workers: int = 0,
                   desc: str | None = None, start_method: str | None = None) -> JobSummary:
    """Run ``job(key) -> (encoded_frames, fps)`` for every key whose entry of ``view`` is not complete yet,
    in a pool of ``workers`` processes (0: one per core; 1: in this process), writing each result
    atomically as soon as it is done.

    Resumable: a killed run leaves only complete entries (and stray temporary files, removed by the next
    run), and the next run skips them. A job that raises (e.g. :class:`VideoDecodeError`) or whose worker
    process dies is counted and listed in the summary; the run goes on. Shows a progress bar with ETA.

    ``start_method`` is the multiprocessing start method of the pool. By default it is "fork" where the
    platform has it (workers start at once and work from any main program: scripts without a
    ``__main__`` guard, notebooks, stdin) unless CUDA is initialised in this process, which forked children
    cannot use: then "spawn" (the job must then be importable by the workers).
    """
    started = time.perf_counter()
    store = ClipStore(root)
    keys = list(dict.fromkeys(keys))
    store.check_keys(keys)
    check_view_name(view)
    try:
        pickle.dumps(job)
    except Exception as error:
        raise TypeError(f"the job must be picklable to run in worker processes: {error}") from None
    summary = JobSummary(view)
    todo = [key for key in keys if not store.has(key, view)]
    summary.skipped = len(keys) - len(todo)
    remove_stale_partials(store.root / view)
    workers = workers if workers > 0 else (os.cpu_count() or 1)
    workers = max(1, min(workers, len(todo)))
    from tqdm import tqdm

    with tqdm(total=len(todo), desc=desc or f"{view} entries", unit="video", smoothing=0.05,
              dynamic_ncols=True) as progress:
        def record(key: str, frames: int, error: str | None) -> None:
            if error is None:
                summary.done += 1
                summary.frames += frames
            else:
                summary.failed.append((key, error))
                progress.set_postfix(failed=len(summary.failed), refresh=False)
            progress.update(1)

        if todo and workers == 1:
            for key in todo:
                record(*_run_and_write(str(root), view, key, job))
        elif todo:
            _run_in_pool(str(root), view, todo, job, workers, record, start_method or _default_start_method())
    summary.seconds = time.perf_counter() - started
    return summary


def remove_stale_partials(folder: Path) -> int:
    """Delete temporary entry files under ``folder`` left by killed writers (whose process is gone)."""
    removed = 0
    if not folder.is_dir():
        return removed
    for directory, _, files in os.walk(folder):
        for name in files:
            if not name.endswith(PARTIAL_SUFFIX):
                continue
            pid = _writer_pid(name)
            if pid is not None and _process_alive(pid):
                continue
            Path(directory, name).unlink(missing_ok=True)
            removed += 1
    return removed


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


_WORKER_JOB: EntryJob | None = None


def _init_worker(job: EntryJob, parent_pid: int) -> None:
    global _WORKER_JOB
    _WORKER_JOB = job
    cv2.setNumThreads(1)  # one process per core already; OpenCV's own threads would oversubscribe
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled once, by the parent, which stops the pool
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()


def _exit_when_orphaned(parent_pid: int) -> None:
    """Stop this worker soon after its parent is killed (a pool worker would otherwise wait forever)."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _run_in_worker(root: str, view: str, key: str) -> tuple[str, int, str | None]:
    assert _WORKER_JOB is not None
    return _run_and_write(root, view, key, _WORKER_JOB)


def _run_and_write(root: str, view: str, key: str, job: EntryJob) -> tuple[str, int, str | None]:
    """Run one job and write its entry; returns (key, frames written, error message or None)."""
    try:
        encoded, fps = job(key)
        write_entry(root, key, view, encoded, fps)
        return key, len(encoded), None
    except Exception as error:  # one bad entry must not stop a job over thousands of videos
        return key, 0, f"{type(error).__name__}: {error}"


def _default_start_method() -> str:
    if "fork" not in multiprocessing.get_all_start_methods():
        return "spawn"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "spawn"
    return "fork"


def _run_in_pool(root: str, view: str, todo: list[str], job: EntryJob, workers: int,
                 record: Callable[[str, int, str | None], None], start_method: str) -> None:
    """Run the keys in a process pool with at most 2 jobs per worker in flight, so results stream in order
    of completion and a worker that dies (crash, out of memory) costs only its in-flight keys: they are
    failed and a new pool takes the rest."""
    context = multiprocessing.get_context(start_method)
    pending = list(reversed(todo))
    while pending:
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                   initargs=(job, os.getpid()))
        in_flight: dict[Future, str] = {}
        broken = False
        try:
            while (pending and not broken) or in_flight:
                while pending and not broken and len(in_flight) < 2 * workers:
                    key = pending.pop()
                    try:
                        in_flight[pool.submit(_run_in_worker, root, view, key)] = key
                    except BrokenProcessPool:
                        broken = True
                        if in_flight:
                            pending.append(key)
                        else:
                            record(key, 0, "worker processes could not be started")
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in finished:
                    key = in_flight.pop(future)
                    try:
                        record(*future.result())
                    except BrokenProcessPool:
                        broken = True
                        record(key, 0, "worker process died (crash or out of memory) while running this entry")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


# --------------------------------------------------------------------------------------------- RGB build

@dataclass(frozen=True)
class DecodeVideoJob:
    """Store job of the "rgb" view: decode ``video_root/<key>``, resize, resample, encode as JPEG."""

    video_root: str
    short_side: int | None = 128
    quality: int = 90
    fps: float | None = None

    def __call__(self, key: str) -> tuple[list[bytes], float]:
        from coclr.data.video import decode_video_with_rate

        frames, fps = decode_video_with_rate(Path(self.video_root) / key, self.short_side, self.fps)
        return [encode_jpeg(frame, self.quality) for frame in frames], fps


def build_store(index: VideoIndex, video_root: str | Path, out: str | Path, short_side: int | None = 128,
                quality: int = 90, fps: float | None = None, workers: int = 0) -> JobSummary:
    """Build (or resume building) the "rgb" view of the store ``out`` from the videos of ``index`` under
    ``video_root``: decoded once, resized to ``short_side``, optionally resampled to ``fps``, JPEG
    ``quality``. Missing videos are reported together before any work; undecodable ones are listed in the
    summary."""
    if short_side is not None and short_side < 1:
        raise DataError(f"short_side must be positive, got {short_side}")
    if not 1 <= quality <= 100:
        raise DataError(f"quality must be in 1..100, got {quality}")
    if fps is not None and not fps > 0:
        raise DataError(f"fps must be positive, got {fps}")
    check_videos_exist(index, video_root)
    create_store(out, index, short_side=short_side, quality=quality, fps=fps)
    job = DecodeVideoJob(str(Path(video_root).resolve()), short_side, quality, fps)
    return run_entry_jobs(out, "rgb", [e.path for e in index.entries], job, workers, desc="decoding videos")
