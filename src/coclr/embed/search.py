"""Nearest videos (or windows) of a query in an embedding folder, by cosine similarity, exactly.

Scores: the exact dot products of quantised unit vectors (:mod:`coclr.eval.exact`, the rule retrieval uses), so the
answer is the same bits on every CPU, thread count and chunk size, and byte-identical rows tie and rank by the
documented rule: higher score first, then lower row. By default nothing is centred (a row's neighbours do not change
when videos are added to the folder); ``center=True`` subtracts the mean of the folder's rows first, as the paper's
retrieval protocol does with its gallery (the order-free mean of :func:`coclr.eval.exact.gallery_mean`).

Speed: the rows are normalised once, when the folder is first searched (or when ``coclr embed`` calls
:func:`prepare_search` after writing it), into ``search/<videos|windows>.<plain|centred>.npy`` beside the arrays,
with a JSON record of the source array's identity (device, inode, size, modification and change times) and its
BLAKE2 checksum: a source whose identity changed is checksummed again, and rows whose checksum differs are
normalised again, so a changed folder is never served stale. The prepared rows are memory-mapped. A search is
then a float32 matrix product over chunks (BLAS speed) that keeps, per query, every row whose float32 score is
within twice the float32 rounding bound (:func:`coclr.eval.exact.exact_dot_bound`) of its running k-th best, and
scores those few candidates exactly in float64: the float32 pass may round however the CPU likes, the exact pass
decides. Only NumPy is needed (no torch import for a search of stored rows).

FAISS (``pip install faiss-cpu``, optional) runs an exact float32 search with an ``IndexFlatIP``: the same
neighbours up to float32 rounding, without the tie rule; it must hold the whole array in memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from coclr.atomic import atomic_open, atomic_write_json, atomic_write_text
from coclr.cpu import native_bfloat16
from coclr.embed.output import Embeddings, file_identity
from coclr.errors import ConfigError, DataError
from coclr.eval.exact import (
    QUANTUM_BITS,
    bfloat16_bits,
    bfloat16_dot_bound,
    exact_dot_bound,
    gallery_mean,
    unit_rows,
)
from coclr.eval.gallery import (
    HIT_COLOUR,
    QUERY_COLOUR,
    animated_gif,
    data_uri,
    gallery_page,
    gallery_row,
    thumbnail,
    video_cell,
)
from coclr.video.decode import decode_frames_at, decode_frames_between, probe_video

BACKENDS = ("exact", "faiss")
PREPARED_DIR = "search"
PREPARED_FORMAT = "coclr-search-rows"
PREPARE_BLOCK = 8192
"""Rows normalised at a time when the prepared rows are written (bounds memory for millions of rows)."""
SEARCH_CHUNK = 32768
"""Gallery rows per float32 product in a search (bounds the score block to ``queries x SEARCH_CHUNK``)."""
FIRST_CHUNK = 1024
"""The first chunk is small: its k-th best score starts the candidate threshold before the big chunks come."""
MANY_QUERIES = 16
"""From this many queries at once the first pass is compute-bound: there it multiplies the rows' bfloat16 copy
where the CPU has bfloat16 dot-product instructions (:func:`coclr.cpu.native_bfloat16`). Otherwise, and for fewer
queries (memory-bound), it is NumPy's float32 product (no torch import)."""
GROUP = 64
"""A score block is cut into ``GROUP`` parts: the maximum over the parts (one pass over the scores) names the few
columns that can hold a candidate, and only those are compared with the floor (instead of a compare and a
``nonzero`` over every score)."""
FIRST_PASSES = ("float32", "bfloat16")
"""The first passes (:func:`first_pass_kind`): NumPy's float32 product, or PyTorch's bfloat16 one."""


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
        import faiss  # noqa: F401, PLC0415 (optional)
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------- exact two-pass search


