"""The pairing of 2026-12-01-warmup-first-step-plan.md: each finished quick-study seed's R@1 and linear-probe
top-1 (the records in SEED_DIR/eval) beside the figures recorded for the same seed before the change
(2026-12-01-window-normalisation.json, "new").

    python docs/experiments/2026-12-01-warmup-first-step.py R/seed0 [R/seed1 ...] --out paired.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

TASKS = {"retrieval": "R@1", "linear": "top1"}
BEFORE = Path(__file__).with_name("2026-12-01-window-normalisation.json")
_PAIRED = importlib.util.spec_from_file_location("paired", BEFORE.with_suffix(".py"))
_EARLIER = importlib.util.module_from_spec(_PAIRED)
_PAIRED.loader.exec_module(_EARLIER)
spread = _EARLIER.spread  # (mean ± sd over seeds, as the pairing before)


def figures(seed_dir: Path) -> dict[str, dict[str, float]]:
    """{row: {task: figure}} of the records in ``seed_dir/eval``."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted((seed_dir / "eval").glob("*.json")):
        row, _, task = path.stem.rpartition("_")
        if task in TASKS:
            out.setdefault(row, {})[task] = json.loads(path.read_text())["results"][TASKS[task]]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", nargs="+", type=Path, help="finished study folders (R/seed<S>)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    recorded = json.loads(BEFORE.read_text())["seeds"]
    pairs: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for seed_dir in args.seeds:
        before = recorded[f"R/{seed_dir.name}"]
        after = figures(seed_dir)
        pairs[seed_dir.name] = {row: {task: {"before": before[row][task]["new"], "after": value}
                                      for task, value in tasks.items()} for row, tasks in after.items()}
    rows = sorted({row for seed in pairs.values() for row in seed})
    lines = [f"seeds: {', '.join(pairs)}", "",
             "| row | task | before | after | after - before (paired) | unchanged on |", "|---|---|---|---|---|---|"]
    for row in rows:
        for task in TASKS:
            got = [seed[row][task] for seed in pairs.values() if task in seed.get(row, {})]
            if not got:
                continue
            before, after = [g["before"] for g in got], [g["after"] for g in got]
            same = sum(abs(a - b) < 1e-9 for a, b in zip(after, before))
            lines.append(f"| {row} | {task} | {spread(before)} | {spread(after)} | "
                         f"{spread([a - b for a, b in zip(after, before)])} | {same}/{len(got)} |")
    claims = {"UberNCE-RGB > CoCLR-RGB > InfoNCE-RGB (R@1)": lambda s: s["ubernce_rgb"]["retrieval"]["after"]
              > s["coclr_rgb"]["retrieval"]["after"] > s["infonce_rgb"]["retrieval"]["after"],
              "InfoNCE-Flow > InfoNCE-RGB (R@1)": lambda s: s["infonce_flow"]["retrieval"]["after"]
              > s["infonce_rgb"]["retrieval"]["after"]}
    lines.append("")
    for claim, holds in claims.items():
        lines.append(f"{claim}: held on {sum(holds(seed) for seed in pairs.values())} of {len(pairs)} seeds")
    print("\n".join(lines))
    args.out.write_text(json.dumps({"seeds": pairs, "table": lines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
