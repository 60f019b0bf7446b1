"""Cost and difficulty of the built-in synthetic dataset (coclr.synth) at its default (demo) size.

Prints the time to generate the store with 1 and 2 worker processes (and their ratio, same run), the
rendering time per clip alone, and nearest-neighbour accuracy from train scenes to the unseen test scenes
with simple reference features: appearance (colour histogram + first-frame thumbnail) should stay near
chance, motion (statistics of OpenCV DIS flow) should be far above it, also when test clips are random
8-frame crops. ``--tvl1`` adds the motion features on OpenCV TV-L1 flow (the training pipeline's flow; slow)
and its time per frame pair.

    python benchmarks/bench_synth.py [--seed 0] [--tvl1] [key=value ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from coclr.config import load_config
from coclr.synth import SynthConfig, dataset_clips, generate_synthetic, render_clip
from synth_diagnostics import appearance_features, clip_flow, motion_features, nearest_neighbour_accuracy

CROP = 8


def tvl1_flow(frames: np.ndarray) -> np.ndarray:
    import cv2

    gray = [cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY) for frame in frames]
    tvl1 = cv2.optflow.DualTVL1OpticalFlow_create()
    return np.stack([tvl1.calc(a, b, None) for a, b in zip(gray[:-1], gray[1:])])


def clip_features(args: tuple[SynthConfig, str, bool]) -> dict[str, np.ndarray | float]:
    """Reference features of one clip (run in a worker process)."""
    import cv2

    cv2.setNumThreads(1)
    config, key, with_tvl1 = args
    frames = render_clip(config, key)
    start = int(np.random.default_rng(zlib.crc32(key.encode())).integers(0, config.frames - CROP + 1))
    out: dict[str, np.ndarray | float] = {
        "appearance": appearance_features(frames),
        "motion (DIS)": motion_features(clip_flow(frames)),
        f"motion (DIS, random {CROP}-frame crop)": motion_features(clip_flow(frames[start:start + CROP])),
    }
    if with_tvl1:
        began = time.perf_counter()
        flow = tvl1_flow(frames)
        out["tvl1_seconds"] = (time.perf_counter() - began) / len(flow)
        out["motion (TV-L1)"] = motion_features(flow)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tvl1", action="store_true", help="also measure motion features on TV-L1 flow")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="generator options")
    args = parser.parse_args()
    config = load_config(SynthConfig, overrides=[*args.overrides, f"seed={args.seed}"])
    clips = dataset_clips(config)
    print(f"config: {config.num_classes} classes, {config.train_scenes}+{config.test_scenes} scenes x "
          f"{config.actions_per_scene} actions x {config.clips_per_action} clips = {len(clips)} clips of "
          f"{config.frames} frames at {config.width}x{config.height}")

    rendered = clips[:32]
    began = time.perf_counter()
    for clip in rendered:
        render_clip(config, clip.key)
    print(f"render only: {(time.perf_counter() - began) / len(rendered) * 1000:.1f} ms per clip (one process)")
    seconds = {}
    with tempfile.TemporaryDirectory() as folder:
        for workers in (1, 2):
            began = time.perf_counter()
            summary = generate_synthetic(Path(folder) / f"w{workers}", config, workers=workers)
            seconds[workers] = time.perf_counter() - began
            assert summary.ok, summary
            print(f"generate store, {workers} worker(s): {seconds[workers]:.2f} s "
                  f"({len(clips) / seconds[workers]:.0f} clips/s)")
    print(f"speed-up with 2 workers: {seconds[1] / seconds[2]:.2f}x")

    began = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        features = list(pool.map(clip_features, [(config, c.key, args.tvl1) for c in clips], chunksize=8))
    print(f"features of all clips: {time.perf_counter() - began:.1f} s (2 processes)")
    labels = np.array([c.label for c in clips])
    train = np.array([c.split == "train" for c in clips])
    chance = 1 / config.num_classes
    print(f"nearest neighbour, train scenes -> unseen test scenes (chance {chance:.3f}):")
    for name in features[0]:
        if name == "tvl1_seconds":
            continue
        values = np.stack([f[name] for f in features])
        reference = np.stack([f["motion (DIS)"] for f in features]) if "crop" in name else values
        accuracy = nearest_neighbour_accuracy(reference[train], labels[train], values[~train], labels[~train])
        print(f"  {name:40s} {accuracy:.3f}")
    if args.tvl1:
        per_pair = float(np.mean([f["tvl1_seconds"] for f in features]))
        print(f"OpenCV TV-L1: {per_pair * 1000:.1f} ms per frame pair, so about "
              f"{per_pair * len(clips) * (config.frames - 1) / 2:.0f} s to extract the flow of this dataset "
              "with 2 processes")


if __name__ == "__main__":
    main()
