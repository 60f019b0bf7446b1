"""Results people can look at: the paper's Table 1, its Figure 4 (R@1 across the stages of a run) and
Figure 5 (a retrieval gallery, see :mod:`coclr.eval.gallery`).

- :func:`build_table` merges evaluation records (``coclr eval ... --out R.json``) of the same encoder(s)
  into one row: Method | Input | Labels | Linear probe | Finetune | R@1, with "-" where not evaluated;
  written as Markdown and JSON.
- :func:`plot_stage_recall` draws R@1 of the RGB and flow networks after each stage of a pipeline run;
  a segment is solid where that network is trained in the stage and dotted where it is frozen.
- :func:`report_run` evaluates retrieval for every finished stage of a run folder (``manifest.json``) on an
  evaluation store, then writes the table, the plot and the gallery. A CoCLR stage's record also gives the
  share of its mined positives that had the query's class (:func:`mined_precision`), read from its log.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coclr.atomic import atomic_open, atomic_write_json, atomic_write_text, read_json_lines, read_json_record
from coclr.clips import CLIP_KEYS
from coclr.core.methods import display_name, find_method
from coclr.data.views import is_flow_view, view_kind
from coclr.errors import DataError
from coclr.eval.evaluate import TaskOptions, evaluate_checkpoint
from coclr.eval.features import (
    ClipConfig,
    Stream,
    check_inputs,
    label_warnings,
    read_clip_settings,
    split_entries,
    unlike_training,
)
from coclr.eval.gallery import write_gallery
from coclr.eval.health import collapsed
from coclr.models.loading import checkpoint_sha256
from coclr.runfolder import FolderRule
from coclr.store.clipstore import open_store

VIEW_NAMES = {"rgb": "RGB", "flow": "Flow", "rgbdiff": "RGBDiff"}
TABLE_COLUMNS = ("Method", "Input", "Labels", "Linear probe", "Finetune", "R@1")
VIEW_COLOURS = {"rgb": "#1f77b4", "flow": "#ff7f0e"}


def view_name(view: str) -> str:
    """Display name of a store view (``flow_dis`` -> ``Flow (dis)``)."""
    if view in VIEW_NAMES:
        return VIEW_NAMES[view]
    if is_flow_view(view):
        return f"Flow ({view[4:].lstrip('_')})"
    return view


REPORT_FOLDER = FolderRule("report", "a report", other="another folder (--out)")
"""The folder ``coclr report`` writes (:mod:`coclr.runfolder`): recorded with no options, since every run rewrites
its tables from the inputs given, so that a report is rewritten only into a folder of reports."""
REPORT_FILES = ("table.md", "table.json", "gallery.html", "stage_recall.png", "results", "feature_cache")
"""What ``coclr report`` writes into its folder (before folders were recorded: a folder of these is a report's)."""


def report_options(folder: Path) -> dict[str, Any] | None:
    """The (empty) options of a report folder written before folders were recorded: one holding only
    :data:`REPORT_FILES`, among them the ``table.json`` a report writes (so that a user's files that happen to bear
    those names are not taken for one); None for any other folder."""
    names = {entry.name for entry in folder.iterdir() if not entry.name.startswith(".")}
    if not names or not names <= set(REPORT_FILES):
        return None
    try:
        table = read_json_record(folder / "table.json")
    except (OSError, DataError):
        return None
    ours = table is not None and table.get("columns") == list(TABLE_COLUMNS) and isinstance(table.get("rows"), list)
    return {} if ours else None


def is_result_file(path: str | Path) -> bool:
    """Whether ``path`` is a ``coclr eval`` result (a JSON record of a task, its streams and results), which
    ``coclr eval --out`` may write again."""
    try:
        record = read_json_record(path)
    except (OSError, DataError):
        return False
    return record is not None and record.get("task") in ("retrieval", "linear", "finetune") and "results" in record


def load_record(path: str | Path) -> dict[str, Any]:
    """One evaluation record, checked to be one (names the file and the field when it is not)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: a folder, not a result file; give the files (e.g. {path / '*.json'})")
    record = read_json_record(path)
    if record is None:
        raise DataError(f"result file not found: {path}")
    if record.get("task") not in ("retrieval", "linear", "finetune") \
            or not isinstance(record.get("streams"), list) or "results" not in record:
        raise DataError(f"{path}: not a 'coclr eval' result (needs task, streams and results)")
    problem = record_problem(record)
    if problem:
        raise DataError(f"{path}: not a valid 'coclr eval' result: {problem}; write it again with coclr eval")
    record.setdefault("source", str(path))
    return record


def left_out_line(record: dict[str, Any]) -> str | None:
    """One line saying which videos a record's figures were computed without (its evaluation left them out because
    a job of their view failed), or None when it left none out (or predates the record of them)."""
    splits = record.get("splits")
    if not isinstance(splits, dict):
        return None
    left = {split.get("name", role): split["left_out"] for role, split in splits.items()
            if isinstance(split, dict) and isinstance(split.get("left_out"), list) and split["left_out"]}
    if not left:
        return None
    counts = " and ".join(f"{len(keys)} {name!r}" for name, keys in left.items())
    first = next(iter(left.values()))[0]
    return (f"{record.get('source', record.get('name', 'a result'))}: its figures leave out {counts} video(s) whose "
            f"jobs failed, e.g. {first}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_list(value: Any, below: int | None = None) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                           and (below is None or v < below) for v in value)


def record_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with the fields the report reads from an evaluation record (None when nothing is), so that a
    malformed file is named in one line before anything is written, never a traceback half-way."""
    streams = record["streams"]
    if not streams:
        return "streams: empty"
    for number, stream in enumerate(streams):
        if not isinstance(stream, dict):
            return f"streams[{number}]: not a mapping"
        for key in ("checkpoint", "checkpoint_sha256", "view"):
            if not isinstance(stream.get(key), str):
                return f"streams[{number}].{key}: missing or not a string"
        for key in ("meta", "trained_clips"):
            if stream.get(key) is not None and not isinstance(stream[key], dict):
                return f"streams[{number}].{key}: not a mapping"
    results = record["results"]
    if not isinstance(results, dict):
        return "results: not a mapping"
    metric = "R@1" if record["task"] == "retrieval" else "top1"
    if results.get(metric) is not None and not _is_number(results[metric]):
        return f"results.{metric}: not a number ({results[metric]!r})"
    if results.get(metric) is not None and not (math.isfinite(results[metric]) and 0 <= results[metric] <= 100):
        return f"results.{metric}: not a percentage from 0 to 100 ({results[metric]!r})"
    for key in ("name", "dataset", "store"):
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key}: not a string"
    config = record.get("config", {})
    if not isinstance(config, dict) or not isinstance(config.get("clips", {}), dict):
        return "config: not a mapping of the clip settings"
    clips = config.get("clips", config)
    wrong = [key for key in CLIP_KEYS
             if key in clips and not (_is_number(clips[key]) and float(clips[key]).is_integer())]
    if wrong:
        return f"config.clips.{wrong[0]}: not a whole number ({clips[wrong[0]]!r})"
    if record.get("splits") is not None and not isinstance(record["splits"], dict):
        return "splits: not a mapping of each role (train, test) to its split"
    health = record.get("feature_health", [])
    if not isinstance(health, list) or not all(
            isinstance(item, dict) and all(isinstance(item.get(split), dict)
                                           and isinstance(item[split].get("degenerate"), bool)
                                           for split in ("train", "test")) for item in health):
        return "feature_health: needs a list of {train: {degenerate: true|false}, test: {degenerate: true|false}}"
    if "neighbours" in record:
        return neighbours_problem(record)
    return None


