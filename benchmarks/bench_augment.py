"""Throughput of the batched clip augmentation (coclr.data.augment).

Prints clips/s for batches of 32-frame clips of 128x171 stored frames cropped to 128x128: the whole training
augmentation (RGB alone, and RGB + flow sharing crops) on the CPU with one thread and with all threads, and on
the GPU when there is one; and the vectorised crop (one grid_sample for the batch) against a per-clip loop of
slicing + F.interpolate, measured in the same run (best of ``--repeats`` timings each).

    python benchmarks/bench_augment.py [--batch 16] [--frames 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from coclr.data.augment import ClipAugment, crop_resize


def per_clip_crop(frames: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor, size: int) -> torch.Tensor:
    """The obvious baseline: for each clip, slice the (rounded) box, F.interpolate it, flip it."""
    out = []
    for clip, (x0, y0, w, h), flipped in zip(frames, boxes.round().long().tolist(), flip.tolist()):
        patch = clip[:, y0:y0 + h, x0:x0 + w].permute(0, 3, 1, 2).float()
        patch = F.interpolate(patch, size=(size, size), mode="bilinear", align_corners=False)
        out.append((patch.flip(-1) if flipped else patch).div_(255).transpose(0, 1))
    return torch.stack(out)


def best_time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one warm-up (synchronising on GPU)."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def run(device: torch.device, batch: int, frames: int, repeats: int, label: str) -> None:
    generator = torch.Generator().manual_seed(0)
    rgb = torch.randint(0, 256, (batch, frames, 128, 171, 3), dtype=torch.uint8, generator=generator).to(device)
    flow = torch.randint(0, 256, (batch, frames, 128, 171, 3), dtype=torch.uint8, generator=generator).to(device)
    augment = ClipAugment(size=128)
    params = augment.draw_params(batch, 128, 171, generator)

    rgb_only = best_time(lambda: augment({"rgb": rgb}, generator), device, repeats)
    two_view = best_time(lambda: augment({"rgb": rgb, "flow": flow}, generator), device, repeats)
    vectorised = best_time(lambda: crop_resize(rgb, params.boxes[:, None], params.flip[:, None], 128), device, repeats)
    loop = best_time(lambda: per_clip_crop(rgb, params.boxes, params.flip, 128), device, repeats)
    print(f"{label:<22} augment rgb {batch / rgb_only:8.1f} clips/s | rgb+flow {batch / two_view:8.1f} samples/s | "
          f"crop: batched {batch / vectorised:8.1f} clips/s, per-clip loop {batch / loop:8.1f} clips/s, "
          f"ratio {loop / vectorised:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="clips per batch")
    parser.add_argument("--frames", type=int, default=32, help="frames per clip")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per figure (the best is kept)")
    args = parser.parse_args()
    print(f"batch {args.batch} x {args.frames} frames of 128x171 -> 128x128, torch {torch.__version__}")
    cores = os.cpu_count() or 1
    torch.set_num_threads(1)
    run(torch.device("cpu"), args.batch, args.frames, args.repeats, "CPU, 1 thread")
    if cores > 1:
        torch.set_num_threads(cores)
        run(torch.device("cpu"), args.batch, args.frames, args.repeats, f"CPU, {cores} threads")
    if torch.cuda.is_available():
        run(torch.device("cuda"), max(args.batch, 32), args.frames, args.repeats,
            f"GPU {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
