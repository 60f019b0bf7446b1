"""What the duplicates' fingerprint owes to the trained encoder: each altered copy's fingerprint similarity to its
original against the most similar other original, with the first block of a trained encoder and of a random one.

The set is a `benchmarks/curate_duplicates.py` work folder's real clips and their altered copies (`W/real_copies`,
named `NNN_<alteration>.mp4` after the sorted originals). Similarities are `coclr curate`'s: fingerprints centred by
the set's mean, the better of the plain and the mirrored pair (`coclr.curate.fingerprint`).

    python benchmarks/curate_fingerprint.py --work W --encoder CLIPS_LEARN/encoder_rgb.pth

With ``--scale N``: instead, the fingerprints' graphs of N random fingerprints of ``--dim`` numbers (each with its
mirrored one) with N/100 planted near-copies, in a child process each (seconds, peak memory, the copies found): the
duplicates' graph at ``--threshold`` (a range search, what curate runs from a given or calibrated threshold) and the
ranked graph of the 10 nearest (what the distribution rule needs). Then the range search alone against FAISS's
exact ``IndexFlatIP.range_search`` over the same rows, on ``--compare`` of the queries, interleaved A B B A with
``--threads`` threads each.

    python benchmarks/curate_fingerprint.py --scale 100000 [--dim 128] [--threshold 0.8] [--threads 2]

A full-width encoder's fingerprints (1,024 numbers) are not random: they lie near a few principal axes, which the
range search screens instead (`coclr.embed.search.Projected`). ``--rank R --noise S`` makes the scale's
fingerprints so: R random orthonormal axes plus noise of S in every number (the child prints the rows' median
length off their first 127 principal axes, what decides the screen). ``--spectrum`` measures that length on
fingerprints made from videos instead: those of the synthetic videos and their altered copies of a
`curate_duplicates.py` work folder, by a random first block of the full width (and by ``--encoder``'s when given),
the axes fitted on every other video and the length measured on the rest.

    python benchmarks/curate_fingerprint.py --scale 100000 --dim 1024 --rank 64 --noise 0.058
    python benchmarks/curate_fingerprint.py --spectrum --work W [--encoder E]
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
CLIPS = REPO.parent / "shared" / "data" / "clips"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", help="a benchmarks/curate_duplicates.py work folder")
    parser.add_argument("--encoder", help="the trained RGB encoder (a coclr learn encoder_rgb.pth)")
    parser.add_argument("--scale", type=int, help="time the graphs of this many random fingerprints")
    parser.add_argument("--dim", type=int, default=128, help="numbers per fingerprint (16 x the first block's width)")
    parser.add_argument("--threshold", type=float, default=0.8, help="the duplicates' threshold of the range search")
    parser.add_argument("--threads", type=int, default=2, help="threads of each side")
    parser.add_argument("--compare", type=int, default=20000, help="queries of the comparison with FAISS")
    parser.add_argument("--rank", type=int, default=0, help="with --scale: fingerprints near this many axes (0: "
                        "random in every direction)")
    parser.add_argument("--noise", type=float, default=0.0, help="with --rank: the noise in every number")
    parser.add_argument("--spectrum", action="store_true", help="measure the length of videos' fingerprints off "
                        "their first principal axes (needs --work)")
    args = parser.parse_args()
    if args.scale:
        return scale(args)
    if args.spectrum:
        return spectrum(args)
    if not (args.work and args.encoder):
        parser.error("--work and --encoder are needed (or --scale)")

    import torch

    from coclr.curate.fingerprint import centred, fingerprints, similarities
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import checkpoint_sha256, load_encoder, save_encoder

    originals = sorted(CLIPS.iterdir())
    copies = sorted(Path(args.work, "real_copies").glob("*.mp4"))
    labels = [(number, "original") for number in range(len(originals))]
    labels += [(int(m.group(1)), m.group(2)) for m in (re.match(r"(\d+)_(.*)\.mp4", p.name) for p in copies)]
    paths = [str(p) for p in [*originals, *copies]]
    trained, _ = load_encoder(args.encoder)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        random = save_encoder(Path(tmp) / "random.pth", build_encoder(width=trained.width).eval(), meta={"view": "rgb"})
        for name, checkpoint in (("trained", Path(args.encoder)), ("random", random)):
            found, lacking, _ = fingerprints(paths, checkpoint, checkpoint_sha256(checkpoint), Path(tmp) / name,
                                             show=False)
            units, _ = centred(found, found[np.setdiff1d(np.arange(len(paths)), lacking), 0].mean(0))
            similar = similarities(units, np.arange(len(paths)))
            count = len(originals)
            others = similar[:count, :count][~np.eye(count, dtype=bool)]
            print(f"{name} first block (S3D width {trained.width:g}): distinct originals up to {others.max():.3f}")
            for alteration in sorted({kind for _, kind in labels[count:]}):
                values = [similar[number, row] for row, (number, kind) in enumerate(labels) if kind == alteration]
                print(f"  {alteration:24s} copy to its original: min {min(values):.3f}, median "
                      f"{np.median(values):.3f}")
            positives = [similar[number, row] for row, (number, kind) in enumerate(labels) if row >= count]
            print(f"  every copy: min {min(positives):.3f}; separated from the other originals: "
                  f"{min(positives) > others.max()}")


CHILD = """
import json, resource, sys, time
import numpy as np
count, dim, threshold, side, queries = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], \
    int(sys.argv[5])
