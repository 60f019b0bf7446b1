"""Each row's nearest other rows, for every row of an embedding folder: the one all-pairs step of curation.

The search's own exact kernels on the folder's prepared rows, the rows queried in chunks, so memory stays at a
chunk's scores and no N x N matrix is ever held. Where the int8 kernels are vector ones (:func:`projection_pays`)
and the rows project well onto a few principal axes (:class:`coclr.embed.search.Projected`), a chunk's floors are
the k-th best exact scores among the candidates that score highest in the projected first pass over the first
:data:`PREFIX_PART` of the rows (k real rows: the true k-th best is no lower), and a range search at them over the
projected rows, fused in C (:func:`coclr.embed.search.exact_over`), finds every row that reaches them; else, or
when too many rows reach them, the two-pass top-k (:func:`coclr.embed.search.exact_topk`).
The scores are the exact ones :mod:`coclr.eval.exact` defines (the same on every CPU, thread count and chunk size),
ties to the lower row: both ways give the same answer.
"""

from __future__ import annotations

import numpy as np

from coclr import progress
from coclr.embed import search_cpu
from coclr.embed.search import (
    Int8Rows,
    Projected,
    UnitRows,
    best_of_each,
    exact_over,
    exact_pairs,
    exact_topk,
    fused_range,
)
from coclr.eval.exact import exact_dot_bound

QUERY_CHUNK = 1024
"""Rows queried at a time (a first-pass block of the search is then at most 32768 x 1024 float32 scores: 128 MiB)."""
WIDER_SCORES = 1 << 24
"""The most float32 scores :func:`neighbour_graph` holds at once for the rows it searches wider (64 MiB)."""
PREFIX_PART = 3
"""A chunk of queries takes its floors from the best candidates among the first 1 / PREFIX_PART of the rows: the
larger that share, the closer the floors come to the true k-th best scores, and the fewer rows reach them."""
PROJECTED_FROM = 32768
"""Fewer rows than this are ranked by the top-k (the projection would not pay for its set-up)."""
EXTRA = 8
"""Candidates per query beyond the k needed, scored exactly among the prefix's."""
RANGE_PAIRS = 4096
"""Rows per query reaching its floor beyond which a chunk is ranked by the top-k instead (memory stays bounded)."""


def pairs_over(rows: UnitRows, queries: np.ndarray, floor: float, per_query: int, projected: Projected | None):
    """Every pair of a query (a row of ``queries``, unit rows) and a row of ``rows`` whose exact score is at least
    ``floor``: ``(queries, rows, scores)`` parts (:func:`~coclr.embed.search.exact_over`'s, a query numbered in
    ``queries``), none left out. A part whose candidates exceed ``per_query`` a query is halved, and a single query
    is searched without a limit (its pairs are at most the rows): memory stays bounded however low the floor."""
    parts = [(0, len(queries))]
    while parts:
        start, stop = parts.pop()
        limit = None if stop - start <= 1 else per_query * (stop - start)
        found = exact_over(rows, queries[start:stop], floor, limit=limit, projected=projected)
        if found is None:
            middle = (start + stop) // 2
            parts += [(middle, stop), (start, middle)]
            continue
        query, row, score = found
        yield query + start, row, score


def video_links(rows: UnitRows, floor: float, show: bool = False, desc: str = "duplicate videos",
                queries=None, count: int | None = None, video=None, chunk: int = QUERY_CHUNK,
                per_query: int = RANGE_PAIRS):
    """The :class:`~coclr.curate.groups.Links` of every pair of videos whose exact score reaches ``floor``
    (:func:`pairs_over`, ``chunk`` videos queried at a time): the duplicates' only input, whatever ``--neighbours``.
    By default each row of ``rows`` is a video and its own query; else ``queries(start, stop)`` gives the query rows
    of ``count`` videos and ``video`` maps a row of ``rows`` to its video (a fingerprint's plain and mirrored rows)."""
    from coclr.curate.groups import Links, linked  # noqa: PLC0415

    count = rows.count if count is None else count
    queries = queries or rows.block
    links = Links.none(count)
    projected = projection(rows)
    with progress.bar(total=count, desc=desc, unit="video", disable=not show, leave=False) as shown:
        for start in range(0, count, chunk):
            stop = min(count, start + chunk)
            for query, row, score in pairs_over(rows, queries(start, stop), floor, per_query, projected):
                other = row if video is None else video(row)
                apart = query + start != other
                links = linked(links, query[apart] + start, other[apart], score[apart])
            shown.update(stop - start)
    return links