@dataclasses.dataclass
class UnitRows:
    """Gallery rows as quantised unit vectors (:func:`coclr.eval.exact.unit_rows`): ``block(start, stop)`` and
    ``take(indices)`` give the same bits for a row whichever way it is read; ``mean`` was subtracted first."""

    count: int
    dim: int
    block: Callable[[int, int], np.ndarray]
    take: Callable[[np.ndarray], np.ndarray]
    mean: np.ndarray | None = None
    block16: Callable[[int, int], np.ndarray] | None = None
    """The same rows rounded to bfloat16 (raw ``uint16`` bits), when prepared: the fast first pass of many queries."""

    @classmethod
    def of_array(cls, units: np.ndarray, mean: np.ndarray | None = None,
                 units16: np.ndarray | None = None) -> UnitRows:
        """Rows normalised already (a prepared file, memory-mapped), and their bfloat16 copy when there is one."""
        block16 = (lambda a, b: np.asarray(units16[a:b])) if units16 is not None else None
        return cls(len(units), units.shape[1], lambda a, b: np.asarray(units[a:b]),
                   lambda rows: np.asarray(units[rows]), mean, block16)

    @classmethod
    def normalising(cls, rows: np.ndarray, center: bool) -> UnitRows:
        """Raw rows, normalised chunk by chunk as they are read (nothing written)."""
        mean = gallery_mean(rows) if center else None
        return cls(len(rows), rows.shape[1], lambda a, b: _units(rows[a:b], mean),
                   lambda indices: _units(rows[indices], mean), mean)


def _units(rows: np.ndarray, mean: np.ndarray | None) -> np.ndarray:
    try:
        return unit_rows(rows, mean)
    except ValueError:
        raise DataError("the searched rows hold NaN or infinite values") from None


def first_pass_kind(gallery: UnitRows, count: int) -> str:
    """Which first pass ``count`` queries at once get over ``gallery`` (one of :data:`FIRST_PASSES`), by what the
    CPU has and what is installed, never by a timing: ``bfloat16`` from :data:`MANY_QUERIES` queries where the rows
    have a bfloat16 copy, torch is installed and the CPU has bfloat16 dot-product instructions (AVX512_BF16 or AMX,
    not limited by ``ATEN_CPU_CAPABILITY`` or ``ONEDNN_MAX_CPU_ISA``: :func:`coclr.cpu.native_bfloat16`), else
    ``float32``. Either gives the same answer (:func:`exact_topk`)."""
    if count < MANY_QUERIES or gallery.block16 is None or not native_bfloat16():
        return "float32"
    try:
        import torch  # noqa: F401, PLC0415 (heavy; optional here: only the bfloat16 pass needs it)
    except ImportError:
        return "float32"
    return "bfloat16"


