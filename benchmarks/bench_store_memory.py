"""Peak memory of the store jobs against a video's length: `coclr data store` (and `coclr flow`) on one long video.

Generates 320x240 videos of each ``--frames`` count (PyAV, MPEG-4 part 2 at a low bit rate: cheap to write and to
decode; a moving pattern, so every frame differs), then runs, for each, as a child process with one job in the
calling process (``--workers 0``):

- ``coclr data store`` of a one-video index into a new store (short side 128, quality 90, the defaults);
- with ``--flow BACKEND``, ``coclr flow`` of that store with the backend (e.g. ``dis``; TV-L1 on 60,000 frames
  takes hours on a CPU);
- with ``--embed CHECKPOINT``, ``coclr embed`` of the video (decoding in the process, ``--short-side 32 --length 8
  --size 32``: a small network, so that the run measures the frames' memory, not the network's speed).

and prints each child's peak resident set size (``ru_maxrss`` from ``os.wait4``: that child alone) and its wall time.
``--src`` runs another checkout's code (e.g. an older version, for the figures before a change).

    python benchmarks/bench_store_memory.py --frames 6000 60000 [--flow dis] [--flow-args nscales=1 ...]
        [--embed tiny.pth] [--skip-store] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write_video(path: Path, frames: int, width: int = 320, height: int = 240, fps: int = 25) -> Path:
    """A ``frames``-frame MPEG-4 video of a moving gradient and square, written frame by frame (bounded memory)."""
    import av

    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.mp4")
    y, x = np.mgrid[0:height, 0:width]
    with av.open(str(partial), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.bit_rate = 200_000
        for t in range(frames):
            image = np.empty((height, width, 3), np.uint8)
            image[..., 0] = (x + 2 * t) % 256
            image[..., 1] = (y + t) % 256
            image[..., 2] = (x + y + 3 * t) % 256
            top, left = (3 * t) % (height - 40), (5 * t) % (width - 40)
            image[top: top + 40, left: left + 40] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    partial.rename(path)
    return path


def run_child(argv: list[str], src: Path) -> tuple[float, float]:
    """Run ``python -m coclr ARGV`` with ``src`` first on the path; returns (peak RSS in MB, wall seconds)."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "coclr", *argv], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    error = process.stderr.read().decode() if process.stderr else ""
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"coclr {' '.join(argv)} exited {process.returncode}:\n{error[-2000:]}")
    return usage.ru_maxrss / 1024, seconds  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[6000, 60000])
    parser.add_argument("--flow", help="also run coclr flow with this backend (dis is fast)")
    parser.add_argument("--flow-args", nargs="+", default=[], metavar="ARG",
                        help="more arguments of coclr flow, e.g. TV-L1 parameters (nscales=1 warps=1: fewer "
                        "iterations; memory does not depend on them)")
    parser.add_argument("--embed", metavar="CHECKPOINT", help="also run coclr embed with this encoder")
    parser.add_argument("--skip-store", action="store_true", help="only the other runs (--embed)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/coclr_store_memory"), help="scratch folder")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the coclr package's folder to run")
    args = parser.parse_args()

    for frames in args.frames:
        videos = args.work / f"videos{frames}"
        write_video(videos / "a" / f"long{frames}.mp4", frames)
        index = args.work / f"index{frames}.json"
        index.write_text(json.dumps({"format": "coclr-video-index", "version": 1, "name": f"long{frames}",
                                     "classes": ["a"], "entries": [{"path": f"a/long{frames}.mp4", "label": 0,
                                                                    "split": "train", "group": None}]}))
        row: dict[str, float] = {"frames": frames}
        stamp = time.strftime("%H%M%S")
        if args.embed:
            rss, seconds = run_child(["embed", str(videos), "--checkpoint", args.embed, "--out",
                                      str(args.work / f"embed{frames}-{stamp}"), "--workers", "0", "--short-side", "32",
                                      "--length", "8", "--size", "32", "--quiet"], args.src)
            row.update({"embed_peak_rss_mb": round(rss, 1), "embed_seconds": round(seconds, 1)})
        if args.skip_store:
            print(json.dumps(row), flush=True)
            continue
        store = args.work / f"store{frames}-{stamp}"
        rss, seconds = run_child(["data", "store", "--index", str(index), "--root", str(videos), "--out", str(store),
                                  "--workers", "0"], args.src)
        row.update({"store_peak_rss_mb": round(rss, 1), "store_seconds": round(seconds, 1)})
        if args.flow:
            rss, seconds = run_child(["flow", str(store), *args.flow_args, "--backend", args.flow, "--workers", "0"],
                                     args.src)
            row.update({f"flow_{args.flow}_peak_rss_mb": round(rss, 1), f"flow_{args.flow}_seconds": round(seconds, 1)})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
