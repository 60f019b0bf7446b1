"""The plot of issue 59's results: CoCLR-Flow's R@1 gain over InfoNCE-Flow against its miner's class precision,
this run's points (seeds.json) with issue 48's two fixed miners (its per-seed table, the same seeds and InfoNCE-Flow).

    python docs/experiments/2026-11-29-issue59-plot.py OUT/seeds.json FILE.png
"""

import json
import sys

from coclr.study.results import plot_mining

points = json.load(open(sys.argv[1]))["mining"]
infonce_flow = [52.1, 44.3, 55.5, 53.1, 51.0]  # R@1, seeds 0-4 (the same in both runs)
issue48 = {  # row: (method, mined precision per seed, R@1 per seed), docs/experiments/2026-11-27-issue48-plan.md
    "coclr_ubernce_miner_flow": ("CoCLR mined by UberNCE-RGB (issue 48)", [71.1, 84.1, 89.8, 51.7, 57.0],
                                 [62.5, 64.6, 70.6, 62.0, 60.2]),
    "coclr_infonce_miner_flow": ("CoCLR mined by InfoNCE-RGB, frozen (issue 48)", [29.4, 22.8, 30.9, 23.9, 24.1],
                                 [41.9, 42.2, 50.3, 44.0, 45.8]),
}
for row, (method, precision, r1) in issue48.items():
    points += [{"seed": seed, "row": row, "method": method, "mined_precision": precision[seed],
                "gain": r1[seed] - infonce_flow[seed]} for seed in range(5)]
plot_mining(points, sys.argv[2])
