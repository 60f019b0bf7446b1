"""Seed robustness of ``coclr demo``: runs the whole demo for several seeds and summarises its numbers.

For every seed it runs ``coclr demo --out ROOT/seedS --seed S [key=value ...]`` (resumable: a finished
seed is only read back), then prints, per row of the table, the mean and standard deviation over the seeds
of the linear-probe top-1 and R@1, the share of each CoCLR stage's mined positives that had the query's
class, the share of the InfoNCE-RGB -> UberNCE-RGB R@1 gap closed by CoCLR-RGB, how many seeds satisfy
each claim of the paper, and the wall time of each demo. It is a benchmark (minutes per seed), not a test.

    python benchmarks/bench_demo_seeds.py --root /tmp/demo_seeds [--seeds 0 1 2] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def run_seed(root: Path, seed: int, overrides: list[str]) -> dict[str, Any]:
    """Run (or resume) the demo of one seed and return its ``results.json`` content."""
    out = root / f"seed{seed}"
    results = out / "results.json"
    if not results.is_file():
        started = time.time()
        subprocess.run([sys.executable, "-m", "coclr", "demo", "--out", str(out), "--seed", str(seed),
                        *overrides], check=True)
        print(f"seed {seed}: demo took {time.time() - started:.0f} s", flush=True)
    return json.loads(results.read_text())


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaNs are ignored."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return float("nan"), float("nan")
    mean = sum(finite) / len(finite)
    if len(finite) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))


def _row(name: str, values: list[float]) -> str:
    """One line of the summary: a value per seed, then their mean ± std (NaN: no value for that seed)."""
    mean, std = mean_std(values)
    return f"{name:<18}" + "".join(f"{v:>16.1f}" for v in values) + f"{mean:>11.1f} ± {std:.1f}"


def summarise(results: list[dict[str, Any]]) -> str:
    """A plain-text table: per seed, then mean ± std over seeds, then how often each claim holds."""
    seeds = [r["seed"] for r in results]
    names = [f"{row['method']}-{row['view']}" for row in results[0]["rows"]]
    lines = [f"{'row':<18}" + "".join(f"{'seed ' + str(s):>16}" for s in seeds) + f"{'mean ± std':>18}"]
    for metric, get in (("linear top-1", lambda row: row["linear_top1"]), ("R@1", lambda row: row["retrieval"]["R@1"])):
        lines.append(f"-- {metric}")
        for index, name in enumerate(names):
            lines.append(_row(name, [get(r["rows"][index]) for r in results]))
    mined = [{stage["stage"]: stage["mined_precision"] for stage in r.get("stages", [])} for r in results]
    stage_names = list(dict.fromkeys(name for m in mined for name, value in m.items() if value is not None))
    if stage_names:
        lines.append("-- mined positives of the query's class (%)")
        for name in stage_names:
            lines.append(_row(name, [float("nan") if m.get(name) is None else m[name] for m in mined]))
    lines.append("-- claims")
    for claim in results[0]["claims"]:
        values = [r["claims"][claim] for r in results]
        if isinstance(values[0], bool):
            lines.append(f"{claim}: holds for {sum(values)}/{len(values)} seeds")
        else:
            mean, std = mean_std([float(v) for v in values])
            shown = ", ".join(f"{100 * v:.0f}%" for v in values)
            lines.append(f"{claim}: {shown} (mean {100 * mean:.0f}% ± {100 * std:.0f}%)")
    walls = [r["wall_seconds"] for r in results]
    mean, std = mean_std(walls)
    lines.append(f"wall time per demo (s): {', '.join(f'{w:.0f}' for w in walls)} (mean {mean:.0f} ± {std:.0f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="folder of the demos, one sub-folder per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("overrides", nargs="*", help="DemoConfig options (key=value), as for `coclr demo`; "
                        "anywhere on the line")
    argv = sys.argv[1:]
    # --seeds takes every following word, so key=value words are moved to the front, where they are positional.
    overrides = [word for word in argv if "=" in word and not word.startswith("-")]
    args = parser.parse_args(overrides + [word for word in argv if word not in overrides])
    results = [run_seed(args.root, seed, args.overrides) for seed in args.seeds]
    print(summarise(results))


if __name__ == "__main__":
    main()
