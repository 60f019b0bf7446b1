"""What flow is computed from: a video's encoded RGB frames in the store, as grayscale frames."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coclr.errors import DataError
from coclr.flow.opencv import rgb_to_gray
from coclr.store.clipstore import ClipStore
from coclr.store.jpeg import decode_jpeg

SOURCE_VIEW = "rgb"


def decode_gray(blobs: Sequence[bytes], first: int = 0) -> np.ndarray:
    """Grayscale ``uint8 [N, H, W]`` of encoded RGB frames (as ``cv2.COLOR_RGB2GRAY`` converts them), the first of
    them frame ``first`` of its entry. A frame that does not decode, or is of another size than the first, is a
    :class:`DataError` naming it and the remedy (an entry written before checksums is read unchecked: it was
    NumPy's "all input arrays must have the same shape")."""
    frames = []
    for number, blob in enumerate(blobs, start=first):
        try:
            frame = decode_jpeg(blob)
        except Exception as error:  # noqa: BLE001 (OpenCV's, or the decoder's own: the entry's fault)
            raise DataError(f"rgb frame {number} does not decode ({error}): its store entry is damaged; run `coclr "
                            "data store` again to decode the video anew") from None
        if frames and frame.shape != frames[0].shape:
            raise DataError(f"rgb frame {number} is {frame.shape[1]}x{frame.shape[0]} where the frames before it are "
                            f"{frames[0].shape[1]}x{frames[0].shape[0]}: its store entry is damaged; run `coclr data "
                            "store` again to decode the video anew")
        frames.append(frame)
    return rgb_to_gray(np.stack(frames))


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
