"""The JPEG codec of stored frames (OpenCV: deterministic for the same input and build).

RGB and flow frames are stored as JPEG (flow as its 3-channel uint8 image, :mod:`coclr.flow.encode`).
"""

from __future__ import annotations

import os
import sys
import tempfile

import cv2
import numpy as np

from coclr.clips import JPEG_QUALITY

JPEG_MAX_SIDE = 65500
"""The longest side a JPEG frame may have (libjpeg's limit, as OpenCV's encoder refuses it)."""

# OpenCV >= 4.10 decodes straight to RGB (faster than decoding to BGR and converting).
_IMREAD_RGB: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)


def encode_jpeg(frame: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """Encode ``uint8 [H, W, 3]`` RGB as JPEG."""
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"expected a uint8 [H, W, 3] frame, got {frame.dtype} {tuple(frame.shape)}")
    if not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality must be in 1..100, got {quality}")
    if max(frame.shape[:2]) > JPEG_MAX_SIDE:
        raise ValueError(f"a frame of {frame.shape[1]}x{frame.shape[0]} px has a side longer than JPEG's "
                         f"{JPEG_MAX_SIDE}: resize to a smaller short side (--short-side), or crop the video")
    ok, data = cv2.imencode(".jpg", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("OpenCV could not encode the frame as JPEG")
    return data.tobytes()


def decode_jpeg(data: bytes) -> np.ndarray:
    """Decode an encoded image (JPEG, or any format OpenCV reads) to ``uint8 [H, W, 3]`` RGB."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), _IMREAD_RGB or cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"cannot decode an image from {len(data)} bytes")
    return image if _IMREAD_RGB else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def decode_jpeg_strict(data: bytes) -> np.ndarray:
    """:func:`decode_jpeg`, and a ``ValueError`` when the decoder warns about the data: libjpeg decodes damaged
    data as far as it goes and only prints a warning ("Corrupt JPEG data: ...") to the process's standard error,
    which is captured here (file descriptor 2 is redirected while the frame decodes, so this is for verification,
    not for the training path)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            image = decode_jpeg(data)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        warning = capture.read().decode("utf-8", "replace").strip()
    if warning:
        raise ValueError(f"the JPEG decoder reports damaged data: {warning.splitlines()[0]}")
    return image
