"""Dataset indexes: which videos a dataset has, their class, split and group, read from official files.

A :class:`VideoIndex` is a list of :class:`VideoEntry` (a video's path relative to a root folder, its class
label, its split and an optional group) plus the class names; it is saved as JSON and is the first thing
a clip store holds. Builders read the official split files of UCF101, HMDB51 and Kinetics-400, any folder
laid out ``root/<class>/<video>`` and plain CSV manifests.

Example::

    index = ucf101_index("ucfTrainTestlist", split=1)   # 9,537 train + 3,783 test entries
    check_videos_exist(index, "UCF-101")                # every missing file reported at once
    index.save("ucf101_split1.json")
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import math
import os
import posixpath
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath

from coclr.atomic import atomic_write_text, read_json_record
from coclr.errors import DataError, why_no_file
from coclr.runfolder import left_out_note, scanned_past
from coclr.text import to_bytes
from coclr.video.decode import why_not_video

SPLITS = ("train", "val", "test")
INDEX_FORMAT = "coclr-video-index"
INDEX_VERSION = 1
MISSING_SHOWN = 20
"""How many missing files an error message lists by name (the count is always given)."""


UNLABELLED = -1
"""The class number of a video without a label wherever labels are numbers (tensors, feature files): never a
class, so it is never anybody's positive and every measure that needs labels leaves it out."""


@dataclass(frozen=True)
class VideoEntry:
    """One video: ``path`` relative to the dataset root (POSIX separators), class ``label`` (index into
    ``VideoIndex.classes``; None: unlabelled), ``split`` ("train", "val" or "test") and ``group`` (videos of one
    group share actors and scene, e.g. UCF101's ``g08``, or one camera's recording; ``None`` when unknown)."""

    path: str
    label: int | None
    split: str
    group: str | None = None

    @property
    def label_id(self) -> int:
        """The label as a number: the class index, or :data:`UNLABELLED`."""
        return UNLABELLED if self.label is None else self.label


