"""Retrieval R@k against a brute-force loop computation; chunking, ties and two-stream fusion."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from coclr.errors import DataError
from coclr.eval.exact import gallery_mean, tree_sum, unit_rows, within_rounding
from coclr.eval.retrieval import recall_at_k, retrieve, topk_neighbours


def brute_force(queries, query_labels, galleries, gallery_labels, ks):
    """Loops in float64: centre each view by its gallery mean, L2-normalise, average the views' cosine
    similarities; rank by (similarity descending, gallery index ascending). R@k counts a tie at the k-th place
    by its exact probability over random orders of the tied videos (math.comb)."""
    views = []
    for q, g in zip(queries, galleries):
        q, g = np.asarray(q, np.float64), np.asarray(g, np.float64)
        mean = g.mean(axis=0)
        unit = lambda rows, mean=mean: [(r - mean) / max(np.sqrt(((r - mean) ** 2).sum()), 1e-12) for r in rows]  # noqa: E731
        views.append((unit(q), unit(g)))
    neighbours, recall = [], {k: 0 for k in ks}
    for i in range(len(queries[0])):
        sims = [sum(float(np.dot(q[i], g[j])) for q, g in views) / len(views) for j in range(len(galleries[0]))]
        order = sorted(range(len(sims)), key=lambda j: (-sims[j], j))
        neighbours.append(order[: max(ks)])
        for k in ks:
            kth = sims[order[min(k, len(order)) - 1]]
            positive = [gallery_labels[j] == query_labels[i] for j in range(len(sims))]
            if any(p and sim > kth for p, sim in zip(positive, sims)):
                recall[k] += 1
                continue
            tied = [p for p, sim in zip(positive, sims) if sim == kth]
            places = min(k, len(order)) - sum(sim > kth for sim in sims)
            recall[k] += 1 - math.comb(len(tied) - sum(tied), places) / math.comb(len(tied), places)
    return {k: v / len(queries[0]) for k, v in recall.items()}, np.array(neighbours)


def _data(seed=0, num_query=40, num_gallery=300, dim=16, classes=7):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) + 3.0  # an offset: centring matters
    gallery_labels = rng.integers(0, classes, num_gallery)
    query_labels = rng.integers(0, classes, num_query)
    gallery = (centres[gallery_labels] + 1.5 * rng.normal(size=(num_gallery, dim))).astype(np.float32)
    query = (centres[query_labels] + 1.5 * rng.normal(size=(num_query, dim))).astype(np.float32)
    return query, query_labels, gallery, gallery_labels


def test_recall_equals_brute_force():
    query, query_labels, gallery, gallery_labels = _data()
    ks = (1, 5, 10, 20)
    expected, expected_neighbours = brute_force([query], query_labels, [gallery], gallery_labels, ks)
    result = retrieve(query, query_labels, gallery, gallery_labels, ks, query_chunk=9, gallery_chunk=64)
    assert result.recall == expected
    np.testing.assert_array_equal(result.topk_indices, expected_neighbours)
    assert 0 < expected[1] < expected[20] <= 1  # a non-trivial case


def test_gallery_mean_centring_not_per_set():
    """Shifting only the queries changes per-set centring's answer but must change ours (test statistics
    are not used); shifting both sets by the same vector must not change anything."""
    query, query_labels, gallery, gallery_labels = _data(seed=1)
    base = retrieve(query, query_labels, gallery, gallery_labels)
    shift = np.full(query.shape[1], 5.0, dtype=np.float32)
    both = retrieve(query + shift, query_labels, gallery + shift, gallery_labels)
    np.testing.assert_array_equal(both.topk_indices, base.topk_indices)
    only_queries = retrieve(query + shift, query_labels, gallery, gallery_labels)
    expected, neighbours = brute_force([query + shift], query_labels, [gallery], gallery_labels, (1, 5, 10, 20))
    assert only_queries.recall == expected
    np.testing.assert_array_equal(only_queries.topk_indices, neighbours)
    assert not np.array_equal(only_queries.topk_indices, base.topk_indices)


@pytest.mark.parametrize("chunks", [(1, 1), (3, 7), (40, 299), (1000, 100000)])
def test_chunked_equals_unchunked(chunks):
    query, query_labels, gallery, gallery_labels = _data(seed=2)
    whole = retrieve(query, query_labels, gallery, gallery_labels, query_chunk=10**6, gallery_chunk=10**6)
    part = retrieve(query, query_labels, gallery, gallery_labels, query_chunk=chunks[0], gallery_chunk=chunks[1])
    assert part.recall == whole.recall
    np.testing.assert_array_equal(part.topk_indices, whole.topk_indices)
    np.testing.assert_array_equal(part.topk_scores, whole.topk_scores)  # exact scores: the same bits


@pytest.mark.parametrize("gallery_chunk", [4, 13, 10**6])
def test_ties_rank_lower_gallery_index_first(gallery_chunk):
    """Duplicated gallery rows tie exactly; the lower index ranks first, across chunk boundaries, and also
    when the tie straddles the k-th place (more equal scores than k)."""
    rng = np.random.default_rng(3)
    gallery = rng.normal(size=(60, 8)).astype(np.float32)
    duplicates = [5, 17, 18, 40, 59]
    gallery[duplicates] = gallery[30]
    many = list(range(41, 58))  # 17 more copies of row 2: a tie wider than k = 10 on its own
    gallery[many] = gallery[2]
    gallery_labels = np.arange(60) % 4
    query = np.stack([gallery[30], gallery[2], gallery[30] + 0.01]).astype(np.float32)
    query_labels = np.array([1, 2, 3])
    result = retrieve(query, query_labels, gallery, gallery_labels, (1, 5, 10), gallery_chunk=gallery_chunk)
    assert result.topk_indices[0, :6].tolist() == sorted([30, *duplicates])
    assert result.topk_indices[1, :10].tolist() == sorted([2, *many])[:10]
    expected, neighbours = brute_force([query], query_labels, [gallery], gallery_labels, (1, 5, 10))
    np.testing.assert_array_equal(result.topk_indices, neighbours)
    assert result.recall == pytest.approx(expected, abs=1e-12)


def test_constant_features_score_chance_whatever_the_gallery_order():
    """A collapsed encoder (every feature the same) ties every similarity: R@k is what a random order of the
    gallery gives, not what its stored order happens to give (the gallery starts with the queries' class here: R@1
    was 100% in that order)."""
    gallery_labels = np.repeat(np.arange(4), 25)
    query_labels = np.zeros(40, np.int64)
    query, gallery = np.ones((40, 8), np.float32), np.ones((100, 8), np.float32)
    result = retrieve(query, query_labels, gallery, gallery_labels, (1, 5, 100))
    assert result.recall[1] == pytest.approx(0.25)
    assert result.recall[5] == pytest.approx(1 - math.comb(75, 5) / math.comb(100, 5))
    assert result.recall[100] == pytest.approx(1.0)
    assert recall_at_k(result.topk_indices, query_labels, gallery_labels, (1,))[1] == 1.0  # the lucky order


def test_features_that_differ_only_by_rounding_score_chance():
    """A collapsed encoder's features differ by the rounding of the batch they were computed in (a few units in the
    last place): centred by their mean, that rounding was normalised into unit vectors that ranked the gallery, so
    R@1 depended on the batch size (28.75 at 3 and 16, 25.0 at 1; chance 25). Rows within rounding of the mean tie."""
    rng = np.random.default_rng(0)
    gallery_labels = np.repeat(np.arange(4), 25)
    query_labels = np.repeat(np.arange(4), 10)
    row = rng.normal(size=8).astype(np.float32)
    constant = retrieve(np.tile(row, (40, 1)), query_labels, np.tile(row, (100, 1)), gallery_labels, (1, 5))

    def rounded(count: int) -> np.ndarray:  # the row, each value moved by up to two units in its last place
        return (row + rng.integers(-2, 3, size=(count, 8)) * np.spacing(row)).astype(np.float32)

    noisy = retrieve(rounded(40), query_labels, rounded(100), gallery_labels, (1, 5))
    assert noisy.recall == constant.recall and constant.recall[1] == pytest.approx(0.25)
    signal = np.tile(row, (100, 1)) + 1e-3 * rng.normal(size=(100, 8)).astype(np.float32)  # small but real
    assert not within_rounding(signal, gallery_mean(signal))
    # a row near the mean because the gallery is mostly copies of it is not rounding: the copies still tie at the top
    other = (row + 0.2 * np.abs(row).max() * rng.normal(size=8)).astype(np.float32)
    gallery = np.vstack([np.tile(row, (3000, 1)), other[None]])
    labels = np.r_[np.zeros(3000, np.int64), 1]
    found = retrieve(row[None], np.zeros(1, np.int64), gallery, labels, (1,))
    assert found.recall[1] == 1.0 and found.topk_indices[0, 0] == 0


def test_two_stream_averages_similarities():
    query_a, query_labels, gallery_a, gallery_labels = _data(seed=4)
    rng = np.random.default_rng(5)
    query_b = (query_a[:, ::-1] + rng.normal(size=query_a.shape)).astype(np.float32)
    gallery_b = (gallery_a[:, ::-1] + rng.normal(size=gallery_a.shape)).astype(np.float32) * 10  # other scale
    ks = (1, 5, 10, 20)
    expected, neighbours = brute_force([query_a, query_b], query_labels, [gallery_a, gallery_b], gallery_labels, ks)
    fused = retrieve([query_a, query_b], query_labels, [gallery_a, gallery_b], gallery_labels, ks,
                     query_chunk=7, gallery_chunk=50)
    assert fused.recall == expected
    np.testing.assert_array_equal(fused.topk_indices, neighbours)
    single = retrieve(query_a, query_labels, gallery_a, gallery_labels, ks)
    assert not np.array_equal(single.topk_indices, fused.topk_indices)


def test_recall_definition_any_of_k():
    topk = np.array([[3, 1, 2], [0, 1, 2]])
    gallery_labels = np.array([0, 1, 1, 2])
    assert recall_at_k(topk, np.array([1, 2]), gallery_labels, (1, 2, 3)) == {1: 0.0, 2: 0.5, 3: 0.5}


def test_k_capped_at_gallery_size_and_bad_features():
    query, query_labels, gallery, gallery_labels = _data(seed=6, num_gallery=5)
    result = retrieve(query, query_labels, gallery, gallery_labels, (1, 20))
    assert result.topk_indices.shape == (len(query), 5)
    assert result.recall[20] == float(np.isin(query_labels, gallery_labels).mean())
    bad = gallery.copy()
    bad[0, 0] = np.nan
    with pytest.raises(DataError, match="NaN"):
        topk_neighbours(query, bad, 3)
    with pytest.raises(DataError, match="expected"):
        topk_neighbours([query, query], [gallery, gallery[:3]], 3)


def _tied_data(seed=7, num_query=30, num_gallery=203, dim=24, classes=5):
    """Random features where most gallery rows have exact duplicates elsewhere (ties inside and across chunks,
    at and around the k-th place), some queries equal to gallery rows."""
    query, query_labels, gallery, gallery_labels = _data(seed, num_query, num_gallery, dim, classes)
    rng = np.random.default_rng(seed)
    sources = rng.integers(0, 20, num_gallery - 20)
    gallery[20:] = np.where(rng.random((num_gallery - 20, 1)) < 0.7, gallery[sources], gallery[20:])
    query[::3] = gallery[rng.integers(0, 20, len(query[::3]))]
    return query, query_labels, gallery, gallery_labels


@pytest.mark.parametrize("dim", [8, 100])
@pytest.mark.parametrize("threads", [1, 2])
def test_same_answer_for_every_chunk_layout_thread_count_and_gallery_order(threads, dim):
    """Identical rows score identically wherever they fall in a block (the AVX-512 fault: R@5 0.643 against 0.894):
    every chunk layout and thread count gives the same bits, equal to the brute-force reference with its tie rule,
    and a permuted gallery gives the same R@k and scores, its neighbour lists the reference's on that order."""
    query, query_labels, gallery, gallery_labels = _tied_data(dim=dim)
    ks = (1, 5, 10, 20)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = [retrieve(query, query_labels, gallery, gallery_labels, ks, query_chunk=qc, gallery_chunk=gc)
                   for qc, gc in [(10**6, 10**6), (1, 1), (7, 13), (4, 64), (30, 202), (16, 8192)]]
        order = np.random.default_rng(8).permutation(len(gallery))
        permuted = retrieve(query, query_labels, gallery[order], gallery_labels[order], ks, query_chunk=5,
                            gallery_chunk=17)
    finally:
        torch.set_num_threads(previous)
    expected, neighbours = brute_force([query], query_labels, [gallery], gallery_labels, ks)
    for result in results:
        assert result.recall == pytest.approx(expected, abs=1e-12)
        np.testing.assert_array_equal(result.topk_indices, neighbours)
        np.testing.assert_array_equal(result.topk_scores, results[0].topk_scores)
        assert result.recall == results[0].recall
    expected_permuted, neighbours_permuted = brute_force([query], query_labels, [gallery[order]],
                                                         gallery_labels[order], ks)
    np.testing.assert_array_equal(permuted.topk_indices, neighbours_permuted)
    np.testing.assert_array_equal(permuted.topk_scores, results[0].topk_scores)
    assert permuted.recall == pytest.approx(results[0].recall, abs=1e-12)
    assert permuted.recall == pytest.approx(expected_permuted, abs=1e-12)
    assert len(set(map(tuple, gallery))) < len(gallery) * 0.6  # many ties


