"""The pretrain entry point: sets up the processes and the run folder (:mod:`coclr.train.setup`), then runs the
loop (:class:`~coclr.train.trainer.Trainer`)."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from coclr.train.config import PretrainConfig
from coclr.train.setup import setup_run
from coclr.train.trainer import Trainer


def pretrain(config: PretrainConfig, restart: bool = False) -> Path:
    """Run one pretraining stage, or continue the one in ``run.out``; returns the last checkpoint. Everything is
    checked (inputs, device, the run folder's options) before any model is built."""
    setup = setup_run(config, restart)
    trainer = Trainer(setup.config, setup=setup)
    try:
        return trainer.run()
    finally:
        if dist.is_initialized():
            dist.barrier()
