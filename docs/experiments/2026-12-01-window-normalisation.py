"""The paired runs of 2026-12-01-window-normalisation-plan.md: a finished quick study's rows (the records in
SEED_DIR/eval) evaluated again under the old protocol (raw window means; no L2 normalisation before the probe's
BatchNorm), on the same encoders, beside the record's new-protocol figure.

    python docs/experiments/2026-12-01-window-normalisation.py R/seed0 [R/seed1 ...] --out paired.json

Each seed's old-protocol figures are kept in SEED_DIR/old_protocol.json (computed once); the summary over seeds
(mean, standard deviation, paired difference) is printed and written to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import coclr.eval.features as features
import coclr.eval.linear as linear
from coclr.eval.evaluate import TaskOptions, evaluate_checkpoint
from coclr.eval.features import Stream
from coclr.eval.options import ClipConfig, LinearProbeConfig
from coclr.models.heads import LinearClassifier

TASKS = {"retrieval": "R@1", "linear": "top1"}  # (the records give them in percent)


def old_protocol() -> None:
    """The evaluation as it was before 085d98a: windows averaged raw, the probe without the normalisation."""
    features.unit_length = lambda rows: rows
    linear.LinearClassifier = lambda *args, **kwargs: LinearClassifier(*args, **{**kwargs, "l2_norm": False})
    features.CACHE_FORMAT = "old-protocol"  # (a cache of its own)


def clip_config(record: dict) -> ClipConfig:
    given = record["config"].get("clips", record["config"])
    return ClipConfig(**{f.name: given[f.name] for f in dataclasses.fields(ClipConfig) if f.name in given})


def seed_figures(seed_dir: Path) -> dict[str, dict[str, float]]:
    """{row: {task: {"new": x, "old": y}}} for every retrieval and linear record of the study in ``seed_dir``."""
    kept = seed_dir / "old_protocol.json"
    if kept.is_file():
        return json.loads(kept.read_text())
    out: dict[str, dict[str, dict[str, float]]] = {}
    for path in sorted((seed_dir / "eval").glob("*.json")):
        row, _, task = path.stem.rpartition("_")
        if task not in TASKS:
            continue
        record = json.loads(path.read_text())
        key = TASKS[task]
        streams = [Stream(s["checkpoint"], s["view"]) for s in record["streams"]]
        probe = LinearProbeConfig(**record["config"]["probe"]) if task == "linear" else LinearProbeConfig()
        options = TaskOptions(ks=record["config"].get("ks", [1, 5, 10, 20]), probe=probe,
                              cache_dir=seed_dir / "old_protocol_cache")
        again = evaluate_checkpoint(task, record["store"], streams, clip_config(record), options,
                                    with_views=("rgb", "flow"), progress=False)
        assert again["splits"] == record["splits"], (path, again["splits"], record["splits"])
        out.setdefault(row, {})[task] = {"new": record["results"][key], "old": again["results"][key]}
        print(f"{seed_dir.name} {row} {task}: new {out[row][task]['new']:.1f}, old {out[row][task]['old']:.1f}",
              flush=True)
    kept.write_text(json.dumps(out, indent=1) + "\n")
    return out


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", nargs="+", type=Path, help="finished study folders (R/seed<S>)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    old_protocol()
    per_seed = {str(seed): seed_figures(seed) for seed in args.seeds}
    rows = sorted({row for figures in per_seed.values() for row in figures})
    lines = ["| row | task | new protocol | old protocol | new - old (paired) |", "|---|---|---|---|---|"]
    for row in rows:
        for task in TASKS:
            pairs = [figures[row][task] for figures in per_seed.values() if task in figures.get(row, {})]
            if pairs:
                new, old = [p["new"] for p in pairs], [p["old"] for p in pairs]
                lines.append(f"| {row} | {task} | {spread(new)} | {spread(old)} | "
                             f"{spread([a - b for a, b in zip(new, old)])} |")
    print(f"{len(per_seed)} seed(s): " + ", ".join(per_seed))
    print("\n".join(lines))
    args.out.write_text(json.dumps({"seeds": per_seed, "table": lines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
