"""Near-duplicate groups, outlier scores and the duplicate threshold: small pure functions on pairs and graphs.

Two videos are near-duplicates when their similarity reaches the threshold; a group is a connected set of such pairs
(union-find over every such pair, :class:`Links`, however many a video has), so a chain of re-encodes of one take
falls into one group. The graph is each row's ``k`` nearest other rows by cosine similarity
(:func:`coclr.curate.graph.neighbour_graph`), what the outlier score and the page use. A video's outlier score is one
minus the mean similarity of its ``k`` nearest others: how far it lies from every part of the collection (a kNN
distance, which needs no parameter beyond ``k`` and no assumption on the shape of the groups).
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


@dataclass(frozen=True)
class Links:
    """What the pairs of rows whose similarity reaches a threshold say of ``count`` rows, however many pairs there
    were: ``joined`` (``int64 [count]``), the lowest row each row is joined with through a chain of such pairs
    (itself where none), and ``best`` (``float64 [count]``), each row's highest similarity among them (-inf where
    none: a video's highest to another member of its group, as the CSV gives it). Built a part of the pairs at a
    time (:func:`linked`), so the groups come from every pair while memory stays at a part's."""

    joined: np.ndarray
    best: np.ndarray

    @classmethod
    def none(cls, count: int) -> Links:
        return cls(np.arange(count, dtype=np.int64), np.full(count, -np.inf))


def linked(links: Links, first: np.ndarray, second: np.ndarray, scores: np.ndarray) -> Links:
    """``links`` with the pairs ``first[i]``-``second[i]`` of similarity ``scores[i]`` joined too: each pair hooks
    the higher of its two components onto the lower, then every row points at its component's lowest row, until
    no pair joins two components (union-find, vectorised)."""
    first, second = np.asarray(first, np.int64), np.asarray(second, np.int64)
    joined, best = links.joined.copy(), links.best.copy()
    scores = np.asarray(scores, np.float64)
    np.maximum.at(best, first, scores)
    np.maximum.at(best, second, scores)
    while True:
        a, b = joined[first], joined[second]
        apart = a != b
        if not apart.any():
            return Links(joined, best)
        low = np.minimum(a[apart], b[apart])
        np.minimum.at(joined, a[apart], low)
        np.minimum.at(joined, b[apart], low)
        while True:  # every row at its component's lowest row (each points no higher than itself: no cycle)
            deeper = joined[joined]
            if np.array_equal(deeper, joined):
                break
            joined = deeper


def merged(links: Links, more: Links) -> Links:
    """``links`` joined with whatever ``more`` (links of the same rows) joins, each row's best the higher."""
    rows = np.flatnonzero(more.joined != np.arange(len(more.joined)))
    joined = linked(links, rows, more.joined[rows], np.full(len(rows), -np.inf))
    return Links(joined.joined, np.maximum(joined.best, more.best))


def colour_links(colours: np.ndarray, tolerance: float) -> Links:
    """The :class:`Links` of solid-colour videos (``colours [N, 3]``: each one's mean colour, NaN for other videos),
    at similarity 1: each joins the first solid-colour video (by row) that starts a group and whose colour lies within
    ``tolerance`` in every channel, else starts one; no other video is joined. Their standardised frames are all
    zero, so no fingerprint tells black from white: their colour does. Joined to a group's first colour, not to any
    near one, so that greys a few levels apart do not chain black to white."""
    colours = np.asarray(colours, np.float64)
    starts: list[int] = []
    first, second = [], []
    for row in np.flatnonzero(~np.isnan(colours).any(axis=1)):
        if starts:
            near = np.flatnonzero((np.abs(colours[starts] - colours[row]) <= tolerance).all(axis=1))
            if len(near):
                first.append(starts[near[0]])
                second.append(int(row))
                continue
        starts.append(int(row))
    return linked(Links.none(len(colours)), np.asarray(first, np.int64), np.asarray(second, np.int64),
                  np.ones(len(first)))