rank, noise = (int(sys.argv[6]), float(sys.argv[7])) if len(sys.argv) > 7 else (0, 0.0)
import coclr.cli
from coclr.curate.fingerprint import centred, duplicate_links, neighbour_graph
rng = np.random.default_rng(0)
if rank:  # near `rank` axes: as a wide encoder's fingerprints are
    axes = np.linalg.qr(rng.standard_normal((dim, rank)))[0].T.astype(np.float32)
    prints = np.empty((count, 2, dim), np.float32)
    for start in range(0, count, 8192):
        part = prints[start: start + 8192]
        part[:] = rng.standard_normal((len(part), 2, rank)).astype(np.float32) @ axes
        part += noise * rng.standard_normal(part.shape).astype(np.float32)
    scale = np.sqrt(rank / dim + noise * noise)  # (a copy's noise as large, relative to the rows, as without)
else:
    prints, scale = rng.standard_normal((count, 2, dim)).astype(np.float32), 1.0
copies = np.arange(1, count, 100)
prints[copies] = prints[copies - 1] + 0.05 * scale * rng.standard_normal((len(copies), 2, dim)).astype(np.float32)
units, _ = centred(prints)
if rank:
    sample = units[::max(1, count // 8192)].reshape(-1, dim).astype(np.float64)
    basis = np.linalg.eigh(sample.T @ sample)[1][:, ::-1][:, :127]
    off = np.linalg.norm(sample - (sample @ basis) @ basis.T, axis=1)
    print(f"median length off the first 127 axes {np.median(off):.3f}", file=sys.stderr)
found = None
begin = time.perf_counter()
if side == "range":
    joined = duplicate_links(units, threshold).joined
    found = float(np.mean(joined[copies] == joined[copies - 1]))
elif side == "ranked":
    _, rows = neighbour_graph(units, 10)
    found = float(np.mean(rows[copies, 0] == copies - 1))
elif side == "faiss":
    import faiss
    gallery = np.ascontiguousarray(units.reshape(2 * count, dim))
    begin = time.perf_counter()
    index = faiss.IndexFlatIP(dim)
    index.add(gallery)
    index.range_search(np.ascontiguousarray(units[:queries, 0]), threshold)
else:  # our range search of the same queries, screened as curate screens it (its set-up timed)
    from coclr.curate.graph import projection
    from coclr.embed.search import UnitRows, exact_over
    begin = time.perf_counter()
    rows = UnitRows.in_memory(units.reshape(2 * count, dim))
    exact_over(rows, units[:queries, 0], threshold, projected=projection(rows))
print(json.dumps({"seconds": time.perf_counter() - begin, "found": found,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def scale(args) -> None:
    import json
    import os
    import subprocess
    import sys

    from coclr.embed.search_cpu import kernel

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": str(args.threads),
           "OPENBLAS_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}

    def child(side: str, queries: int = 0) -> dict:
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.scale), str(args.dim), str(args.threshold), side,
                               str(queries), str(args.rank), str(args.noise)], env=env, capture_output=True, text=True,
                              check=True)
        if "median length" in done.stderr and side == "range":
            print("  " + next(line for line in done.stderr.splitlines() if "median length" in line), flush=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    shape = f"near {args.rank} axes, noise {args.noise}" if args.rank else "random"
    print(f"{args.scale:,} fingerprints x {args.dim} (and mirrored; {shape}), {args.threads} threads, int8 kernel "
          f"{kernel()}", flush=True)
    for side, what in (("range", f"duplicates' graph at {args.threshold} (range search)"),
                       ("ranked", "ranked graph, 10 nearest")):
        result = child(side)
        print(f"  {what}: {result['seconds']:.1f} s, peak {result['maxrss_mb']:.0f} MB, planted copies whose nearest "
              f"is their original {result['found']:.3f}", flush=True)
    queries = min(args.compare, args.scale)
    results: dict[str, list[float]] = {"ours": [], "faiss": []}
    for side in ("ours", "faiss", "faiss", "ours"):
        results[side].append(child(side, queries)["seconds"])
    ours, theirs = np.mean(results["ours"]), np.mean(results["faiss"])
    print(f"  range search of {queries:,} queries over the {2 * args.scale:,} rows (A B B A): ours {ours:.1f} s, "
          f"FAISS IndexFlatIP.range_search {theirs:.1f} s: {theirs / ours:.2f}x", flush=True)


def spectrum(args) -> None:
    """Fingerprints' median length off their first principal axes, made from videos (see the module docstring)."""
    import torch

    from coclr.curate.fingerprint import centred, fingerprints
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import checkpoint_sha256, save_encoder

    if not args.work:
        raise SystemExit("--spectrum needs --work (a curate_duplicates.py work folder)")
    paths = [str(p) for p in sorted(Path(args.work, "synth", "videos").glob("*.mp4"))]
    paths += [str(p) for p in sorted(Path(args.work, "synthetic_copies").glob("*.mp4"))]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        random = save_encoder(Path(tmp) / "random.pth", build_encoder(width=1.0).eval(), meta={"view": "rgb"})
        blocks = [("random, full width", random)] + ([("trained", Path(args.encoder))] if args.encoder else [])
        for name, checkpoint in blocks:
            found, lacking, _ = fingerprints(paths, checkpoint, checkpoint_sha256(checkpoint), Path(tmp) / name,
                                             show=False)
            have = np.setdiff1d(np.arange(len(paths)), lacking)
            fit, test = have[0::2], have[1::2]
            units, _ = centred(found[have], found[fit, 0].mean(0))
            rows = {"fit": units[0::2].reshape(-1, units.shape[-1]).astype(np.float64),
                    "test": units[1::2].reshape(-1, units.shape[-1]).astype(np.float64)}
            _, vectors = np.linalg.eigh(rows["fit"].T @ rows["fit"])
            line = []
            for axes in (32, 64, 127):
                basis = vectors[:, ::-1][:, :axes]
                off = np.linalg.norm(rows["test"] - (rows["test"] @ basis) @ basis.T, axis=1)
                line.append(f"{axes} axes: median {np.median(off):.3f}, 90th percentile {np.percentile(off, 90):.3f}")
            print(f"{name} first block, {units.shape[-1]} numbers, {len(fit)} videos fitted, {len(test)} measured: "
                  + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
