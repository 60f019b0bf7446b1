"""Per-epoch tables of the CoCLR K=1 ablation of a study folder (issue 40): loss, share of mined positives of the
query's class, kNN R@1 and the collapse test of the train features, then the row's final numbers.

Reads what the study wrote: ``seed<S>/coclr_k1/<stage>/log.jsonl`` (run with ``train.run.log_every=1`` so every
step's ``<view>/mined_precision`` is logged, and ``train.run.knn_every=1`` for the per-epoch measures of
:func:`coclr.eval.monitor.knn_recall`) and ``seed<S>/results.json``.

    python benchmarks/k1_collapse_tables.py STUDY_DIR [--seeds 0 1 2 3 4]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

STAGES = ("cycle1_rgb", "cycle1_flow", "cycle2_rgb")


def stage_epochs(log: Path, view: str) -> list[dict]:
    """One dict per epoch of a training log: the epoch's mean loss, the mean over its steps of the share of mined
    positives of the query's class (percent), and the kNN measures logged at its end."""
    steps = defaultdict(list)
    epochs = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "epoch_loss" in record:
            epochs.append(record)
        elif f"{view}/mined_precision" in record:
            steps[record["epoch"]].append(record[f"{view}/mined_precision"])
    rows = []
    for record in epochs:
        shares = steps.get(record["epoch"] - 1, [])
        rows.append({"epoch": record["epoch"], "loss": record["epoch_loss"],
                     "share": 100 * sum(shares) / len(shares) if shares else None,
                     "R@1": record.get("knn_R@1"), "nn": record.get("knn_nn_accuracy"),
                     "rank": record.get("knn_rank"), "collapsed": record.get("knn_collapsed")})
    return rows


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def seed_tables(folder: Path) -> str:
    lines = []
    for stage in STAGES:
        log = folder / "coclr_k1" / stage / "log.jsonl"
        if not log.is_file():
            continue
        view = stage.split("_")[1]
        lines += [f"{stage} (trains {view}; positives mined in the other view, K=1):", "",
                  "| epoch | loss | positives of the class (%) | kNN R@1 | train 1-NN acc. | eff. rank | collapsed |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
        for row in stage_epochs(log, view):
            flag = "-" if row["collapsed"] is None else ("yes" if row["collapsed"] else "no")
            lines.append(f"| {row['epoch']} | {row['loss']:.3f} | {fmt(row['share'])} | {fmt(row['R@1'])} | "
                         f"{fmt(row['nn'])} | {fmt(row['rank'], 2)} | {flag} |")
        lines.append("")
    results = folder / "results.json"
    if results.is_file():
        lines += ["Final rows (test videos; the linear probe and R@1 of the study's evaluation):", "",
                  "| row | linear probe | R@1 | eff. rank (train) | 1-NN acc. (train) | collapsed |",
                  "|---|---:|---:|---:|---:|---|"]
        for row in json.loads(results.read_text())["rows"]:
            health = json.loads((folder / "eval" / f"{row['row']}_retrieval.json").read_text())["feature_health"]
            train = health[0]["train"]
            lines.append(f"| {row['method']} {row['view']} | {fmt(row.get('linear_top1'))} | "
                         f"{fmt(row['retrieval']['R@1'])} | {train['effective_rank']:.2f} | "
                         f"{fmt(train.get('nn_accuracy'))} | {'yes' if row.get('collapsed') else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    found = [seed for seed in args.seeds if (args.study / f"seed{seed}").is_dir()]
    if not found:  # (it printed nothing and exited 0)
        parser.error(f"{args.study}: holds no seed<S>/ folder of a study for the seeds {args.seeds}")
    for seed in found:
        print(f"### Seed {seed}\n\n{seed_tables(args.study / f'seed{seed}')}")


if __name__ == "__main__":
    main()
