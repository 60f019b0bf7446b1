"""Fitting stored frames to the frame size of a batch: resize to cover it (aspect ratio kept), centre-crop.

Videos of one split may be stored at different sizes (another aspect ratio); a batch needs one. The CPU path
(:func:`fit_frames`, OpenCV) is the one DataLoader workers use; :func:`fit_frames_torch` does the same on the
training device, for frames decoded there, with PyTorch's antialiased resize (close to OpenCV's, not equal).
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F


def fit_geometry(height: int, width: int, size: Sequence[int]) -> tuple[int, int, int, int, float]:
    """How :func:`fit_frames` fits a ``height x width`` frame to ``size``: ``(new_h, new_w, top, left, scale)``, the
    size it is resized to (covering ``size``, aspect ratio kept) and the corner of the centred crop."""
    scale = max(size[0] / height, size[1] / width)
    new_h, new_w = max(size[0], round(height * scale)), max(size[1], round(width * scale))
    return new_h, new_w, (new_h - size[0]) // 2, (new_w - size[1]) // 2, scale


def fit_frames(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize ``[T, H, W, 3]`` frames to cover ``size`` (keeping their aspect ratio), then centre-crop."""
    height, width = frames.shape[1:3]
    if (height, width) == tuple(size):
        return frames
    new_h, new_w, top, left, scale = fit_geometry(height, width, size)
    out = np.empty((len(frames), size[0], size[1], 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        resized = cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
        out[i] = resized[top : top + size[0], left : left + size[1]]
    return out


def fit_frames_torch(frames: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """:func:`fit_frames` of ``uint8 [T, 3, H, W]`` frames on their device: antialiased bilinear resize when
    shrinking (bilinear when enlarging), then the same centred crop; returns ``uint8 [T, 3, *size]``."""
    height, width = frames.shape[2:4]
    if (height, width) == tuple(size):
        return frames
    new_h, new_w, top, left, scale = fit_geometry(height, width, size)
    resized = F.interpolate(frames.float(), size=(new_h, new_w), mode="bilinear", align_corners=False,
                            antialias=scale < 1)
    return resized[:, :, top : top + size[0], left : left + size[1]].round_().clamp_(0, 255).to(torch.uint8)
