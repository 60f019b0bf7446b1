"""The duplicate threshold calibrated on altered copies of the user's own videos.

A few videos of the folder (spread over it) are altered as duplicates in the wild are (:mod:`coclr.curate.alter`),
each copy is fingerprinted (:mod:`coclr.curate.fingerprint`) or embedded exactly as the folder was (the checkpoints
and settings its ``embed.json`` records, into a ``coclr embed`` folder of their own, so an interrupted calibration
continues), and each copy's similarity to its original is a positive; every video's similarity to its nearest other
video is a negative. The threshold is the one
that separates them best (:func:`coclr.curate.groups.calibrated_threshold`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coclr import progress
from coclr.curate.alter import ALTERATIONS, write_altered
from coclr.curate.order import value_order
from coclr.data.sampling import spread
from coclr.embed.output import Embeddings
from coclr.errors import ConfigError
from coclr.eval.exact import unit_rows
from coclr.text import to_bytes

FOLDER = "calibration"
"""The curate folder's subfolder of altered copies (``videos/``) and their embeddings (``embeddings-KEY/``,
:func:`embeddings_folder`)."""
MAX_FRAMES = 300
"""A longer video's first this many frames are altered (and compared with its own vector: the copy is a part)."""


def video_key(record: dict[str, Any]) -> str:
    """The name of what is made from an embedded video (its altered copies, its thumbnail): by the video's identity as
    embedded (path, size, modification time), so that a folder embedded again, its rows moved, still finds each
    video's own (and an edited video gets new ones)."""
    text = f"{record['path']}\0{record.get('size')}\0{record.get('mtime_ns')}"
    return hashlib.sha256(to_bytes(text)).hexdigest()[:24]


def embeddings_folder(embeddings: Embeddings, out: Path) -> Path:
    """Where the altered copies are embedded as ``embeddings`` was: ``out/embeddings-KEY``, ``KEY`` from the folder's
    recorded settings (its ``embed.json``'s, with its checkpoints' sha256): what determines those embeddings. The
    same command after the folder was embedded again with another checkpoint or setting embeds the copies (kept,
    reused) anew beside the old ones, where one folder for all refused them, after writing, as of other settings."""
    settings = json.dumps(embeddings.record.get("settings", {}), sort_keys=True, default=str)
    return out / f"embeddings-{hashlib.sha256(to_bytes(settings)).hexdigest()[:16]}"


def sample_rows(embeddings: Embeddings, count: int, stale: set[int]) -> list[int]:
    """Up to ``count`` video rows of files unchanged since they were embedded, spread evenly over the folder's videos
    in the order of their vectors (:func:`~coclr.curate.order.value_order`): the same videos renamed or listed in
    another order give the same sample, so the same threshold."""
    usable = [row for row in range(len(embeddings.videos)) if row not in stale]
    if not usable or count <= 0:
        return []
    usable = [usable[i] for i in value_order(np.asarray(embeddings.videos[usable]))]
    return [usable[i] for i in spread(len(usable), count)]


def folder_encoder(embeddings: Embeddings, device: str | None, workers: int | None):
    """An :class:`~coclr.embed.embedder.Embedder` that embeds as the folder did (:func:`coclr.embed.run.embedder_for`:
    its checkpoints, unchanged since, and its settings); refused in one line, with what to do, when a checkpoint is
    gone or changed."""
    from coclr.embed.run import embedder_for  # noqa: PLC0415 (heavy: torch)
    from coclr.errors import CheckpointError  # noqa: PLC0415

    try:
        return embedder_for(embeddings.root, device=device, workers=workers)
    except CheckpointError as error:
        raise ConfigError(f"{error}: altered copies cannot be embedded as the folder was; give --threshold, or "
                          "--calibrate 0 for the distribution rule") from None


def altered_copies(embeddings: Embeddings, rows: list[int], out: Path,
                   show: bool = False) -> list[tuple[int, str, Path]]:
    """Each sampled video's altered copies in ``out/videos`` (written once, named by the video's identity,
    :func:`video_key`; a copy already there is kept): (row, alteration, path) of every copy made; a video that
    cannot be read is skipped. ``show``: a progress bar over the videos, with its ETA (the copies are encoded on one
    thread each, for the same bytes on every machine: minutes for a few long videos)."""
    from coclr.video.decode import VideoReader  # noqa: PLC0415 (heavy: av)

    folder = out / "videos"
    folder.mkdir(parents=True, exist_ok=True)
    copies = []
    for row in progress.bar(rows, desc="altered copies", unit="video", disable=not show, leave=False):
        record = embeddings.video_records[row]
        path, key = record["path"], video_key(record)
        names = {name: folder / f"{key}_{name.replace('+', '_')}.mp4" for name in ALTERATIONS}
        if not all(target.is_file() for target in names.values()):
            try:
                with VideoReader(path) as reader:
                    kept = []
                    for frame in reader:
                        kept.append(frame)
                        if len(kept) == MAX_FRAMES:
                            break
                    fps = reader.fps
                frames = np.stack(kept)
            except Exception:  # an unreadable original: not a calibration sample
                continue
            if len(frames) < 2 or min(frames.shape[1:3]) < 8:
                continue
            for name, target in names.items():
                if not target.is_file():
                    write_altered(frames, fps, name, target)
        copies += [(row, name, target) for name, target in names.items()]
    return copies


