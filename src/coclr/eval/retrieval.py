"""Nearest-neighbour video retrieval: test videos query train videos; Recall at k.

Protocol (paper, section 4.3): a query counts as a hit at k when any of its k nearest train videos has the
query's class; k in {1, 5, 10, 20}. Both sets are centred by the mean of the *gallery* (train) features and
L2-normalised, and compared by cosine similarity. The reference centred each set by its own mean, which
uses test-set statistics.

Memory: similarities are computed in (query chunk x gallery chunk) blocks and only a running top-k per
query is kept, so a Kinetics-size gallery (240k videos) never materialises the full similarity matrix.

Tie rule: among equal similarities, the gallery video with the lower index (its position in the train split)
ranks first, whatever the chunk sizes (the running top-k is merged with stable sorts). Chunking gives the
same neighbours as one big block except where two similarities differ by less than float rounding: BLAS
may round the last bit of a dot product differently for other block shapes (``dtype=torch.float64`` makes
that ~1e-16).

Two-stream retrieval averages the similarity matrices of the two views (computed blockwise too).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from coclr.errors import DataError

DEFAULT_KS = (1, 5, 10, 20)


@dataclasses.dataclass
class RetrievalResult:
    """Recall at each k and, per query, its nearest gallery videos (best first)."""

    ks: tuple[int, ...]
    recall: dict[int, float]
    """R@k as a fraction in [0, 1]."""
    topk_indices: np.ndarray
    """``int64 [Q, kmax]``: gallery indices of each query's nearest videos, best first."""
    topk_scores: np.ndarray
    """``float32 [Q, kmax]``: their (view-averaged) cosine similarities."""

    def to_json(self, with_neighbours: bool = True) -> dict[str, object]:
        """Plain JSON: recall in percent under ``"R@k"`` keys, plus the neighbour lists when asked."""
        out: dict[str, object] = {f"R@{k}": round(100.0 * self.recall[k], 4) for k in self.ks}
        if with_neighbours:
            out["topk_indices"] = self.topk_indices.tolist()
            out["topk_scores"] = np.round(self.topk_scores, 6).tolist()
        return out


def _ordered_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top ``k`` of each row, ordered by score descending then column ascending (exact tie rule).

    ``torch.topk`` leaves ties unordered and may pick any of several equal scores at the k-th place, so rows
    with such a boundary tie are fully sorted with a stable sort; the others are re-ordered stably.
    """
    k = min(k, scores.shape[1])
    values, indices = scores.topk(k, dim=1)
    order = indices.argsort(dim=1)
    values, indices = values.gather(1, order), indices.gather(1, order)
    values, order = values.sort(dim=1, descending=True, stable=True)
    indices = indices.gather(1, order)
    boundary = (scores >= values[:, -1:]).sum(dim=1) > k
    if bool(boundary.any()):
        rows = boundary.nonzero().squeeze(1)
        full_values, full_indices = scores[rows].sort(dim=1, descending=True, stable=True)
        values[rows], indices[rows] = full_values[:, :k], full_indices[:, :k]
    return values, indices


def _merge_topk(values: torch.Tensor, indices: torch.Tensor, new_values: torch.Tensor, new_indices: torch.Tensor,
                k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge a running top-k with the top-k of a later gallery chunk (all of whose indices are larger)."""
    values, order = torch.cat([values, new_values], dim=1).sort(dim=1, descending=True, stable=True)
    indices = torch.cat([indices, new_indices], dim=1).gather(1, order)
    return values[:, :k], indices[:, :k]


def _as_views(features: torch.Tensor | np.ndarray | Sequence) -> list[torch.Tensor]:
    if isinstance(features, (torch.Tensor, np.ndarray)):
        features = [features]
    return [torch.as_tensor(np.asarray(f) if not isinstance(f, torch.Tensor) else f) for f in features]


