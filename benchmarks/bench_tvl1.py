"""Speed and accuracy of our PyTorch TV-L1 (``tvl1_flow``) next to OpenCV's DualTVL1, and of ``coclr flow``'s
tvl1-torch pipeline from MP4 files to a written store, in one run.

Prints:

* frame pairs/s at 128x171 and 256x340 (consecutive frames of real clips, OpenCV default parameters) for
  OpenCV on 1 thread and on all threads (its own parallel loops inside one call) and for ours on the CPU in
  each mode (exact, fast), with the ratio ours / OpenCV (1 thread); on CUDA, when present, for each mode,
  implementation (the fused Triton kernels, PyTorch operations) and batch size, with the peak GPU memory;
* mean endpoint error on Middlebury (RubberWhale, Dimetrodon) at full resolution for OpenCV and both modes;
* agreement of the stored 8-bit flow (``flow_to_uint8``) with the OpenCV path, and of the fast mode with the
  exact mode, on frames of every clip in ../shared/data/clips at short side 128;
* end to end from MP4 files: the RGB store built (``coclr data store``: decoding, resizing, JPEG) and the flow
  view written by the tvl1-torch pipeline (decoding workers, batches across videos, encoding workers, atomic
  writes): videos/s and pairs/s of each stage, the share of the time the device waited for input, and the hours
  UCF101 (2.5 M pairs) and Kinetics-400 (60 M pairs) would take at that rate on the device measured.

Usage: ``python benchmarks/bench_tvl1.py [--pairs 4] [--cuda-batches 64,256,1024] [--e2e-frames 0]
[--e2e-repeat 20]``. Without a CUDA device the GPU rows say so and the end-to-end stage runs on the CPU (on
the first ``--e2e-frames`` frames of each clip). The real clips and Middlebury come from ../shared/data (or
COCLR_SHARED). On a bare GPU machine (no PyAV, no OpenCV contrib modules, no ../shared) it starts all the same:
the speed rows run on synthetic frames (``coclr.synth``) without the OpenCV columns, and each section that needs
what is missing says so in one line and is skipped.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import torch

from coclr.flow.encode import flow_to_uint8
from coclr.flow.opencv import opencv_tvl1, rgb_to_gray
from coclr.flow.params import FAST_STOP_EVERY, MODES, TVL1Params
from coclr.flow.tvl1 import triton_available, tvl1_flow
from coclr.store.build import build_store
from coclr.store.flow_extract import extract_flow
from coclr.threads import opencv_threads
from coclr.video.indexes import VideoEntry, VideoIndex
from frame_pool import frame_pool, have_pyav
from middlebury import endpoint_error, read_flo

DATASET_PAIRS = {"UCF101": 2.5e6, "Kinetics-400": 60e6}
"""Frame pairs of the datasets (consecutive frames of every video), for the projections."""
SHARED = Path(os.environ.get("COCLR_SHARED", Path(__file__).resolve().parents[1].parent / "shared")) / "data"
SIZES = {(128, 171): "v_Basketball_g01_c01.avi", (256, 340): "arm_wrestling.mp4"}
ALL_THREADS = os.cpu_count() or 1


HAVE_OPENCV_TVL1 = hasattr(cv2, "optflow")
"""OpenCV's DualTVL1 is in the contrib modules (opencv-contrib-python-headless)."""


def missing(*needs: str) -> str | None:
    """Why a section cannot run here (one line), or None: ``needs`` among ``shared``, ``pyav``, ``opencv``."""
    reasons = {"shared": (SHARED.is_dir(), f"no {SHARED} (set COCLR_SHARED)"),
               "pyav": (have_pyav(), "no PyAV (pip install av)"),
               "opencv": (HAVE_OPENCV_TVL1, "no cv2.optflow (pip install opencv-contrib-python-headless)")}
    lacking = [reasons[need][1] for need in needs if not reasons[need][0]]
    return "; ".join(lacking) or None


