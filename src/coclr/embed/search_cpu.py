"""The search's int8 first pass: rows and queries quantised to bytes, multiplied in plain C, with a bound on the error.

Where the CPU has no bfloat16 dot-product instructions, the cheapest exact-enough product is an integer one: AVX2's
``vpmaddubsw`` multiplies 32 byte pairs per instruction where a float32 FMA multiplies 8, and AVX-512 VNNI's
``vpdpbusd`` 64. :func:`quantise_rows` stores each unit row as bytes with its own scale (prepared once, beside the
float32 rows); :class:`Queries` does the same for the queries, to 7 bits (so that no pair of byte products
reaches AVX2's int16 saturation, and every kernel computes the same integers). :func:`query_bounds` bounds, per
query, how far a first-pass score may be from the exact one over any of the rows (Cauchy-Schwarz on the two
quantisation errors, and the float32 rounding of the scaling); the exact pass (:func:`pair_dots`, float64 dots of
the candidates, exact in any order) decides, so the answer is the one every first pass gives.

``search_cpu.c`` (package data) is built on first use by :mod:`coclr.native` for this CPU, or for AVX2 where
PyTorch's capability is limited to it; :data:`KERNEL`'s ``load()`` is None (one warning) when it cannot be built.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from coclr import native

ALIGN = 64
"""The quantised rows and queries are padded to a multiple of this many bytes (the kernels' step)."""
ROW_LEVELS = 127
"""A row's bytes: its values over its scale, rounded, in [-127, 127], stored plus 128 (unsigned)."""
QUERY_LEVELS = 63
"""A query's bytes, in [-63, 63]: two byte products then sum to at most 2 * 255 * 63 < 2**15 (no saturation)."""
MAX_DIM = (2 ** 31 - 1) // (255 * QUERY_LEVELS)
"""The longest rows the int32 sums hold (a row's bytes are at most 255): longer ones take the float32 pass."""
SAFETY = 1.01
"""The bound is computed in float64 from norms rounded to nearest; this factor covers their rounding."""

def open_library(path: Path) -> ctypes.CDLL:
    """The compiled kernels at ``path``, with their argument types declared."""
    library = ctypes.CDLL(str(path))
    library.coclr_i8_kernel.restype = ctypes.c_char_p
    library.coclr_i8_block.restype = ctypes.c_int
    library.coclr_i8_scores.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long] * 2 + [ctypes.c_int] * 2 + \
        [ctypes.c_void_p]
    library.coclr_i8_scores.restype = ctypes.c_int
    library.coclr_i8_over_floor.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_long] * 2 + [ctypes.c_int] * 2 + \
        [ctypes.c_long] + [ctypes.c_void_p] * 3
    library.coclr_i8_over_floor.restype = ctypes.c_long
    library.coclr_pair_dots.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 2 + [ctypes.c_int, ctypes.c_void_p]
    library.coclr_pair_dots.restype = ctypes.c_int
    return library


KERNEL = native.Kernel("search_cpu", Path(__file__).with_name("search_cpu.c"), open_library,
                       "the int8 search kernels are unavailable, the search's first pass multiplies float32 rows "
                       "(slower)")
"""The C kernels (:class:`coclr.native.Kernel`): built and loaded on first use."""


def kernel() -> str:
    """Which integer kernel the build runs: ``avx512_vnni``, ``avx2`` or ``plain`` (``unavailable`` without C)."""
    library = KERNEL.load()
    return library.coclr_i8_kernel().decode() if library is not None else "unavailable"