@dataclass
class VideoIndex:
    """A dataset's videos and class names. Entry paths are unique and are the keys of a clip store."""

    name: str
    classes: list[str]
    entries: list[VideoEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        problems = []
        seen: dict[str, str] = {}
        for entry in self.entries:
            if entry.label is not None and not 0 <= entry.label < len(self.classes):
                problems.append(f"{entry.path}: label {entry.label} outside 0..{len(self.classes) - 1}")
            if entry.split not in SPLITS:
                problems.append(f"{entry.path}: split {entry.split!r} is not one of {', '.join(SPLITS)}")
            if "\\" in entry.path:  # (legal in a Linux name, but the index's paths separate folders by '/' only)
                problems.append(f"{entry.path!r}: a backslash in a name; rename the file (or leave it out)")
            elif not is_relative_key(entry.path):
                problems.append(f"{entry.path!r}: paths must be relative, with '/' and no '..'")
            elif posixpath.normpath(entry.path) != entry.path:  # (a/./b and a//b are a/b: one video, two entries)
                problems.append(f"{entry.path!r}: write the path in its plain form, "
                                f"{posixpath.normpath(entry.path)!r}")
            if entry.path in seen:
                where = (f"in the {seen[entry.path]} split and in the {entry.split} split"
                         if seen[entry.path] != entry.split else f"twice in the {entry.split} split")
                problems.append(f"{entry.path}: listed {where}")
            seen.setdefault(entry.path, entry.split)
            if len(problems) >= MISSING_SHOWN:
                break
        if problems:
            raise DataError(f"index {self.name!r} is invalid: " + "; ".join(problems))

    def __len__(self) -> int:
        return len(self.entries)

    def split(self, name: str) -> VideoIndex:
        """The entries of one split (same name and classes)."""
        if name not in SPLITS:
            raise DataError(f"unknown split {name!r} (known: {', '.join(SPLITS)})")
        return VideoIndex(self.name, list(self.classes), [e for e in self.entries if e.split == name])

    def without(self, paths: Iterable[str]) -> VideoIndex:
        """The index less the entries whose path is in ``paths`` (e.g. videos missing on disk)."""
        drop = set(paths)
        return VideoIndex(self.name, list(self.classes), [e for e in self.entries if e.path not in drop])

    def unlabelled(self, splits: Iterable[str] | None = None) -> list[str]:
        """Paths of the entries without a label (in ``splits``, or in all)."""
        wanted = None if splits is None else set(splits)
        return [e.path for e in self.entries if e.label is None and (wanted is None or e.split in wanted)]

    def require_labels(self, what: str, splits: Iterable[str] | None = None) -> None:
        """Refuse, in one line naming ``what`` needs them, an index whose entries (in ``splits``) lack labels."""
        splits = None if splits is None else list(dict.fromkeys(splits))
        missing = self.unlabelled(splits)
        if missing:
            within = [e for e in self.entries if splits is None or e.split in splits]
            where = f" of split {'/'.join(splits)}" if splits else ""
            raise DataError(f"{what} needs labels, but {len(missing)} of the {len(within)} videos{where} of index "
                            f"{self.name!r} have none (e.g. {missing[0]}): give a labelled index, or use a method "
                            "that needs none (InfoNCE, CoCLR, CMC; `coclr learn` for unlabelled videos)")

    def split_counts(self) -> dict[str, int]:
        """Number of videos per split, for the splits that have any."""
        counts = Counter(e.split for e in self.entries)
        return {split: counts[split] for split in SPLITS if counts[split]}

    def class_counts(self, split: str | None = None) -> list[int]:
        """Number of videos per class (in the order of ``classes``), in one split or in all."""
        counts = Counter(e.label for e in self.entries if e.label is not None and (split is None or e.split == split))
        return [counts[label] for label in range(len(self.classes))]

    def to_dict(self) -> dict:
        return {"format": INDEX_FORMAT, "version": INDEX_VERSION, "name": self.name, "classes": self.classes,
                "entries": [asdict(e) for e in self.entries]}

    @classmethod
    def from_dict(cls, data: dict, source: str = "index") -> VideoIndex:
        if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
            raise DataError(f"{source}: not a coclr video index (no \"format\": {INDEX_FORMAT!r})")
        if data.get("version") != INDEX_VERSION:
            raise DataError(f"{source}: unsupported index version {data.get('version')!r}")
        def malformed(where: str, what: str, value: object) -> DataError:
            return DataError(f"{source}: malformed index: {where} must be {what}, got {value!r}")

        name, classes, listed = data.get("name"), data.get("classes"), data.get("entries")
        if not isinstance(name, str):
            raise malformed('"name"', "text", name)
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise malformed('"classes"', "a list of class names", classes)
        if not isinstance(listed, list):
            raise malformed('"entries"', "a list of videos", type(listed).__name__ if listed is not None else None)
        entries = []
        for number, e in enumerate(listed):
            where = f"entry {number}"
            if not isinstance(e, dict):
                raise malformed(where, "an object with path, label and split", e)
            path, label, split, group = e.get("path"), e.get("label"), e.get("split"), e.get("group")
            if not isinstance(path, str) or not path:
                raise malformed(f'{where}: "path"', "the video's path (text)", path)
            if "label" not in e or label is not None and (isinstance(label, bool) or not isinstance(label, int)):
                raise malformed(f'{where} ({path}): "label"', "a class number or null", label)
            if not isinstance(split, str):
                raise malformed(f'{where} ({path}): "split"', f"one of {', '.join(SPLITS)}", split)
            if group is not None and not isinstance(group, str):
                raise malformed(f'{where} ({path}): "group"', "text or null", group)
            entries.append(VideoEntry(path, label, split, group))
        return cls(name, classes, entries)

    def save(self, path: str | Path) -> None:
        """Write the index as JSON, atomically (a temporary file in the same folder, then a rename)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> VideoIndex:
        path = Path(path)
        if path.is_dir():  # (it said "not found" of a folder that is there)
            raise DataError(f"{path}: a folder, not an index file: give the index file `coclr data index` wrote "
                            "(its --out)")
        data = read_json_record(path)
        if data is None:
            raise DataError(f"index file not found: {path}")
        return cls.from_dict(data, str(path))


def is_index_file(path: str | Path) -> bool:
    """Whether ``path`` is a coclr video index (what ``coclr data index --out`` writes, and may write again)."""
    try:
        record = read_json_record(path)
    except (OSError, DataError):
        return False
    return record is not None and record.get("format") == INDEX_FORMAT


def is_relative_key(path: str) -> bool:
    """Whether ``path`` is a relative POSIX path without ``..`` (safe to join under a root folder)."""
    parts = PurePosixPath(path).parts
    return bool(parts) and "\\" not in path and not path.startswith("/") and ".." not in parts


def missing_videos(index: VideoIndex, root: str | Path) -> list[str]:
    """Paths of the index's entries that are not files under ``root``."""
    root = Path(root)
    return [e.path for e in index.entries if not (root / e.path).is_file()]


def _missing_text(root: Path, path: str) -> str:
    """``path`` of a missing video, with why it is no file where something is there (it read "a link to nothing" for
    a link in a loop, and nothing for a folder)."""
    why = why_no_file(root / path, "video file")
    return path if why == "video file not found" else f"{path} ({why})"


def video_folder(root: str | Path) -> Path:
    """``root`` when it is a folder; else one line: not there, or a file (a video, not the folder of videos)."""
    root = Path(root)
    if root.is_file():
        raise DataError(f"{root}: is a file, not a folder of videos: give the folder it is in")
    if not root.is_dir():
        raise DataError(f"video folder not found: {root}")
    return root


def check_videos_exist(index: VideoIndex, root: str | Path, remedy: str = "") -> None:
    """Raise one DataError listing every video of ``index`` missing under ``root`` (count + first names; one that is
    a folder, a link to nothing or in a loop said so), ending with ``remedy`` (what to do) when given."""
    root = video_folder(root)
    missing = missing_videos(index, root)
    if missing:
        shown = ", ".join(_missing_text(root, path) for path in missing[:MISSING_SHOWN])
        more = f" (and {len(missing) - MISSING_SHOWN} more)" if len(missing) > MISSING_SHOWN else ""
        raise DataError(f"{len(missing)} of the {len(index)} videos of index {index.name!r} are missing "
                        f"under {root}: {shown}{more}{'; ' + remedy if remedy else ''}")


# ---------------------------------------------------------------------------------------------- UCF101

_UCF_NAME = re.compile(r"v_(?P<class>[^_]+)_(?P<group>g\d+)_c\d+", re.IGNORECASE)


def ucf101_group(path: str) -> str | None:
    """The source group of a UCF101-named video, as the authors' code identifies it: ``v_<Class>_g<XX>`` (per
    class: ``g08`` of ApplyEyeMakeup and ``g08`` of Archery are different sources); None for other names."""
    match = _UCF_NAME.match(PurePosixPath(path).name)
    return f"v_{match['class']}_{match['group'].lower()}" if match else None


def ucf101_index(annotations: str | Path, split: int = 1) -> VideoIndex:
    """UCF101 from its official files in ``annotations`` (``ucfTrainTestlist``): ``classInd.txt``
    (``index name``, 1-based), ``trainlist0N.txt`` (``Class/v_Class_gXX_cYY.avi label``) and
    ``testlist0N.txt`` (``Class/v_Class_gXX_cYY.avi``). Entries carry the source group of the video
    (:func:`ucf101_group`)."""
    annotations = Path(annotations)
    _check_split_number(split)
    if annotations.is_file():
        raise DataError(f"{annotations}: a file; give the folder that holds classInd.txt and the split lists "
                        f"({annotations.parent})")
    class_file = annotations / "classInd.txt"
    classes_by_number: dict[int, str] = {}
    for number, line in _lines(class_file):
        fields = line.split()
        if len(fields) != 2 or not fields[0].isdigit():
            raise DataError(f"{class_file}:{number}: expected 'index name', got {line!r}")
        if int(fields[0]) in classes_by_number or fields[1].lower() in map(str.lower, classes_by_number.values()):
            twice = "number" if int(fields[0]) in classes_by_number else "name"
            raise DataError(f"{class_file}:{number}: the class {twice} of {line!r} is listed twice (each class once, "
                            "numbered 1..N)")
        classes_by_number[int(fields[0])] = fields[1]
    if sorted(classes_by_number) != list(range(1, len(classes_by_number) + 1)):
        raise DataError(f"{class_file}: class indices must be 1..{len(classes_by_number)}")
    classes = [classes_by_number[i] for i in range(1, len(classes_by_number) + 1)]
    label_of_folder = {name.lower(): label for label, name in enumerate(classes)}

    entries = []
    listed = _Listed()
    for split_name in ("train", "test"):
        list_file = annotations / f"{split_name}list{split:02d}.txt"
        for number, line in _lines(list_file):
            fields = line.split()
            where = f"{list_file}:{number}"
            if len(fields) > 2:  # (the rest was dropped without a word: a name with a space, a line run together)
                raise DataError(f"{where}: expected 'Class/video.avi [label]', got {line.strip()!r}")
            path = posixpath.normpath(fields[0])  # (Class/./v.avi is Class/v.avi: listed twice, one video in both
            folder = PurePosixPath(path).parts[0] if "/" in path else ""  # splits, was not seen)
            if folder.lower() not in label_of_folder:
                raise DataError(f"{where}: class folder {folder!r} of {path!r} is not in {class_file}")
            label = label_of_folder[folder.lower()]
            if len(fields) > 1:
                if not fields[1].isdigit() or int(fields[1]) - 1 != label:
                    raise DataError(f"{where}: label {fields[1]!r} does not match class {folder!r}")
            listed.check(path, where, split_name)
            entries.append(VideoEntry(path, label, split_name, ucf101_group(path)))
    return VideoIndex(f"ucf101_split{split}", classes, entries)


# ---------------------------------------------------------------------------------------------- HMDB51

def hmdb51_index(annotations: str | Path, split: int = 1) -> VideoIndex:
    """HMDB51 from its split files ``<class>_test_split<N>.txt`` in ``annotations`` (lines
    ``video.avi flag``: 1 train, 2 test, 0 unused). Video paths are ``<class>/<video>.avi``."""
    annotations = Path(annotations)
    _check_split_number(split)
    suffix = f"_test_split{split}.txt"
    files = sorted((p for p in annotations.glob(f"*{suffix}") if p.is_file()), key=lambda p: p.name[: -len(suffix)]
                   ) if annotations.is_dir() else []  # (by class name: "climb" before "climb_stairs", as folders sort)
    if not files and annotations.is_file():  # (one class's split file: "no split files found in" that file)
        raise DataError(f"{annotations}: a file; give the folder that holds the split files '*{suffix}' (one per "
                        "class)")
    if not files:
        raise DataError(f"no HMDB51 split files '*{suffix}' found in {annotations}")
    classes = [p.name[: -len(suffix)] for p in files]
    others = {match.group(1) for p in annotations.glob("*_test_split*.txt")
              if (match := re.fullmatch(r"(.+)_test_split[123]\.txt", p.name))}
    missing = sorted(others - set(classes))
    if missing:  # (split N read with fewer classes, numbered otherwise than the other splits, without a word)
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise DataError(f"{annotations}: no {missing[0]}{suffix}{more}, though the other splits have that class: "
                        "the split files are incomplete; give the whole folder of HMDB51's split files")
    entries = []
    listed = _Listed()
    for label, (name, list_file) in enumerate(zip(classes, files)):
        for number, line in _lines(list_file):
            fields = line.split()
            if len(fields) != 2 or fields[1] not in ("0", "1", "2"):
                raise DataError(f"{list_file}:{number}: expected 'video.avi 0|1|2', got {line!r}")
            if fields[1] != "0":
                path, split_name = posixpath.normpath(f"{name}/{fields[0]}"), "train" if fields[1] == "1" else "test"
                listed.check(path, f"{list_file}:{number}", split_name)
                entries.append(VideoEntry(path, label, split_name))
    return VideoIndex(f"hmdb51_split{split}", classes, entries)


# ------------------------------------------------------------------------------------------ Kinetics-400

_KINETICS_SPLITS = {"train": "train", "val": "val", "validate": "val", "validation": "val", "test": "test"}


def kinetics_index(annotations: str | Path | Sequence[str | Path], root: str | Path,
                   name: str = "kinetics400", notes: list[str] | None = None) -> VideoIndex:
    """Kinetics from annotation CSVs (``label,youtube_id,time_start,time_end,split``, one or several).

    Videos are named ``<youtube_id>_<start:06d>_<end:06d>.mp4`` and looked for under ``root`` in the usual
    layouts, in this order: ``root/<split>/<label>/``, ``root/<label>/``, ``root/<split>/``, ``root/``, where
    ``<split>`` is the CSV's value or ours ("validate" -> "val") and ``<label>`` the class name as written or
    with spaces as underscores. A video found nowhere gets the first layout's path, so that
    :func:`check_videos_exist` reports it. Classes are the sorted labels; the group is the YouTube id. Rows
    without a label (the unlabelled test set's CSV) are left out, counted in one line of ``notes``.
    """
    files = [Path(annotations)] if isinstance(annotations, (str, Path)) else [Path(a) for a in annotations]
    root = Path(root)
    rows = []
    for csv_file in files:
        if not csv_file.is_file():
            raise DataError(f"annotation file not found: {csv_file}" if not csv_file.is_dir() else
                            f"{csv_file}: a folder, not an annotation CSV: give the CSV file(s)")
        with io.StringIO(manifest_text(csv_file), newline="") as file:  # (UTF-8, a spreadsheet's byte-order mark
            reader = csv.DictReader(file)  # too; other text refused in one line)
            needed = {"label", "youtube_id", "time_start", "time_end", "split"}
            if reader.fieldnames is None or not needed <= set(reader.fieldnames):
                raise DataError(f"{csv_file}: expected the columns {', '.join(sorted(needed))}, "
                                f"got {reader.fieldnames}")
            ended = reader.line_num
            for row in reader:  # each row numbered by the file's line it starts on (a quoted cell may break lines)
                number, ended = ended + 1, reader.line_num
                if any(row.get(key) is None for key in needed) or None in row:  # cut short, or cells past the header
                    cells = sum(value is not None for key, value in row.items() if key is not None) + len(
                        row.get(None) or [])
                    raise DataError(f"{csv_file}:{number}: expected the {len(reader.fieldnames)} cells of the header "
                                    f"({','.join(reader.fieldnames)}), got {cells}; mend or remove the line")
                split = _KINETICS_SPLITS.get(row["split"].strip().lower())
                if split is None:
                    raise DataError(f"{csv_file}:{number}: unknown split {row['split']!r}")
                try:
                    times = float(row["time_start"]), float(row["time_end"])
                except ValueError:
                    times = (math.nan, math.nan)
                if not all(math.isfinite(t) and t >= 0 for t in times):
                    raise DataError(f"{csv_file}:{number}: time_start and time_end must be seconds (0 or more), got "
                                    f"{row['time_start']!r} and {row['time_end']!r}")
                start, end = int(times[0]), int(times[1])
                rows.append((row["label"].strip(), row["youtube_id"].strip(), start, end,
                             row["split"].strip(), split, f"{csv_file}:{number}"))
    classes = sorted({row[0] for row in rows if row[0]})
    label_of = {c: i for i, c in enumerate(classes)}
    listing = _FolderListing(root)
    entries = []
    listed = _Listed()
    for label, youtube_id, start, end, csv_split, split, where in rows:
        if not label:
            continue
        file_name = f"{youtube_id}_{start:06d}_{end:06d}.mp4"
        candidates = _kinetics_candidates(file_name, label, csv_split, split)
        path = next((c for c in candidates if listing.exists(c)), candidates[0])
        listed.check(path, where, split)
        entries.append(VideoEntry(path, label_of[label], split, youtube_id))
    unlabelled = [where for label, *_, where in rows if not label]
    if unlabelled and notes is not None:  # (left out in silence: an index of the test CSV held no video, exit 0)
        notes.append(f"left out {len(unlabelled)} rows without a label (first {unlabelled[0]}): Kinetics' test CSV "
                     "has none; the index lists the labelled rows")
    return VideoIndex(name, classes, entries)


class _Listed:
    """Where an annotation file listed each video (state: path -> ``(file:line, split)``), so that a video listed
    twice is refused naming both lines (the index's own check sees the paths only)."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[str, str]] = {}

    def check(self, path: str, where: str, split: str) -> None:
        """Record that ``where`` (``file:line``) lists ``path`` in ``split``; a :class:`DataError` if listed before."""
        if path not in self.first:
            self.first[path] = (where, split)
            return
        before, before_split = self.first[path]
        if before == where:  # the same line read twice: the file was given twice
            raise DataError(f"{where.rpartition(':')[0]}: given twice; give each annotation file once")
        if before_split != split:
            raise DataError(f"{where}: {path} is in the {split} split here and in the {before_split} split at "
                            f"{before}; a video belongs to one split: remove one of the two lines")
        raise DataError(f"{where}: {path} is listed again (first at {before}); remove one of the two lines")


def _kinetics_candidates(file_name: str, label: str, csv_split: str, split: str) -> list[str]:
    splits = list(dict.fromkeys([csv_split, split]))
    labels = list(dict.fromkeys([label, label.replace(" ", "_")]))
    return ([f"{s}/{lab}/{file_name}" for s in splits for lab in labels] + [f"{lab}/{file_name}" for lab in labels]
            + [f"{s}/{file_name}" for s in splits] + [file_name])


class _FolderListing:
    """Answers "does root/<path> exist" from one listing per folder (fast on 250k files); state: a cache
    of folder listings."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._listings: dict[str, frozenset[str]] = {}

    def exists(self, path: str) -> bool:
        folder, _, name = path.rpartition("/")
        if folder not in self._listings:
            directory = self.root / folder
            self._listings[folder] = frozenset(os.listdir(directory)) if directory.is_dir() else frozenset()
        return name in self._listings[folder]


# ---------------------------------------------------------------------------------------- folder and CSV

def folder_index(root: str | Path, name: str | None = None, split: str = "train",
                 extensions: Sequence[str] | None = None, test_fraction: float = 0.0,
                 seed: int = 0, notes: list[str] | None = None) -> VideoIndex:
    """Any folder laid out ``root/<class>/<video>``: classes are the sorted subfolder names and every entry
    is in ``split``. A root holding only ``train``/``val``/``test`` subfolders (in any case) is read as
    ``root/<split>/<class>/<video>`` instead (classes: the union over the splits); split folders beside others are
    refused (the splits would be read as classes).

    A file is a video by the one rule of :func:`coclr.video.decode.why_not_video` (a video extension, or PyAV opens
    it as one: ``.ts``, ``.MTS`` ...), or, with ``extensions``, when its name ends in one of them. ``notes``
    receives one line counting the files under the class folders that are not videos (a few named, with the
    reason).

    Videos may sit deeper in a class folder; a video's source group is its UCF101 id (:func:`ucf101_group`) or,
    failing that, the first subfolder below its class (``<class>/<source>/<clip>``). With ``test_fraction`` > 0 a
    plain class folder is split into train and test (:func:`split_by_group`): deterministic for a ``seed``, and
    the clips of one source never straddle the split.

    Links are followed, but a folder link that leads back into a folder being scanned (a loop) and a video file
    reached by two paths are errors naming them: either would silently add duplicates (a loop under ``train``
    shows up as one more class holding copies of every video).
    """
    root = video_folder(root)
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    if not 0 <= test_fraction < 1:
        raise DataError(f"test fraction must be in [0, 1), got {test_fraction}")
    scan = _FolderScan(root, why_not_video if extensions is None else _by_extension(extensions))
    subfolders = sorted(p.name for p in root.iterdir()
                        if p.is_dir() and not p.name.startswith(".") and not scan.is_output(p))
    named_splits = [name for name in subfolders if name.lower() in SPLITS]
    by_split = bool(subfolders) and len(named_splits) == len(subfolders)
    if named_splits and not by_split:  # a split folder would be read as a class, and its classes lost
        others = [name for name in subfolders if name not in named_splits]
        raise DataError(f"{root} holds split folders ({', '.join(named_splits)}) beside other folders "
                        f"({', '.join(others[:MISSING_SHOWN])}): move those out (e.g. an archive's __MACOSX), or lay "
                        "it out as root/<class>/<video>")
    if by_split and test_fraction:
        raise DataError(f"{root} is already laid out by split ({', '.join(subfolders)}): a test fraction applies to "
                        "a plain root/<class>/<video> folder")
    prefixes = [(f"{s}/", s.lower()) for s in subfolders] if by_split else [("", split)]
    for prefix, _ in prefixes:
        _refuse_loose_videos(root / prefix, scan.not_video)
    videos = []
    for prefix, split_name in prefixes:
        class_dirs = [root / name for name in subfolders] if not prefix else sorted(
            p for p in (root / prefix).iterdir() if p.is_dir() and not p.name.startswith(".") and not scan.is_output(p))
        for class_dir in class_dirs:
            for relative in scan.videos(class_dir):
                depth = PurePosixPath(relative).relative_to(class_dir.relative_to(root).as_posix()).parts
                group = ucf101_group(relative) or (f"{class_dir.name}/{depth[0]}" if len(depth) > 1 else None)
                videos.append((relative, class_dir.name, split_name, group))
    scan.check()
    _note_skipped(root, scan, notes)
    if not videos:
        raise DataError(f"no videos found in {root}/<class>/ (a file is a video when its name ends in a video "
                        "extension or PyAV opens it as one)")
    classes = sorted({c for _, c, _, _ in videos})
    label_of = {c: i for i, c in enumerate(classes)}
    entries = [VideoEntry(path, label_of[c], s, g) for path, c, s, g in videos]
    index = VideoIndex(name or Path(os.path.abspath(root)).name, classes, entries)
    return split_by_group(index, test_fraction, seed) if test_fraction else index


def tree_index(root: str | Path, name: str | None = None, extensions: Sequence[str] | None = None,
               test_fraction: float = 0.0, seed: int = 0, notes: list[str] | None = None) -> VideoIndex:
    """Every video under ``root``, at any depth, without labels (:func:`unlabelled_index`): a folder of one's own
    footage, laid out any way (``root/<camera>/<recording>/<clip>``, or flat). A root whose every video lies under
    ``train``/``val``/``test`` folders keeps those splits (``notes`` says when some of them do and others do not).
    Which files are videos, links, loops, videos reached twice and ``notes`` as in :func:`folder_index`."""
    root = video_folder(root)
    scan = _FolderScan(root, why_not_video if extensions is None else _by_extension(extensions))
    videos = scan.videos(root)
    scan.check()
    _note_skipped(root, scan, notes)
    if not videos:
        raise DataError(f"no videos found under {root} (a file is a video when its name ends in a video extension or "
                        "PyAV opens it as one)")
    index = unlabelled_index(videos, name or Path(os.path.abspath(root)).name, test_fraction, seed)
    tops = [PurePosixPath(path).parts[0].lower() if "/" in path else "" for path in videos]
    held_out = sum(top in SPLITS and top != "train" for top in tops)
    if held_out and all(top in SPLITS for top in tops):  # laid out <split>/...: its splits kept (all went to train,
        if test_fraction:  # an evaluation's test videos among those trained on)
            raise DataError(f"{root}: laid out by split already (train/, test/ ...): leave --test-fraction out")
        index = VideoIndex(index.name, [], [  # (a group from below the split folder: a video directly in train/
            replace(entry, split=top,  # was of group "train", the positive of every other one there)
                    group=ucf101_group(entry.path) or source_folder(entry.path.split("/", 1)[1]))
            for entry, top in zip(index.entries, tops)])
    elif held_out and notes is not None:
        notes.append(f"{root}: {held_out} videos under test/ or val/ folders are indexed as training videos, as "
                     "the other folders are not split folders: lay the whole folder out as <split>/... to keep them "
                     "apart")
    return index


def unlabelled_index(paths: Sequence[str], name: str, test_fraction: float = 0.0, seed: int = 0) -> VideoIndex:
    """An index of videos without labels, from their paths relative to a root. A video's source group is its
    UCF101 id, else the folder holding it (``<camera>/<recording>``: its clips share the scene; none for a video at
    the top), so that with ``test_fraction`` > 0 the clips of one source never straddle the split
    (:func:`split_by_group`)."""
    if not 0 <= test_fraction < 1:
        raise DataError(f"test fraction must be in [0, 1), got {test_fraction}")
    entries = [VideoEntry(path, None, "train", ucf101_group(path) or source_folder(path)) for path in paths]
    index = VideoIndex(name, [], entries)
    return split_by_group(index, test_fraction, seed) if test_fraction else index


def source_folder(path: str) -> str | None:
    """The folder holding ``path`` (relative, POSIX), None at the top."""
    parent = PurePosixPath(path).parent.as_posix()
    return None if parent == "." else parent


def _note_skipped(root: Path, scan: _FolderScan, notes: list[str] | None) -> None:
    """One line in ``notes`` counting the files of the scan that are not videos (a few named, with the reason), and
    one naming the output folders it left out."""
    if scan.outputs and notes is not None:
        notes.append(left_out_note(root, scan.outputs))
    if scan.skipped and notes is not None:
        shown = "; ".join(f"{path}: {reason}" for path, reason in scan.skipped[:3])
        more = f"; and {len(scan.skipped) - 3} more" if len(scan.skipped) > 3 else ""
        notes.append(f"{root}: skipped {len(scan.skipped)} files that are not videos ({shown}{more})")


def _by_extension(extensions: Sequence[str]) -> Callable[[Path], str | None]:
    """A rule of which files are videos (as :func:`why_not_video`) by their name's ending only."""
    suffixes = tuple(e.lower() for e in extensions)

    def not_video(path: Path) -> str | None:
        return None if path.name.lower().endswith(suffixes) else f"its name does not end in {', '.join(suffixes)}"

    return not_video


def _refuse_loose_videos(folder: Path, not_video: Callable[[Path], str | None]) -> None:
    """Videos lying in a folder of class folders have no class: refused in one line naming them, never dropped."""
    loose = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                   and not_video(p) is None)
    if loose:
        shown = ", ".join(loose[:3]) + (f" and {len(loose) - 3} more" if len(loose) > 3 else "")
        raise DataError(f"{folder}: {len(loose)} video(s) lie beside the class folders, outside any class ({shown}); "
                        "move each into its class folder (root/<class>/<video>) or elsewhere")


