"""A quick representation check during pretraining: nearest-neighbour R@1 on the store's labelled splits, and the
gallery features' health (:mod:`coclr.eval.health`: effective rank, leave-one-out nearest-neighbour accuracy),
so that a run's log shows the epoch its encoder collapsed.

Labels are used only to report these numbers, never by the training itself (the paper's Figure 4).
"""

from __future__ import annotations

import torch
from torch import nn

from coclr.errors import DataError
from coclr.eval.features import ClipConfig, extract_features
from coclr.eval.health import feature_health, store_groups
from coclr.eval.retrieval import retrieve
from coclr.store.clipstore import ClipStore


def knn_recall(backbone: nn.Module, store: str, view: str, length: int, stride: int, size: int,
               device: torch.device | str = "cpu", query_split: str = "test", gallery_split: str = "train",
               batch_size: int = 32) -> dict[str, float]:
    """R@1 and R@5 (percent) of ``query_split`` videos retrieving ``gallery_split`` videos, and the gallery
    features' effective rank, leave-one-out nearest-neighbour accuracy (percent) and whether they carry nothing
    (``knn_collapsed``, 1 or 0); empty when the store has no gallery split, only the gallery's measures while the
    query split's view is not built yet, or when either split lacks labels (judged without them: by the spread,
    :func:`~coclr.eval.health.feature_health`)."""
    clip_store = ClipStore(store)
    splits = {entry.split for entry in clip_store.index.entries}
    if gallery_split not in splits:
        return {}
    config = ClipConfig(length=length, stride=stride, size=size, batch_size=batch_size)
    gallery = extract_features(backbone, clip_store, view, gallery_split, config, device, progress=False)
    health = feature_health(gallery.features, gallery.labels, store_groups(clip_store, gallery.keys))
    found = {"knn_rank": health["effective_rank"], "knn_nn_accuracy": health["nn_accuracy"],
             "knn_collapsed": float(health["degenerate"])}
    query = None
    if query_split in splits and not clip_store.index.unlabelled([query_split, gallery_split]):
        try:  # the study builds the test split's flow beside training: until it is built, only the gallery's health
            query = extract_features(backbone, clip_store, view, query_split, config, device, progress=False)
        except DataError:
            pass
    if query is not None:
        result = retrieve(query.features, query.labels, gallery.features, gallery.labels, ks=(1, 5))
        found.update({"knn_R@1": 100.0 * result.recall[1], "knn_R@5": 100.0 * result.recall[5]})
    return {key: value for key, value in found.items() if value is not None}
