"""Scores of a learn run's embeddings against labels it never trained with (``coclr learn --labels``).

With labelled videos of both a train and a test split (the manifest's ``split`` column), the test videos query
the train videos as the paper's retrieval does (:func:`coclr.eval.retrieval.retrieve`: R@k, features centred by
the gallery's mean, ties counted in expectation); otherwise every labelled video queries the others (leave one
out). The kNN accuracy is the majority class of the ``k`` nearest (a tie goes to the class met first, nearest).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from coclr.embed.output import Embeddings
from coclr.eval.retrieval import retrieve

KS = (1, 5, 10)
KNN = 5


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
    else leave-one-out."""
    test = np.array([split == "test" for split in splits])
    train = np.array([split == "train" for split in splits])
    if test.any() and train.any():
        result = retrieve(features[test], labels[test], features[train], labels[train], ks=KS)
        recall = {f"R@{k}": 100.0 * result.recall[k] for k in KS}
        knn = knn_accuracy(result.topk_indices, labels[test], labels[train], KNN)
        return {"protocol": "test videos query the train videos", "queries": int(test.sum()),
                "gallery": int(train.sum()), **recall, f"kNN@{KNN}": knn}
    recalls = {k: 0.0 for k in KS}
    knn_hits = []
    for query in range(len(features)):
        others = np.flatnonzero(np.arange(len(features)) != query)
        result = retrieve(features[[query]], labels[[query]], features[others], labels[others], ks=KS)
        for k in KS:
            recalls[k] += result.recall[k]
        knn_hits.append(knn_accuracy(result.topk_indices, labels[[query]], labels[others], KNN))
    count = max(1, len(features))
    return {"protocol": "each labelled video queries the others (leave one out)", "queries": len(features),
            "gallery": len(features) - 1, **{f"R@{k}": 100.0 * recalls[k] / count for k in KS},
            f"kNN@{KNN}": float(np.mean(knn_hits)) if knn_hits else 0.0}


def label_scores(out: Path, labels: dict[str, Any]) -> dict[str, Any]:
    """The scores of every embedding folder of ``out`` on the labelled videos (``labels`` from
    :func:`coclr.learn.run.read_labels`)."""
    scores = {}
    for folder in sorted((out / "embeddings").iterdir()):
        embeddings = Embeddings(folder)
        rows, classes, splits = [], [], []
        for path, (label, split) in labels["videos"].items():
            row = embeddings.row_of(path)
            if row is not None:
                rows.append(row)
                classes.append(label)
                splits.append(split)
        if len(rows) < 2:
            continue
        vectors = np.asarray(embeddings.videos[np.asarray(rows)], dtype=np.float32)
        scores[folder.name] = scores_of(vectors, np.asarray(classes), splits)
    return {"file": labels["file"], "videos": len(labels["videos"]), "classes": len(labels["classes"]),
            "chance": 100.0 / max(1, len(labels["classes"])), "embeddings": scores}