def neighbours_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with a record's ``neighbours`` (the retrieval gallery's input), None when nothing is."""
    neighbours = record["neighbours"]
    if not isinstance(neighbours, dict):
        return "neighbours: not a mapping"
    keys = ("query_keys", "query_labels", "gallery_keys", "gallery_labels", "classes", "topk_indices")
    missing = [key for key in keys if not isinstance(neighbours.get(key), list)]
    if missing:
        return f"neighbours: {', '.join(missing)} missing or not a list"
    queries, gallery, classes = neighbours["query_keys"], neighbours["gallery_keys"], neighbours["classes"]
    if not all(isinstance(key, str) for key in [*queries, *gallery, *classes]):
        return "neighbours: keys and classes must be strings"
    for name, labels, count in (("query_labels", neighbours["query_labels"], len(queries)),
                                ("gallery_labels", neighbours["gallery_labels"], len(gallery))):
        if len(labels) != count or not _int_list(labels, len(classes)):
            return f"neighbours.{name}: needs one class number below {len(classes)} per key"
    topk = neighbours["topk_indices"]
    if len(topk) != len(queries) or not all(_int_list(row, len(gallery)) for row in topk) or len(
            {len(row) for row in topk}) > 1:  # (rows of other lengths: a traceback after the table was written)
        return (f"neighbours.topk_indices: needs one list of gallery rows (below {len(gallery)}) per query, all of "
                "one length")
    return None


def _encoder_key(record: dict[str, Any]) -> tuple:
    return tuple((s["checkpoint_sha256"], s["view"]) for s in record["streams"])


def describe_encoders(record: dict[str, Any]) -> dict[str, str]:
    """Method, Input and Labels cells of a record, from its name or its checkpoints' metadata."""
    streams = record["streams"]
    methods = []
    for stream in streams:
        meta = stream.get("meta") or {}
        method = str(meta.get("method") or Path(stream["checkpoint"]).stem)
        methods.append(method)
    distinct = list(dict.fromkeys(methods))
    name = record.get("name") or "/".join(display_name(m) for m in distinct)
    views = [s["view"] for s in streams]
    if len(views) == 2 and views[0] == "rgb" and is_flow_view(views[1]):
        input_name = "R+F"
    else:
        input_name = "+".join(view_name(v) for v in views)
    finetuned = any("finetuned_from" in (stream.get("meta") or {}) for stream in streams)  # (trained on the labels)
    labels = "✓" if finetuned or any(getattr(find_method(m), "uses_labels", False) for m in methods) else "✗"
    return {"Method": name, "Input": input_name, "Labels": labels}


