"""Two-stream fusion (paper, Table 1 "R+F"): average the RGB and flow predictions of the same videos.

Classification averages the per-video class probabilities; retrieval averages the similarity matrices
(see :func:`coclr.eval.retrieval.retrieve`, which takes one feature matrix per view). Fusing only makes
sense when both streams describe the same videos in the same order, which :func:`check_same_videos`
enforces with an error naming the first difference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coclr.errors import CoclrError, DataError


def check_same_videos(keys_a: Sequence[str], keys_b: Sequence[str], what: str = "two streams") -> None:
    """Raise :class:`DataError` unless both key lists are the same videos in the same order."""
    if len(keys_a) != len(keys_b):
        raise DataError(f"{what}: cannot fuse {len(keys_a)} videos with {len(keys_b)} videos")
    for position, (a, b) in enumerate(zip(keys_a, keys_b)):
        if a != b:
            raise DataError(f"{what}: video {position} differs ({a!r} vs {b!r}); both streams must cover the "
                            "same videos in the same order")


def fuse_probabilities(probs_a: np.ndarray, keys_a: Sequence[str], probs_b: np.ndarray,
                       keys_b: Sequence[str]) -> np.ndarray:
    """Mean of two streams' per-video class probabilities ``[N, C]`` (after checking the videos match)."""
    check_same_videos(keys_a, keys_b, "probability fusion")
    probs_a, probs_b = np.asarray(probs_a, dtype=np.float64), np.asarray(probs_b, dtype=np.float64)
    if probs_a.shape != probs_b.shape:
        raise DataError(f"probability fusion: shapes differ, {probs_a.shape} vs {probs_b.shape}")
    return ((probs_a + probs_b) / 2.0).astype(np.float32)


def require_finite(probabilities: np.ndarray, what: str, remedy: str) -> None:
    """Refuse, in one line, probabilities that are not finite: ``what`` (a finetuning, a probe) diverged, and an
    accuracy of them would be that of NaN rows sorted in class order (the share of class 0), reported as a result."""
    if not np.isfinite(np.asarray(probabilities)).all():
        raise CoclrError(f"{what} diverged: its test probabilities are not finite (NaN or infinite), so no accuracy "
                         f"is written; {remedy}")


def topk_accuracy(probabilities: np.ndarray, labels: np.ndarray, ks: Sequence[int] = (1, 5)) -> dict[int, float]:
    """Fraction of videos whose label is among the k most probable classes (ties: lower class first)."""
    probabilities, labels = np.asarray(probabilities), np.asarray(labels)
    order = np.argsort(-probabilities, axis=1, kind="stable")
    return {int(k): float((order[:, :k] == labels[:, None]).any(axis=1).mean()) for k in ks}
