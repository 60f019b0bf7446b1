"""Building the "rgb" view of a clip store: every video of an index decoded once, resized and JPEG-encoded.

Example::

    summary = build_store(ucf101_index("ucfTrainTestlist"), "UCF-101", "stores/ucf101", short_side=128)
    print(summary)   # rgb: 13320 done, 0 skipped, 0 failed in ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coclr.atomic import file_identity, file_sha256
from coclr.clips import JPEG_QUALITY, SHORT_SIDE, check_fps, check_short_side
from coclr.errors import DataError, VideoDecodeError
from coclr.store.clipstore import META_FILE, ClipStore, IndexUpdate, adopt_pending_notes, record_notes
from coclr.store.jobs import JobSummary, run_entry_jobs, shard, writing_view
from coclr.store.jpeg import encode_jpeg
from coclr.store.options import StoreOptions
from coclr.threads import check_workers
from coclr.video.decode import VideoReader, size_change
from coclr.video.indexes import VideoIndex, check_videos_exist


@dataclass(frozen=True)
class DecodeVideoJob:
    """Store job of the "rgb" view: decode ``video_root/<key>``, resize, resample, encode as JPEG; notes the video
    file's identity as decoded (``source``: size, modification time), the damaged frames kept (within the decoder's
    tolerance, :data:`~coclr.video.decode.DAMAGE_TOLERANCE`) and the turn its display matrix asked for, for the
    store's ``notes_rgb.json``.

    The frames are made one at a time as the entry is written (a generator over a streaming
    :class:`~coclr.video.decode.VideoReader`), so the job's memory does not depend on the video's length
    (``docs/store.md``, "Memory"); the notes are filled when the last frame is made."""

    video_root: str
    short_side: int | None = SHORT_SIDE
    quality: int = JPEG_QUALITY
    fps: float | None = None

    def __call__(self, key: str) -> tuple[Iterator[bytes], float, dict[str, Any]]:
        path = Path(self.video_root) / key
        source = file_identity(path)  # before decoding: a file changed meanwhile is decoded again by the next run
        reader = VideoReader(path, self.short_side, self.fps)
        notes: dict[str, Any] = {} if source is None else {"source": list(source), "sha256": file_sha256(path)}
        return encoded_frames(reader, self.quality, notes), reader.fps, notes


def encoded_frames(reader: VideoReader, quality: int, notes: dict[str, Any] | None = None) -> Iterator[bytes]:
    """The JPEG bytes of the frames of ``reader``, one at a time; a frame whose size differs from the first one's
    (a stream that changes size) is a :class:`VideoDecodeError` naming the video, as the entry needs one size. At
    the end, ``notes`` gets the damaged frames kept and the turn applied, if any."""
    first = None
    with reader:
        for number, frame in enumerate(reader):
            first = frame if first is None else first
            if (changed := size_change(first, frame, number, reader.short_side)) is not None:
                raise VideoDecodeError(f"{reader.path}: {changed}")
            yield encode_jpeg(frame, quality)
    if notes is not None and reader.damaged:
        notes["damaged_frames"] = reader.damaged
    if notes is not None and reader.orientation:
        notes.update(rotation=reader.orientation.rotation, mirrored=reader.orientation.mirrored)
    if notes is not None and reader.pixel_aspect != 1:
        notes["pixel_aspect"] = str(reader.pixel_aspect)  # (what a player would stretch the frames by: "4/3")


def build_store(index: VideoIndex, video_root: str | Path, out: str | Path,
                short_side: int | None = StoreOptions.short_side, quality: int = StoreOptions.quality,
                fps: float | None = StoreOptions.fps, workers: int | None = StoreOptions.workers,
                announce: Callable[[str], None] | None = None) -> JobSummary:
    """Build (or resume building) the "rgb" view of the store ``out`` from the videos of ``index`` under
    ``video_root``: decoded once, resized to ``short_side``, optionally resampled to ``fps``, JPEG
    ``quality``. Missing videos are reported together before any work; undecodable ones are listed in the
    summary and in the store's failure list. A store built from an earlier version of the index takes the new
    one in place (videos added or removed); the entries of the videos both hold are kept, but for videos whose file
    changed since it was decoded (:func:`changed_videos`): their entries, of every view, are removed and the video
    decoded again. A job refused (other options, or another job writing the view) changes nothing in the store.
    What changed (the index, videos decoded again) is passed to ``announce`` line by line before any decoding, so
    that a job interrupted has said it (the index is then in place, and the next job would not); without it, the
    lines lead the summary's."""
    check_short_side(short_side, "short_side")
    if not 1 <= quality <= 100:
        raise DataError(f"quality must be in 1..100, got {quality}")
    check_workers(workers, "workers")
    check_fps(fps, "fps")
    if not index.entries:
        raise DataError(f"index {index.name!r} lists no videos: nothing to decode; give an index of the videos "
                        "(`coclr data index`)")
    check_videos_exist(index, video_root)
    job = DecodeVideoJob(str(Path(video_root).resolve()), short_side, quality, fps)
    keys = [entry.path for entry in index.entries]
    try:
        before = ClipStore(out) if (Path(out) / META_FILE).is_file() else None  # (reads only)
    except DataError:  # (the claim below says what is wrong with it)
        before = None
    if before is not None and before.rgb_command() != "coclr data store":  # (it took one over, and mixed the two)
        raise DataError(f"{out}: holds a store whose rgb frames `{before.rgb_command()}` wrote, not decoded videos: "
                        "give another output folder")
    # the views of videos that may have changed (their size or modification time differs: read, not hashed, before
    # the claim refuses or takes the job) are held too: a flow job on them is refused
    removing = before is not None and bool(moved_identities(before, keys, video_root))
    others = [view for view in before.views() if view != "rgb"] if removing else []
    with writing_view(out, "rgb", index, replace_index=True, also=others, short_side=short_side, quality=quality,
                      fps=fps) as update:
        store = ClipStore(out)
        mine = set(shard(keys))  # (each process of a distributed job its own keys, which it decodes)
        adopt_pending_notes(store, "rgb", mine)  # (a killed job's, before the notes are read)
        changed = [key for key in changed_videos(store, keys, video_root) if key in mine]
        for key in changed:  # the rgb entry last: a kill between two deletions leaves a changed video's rgb entry,
            for view in sorted(store.views(), key=lambda view: view == "rgb"):  # which the next run finds changed
                store.entry_path(key, view).unlink(missing_ok=True)  # again (removed first, its old flow was kept)
        note_lost_sha256(store, sorted(mine), video_root)
        said = _store_changes(update, changed)
        for line in said if announce is not None else ():
            announce(line)
        summary = run_entry_jobs(out, "rgb", keys, job, workers, desc="decoding videos")
    if announce is None:
        summary.notes.extend(said)
    return summary


