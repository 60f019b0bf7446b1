"""`coclr learn` on a small folder of real footage (the eight clips of ../shared/data), seed after seed.

For each seed: `coclr learn CLIPS --out WORK/s<S> --budget B --seed S`, timed as a user would time it, then from its
`learn.json`: the plan (network, instances, batch, queue, top-K, steps), the share of the budget used, each phase's
estimate against its time, the stages that collapsed, the RGB/flow nearest-neighbour agreement after InfoNCE and
after each cycle (against chance), the exported stage of each view and the exit status. The goal (issue 55): no
stage collapsed and agreement above chance after each cycle, on every seed, within 85-100% of the budget.

    python benchmarks/learn_clips.py --work /tmp/learn_clips --seeds 0 1 2 3 4 5 --budget 3m
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CLIPS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "clips"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, type=Path, help="folder of the runs (kept: reruns continue)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--budget", default="3m")
    parser.add_argument("--clips", type=Path, default=CLIPS, help="the footage (default: ../shared/data/clips)")
    args = parser.parse_args()
    print(f"cpu: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; budget {args.budget}; {args.clips}",
          flush=True)
    healthy = failed = 0
    for seed in args.seeds:
        out = args.work / f"s{seed}"
        begin = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "coclr", "learn", str(args.clips), "--out", str(out), "--budget",
                               args.budget, "--seed", str(seed), "--quiet"], capture_output=True, text=True)
        seconds = time.perf_counter() - begin
        if not (out / "learn.json").is_file():
            print(f"seed {seed}: exit {done.returncode}: {done.stderr.strip()[-300:]}", flush=True)
            failed += 1
            continue
        record = json.loads((out / "learn.json").read_text())
        plan = record["plan"]
        estimates, phases = plan["estimates"], record.get("phases", {})
        collapsed = [stage for stage, entry in record["stages"].items() if entry["collapsed"]]
        agreement = {name: entry["nearest_neighbour"] for name, entry in record["agreement"].items()}
        chance = next(iter(record["agreement"].values()))["chance"]
        above = all(agreement[name] > chance for name in agreement if name.startswith("cycle"))
        healthy += not collapsed and above
        print(f"seed {seed}: exit {done.returncode}, {seconds:.0f} s of {plan['budget']:.0f} "
              f"({100 * seconds / plan['budget']:.0f}%, the run's own clock {record['seconds']:.0f} s); "
              f"w{plan['model']['width']:g} {plan['model']['size']}px, segments of {plan.get('segment_frames')} "
              f"frames, batch {plan['batch']}, queue {plan['queue']}, top-{plan['topk']}, {plan['steps']} steps; "
              f"collapsed: {', '.join(collapsed) or 'none'}; agreement "
              + ", ".join(f"{name} {100 * value:.0f}%" for name, value in agreement.items())
              + f" (chance {100 * chance:.0f}%); exported "
              + ", ".join(f"{view} {entry['stage']}" for view, entry in record["exported"].items()), flush=True)
        print("  phase seconds (estimate / took): " + ", ".join(
            f"{name} {estimates.get(name, 0):.0f}/{phases[name]:.0f}" for name in phases), flush=True)
    print(f"{healthy} of {len(args.seeds)} seeds: no stage collapsed and agreement above chance after each cycle")
    if failed:  # a seed whose learn wrote no result is no figure: not a run that ended well
        sys.exit(f"{failed} of {len(args.seeds)} seeds wrote no learn.json (above: why)")


if __name__ == "__main__":
    main()
