"""Speed and accuracy of our PyTorch TV-L1 (``tvl1_flow``) next to OpenCV's DualTVL1, in one run.

Prints:

* frame pairs/s at 128x171 and 256x340 (consecutive frames of real clips, OpenCV default parameters) for
  OpenCV on 1 thread and on all threads (its own parallel loops inside one call), for ours on the CPU, and on
  CUDA when present for several batch sizes with the peak GPU memory; the ratio ours / OpenCV (1 thread);
* mean endpoint error on Middlebury (RubberWhale, Dimetrodon) at full resolution for both, and the ratio;
* agreement of the stored 8-bit flow (``flow_to_uint8``) with the OpenCV path on frames of every clip in
  ../shared/data/clips at short side 128: mean absolute difference in stored units and the fraction of
  values differing by more than 2 units.

Usage: ``python benchmarks/bench_tvl1.py [--pairs 4] [--cuda-batches 16,64,256] [--compile]``.
Needs ../shared/data (or COCLR_SHARED).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import av
import cv2
import numpy as np
import torch

from coclr.data.flow.middlebury import endpoint_error, read_flo
from coclr.data.flow.opencv import opencv_threads, opencv_tvl1, rgb_to_gray
from coclr.data.flow.params import TVL1Params
from coclr.data.flow.tvl1 import tvl1_flow

try:
    from coclr.data.flow.encode import flow_to_uint8
except ImportError:  # the formula of docs/ARCHITECTURE.md

    def flow_to_uint8(flow: np.ndarray) -> np.ndarray:
        return np.round((np.clip(flow, -20, 20) + 20) * 255 / 40).astype(np.uint8)


SHARED = Path(os.environ.get("COCLR_SHARED", Path(__file__).resolve().parents[1].parent / "shared")) / "data"
SIZES = {(128, 171): "v_Basketball_g01_c01.avi", (256, 340): "arm_wrestling.mp4"}
ALL_THREADS = os.cpu_count() or 1


def gray_frames(path: Path, count: int, size: tuple[int, int] | None = None, short_side: int | None = None,
                start: int = 0) -> np.ndarray:
    """``count`` consecutive grayscale frames ``uint8 [count, H, W]`` from frame ``start`` of a video."""
    frames = []
    with av.open(str(path)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index < start:
                continue
            rgb = frame.to_ndarray(format="rgb24")
            if short_side is not None:
                h, w = rgb.shape[:2]
                size = (short_side, round(w * short_side / h)) if h <= w else (round(h * short_side / w), short_side)
            rgb = cv2.resize(rgb, (size[1], size[0]), interpolation=cv2.INTER_AREA)
            frames.append(rgb_to_gray(rgb))
            if len(frames) == count:
                break
    return np.stack(frames)


def best_time(fn: Callable[[], object], repeats: int = 2) -> float:
    """Fastest of ``repeats`` runs, in seconds (the machine may be shared)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def opencv_pairs(frames: np.ndarray) -> list[np.ndarray]:
    return [opencv_tvl1(frames[i], frames[i + 1]) for i in range(len(frames) - 1)]


def ours_pairs(frames: np.ndarray, device: str = "cpu", compile: bool = False) -> np.ndarray:
    batch = torch.from_numpy(frames).to(device)
    flow = tvl1_flow(batch[:-1], batch[1:], compile=compile)
    if device != "cpu":
        torch.cuda.synchronize()
    return flow.permute(0, 2, 3, 1).cpu().numpy()


