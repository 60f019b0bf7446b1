"""The output folder of ``coclr embed``: memory-mappable arrays plus JSON-lines metadata, resumable and atomic.

Layout::

    embed.json       the settings, the checkpoints (path, sha256, format), the dimension, library versions
    videos.npy       float32 [N, D], one unit vector per video (row i <-> line i of videos.jsonl)
    videos.jsonl     {"row", "path", "size", "mtime_ns", "duration", "fps", "frames", "windows", "damaged_frames",
                      "rotation", "mirrored", "padded", "first_window", "pixel_aspect"} (damaged_frames: frames the
                      decoder reported damaged, within its tolerance; rotation: degrees the frames were turned
                      clockwise, as the file's display matrix asks, then mirrored when "mirrored"; padded: shorter
                      than one window, whose last frame is repeated; pixel_aspect, only where not 1: a pixel's width
                      over its height as a player shows it, the frames kept at their coded width; rows written
                      before these keys lack them)
    windows.npy      float32 [M, D], one unit vector per window; a video's windows are consecutive rows
    windows.jsonl    {"row", "video", "start", "end"} (video row; seconds from the video's first frame, from the
                      frames' presentation timestamps)
    failed.jsonl     {"path", "size", "mtime_ns", "error"}: the files that could not be embedded
    chunks/          results of a run not merged into the files above yet (each chunk file written atomically)

A video is keyed by its absolute path; the same path with the same size and modification time is not embedded
again, a changed one replaces its row in place (same row number; its windows move to the end of windows.npy).
Rows stay true to the files: a video that fails loses its earlier row (the failure is in failed.jsonl), and a
run drops the rows of files removed or changed since they were embedded that it does not embed again (the rows
after a dropped one move up). New rows follow the order of the run's inputs, whichever process embedded them and
whenever they were flushed, so a distributed run writes the folder one process writes.

Writes: while a run goes, finished videos are written to chunk files (atomically, every ``flush_videos``
videos or ``flush_seconds``). Merging them rewrites the five files as temporary ``.next`` files, then records
the list of renames in ``commit.json`` (atomically), then renames and deletes the merged chunks, then deletes
``commit.json``. A run that starts finds and finishes an interrupted commit, then counts what chunks remain as
done and merges them with its own as it ends (new rows in the order of its inputs: the folder of a run stopped
and continued is the one it would have written at once), so a kill at any moment loses at most the unflushed
videos, and never leaves a duplicate or a half-written row.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coclr.atomic import (
    atomic_open,
    atomic_write_json,
    file_identity,
    file_state,
    read_json_record,
    remove_stale_partials,
)
from coclr.embed.settings import EmbedSettings
from coclr.errors import ConfigError, DataError
from coclr.filelock import lock_holder
from coclr.runfolder import LOCK_FILE, FolderRecord, FolderRule, claim_folder, folder_lock

SETTINGS_FILE = "embed.json"
COMMIT_FILE = "commit.json"
CHUNKS = "chunks"
NEXT_SUFFIX = ".next"
VIDEOS, WINDOWS = "videos", "windows"
SNAPSHOT_TRIES, SNAPSHOT_WAIT = 6, 0.25
"""How often a reader reads a folder a coclr embed is committing to (the files changed while read), and the wait
before each try (growing by as much each time: 5 s in all)."""
FAILED = "failed.jsonl"
FORMAT = "coclr-embeddings"
CHECKPOINTS = ("checkpoint", "flow_checkpoint")
"""The checkpoints ``embed.json`` records (path, sha256, format): the RGB stream's, the flow stream's."""


def _as_typed(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as the options take them: the decoded size as ``--short-side 0`` gives it (recorded as null), an
    encoder by the option that gives it (another encoder was refused as ``checkpoint_sha256='59ae...'``)."""
    settings = {**settings, "short_side": 0} if "short_side" in settings and settings["short_side"] is None \
        else dict(settings)
    for key, option in (("checkpoint_sha256", "--checkpoint (its sha256)"),
                        ("flow_checkpoint_sha256", "--flow-checkpoint (its sha256)")):
        if key in settings:
            settings[option] = settings.pop(key)
    return settings


