"""`coclr learn --init` across a domain shift we control, against learning from scratch at the same budget.

The source: the quick study's data at another seed (other scenes) with six of the ten motions (rotate, circle,
still, zoom in, zoom out, vertical oscillation: four of the target's eight classes and two it does not have), learnt
by `coclr learn` without labels (`--budget SOURCE_BUDGET`). The targets: `coclr data synth --videos --preset study
--seed S` (eight classes, four of them unseen in the source). For each seed, in the order A B, B A, A B (a slower
moment of the machine falls on both):

- init + learn: `coclr learn TARGET --init SOURCE/encoder_rgb.pth --flow-init SOURCE/encoder_flow.pth --budget B`
- scratch: `coclr learn TARGET --budget B`
- init alone: `coclr embed` of the target videos with the source's encoders (RGB, flow, two-stream)

and R@1 of the test videos against the train videos (labels.csv's split; never seen by learn) from each embedding
folder, as benchmarks/learn_synth.py computes it. Prints one line per seed and the mean, spread and paired
differences over the seeds. Plan and verdict: docs/experiments/2026-11-29-issue58-init-plan.md, docs/learn.md.

    python benchmarks/learn_init.py --work /tmp/learn_init --seeds 0 1 2 --budget 5m --source-budget 10m
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

import numpy as np

from learn_synth import r_at_1, run  # this folder: the script's own, first on the path

SOURCE_MOTIONS = ("rotate", "circle", "still", "zoom_in", "zoom_out", "oscillate_vertical")
SOURCE_SEED = 100
EMBEDDINGS = ("rgb", "flow", "two_stream")
ARMS = ("init alone", "init + learn", "scratch")


def labels_of(data: Path) -> dict[str, tuple[str, str]]:
    with (data / "labels.csv").open() as file:
        return {os.path.abspath(data / row["path"]): (row["label"], row["split"]) for row in csv.DictReader(file)}


def embed_alone(source: Path, data: Path, out: Path) -> Path:
    """The target videos embedded with the source's encoders: RGB and two-stream (which writes flow alone too)."""
    videos = str(data / "videos")
    run(["embed", videos, "--checkpoint", str(source / "encoder_rgb.pth"), "--out", str(out / "rgb"), "--quiet"])
    run(["embed", videos, "--checkpoint", str(source / "encoder_rgb.pth"), "--flow-checkpoint",
         str(source / "encoder_flow.pth"), "--out", str(out / "two_stream"), "--quiet"])
    run(["embed", videos, "--checkpoint", str(source / "encoder_flow.pth"), "--out", str(out / "flow"), "--quiet"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the data and the runs (kept: reruns continue)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", default="5m", help="budget of each target run")
    parser.add_argument("--source-budget", default="10m", help="budget of the source run")
    args = parser.parse_args()
    work = Path(args.work)
    print(f"cpu: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; budget {args.budget}, source "
          f"{args.source_budget}", flush=True)
    source_data, source = work / "source_data", work / "source"
    run(["data", "synth", "--videos", str(source_data), "--preset", "study", "--seed", str(SOURCE_SEED),
         f"num_classes={len(SOURCE_MOTIONS)}", f"motions=[{','.join(SOURCE_MOTIONS)}]"])
    seconds = run(["learn", str(source_data / "videos"), "--out", str(source), "--budget", args.source_budget,
                   "--quiet"])
    exported = json.loads((source / "learn.json").read_text())["exported"]
    print(f"source: learnt in {seconds / 60:.1f} min; exported {exported}", flush=True)
    results: dict[str, dict[str, list[float]]] = {arm: {name: [] for name in EMBEDDINGS} for arm in ARMS}
    for number, seed in enumerate(args.seeds):
        data = work / f"data{seed}"
        run(["data", "synth", "--videos", str(data), "--preset", "study", "--seed", str(seed)])
        labels = labels_of(data)
        common = ["--budget", args.budget, "--seed", str(seed), "--labels", str(data / "labels.csv"), "--quiet"]
        arms = {"init + learn": ["learn", str(data / "videos"), "--out", str(work / f"init{seed}"), "--init",
                                 str(source / "encoder_rgb.pth"), "--flow-init", str(source / "encoder_flow.pth"),
                                 *common],
                "scratch": ["learn", str(data / "videos"), "--out", str(work / f"scratch{seed}"), *common]}
        order = list(arms) if number % 2 == 0 else list(arms)[::-1]
        took = {arm: run(arms[arm]) for arm in order}
        folders = {"init alone": embed_alone(source, data, work / f"alone{seed}"),
                   "init + learn": work / f"init{seed}" / "embeddings",
                   "scratch": work / f"scratch{seed}" / "embeddings"}
        line = []
        for arm in ARMS:
            scores = {name: r_at_1(folders[arm] / name, labels, center=False) for name in EMBEDDINGS}
            for name, value in scores.items():
                results[arm][name].append(value)
            line.append(f"{arm} " + "/".join(f"{scores[name]:.1f}" for name in EMBEDDINGS))
        print(f"seed {seed} (R@1 rgb/flow/two-stream): {'; '.join(line)}; minutes "
              + ", ".join(f"{arm} {seconds / 60:.1f}" for arm, seconds in took.items()), flush=True)
    for arm in ARMS:
        print(f"{arm}: " + ", ".join(f"{name} {np.mean(v):.1f} +- {np.std(v):.1f}" for name, v in results[arm].items()))
    for name in EMBEDDINGS:
        gain = np.array(results["init + learn"][name]) - np.array(results["scratch"][name])
        print(f"init + learn - scratch, {name}: {np.mean(gain):+.1f} (seeds: {', '.join(f'{g:+.1f}' for g in gain)})")


if __name__ == "__main__":
    main()
