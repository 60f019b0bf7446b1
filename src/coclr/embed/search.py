"""Nearest videos (or windows) of a query in an embedding folder, by cosine similarity, exactly.

Scores: the exact dot products of quantised unit vectors (:mod:`coclr.eval.exact`, the rule retrieval uses), so the
answer is the same bits on every CPU, thread count and chunk size, and byte-identical rows tie and rank by the
documented rule: higher score first, then lower row. By default nothing is centred (a row's neighbours do not change
when videos are added to the folder); ``center=True`` subtracts the mean of the folder's rows first, as the paper's
retrieval protocol does with its gallery (the order-free mean of :func:`coclr.eval.exact.gallery_mean`).

Speed: the rows are normalised once, when the folder is first searched (or ahead of it, by a call of
:func:`prepare_search`), into ``search/<videos|windows>.<plain|centred>.npy`` beside the arrays,
with a JSON record of the source array's identity (device, inode, size, modification and change times) and its
BLAKE2 checksum: a source whose identity changed is checksummed again, and rows whose checksum differs are
normalised again, so a changed folder is never served stale. The prepared rows are memory-mapped, beside their
bfloat16 and int8 copies (the first passes of many queries). A search is then a first pass over chunks, within a
known bound of the exact scores, and an exact pass (float64) over the few rows whose first-pass score reaches the
query's k-th best exact score so far less that bound: the first pass may round however the CPU likes, the exact
pass decides (:func:`exact_topk`). For few queries the first pass is a float32 matrix product (BLAS speed); for
many, a bfloat16 one where the CPU has bfloat16 instructions, else an int8 one in C (:mod:`coclr.embed.search_cpu`).
No torch import for a search of stored rows except by the bfloat16 pass.

FAISS (``pip install faiss-cpu``, optional) runs an exact float32 search with an ``IndexFlatIP``: the same
neighbours up to float32 rounding, without the tie rule; it must hold the whole array in memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from coclr.atomic import (
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    file_sha256,
    file_state,
    remove_stale_partials,
)
from coclr.config import whole_number
from coclr.cpu import native_bfloat16
from coclr.embed import search_cpu
from coclr.embed.options import SEARCH_BACKENDS, SearchOptions
from coclr.embed.output import Embeddings, is_current
from coclr.errors import ConfigError, DataError
from coclr.eval.exact import (
    QUANTUM_BITS,
    bfloat16_bits,
    bfloat16_dot_bound,
    exact_dot_bound,
    gallery_mean,
    unit_rows,
)
from coclr.eval.gallery import (
    NEIGHBOUR_COLOUR,
    QUERY_COLOUR,
    animated_gif,
    data_uri,
    gallery_page,
    gallery_row,
    short_names,
    thumbnail,
    video_cell,
)
from coclr.text import shown
from coclr.video.decode import decode_frames_at, decode_frames_between, probe_video

PREPARED_DIR = "search"
PREPARED_FORMAT = "coclr-search-rows-2"
"""The prepared rows' format: 2 since rows of tiny values are made unit vectors too
(:func:`coclr.eval.exact.unit_rows`); files of another are prepared again."""
PREPARE_BLOCK = 8192
"""Rows normalised at a time when the prepared rows are written (bounds memory for millions of rows)."""
SEARCH_CHUNK = 32768
"""Gallery rows per float32 product in a search (bounds the score block to ``queries x SEARCH_CHUNK``)."""
FIRST_CHUNK = 1024
"""The first chunk is small: its k best rows per query, scored exactly, start the floors before the big chunks come."""
PAIR_BLOCK = 8192
"""Candidate pairs scored exactly at a time by NumPy (bounds the float64 copy of their rows)."""
MANY_QUERIES = 16
"""From this many queries at once the first pass is compute-bound: there it multiplies the rows' bfloat16 copy
where the CPU has bfloat16 dot-product instructions (:func:`coclr.cpu.native_bfloat16`), else their int8 copy in C
(:mod:`coclr.embed.search_cpu`). For fewer queries (memory-bound) it is NumPy's float32 product."""
GROUP = 64
"""A score block is cut into ``GROUP`` parts: the maximum over the parts (one pass over the scores) names the few
columns that can hold a candidate, and only those are compared with the floor (instead of a compare and a
``nonzero`` over every score)."""
FIRST_PASSES = ("float32", "bfloat16", "int8")
"""The first passes (:func:`first_pass_kind`): NumPy's float32 product, PyTorch's bfloat16 one, or the int8 one in C
(:mod:`coclr.embed.search_cpu`)."""


@dataclasses.dataclass
class Hit:
    """One neighbour: its rank (1 = nearest), similarity, row (of videos.npy or windows.npy) and video file;
    for windows, the video's row and the window's start and end in seconds."""

    rank: int
    score: float
    row: int
    path: str
    video_row: int
    start: float | None = None
    end: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in dataclasses.asdict(self).items() if value is not None}


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401, PLC0415 (optional)
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------- exact two-pass search


@dataclasses.dataclass
class Int8Rows:
    """The int8 copy of unit rows (:func:`coclr.embed.search_cpu.quantise_rows`): bytes ``[N, padded(D)]``, a scale
    per row, and the largest error norm and quantised norm over the rows (what the first pass's bound needs)."""

    bytes: np.ndarray
    scales: np.ndarray
    error: float
    norm: float


