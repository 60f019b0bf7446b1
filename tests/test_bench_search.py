"""benchmarks/bench_search.py: compare_search() returns the rows compare.py prints, both sides find the same
neighbours (a slow test: it runs the commands)."""

from __future__ import annotations

import pytest

pytest.importorskip("faiss")


@pytest.mark.slow
def test_compare_search_rows(tmp_path):
    from bench_search import compare_search

    rows = compare_search(rows=3000, dim=64, threads=1, repeats=1, work=tmp_path, queries=20)
    assert [row["compared_with"].split(" ")[0] for row in rows] == ["one-shot", "FAISS", "FAISS"]
    for row in rows:
        assert row["ours_s"] > 0 and row["theirs_s"] > 0 and row["ratio"] == row["theirs_s"] / row["ours_s"]
        assert row["runs"] == 2 and row["threads"] == 1
    assert rows[0]["same_neighbours"] is True and rows[1]["same_neighbours"] == 1.0
    assert sum(row.get("faster_faiss_path", False) for row in rows) == 1
