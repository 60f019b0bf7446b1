"""Throughput of the batched clip augmentation (coclr.data.augment).

Prints clips/s for batches of 32-frame clips of 128x171 stored frames cropped to 128x128: the whole training
augmentation (RGB alone, and RGB + flow sharing crops) on the CPU with one thread and with all threads, and on
the GPU when there is one; and the vectorised crop (one grid_sample for the batch) against a per-clip loop of
slicing + F.interpolate, measured in the same run (best of ``--repeats`` timings each). Then the CPU 8-bit
path's C loops (coclr.data.augment_cpu, 1 thread) against the OpenCV calls a user would write for the same work,
timed alternately (A B B A) on the same clips: the sub-pixel crop of every frame (``cv2.remap`` with fixed-point
maps, one call per frame) and the normalisation into float32 planes (``cv2.split`` + one ``cv2.addWeighted`` per
channel); medians and their ratio.

    python benchmarks/bench_augment.py [--batch 16] [--frames 32] [--repeats 3] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from coclr.data.augment import IMAGENET_MEAN, IMAGENET_STD, ClipAugment, crop_resize
from coclr.data.augment_cpu import KERNEL, crop_clip, rgb_to_planes


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


def opencv_crop(frames: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """The crop with OpenCV: ``remap`` of each frame at the same positions (maps to 1/32 pixel)."""
    maps = cv2.convertMaps(*np.broadcast_arrays(xs[None, :].astype(np.float32), ys[:, None].astype(np.float32)),
                           cv2.CV_16SC2)
    out = np.empty((len(frames), len(ys), len(xs), 3), np.uint8)
    for frame, target in zip(frames, out):
        cv2.remap(frame, *maps, cv2.INTER_LINEAR, dst=target, borderMode=cv2.BORDER_REPLICATE)
    return out


def opencv_planes(clip: np.ndarray, scale: list[float], shift: list[float], out: np.ndarray) -> None:
    """The normalisation with OpenCV: the planes split, then each converted with its scale and shift."""
    for channel, plane in enumerate(cv2.split(clip.reshape(-1, clip.shape[-2], 3))):
        cv2.addWeighted(plane, scale[channel], plane, 0.0, shift[channel], dst=out[channel], dtype=cv2.CV_32F)


def alternate(ours: Callable[[], object], theirs: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median times of ``ours`` and ``theirs``, called A B B A ``rounds`` times after one warm-up each."""
    times: dict[int, list[float]] = {0: [], 1: []}
    calls = (ours, theirs)
    for fn in calls:
        fn()
    for order in [(0, 1), (1, 0)] * rounds:
        for side in order:
            start = time.perf_counter()
            calls[side]()
            times[side].append(time.perf_counter() - start)
    return float(np.median(times[0])), float(np.median(times[1]))


def c_loops_against_opencv(frames: int, rounds: int) -> None:
    if KERNEL.load() is None:
        print("C loops: not built here (no C compiler), nothing to compare")
        return
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    rng = np.random.default_rng(0)
    clip = cv2.GaussianBlur(rng.integers(0, 256, (frames * 128, 171, 3), dtype=np.uint8), (0, 0), 1.5)
    clip = clip.reshape(frames, 128, 171, 3)
    centres = (np.arange(128) + 0.5) / 128
    xs, ys = 13.3 + centres * 120.4 - 0.5, 7.9 + centres * 101.7 - 0.5  # a box of 120.4 x 101.7 at (13.3, 7.9)
    ours, theirs = alternate(lambda: crop_clip(clip, xs, ys), lambda: opencv_crop(clip, xs, ys), rounds)
    print(f"crop of {frames} frames, 1 thread: C {ours * 1e3:7.2f} ms, OpenCV remap {theirs * 1e3:7.2f} ms, "
          f"ratio {theirs / ours:5.2f}x")
    cropped = crop_clip(clip, xs, ys)
    scale = [1 / (255 * s) for s in IMAGENET_STD]
    shift = [-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]
    out = np.empty((3, frames * 128 * 128), np.float32)
    planes = out.reshape(3, frames * 128, 128)
    ours, theirs = alternate(lambda: rgb_to_planes(cropped, scale, shift, out),
                             lambda: opencv_planes(cropped, scale, shift, planes), rounds)
    print(f"normalisation of {frames} frames, 1 thread: C {ours * 1e3:7.2f} ms, OpenCV split + addWeighted "
          f"{theirs * 1e3:7.2f} ms, ratio {theirs / ours:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="clips per batch")
    parser.add_argument("--frames", type=int, default=32, help="frames per clip")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per figure (the best is kept)")
    parser.add_argument("--rounds", type=int, default=8, help="A B B A rounds of the C loops against OpenCV")
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
    c_loops_against_opencv(args.frames, args.rounds)


if __name__ == "__main__":
    main()