class _FolderScan:
    """Finds the video files under class folders, following links, and collects loops and videos reached twice.

    State: the real paths of the videos seen (and by which path), the files that are not videos (with the reason),
    and the problems found."""

    def __init__(self, root: Path, not_video: Callable[[Path], str | None]) -> None:
        self.root = root
        self.not_video = not_video
        self.skipped: list[tuple[str, str]] = []
        self.seen: dict[str, str] = {}
        self.loops: list[str] = []
        self.twice: list[str] = []
        self.outputs: list[str] = []

    def videos(self, folder: Path) -> list[str]:
        """Relative paths (POSIX) of the videos under ``folder``, in sorted order."""
        found: list[str] = []
        above = PurePosixPath(folder.relative_to(self.root).as_posix()).parents
        self._visit(folder, [os.path.realpath(self.root / p) for p in reversed(above)], found)
        return found

    def _visit(self, folder: Path, ancestors: list[str], found: list[str]) -> None:
        """Scan ``folder`` unless it leads back to a folder above it (``ancestors``: their real paths)."""
        real = os.path.realpath(folder)
        if real in ancestors:
            target = os.readlink(folder) if folder.is_symlink() else real
            self.loops.append(f"{folder.relative_to(self.root).as_posix()} -> {target}")
            return
        for child in sorted(folder.iterdir()):
            if child.name.startswith("."):
                continue
            if child.is_dir() and self.is_output(child):
                continue
            if child.is_dir():
                self._visit(child, [*ancestors, real], found)
            elif child.is_symlink() and not child.exists() and self.not_video(child) is not None:
                self.skipped.append((child.relative_to(self.root).as_posix(), why_no_file(child)))
            elif child.is_file() and (reason := self.not_video(child)) is not None:
                self.skipped.append((child.relative_to(self.root).as_posix(), reason))
            elif child.is_file() or child.is_symlink():  # (a link to nothing named as a video: a video that fails
                relative = child.relative_to(self.root).as_posix()  # when read, as coclr embed's inputs)
                target = os.path.realpath(child)
                if target in self.seen:
                    self.twice.append(f"{relative} (also {self.seen[target]})")
                    continue
                self.seen[target] = relative
                found.append(relative)
            else:  # a named pipe, a socket, a device: nothing a video is read from
                self.skipped.append((child.relative_to(self.root).as_posix(), "not a regular file (a pipe, a "
                                     "socket or a device)"))

    def is_output(self, folder: Path) -> bool:
        """Whether ``folder`` is a coclr command's output, not scanned (:func:`~coclr.runfolder.scanned_past`):
        then it is noted."""
        owner = scanned_past(folder)
        if owner is not None:
            self.outputs.append(f"{folder.relative_to(self.root).as_posix()} (coclr {owner})")
        return owner is not None

    def check(self) -> None:
        """Raise one :class:`DataError` naming the loops and the videos reached twice, if any."""
        problems = []
        if self.loops:
            problems.append(f"{len(self.loops)} folder link(s) lead back into a folder being scanned (a loop): "
                            + ", ".join(self.loops[:MISSING_SHOWN]))
        if self.twice:
            problems.append(f"{len(self.twice)} video(s) are reached by two paths: "
                            + ", ".join(self.twice[:MISSING_SHOWN]))
        if problems:
            raise DataError(f"{self.root}: " + "; ".join(problems) + ". Remove or move those links: each video must "
                            "appear once")