def topk_neighbours(query: torch.Tensor | np.ndarray | Sequence, gallery: torch.Tensor | np.ndarray | Sequence,
                    k: int, query_chunk: int = 1024, gallery_chunk: int = 8192, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32, center: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most similar gallery rows of each query row, best first (see the module's tie rule).

    ``query`` and ``gallery`` are one ``[N, D]`` feature matrix each, or a list of them (one per view, the
    same videos in the same order): the similarity is then the mean of the views' cosine similarities. Each
    view is centred by its gallery mean (unless ``center`` is false) and L2-normalised first, one chunk at a
    time, so memory-mapped arrays of millions of rows are read without being copied whole. Returns
    ``(scores [Q, k], indices [Q, k])``.
    """
    queries, galleries = _as_views(query), _as_views(gallery)
    if len(queries) != len(galleries) or not queries:
        raise ValueError(f"need the same number of views for queries and gallery, got {len(queries)} and {len(galleries)}")
    num_query, num_gallery = len(queries[0]), len(galleries[0])
    for name, views, n in (("query", queries, num_query), ("gallery", galleries, num_gallery)):
        for view, feats in enumerate(views):
            if feats.ndim != 2 or len(feats) != n:
                raise DataError(f"{name} features of view {view}: expected [{n}, D], got {tuple(feats.shape)}")
    if num_gallery == 0 or num_query == 0:
        raise DataError(f"retrieval needs queries and gallery videos, got {num_query} and {num_gallery}")
    device = torch.device(device)
    means = [g.to(device, dtype).mean(dim=0, keepdim=True) if center else None for g in galleries]

    def prepared(views: list[torch.Tensor], start: int, size: int, name: str) -> list[torch.Tensor]:
        """Rows ``start:start + size`` of every view, centred and L2-normalised (a zero row stays zero)."""
        out = []
        for view, (feats, mean) in enumerate(zip(views, means)):
            rows = feats[start : start + size].to(device, dtype)
            rows = rows - mean if mean is not None else rows
            norms = rows.norm(dim=1, keepdim=True)  # not finite iff a value of the row is not (cheaper to test)
            if not bool(torch.isfinite(norms).all()):
                raise DataError(f"{name} features of view {view} contain NaN or infinite values")
            out.append(rows / norms.clamp_min(1e-12))  # F.normalize's formula
        return out

    k = min(k, num_gallery)
    all_scores, all_indices = [], []
    for q_start in range(0, num_query, query_chunk):
        query_rows = prepared(queries, q_start, query_chunk, "query")
        best_values = best_indices = None
        for g_start in range(0, num_gallery, gallery_chunk):
            gallery_rows = prepared(galleries, g_start, gallery_chunk, "gallery")
            scores = sum(q @ g.T for q, g in zip(query_rows, gallery_rows))
            scores = scores / len(query_rows)
            values, indices = _ordered_topk(scores, k)
            indices = indices + g_start
            if best_values is None:
                best_values, best_indices = values, indices
            else:
                best_values, best_indices = _merge_topk(best_values, best_indices, values, indices, k)
        all_scores.append(best_values.float().cpu())
        all_indices.append(best_indices.cpu())
    return torch.cat(all_scores).numpy(), torch.cat(all_indices).numpy().astype(np.int64)


def recall_at_k(topk_indices: np.ndarray, query_labels: np.ndarray, gallery_labels: np.ndarray,
                ks: Sequence[int] = DEFAULT_KS) -> dict[int, float]:
    """Fraction of queries with at least one same-class video among their k nearest (k capped at the
    number of neighbours available)."""
    same = np.asarray(gallery_labels)[topk_indices] == np.asarray(query_labels)[:, None]
    return {int(k): float(same[:, :k].any(axis=1).mean()) for k in ks}


def retrieve(query: torch.Tensor | np.ndarray | Sequence, query_labels: np.ndarray,
             gallery: torch.Tensor | np.ndarray | Sequence, gallery_labels: np.ndarray,
             ks: Sequence[int] = DEFAULT_KS, query_chunk: int = 1024, gallery_chunk: int = 8192,
             device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> RetrievalResult:
    """R@k of test ``query`` features against train ``gallery`` features (one view, or a list of views for
    two-stream retrieval), with each query's ``max(ks)`` nearest gallery videos."""
    ks = tuple(sorted({int(k) for k in ks}))
    if not ks or ks[0] < 1:
        raise ValueError(f"k values must be >= 1, got {ks}")
    scores, indices = topk_neighbours(query, gallery, ks[-1], query_chunk, gallery_chunk, device, dtype)
    return RetrievalResult(ks, recall_at_k(indices, query_labels, gallery_labels, ks), indices, scores)


def evaluate_retrieval(store, streams: Sequence, config=None, ks: Sequence[int] = DEFAULT_KS,
                       train_split: str = "train", test_split: str = "test", device: str | torch.device = "cpu",
                       cache_dir=None, progress: bool = True) -> dict[str, object]:
    """The retrieval protocol for one checkpoint (or two: two-stream) on an evaluation store, as a JSON record.

    Features come from :func:`coclr.eval.features.cached_features`; with two streams the result is the
    fused (similarity-averaged) retrieval and ``per_stream`` holds each stream alone. The record keeps each
    test query's nearest train videos (``neighbours``) for the retrieval gallery.
    """
    from coclr.eval.features import ClipConfig, cached_features, check_inputs, file_sha256, input_record
    from coclr.eval.fusion import check_same_videos

    config = config or ClipConfig()
    check_inputs(store, list(streams), [train_split, test_split])
    shas = [file_sha256(stream.checkpoint) for stream in streams]
    train, test = [], []
    for stream, sha in zip(streams, shas):
        for split, out in ((train_split, train), (test_split, test)):
            out.append(cached_features(stream.checkpoint, store, stream.view, split, config, cache_dir, device,
                                       checkpoint_sha256=sha, progress=progress))
    for other_train, other_test in zip(train[1:], test[1:]):
        check_same_videos(train[0].keys, other_train.keys, "two-stream retrieval (train videos)")
        check_same_videos(test[0].keys, other_test.keys, "two-stream retrieval (test videos)")
    fused = retrieve([f.features for f in test], test[0].labels, [f.features for f in train], train[0].labels,
                     ks, device=device)
    record = {"task": "retrieval", **input_record(store, list(streams), {"train": train_split, "test": test_split}, shas),
              "config": {**dataclasses.asdict(config), "ks": list(fused.ks)}, "results": fused.to_json(False)}
    if len(streams) > 1:
        record["per_stream"] = [retrieve(q.features, q.labels, g.features, g.labels, ks, device=device).to_json(False)
                                for q, g in zip(test, train)]
    record["neighbours"] = {"query_keys": test[0].keys, "query_labels": test[0].labels.tolist(),
                            "gallery_keys": train[0].keys, "gallery_labels": train[0].labels.tolist(),
                            "classes": list(store.index.classes), **fused.to_json(True)}
    for k in fused.ks:
        record["neighbours"].pop(f"R@{k}")
    return record