OTHER_CLIPS_MARK = "†"
DEGENERATE_MARK = "‡"


def record_clips(record: dict[str, Any]) -> dict[str, int]:
    """The clip length, stride and size a record was evaluated with."""
    config = record.get("config") or {}
    clips = config.get("clips", config)
    return {key: clips[key] for key in CLIP_KEYS if key in clips}


def clips_text(clips: dict[str, int]) -> str:
    """``32x128`` (frames x crop side), with ``/2`` for a frame stride of 2."""
    text = f"{clips.get('length', '?')}x{clips.get('size', '?')}"
    return text + (f"/{clips['stride']}" if clips.get("stride", 1) != 1 else "")


def other_clips(record: dict[str, Any]) -> list[str]:
    """How the clips a record was evaluated on differ from those its encoders were trained on (as their
    checkpoints record them), e.g. ``["32x128 clips, trained on 8x32"]``; [] when they agree or nothing is
    recorded."""
    evaluated = record_clips(record)
    found = []
    for stream in record.get("streams", []):
        trained = stream.get("trained_clips") or {}
        if trained and any(trained.get(key) != evaluated.get(key) for key in trained):
            found.append(f"{clips_text(evaluated)} clips, trained on {clips_text(trained)}")
    return list(dict.fromkeys(found))


def degenerate(record: dict[str, Any]) -> bool:
    """Whether a record's features were degenerate (a collapsed encoder, :mod:`coclr.eval.health`)."""
    return any(collapsed(stream) for stream in record.get("feature_health", []))