@dataclasses.dataclass
class UnitRows:
    """Gallery rows as quantised unit vectors (:func:`coclr.eval.exact.unit_rows`): ``block(start, stop)`` and
    ``take(indices)`` give the same bits for a row whichever way it is read; ``mean`` was subtracted first."""

    count: int
    dim: int
    block: Callable[[int, int], np.ndarray]
    take: Callable[[np.ndarray], np.ndarray]
    mean: np.ndarray | None = None
    block16: Callable[[int, int], np.ndarray] | None = None
    """The same rows rounded to bfloat16 (raw ``uint16`` bits), when prepared: the fast first pass of many queries."""
    int8: Int8Rows | None = None
    """Their int8 copy, when prepared: the first pass of many queries on CPUs without bfloat16 instructions."""
    units: np.ndarray | None = None
    """The rows themselves (C order, a memory map when prepared), when they are stored: read in place."""

    @classmethod
    def of_array(cls, units: np.ndarray, mean: np.ndarray | None = None, units16: np.ndarray | None = None,
                 int8: Int8Rows | None = None) -> UnitRows:
        """Rows normalised already (a prepared file, memory-mapped), and their bfloat16 and int8 copies when there
        are."""
        block16 = (lambda a, b: np.asarray(units16[a:b])) if units16 is not None else None
        return cls(len(units), units.shape[1], lambda a, b: np.asarray(units[a:b]),
                   lambda rows: np.asarray(units[rows]), mean, block16, int8,
                   units if units.flags.c_contiguous and units.dtype == np.float32 else None)

    @classmethod
    def in_memory(cls, units: np.ndarray) -> UnitRows:
        """Rows normalised already (:func:`coclr.eval.exact.unit_rows`) held in memory, with their bfloat16 and int8
        copies made here (a block at a time; the bfloat16 one where the CPU has bfloat16 instructions): the first
        passes of many queries, as for a prepared folder."""
        units = np.ascontiguousarray(units, np.float32)
        quantised = np.empty((len(units), search_cpu.padded(units.shape[1])), np.uint8)
        scales = np.empty(len(units), np.float32)
        error = norm = 0.0
        for start in range(0, len(units), PREPARE_BLOCK):
            part = slice(start, start + PREPARE_BLOCK)
            quantised[part], scales[part], block_error, block_norm = search_cpu.quantise_rows(units[part])
            error, norm = max(error, block_error), max(norm, block_norm)
        units16 = bfloat16_bits(units) if native_bfloat16() else None
        return cls.of_array(units, None, units16, Int8Rows(quantised, scales, error, norm))

    @classmethod
    def normalising(cls, rows: np.ndarray, center: bool, source: Path | None = None) -> UnitRows:
        """Raw rows (of the file ``source``, named when one is not finite), normalised chunk by chunk as they are
        read (nothing written)."""
        mean = gallery_mean(rows) if center else None
        return cls(len(rows), rows.shape[1], lambda a, b: _units(rows[a:b], mean, rows, source),
                   lambda indices: _units(rows[indices], mean, rows, source), mean)


PROJECTED_DIMS = 127
"""Principal axes a projected first pass keeps (:class:`Projected`): with the residual, 128 numbers, a whole number
of the int8 kernels' 64-byte steps (one more axis would pad each row to 192)."""
PROJECTION_SAMPLE = 16384
"""Rows (spread evenly) whose second moments choose the axes."""
PROJECTION_RESIDUAL = 0.3
"""A projection whose rows keep more than this of their length outside the axes (the median) screens too little:
not made."""
PROJECTION_MARGIN = 1e-5
"""Added to the int8 bound of a projected first pass: the float32 rounding of the projected rows (about 1e-7)."""


