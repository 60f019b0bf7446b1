"""Clip store read speed: random 32-frame clips per second on one core (read, JPEG decode, augment).

Default run: builds a small store from the real clips in ../shared/data/clips (or synthetic frames when they
are absent), then times, on one core, reading a random 32-frame clip (encoded bytes), reading + decoding
the JPEGs, and, when ``coclr.data.augment.ClipAugment`` exists, reading + decoding + augmenting.

``--compare-layouts`` also measures the storage layouts the store could use (the figures in
``docs/store.md``): one file per video (ours), one JPEG file per frame, sharded tar and LMDB (only when the
``lmdb`` package is importable; it is not a dependency). Reads are timed warm (page cache) and cold
(``posix_fadvise(DONTNEED)`` drops the files' cached pages, then one clip of each video is read).

    python benchmarks/bench_store.py [--videos 48] [--clips 300] [--compare-layouts]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from coclr.store.clipstore import ClipStore, create_store, write_entry
from coclr.store.jpeg import decode_jpeg, encode_jpeg
from coclr.video.indexes import VideoEntry, VideoIndex

CLIP_LENGTH = 32
SHARED_CLIPS = next((folder / "shared" / "data" / "clips" for folder in Path(__file__).resolve().parents
                     if (folder / "shared" / "data" / "clips").is_dir()),
                    Path(__file__).resolve().parents[2] / "shared" / "data" / "clips")
"""The real clips: ../shared/data/clips of the checkout (or of a folder above it, for a git worktree)."""


def source_videos(short_side: int, quality: int) -> tuple[list[list[bytes]], str]:
    """Encoded frames of the real clips (resized), or of synthetic moving gradients without ../shared."""
    if SHARED_CLIPS.is_dir():
        from coclr.video.decode import decode_video

        videos = [[encode_jpeg(f, quality) for f in decode_video(p, short_side=short_side)]
                  for p in sorted(SHARED_CLIPS.iterdir())]
        return videos, f"the {len(videos)} real clips of {SHARED_CLIPS}"
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:short_side, 0:short_side * 4 // 3]
    videos = []
    for _ in range(4):
        base = rng.integers(0, 255, 3)
        frames = [np.clip(base + np.stack([x + 3 * t, y, x + y], -1) % 256, 0, 255).astype(np.uint8)
                  for t in range(150)]
        videos.append([encode_jpeg(f, quality) for f in frames])
    return videos, "synthetic frames (../shared/data/clips not found)"


def dataset(videos: list[list[bytes]], count: int) -> list[tuple[str, list[bytes]]]:
    """``count`` entries cycling through the source videos, named like a two-level dataset."""
    return [(f"class{i % 10:02d}/video{i:05d}.avi", videos[i % len(videos)]) for i in range(count)]


def clip_requests(entries: list[tuple[str, list[bytes]]], count: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        i = int(rng.integers(len(entries)))
        n = len(entries[i][1])
        requests.append((i, int(rng.integers(0, max(1, n - CLIP_LENGTH + 1)))))
    return requests


def drop_cache(paths: list[Path]) -> None:
    """Evict the files' pages from the page cache (unprivileged; only clean pages, hence the sync)."""
    os.sync()
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


# ------------------------------------------------------------------------------------------------ layouts

class FilePerVideo:
    """Ours: the clip store (header + frame offsets + concatenated JPEGs, one file per video)."""

    name = "one file per video (ours)"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, entries: list[tuple[str, list[bytes]]]) -> None:
        index = VideoIndex("bench", [f"class{c:02d}" for c in range(10)],
                           [VideoEntry(key, int(key[5:7]), "train") for key, _ in entries])
        create_store(self.folder, index)
        for key, frames in entries:
            write_entry(self.folder, key, "rgb", frames, fps=25.0)

    def open(self) -> None:
        self.store = ClipStore(self.folder)

    def read(self, key: str, indices: np.ndarray) -> list[bytes]:
        return self.store.read_encoded(key, "rgb", indices)

    def close(self) -> None:
        pass