def _flow_of_old(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings recorded before ``flow_method`` was (2026-12-02): their flow was TV-L1 at OpenCV's defaults (None),
    whatever the flow encoder had been trained on, so a folder of them continues only with that flow."""
    return {"flow_method": None, **settings}


EMBED_FOLDER = FolderRule("embed", "embeddings", other="another output folder", shown=_as_typed, same=_flow_of_old)
"""How an output folder is continued or refused (:mod:`coclr.runfolder`): by the ``"settings"`` of ``embed.json``."""
ARRAY_BLOCK = 65536
"""Rows copied at a time when the arrays are rewritten (bounds memory for millions of rows)."""


class ChunkWriter:
    """Buffers results and writes them to chunk files of an output folder (atomically, every ``flush_videos``
    results or ``flush_seconds``); :class:`EmbeddingWriter` merges them. Alone, it is what the other processes
    of a distributed job use (rank 0 holds the folder). State: the results and events not flushed yet.

    A chunk records, in order of events: the videos embedded (with their position ``order`` in the run's list of
    inputs, which orders new rows whatever process or moment embedded them), the failures, and the stale paths
    (files removed or changed since their row was written, not embedded again): a failure or a stale path drops
    the path's row at the merge, so no row outlives the file it was computed from.
    """

    def __init__(self, root: str | Path, record: dict[str, Any], flush_videos: int = 256,
                 flush_seconds: float = 60.0, name: str = "") -> None:
        self.root = Path(root)
        self.record = json.loads(json.dumps(record))
        self.flush_videos, self.flush_seconds = flush_videos, flush_seconds
        self.name = name
        self._buffer: list[tuple[Any, tuple[int, int], int]] = []
        self._failures: list[dict[str, Any]] = []
        self._stale: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._sequence = 0
        self._added = 0

    def add(self, result, identity: tuple[int, int], order: int | None = None) -> None:
        """Add a :class:`~coclr.embed.embedder.VideoEmbedding` of the file with ``identity``; ``order`` places a
        new row among the others of the run (default: the order of the calls)."""
        self._buffer.append((result, identity, self._added if order is None else int(order)))
        self._added += 1
        self._maybe_flush()

    def add_failure(self, path: str, identity: tuple[int, int] | None, error: str) -> None:
        """Record that ``path`` (with ``identity``) could not be embedded: its old row, if any, is dropped."""
        size, mtime = identity if identity is not None else (None, None)
        self._failures.append({"path": path, "size": size, "mtime_ns": mtime, "error": error})
        self._maybe_flush()

    def add_stale(self, path: str, reason: str) -> None:
        """Record that the row of ``path`` no longer matches its file (``reason``: one line): it is dropped."""
        self._stale.append({"path": path, "reason": reason})
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if (len(self._buffer) + len(self._failures) + len(self._stale) >= self.flush_videos
                or time.monotonic() - self._last_flush >= self.flush_seconds):
            self.flush()

    def flush(self) -> None:
        """Write the buffered results to a new chunk file (atomically)."""
        self._last_flush = time.monotonic()
        if not self._buffer and not self._failures and not self._stale:
            return
        dim = int(self.record["dim"])
        results = [result for result, _, _ in self._buffer]
        videos = [{"path": r.path, "size": ident[0], "mtime_ns": ident[1], "duration": r.duration, "fps": r.fps,
                   "frames": r.frames, "windows": len(r.windows), "damaged_frames": r.damaged_frames,
                   "rotation": r.rotation, "mirrored": r.mirrored, "padded": r.padded,
                   **({"pixel_aspect": r.pixel_aspect} if r.pixel_aspect != 1 else {})}
                  for r, ident, _ in self._buffer]
        arrays = {
            "videos": np.stack([r.vector for r in results]).astype(np.float32) if results
            else np.zeros((0, dim), np.float32),
            "windows": np.concatenate([r.windows for r in results]).astype(np.float32) if results
            else np.zeros((0, dim), np.float32),
            "starts": np.concatenate([r.starts for r in results]) if results else np.zeros(0),
            "ends": np.concatenate([r.ends for r in results]) if results else np.zeros(0),
        }
        meta = json.dumps({"videos": videos, "order": [order for _, _, order in self._buffer],
                           "failed": self._failures, "stale": self._stale})
        name = f"{time.time_ns():020d}-{os.getpid()}{self.name}-{self._sequence:06d}.npz"
        self._sequence += 1
        with atomic_open(self.root / CHUNKS / name, "wb") as out:
            np.savez(out, meta=np.array(meta), **arrays)
        self._flushed(self._buffer, self._failures, self._stale)
        self._buffer, self._failures, self._stale = [], [], []

    def _flushed(self, results: list[tuple[Any, tuple[int, int], int]], failures: list[dict[str, Any]],
                 stale: list[dict[str, Any]]) -> None:
        """Called with what a flush wrote."""


class EmbeddingWriter(ChunkWriter):
    """Writes an output folder (see the module docstring): use as ``with EmbeddingWriter(root, record) as out``.

    ``record`` is what ``embed.json`` holds; its ``"settings"`` must equal the folder's (else
    :class:`~coclr.runfolder.FolderRefused` naming each differing key). Opening checks, then locks the folder
    (a refused run writes nothing), finishes an interrupted commit and counts the chunks a stopped run left as done;
    closing flushes and merges them with its own (interrupted, SIGINT or SIGTERM: flushes only, and the next run
    merges). State: the videos done (identity by path), the failures, and the results not flushed yet.
    """

    def __init__(self, root: str | Path, record: dict[str, Any], flush_videos: int = 256,
                 flush_seconds: float = 60.0) -> None:
        super().__init__(root, record, flush_videos, flush_seconds)
        self._lock: contextlib.ExitStack | None = None
        self.positions: dict[str, int] = {}
        """Each input's position in the run's list (:meth:`place`)."""

    # ------------------------------------------------------------------ opening and closing

    def __enter__(self) -> EmbeddingWriter:
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(claim_folder(self.root, EMBED_FOLDER, self.record["settings"],
                                              record=self._folder_record()))
        try:
            recover(self.root)
            left = self._chunks()  # (a run stopped before it merged them)
            if not (self.root / f"{VIDEOS}.npy").is_file():
                lost_array(self.root)
                if not left:
                    self.merge()  # a new folder: its empty arrays
            if (self.root / f"{VIDEOS}.npy").is_file():
                Embeddings(self.root)  # the folder as it is must be whole to be continued
            videos = read_jsonl(self.root / f"{VIDEOS}.jsonl")  # every record checked before the work
            read_jsonl(self.root / f"{WINDOWS}.jsonl", len(videos))
            self.done = {r["path"]: (r["size"], r["mtime_ns"]) for r in videos}
            failures = read_jsonl(self.root / FAILED)
            self.failed = {r["path"]: (r["size"], r["mtime_ns"]) for r in failures}
            self.errors = {r["path"]: r.get("error") or "failed" for r in failures}
            for chunk in left:  # done as the stopped run left them; merged with this run's results as it ends, so
                meta, _ = _read_chunk(chunk)  # that its new rows follow the inputs' order (not when it stopped);
                # read whole now, so that a damaged one is said before the work, not at the merge after it
                self._noted([(video["path"], (video["size"], video["mtime_ns"])) for video in meta["videos"]],
                            meta["failed"], meta.get("stale", []))
        except BaseException:
            self._lock.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: Any) -> None:
        try:
            self.flush()
            if kind is None or not issubclass(kind, KeyboardInterrupt):  # interrupted: the next run merges (the
                self.merge()  # merge rewrites the whole folder, too long for a stop that must take seconds)
        finally:
            assert self._lock is not None
            self._lock.close()

    def _folder_record(self) -> FolderRecord:
        """How the folder records its settings (:func:`~coclr.runfolder.claim_folder`): the ``"settings"`` of
        ``embed.json``, which a new folder is given with the rest of the record (checkpoints, dimension,
        versions); a folder continued with its checkpoints at other paths (the same content: the settings hold their
        sha256) records where they are now, where a search embeds its query with them."""
        def settings(folder: Path) -> dict[str, Any] | None:
            return read_settings(folder).get("settings", {}) if (folder / SETTINGS_FILE).is_file() else None

        def write(folder: Path, held: bool) -> None:
            if not held:
                atomic_write_json(folder / SETTINGS_FILE, {"format": FORMAT, **self.record})
                return
            kept = read_settings(folder)  # the same settings, so the same checkpoints' content: where they are now
            moved = {name: {**kept[name], "path": self.record[name]["path"]} for name in CHECKPOINTS
                     if kept.get(name) and self.record.get(name) and kept[name]["path"] != self.record[name]["path"]}
            if moved:
                atomic_write_json(folder / SETTINGS_FILE, {**kept, **moved})

        return FolderRecord(SETTINGS_FILE, settings, write)

    # ------------------------------------------------------------------ adding results

    def todo(self, path: str, identity: tuple[int, int] | None, retry_failed: bool = False) -> bool:
        """Whether ``path`` (with its current identity, None when it cannot be read) still needs embedding: not
        when its row is there for this identity, nor when it failed before with this identity (a file missing
        then and now included) unless ``retry_failed``."""
        if identity is not None and self.done.get(path) == identity:
            return False
        return retry_failed or self.failed.get(path) != (identity or (None, None))

    def failed_before(self, path: str, identity: tuple[int, int] | None) -> str | None:
        """Why ``path`` failed before, when it is not tried again for that (:meth:`todo` without ``retry_failed``:
        the same identity); None otherwise."""
        if identity is not None and self.done.get(path) == identity:
            return None
        return self.errors.get(path) if self.failed.get(path) == (identity or (None, None)) else None

    def stale(self, skip: set[str]) -> dict[str, str]:
        """The rows (path -> reason) whose file was removed or changed since it was embedded, among the paths
        not in ``skip`` (the ones this run embeds again)."""
        out = {}
        for path, identity in self.done.items():
            if path in skip:
                continue
            now = file_identity(path)
            if now is None:
                out[path] = "removed"
            elif now != identity:
                out[path] = "changed since it was embedded"
        return out

    def place(self, paths: Sequence[str]) -> None:
        """The run's inputs, in order: its new rows follow it, those of an earlier run stopped before it merged
        them (the same command continued) included; the others' after them."""
        self.positions = {path: position for position, path in enumerate(paths)}

    def _flushed(self, results: list[tuple[Any, tuple[int, int], int]], failures: list[dict[str, Any]],
                 stale: list[dict[str, Any]]) -> None:
        self._noted([(result.path, identity) for result, identity, _ in results], failures, stale)

    def _noted(self, videos: list[tuple[str, tuple[int, int]]], failures: list[dict[str, Any]],
               stale: list[dict[str, Any]]) -> None:
        """What a chunk holds, as done (the videos), failed or dropped (stale)."""
        for path, identity in videos:
            self.done[path] = identity
        for failure in failures:
            self.failed[failure["path"]] = (failure["size"], failure["mtime_ns"])
            self.errors[failure["path"]] = failure["error"]
            self.done.pop(failure["path"], None)
        for record in stale:
            self.done.pop(record["path"], None)

    # ------------------------------------------------------------------ merging

    def _chunks(self) -> list[Path]:
        """The chunk files in the order they were written."""
        return sorted((self.root / CHUNKS).glob("*.npz")) if (self.root / CHUNKS).is_dir() else []

    def merge(self) -> None:
        """Merge the chunk files into the arrays and JSON-lines files (see the module docstring).

        Rows of unchanged videos keep their order; a re-embedded video keeps its row (its windows move to the
        end); a failed or stale video's row is dropped (the rows after it move up); new videos follow, ordered
        by their position in their run's inputs, so the folder does not depend on which process embedded what
        or when results were flushed."""
        chunks = self._chunks()
        if not chunks and (self.root / f"{VIDEOS}.npy").is_file():
            return
        dim = int(self.record["dim"])
        videos = read_jsonl(self.root / f"{VIDEOS}.jsonl")
        windows = read_jsonl(self.root / f"{WINDOWS}.jsonl")
        old_videos = _open_array(self.root / f"{VIDEOS}.npy", dim)
        old_windows = _open_array(self.root / f"{WINDOWS}.npy", dim)
        failed = {r["path"]: r for r in read_jsonl(self.root / FAILED)}

        # The latest result of every path: (its order, chunk number, position in chunk); the rows to drop.
        latest: dict[str, tuple[int, int, int]] = {}
        dropped: set[str] = set()
        loaded = []
        for number, chunk in enumerate(chunks):
            meta, arrays = _read_chunk(chunk)
            first = np.concatenate([[0], np.cumsum([v["windows"] for v in meta["videos"]])]).astype(np.int64)
            loaded.append((meta, arrays, first))
            orders = meta.get("order") or list(range(len(meta["videos"])))
            for position, video in enumerate(meta["videos"]):
                latest[video["path"]] = (int(orders[position]), number, position)
                failed.pop(video["path"], None)
                dropped.discard(video["path"])
            for failure in meta["failed"]:
                failed[failure["path"]] = failure
            for path in [f["path"] for f in meta["failed"]] + [s["path"] for s in meta.get("stale", [])]:
                latest.pop(path, None)
                dropped.add(path)

        kept = [record for record in videos if record["path"] not in dropped]
        new_row = {record["row"]: row for row, record in enumerate(kept)}
        row_of = {record["path"]: new_row[record["row"]] for record in kept}
        ordered = sorted(latest, key=lambda path: (path not in self.positions, self.positions.get(path, 0),
                                                   latest[path]))
        for path in ordered:
            row_of.setdefault(path, len(row_of))
        replaced = {row_of[path] for path in latest if row_of[path] < len(kept)}
        num_videos = len(row_of)
        kept_windows = [w for w in windows if w["video"] in new_row and new_row[w["video"]] not in replaced]
        num_windows = len(kept_windows) + sum(loaded[n][0]["videos"][p]["windows"] for _, n, p in latest.values())

        temps = {}
        video_out = _new_array(self.root / f"{VIDEOS}.npy", (num_videos, dim), temps)
        window_out = _new_array(self.root / f"{WINDOWS}.npy", (num_windows, dim), temps)
        _copy_rows(old_videos, [record["row"] for record in kept], video_out)
        # Windows of unchanged videos, in their order, then the new ones.
        write_at = _copy_rows(old_windows, [w["row"] for w in kept_windows], window_out)
        new_window_records, first_window = [], {}
        for row, record in enumerate(kept_windows):
            video = new_row[record["video"]]
            new_window_records.append({**record, "row": row, "video": video})
            first_window.setdefault(video, row)
        video_records = {row: {**record, "row": row} for row, record in enumerate(kept)}
        for path in ordered:
            _, number, position = latest[path]
            meta, arrays, first = loaded[number]
            row = row_of[path]
            video_out[row] = arrays["videos"][position]
            begin, end = int(first[position]), int(first[position + 1])
            window_out[write_at: write_at + end - begin] = arrays["windows"][begin:end]
            for offset in range(end - begin):
                new_window_records.append({"row": write_at + offset, "video": row,
                                           "start": float(arrays["starts"][begin + offset]),
                                           "end": float(arrays["ends"][begin + offset])})
            first_window[row] = write_at
            write_at += end - begin
            video_records[row] = {"row": row, **meta["videos"][position]}
        assert write_at == num_windows
        for row, record in video_records.items():
            record["first_window"] = first_window.get(row, 0)
        for array in (video_out, window_out):
            if isinstance(array, np.memmap):
                array.flush()
        del video_out, window_out, old_videos, old_windows
        _write_lines(self.root / f"{VIDEOS}.jsonl", [video_records[row] for row in range(num_videos)], temps)
        _write_lines(self.root / f"{WINDOWS}.jsonl", new_window_records, temps)
        _write_lines(self.root / FAILED, [failed[path] for path in sorted(failed)], temps)
        for temp in temps.values():
            _fsync(temp)
        atomic_write_json(self.root / COMMIT_FILE, {"renames": {str(t.name): str(f.name) for f, t in temps.items()},
                                                    "chunks": [chunk.name for chunk in chunks]})
        recover(self.root)