def speed_frames(size: tuple[int, int], count: int) -> tuple[np.ndarray, str]:
    """``count`` consecutive grayscale frames at ``size``: of the section's real clip when it can be read, else
    of a synthetic clip (repeated if it is shorter)."""
    clip = SIZES.get(size)
    if clip is not None and missing("shared", "pyav") is None:
        return gray_frames(SHARED / "clips" / clip, count, size=size), clip
    videos, source = frame_pool(size, min(count, 64), 1)
    gray = np.stack([rgb_to_gray(frame) for frame in videos[0]])
    return np.concatenate([gray] * (count // len(gray) + 1))[:count], source


def gray_frames(path: Path, count: int, size: tuple[int, int] | None = None, short_side: int | None = None,
                start: int = 0) -> np.ndarray:
    """``count`` consecutive grayscale frames ``uint8 [count, H, W]`` from frame ``start`` of a video."""
    import av  # optional: see missing()

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


def ours_pairs(frames: np.ndarray, device: str = "cpu", mode: str = "exact", kernels: str = "auto",
               stop_every: int = FAST_STOP_EVERY) -> np.ndarray:
    batch = torch.from_numpy(frames).to(device)
    flow = tvl1_flow(batch[:-1], batch[1:], mode=mode, kernels=kernels, stop_every=stop_every)
    if device != "cpu":
        torch.cuda.synchronize()
    return flow.permute(0, 2, 3, 1).cpu().numpy()


def speed(pairs: int, cuda_batches: list[int], stop_every: int, sizes: list[tuple[int, int]]) -> None:
    print(f"== frame pairs/s, OpenCV default parameters, {pairs} pairs per size on the CPU ==")
    for size in sizes:
        frames, source = speed_frames(size, pairs + 1)
        line = [f"{size[0]}x{size[1]} ({source})"]
        cv_one = math.nan
        if HAVE_OPENCV_TVL1:
            with opencv_threads(1):
                cv_one = pairs / best_time(lambda frames=frames: opencv_pairs(frames), 1)
            with opencv_threads(ALL_THREADS):
                cv_all = pairs / best_time(lambda frames=frames: opencv_pairs(frames), 1)
            line.append(f"OpenCV 1 thread {cv_one:.2f}, {ALL_THREADS} threads {cv_all:.2f}")
        else:
            line.append(f"OpenCV: not measured ({missing('opencv')})")
        for mode in MODES:
            run = lambda frames=frames, mode=mode: ours_pairs(frames, mode=mode, stop_every=stop_every)  # noqa: E731
            torch.set_num_threads(1)
            one = pairs / best_time(run, 1)
            torch.set_num_threads(ALL_THREADS)
            every = pairs / best_time(run, 1)
            line.append(f"ours CPU {mode} 1 thread {one:.2f} ({one / cv_one:.2f}x OpenCV 1 thread), "
                        f"{ALL_THREADS} threads {every:.2f}")
        torch.set_num_threads(1)
        print(" | ".join(line), flush=True)
        if not torch.cuda.is_available():
            print("    GPU: not measured (no CUDA device)")
            continue
        name = torch.cuda.get_device_name()
        many, _ = speed_frames(size, max(cuda_batches) + 1)  # distinct pairs, repeated
        kinds = ["triton", "torch"] if triton_available() else ["torch"]
        for mode in MODES:
            for kernels in kinds:
                for batch in cuda_batches:
                    repeated = np.concatenate([many] * (batch // len(many) + 1))[: batch + 1]
                    run = lambda repeated=repeated, mode=mode, kernels=kernels: ours_pairs(  # noqa: E731
                        repeated, "cuda", mode, kernels, stop_every)
                    run()  # warm-up (and Triton's compilation)
                    torch.cuda.reset_peak_memory_stats()
                    rate = batch / best_time(run)
                    peak = torch.cuda.max_memory_allocated() / 2**30
                    print(f"    ours CUDA ({name}) {mode} {kernels} batch {batch}: {rate:.1f} pairs/s "
                          f"({rate / cv_one:.0f}x OpenCV 1 thread), peak memory {peak:.2f} GiB", flush=True)


def middlebury_accuracy(stop_every: int) -> None:
    print("== Middlebury mean endpoint error, full resolution, default parameters ==")
    torch.set_num_threads(ALL_THREADS)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ("RubberWhale", "Dimetrodon"):
        folder = SHARED / "flow" / "middlebury" / name
        first = cv2.imread(str(folder / "frame10.png"), cv2.IMREAD_GRAYSCALE)
        second = cv2.imread(str(folder / "frame11.png"), cv2.IMREAD_GRAYSCALE)
        gt = read_flo(folder / "flow10.flo")
        theirs = opencv_tvl1(first, second)
        epe_theirs = endpoint_error(theirs, gt)["epe"]
        line = [f"{name}: OpenCV {epe_theirs:.4f} px"]
        for mode in MODES:
            mine = ours_pairs(np.stack([first, second]), device, mode, stop_every=stop_every)[0]
            epe_mine = endpoint_error(mine, gt)["epe"]
            line.append(f"ours {mode} ({device}) {epe_mine:.4f} px, ratio {epe_mine / epe_theirs:.4f}, mean |ours - "
                        f"OpenCV| {np.abs(mine - theirs).mean():.5f} px")
        print(" | ".join(line), flush=True)
    torch.set_num_threads(1)


def stored_agreement(frames_per_clip: int, stop_every: int) -> None:
    print(f"== stored 8-bit flow: exact vs the OpenCV path, fast vs exact; {frames_per_clip - 1} pairs per clip, "
          "short side 128 ==")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    diffs, fast_diffs = [], []
    for clip in sorted((SHARED / "clips").iterdir()):
        frames = gray_frames(clip, frames_per_clip, short_side=128, start=10)
        theirs = flow_to_uint8(np.stack(opencv_pairs(frames))).astype(np.int16)
        mine = flow_to_uint8(ours_pairs(frames, device)).astype(np.int16)
        fast = flow_to_uint8(ours_pairs(frames, device, "fast", stop_every=stop_every)).astype(np.int16)
        diff, fast_diff = np.abs(mine - theirs)[..., :2], np.abs(fast - mine)[..., :2]
        diffs.append(diff.ravel())
        fast_diffs.append(fast_diff.ravel())
        print(f"{clip.name} {frames.shape[1]}x{frames.shape[2]}: exact vs OpenCV mean |diff| {diff.mean():.4f} units, "
              f"> 2 units {100 * (diff > 2).mean():.3f}% | fast vs exact {fast_diff.mean():.4f} units, > 2 units "
              f"{100 * (fast_diff > 2).mean():.3f}%", flush=True)
    every, fast_every = np.concatenate(diffs), np.concatenate(fast_diffs)
    print(f"all clips: exact vs OpenCV mean |diff| {every.mean():.4f} units, > 2 units "
          f"{100 * (every > 2).mean():.3f}%, max {every.max()} units | fast vs exact {fast_every.mean():.4f} units "
          f"(bound 0.5), max {fast_every.max()}")


def trimmed_clips(folder: Path, frames: int) -> None:
    """The clips of ../shared/data/clips as MP4 files in ``folder``, each cut to its first ``frames`` frames
    (re-encoded with H.264; all frames when ``frames`` is 0, copied as they are)."""
    import av  # optional: see missing()

    for clip in sorted((SHARED / "clips").iterdir()):
        if not frames:
            shutil.copy(clip, folder / clip.name)
            continue
        with av.open(str(clip)) as source, av.open(str(folder / (clip.stem + ".mp4")), "w") as target:
            stream = target.add_stream("libx264", rate=25)
            stream.pix_fmt = "yuv420p"
            for index, frame in enumerate(source.decode(video=0)):
                if index == frames:
                    break
                if index == 0:
                    stream.width, stream.height = frame.width // 2 * 2, frame.height // 2 * 2
                image = av.VideoFrame.from_ndarray(frame.to_ndarray(format="rgb24")[: stream.height, : stream.width],
                                                   format="rgb24")
                for packet in stream.encode(image):
                    target.mux(packet)
            for packet in stream.encode():
                target.mux(packet)


def end_to_end(frames: int, repeat: int, short_side: int, mode: str, stop_every: int, batch: int,
               workers: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {ALL_THREADS} threads"
    length = f"first {frames} frames of each" if frames else "every frame of each"
    print(f"== end to end from MP4 files to a written store: {length} of the {repeat} x 8 clips, short side "
          f"{short_side}, tvl1-torch {mode} on {device} ({where}), batches of {batch} pairs, {workers} CPU workers ==")
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        (folder / "videos" / "clips").mkdir(parents=True)
        trimmed_clips(folder / "videos" / "clips", frames)
        names = sorted(p.name for p in (folder / "videos" / "clips").iterdir())
        entries = []
        for copy in range(repeat):  # the same files under other names: distinct entries of one store
            if copy:
                (folder / "videos" / f"copy{copy}").symlink_to(folder / "videos" / "clips")
            entries += [VideoEntry(f"{'clips' if not copy else f'copy{copy}'}/{name}", 0, "train") for name in names]
        index = VideoIndex("clips", ["any"], entries)
        if device == "cuda":  # Triton compiles its kernels on first use: not part of the measurement
            warm = VideoIndex("warm", ["any"], entries[: len(names)])
            build_store(warm, folder / "videos", folder / "warm", short_side=short_side, workers=workers)
            extract_flow(folder / "warm", backend="tvl1-torch", device=device, workers=workers, batch_pairs=batch,
                         mode=mode, stop_every=stop_every)
        start = time.perf_counter()
        built = build_store(index, folder / "videos", folder / "store", short_side=short_side, workers=workers)
        decoded = time.perf_counter() - start
        start = time.perf_counter()
        flow = extract_flow(folder / "store", backend="tvl1-torch", device=device, workers=workers,
                            batch_pairs=batch, mode=mode, stop_every=stop_every)
        extracted = time.perf_counter() - start
        stats = next((note for note in flow.notes if "waited for input" in note), "")
        pairs = flow.frames
        print(f"MP4 -> RGB store: {built.done} videos, {built.frames} frames in {decoded:.1f} s "
              f"({built.done / decoded:.2f} videos/s)")
        print(f"RGB store -> flow view: {flow.done} videos, {pairs} pairs in {extracted:.1f} s "
              f"({flow.done / extracted:.2f} videos/s, {pairs / extracted:.1f} pairs/s); {stats}")
        total = decoded + extracted
        print(f"MP4 -> RGB store -> flow view: {flow.done / total:.2f} videos/s, {pairs / total:.1f} pairs/s")
        for dataset, count in DATASET_PAIRS.items():
            print(f"projected from the rates measured above on {where} (not measured on the dataset): {dataset} "
                  f"({count / 1e6:g} M pairs) {count / (pairs / extracted) / 3600:.1f} h for the flow view, "
                  f"{count / (pairs / total) / 3600:.1f} h from MP4 files")
    if device == "cpu":
        print("GPU: not measured (no CUDA device)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4, help="pairs timed per size on the CPU")
    parser.add_argument("--sizes", default="128x171,256x340", help="frame sizes (HxW) of the speed section")
    parser.add_argument("--cuda-batches", default="64,256,1024", help="batch sizes timed on CUDA")
    parser.add_argument("--stop-every", type=int, default=FAST_STOP_EVERY, help="the fast mode's stop interval")
    parser.add_argument("--agreement-frames", type=int, default=4, help="frames per clip for the 8-bit check")
    parser.add_argument("--e2e-frames", type=int, default=None,
                        help="frames of each clip in the end-to-end run (0: all; default all on CUDA, 12 on the CPU)")
    parser.add_argument("--e2e-repeat", type=int, default=None,
                        help="copies of the 8 clips in the end-to-end run (default 20 on CUDA, 1 on the CPU)")
    parser.add_argument("--e2e-short-side", type=int, default=256, help="short side of the end-to-end store")
    parser.add_argument("--e2e-mode", default="fast", choices=MODES, help="mode of the end-to-end run")
    parser.add_argument("--e2e-batch", type=int, default=None, help="pairs per batch (default 1024 on CUDA, 64)")
    parser.add_argument("--workers", type=int, default=ALL_THREADS, help="CPU workers of the end-to-end run")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: speed, middlebury, "
                        "agreement, e2e")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    skip = set(filter(None, args.skip.split(",")))
    needs = {"middlebury": ("shared", "opencv"), "agreement": ("shared", "pyav", "opencv"), "e2e": ("shared", "pyav")}
    for section, need in needs.items():
        if section not in skip and missing(*need):
            print(f"{section}: skipped, {missing(*need)}")
            skip.add(section)
    print(f"torch {torch.__version__}, OpenCV {cv2.__version__}, {ALL_THREADS} CPU threads, Triton "
          f"{'importable' if triton_available() else 'not importable'}, params {TVL1Params()}, fast mode stop_every "
          f"{args.stop_every}")
    torch.set_num_threads(1)
    if "speed" not in skip:
        sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
        speed(args.pairs, [int(b) for b in args.cuda_batches.split(",")], args.stop_every, sizes)
    if "middlebury" not in skip:
        middlebury_accuracy(args.stop_every)
    if "agreement" not in skip:
        stored_agreement(args.agreement_frames, args.stop_every)
    if "e2e" not in skip:
        frames = args.e2e_frames if args.e2e_frames is not None else (0 if cuda else 12)
        repeat = args.e2e_repeat or (20 if cuda else 1)
        end_to_end(frames, repeat, args.e2e_short_side, args.e2e_mode, args.stop_every,
                   args.e2e_batch or (1024 if cuda else 64), args.workers)


if __name__ == "__main__":
    main()
