"""The map of a collection: every video as a point in two dimensions, and the groups its colours show.

The 2-D layout is UMAP's (cosine metric, 15 neighbours; ``pip install umap-learn``, the ``[map]`` extra) when it is
installed, else the documented fallback: the first two principal components of the unit vectors (a linear view:
the largest spreads of the collection, which keeps far groups apart but may overlap near ones). The colours are
k-means groups of the vectors' first :data:`GROUP_DIMS` principal components (a few groups, so a person can name
them), seeded, computed in float64 so that the thread count does not move a point from one group to another.
"""

from __future__ import annotations

import numpy as np

from coclr.curate.order import value_order

GROUP_DIMS = 32
"""Principal components the k-means groups are found in."""
MAX_GROUPS = 10
"""At most this many colour groups."""
ITERATIONS = 25
BLOCK = 16384
"""Rows projected at a time (bounds memory for large collections)."""


def principal_axes(units: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean and the first ``count`` principal axes ``[count, D]`` of the rows (float64, from the covariance
    summed block by block; each axis's sign fixed so its largest coordinate is positive)."""
    mean = np.zeros(units.shape[1])
    for start in range(0, len(units), BLOCK):
        mean += np.asarray(units[start:start + BLOCK], np.float64).sum(axis=0)
    mean /= max(1, len(units))
    covariance = np.zeros((units.shape[1], units.shape[1]))
    for start in range(0, len(units), BLOCK):
        block = np.asarray(units[start:start + BLOCK], np.float64) - mean
        covariance += block.T @ block
    values, vectors = np.linalg.eigh(covariance)
    axes = vectors[:, ::-1][:, :count].T
    signs = np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)])
    return mean, axes * signs[:, None]


def project(units: np.ndarray, mean: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """The rows' coordinates on ``axes`` (float64 ``[N, len(axes)]``)."""
    out = np.empty((len(units), len(axes)))
    for start in range(0, len(units), BLOCK):
        out[start:start + BLOCK] = (np.asarray(units[start:start + BLOCK], np.float64) - mean) @ axes.T
    return out


def umap_available() -> bool:
    try:
        import umap  # noqa: F401, PLC0415 (optional)
    except ImportError:
        return False
    return True


def layout(units: np.ndarray, seed: int = 0) -> tuple[np.ndarray, str]:
    """Each row's point on the map ``float32 [N, 2]``, scaled into [0, 1] by one factor for both axes (so that
    distances across and up keep their proportion; the narrower axis centred, one along which every point is at one
    spot at 0.5), and how it was made (``"umap"`` or ``"pca"``)."""
    count = len(units)
    if count >= 16 and umap_available():
        import umap  # noqa: PLC0415 (optional)

        points = umap.UMAP(n_neighbors=min(15, count - 1), metric="cosine", random_state=seed,
                           n_components=2).fit_transform(np.asarray(units, np.float32))
        method = "umap"
    else:
        mean, axes = principal_axes(units, min(2, units.shape[1]))
        points = project(units, mean, axes)
        if points.shape[1] < 2:
            points = np.concatenate([points, np.zeros((count, 2 - points.shape[1]))], axis=1)
        method = "pca"
    points = np.asarray(points, np.float64)
    low, span = points.min(axis=0), np.ptp(points, axis=0)
    widest = float(span.max())
    if widest <= 0:  # (one spot: the middle)
        return np.full(points.shape, 0.5, np.float32), method
    scaled = (points - low) / widest + (1.0 - span / widest) / 2  # one scale for both axes (distances as they are),
    return scaled.astype(np.float32), method  # the narrower axis centred


def group_count(count: int) -> int:
    """Colour groups for ``count`` videos: about one per ten videos' square root, 2 to :data:`MAX_GROUPS`."""
    return int(min(MAX_GROUPS, max(2, round(np.sqrt(count / 10))))) if count >= 2 else 1


def colour_groups(units: np.ndarray, seed: int = 0) -> np.ndarray:
    """Each row's colour group (``int32``, groups numbered by size, largest 0): k-means (k-means++ start, seeded)
    on the rows' first :data:`GROUP_DIMS` principal components, run on the rows in the order of their values
    (:func:`~coclr.curate.order.value_order`), so that the same videos listed in another order get the same groups."""
    count = len(units)
    groups = group_count(count)
    if groups <= 1:
        return np.zeros(count, np.int32)
    order = value_order(units)
    labels = np.empty(count, np.int32)
    labels[order] = _kmeans_groups(np.asarray(units)[order], groups, seed)
    return labels


def _kmeans_groups(units: np.ndarray, groups: int, seed: int) -> np.ndarray:
    """:func:`colour_groups` of rows in the order given: ``groups`` k-means groups, numbered by size."""
    count = len(units)
    mean, axes = principal_axes(units, min(GROUP_DIMS, units.shape[1]))
    points = project(units, mean, axes)
    rng = np.random.default_rng(seed)
    centres = [points[rng.integers(count)]]
    for _ in range(1, groups):  # k-means++: each next centre far from the chosen ones
        distance = np.min([((points - centre) ** 2).sum(axis=1) for centre in centres], axis=0)
        total = distance.sum()
        centres.append(points[rng.choice(count, p=distance / total)] if total > 0 else points[rng.integers(count)])
    centres = np.array(centres)
    labels = np.zeros(count, np.int64)
    for _ in range(ITERATIONS):
        distance = (points ** 2).sum(axis=1)[:, None] - 2 * points @ centres.T + (centres ** 2).sum(axis=1)[None]
        labels = distance.argmin(axis=1)
        for group in range(groups):
            inside = labels == group
            if inside.any():
                centres[group] = points[inside].mean(axis=0)
    sizes = np.bincount(labels, minlength=groups)
    order = np.lexsort((np.arange(groups), -sizes))
    renumber = np.empty(groups, np.int32)
    renumber[order] = np.arange(groups)
    return renumber[labels]