def link_groups(links: Links) -> list[list[int]]:
    """The groups ``links`` joins (each a sorted list of rows, at least two; groups sorted by their first row)."""
    rows = np.flatnonzero(np.bincount(links.joined, minlength=len(links.joined))[links.joined] > 1)
    members: dict[int, list[int]] = {}
    for row in rows:
        members.setdefault(int(links.joined[row]), []).append(int(row))
    return sorted(members.values(), key=lambda group: group[0])


def reach_floor(threshold: float, dim: int) -> float:
    """The lowest exact score of two unit rows of length ``dim`` that reaches ``threshold``: the threshold less the
    rounding of the quantised rows (:func:`coclr.eval.exact.quantised_dot_bound`), so identical videos, whose exact
    score is 1 less that rounding, reach any threshold up to 1. The one rule by which a pair reaches a threshold."""
    from coclr.eval.exact import quantised_dot_bound  # noqa: PLC0415

    return float(threshold) - quantised_dot_bound(dim)


def alike_links(rows: np.ndarray, count: int) -> Links:
    """``rows`` of ``count`` joined at similarity 1 and nothing else: for videos that no similarity can tell apart
    because each is the folder's mean (copies of one video, centred, are all zero), which are one group whatever the
    threshold."""
    rows = np.asarray(rows, np.int64)
    if len(rows) < 2:
        return Links.none(count)
    return linked(Links.none(count), rows[1:], np.full(len(rows) - 1, rows[0]), np.ones(len(rows) - 1))


def subset_links(links: Links, rows: np.ndarray, count: int) -> Links:
    """Links found among ``rows`` only (``links``'s row ``i`` is ``rows[i]``) as links of ``count`` rows: the rest
    joined with nobody (videos without a fingerprint)."""
    rows = np.asarray(rows, np.int64)
    joined, best = np.arange(count, dtype=np.int64), np.full(count, -np.inf)
    joined[rows], best[rows] = rows[links.joined], links.best
    return Links(joined, best)


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


