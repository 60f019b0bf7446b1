"""Options mean what they say: values that would silently give a wrong result are refused in one line, before any
work (issue 36, 3e). The seed and --seeds cases live beside their commands' tests (test_synth, test_study); embed's
non-finite --mean is refused by the embed work (test_embed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coclr.cli import main
from coclr.errors import DataError
from coclr.video.indexes import folder_index


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


@pytest.mark.parametrize("layout", ["plain", "by_split"])
def test_folder_index_refuses_videos_beside_the_class_folders(tmp_path, capsys, layout):
    """`data index --format folder` silently dropped the videos lying in the root beside class folders."""
    prefix = "train/" if layout == "by_split" else ""
    for path in (f"{prefix}walk/a.mp4", f"{prefix}run/b.mp4", f"{prefix}stray.mp4", f"{prefix}notes.txt"):
        _touch(tmp_path / "videos" / path)
    with pytest.raises(DataError, match=r"1 video\(s\) lie beside the class folders.*stray\.mp4"):
        folder_index(tmp_path / "videos")
    out = tmp_path / "index.json"
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--out", str(out)]) == 2
    assert "stray.mp4" in capsys.readouterr().err and not out.exists()
    (tmp_path / "videos" / prefix / "stray.mp4").unlink()
    assert len(folder_index(tmp_path / "videos").entries) == 2
