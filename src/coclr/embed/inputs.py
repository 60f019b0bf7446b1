"""What ``coclr embed INPUT...`` means by its inputs: video files, folders, list files and glob patterns.

Which files are videos is one rule, :func:`coclr.video.decode.why_not_video`: a name ending in one of
:data:`~coclr.video.decode.VIDEO_EXTENSIONS`, or any file PyAV opens as a video (``.ts``, ``.MTS``, no extension...).

- a file: a video, itself; otherwise a list file: a text file of one path per line, or a CSV whose first column is
  the path, or the ``path`` column its header row names (:func:`coclr.video.indexes.manifest_header`: ``label,path``
  as a manifest), or a line whose first space-separated part is a file (a UCF101 split file's ``path label``);
  blank lines and lines starting with ``#`` are skipped; relative paths are taken from the list file's folder.
  Labels are not needed. A file that is neither (a binary file PyAV cannot read as a video) is that
  input's failure, listed with the failed videos: the others go on;
- a folder: every video under it, recursively (hidden files and folders left out), in sorted order; the files that
  are not videos are counted and named in one line (a few of them, with the reason);
- a glob pattern (``*``, ``?``, ``[``; ``**`` reaches into subfolders, not through links to folders): the videos
  among the files it matches, and the videos in the folders it matches, but in coclr's own output folders below
  where it starts (as a folder scan leaves them out).

Every video is named by its absolute path (``os.path.abspath``: symbolic links are kept, not resolved), the key
of the output folder's rows; a file reached twice (the same path, or another name of the same real file through
a symbolic link) is embedded once, under the file's own name where an input names it so, else the first name met
(and under the name an output folder holds it by, on later runs: :func:`known_names`). Folders are followed through
symbolic links, but a link back to a folder being scanned (a loop, e.g. ``again -> .``) or to one already scanned is
not followed, and each is named in one line. An INPUT that names nothing (a missing file, a folder without videos,
a pattern matching no video, a list file naming no path) is an error before any work; a path listed in a list file
that does not exist is reported with the failed videos instead, so one stale line does not stop a list of
thousands.
"""

from __future__ import annotations

import codecs
import csv
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from coclr.errors import DataError
from coclr.runfolder import left_out_note, scanned_past
from coclr.video.decode import why_not_video
from coclr.video.indexes import manifest_header

GLOB_CHARACTERS = "*?["
TEXT_CHECK_BYTES = 65536
"""How much of a list file is checked for binary data before it is read whole."""
SKIPPED_SHOWN = 3
"""Files named (with the reason) in the one line about the files a folder scan skipped."""


def expand_inputs(inputs: Sequence[str | os.PathLike[str]], notes: list[str] | None = None,
                  unusable: dict[str, str] | None = None) -> list[Path]:
    """The absolute paths of the videos named by ``inputs`` (see the module docstring), in order, each real file
    once. Raises :class:`DataError` naming every input that names nothing. ``notes`` receives one line per
    symbolic link not followed, per file named twice and per folder or pattern with files that are not videos.
    A file that is neither a video nor a text list file goes to ``unusable`` (absolute path -> reason, one line)
    when it is given (``coclr embed`` lists it as that input's failure), else it is a :class:`DataError` too."""
    if not inputs:
        raise DataError("no input given: name video files, folders, list files or glob patterns")
    notes = [] if notes is None else notes
    found: list[Path] = []
    empty: list[str] = []
    bad: dict[str, str] = {}
    for item in inputs:
        videos, problem = _expand(str(item), notes)
        found.extend(videos)
        if problem is not None:
            bad[str(_absolute(str(item), Path.cwd()))] = problem
        elif not videos:
            empty.append(str(item))
    if empty:
        raise DataError("; ".join(_nothing_found(item) for item in empty))
    if bad and unusable is None:
        raise DataError("; ".join(f"{path}: {reason}" for path, reason in bad.items()))
    if unusable is not None:
        unusable.update(bad)
    return _unique_files(found, notes)


def _unique_files(paths: list[Path], notes: list[str]) -> list[Path]:
    """``paths`` with each real file once, at its first place, under its own name where the inputs name it so (else
    the first name met): a link's name may go, the file's stays. One note names the kept name of each and the
    other names."""
    names: dict[str, list[Path]] = {}
    for path in paths:
        names.setdefault(os.path.realpath(path), []).append(path)
    kept = {real: next((path for path in given if str(path) == real), given[0]) for real, given in names.items()}
    repeated = [f"{kept[real]} (also named {', '.join(str(p) for p in dict.fromkeys(given) if p != kept[real])})"
                for real, given in names.items() if len(set(given)) > 1]
    if repeated:
        more = f" and {len(repeated) - 3} more" if len(repeated) > 3 else ""
        notes.append(f"{len(repeated)} files named twice through symbolic links, embedded once, under the file's own "
                     f"name where given, else the first: {', '.join(repeated[:3])}{more}")
    return list(kept.values())