def record_splits(record: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The splits a record was evaluated on, by role (``(("test", "test"), ("train", "train"))``): results on other
    splits (the test split as the gallery, a subset) are not the same measure, so they are other rows."""
    splits = record.get("splits") or {}
    return tuple(sorted((str(role), str((info or {}).get("name") if isinstance(info, dict) else info))
                        for role, info in splits.items()))


def build_table(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per encoder (or encoder pair) and clip shape: the linear-probe and finetune top-1 and R@1 in
    percent, None where not evaluated. Rows keep the order in which their encoders first appear; a later record
    of the same task, encoders, clips, store and splits replaces an earlier one (a result it lacks is kept); records
    of other stores, splits or clips are other rows, each noting its store, splits or clips when the table holds more
    than one (an R@1 of one dataset beside a probe of another was one row). A row evaluated on other clips than its
    encoder was trained on has the Method marked :data:`OTHER_CLIPS_MARK`, one with degenerate features
    :data:`DEGENERATE_MARK`; ``notes`` says why (:func:`markdown_table` lists them under the table)."""
    rows: dict[tuple, dict[str, Any]] = {}
    columns = {"linear": "Linear probe", "finetune": "Finetune", "retrieval": "R@1"}
    metric = {"linear": "top1", "finetune": "top1", "retrieval": "R@1"}
    stores = {(record.get("dataset"), record.get("store")) for record in records}
    protocols = {record_splits(record) for record in records}
    shapes = {tuple(sorted(record_clips(record).items())) for record in records}
    for record in records:
        clips = record_clips(record)
        data = (record.get("dataset"), record.get("store"))
        key = (_encoder_key(record), record.get("name"), tuple(sorted(clips.items())), data, record_splits(record))
        row = rows.setdefault(key, {**describe_encoders(record), "Linear probe": None, "Finetune": None,
                                    "R@1": None, "clips": clips, "notes": [], "sources": [],
                                    "encoders": [f"{Path(stream['checkpoint']).name} "
                                                 f"({stream['checkpoint_sha256'][:12]})"
                                                 for stream in record["streams"]]})
        value = record["results"].get(metric[record["task"]])
        if value is not None:  # (a record without it, e.g. R@5 and R@10 only, leaves an earlier one's)
            row[columns[record["task"]]] = value
        row["sources"].append(record.get("source", ""))
        notes = [f"{OTHER_CLIPS_MARK} evaluated on {note}" for note in other_clips(record)]
        if degenerate(record):
            notes.append(f"{DEGENERATE_MARK} degenerate features in the {record['task']} evaluation (a collapsed "
                         "encoder): no evidence of a representation")
        if len(stores) > 1:
            notes.append(f"on {data[0] or 'a dataset'} ({data[1] or 'a store not recorded'})")
        if len(protocols) > 1:
            notes.append(", ".join(f"{role} split {name}" for role, name in record_splits(record)) or
                         "splits not recorded")
        if len(shapes) > 1 and not other_clips(record):  # (rows of one encoder on two clip shapes read alike)
            notes.append(f"on {clips_text(clips)} clips")
        row["notes"] += [note for note in notes if note not in row["notes"]]
    named: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows.values():
        named.setdefault((row["Method"], row["Input"], tuple(row["notes"])), []).append(row)
    for alike in named.values():  # (other encoders of one default name: rows alike but for their numbers)
        if len({tuple(row["encoders"]) for row in alike}) > 1:
            for row in alike:
                row["notes"].append("encoder " + " and ".join(row["encoders"]))
    for row in rows.values():
        marks = "".join(mark for mark in (OTHER_CLIPS_MARK, DEGENERATE_MARK) if any(n[0] == mark for n in row["notes"]))
        if marks:
            row["Method"] += f" {marks}"
    return list(rows.values())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, (int, float)) else markdown_text(str(value))


_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*\[\]~|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")
"""What a Markdown viewer reads as markup inside a line: emphasis, code, links (without ``[`` no link), tables; an
underscore inside a word (``cycle1_rgb``) is none."""


_MARKDOWN_BLOCK = re.compile(r"^([#+-]|\d+(?=[.)]))")
"""What a Markdown viewer reads as a block's start at the beginning of a line: a heading, a list item (a method
named ``# best run`` was a heading in the notes' list, ``1. first`` a numbered list; a quote's ``>`` is escaped as
HTML)."""


def markdown_text(text: str) -> str:
    """``text`` as Markdown shows it as written: HTML escaped (a viewer renders it), Markdown's punctuation
    backslash-escaped (a name ``**v2**`` was bold, ``[x](url)`` a link), a ``|`` not a cell's end, a line break not a
    row's, and a block's marker at its start not one (:data:`_MARKDOWN_BLOCK`)."""
    line = " ".join(_MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(text, quote=False)).split())
    marker = _MARKDOWN_BLOCK.match(line)
    if marker is None:
        return line
    end = marker.end()
    return (line[:end] + "\\" + line[end:]) if line[:1].isdigit() else "\\" + line


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a Markdown table in the layout of the paper's Table 1, then the notes of marked rows; names and notes
    escaped (:func:`markdown_text`)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * 3) + "|"]
    lines += ["| " + " | ".join(_cell(row[column]) for column in TABLE_COLUMNS) + " |" for row in rows]
    notes = ["- " + markdown_text(f"{row['Method']} ({row['Input']}): {note}") for row in rows
             for note in row.get("notes", [])]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def write_table(rows: Sequence[dict[str, Any]], out_dir: str | Path) -> tuple[Path, Path]:
    """``table.md`` and ``table.json`` in ``out_dir``."""
    out_dir = Path(out_dir)
    return (atomic_write_text(out_dir / "table.md", markdown_table(rows)),
            atomic_write_json(out_dir / "table.json", {"columns": list(TABLE_COLUMNS), "rows": list(rows)}))


