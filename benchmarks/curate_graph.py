"""The neighbour graph's two ways, a chunk of 1,024 queries at a time, on a `benchmarks/curate_scale.py` folder: the
projected range search (`coclr.curate.graph.nearest_rows` with the projection) against the search's top-k (the
first pass the CPU gives it), interleaved A B B A over chunks spread through the folder, in one process; each
chunk's two answers checked equal.

    python benchmarks/curate_graph.py W/curate_100000x1024 [--chunks 4]

With ``coclr.cpu.AVX2_LIMIT`` in the environment, the AVX2 kind.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from coclr.curate import graph
from coclr.embed import search_cpu
from coclr.embed.output import Embeddings
from coclr.embed.search import Projected, first_pass_kind, folder_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a coclr embed folder (benchmarks/curate_scale.py makes one)")
    parser.add_argument("--chunks", type=int, default=4, help="chunks of queries timed, spread through the folder")
    args = parser.parse_args()
    rows = folder_rows(Embeddings(args.folder), center=True)
    begin = time.perf_counter()
    projected = Projected.of(rows)
    if projected is None:
        sys.exit("these rows do not project onto a few axes")
    print(f"{rows.count} x {rows.dim}; int8 kernel {search_cpu.kernel()}; the top-k's first pass "
          f"{first_pass_kind(rows, graph.QUERY_CHUNK)}; the projection made in {time.perf_counter() - begin:.1f} s")
    times: dict[str, list[float]] = {"projected": [], "top-k": []}
    for start in np.linspace(0, rows.count - graph.QUERY_CHUNK, args.chunks).astype(int):
        queries = rows.block(start, start + graph.QUERY_CHUNK)
        answers = {}
        for side in ("projected", "top-k", "top-k", "projected"):
            begin = time.perf_counter()
            answers[side] = graph.nearest_rows(rows, queries, 11, projected if side == "projected" else None)
            times[side].append(time.perf_counter() - begin)
        if not all(np.array_equal(a, b) for a, b in zip(answers["projected"], answers["top-k"])):
            sys.exit(f"the two ways differ on the chunk from row {start}")
    mean = {side: float(np.mean(seconds)) for side, seconds in times.items()}
    print(f"a chunk of {graph.QUERY_CHUNK} queries, 11 nearest (A B B A over {args.chunks} chunks): projected "
          f"{mean['projected']:.3f} s (range {min(times['projected']):.3f}-{max(times['projected']):.3f}), top-k "
          f"{mean['top-k']:.3f} s ({min(times['top-k']):.3f}-{max(times['top-k']):.3f}): "
          f"{mean['top-k'] / mean['projected']:.2f}x")


if __name__ == "__main__":
    main()
