"""Optical flow with OpenCV on the CPU: dual TV-L1 (the paper's flow) and DIS (a much faster alternative).

Both take two grayscale frames ``uint8 [H, W]`` and return the flow from the first to the second as float32
``[H, W, 2]`` (u = horizontal, v = vertical, in pixels), so that ``next[y + v, x + u] ~ prev[y, x]``.
OpenCV parallelises one call over its own thread pool; :func:`opencv_threads` sets its size for a block
(extraction with several worker processes sets it to 1 per worker so the processes do not oversubscribe).
"""

from __future__ import annotations

import cv2
import numpy as np

from coclr.flow.params import TVL1Params

DIS_PRESETS = {
    "ultrafast": cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST,
    "fast": cv2.DISOPTICAL_FLOW_PRESET_FAST,
    "medium": cv2.DISOPTICAL_FLOW_PRESET_MEDIUM,
}


def rgb_to_gray(frames: np.ndarray) -> np.ndarray:
    """Grayscale ``uint8 [..., H, W]`` of RGB frames ``uint8 [..., H, W, 3]``, as ``cv2.COLOR_RGB2GRAY`` does.

    Uses the BT.601 luma weights 0.299 R + 0.587 G + 0.114 B with OpenCV's fixed-point rounding, so flow
    computed from our frames matches flow computed by OpenCV users from the same images.
    """
    if frames.dtype != np.uint8 or frames.ndim < 3 or frames.shape[-1] != 3:
        raise ValueError(f"expected uint8 RGB frames [..., H, W, 3], got {frames.dtype} {frames.shape}")
    lead, (height, width) = frames.shape[:-3], frames.shape[-3:-1]
    flat = np.ascontiguousarray(frames).reshape(-1, width, 3)  # cvtColor is per pixel: stack frames vertically
    gray = cv2.cvtColor(flat, cv2.COLOR_RGB2GRAY)
    return gray.reshape(*lead, height, width)


def _check_pair(prev_gray: np.ndarray, next_gray: np.ndarray) -> None:
    if prev_gray.ndim != 2 or prev_gray.shape != next_gray.shape:
        raise ValueError(
            f"expected two grayscale frames [H, W] of the same size, got {prev_gray.shape} and {next_gray.shape}"
        )
    if prev_gray.dtype != np.uint8 or next_gray.dtype != np.uint8:
        raise ValueError(f"expected uint8 frames, got {prev_gray.dtype} and {next_gray.dtype}")


def create_tvl1(params: TVL1Params | None = None) -> cv2.optflow.DualTVL1OpticalFlow:
    """OpenCV's ``DualTVL1OpticalFlow`` with every field of ``params`` set (validated first)."""
    params = params or TVL1Params()
    params.validate()
    # Positional: the Python keyword for inner iterations is misspelt ("innnerIterations") in OpenCV.
    return cv2.optflow.DualTVL1OpticalFlow_create(
        float(params.tau),
        float(params.lambda_),
        float(params.theta),
        int(params.nscales),
        int(params.warps),
        float(params.epsilon),
        int(params.inner_iterations),
        int(params.outer_iterations),
        float(params.scale_step),
        float(params.gamma),
        int(params.median_filtering),
        False,
    )


def opencv_tvl1(prev_gray: np.ndarray, next_gray: np.ndarray, params: TVL1Params | None = None) -> np.ndarray:
    """Dual TV-L1 flow (Zach et al. 2007) from ``prev_gray`` to ``next_gray``: float32 ``[H, W, 2]``."""
    _check_pair(prev_gray, next_gray)
    return create_tvl1(params).calc(prev_gray, next_gray, None)


def opencv_dis(prev_gray: np.ndarray, next_gray: np.ndarray, preset: str = "medium") -> np.ndarray:
    """Dense Inverse Search flow (Kroeger et al. 2016) from ``prev_gray`` to ``next_gray``: float32 ``[H, W, 2]``.

    ``preset`` is "ultrafast", "fast" or "medium" (OpenCV's presets; "medium" is the most accurate).
    """
    if preset not in DIS_PRESETS:
        raise ValueError(f"unknown DIS preset {preset!r} (choose from {', '.join(DIS_PRESETS)})")
    _check_pair(prev_gray, next_gray)
    height, width = prev_gray.shape
    if min(height, width) < DIS_MIN_SIDE:
        raise ValueError(f"frames of {width} x {height} px are too small for DIS (it needs {DIS_MIN_SIDE} px on each "
                         "side); use --backend tvl1, or store larger frames")
    return cv2.DISOpticalFlow_create(DIS_PRESETS[preset]).calc(prev_gray, next_gray, None)


DIS_MIN_SIDE = 16
"""The least side OpenCV's DIS (5.0) takes safely: below it some sizes are refused with its own error (a literal
"\\n" and its source line in the failure list) and others crash the process (8-15 px by 40 px or more: a
segmentation fault), measured on every size up to 29 x 79 and some longer."""


def opencv_video_flow(gray: np.ndarray, method: str, params: TVL1Params | None = None) -> np.ndarray:
    """Flow between consecutive frames of ``gray [N, H, W]`` with an OpenCV backend: float32 ``[N-1, H, W, 2]``."""
    if method == "tvl1":
        flows = [opencv_tvl1(a, b, params) for a, b in zip(gray[:-1], gray[1:])]
    elif method == "dis":
        flows = [opencv_dis(a, b) for a, b in zip(gray[:-1], gray[1:])]
    else:
        raise ValueError(f"not an OpenCV flow method: {method!r}")
    return np.stack(flows) if flows else np.zeros((0, *gray.shape[1:], 2), np.float32)
