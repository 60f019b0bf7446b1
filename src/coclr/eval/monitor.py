"""A quick representation check during pretraining: nearest-neighbour R@1 on the store's labelled splits.

Labels are used only to report this number, never by the training itself (the paper's Figure 4).
"""

from __future__ import annotations

import torch
from torch import nn

from coclr.eval.features import ClipConfig, extract_features
from coclr.eval.retrieval import retrieve
from coclr.store.clipstore import ClipStore


def knn_recall(backbone: nn.Module, store: str, view: str, length: int, stride: int, size: int,
               device: torch.device | str = "cpu", query_split: str = "test", gallery_split: str = "train",
               batch_size: int = 32) -> dict[str, float]:
    """R@1 and R@5 (percent) of ``query_split`` videos retrieving ``gallery_split`` videos; empty when the
    store has no such labelled splits."""
    clip_store = ClipStore(store)
    splits = {entry.split for entry in clip_store.index.entries}
    if not {query_split, gallery_split} <= splits:
        return {}
    config = ClipConfig(length=length, stride=stride, size=size, batch_size=batch_size)
    gallery = extract_features(backbone, clip_store, view, gallery_split, config, device, progress=False)
    query = extract_features(backbone, clip_store, view, query_split, config, device, progress=False)
    result = retrieve(query.features, query.labels, gallery.features, gallery.labels, ks=(1, 5))
    return {"knn_R@1": 100.0 * result.recall[1], "knn_R@5": 100.0 * result.recall[5]}
