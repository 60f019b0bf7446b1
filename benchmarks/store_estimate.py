"""What `coclr learn`'s store phase costs against what its calibration prices it at, part by part.

The plan prices the store as the store job timed as it runs on the first frames of the videos the calibration
samples (`learn.budget.store_costs`: the job's start, a video's own part, a further frame, each the median of
learn.budget.REPEATS timings) and counts them for the footage (`learn.budget.store_seconds`); plans made before
divided one process's figures (the calibration's decode: native size, FFmpeg's frame threads; and JPEG) by the
workers. This times, on VIDEOS (a folder), REPEATS times each, in turn: the calibration's decode of the first 48
frames of each video and the CPU its decoder threads take (process CPU time over wall time: the cores one decoder
already uses); whole videos decoded at their own size; the store's own work in one process (every frame decoded at
the clip side, then JPEG); the calibration's timing of the store job; and the store job itself (`build_store`,
WORKERS processes, as learn runs it). It prints each figure, both estimates, and the job against each.

    python benchmarks/store_estimate.py ../shared/data/clips --size 64 --workers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("videos", help="a folder of videos")
    parser.add_argument("--size", type=int, default=64, help="the clip side the store keeps (a candidate's size)")
    parser.add_argument("--workers", type=int, default=2, help="processes of the store job")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import numpy as np

    import coclr.cli  # noqa: F401 (the process policy of every entry point)
    from coclr.learn.budget import SAMPLE_VIDEOS, Costs, Footage, store_costs, store_seconds
    from coclr.store.build import build_store
    from coclr.store.jpeg import encode_jpeg
    from coclr.video.decode import VideoReader, decode_video, probe_video
    from coclr.video.indexes import unlabelled_index

    paths = sorted(str(path) for path in Path(args.videos).iterdir() if path.is_file())
    print(f"{len(paths)} videos, short side {args.size}, {args.workers} workers, {os.cpu_count()} cores")
    footage = Footage.of([probe_video(path) for path in paths])
    spread = np.unique(np.linspace(0, len(paths) - 1, min(SAMPLE_VIDEOS, len(paths))).round())
    sampled = [paths[int(i)] for i in spread]  # as learn.budget.measure_costs samples them
    for repeat in range(args.repeats):
        wall = cpu = 0.0
        counted = 0
        for number, path in enumerate(paths):  # the calibration's decode (learn.budget.measure_costs)
            begin, begin_cpu, frames = time.perf_counter(), time.process_time(), 0
            with VideoReader(path) as reader:
                for _ in reader:
                    frames += 1
                    if frames == 48:
                        break
            if number:  # the first warms the decoder up, as in the calibration
                wall += time.perf_counter() - begin
                cpu += time.process_time() - begin_cpu
                counted += frames
        decode_frame, threads = wall / counted, cpu / wall
        native = decoding = encoding = 0.0
        frames = 0
        for path in paths:  # whole videos at their own size, then the store's work in one process
            begin = time.perf_counter()
            decode_video(path, None)
            native += time.perf_counter() - begin
            begin = time.perf_counter()
            decoded = decode_video(path, args.size)
            middle = time.perf_counter()
            for frame in decoded:
                encode_jpeg(frame)
            decoding += middle - begin
            encoding += time.perf_counter() - middle
            frames += len(decoded)
        total = decoding + encoding
        begin = time.perf_counter()
        start, video, further = store_costs(sampled, args.size, args.workers, footage, decode_frame)
        timing = time.perf_counter() - begin
        timed = Costs(decode_frame, {args.size: encoding / frames}, {}, {}, {}, {}, {}, {}, args.workers,
                      store_job={args.size: start}, store_video={args.size: video}, store_next={args.size: further})
        estimate = store_seconds(footage, args.size, timed)
        with tempfile.TemporaryDirectory(prefix="coclr-store-") as tmp:
            index = unlabelled_index([os.path.basename(path) for path in paths], "videos")
            begin = time.perf_counter()
            build_store(index, args.videos, Path(tmp) / "store", short_side=args.size, workers=args.workers)
            job = time.perf_counter() - begin
        before = frames * (decode_frame + encoding / frames) / args.workers
        print(f"repeat {repeat}: {frames} frames; calibration {1e3 * decode_frame:.3f} ms/frame decoded, one decoder "
              f"on {threads:.2f} cores; whole videos {1e3 * native / frames:.3f} ms/frame at their size, "
              f"{1e3 * decoding / frames:.3f} at {args.size} px; one process {total:.3f} s (decoding {decoding:.3f} s, "
              f"JPEG {encoding:.3f} s); the store job timed as it runs ({timing:.2f} s): its start "
              f"{1e3 * start:.1f} ms, a video's own part {1e3 * video:.2f} ms, each further frame {1e3 * further:.3f} "
              f"ms; the job {job:.3f} s "
              f"({total / job:.2f}x one process); the plan's estimate {estimate:.3f} s (job / estimate "
              f"{job / estimate:.2f}); one process's figures over the workers {before:.3f} s (job / that "
              f"{job / before:.2f})", flush=True)


if __name__ == "__main__":
    main()
