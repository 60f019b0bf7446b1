"""``coclr curate``: the duplicate groups, stretches, outlier scores and thresholds against plain references, the
neighbour graph against a brute-force one, and the whole command on real video files: what it finds, its refusals,
and its page in a real browser (points drawn, a hover shows a thumbnail, a list entry marks its points)."""

from __future__ import annotations

import csv
import functools
import html
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from coclr.curate import groups as rules
from coclr.errors import ConfigError, DataError

# ------------------------------------------------------------------------------------------------ pure rules


def _graph_groups(scores: np.ndarray, neighbours: np.ndarray, threshold: float) -> list[list[int]]:
    """The groups that a graph's pairs (``[N, k]``, -1 for none) at or above ``threshold`` join."""
    rows, columns = np.nonzero((scores >= threshold) & (neighbours >= 0))
    return rules.link_groups(rules.linked(rules.Links.none(len(scores)), rows, neighbours[rows, columns],
                                          scores[rows, columns]))


def test_pairs_over_the_threshold_join_into_groups_through_chains():
    scores = np.array([[0.99, 0.2], [0.99, 0.97], [0.97, 0.1], [0.5, 0.4], [0.3, 0.2]])
    neighbours = np.array([[1, 3], [0, 2], [1, 4], [0, 1], [2, 3]])
    assert _graph_groups(scores, neighbours, 0.95) == [[0, 1, 2]]  # 0-1 and 1-2: one group
    assert _graph_groups(scores, neighbours, 0.98) == [[0, 1]]
    assert _graph_groups(scores, neighbours, 1.0) == []
    one_way = np.array([[0.2, 0.1], [0.97, 0.1], [0.3, 0.2]])  # 1 found 0, 0 did not list 1 (mirrored prints)
    one_way_neighbours = np.array([[2, 1], [0, 2], [0, 1]])
    assert _graph_groups(one_way, one_way_neighbours, 0.95) == [[0, 1]]


def test_links_join_every_pair_in_parts_and_keep_each_rows_best():
    """However the pairs come (a part at a time, either way, repeated), the groups are the union-find's of all of
    them and each row's best is its highest among them, from either side."""
    rng = np.random.default_rng(1)
    count = 40
    first, second = rng.integers(0, count, 30), rng.integers(0, count, 30)
    scores = rng.uniform(0.9, 1.0, 30)
    links = rules.Links.none(count)
    for part in np.array_split(rng.permutation(30), 4):
        links = rules.linked(links, second[part], first[part], scores[part])
    parent = list(range(count))

    def root(row):
        while parent[row] != row:
            row = parent[row]
        return row

    for a, b in zip(first, second):
        parent[max(root(a), root(b))] = min(root(a), root(b))
    groups: dict[int, list[int]] = {}
    for row in range(count):
        groups.setdefault(root(row), []).append(row)
    assert rules.link_groups(links) == sorted(g for g in groups.values() if len(g) > 1)
    assert links.joined.tolist() == [root(row) for row in range(count)]
    for row in range(count):
        mine = scores[(first == row) | (second == row)]
        assert links.best[row] == (mine.max() if len(mine) else -np.inf)
    chain = rules.linked(rules.Links.none(6), np.arange(1, 6), np.arange(5), np.ones(5))  # 5-4-3-2-1-0
    assert chain.joined.tolist() == [0] * 6


