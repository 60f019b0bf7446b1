"""Atomic writes: a duplicate made by hard link or by copy keeps its content when the source is rewritten."""

from __future__ import annotations

import os

import pytest

from coclr.atomic import atomic_duplicate, atomic_write_text


@pytest.mark.parametrize("links", [True, False], ids=["hard link", "copy"])
def test_duplicate_keeps_its_content_when_the_source_is_rewritten(tmp_path, monkeypatch, links):
    if not links:
        def no_links(*args, **kwargs):
            raise OSError("hard links not supported")

        monkeypatch.setattr(os, "link", no_links)
    source, copy = tmp_path / "last.pth", tmp_path / "best.pth"
    atomic_write_text(copy, "older")
    atomic_write_text(source, "epoch 3")
    atomic_duplicate(source, copy)
    assert copy.read_text() == "epoch 3"
    assert (os.stat(copy).st_ino == os.stat(source).st_ino) == links
    atomic_write_text(source, "epoch 4")
    assert copy.read_text() == "epoch 3"
    assert source.read_text() == "epoch 4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pth", "last.pth"]  # no temporary files left


def test_duplicate_of_a_missing_source_fails_and_leaves_the_target(tmp_path):
    atomic_write_text(tmp_path / "best.pth", "kept")
    with pytest.raises(FileNotFoundError):
        atomic_duplicate(tmp_path / "missing.pth", tmp_path / "best.pth")
    assert (tmp_path / "best.pth").read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["best.pth"]