def split_class_notes(index: VideoIndex) -> list[str]:
    """What an index of labelled splits should say of its classes: those with test (or validation) videos but no
    training video (each such video a miss in every evaluation), and names that differ only in case or
    Unicode form (``café`` typed on two systems), most likely one class named twice."""
    splits: dict[int, set[str]] = {}
    for entry in index.entries:
        if entry.label is not None:
            splits.setdefault(entry.label, set()).add(entry.split)
    notes = []
    untrained = [index.classes[label] for label, found in sorted(splits.items()) if "train" not in found]
    if untrained:
        named = ", ".join(map(repr, untrained[:5])) + (", ..." if len(untrained) > 5 else "")
        held = " or ".join(sorted({split for found in splits.values() for split in found} - {"train"}))
        notes.append(f"{len(untrained)} class(es) have {held} videos and no training video ({named}): every "
                     "evaluation counts those videos as misses")
    alike: dict[str, list[str]] = {}
    for name in index.classes:
        alike.setdefault(unicodedata.normalize("NFC", name).casefold(), []).append(name)
    for names in alike.values():
        if len(names) > 1:
            notes.append(f"the classes {' and '.join(map(repr, names))} differ only in case or Unicode form: one class "
                         "named two ways? rename the folders alike to make them one")
    return notes