@dataclasses.dataclass
class Projected:
    """A first pass over fewer numbers: each unit row ``a`` as its projection ``P a`` onto the rows' first
    :data:`PROJECTED_DIMS` principal axes, with the length of what is left, ``r_a = |a - P^T P a|``, as one more
    number. ``[P a, r_a] . [P q, r_q] = P a . P q + r_a r_q`` is at least ``a . q`` (Cauchy-Schwarz on the parts off
    the axes): a first pass over these, within its int8 bound, keeps every row whose exact score reaches a floor, so
    the exact pass gives the same answer. It screens well when the rows lie near a few axes (embeddings do: their
    effective rank is low), and is not made when they do not (:data:`PROJECTION_RESIDUAL`)."""

    basis: np.ndarray | None
    """float64 ``[D, p]``, orthonormal columns; None: the rows as they are (:meth:`identity`)."""
    int8: Int8Rows
    """The projected rows, quantised for the int8 kernels."""

    @classmethod
    def identity(cls, gallery: UnitRows) -> Projected:
        """No projection: the rows' own int8 copy, so that a range search at floors screens the rows themselves."""
        return cls(None, gallery.int8)

    @classmethod
    def of(cls, gallery: UnitRows) -> Projected | None:
        """The projection of ``gallery``'s rows, or None (too few dimensions to gain, or the rows spread wide)."""
        if gallery.dim < 4 * PROJECTED_DIMS or gallery.count < 4 * PROJECTED_DIMS:
            return None
        sample = gallery.take(np.arange(0, gallery.count, max(1, gallery.count // PROJECTION_SAMPLE)))
        sample = sample.astype(np.float64)
        _, vectors = np.linalg.eigh(sample.T @ sample)
        basis = np.ascontiguousarray(vectors[:, ::-1][:, :PROJECTED_DIMS])
        width = search_cpu.padded(PROJECTED_DIMS + 1)
        quantised = np.empty((gallery.count, width), np.uint8)
        scales = np.empty(gallery.count, np.float32)
        residuals = np.empty(gallery.count)
        error = norm = 0.0
        for start in range(0, gallery.count, PREPARE_BLOCK):
            stop = min(gallery.count, start + PREPARE_BLOCK)
            rows = cls.augmented(basis, gallery.block(start, stop))
            residuals[start:stop] = rows[:, -1]
            quantised[start:stop], scales[start:stop], block_error, block_norm = search_cpu.quantise_rows(rows)
            error, norm = max(error, block_error), max(norm, block_norm)
        if np.median(residuals) > PROJECTION_RESIDUAL:
            return None
        return cls(basis, Int8Rows(quantised, scales, error, norm))

    @staticmethod
    def augmented(basis: np.ndarray, units: np.ndarray) -> np.ndarray:
        """float32 ``[n, p + 1]``: ``[P a, r_a]`` of each row of ``units``."""
        values = np.asarray(units, np.float64)
        projected = values @ basis
        residual = np.linalg.norm(values - projected @ basis.T, axis=1)
        return np.concatenate([projected, residual[:, None]], axis=1).astype(np.float32)

    def queries(self, queries: np.ndarray) -> tuple[search_cpu.Queries, np.ndarray]:
        """The queries projected and quantised for the int8 kernels, and each one's bound (the int8 pass's, plus
        :data:`PROJECTION_MARGIN` for a projection) below which its first-pass score never lies under the exact
        one."""
        if self.basis is None:
            quantised = search_cpu.Queries(queries)
            return quantised, search_cpu.query_bounds(quantised, self.int8.error, self.int8.norm)
        quantised = search_cpu.Queries(self.augmented(self.basis, queries))
        return quantised, search_cpu.query_bounds(quantised, self.int8.error, self.int8.norm) + PROJECTION_MARGIN


def _units(rows: np.ndarray, mean: np.ndarray | None, whole: np.ndarray | None = None,
           source: Path | None = None) -> np.ndarray:
    """``rows`` as unit rows (:func:`unit_rows`); rows that hold NaN or infinite values are a :class:`DataError`
    naming the first such row of ``whole`` (the array ``rows`` are of) and its file ``source`` when given."""
    try:
        return unit_rows(rows, mean)
    except ValueError:
        pass
    bad = _first_nonfinite_row(whole if whole is not None else rows)
    if source is None or bad is None:
        raise DataError("the searched rows hold NaN or infinite values" + ("" if bad is None else f" (row {bad})"))
    raise DataError(f"{source}: damaged (row {bad} holds NaN or infinite values); this folder cannot be searched: "
                    "move it away and run coclr embed again")


def _first_nonfinite_row(rows: np.ndarray) -> int | None:
    """The first row of ``rows`` that holds a NaN or infinite value (read a block at a time), or None."""
    for start in range(0, len(rows), PREPARE_BLOCK):
        bad = np.flatnonzero(~np.isfinite(np.asarray(rows[start: start + PREPARE_BLOCK])).all(axis=1))
        if len(bad):
            return start + int(bad[0])
    return None


def first_pass_kind(gallery: UnitRows, count: int) -> str:
    """Which first pass ``count`` queries at once get over ``gallery`` (one of :data:`FIRST_PASSES`), by what the
    CPU has and what is installed, never by a timing. From :data:`MANY_QUERIES` queries: ``bfloat16`` where the rows
    have a bfloat16 copy, torch is installed and the CPU has bfloat16 dot-product instructions (AVX512_BF16 or AMX,
    not limited by ``ATEN_CPU_CAPABILITY`` or ``ONEDNN_MAX_CPU_ISA``: :func:`coclr.cpu.native_bfloat16`); else
    ``int8`` where the rows have an int8 copy, are at most :data:`~coclr.embed.search_cpu.MAX_DIM` long and its C
    kernels build (:mod:`coclr.embed.search_cpu`). Otherwise ``float32``. Each gives the same answer
    (:func:`exact_topk`)."""
    if count < MANY_QUERIES:
        return "float32"
    if gallery.block16 is not None and native_bfloat16():
        try:
            import torch  # noqa: F401, PLC0415 (heavy; optional here: only the bfloat16 pass needs it)
        except ImportError:
            pass
        else:
            return "bfloat16"
    if gallery.int8 is not None and gallery.units is not None and gallery.dim <= search_cpu.MAX_DIM \
            and search_cpu.KERNEL.load() is not None:
        return "int8"
    return "float32"


def exact_topk(gallery: UnitRows, queries: np.ndarray, k: int, chunk: int = SEARCH_CHUNK,
               first: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(scores float64 [Q, k], rows int64 [Q, k])``: each query's ``k`` best gallery rows by exact score, ties
    to the lower row. ``queries`` are unit rows already (:func:`coclr.eval.exact.unit_rows`, same mean).

    Pass 1 (``first``, by default :func:`first_pass_kind`: NumPy's float32 product, a bfloat16 product where the
    CPU has bfloat16 instructions, or the int8 one) scores the rows chunk by chunk within a known bound of the exact
    score (per query). Pass 2 scores exactly (float64 products of quantised rows: exact in any order) every row whose
    first-pass score is at least the query's floor: the k-th best exact score found so far, less the bound. A row
    whose exact score reaches the exact k-th best is therefore always scored exactly, and the answer is the same
    whichever first pass ran. In each chunk, k rows per query that score high in the first pass (:func:`_seeds`)
    are scored exactly first, to raise the floors before the chunk's candidates are taken; the first chunk is
    small, to start the floors before the big chunks come."""
    if gallery.count == 0 or k < 1:
        raise DataError(f"nothing to search: {gallery.count} rows, k = {k}")
    queries = np.ascontiguousarray(queries, np.float32)
    count, k = len(queries), min(k, gallery.count)
    first = first or first_pass_kind(gallery, count)
    many = first == "int8" or count >= MANY_QUERIES  # the C kernels score many candidates exactly, if they load
    library = search_cpu.KERNEL.load(warn=first == "int8") if many else None
    if first not in FIRST_PASSES or (first == "bfloat16" and gallery.block16 is None) \
            or (first == "int8" and (gallery.int8 is None or gallery.units is None or library is None
                                     or gallery.dim > search_cpu.MAX_DIM)):
        raise ConfigError(f"first pass: {first!r} is not one of {', '.join(FIRST_PASSES)} for these rows")
    first_pass, bound = _first_pass(gallery, queries, first, library, min(chunk, gallery.count))
    exact_of = exact_pairs(gallery, queries, library)
    lower = np.full(count, -np.inf)  # per query, the k-th best exact score of the rows scored so far
    pool_query, pool_row, pool_exact = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64)
    starts = [0, *range(min(FIRST_CHUNK, chunk), gallery.count, chunk)]
    for number, start in enumerate(starts):
        stop = starts[number + 1] if number + 1 < len(starts) else gallery.count
        scores = first_pass(start, stop)  # float32 [c, Q], within the bound of the exact scores
        parts, maxima = _parts(scores)
        seeds = _seeds(parts, maxima, k)
        if seeds is not None:  # k rows of the chunk that score high for each query: their k-th raises its floor
            lower = np.maximum(lower, exact_of(seeds + start, np.tile(np.arange(count), k)).reshape(k, count)
                               .min(axis=0))
        rows, hits = _over_floor(scores, _floor32(lower - bound), parts, maxima)
        rows = rows.astype(np.int64) + start
        pool_query, pool_row = np.concatenate([pool_query, hits]), np.concatenate([pool_row, rows])
        pool_exact = np.concatenate([pool_exact, exact_of(rows, hits)])
        lower = _kth_best(lower, pool_query, pool_exact, k)
        keep = pool_exact >= lower[pool_query]  # below the k-th best exact score: never among the k best
        pool_query, pool_row, pool_exact = pool_query[keep], pool_row[keep], pool_exact[keep]
    picked = best_of_each(pool_query, pool_row, pool_exact, count, k)
    return pool_exact[picked], pool_row[picked]


def best_of_each(query: np.ndarray, row: np.ndarray, score: np.ndarray, count: int, k: int) -> np.ndarray:
    """``int64 [count, k]``: indices of each query's ``k`` best entries of the pairs ``(query, row, score)``, best
    first, ties to the lower row; each query ``0 .. count - 1`` has at least ``k`` of them."""
    order = np.lexsort((row, -score, query))
    return order[np.searchsorted(query[order], np.arange(count))[:, None] + np.arange(k)]


def _first_pass(gallery: UnitRows, queries: np.ndarray, first: str, library: Any | None,
                width: int) -> tuple[Callable[[int, int], np.ndarray], np.ndarray]:
    """The first pass ``first`` of rows ``start:stop`` (float32 ``[c, Q]``, at most ``width`` rows a call) and its
    bound per query (float64 ``[Q]``)."""
    if first == "int8":
        first_pass, bound = _int8_pass(library, gallery.int8, queries, width)
    elif first == "bfloat16":
        first_pass, bound = _bfloat16_pass(gallery, queries, width), bfloat16_dot_bound(gallery.dim)
    else:
        by_query = queries.T  # the products are rows x queries: OpenBLAS runs that orientation at least as fast
        first_pass, bound = (lambda start, stop: gallery.block(start, stop) @ by_query), exact_dot_bound(gallery.dim)
    return first_pass, np.broadcast_to(np.asarray(bound, np.float64), len(queries))


def fused_range(gallery: UnitRows) -> bool:
    """Whether :func:`exact_over`'s first pass over ``gallery`` compares each score as it is computed (the int8
    kernels build, and the rows have their int8 copy and are stored); else it stores blocks of scores."""
    return gallery.int8 is not None and gallery.units is not None and gallery.dim <= search_cpu.MAX_DIM \
        and search_cpu.KERNEL.load() is not None


def exact_over(gallery: UnitRows, queries: np.ndarray, floors: np.ndarray | float, chunk: int = SEARCH_CHUNK,
               limit: int | None = None,
               projected: Projected | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(queries int64, rows int64, scores float64)``: every pair of a query and a gallery row whose exact score
    (:func:`exact_topk`'s) is at least the query's floor (``floors``, one or one per query): a range search, sorted
    by query, then best first, ties to the lower row. ``queries`` are unit rows already, like the gallery's.

    The first pass takes the rows whose first-pass score reaches the floor less its bound; the exact pass decides,
    so the answer is the same whichever first pass ran. Where the int8 kernels build and the rows have their int8
    copy, that pass compares each score with the floor as it is computed (:func:`coclr.embed.search_cpu.over_floor`):
    no score block is ever stored; else chunk by chunk, as :func:`exact_topk`'s. None when the first pass finds
    more than ``limit`` candidate pairs (a floor too low for a range search: rank instead). With ``projected``
    (:class:`Projected`, of these rows), the fused pass runs over the projected rows: fewer numbers, the same
    answer."""
    queries = np.ascontiguousarray(queries, np.float32)
    floors = np.broadcast_to(np.asarray(floors, np.float64), len(queries))
    empty = np.empty(0, np.int64)
    if gallery.count == 0 or len(queries) == 0:
        return empty, empty, np.empty(0, np.float64)
    fused = fused_range(gallery)
    library = search_cpu.KERNEL.load(warn=False) if fused or len(queries) >= MANY_QUERIES else None
    if fused:
        int8 = gallery.int8 if projected is None else projected.int8
        if projected is None:
            quantised = search_cpu.Queries(queries)
            bound = search_cpu.query_bounds(quantised, int8.error, int8.norm)
        else:
            quantised, bound = projected.queries(queries)
        found = search_cpu.over_floor(library, int8.bytes, int8.scales, quantised, _floor32(floors - bound), limit)
        if found is None:
            return None
        rows, hits = found
    else:
        first_pass, bound = _first_pass(gallery, queries, first_pass_kind(gallery, len(queries)), library,
                                        min(chunk, gallery.count))
        floor32 = _floor32(floors - bound)
        parts, total = [], 0
        for start in range(0, gallery.count, chunk):
            row, hit = _over_floor(first_pass(start, min(gallery.count, start + chunk)), floor32)
            parts.append((row.astype(np.int64) + start, hit.astype(np.int64)))
            total += len(row)
            if limit is not None and total > limit:
                return None
        rows, hits = (np.concatenate(part) for part in zip(*parts))
    exact = exact_pairs(gallery, queries, library)(rows, hits)
    keep = exact >= floors[hits]
    rows, hits, exact = rows[keep], hits[keep], exact[keep]
    order = np.lexsort((rows, -exact, hits))
    return hits[order], rows[order], exact[order]


def _floor32(floor: np.ndarray) -> np.ndarray:
    """``floor`` (float64) as float32, rounded down: a first-pass score at the floor is never left out."""
    floor32 = floor.astype(np.float32)
    high = floor32 > floor
    floor32[high] = np.nextafter(floor32[high], np.float32(-np.inf))
    return floor32


def exact_pairs(gallery: UnitRows, queries: np.ndarray,
                 library: Any | None) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``exact(rows, queries_of_rows) -> float64``: the exact scores of (row, query) pairs; in C, reading the rows in
    place in file order, when ``library`` (:mod:`coclr.embed.search_cpu`) is given and the rows are stored
    (:func:`coclr.embed.search_cpu.pair_dots`), else the rows read once each and multiplied in float64 by NumPy."""
    def exact(rows: np.ndarray, which: np.ndarray) -> np.ndarray:
        out = np.empty(len(rows), np.float64)
        if library is not None and gallery.units is not None:
            by_row = np.argsort(rows, kind="stable")
            out[by_row] = search_cpu.pair_dots(library, gallery.units, queries, rows[by_row], which[by_row])
            return out
        unique, inverse = np.unique(rows, return_inverse=True)  # each row read once, in file order
        taken = gallery.take(unique).astype(np.float64)
        for start in range(0, len(rows), PAIR_BLOCK):
            part = slice(start, start + PAIR_BLOCK)
            out[part] = np.einsum("ij,ij->i", taken[inverse[part]], queries[which[part]].astype(np.float64))
        return out

    return exact


def _kth_best(lower: np.ndarray, pool_query: np.ndarray, pool_exact: np.ndarray, k: int) -> np.ndarray:
    """Each query's ``lower`` raised to its k-th best pool score (where it has k pool scores)."""
    count = len(lower)
    order = np.lexsort((-pool_exact, pool_query))  # by query, best first: the k-th is at first + k - 1
    sorted_query, sorted_score = pool_query[order], pool_exact[order]
    first = np.searchsorted(sorted_query, np.arange(count + 1))
    full = np.flatnonzero(np.diff(first) >= k)
    lower = lower.copy()
    lower[full] = np.maximum(lower[full], sorted_score[first[full] + k - 1])
    return lower


def _parts(scores: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """``(parts, maxima)`` of a score block ``[rows, queries]``: where its rows divide into :data:`GROUP` parts,
    the parts ``[GROUP, rows / GROUP, queries]`` (part g, row j: the scores of row g * rows / GROUP + j) and their
    maxima over the parts ``[rows / GROUP, queries]``, each the score of another row; else None and the scores."""
    width, count = scores.shape
    if width % GROUP or width < 4 * GROUP:
        return None, scores
    parts = scores.reshape(GROUP, width // GROUP, count)
    return parts, parts.max(axis=0)


def _seeds(parts: np.ndarray | None, maxima: np.ndarray, k: int) -> np.ndarray | None:
    """``int64 [k * Q]`` (k-major): for each query, the rows of its ``k`` largest ``maxima`` (:func:`_parts`): k
    distinct rows of the block that score high; None when there are no more than k maxima."""
    if len(maxima) <= k:
        return None
    count = maxima.shape[1]
    top = np.argpartition(maxima, len(maxima) - k, axis=0)[len(maxima) - k:]  # [k, Q]
    if parts is None:
        return top.ravel().astype(np.int64)
    part = parts[:, top, np.arange(count)].argmax(axis=0)  # [k, Q]: the part holding each maximum
    return (part * parts.shape[1] + top).ravel().astype(np.int64)


def _over_floor(scores: np.ndarray, floor: np.ndarray, parts: np.ndarray | None = None,
                maxima: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, queries)`` of the scores ``[rows, queries]`` at or above their query's floor. Where the block's
    rows divide into :data:`GROUP` parts (:func:`_parts`, computed here unless given), the maximum over the parts
    (one pass) names the few rows worth a look."""
    if maxima is None:
        parts, maxima = _parts(scores)
    if parts is None:
        count = scores.shape[1]
        hot = np.flatnonzero(scores.max(axis=0) >= floor)  # most queries have no candidate in a later block
        rows, which = np.nonzero((scores if len(hot) == count else scores[:, hot]) >= floor[hot])
        return rows, hot[which]
    row, query = np.nonzero(maxima >= floor)
    part, which = np.nonzero(parts[:, row, query] >= floor[query])  # [GROUP, n]
    return part * parts.shape[1] + row[which], query[which]


def _int8_pass(library: Any, rows: Int8Rows, queries: np.ndarray,
               width: int) -> tuple[Callable[[int, int], np.ndarray], np.ndarray]:
    """The int8 first pass of rows ``start:stop`` (float32 ``[c, Q]``, one buffer reused like the bfloat16 pass's)
    and its bound per query (:func:`coclr.embed.search_cpu.query_bounds`)."""
    quantised = search_cpu.Queries(queries)
    buffer = np.empty(len(queries) * width, np.float32)

    def scores(start: int, stop: int) -> np.ndarray:
        return search_cpu.scores(library, rows.bytes[start:stop], rows.scales[start:stop], quantised, buffer)

    return scores, search_cpu.query_bounds(quantised, rows.error, rows.norm)


def _bfloat16_pass(gallery: UnitRows, queries: np.ndarray, width: int) -> Callable[[int, int], np.ndarray]:
    """PyTorch's product of the bfloat16 copy of rows ``start:stop`` with the queries rounded to bfloat16 (float32
    accumulation, a bfloat16 result; one buffer reused: a block is used before the next is asked for), as float32
    ``[c, Q]``."""
    import torch  # noqa: PLC0415 (heavy: only a search of many queries needs it)

    query = torch.from_numpy(bfloat16_bits(queries).view(np.int16)).view(torch.bfloat16)
    buffer = torch.empty(len(queries) * width, dtype=torch.bfloat16)

    def scores(start: int, stop: int) -> np.ndarray:
        with warnings.catch_warnings():  # a read-only memory map: torch warns that it could write (it does not)
            warnings.simplefilter("ignore", UserWarning)
            rows = torch.from_numpy(np.ascontiguousarray(gallery.block16(start, stop)).view(np.int16))
        out = buffer[: len(queries) * (stop - start)].view(stop - start, len(queries))
        torch.mm(rows.view(torch.bfloat16), query.T, out=out)
        return out.float().numpy()

    return scores


# ------------------------------------------------------------------------------ prepared rows beside a folder


def _identity(path: Path) -> list[int] | None:
    state = file_state(path)
    return None if state is None else list(state)


def file_checksum(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes (:func:`coclr.atomic.file_sha256`, the one content hash of files)."""
    return f"sha256:{file_sha256(path)}"


COPIES = {"prepared": ("npy", np.float32), "bf16": ("bf16.npy", np.uint16), "i8": ("i8.npy", np.uint8),
          "i8_scales": ("i8-scales.npy", np.float32)}
"""The prepared files of an array (key: file suffix, dtype): the unit rows, their bfloat16 copy, their int8 copy
(:data:`coclr.embed.search_cpu.ALIGN`-padded) and its scales; the record holds each one's identity as
``<key>_identity``."""


def prepared_paths(root: Path, name: str, center: bool) -> dict[str, Path]:
    """The prepared files of ``<name>.npy`` (:data:`COPIES`) and their record (``"record"``):
    ``search/<name>.<plain|centred>.{npy,bf16.npy,i8.npy,i8-scales.npy,json}``."""
    stem = root / PREPARED_DIR / f"{name}.{'centred' if center else 'plain'}"
    return {**{key: Path(f"{stem}.{suffix}") for key, (suffix, _) in COPIES.items()}, "record": Path(f"{stem}.json")}


def _prepared_shapes(shape: tuple[int, int]) -> dict[str, tuple[int, ...]]:
    count, dim = shape
    return {"prepared": (count, dim), "bf16": (count, dim), "i8": (count, search_cpu.padded(dim)),
            "i8_scales": (count,)}


def _fresh(root: Path, name: str, center: bool, source: np.ndarray) -> UnitRows | None:
    """The prepared rows when their record matches the source array (by identity, else by checksum); else None."""
    paths = prepared_paths(root, name, center)
    source_path = root / f"{name}.npy"
    try:
        record = json.loads(paths["record"].read_text())
        if record.get("format") != PREPARED_FORMAT or record.get("quantum_bits") != QUANTUM_BITS \
                or any(record.get(f"{key}_identity") != _identity(paths[key]) for key in COPIES):
            return None
        if record.get("source_identity") != _identity(source_path):
            if record.get("source_checksum") != file_checksum(source_path):
                return None
            record["source_identity"] = _identity(source_path)  # the same bytes (a copy, a touch): re-bless
            atomic_write_json(paths["record"], record)
        arrays = {key: np.load(paths[key], mmap_mode="r") for key in COPIES}
        int8 = Int8Rows(arrays["i8"], arrays["i8_scales"], float(record["i8_error"]), float(record["i8_norm"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    shapes = _prepared_shapes(source.shape)
    if any(array.shape != shapes[key] or array.dtype != COPIES[key][1] for key, array in arrays.items()):
        return None
    mean = np.asarray(record["mean"], np.float64) if center else None
    if mean is not None and mean.shape != (source.shape[1],):
        return None
    return UnitRows.of_array(arrays["prepared"], mean, arrays["bf16"], int8)


def _write_prepared(root: Path, name: str, center: bool, source: np.ndarray, loaded: list[int] | None) -> UnitRows:
    """Prepare ``source``, the rows of ``root/<name>.npy`` as read when its state was ``loaded``; rows of a file
    replaced since (a coclr embed committed after they were read) are only normalised, not kept: their preparation
    would be recorded against the new file's bytes."""
    paths = prepared_paths(root, name, center)
    source_path = root / f"{name}.npy"
    identity = _identity(source_path)
    checksum = file_checksum(source_path) if identity == loaded else None
    if checksum is None or _identity(source_path) != loaded:
        return UnitRows.normalising(source, center, source_path)
    mean = gallery_mean(source) if center else None
    shapes = _prepared_shapes(source.shape)
    error = norm = 0.0
    with contextlib.ExitStack() as stack:
        files = {key: stack.enter_context(atomic_open(paths[key], "wb")) for key in COPIES}
        for key, file in files.items():
            np.lib.format.write_array_header_1_0(file, {"descr": np.lib.format.dtype_to_descr(np.dtype(COPIES[key][1])),
                                                        "fortran_order": False, "shape": shapes[key]})
        for start in range(0, len(source), PREPARE_BLOCK):
            units = _units(source[start: start + PREPARE_BLOCK], mean, source, source_path)
            quantised, scales, block_error, block_norm = search_cpu.quantise_rows(units)
            error, norm = max(error, block_error), max(norm, block_norm)
            for key, array in (("prepared", units), ("bf16", bfloat16_bits(units)), ("i8", quantised),
                               ("i8_scales", scales)):
                files[key].write(array.tobytes())
    atomic_write_json(paths["record"], {
        "format": PREPARED_FORMAT, "quantum_bits": QUANTUM_BITS, "source": source_path.name,
        "source_identity": identity, "source_checksum": checksum,
        **{f"{key}_identity": _identity(paths[key]) for key in COPIES}, "i8_error": error, "i8_norm": norm,
        "mean": mean.tolist() if mean is not None else None})
    fresh = _fresh(root, name, center, source)
    if fresh is None:
        raise OSError(f"{paths['record']}: the prepared rows changed while they were written")
    return fresh


def folder_rows(embeddings: Embeddings, windows: bool = False, center: bool = False) -> UnitRows:
    """The searched rows of a folder, prepared once and kept beside it (see the module docstring); a folder that
    cannot be written (read-only) is normalised chunk by chunk on each search instead."""
    name = "windows" if windows else "videos"
    source = embeddings.windows if windows else embeddings.videos
    prepared = _fresh(embeddings.root, name, center, source)
    if prepared is not None:
        return prepared
    path = embeddings.root / f"{name}.npy"
    if len(source) == 0:
        return UnitRows.normalising(source, center, path)
    loaded = getattr(embeddings, "states", {}).get(f"{name}.npy")
    try:
        remove_stale_partials(embeddings.root / PREPARED_DIR)  # (a kill while preparing left its temporary files)
        return _write_prepared(embeddings.root, name, center, source, None if loaded is None else list(loaded))
    except OSError:
        return UnitRows.normalising(source, center, path)


def prepare_search(root: str | Path) -> None:
    """Prepare a folder's rows for search now (videos and windows, not centred), so that the first search does not
    pay for it (a program that embeds and then serves searches). Safe to call at any time."""
    embeddings = Embeddings(root)
    for windows in (False, True):
        folder_rows(embeddings, windows)


# ------------------------------------------------------------------------------------------------ the search


def nearest(gallery: np.ndarray | UnitRows, queries: np.ndarray, k: int, backend: str = "exact",
            center: bool = False, chunk: int = SEARCH_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [Q, k], rows [Q, k])`` of the ``k`` gallery rows most similar to each query (cosine), best first,
    ties to the lower row. ``gallery``: raw rows (normalised as they are read) or prepared :class:`UnitRows`
    (then ``center`` is theirs)."""
    if backend not in SEARCH_BACKENDS:
        raise ConfigError(f"backend: {backend!r} is not one of {', '.join(SEARCH_BACKENDS)}")
    dim = gallery.dim if isinstance(gallery, UnitRows) else gallery.shape[1]
    queries = np.asarray(queries, np.float32)
    if queries.ndim == 1:
        queries = queries[None]
    if queries.ndim != 2 or queries.shape[1] != dim:
        raise DataError(f"queries must be vectors of the gallery's {dim} dimensions ([{dim}] or [queries, {dim}]), "
                        f"got shape {queries.shape} (from another encoder?)")
    if not np.isfinite(queries).all():  # (it was blamed on the folder: "the searched rows hold NaN")
        bad = int(np.flatnonzero(~np.isfinite(queries).all(axis=1))[0])
        raise DataError(f"query {bad} holds NaN or infinite values; give finite query vectors")
    if backend == "faiss":
        raw = gallery.block(0, gallery.count) if isinstance(gallery, UnitRows) else gallery
        return _faiss_nearest(raw, queries, k, center and not isinstance(gallery, UnitRows), chunk)
    rows = gallery if isinstance(gallery, UnitRows) else UnitRows.normalising(gallery, center)
    return exact_topk(rows, _units(queries, rows.mean), k, chunk)


def _faiss_nearest(gallery: np.ndarray, queries: np.ndarray, k: int, center: bool,
                   chunk: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        import faiss  # noqa: PLC0415 (optional)
    except ImportError:
        raise ConfigError("backend: faiss is not installed (pip install faiss-cpu), use the exact backend") from None
    mean = gallery.mean(axis=0, dtype=np.float64).astype(np.float32) if center else None
    index = faiss.IndexFlatIP(gallery.shape[1])
    for start in range(0, len(gallery), chunk):
        index.add(_unit(np.asarray(gallery[start: start + chunk], np.float32), mean))
    scores, rows = index.search(_unit(queries, mean), min(k, len(gallery)))
    return scores, rows.astype(np.int64)


def _unit(rows: np.ndarray, mean: np.ndarray | None) -> np.ndarray:
    rows = rows - mean if mean is not None else rows.copy()
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.ascontiguousarray(rows / np.maximum(norms, 1e-12), dtype=np.float32)


def check_search(embeddings: Embeddings, asked: SearchOptions) -> None:
    """Refuse, in one line, a search that cannot run: nothing to search, ``k`` below 1, FAISS not installed (a
    command checks it before it embeds a query video)."""
    gallery = embeddings.windows if asked.windows else embeddings.videos
    if len(gallery) == 0:
        raise DataError(f"{embeddings.root}: no {'window' if asked.windows else 'video'} rows to search yet (a coclr "
                        "embed run adds them as it merges its results; one that ended may have failed every video: "
                        "see failed.jsonl there)")
    if not whole_number(asked.k) or asked.k < 1:  # (2.5 was NumPy's
        raise ConfigError(f"-k: must be a whole number of at least 1, got {asked.k!r}")  # "Partition index" error)
    if asked.backend == "faiss" and not faiss_available():
        raise ConfigError("--backend faiss: faiss is not installed (pip install faiss-cpu); use the exact backend")


def search(embeddings: Embeddings, query: np.ndarray, k: int = SearchOptions.k, windows: bool = SearchOptions.windows,
           exclude: int | None = None, backend: str = SearchOptions.backend, center: bool = SearchOptions.center,
           stale: list[str] | None = None) -> list[Hit]:
    """The ``k`` nearest videos (or windows, with ``windows``) of the vector ``query``; ``exclude`` leaves out
    one row of the searched array (the query's own). A hit whose file was removed or changed since it was embedded
    is never served: it is left out (its path appended to ``stale``) and the next row takes its place; only the
    candidates' files are looked at, so a search costs a few ``stat`` calls, not one per row."""
    check_search(embeddings, SearchOptions(k=k, windows=windows, backend=backend, center=center))
    if np.ndim(query) == 2 and len(query) == 1:  # one vector as a row
        query = np.asarray(query)[0]
    if np.ndim(query) != 1:
        raise DataError(f"search takes one query vector, got shape {np.shape(query)} (search each row alone)")
    gallery = embeddings.windows if windows else embeddings.videos
    rows_or_prepared = folder_rows(embeddings, windows, center) if backend == "exact" else gallery
    left_out = {exclude} if exclude is not None else set()
    fresh: dict[int, bool] = {}  # video row -> whether its file is as embedded

    def is_fresh(video: dict[str, Any]) -> bool:
        if video["row"] not in fresh:
            fresh[video["row"]] = is_current(video)
            if not fresh[video["row"]] and stale is not None:
                stale.append(video["path"])
        return fresh[video["row"]]

    want = k + len(left_out)
    while True:
        scores, rows = nearest(rows_or_prepared, query, min(want, len(gallery)), backend, center)
        hits = []
        for score, row in zip(scores[0], rows[0]):
            row = int(row)
            if row in left_out or row < 0 or len(hits) == k:
                continue
            record = embeddings.window_records[row] if windows else None
            video = embeddings.video_records[record["video"] if windows else row]
            if not is_fresh(video):
                left_out.add(row)
                continue
            if windows:
                hits.append(Hit(len(hits) + 1, float(score), row, video["path"], video["row"], record["start"],
                                record["end"]))
            else:
                hits.append(Hit(len(hits) + 1, float(score), row, video["path"], row))
        if len(hits) == k or want >= len(gallery):
            return hits
        want = min(len(gallery), 2 * want + len(left_out))


@dataclasses.dataclass
class Query:
    """What a search is asked about: its vector, how it is named, and the row it is in the folder as (left out of
    its own hits), if any."""

    vector: np.ndarray
    label: str
    exclude: int | None = None
    row: int | None = None
    """the row number given as the query (a window row with ``windows``), else None"""
    stale: bool = False
    """a row whose file changed or was removed since it was embedded (its vector is the file as it was)"""


def resolve_query(embeddings: Embeddings, query: str, windows: bool = False, device: str | None = None) -> Query:
    """The query ``query`` names: a video file (its embedded row when the file is as it was embedded, else embedded
    now as the folder's videos were), or a row number of the folder (of its windows with ``windows``). A query is
    a row number unless a file of that name exists; anything else is a :class:`DataError` naming it."""
    if Path(query).is_file():
        stored = embeddings.row_of(query)
        if stored is not None and is_current(embeddings.video_records[stored]):
            return Query(embeddings.videos[stored], str(Path(query).absolute()), None if windows else stored)
        from coclr.embed.run import embedder_for  # noqa: PLC0415 (heavy: the encoder)

        vector = embedder_for(embeddings.root, device=device, workers=0).embed(query).vector
        return Query(vector, str(Path(query).absolute()))
    if not (query.isascii() and query.isdigit()):  # ("²" and "３" are digits to str.isdigit, not to int or a user)
        negative = query.startswith("-") and query[1:].isascii() and query[1:].isdigit()
        what = ("a folder, not a video file" if Path(query).is_dir() else
                "no such file, and rows are numbered from 0" if negative and not Path(query).exists() else
                "no such file, nor a row number" if not Path(query).exists() else
                "not a regular file, nor a row number")
        raise DataError(f"--query: {query}: {what}; give a video file or the row number of one in the folder")
    row = int(query)
    records = embeddings.window_records if windows else embeddings.video_records
    if not 0 <= row < len(records):  # (none: check_search says why, before the query is read)
        raise DataError(f"--query: row {row} is out of range ({len(records)} rows in {embeddings.root})")
    video = embeddings.video_records[records[row]["video"]] if windows else records[row]
    return Query((embeddings.windows if windows else embeddings.videos)[row], video["path"], row, row,
                 not is_current(video))


def seconds_span(start: float, end: float) -> str:
    """A window's stretch of its video as every output of the search writes it."""
    return f"{start:.2f}-{end:.2f} s"


def format_hits(hits: list[Hit]) -> str:
    """A plain-text table of the hits."""
    lines = []
    for hit in hits:
        span = f"  {hit.start:8.2f}-{hit.end:.2f} s" if hit.start is not None else ""
        lines.append(f"{hit.rank:3d}  {hit.score:.4f}  row {hit.row:<7d}{span}  {shown(hit.path)}")
    return "\n".join(lines)


def write_search_html(path: str | Path, query_label: str, query_thumbnail: np.ndarray, hits: list[Hit],
                      embeddings: Embeddings, span: str = "", windows: bool = False) -> Path:
    """The query and its neighbours (``windows``: the nearest windows) as animated thumbnails on one self-contained
    page (the retrieval gallery's layout), the neighbours' taken from their files (their window's frames for window
    hits; ``span``: which stretch of its video a window query is)."""

    names = short_names([query_label, *(hit.path for hit in hits)])
    query_cell = video_cell(data_uri(animated_gif(query_thumbnail)), names[0], QUERY_COLOUR, query_label,
                            f"query {span}".strip())
    cells = []
    for hit, name in zip(hits, names[1:]):
        frames = file_thumbnail(hit.path, embeddings, hit.start, hit.end)
        stretch = f" {seconds_span(hit.start, hit.end)}" if hit.start is not None else ""
        cells.append(video_cell(data_uri(animated_gif(frames)), name, NEIGHBOUR_COLOUR, hit.path, f"#{hit.rank}",
                                f"{stretch} ({hit.score:.3f})"))
    what = "windows" if windows else "videos"
    note = (f"The query (blue) and its nearest {what} by cosine similarity, best first. Thumbnails are animated; "
            "hover one for its whole path.")
    return atomic_write_text(path, gallery_page(f"Nearest {what}", note, [gallery_row(query_cell, cells)], "search"))


def file_thumbnail(path: str, embeddings: Embeddings | None = None, start: float | None = None,
                   end: float | None = None, num_frames: int = 8, height: int = 64) -> np.ndarray:
    """Thumbnail frames of a video file (of the frames shown from ``start`` to ``end`` seconds, when given: a
    window's times, which follow the frames' timestamps), at the frame rate the folder embedded it with."""

    fps = embeddings.record["settings"].get("fps") if embeddings is not None else None
    if start is not None:
        frames = decode_frames_between(path, start, float("inf") if end is None else end, height, fps)
        return thumbnail(len(frames), lambda indices: frames[indices], num_frames, height)
    row = embeddings.row_of(path) if embeddings is not None else None
    if row is not None:
        total = embeddings.video_records[row]["frames"]
    else:
        info = probe_video(path)
        total = max(1, round(info.frames * (fps or info.fps) / info.fps))
    return thumbnail(total, lambda indices: decode_frames_at(path, indices, height, fps), num_frames, height)
