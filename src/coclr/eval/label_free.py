"""How good a representation is, judged without labels: what one can check on one's own footage.

- **alignment** and **uniformity** (Wang and Isola, "Understanding Contrastive Representation Learning through
  Alignment and Uniformity on the Hypersphere", ICML 2020), on features centred by the videos' mean (as retrieval
  compares them: pooled backbone features are all positive) and L2-normalised: alignment is the mean
  squared distance between the two halves of a video (the mean window feature of its first half and of its second
  half: two clips of one video, InfoNCE's positives; 0 is perfect, 4 is opposite), uniformity the log of the mean
  Gaussian potential ``exp(-2 |x - y|^2)`` over pairs of videos (from 0 when every video sits on one point down to
  about -4 for a uniform spread). Lower is better for both; an encoder that maps every video to one point has
  perfect alignment and uniformity 0.
- **effective rank** of the video features (:func:`coclr.eval.health.effective_rank`), and **collapse** judged
  without labels by :func:`coclr.eval.health.feature_health` (no spread, or features along one line).
- **neighbour agreement** of two views: how often a video's nearest other video is the same one for the RGB
  and for the flow encoder (chance: one over the videos less one). CoCLR's premise is that the views agree on
  which videos are alike; agreement that rises over the cycles is the co-training working.
"""

from __future__ import annotations

import numpy as np

from coclr.eval.health import effective_rank, feature_health

MAX_PAIRS_ROWS = 4096
"""Uniformity is measured on at most this many videos (a fixed sample of larger sets)."""


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def halves(windows: np.ndarray, videos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean window feature of the first and of the second half of each video with two windows or more
    (``videos``: the video of each window, windows in time order): two positive views of each such video."""
    firsts, seconds = [], []
    for video in np.unique(videos):
        rows = np.flatnonzero(videos == video)
        if len(rows) < 2:
            continue
        middle = len(rows) // 2
        firsts.append(windows[rows[:middle]].mean(axis=0))
        seconds.append(windows[rows[middle:]].mean(axis=0))
    dim = windows.shape[1]
    return np.array(firsts).reshape(-1, dim), np.array(seconds).reshape(-1, dim)


def alignment(a: np.ndarray, b: np.ndarray) -> float | None:
    """Mean squared distance between the L2-normalised rows of ``a`` and ``b`` (positive pairs); None without
    pairs."""
    if len(a) == 0:
        return None
    return float((((_unit(a) - _unit(b)) ** 2).sum(axis=1)).mean())


def uniformity(features: np.ndarray, t: float = 2.0) -> float | None:
    """``log mean exp(-t |x - y|^2)`` over pairs of distinct L2-normalised rows; None for fewer than two rows."""
    x = _unit(features)
    if len(x) > MAX_PAIRS_ROWS:
        x = x[np.random.default_rng(0).choice(len(x), MAX_PAIRS_ROWS, replace=False)]
    if len(x) < 2:
        return None
    norms = (x ** 2).sum(axis=1)  # 1, or 0 for a row without spread (which sits on the others' point)
    squared = np.clip(norms[:, None] + norms[None, :] - 2.0 * (x @ x.T), 0.0, None)
    upper = np.triu_indices(len(x), k=1)
    values = -t * squared[upper]
    peak = values.max()
    return float(peak + np.log(np.exp(values - peak).mean()))


def nearest_others(features: np.ndarray) -> np.ndarray:
    """The index of each row's most similar other row (cosine after centring; ties to the lower index)."""
    x = np.asarray(features, dtype=np.float64)
    x = _unit(x - x.mean(axis=0))
    scores = x @ x.T
    np.fill_diagonal(scores, -np.inf)
    return scores.argmax(axis=1)


def neighbour_agreement(a: np.ndarray, b: np.ndarray) -> float | None:
    """The share of videos whose nearest other video is the same in ``a`` and in ``b`` (rows: the same videos);
    None for fewer than three videos."""
    if len(a) < 3:
        return None
    return float((nearest_others(a) == nearest_others(b)).mean())


def quality(video_features: np.ndarray, windows: np.ndarray | None = None,
            window_videos: np.ndarray | None = None) -> dict[str, float | bool | None]:
    """The label-free measures of one encoder's features: ``effective_rank``, ``uniformity``, ``alignment`` (with
    the window features and the video of each window) and ``collapsed`` (no spread, or one line:
    :func:`~coclr.eval.health.feature_health` without labels)."""
    x = np.asarray(video_features, dtype=np.float64)
    health = feature_health(x)
    mean = x.mean(axis=0)
    first, second = (halves(windows, window_videos) if windows is not None and window_videos is not None
                     else (np.zeros((0, x.shape[1])), np.zeros((0, x.shape[1]))))
    return {"effective_rank": effective_rank(x - mean), "uniformity": uniformity(x - mean),
            "alignment": alignment(first - mean, second - mean), "videos": len(x),
            "collapsed": bool(health["degenerate"])}
