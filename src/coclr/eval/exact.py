"""Cosine similarities whose rounding does not depend on the CPU, the thread count, a chunk size or the row order.

Why: a float32 matrix product rounds a dot product differently depending on where a row falls in a block (the
kernel's edge and main loops sum in other orders, AVX-512 and AVX2 differ), so two identical gallery rows could
score differently and a tie rule ("lower gallery index first", R@k ties in expectation) never saw the tie.

The rule, one place for retrieval and search:

1. A row is centred (optionally) and L2-normalised in float64 with elementwise operations only, its sum of squares
   taken by a fixed pairwise tree (:func:`tree_sum`), so each value is a function of the row alone.
2. Each unit-vector component is rounded to a multiple of ``2**-QUANTUM_BITS`` (``QUANTUM_BITS = 24``: exactly
   representable in float32, at most ``2**-25`` from the float64 value, below float32's own rounding of a unit
   vector's larger components).
3. The similarity is the dot product of two such rows. Their components are integers times ``2**-24``, so every
   product and every partial sum is an integer times ``2**-48`` of magnitude at most ``|a| |b| <= ~1`` (Cauchy-
   Schwarz): under ``2**53``, exact in float64 whatever the summation order, blocking or FMA. A float64 matrix
   product (any BLAS, any device) therefore gives the exact value: identical rows score identically, always.

The gallery mean used for centring is also order-free: each column is sorted, then summed by the fixed tree.
"""

from __future__ import annotations

import numpy as np

QUANTUM_BITS = 24
QUANTUM = 2.0 ** QUANTUM_BITS
ROUNDING_FLOOR = 2.0 ** -13
"""A set of rows none of which differs from their mean by more than this fraction of their largest component is
rounding, not signal (:func:`within_rounding`): features of one network differ by about 3e-5 of their size between
batch sizes, thread counts and CPUs (:mod:`coclr.eval.features`), and a collapsed encoder's rows centred by their
mean are that difference alone, which normalising made unit vectors that ranked by it."""
MEAN_BLOCK = 64
"""Columns sorted at a time for the gallery mean (bounds memory to ``N x 64`` float64)."""


def tree_sum(values: np.ndarray, axis: int) -> np.ndarray:
    """Sum along ``axis`` by a fixed pairwise tree of elementwise additions (zero-padded to a power of two): the
    rounding depends only on the values and their order along ``axis``, never on SIMD width, threads or memory
    layout."""
    values = np.moveaxis(np.asarray(values, np.float64), axis, 0)
    size = 1 << max(0, (len(values) - 1).bit_length())
    if size != len(values):
        values = np.concatenate([values, np.zeros((size - len(values), *values.shape[1:]), np.float64)])
    while len(values) > 1:
        half = len(values) // 2
        values = values[:half] + values[half:]
    return values[0]


def gallery_mean(rows: np.ndarray) -> np.ndarray:
    """``float64 [D]``: the mean of ``rows [N, D]``, the same for every order of the rows (columns sorted, then
    :func:`tree_sum`); read ``MEAN_BLOCK`` columns at a time, so a memory-mapped array is never copied whole."""
    count, dim = rows.shape
    mean = np.empty(dim, np.float64)
    for start in range(0, dim, MEAN_BLOCK):
        block = np.sort(np.asarray(rows[:, start: start + MEAN_BLOCK], np.float64), axis=0)
        mean[start: start + MEAN_BLOCK] = tree_sum(block, 0) / max(count, 1)
    return mean


def within_rounding(rows: np.ndarray, mean: np.ndarray) -> bool:
    """Whether every row of ``rows [N, D]`` lies within :data:`ROUNDING_FLOOR` of ``mean`` (relative to the largest
    component of the rows and the mean): a collapsed encoder's features, whose differences are the rounding of the
    batches they were computed in. A decision about the whole set (a row near the mean of many copies of itself is
    not rounding), order-free (maxima only), read ``MEAN_BLOCK`` columns at a time like :func:`gallery_mean`."""
    size, spread = float(np.abs(mean).max(initial=0.0)), 0.0
    for start in range(0, rows.shape[1], MEAN_BLOCK):
        block = np.asarray(rows[:, start: start + MEAN_BLOCK], np.float64)
        size = max(size, float(np.abs(block).max(initial=0.0)))
        spread = max(spread, float(np.abs(block - mean[start: start + MEAN_BLOCK]).max(initial=0.0)))
    return spread <= ROUNDING_FLOOR * size