def window_pairs(rows: UnitRows, floor: float, video: np.ndarray, show: bool = False,
                 desc: str = "matching windows") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(queries, rows, scores)``: every pair of windows (``rows``, each of video ``video[i]``) of different videos
    whose exact score reaches ``floor`` (:func:`pairs_over`, :data:`QUERY_CHUNK` windows queried at a time), each
    window's best window of each other video kept (:func:`coclr.curate.groups.best_windows`): what the stretches
    are decided on, whatever the number of videos sharing one."""
    from coclr.curate.groups import best_windows  # noqa: PLC0415

    parts = [(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))]
    projected = projection(rows)
    with progress.bar(total=rows.count, desc=desc, unit="row", disable=not show, leave=False) as shown:
        for start in range(0, rows.count, QUERY_CHUNK):
            stop = min(rows.count, start + QUERY_CHUNK)
            for query, row, score in pairs_over(rows, rows.block(start, stop), floor, RANGE_PAIRS, projected):
                parts.append(best_windows(query + start, row, score, video))
            shown.update(stop - start)
    query, row, score = (np.concatenate(part) for part in zip(*parts))
    return query, row, score


def projection_pays() -> bool:
    """Whether the int8 kernels are vector ones (AVX2, or AVX-512 VNNI): there the projected range search was
    measured faster than the top-k, whichever first pass the top-k takes (docs/curate.md); the plain C loop is not
    worth a projection."""
    return search_cpu.kernel() in ("avx2", "avx512_vnni")


def projection(rows: UnitRows) -> Projected | None:
    """The projected rows :func:`nearest_rows` screens with, where the range search is fused and it pays."""
    if not projection_pays() or not fused_range(rows) or rows.count < PROJECTED_FROM:
        return None
    return Projected.of(rows)


def nearest_rows(rows: UnitRows, queries: np.ndarray, want: int,
                 projected: Projected | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~coclr.embed.search.exact_topk`'s answer: each query's ``want`` best rows (exact scores, best first,
    ties to the lower row), by a range search over ``projected`` when given (see the module docstring)."""
    prefix = rows.count // PREFIX_PART
    if projected is None or want + EXTRA > prefix:
        return exact_topk(rows, queries, want)
    library = search_cpu.KERNEL.load()
    quantised, _ = projected.queries(queries)
    best = _best_first(library, projected.int8, quantised, prefix, want + EXTRA)  # [Q, m]: high in the first pass
    exact = search_cpu.pair_dots(library, rows.units, queries, best.ravel(),
                                 np.repeat(np.arange(len(queries)), want + EXTRA)).reshape(best.shape)
    floors = -np.partition(-exact, want - 1, axis=1)[:, want - 1]  # the want-th best of real rows: none true lower
    ranged = exact_over(rows, queries, floors, limit=RANGE_PAIRS * len(queries), projected=projected)
    if ranged is None:
        return exact_topk(rows, queries, want)
    query, row, score = ranged  # by query, best first, ties to the lower row; at least want each (the prefix's)
    picked = np.searchsorted(query, np.arange(len(queries)))[:, None] + np.arange(want)
    return score[picked], row[picked]


def _best_first(library, int8: Int8Rows, queries: search_cpu.Queries, prefix: int, m: int) -> np.ndarray:
    """``int64 [Q, m]``: for each query, ``m`` of the first ``prefix`` rows whose first-pass scores are the highest
    (ties to the lower row). By the fused range pass over blocks of rows twice as long each time, at floors that rise
    as they go (each query's m-th best so far): the scores that reach them are few, and no block is stored or
    sorted."""
    count = len(queries.scales)
    best_score = search_cpu.scores(library, int8.bytes[:m], int8.scales[:m], queries).T  # [Q, m]
    best_row = np.broadcast_to(np.arange(m), (count, m))
    by_query = np.repeat(np.arange(count), m)
    start = m
    while start < prefix:
        stop = min(prefix, 2 * start)
        row, query, score = search_cpu.over_floor(library, int8.bytes[start:stop], int8.scales[start:stop], queries,
                                                  best_score.min(axis=1), with_scores=True)
        query, row = np.concatenate([by_query, query]), np.concatenate([best_row.ravel(), row + start])
        score = np.concatenate([best_score.ravel(), score])
        picked = best_of_each(query, row, score, count, m)
        best_row, best_score = row[picked], score[picked]
        start = stop
    return best_row


