"""Nearest-neighbour video retrieval: test videos query train videos; Recall at k.

Protocol (paper, section 4.3): a query counts as a hit at k when any of its k nearest train videos has the
query's class; k in {1, 5, 10, 20}. Both sets are centred by the mean of the *gallery* (train) features and
L2-normalised, and compared by cosine similarity. The reference centred each set by its own mean, which
uses test-set statistics.

Memory: similarities are computed in (query chunk x gallery chunk) blocks and only a running top-k per
query is kept, so a Kinetics-size gallery (240k videos) never materialises the full similarity matrix, and
features are centred and normalised chunk by chunk, so memory-mapped arrays are never copied whole.

Ties: in the neighbour lists, among equal similarities the gallery video with the lower index (its position in
the train split) ranks first, whatever the chunk sizes (the running top-k is merged with stable sorts). R@k does
not depend on that order: ties at the k-th place count in expectation over a random order
(:func:`recall_with_ties`), so constant features (a collapsed encoder) score chance, not what the gallery's
order happens to give, nor what the rounding of their batches gives (a view whose gallery lies wholly within
rounding of its mean ties every similarity: :func:`coclr.eval.exact.within_rounding`). Equal rows always tie:
similarities are exact dot products of quantised unit vectors (:mod:`coclr.eval.exact`), so neighbours, scores and
R@k are the same bits on every CPU and device, for every chunk size, thread count and gallery order (the gallery mean
is order-free too).

Two-stream retrieval averages the similarity matrices of the two views (computed blockwise too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from coclr.errors import DataError
from coclr.eval.exact import gallery_mean, unit_rows, within_rounding
from coclr.eval.features import ClipConfig, cached_features, check_inputs, input_record, stream_views
from coclr.eval.fusion import check_same_videos
from coclr.eval.health import health_warnings, streams_health
from coclr.models.loading import checkpoint_sha256

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


def _as_views(features: torch.Tensor | np.ndarray | Sequence) -> list[np.ndarray]:
    """The views as arrays on the CPU (memory-mapped arrays stay memory-mapped: rows are read chunk by chunk)."""
    if isinstance(features, (torch.Tensor, np.ndarray)):
        features = [features]
    return [f.detach().cpu().numpy() if isinstance(f, torch.Tensor) else np.asanyarray(f) for f in features]


class _Rows:
    """The checked views of the queries and the gallery, handed out in chunks of rows centred by the gallery's mean
    (unless ``center`` is false), L2-normalised and quantised by :func:`coclr.eval.exact.unit_rows`, as float64 on
    the compute device: a row's values depend on the row alone, so a block computed twice, in another chunk or on
    another CPU gives the same bits, and memory-mapped arrays of millions of rows are never copied whole."""

    def __init__(self, query, gallery, device: str | torch.device, center: bool) -> None:
        self.queries, self.galleries = _as_views(query), _as_views(gallery)
        if len(self.queries) != len(self.galleries) or not self.queries:
            raise ValueError(f"need the same number of views for queries and gallery, got {len(self.queries)} and "
                             f"{len(self.galleries)}")
        self.num_query, self.num_gallery = len(self.queries[0]), len(self.galleries[0])
        for name, views, n in (("query", self.queries, self.num_query), ("gallery", self.galleries,
                                                                          self.num_gallery)):
            for view, feats in enumerate(views):
                if feats.ndim != 2 or len(feats) != n:
                    raise DataError(f"{name} features of view {view}: expected [{n}, D], got {tuple(feats.shape)}")
        for view, (queries, gallery) in enumerate(zip(self.queries, self.galleries)):
            if queries.shape[1] != gallery.shape[1]:
                raise DataError(f"query and gallery features of view {view} differ in size: {queries.shape[1]} vs "
                                f"{gallery.shape[1]} dimensions (from different encoders?)")
        if self.num_gallery == 0 or self.num_query == 0:
            raise DataError(f"retrieval needs queries and gallery videos, got {self.num_query} and "
                            f"{self.num_gallery}")
        self.device = torch.device(device)
        self.means = [gallery_mean(g) if center else None for g in self.galleries]
        # a view whose gallery is one feature up to rounding (a collapsed encoder): every similarity of it is 0, a tie
        # (centred, its rows were that rounding normalised, which ranked the gallery by the batch size)
        self.rounding = [mean is not None and within_rounding(g, mean) for g, mean in zip(self.galleries, self.means)]

    def _chunk(self, views: list[np.ndarray], start: int, size: int, name: str) -> list[torch.Tensor]:
        out = []
        for view, (feats, mean, rounding) in enumerate(zip(views, self.means, self.rounding)):
            try:
                rows = unit_rows(feats[start : start + size], mean)
            except ValueError:
                raise DataError(f"{name} features of view {view} contain NaN or infinite values") from None
            out.append(torch.from_numpy(rows).to(self.device, torch.float64) * (0.0 if rounding else 1.0))
        return out

    def query(self, start: int, size: int) -> list[torch.Tensor]:
        return self._chunk(self.queries, start, size, "query")

    def gallery(self, start: int, size: int) -> list[torch.Tensor]:
        return self._chunk(self.galleries, start, size, "gallery")


def _block_scores(query_rows: list[torch.Tensor], gallery_rows: list[torch.Tensor]) -> torch.Tensor:
    """The view-averaged similarities of a block of queries and gallery videos, float64 and exact for each view
    (quantised rows: see :mod:`coclr.eval.exact`), so equal rows tie wherever they fall in the block."""
    return sum(q @ g.T for q, g in zip(query_rows, gallery_rows)) / len(query_rows)


def _topk(rows: _Rows, k: int, query_chunk: int, gallery_chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The running top-k over gallery chunks, float64 on the compute device: ``(scores, indices) [Q, k]``."""
    all_scores, all_indices = [], []
    for q_start in range(0, rows.num_query, query_chunk):
        query_rows = rows.query(q_start, query_chunk)
        best_values = best_indices = None
        for g_start in range(0, rows.num_gallery, gallery_chunk):
            values, indices = _ordered_topk(_block_scores(query_rows, rows.gallery(g_start, gallery_chunk)), k)
            indices = indices + g_start
            if best_values is None:
                best_values, best_indices = values, indices
            else:
                best_values, best_indices = _merge_topk(best_values, best_indices, values, indices, k)
        all_scores.append(best_values)
        all_indices.append(best_indices)
    return torch.cat(all_scores), torch.cat(all_indices)


