"""Whether features carry anything: a collapsed encoder gives every video (nearly) the same feature.

An encoder whose training collapsed still yields a retrieval R@1 and a linear-probe accuracy, and they can look
like a real result. :func:`feature_health` judges a set of features two ways, so that every evaluation record,
the CLI, the study's tables and the report can say so:

- by their spread: the variance across videos and the effective rank (features on one point, or one line);
- by what they carry: the leave-one-out nearest-neighbour accuracy of the labelled videos (each video's most
  similar other video, by cosine after centring, as retrieval compares them) against the accuracy of a random
  neighbour. Features that spread along a few directions that have nothing to do with the class (CoCLR K=1 at
  effective rank 1.25 on the built-in data, docs/synth.md) pass the spread test and fail this one.
"""

from __future__ import annotations

import math

import numpy as np

MIN_RELATIVE_VARIANCE = 1e-6
"""Below this share of the features' mean squared norm, their variance across videos counts as none."""
MIN_EFFECTIVE_RANK = 1.1
"""Without labels, below this effective rank the features vary along one line only (1: every feature on one line
through their mean; what an encoder gives whose features all point the same way, pairwise cosine 1)."""
CHANCE_MARGIN_SD = 3.0
"""Features carry nothing when their leave-one-out nearest-neighbour accuracy is within this many binomial
standard deviations of a random neighbour's (sqrt(c (1 - c) / N) for chance c and N videos: 3 sd is 5.1 points
at 8 balanced classes and 384 videos, where the healthy rows of the built-in study reach 25-75 %)."""
MIN_NN_VIDEOS = 20
"""The nearest-neighbour test needs this many labelled videos, of two classes at least, two of one class (with
fewer the margin leaves it no power: at 6 videos of 3 classes it lies at 69 %; only the spread is judged then)."""
MAX_ROWS = 20_000
"""Larger sets are measured on this many rows drawn with a fixed seed (the measures are properties of the set)."""
CHUNK = 1024
"""Rows of the similarity matrix computed at once (in float64: the result does not depend on it)."""


def effective_rank(centered: np.ndarray) -> float:
    """The exponential of the entropy of the covariance's normalised eigenvalues (Roy and Vetterli 2007): 1 for
    features on one line, D for an isotropic spread, 0 for no spread."""
    eigenvalues = np.clip(np.linalg.eigvalsh(centered.T @ centered), 0, None)
    total = eigenvalues.sum()
    if total <= 0:
        return 0.0
    share = eigenvalues[eigenvalues > 0] / total
    return float(np.exp(-(share * np.log(share)).sum()))


def _group_ids(groups, count: int) -> np.ndarray:
    """An integer per video: equal for videos of one known group, unique for a video of no known group."""
    if groups is None:
        return np.arange(count)
    ids: dict[str, int] = {}
    return np.array([ids.setdefault(group, len(ids)) if group is not None else -1 - n
                     for n, group in enumerate(groups)])


def nn_accuracy(features: np.ndarray, labels: np.ndarray, groups=None, chunk: int = CHUNK) -> float:
    """Leave-one-group-out 1-nearest-neighbour accuracy (a fraction): the share of videos whose most similar video
    of another group (``groups``: one source video, e.g. UCF101's gXX, which shares the scene; None: only the
    video itself is left out) has their class, by cosine after centring by the mean (float64). Ties count in
    expectation over a random order (a video tied with several neighbours scores the share of its class among
    them), so constant features score chance, not what the videos' order happens to give."""
    x = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels)
    group = _group_ids(groups, len(x))
    x = x - x.mean(axis=0)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    hits = 0.0
    for start in range(0, len(x), chunk):
        scores = x[start : start + chunk] @ x.T
        scores[group[start : start + chunk, None] == group[None, :]] = -np.inf
        tied = scores == scores.max(axis=1, keepdims=True)
        same = labels[None, :] == labels[start : start + chunk, None]
        hits += float(((tied & same).sum(axis=1) / tied.sum(axis=1)).sum())
    return hits / len(x)


def chance_nn_accuracy(labels: np.ndarray, groups=None) -> float:
    """The accuracy of :func:`nn_accuracy` with a random neighbour: the mean over videos of the share of their
    class among the videos of other groups (without groups, sum over classes of n_c (n_c - 1) / (N (N - 1)))."""
    labels = np.asarray(labels)
    group = _group_ids(groups, len(labels))
    others = group[:, None] != group[None, :]
    same = others & (labels[:, None] == labels[None, :])
    counts = others.sum(axis=1)
    usable = counts > 0
    return float((same.sum(axis=1)[usable] / counts[usable]).mean()) if usable.any() else 1.0


