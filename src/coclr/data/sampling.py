"""Which frames a clip takes: random clips for training, sliding windows for testing, RGB/flow alignment, and the
stretches of a video that are training instances of their own.

A clip is ``length`` frames ``stride`` apart, spanning ``(length - 1) * stride + 1`` frames. Videos shorter
than that are padded by repeating their last frame (as the reference implementation does), so every clip
has exactly ``length`` frames.

Example::

    rng = np.random.default_rng(0)
    n = aligned_num_frames(store.num_frames(key, "rgb"), store.num_frames(key, "flow"))
    first, second = train_clip_indices(n, 32, 1, rng), train_clip_indices(n, 32, 1, rng)  # two positives
    windows = sliding_windows(n, 32, 1)  # test time: half-overlapping windows covering the whole video
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def clip_span(length: int, stride: int) -> int:
    """Number of frames a clip of ``length`` frames ``stride`` apart spans."""
    _check_clip(length, stride)
    return (length - 1) * stride + 1


def train_clip_indices(num_frames: int, length: int, stride: int, rng: np.random.Generator) -> np.ndarray:
    """Frame indices of one training clip at a uniformly random start (``int64 [length]``).

    A training sample takes two such clips at independent starts. Videos shorter than the clip span start
    at frame 0 and are padded by repeating the last frame.
    """
    _check_frames(num_frames)
    span = clip_span(length, stride)
    start = int(rng.integers(0, num_frames - span + 1)) if num_frames >= span else 0
    return _clip_at(start, num_frames, length, stride)


def sliding_windows(num_frames: int, length: int, stride: int, hop: int | None = None) -> list[np.ndarray]:
    """Test-time clips covering the whole video: windows that overlap by half (they start
    ``length // 2 * stride`` frames apart, or ``hop`` frames when given), the last one ending at the last
    frame; one padded window for videos shorter than a clip."""
    _check_frames(num_frames)
    span = clip_span(length, stride)
    if hop is not None and hop < 1:
        raise ValueError(f"window hop must be at least 1 frame, got {hop}")
    if num_frames <= span:
        return [_clip_at(0, num_frames, length, stride)]
    hop = hop or max(1, length // 2) * stride
    starts = list(range(0, num_frames - span + 1, hop))
    if starts[-1] != num_frames - span:
        starts.append(num_frames - span)
    return [_clip_at(start, num_frames, length, stride) for start in starts]


def segment_counts(num_frames: Sequence[int], segment_frames: int | None) -> np.ndarray:
    """``int64 [N]``: the instances each video of ``num_frames`` frames gives when cut into stretches of
    ``segment_frames`` (:func:`segments_of`): one per whole stretch, at least one; one each for None."""
    frames = np.asarray(num_frames, dtype=np.int64).reshape(-1)
    if segment_frames is None:
        return np.ones_like(frames)
    return np.maximum(1, frames // segment_frames)


def segments_of(num_frames: Sequence[int], segment_frames: int | None) -> np.ndarray:
    """``int64 [S, 3]``: (video, first frame, frames) of each instance when every video is cut into consecutive
    stretches of ``segment_frames`` frames, the last one taking the remainder (a video shorter than two stretches
    is one instance, whole); None: every video is one instance."""
    rows = []
    for video, (frames, count) in enumerate(zip(np.asarray(num_frames, dtype=np.int64).reshape(-1).tolist(),
                                                segment_counts(num_frames, segment_frames).tolist())):
        for number in range(count):
            first = number * (segment_frames or 0)
            rows.append((video, first, frames - first if number == count - 1 else segment_frames))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def instances_of(videos: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                 segment_frames: int | None) -> np.ndarray:
    """``int64 [W, 2]``: the instance (video, stretch) holding each window (its video and first frame), each video
    cut into ``counts[video]`` stretches of ``segment_frames`` (:func:`segment_counts`), the last one longer, as
    :func:`segments_of` cuts them."""
    if segment_frames is None:
        return np.stack([videos, np.zeros_like(videos)], axis=1)
    return np.stack([videos, np.minimum(starts // segment_frames, counts[videos] - 1)], axis=1)


def aligned_num_frames(n_rgb: int, n_flow: int) -> int:
    """Frames usable by a sample that pairs RGB and flow clips at the same indices: flow frame ``i`` is the
    motion from RGB frame ``i`` to ``i + 1``, so index ``i`` is valid when both RGB frames ``i, i + 1`` and
    flow frame ``i`` exist: ``min(n_rgb - 1, n_flow)``."""
    usable = min(n_rgb - 1, n_flow)
    if usable < 1:
        raise ValueError(f"no aligned frames: {n_rgb} RGB and {n_flow} flow frames")
    return usable


def spread(total: int, count: int) -> np.ndarray:
    """Indices of ``min(count, total)`` of ``total`` items spread evenly from the first to the last, each rounded to
    the nearest (``int64``, increasing, each once; empty when either is 0): a sample that sees the whole range and
    is the same on every call."""
    return np.unique(np.linspace(0, total - 1, min(count, total)).round().astype(np.int64))


def _clip_at(start: int, num_frames: int, length: int, stride: int) -> np.ndarray:
    return np.minimum(start + stride * np.arange(length, dtype=np.int64), num_frames - 1)


def _check_clip(length: int, stride: int) -> None:
    if length < 1:
        raise ValueError(f"clip length must be at least 1, got {length}")
    if stride < 1:
        raise ValueError(f"clip stride must be at least 1, got {stride}")


def _check_frames(num_frames: int) -> None:
    if num_frames < 1:
        raise ValueError(f"a video needs at least one frame, got num_frames={num_frames}")