def topk_neighbours(query: torch.Tensor | np.ndarray | Sequence, gallery: torch.Tensor | np.ndarray | Sequence,
                    k: int, query_chunk: int = 1024, gallery_chunk: int = 8192, device: str | torch.device = "cpu",
                    center: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most similar gallery rows of each query row, best first (see the module's tie rule).

    ``query`` and ``gallery`` are one ``[N, D]`` feature matrix each, or a list of them (one per view, the
    same videos in the same order): the similarity is then the mean of the views' cosine similarities. Each
    view is centred by its gallery mean (unless ``center`` is false) and L2-normalised first, one chunk at a
    time, so memory-mapped arrays of millions of rows are read without being copied whole. Returns
    ``(scores [Q, k], indices [Q, k])``.
    """
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    rows = _Rows(query, gallery, device, center)
    scores, indices = _topk(rows, min(int(k), rows.num_gallery), query_chunk, gallery_chunk)
    return scores.float().cpu().numpy(), indices.cpu().numpy().astype(np.int64)


def class_codes(query_labels, gallery_labels, num_query: int, num_gallery: int) -> tuple[np.ndarray, np.ndarray]:
    """The labels of the queries and of the gallery as integer codes of one numbering (labels may be any values
    that compare: class indices, names), or one :class:`DataError` where a side's count is not its videos'."""
    labels = []
    for name, given, count in (("query", query_labels, num_query), ("gallery", gallery_labels, num_gallery)):
        array = np.asarray(given)
        if array.ndim != 1 or len(array) != count:
            raise DataError(f"{name} labels: expected one per video ({count}), got shape {array.shape}")
        labels.append(array)
    try:
        _, codes = np.unique(np.concatenate(labels), return_inverse=True)
    except TypeError as error:
        raise DataError(f"labels must be values of one kind that compare (class indices or names): {error}") from None
    codes = codes.reshape(-1).astype(np.int64)
    return codes[:num_query], codes[num_query:]


def recall_at_k(topk_indices: np.ndarray, query_labels: np.ndarray, gallery_labels: np.ndarray,
                ks: Sequence[int] = DEFAULT_KS) -> dict[int, float]:
    """Fraction of queries with at least one same-class video among their k nearest (k capped at the
    number of neighbours available), in the order of ``topk_indices`` (ties as they were broken there)."""
    same = np.asarray(gallery_labels)[topk_indices] == np.asarray(query_labels)[:, None]
    return {int(k): float(same[:, :k].any(axis=1).mean()) for k in ks}


def recall_with_ties(rows: _Rows, kth_scores: torch.Tensor, ks: Sequence[int],
                     query_labels: np.ndarray, gallery_labels: np.ndarray, query_chunk: int = 1024,
                     gallery_chunk: int = 8192) -> dict[int, float]:
    """R@k with ties at the k-th place broken at random, in expectation: a query scores 1 when a gallery video of
    its class is strictly more similar than its k-th neighbour, else the probability that the places left go to
    at least one video of its class among those tied with the k-th (hypergeometric). Without ties this is the
    usual R@k; with constant features (every similarity tied) it is the share of the query's class in the
    gallery, chance, never a score the gallery's order gives. ``kth_scores [Q, len(ks)]``: the k-th best score of
    each query for each k, from the same blocks (:func:`_topk`)."""
    device = kth_scores.device
    query_labels = torch.as_tensor(np.asarray(query_labels), device=device)
    gallery_labels = torch.as_tensor(np.asarray(gallery_labels), device=device)
    places = torch.tensor([min(k, rows.num_gallery) for k in ks], device=device, dtype=torch.float64)
    hits = []
    for q_start in range(0, rows.num_query, query_chunk):
        chunk = slice(q_start, q_start + query_chunk)
        query_rows = rows.query(q_start, query_chunk)
        kth = kth_scores[chunk].unsqueeze(2)  # [q, K, 1]
        counts = torch.zeros(4, *kth.shape[:2], dtype=torch.float64, device=device)  # above, above+, tied, tied+
        for g_start in range(0, rows.num_gallery, gallery_chunk):
            columns = slice(g_start, g_start + gallery_chunk)
            scores = _block_scores(query_rows, rows.gallery(g_start, gallery_chunk)).unsqueeze(1)  # [q, 1, g]
            positive = (query_labels[chunk, None] == gallery_labels[None, columns]).unsqueeze(1)
            above, tied = scores > kth, scores == kth
            counts += torch.stack([above.sum(2), (above & positive).sum(2), tied.sum(2),
                                   (tied & positive).sum(2)]).double()
        above, above_positive, tied, tied_positive = counts
        left = places - above  # places the tied videos fill (>= 1: the k-th itself is tied with itself)
        negatives = tied - tied_positive
        log_miss = (torch.lgamma(negatives + 1) - torch.lgamma((negatives - left).clamp_min(0) + 1)
                    - torch.lgamma(tied + 1) + torch.lgamma(tied - left + 1))
        miss = torch.where(negatives >= left, log_miss.exp(), torch.zeros_like(log_miss))
        hits.append(torch.where(above_positive > 0, torch.ones_like(miss), 1 - miss))
    mean = torch.cat(hits).mean(dim=0).tolist()
    return {int(k): float(value) for k, value in zip(ks, mean)}


def retrieve(query: torch.Tensor | np.ndarray | Sequence, query_labels: np.ndarray,
             gallery: torch.Tensor | np.ndarray | Sequence, gallery_labels: np.ndarray,
             ks: Sequence[int] = DEFAULT_KS, query_chunk: int = 1024, gallery_chunk: int = 8192,
             device: str | torch.device = "cpu") -> RetrievalResult:
    """R@k of test ``query`` features against train ``gallery`` features (one view, or a list of views for
    two-stream retrieval), with each query's ``max(ks)`` nearest gallery videos. Ties at the k-th place count
    in expectation (:func:`recall_with_ties`); the neighbour lists break them by gallery index."""
    ks = tuple(sorted({int(k) for k in ks}))
    if not ks or ks[0] < 1:
        raise ValueError(f"k values must be >= 1, got {ks}")
    rows = _Rows(query, gallery, device, center=True)
    query_labels, gallery_labels = class_codes(query_labels, gallery_labels, rows.num_query, rows.num_gallery)
    scores, indices = _topk(rows, min(ks[-1], rows.num_gallery), query_chunk, gallery_chunk)
    kth = scores[:, [min(k, rows.num_gallery) - 1 for k in ks]]
    recall = recall_with_ties(rows, kth, ks, query_labels, gallery_labels, query_chunk, gallery_chunk)
    return RetrievalResult(ks, recall, indices.cpu().numpy().astype(np.int64), scores.float().cpu().numpy())


def evaluate_retrieval(store, streams: Sequence, config=None, ks: Sequence[int] = DEFAULT_KS,
                       train_split: str = "train", test_split: str = "test", device: str | torch.device = "cpu",
                       cache_dir=None, progress: bool = True, with_views: Sequence[str] = ()) -> dict[str, object]:
    """The retrieval protocol for one checkpoint (or two: two-stream) on an evaluation store, as a JSON record, on
    the videos that have every stream's view and the views of ``with_views``.

    Features come from :func:`coclr.eval.features.cached_features`; with two streams the result is the
    fused (similarity-averaged) retrieval and ``per_stream`` holds each stream alone. The record keeps each
    test query's nearest train videos (``neighbours``) for the retrieval gallery.
    """

    config = config or ClipConfig()
    check_inputs(store, list(streams), [train_split, test_split], with_views)
    shas = [checkpoint_sha256(stream.checkpoint) for stream in streams]
    train, test = [], []
    for stream, sha in zip(streams, shas):
        for split, out in ((train_split, train), (test_split, test)):
            out.append(cached_features(stream.checkpoint, store, stream.view, split, config, cache_dir, device,
                                       checkpoint_sha256=sha, progress=progress,
                                       with_views=stream_views(streams, with_views)))
    for other_train, other_test in zip(train[1:], test[1:]):
        check_same_videos(train[0].keys, other_train.keys, "two-stream retrieval (train videos)")
        check_same_videos(test[0].keys, other_test.keys, "two-stream retrieval (test videos)")
    fused = retrieve([f.features for f in test], test[0].labels, [f.features for f in train], train[0].labels,
                     ks, device=device)
    record = {"task": "retrieval", **input_record(store, list(streams), {"train": train_split, "test": test_split},
                                                    shas, with_views),
              "config": {**dataclasses.asdict(config), "ks": list(fused.ks)}, "results": fused.to_json(False)}
    record["feature_health"] = streams_health(streams, train, test, store)
    record["warnings"] = health_warnings(record["feature_health"])
    if len(streams) > 1:
        record["per_stream"] = [retrieve(q.features, q.labels, g.features, g.labels, ks, device=device).to_json(False)
                                for q, g in zip(test, train)]
    record["neighbours"] = {"query_keys": test[0].keys, "query_labels": test[0].labels.tolist(),
                            "gallery_keys": train[0].keys, "gallery_labels": train[0].labels.tolist(),
                            "classes": list(store.index.classes), **fused.to_json(True)}
    for k in fused.ks:
        record["neighbours"].pop(f"R@{k}")
    return record