def split_by_group(index: VideoIndex, test_fraction: float, seed: int = 0) -> VideoIndex:
    """The index with about ``test_fraction`` of each class moved to the test split, by source group.

    A group (a video without one is its own group) goes to test when a hash of ``(seed, group)``, read as a
    fraction of 1, is below ``test_fraction``: so the split is deterministic, one source never straddles it, and
    adding or removing videos moves no other group (an encoder trained on the train split never finds its videos
    in the test split of a grown folder). A class of two groups or more keeps one on each side:
    where none falls in test, its group of lowest hash goes there; where all do, its group of highest hash stays in
    train (those two may move as the class's groups change).
    """
    def fraction(group: str) -> float:
        return int(hashlib.sha256(to_bytes(f"{seed}:{group}")).hexdigest()[:15], 16) / 16 ** 15

    units: dict[int, set[str]] = {}
    for entry in index.entries:
        units.setdefault(entry.label, set()).add(entry.group or entry.path)
    test_units: set[tuple[int, str]] = set()
    for label, groups in units.items():
        ordered = sorted(groups, key=lambda g: (fraction(g), g))
        test = [g for g in ordered if fraction(g) < test_fraction]
        if len(ordered) > 1 and not test:
            test = ordered[:1]
        elif len(ordered) > 1 and len(test) == len(ordered):
            test = ordered[:-1]
        test_units.update((label, g) for g in test)
    entries = [VideoEntry(e.path, e.label, "test" if (e.label, e.group or e.path) in test_units else "train", e.group)
               for e in index.entries]
    return VideoIndex(index.name, list(index.classes), entries)


