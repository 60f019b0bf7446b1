"""Options mean what they say: values that would silently give a wrong result are refused in one line, before any
work (issue 36, 3e). The synth seed case lives beside its command's tests (test_synth); embed's
non-finite --mean is refused by the embed work (test_embed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coclr.cli import main
from coclr.errors import ConfigError, DataError
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


def test_repeated_seeds_are_refused_before_any_work(tmp_path, capsys):
    """`study --seeds 0 0` reported one run as two agreeing seeds (+- 0.0)."""
    from coclr.cli.study import check_seeds

    assert check_seeds([2, 0, 1]) == [2, 0, 1]
    with pytest.raises(ConfigError, match="--seeds: 0 given more than once"):
        check_seeds([0, 1, 0])
    out = tmp_path / "study"
    assert main(["study", "--out", str(out), "--seeds", "0", "0"]) == 2
    assert "--seeds: 0 given more than once" in capsys.readouterr().err and not out.exists()