def calibrate(embeddings: Embeddings, units: np.ndarray, mean: np.ndarray | None, nearest: np.ndarray, count: int,
              out: Path, encoder, stale: set[int] | None = None, show: bool = True,
              windows: WindowSpace | None = None) -> dict[str, Any]:
    """The calibrated threshold and what it rests on: ``count`` videos' altered copies embedded by ``encoder``
    (:func:`folder_encoder`) into :func:`embeddings_folder` (``units``: the folder's video vectors, centred by
    ``mean`` and of unit length, as the copies' are then compared; ``nearest``: each video's similarity to its
    nearest other). Returns ``{"threshold", "rule", "positives": {alteration: [similarities]}, "videos"}``; with no
    usable copy, the caller's distribution rule applies (``threshold`` None). With ``windows``, also ``"windows"``:
    the windows' own threshold, calibrated the same way in their space (:func:`window_positives`), as windows are
    compared (their similarities lie on another scale than the videos': a threshold of one, applied to the other,
    made every pair of distinct videos share a stretch)."""
    from coclr.embed.run import embed_videos  # noqa: PLC0415 (heavy: torch)

    out.mkdir(parents=True, exist_ok=True)
    rows = sample_rows(embeddings, count, stale or set())
    copies = altered_copies(embeddings, rows, out, show)
    if not copies:
        return {"threshold": None, "rule": "no video could be altered", "positives": {}, "videos": 0}
    folder = embeddings_folder(embeddings, out)
    embed_videos([str(path) for _, _, path in copies], folder, encoder, progress=show)
    copied = Embeddings(folder)
    positives: dict[str, list[float]] = {}
    for row, name, path in copies:
        found = copied.row_of(path)
        if found is None:  # a copy that failed to embed is listed in its folder's failed.jsonl
            continue
        copy_unit = unit_rows(np.asarray(copied.videos[found])[None], mean)[0]  # as the folder's rows: the same
        positives.setdefault(name, []).append(float(copy_unit.astype(np.float64) @ units[row].astype(np.float64)))
        # similarity on every CPU (a float64 BLAS dot of raw vectors rounded by its kernel's order)
    result = _threshold(positives, nearest, len({row for row, _, _ in copies}), "embedded")
    if windows is not None:
        matched = window_positives(copied, copies, windows)
        result["windows"] = _threshold(matched, windows.nearest, len({row for row, _, _ in copies}), "embedded")
    return result


@dataclass(frozen=True)
class WindowSpace:
    """The folder's windows as stretches are compared: ``units`` (centred by ``mean``, unit length, ``[M, D]``),
    each window's video row (``video``) and its similarity to its nearest window of another video (``nearest``)."""

    units: np.ndarray
    mean: np.ndarray | None
    video: np.ndarray
    nearest: np.ndarray


def window_positives(copied: Embeddings, copies: list[tuple[int, str, Path]],
                     windows: WindowSpace) -> dict[str, list[float]]:
    """For each altered copy, each of its windows' similarity to the most similar window of its original (a trim
    or a change of speed moves the windows: the best match, not the one at the same second), by alteration."""
    copy_video = np.array([record["video"] for record in copied.window_records], np.int64)
    positives: dict[str, list[float]] = {}
    for row, name, path in copies:
        found = copied.row_of(path)
        mine = np.flatnonzero(copy_video == found) if found is not None else np.empty(0, np.int64)
        theirs = np.flatnonzero(windows.video == row)
        if not len(mine) or not len(theirs):
            continue
        copy_units = unit_rows(np.asarray(copied.windows[mine]), windows.mean).astype(np.float64)
        best = (copy_units @ windows.units[theirs].astype(np.float64).T).max(axis=1)
        positives.setdefault(name, []).extend(float(value) for value in best)
    return positives