def exact_topk(gallery: UnitRows, queries: np.ndarray, k: int, chunk: int = SEARCH_CHUNK,
               first: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(scores float64 [Q, k], rows int64 [Q, k])``: each query's ``k`` best gallery rows by exact score, ties
    to the lower row. ``queries`` are unit rows already (:func:`coclr.eval.exact.unit_rows`, same mean).

    Pass 1 (``first``, by default :func:`first_pass_kind`: NumPy's float32 product, or a bfloat16 product where
    the CPU has bfloat16 instructions) keeps every row within ``margin`` (twice that pass's rounding bound) of the
    running k-th best first-pass score: a row whose exact score reaches the exact k-th best is always kept. Pass 2
    scores the kept rows exactly (float64 products of quantised rows: exact in any order), so the answer is the
    same whichever first pass ran."""
    if gallery.count == 0 or k < 1:
        raise DataError(f"nothing to search: {gallery.count} rows, k = {k}")
    queries = np.ascontiguousarray(queries, np.float32)
    count, k = len(queries), min(k, gallery.count)
    first = first or first_pass_kind(gallery, count)
    if first not in FIRST_PASSES or (first == "bfloat16" and gallery.block16 is None):
        raise ConfigError(f"first pass: {first!r} is not one of {', '.join(FIRST_PASSES)} for these rows")
    coarse = first == "bfloat16"
    bound = bfloat16_dot_bound(gallery.dim) if coarse else exact_dot_bound(gallery.dim)
    by_query = queries.T  # the products are rows x queries: OpenBLAS runs that orientation at least as fast
    first_pass = (_bfloat16_pass(gallery, queries, min(chunk, gallery.count)) if coarse
                  else lambda start, stop: gallery.block(start, stop) @ by_query)
    margin = np.float32(2 * bound)
    floor = np.full(count, -np.inf, np.float32)
    pool_query, pool_row, pool_score = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    starts = [0, *range(min(FIRST_CHUNK, chunk), gallery.count, chunk)]
    for number, start in enumerate(starts):
        stop = starts[number + 1] if number + 1 < len(starts) else gallery.count
        scores = first_pass(start, stop)  # float32 [c, Q], rounded however the CPU likes (within the bound)
        if number == 0 and stop - start >= k:  # the first block's k-th best starts the threshold
            floor = np.partition(scores, stop - start - k, axis=0)[stop - start - k] - margin
        rows, hits = _over_floor(scores, floor)
        pool_query = np.concatenate([pool_query, hits])
        pool_row = np.concatenate([pool_row, rows.astype(np.int64) + start])
        pool_score = np.concatenate([pool_score, scores[rows, hits]])
        floor = _raise_floor(floor, pool_query, pool_score, k, margin)
        keep = pool_score >= floor[pool_query]
        pool_query, pool_row, pool_score = pool_query[keep], pool_row[keep], pool_score[keep]
    unique, inverse = np.unique(pool_row, return_inverse=True)  # each candidate row read once, in file order
    rows32 = gallery.take(unique)
    if coarse:  # float32 scores of the bfloat16 pass's candidates thin them
        refined = (queries @ rows32.T)[pool_query, inverse]
        margin32 = np.float32(2 * exact_dot_bound(gallery.dim))
        floor32 = _raise_floor(np.full(count, -np.inf, np.float32), pool_query, refined, k, margin32)
        keep = refined >= floor32[pool_query]
        pool_query, pool_row, inverse = pool_query[keep], pool_row[keep], inverse[keep]
    exact = np.einsum("ij,ij->i", rows32[inverse].astype(np.float64), queries[pool_query].astype(np.float64))
    order = np.lexsort((pool_row, -exact, pool_query))  # exact in any order (quantised rows); ties to the lower row
    first_hit = np.searchsorted(pool_query[order], np.arange(count))
    picked = order[first_hit[:, None] + np.arange(k)]
    return exact[picked], pool_row[picked]


def _over_floor(scores: np.ndarray, floor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, queries)`` of the scores ``[rows, queries]`` at or above their query's floor. Where the block's
    rows divide into :data:`GROUP` parts, the maximum over the parts (one pass) names the few rows worth a look."""
    width, count = scores.shape
    if width % GROUP or width < 4 * GROUP:
        hot = np.flatnonzero(scores.max(axis=0) >= floor)  # most queries have no candidate in a later block
        rows, which = np.nonzero((scores if len(hot) == count else scores[:, hot]) >= floor[hot])
        return rows, hot[which]
    stride = width // GROUP
    parts = scores.reshape(GROUP, stride, count)  # part g, row j: the scores of row g * stride + j
    row, query = np.nonzero(parts.max(axis=0) >= floor)
    part, which = np.nonzero(parts[:, row, query] >= floor[query])  # [GROUP, n]
    return part * stride + row[which], query[which]


def _raise_floor(floor: np.ndarray, pool_query: np.ndarray, pool_score: np.ndarray, k: int,
                 margin: np.float32) -> np.ndarray:
    """Each query's floor raised to its k-th best pool score minus ``margin`` (where it has k pool scores)."""
    count = len(floor)
    order = np.lexsort((-pool_score, pool_query))  # by query, best first: the k-th is at first + k - 1
    sorted_query, sorted_score = pool_query[order], pool_score[order]
    first = np.searchsorted(sorted_query, np.arange(count + 1))
    full = np.flatnonzero(np.diff(first) >= k)
    floor = floor.copy()
    floor[full] = np.maximum(floor[full], sorted_score[first[full] + k - 1] - margin)
    return floor


def _bfloat16_pass(gallery: UnitRows, queries: np.ndarray, width: int) -> Callable[[int, int], np.ndarray]:
    """PyTorch's product of the bfloat16 copy of rows ``start:stop`` with the queries rounded to bfloat16 (float32
    accumulation, a bfloat16 result; one buffer reused: a block is used before the next is asked for), as float32
    ``[c, Q]``."""
    import torch  # noqa: PLC0415 (heavy: only a search of many queries needs it)

    query = torch.from_numpy(bfloat16_bits(queries).view(np.int16)).view(torch.bfloat16)
    buffer = torch.empty(len(queries) * width, dtype=torch.bfloat16)

    def scores(start: int, stop: int) -> np.ndarray:
        with warnings.catch_warnings():  # a read-only memory map: torch warns that it could write (it does not)
            warnings.simplefilter("ignore", UserWarning)
            rows = torch.from_numpy(np.ascontiguousarray(gallery.block16(start, stop)).view(np.int16))
        out = buffer[: len(queries) * (stop - start)].view(stop - start, len(queries))
        torch.mm(rows.view(torch.bfloat16), query.T, out=out)
        return out.float().numpy()

    return scores


# ------------------------------------------------------------------------------ prepared rows beside a folder


def _identity(path: Path) -> list[int]:
    stat = os.stat(path)
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def file_checksum(path: Path, block: int = 1 << 23) -> str:
    """``blake2b:<hex>`` of a file's bytes (read in blocks)."""
    digest = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as file:
        while chunk := file.read(block):
            digest.update(chunk)
    return f"blake2b:{digest.hexdigest()}"


def prepared_paths(root: Path, name: str, center: bool) -> tuple[Path, Path, Path]:
    """The prepared rows of ``<name>.npy``, their bfloat16 copy and their record:
    ``search/<name>.<plain|centred>.{npy,bf16.npy,json}``."""
    stem = root / PREPARED_DIR / f"{name}.{'centred' if center else 'plain'}"
    return Path(f"{stem}.npy"), Path(f"{stem}.bf16.npy"), Path(f"{stem}.json")


def _fresh(root: Path, name: str, center: bool, source: np.ndarray) -> UnitRows | None:
    """The prepared rows when their record matches the source array (by identity, else by checksum); else None."""
    rows_path, bf16_path, record_path = prepared_paths(root, name, center)
    source_path = root / f"{name}.npy"
    try:
        record = json.loads(record_path.read_text())
        if record.get("format") != PREPARED_FORMAT or record.get("quantum_bits") != QUANTUM_BITS \
                or record.get("prepared_identity") != _identity(rows_path) \
                or record.get("bf16_identity") != _identity(bf16_path):
            return None
        if record.get("source_identity") != _identity(source_path):
            if record.get("source_checksum") != file_checksum(source_path):
                return None
            record["source_identity"] = _identity(source_path)  # the same bytes (a copy, a touch): re-bless
            atomic_write_json(record_path, record)
        units, units16 = np.load(rows_path, mmap_mode="r"), np.load(bf16_path, mmap_mode="r")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if units.shape != source.shape or units.dtype != np.float32 or units16.shape != source.shape \
            or units16.dtype != np.uint16:
        return None
    mean = np.asarray(record["mean"], np.float64) if center else None
    if mean is not None and mean.shape != (source.shape[1],):
        return None
    return UnitRows.of_array(units, mean, units16)


def _write_prepared(root: Path, name: str, center: bool, source: np.ndarray) -> UnitRows:
    rows_path, bf16_path, record_path = prepared_paths(root, name, center)
    source_path = root / f"{name}.npy"
    identity, checksum = _identity(source_path), file_checksum(source_path)
    mean = gallery_mean(source) if center else None
    with atomic_open(rows_path, "wb") as file, atomic_open(bf16_path, "wb") as file16:
        for out, dtype in ((file, np.float32), (file16, np.uint16)):
            np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                       "fortran_order": False, "shape": tuple(source.shape)})
        for start in range(0, len(source), PREPARE_BLOCK):
            units = _units(source[start: start + PREPARE_BLOCK], mean)
            file.write(units.tobytes())
            file16.write(bfloat16_bits(units).tobytes())
    atomic_write_json(record_path, {"format": PREPARED_FORMAT, "quantum_bits": QUANTUM_BITS, "source": source_path.name,
                                    "source_identity": identity, "source_checksum": checksum,
                                    "prepared_identity": _identity(rows_path), "bf16_identity": _identity(bf16_path),
                                    "mean": mean.tolist() if mean is not None else None})
    return UnitRows.of_array(np.load(rows_path, mmap_mode="r"), mean, np.load(bf16_path, mmap_mode="r"))


