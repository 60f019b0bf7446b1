"""The pretrain entry point: sets up the processes, checks and claims the run folder and builds every part of the run
(:mod:`coclr.train.setup`), then runs the loop (:class:`~coclr.train.trainer.Trainer`).

:func:`pretrain` is the one entry of every pretraining stage: ``coclr pretrain``, the pipeline's stages (and so the
study's and ``coclr learn``'s) and the benchmarks. :func:`start_run` is its first half, for a caller that drives
the loop's steps itself (the calibration of ``coclr learn``'s budget, tests).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from coclr.train.config import PretrainConfig
from coclr.train.setup import build_parts, claim_run_folder, setup_run, torch_settings
from coclr.train.trainer import Trainer


@dataclass(frozen=True)
class Pretrained:
    """What a pretraining run left: its last checkpoint, and whether every configured epoch is done (false when
    ``run.max_steps`` stopped it first)."""

    checkpoint: Path
    finished: bool


@contextmanager
def start_run(config: PretrainConfig, restart: bool = False) -> Iterator[Trainer]:
    """A run ready for its loop, for the ``with`` block: everything checked (inputs, device, the run folder's
    options) and every part built (a checkpoint that does not fit is refused here) before anything is written or
    moved; then, with ``restart``, an earlier run moved aside, and the folder claimed (held until the block ends)
    and its last checkpoint loaded. The torch settings of ``run.deterministic`` (and cuDNN's autotuner on CUDA) hold
    while the block runs and are restored after."""
    setup = setup_run(config, restart)
    parts = build_parts(setup)
    with claim_run_folder(setup.config, setup.world, restart), \
            torch_settings(setup.config.run.deterministic, setup.device):
        yield Trainer(parts)


def pretrain(config: PretrainConfig, restart: bool = False, label: str = "") -> Pretrained:
    """Run one pretraining stage, or continue the one in ``run.out``: :func:`start_run`, then the loop (its
    progress bar labelled ``label``). Interrupted, it raises :class:`~coclr.interrupts.Interrupted` saying which
    checkpoint is kept."""
    with start_run(config, restart) as trainer:
        trainer.progress_label = label
        trained = Pretrained(trainer.run(), trainer.finished)
    # Every process leaves together once the run is done, never while an error or a stop unwinds: a process
    # waiting here then left the others waiting in a step's collective, and the job hung (until torchrun killed it)
    if dist.is_initialized():
        dist.barrier()
    return trained
