"""Simple, fixed features that check the synthetic dataset poses the intended problem: appearance alone should not
tell the classes apart across scenes, motion should. Used by bench_synth.py and by the dataset's tests (which
put this folder on their path); not part of the library.
"""

from __future__ import annotations

import math

import numpy as np


def appearance_features(frames: np.ndarray) -> np.ndarray:
    """Appearance of a clip ``uint8 [T, H, W, 3]``: a 4x4x4 colour histogram of all its frames and an
    8x8 thumbnail of its first frame (what one frame shows, without motion)."""
    import cv2

    bins = (frames // 64).reshape(-1, 3).astype(np.int64)
    histogram = np.bincount(bins[:, 0] * 16 + bins[:, 1] * 4 + bins[:, 2], minlength=64) / len(bins)
    thumbnail = cv2.resize(frames[0], (8, 8), interpolation=cv2.INTER_AREA).reshape(-1) / 255.0
    return np.concatenate([histogram * 8.0, thumbnail])


def clip_flow(frames: np.ndarray) -> np.ndarray:
    """Optical flow ``float32 [T-1, H, W, 2]`` between consecutive frames (OpenCV DIS, fast preset
    "medium"): a quick stand-in for the TV-L1 flow of the training pipeline."""
    import cv2

    gray = [cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY) for frame in frames]
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)
    return np.stack([dis.calc(a, b, None) for a, b in zip(gray[:-1], gray[1:])])


def motion_features(flow: np.ndarray) -> np.ndarray:
    """Motion of a clip from its flow ``[T-1, H, W, 2]``: a magnitude-weighted histogram of flow
    directions, the mean flow and its temporal autocorrelation (translation vs oscillation), the radial
    flow about the frame centre and the mean divergence (zoom), the mean absolute curl (rotation) and the
    mean speed."""
    import cv2

    steps, height, width, _ = flow.shape
    u, v = flow[..., 0], flow[..., 1]
    magnitude = np.hypot(u, v)
    direction = ((np.arctan2(v, u) + math.pi) / (2 * math.pi) * 8).astype(np.int64) % 8
    histogram = np.stack([np.bincount(d.ravel(), weights=m.ravel(), minlength=8)
                          for d, m in zip(direction, magnitude)])
    histogram /= histogram.sum(axis=1, keepdims=True) + 1e-6
    weight = magnitude.sum(axis=(1, 2)) + 1e-6
    mean_u = (u * magnitude).sum(axis=(1, 2)) / weight
    mean_v = (v * magnitude).sum(axis=(1, 2)) / weight
    energy = float((mean_u**2 + mean_v**2).mean()) + 1e-6
    lags = [float((mean_u[:-lag] * mean_u[lag:] + mean_v[:-lag] * mean_v[lag:]).mean()) / energy
            if lag < steps else 0.0 for lag in (2, 4)]
    ys, xs = np.mgrid[0:height, 0:width] + 0.5
    rx, ry = xs - width / 2, ys - height / 2
    radial = float(((u * rx + v * ry) / (np.hypot(rx, ry) + 1e-6)).mean())
    smooth = np.stack([cv2.GaussianBlur(f, (0, 0), 2) for f in flow])
    divergence = np.gradient(smooth[..., 0], axis=2) + np.gradient(smooth[..., 1], axis=1)
    curl = np.gradient(smooth[..., 1], axis=2) - np.gradient(smooth[..., 0], axis=1)
    return np.concatenate([histogram.mean(axis=0), [
        np.abs(mean_u).mean(), mean_v.mean(), np.abs(mean_v).mean(), *lags, radial,
        divergence.mean(), np.abs(curl).mean(), magnitude.mean()]])


def nearest_neighbour_accuracy(train: np.ndarray, train_labels: np.ndarray, test: np.ndarray,
                               test_labels: np.ndarray) -> float:
    """Accuracy of 1-nearest-neighbour classification (Euclidean, features standardised on ``train``)."""
    mean, std = train.mean(axis=0), train.std(axis=0) + 1e-6
    train, test = (train - mean) / std, (test - mean) / std
    distances = ((test[:, None, :] - train[None, :, :]) ** 2).sum(axis=-1)
    return float((train_labels[distances.argmin(axis=1)] == test_labels).mean())