class FilePerFrame:
    """The reference's layout: a folder per video, one JPEG file per frame."""

    name = "one JPEG file per frame"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, entries: list[tuple[str, list[bytes]]]) -> None:
        for key, frames in entries:
            directory = self.folder / key
            directory.mkdir(parents=True)
            for i, frame in enumerate(frames):
                (directory / f"{i:05d}.jpg").write_bytes(frame)

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def read(self, key: str, indices: np.ndarray) -> list[bytes]:
        return [(self.folder / key / f"{i:05d}.jpg").read_bytes() for i in indices]


class TarShards:
    """WebDataset-style shards: tar files of 64 videos, members ``<key>/<frame>.jpg``; reading needs an
    in-memory table of member offsets built by scanning every shard's headers at open."""

    name = "sharded tar (64 videos/shard)"
    videos_per_shard = 64

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, entries: list[tuple[str, list[bytes]]]) -> None:
        self.folder.mkdir(parents=True)
        for shard_start in range(0, len(entries), self.videos_per_shard):
            with tarfile.open(self.folder / f"shard{shard_start // self.videos_per_shard:05d}.tar", "w") as tar:
                for key, frames in entries[shard_start: shard_start + self.videos_per_shard]:
                    for i, frame in enumerate(frames):
                        info = tarfile.TarInfo(f"{key}/{i:05d}.jpg")
                        info.size = len(frame)
                        tar.addfile(info, _BytesReader(frame))

    def open(self) -> None:
        if hasattr(self, "members"):
            return  # the table survives a close; rescanning would pull the shards back into the cache
        self.members: dict[str, tuple[Path, list[tuple[int, int]]]] = {}
        for shard in sorted(self.folder.glob("*.tar")):
            with tarfile.open(shard) as tar:
                for member in tar:
                    key = member.name.rsplit("/", 1)[0]
                    self.members.setdefault(key, (shard, []))[1].append((member.offset_data, member.size))

    def close(self) -> None:
        pass  # the member table stays in memory; only the shard files' pages are evicted

    def read(self, key: str, indices: np.ndarray) -> list[bytes]:
        shard, table = self.members[key]
        first, last = table[indices.min()], table[indices.max()]
        descriptor = os.open(shard, os.O_RDONLY)
        try:
            data = os.pread(descriptor, last[0] + last[1] - first[0], first[0])
        finally:
            os.close(descriptor)
        return [data[table[i][0] - first[0]: table[i][0] - first[0] + table[i][1]] for i in indices]


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else self.position + size
        chunk, self.position = self.data[self.position: end], min(end, len(self.data))
        return chunk


class Lmdb:
    """LMDB: one database, key ``<video>/<frame>``, one write transaction per video."""

    name = "LMDB (key per frame)"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, entries: list[tuple[str, list[bytes]]]) -> None:
        import lmdb

        size = sum(len(f) for _, frames in entries for f in frames)
        env = lmdb.open(str(self.folder), map_size=4 * size + (1 << 26))
        for key, frames in entries:
            with env.begin(write=True) as txn:
                for i, frame in enumerate(frames):
                    txn.put(f"{key}/{i:05d}".encode(), frame)
        env.close()

    def open(self) -> None:
        import lmdb

        self.env = lmdb.open(str(self.folder), readonly=True, lock=False, readahead=False)

    def close(self) -> None:
        self.env.close()

    def read(self, key: str, indices: np.ndarray) -> list[bytes]:
        with self.env.begin() as txn:
            return [bytes(txn.get(f"{key}/{i:05d}".encode())) for i in indices]


def all_files(folder: Path) -> list[Path]:
    return [Path(d, f) for d, _, files in os.walk(folder) for f in files]