def neighbour_graph(rows: UnitRows, k: int, groups: np.ndarray | None = None, show: bool = False,
                    desc: str = "neighbours") -> tuple[np.ndarray, np.ndarray]:
    """``(scores float32 [N, k], neighbours int64 [N, k])``: each row's ``k`` most similar other rows, best first
    (-1 and -inf where there are fewer); with ``groups`` (each row's group, e.g. a window's video), the ``k`` most
    similar rows of other groups: among each row's ``k`` + 8 nearest, and for a row with fewer there (a steady shot's
    window, nearest to many of its own video's), among every row of the other groups (:func:`_other_groups_topk`),
    in chunks of queries that hold at most :data:`WIDER_SCORES` scores."""
    count = rows.count
    extra = 0 if groups is None else 8
    want = min(count, k + 1 + extra)
    scores = np.full((count, k), -np.inf, np.float32)
    neighbours = np.full((count, k), -1, np.int64)
    projected = projection(rows)

    def pick(queries: np.ndarray, found: np.ndarray, rows_found: np.ndarray) -> None:
        keep = rows_found != queries[:, None]
        if groups is not None:
            keep &= groups[rows_found] != groups[queries][:, None]
        for offset, query in enumerate(queries):
            picked = np.flatnonzero(keep[offset])[:k]
            scores[query, :len(picked)] = found[offset, picked]
            neighbours[query, :len(picked)] = rows_found[offset, picked]

    with progress.bar(total=count, desc=desc, unit="row", disable=not show, leave=False) as shown:
        for start in range(0, count, QUERY_CHUNK):
            stop = min(count, start + QUERY_CHUNK)
            pick(np.arange(start, stop), *nearest_rows(rows, rows.block(start, stop), want, projected))
            shown.update(stop - start)
    short = np.flatnonzero(neighbours[:, k - 1] < 0) if groups is not None and k > 0 else np.array([], np.int64)
    if len(short) and want < count:
        step = max(1, min(QUERY_CHUNK, WIDER_SCORES // count))  # queries at a time: at most WIDER_SCORES scores
        for first in range(0, len(short), step):
            queries = short[first:first + step]
            pick(queries, *_other_groups_topk(rows, queries, groups, k))
    return scores, neighbours


def _other_groups_topk(rows: UnitRows, queries: np.ndarray, groups: np.ndarray,
                       k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best rows of other groups than each query row's own (``[Q, k]`` exact scores and rows, ties to the
    lower row, -inf and -1 where there are fewer): every row scored in float32 with the query's own group left out,
    then the rows within twice the float32 product's error bound of the k-th best (:func:`exact_dot_bound`) scored
    exactly, as the search scores (:func:`~coclr.embed.search.exact_topk`: the same answer whatever the float32
    product's rounding)."""
    block = rows.take(queries)
    scores = np.concatenate([block @ rows.block(start, min(rows.count, start + QUERY_CHUNK * 32)).T
                             for start in range(0, rows.count, QUERY_CHUNK * 32)], axis=1)
    scores[groups[queries][:, None] == groups[None, :]] = -np.inf
    others = np.isfinite(scores).sum(axis=1)
    take = min(k, scores.shape[1])
    kth = -np.partition(-scores, take - 1, axis=1)[:, take - 1]
    query, row = np.nonzero((scores >= (kth - 2 * exact_dot_bound(rows.dim))[:, None]) & np.isfinite(scores))
    exact = exact_pairs(rows, block, None)(row.astype(np.int64), query.astype(np.int64))
    order = np.lexsort((row, -exact, query))  # by query, best first, ties to the lower row
    query, row, exact = query[order], row[order], exact[order]
    starts = np.searchsorted(query, np.arange(len(queries)))
    found = np.full((len(queries), k), -np.inf)
    rows_found = np.full((len(queries), k), -1, np.int64)
    for number in range(len(queries)):
        have = min(k, int(others[number]))
        found[number, :have] = exact[starts[number]:starts[number] + have]
        rows_found[number, :have] = row[starts[number]:starts[number] + have]
    return found, rows_found