def test_exact_scores_do_not_depend_on_position_or_block_shape():
    """A row's quantised unit vector is the same alone or inside any block; the float64 product of such rows is
    the exact dot product (math.fsum of the exact products), for every block shape BLAS may pick."""
    rng = np.random.default_rng(9)
    rows = (rng.normal(size=(67, 1024)) * rng.uniform(0.01, 100, size=(67, 1))).astype(np.float32) + 2
    mean = gallery_mean(rows)
    units = unit_rows(rows, mean)
    for start in (0, 1, 5, 33):
        np.testing.assert_array_equal(unit_rows(rows[start:start + 3], mean), units[start:start + 3])
    assert np.all(units * 2.0 ** 24 == np.rint(units * 2.0 ** 24))
    np.testing.assert_allclose(np.linalg.norm(units.astype(np.float64), axis=1), 1, atol=1e-6)
    exact = np.array([[math.fsum(a * b) for b in units.astype(np.float64)] for a in units[:5].astype(np.float64)])
    double = units.astype(np.float64)
    for width in (1, 3, 16, 67):
        blocks = np.concatenate([double[:5] @ double[s:s + width].T for s in range(0, 67, width)], axis=1)
        np.testing.assert_array_equal(blocks, exact)
    assert gallery_mean(rows[::-1]).tobytes() == mean.tobytes()  # order-free mean
    np.testing.assert_allclose(mean, rows.astype(np.float64).mean(axis=0), rtol=1e-12)
    assert tree_sum(np.array([1.0, 2.0, 3.0]), 0) == 6.0