def _store_changes(update: IndexUpdate, changed: list[str]) -> list[str]:
    """What a job changed in the store before decoding: the index taken in place (a video moved to the test split
    among it), the videos decoded again."""
    lines = [str(update)] if update else []
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        lines.append(f"{len(changed)} video(s) changed since they were decoded (size or modification time): "
                     f"decoded again, their flow removed for the next coclr flow: {', '.join(changed[:3])}{more}")
    return lines


HASHED = "hashed"
"""The mark of a note an earlier version made before decoding, by a job that notes the content's sha256 as it
ends: a store whose first job was killed then holds no sha256 yet, and is no store from before they were noted."""


def note_lost_sha256(store: ClipStore, keys: list[str], video_root: str | Path) -> None:
    """The content sha256 of entries decoded by a job of an earlier version killed before it noted it (``kill -9``;
    since, a job's notes are written beside each entry before it is put in place: :func:`~coclr.store.clipstore.
    adopt_pending_notes`), for each file that is still the one that version noted before decoding (its size and
    modification time); without it, a later ``touch`` of such a video decoded it again and removed its flow
    (:func:`changed_videos`). Only in a store whose jobs note the sha256 (one from before has no entry with it,
    and is not read through again)."""
    noted = store.notes("rgb")
    if not any("sha256" in note or note.get(HASHED) for note in noted.values()):
        return
    found = {}
    for key in keys:
        note = noted.get(key, {})
        if "sha256" in note or "source" not in note or not store.has(key, "rgb"):
            continue
        path = Path(video_root) / key
        if file_identity(path) == tuple(note["source"]):
            found[key] = {**note, "sha256": file_sha256(path)}
    if found:
        record_notes(store.root, "rgb", list(found), found)


def moved_identities(store: ClipStore, keys: list[str], video_root: str | Path,
                     noted: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The keys of rgb entries whose video file's size or modification time is no longer the one noted when it was
    decoded (``source``; ``noted``: the rgb view's notes, read when not given): those :func:`changed_videos` reads
    through; nothing hashed or written."""
    noted = store.notes("rgb") if noted is None else noted
    return [key for key in keys if "source" in noted.get(key, {}) and store.has(key, "rgb")
            and file_identity(Path(video_root) / key) != tuple(noted[key]["source"])]


def changed_videos(store: ClipStore, keys: list[str], video_root: str | Path) -> list[str]:
    """The keys whose video file is no longer the one their rgb entry was decoded from: its size or modification
    time differs from the identity the entry's job noted (``source``; entries from before it was noted: none), and
    where the job noted its content's sha256 too, so does the content. A file touched or copied without its times
    (``cp``, ``rsync`` without ``-t``) is the same video: its new identity is noted, and its flow kept."""
    noted = store.notes("rgb")
    changed, touched = [], {}
    for key in moved_identities(store, keys, video_root, noted):
        path = Path(video_root) / key
        identity = file_identity(path)
        if (identity is not None and "sha256" in noted[key] and identity[0] == noted[key]["source"][0]
                and file_sha256(path) == noted[key]["sha256"]):
            touched[key] = {**noted[key], "source": list(identity)}
        else:
            changed.append(key)
    if touched:
        record_notes(store.root, "rgb", list(touched), touched)
    return changed