def _both_ways(pairs: list[tuple[int, int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    first, second, score = (np.array(column) for column in zip(*pairs))
    return np.concatenate([first, second]), np.concatenate([second, first]), np.concatenate([score, score])


def test_shared_stretches_come_from_mutual_best_windows_per_pair_of_videos_and_skip_whole_duplicates():
    window_video = np.array([0, 0, 0, 1, 1, 2, 2])
    starts = np.array([0.0, 1, 2, 0, 1, 0, 1])
    ends = starts + 2
    pairs = [(1, 3, 0.96), (2, 4, 0.97), (2, 3, 0.955), (1, 6, 0.985), (5, 1, 0.98)]
    none = np.full(3, -1)
    stretches = rules.matching_stretches(*_both_ways(pairs), window_video, starts, ends, none)
    assert [(s.video, s.other) for s in stretches] == [(0, 1), (0, 2)]
    first, second = stretches
    assert (first.start, first.end, first.other_start, first.other_end) == (1.0, 4.0, 0.0, 3.0)
    assert first.similarity == 0.97
    # window 5's best of video 0 is 1, whose best of video 2 is 6: not mutual, so video 2's stretch starts at 1
    assert (second.start, second.end, second.other_start, second.other_end, second.similarity) == (
        1.0, 3.0, 1.0, 3.0, 0.985)
    whole = rules.group_of([[0, 1]], 3)
    assert whole.tolist() == [0, 0, -1]
    assert [(s.video, s.other) for s in rules.matching_stretches(*_both_ways(pairs), window_video, starts, ends,
                                                                  whole)] == [(0, 2)]
    above = [pair for pair in pairs if pair[2] >= 0.965]
    assert rules.matching_stretches(*_both_ways(above), window_video, starts, ends, none)[0].start == 2.0


def test_a_stretch_shared_by_many_videos_is_found_whole_in_every_pair(monkeypatch):
    """The same intro (three windows) on four videos: every pair of them shares it from its first window's start
    to its last's end (each window kept only its single nearest window of any video, if mutual, and the search
    only 4 nearest: most pairs got a window or two), however few candidates a search may hold."""
    from coclr.curate import graph
    from coclr.embed.search import UnitRows
    from coclr.eval.exact import unit_rows

    rng = np.random.default_rng(6)
    intro = rng.normal(size=(3, 32))
    rows = np.concatenate([np.concatenate([intro + 0.001 * rng.normal(size=(3, 32)), rng.normal(size=(5, 32))])
                           for _ in range(4)])  # four videos of 8 windows, the first 3 the intro
    window_video = np.arange(32) // 8
    starts = np.tile(np.arange(8) * 0.5, 4)
    units = unit_rows(rows, rows.mean(axis=0))
    for most in (4096, 1):
        monkeypatch.setattr(graph, "RANGE_PAIRS", most)
        pairs = graph.window_pairs(UnitRows.in_memory(units), 0.99, window_video)
        stretches = rules.matching_stretches(*pairs, window_video, starts, starts + 1.0, np.full(4, -1))
        assert [(s.video, s.other) for s in stretches] == [(a, b) for a in range(4) for b in range(a + 1, 4)]
        assert all((s.start, s.end, s.other_start, s.other_end) == (0.0, 2.0, 0.0, 2.0) for s in stretches)


def test_an_intro_and_an_outro_two_videos_share_are_two_stretches():
    """Two episodes share an intro (0-2 s) and an outro (7.5-9.5 s), their middles unlike: one stretch spanned
    every match of the pair, 0-9.5 s in each, the unshared middle included. Each run of matches that follow one
    another in both videos is a stretch of its own; a window that missed its match inside a run does not split it.
    A video holding a clip twice gives the stretch of the copy its windows match best (mutual best windows: one
    copy; not yet both)."""
    rng = np.random.default_rng(3)
    intro, outro = rng.normal(size=(4, 32)), rng.normal(size=(4, 32))
    episodes = [np.concatenate([intro, rng.normal(size=(11, 32)), outro]) for _ in range(2)]
    episodes[1][1] = rng.normal(size=32)  # (one window of the intro, re-cut: no match)
    clip = rng.normal(size=(4, 32))
    twice = np.concatenate([clip, rng.normal(size=(6, 32)), clip])  # the clip at 0-2.5 s and at 5-7.5 s
    rows = np.concatenate([*episodes, clip, twice])
    window_video = np.repeat([0, 1, 2, 3], [19, 19, 4, 14])
    starts = np.concatenate([np.arange(count) * 0.5 for count in (19, 19, 4, 14)])
    ends = starts + 1.0
    units = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    scores = units @ units.T
    query, row = np.nonzero(scores >= 0.999)
    stretches = rules.matching_stretches(query, row, scores[query, row], window_video, starts, ends, np.full(4, -1))
    seconds = [(s.video, s.other, s.start, s.end, s.other_start, s.other_end) for s in stretches]
    assert seconds == [(0, 1, 0.0, 2.5, 0.0, 2.5), (0, 1, 7.5, 10.0, 7.5, 10.0), (2, 3, 0.0, 2.5, 0.0, 2.5)], seconds
    assert rules.sharing_pairs(stretches) == 2
    # a clip's windows (0-3) whose matches alternate between its two copies in another video (windows 10-13 and
    # 20-23): one run per copy, not one spanning both and what lies between
    times = np.arange(24) * 0.5
    both = rules.runs(np.array([0, 1, 2, 3]), np.array([10, 21, 12, 23]), times, times + 1.0)
    assert [run.tolist() for run in both] == [[0, 2], [1, 3]]


def test_outlier_scores_are_one_minus_the_mean_similarity_of_the_nearest():
    rng = np.random.default_rng(0)
    scores = -np.sort(-rng.uniform(-1, 1, size=(50, 12)), axis=1)
    found = rules.outlier_scores(scores, 10)
    assert np.allclose(found, [1 - np.mean(row[:10]) for row in scores])
    ranking = rules.outlier_ranking(np.array([0.1, 0.5, 0.5, 0.2]))
    assert ranking.tolist() == [1, 2, 3, 0]  # ties to the lower row


def test_the_calibrated_threshold_separates_copies_from_other_videos():
    positives, negatives = np.array([0.95, 0.97, 0.99]), np.array([0.5, 0.7, 0.8])
    assert rules.calibrated_threshold(positives, negatives) == pytest.approx((0.8 + 0.95) / 2)
    threshold = rules.calibrated_threshold(np.array([0.6, 0.9, 0.95]), np.array([0.5, 0.7, 0.8]))
    assert 0.8 < threshold <= 0.9  # one copy lost costs less than two videos passing
    rng = np.random.default_rng(1)
    positives, negatives = rng.normal(0.9, 0.03, 200), rng.normal(0.6, 0.1, 500)
    threshold = rules.calibrated_threshold(positives, negatives)
    gain = lambda t: (positives >= t).mean() - (negatives >= t).mean()  # noqa: E731
    grid = np.linspace(0, 1, 2001)
    assert gain(threshold) == pytest.approx(max(gain(t) for t in grid), abs=1e-9)
    assert rules.separation(positives, negatives, threshold) == pytest.approx(gain(threshold))
    assert rules.separation(np.array([0.9, 0.95]), np.array([0.5, 0.92]), 0.93) == pytest.approx(0.5)
    # two intervals apart that both give the best J: their midpoint fell in the dip between them (J 0 at 0.65, where
    # 0.45 and 0.8 give 0.5), and a calibration that passes was rejected
    positives, negatives = np.array([0.5, 0.9]), np.array([0.4, 0.7])
    threshold = rules.calibrated_threshold(positives, negatives)
    assert rules.separation(positives, negatives, threshold) == pytest.approx(0.5) and 0.4 < threshold <= 0.5
    for seed in range(200):  # overlapping distributions, many ties of J: always at its best
        rng = np.random.default_rng(seed)
        positives, negatives = np.round(rng.normal(0.93, 0.03, 80), 3), np.round(rng.normal(0.85, 0.03, 40), 3)
        found = rules.separation(positives, negatives, rules.calibrated_threshold(positives, negatives))
        assert found == pytest.approx(max(gain(t) for t in np.unique(np.concatenate([positives, negatives]))))


def test_the_recall_threshold_keeps_the_target_share_of_the_copies():
    positives = np.arange(1, 101) / 100.0  # 0.01 .. 1.00
    threshold = rules.recall_threshold(positives)
    assert threshold in positives and (positives >= threshold).mean() == pytest.approx(rules.RECALL_TARGET)
    assert (positives >= threshold + 0.01).mean() < rules.RECALL_TARGET  # the highest that keeps the target
    assert rules.recall_threshold(positives, recall=1.0) == 0.01
    shuffled = np.random.default_rng(0).permutation(positives)
    assert rules.recall_threshold(shuffled) == threshold  # the order of the copies does not matter
    few = np.array([0.7, 0.9, 0.95])  # fewer copies than 1 / (1 - target): the lowest, so every copy is kept
    assert rules.recall_threshold(few) == 0.7


def test_the_distribution_rule_is_an_outer_fence_within_its_range():
    nearest = np.linspace(0.3, 0.5, 101)
    assert rules.distribution_threshold(nearest) == pytest.approx(0.8)  # 0.45 + 3 * 0.1 = 0.75, raised to 0.8
    assert rules.distribution_threshold(np.linspace(0.85, 0.95, 101)) == pytest.approx(0.99)  # capped
    assert rules.distribution_threshold(np.linspace(0.8, 0.84, 101)) == pytest.approx(0.83 + 3 * 0.02)
    with_lost = np.concatenate([np.linspace(0.8, 0.84, 101), [-np.inf] * 60])  # videos unreadable since: no nearest
    assert rules.distribution_threshold(with_lost) == pytest.approx(0.83 + 3 * 0.02)
    assert rules.distribution_threshold(np.full(3, -np.inf)) == rules.FALLBACK_RANGE[1]


# ------------------------------------------------------------------------------------------ the neighbour graph


@pytest.mark.parametrize("stored", ["float32 rows", "with their int8 and bfloat16 copies", "projected",
                                    "projected, ranked when many"])
def test_the_neighbour_graph_is_the_brute_force_one_without_self(stored, monkeypatch):
    """Each first pass the rows allow, queried in chunks, and the range search over the rows projected onto a few
    axes at floors from a prefix of the rows (falling back to the top-k when too many rows reach them): the
    brute-force graph, exact scores, ties to the lower row."""
    from coclr.curate import graph
    from coclr.embed import search
    from coclr.embed.search import UnitRows
    from coclr.eval.exact import unit_rows

    rng = np.random.default_rng(2)
    rows = rng.normal(size=(300, 24)).astype(np.float32)
    if stored.startswith("projected"):  # rows near six axes (as embeddings are), with the sizes made small
        monkeypatch.setattr(graph, "PROJECTED_FROM", 64)
        monkeypatch.setattr(graph, "projection_pays", lambda: True)  # (whatever this CPU's kernels are)
        monkeypatch.setattr(search, "PROJECTED_DIMS", 6)
        rows = rows[:, :6] @ rng.normal(size=(6, 24)) + 0.05 * rows
        if stored.endswith("many"):
            monkeypatch.setattr(graph, "RANGE_PAIRS", 1)
    rows[10] = rows[200]  # an exact duplicate: each finds the other first, and others see a tie
    units = np.ascontiguousarray(unit_rows(rows, None), np.float32)
    stored, kind = (UnitRows.of_array(units) if stored == "float32 rows" else UnitRows.in_memory(units)), stored
    if kind.startswith("projected") and graph.projection(stored) is None:
        assert search_cpu_missing(), "rows near a few axes were not projected"
        pytest.skip("the int8 kernels do not build here")
    monkeypatch.setattr(graph, "QUERY_CHUNK", 64)
    scores, neighbours = graph.neighbour_graph(stored, 5)
    exact = units.astype(np.float64) @ units.astype(np.float64).T
    np.fill_diagonal(exact, -np.inf)
    expected = np.argsort(-exact, axis=1, kind="stable")[:, :5]
    assert np.array_equal(neighbours, expected)
    assert np.array_equal(scores, np.take_along_axis(exact, expected, axis=1).astype(np.float32))
    assert neighbours[10, 0] == 200 and neighbours[200, 0] == 10
    groups = np.arange(300) // 3  # rows of the query's own group are skipped
    _, grouped = graph.neighbour_graph(stored, 3, groups=groups)
    assert not (groups[grouped] == groups[:, None]).any()


def test_the_videos_links_are_every_pair_over_the_threshold(monkeypatch):
    """The vectors' duplicates (--no-fingerprints): every pair of rows at or above the threshold, however few
    candidates a search may hold (the queries then searched fewer at a time, down to one without a limit)."""
    from coclr.curate import graph
    from coclr.embed.search import UnitRows
    from coclr.eval.exact import unit_rows

    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((90, 16))
    vectors[30:60] = vectors[0] + 0.05 * rng.standard_normal((30, 16))  # thirty copies of one video
    units = unit_rows(vectors)
    similar = units.astype(np.float64) @ units.T.astype(np.float64)
    monkeypatch.setattr(graph, "QUERY_CHUNK", 16)
    for threshold in (0.95, 0.2, -1.0):
        first, second = np.nonzero(np.triu(similar >= threshold, 1))
        expected = rules.linked(rules.Links.none(90), first, second, similar[first, second])
        for most in (4096, 1):
            monkeypatch.setattr(graph, "RANGE_PAIRS", most)
            links = graph.video_links(UnitRows.in_memory(units), threshold)
            assert rules.link_groups(links) == rules.link_groups(expected), (threshold, most)
            assert np.array_equal(links.best, expected.best), (threshold, most)


def test_a_row_nearest_to_many_of_its_own_group_still_finds_other_groups():
    """A steady shot's window is nearest to a dozen of its own video's windows: searched among its k + 8 nearest
    only, it found no window of another video (-1), and a shared stretch was never reported. Now the k best rows of
    other groups, as brute force finds them."""
    from coclr.curate import graph
    from coclr.embed.search import UnitRows
    from coclr.eval.exact import unit_rows

    rng = np.random.default_rng(5)
    bases = rng.normal(size=(8, 32))
    rows = np.concatenate([base + 0.01 * rng.normal(size=(25, 32)) for base in bases])  # 8 steady videos
    rows[30:33] = rows[3:6] + 0.05 * rng.normal(size=(3, 32))  # video 1 repeats a stretch of video 0
    groups = np.arange(200) // 25
    units = np.ascontiguousarray(unit_rows(rows.astype(np.float32), None), np.float32)
    scores, neighbours = graph.neighbour_graph(UnitRows.in_memory(units), 4, groups=groups)
    exact = units.astype(np.float64) @ units.astype(np.float64).T
    exact[groups[:, None] == groups[None, :]] = -np.inf
    expected = np.argsort(-exact, axis=1, kind="stable")[:, :4]
    assert np.array_equal(neighbours, expected)
    assert np.array_equal(scores, np.take_along_axis(exact, expected, axis=1).astype(np.float32))
    assert set(neighbours[3:6, 0]) <= set(range(30, 33))
    # fewer rows of other groups than k: every one of them, then -1
    two = np.arange(200) // 199
    scores, neighbours = graph.neighbour_graph(UnitRows.in_memory(units), 4, groups=two)
    assert neighbours[199].tolist() == expected_of(units, two, 199, 4) and neighbours[0, 1] == -1
    assert neighbours[0, 0] == 199 and scores[0, 1] == -np.inf


def expected_of(units: np.ndarray, groups: np.ndarray, row: int, k: int) -> list[int]:
    """The brute-force ``k`` nearest rows of other groups of ``row`` (ties to the lower row)."""
    exact = units.astype(np.float64) @ units[row].astype(np.float64)
    exact[groups == groups[row]] = -np.inf
    return np.argsort(-exact, kind="stable")[:k].tolist()


def test_curation_draws_from_its_rows_in_an_order_their_values_decide():
    """The calibration's sample and the map's colour groups were drawn along the folder's row order: the same videos
    renamed, or listed in another order, gave another threshold and other groups."""
    from types import SimpleNamespace

    from coclr.curate.calibrate import sample_rows
    from coclr.curate.layout import colour_groups

    rng = np.random.default_rng(4)
    rows = rng.normal(size=(120, 16))
    rows[::7] += 3 * rng.normal(size=16)
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    rows[50] = rows[60]  # equal rows: either may be drawn, as alike
    order = rng.permutation(120)
    found = colour_groups(rows)
    assert len(set(found)) > 1 and np.array_equal(colour_groups(rows[order]), found[order])
    sampled = sample_rows(SimpleNamespace(videos=rows), 9, set())
    again = sample_rows(SimpleNamespace(videos=rows[order]), 9, set())
    assert len(sampled) == 9 and [rows[row].tobytes() for row in sampled] == [rows[order][row].tobytes()
                                                                             for row in again]
    stale = {int(sampled[0])}  # a file changed since: left out, the rest drawn the same way
    assert int(sampled[0]) not in sample_rows(SimpleNamespace(videos=rows), 9, stale)


def test_the_map_and_its_groups_are_deterministic_and_separate_far_groups():
    from coclr.curate.layout import colour_groups, layout

    rng = np.random.default_rng(3)
    centres = rng.normal(size=(3, 16)) * 5
    rows = np.concatenate([centre + rng.normal(size=(40, 16)) for centre in centres])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    points, method = layout(rows)
    assert points.shape == (120, 2) and points.min() == 0 and points.max() == 1
    again, _ = layout(rows)
    assert np.array_equal(points, again)
    found = colour_groups(rows)
    assert np.array_equal(found, colour_groups(rows))
    for block in range(3):  # each planted group is one colour group
        assert len(set(found[block * 40:(block + 1) * 40])) == 1
    assert len(set(found)) >= 3 or method == "umap"


# ------------------------------------------------------------------------------------------------ fingerprints


@pytest.fixture(scope="module")
def takes(tmp_path_factory):
    """Eight generated takes (64 px, 48 frames, each its own scene) and every altered copy of the first two, with a
    small untrained encoder whose first block fingerprints them."""
    from coclr.curate.alter import ALTERATIONS, write_altered
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder
    from coclr.synth import SynthConfig, write_videos
    from coclr.video.decode import decode_video_with_rate

    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("takes")
    write_videos(root / "data", SynthConfig(num_classes=2, train_scenes=2, test_scenes=2, actions_per_scene=2,
                                            clips_per_action=1, frames=48, height=64, width=64))
    videos = sorted((root / "data" / "videos").glob("*.mp4"))
    copies = {}
    (root / "copies").mkdir()
    for number, original in enumerate(videos[:2]):
        frames, fps = decode_video_with_rate(original)
        for name in ALTERATIONS:
            copies[(number, name)] = write_altered(frames, fps, name, root / "copies" / f"{number}_{name}.mp4")
    torch.manual_seed(0)
    checkpoint = save_encoder(root / "encoder.pth", build_encoder(width=0.25).eval(),
                              meta={"clip_settings": {"view": "rgb", "length": 8, "size": 32, "stride": 1}})
    return videos, copies, checkpoint


def test_the_best_rows_of_a_prefix_by_the_first_pass_are_its_highest_scores():
    """A chunk's candidates for its floors (``graph._best_first``: the fused range pass over blocks that double, at
    floors that rise): for each query, ``m`` distinct rows of the prefix holding its ``m`` highest first-pass scores
    (the stored product's, ties either way), whether the prefix is all the rows, a part, or only ``m`` rows."""
    from coclr.curate import graph
    from coclr.embed import search_cpu
    from coclr.embed.search import Int8Rows
    from coclr.eval.exact import unit_rows

    if search_cpu_missing():
        pytest.skip("the int8 kernels do not build here")
    library = search_cpu.KERNEL.load()
    rng = np.random.default_rng(12)
    units = unit_rows(rng.normal(size=(500, 40)))
    units[300:310] = units[3]  # ties
    quantised, scales, error, norm = search_cpu.quantise_rows(units)
    queries = search_cpu.Queries(np.concatenate([units[:40], unit_rows(rng.normal(size=(35, 40)))]))
    for prefix, m in ((500, 7), (311, 20), (20, 20)):
        best = graph._best_first(library, Int8Rows(quantised, scales, error, norm), queries, prefix, m)
        stored = search_cpu.scores(library, quantised[:prefix], scales[:prefix], queries).T  # [Q, prefix]
        assert best.shape == (75, m) and best.min() >= 0 and best.max() < prefix
        assert all(len(set(row)) == m for row in best.tolist())
        np.testing.assert_array_equal(np.sort(np.take_along_axis(stored, best, axis=1), axis=1),
                                      np.sort(stored, axis=1)[:, -m:])


def search_cpu_missing() -> bool:
    from coclr.embed import search_cpu

    return search_cpu.KERNEL.load(warn=False) is None


def _slow_links(units: np.ndarray, threshold: float) -> tuple[list[list[int]], np.ndarray]:
    """The fingerprints' groups and each video's best the obvious way: every similarity, either way, at or above
    ``threshold``."""
    from coclr.curate import fingerprint as prints

    count = len(units)
    similar = prints.similarities(units, np.arange(count))
    np.fill_diagonal(similar, -np.inf)
    first, second = np.nonzero(similar >= threshold)
    best = np.full(count, -np.inf)
    for a, b in zip(first, second):
        best[a] = max(best[a], similar[a, b])
        best[b] = max(best[b], similar[a, b])
    links = rules.Links.none(count)
    for a, b in zip(first, second):
        links = rules.linked(links, [a], [b], [similar[a, b]])
    return rules.link_groups(links), best


def _slow_graph(units: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The fingerprints' graph the obvious way: every similarity, sorted (best first, ties to the lower row)."""
    from coclr.curate import fingerprint as prints

    count = len(units)
    similar = prints.similarities(units, np.arange(count))
    np.fill_diagonal(similar, -np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(count), similar.shape), -similar), axis=1)
    order = order[:, :max(0, min(k, count - 1))]
    return np.take_along_axis(similar, order, axis=1), order


@pytest.mark.parametrize("first", ["int8", "bfloat16", "float32"])
def test_the_fingerprint_graphs_are_the_slow_ones_exactly(first, monkeypatch):
    """Ranked (:func:`neighbour_graph`) and every pair at a threshold (:func:`duplicate_links`, a range search, in
    smaller parts where too many pairs reach it), through the mirror, with exact ties, a video without a fingerprint
    and folders smaller than k: the slow graph's exact numbers and rows, the slow groups and bests, whichever first
    pass runs and however the queries are chunked."""
    from coclr.curate import fingerprint as prints
    from coclr.embed import search, search_cpu

    if first != "int8":  # no int8 kernels: the first passes of blocks of scores
        monkeypatch.setattr(search_cpu.KERNEL, "load", lambda warn=True: None)
    if first == "float32":
        monkeypatch.setattr(search, "native_bfloat16", lambda: False)
    elif first == "int8" and search_cpu.KERNEL.load(warn=False) is None:
        pytest.skip("the int8 kernels do not build here")
    monkeypatch.setattr("coclr.curate.graph.QUERY_CHUNK", 64)
    monkeypatch.setattr("coclr.curate.graph.PROJECTED_FROM", 64)  # (300 videos: ranked by the range search)
    monkeypatch.setattr(prints, "DUPLICATE_CHUNK", 50)
    rng = np.random.default_rng(3)
    for count, dim in ((300, 48), (4, 8), (2, 4)):
        found = rng.standard_normal((count, 2, dim)).astype(np.float32)
        copies = np.arange(1, count, 7)
        found[copies] = found[copies - 1] + 0.2 * rng.standard_normal((len(copies), 2, dim))
        found[count // 2, 1] = found[0, 0]  # a mirrored copy of video 0
        found[-1] = found[0]  # a byte-identical one: ties
        found[min(2, count - 1)] = 0.0  # no fingerprint
        units, _ = prints.centred(found)
        for k in (1, 4, count + 2):
            assert np.array_equal(prints.neighbour_graph(units, k), _slow_graph(units, k))
        for threshold in (-0.2, 0.3, 0.7, 0.99):
            for most in (256, 1):
                monkeypatch.setattr(prints, "RANGE_PAIRS", most)
                links = prints.duplicate_links(units, threshold)
                groups, best = _slow_links(units, threshold)
                assert rules.link_groups(links) == groups, (count, threshold, most)
                assert np.array_equal(links.best, best), (count, threshold, most)


def test_wide_fingerprints_are_screened_by_their_principal_axes_with_the_same_graphs(monkeypatch):
    """A full-width encoder's fingerprints (1,024 numbers; here 512) lie near a few principal axes: the range
    search screens their projection (:class:`coclr.embed.search.Projected`) and gives the slow graphs exactly."""
    from coclr.curate import fingerprint as prints
    from coclr.curate import graph
    from coclr.embed import search

    if search_cpu_missing() or not graph.projection_pays():
        pytest.skip("no vector int8 kernels here: the fingerprints are not projected")
    made = []
    original = search.Projected.of.__func__

    def spy(cls, gallery):
        made.append(original(cls, gallery))
        return made[-1]

    monkeypatch.setattr(search.Projected, "of", classmethod(spy))
    monkeypatch.setattr("coclr.curate.graph.PROJECTED_FROM", 64)
    monkeypatch.setattr("coclr.curate.graph.QUERY_CHUNK", 128)
    monkeypatch.setattr(prints, "DUPLICATE_CHUNK", 200)
    rng = np.random.default_rng(5)
    count, dim = 300, 512
    mixing = np.linalg.qr(rng.standard_normal((dim, 24)))[0].T  # 24 axes, and a little of every other direction
    found = (rng.standard_normal((count, 2, 24)) @ mixing + 0.01 * rng.standard_normal((count, 2, dim)))
    copies = np.arange(1, count, 9)
    found[copies] = found[copies - 1] + 0.05 * rng.standard_normal((len(copies), 2, dim))
    found[-1] = found[0]  # ties
    units, _ = prints.centred(found.astype(np.float32))
    for threshold in (0.5, 0.9):
        links = prints.duplicate_links(units, threshold)
        groups, best = _slow_links(units, threshold)
        assert rules.link_groups(links) == groups and np.array_equal(links.best, best)
    assert np.array_equal(prints.neighbour_graph(units, 3), _slow_graph(units, 3))
    assert made and all(screen is not None and screen.basis is not None for screen in made)


def test_a_fingerprint_finds_every_altered_copy_above_every_other_take(takes, tmp_path, monkeypatch):
    """Re-encoded, trimmed, cropped, resized, brightened, sped up, flipped, captioned: each copy's fingerprint is
    nearer its original's than any other take's is to that original (centred over the takes, the mirrored frames
    counted); a second call reads the kept fingerprints without the encoder."""
    from coclr.curate import fingerprint as prints
    from coclr.models.loading import checkpoint_sha256

    videos, copies, checkpoint = takes
    paths = [str(path) for path in videos] + [str(path) for path in copies.values()]
    found, lacking, _ = prints.fingerprints(paths, checkpoint, checkpoint_sha256(checkpoint), tmp_path / "kept",
                                            show=False, workers=2)
    assert lacking == [] and found.shape == (len(paths), 2, 16 * 16)  # width 0.25: 16 channels, 4 x 4 cells
    units, _ = prints.centred(found, found[: len(videos), 0].mean(0))
    similar = prints.similarities(units, np.arange(len(paths)))
    for (number, name), path in copies.items():
        copy = paths.index(str(path))
        others = [similar[number, other] for other in range(len(videos)) if other != number]
        assert similar[number, copy] > max(others), (name, similar[number, copy], max(others))
    mirrored = paths.index(str(copies[(0, "flip")]))
    assert units[0, 0] @ units[mirrored, 1] > units[0, 0] @ units[mirrored, 0]  # matched through the mirror
    monkeypatch.setattr("coclr.curate.graph.QUERY_CHUNK", 5)
    scores, rows = prints.neighbour_graph(units, 3)
    assert np.array_equal((scores, rows), _slow_graph(units, 3))
    (tmp_path / "broken.mp4").write_bytes(b"not a video" * 100)
    some, lacking, _ = prints.fingerprints([str(tmp_path / "absent.mp4"), paths[0], str(tmp_path / "broken.mp4")],
                                           checkpoint, checkpoint_sha256(checkpoint), tmp_path / "kept", show=False)
    assert lacking == [0, 2] and np.array_equal(some[1], found[0]) and not some[[0, 2]].any()
    assert not prints.centred(some)[0][[0, 2]].any()  # no fingerprint: no direction after centring either
    damaged = tmp_path / "kept" / prints.cache_key(paths[3], checkpoint_sha256(checkpoint))
    damaged.write_bytes(b"half a file")  # (not one of ours: made again)
    remade, _, _ = prints.fingerprints(paths, checkpoint, checkpoint_sha256(checkpoint), tmp_path / "kept", show=False)
    assert np.array_equal(remade, found)
    monkeypatch.setattr(prints, "load_stem", lambda checkpoint: pytest.fail("the kept fingerprints were not read"))
    stale = tmp_path / "kept" / f".{damaged.name}.{2 ** 22 + 12345}.a1b2c3.partial"  # (a killed run's: it stayed)
    stale.write_bytes(b"half a fingerprint")
    again, _, _ = prints.fingerprints(paths, checkpoint, checkpoint_sha256(checkpoint), tmp_path / "kept", show=False)
    assert np.array_equal(again, found) and not stale.exists()


# ------------------------------------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """Twelve generated videos and a copy of one under another name, embedded by a small untrained encoder (its
    batch-norm statistics taken from the videos) with one window per 8 frames. (How well near-duplicates that
    differ are found is measured by benchmarks/curate_duplicates.py with trained encoders.)"""
    from coclr.embed.embedder import Embedder
    from coclr.embed.run import embed_videos
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder
    from coclr.synth import SynthConfig, write_videos
    from coclr.video.decode import decode_video

    root = tmp_path_factory.mktemp("curate")
    config = SynthConfig(num_classes=2, train_scenes=2, test_scenes=1, actions_per_scene=2, frames=24, height=48,
                         width=48)
    write_videos(root / "data", config)
    videos = sorted((root / "data" / "videos").glob("*.mp4"))
    shutil.copy(videos[0], root / "data" / "videos" / "copy of first.mp4")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    encoder = build_encoder(width=0.125)
    clips = torch.stack([torch.from_numpy(decode_video(path, short_side=32)[:8, :32, :32]).permute(3, 0, 1, 2)
                         for path in videos]).float() / 255
    for module in encoder.modules():  # statistics of these clips: a random network that is not degenerate
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.momentum = None
            module.reset_running_stats()
    with torch.no_grad():
        encoder.train()((clips - 0.45) / 0.225)
    checkpoint = save_encoder(root / "encoder.pth", encoder.eval(),
                              meta={"clip_settings": {"view": "rgb", "length": 8, "size": 32, "stride": 1}})
    embedder = Embedder(checkpoint, device="cpu", workers=0, short_side=32, window_step=8)
    embed_videos([str(root / "data" / "videos")], root / "embeddings", embedder, progress=False)
    return root, root / "embeddings", videos


@pytest.mark.slow
def test_the_calibration_says_how_many_videos_it_alters(embedded, tmp_path, capsys):
    """--calibrate beyond the folder's videos alters each once: the line said "altered copies of 1000 videos"."""
    from coclr.cli import main

    _, embeddings, videos = embedded
    assert main(["curate", str(embeddings), "--out", str(tmp_path / "all"), "--calibrate", "1000", "--no-windows",
                 "--thumbnails", "0"]) == 0
    said = capsys.readouterr().err
    assert f"calibrating the fingerprints' threshold on altered copies of {len(videos) + 1} videos" in said


def test_the_vectors_calibration_scores_copies_by_the_exact_rule(embedded, tmp_path):
    """A copy's similarity to its video is of the quantised unit rows (coclr.eval.exact), exact in float64: a
    multiple of 2**-48 (a BLAS dot of the raw vectors gave other last bits under AVX2)."""
    from coclr.curate.run import CurateOptions, curate

    _, embeddings, _ = embedded
    curate(embeddings, tmp_path / "out", CurateOptions(calibrate=2, fingerprints=False, windows=False,
                                                       thumbnails=0), show=False)
    positives = [value for values in json.loads((tmp_path / "out" / "curate.json").read_text())["calibration"][
        "positives"].values() for value in values]
    assert positives and all((value * 2.0 ** 48).is_integer() for value in positives)


def test_a_rerun_removes_a_killed_runs_half_written_thumbnail(embedded, tmp_path):
    import subprocess
    import sys

    from coclr.curate.run import CurateOptions, curate

    _, embeddings, _ = embedded
    options = CurateOptions(calibrate=0, fingerprints=False, windows=False, thumbnails=2)
    curate(embeddings, tmp_path / "out", options, show=False)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / "out" / "thumbs" / f".a.gif.{gone}.1f2e.partial"  # as a kill -9 left it, for good
    stale.write_bytes(b"GIF8")
    curate(embeddings, tmp_path / "out", options, show=False)
    assert not stale.exists()


def test_stretches_not_searched_are_said_so_not_counted_as_none(embedded, tmp_path):
    """Without a calibrated windows' threshold no stretch is searched, yet the summary, learn's last lines and its
    report said "0 pair(s) sharing a stretch", and the page nothing: no partial copy found where none was looked for."""
    from coclr.curate.groups import stretches_text
    from coclr.curate.run import CurateOptions, curate

    _, embeddings, _ = embedded
    summary = curate(embeddings, tmp_path / "out", CurateOptions(calibrate=0, fingerprints=False, thumbnails=2),
                     show=False)
    why = "not searched: the windows' threshold is not calibrated"
    assert json.loads((tmp_path / "out" / "curate.json").read_text())["stretches"] == why
    assert f"shared stretches {why}" in str(summary) and "sharing a stretch" not in str(summary)
    assert f"shared stretches (part of one video in another): {why}" in html.unescape(
        (tmp_path / "out" / "index.html").read_text())
    assert stretches_text(0, "searched") == "0 pair(s) sharing a stretch" == stretches_text(0, None)


@pytest.mark.slow
def test_curate_finds_the_copy_ranks_every_video_and_keeps_its_rules(embedded, tmp_path, capsys):
    from coclr.cli import main
    from coclr.curate.run import CurateOptions, curate
    from coclr.runfolder import FolderRefused

    root, embeddings, videos = embedded
    out = tmp_path / "curated"
    assert main(["curate", str(embeddings), "--out", str(out), "--calibrate", "2", "--quiet"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "curate.json").read_text())
    assert f"{record['threshold']:.4f}" in printed and record["rule"] in printed  # calibrated, or said why not
    assert record["rule"].startswith(("calibrated", "the distribution rule (the altered copies were not told"))
    assert record["compared_by"] == "fingerprints" and record["fingerprints"]["without"] == []
    for calibration in (record["fingerprints"]["calibration"], record["calibration"]):  # whole videos, windows
        assert sum(len(v) for v in calibration["positives"].values()) == 20  # 2 videos x 10 alterations
    assert len(list((out / "fingerprints").glob("*.npy"))) == len(videos) + 1
    rows = list(csv.DictReader((out / "duplicates.csv").open()))
    copy = str(root / "data" / "videos" / "copy of first.mp4")
    pair = [row for row in rows if row["path"] in (copy, str(videos[0])) and row["kind"] == "whole"]
    assert len(pair) == 2 and pair[0]["group"] == pair[1]["group"]  # the copy and its original: one group
    assert float(pair[0]["similarity"]) == pytest.approx(1.0)
    ranked = list(csv.DictReader((out / "outliers.csv").open()))
    assert [int(row["rank"]) for row in ranked] == list(range(1, len(videos) + 2))
    assert len({row["path"] for row in ranked}) == len(videos) + 1
    scores = [float(row["score"]) for row in ranked]
    assert scores == sorted(scores, reverse=True)
    assert (out / "index.html").is_file() and list((out / "thumbs").glob("*.gif"))
    before = {p: p.stat().st_mtime_ns for p in (out / "thumbs").iterdir()}
    assert main(["curate", str(embeddings), "--out", str(out), "--calibrate", "2", "--quiet"]) == 0  # again
    assert {p: p.stat().st_mtime_ns for p in (out / "thumbs").iterdir()} == before  # thumbnails kept
    snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".lock" not in p.name}
    with pytest.raises(FolderRefused, match=r"threshold=null \(given 0\.5\)"):
        curate(embeddings, out, CurateOptions(threshold=0.5, calibrate=2), show=False)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".lock" not in p.name} == snapshot
    given = curate(embeddings, tmp_path / "given", CurateOptions(threshold=0.9999999, calibrate=0), show=False)
    assert given.rule == "given" and given.groups <= 1
    kept, state = videos[1].read_bytes(), videos[1].stat()
    try:  # a video that cannot be read now: no fingerprint, said in the summary, nobody's duplicate
        videos[1].write_bytes(b"not a video any more")
        unread = curate(embeddings, tmp_path / "unread", CurateOptions(threshold=-1.0, calibrate=0), show=False)
    finally:
        videos[1].write_bytes(kept)
        os.utime(videos[1], ns=(state.st_atime_ns, state.st_mtime_ns))
    assert unread.unfingerprinted == 1 and "1 video(s) could not be read for a fingerprint" in str(unread)
    assert json.loads((tmp_path / "unread" / "curate.json").read_text())["fingerprints"]["without"] == [
        str(videos[1])]
    assert str(videos[1]) not in (tmp_path / "unread" / "duplicates.csv").read_text()  # even at threshold -1
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(FolderRefused, match="notes.txt"):
        curate(embeddings, mine, CurateOptions(calibrate=0), show=False)
    with pytest.raises(ConfigError, match="--threshold"):
        curate(embeddings, tmp_path / "bad", CurateOptions(threshold=2.0), show=False)
    assert not (tmp_path / "bad").exists()
    assert main(["curate", str(tmp_path / "absent"), "--out", str(tmp_path / "x")]) == 2
    moved = tmp_path / "moved"  # a folder whose encoder is gone: calibration refused before any write
    shutil.copytree(embeddings, moved)
    record = json.loads((moved / "embed.json").read_text())
    record["checkpoint"]["path"] = str(tmp_path / "gone.pth")
    (moved / "embed.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="gone.pth is not there: fingerprints need .* --no-fingerprints"):
        curate(moved, tmp_path / "never", CurateOptions(calibrate=0), show=False)
    with pytest.raises(ConfigError, match="no longer exists.*--calibrate 0"):
        curate(moved, tmp_path / "never", CurateOptions(calibrate=2, fingerprints=False), show=False)
    assert not (tmp_path / "never").exists()
    assert curate(moved, tmp_path / "fence", CurateOptions(calibrate=0, fingerprints=False),
                  show=False).rule.startswith("the distribution rule")
    damaged = tmp_path / "damaged"  # a window of NaN: refused, but only after the output folder was claimed
    shutil.copytree(embeddings, damaged, ignore=shutil.ignore_patterns("search"))
    windows = np.load(damaged / "windows.npy")
    windows[3, 5] = np.nan
    np.save(damaged / "windows.npy", windows)
    with pytest.raises(DataError, match=r"windows\.npy: damaged \(row 3 holds NaN"):
        curate(damaged, tmp_path / "unclaimed", CurateOptions(calibrate=0, threshold=0.9, fingerprints=False),
               show=False)
    assert not (tmp_path / "unclaimed").exists()
    # the windows' threshold, not calibrated by the distribution rule, is null: curate.json was not JSON (NaN)
    record = json.loads((tmp_path / "fence" / "curate.json").read_text(), parse_constant=_not_json)
    assert record["window_threshold"] is None and record["window_rule"].startswith("not calibrated")


def _not_json(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def harness_result(chromium: str, folder: Path, harness: str, budget_ms: int, window: str) -> dict:
    """What ``harness`` (a page that loads ``folder``'s page in a frame and writes its findings as JSON into
    ``<pre id="result">``) found, loaded in headless Chromium from a local server of ``folder``."""
    from test_report import CHROMIUM_FLAGS

    (folder / "harness.html").write_text(harness)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/harness.html"
        dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={folder / 'profile'}",
                              f"--virtual-time-budget={budget_ms}", f"--window-size={window}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=120).stdout
    finally:
        server.shutdown()
    assert '<pre id="result">{' in dom, dom[-500:]
    return json.loads(dom.split('<pre id="result">')[1].split("</pre>")[0].replace("&quot;", '"'))


HARNESS = """<!DOCTYPE html><html><body><iframe id="f" src="curated/index.html" width="1100" height="700"></iframe>
<pre id="result">waiting</pre><script>
const frame = document.getElementById('f');
function pixel(ctx, x, y) { return Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3)); }
frame.onload = () => setTimeout(() => {
  const w = frame.contentWindow, doc = frame.contentDocument, view = w.curateView, D = w.CURATE;
  const canvas = doc.getElementById('canvas'), ctx = canvas.getContext('2d'), r = w.devicePixelRatio;
  const image = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  let drawn = 0; for (let i = 3; i < image.length; i += 4) if (image[i] > 0) drawn++;
  const row = D.thumbs.findIndex(t => t), p = view.toScreen(row), box = canvas.getBoundingClientRect();
  canvas.dispatchEvent(new w.MouseEvent('mousemove', {clientX: box.left + p[0], clientY: box.top + p[1],
                                                      bubbles: true}));
  const tip = doc.getElementById('tip'), img = doc.getElementById('tip-image');
  const entry = doc.querySelector('#duplicates li');
  entry.click();
  const group = D.duplicates[0].members, q = view.toScreen(group[0]);
  const marked = pixel(ctx, Math.round(q[0] * r), Math.round(q[1] * r));
  setTimeout(() => {
    document.getElementById('result').textContent = JSON.stringify({
      ready: doc.body.dataset.ready, points: D.names.length, drawn: drawn, tip: tip.style.display,
      tipName: doc.getElementById('tip-name').textContent, hovered: D.names[row],
      thumbnail: img.complete && img.naturalWidth > 0, marked: view.marked, group: group, pixel: marked,
      chosen: entry.className});
  }, 1500);
}, 500);
</script></body></html>"""


@pytest.mark.slow
def test_the_page_draws_every_point_shows_a_thumbnail_on_hover_and_marks_a_group(embedded, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    from coclr.curate.run import CurateOptions, curate

    _, embeddings, _ = embedded
    curate(embeddings, tmp_path / "curated", CurateOptions(threshold=0.0, calibrate=0, windows=False), show=False)
    found = harness_result(chromium, tmp_path, HARNESS, 15000, "1300,900")
    assert found["ready"] == "yes" and found["drawn"] > 20 * found["points"]  # every point painted
    assert found["tip"] == "block" and found["tipName"] == found["hovered"] and found["thumbnail"]
    assert found["marked"] == found["group"] and found["chosen"] == "path chosen"
    assert found["pixel"] == [0xD6, 0x27, 0x28]  # the marked point is drawn in the mark's colour


def test_names_cannot_break_out_of_the_page(tmp_path):
    from coclr.curate.page import write_page

    name = '</script><img src=x onerror="alert(1)">&amp;'
    data = {"names": [name, "b"], "points": [0, 0, 1, 1], "groups": [0, 1], "nearest": [[], []],
            "duplicates": [], "outliers": [[0, 0.5]], "thumbs": [None, None]}
    write_page(tmp_path, tmp_path / name.replace("/", "|"), [f"line {name}"], data)
    page, script = (tmp_path / "index.html").read_text(), (tmp_path / "data.js").read_text()
    assert "</script><img" not in page and "<img src=x" not in page
    assert "<" not in script and ">" not in script and "&" not in script.replace("\\u0026", "")
    decoded = json.loads(script.split("=", 1)[1].strip().rstrip(";"))
    assert decoded["names"][0] == name  # the name itself, shown as text


NAMES_HARNESS = """<!DOCTYPE html><html><body><iframe id="f" src="page/index.html" width="1000" height="600"></iframe>
<pre id="result">waiting</pre><script>
const frame = document.getElementById('f');
frame.onload = () => setTimeout(() => {
  const w = frame.contentWindow, doc = frame.contentDocument, view = w.curateView, D = w.CURATE;
  const canvas = doc.getElementById('canvas'), box = canvas.getBoundingClientRect();
  function at(row, type, extra) {
    const p = view.toScreen(row);
    const init = {clientX: box.left + p[0], clientY: box.top + p[1], bubbles: true, ...extra};
    (type === 'mouseup' ? w : canvas).dispatchEvent(new (type === 'wheel' ? w.WheelEvent : w.MouseEvent)(type, init));
  }
  const group = Array.from(doc.querySelectorAll('#duplicates li bdi')).map(e => e.textContent);
  const a = view.toScreen(0), b = view.toScreen(4);  // pixels per unit of the layout, across and up
  const axes = [(b[0] - a[0]) / (D.points[8] - D.points[0]), (b[1] - a[1]) / (D.points[9] - D.points[1])];
  at(4, 'mousemove');
  const tip = doc.getElementById('tip').getBoundingClientRect();
  const map = doc.getElementById('map').getBoundingClientRect();
  const inside = tip.left >= map.left && tip.top >= map.top && tip.right <= map.right && tip.bottom <= map.bottom;
  at(2, 'mousemove');
  const more = doc.getElementById('tip-more').textContent;
  const before = view.toScreen(1);
  at(1, 'wheel', {deltaY: -500, cancelable: true});
  const after = view.toScreen(1);
  const chosen = [];
  for (let i = 0; i < 3; i++) { at(2, 'mousedown'); at(2, 'mouseup'); chosen.push(view.chosen); }
  document.getElementById('result').textContent = JSON.stringify({
    ready: doc.body.dataset.ready, names: D.names, group: group, inside: inside, more: more,
    moved: Math.hypot(after[0] - before[0], after[1] - before[1]), scale: view.scale, chosen: chosen, axes: axes,
    heading: doc.querySelector('header h1 bdi').textContent});
}, 500);
</script></body></html>"""


def test_the_page_isolates_names_keeps_its_tip_inside_zooms_on_the_cursor_and_reaches_stacked_videos(tmp_path):
    """A right-to-left override in one name stays inside it (each name a ``<bdi>``), a name's bytes that are not
    UTF-8 reach the script as U+FFFD (a lone surrogate in its data crashed the browser), the tip near the map's
    corner stays on the map, the wheel keeps the spot under the cursor, videos drawn at one spot are each chosen
    in turn by clicking it again, and the map keeps the layout's proportions (it scaled each axis by its side)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    from coclr.curate.page import write_page

    names = ["/v/\u202egnp.mp4", "/v/caf\udce9.mp4", "/v/copy a.mp4", "/v/copy b.mp4", "/v/" + "long name " * 12]
    data = {"names": names, "points": [0.2, 0.3, 0.5, 0.5, 0.4, 0.6, 0.4, 0.6, 1.0, 1.0], "groups": [0, 1, 0, 0, 1],
            "nearest": [[[2, 0.9]], [[0, 0.1]], [[3, 1.0]], [[2, 1.0]], [[0, 0.1]]],
            "duplicates": [{"members": [0, 2, 3], "kind": "whole", "similarity": 0.9}],
            "outliers": [[4, 0.9], [1, 0.8]], "thumbs": [None] * 5}
    (tmp_path / "page").mkdir()
    write_page(tmp_path / "page", Path("/v/\u202efolder"), ["a line"], data)
    found = harness_result(chromium, tmp_path, NAMES_HARNESS, 5000, "1100,800")
    assert found["ready"] == "yes" and found["names"][1] == "/v/caf\ufffd.mp4"
    across, up = found["axes"]  # one scale for both axes (a 1000 x 600 frame stretched the map across by 1.7)
    assert across == pytest.approx(up, rel=1e-6) and across > 100, found["axes"]
    assert found["group"] == [names[0], names[2], names[3]]  # each name its own element
    assert found["heading"] == "\u202efolder"
    assert found["inside"]  # the tip of the corner's video on the map
    assert found["more"].startswith("2 videos at this spot")
    assert found["scale"] > 2.5 and found["moved"] < 2  # zoomed in, the point under the cursor where it was (it
    # moved 34 px; the event gives the cursor in whole pixels)
    assert sorted(found["chosen"][:2]) == [2, 3] and found["chosen"][2] == found["chosen"][0]  # in turn


def test_the_command_line_is_generated_from_the_options():
    import dataclasses

    from coclr.cli import build_parser
    from coclr.cli._options import options_from_flags
    from coclr.curate.run import CurateOptions

    parser = build_parser()
    args = parser.parse_args(["curate", "E", "--out", "D", "--threshold", "0.9", "--no-windows", "--calibrate", "0"])
    assert options_from_flags(CurateOptions, args) == CurateOptions(threshold=0.9, windows=False, calibrate=0)
    assert options_from_flags(CurateOptions, parser.parse_args(["curate", "E", "--out", "D"])) == CurateOptions()
    subparsers = next(a for a in parser._actions if a.dest == "command" or hasattr(a, "choices") and a.choices
                      and "curate" in a.choices)
    text = subparsers.choices["curate"].format_help()
    for field in dataclasses.fields(CurateOptions):  # each option once, with its documentation
        assert f"--{field.name.replace('_', '-')}" in text
        assert field.metadata["help"].split()[0] in text


def test_the_fallback_map_keeps_distances_in_proportion_and_the_page_shows_a_stretch_s_seconds():
    """Each axis of the map was stretched to [0, 1] on its own: a cluster's noise across looked as large as the
    distance between two clusters up. A shared stretch's group listed its videos without the seconds the CSV gives."""
    from coclr.curate.groups import Stretch
    from coclr.curate.layout import layout
    from coclr.curate.page import SCRIPT
    from coclr.curate.run import page_data

    rng = np.random.default_rng(0)
    rows = np.concatenate([np.eye(64)[0] + 0.02 * rng.normal(size=(7, 64)),  # (fewer than UMAP takes)
                           np.eye(64)[1] + 0.02 * rng.normal(size=(7, 64))])
    points, method = layout(rows)
    assert method == "pca"
    spans = np.ptp(points, axis=0)
    assert max(spans) == pytest.approx(1.0) and min(spans) < 0.2  # (the clusters' noise across, to scale)
    low = np.argmin(spans)
    assert points[:, low].min() + points[:, low].max() == pytest.approx(1.0)  # the narrower axis centred
    data = page_data(["a", "b"], np.zeros((2, 2)), np.zeros(2, int), np.zeros((2, 1)), np.array([[1], [0]]), [],
                     [Stretch(0, 1, 1.28, 1.92, 0.64, 1.28, 0.74)], np.zeros(2), np.array([0, 1]), {}, 2, np.zeros(2))
    assert data["duplicates"][0]["seconds"] == ["1.280-1.920", "0.640-1.280"]
    assert "group.seconds[at] + ' s)'" in SCRIPT


def test_brighten_gives_every_level_the_formula_s_value_on_any_layout():
    """The brightened copy looks every level up: the same bytes as the formula computed in float32 (brighter by 40
    levels, a fifth more contrast, clipped, truncated), on a contiguous video, a trimmed view and an odd size."""
    from coclr.curate.alter import brighten, trim

    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, (12, 17, 23, 3), dtype=np.uint8)
    video[0, 0, :3] = [[0, 1, 2], [179, 180, 181], [212, 213, 255]]  # below, at and past the clip

    def formula(frames: np.ndarray) -> np.ndarray:
        return np.clip(frames.astype(np.float32) * 1.2 + 40, 0, 255).astype(np.uint8)

    for frames in (video, trim(video), video[:, 1:, ::2]):
        out = brighten(frames)
        assert out.dtype == np.uint8 and out.shape == frames.shape and np.array_equal(out, formula(frames))


def test_an_embed_folder_being_written_or_left_unmerged_is_refused_before_any_write(embedded, tmp_path):
    from coclr.curate.run import CurateOptions, curate
    from coclr.errors import DataError

    _, embeddings, _ = embedded
    folder = shutil.copytree(embeddings, tmp_path / "embeddings")
    options = CurateOptions(calibrate=0, fingerprints=False, windows=False)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom coclr.embed.output import EMBED_FOLDER\n"
                               "from coclr.runfolder import folder_lock\nwith folder_lock(sys.argv[1], EMBED_FOLDER):\n"
                               "    print('held', flush=True); time.sleep(60)", str(folder)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"  # an embed writing the folder now
        with pytest.raises(DataError, match="another coclr embed is writing this folder"):
            curate(folder, tmp_path / "out", options, show=False)
    finally:
        holder.kill()
        holder.wait()
    (folder / "chunks").mkdir(exist_ok=True)
    shutil.copy(folder / "videos.npy", folder / "chunks" / "00000-left.npz")  # a stopped run's results
    with pytest.raises(DataError, match="not merged yet .* run the same coclr embed command again"):
        curate(folder, tmp_path / "out", options, show=False)
    assert not (tmp_path / "out").exists()


def test_altered_copies_belong_to_their_video_whatever_its_row(embedded, tmp_path):
    from coclr.curate.calibrate import altered_copies, video_key
    from coclr.embed.embedder import Embedder
    from coclr.embed.output import Embeddings, read_settings
    from coclr.embed.run import embed_videos

    root, embeddings, videos = embedded
    first = Embeddings(embeddings)
    made = altered_copies(first, [0], tmp_path / "calibration")
    assert {path.name.split("_")[0] for _, _, path in made} == {video_key(first.video_records[0])}
    # The folder embedded again without its first video: row 0 is now another video, which gets copies of its own.
    settings = read_settings(embeddings)
    embedder = Embedder(settings["checkpoint"]["path"], device="cpu", workers=0, short_side=32, window_step=8)
    embed_videos([str(path) for path in videos[1:]], tmp_path / "again", embedder, progress=False)
    again = Embeddings(tmp_path / "again")
    assert again.video_records[0]["path"] == str(videos[1])
    remade = altered_copies(again, [0], tmp_path / "calibration")
    assert not {path for _, _, path in made} & {path for _, _, path in remade}
    assert all(path.is_file() for _, _, path in made + remade)


def test_making_the_altered_copies_shows_its_progress(embedded, tmp_path, capsys):
    """Minutes of one-thread encoding showed one line and nothing more (a user killed it twice)."""
    from coclr.curate.calibrate import altered_copies
    from coclr.embed.output import Embeddings

    altered_copies(Embeddings(embedded[1]), [0, 1], tmp_path / "calibration", show=True)
    assert "altered copies" in capsys.readouterr().err


def test_a_folder_of_two_videos_is_refused_in_one_line(embedded, tmp_path):
    from coclr.curate.run import curate
    from coclr.embed.embedder import Embedder
    from coclr.embed.output import read_settings
    from coclr.embed.run import embed_videos

    _, embeddings, videos = embedded
    settings = read_settings(embeddings)
    embedder = Embedder(settings["checkpoint"]["path"], device="cpu", workers=0, short_side=32, window_step=8)
    embed_videos([str(path) for path in videos[:2]], tmp_path / "two", embedder, progress=False)
    with pytest.raises(ConfigError, match="2 video.s. embedded; .* needs at least 3 .of two, each is the other's "
                                          "opposite"):
        curate(tmp_path / "two", tmp_path / "out", show=False)
    assert not (tmp_path / "out").exists()


def test_copies_of_one_video_are_one_group_without_calibrating(embedded, tmp_path):
    """Each of them is the folder's mean, so every centred fingerprint is zero and no similarity joins them: the
    folder is said to hold one video's copies (it was "0 groups", after calibrating on copies). Alike vectors alone
    do not say so (a collapsed encoder gives every video one vector): learn's tests cover that."""
    from coclr.curate.run import ALIKE_RULE, curate
    from coclr.embed.embedder import Embedder
    from coclr.embed.output import read_settings
    from coclr.embed.run import embed_videos

    _, embeddings, videos = embedded
    for number in range(4):
        shutil.copy(videos[1], tmp_path / f"take {number}.mp4")
    settings = read_settings(embeddings)
    embedder = Embedder(settings["checkpoint"]["path"], device="cpu", workers=0, short_side=32, window_step=8)
    embed_videos([str(tmp_path / f"take {number}.mp4") for number in range(4)], tmp_path / "same", embedder,
                 progress=False)
    summary = curate(tmp_path / "same", tmp_path / "out", show=False)
    assert (summary.groups, summary.duplicates, summary.rule) == (1, 4, ALIKE_RULE)
    with (tmp_path / "out" / "duplicates.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert sorted(Path(row["path"]).name for row in rows) == [f"take {number}.mp4" for number in range(4)]
    assert {row["group"] for row in rows} == {"1"} and {float(row["similarity"]) for row in rows} == {1.0}
    record = json.loads((tmp_path / "out" / "curate.json").read_text())
    assert not (tmp_path / "out" / "calibration").exists()  # no copies made for a threshold that cannot apply
    assert record["stretches"] == "not searched: one group holds every video"
    with (tmp_path / "out" / "outliers.csv").open() as file:  # copies are each other's nearest, not unlike the rest
        assert {float(row["score"]) for row in csv.DictReader(file)} == {0.0}
    data = json.loads((tmp_path / "out" / "data.js").read_text().split("=", 1)[1].strip().rstrip(";"))
    assert all(score == 1.0 for near in data["nearest"] for _, score in near) and len(data["nearest"][0]) == 3
    assert data["points"] == [0.5] * 8  # the one spot in the middle of the map


def _embedded_with(embedded, folder: Path, paths: list[Path]) -> Path:
    """``paths`` embedded as the ``embedded`` folder was, into ``folder``."""
    from coclr.embed.embedder import Embedder
    from coclr.embed.output import read_settings
    from coclr.embed.run import embed_videos

    settings = read_settings(embedded[1])
    embedder = Embedder(settings["checkpoint"]["path"], device="cpu", workers=0, short_side=32, window_step=8)
    embed_videos([str(path) for path in paths], folder, embedder, progress=False)
    return folder


def test_the_groups_hold_every_pair_over_the_threshold_whatever_the_neighbours(embedded, tmp_path):
    """Three byte-identical copies of a video and three of its re-encode (every pair of the six above the
    threshold) are one group with --neighbours 1 as with 5: the groups come from every pair that reaches the
    threshold, --neighbours only bounds the lists shown (it made one group of each three)."""
    from coclr.curate.alter import write_altered
    from coclr.curate.run import CurateOptions, curate
    from coclr.video.decode import decode_video, probe_video

    _, _, videos = embedded
    (tmp_path / "v").mkdir()
    for number in range(3):
        shutil.copy(videos[1], tmp_path / "v" / f"a{number}.mp4")
    write_altered(decode_video(videos[1]), probe_video(videos[1]).fps, "reencode", tmp_path / "b.mp4")
    for number in range(3):
        shutil.copy(tmp_path / "b.mp4", tmp_path / "v" / f"b{number}.mp4")
    folder = _embedded_with(embedded, tmp_path / "e", sorted((tmp_path / "v").glob("*.mp4")) + videos[2:8])
    found = {}
    for neighbours in (1, 5):
        options = CurateOptions(threshold=0.75, windows=False, neighbours=neighbours, thumbnails=0)
        curate(folder, tmp_path / f"out{neighbours}", options, show=False)
        with (tmp_path / f"out{neighbours}" / "duplicates.csv").open() as file:
            found[neighbours] = [(row["group"], Path(row["path"]).name, row["similarity"])
                                 for row in csv.DictReader(file)]
        first = next(group for group, name, _ in found[neighbours] if name == "a0.mp4")
        assert {name for group, name, _ in found[neighbours] if group == first} == {
            f"{copy}{number}.mp4" for copy in "ab" for number in range(3)}, (neighbours, found[neighbours])
    assert found[1] == found[5]


def test_identical_rows_reach_any_threshold_up_to_one():
    """A quantised unit row with itself scores 1 less its rounding (0.99999997 for some rows, 1.00000003 for
    others): every such score reaches the floor of a threshold of 1 (:func:`~coclr.curate.groups.reach_floor`)."""
    from coclr.eval.exact import unit_rows

    rng = np.random.default_rng(4)
    for dim in (16, 128, 1024):
        units = unit_rows(rng.standard_normal((2000, dim))).astype(np.float64)
        itself = np.einsum("ij,ij->i", units, units)
        assert itself.min() < 1.0 < itself.max()  # (both ways: the rounding is not one-sided)
        assert itself.min() >= rules.reach_floor(1.0, dim) and rules.reach_floor(1.0, dim) > 1 - 1e-5


def test_byte_identical_copies_are_duplicates_at_threshold_one_and_a_given_threshold_is_shown_as_given(
        embedded, tmp_path, capsys):
    """--threshold 1 groups every byte-identical copy, whichever way its rows' rounding fell (some pairs scored
    0.99999997 and were left out); a given 0.99999 is printed so, not as "1.0000"."""
    from coclr.curate.run import CurateOptions, curate

    _, _, videos = embedded
    (tmp_path / "v").mkdir()
    for number in range(1, 7):
        for copy in "ab":
            shutil.copy(videos[number], tmp_path / "v" / f"{number}{copy}.mp4")
    folder = _embedded_with(embedded, tmp_path / "e", sorted((tmp_path / "v").glob("*.mp4")) + videos[7:10])
    for fingerprints in (True, False):
        options = CurateOptions(threshold=1.0, fingerprints=fingerprints, windows=False, thumbnails=0)
        summary = curate(folder, tmp_path / f"out{fingerprints}", options, show=False)
        with (tmp_path / f"out{fingerprints}" / "duplicates.csv").open() as file:
            groups: dict[str, set[str]] = {}
            for row in csv.DictReader(file):
                groups.setdefault(row["group"], set()).add(Path(row["path"]).name)
        assert sorted(map(sorted, groups.values())) == [[f"{number}a.mp4", f"{number}b.mp4"]
                                                        for number in range(1, 7)], fingerprints
    summary = curate(folder, tmp_path / "close", CurateOptions(threshold=0.99999, windows=False, thumbnails=0),
                     show=True)
    assert "threshold 0.99999 (given)" in str(summary)
    assert "near-duplicate threshold 0.99999 (given)" in capsys.readouterr().err


def test_solid_colour_videos_match_only_their_own_colour_and_a_fingerprint_of_zeros_is_none(embedded, tmp_path,
                                                                                               monkeypatch):
    """Black, white and red have no layout (standardised, each is all zeros, and its fingerprint was the encoder's
    alone: they were one group); each is its colour, so two copies of black are a group and nothing else is. A
    fingerprint of zeros (an encoder's first block that gives nothing) is none: listed as without."""
    from coclr.curate import fingerprint as prints
    from coclr.curate.run import CurateOptions, curate
    from coclr.models.loading import checkpoint_sha256
    from coclr.video.decode import write_mp4

    _, embeddings, videos = embedded
    (tmp_path / "v").mkdir()
    for name, colour in (("black", (0, 0, 0)), ("black again", (0, 0, 0)), ("white", (255, 255, 255)),
                         ("red", (200, 20, 20)), ("dark", (12, 12, 12))):
        write_mp4(tmp_path / "v" / f"{name}.mp4", np.full((24, 48, 48, 3), colour, np.uint8), 8)
    folder = _embedded_with(embedded, tmp_path / "e", sorted((tmp_path / "v").glob("*.mp4")) + videos[2:6])
    summary = curate(folder, tmp_path / "out", CurateOptions(threshold=0.5, windows=False, thumbnails=0),
                     show=False)
    with (tmp_path / "out" / "duplicates.csv").open() as file:
        groups: dict[str, set[str]] = {}
        for row in csv.DictReader(file):
            groups.setdefault(row["group"], set()).add(Path(row["path"]).name)
    assert {"black.mp4", "black again.mp4"} in groups.values(), groups
    assert all(name not in group for group in groups.values() for name in ("white.mp4", "red.mp4", "dark.mp4"))
    record = json.loads((tmp_path / "out" / "curate.json").read_text())
    assert sorted(Path(path).name for path in record["fingerprints"]["solid_colour"]) == [
        "black again.mp4", "black.mp4", "dark.mp4", "red.mp4", "white.mp4"]
    assert record["fingerprints"]["without"] == [] and summary.unfingerprinted == 0
    # calibrated on copies of black and of another video: black's copies have no layout, so one video's copies
    # were compared (it said two)
    from coclr.curate import calibrate

    rows = {Path(json.loads(line)["path"]).name: number
            for number, line in enumerate((folder / "videos.jsonl").read_text().splitlines())}
    monkeypatch.setattr(calibrate, "sample_rows", lambda embeddings, count, stale: [rows["black.mp4"],
                                                                                   rows[videos[2].name]])
    curate(folder, tmp_path / "calibrated", CurateOptions(calibrate=2, windows=False, thumbnails=0), show=False)
    calibration = json.loads((tmp_path / "calibrated" / "curate.json").read_text())["fingerprints"]["calibration"]
    assert calibration["videos"] == 1
    checkpoint = read_checkpoint(embeddings)
    paths = [str(path) for path in videos[1:5]]
    made = prints.fingerprint_file
    monkeypatch.setattr(prints, "fingerprint_file",
                        lambda path, stem: made(path, stem) * (str(path) != paths[2]))
    found, lacking, colours = prints.fingerprints(paths, checkpoint, checkpoint_sha256(checkpoint), tmp_path / "kept",
                                                  show=False)
    assert lacking == [2] and found[[0, 1, 3]].any(axis=(1, 2)).all() and np.isnan(colours).all()


def read_checkpoint(embeddings: Path) -> str:
    from coclr.embed.output import read_settings

    return read_settings(embeddings)["checkpoint"]["path"]


def test_the_same_command_after_the_folder_was_embedded_again_with_other_settings_continues(embedded, tmp_path):
    """The calibration's copies are embedded as the folder was, into a folder keyed by its settings: after the
    folder was embedded again (here another window step) the same command embeds the kept copies anew (it was
    refused, the copies' embeddings being of the old settings, after new files were written)."""
    from coclr.curate.run import CurateOptions, curate
    from coclr.embed.embedder import Embedder
    from coclr.embed.output import read_settings
    from coclr.embed.run import embed_videos

    _, embeddings, videos = embedded
    checkpoint = read_settings(embeddings)["checkpoint"]["path"]
    options = CurateOptions(calibrate=1, fingerprints=False, thumbnails=0)
    for step in (8, 4):
        shutil.rmtree(tmp_path / "e", ignore_errors=True)
        embedder = Embedder(checkpoint, device="cpu", workers=0, short_side=32, window_step=step)
        embed_videos([str(path) for path in videos[:5]], tmp_path / "e", embedder, progress=False)
        summary = curate(tmp_path / "e", tmp_path / "out", options, show=False)
        assert summary.rule != "given" and summary.videos == 5
    kept = sorted(path.name for path in (tmp_path / "out" / "calibration").iterdir())
    assert kept[0].startswith("embeddings-") and kept[1].startswith("embeddings-") and kept[2:] == ["videos"]


def test_videos_that_cannot_be_read_are_listed_and_the_status_says_so(embedded, tmp_path, capsys):
    from coclr.cli import EXIT_SOME_FAILED, main

    _, embeddings, _ = embedded
    folder = shutil.copytree(embeddings, tmp_path / "embeddings")
    records = [json.loads(line) for line in (folder / "videos.jsonl").read_text().splitlines()]
    records[1]["path"] = str(tmp_path / "gone.mp4")  # a video removed since it was embedded
    (folder / "videos.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    assert main(["curate", str(folder), "--out", str(tmp_path / "out"), "--calibrate", "0", "--no-windows",
                 "--quiet"]) == EXIT_SOME_FAILED
    printed = capsys.readouterr().out
    assert "1 video(s) could not be read for a fingerprint" in printed and "1 video(s) changed or removed" in printed
    assert json.loads((tmp_path / "out" / "curate.json").read_text())["fingerprints"]["without"] == [records[1]["path"]]


def test_the_windows_threshold_is_calibrated_among_windows():
    """The windows' threshold was the videos' (calibrated on whole-video vectors, centred by the videos' mean) and
    applied to windows centred by theirs, another scale: every pair of four distinct clips "shared a stretch".
    Each copy's window is now matched to its original's most similar window (a trim moves them), in the windows'
    own space."""
    from types import SimpleNamespace

    from coclr.curate.calibrate import WindowSpace, _threshold, window_positives
    from coclr.eval.exact import unit_rows

    rng = np.random.default_rng(0)
    raw = rng.normal(size=(6, 16))  # 3 videos of 2 windows
    mean = raw.mean(axis=0)
    space = WindowSpace(unit_rows(raw, mean), mean, np.array([0, 0, 1, 1, 2, 2]),
                        nearest=np.array([0.1, 0.2, 0.0, 0.15, 0.05, 0.1]))
    copy = raw[[1, 0]] + rng.normal(scale=0.01, size=(2, 16))  # video 0's windows, in another order, barely altered
    copied = SimpleNamespace(windows=copy, window_records=[{"video": 0}, {"video": 0}],
                             row_of=lambda path: 0 if path == "c.mp4" else None)
    positives = window_positives(copied, [(0, "crop", "c.mp4"), (1, "crop", "gone.mp4")], space)
    assert list(positives) == ["crop"] and len(positives["crop"]) == 2 and min(positives["crop"]) > 0.99
    result = _threshold(positives, space.nearest, 1, "embedded")
    assert result["threshold"] is not None and 0.2 < result["threshold"] <= min(positives["crop"])


def test_solid_colours_a_few_levels_apart_do_not_chain_black_to_white():
    """Every pair within 8 levels was joined, so greys 6 levels apart chained black, grey and white into one group."""
    greys = np.array([[level] * 3 for level in range(0, 256, 6)], np.float64)
    colours = np.concatenate([greys, np.full((1, 3), np.nan), [[3.0, 3.0, 3.0]]])
    groups = rules.link_groups(rules.colour_links(colours, 8.0))
    assert all(np.ptp(colours[group, 0]) <= 16 for group in groups)  # each within twice the tolerance
    assert [0, len(colours) - 1] == [row for row in groups[0] if row in (0, len(colours) - 1)]  # black's copy
    assert len(colours) - 2 not in {row for group in groups for row in group}  # a video of no solid colour


def test_the_page_rounds_each_score_once():
    """data.js holds the scores rounded to the digits the page shows: rounded to four first, then by the page to
    three, 0.83346 showed as 0.834 beside the CSV's 0.833460."""
    from coclr.curate.page import PAGE_DIGITS, SCRIPT
    from coclr.curate.run import page_data

    assert SCRIPT.count("toFixed(") == SCRIPT.count(f"toFixed({PAGE_DIGITS})") == 3
    scores = np.array([[0.83346, 0.502507]])
    data = page_data(["a", "b"], np.zeros((2, 2)), np.zeros(2, int), np.vstack([scores, scores]),
                     np.array([[1, -1], [0, -1]]), [], [], np.array([0.83346, 0.978462]), np.array([1, 0]), {}, 2,
                     np.zeros(2))
    assert data["outliers"] == [[1, 0.978], [0, 0.833]]
    assert data["nearest"][0] == [[1, 0.833]]


def test_the_page_names_a_folder_given_as_dot_by_its_name(tmp_path, monkeypatch):
    from coclr.curate.page import write_page

    folder = tmp_path / "my clips"
    folder.mkdir()
    monkeypatch.chdir(folder)
    data = {"names": ["a.mp4"], "points": [0.0, 0.0], "groups": [0], "nearest": [[]], "duplicates": [],
            "outliers": [], "thumbs": [None]}
    page = write_page(tmp_path, Path("."), [], data).read_text()
    assert "<title>coclr curate: my clips</title>" in page
    assert f"1 videos of <bdi>{folder}</bdi>" in page