def folder_rows(embeddings: Embeddings, windows: bool = False, center: bool = False) -> UnitRows:
    """The searched rows of a folder, prepared once and kept beside it (see the module docstring); a folder that
    cannot be written (read-only) is normalised chunk by chunk on each search instead."""
    name = "windows" if windows else "videos"
    source = embeddings.windows if windows else embeddings.videos
    prepared = _fresh(embeddings.root, name, center, source)
    if prepared is not None:
        return prepared
    if len(source) == 0:
        return UnitRows.normalising(source, center)
    try:
        return _write_prepared(embeddings.root, name, center, source)
    except OSError:
        return UnitRows.normalising(source, center)


def prepare_search(root: str | Path) -> None:
    """Prepare a folder's rows for search now (videos and windows, not centred): the hook ``coclr embed`` may call
    after it writes the folder, so that the first search does not pay for it. Safe to call at any time."""
    embeddings = Embeddings(root)
    for windows in (False, True):
        folder_rows(embeddings, windows)


# ------------------------------------------------------------------------------------------------ the search


def nearest(gallery: np.ndarray | UnitRows, queries: np.ndarray, k: int, backend: str = "exact",
            center: bool = False, chunk: int = SEARCH_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [Q, k], rows [Q, k])`` of the ``k`` gallery rows most similar to each query (cosine), best first,
    ties to the lower row. ``gallery``: raw rows (normalised as they are read) or prepared :class:`UnitRows`
    (then ``center`` is theirs)."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    dim = gallery.dim if isinstance(gallery, UnitRows) else gallery.shape[1]
    queries = np.asarray(queries, np.float32).reshape(-1, dim)
    if backend == "faiss":
        raw = gallery.block(0, gallery.count) if isinstance(gallery, UnitRows) else gallery
        return _faiss_nearest(raw, queries, k, center and not isinstance(gallery, UnitRows), chunk)
    rows = gallery if isinstance(gallery, UnitRows) else UnitRows.normalising(gallery, center)
    return exact_topk(rows, _units(queries, rows.mean), k, chunk)