def speed(pairs: int, cuda_batches: list[int], compile: bool) -> None:
    print(f"== frame pairs/s, OpenCV default parameters, {pairs} pairs per size ==")
    for size, clip in SIZES.items():
        frames = gray_frames(SHARED / "clips" / clip, pairs + 1, size=size)
        with opencv_threads(1):
            cv_one = pairs / best_time(lambda: opencv_pairs(frames), 1)
        with opencv_threads(ALL_THREADS):
            cv_all = pairs / best_time(lambda: opencv_pairs(frames), 1)
        torch.set_num_threads(1)
        ours_one = pairs / best_time(lambda: ours_pairs(frames), 1)
        torch.set_num_threads(ALL_THREADS)
        ours_all = pairs / best_time(lambda: ours_pairs(frames), 1)
        print(f"{size[0]}x{size[1]}: OpenCV 1 thread {cv_one:.2f}, {ALL_THREADS} threads {cv_all:.2f} | "
              f"ours CPU 1 thread {ours_one:.2f} ({ours_one / cv_one:.2f}x OpenCV 1 thread), "
              f"{ALL_THREADS} threads {ours_all:.2f} ({ours_all / cv_all:.2f}x OpenCV {ALL_THREADS} threads)")
        if torch.cuda.is_available():
            for batch in cuda_batches:
                repeated = np.concatenate([frames] * (batch // pairs + 1))[: batch + 1]
                ours_pairs(repeated, "cuda", compile)  # warm-up (and compilation)
                torch.cuda.reset_peak_memory_stats()
                rate = batch / best_time(lambda: ours_pairs(repeated, "cuda", compile))
                peak = torch.cuda.max_memory_allocated() / 2**30
                print(f"    ours CUDA ({torch.cuda.get_device_name()}) batch {batch}{' compiled' if compile else ''}: "
                      f"{rate:.1f} pairs/s ({rate / cv_one:.0f}x OpenCV 1 thread, {rate / cv_all:.0f}x "
                      f"{ALL_THREADS} threads), peak memory {peak:.2f} GiB")


def middlebury_accuracy() -> None:
    print("== Middlebury mean endpoint error, full resolution, default parameters ==")
    torch.set_num_threads(ALL_THREADS)
    for name in ("RubberWhale", "Dimetrodon"):
        folder = SHARED / "flow" / "middlebury" / name
        first = cv2.imread(str(folder / "frame10.png"), cv2.IMREAD_GRAYSCALE)
        second = cv2.imread(str(folder / "frame11.png"), cv2.IMREAD_GRAYSCALE)
        gt = read_flo(folder / "flow10.flo")
        theirs = opencv_tvl1(first, second)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        mine = ours_pairs(np.stack([first, second]), device)[0]
        epe_theirs, epe_mine = endpoint_error(theirs, gt)["epe"], endpoint_error(mine, gt)["epe"]
        print(f"{name}: OpenCV {epe_theirs:.4f} px, ours ({device}) {epe_mine:.4f} px, ratio "
              f"{epe_mine / epe_theirs:.3f}; mean |ours - OpenCV| {np.abs(mine - theirs).mean():.5f} px")


def stored_agreement(frames_per_clip: int) -> None:
    print(f"== stored 8-bit flow vs the OpenCV path, {frames_per_clip - 1} pairs per clip, short side 128 ==")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    diffs = []
    for clip in sorted((SHARED / "clips").iterdir()):
        frames = gray_frames(clip, frames_per_clip, short_side=128, start=10)
        theirs = flow_to_uint8(np.stack(opencv_pairs(frames))).astype(np.int16)
        mine = flow_to_uint8(ours_pairs(frames, device)).astype(np.int16)
        diff = np.abs(mine - theirs)[..., :2]
        diffs.append(diff.ravel())
        print(f"{clip.name} {frames.shape[1]}x{frames.shape[2]}: mean |diff| {diff.mean():.4f} units, "
              f"> 2 units {100 * (diff > 2).mean():.3f}% of values")
    every = np.concatenate(diffs)
    print(f"all clips: mean |diff| {every.mean():.4f} units, > 2 units {100 * (every > 2).mean():.3f}%, "
          f"max {every.max()} units")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4, help="pairs timed per size on the CPU")
    parser.add_argument("--cuda-batches", default="16,64,256", help="batch sizes timed on CUDA")
    parser.add_argument("--compile", action="store_true", help="CUDA runs use torch.compile")
    parser.add_argument("--agreement-frames", type=int, default=4, help="frames per clip for the 8-bit check")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, OpenCV {cv2.__version__}, {ALL_THREADS} CPU threads, params {TVL1Params()}")
    speed(args.pairs, [int(b) for b in args.cuda_batches.split(",")], args.compile)
    middlebury_accuracy()
    stored_agreement(args.agreement_frames)


if __name__ == "__main__":
    main()
