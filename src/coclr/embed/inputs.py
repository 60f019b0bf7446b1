"""What ``coclr embed INPUT...`` means by its inputs: video files, folders, list files and glob patterns.

- a video file (a name ending in one of :data:`~coclr.video.decode.VIDEO_EXTENSIONS`): itself;
- a folder: every video under it, recursively (hidden files and folders left out), in sorted order;
- a list file (any other file: ``.txt``, ``.csv``, ``.lst`` ...): one path per line, or a CSV whose first
  column is the path (a header row whose first cell is ``path`` is skipped, as are blank lines and lines
  starting with ``#``); relative paths are taken from the list file's folder. Labels are not needed;
- a glob pattern (``*``, ``?``, ``[``; ``**`` reaches into subfolders): the files it matches, and the videos in
  the folders it matches.

Every video is named by its absolute path (``os.path.abspath``: symbolic links are kept, not resolved), the key
of the output folder's rows; a file reached twice (the same path, or another name of the same real file through
a symbolic link) is embedded once, under the first name met. Folders are followed through symbolic links, but a
link back to a folder being scanned (a loop, e.g. ``again -> .``) or to one already scanned is not followed, and
each is named in one line. An INPUT that names nothing (a missing file, a folder without
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


def expand_inputs(inputs: Sequence[str | os.PathLike[str]], notes: list[str] | None = None) -> list[Path]:
    """The absolute paths of the videos named by ``inputs`` (see the module docstring), in order, each real file
    once. Raises :class:`DataError` naming every input that names no video. ``notes`` receives one line per
    symbolic link not followed and per file named twice."""
    if not inputs:
        raise DataError("no input given: name video files, folders, list files or glob patterns")
    notes = [] if notes is None else notes
    found: list[Path] = []
    empty: list[str] = []
    for item in inputs:
        videos = _expand(str(item), notes)
        if videos:
            found.extend(videos)
        else:
            empty.append(str(item))
    if empty:
        raise DataError("; ".join(_nothing_found(item) for item in empty))
    return _unique_files(found, notes)


def _unique_files(paths: list[Path], notes: list[str]) -> list[Path]:
    """``paths`` without repeats of one real file (first name kept); one note for the other names."""
    first: dict[str, Path] = {}
    repeated: list[str] = []
    for path in paths:
        real = os.path.realpath(path)
        if real not in first:
            first[real] = path
        elif first[real] != path:
            repeated.append(f"{path} (= {first[real]})")
    if repeated:
        more = f" and {len(repeated) - 3} more" if len(repeated) > 3 else ""
        notes.append(f"{len(repeated)} files named twice through symbolic links, embedded once under the first "
                     f"name: {', '.join(repeated[:3])}{more}")
    return list(first.values())


def _expand(item: str, notes: list[str]) -> list[Path]:
    path = Path(item).expanduser()
    if path.is_dir():
        return scan_folder(path, notes)
    if path.is_file():
        return [_absolute(item, Path.cwd())] if is_video_name(path) else read_list_file(path)
    if any(char in item for char in GLOB_CHARACTERS):
        matches = sorted(glob.glob(str(path), recursive=True))
        out: list[Path] = []
        for match in map(Path, matches):
            if match.is_dir():
                out.extend(scan_folder(match, notes))
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


def scan_folder(root: Path, notes: list[str] | None = None) -> list[Path]:
    """Every video file under ``root`` (recursively; hidden entries skipped; symbolic links to folders followed
    unless they lead to a folder already scanned), sorted by path. ``notes`` receives one line naming the links
    not followed."""
    videos = []
    seen = {os.path.realpath(root)}
    loops: list[str] = []
    for directory, folders, files in os.walk(root, followlinks=True):
        keep = []
        names = sorted(name for name in folders if not name.startswith("."))
        # Real folders before links, so that a folder is scanned under its own name when a sibling links to it.
        for name in sorted(names, key=lambda name: os.path.islink(os.path.join(directory, name))):
            real = os.path.realpath(os.path.join(directory, name))
            if real in seen:
                loops.append(f"{os.path.join(directory, name)} -> {real}")
            else:
                seen.add(real)
                keep.append(name)
        folders[:] = sorted(keep)
        videos.extend(_absolute(os.path.join(directory, name), Path.cwd()) for name in files
                      if not name.startswith(".") and is_video_name(name))
    if loops and notes is not None:
        more = f" and {len(loops) - 3} more" if len(loops) > 3 else ""
        notes.append(f"{root}: not followed {len(loops)} symbolic links to folders scanned already (a loop, or a "
                     f"second way to one folder): {', '.join(loops[:3])}{more}")
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
