"""Near-duplicate groups, outlier scores and the duplicate threshold: small pure functions on a neighbour graph.

The graph is each row's ``k`` nearest other rows by cosine similarity (:func:`coclr.curate.graph.neighbour_graph`).
Two videos are near-duplicates when their similarity reaches the threshold; a group is a connected set of such pairs
(union-find), so a chain of re-encodes of one take falls into one group. A video's outlier score is one minus the
mean similarity of its ``k`` nearest others: how far it lies from every part of the collection (a kNN distance,
which needs no parameter beyond ``k`` and no assumption on the shape of the groups).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OUTLIER_K = 10
"""Neighbours the outlier score averages over."""
MIN_SEPARATION = 0.5
"""A calibration whose best threshold keeps less than this Youden's J (recall of the copies minus the share of videos
passing) does not separate copies from other videos: the distribution rule is used instead."""
RECALL_TARGET = 0.95
"""The share of its altered copies the fingerprints' calibrated threshold keeps (:func:`recall_threshold`)."""
FALLBACK_RANGE = (0.80, 0.99)
"""Where the distribution rule's threshold is kept (:func:`distribution_threshold`)."""


def duplicate_groups(scores: np.ndarray, neighbours: np.ndarray, threshold: float) -> list[list[int]]:
    """The groups (each a sorted list of rows, at least two; groups sorted by their first row) that pairs of rows
    with similarity at least ``threshold`` join, from ``scores``/``neighbours`` ``[N, k]`` (each row's nearest
    others, -1 for none)."""
    count = len(scores)
    parent = np.arange(count)

    def root(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return int(node)

    rows, columns = np.nonzero((scores >= threshold) & (neighbours >= 0))
    for row, other in zip(rows, neighbours[rows, columns]):
        a, b = root(int(row)), root(int(other))
        if a != b:
            parent[max(a, b)] = min(a, b)
    members: dict[int, list[int]] = {}
    for row in np.unique(np.concatenate([rows, neighbours[rows, columns]])) if len(rows) else []:
        members.setdefault(root(int(row)), []).append(int(row))
    return sorted((sorted(group) for group in members.values() if len(group) > 1), key=lambda group: group[0])


def alike_graph(rows: np.ndarray, count: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A graph (as :func:`duplicate_groups` reads it, ``[count, max(1, k)]``) that joins ``rows`` at similarity 1 and
    nothing else: for videos that no similarity can tell apart because each is the folder's mean (copies of one
    video, centred, are all zero), which are one group whatever the threshold."""
    width = max(1, k)
    scores = np.full((count, width), -np.inf, np.float32)
    neighbours = np.full((count, width), -1, np.int64)
    rows = np.asarray(rows, np.int64)
    for place, row in enumerate(rows):
        others = rows[(place + 1 + np.arange(min(width, len(rows) - 1))) % len(rows)]
        scores[row, :len(others)] = 1.0
        neighbours[row, :len(others)] = others
    return scores, neighbours


def alike_first(scores: np.ndarray, neighbours: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The graph with each of ``rows`` (videos that are each the folder's mean, so zero once centred: their cosine
    says nothing, 0) nearest to the others of ``rows`` at similarity 1, as their vectors are one, its other
    neighbours after them: copies of one video are not each other's most unlike."""
    scores, neighbours = scores.copy(), neighbours.copy()
    alike = set(int(row) for row in rows)
    width = scores.shape[1]
    for row in rows:
        others = sorted(alike - {int(row)})[:width]  # (the lowest rows: the same graph every run)
        rest = [(score, other) for score, other in zip(scores[row], neighbours[row])
                if other >= 0 and int(other) not in alike][:width - len(others)]
        scores[row] = -np.inf
        neighbours[row] = -1
        scores[row, :len(others)] = 1.0
        neighbours[row, :len(others)] = others
        for column, (score, other) in enumerate(rest, start=len(others)):
            scores[row, column], neighbours[row, column] = score, other
    return scores, neighbours


def best_match(scores: np.ndarray, neighbours: np.ndarray, group: list[int]) -> dict[int, float]:
    """For each row of ``group``, its highest similarity to another member among the pairs of the graph, either
    way (the CSV's ``similarity``): a graph need not be symmetric (a fingerprint is compared with the others'
    mirrored ones too), and a pair found from one side is the other's match as well."""
    inside = set(group)
    found = {row: -np.inf for row in group}
    for row in group:
        for score, other in zip(scores[row], neighbours[row]):
            if int(other) in inside and int(other) != row:
                found[row] = max(found[row], float(score))
                found[int(other)] = max(found[int(other)], float(score))
    return {row: best if best > -np.inf else float("nan") for row, best in found.items()}


@dataclass(frozen=True)
class Stretch:
    """Where two videos share a part: the seconds of each (first window's start to last window's end) and the
    highest similarity of their matching windows."""

    video: int
    other: int
    start: float
    end: float
    other_start: float
    other_end: float
    similarity: float


def group_of(groups: list[list[int]], count: int) -> np.ndarray:
    """Each of ``count`` rows' group number in ``groups`` (-1: in none)."""
    found = np.full(count, -1, np.int64)
    for number, group in enumerate(groups):
        found[group] = number
    return found


def matching_stretches(scores: np.ndarray, neighbours: np.ndarray, window_video: np.ndarray, starts: np.ndarray,
                       ends: np.ndarray, threshold: float, whole: np.ndarray) -> list[Stretch]:
    """The stretches two videos share where only part of one repeats: the window pairs of different videos whose
    similarity reaches ``threshold`` (``scores``/``neighbours`` ``[M, k]`` over windows; ``window_video`` each
    window's video row, ``starts``/``ends`` its seconds), gathered per pair of videos that is not already a
    whole-video duplicate (``whole``: each video's duplicate group, -1 for none, :func:`group_of`); one stretch per
    pair, ``video < other``. Only mutual nearest windows count (each is the other's nearest window of another
    video): in a space where a few windows are near everything (hubs), a window's nearest alone would tie unrelated
    videos together."""
    nearest = neighbours[:, 0]
    mutual = (nearest >= 0) & (neighbours[np.maximum(nearest, 0), 0] == np.arange(len(nearest)))
    found: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
    for row in np.flatnonzero(mutual & (scores[:, 0] >= threshold)):
        row, other = int(row), int(nearest[row])
        a, b = int(window_video[row]), int(window_video[other])
        if a == b or (whole[a] >= 0 and whole[a] == whole[b]):
            continue
        mine, theirs = (row, other) if a < b else (other, row)
        found.setdefault((min(a, b), max(a, b)), []).append((mine, theirs, float(scores[row, 0])))
    stretches = []
    for (a, b), matches in sorted(found.items()):
        mine = np.array([m[0] for m in matches])
        theirs = np.array([m[1] for m in matches])
        stretches.append(Stretch(a, b, float(starts[mine].min()), float(ends[mine].max()),
                                 float(starts[theirs].min()), float(ends[theirs].max()),
                                 max(m[2] for m in matches)))
    return stretches


def outlier_scores(scores: np.ndarray, k: int = OUTLIER_K) -> np.ndarray:
    """Each row's outlier score: one minus the mean similarity of its ``k`` nearest others (``scores [N, >= k]``,
    best first; fewer columns: all of them)."""
    return 1.0 - np.asarray(scores[:, :k], np.float64).mean(axis=1)


def outlier_ranking(outliers: np.ndarray) -> np.ndarray:
    """The rows, most unlike the rest first (ties to the lower row)."""
    return np.lexsort((np.arange(len(outliers)), -outliers))


def calibrated_threshold(positives: np.ndarray, negatives: np.ndarray) -> float:
    """The similarity that best separates altered copies of a video from it (``positives``: each copy's similarity
    to its original) from other videos (``negatives``: each video's similarity to its nearest other video):
    Youden's J (recall of the copies minus the share of videos whose nearest other passes) at its best, the
    midpoint of the best interval between two observed values."""
    positives, negatives = np.sort(np.asarray(positives, np.float64)), np.sort(np.asarray(negatives, np.float64))
    values = np.unique(np.concatenate([positives, negatives]))
    candidates = np.concatenate([values, [np.nextafter(values[-1], np.inf)]])
    recall = 1.0 - np.searchsorted(positives, candidates, side="left") / max(1, len(positives))
    passed = 1.0 - np.searchsorted(negatives, candidates, side="left") / max(1, len(negatives))
    gain = recall - passed
    best = np.flatnonzero(gain == gain.max())
    first, last = best[0], best[-1]
    low = values[first - 1] if first > 0 else candidates[first] - 1e-3
    high = candidates[last]  # thresholds in (low, high] all give the best J
    return float(np.clip((low + high) / 2, -1.0, 1.0))


def recall_threshold(positives: np.ndarray, recall: float = RECALL_TARGET) -> float:
    """The highest similarity that keeps at least ``recall`` of the altered copies (``positives``: each copy's
    similarity to its original). Unlike :func:`calibrated_threshold` it needs no other videos, so a
    folder where most videos have a duplicate (their nearest other is one) does not mislead it; whether other videos
    stay below it is checked apart (:func:`separation` against each copy's similarity to the folder's other
    videos)."""
    ordered = np.sort(np.asarray(positives, np.float64))
    return float(ordered[min(len(ordered) - 1, int(np.floor(len(ordered) * (1.0 - recall) + 1e-9)))])


def separation(positives: np.ndarray, negatives: np.ndarray, threshold: float) -> float:
    """Youden's J of ``threshold``: the share of ``positives`` at or above it less the share of ``negatives``."""
    return float((np.asarray(positives) >= threshold).mean() - (np.asarray(negatives) >= threshold).mean())


def distribution_threshold(nearest: np.ndarray) -> float:
    """The threshold without altered copies: an outer fence of the nearest-other similarities (the third quartile
    plus three interquartile ranges, as a boxplot's far outliers), kept within :data:`FALLBACK_RANGE`: a pair far
    more alike than a video usually is with its nearest other. Videos without one (unreadable, removed: their
    similarities are not finite) are left out; with none left, the range's top."""
    nearest = np.asarray(nearest, np.float64)
    nearest = nearest[np.isfinite(nearest)]
    if not len(nearest):
        return FALLBACK_RANGE[1]
    q1, q3 = np.percentile(nearest, [25, 75])
    return float(np.clip(q3 + 3 * (q3 - q1), *FALLBACK_RANGE))