def unit_rows(rows: np.ndarray, mean: np.ndarray | None = None) -> np.ndarray:
    """``float32 [N, D]``: ``rows`` minus ``mean`` (when given), L2-normalised (a zero row stays zero, like
    ``F.normalize``), each component rounded to a multiple of ``2**-24``; every value a function of its row
    alone (see the module docstring). Raises ValueError when a row holds NaN or an infinity."""
    values = np.asarray(rows, np.float64)
    if mean is not None:
        values = values - mean
    if not np.isfinite(values).all():
        raise ValueError("contains NaN or infinite values")
    if values.size:  # each row scaled by a power of two (exact, so the result is the same) to a largest value in
        # [0.5, 1): a row of tiny values (an untrained narrow network's) is made a unit vector, not left under the floor
        values = np.ldexp(values, -np.frexp(np.abs(values).max(axis=1))[1][:, None])
    norms = np.sqrt(tree_sum(values * values, 1))
    if not np.isfinite(norms).all():
        raise ValueError("contains NaN or infinite values")
    unit = values / np.maximum(norms, 1e-12)[:, None]
    return (np.rint(unit * QUANTUM) / QUANTUM).astype(np.float32)


def exact_dot_bound(dim: int) -> float:
    """A bound on ``|float32 dot - exact dot|`` of two :func:`unit_rows` rows of length ``dim``, for any
    summation order (``gamma_dim * sum |a_i b_i|`` with ``sum |a_i b_i| <= |a| |b| <= 1 + dim * 2**-25``),
    doubled for safety: a float32 product may rank candidates, the exact one decides."""
    unit_roundoff = 2.0 ** -24
    gamma = dim * unit_roundoff / (1 - dim * unit_roundoff)
    return 2 * gamma * (1 + dim * 2.0 ** -25) ** 2


def quantised_dot_bound(dim: int) -> float:
    """A bound on how far the exact dot product of two :func:`unit_rows` rows of length ``dim`` lies from the cosine
    of the rows before rounding (each component at most ``2**-25`` off, so each row at most ``sqrt(dim) * 2**-25``:
    ``2 sqrt(dim) 2**-25 + dim 2**-50``), doubled for safety like :func:`exact_dot_bound`: a row with itself scores
    1 less up to this (e.g. 0.99999997), so a rule "at least a threshold" on exact scores allows it."""
    return 2 * (2 * np.sqrt(dim) * 2.0 ** -25 + dim * 2.0 ** -50)


def bfloat16_bits(units: np.ndarray) -> np.ndarray:
    """``uint16``: the bfloat16 nearest each float32 value (ties to even; torch's ``.bfloat16()``), as raw bits."""
    bits = np.ascontiguousarray(units, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bfloat16_dot_bound(dim: int) -> float:
    """A bound on ``|bfloat16 product - exact dot|`` for two :func:`unit_rows` rows rounded to bfloat16, multiplied
    with float32 accumulation (oneDNN, AMX and PyTorch's own kernels) and a bfloat16 result: each input rounding
    ``u = 2**-9`` relative (``2u + u**2`` on a product), the float32 sums ``gamma_dim``, the result ``u``; all over
    ``sum |a_i b_i| <= 1 + dim * 2**-25``. Doubled for safety, like :func:`exact_dot_bound`."""
    unit_roundoff = 2.0 ** -9
    size = (1 + dim * 2.0 ** -25) ** 2
    inputs = (2 * unit_roundoff + unit_roundoff ** 2) * size
    sums = exact_dot_bound(dim) / 2 * (1 + unit_roundoff) ** 2
    return 2 * (inputs + sums + unit_roundoff * (size + inputs + sums))
