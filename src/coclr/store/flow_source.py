"""What flow is computed from: a video's encoded RGB frames in the store, as grayscale frames."""

from __future__ import annotations

import numpy as np

from coclr.errors import DataError
from coclr.flow.opencv import rgb_to_gray
from coclr.store.clipstore import ClipStore

SOURCE_VIEW = "rgb"


def gray_frames(store: ClipStore, key: str, start: int, stop: int) -> np.ndarray:
    """Grayscale ``uint8 [N, H, W]`` of frames ``start`` to ``stop`` of ``key``'s RGB entry (as
    ``cv2.COLOR_RGB2GRAY`` converts them), read by :meth:`ClipStore.read`: a frame that does not decode, or is not
    of the entry's size, is the entry's damage, listed so that the job that writes it rebuilds it."""
    return rgb_to_gray(store.read(key, SOURCE_VIEW, range(start, stop)))


def source_frames(store: ClipStore, key: str) -> tuple[int, float]:
    """The number of RGB frames of ``key`` and its fps; a video with fewer than 2 frames is an error."""
    if not store.has(key, SOURCE_VIEW):
        raise DataError(f"{key}: no {SOURCE_VIEW!r} entry in {store.root} (its RGB job failed, or the entry was "
                        "removed since)")
    count = store.num_frames(key, SOURCE_VIEW)
    if count < 2:
        raise DataError(f"{key}: {count} RGB frame, flow needs at least 2")
    return count, store.fps(key, SOURCE_VIEW)


def video_source(store: ClipStore, key: str) -> tuple[list[bytes], float]:
    """The encoded RGB frames of ``key`` (all of them: see :func:`source_frames` to read them in parts) and its
    fps; a video with fewer than 2 frames is an error."""
    count, fps = source_frames(store, key)
    return store.read_encoded(key, SOURCE_VIEW, range(count)), fps
