"""Nearest videos (or windows) of a query in an embedding folder, by cosine similarity.

Exact search goes through :func:`coclr.eval.retrieval.topk_neighbours` over the memory-mapped arrays, in
chunks, so memory stays bounded for millions of rows. The rows are unit vectors, so the similarity is their dot
product; by default nothing is centred (a row's neighbours do not change when videos are added to the folder,
and the scores are those FAISS gives). ``center=True`` subtracts the mean of the folder's rows first, as the
paper's retrieval protocol does with its gallery, which removes what all videos share.

FAISS (``pip install faiss-cpu``, optional) runs the same exact search with an ``IndexFlatIP``; it must hold the
whole array in memory, and building the index per query costs more than the chunked search saves: it pays when
one index serves many queries (``benchmarks/bench_embed.py`` measures both; ``docs/embed.md``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from coclr.embed.output import Embeddings
from coclr.errors import ConfigError, DataError

BACKENDS = ("exact", "faiss")


@dataclasses.dataclass
class Hit:
    """One neighbour: its rank (1 = nearest), similarity, row (of videos.npy or windows.npy) and video file;
    for windows, the video's row and the window's start and end in seconds."""

    rank: int
    score: float
    row: int
    path: str
    video_row: int
    start: float | None = None
    end: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in dataclasses.asdict(self).items() if value is not None}


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def nearest(gallery: np.ndarray, queries: np.ndarray, k: int, backend: str = "exact", center: bool = False,
            chunk: int = 16384) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [Q, k], rows [Q, k])`` of the ``k`` gallery rows most similar to each query (cosine)."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    queries = np.asarray(queries, np.float32).reshape(-1, gallery.shape[1])
    if backend == "faiss":
        return _faiss_nearest(gallery, queries, k, center, chunk)
    from coclr.eval.retrieval import topk_neighbours

    return topk_neighbours(queries, gallery, k, gallery_chunk=chunk, center=center)


def _faiss_nearest(gallery: np.ndarray, queries: np.ndarray, k: int, center: bool,
                   chunk: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        import faiss
    except ImportError:
        raise ConfigError("backend: faiss is not installed (pip install faiss-cpu), use the exact backend") from None
    mean = gallery.mean(axis=0, dtype=np.float64).astype(np.float32) if center else None
    index = faiss.IndexFlatIP(gallery.shape[1])
    for start in range(0, len(gallery), chunk):
        index.add(_unit(np.asarray(gallery[start: start + chunk], np.float32), mean))
    scores, rows = index.search(_unit(queries, mean), min(k, len(gallery)))
    return scores, rows.astype(np.int64)


def _unit(rows: np.ndarray, mean: np.ndarray | None) -> np.ndarray:
    rows = rows - mean if mean is not None else rows.copy()
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.ascontiguousarray(rows / np.maximum(norms, 1e-12), dtype=np.float32)


def search(embeddings: Embeddings, query: np.ndarray, k: int = 10, windows: bool = False, exclude: int | None = None,
           backend: str = "exact", center: bool = False) -> list[Hit]:
    """The ``k`` nearest videos (or windows, with ``windows``) of the vector ``query``; ``exclude`` leaves out
    one row of the searched array (the query's own)."""
    gallery = embeddings.windows if windows else embeddings.videos
    if len(gallery) == 0:
        raise DataError(f"{embeddings.root}: no {'windows' if windows else 'videos'} to search")
    if k < 1:
        raise ConfigError(f"k: must be at least 1, got {k}")
    extra = 1 if exclude is not None else 0
    scores, rows = nearest(gallery, query, k + extra, backend, center)
    hits = []
    for score, row in zip(scores[0], rows[0]):
        row = int(row)
        if row == exclude or row < 0 or len(hits) == k:
            continue
        if windows:
            record = embeddings.window_records[row]
            video = embeddings.video_records[record["video"]]
            hits.append(Hit(len(hits) + 1, float(score), row, video["path"], video["row"], record["start"],
                            record["end"]))
        else:
            video = embeddings.video_records[row]
            hits.append(Hit(len(hits) + 1, float(score), row, video["path"], row))
    return hits


def format_hits(hits: list[Hit]) -> str:
    """A plain-text table of the hits."""
    lines = []
    for hit in hits:
        span = f"  {hit.start:8.2f}-{hit.end:.2f} s" if hit.start is not None else ""
        lines.append(f"{hit.rank:3d}  {hit.score:.4f}  row {hit.row:<7d}{span}  {hit.path}")
    return "\n".join(lines)


def write_search_html(path: str | Path, query_label: str, query_thumbnail: np.ndarray, hits: list[Hit],
                      embeddings: Embeddings, title: str = "Nearest videos") -> Path:
    """The query and its neighbours as animated thumbnails on one self-contained page (the retrieval gallery's
    layout), the neighbours' taken from their files (their window's frames for window hits)."""
    from coclr.atomic import atomic_write_text
    from coclr.eval.gallery import (
        HIT_COLOUR,
        QUERY_COLOUR,
        animated_gif,
        data_uri,
        gallery_page,
        gallery_row,
        video_cell,
    )

    query_cell = video_cell(data_uri(animated_gif(query_thumbnail)), Path(query_label).name, QUERY_COLOUR,
                            query_label, "query")
    cells = []
    for hit in hits:
        frames = file_thumbnail(hit.path, embeddings, hit.start, hit.end)
        span = f" {hit.start:.1f}-{hit.end:.1f} s" if hit.start is not None else ""
        cells.append(video_cell(data_uri(animated_gif(frames)), f"{Path(hit.path).name}{span} ({hit.score:.3f})",
                                HIT_COLOUR, hit.path, f"#{hit.rank}"))
    note = ("The query (blue) and its nearest " + ("windows" if hits and hits[0].start is not None else "videos")
            + " by cosine similarity, best first. Thumbnails are animated.")
    return atomic_write_text(path, gallery_page(title, note, [gallery_row(query_cell, cells)]))


def file_thumbnail(path: str, embeddings: Embeddings | None = None, start: float | None = None,
                   end: float | None = None, num_frames: int = 8, height: int = 64) -> np.ndarray:
    """Thumbnail frames of a video file (of the part from ``start`` to ``end`` seconds, when given), at the frame
    rate the folder embedded it with."""
    from coclr.eval.gallery import thumbnail
    from coclr.video.decode import decode_frames_at, probe_video

    fps = embeddings.record["settings"].get("fps") if embeddings is not None else None
    row = embeddings.row_of(path) if embeddings is not None else None
    if row is not None:
        record = embeddings.video_records[row]
        rate, total = record["fps"], record["frames"]
    else:
        info = probe_video(path)
        rate = fps or info.fps
        total = max(1, round(info.frames * rate / info.fps))
    first = 0 if start is None else min(total - 1, int(round(start * rate)))
    last = total if end is None else max(first + 1, min(total, int(round(end * rate))))
    return thumbnail(last - first, lambda indices: decode_frames_at(path, indices + first, height, fps), num_frames,
                     height)