def plot_stage_recall(stages: Sequence[str], recall: dict[str, Sequence[float | None]],
                      trained: Sequence[Sequence[str]], path: str | Path,
                      title: str = "R@1 across the stages of co-training") -> Path:
    """The paper's Figure 4 as a PNG: R@1 of each view's network after each stage.

    ``recall[view][i]`` is the R@1 (percent) of that view's network after stage ``i`` (None before it
    exists); ``trained[i]`` lists the views trained in stage ``i``. The segment into stage ``i`` is solid
    for a view trained in it and dotted for a frozen one.
    """
    import matplotlib  # noqa: PLC0415 (heavy)

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # noqa: PLC0415 (heavy)
    from matplotlib.lines import Line2D  # noqa: PLC0415 (heavy)

    figure, axes = plt.subplots(figsize=(max(5.0, 1.1 * len(stages) + 2), 3.6), dpi=120)
    for view, values in recall.items():
        colour = VIEW_COLOURS.get("flow" if is_flow_view(view) else view, None)
        xs = [i for i, value in enumerate(values) if value is not None]
        for previous, current in zip(xs, xs[1:]):
            style = "-" if view in trained[current] else ":"
            axes.plot([previous, current], [values[previous], values[current]], linestyle=style, color=colour,
                      linewidth=2)
        axes.plot(xs, [values[i] for i in xs], marker="o", linestyle="none", color=colour, label=view_name(view))
    axes.set_xticks(range(len(stages)))
    axes.set_xticklabels(stages, rotation=20, ha="right", fontsize=8)
    axes.set_ylabel("R@1 (%)")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    handles, _ = axes.get_legend_handles_labels()
    handles += [Line2D([], [], color="gray", linestyle="-", label="trained in the stage"),
                Line2D([], [], color="gray", linestyle=":", label="frozen in the stage")]
    axes.legend(handles=handles, fontsize=8, loc="best")
    figure.tight_layout()
    with atomic_open(path, "wb") as file:
        figure.savefig(file, format="png")
    plt.close(figure)
    return Path(path)


def stage_encoders(run_dir: str | Path) -> list[dict[str, Any]]:
    """The points of Figure 4 for a pipeline run: the latest encoder file of every view after each stage.

    Reads ``manifest.json``: a stage's trained views take its exported encoders (``encoders``) or, for a
    single-view stage, its ``checkpoint``; the other views keep their previous file (frozen). ``logs`` maps
    each view to the training log (``log.jsonl`` beside the checkpoint) of the stage that produced it. The
    initialisation stages (cycle 0: InfoNCE of each view, trained independently) form one point, "init",
    as in the paper's figure, whose curves start from the InfoNCE networks.
    """
    run_dir = Path(run_dir)
    manifest_path = run_dir / "manifest.json"
    manifest = read_json_record(manifest_path)
    if manifest is None:
        raise DataError(f"{run_dir}: no manifest.json (not a 'coclr pipeline' run folder)")
    latest: dict[str, Path] = {}
    producers: dict[str, tuple[str, str]] = {}
    logs: dict[str, Path] = {}
    points: list[dict[str, Any]] = []
    for stage in manifest.get("stages", []):
        if not finished_stage(stage):
            continue
        trains = [view for view in str(stage.get("trains") or stage.get("view", "")).split("+") if view]
        encoders = stage.get("encoders") or {}
        for view in trains:
            relative = encoders.get(view) or (stage.get("checkpoint") if len(trains) == 1 else None)
            if relative is None:
                raise DataError(f"{manifest_path}: stage {stage.get('name')!r} lists no encoder file for {view!r}")
            latest[view] = run_dir / relative
        name = stage.get("name", f"stage{len(points)}")
        producers.update({view: (name, str(stage.get("method", ""))) for view in trains})
        for view in trains:  # a stage without a checkpoint has no log: never reuse an earlier stage's
            if stage.get("checkpoint"):
                logs[view] = (run_dir / stage["checkpoint"]).parent / "log.jsonl"
            else:
                logs.pop(view, None)
        found = find_method(str(stage.get("method")))
        initial = stage.get("cycle", 0 if found and found.from_scratch else 1) == 0
        if initial and points and points[-1]["initial"]:
            point = points[-1]
            point["trains"] += trains
            point["stages"].append(name)
            point["encoders"], point["producers"], point["logs"] = dict(latest), dict(producers), dict(logs)
            continue
        points.append({"name": "init" if initial else name, "stages": [name], "trains": trains, "initial": initial,
                       "encoders": dict(latest), "producers": dict(producers), "logs": dict(logs)})
    if not points:
        raise DataError(f"{manifest_path}: no finished stage to report")
    return points


