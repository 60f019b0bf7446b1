"""Thread pools of the libraries we call: OpenCV's pool size for a block of work."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import cv2


@contextmanager
def opencv_threads(threads: int | None) -> Iterator[None]:
    """Run a block with OpenCV's thread pool set to ``threads`` (None: leave OpenCV's setting alone)."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    previous = cv2.getNumThreads()
    cv2.setNumThreads(threads)
    try:
        yield
    finally:
        cv2.setNumThreads(previous)
