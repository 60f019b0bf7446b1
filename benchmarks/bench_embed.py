"""Speed of ``coclr embed`` (videos/s, windows/s, the share of time spent decoding) and of ``coclr search``
(chunked exact search against FAISS, when installed).

Embedding: the real clips of ../shared/data/clips (or synthetic videos without ../shared), embedded with a
randomly initialised S3D of ``--width`` (1.0: the paper's network, what users run; timings do not depend on
the weights) by :func:`coclr.embed.run.embed_videos` into a fresh folder, once per number of decoding workers.
The decoding share is the time of decoding alone (the same videos, same settings, one process) over the time of
the serial run (``--workers 0``, decoding then inference in one process). On a CUDA machine the GPU is timed
too.

Search: one query against ``N`` random unit rows of ``--dim`` (float32, memory-mapped from disk as ``coclr
search`` reads them): the chunked exact search, and FAISS ``IndexFlatIP`` with its index built per query (what
``coclr search --backend faiss`` does) and prebuilt (the search alone). Ratios are measured in the same run.

Comparison (``--compare``, and :func:`compare_embed` for ``benchmarks/compare.py``): ``coclr embed`` against the
plain script a user would write (:func:`plain_embed`: PyAV decodes every frame, OpenCV resizes it, the centre crop,
the same windows, the same checkpoint in float32 on batches of one video's windows, the mean of the windows),
same videos, same thread count for both (``torch.set_num_threads`` and the CPU affinity), interleaved A B B A,
medians; the cosine between the two sides' vectors is printed as a check that both compute the same thing. Each
run of a side is a fresh interpreter (timed around the call only, as in one process), so that no process-wide
setting of one side (glibc's malloc policy within :func:`~coclr.embed.run.embed_videos`) reaches the other.

    python benchmarks/bench_embed.py [--width 1.0] [--workers 0 1] [--search-rows 10000 100000 1000000]
    python benchmarks/bench_embed.py --compare [--threads 1 2] [--repeats 1] [--precision fp32 bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

SHARED_CLIPS = next((root / "shared" / "data" / "clips" for root in Path(__file__).resolve().parents
                     if (root / "shared" / "data" / "clips").is_dir()), Path("../shared/data/clips"))
"""The real clips of ../shared (searched upwards, so that a worktree nested deeper finds them too)."""


def source_videos(folder: Path) -> tuple[list[Path], str]:
    """The real clips, or 8 synthetic videos of 200 frames at 320x240 written into ``folder``."""
    if SHARED_CLIPS.is_dir():
        return sorted(SHARED_CLIPS.iterdir()), f"the {len(list(SHARED_CLIPS.iterdir()))} real clips"
    from coclr.video.decode import write_mp4

    rng = np.random.default_rng(0)
    paths = []
    for number in range(8):
        frames = np.clip(rng.integers(0, 255, 3) + rng.normal(0, 20, (200, 240, 320, 3)), 0, 255).astype(np.uint8)
        path = folder / f"synthetic{number}.mp4"
        write_mp4(path, frames, 25.0)
        paths.append(path)
    return paths, "8 synthetic videos (../shared/data/clips not found)"


def save_random_encoder(path: Path, width: float, calibrate: bool = True) -> Path:
    """A randomly initialised encoder whose BatchNorm statistics are set on random clips (one pass in training
    mode): without it the activations of the untrained network shrink layer by layer towards zero and
    denormals, which times (and compares precisions) unlike any trained network."""
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    torch.manual_seed(0)
    encoder = build_encoder(width=width)
    if calibrate:
        for module in encoder.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.reset_running_stats()
                module.momentum = None  # a cumulative average over the calibration batch
        encoder.train()
        with torch.no_grad():
            encoder.backbone(torch.rand(4, 3, 32, 128, 128) * 4 - 2)
        encoder.eval()
    return save_encoder(path, encoder)


def time_decoding(paths: list[Path], short_side: int) -> float:
    from coclr.video.decode import VideoReader

    started = time.perf_counter()
    for path in paths:
        with VideoReader(path, short_side) as reader:
            for _ in reader:
                pass
    return time.perf_counter() - started


def bench_embedding(args: argparse.Namespace, work: Path) -> None:
    from coclr.embed.embedder import Embedder
    from coclr.embed.run import embed_videos

    paths, what = source_videos(work)
    checkpoint = save_random_encoder(work / "encoder.pth", args.width)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"embedding {what}; S3D width {args.width}; {torch.get_num_threads()} torch threads; "
          f"{os.cpu_count()} cores")
    decode_seconds = time_decoding(paths, 128)
    print(f"  decoding alone (one process, short side 128): {decode_seconds:.2f} s")
    for device in devices:
        for workers in args.workers:
            embedder = Embedder(checkpoint, device=device, workers=workers, batch_size=args.batch_size)
            out = work / f"out_{device}_{workers}"
            if device == "cuda":  # warm-up: cuDNN autotuning and allocator on one video
                embedder.embed(paths[0])
                torch.cuda.synchronize()
            summary = embed_videos(paths, out, embedder, progress=False)
            share = f"decoding {100 * decode_seconds / summary.seconds:.0f}% of the time" if workers == 0 else \
                "decoding overlapped with inference"
            print(f"  {device}, {workers} decoding workers: {summary.done} videos, {summary.windows} windows in "
                  f"{summary.seconds:.1f} s: {summary.done / summary.seconds:.2f} videos/s, "
                  f"{summary.windows / summary.seconds:.1f} windows/s ({share})")


def plain_embed(paths: list[Path], checkpoint: Path, length: int = 32, size: int = 128, short_side: int = 128,
                batch: int = 16) -> np.ndarray:
    """The script a user writes to embed videos with an S3D checkpoint: PyAV decodes every frame of a video,
    OpenCV resizes it to the short side, the centre crop is normalised, the windows (``length`` frames, every
    half window, the last one ending at the last frame: those of ``coclr eval``) go through the network in
    float32 batches, and the video's vector is the mean of its windows' features, L2-normalised."""
    import av
    import cv2
    import torch.nn.functional as F

    from coclr.data.augment import IMAGENET_MEAN, IMAGENET_STD
    from coclr.data.sampling import sliding_windows
    from coclr.models.loading import load_encoder

    backbone, _ = load_encoder(checkpoint)
    backbone.eval()
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1, 1)
    vectors = []
    for path in paths:
        with av.open(str(path)) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        height, width = frames[0].shape[:2]
        scale = short_side / min(height, width)
        new_size = (max(1, round(width * scale)), max(1, round(height * scale)))
        frames = np.stack([cv2.resize(frame, new_size, interpolation=cv2.INTER_AREA) for frame in frames])
        top, left = (frames.shape[1] - size) // 2, (frames.shape[2] - size) // 2
        video = torch.from_numpy(frames[:, top: top + size, left: left + size]).permute(3, 0, 1, 2).float() / 255
        video = (video - mean) / std
        windows = sliding_windows(len(frames), length, 1, length // 2)
        features = []
        with torch.no_grad():
            for start in range(0, len(windows), batch):
                clips = torch.stack([video[:, torch.from_numpy(w)] for w in windows[start: start + batch]])
                features.append(backbone(clips).mean(dim=(2, 3, 4)))
        vectors.append(F.normalize(torch.cat(features).double().mean(0), dim=0).float().numpy())
    return np.stack(vectors)


def ours_embed(paths: list[Path], checkpoint: Path, out: Path, workers: int, precision: str | None = None,
               batch: int = 16) -> np.ndarray:
    """``coclr embed`` from Python (:func:`coclr.embed.run.embed_videos`) into a fresh folder; the vectors in the
    order of ``paths``."""
    import shutil

    from coclr.embed.embedder import Embedder
    from coclr.embed.output import Embeddings
    from coclr.embed.run import embed_videos

    shutil.rmtree(out, ignore_errors=True)
    embedder = Embedder(checkpoint, device="cpu", workers=workers, batch_size=batch, precision=precision)
    summary = embed_videos(paths, out, embedder, progress=False)
    assert summary.done == len(paths), summary
    folder = Embeddings(out)
    return np.stack([np.asarray(folder.videos[folder.row_of(path)]) for path in paths])


def compare_embed(threads: tuple[int, ...] = (1, 2), repeats: int = 1, width: float = 1.0,
                  videos: list[Path] | None = None, precisions: tuple[str, ...] = ("fp32",),
                  log=print) -> list[dict]:
    """``coclr embed`` against :func:`plain_embed` on the same videos and checkpoint, for each torch thread count
    (the process pinned to that many cores; our decoding worker shares them), interleaved A B B A ``repeats``
    times; one row per thread count and precision of ours: median seconds of each side, their spread, the ratio
    theirs / ours (> 1: ours faster) and the minimum cosine between the two sides' vectors."""
    import statistics

    rows = []
    with tempfile.TemporaryDirectory(prefix="compare_embed_") as folder:
        work = Path(folder)
        paths, what = (videos, f"{len(videos)} videos") if videos else source_videos(work)
        checkpoint = save_random_encoder(work / "encoder.pth", width)
        for count in threads:
            workers = 1 if count > 1 else 0  # on one core a decoding process could only take from inference
            for precision in precisions:
                mode = None if precision == "fp32" else precision
                times: dict[str, list[float]] = {"ours": [], "theirs": []}
                cpu: dict[str, list[float]] = {"ours": [], "theirs": []}
                vectors = {}
                order = ["theirs", "ours", "ours", "theirs"] * repeats
                for side in order:
                    seconds, cpu_used, vectors[side] = run_side(side, paths, checkpoint, work, workers, mode,
                                                                count)
                    times[side].append(seconds)
                    cpu[side].append(cpu_used)
                    log(f"  {count} thread(s), {precision}: {side} {times[side][-1]:.1f} s "
                        f"(CPU {cpu[side][-1]:.1f} s, load {os.getloadavg()[0]:.1f})")
                cosine = float((vectors["ours"] * vectors["theirs"]).sum(axis=1).min())
                ours, theirs = statistics.median(times["ours"]), statistics.median(times["theirs"])
                ours_cpu, theirs_cpu = statistics.median(cpu["ours"]), statistics.median(cpu["theirs"])
                pairs = pair_ratios(times, order)
                rows.append({"path": "coclr embed", "compared_with": "plain PyAV + S3D script", "what": what,
                             "width": width, "threads": count, "precision": precision, "ours_s": ours,
                             "theirs_s": theirs, "ours_spread_s": max(times["ours"]) - min(times["ours"]),
                             "theirs_spread_s": max(times["theirs"]) - min(times["theirs"]),
                             "ratio": theirs / ours, "pair_ratios": pairs, "ours_cpu_s": ours_cpu,
                             "theirs_cpu_s": theirs_cpu, "cpu_ratio": theirs_cpu / ours_cpu,
                             "min_cosine": cosine,
                             "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None})
                log(f"coclr embed vs plain script, {what}, {count} thread(s), {precision}: ours {ours:.1f} s, "
                    f"theirs {theirs:.1f} s, ratio {theirs / ours:.2f} (within pairs: "
                    f"{', '.join(f'{r:.2f}' for r in pairs)}); CPU time ours {ours_cpu:.1f} s, theirs "
                    f"{theirs_cpu:.1f} s, ratio {theirs_cpu / ours_cpu:.2f}; min cosine {cosine:.5f}")
    return rows


SIDE = "--side"
"""The argument that makes this script run one side of the comparison (:func:`run_side`)."""


def run_side(side: str, paths: list[Path], checkpoint: Path, work: Path, workers: int, precision: str | None,
             threads: int) -> tuple[float, float, np.ndarray]:
    """``(wall seconds, CPU seconds, vectors)`` of one run of ``side`` (``ours`` or ``theirs``) in a fresh
    interpreter pinned to ``threads`` cores with as many torch threads, timed around the call alone."""
    spec = {"side": side, "paths": [str(path) for path in paths], "checkpoint": str(checkpoint),
            "out": str(work / "out"), "workers": workers, "precision": precision, "threads": threads,
            "vectors": str(work / f"{side}.npy")}
    run = subprocess.run([sys.executable, str(Path(__file__).resolve()), SIDE, json.dumps(spec)],
                         capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"the {side} side failed:\n{run.stderr[-3000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return result["seconds"], result["cpu"], np.load(spec["vectors"])


def side_main(spec: dict) -> None:
    """The child of :func:`run_side`."""
    torch.set_num_threads(spec["threads"])
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: spec["threads"]])
    paths = [Path(path) for path in spec["paths"]]
    started, cpu_started = time.perf_counter(), cpu_seconds()
    if spec["side"] == "ours":
        vectors = ours_embed(paths, Path(spec["checkpoint"]), Path(spec["out"]), spec["workers"], spec["precision"])
    else:
        vectors = plain_embed(paths, Path(spec["checkpoint"]))
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
    np.save(spec["vectors"], vectors)
    print(json.dumps({"seconds": seconds, "cpu": cpu}))


def cpu_seconds() -> float:
    """CPU time of this process and of its finished child processes (the decoding workers), user and system:
    what a run cost in work, steadier than wall time on a machine that other jobs share."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def pair_ratios(times: dict[str, list[float]], order: list[str]) -> list[float]:
    """theirs / ours within each pair of consecutive runs (A B, then B A, ...): ``order`` names the side of each
    run, ``times[side]`` holds that side's timings in the order they were taken."""
    taken = {side: iter(values) for side, values in times.items()}
    runs = [(side, next(taken[side])) for side in order]
    return [dict(pair)["theirs"] / dict(pair)["ours"] for pair in zip(runs[::2], runs[1::2])]


def bench_search(args: argparse.Namespace, work: Path) -> None:
    from coclr.embed.search import faiss_available, nearest

    rng = np.random.default_rng(0)
    print(f"search: one query, {args.dim}-d float32 rows memory-mapped from disk; best of 3")
    for rows in args.search_rows:
        path = work / f"rows_{rows}.npy"
        array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, args.dim))
        for start in range(0, rows, 65536):
            block = rng.normal(size=(min(65536, rows - start), args.dim)).astype(np.float32)
            array[start: start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
        array.flush()
        del array
        gallery = np.load(path, mmap_mode="c")
        query = np.asarray(gallery[rows // 2])
        exact = min(_timed(lambda g=gallery, q=query: nearest(g, q, 10)) for _ in range(3))
        line = f"  {rows:>9,d} rows: exact chunked {1000 * exact:8.1f} ms"
        if faiss_available():
            import faiss

            with_build = min(_timed(lambda g=gallery, q=query: nearest(g, q, 10, backend="faiss")) for _ in range(3))
            index = faiss.IndexFlatIP(args.dim)
            index.add(np.ascontiguousarray(gallery))
            prebuilt = min(_timed(lambda i=index, q=query: i.search(q[None], 10)) for _ in range(3))
            line += (f" | faiss, index built per query {1000 * with_build:8.1f} ms ({exact / with_build:.2f}x), "
                     f"prebuilt index {1000 * prebuilt:7.1f} ms ({exact / prebuilt:.1f}x)")
        else:
            line += " | faiss: unavailable (pip install faiss-cpu)"
        print(line)
        del gallery
        path.unlink()


def _timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == SIDE:
        return side_main(json.loads(sys.argv[2]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=float, default=1.0, help="S3D width (1.0: the paper's network)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1], help="decoding worker counts to time")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=1024, help="embedding dimension for the search timings")
    parser.add_argument("--search-rows", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--skip-embedding", action="store_true")
    parser.add_argument("--compare", action="store_true", help="only the comparison with the plain script")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts of the comparison")
    parser.add_argument("--repeats", type=int, default=1, help="A B B A rounds of the comparison")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "bf16"),
                        help="precisions of ours in the comparison")
    parser.add_argument("--videos", type=Path, nargs="*", help="videos of the comparison (default: the real clips)")
    parser.add_argument("--json", type=Path, help="write the comparison's rows here")
    args = parser.parse_args()
    if args.compare:
        print(f"load average {os.getloadavg()}; {os.cpu_count()} cores; torch {torch.__version__}")
        rows = compare_embed(tuple(args.threads), args.repeats, args.width, args.videos, tuple(args.precision))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return
    with tempfile.TemporaryDirectory(prefix="bench_embed_") as folder:
        work = Path(folder)
        if not args.skip_embedding:
            bench_embedding(args, work)
        if args.search_rows:
            bench_search(args, work)


if __name__ == "__main__":
    main()
