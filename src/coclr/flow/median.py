"""The exact median filter of TV-L1 (``cv2.medianBlur`` on float fields) as comparator networks.

Sorting networks are plain data (lists of index pairs), so the same plan drives the PyTorch filter here and
the Triton kernels generated from it (``_median_triton``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

Comparator = tuple[int, int, bool, bool]
"""``(a, b, keep_min, keep_max)``: put min(v[a], v[b]) in ``a`` and the max in ``b``, each only if needed."""


def sorting_network(n: int) -> list[tuple[int, int]]:
    """Batcher's merge-exchange sorting network for ``n`` inputs (Knuth, TAOCP 5.2.2, Algorithm M)."""
    t = max(1, math.ceil(math.log2(n)))
    p = 1 << (t - 1)
    pairs: list[tuple[int, int]] = []
    while p > 0:
        q, r, d = 1 << (t - 1), 0, p
        while True:
            pairs += [(i, i + d) for i in range(n - d) if i & p == r]
            if q == p:
                break
            d, q, r = q - p, q >> 1, p
        p >>= 1
    return pairs


def selection_network(n: int, outputs: Sequence[int]) -> list[Comparator]:
    """The comparators of :func:`sorting_network` that the sorted ``outputs`` positions depend on."""
    needed = set(outputs)
    kept: list[Comparator] = []
    for a, b in reversed(sorting_network(n)):
        if a in needed or b in needed:
            kept.append((a, b, a in needed, b in needed))
            needed |= {a, b}
    return kept[::-1]


def comparator_statements(network: Sequence[Comparator], names: Sequence[str], both: str, low: str,
                          high: str) -> list[str]:
    """Source lines of ``network`` on the variables ``names``, for the code generators (Triton, C): per comparator
    ``(a, b, keep_min, keep_max)`` the template ``both``, ``low`` (the min only) or ``high`` (the max only),
    formatted with ``a`` and ``b`` as the two variables' names."""
    templates = {(True, True): both, (True, False): low, (False, True): high}
    return [templates[keep_min, keep_max].format(a=names[a], b=names[b]) for a, b, keep_min, keep_max in network]


def run_network(network: Sequence[Comparator], values: list[Tensor | None]) -> list[Tensor | None]:
    """Apply a comparator network elementwise to a list of equally shaped tensors (in place in the list)."""
    for a, b, keep_min, keep_max in network:
        low = torch.minimum(values[a], values[b]) if keep_min else None
        high = torch.maximum(values[a], values[b]) if keep_max else None
        values[a], values[b] = low, high
    return values


def median_plan(ksize: int) -> tuple[list[Comparator], list[tuple[list[int], list[Comparator]]], list[Comparator]]:
    """Networks for a ``ksize x ksize`` median: column sort, per-rank row selections, final median.

    After sorting every column of the window and then every row, entry ``(i, j)`` has at least
    ``(i+1)(j+1) - 1`` entries below it and ``(k-i)(k-j) - 1`` above, so only the entries with both
    counts at most ``(k^2 - 1) / 2`` can be the median, and as many entries are ruled out below it as
    above: the median of the window is the median of these candidates (13 of 25 for a 5 x 5 window).
    """
    half = (ksize * ksize - 1) // 2
    rows = []
    for i in range(ksize):
        cols = [j for j in range(ksize) if (i + 1) * (j + 1) - 1 <= half and (ksize - i) * (ksize - j) - 1 <= half]
        rows.append((cols, selection_network(ksize, cols)))
    count = sum(len(cols) for cols, _ in rows)
    column_sort = selection_network(ksize, range(ksize))
    return column_sort, rows, selection_network(count, [count // 2])


MEDIAN_PLANS = {ksize: median_plan(ksize) for ksize in (3, 5)}
"""The plans for OpenCV's float median sizes, built once (plain data, so ``torch.compile`` traces freely)."""


def median_blur(field: Tensor, ksize: int) -> Tensor:
    """Median over ``ksize x ksize`` windows of ``field [..., H, W]``, borders replicated (``cv2.medianBlur``).

    A comparator network on shifted views (about 160 min/max passes for 5 x 5, see :func:`median_plan`):
    exact, no ``k^2``-times larger window tensor, and fusable by ``torch.compile``.
    """
    if ksize <= 1:
        return field
    if ksize % 2 == 0:
        raise ValueError(f"median filter size must be odd, got {ksize}")
    radius = ksize // 2
    height, width = field.shape[-2:]
    lead = field.shape[:-2]
    padded = F.pad(field.reshape(-1, 1, height, width), (radius,) * 4, mode="replicate").reshape(
        *lead, height + 2 * radius, width + 2 * radius
    )
    column_sort, rows, final = MEDIAN_PLANS[ksize] if ksize in MEDIAN_PLANS else median_plan(ksize)
    columns = run_network(column_sort, [padded[..., i : i + height, :] for i in range(ksize)])
    candidates: list[Tensor | None] = []
    for rank, (cols, network) in enumerate(rows):
        ranked = run_network(network, [columns[rank][..., j : j + width] for j in range(ksize)])
        candidates += [ranked[j] for j in cols]
    return run_network(final, candidates)[len(candidates) // 2]