def _read_chunk(chunk: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        with np.load(chunk, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays = {key: data[key] for key in ("videos", "windows", "starts", "ends")}
    except (OSError, ValueError, KeyError) as error:
        raise DataError(f"{chunk}: unreadable chunk file ({error}); delete it and run again") from None
    return meta, arrays


def _copy_rows(source: np.ndarray, rows: list[int], target: np.ndarray) -> int:
    """Copy ``source[rows]`` (sorted) to the first ``len(rows)`` rows of ``target``, in blocks of consecutive
    rows (bounded memory); returns ``len(rows)``."""
    write_at = 0
    for begin, end in _runs(rows):
        for start in range(begin, end, ARRAY_BLOCK):
            stop = min(end, start + ARRAY_BLOCK)
            target[write_at: write_at + stop - start] = source[start:stop]
            write_at += stop - start
    return write_at


def recover(root: Path) -> None:
    """Finish an interrupted commit (renames, then chunk deletions), and remove leftover temporary files."""
    commit = root / COMMIT_FILE
    plan = read_json_record(commit)
    if plan is not None:
        for temp, final in plan["renames"].items():
            if (root / temp).is_file():
                os.replace(root / temp, root / final)
        for chunk in plan["chunks"]:
            (root / CHUNKS / chunk).unlink(missing_ok=True)
        commit.unlink()
    for leftover in root.glob("*" + NEXT_SUFFIX):
        leftover.unlink()
    remove_stale_partials(root / CHUNKS)


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs ``[begin, end)`` of a sorted list of rows."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs


def _open_array(path: Path, dim: int) -> np.ndarray:
    if not path.is_file():
        return np.zeros((0, dim), np.float32)
    return load_array(path, "r")


def load_array(path: Path, mode: str = "c", dim: int | None = None) -> np.ndarray:
    """A folder's array of rows, memory-mapped (``mode``: numpy's ``mmap_mode``); one that cannot be read, or whose
    rows are not ``dim`` float32 numbers, is :func:`damaged`."""
    try:
        array = np.load(path, mmap_mode=mode)
    except (OSError, ValueError, EOFError) as error:
        text = str(error).strip()
        raise damaged(path, text.splitlines()[0] if text else type(error).__name__) from None
    if array.ndim != 2 or array.dtype != np.float32 or (dim is not None and array.shape[1] != dim):
        raise damaged(path, f"a {array.dtype} array of shape {array.shape}, not rows of {dim or 'D'} float32")
    return array


def lost_array(root: Path) -> None:
    """Refuse a folder whose ``videos.npy`` is gone while its other files hold rows (:func:`damaged`): a folder
    without it is new only when it holds none of them."""
    held = [name for name in (f"{VIDEOS}.jsonl", f"{WINDOWS}.npy", f"{WINDOWS}.jsonl") if (root / name).is_file()]
    if held:
        raise damaged(root / f"{VIDEOS}.npy", f"missing, while {', '.join(held)} {'is' if len(held) == 1 else 'are'} "
                      "there")


def damaged(what: str | Path, problem: str) -> DataError:
    """The error of a folder changed from outside (its writes are atomic, so nothing of ours leaves it so)."""
    return DataError(f"{what}: damaged ({problem}); this folder cannot be read or continued: move it away and run "
                     "coclr embed again")


def _new_array(final: Path, shape: tuple[int, int], temps: dict[Path, Path]) -> np.ndarray:
    temp = final.with_name(final.name + NEXT_SUFFIX)
    temps[final] = temp
    if shape[0] == 0:  # an empty file cannot be memory-mapped
        with open(temp, "wb") as out:
            np.save(out, np.zeros(shape, np.float32))
        return np.zeros(shape, np.float32)
    array = np.lib.format.open_memmap(temp, mode="w+", dtype=np.float32, shape=shape)
    if hasattr(os, "posix_fallocate"):  # the file's blocks taken now: on a full disk, a write through the map of a
        with _naming(temp), open(temp, "rb+") as handle:  # sparse file killed the process (SIGBUS), not a line
            os.posix_fallocate(handle.fileno(), 0, os.fstat(handle.fileno()).st_size)
    return array


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An ``OSError`` of a write of ``path`` (the disk full) that names no file, raised again naming it."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from None


def _write_lines(final: Path, records: list[dict[str, Any]], temps: dict[Path, Path]) -> None:
    temp = final.with_name(final.name + NEXT_SUFFIX)
    temps[final] = temp
    with _naming(temp), open(temp, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")


def _fsync(path: Path) -> None:
    with _naming(path), open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_or_none(value: Any) -> bool:
    return value is None or _is_int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_problem(name: str, record: Any, number: int, videos: int | None = None) -> str | None:
    """What is wrong with record ``number`` (0-based) of the folder's ``name`` file (``videos.jsonl``,
    ``windows.jsonl`` or ``failed.jsonl``), or None: each file's keys with values of their type, a row that is its
    line, a window's video one of the ``videos`` rows. The folder's own writes never leave one wrong (they are
    atomic): a wrong one was changed from outside."""
    if not isinstance(record, dict):
        return "not a record"
    if name == FAILED:  # (a file gone has no size or time)
        keys = {"path": str, "size": _is_int_or_none, "mtime_ns": _is_int_or_none}
    elif name == f"{VIDEOS}.jsonl":
        keys = {"row": _is_int, "path": str, "size": _is_int, "mtime_ns": _is_int}
    elif name == f"{WINDOWS}.jsonl":
        keys = {"row": _is_int, "video": _is_int, "start": _is_number, "end": _is_number}
    else:
        return None
    for key, kind in keys.items():
        if not (isinstance(record.get(key), kind) if isinstance(kind, type) else kind(record.get(key))):
            return f"its {key} is {record[key]!r}" if key in record else f"no {key}"
    if "row" in keys and record["row"] != number:
        return f"row {record['row']} on line {number + 1}"
    if "video" in keys and videos is not None and not 0 <= record["video"] < videos:
        return f"video {record['video']}, of {videos} video rows"
    return None


def read_jsonl(path: Path, videos: int | None = None) -> list[dict[str, Any]]:
    """The records of a JSON-lines file of the folder ([] when it does not exist), each checked
    (:func:`record_problem`; ``videos``: the video rows a window may name): a line that is not JSON, the last one
    too (the files are written whole, never appended to), or a wrong record is :func:`damaged`."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise damaged(path, f"record {len(records) + 1} is not JSON: {error}") from None
        problem = record_problem(path.name, record, len(records), videos)
        if problem:
            raise damaged(path, f"record {len(records) + 1}: {problem}")
        records.append(record)
    return records


class JsonLines(Sequence):
    """The records of a JSON-lines file of the folder as a read-only list whose lines are parsed and checked
    (:func:`record_problem`) when first read (a search of millions of rows reads the ``k`` it prints); a line that
    is not JSON, or a wrong record, is :func:`damaged` naming the file and record."""

    def __init__(self, path: Path, videos: int | None = None) -> None:
        self.path = path
        self.videos = videos
        self._data = path.read_bytes() if path.is_file() else b""
        ends = np.flatnonzero(np.frombuffer(self._data, np.uint8) == ord("\n"))
        starts = np.concatenate([[0], ends + 1])
        ends = np.concatenate([ends, [len(self._data)]])
        full = ends > starts  # empty lines (the end of the file) are no records
        self._starts, self._ends = starts[full], ends[full]
        self._parsed: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        number = range(len(self))[index]  # IndexError when out of range, negative indices allowed
        if number not in self._parsed:
            try:
                record = json.loads(self._data[self._starts[number]: self._ends[number]])
            except ValueError as error:
                raise damaged(self.path, f"record {number + 1} is not JSON: {error}") from None
            problem = record_problem(self.path.name, record, number, self.videos)
            if problem:
                raise damaged(self.path, f"record {number + 1}: {problem}")
            self._parsed[number] = record
        return self._parsed[number]


def read_settings(root: str | Path) -> dict[str, Any]:
    """The ``embed.json`` record of an output folder (a :class:`DataError` when it is not one)."""
    path = Path(root) / SETTINGS_FILE
    record = read_json_record(path)
    if record is None:
        raise DataError(f"{root}: not a coclr embed output folder (no {SETTINGS_FILE})" if Path(root).exists()
                        else f"{root}: not found (give a folder coclr embed wrote)")
    if record.get("format") != FORMAT:
        raise DataError(f"{path}: not a coclr embed settings file")
    problem = settings_problem(record)
    if problem:
        raise damaged(path, problem)
    return record


def settings_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with an ``embed.json`` record (its settings valid :class:`EmbedSettings`, its checkpoints a
    path and a sha256 each, the first one given, its dimension positive), or None."""
    settings = record.get("settings")
    if not isinstance(settings, dict):
        return "no settings"
    values = {key: tuple(value) if isinstance(value, list) else value for key, value in settings.items()
              if not key.endswith("_sha256")}
    try:
        EmbedSettings(**values).validate()
    except (TypeError, ValueError, ConfigError) as error:  # (an unknown key, a value of another type)
        return f"settings: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
    for name in ("checkpoint", "flow_checkpoint"):
        info = record.get(name)
        if info is None and name == "flow_checkpoint":
            continue
        if not isinstance(info, dict) or not isinstance(info.get("path"), str) \
                or not isinstance(info.get("sha256"), str):
            return f"{name}: {info!r}, not a path and a sha256"
    if not _is_int(record.get("dim")) or record["dim"] < 1:
        return f"dim: {record.get('dim')!r}"
    return None


def is_current(record: dict[str, Any]) -> bool:
    """Whether the file of an embedded video's record is as it was when embedded (size and modification time, the
    identity records keep: :func:`coclr.atomic.file_identity`)."""
    return file_identity(record["path"]) == (record["size"], record["mtime_ns"])


class Embeddings:
    """Read access to an output folder: memory-mapped arrays and their metadata.

    ``videos`` and ``windows`` are memory-mapped ``float32 [N, D]`` / ``[M, D]`` (copy-on-write: reading
    never loads them whole); ``video_records`` / ``window_records`` the JSON lines. An interrupted run (chunks
    not merged, or a commit not finished) is reported: run ``coclr embed`` again on the folder to finish it.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.states: dict[str, Any] = {}
        """The state (:func:`coclr.atomic.file_state`) of each file read, as read: one snapshot of the folder."""
        for attempt in range(SNAPSHOT_TRIES):  # a coclr embed may commit while the files are read: read them again
            before = self._file_states()
            try:
                self._read()
            except DataError:
                writer = lock_holder(self.root / LOCK_FILE) if before[SETTINGS_FILE] is not None else None
                if writer is None and self._file_states() == before:  # damaged, a run interrupted, or another
                    raise  # command's folder (a lock not an embed's): said as found
                if attempt == SNAPSHOT_TRIES - 1:
                    raise DataError(f"{self.root}: a coclr embed is writing it now ({writer or 'it just ended'}); run "
                                    "this again when it ends") from None
            else:
                if self._file_states() == before:
                    self.states = before
                    return
            time.sleep(SNAPSHOT_WAIT * (attempt + 1))
        raise DataError(f"{self.root}: a coclr embed kept changing it while it was read; run this again when it ends")

    def _file_states(self) -> dict[str, Any]:
        names = (SETTINGS_FILE, COMMIT_FILE, f"{VIDEOS}.npy", f"{VIDEOS}.jsonl", f"{WINDOWS}.npy", f"{WINDOWS}.jsonl")
        return {name: file_state(self.root / name) for name in names}

    def _read(self) -> None:
        self.record = read_settings(self.root)
        if (self.root / COMMIT_FILE).is_file():
            raise DataError(f"{self.root}: a run was interrupted while writing; run the same coclr embed command "
                            "again to finish it")
        if not (self.root / f"{VIDEOS}.npy").is_file():
            lost_array(self.root)
            raise DataError(f"{self.root}: no embeddings yet; run the same coclr embed command again to finish")
        self.video_records = JsonLines(self.root / f"{VIDEOS}.jsonl")  # parsed as read: a search reads k of N
        self.window_records = JsonLines(self.root / f"{WINDOWS}.jsonl", len(self.video_records))
        dim = self.record.get("dim")
        self.videos = load_array(self.root / f"{VIDEOS}.npy", "c", dim)
        self.windows = load_array(self.root / f"{WINDOWS}.npy", "c", dim)
        for name, array, records in ((VIDEOS, self.videos, self.video_records),
                                     (WINDOWS, self.windows, self.window_records)):
            if len(array) != len(records):
                raise damaged(self.root, f"{name}.npy holds {len(array)} rows, {name}.jsonl {len(records)} records")
        self.pending_chunks = len(list((self.root / CHUNKS).glob("*.npz"))) if (self.root / CHUNKS).is_dir() else 0
        self._row_of: dict[str, int] | None = None
        self._row_of_real: dict[str, int] | None = None

    def stale_rows(self) -> np.ndarray:
        """The video rows (sorted ``int64``) whose file was removed or changed (size or modification time) since it
        was embedded: what a reader must not serve until ``coclr embed`` runs again (which drops or redoes them).
        One ``stat`` per row."""
        return np.array([record["row"] for record in self.video_records if not is_current(record)], np.int64)

    def row_of(self, path: str | Path) -> int | None:
        """The video row of ``path`` (absolute, as embedded; else the same file under another name: a scan embeds a
        file reached under two names once, under either), or None."""
        if self._row_of is None:
            self._row_of = {record["path"]: record["row"] for record in self.video_records}
        found = self._row_of.get(os.path.abspath(path))
        if found is None:
            found = self._row_of.get(os.path.realpath(path))
        if found is None:  # the row's name is a link (or in a linked folder): its file's real path is the query's
            if self._row_of_real is None:
                self._row_of_real = {}
                for record in self.video_records:
                    self._row_of_real.setdefault(os.path.realpath(record["path"]), record["row"])
            found = self._row_of_real.get(os.path.realpath(path))
        return found


def finished_embeddings(root: str | Path) -> Embeddings:
    """``root`` as a finished ``coclr embed`` folder, for a command that reads all of it (the curation): refused in
    one line while an embed writes it (its lock), or when it holds results not merged yet (a run stopped, which the
    same embed command finishes)."""
    read_settings(root)  # a folder that is not one is refused before its lock is touched
    with folder_lock(root, EMBED_FOLDER):
        embeddings = Embeddings(root)
    if embeddings.pending_chunks:
        raise DataError(f"{root}: holds results of a coclr embed run not merged yet (it was stopped): run the same "
                        "coclr embed command again to finish it, then this one")
    for records in (embeddings.video_records, embeddings.window_records):  # every record checked now, before the
        for _ in records:  # command writes anything
            pass
    return embeddings
