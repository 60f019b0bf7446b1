"""Middlebury ``.flo`` files and flow error measures, for checking flow accuracy against ground truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coclr.errors import DataError

FLO_TAG = 202021.25
UNKNOWN_FLOW_THRESHOLD = 1e9


def read_flo(path: str | Path) -> np.ndarray:
    """Read a Middlebury ``.flo`` file as float32 [H, W, 2] (u, v); unknown pixels keep their huge values."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot read flow file: {error}") from None
    if len(raw) < 12 or np.frombuffer(raw[:4], "<f4")[0] != np.float32(FLO_TAG):
        raise DataError(f"{path}: not a Middlebury .flo file (bad tag)")
    width, height = (int(v) for v in np.frombuffer(raw[4:12], "<i4"))
    expected = 12 + width * height * 2 * 4
    if width <= 0 or height <= 0 or len(raw) != expected:
        raise DataError(f"{path}: size {len(raw)} bytes does not match {width}x{height} flow")
    return np.frombuffer(raw[12:], "<f4").reshape(height, width, 2).copy()


def valid_mask(gt: np.ndarray) -> np.ndarray:
    """Pixels whose ground truth is known (Middlebury marks unknown ones with magnitudes above 1e9)."""
    return np.all(np.isfinite(gt), axis=-1) & np.all(np.abs(gt) < UNKNOWN_FLOW_THRESHOLD, axis=-1)


def endpoint_error(flow: np.ndarray, gt: np.ndarray) -> dict[str, float]:
    """Mean and RMS endpoint error, and the fraction of pixels with error above 1 px, over known pixels."""
    if flow.shape != gt.shape:
        raise ValueError(f"flow shape {flow.shape} differs from ground truth shape {gt.shape}")
    mask = valid_mask(gt)
    err = np.linalg.norm(flow.astype(np.float64) - gt.astype(np.float64), axis=-1)[mask]
    return {
        "epe": float(err.mean()),
        "rmse": float(np.sqrt((err ** 2).mean())),
        "outliers_1px": float((err > 1.0).mean()),
    }
