"""Near-duplicate detection by `coclr curate` against a frame-hash dedup, on altered copies of real and synthetic
videos: precision and recall per alteration, side by side.

The sets: the real clips of ../shared/data/clips, and `coclr data synth --videos` clips (64 x 64 px, 48 frames,
another seed than any encoder saw, each from a take of its own) among 300 other such clips left unaltered
(distractors: in a user's folder most videos have no duplicate, and the calibration's negatives, each video's
nearest other, come from them). Each original gets one copy per alteration of coclr.curate.alter (re-encoded at a
lower quality, trimmed, cropped, resized, brightened, sped up, flipped, captioned, and two combinations). A set
is embedded as `coclr learn` embeds (two streams, RGB and TV-L1 flow, the encoders of a `coclr learn` folder given
for it), then `coclr curate` runs on it as a user would run it: the threshold calibrated on altered copies of 8 of
the folder's videos (the same kinds of alteration as the test: it is tuned for them), and again with `--calibrate
0` (the distribution rule, tuned for nothing).

The baseline is the script a user would write first: `imagehash.phash` of 8 frames spread evenly over each video,
two videos' distance the mean Hamming distance of their frames in order, a pair a duplicate when it is at most a
threshold; the baseline gets its best threshold on the very data (the F1-best: an upper bound of what it does).

A predicted pair is two videos in one of curate's groups (whole videos), or a pair sharing a stretch; a true pair is
two videos from one original. Per alteration: recall of its (original, copy) pairs, and the precision of the
predicted pairs that hold one of its copies. Overall: precision and recall over every pair.

    python benchmarks/curate_duplicates.py --work W --clips-learn CLIPS_LEARN --synth-learn SYNTH_LEARN \
        [--sets real synthetic] [--synth-seed 11]

where CLIPS_LEARN is `coclr learn ../shared/data/clips --out CLIPS_LEARN --budget 3m` and SYNTH_LEARN a `coclr learn`
of `coclr data synth --videos D --preset study`. The figures are also written to `W/report-seed{S}.json` (S:
`--synth-seed`; a run of one set keeps the other set's figures there).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
CLIPS = REPO.parent / "shared" / "data" / "clips"
HASH_FRAMES = 8


def make_set(originals: list[Path], folder: Path) -> dict[str, tuple[int, str]]:
    """The originals and their altered copies in ``folder`` (kept when there): path -> (original, alteration)."""
    from coclr.curate.alter import ALTERATIONS, write_altered
    from coclr.video.decode import decode_video_with_rate

    folder.mkdir(parents=True, exist_ok=True)
    truth = {}
    for number, original in enumerate(originals):
        truth[str(original.resolve())] = (number, "original")
        frames = fps = None
        for name in ALTERATIONS:
            target = folder / f"{number:03d}_{name.replace('+', '_')}.mp4"
            if not target.is_file():
                if frames is None:
                    frames, fps = decode_video_with_rate(original)
                write_altered(frames, fps, name, target)
            truth[str(target.resolve())] = (number, name)
    return truth


def embed(paths: list[str], learn: Path, out: Path) -> Path:
    """The videos embedded with a learn folder's encoders on two streams (as its embeddings/two_stream)."""
    from coclr.embed.embedder import Embedder
    from coclr.embed.run import embed_videos

    embedder = Embedder(learn / "encoder_rgb.pth", flow_checkpoint=learn / "encoder_flow.pth", device="cpu")
    embed_videos(paths, out, embedder, progress=False)
    return out


def curated_pairs(folder: Path) -> set[tuple[str, str]]:
    """The pairs `coclr curate` predicts (whole groups: every pair of a group; partial: its pair)."""
    groups: dict[str, list[str]] = {}
    with (folder / "duplicates.csv").open() as file:
        for row in csv.DictReader(file):
            groups.setdefault(row["group"], []).append(row["path"])
    return {tuple(sorted(pair)) for members in groups.values() for pair in itertools.combinations(members, 2)}


def frame_hashes(path: str):
    import imagehash
    from PIL import Image

    from coclr.video.decode import decode_frames_at, probe_video

    total = max(1, probe_video(path, exact=True).frames)
    indices = np.unique(np.linspace(0, total - 1, HASH_FRAMES).round().astype(int))
    frames = decode_frames_at(path, indices)
    hashes = [imagehash.phash(Image.fromarray(frame)) for frame in frames]
    return hashes + [hashes[-1]] * (HASH_FRAMES - len(hashes))


def baseline_pairs(paths: list[str], truth: dict[str, tuple[int, str]]) -> tuple[set[tuple[str, str]], float]:
    """The frame-hash dedup's pairs at its F1-best threshold on this data, and that threshold."""
    paths = sorted(paths)
    bits = np.array([[np.asarray(h.hash, bool).reshape(-1) for h in frame_hashes(path)] for path in paths])
    matrix = np.mean([(bits[:, None, i] != bits[None, :, i]).sum(axis=-1) for i in range(HASH_FRAMES)], axis=0)
    first, second = np.triu_indices(len(paths), k=1)
    pairs = [(paths[a], paths[b]) for a, b in zip(first, second)]
    values = matrix[first, second]
    distances = dict(zip(pairs, values.tolist()))
    true = np.array([truth[a][0] == truth[b][0] for a, b in pairs])
    order = np.argsort(values, kind="stable")
    hits = np.cumsum(true[order])
    last = np.r_[values[order][1:] != values[order][:-1], True]  # a cut between distinct distances only
    f1 = 2 * hits / (np.arange(1, len(values) + 1) + true.sum())
    best = float(values[order][np.flatnonzero(last)[np.argmax(f1[last])]])
    return {pair for pair, d in distances.items() if d <= best}, best


