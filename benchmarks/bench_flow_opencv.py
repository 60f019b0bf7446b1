"""Accuracy and speed of the OpenCV flow backends, and the cost of our extraction path around them.

Prints, for TV-L1 (OpenCV defaults) and DIS ("medium"):

* Middlebury (RubberWhale, Dimetrodon): mean endpoint error at full resolution, seconds per pair, and the
  error added by the paper's storage (uint8, then colour JPEG at the store's quality);
* real clips at 128x171 (UCF101 clips, short side 128) and 256x340 (Kinetics-style clips): frame pairs/s
  of OpenCV's own call on pre-converted grayscale frames, next to our whole extraction path
  (``extract_flow``: read the store, decode JPEG, grayscale, flow, uint8, JPEG, atomic write) on the same
  frames, with OpenCV on 1 thread and on all threads, and the ratio ours / OpenCV.

Needs ../shared/data. Usage: ``python benchmarks/bench_flow_opencv.py [--pairs 4] [--dis-pairs 64] [--quality 90]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from coclr.flow.encode import flow_to_uint8, uint8_to_flow
from coclr.flow.opencv import opencv_dis, opencv_tvl1, rgb_to_gray
from coclr.store.clipstore import create_store, write_entry
from coclr.store.flow_extract import extract_flow
from coclr.store.jpeg import decode_jpeg, encode_jpeg
from coclr.threads import opencv_threads
from coclr.video.decode import decode_video
from coclr.video.indexes import VideoEntry, VideoIndex
from middlebury import endpoint_error, read_flo, valid_mask

SHARED = Path(os.environ.get("COCLR_SHARED", Path(__file__).resolve().parents[1].parent / "shared")) / "data"
CLIPS = {128: ["v_Basketball_g01_c01.avi", "v_BaseballPitch_g01_c01.avi"],
         256: ["arm_wrestling.mp4", "cleaning_pool.mp4"]}
METHODS = {"tvl1": opencv_tvl1, "dis": opencv_dis}
ALL_THREADS = cv2.getNumThreads()


def middlebury(quality: int) -> None:
    print(f"Middlebury, full resolution, grayscale input; storage = uint8 then colour JPEG q{quality}")
    print(f"{'pair':<12} {'method':<5} {'EPE':>7} {'s/pair':>7} {'+uint8':>7} {'+JPEG':>7} {'EPE stored':>10}")
    for name in ("RubberWhale", "Dimetrodon"):
        folder = SHARED / "flow" / "middlebury" / name
        images = [cv2.cvtColor(cv2.imread(str(folder / f)), cv2.COLOR_BGR2RGB) for f in ("frame10.png", "frame11.png")]
        prev, nxt = rgb_to_gray(np.stack(images))
        gt = read_flo(folder / "flow10.flo")
        mask = valid_mask(gt)
        for method, compute in METHODS.items():
            start = time.perf_counter()
            flow = compute(prev, nxt)
            seconds = time.perf_counter() - start
            quantised = uint8_to_flow(flow_to_uint8(flow))
            stored = uint8_to_flow(decode_jpeg(encode_jpeg(flow_to_uint8(flow), quality)))
            added_uint8 = np.linalg.norm(quantised - flow, axis=-1)[mask].mean()
            added_jpeg = np.linalg.norm(stored - flow, axis=-1)[mask].mean()
            print(f"{name:<12} {method:<5} {endpoint_error(flow, gt)['epe']:7.4f} {seconds:7.3f} "
                  f"{added_uint8:7.4f} {added_jpeg:7.4f} {endpoint_error(stored, gt)['epe']:10.4f}")


def clip_frames(short_side: int, pairs: int) -> dict[str, np.ndarray]:
    """``pairs + 1`` consecutive RGB frames from the middle of each clip of that size (fewer if it is short)."""
    videos = {}
    for name in CLIPS[short_side]:
        frames = decode_video(SHARED / "clips" / name, short_side=short_side)
        start = max(0, min(len(frames) // 2, len(frames) - pairs - 1))
        videos[name] = frames[start: start + pairs + 1]
    return videos


def opencv_rate(method: str, videos: dict[str, np.ndarray], quality: int) -> float:
    """Pairs/s of OpenCV's own calls on grayscale frames decoded from the same JPEGs our path reads."""
    grays = [rgb_to_gray(np.stack([decode_jpeg(encode_jpeg(f, quality)) for f in frames]))
             for frames in videos.values()]
    count, start = 0, time.perf_counter()
    for gray in grays:
        for prev, nxt in zip(gray[:-1], gray[1:]):
            METHODS[method](prev, nxt)
            count += 1
    return count / (time.perf_counter() - start)


def ours_rate(method: str, store: Path, view: str) -> float:
    """Pairs/s of the whole extraction into a fresh view of ``store``, in this process."""
    summary = extract_flow(store, backend=method, view=view, workers=1)
    assert not summary.failed, summary.failed
    return summary.frames / summary.seconds


def make_store(root: Path, videos: dict[str, np.ndarray], quality: int) -> Path:
    create_store(root, VideoIndex("bench", ["x"], [VideoEntry(k, 0, "test") for k in videos]), quality=quality)
    for key, frames in videos.items():
        write_entry(root, key, "rgb", [encode_jpeg(f, quality) for f in frames], fps=25.0)
    return root


def clips(pairs: dict[str, int], quality: int) -> None:
    print(f"\nReal clips, 2 clips per size, frame pairs per clip {pairs}; pairs/s (higher is better)")
    print(f"{'size':<8} {'method':<5} {'threads':>7} {'OpenCV call':>12} {'ours':>8} {'ours/OpenCV':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for short_side in CLIPS:
            for method, count in pairs.items():
                videos = clip_frames(short_side, count)
                height, width = next(iter(videos.values())).shape[1:3]
                store = make_store(Path(tmp) / f"{method}{short_side}", videos, quality)
                for threads in sorted({1, ALL_THREADS}):
                    with opencv_threads(threads):
                        theirs = opencv_rate(method, videos, quality)
                        ours = ours_rate(method, store, f"{method}_{threads}")
                    print(f"{height}x{width:<4} {method:<5} {threads:>7} {theirs:12.2f} {ours:8.2f} "
                          f"{ours / theirs:11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4,
                        help="TV-L1 frame pairs per clip (TV-L1 costs ~0.8 s/pair at 256x340 on one core)")
    parser.add_argument("--dis-pairs", type=int, default=64, help="DIS frame pairs per clip")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality of the store (the build default)")
    args = parser.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"shared data not found: {SHARED}")
    print(f"OpenCV {cv2.__version__}, all threads = {ALL_THREADS}")
    middlebury(args.quality)
    clips({"tvl1": args.pairs, "dis": args.dis_pairs}, args.quality)


if __name__ == "__main__":
    main()
