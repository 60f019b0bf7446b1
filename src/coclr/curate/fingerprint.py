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

SIDE = 64
"""Short side (px) the frames are decoded at."""
WINDOWS = 8
"""Windows spread evenly over a video."""
LENGTH = 8
"""Frames per window (consecutive)."""
GRID = 4
"""Cells per side of the grid the first block's map is averaged into."""
VERSION = 1
"""Changes whenever a fingerprint of the same video and encoder would change (the cache's key holds it)."""


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
    return np.unique(np.linspace(0, max(0, frames - LENGTH), WINDOWS).round().astype(int))


def fingerprint_frames(windows: np.ndarray, stem) -> np.ndarray:
    """The fingerprint of ``windows`` (``[W, LENGTH, H, W, 3]`` uint8 RGB): ``[2, D]`` float32, the plain and the
    mirrored frames' (see the module docstring)."""
    import torch  # noqa: PLC0415 (heavy)
    import torch.nn.functional as F  # noqa: PLC0415

    from coclr.clips import IMAGENET_STD  # noqa: PLC0415

    clips = torch.from_numpy(np.ascontiguousarray(windows)).float().div_(255).permute(0, 4, 1, 2, 3)
    channels = clips.transpose(0, 1).reshape(3, -1)
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
    return hashlib.sha256(text.encode()).hexdigest()[:24] + ".npy"


def fingerprints(paths: Sequence[str], checkpoint: str | Path, encoder_sha256: str, folder: Path, show: bool = True,
                 workers: int | None = None) -> tuple[np.ndarray, list[int]]:
    """The fingerprint of each video file of ``paths`` as it is now (a video changed since it was embedded too),
    kept in ``folder`` (one file each, :func:`cache_key`; a second run reads them), made on ``workers`` threads
    (decoding and the convolution release the GIL). Returns ``[N, 2, D]`` (zeros where there is none) and the rows
    without one (a file gone or unreadable)."""
    import threading  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from coclr import progress  # noqa: PLC0415
    from coclr.atomic import atomic_open  # noqa: PLC0415
    from coclr.threads import torch_threads, usable_cores  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
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
    size = next((found.shape for found in made if found is not None), (2, 1))
    out = np.zeros((len(paths), *size), np.float32)
    lacking = []
    for row, found in enumerate(made):
        if found is None or found.shape != size:
            lacking.append(row)
        else:
            out[row] = found
    return out, lacking


def centred(prints: np.ndarray, mean: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``prints`` (``[N, 2, D]``) less ``mean`` (default: the mean of their plain fingerprints), each of unit length
    (a zero row stays zero), and the mean: similarities are of what sets a video apart from the folder."""
    mean = prints[:, 0].mean(0) if mean is None else mean
    shifted = prints - mean
    norms = np.linalg.norm(shifted, axis=-1, keepdims=True)
    units = np.where(norms > 1e-12, shifted / np.maximum(norms, 1e-12), 0.0).astype(np.float32)
    units[~prints.any(axis=(1, 2))] = 0.0
    return units, mean


def similarities(units: np.ndarray, rows: np.ndarray, others: np.ndarray | None = None) -> np.ndarray:
    """The similarity of each video of ``rows`` to every video of ``others`` (default: all): the cosine of their
    centred fingerprints (:func:`centred`), the better of the plain and the mirrored other."""
    others = units if others is None else others
    plain = units[rows, 0] @ others[:, 0].T
    mirrored = units[rows, 0] @ others[:, 1].T
    return np.maximum(plain, mirrored)


def neighbour_graph(units: np.ndarray, k: int, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Each video's ``k`` most similar others by :func:`similarities` (scores descending, rows; -1 and -inf where a
    folder has fewer), in chunks of ``chunk`` rows: never the whole matrix at once."""
    count = len(units)
    k = min(k, count - 1)
    scores = np.full((count, max(k, 0)), -np.inf, np.float32)
    rows = np.full((count, max(k, 0)), -1, np.int64)
    for begin in range(0, count, chunk):
        block = np.arange(begin, min(count, begin + chunk))
        values = similarities(units, block)
        values[np.arange(len(block)), block] = -np.inf
        if k <= 0:
            continue
        part = np.argpartition(-values, k - 1, axis=1)[:, :k]
        picked = np.take_along_axis(values, part, axis=1)
        order = np.argsort(-picked, axis=1, kind="stable")
        rows[block] = np.take_along_axis(part, order, axis=1)
        scores[block] = np.take_along_axis(picked, order, axis=1)
    return scores, rows