def mined_precision(log: str | Path, view: str) -> float | None:
    """Percentage of the positives a CoCLR stage mined for ``view`` that had the query's class.

    The mean of ``<view>/mined_precision`` over the logged steps of a training log (``log.jsonl``, one
    record every ``run.log_every`` steps; the trainer logs it at the steps whose mined positives include some of a
    known class). None when the log
    does not exist or has no such value (InfoNCE and UberNCE stages, unlabelled data). Blank lines and a last
    line cut short by a killed run are ignored; any other line that is not JSON is an error naming the file and
    line (:func:`coclr.atomic.read_json_lines`).
    """
    log = Path(log)
    if not log.is_file():
        return None
    key = f"{view}/mined_precision"
    values = [float(record[key]) for record in read_json_lines(log)
              if isinstance(record, dict) and isinstance(record.get(key), (int, float))
              and math.isfinite(record[key])]
    return 100 * sum(values) / len(values) if values else None


def check_run_inputs(run_dir: str | Path, store) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """The finished stages of the run (:func:`stage_encoders`), refused in one line unless ``store`` holds the train
    and test videos of every view their encoders take (reads only: a command checks it before its output exists);
    and per split, the videos left out of some stage's evaluation because a job of its view failed (key -> reason)."""
    stages = stage_encoders(run_dir)
    streams = {(str(path), view): Stream(path, view) for stage in stages for view, path in stage["encoders"].items()}
    for (path, view), _ in streams.items():
        trained = read_clip_settings(path).get("view")
        if trained is not None and view_kind(trained) != view_kind(view):
            raise DataError(f"{path}: the run names it its {view!r} encoder, but it was trained on {trained!r} clips "
                            "(a file copied over it?): the run's folder is not as its stages wrote it")
    return stages, check_inputs(store, list(streams.values()), ["train", "test"])


def run_warnings(stages: Sequence[dict[str, Any]], store) -> list[str]:
    """What makes the figures of the run's stages on ``store`` mean less than they seem, said before any work: each
    encoder's clips unlike the store's (:func:`~coclr.eval.features.unlike_training`), and the splits' labels
    (:func:`~coclr.eval.features.label_warnings`)."""
    lines: list[str] = []
    views = sorted({view for stage in stages for view in stage["encoders"]})
    for path, view in dict.fromkeys((path, view) for stage in stages for view, path in stage["encoders"].items()):
        lines += [line for line in unlike_training(store, path, view) if line not in lines]
    return lines + label_warnings(split_entries(store, "train", views), split_entries(store, "test", views),
                                  "train", "test")


def finished_stage(stage: Any) -> bool:
    """Whether a pipeline manifest's ``stage`` entry is a finished stage (what a report of the run shows)."""
    return isinstance(stage, dict) and stage.get("status") == "done"


