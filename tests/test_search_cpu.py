"""The search's int8 first pass in C: the integer products scaled as documented, the same bits from every build
(plain C, AVX2, AVX-512 VNNI) and thread count, no saturation at the extremes, scores within the stated bound, and
the exact pass equal to a slow exact reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coclr import native
from coclr.embed import search_cpu
from coclr.embed.search_cpu import Queries, pair_dots, quantise_rows, query_bounds, scores
from coclr.eval.exact import unit_rows

pytestmark = pytest.mark.skipif(native.find_compiler() is None, reason="no C compiler found (set CC or install gcc)")


def _reference(rows: np.ndarray, row_scales: np.ndarray, queries: Queries) -> np.ndarray:
    """The first-pass scores the slow way: the integer products in int64, then the documented float32 scaling."""
    dots = (rows.astype(np.int64) - 128) @ queries.bytes.astype(np.int64).T
    assert np.abs(dots).max(initial=0) < 2 ** 24  # exact in float32
    scale = row_scales[:, None] * queries.scales[None, :]  # float32 products, as in C
    return dots.astype(np.float32) * scale


def _extreme_rows(dim: int) -> np.ndarray:
    """Unit rows whose bytes reach both ends (0 and 254 plus 128 -> 1 and 255), and one that is zero."""
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(7, dim))
    rows[0] = np.where(np.arange(dim) % 2, 1.0, -1.0)  # every byte at an end, alternating
    rows[1] = 1.0
    rows[2] = -1.0
    rows[3] = 0.0
    rows[4, 1:] = 0.0  # one non-zero value
    return unit_rows(rows)


@pytest.mark.parametrize("dim", [64, 100, 1024])
def test_scores_are_the_integer_products_scaled(dim):
    """Row counts and query counts off the kernels' blocks, dimensions off their step (padding), extreme bytes: the
    C scores equal the int64 reference bit for bit, on 1 to 3 threads (each score is computed alone)."""
    import torch

    rng = np.random.default_rng(dim)
    units = np.concatenate([_extreme_rows(dim), unit_rows(rng.normal(size=(1200, dim)))])
    quantised, row_scales, _, _ = quantise_rows(units)
    library = search_cpu.KERNEL.load()
    previous = torch.get_num_threads()
    try:
        for extra in (10, 64):  # (17 queries: less than a VNNI block; 71: blocks and a part on every build)
            queries = Queries(np.concatenate([_extreme_rows(dim), unit_rows(rng.normal(size=(extra, dim)))]))
            assert quantised.min() == 1 and quantised.max() == 255 and np.abs(queries.bytes).max() == 63
            expected = _reference(quantised, row_scales, queries)
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                for count in (len(units), 1, 5, 67, 601):
                    np.testing.assert_array_equal(scores(library, quantised[:count], row_scales[:count], queries),
                                                  expected[:count])
    finally:
        torch.set_num_threads(previous)


def test_many_queries_span_the_cache_in_parts():
    """More queries than the kernels hold in L2 at once (1 MiB of them: 16,384 at 64 bytes) are taken a span at a
    time: every score the same as the reference, the range pass's pairs and scores too."""
    rng = np.random.default_rng(8)
    dim = 64
    units = unit_rows(rng.normal(size=(23, dim)))
    quantised, row_scales, _, _ = quantise_rows(units)
    queries = Queries(unit_rows(rng.normal(size=(16384 + 45, dim))))
    library = search_cpu.KERNEL.load()
    expected = _reference(quantised, row_scales, queries)
    np.testing.assert_array_equal(scores(library, quantised, row_scales, queries), expected)
    floors = np.quantile(expected, 0.9, axis=0).astype(np.float32)
    rows, which, found = search_cpu.over_floor(library, quantised, row_scales, queries, floors, with_scores=True)
    assert set(zip(rows, which)) == set(zip(*np.nonzero(expected >= floors)))
    assert len(rows) == (expected >= floors).sum()
    np.testing.assert_array_equal(found, expected[rows, which])


