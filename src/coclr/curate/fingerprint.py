"""A video's appearance fingerprint, which tells one take from another where the embedding vectors do not.

The vectors of an encoder trained for minutes on a CPU say which action a video shows, not which take it is: a
distinct take's nearest other video is as similar as an altered copy of it (docs/curate.md). A near-duplicate is the
same take, so the duplicates are found on a fingerprint of what is where in the frames:

- :data:`WINDOWS` windows of :data:`LENGTH` frames spread over the video, decoded at :data:`SIDE` px on the short
  side (a trimmed or sped-up copy samples the same scenes);
- each video's frames standardised per colour channel (its mean and spread: a brightened or contrastier copy gives
  the same input);
- the first block of the folder's RGB encoder (S3D's ``Conv_1a``), its map averaged over time into a
  :data:`GRID` x :data:`GRID` grid of cells (the layout: a re-encoded, resized or captioned copy keeps it, another
  take does not), each window's grid a unit vector, the video's their mean;
- the same of the mirrored frames, so that a flipped copy matches (:func:`similarities`: the better of the two).

A solid-colour video (every channel's spread below :data:`FLAT`) has no layout: standardised, its frames are all
zero and its fingerprint would be the encoder's alone (the same for black, white and red, or all zeros). It gets its
mean colour instead, and matches only videos of the same colour (:data:`SAME_COLOUR`,
:func:`coclr.curate.groups.colour_links`).

Measured on altered copies of the real clips and of synthetic videos (``benchmarks/curate_duplicates.py``,
docs/curate.md); the first block's filters matter less than the layout and the standardisation (a random first
block does as well there).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from coclr.data.sampling import spread
from coclr.text import to_bytes

SIDE = 64
"""Short side (px) the frames are decoded at."""
WINDOWS = 8
"""Windows spread evenly over a video."""
LENGTH = 8
"""Frames per window (consecutive)."""
GRID = 4
"""Cells per side of the grid the first block's map is averaged into."""
VERSION = 2
"""Changes whenever a fingerprint of the same video and encoder would change (the cache's key holds it)."""
FLAT = 2.0
"""Spread (standard deviation over a video's sampled pixels, in levels of 255) below which every colour channel is
flat: a solid-colour video, whose fingerprint is its mean colour."""
SAME_COLOUR = 8.0
"""Levels (of 255) within which each channel of two solid-colour videos' mean colours lies when they are copies (a
re-encode moves a solid colour by a level or two)."""


def folder_checkpoint(embeddings) -> tuple[Path, str]:
    """The encoder an embedding folder was made with (its ``embed.json``'s ``checkpoint``) and its sha256; refused in
    one line, with what to do, when it is gone or changed since."""
    from coclr.errors import ConfigError  # noqa: PLC0415
    from coclr.models.loading import checkpoint_sha256  # noqa: PLC0415 (heavy: torch)

    recorded = embeddings.record.get("checkpoint") or {}
    path = Path(recorded.get("path", ""))
    advice = "fingerprints need the encoder the folder was embedded with; give --no-fingerprints to find duplicates " \
             "by the embedding vectors"
    if not recorded.get("path") or not path.is_file():
        raise ConfigError(f"{embeddings.root}: its encoder {recorded.get('path')} is not there: {advice}")
    sha = checkpoint_sha256(path)
    if recorded.get("sha256") and sha != recorded["sha256"]:
        raise ConfigError(f"{path}: changed since {embeddings.root} was embedded: {advice}")
    return path, sha


def load_stem(checkpoint: str | Path):
    """The first block of the RGB encoder at ``checkpoint`` (an ``nn.Module``, evaluation mode, on the CPU)."""
    from coclr.models.loading import load_encoder  # noqa: PLC0415 (heavy: torch)

    backbone, _ = load_encoder(checkpoint)
    return backbone.Conv_1a.eval()


def window_starts(frames: int) -> np.ndarray:
    """The first frame of each window of a video of ``frames`` frames (fewer windows when it is short)."""
    return spread(max(0, frames - LENGTH) + 1, WINDOWS)


