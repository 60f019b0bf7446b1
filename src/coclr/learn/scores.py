"""Scores of a learn run's embeddings against labels it never trained with (``coclr learn --labels``).

With labelled videos of both a train and a test split (the manifest's ``split`` column), the test videos query
the train videos as the paper's retrieval does (:func:`coclr.eval.retrieval.retrieve`: R@k, features centred by
the gallery's mean, ties counted in expectation); otherwise every labelled video queries the others (leave one
out). The kNN accuracy is the majority class of the ``k`` nearest (a tie goes to the class met first, nearest).
A measure of ``k`` neighbours is left out (None) when the gallery holds ``k`` videos or fewer: every query then
meets the whole gallery, and the figure tells the labels, not the features.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from coclr.atomic import file_sha256
from coclr.embed.output import Embeddings
from coclr.errors import DataError, why_no_file
from coclr.eval.retrieval import retrieve
from coclr.video.indexes import SPLITS, manifest_labels, manifest_rows

KS = (1, 5, 10)
KNN = 5
MIN_LABELLED = 2
"""Fewest labelled input videos that can be scored (each query needs another labelled video to retrieve)."""
SHOWN = 3
"""Rows a note or a refusal names (the count is always given)."""


def read_labels(path: str, paths: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The labels of ``path`` (a ``--format csv`` manifest ``path,label[,split[,group]]``, UTF-8 with or without a
    byte-order mark; paths relative to its folder, or absolute) for the input videos ``paths`` they name:
    ``{"file", "sha256", "classes", "videos": {absolute path: (label, split)}}`` (the file's content hash: an edited
    file scores again), and notes (one line each) on its rows that
    are not scored: rows naming no input video, rows without a label, a video's further rows of its label. Refused in
    one line, before any work, naming the file and its lines: text that is not UTF-8, rows without a path or of an
    unknown split, a video given two labels or splits, or fewer than :data:`MIN_LABELLED` labelled input videos."""
    if not os.path.isfile(path):  # (it said "x.csv: manifest not found", naming no option)
        raise DataError(f"--labels {path}: {why_no_file(path, 'labels file')}")
    folder = os.path.dirname(os.path.abspath(path))
    inputs = {os.path.realpath(p): p for p in paths}  # a row may name a video through a link, or the link's target
    bad, outside, unlabelled, rows, again = [], [], [], [], []
    first: dict[str, tuple[int, str, str]] = {}
    for number, record in manifest_rows(path):
        split = record.get("split") or "train"
        if not record.get("path") or split not in SPLITS:
            bad.append(f"line {number} ({'no path' if not record.get('path') else f'split {split!r}'})")
            continue
        video = inputs.get(os.path.realpath(os.path.join(folder, record["path"])))
        if video is None:
            outside.append(record["path"])
        elif not record.get("label"):
            unlabelled.append(f"line {number}")
        elif video in first:
            line, label, kind = first[video]
            if (label, kind) != (record["label"], split):
                bad.append(f"line {number} ({record['path']} is {record['label']!r}/{split}, line {line} says "
                           f"{label!r}/{kind})")
            else:
                again.append(f"line {number}")
        else:
            first[video] = (number, record["label"], split)
            rows.append((video, record["label"], split))
    if bad:
        raise DataError(f"--labels {path}: {len(bad)} malformed row(s): {', '.join(bad[:SHOWN])}"
                        f"{' ...' if len(bad) > SHOWN else ''} (each row: path,label[,split[,group]], split one of "
                        f"{', '.join(SPLITS)}); mend them and run again")
    if len(rows) < MIN_LABELLED:
        separator = next((name for mark, name in ((";", "semicolons"), ("\t", "tabs"))
                          if any(mark in other for other in outside)), None)
        hint = (f"; its rows are separated by {separator}: save it with commas (a spreadsheet's \"CSV UTF-8\")"
                if separator else "")
        raise DataError(f"--labels {path}: {len(rows)} of its rows label an input video ({len(outside)} name other "
                        f"files, e.g. {', '.join(outside[:SHOWN]) or 'none'}; paths are taken from its folder, "
                        f"{folder}, or as absolute): at least {MIN_LABELLED} are needed to score anything{hint}")
    names, ids = manifest_labels([label for _, label, _ in rows])
    used = sorted(set(ids))  # the classes these videos have (labels 1 and 5 are two classes, not "0".."5")
    classes, renumbered = [names[number] for number in used], {number: new for new, number in enumerate(used)}
    ids = [renumbered[number] for number in ids]
    videos = {video: (label, split) for (video, _, split), label in zip(rows, ids)}
    notes = []
    if outside:
        notes.append(f"--labels {path}: {len(outside)} row(s) name videos that are not among the inputs, not scored "
                     f"(e.g. {', '.join(outside[:SHOWN])})")
    if unlabelled:
        notes.append(f"--labels {path}: {len(unlabelled)} row(s) have no label, not scored "
                     f"({', '.join(unlabelled[:SHOWN])}{' ...' if len(unlabelled) > SHOWN else ''})")
    if again:
        notes.append(f"--labels {path}: {len(again)} row(s) repeat a video's row, counted once "
                     f"({', '.join(again[:SHOWN])}{' ...' if len(again) > SHOWN else ''})")
    return {"file": os.path.abspath(path), "sha256": file_sha256(path), "classes": classes, "videos": videos}, notes