def test_every_build_computes_the_same_scores(tmp_path):
    """The kernels compiled for the baseline (plain C), for AVX2 (vpmaddubsw: below saturation by the queries'
    7 bits) and for this CPU (AVX-512 VNNI where it has it) give the same scores, at the extremes too."""
    compiler = native.find_compiler()
    cpu_flags = set(native.cpu_flags().split())
    marches = [None, "-march=native"] + (["-march=x86-64-v3"] if {"avx2", "fma"} <= cpu_flags else [])
    dim = 256
    rng = np.random.default_rng(0)
    units = np.concatenate([_extreme_rows(dim), unit_rows(rng.normal(size=(41, dim)))])
    quantised, row_scales, _, _ = quantise_rows(units)
    queries = Queries(np.concatenate([_extreme_rows(dim)[::-1], unit_rows(rng.normal(size=(60, dim)))]))
    expected = _reference(quantised, row_scales, queries)
    kernels = set()
    for index, march in enumerate(marches):
        flags = [flag for flag in native.FLAGS if flag != "-march=native"] + ([march] if march else [])
        (tmp_path / str(index)).mkdir()
        library = search_cpu.open_library(search_cpu.KERNEL.compile(list(compiler), flags, tmp_path / str(index)))
        kernels.add(library.coclr_i8_kernel().decode())
        np.testing.assert_array_equal(scores(library, quantised, row_scales, queries), expected, err_msg=march)
    assert "plain" in kernels and (("avx2" in kernels) or "avx2" not in cpu_flags)


def test_the_range_pass_finds_the_scores_at_their_floors_in_every_build(tmp_path):
    """The fused range pass (:func:`over_floor`: each score compared with its query's floor as it is computed)
    returns exactly the pairs whose stored score reaches the floor (and, asked, those scores), from every build and
    on 1 to 3 threads, with floors on scores themselves (ties), beyond every score and below every score (more pairs
    than its first buffer); ``limit`` gives None when more pairs reach the floors."""
    import torch

    compiler = native.find_compiler()
    cpu_flags = set(native.cpu_flags().split())
    marches = [None, "-march=native"] + (["-march=x86-64-v3"] if {"avx2", "fma"} <= cpu_flags else [])
    rng = np.random.default_rng(5)
    for dim in (64, 200):
        units = np.concatenate([_extreme_rows(dim), unit_rows(rng.normal(size=(1500, dim)))])
        quantised, row_scales, _, _ = quantise_rows(units)
        queries = Queries(np.concatenate([_extreme_rows(dim), unit_rows(rng.normal(size=(6 + 30 * (dim > 64),
                                                                                          dim)))]))
        expected = _reference(quantised, row_scales, queries)
        count = len(queries.scales)
        floors = expected[rng.integers(0, len(units), count), np.arange(count)]  # a score each: ties
        floors[0], floors[1:9] = np.inf, -np.inf  # (a part of the rows: more pairs than its first buffer holds)
        want = set(zip(*np.nonzero(expected >= floors)))
        for index, march in enumerate(marches):
            flags = [flag for flag in native.FLAGS if flag != "-march=native"] + ([march] if march else [])
            (tmp_path / f"{dim}-{index}").mkdir()
            library = search_cpu.open_library(search_cpu.KERNEL.compile(list(compiler), flags,
                                                                        tmp_path / f"{dim}-{index}"))
            previous = torch.get_num_threads()
            try:
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    rows, which = search_cpu.over_floor(library, quantised, row_scales, queries, floors)
                    assert len(rows) == len(want) and set(zip(rows, which)) == want, (dim, march, threads)
                    rows, which, found = search_cpu.over_floor(library, quantised, row_scales, queries, floors,
                                                               with_scores=True)
                    assert set(zip(rows, which)) == want
                    np.testing.assert_array_equal(found, expected[rows, which])
            finally:
                torch.set_num_threads(previous)
            assert search_cpu.over_floor(library, quantised, row_scales, queries, floors, limit=len(want) - 1) is None
            assert len(search_cpu.over_floor(library, quantised, row_scales, queries, floors, limit=len(want))[0]) \
                == len(want)