def _faiss_nearest(gallery: np.ndarray, queries: np.ndarray, k: int, center: bool,
                   chunk: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        import faiss  # noqa: PLC0415 (optional)
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
           backend: str = "exact", center: bool = False, stale: list[str] | None = None) -> list[Hit]:
    """The ``k`` nearest videos (or windows, with ``windows``) of the vector ``query``; ``exclude`` leaves out
    one row of the searched array (the query's own). A hit whose file was removed or changed since it was embedded
    is never served: it is left out (its path appended to ``stale``) and the next row takes its place; only the
    candidates' files are looked at, so a search costs a few ``stat`` calls, not one per row."""
    gallery = embeddings.windows if windows else embeddings.videos
    if len(gallery) == 0:
        raise DataError(f"{embeddings.root}: no {'windows' if windows else 'videos'} to search")
    if k < 1:
        raise ConfigError(f"k: must be at least 1, got {k}")
    rows_or_prepared = folder_rows(embeddings, windows, center) if backend == "exact" else gallery
    left_out = {exclude} if exclude is not None else set()
    fresh: dict[int, bool] = {}  # video row -> whether its file is as embedded

    def is_fresh(video: dict[str, Any]) -> bool:
        if video["row"] not in fresh:
            fresh[video["row"]] = file_identity(video["path"]) == (video["size"], video["mtime_ns"])
            if not fresh[video["row"]] and stale is not None:
                stale.append(video["path"])
        return fresh[video["row"]]

    want = k + len(left_out)
    while True:
        scores, rows = nearest(rows_or_prepared, query, min(want, len(gallery)), backend, center)
        hits = []
        for score, row in zip(scores[0], rows[0]):
            row = int(row)
            if row in left_out or row < 0 or len(hits) == k:
                continue
            record = embeddings.window_records[row] if windows else None
            video = embeddings.video_records[record["video"] if windows else row]
            if not is_fresh(video):
                left_out.add(row)
                continue
            if windows:
                hits.append(Hit(len(hits) + 1, float(score), row, video["path"], video["row"], record["start"],
                                record["end"]))
            else:
                hits.append(Hit(len(hits) + 1, float(score), row, video["path"], row))
        if len(hits) == k or want >= len(gallery):
            return hits
        want = min(len(gallery), 2 * want + len(left_out))


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
    """Thumbnail frames of a video file (of the frames shown from ``start`` to ``end`` seconds, when given: a
    window's times, which follow the frames' timestamps), at the frame rate the folder embedded it with."""

    fps = embeddings.record["settings"].get("fps") if embeddings is not None else None
    if start is not None:
        frames = decode_frames_between(path, start, float("inf") if end is None else end, height, fps)
        return thumbnail(len(frames), lambda indices: frames[indices], num_frames, height)
    row = embeddings.row_of(path) if embeddings is not None else None
    if row is not None:
        total = embeddings.video_records[row]["frames"]
    else:
        info = probe_video(path)
        total = max(1, round(info.frames * (fps or info.fps) / info.fps))
    return thumbnail(total, lambda indices: decode_frames_at(path, indices, height, fps), num_frames, height)
