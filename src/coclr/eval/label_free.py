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
- **RankMe** (Garrido et al., "RankMe: Assessing the Downstream Performance of Pretrained Self-Supervised
  Representations by Their Rank", ICML 2023) on the centred video features: the exponential of the entropy of
  their normalised singular values (the effective rank weighs the eigenvalues, their squares).
- **neighbour agreement** of two views: how often a video's nearest other video is the same one for the RGB
  and for the flow encoder (chance: one over the videos less one), and its k-nearest form
  (:func:`neighbour_overlap`: the share of a video's k nearest shared by two encoders). CoCLR's premise is that
  the views agree on which videos are alike; agreement that rises over the cycles is the co-training working.
- **temporal retrieval**: how often a video's first half (the mean of its first windows) finds its own second half
  as the nearest among every video's second half; and **neighbour stability**: the share of a video's k nearest
  others that are the same whether the videos are seen through their first or their second halves. Both ask
  whether the features say more about which video (and which kind of video) it is than about the moment.

Every ranking here compares videos by the cosine of their centred features, scored exactly
(:mod:`coclr.eval.exact`), ties to the lower index, so the measures do not depend on the CPU or the order of work.
"""

from __future__ import annotations

import numpy as np

from coclr.eval.exact import gallery_mean, unit_rows
from coclr.eval.health import effective_rank, feature_health

MAX_PAIRS_ROWS = 4096
"""Uniformity is measured on at most this many videos (a fixed sample of larger sets)."""


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def halves(windows: np.ndarray, videos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean window feature of the first and of the second half of each video with two windows or more
    (``videos``: the video of each window, windows in time order): two positive views of each such video; and
    those videos."""
    firsts, seconds, kept = [], [], []
    for video in np.unique(videos):
        rows = np.flatnonzero(videos == video)
        if len(rows) < 2:
            continue
        middle = len(rows) // 2
        firsts.append(windows[rows[:middle]].mean(axis=0))
        seconds.append(windows[rows[middle:]].mean(axis=0))
        kept.append(video)
    dim = windows.shape[1]
    return np.array(firsts).reshape(-1, dim), np.array(seconds).reshape(-1, dim), np.array(kept, dtype=np.int64)


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


NEIGHBOURS = 5
"""The k of the k-nearest measures (fewer for fewer candidates: :func:`neighbour_count`)."""


def neighbour_count(candidates: int, k: int = NEIGHBOURS) -> int:
    """``k``, or fewer when a row has few candidates (at most its candidates less one, so that a neighbour set is
    never all of them), at least 1."""
    return max(1, min(k, candidates - 1))


def similarities(queries: np.ndarray, gallery: np.ndarray | None = None) -> np.ndarray:
    """``float64 [Q, G]``: the cosine of each query and gallery row after centring both by the gallery's mean (the
    queries' own without a gallery), exact whatever the order of work (:mod:`coclr.eval.exact`)."""
    others = queries if gallery is None else gallery
    mean = gallery_mean(np.asarray(others, dtype=np.float64))
    q = unit_rows(queries, mean).astype(np.float64)
    g = q if gallery is None else unit_rows(gallery, mean).astype(np.float64)
    return q @ g.T


def nearest(scores: np.ndarray, k: int) -> np.ndarray:
    """``[Q, k]``: the columns of each row's ``k`` largest scores, best first, ties to the lower column (a stable
    sort)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def _candidates(count: int, groups: np.ndarray | None) -> np.ndarray:
    """``bool [N, N]``: which rows are each row's candidate neighbours: every other row, less those of its group."""
    allowed = ~np.eye(count, dtype=bool)
    if groups is not None:
        groups = np.asarray(groups)
        allowed &= groups[:, None] != groups[None, :]
    return allowed


def nearest_others(features: np.ndarray, k: int = 1, groups: np.ndarray | None = None) -> np.ndarray:
    """The indices of each row's ``k`` most similar other rows (cosine after centring; ties to the lower index;
    with ``groups``, never a row of its own group: other stretches of its video): ``[N]`` for ``k`` 1, else
    ``[N, k]``."""
    scores = similarities(features)
    scores[~_candidates(len(scores), groups)] = -np.inf
    found = nearest(scores, k)
    return found[:, 0] if k == 1 else found


def chance_agreement(count: int, groups: np.ndarray | None = None) -> float:
    """What :func:`neighbour_agreement` gives for unrelated features: the mean over rows of one over its
    candidates."""
    candidates = _candidates(count, groups).sum(axis=1)
    return float(np.mean(1.0 / np.maximum(candidates, 1)))


def neighbour_agreement(a: np.ndarray, b: np.ndarray, groups: np.ndarray | None = None) -> float | None:
    """The share of rows whose nearest other row (outside its group) is the same in ``a`` and in ``b`` (rows: the
    same videos, or stretches of them); None for fewer than three rows."""
    if len(a) < 3:
        return None
    return float((nearest_others(a, groups=groups) == nearest_others(b, groups=groups)).mean())


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    """The mean over rows of the share of ``a``'s indices that are also in ``b``'s (``[N, k]`` each)."""
    return float(np.mean([len(set(x) & set(y)) / a.shape[1] for x, y in zip(a.tolist(), b.tolist())]))


def neighbour_overlap(a: np.ndarray, b: np.ndarray, k: int = NEIGHBOURS,
                      groups: np.ndarray | None = None) -> float | None:
    """The share of a row's ``k`` nearest other rows (outside its group; :func:`neighbour_count` of its fewest
    candidates) that are the same in ``a`` and in ``b`` (rows: the same videos), averaged over the rows; None for
    fewer than three rows."""
    if len(a) < 3:
        return None
    k = neighbour_count(int(_candidates(len(a), groups).sum(axis=1).min()), k)
    return _overlap(nearest_others(a, k, groups).reshape(len(a), k), nearest_others(b, k, groups).reshape(len(b), k))


def rankme(centered: np.ndarray, eps: float = 1e-7) -> float:
    """RankMe: exp of the entropy of the normalised singular values of ``centered`` (0 for no spread)."""
    values = np.linalg.svd(np.asarray(centered, dtype=np.float64), compute_uv=False)
    total = values.sum()
    if total <= 0:
        return 0.0
    share = values / total + eps
    return float(np.exp(-(share * np.log(share)).sum()))


def temporal_retrieval(first: np.ndarray, second: np.ndarray) -> float | None:
    """The share of videos whose ``first`` half finds its own ``second`` half as the nearest among every video's
    second half (cosine, centred by the second halves' mean; ties to the lower index: a constant encoder scores
    one video in all); None for fewer than two videos."""
    if len(first) < 2:
        return None
    return float((nearest(similarities(first, second), 1)[:, 0] == np.arange(len(first))).mean())


def neighbour_stability(first: np.ndarray, second: np.ndarray, k: int = NEIGHBOURS,
                        groups: np.ndarray | None = None) -> float | None:
    """The share of a video's ``k`` nearest other videos (outside its group) that are the same by the videos'
    ``first`` halves and by their ``second`` halves (:func:`neighbour_overlap` of the two); None for fewer than
    three videos."""
    return neighbour_overlap(first, second, k, groups)


def quality(video_features: np.ndarray, windows: np.ndarray | None = None, window_videos: np.ndarray | None = None,
            groups: np.ndarray | None = None) -> dict[str, float | bool | None]:
    """The label-free measures of one encoder's features (a row per video, or per stretch of one): ``effective_rank``,
    ``rankme``, ``uniformity``, with the window features and the row of each window ``alignment``,
    ``temporal_retrieval`` and ``neighbour_stability`` (on the rows of two windows or more; with ``groups``, each
    row's group, a row's neighbours are outside its group), and ``collapsed`` (no spread, or one line:
    :func:`~coclr.eval.health.feature_health` without labels)."""
    x = np.asarray(video_features, dtype=np.float64)
    health = feature_health(x)
    mean = x.mean(axis=0)
    empty = np.zeros((0, x.shape[1]))
    first, second, kept = (halves(windows, window_videos) if windows is not None and window_videos is not None
                           else (empty, empty, np.zeros(0, dtype=np.int64)))
    kept_groups = None if groups is None else np.asarray(groups)[kept]
    return {"effective_rank": effective_rank(x - mean), "rankme": rankme(x - mean),
            "uniformity": uniformity(x - mean), "alignment": alignment(first - mean, second - mean),
            "temporal_retrieval": temporal_retrieval(first, second),
            "neighbour_stability": neighbour_stability(first, second, groups=kept_groups), "videos": len(x),
            "collapsed": bool(health["degenerate"])}