def known_names(paths: Sequence[str], known: Iterable[str], notes: list[str]) -> list[str]:
    """``paths`` with each file that a folder holds a row of under another name (``known``: a link, or a path
    through a linked folder) given that name, so that a file has one row however it is named; one note for them."""
    by_real: dict[str, str] = {}
    for name in known:
        by_real.setdefault(os.path.realpath(name), name)
    out, renamed = [], []
    for path in paths:
        name = by_real.get(os.path.realpath(path), path)
        if name != path:
            renamed.append(f"{path} (as {name})")
        out.append(name)
    if renamed:
        more = f" and {len(renamed) - 3} more" if len(renamed) > 3 else ""
        notes.append(f"{len(renamed)} files the folder holds under another of their names (symbolic links), kept "
                     f"under that name: {', '.join(renamed[:3])}{more}")
    return out


def _expand(item: str, notes: list[str]) -> tuple[list[Path], str | None]:
    """The videos ``item`` names, and why it is unusable (a file neither a video nor a text list) or None."""
    path = Path(item).expanduser()
    if path.is_dir():
        return scan_folder(path, notes), None
    if path.is_file():
        not_video = why_not_video(path)
        if not_video is None:
            return [_absolute(item, Path.cwd())], None
        if not is_text_file(path):
            return [], f"neither a video ({not_video}) nor a text list of paths (it holds binary data)"
        return read_list_file(path), None
    if any(char in item for char in GLOB_CHARACTERS):
        base, matches = glob_matches(path)
        out: list[Path] = []
        skipped: list[tuple[str, str]] = []
        outputs: list[str] = []
        scanned: set[str] = set()
        for match in matches:
            owner = _output_above(base, match)
            if owner is not None:  # (a pattern reached into curate's altered copies that a scan leaves out)
                outputs.append(f"{owner[0]} (coclr {owner[1]})")
                continue
            if match.is_dir():
                if any(os.path.realpath(parent) in scanned for parent in (match, *match.parents)):
                    continue  # (inside a folder matched and scanned already: its videos once)
                scanned.add(os.path.realpath(match))
                out.extend(scan_folder(match, notes))
            elif match.is_file() or match.is_symlink():  # (a link to nothing, or in a loop, is a video that fails
                # with its reason, as in a scan: it was left out in silence)
                reason = why_not_video(match)
                if reason is None:
                    out.append(_absolute(str(match), Path.cwd()))
                else:
                    skipped.append((str(match), reason))
        if outputs:
            notes.append(left_out_note(item, list(dict.fromkeys(outputs))))
        _note_skipped(item, skipped, notes)
        return out, None
    return [], None


def glob_matches(path: Path) -> tuple[Path, list[Path]]:
    """The paths a pattern matches, sorted, and the literal folder it starts from: ``**`` does not follow symbolic
    links to folders (``glob.glob`` did: two links up, ``..``, made the pattern's walk grow without end, and one made
    a name forty folders deep); a hidden entry is matched only by a pattern part that begins with a dot, as
    ``glob.glob`` and a scan have it."""
    parts = path.parts
    literal = next((i for i, part in enumerate(parts) if any(char in part for char in GLOB_CHARACTERS)), len(parts))
    base = Path(*parts[:literal]) if literal else Path(".")
    rest = parts[literal:]
    if not rest:
        return base, [base] if base.exists() else []
    dotted = any(part.startswith(".") for part in rest)
    found = []
    for match in base.glob("/".join(rest)):
        relative = match.relative_to(base).parts
        if not dotted and any(part.startswith(".") for part in relative):
            continue
        found.append(match)
    return base, sorted(found)


def _output_above(base: Path, match: Path) -> tuple[str, str] | None:
    """The first folder from ``base`` down to ``match`` (itself included, where it is a folder) that is the output of
    a command a scan does not enter (:func:`~coclr.runfolder.scanned_past`), and that command; None where none is."""
    folder = base
    for part in match.relative_to(base).parts:
        folder = folder / part
        if not folder.is_dir():
            break
        owner = scanned_past(folder)
        if owner is not None:
            return str(folder), owner
    return None


def _nothing_found(item: str) -> str:
    path = Path(item).expanduser()
    if path.is_dir():
        if not os.access(path, os.R_OK | os.X_OK):
            return f"{item}: the folder cannot be read (permission denied)"
        return f"{item}: no videos in this folder or its subfolders (a file is a video when its name ends in a " \
               "video extension or PyAV opens it as one)"
    if path.is_file():
        return f"{item}: the list file names no video"
    if any(char in item for char in GLOB_CHARACTERS):
        matched = glob_matches(path)[1]
        return f"{item}: the pattern matches no video (only files that are not videos)" if matched else \
            f"{item}: the pattern matches no file"
    return f"{item}: no such file or folder"


