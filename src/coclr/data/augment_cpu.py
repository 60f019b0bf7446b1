"""The first and last steps of the CPU augmentation in plain C: a clip's crops, and its normalised float32 planes.

:meth:`coclr.data.augment.ClipAugment._cpu_clips` starts each clip with a bilinear crop at sub-pixel positions and
ends it with ``x * scale[c] + shift[c]`` per channel into the model's planar ``[3, T, S, S]`` layout.

* :func:`crop_clip` interpolates along x on the source rows the crop reads, then along y, in fixed point
  (positions to 1/2048 pixel, one rounding): OpenCV's ``remap`` takes each output pixel's four neighbours with
  positions to 1/32 pixel, not using that the crop's positions are separable (slower, docs/performance.md).
* :func:`rgb_to_planes` reads the interleaved bytes once and writes the three planes; OpenCV needs a de-interleave
  (``split``) and one conversion per channel, four passes over the clip.

``augment_cpu.c`` is package data, built on first use by :mod:`coclr.native`. Without a compiler (one warning)
NumPy computes the same integers and the same float32 products and sums: the same bits either way, on any thread
count.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from coclr import native

CROP_BITS = 11
"""Fixed-point bits of the crops' weights (``COCLR_CROP_BITS`` in the C): positions to 1/2048 pixel."""

def _open(path: Path) -> ctypes.CDLL:
    """The library at ``path``, its functions' argument types set."""
    library = ctypes.CDLL(str(path))
    function = library.coclr_rgb_to_planes
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_long, ctypes.c_long]
    function.restype = ctypes.c_int
    function = library.coclr_crop_resize
    function.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int] + \
        [ctypes.c_void_p] * 3 + [ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2
    function.restype = ctypes.c_int
    return library


KERNEL = native.Kernel("augment_cpu", Path(__file__).with_name("augment_cpu.c"), _open,
                       "the C augmentation loops are unavailable, NumPy crops and normalises the clips (slower)")
"""The C loops (:class:`coclr.native.Kernel`): built and loaded on first use."""


def rgb_to_planes(rgb: np.ndarray, scale: Sequence[float], shift: Sequence[float], out: np.ndarray) -> None:
    """``out[c] = rgb[..., c] * scale[c] + shift[c]`` in float32 (product and sum each rounded to float32).

    ``rgb`` is ``uint8 [..., 3]`` (``P`` pixels), ``out`` float32 with ``3 * P`` elements, each of its three
    planes (``out[c]``, ``P`` elements) contiguous; both C-contiguous within a pixel or plane as described.
    """
    if rgb.dtype != np.uint8 or rgb.shape[-1:] != (3,) or not rgb.flags.c_contiguous:
        raise ValueError(f"rgb must be C-contiguous uint8 [..., 3], got {rgb.dtype} {rgb.shape}")
    pixels = rgb.size // 3
    planes = out.reshape(3, -1) if out.flags.c_contiguous else None
    if out.dtype != np.float32 or planes is None or planes.shape[1] != pixels:
        raise ValueError(f"out must be C-contiguous float32 with 3 x {pixels} elements, got {out.dtype} "
                         f"{out.shape}")
    scale32, shift32 = np.asarray(scale, np.float32), np.asarray(shift, np.float32)
    if scale32.shape != (3,) or shift32.shape != (3,):
        raise ValueError(f"scale and shift need 3 values each, got {len(scale)} and {len(shift)}")
    library = KERNEL.load()
    if library is None:
        pixel_rows = rgb.reshape(pixels, 3)
        for channel in range(3):
            np.multiply(pixel_rows[:, channel], scale32[channel], out=planes[channel])
            np.add(planes[channel], shift32[channel], out=planes[channel])
        return
    chunks = max(1, min(native.thread_count(), pixels // 65536))
    bounds = [pixels * i // chunks for i in range(chunks + 1)]

    def run(chunk: int) -> int:
        return library.coclr_rgb_to_planes(rgb.ctypes.data, planes.ctypes.data, pixels, scale32.ctypes.data,
                                           shift32.ctypes.data, bounds[chunk], bounds[chunk + 1])

    native.for_each(chunks, run)


def _taps(positions: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The two source pixels each position (in ``[0, limit - 1]``) blends and the second's weight in fixed point."""
    first = np.floor(positions).astype(np.int32)
    weight = np.rint((positions - first) * (1 << CROP_BITS)).astype(np.int32)
    return first, np.minimum(first + 1, limit - 1).astype(np.int32), weight


def crop_clip(frames: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Bilinear samples of every frame of ``uint8 [T, H, W, 3]`` at columns ``xs`` and rows ``ys`` (source pixel
    coordinates, pixel centres at integers, within ``[0, W - 1]`` and ``[0, H - 1]``; ``ys`` ascending):
    ``uint8 [T, len(ys), len(xs), 3]``, positions to 1/2048 pixel, rounded once (half up)."""
    frames = np.ascontiguousarray(frames)
    steps, height, width, channels = frames.shape
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    if frames.dtype != np.uint8 or channels != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
    if not (0 <= xs.min() and xs.max() <= width - 1 and 0 <= ys.min() and ys.max() <= height - 1) \
            or np.any(np.diff(ys) < 0):
        raise ValueError(f"positions outside the {height}x{width} frames or rows not ascending")
    x_left, x_right, x_weight = _taps(xs, width)
    y_top, y_bottom, y_weight = _taps(ys, height)
    first, last = int(y_top[0]), int(y_bottom[-1])
    out = np.empty((steps, len(ys), len(xs), 3), np.uint8)
    library = KERNEL.load()
    if library is None:
        one = 1 << CROP_BITS
        rows = frames[:, first : last + 1].astype(np.int32)
        along_x = rows[:, :, x_left] * (one - x_weight)[:, None] + rows[:, :, x_right] * x_weight[:, None]
        sums = along_x[:, y_top - first] * (one - y_weight)[:, None, None] + \
            along_x[:, y_bottom - first] * y_weight[:, None, None]
        np.right_shift(sums + (1 << (2 * CROP_BITS - 1)), 2 * CROP_BITS, out=sums)
        out[...] = sums
        return out
    chunks = min(native.thread_count(), steps)
    bounds = [steps * i // chunks for i in range(chunks + 1)]
    frame_bytes, out_bytes = height * width * 3, out[0].size

    def run(chunk: int) -> int:
        work = np.empty((last - first + 1) * len(xs) * 3, np.int32)
        begin = bounds[chunk]
        return library.coclr_crop_resize(frames.ctypes.data + begin * frame_bytes, bounds[chunk + 1] - begin,
                                         height, width, x_left.ctypes.data, x_right.ctypes.data,
                                         x_weight.ctypes.data, len(xs), y_top.ctypes.data, y_bottom.ctypes.data,
                                         y_weight.ctypes.data, len(ys), first, last, work.ctypes.data,
                                         out.ctypes.data + begin * out_bytes)

    native.for_each(chunks, run)
    return out