def knn_accuracy(topk_indices: np.ndarray, query_labels: np.ndarray, gallery_labels: np.ndarray, k: int) -> float:
    """The share of queries whose ``k`` nearest gallery videos' majority class is theirs (percent)."""
    hits = 0
    for neighbours, label in zip(np.asarray(topk_indices)[:, :k], query_labels):
        votes = Counter(int(gallery_labels[i]) for i in neighbours)
        best = max(votes.values())
        winner = next(int(gallery_labels[i]) for i in neighbours if votes[int(gallery_labels[i])] == best)
        hits += winner == int(label)
    return 100.0 * hits / max(1, len(query_labels))


def scores_of(features: np.ndarray, labels: np.ndarray, splits: list[str]) -> dict[str, Any]:
    """R@k and kNN accuracy (percent) of labelled video features: test -> train when both splits have videos,
    else leave-one-out. A query whose class no video of its gallery has (nothing to find: it could only miss) is
    left out, and said; with none left, nothing is measured (every measure None)."""
    test = np.array([split == "test" for split in splits])
    train = np.array([split == "train" for split in splits])
    if test.any() and train.any():
        gallery = int(train.sum())
        asked = np.flatnonzero(test)
        kept = asked[np.isin(labels[asked], labels[train])]
        found = {"protocol": "test videos query the train videos", "queries": len(kept), "gallery": gallery,
                 **_left_out(len(asked) - len(kept))}
        if not len(kept):
            return {**found, **_nothing_to_find()}
        result = retrieve(features[kept], labels[kept], features[train], labels[train], ks=KS)
        recall = {f"R@{k}": 100.0 * result.recall[k] if k < gallery else None for k in KS}
        knn = knn_accuracy(result.topk_indices, labels[kept], labels[train], KNN) if KNN < gallery else None
        return {**found, **recall, f"kNN@{KNN}": knn, **_unmeasured(gallery)}
    gallery = len(features) - 1
    classes, counts = np.unique(labels, return_counts=True)
    kept = np.flatnonzero(np.isin(labels, classes[counts > 1]))
    found = {"protocol": "each labelled video queries the others (leave one out)", "queries": len(kept),
             "gallery": gallery, **_left_out(len(features) - len(kept))}
    if not len(kept):
        return {**found, **_nothing_to_find()}
    recalls = {k: 0.0 for k in KS}
    knn_hits = []
    for query in kept:
        others = np.flatnonzero(np.arange(len(features)) != query)
        result = retrieve(features[[query]], labels[[query]], features[others], labels[others], ks=KS)
        for k in KS:
            recalls[k] += result.recall[k]
        knn_hits.append(knn_accuracy(result.topk_indices, labels[[query]], labels[others], KNN))
    return {**found, **{f"R@{k}": 100.0 * recalls[k] / len(kept) if k < gallery else None for k in KS},
            f"kNN@{KNN}": float(np.mean(knn_hits)) if KNN < gallery else None, **_unmeasured(gallery)}


def _left_out(count: int) -> dict[str, str]:
    """``{"left_out": why}`` when ``count`` queries of :func:`scores_of` have nothing to find."""
    return {"left_out": f"{count} labelled video(s) whose class no video of their gallery has (nothing to find: they "
                        "could only miss) are left out of the queries"} if count else {}