MANIFEST_COLUMNS = ("path", "label", "split", "group")


def manifest_text(path: str | Path) -> str:
    """The text of a manifest: UTF-8, with or without the byte-order mark spreadsheets write ("CSV UTF-8"); UTF-16
    or bytes that are not UTF-8 are refused in one line naming the file and saying how to save it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: {why_no_file(path, 'manifest')}")
    data = path.read_bytes()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or _utf16_without_mark(data):
        raise DataError(f"{path}: UTF-16 text, not UTF-8; save it as UTF-8 (a spreadsheet's \"CSV UTF-8\")")
    if b"\0" in data:  # (a spreadsheet's own file, an archive: "UTF-16 text" was said of any NUL byte)
        kind = " (a ZIP archive: a spreadsheet's .xlsx?)" if data.startswith(b"PK\x03\x04") else ""
        raise DataError(f"{path}: not a text file{kind}; save it as CSV (a spreadsheet's \"CSV UTF-8\")")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); save it "
                        "as UTF-8 (a spreadsheet's \"CSV UTF-8\")") from None


def _utf16_without_mark(data: bytes) -> bool:
    """Whether ``data`` reads as UTF-16 text without a byte-order mark: ASCII text in UTF-16 has a NUL in every other
    byte (the even ones, big-endian; the odd ones, little-endian), where other binary data has them anywhere."""
    head = data[:4096]
    if len(head) < 2 or b"\0" not in head:
        return False
    pairs = len(head) // 2
    return any(head[side::2][:pairs].count(0) >= 0.9 * pairs for side in (0, 1))


def manifest_header(cells: Sequence[str]) -> list[str] | None:
    """The columns a CSV's first row names when it is a header (it starts with ``path``, or names only
    :data:`MANIFEST_COLUMNS`, ``path`` among them, in any order: ``label,path``), lower-cased; None for a row of
    data. The one rule of every reader of such files (manifests, ``coclr embed``'s list files)."""
    first = [cell.strip().lower() for cell in cells]
    if first and (first[0] == "path" or ("path" in first and set(first) <= set(MANIFEST_COLUMNS))):
        return first
    return None


def manifest_rows(path: str | Path) -> list[tuple[int, dict[str, str]]]:
    """The rows of a CSV manifest (:func:`csv_index`'s format), each with its line number: a dict of the columns it
    fills (``path``, ``label``, ``split``, ``group``; values stripped). Lines starting with ``#`` are comments.
    The first row is a header when :func:`manifest_header` says so. Raises :class:`DataError` naming the line of a
    bad header or of a row with more cells than columns."""
    path = Path(path)
    reader = csv.reader(io.StringIO(manifest_text(path), newline=""))
    rows, ended = [], 0
    for row in reader:  # each row numbered by the file's line it starts on (a quoted cell may hold a line break)
        first, ended = ended + 1, reader.line_num
        if row and not row[0].startswith("#"):
            rows.append((first, row))
    columns = list(MANIFEST_COLUMNS)
    header = manifest_header(rows[0][1]) if rows else None
    if header is not None:
        columns = header
        unknown = [c for c in columns if c not in MANIFEST_COLUMNS]
        if unknown or len(set(columns)) != len(columns):
            raise DataError(f"{path}:{rows[0][0]}: the header names the columns path, label, split and group, each "
                            f"once; got {','.join(columns)}")
        rows = rows[1:]
    if not rows:
        raise DataError(f"{path}: the manifest lists no videos")
    records = []
    for number, row in rows:
        if len(row) > len(columns):
            raise DataError(f"{path}:{number}: expected {','.join(columns)} (the last ones optional), got {row}")
        records.append((number, dict(zip(columns, (value.strip() for value in row)))))
    return records


def manifest_labels(labels: Sequence[str]) -> tuple[list[str], list[int]]:
    """The classes of a manifest's label cells and each cell's class index: when all are integers that name at least
    half of 0..max, class indices (classes "0".."max"; a cell "03" is class 3); other integers (identifiers, dates:
    20240101 made twenty million classes) are class names, in their order as numbers; else their sorted set."""
    if labels and all(_is_int(label) for label in labels):
        numbers = [int(x) for x in labels]
        if max(numbers) + 1 <= 2 * len(set(numbers)):
            return [str(i) for i in range(max(numbers) + 1)], numbers
        labels = [str(number) for number in numbers]
        classes = [str(number) for number in sorted(set(numbers))]
        index = {c: i for i, c in enumerate(classes)}
        return classes, [index[label] for label in labels]
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    return classes, [index[label] for label in labels]


def csv_index(path: str | Path, name: str | None = None) -> VideoIndex:
    """A CSV manifest with the columns ``path,label`` and optionally ``split`` (default "train") and
    ``group``; a header row naming them is optional, and with a header they may come in any order. Labels are class
    indices (all integers naming at least half of "0".."max") or class names (classes: their sorted set;
    :func:`manifest_labels`). A video with an empty label
    cell, or every video of a manifest without a label column (a header without ``label``, or one column of paths
    and no header), has no label. UTF-8, a byte-order mark accepted (:func:`manifest_text`)."""
    path = Path(path)
    records = manifest_rows(path)
    classes, ids = manifest_labels([r["label"] for _, r in records if r.get("label")])
    labels = iter(ids)
    entries = []
    listed = _Listed()  # (a path listed twice, as ./a.mp4 too, is named by both lines: the index's check names none)
    for number, record in records:
        if not record.get("path"):
            raise DataError(f"{path}:{number}: no path")
        split = record.get("split") or "train"
        if split not in SPLITS:
            raise DataError(f"{path}:{number}: unknown split {split!r} (known: {', '.join(SPLITS)})")
        label = next(labels) if record.get("label") else None  # one spelling of a path (./a.mp4, a//b.mp4: the same
        key = posixpath.normpath(record["path"])  # files, which the index then refuses as listed twice)
        listed.check(key, f"{path}:{number}", split)
        entries.append(VideoEntry(key, label, split, record.get("group") or None))
    return VideoIndex(name or path.stem, classes, entries)


# ---------------------------------------------------------------------------------------------- helpers

def _lines(path: Path) -> list[tuple[int, str]]:
    """Non-empty lines of a text file with their 1-based numbers (CRLF endings accepted)."""
    if not path.is_file():
        raise DataError(f"annotation file not found: {path}")
    text = manifest_text(path)  # (a byte-order mark is not part of a name; other text than UTF-8 refused, named)
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _check_split_number(split: int) -> None:
    if split not in (1, 2, 3):
        raise DataError(f"split must be 1, 2 or 3, got {split!r}")


def _is_int(text: str) -> bool:
    """Whether a label cell is a class number: ASCII digits only (``"²".isdigit()`` holds, but ``int`` refuses it)."""
    return text.isascii() and text.isdigit()
