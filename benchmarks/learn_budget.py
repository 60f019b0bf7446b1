"""How closely finished `coclr learn` runs kept to their budget, and how good each phase's estimate was.

Reads each run's `learn.json` (its plan, the seconds of each phase and of the whole run; a continued run counts
every part) and prints one line per run: the share of `--budget` the run took, and for each phase its seconds over
its estimate. The CoCLR phase is compared with the plan's seconds an epoch times the epochs its stages were
sized to (the calibration's error, which sizing corrects); the phases after it with their estimates at the pace
the last sizing used (what the run counted on). Then how many runs ended within 85-100% of their budget (issue 55).

    python benchmarks/learn_budget.py RUN [RUN ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from coclr.learn.budget import LATER, Plan


def phase_ratios(record: dict) -> dict[str, float]:
    """Each phase's seconds over its estimate (see the module docstring)."""
    plan, took = record["plan"], record.get("phases", {})
    estimates = dict(plan["estimates"])
    sizing = record.get("sizing") or {}
    if sizing:
        estimates["coclr"] = Plan.from_dict(plan).coclr_epoch_seconds * sum(plan["stage_epochs"].values())
        pace = list(sizing.values())[-1]["pace"]
        estimates.update({name: estimates[name] * pace for name in LATER if name in estimates})
    return {name: took[name] / estimates[name] for name in took if estimates.get(name)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    shares = []
    for run in args.runs:
        record = json.loads((run / "learn.json").read_text())
        if record.get("status") != "done":
            print(f"{run}: not finished")
            continue
        share = record["seconds"] / record["plan"]["budget"]
        shares.append(share)
        sized, planned = record["plan"].get("stage_epochs") or {}, record["plan"]["epochs"]["coclr"]
        epochs = (f"CoCLR epochs {'/'.join(str(e) for e in sized.values())} (planned {planned})" if sized
                  else f"CoCLR epochs {planned} (not sized)")
        ratios = ", ".join(f"{name} {ratio:.2f}" for name, ratio in phase_ratios(record).items())
        print(f"{run}: {record['seconds']:.0f} s of {record['plan']['budget']:.0f} s = {share:.1%}; {epochs}; "
              f"seconds / estimate: {ratios}")
    inside = sum(0.85 <= share <= 1.0 for share in shares)
    if shares:
        print(f"{inside} of {len(shares)} runs within 85-100% of the budget (shares {min(shares):.1%} to "
              f"{max(shares):.1%})")


if __name__ == "__main__":
    main()
