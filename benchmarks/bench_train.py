"""Training throughput of `coclr pretrain`: clips per second of one optimiser step (augmentation included).

The paper's setting is the default: full S3D, 32 x 128 x 128 clips, batch 32 per process, InfoNCE on RGB.
A small random clip store is made in a temporary folder, one batch is loaded once, and the trainer's own
``train_step`` (device augmentation, query and key forward, loss, backward, Adam step) is timed, so the figure
is the model's cost without the data loader; ``--with-loader`` also times full epochs through the DataLoader, and
``--frame-cache`` times epochs in one process (``data.workers=0``) with and without the decoded-frame cache
(``data.cache_mb``), after a first epoch that fills it, and prints the ratio.

    python benchmarks/bench_train.py                         # GPU if present, else CPU
    python benchmarks/bench_train.py run.amp=bf16 run.channels_last=true run.compile=true
    python benchmarks/bench_train.py model.width=0.125 data.length=8 data.size=32   # the CPU demo's size
    python benchmarks/bench_train.py --frame-cache model.width=0.125 data.length=8 data.size=32
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch

from coclr.config import load_config
from coclr.data.batch_decode import collate_clips
from coclr.synth import random_store
from coclr.train.config import PretrainConfig
from coclr.train.run import start_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after 3 warm-up steps)")
    parser.add_argument("--with-loader", action="store_true", help="also time an epoch through the DataLoader")
    parser.add_argument("--frame-cache", action="store_true",
                        help="also time epochs in one process with and without the decoded-frame cache")
    parser.add_argument("overrides", nargs="*", help="pretraining options, e.g. run.amp=bf16")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        probe = load_config(PretrainConfig, None, ["data.store=x", "run.out=y", *args.overrides])
        batch_size = probe.run.batch_size
        frames = probe.data.length * probe.data.stride + 1
        height = probe.data.size
        store = random_store(Path(tmp) / "store", videos=2 * batch_size, frames=frames,
                                  size=(height, height * 4 // 3), views=("rgb",))
        config = load_config(PretrainConfig, None, [f"data.store={store}", f"run.out={tmp}/run", "run.progress=false",
                                                     "method.queue_size=256", "method.wait_for_full_queue=false",
                                                     *args.overrides])
        with start_run(config) as trainer:
            trainer._set_train_mode()
            batch = next(iter(torch.utils.data.DataLoader(trainer.dataset, batch_size=batch_size,
                                                          collate_fn=collate_clips)))
            sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
            for _ in range(3):
                trainer.train_step(batch, queue_full=True)
            sync()
            started = time.perf_counter()
            for _ in range(args.steps):
                loss, _ = trainer.train_step(batch, queue_full=True)
            sync()
            seconds = time.perf_counter() - started
            memory = torch.cuda.max_memory_allocated() / 2**30 if trainer.device.type == "cuda" else float("nan")
            name = torch.cuda.get_device_name() if trainer.device.type == "cuda" else "cpu"
            print(f"device {trainer.device} ({name}), torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
            print(f"config: width {config.model.width}, "
                  f"clips {config.data.length}x{config.data.size}x{config.data.size}, batch {batch_size}, "
                  f"amp {config.run.amp}, channels_last {config.run.channels_last}, compile {config.run.compile}")
            print(f"train step: {args.steps * batch_size / seconds:.1f} samples/s (2 clips each) "
                  f"({seconds / args.steps * 1000:.0f} ms/step), "
                  f"peak GPU memory {memory:.2f} GiB, last loss {float(loss):.3f}")
            if args.with_loader:
                started = time.perf_counter()
                trainer.config.optim.epochs = 1
                trainer.run()
                seconds = time.perf_counter() - started
                print(f"epoch with DataLoader ({config.data.workers} workers): "
                      f"{len(trainer.dataset) // batch_size * batch_size / seconds:.1f} samples/s (2 clips each)")
            if args.frame_cache:
                rates = {cache_mb: loader_epochs(config, cache_mb, Path(tmp) / f"cache{cache_mb}")
                         for cache_mb in (0, 256)}
                print(f"epochs in one process (samples of 2 clips): {rates[0]:.1f} samples/s decoding every read, "
                      f"{rates[256]:.1f} samples/s with data.cache_mb=256 ({rates[256] / rates[0]:.2f}x)")


def loader_epochs(config: PretrainConfig, cache_mb: float, out: Path, epochs: int = 3) -> float:
    """Samples (two clips each) per second of ``epochs`` training epochs in this process, after one untimed epoch
    (which fills the frame cache)."""
    config = copy.deepcopy(config)
    config.data.workers, config.data.cache_mb, config.run.out = 0, cache_mb, str(out)
    config.optim.epochs = 1
    with start_run(config) as trainer:
        trainer.run()
        trainer.config.optim.epochs = 1 + epochs
        started = time.perf_counter()
        trainer.run()
        seconds = time.perf_counter() - started
        batch_size = config.run.batch_size
        return epochs * (len(trainer.dataset) // batch_size * batch_size) / seconds


if __name__ == "__main__":
    main()
