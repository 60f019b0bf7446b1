"""Speed of ``coclr embed`` (videos/s, windows/s, the share of time spent decoding) and of ``coclr search``
(chunked exact search against FAISS, when installed).

Embedding: the real clips of ../shared/data/clips (or synthetic videos without ../shared), embedded with a
randomly initialised S3D of ``--width`` (1.0: the paper's network, what users run; timings do not depend on
the weights) by :func:`coclr.embed.run.embed_videos` into a fresh folder, once per number of decoding workers.
The decoding share is the time of decoding alone (the same videos, same settings, one process) over the time of
the serial run (``--workers 0``, decoding then inference in one process). On a CUDA machine the GPU is timed
too.

Search: one query against ``N`` random unit rows of ``--dim`` (float32, memory-mapped from disk as ``coclr
search`` reads them): the chunked exact search, and FAISS ``IndexFlatIP`` with its index built per query (what
``coclr search --backend faiss`` does) and prebuilt (the search alone). Ratios are measured in the same run.

    python benchmarks/bench_embed.py [--width 1.0] [--workers 0 1] [--search-rows 10000 100000 1000000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

SHARED_CLIPS = Path(__file__).resolve().parents[2] / "shared" / "data" / "clips"


def source_videos(folder: Path) -> tuple[list[Path], str]:
    """The real clips, or 8 synthetic videos of 200 frames at 320x240 written into ``folder``."""
    if SHARED_CLIPS.is_dir():
        return sorted(SHARED_CLIPS.iterdir()), f"the {len(list(SHARED_CLIPS.iterdir()))} real clips"
    from coclr.video.decode import write_mp4

    rng = np.random.default_rng(0)
    paths = []
    for number in range(8):
        frames = np.clip(rng.integers(0, 255, 3) + rng.normal(0, 20, (200, 240, 320, 3)), 0, 255).astype(np.uint8)
        path = folder / f"synthetic{number}.mp4"
        write_mp4(path, frames, 25.0)
        paths.append(path)
    return paths, "8 synthetic videos (../shared/data/clips not found)"


def save_random_encoder(path: Path, width: float) -> Path:
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    torch.manual_seed(0)
    return save_encoder(path, build_encoder(width=width))


def time_decoding(paths: list[Path], short_side: int) -> float:
    from coclr.video.decode import VideoReader

    started = time.perf_counter()
    for path in paths:
        with VideoReader(path, short_side) as reader:
            for _ in reader:
                pass
    return time.perf_counter() - started


def bench_embedding(args: argparse.Namespace, work: Path) -> None:
    from coclr.embed.embedder import Embedder
    from coclr.embed.run import embed_videos

    paths, what = source_videos(work)
    checkpoint = save_random_encoder(work / "encoder.pth", args.width)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"embedding {what}; S3D width {args.width}; {torch.get_num_threads()} torch threads; "
          f"{os.cpu_count()} cores")
    decode_seconds = time_decoding(paths, 128)
    print(f"  decoding alone (one process, short side 128): {decode_seconds:.2f} s")
    for device in devices:
        for workers in args.workers:
            embedder = Embedder(checkpoint, device=device, workers=workers, batch_size=args.batch_size)
            out = work / f"out_{device}_{workers}"
            if device == "cuda":  # warm-up: cuDNN autotuning and allocator on one video
                embedder.embed(paths[0])
                torch.cuda.synchronize()
            summary = embed_videos(paths, out, embedder, progress=False)
            share = f"decoding {100 * decode_seconds / summary.seconds:.0f}% of the time" if workers == 0 else \
                "decoding overlapped with inference"
            print(f"  {device}, {workers} decoding workers: {summary.done} videos, {summary.windows} windows in "
                  f"{summary.seconds:.1f} s: {summary.done / summary.seconds:.2f} videos/s, "
                  f"{summary.windows / summary.seconds:.1f} windows/s ({share})")


def bench_search(args: argparse.Namespace, work: Path) -> None:
    from coclr.embed.search import faiss_available, nearest

    rng = np.random.default_rng(0)
    print(f"search: one query, {args.dim}-d float32 rows memory-mapped from disk; best of 3")
    for rows in args.search_rows:
        path = work / f"rows_{rows}.npy"
        array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, args.dim))
        for start in range(0, rows, 65536):
            block = rng.normal(size=(min(65536, rows - start), args.dim)).astype(np.float32)
            array[start: start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
        array.flush()
        del array
        gallery = np.load(path, mmap_mode="c")
        query = np.asarray(gallery[rows // 2])
        exact = min(_timed(lambda: nearest(gallery, query, 10)) for _ in range(3))
        line = f"  {rows:>9,d} rows: exact chunked {1000 * exact:8.1f} ms"
        if faiss_available():
            import faiss

            with_build = min(_timed(lambda: nearest(gallery, query, 10, backend="faiss")) for _ in range(3))
            index = faiss.IndexFlatIP(args.dim)
            index.add(np.ascontiguousarray(gallery))
            prebuilt = min(_timed(lambda: index.search(query[None], 10)) for _ in range(3))
            line += (f" | faiss, index built per query {1000 * with_build:8.1f} ms ({exact / with_build:.2f}x), "
                     f"prebuilt index {1000 * prebuilt:7.1f} ms ({exact / prebuilt:.1f}x)")
        else:
            line += " | faiss: unavailable (pip install faiss-cpu)"
        print(line)
        del gallery
        path.unlink()


def _timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=float, default=1.0, help="S3D width (1.0: the paper's network)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1], help="decoding worker counts to time")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=1024, help="embedding dimension for the search timings")
    parser.add_argument("--search-rows", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--skip-embedding", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_embed_") as folder:
        work = Path(folder)
        if not args.skip_embedding:
            bench_embedding(args, work)
        if args.search_rows:
            bench_search(args, work)


if __name__ == "__main__":
    main()