def compare_layouts(entries, requests, workdir: Path) -> None:
    layouts = [FilePerVideo, FilePerFrame, TarShards]
    if importlib.util.find_spec("lmdb") is not None:
        layouts.append(Lmdb)
    else:
        print("(lmdb not importable: LMDB left out)")
    frames = sum(len(f) for _, f in entries)
    print(f"\nlayouts: {len(entries)} videos, {frames} frames, {len(requests)} random {CLIP_LENGTH}-frame clips")
    print(f"{'layout':34s} {'write s':>8s} {'open ms':>8s} {'files':>7s} {'MB':>7s} "
          f"{'warm clips/s':>13s} {'cold clips/s':>13s}")
    for layout_type in layouts:
        layout = layout_type(workdir / layout_type.__name__)
        start = time.perf_counter()
        layout.write(entries)
        written = time.perf_counter() - start
        start = time.perf_counter()
        layout.open()
        opened = time.perf_counter() - start
        files = all_files(layout.folder)
        megabytes = sum(f.stat().st_size for f in files) / 1e6
        keys = [key for key, _ in entries]
        for i, start_frame in requests[:20]:  # warm up
            layout.read(keys[i], np.arange(start_frame, start_frame + CLIP_LENGTH))
        start = time.perf_counter()
        for i, start_frame in requests:
            layout.read(keys[i], np.arange(start_frame, start_frame + CLIP_LENGTH))
        warm = len(requests) / (time.perf_counter() - start)
        # Cold: evict every file of the layout from the page cache once, then read one clip of each video
        # (distinct videos, so no clip finds another's pages); LMDB's map is reopened so no page stays mapped.
        cold_requests = list({i: (i, s) for i, s in requests}.values())
        layout.close()
        drop_cache(files)
        layout.open()
        start = time.perf_counter()
        for i, start_frame in cold_requests:
            layout.read(keys[i], np.arange(start_frame, start_frame + CLIP_LENGTH))
        elapsed = time.perf_counter() - start
        cold = len(cold_requests) / elapsed
        print(f"{layout.name:34s} {written:8.2f} {1000 * opened:8.1f} {len(files):7d} {megabytes:7.1f} "
              f"{warm:13.0f} {cold:13.0f}")
        shutil.rmtree(layout.folder)


def time_clips(label: str, requests, step) -> None:
    for request in requests[:10]:
        step(*request)
    start = time.perf_counter()
    for request in requests:
        step(*request)
    rate = len(requests) / (time.perf_counter() - start)
    print(f"{label:58s} {rate:8.1f} clips/s per core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=48, help="videos in the benchmark store")
    parser.add_argument("--clips", type=int, default=300, help="random clips timed per measurement")
    parser.add_argument("--short-side", type=int, default=128)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--compare-layouts", action="store_true", help="also compare storage layouts")
    args = parser.parse_args()

    cv2.setNumThreads(1)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        torch = None
    videos, source = source_videos(args.short_side, args.quality)
    entries = dataset(videos, args.videos)
    requests = clip_requests(entries, args.clips)
    keys = [key for key, _ in entries]
    height, width = decode_jpeg(entries[0][1][0]).shape[:2]
    print(f"source: {source}; {args.videos} videos, short side {args.short_side}, JPEG quality {args.quality}; "
          f"one process, 1 thread")
    with tempfile.TemporaryDirectory(prefix="bench_store_") as workdir:
        layout = FilePerVideo(Path(workdir) / "store")
        layout.write(entries)
        store = ClipStore(layout.folder)

        def indices(start: int) -> np.ndarray:
            return np.arange(start, start + CLIP_LENGTH)

        print(f"random {CLIP_LENGTH}-frame clip of {width}x{height} frames (warm page cache):")
        time_clips("  read encoded frames", requests, lambda i, s: store.read_encoded(keys[i], "rgb", indices(s)))
        time_clips("  read + decode JPEGs", requests, lambda i, s: store.read(keys[i], "rgb", indices(s)))
        augment_type = None
        if torch is not None and importlib.util.find_spec("coclr.data.augment") is not None:
            from coclr.data import augment as augment_module

            augment_type = getattr(augment_module, "ClipAugment", None)
        if augment_type is None:
            print("  (coclr.data.augment.ClipAugment not available: augmentation not timed)")
        else:
            augment = augment_type(size=112 if args.short_side < 128 else 128)
            generator = torch.Generator().manual_seed(0)
            time_clips("  read + decode + ClipAugment (batch of 1, CPU)", requests[: max(20, args.clips // 5)],
                       lambda i, s: augment({"rgb": torch.from_numpy(store.read(keys[i], "rgb", indices(s)))[None]},
                                            generator))
        if args.compare_layouts:
            compare_layouts(entries, requests, Path(workdir))


if __name__ == "__main__":
    main()