def scan_folder(root: Path, notes: list[str] | None = None) -> list[Path]:
    """Every video file under ``root`` (recursively; hidden entries skipped; symbolic links to folders followed
    unless they lead to a folder already scanned; the output folders of coclr's commands not entered:
    :func:`~coclr.runfolder.scanned_past`), sorted by path. ``notes`` receives one line naming the links not followed,
    one naming the output folders left out, and one counting the files that are not videos (a few named, with the
    reason)."""
    videos = []
    seen = {os.path.realpath(root)}
    loops: list[str] = []
    outputs: list[str] = []
    skipped: list[tuple[str, str]] = []
    unreadable: list[str] = []
    for directory, folders, files in os.walk(root, followlinks=True,
                                             onerror=lambda error: unreadable.append(f"{error.filename} "
                                                                                     f"({error.strerror})")):
        keep = []
        names = sorted(name for name in folders if not name.startswith("."))
        # Real folders before links, so that a folder is scanned under its own name when a sibling links to it.
        for name in sorted(names, key=lambda name: os.path.islink(os.path.join(directory, name))):
            real = os.path.realpath(os.path.join(directory, name))
            owner = scanned_past(os.path.join(directory, name))
            if real in seen:
                loops.append(f"{os.path.join(directory, name)} -> {real}")
            elif owner is not None:
                outputs.append(f"{os.path.join(directory, name)} (coclr {owner})")
            else:
                seen.add(real)
                keep.append(name)
        folders[:] = sorted(keep)
        for name in sorted(files):
            if name.startswith("."):
                continue
            reason = why_not_video(os.path.join(directory, name))
            if reason is None:
                videos.append(_absolute(os.path.join(directory, name), Path.cwd()))
            else:
                skipped.append((os.path.relpath(os.path.join(directory, name), root), reason))
    if loops and notes is not None:
        more = f" and {len(loops) - 3} more" if len(loops) > 3 else ""
        notes.append(f"{root}: not followed {len(loops)} symbolic links to folders scanned already (a loop, or a "
                     f"second way to one folder): {', '.join(loops[:3])}{more}")
    if outputs and notes is not None:
        notes.append(left_out_note(root, outputs))
    if unreadable and notes is not None:  # (their videos were left out in silence)
        more = f" and {len(unreadable) - 3} more" if len(unreadable) > 3 else ""
        notes.append(f"{root}: could not read {len(unreadable)} folder(s), whose videos are left out: "
                     f"{', '.join(unreadable[:3])}{more}; make them readable (or leave them out) and run again")
    if notes is not None:
        _note_skipped(str(root), skipped, notes)
    return sorted(videos)


def _note_skipped(where: str, skipped: list[tuple[str, str]], notes: list[str]) -> None:
    """One line saying how many files of a folder or pattern are not videos, naming a few with the reason."""
    if not skipped:
        return
    shown = "; ".join(f"{name}: {reason}" for name, reason in skipped[:SKIPPED_SHOWN])
    more = f"; and {len(skipped) - SKIPPED_SHOWN} more" if len(skipped) > SKIPPED_SHOWN else ""
    notes.append(f"{where}: skipped {len(skipped)} files that are not videos ({shown}{more})")


def is_text_file(path: Path) -> bool:
    """Whether ``path`` reads as text: no NUL byte and valid UTF-8 in its first :data:`TEXT_CHECK_BYTES`."""
    try:
        with open(path, "rb") as file:
            head = file.read(TEXT_CHECK_BYTES)
    except OSError as error:
        raise DataError(f"{path}: cannot read the list file: {error}") from None
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def read_list_file(path: Path) -> list[Path]:
    """The paths a list file names (see the module docstring), absolute."""
    try:
        text = path.read_text(encoding="utf-8-sig", errors="replace")  # (a byte-order mark is not part of a path)
    except OSError as error:
        raise DataError(f"{path}: cannot read the list file: {error}") from None
    base = _absolute(str(path), Path.cwd()).parent
    out = []
    column, first = 0, True  # the path's column: the first, or the one a header row names
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        whole = _absolute(line, base)
        if whole.is_file():  # a path with a comma in its name
            out.append(whole)
            first = False
            continue
        cells = next(csv.reader([line]), [""])
        header = manifest_header(cells) if first else None
        first = False
        if header is not None:
            column = header.index("path")
            continue
        cell = cells[column].strip() if column < len(cells) else ""
        if len(cells) == 1 and " " in cell and not _absolute(cell, base).exists():  # ("Class/v_x.avi 1": a UCF101
            token = _absolute(cell.split()[0], base)  # split file's line, its label after a space, failed every line)
            if token.is_file():
                cell = str(token)
        if cell:
            out.append(_absolute(cell, base))
    return out


def _absolute(listed: str, base: Path) -> Path:
    path = Path(listed).expanduser()
    return Path(os.path.abspath(path if path.is_absolute() else base / path))
