"""What ``coclr embed INPUT...`` means by its inputs: video files, folders, list files and glob patterns.

- a video file (a name ending in one of :data:`~coclr.video.decode.VIDEO_EXTENSIONS`): itself;
- a folder: every video under it, recursively (hidden files and folders left out), in sorted order;
- a list file (any other file: ``.txt``, ``.csv``, ``.lst`` ...): one path per line, or a CSV whose first
  column is the path (a header row whose first cell is ``path`` is skipped, as are blank lines and lines
  starting with ``#``); relative paths are taken from the list file's folder. Labels are not needed;
- a glob pattern (``*``, ``?``, ``[``; ``**`` reaches into subfolders): the files it matches, and the videos in
  the folders it matches.

Every video is named by its absolute path (``os.path.abspath``: symbolic links are kept, not resolved), the key
of the output folder's rows; duplicates are dropped. An INPUT that names nothing (a missing file, a folder without
videos, a pattern matching nothing) is an error before any work; a path listed in a list file that does not exist
is reported with the failed videos instead, so one stale line does not stop a list of thousands.
"""

from __future__ import annotations

import csv
import glob
import os
from collections.abc import Sequence
from pathlib import Path

from coclr.errors import DataError
from coclr.video.decode import VIDEO_EXTENSIONS

GLOB_CHARACTERS = "*?["


def is_video_name(path: str | Path) -> bool:
    return str(path).lower().endswith(VIDEO_EXTENSIONS)


def expand_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The absolute paths of the videos named by ``inputs`` (see the module docstring), in order, without
    duplicates. Raises :class:`DataError` naming every input that names no video."""
    if not inputs:
        raise DataError("no input given: name video files, folders, list files or glob patterns")
    found: list[Path] = []
    empty: list[str] = []
    for item in inputs:
        videos = _expand(str(item))
        if videos:
            found.extend(videos)
        else:
            empty.append(str(item))
    if empty:
        raise DataError("; ".join(_nothing_found(item) for item in empty))
    return list(dict.fromkeys(found))


def _expand(item: str) -> list[Path]:
    path = Path(item).expanduser()
    if path.is_dir():
        return scan_folder(path)
    if path.is_file():
        return [_absolute(item, Path.cwd())] if is_video_name(path) else read_list_file(path)
    if any(char in item for char in GLOB_CHARACTERS):
        matches = sorted(glob.glob(str(path), recursive=True))
        out: list[Path] = []
        for match in map(Path, matches):
            if match.is_dir():
                out.extend(scan_folder(match))
            elif match.is_file():
                out.append(_absolute(str(match), Path.cwd()))
        return out
    return []


def _nothing_found(item: str) -> str:
    path = Path(item).expanduser()
    if path.is_dir():
        return f"{item}: no videos ({', '.join(VIDEO_EXTENSIONS)}) in this folder or its subfolders"
    if path.is_file():
        return f"{item}: the list file names no video"
    if any(char in item for char in GLOB_CHARACTERS):
        return f"{item}: the pattern matches no file"
    return f"{item}: no such file or folder"


def scan_folder(root: Path) -> list[Path]:
    """Every video file under ``root`` (recursively; hidden entries skipped), sorted by path."""
    videos = []
    for directory, folders, files in os.walk(root, followlinks=True):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        videos.extend(_absolute(os.path.join(directory, name), Path.cwd()) for name in files
                      if not name.startswith(".") and is_video_name(name))
    return sorted(videos)


def read_list_file(path: Path) -> list[Path]:
    """The paths a list file names (see the module docstring), absolute."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise DataError(f"{path}: cannot read the list file: {error}") from None
    base = _absolute(str(path), Path.cwd()).parent
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        whole = _absolute(line, base)
        if whole.is_file():  # a path with a comma in its name
            out.append(whole)
            continue
        cell = next(csv.reader([line]), [""])[0].strip()
        if cell and not (number == 1 and cell.lower() == "path"):
            out.append(_absolute(cell, base))
    return out


def _absolute(listed: str, base: Path) -> Path:
    path = Path(listed).expanduser()
    return Path(os.path.abspath(path if path.is_absolute() else base / path))
