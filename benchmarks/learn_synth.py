"""`coclr learn` on the quick study's data written as videos, scored against the labels it never saw.

For each seed: `coclr data synth --videos DIR --preset study --seed S` (768 videos with neutral names, their labels
in DIR/labels.csv), then `coclr learn DIR/videos --out OUT --budget B` timed as a user would time it, then R@1 of
the test videos against the train videos (labels.csv's split) from the embedding folders' `videos.npy`, with
plain NumPy (cosine of the stored unit vectors, and after centring by the train videos' mean), then the same
command again: its seconds, and whether every file of OUT kept its bytes. Prints one line per seed and embedding,
and the mean over seeds; the goal (issue 44): R@1 >= 50 two-stream, >= 35 RGB, >= 45 flow, within 17 minutes.

    python benchmarks/learn_synth.py --work /tmp/learn_synth --seeds 0 1 2 --budget 15m
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

EMBEDDINGS = ("rgb", "flow", "two_stream")


def r_at_1(folder: Path, labels: dict[str, tuple[str, str]], center: bool) -> float:
    """R@1 (percent) of the test videos against the train videos, cosine similarity of the stored vectors."""
    vectors = np.load(folder / "videos.npy")
    paths = [json.loads(line)["path"] for line in (folder / "videos.jsonl").read_text().splitlines()]
    classes = np.array([labels[p][0] for p in paths])
    splits = np.array([labels[p][1] for p in paths])
    query, gallery = vectors[splits == "test"], vectors[splits == "train"]
    if center:
        mean = gallery.mean(axis=0)
        query, gallery = query - mean, gallery - mean
    query = query / np.linalg.norm(query, axis=1, keepdims=True)
    gallery = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    nearest = (query @ gallery.T).argmax(axis=1)
    return 100.0 * float((classes[splits == "test"] == classes[splits == "train"][nearest]).mean())


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def run(argv: list[str]) -> float:
    begin = time.perf_counter()
    subprocess.run([sys.executable, "-m", "coclr", *argv], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the data and the runs (kept: reruns continue)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--budget", default="15m")
    args = parser.parse_args()
    work = Path(args.work)
    print(f"cpu: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; budget {args.budget}", flush=True)
    results = {name: [] for name in EMBEDDINGS}
    for seed in args.seeds:
        data, out = work / f"data{seed}", work / f"learn{seed}"
        run(["data", "synth", "--videos", str(data), "--preset", "study", "--seed", str(seed)])
        with (data / "labels.csv").open() as file:
            labels = {os.path.abspath(data / row["path"]): (row["label"], row["split"]) for row in csv.DictReader(file)}
        seconds = run(["learn", str(data / "videos"), "--out", str(out), "--budget", args.budget, "--quiet"])
        before = digest(out)
        again = run(["learn", str(data / "videos"), "--out", str(out), "--budget", args.budget, "--quiet"])
        same = digest(out) == before
        print(f"seed {seed}: learn {seconds / 60:.1f} min; the same command again {again:.1f} s, "
              f"{'every byte kept' if same else 'FILES CHANGED'} (load {os.getloadavg()[0]:.1f})", flush=True)
        for name in EMBEDDINGS:
            plain = r_at_1(out / "embeddings" / name, labels, center=False)
            centred = r_at_1(out / "embeddings" / name, labels, center=True)
            results[name].append(plain)
            print(f"  {name}: R@1 {plain:.1f} (centred {centred:.1f})", flush=True)
    for name, values in results.items():
        print(f"{name}: R@1 {np.mean(values):.1f} +- {np.std(values):.1f} over seeds {args.seeds}")


if __name__ == "__main__":
    main()