def test_labels_of_any_kind_and_features_of_another_width():
    """Class names as labels were a torch TypeError; labels of another count were a torch size error, or ignored;
    a query one column wide was broadcast against the gallery and scored."""
    rng = np.random.default_rng(0)
    gallery, queries = rng.normal(size=(60, 32)), rng.normal(size=(25, 32))
    gallery_labels, query_labels = rng.integers(0, 5, 60), rng.integers(0, 5, 25)
    names = np.array(list("abcde"))
    by_index = retrieve(queries, query_labels, gallery, gallery_labels)
    by_name = retrieve(queries, names[query_labels], gallery, list(names[gallery_labels]))
    assert by_name.recall == by_index.recall
    for width in (16, 1):
        with pytest.raises(DataError, match=f"query and gallery features of view 0 differ in size: {width} vs 32"):
            retrieve(queries[:, :width], query_labels, gallery, gallery_labels)
    with pytest.raises(DataError, match=r"query labels: expected one per video \(25\), got shape \(30,\)"):
        retrieve(queries, rng.integers(0, 5, 30), gallery, gallery_labels, query_chunk=5)
    with pytest.raises(DataError, match=r"gallery labels: expected one per video \(60\), got shape \(59,\)"):
        retrieve(queries, query_labels, gallery, gallery_labels[:59])
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        topk_neighbours(queries, gallery, 0)


def test_retrieval_is_the_same_at_any_scale_of_the_features():
    """unit_rows scales each row by a power of two before normalising: features of an untrained narrow network
    (norms near 1e-19, under the normalisation's floor) rank as they would at any other scale."""
    rows = np.random.default_rng(0).normal(size=(40, 32))
    expected = unit_rows(rows, rows.mean(axis=0))
    for scale in (1e-19, 1e-6, 1e6, 1e18):
        scaled = rows * scale
        np.testing.assert_array_equal(unit_rows(scaled, scaled.mean(axis=0)), expected)