def fingerprint_frames(windows: np.ndarray, stem) -> np.ndarray:
    """The fingerprint of ``windows`` (``[W, LENGTH, H, W, 3]`` uint8 RGB): ``[2, D]`` float32, the plain and the
    mirrored frames' (see the module docstring); of a solid-colour video (every channel's spread below
    :data:`FLAT`), ``[3]`` float32, its mean colour in levels of 255."""
    import torch  # noqa: PLC0415 (heavy)
    import torch.nn.functional as F  # noqa: PLC0415

    from coclr.clips import IMAGENET_STD  # noqa: PLC0415

    clips = torch.from_numpy(np.ascontiguousarray(windows)).float().div_(255).permute(0, 4, 1, 2, 3)
    channels = clips.transpose(0, 1).reshape(3, -1)
    if float(channels.std(1).max()) * 255 < FLAT:
        return (channels.mean(1) * 255).numpy().astype(np.float32)
    spread = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1)
    clips = (clips - channels.mean(1).view(1, 3, 1, 1, 1)) / (channels.std(1).view(1, 3, 1, 1, 1) + 1e-3) * spread
    found = []
    with torch.no_grad():
        for view in (clips, clips.flip(-1)):
            cells = F.adaptive_avg_pool3d(stem(view), (1, GRID, GRID)).flatten(1)
            found.append(F.normalize(cells, dim=1).mean(0))
    return torch.stack(found).numpy().astype(np.float32)


def fingerprint_file(path: str | Path, stem) -> np.ndarray:
    """The fingerprint of the video file ``path`` (:func:`fingerprint_frames`); a video it cannot read raises."""
    from coclr.video.decode import decode_frames_at, probe_video  # noqa: PLC0415 (heavy: av)

    total = probe_video(path).frames or probe_video(path, exact=True).frames  # (the container's count, else counted)
    if total < 1:
        raise ValueError(f"{path}: no frames")
    starts = window_starts(total)
    indices = np.concatenate([np.arange(start, start + LENGTH) for start in starts]).clip(0, total - 1)
    frames = list(decode_frames_at(path, indices, short_side=SIDE))
    if not frames:
        raise ValueError(f"{path}: no frame decoded")
    frames += [frames[-1]] * (len(indices) - len(frames))  # (fewer than probed: the last repeated)
    height, width = frames[0].shape[:2]
    if min(height, width) < 8:
        raise ValueError(f"{path}: frames of {width}x{height} px are too small to fingerprint")
    return fingerprint_frames(np.stack(frames).reshape(len(starts), LENGTH, height, width, 3), stem)


def cache_key(path: str, encoder_sha256: str) -> str | None:
    """A fingerprint's file name: by the video file's identity as it is now (path, size, modification time), the
    encoder's content and :data:`VERSION`: what determines it; None when the file is not there."""
    try:
        state = os.stat(path)
    except OSError:
        return None
    text = f"{path}\0{state.st_size}\0{state.st_mtime_ns}\0{encoder_sha256}\0{VERSION}"
    return hashlib.sha256(to_bytes(text)).hexdigest()[:24] + ".npy"


def fingerprints(paths: Sequence[str], checkpoint: str | Path, encoder_sha256: str, folder: Path, show: bool = True,
                 workers: int | None = None) -> tuple[np.ndarray, list[int], np.ndarray]:
    """The fingerprint of each video file of ``paths`` as it is now (a video changed since it was embedded too),
    kept in ``folder`` (one file each, :func:`cache_key`; a second run reads them), made on ``workers`` threads
    (decoding and the convolution release the GIL). Returns ``[N, 2, D]`` (zeros where there is none), the rows
    without one (a file gone or unreadable, or a fingerprint of zeros: an encoder's first block that gives nothing
    for it) and ``[N, 3]``: each solid-colour video's mean colour (:func:`fingerprint_frames`; its fingerprint
    zero), NaN for the others."""
    import threading  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from coclr import progress  # noqa: PLC0415
    from coclr.atomic import atomic_open, remove_stale_partials  # noqa: PLC0415
    from coclr.threads import torch_threads, usable_cores  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(folder, recursive=False)  # (a killed run's)
    keys = [cache_key(path, encoder_sha256) for path in paths]
    loaded: list = []
    lock = threading.Lock()

    def stem():  # the encoder's first block, loaded once, when a fingerprint is to be made
        with lock:
            if not loaded:
                loaded.append(load_stem(checkpoint))
            return loaded[0]

    def make(row: int) -> np.ndarray | None:
        if keys[row] is None:
            return None
        file = folder / keys[row]
        if file.is_file():
            try:
                return np.load(file, allow_pickle=False)
            except (OSError, ValueError):  # a damaged cache file: made again
                pass
        block = stem()
        try:
            found = fingerprint_file(paths[row], block)
        except Exception:  # an unreadable video: no fingerprint, the rest goes on
            return None
        with atomic_open(file, "wb") as handle:
            np.save(handle, found, allow_pickle=False)
        return found

    made: list[np.ndarray | None] = []
    with progress.bar(total=len(paths), desc="fingerprints", unit="video", disable=not show, leave=False) as shown, \
            ThreadPoolExecutor(max(1, workers or usable_cores())) as pool, torch_threads(1):
        for found in pool.map(make, range(len(paths))):
            shown.update(1)
            made.append(found)
    size = next((found.shape for found in made if found is not None and found.ndim == 2), (2, 1))
    out = np.zeros((len(paths), *size), np.float32)
    colours = np.full((len(paths), 3), np.nan)
    lacking = []
    for row, found in enumerate(made):
        if found is not None and found.shape == (3,):
            colours[row] = found
        elif found is None or found.shape != size or not found.any():
            lacking.append(row)
        else:
            out[row] = found
    return out, lacking, colours