def calibrate_fingerprints(embeddings: Embeddings, units: np.ndarray, mean: np.ndarray, count: int, out: Path,
                           checkpoint: Path, encoder_sha256: str, stale: set[int] | None = None, show: bool = True,
                           workers: int | None = None) -> dict[str, Any]:
    """The fingerprints' threshold (:mod:`coclr.curate.fingerprint`) from the same altered copies as
    :func:`calibrate` (made once for both), each fingerprinted (kept in ``out/fingerprints``) and compared with its
    original's (``units``: the folder's centred fingerprints, by ``mean``): the similarity that keeps
    :data:`~coclr.curate.groups.RECALL_TARGET` of the copies (:func:`~coclr.curate.groups.recall_threshold`),
    accepted when it separates them (Youden's J at least :data:`~coclr.curate.groups.MIN_SEPARATION`) from each
    copy's similarity to the folder's other videos, which are other takes but for the original's own duplicates (a
    few among many). Each video's nearest other is no negative here: in a folder where most videos have a duplicate,
    it is one."""
    from coclr.curate.fingerprint import centred, fingerprints, similarities  # noqa: PLC0415 (heavy: torch)
    from coclr.curate.groups import MIN_SEPARATION, RECALL_TARGET, recall_threshold, separation  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    rows = sample_rows(embeddings, count, stale or set())
    copies = altered_copies(embeddings, rows, out, show)
    if not copies:
        return {"threshold": None, "rule": "no video could be altered", "positives": {}, "videos": 0}
    prints, lacking, colours = fingerprints([str(path) for _, _, path in copies], checkpoint, encoder_sha256,
                                            out / "fingerprints", show=show, workers=workers)
    lacking = [*lacking, *np.flatnonzero(~np.isnan(colours[:, 0])).tolist()]  # (a solid colour: no layout)
    copied, _ = centred(prints, mean)
    positives: dict[str, list[float]] = {}
    negatives = []
    usable = units.any(axis=(1, 2))
    compared_all = similarities(copied, np.arange(len(copies)), units)  # each copy to every video of the folder
    counted = set()  # (the videos a copy of which was compared: a solid-colour one's copies have no layout)
    for number, (row, name, _) in enumerate(copies):
        if number in lacking or not usable[row]:
            continue
        compared = compared_all[number]
        positives.setdefault(name, []).append(float(compared[row]))
        negatives.append(np.delete(compared, row)[np.delete(usable, row)])
        counted.add(row)
    videos = len(counted)
    values = np.concatenate([np.asarray(v) for v in positives.values()]) if positives else np.empty(0)
    if not len(values):
        return {"threshold": None, "rule": "no altered copy could be fingerprinted", "positives": {}, "videos": 0}
    others = np.concatenate(negatives)
    threshold = recall_threshold(values)
    gain = separation(values, others, threshold)
    record = {"positives": positives, "videos": videos, "separation": gain,
              "others_passing": float((others >= threshold).mean())}
    if gain < MIN_SEPARATION:
        return {**record, "threshold": None,
                "rule": f"the altered copies were not told apart from other videos (Youden's J {gain:.2f} at the "
                        f"similarity keeping {RECALL_TARGET:.0%} of them, below {MIN_SEPARATION})"}
    return {**record, "threshold": threshold,
            "rule": f"calibrated: the similarity that keeps {RECALL_TARGET:.0%} of {len(values)} altered copies of "
                    f"{videos} of these videos, which {record['others_passing']:.1%} of their comparisons with the "
                    f"other videos reach (Youden's J {gain:.2f})"}


def _threshold(positives: dict[str, list[float]], nearest: np.ndarray, videos: int, how: str) -> dict[str, Any]:
    """The calibration's result from the copies' similarities to their originals (``positives``, by alteration)
    and each video's to its nearest other (``nearest``), as :func:`calibrate` returns it."""
    from coclr.curate.groups import MIN_SEPARATION, calibrated_threshold, separation  # noqa: PLC0415

    values = np.concatenate([np.asarray(v) for v in positives.values()]) if positives else np.empty(0)
    if not len(values):
        return {"threshold": None, "rule": f"no altered copy could be {how}", "positives": {}, "videos": 0}
    threshold = calibrated_threshold(values, nearest)
    gain = separation(values, nearest, threshold)
    if gain < MIN_SEPARATION:
        return {"threshold": None, "positives": positives, "videos": videos,
                "rule": f"the altered copies were not told apart from other videos (Youden's J {gain:.2f} at best, "
                        f"below {MIN_SEPARATION})"}
    return {"threshold": threshold, "separation": gain, "positives": positives, "videos": videos,
            "rule": f"calibrated: the similarity that best separates {len(values)} altered copies of "
                    f"{videos} of these videos from each video's nearest other "
                    f"(Youden's J {gain:.2f})"}