def best_windows(query: np.ndarray, row: np.ndarray, score: np.ndarray,
                 window_video: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of pairs of windows (``query``, ``row``, their ``score``; ``window_video`` each window's video row), those of
    different videos reduced to each window's best window of each other video (ties to the lower row): ``(query,
    row, score)`` sorted by query, then the other video. Applied to a part of the pairs or to all, the same."""
    other = window_video[query] != window_video[row]
    query, row, score = query[other], row[other], np.asarray(score, np.float64)[other]
    order = np.lexsort((row, -score, window_video[row], query))
    query, row, score = query[order], row[order], score[order]
    first = np.ones(len(query), bool)
    first[1:] = (query[1:] != query[:-1]) | (window_video[row[1:]] != window_video[row[:-1]])
    return query[first], row[first], score[first]


def matching_stretches(query: np.ndarray, row: np.ndarray, score: np.ndarray, window_video: np.ndarray,
                       starts: np.ndarray, ends: np.ndarray, whole: np.ndarray) -> list[Stretch]:
    """The stretches two videos share where only part of one repeats, from every pair of windows whose similarity
    reaches the threshold (``query``, ``row``, ``score``, either way; ``window_video`` each window's video row,
    ``starts``/``ends`` its seconds), gathered per pair of videos that is not already a whole-video duplicate
    (``whole``: each video's duplicate group, -1 for none, :func:`group_of`); ``video < other``, one stretch per
    run of matching windows that follow one another in both videos (:func:`runs`: two shared stretches apart, an
    intro and an outro, are two stretches, not one spanning what lies between them; a clip one video holds twice
    gives the stretch of the copy each window matches best, not both). Decided per pair of videos:
    a window matches the window of the other video that is its best there (:func:`best_windows`) when it is that
    window's best in its own video too (mutual): in a space where a few windows are near everything (hubs), a
    window's best alone would tie unrelated stretches together; and an intro shared by many videos is matched in
    each pair whatever the others (a window's single nearest of any video left all but one pair a window or
    two)."""
    query, row, score = best_windows(np.asarray(query, np.int64), np.asarray(row, np.int64), score, window_video)
    if not len(query):
        return []
    videos = int(window_video.max()) + 1
    key = query * videos + window_video[row]  # sorted: by query, then the other video
    back = row * videos + window_video[query]  # the row's best in the query's video
    at = np.minimum(np.searchsorted(key, back), len(key) - 1)
    mutual = (key[at] == back) & (row[at] == query)
    a, b = window_video[query], window_video[row]
    keep = mutual & (a < b) & ~((whole[a] >= 0) & (whole[a] == whole[b]))
    found: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
    for mine, theirs, value in zip(query[keep], row[keep], score[keep]):
        found.setdefault((int(window_video[mine]), int(window_video[theirs])), []).append(
            (int(mine), int(theirs), float(value)))
    stretches = []
    for (a, b), matches in sorted(found.items()):
        mine = np.array([m[0] for m in matches])
        theirs = np.array([m[1] for m in matches])
        values = np.array([m[2] for m in matches])
        for run in runs(mine, theirs, starts, ends):
            stretches.append(Stretch(a, b, float(starts[mine[run]].min()), float(ends[mine[run]].max()),
                                     float(starts[theirs[run]].min()), float(ends[theirs[run]].max()),
                                     float(values[run].max())))
    return stretches


def runs(mine: np.ndarray, theirs: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[np.ndarray]:
    """The matches of one pair of videos (window ``mine[i]`` of one matching ``theirs[i]`` of the other) split into
    runs, each the indices of one copy's matches in order of time: matches whose offset between the two videos
    (``starts[theirs] - starts[mine]``) stays within one window's length of the next are one copy (matches of two
    copies give one run per copy, however they alternate between them), and within a
    copy a run ends where the next match's window begins more than one window's length after the end of the
    previous one's (one window that missed its match inside a stretch does not split it; an intro and an outro at
    the same offset are two runs)."""
    offset = starts[theirs] - starts[mine]
    length = ends[mine] - starts[mine]
    by_offset = np.lexsort((starts[mine], offset))
    copies, current = [], [by_offset[0]]
    for previous, index in zip(by_offset[:-1], by_offset[1:]):
        if offset[index] - offset[previous] > length[previous]:
            copies.append(current)
            current = []
        current.append(index)
    copies.append(current)
    found = []
    for copy in copies:
        copy = sorted(copy, key=lambda index: (starts[mine[index]], mine[index]))
        current = [copy[0]]
        for previous, index in zip(copy[:-1], copy[1:]):
            if starts[mine[index]] > ends[mine[previous]] + length[previous]:
                found.append(np.array(current))
                current = []
            current.append(index)
        found.append(np.array(current))
    return sorted(found, key=lambda run: (starts[mine[run[0]]], starts[theirs[run[0]]]))


def sharing_pairs(stretches: list[Stretch]) -> int:
    """How many pairs of videos share at least one stretch (a pair may share several)."""
    return len({(stretch.video, stretch.other) for stretch in stretches})


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
    midpoint of the best interval between two observed values (the lowest, where several give the best J)."""
    positives, negatives = np.sort(np.asarray(positives, np.float64)), np.sort(np.asarray(negatives, np.float64))
    values = np.unique(np.concatenate([positives, negatives]))
    candidates = np.concatenate([values, [np.nextafter(values[-1], np.inf)]])
    recall = 1.0 - np.searchsorted(positives, candidates, side="left") / max(1, len(positives))
    passed = 1.0 - np.searchsorted(negatives, candidates, side="left") / max(1, len(negatives))
    gain = recall - passed
    best = np.flatnonzero(gain >= gain.max() - 1e-12)  # (shares equal as fractions may differ by a rounding)
    breaks = np.flatnonzero(np.diff(best) != 1)
    first, last = best[0], best[breaks[0]] if len(breaks) else best[-1]  # the first run of best J: two runs apart
    low = values[first - 1] if first > 0 else candidates[first] - 1e-3  # had their midpoint in the dip between them
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


def stretches_text(pairs: int, searched: str | None) -> str:
    """``N pair(s) sharing a stretch``, or, where stretches were not searched (``curate.json``'s ``stretches``), why:
    a count of 0 said that no partial copy was found where none was looked for."""
    if searched in (None, "searched"):
        return f"{pairs} pair(s) sharing a stretch"
    return f"shared stretches {searched}"