def report_run(run_dir: str | Path, store, out_dir: str | Path, clip_config=None, device: str = "cpu",
               cache_dir: str | Path | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Evaluate retrieval after every finished stage of a run and draw Figure 4; returns the records.

    Each (checkpoint content, view) is evaluated once (a frozen network is the same file as before), with
    features cached in ``cache_dir`` (default ``out_dir/feature_cache``). Records are written to
    ``out_dir/results/<stage>_<view>.json``, with ``mined_precision`` (percent) for stages that mined
    positives (those of another run's stages there are removed: the folder holds this run's); the plot to
    ``out_dir/stage_recall.png``.
    """

    out_dir = Path(out_dir)
    cache_dir = Path(cache_dir) if cache_dir else out_dir / "feature_cache"
    stages, _ = check_run_inputs(run_dir, store)
    by_content: dict[tuple[str, str], dict[str, Any]] = {}
    records, written = [], set()
    views = list(dict.fromkeys(view for stage in stages for view in stage["encoders"]))
    recall: dict[str, list[float | None]] = {view: [] for view in views}
    for stage in stages:  # (each on the videos that have every view of the run: the curves are of the same ones)
        for view in views:
            path = stage["encoders"].get(view)
            if path is None:
                recall[view].append(None)
                continue
            key = (checkpoint_sha256(path), view)
            if key not in by_content:
                record = evaluate_checkpoint("retrieval", store, [Stream(path, view)], clip_config or ClipConfig(),
                                             TaskOptions(cache_dir=cache_dir), device=device, progress=progress,
                                             with_views=[other for other in views if other != view])
                trained_in, method = stage["producers"][view]
                record["name"] = f"{display_name(method)} ({trained_in})"
                record["stage"] = trained_in
                precision = mined_precision(stage["logs"][view], view) if view in stage["logs"] else None
                if precision is not None:
                    record["mined_precision"] = precision
                if view in stage["trains"]:
                    atomic_write_json(out_dir / "results" / f"{trained_in}_{view}.json", record)
                    written.add(f"{trained_in}_{view}.json")
                    record["source"] = str(out_dir / "results" / f"{trained_in}_{view}.json")  # (the table's
                    records.append(record)  # provenance, as a result file read gives it: it was "")
                by_content[key] = record
            recall[view].append(by_content[key]["results"]["R@1"])
    for earlier in (out_dir / "results").glob("*.json"):  # another run's stages (this folder's own files)
        if earlier.name not in written:
            earlier.unlink()
    plot_stage_recall([stage["name"] for stage in stages], recall, [stage["trains"] for stage in stages],
                      out_dir / "stage_recall.png")
    return records


def gallery_inputs(records: Sequence[dict[str, Any]], store=None) -> tuple[dict[str, Any] | None, Any]:
    """The retrieval record the gallery shows (the last with neighbours, preferring one whose features are not
    degenerate, then one whose first stream is RGB, as the paper's Figure 5) and the store of its thumbnails
    (``store``, else the one the record names), checked: a record without a store, a store not found, or one without
    the record's videos is a :class:`DataError` naming the record and what to give (so that a command refuses it
    before it writes anything)."""
    retrievals = [record for record in records if record["task"] == "retrieval" and "neighbours" in record]
    if not retrievals:
        return None, None
    healthy = [record for record in retrievals if not degenerate(record)] or retrievals  # (a collapsed one's
    rgb_first = [record for record in healthy if record["streams"][0]["view"] == "rgb"]  # neighbours are arbitrary)
    record = (rgb_first or healthy)[-1]
    source = record.get("source", "a retrieval record")
    if store is None and not isinstance(record.get("store"), str):
        raise DataError(f"{source}: records no store for the gallery's thumbnails; give --store")
    try:
        chosen = store if store is not None else open_store(record["store"])
    except DataError as error:
        raise DataError(f"{source}: the store it records for the gallery's thumbnails: {error}; give --store"
                        ) from None
    neighbours = record["neighbours"]
    held = {entry.path for entry in chosen.index.entries}
    missing = sorted({*neighbours["query_keys"], *neighbours["gallery_keys"]} - held)
    if missing:
        raise DataError(f"{chosen.root}: holds no video {missing[0]!r} of {source} ({len(missing)} missing): give the "
                        "store it was evaluated on (--store)")
    return record, chosen


def write_report(out_dir: str | Path, records: Sequence[dict[str, Any]], store=None,
                 gallery_count: int = 8, gallery: bool = True) -> dict[str, Path]:
    """Table (Markdown + JSON) of ``records`` and, with ``gallery``, a gallery of the last retrieval record with
    neighbours (preferring one whose first stream is RGB, as the paper's Figure 5).

    The gallery reads thumbnails from ``store`` (default: the store recorded in that record).
    """

    out_dir = Path(out_dir)
    gallery_record, gallery_store = gallery_inputs(records, store) if gallery else (None, None)  # (before writing)
    markdown, table = write_table(build_table(records), out_dir)
    written = {"table.md": markdown, "table.json": table}
    if gallery_record is not None:
        cells = describe_encoders(gallery_record)
        title = f"Retrieval with {cells['Method']}, input {cells['Input']}, on {gallery_record.get('dataset', '?')}"
        written["gallery.html"] = write_gallery(out_dir / "gallery.html", gallery_store, gallery_record,
                                                gallery_count, title=title, degenerate=degenerate(gallery_record))
    return written