def padded(dim: int) -> int:
    """``dim`` rounded up to a multiple of :data:`ALIGN`: the length of a quantised row or query."""
    return -(-dim // ALIGN) * ALIGN


def _quantise(units: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(values int16 [N, D], scales float32 [N], error norms float64 [N], norms of the quantised rows float64
    [N])``: each row over ``max|row| / levels``, rounded; a zero row has scale 0."""
    units = np.asarray(units, np.float32)
    scales = (np.abs(units).max(axis=1, initial=0) / np.float32(levels)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))
    values = np.clip(np.rint(units / safe[:, None]), -levels, levels).astype(np.int16)
    approx = scales.astype(np.float64)[:, None] * values  # exact: a float32 times a small integer
    errors = np.sqrt(((units.astype(np.float64) - approx) ** 2).sum(axis=1))
    return values, scales, errors, np.sqrt((approx ** 2).sum(axis=1))


def quantise_rows(units: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """``(bytes uint8 [N, padded(D)], scales float32 [N], largest error norm, largest quantised norm)`` of unit rows:
    the stored copy of the first pass, and what :func:`query_bounds` needs of them (maxima over every row)."""
    values, scales, errors, norms = _quantise(units, ROW_LEVELS)
    out = np.full((len(values), padded(values.shape[1])), 128, np.uint8)
    out[:, : values.shape[1]] = values + 128
    return out, scales, float(errors.max(initial=0.0)), float(norms.max(initial=0.0))


class Queries:
    """Queries quantised for :func:`scores`: bytes ``[Q, padded(D)]``, scales, the offsets the rows' +128 adds,
    and the norms :func:`query_bounds` needs; :meth:`packed` lays them out for the kernels."""

    def __init__(self, queries: np.ndarray) -> None:
        values, self.scales, self.errors, self.quantised_norms = _quantise(queries, QUERY_LEVELS)
        self.bytes = np.zeros((len(values), padded(values.shape[1])), np.int8)
        self.bytes[:, : values.shape[1]] = values
        self.offsets = (128 * values.astype(np.int32).sum(axis=1)).astype(np.int32)
        self.norms = np.sqrt((np.asarray(queries, np.float64) ** 2).sum(axis=1))
        self._packed: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def packed(self, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(bytes, scales, offsets)`` in blocks of ``block`` queries, as ``search_cpu.c`` reads them: block ``b``
        holds, for each four bytes of a row, those four bytes of each of its queries in turn (``[Q / block, D / 4,
        block, 4]``); the count rounded up to a multiple of ``block`` with zero queries."""
        if block not in self._packed:
            count, width = self.bytes.shape
            total = -(-count // block) * block
            values = np.zeros((total, width), np.int8)
            values[:count] = self.bytes
            layout = values.reshape(total // block, block, width // 4, 4).transpose(0, 2, 1, 3)
            self._packed[block] = (np.ascontiguousarray(layout), _padded_to(self.scales, total, 0),
                                   _padded_to(self.offsets, total, 0))
        return self._packed[block]


def _padded_to(values: np.ndarray, total: int, fill: float) -> np.ndarray:
    """``values`` (1-D) followed by ``fill`` up to ``total`` entries, C-contiguous."""
    out = np.full(total, fill, values.dtype)
    out[: len(values)] = values
    return out


def query_bounds(queries: Queries, row_error: float, row_norm: float) -> np.ndarray:
    """``float64 [Q]``: for each query, a bound on ``|first-pass score - exact dot|`` over any row whose error norm
    and quantised norm are at most ``row_error`` and ``row_norm``. With a row ``x = s x' + e`` and a query ``q = t q'
    + f``: ``x.q - s t x'.q' = s x'.f + e.q``, at most ``row_norm |f| + row_error |q|``; the integer dot is exact
    and its scaling to float32 rounds three times (at most ``4 * 2**-24`` of ``|s x'| |t q'|``)."""
    rounding = 4 * 2.0 ** -24 * row_norm * queries.quantised_norms
    return SAFETY * (row_norm * queries.errors + row_error * queries.norms + rounding)


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


def scores(library: ctypes.CDLL, rows: np.ndarray, scales: np.ndarray, queries: Queries,
           out: np.ndarray | None = None) -> np.ndarray:
    """``float32 [N, Q]``: the first-pass scores of the quantised rows ``rows`` (uint8 ``[N, padded(D)]``, C order)
    with scales ``scales`` against ``queries``; the rows split over :func:`coclr.native.for_each`'s threads (each
    score is computed alone, so the split changes nothing)."""
    rows, scales = np.ascontiguousarray(rows), np.ascontiguousarray(scales, np.float32)
    count, width = rows.shape
    if width != queries.bytes.shape[1] or len(scales) != count:
        raise ValueError(f"rows {rows.shape} with {len(scales)} scales against queries {queries.bytes.shape}")
    nq = len(queries.scales)
    out = np.empty((count, nq), np.float32) if out is None else out[: count * nq].reshape(count, nq)
    chunks = max(1, min(native.thread_count(), count // 256))
    bounds = [count * i // chunks for i in range(chunks + 1)]
    packed, query_scales, offsets = queries.packed(library.coclr_i8_block())
    native.for_each(chunks, lambda c: library.coclr_i8_scores(
        _ptr(rows), _ptr(packed), _ptr(scales), _ptr(query_scales), _ptr(offsets), bounds[c], bounds[c + 1], nq,
        width, _ptr(out)))
    return out


def over_floor(library: ctypes.CDLL, rows: np.ndarray, scales: np.ndarray, queries: Queries, floors: np.ndarray,
               limit: int | None = None, with_scores: bool = False) -> tuple[np.ndarray, ...] | None:
    """``(rows int64, queries int64)``, and with ``with_scores`` their scores (float32): the pairs whose first-pass
    score (:func:`scores`'s, the same floats) is at least their query's ``floors`` (float32 ``[Q]``), in no
    particular order; no score block is stored (a range search's first pass). None when there are more than
    ``limit``. The rows split over :func:`coclr.native.for_each`'s threads (each score is compared alone, so the
    split changes nothing)."""
    rows, scales = np.ascontiguousarray(rows), np.ascontiguousarray(scales, np.float32)
    floors = np.ascontiguousarray(floors, np.float32)
    count, width = rows.shape
    if width != queries.bytes.shape[1] or len(scales) != count or floors.shape != queries.scales.shape:
        raise ValueError(f"rows {rows.shape} with {len(scales)} scales against queries {queries.bytes.shape} and "
                         f"{floors.shape} floors")
    nq = len(queries.scales)
    packed, query_scales, offsets = queries.packed(library.coclr_i8_block())
    floors = _padded_to(floors, len(offsets), np.inf)  # (the padding's zero queries: never over)
    chunks = max(1, min(4 * native.thread_count(), count // 256))
    bounds = [count * i // chunks for i in range(chunks + 1)]

    def part(c: int) -> tuple[np.ndarray, ...] | None:
        capacity = 4 * (bounds[c + 1] - bounds[c]) + 1024  # (a range search's hits are few; more: asked again,
        if limit is not None:                               # so room for a part's share of the limit at once)
            capacity = max(capacity, -(-limit // chunks))
        while True:
            found = [np.empty(capacity, np.int64), np.empty(capacity, np.int64)]
            found += [np.empty(capacity, np.float32)] if with_scores else []
            total = library.coclr_i8_over_floor(
                _ptr(rows), _ptr(packed), _ptr(scales), _ptr(query_scales), _ptr(offsets), _ptr(floors), bounds[c],
                bounds[c + 1], nq, width, capacity, *(_ptr(array) for array in found), *([None] * (not with_scores)))
            if total <= capacity:
                return tuple(array[:total] for array in found)
            if limit is not None and total > limit:
                return None
            capacity = total  # (the same pairs again, with room for them all)

    parts = native.for_each(chunks, part)
    if any(found is None for found in parts) or (limit is not None and sum(len(p[0]) for p in parts) > limit):
        return None
    return tuple(np.concatenate(arrays) for arrays in zip(*parts))


def pair_dots(library: ctypes.CDLL, rows: np.ndarray, queries: np.ndarray, row: np.ndarray,
              query: np.ndarray) -> np.ndarray:
    """``float64 [P]``: ``rows[row[p]] . queries[query[p]]`` in float64 (exact for quantised unit rows); ``rows``
    float32 ``[N, D]`` in C order (a memory map is read in place)."""
    queries = np.ascontiguousarray(queries, np.float32)
    if not rows.flags.c_contiguous or rows.dtype != np.float32 or rows.ndim != 2 or queries.shape[1:] != rows.shape[1:]:
        raise ValueError(f"pair_dots reads float32 rows [N, D] in C order and queries [Q, D]: got {rows.dtype} "
                         f"{rows.shape} and {queries.shape}")
    row, query = np.ascontiguousarray(row, np.int64), np.ascontiguousarray(query, np.int64)
    out = np.empty(len(row), np.float64)
    if len(row) and (row.min() < 0 or row.max() >= len(rows) or query.min() < 0 or query.max() >= len(queries)):
        raise IndexError("pair_dots: a row or query index out of range")
    chunks = max(1, min(native.thread_count(), len(row) // 1024))
    bounds = [len(row) * i // chunks for i in range(chunks + 1)]
    native.for_each(chunks, lambda c: library.coclr_pair_dots(
        _ptr(rows), _ptr(queries), _ptr(row), _ptr(query), bounds[c], bounds[c + 1], rows.shape[1], _ptr(out)))
    return out