def carries_nothing(accuracy: float, chance: float, videos: int) -> bool:
    """Whether a leave-one-out accuracy is no better than chance: within :data:`CHANCE_MARGIN_SD` binomial
    standard deviations of it."""
    return accuracy <= chance + CHANCE_MARGIN_SD * math.sqrt(chance * (1 - chance) / max(videos, 1))


def feature_health(features: np.ndarray, labels: np.ndarray | None = None, groups=None
                   ) -> dict[str, float | bool | None]:
    """``relative_variance`` (variance across videos / mean squared norm), ``effective_rank``
    (:func:`effective_rank`), with ``labels`` (of at least :data:`MIN_NN_VIDEOS` videos with a label >= 0; and
    their ``groups``, whose videos are never each other's neighbours) ``nn_accuracy`` and ``chance`` (percent:
    :func:`nn_accuracy` and :func:`chance_nn_accuracy`), and ``degenerate``: no variance, or a nearest-neighbour
    accuracy no better than chance (:func:`carries_nothing`); without labels, an effective rank below
    :data:`MIN_EFFECTIVE_RANK`. With labels the rank does not decide: features along one line that orders the
    classes carry them, and features that spread along directions unrelated to the class carry nothing."""
    x = np.asarray(features, dtype=np.float64)
    y = None if labels is None else np.asarray(labels)
    g = None if groups is None else np.asarray(groups, dtype=object)
    if len(x) > MAX_ROWS:
        rows = np.random.default_rng(0).choice(len(x), MAX_ROWS, replace=False)
        x, y, g = x[rows], (None if y is None else y[rows]), (None if g is None else g[rows])
    centered = x - x.mean(axis=0)
    spread = float((centered ** 2).sum(axis=1).mean())
    relative = spread / max(float((x ** 2).sum(axis=1).mean()), 1e-300)
    rank = effective_rank(centered)
    health: dict[str, float | bool | None] = {"relative_variance": relative, "effective_rank": rank,
                                              "nn_accuracy": None, "chance": None}
    known = None if y is None else y >= 0
    kept = None if known is None or g is None else list(g[known])
    chance = 0.0 if known is None else chance_nn_accuracy(y[known], kept)
    if known is not None and int(known.sum()) >= MIN_NN_VIDEOS and 0 < chance < 1:
        accuracy = nn_accuracy(x[known], y[known], kept)
        health.update(nn_accuracy=100.0 * accuracy, chance=100.0 * chance)
        empty = carries_nothing(accuracy, chance, int(known.sum()))
    else:  # too few labelled videos (or classes) to judge by: only the spread
        empty = rank < MIN_EFFECTIVE_RANK
    health["degenerate"] = bool(relative < MIN_RELATIVE_VARIANCE or empty)
    return health


def describe_health(measures: dict) -> str:
    """The measures of one split in words (for warnings and logs)."""
    text = (f"variance across videos {measures['relative_variance']:.2g} of their squared norm, effective rank "
            f"{measures['effective_rank']:.2f}")
    if measures.get("nn_accuracy") is not None:
        text += (f", nearest-neighbour accuracy {measures['nn_accuracy']:.1f} % (chance {measures['chance']:.1f} "
                 "%)")
    return text


def collapsed(stream: dict) -> bool:
    """Whether a stream's encoder collapsed: its features degenerate on the train and on the test split. A
    collapsed encoder carries nothing anywhere; a weak one can sit within the noise of chance on one split's
    nearest neighbours (a few hundred videos) while its test-to-train retrieval is well above chance."""
    return all(stream[split]["degenerate"] for split in ("train", "test"))


def health_warnings(health: list[dict]) -> list[str]:
    """One line per stream whose encoder collapsed (:func:`collapsed`; ``health``: per stream ``{"view",
    "checkpoint", "train", "test"}``)."""
    lines = []
    for stream in health:
        bad = [split for split in ("train", "test") if stream[split]["degenerate"]]
        if collapsed(stream):
            lines.append(f"collapsed encoder: degenerate features from {stream['checkpoint']} ({stream['view']}, "
                         f"{' and '.join(bad)}): {describe_health(stream[bad[0]])}; its numbers are no evidence "
                         "of a representation")
    return lines


def store_groups(store, keys: list[str]) -> list[str | None]:
    """The group of each video of a store (None: unknown), for :func:`feature_health`."""
    return [store.entry(key).group for key in keys]


def streams_health(streams, train: list, test: list, store=None) -> list[dict]:
    """:func:`feature_health` of each stream's train and test features (``VideoFeatures``; with the ``store``
    they come from, each video's group is left out of its neighbours), for a record."""
    def health(features) -> dict:
        groups = None if store is None else store_groups(store, features.keys)
        return feature_health(features.features, features.labels, groups)

    return [{"view": stream.view, "checkpoint": str(stream.checkpoint), "train": health(tr), "test": health(te)}
            for stream, tr, te in zip(streams, train, test)]