def _nothing_to_find() -> dict[str, Any]:
    """Every measure of :func:`scores_of` None, and why: no query has a video of its class to find."""
    return {**{f"R@{k}": None for k in KS}, f"kNN@{KNN}": None,
            "unmeasured": "nothing measured: no labelled video has another of its class to find (label at least "
                          "two videos of a class)"}


def _unmeasured(gallery: int) -> dict[str, str]:
    """``{"unmeasured": why}`` when a gallery of ``gallery`` videos leaves measures of :func:`scores_of` out."""
    left = [f"R@{k}" for k in KS if k >= gallery] + ([f"kNN@{KNN}"] if KNN >= gallery else [])
    if not left:
        return {}
    return {"unmeasured": f"{', '.join(left)} not measured: the gallery holds {gallery} labelled video(s), and a "
                          "measure of k neighbours needs more than k (label more videos)"}


def label_scores(out: Path, labels: dict[str, Any]) -> dict[str, Any]:
    """The scores of every embedding folder of ``out`` on the labelled videos (``labels`` from
    :func:`coclr.learn.run.read_labels`)."""
    scores, vectorless = {}, set()
    for folder in sorted((out / "embeddings").iterdir()):
        embeddings = Embeddings(folder)
        rows, classes, splits = [], [], []
        for path, (label, split) in labels["videos"].items():
            row = embeddings.row_of(path)
            if row is None:
                vectorless.add(path)
                continue
            rows.append(row)
            classes.append(label)
            splits.append(split)
        if len(rows) < MIN_LABELLED:
            continue
        vectors = np.asarray(embeddings.videos[np.asarray(rows)], dtype=np.float32)
        scores[folder.name] = scores_of(vectors, np.asarray(classes), splits)
    scored = len(labels["videos"]) - len(vectorless)
    notes = []
    if vectorless:
        shown = ", ".join(sorted(vectorless)[:SHOWN]) + (" ..." if len(vectorless) > SHOWN else "")
        notes.append(f"{len(vectorless)} labelled video(s) have no vector (they failed, listed with the reason): "
                     f"{shown}; each embedding is scored on the labelled videos it holds")
    notes.extend(dict.fromkeys(entry[key] for entry in scores.values() for key in ("left_out", "unmeasured")
                               if key in entry))
    if not scores:
        notes.append(f"nothing scored: {scored} labelled video(s) have a vector, and at least {MIN_LABELLED} are "
                     "needed; label more of the videos")
    kept = [(label, split) for path, (label, split) in labels["videos"].items() if path not in vectorless]
    return {"file": labels["file"], "videos": scored, "labelled": len(labels["videos"]),
            "classes": len({label for label, _ in kept}),
            "chance": chance_recall(np.asarray([label for label, _ in kept]), [split for _, split in kept]),
            "embeddings": scores, "notes": notes}


def chance_recall(labels: np.ndarray, splits: list[str]) -> float:
    """The R@1 (percent) of features that order the videos at random, under :func:`scores_of`'s protocol: each
    query's share of its gallery in its class, averaged over the queries it keeps (one over the classes counted
    those no scored video has; 0 where it keeps none)."""
    test = np.array([split == "test" for split in splits], dtype=bool)
    train = np.array([split == "train" for split in splits], dtype=bool)
    if test.any() and train.any():
        shares = [float((labels[train] == label).mean()) for label in labels[test]]
    elif len(labels) > 1:
        shares = [float(((labels == label).sum() - 1) / (len(labels) - 1)) for label in labels]
    else:
        return 0.0
    kept = [share for share in shares if share > 0]  # (a query with nothing to find is left out: scores_of)
    return 100.0 * float(np.mean(kept)) if kept else 0.0


def stage_scorer(labels: dict[str, Any], root: str) -> Callable[[list[str], np.ndarray], dict[str, Any] | None]:
    """The scores of a stage's video features on the labelled videos among them (:func:`scores_of`; store keys are
    relative to ``root``), for :func:`coclr.learn.stages.stage_quality`; None when fewer than two are labelled."""

    def score(keys: list[str], features: np.ndarray) -> dict[str, Any] | None:
        rows, classes, splits = [], [], []
        for row, key in enumerate(keys):
            found = labels["videos"].get(os.path.join(root, key))
            if found is not None:
                rows.append(row)
                classes.append(found[0])
                splits.append(found[1])
        if len(rows) < MIN_LABELLED:
            return None
        return scores_of(np.asarray(features[rows], dtype=np.float32), np.asarray(classes), splits)

    return score
