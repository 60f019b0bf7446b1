"""Cost of verifying stored entries on read: a training epoch's input path with and without the checksum checks.

Builds one store (the real clips of ../shared/data/clips, or synthetic frames without them, cycled to
``--videos`` entries) and reads it twice over per round, through the same files: once as training reads it
(``ClipStore``: every frame's bytes are checked against their checksum) and once with the checks switched off (a
``ClipStore`` whose entry headers carry no checksums, as for entries written before them). Two paths are timed:

- epoch input path: what the trainer does on the CPU for one epoch: ``TrainClips(encoded=True)`` items (two random
  32-frame clips per video, still JPEG-encoded), ``collate_clips`` into batches, ``decode_batch`` on the CPU;
- reads only: the ``TrainClips`` items alone (what DataLoader workers do when the batch decodes on a GPU).

Rounds run in the order A B B A (A checked, B unchecked), one process, one thread, warm page cache, so both see the
same machine state; the ratio of the summed times is printed.

    python benchmarks/bench_checksum.py [--videos 48] [--rounds 3] [--batch 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import cv2
import torch

from bench_store import FilePerVideo, dataset, source_videos
from coclr.data.batch_decode import collate_clips, decode_batch
from coclr.data.datasets import TrainClips
from coclr.store.clipstore import ClipStore


class UncheckedStore(ClipStore):
    """The same store read without checksum checks (its headers as if written before checksums)."""

    def _header(self, key: str, view: str):
        cached = self.__dict__.setdefault("_unchecked", {})
        if (key, view) not in cached:
            cached[(key, view)] = dataclasses.replace(super()._header(key, view), checksums=None)
        return cached[(key, view)]


def epoch(data: TrainClips, batch: int, decode: bool, epoch_number: int) -> float:
    """Seconds to produce every sample of one epoch (and decode its batches on the CPU with ``decode``)."""
    data.set_epoch(epoch_number)
    started = time.perf_counter()
    for first in range(0, len(data), batch):
        samples = [data[i] for i in range(first, min(first + batch, len(data)))]
        if decode:
            decode_batch(collate_clips(samples), torch.device("cpu"))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=48, help="videos in the benchmark store")
    parser.add_argument("--rounds", type=int, default=3, help="A B B A rounds per path")
    parser.add_argument("--batch", type=int, default=8, help="videos per batch")
    parser.add_argument("--short-side", type=int, default=128)
    parser.add_argument("--quality", type=int, default=90)
    args = parser.parse_args()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    videos, source = source_videos(args.short_side, args.quality)
    entries = dataset(videos, args.videos)
    frames = sum(len(f) for _, f in entries)
    print(f"source: {source}; {args.videos} videos, {frames} frames, short side {args.short_side}, JPEG quality "
          f"{args.quality}; one process, 1 thread; {args.rounds} rounds A B B A (A: checked, B: unchecked)")
    with tempfile.TemporaryDirectory(prefix="bench_checksum_") as workdir:
        layout = FilePerVideo(Path(workdir) / "store")
        layout.write(entries)
        for label, decode in (("epoch input path (read + collate + decode on the CPU)", True),
                              ("reads only (TrainClips items, encoded)", False)):
            datasets = {name: TrainClips(kind(layout.folder), "train", ["rgb"], length=32, num_clips=2,
                                         encoded=True)
                        for name, kind in (("checked", ClipStore), ("unchecked", UncheckedStore))}
            epoch(datasets["checked"], args.batch, decode, 0)  # warm the page cache and the header caches
            epoch(datasets["unchecked"], args.batch, decode, 0)
            totals = {"checked": 0.0, "unchecked": 0.0}
            for round_number in range(args.rounds):
                for name in ("checked", "unchecked", "unchecked", "checked"):
                    totals[name] += epoch(datasets[name], args.batch, decode, 1 + round_number)
            ratio = totals["checked"] / totals["unchecked"]
            epochs = 2 * args.rounds
            print(f"{label}: checked {totals['checked'] / epochs:.3f} s/epoch, unchecked "
                  f"{totals['unchecked'] / epochs:.3f} s/epoch; ratio {ratio:.4f} (overhead {100 * (ratio - 1):+.2f}%)")


if __name__ == "__main__":
    main()