def centred(prints: np.ndarray, mean: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``prints`` (``[N, 2, D]``) less ``mean`` (default: the order-free mean of the plain fingerprints of the rows
    that have one, :func:`coclr.eval.exact.gallery_mean`), each a quantised unit row
    (:func:`coclr.eval.exact.unit_rows`: their products are exact in float64, whatever the CPU or order), a row
    without a fingerprint zero; and the mean. Similarities are of what sets a video apart from the folder."""
    from coclr.eval.exact import gallery_mean, unit_rows  # noqa: PLC0415

    have = prints.any(axis=(1, 2))
    if mean is None:
        mean = gallery_mean(prints[have, 0]) if have.any() else np.zeros(prints.shape[-1])
    units = np.stack([unit_rows(prints[:, view], mean) for view in range(prints.shape[1])], axis=1)
    units[~have] = 0.0
    return units, np.asarray(mean, np.float64)


SIMILARITY_BLOCK = 8192
"""Rows of the other videos multiplied at a time by :func:`similarities` (bounds their float64 copy)."""


def similarities(units: np.ndarray, rows: np.ndarray, others: np.ndarray | None = None) -> np.ndarray:
    """``float64 [len(rows), len(others)]``: the similarity of each video of ``rows`` to every video of ``others``
    (default: all): the exact cosine of their centred fingerprints (:func:`centred`), the better of the plain and the
    mirrored other. The same numbers as :func:`neighbour_graph`'s."""
    others = units if others is None else others
    queries = units[rows, 0].astype(np.float64)
    out = np.empty((len(queries), len(others)), np.float64)
    for start in range(0, len(others), SIMILARITY_BLOCK):
        block = others[start: start + SIMILARITY_BLOCK].astype(np.float64)
        out[:, start: start + len(block)] = np.maximum(queries @ block[:, 0].T, queries @ block[:, 1].T)
    return out


def _mirrored_rows(units: np.ndarray):
    """The search's rows of the fingerprints (:class:`coclr.embed.search.UnitRows`, in memory): video ``i``'s plain
    one as row ``2i``, its mirrored one as row ``2i+1``."""
    from coclr.embed.search import UnitRows  # noqa: PLC0415

    return UnitRows.in_memory(units.reshape(2 * len(units), -1))


def _best_per_video(video: np.ndarray, scores: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Of each query's rows (``video`` and ``scores`` ``[q, m]``, best first, -1 where none), each other video's
    best only, the first ``k``: ``(scores float64 [q, k], videos int64 [q, k])``, -inf and -1 where fewer."""
    by_video = np.argsort(video, axis=1, kind="stable")  # a video's rows together, its best first
    grouped = np.take_along_axis(video, by_video, axis=1)
    first = np.ones_like(grouped, bool)
    first[:, 1:] = grouped[:, 1:] != grouped[:, :-1]
    best = np.empty_like(first)
    np.put_along_axis(best, by_video, first, axis=1)
    best &= (video != query[:, None]) & (video >= 0)
    order = np.argsort(~best, axis=1, kind="stable")[:, :k]
    kept = np.take_along_axis(best, order, axis=1)
    picked_scores = np.where(kept, np.take_along_axis(scores, order, axis=1), -np.inf)
    picked = np.where(kept, np.take_along_axis(video, order, axis=1), -1)
    pad = k - picked.shape[1]
    if pad > 0:
        picked_scores = np.pad(picked_scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        picked = np.pad(picked, ((0, 0), (0, pad)), constant_values=-1)
    return picked_scores, picked


def _ranked(gallery, queries: np.ndarray, first: int, k: int, projected) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most similar others of the videos ``first, first + 1, ...`` whose plain fingerprints are ``queries``,
    over ``gallery`` (:func:`_mirrored_rows`), a chunk of queries at a time (:data:`coclr.curate.graph.QUERY_CHUNK`):
    where the int8 kernels build, a range search at floors from a prefix of the rows, fused in C, which screens the
    rows' ``projected`` copy (:func:`_each_chunk`) or else the short fingerprints themselves
    (:func:`coclr.curate.graph.nearest_rows`; faster than the top-k on both CPU kinds, docs/curate.md), else the
    search's top-k. A video's ``2(k+1)`` best rows hold the best row of each of its
    ``k + 1`` most similar videos (itself among them): every video ranked ahead of one has at most two rows ahead."""
    from coclr.curate.graph import PROJECTED_FROM, QUERY_CHUNK, nearest_rows  # noqa: PLC0415
    from coclr.embed.search import Projected, fused_range  # noqa: PLC0415

    screen = projected
    if screen is None and fused_range(gallery) and gallery.count >= PROJECTED_FROM:
        screen = Projected.identity(gallery)
    scores, rows = np.full((len(queries), k), -np.inf), np.full((len(queries), k), -1, np.int64)
    for start in range(0, len(queries), QUERY_CHUNK):
        stop = min(len(queries), start + QUERY_CHUNK)
        found, at = nearest_rows(gallery, queries[start:stop], 2 * (k + 1), screen)
        videos = np.arange(first + start, first + stop)
        scores[start:stop], rows[start:stop] = _best_per_video(at // 2, found, videos, k)
    return scores, rows


def _each_chunk(units: np.ndarray, k: int, show: bool, desc: str, chunk_graph) -> tuple[np.ndarray, np.ndarray]:
    """``(scores float64 [N, k], videos int64 [N, k])`` (-inf and -1 where none), from ``chunk_graph(gallery,
    queries, first, k, projected)`` over :data:`DUPLICATE_CHUNK` videos at a time, the gallery
    :func:`_mirrored_rows` and its projection made once: the rows onto their first principal axes
    (:func:`coclr.curate.graph.projection`, as for the vectors), which the range searches screen instead of the rows
    where they lie near those axes, as a wide encoder's do (a full-width first block's 1,024 numbers); None where it
    does not pay (fewer numbers than it keeps, few rows, rows spread wide, no vector int8 kernels). The answer is the
    same either way."""
    from coclr import progress  # noqa: PLC0415
    from coclr.curate.graph import projection  # noqa: PLC0415

    count = len(units)
    k = max(0, min(k, count - 1))
    scores = np.full((count, k), -np.inf)
    rows = np.full((count, k), -1, np.int64)
    if k == 0:
        return scores, rows
    gallery = _mirrored_rows(units)
    projected = projection(gallery)
    with progress.bar(total=count, desc=desc, unit="video", disable=not show, leave=False) as shown:
        for start in range(0, count, DUPLICATE_CHUNK):
            stop = min(count, start + DUPLICATE_CHUNK)
            scores[start:stop], rows[start:stop] = chunk_graph(gallery, units[start:stop, 0], start, k, projected)
            shown.update(stop - start)
    return scores, rows


def neighbour_graph(units: np.ndarray, k: int, show: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each video's ``k`` most similar others by :func:`similarities` (float64 scores descending, ties to the lower
    row; -1 and -inf where a folder has fewer), exactly, never the whole matrix at once: over the plain and the
    mirrored fingerprints as rows ``2i`` and ``2i+1``, each video's plain one the query (:func:`_ranked`)."""
    return _each_chunk(units, k, show, "nearest fingerprints", _ranked)


DUPLICATE_CHUNK = 8192
"""Videos queried at a time by the fingerprints' graphs (bounds their quantised copy and their pairs)."""
RANGE_PAIRS = 256
"""Candidate pairs per queried video beyond which :func:`duplicate_links` searches fewer videos at a time (a
threshold so low that most pairs reach it: memory stays bounded, no pair left out)."""


def duplicate_links(units: np.ndarray, floor: float, show: bool = False):
    """The :class:`~coclr.curate.groups.Links` of every pair of videos whose similarity (:func:`similarities`)
    reaches ``floor``: the duplicates' only input, however many pairs a video has. A range search
    (:func:`coclr.curate.graph.pairs_over`) over the plain and the mirrored fingerprints as rows ``2i`` and
    ``2i+1``, each video's plain one the query, :data:`DUPLICATE_CHUNK` videos at a time
    (:func:`coclr.curate.graph.video_links`). Much cheaper at a high threshold: no video's nearest is ranked."""
    from coclr.curate.graph import video_links  # noqa: PLC0415
    from coclr.curate.groups import Links  # noqa: PLC0415

    if len(units) < 2:
        return Links.none(len(units))
    return video_links(_mirrored_rows(units), floor, show, "duplicate fingerprints", lambda a, b: units[a:b, 0],
                       len(units), lambda row: row // 2, DUPLICATE_CHUNK, RANGE_PAIRS)