@pytest.mark.parametrize("spread", [0.0, 0.1, 0.3])
def test_a_projected_first_pass_never_falls_below_the_exact_score_by_more_than_its_bound(spread, monkeypatch):
    """Rows near a few axes, projected onto their principal axes plus the length left off them: every int8 score of
    the projected rows is at least the exact dot product less its query's bound (what lets a range search over them
    keep every row that reaches a floor), and mostly within a small distance of it."""
    from coclr.embed import search

    monkeypatch.setattr(search, "PROJECTED_DIMS", 16)
    rng = np.random.default_rng(11)
    dim = 128
    raw = rng.normal(size=(2000, 12)) @ rng.normal(size=(12, dim)) + spread * 3 * rng.normal(size=(2000, dim))
    units = unit_rows(raw)
    projected = search.Projected.of(search.UnitRows.in_memory(units))
    assert projected is not None
    queries = units[rng.integers(0, len(units), 30)] + 0.01 * rng.normal(size=(30, dim))
    queries = unit_rows(np.concatenate([queries, rng.normal(size=(10, dim))]))
    quantised, bounds = projected.queries(queries)
    first = scores(search_cpu.KERNEL.load(), projected.int8.bytes, projected.int8.scales, quantised)
    exact = units.astype(np.float64) @ queries.astype(np.float64).T
    assert (first >= exact - bounds[None, :]).all()
    assert np.median(first - exact) < 0.2


@pytest.mark.parametrize("kind", ["normal", "spiky", "positive", "sparse"])
def test_first_pass_scores_are_within_their_bound(kind):
    """Whatever the rows look like, every first-pass score is within its query's bound of the exact dot product
    (the bound the search chooses its candidates with), and the bound is not vacuous."""
    rng = np.random.default_rng(7)
    dim = 512
    raw = rng.normal(size=(3000, dim))
    if kind == "spiky":
        raw[:, :3] *= 40  # a few large values: a large scale, coarse steps for the rest
    elif kind == "positive":
        raw = np.abs(raw) + 1.0
    elif kind == "sparse":
        raw *= rng.random(raw.shape) < 0.02
    units = unit_rows(raw)
    query_units = unit_rows(np.concatenate([raw[rng.integers(0, 3000, 20)] + rng.normal(size=(20, dim)),
                                            rng.normal(size=(20, dim))]))
    quantised, row_scales, error, norm = quantise_rows(units)
    queries = Queries(query_units)
    bounds = query_bounds(queries, error, norm)
    first = scores(search_cpu.KERNEL.load(), quantised, row_scales, queries).astype(np.float64)
    exact = units.astype(np.float64) @ query_units.astype(np.float64).T
    assert (np.abs(first - exact) <= bounds[None, :]).all()
    assert bounds.max() < 0.2


def test_pair_dots_are_exact(tmp_path):
    """The exact pass: float64 dots of quantised unit rows, equal to math.fsum of the products; memory-mapped rows
    are read in place; an index out of range is refused, not read."""
    rng = np.random.default_rng(5)
    units = unit_rows(rng.normal(size=(300, 96)))
    query_units = unit_rows(rng.normal(size=(7, 96)))
    np.save(tmp_path / "rows.npy", units)
    mapped = np.load(tmp_path / "rows.npy", mmap_mode="r")
    row = rng.integers(0, 300, 5000)
    query = rng.integers(0, 7, 5000)
    found = pair_dots(search_cpu.KERNEL.load(), mapped, query_units, row, query)
    expected = [math.fsum(units[r].astype(np.float64) * query_units[q].astype(np.float64)) for r, q in zip(row, query)]
    np.testing.assert_array_equal(found, expected)
    with pytest.raises(IndexError):
        pair_dots(search_cpu.KERNEL.load(), mapped, query_units, np.array([300]), np.array([0]))


_WITHOUT_TORCH = """
import sys
import numpy as np
from coclr import native
from coclr.embed.search import Int8Rows, UnitRows, exact_topk, first_pass_kind
from coclr.embed.search_cpu import quantise_rows
from coclr.eval.exact import unit_rows
units = unit_rows(np.random.default_rng(0).normal(size=(3000, 64)))
rows = UnitRows.of_array(units, None, None, Int8Rows(*quantise_rows(units)))
exact_topk(rows, units[:40], 5)
print(first_pass_kind(rows, 40), native.thread_count(), "torch" in sys.modules)
"""


def test_the_int8_search_runs_without_importing_torch(tmp_path):
    """A search of many queries through the C kernels imports no torch; their threads then follow
    ``OMP_NUM_THREADS``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "OMP_NUM_THREADS": "3", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    run = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    assert run.stdout.split() == ["int8", "3", "False"]
