"""What the duplicates' fingerprint owes to the trained encoder: each altered copy's fingerprint similarity to its
original against the most similar other original, with the first block of a trained encoder and of a random one.

The set is a `benchmarks/curate_duplicates.py` work folder's real clips and their altered copies (`W/real_copies`,
named `NNN_<alteration>.mp4` after the sorted originals). Similarities are `coclr curate`'s: fingerprints centred by
the set's mean, the better of the plain and the mirrored pair (`coclr.curate.fingerprint`).

    python benchmarks/curate_fingerprint.py --work W --encoder CLIPS_LEARN/encoder_rgb.pth

With ``--scale N``: instead, the seconds and peak memory of the fingerprints' neighbour graph (10 nearest, the
mirrored pairs too) of N random fingerprints of 128 numbers with N/100 planted near-copies, and the share of the
copies whose nearest is their original.

    python benchmarks/curate_fingerprint.py --scale 100000
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
    parser.add_argument("--scale", type=int, help="time the neighbour graph of this many random fingerprints")
    args = parser.parse_args()
    if args.scale:
        return scale(args.scale)
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
            found, lacking = fingerprints(paths, checkpoint, checkpoint_sha256(checkpoint), Path(tmp) / name,
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


def scale(count: int) -> None:
    import resource
    import time

    from coclr.curate.fingerprint import centred, neighbour_graph

    rng = np.random.default_rng(0)
    prints = rng.standard_normal((count, 2, 128)).astype(np.float32)
    copies = np.arange(1, count, 100)
    prints[copies] = prints[copies - 1] + 0.05 * rng.standard_normal((len(copies), 2, 128)).astype(np.float32)
    begin = time.perf_counter()
    units, _ = centred(prints)
    _, rows = neighbour_graph(units, 10)
    print(f"fingerprint graph of {count:,} x 128 (and mirrored), 10 nearest: {time.perf_counter() - begin:.1f} s; "
          f"planted copies whose nearest is their original: {np.mean(rows[copies, 0] == copies - 1):.3f}; peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
