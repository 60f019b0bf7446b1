"""Each row's nearest other rows, for every row of an embedding folder: the one all-pairs step of curation.

The search's own exact two-pass kernels (:func:`coclr.embed.search.exact_topk` on the folder's prepared rows: a
float32, bfloat16 or int8 first pass by what the CPU has, then exact scores), the rows queried in chunks, so memory
stays at a chunk's scores and no N x N matrix is ever held. The scores are the exact ones :mod:`coclr.eval.exact`
defines (the same on every CPU, thread count and chunk size), ties to the lower row.
"""

from __future__ import annotations

import numpy as np

from coclr import progress
from coclr.embed.search import UnitRows, exact_topk

QUERY_CHUNK = 1024
"""Rows queried at a time (a first-pass block of the search is then at most 32768 x 1024 float32 scores: 128 MiB)."""


def neighbour_graph(rows: UnitRows, k: int, groups: np.ndarray | None = None, show: bool = False,
                    desc: str = "neighbours") -> tuple[np.ndarray, np.ndarray]:
    """``(scores float32 [N, k], neighbours int64 [N, k])``: each row's ``k`` most similar other rows, best first
    (-1 and -inf where there are fewer); with ``groups`` (each row's group, e.g. a window's video), rows of the
    query's own group are skipped among its ``k`` + 8 nearest."""
    count = rows.count
    extra = 0 if groups is None else 8
    want = min(count, k + 1 + extra)
    scores = np.full((count, k), -np.inf, np.float32)
    neighbours = np.full((count, k), -1, np.int64)
    with progress.bar(total=count, desc=desc, unit="row", disable=not show, leave=False) as shown:
        for start in range(0, count, QUERY_CHUNK):
            stop = min(count, start + QUERY_CHUNK)
            found, rows_found = exact_topk(rows, rows.block(start, stop), want)
            own = np.arange(start, stop)[:, None]
            keep = rows_found != own
            if groups is not None:
                keep &= groups[rows_found] != groups[own]
            for offset in range(stop - start):
                picked = np.flatnonzero(keep[offset])[:k]
                scores[start + offset, :len(picked)] = found[offset, picked]
                neighbours[start + offset, :len(picked)] = rows_found[offset, picked]
            shown.update(stop - start)
    return scores, neighbours
