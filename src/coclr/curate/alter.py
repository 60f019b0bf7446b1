"""Altered copies of a video, as a duplicate found in the wild differs from its original: re-encoded at a lower
quality, trimmed, cropped, resized, brightened, sped up, flipped, with a text overlay, or several of these.

They calibrate the duplicate threshold on a user's own videos (:mod:`coclr.curate.calibrate`) and measure duplicate
detection (``benchmarks/curate_duplicates.py``). Each alteration is a pure function of the decoded frames; the copy
is written as H.264 (even sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

LOW_QUALITY_CRF = 38
"""H.264 CRF of the "re-encoded at a lower quality" copy (18 is visually lossless; 38 shows blocks)."""


def _even(frames: np.ndarray) -> np.ndarray:
    height, width = frames.shape[1] // 2 * 2, frames.shape[2] // 2 * 2
    return np.ascontiguousarray(frames[:, :height, :width])


def trim(frames: np.ndarray) -> np.ndarray:
    """The middle 60% of the frames (a fifth cut at each end)."""
    cut = len(frames) // 5
    return frames[cut: len(frames) - cut] if len(frames) - 2 * cut >= 2 else frames


def crop(frames: np.ndarray) -> np.ndarray:
    """The centre 80% of each side, resized back to the original size."""
    height, width = frames.shape[1:3]
    top, left = height // 10, width // 10
    inner = frames[:, top: height - top, left: width - left]
    return np.stack([cv2.resize(frame, (width, height), interpolation=cv2.INTER_LINEAR) for frame in inner])


def resize(frames: np.ndarray) -> np.ndarray:
    """Half the size (at least 32 px a side)."""
    height, width = frames.shape[1:3]
    size = (max(32, width // 2), max(32, height // 2))
    return np.stack([cv2.resize(frame, size, interpolation=cv2.INTER_AREA) for frame in frames])


_BRIGHTER = np.clip(np.arange(256, dtype=np.float32) * 1.2 + 40, 0, 255).astype(np.uint8)
""":func:`brighten` of each level 0-255."""


def brighten(frames: np.ndarray) -> np.ndarray:
    """Brighter by 40 levels of 255 and a fifth more contrast, clipped: each level looked up in :data:`_BRIGHTER`
    (``uint8 [T, H, W, C]``; no float copy of the frames)."""
    shape = frames.shape
    return cv2.LUT(np.ascontiguousarray(frames).reshape(-1, *shape[2:]), _BRIGHTER).reshape(shape)


def speed(frames: np.ndarray) -> np.ndarray:
    """Twice as fast: every other frame."""
    return frames[::2] if len(frames) >= 4 else frames


def flip(frames: np.ndarray) -> np.ndarray:
    """Mirrored left to right."""
    return np.ascontiguousarray(frames[:, :, ::-1])


def overlay(frames: np.ndarray) -> np.ndarray:
    """A white caption with a dark outline across the lower part of every frame."""
    out = frames.copy()
    height, width = out.shape[1:3]
    scale = max(0.3, width / 320)
    for frame in out:
        for colour, thickness in (((0, 0, 0), 3), ((255, 255, 255), 1)):
            cv2.putText(frame, "coclr 2026", (width // 20, height - height // 8), cv2.FONT_HERSHEY_SIMPLEX, scale,
                        colour, max(1, round(thickness * scale)), cv2.LINE_AA)
    return out


ALTERATIONS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], int]] = {
    "reencode": (lambda frames: frames, LOW_QUALITY_CRF),
    "trim": (trim, 18),
    "crop": (crop, 18),
    "resize": (resize, 18),
    "brighten": (brighten, 18),
    "speed": (speed, 18),
    "flip": (flip, 18),
    "overlay": (overlay, 18),
    "crop+reencode": (crop, LOW_QUALITY_CRF),
    "trim+brighten+overlay": (lambda frames: overlay(brighten(trim(frames))), 18),
}
"""Each alteration: what it does to the frames, and the CRF the copy is written at."""


def write_altered(frames: np.ndarray, fps: float, name: str, path: Path) -> Path:
    """Write ``frames`` (``uint8 [T, H, W, 3]``) altered by ``ALTERATIONS[name]`` as an MP4 ``path``, atomically
    (a temporary name, then renamed), at ``fps``: a sped-up copy plays its half of the frames in half the time."""
    from coclr.video.decode import write_mp4  # noqa: PLC0415 (heavy: av)

    alter, crf = ALTERATIONS[name]
    temp = path.with_name(f".{path.name}.partial.mp4")
    try:
        write_mp4(temp, _even(alter(frames)), fps, crf=crf)
        temp.replace(path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path