def scores(predicted: set[tuple[str, str]], truth: dict[str, tuple[int, str]]) -> dict[str, tuple[float, float]]:
    """(precision, recall) per alteration and overall (percent; precision None-free: 100 when nothing predicted)."""
    from coclr.curate.alter import ALTERATIONS

    paths = sorted(truth)
    true = {(a, b) for a, b in itertools.combinations(paths, 2) if truth[a][0] == truth[b][0]}
    out = {}
    for name in ALTERATIONS:
        copies = [p for p in paths if truth[p][1] == name]
        wanted = {tuple(sorted((p, next(q for q in paths if truth[q] == (truth[p][0], "original"))))) for p in copies}
        holding = {pair for pair in predicted if truth[pair[0]][1] == name or truth[pair[1]][1] == name}
        precision = 100.0 * len(holding & true) / len(holding) if holding else 100.0
        out[name] = (precision, 100.0 * len(wanted & predicted) / max(1, len(wanted)))
    precision = 100.0 * len(predicted & true) / len(predicted) if predicted else 100.0
    out["overall"] = (precision, 100.0 * len(predicted & true) / max(1, len(true)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True)
    parser.add_argument("--clips-learn", required=True, help="a coclr learn folder of ../shared/data/clips")
    parser.add_argument("--synth-learn", required=True, help="a coclr learn folder of synthetic videos")
    parser.add_argument("--synth-videos", type=int, default=20, help="synthetic originals (each altered ten ways)")
    parser.add_argument("--distractors", type=int, default=300, help="other synthetic videos, not altered: a folder "
                        "where duplicates are a minority, as in a user's footage")
    parser.add_argument("--sets", nargs="+", default=["real", "synthetic"], help="which sets to measure")
    parser.add_argument("--synth-seed", type=int, default=11, help="the synthetic set's seed (its videos, originals "
                        "and distractors)")
    args = parser.parse_args()
    from coclr.atomic import atomic_write_text
    from coclr.curate.run import CurateOptions, curate
    from coclr.data import sampling
    from coclr.synth import SynthConfig, write_videos

    work = Path(args.work)
    print(f"cpu: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    write_videos(work / "synth", SynthConfig(seed=args.synth_seed, num_classes=8, train_scenes=160, test_scenes=2,
                                             frames=48, height=64, width=64, clips_per_action=1))  # a clip per take
    synth = sorted((work / "synth" / "videos").glob("*.mp4"))
    spread = sampling.spread(len(synth), args.synth_videos + args.distractors)
    picked = [synth[i] for i in spread[::max(1, len(spread) // args.synth_videos)][:args.synth_videos]]
    others = [synth[i] for i in spread if synth[i] not in picked][:args.distractors]
    sets = {"real clips": (sorted(CLIPS.iterdir()), [], Path(args.clips_learn)),
            "synthetic": (picked, others, Path(args.synth_learn))}
    # a run of one set keeps the other set's figures; another seed's sets have a file of their own
    out = work / f"report-seed{args.synth_seed}.json"
    report = json.loads(out.read_text()) if out.exists() else {}
    for name, (originals, distractors, learn) in sets.items():
        key = name.split()[0]
        if key not in args.sets:
            continue
        truth = make_set(originals, work / f"{key}_copies")
        truth.update({str(path.resolve()): (len(originals) + n, "distractor") for n, path in enumerate(distractors)})
        paths = sorted(truth)
        begin = time.perf_counter()
        folder = embed(paths, learn, work / f"{key}_embeddings")
        embedded = time.perf_counter() - begin
        results = {}
        for label, options in (("coclr, fingerprints, calibrated", CurateOptions()),
                               ("coclr, fingerprints, distribution rule", CurateOptions(calibrate=0)),
                               ("coclr, vectors, calibrated", CurateOptions(fingerprints=False))):
            begin = time.perf_counter()
            target = work / f"{key}_curate_{options.calibrate}{'' if options.fingerprints else '_vectors'}"
            curate(folder, target, options, show=False)
            record = json.loads((target / "curate.json").read_text())
            results[f"{label} (threshold {record['threshold']:.3f})"] = scores(curated_pairs(target), truth)
            print(f"{name}: curate {label} took {time.perf_counter() - begin:.1f} s", flush=True)
        begin = time.perf_counter()
        pairs, threshold = baseline_pairs(paths, truth)
        results[f"frame hash, best threshold on the data ({threshold:.1f} bits)"] = scores(pairs, truth)
        print(f"{name}: {len(originals)} originals, {len(distractors)} distractors, {len(paths)} videos; embedded in "
              f"{embedded:.0f} s; frame hashes "
              f"{time.perf_counter() - begin:.0f} s", flush=True)
        methods = list(results)
        print(f"{name}: precision / recall (%) per alteration")
        for number, method in enumerate(methods):
            print(f"  [{number + 1}] {method}")
        print("  " + "alteration".ljust(24) + "".join(f"[{n + 1}]".ljust(16) for n in range(len(methods))))
        for alteration in next(iter(results.values())):
            print("  " + alteration.ljust(24) + "".join(f"{results[m][alteration][0]:5.1f} / "
                                                        f"{results[m][alteration][1]:5.1f}".ljust(16) for m in methods),
                  flush=True)
        report[name] = results
    atomic_write_text(out, json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
