"""How much `coclr learn`'s calibration of training moves between moments on this machine, and what a CoCLR step
costs beside the InfoNCE step the calibration times.

The plan prices a CoCLR step as the calibration's InfoNCE step plus the frozen miner's forward of the batch
(`learn.budget.estimates`). This times, REPEATS times each, the calibration's own measurement of MODEL
(`train.timing.time_training`: InfoNCE steps on every thread and on one, in turn, and a clip's forward) and the same
measurement on a real CoCLR run of the same network (an RGB stage mining with a frozen flow encoder), and prints
every repeat and, per figure, its spread (largest / smallest) and the CoCLR step against that price.

    python benchmarks/learn_calibration.py --model w0.25_s32_l8 --batch 32 --repeats 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="w0.25_s32_l8", help="a candidate's key (learn.budget.MODELS)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from coclr.config import from_dict
    from coclr.learn.budget import MODELS
    from coclr.synth.output import random_store
    from coclr.train.config import PretrainConfig
    from coclr.train.run import start_run
    from coclr.train.timing import time_steps, time_training

    model = next((m for m in MODELS if m.key == args.model), None)
    if model is None:
        raise SystemExit(f"--model {args.model}: one of {', '.join(m.key for m in MODELS)}")
    print(f"{model}, batch {args.batch}, {torch.get_num_threads()} threads")
    infonce, coclr = [], []
    with tempfile.TemporaryDirectory(prefix="coclr-calibration-") as tmp:
        tmp = Path(tmp)
        store = random_store(tmp / "store", videos=2 * args.batch, frames=model.length + 2,
                             size=(model.size, model.size * 4 // 3), views=("rgb", "flow"))
        base = {"data": {"store": str(store), "length": model.length, "size": model.size, "workers": 0},
                "model": {"width": model.width}, "run": {"batch_size": args.batch, "progress": False,
                                                          "device": "cpu"}}
        miner = from_dict(PretrainConfig, {**base, "data": {**base["data"], "view": "flow", "second_view": "rgb"},
                                           "method": {"queue_size": 2 * args.batch, "topk": 1},
                                           "run": {**base["run"], "out": str(tmp / "miner")}})
        with start_run(miner) as trainer:
            trainer.save(best=True)
        method = {"name": "coclr", "queue_size": 2 * args.batch, "topk": 5, "wait_for_full_queue": False,
                  "sampler_checkpoint": str(next((tmp / "miner").rglob("checkpoint_best.pth")))}
        for repeat in range(args.repeats):  # in turn: InfoNCE, then CoCLR
            infonce.append(time_training(model.width, model.size, model.length, tmp / f"infonce{repeat}", "cpu",
                                          args.batch))
            run = from_dict(PretrainConfig, {**base, "method": method,
                                             "run": {**base["run"], "out": str(tmp / f"coclr{repeat}")}})
            with start_run(run) as trainer:
                coclr.append(time_steps(trainer, model.length, model.size, args.batch, 5, 0.0, None))
            print(f"  repeat {repeat + 1}: InfoNCE step {infonce[-1]['step'] * 1000:.0f} ms (one thread "
                  f"{infonce[-1]['single_step'] * 1000:.0f}), forward {infonce[-1]['forward'] * 1000:.2f} ms a clip; "
                  f"CoCLR step {coclr[-1]['step'] * 1000:.0f} ms (one thread {coclr[-1]['single_step'] * 1000:.0f})")
    for name in ("step", "single_step", "forward"):
        values = np.array([item[name] for item in infonce])
        print(f"calibration's {name}: spread {values.max() / values.min():.2f} (largest / smallest)")
    for name in ("step", "single_step"):
        price = np.array([item[name] + args.batch * item["forward"] for item in infonce])
        actual = np.array([item[name] for item in coclr])
        print(f"CoCLR {name} against its price (InfoNCE {name} + the batch's forward): "
              + ", ".join(f"{a / p:.2f}" for a, p in zip(actual, price)))


if __name__ == "__main__":
    main()
