"""What the pretrain entry point does before the loop: the device and precision, the processes (torchrun joins
its process group here), the inputs checked and the run folder continued or refused.

:func:`setup_run` does all of it, once, before any model is built; :func:`coclr.train.run.pretrain` calls it and
hands the result to the :class:`~coclr.train.trainer.Trainer`, which only runs the loop. The run folder follows
:mod:`coclr.runfolder` through two calls: :func:`check_run_folder` (reads only) here, and
:func:`claim_run_folder` (lock, check again, record) around the loop, before its first write.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from coclr.config import to_dict
from coclr.core.distributed import held_by_main, init_distributed, is_main, pick_device, rank, world_size
from coclr.errors import ConfigError
from coclr.runfolder import FolderRule, check_folder, claim_folder, restart_folder
from coclr.store.clipstore import open_store
from coclr.train.checkpoint import load_checkpoint
from coclr.train.config import PretrainConfig
from coclr.train.model import check_view_of

LAST = "checkpoint_last.pth"
BEST = "checkpoint_best.pth"


@dataclass(frozen=True)
class RunSetup:
    """A run ready for its loop: the device, the configuration with its precision resolved for it, this process's
    rank among ``world`` processes, and whether ``run.out`` holds a run to continue."""

    config: PretrainConfig
    device: torch.device
    rank: int
    world: int
    continues: bool


def setup_run(config: PretrainConfig, restart: bool = False) -> RunSetup:
    """Pick the device (``run.device``), check the inputs (files, views, device options), resolve the precision,
    join torchrun's process group and check ``run.out`` (continue, or refuse other options naming each; with
    ``restart`` an earlier run is moved aside first). Raises a :class:`~coclr.errors.CoclrError` before any
    work."""
    device = resolve_device(config.run.device)
    check_inputs(config, device)
    config = resolve_precision(config, device)
    init_distributed(device)
    continues = check_run_folder(config, restart)
    return RunSetup(config, device, rank(), world_size(), continues)


@contextmanager
def torch_settings(deterministic: bool, device: torch.device) -> Iterator[None]:
    """Deterministic algorithms (``deterministic``) or cuDNN's autotuner (CUDA), restored on exit: process-wide
    settings that a trainer must not leave behind (a pipeline runs several in one process)."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    elif device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
        if before[3] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def resolve_device(name: str) -> torch.device:
    """The device of ``run.device`` (:func:`coclr.core.distributed.pick_device`)."""
    return pick_device(name, "run.device")


def resolve_precision(config: PretrainConfig, device: torch.device) -> PretrainConfig:
    """``config`` with ``run.amp=auto`` and ``run.channels_last=null`` resolved for ``device``: bf16 autocast and
    channels_last_3d on CUDA devices with bf16 support, none on the CPU (a copy; ``config`` is not changed).
    Run folders record the resolved values, so a CPU run records what it did."""
    run = config.run
    amp = run.amp
    if amp == "auto":
        amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "none"
    channels_last = run.channels_last
    if channels_last is None:
        channels_last = device.type == "cuda" and amp != "none"
    return dataclasses.replace(config, run=dataclasses.replace(run, amp=amp, channels_last=channels_last))


def check_inputs(config: PretrainConfig, device: torch.device) -> None:
    """Fail fast, before any compute, on missing files, checkpoints of another view, and options the device cannot
    honour (the store itself is checked by TrainClips)."""
    views = {"init_checkpoint": config.data.view, "second_init_checkpoint": config.data.second_view,
             "sampler_checkpoint": config.data.second_view}
    for key, view in views.items():
        path = getattr(config.method, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"method.{key}: checkpoint not found: {path}")
        if path:
            check_view_of(path, view, f"method.{key}")
    if not Path(config.data.store).is_dir():
        raise ConfigError(f"data.store: not a directory: {config.data.store}")
    if config.method.spec.uses_labels:
        open_store(config.data.store).index.require_labels(f"method {config.method.name}", [config.data.split])
    if config.run.amp not in ("none", "auto") and device.type != "cuda":
        raise ConfigError(f"run.amp: {config.run.amp} autocast is for CUDA devices; this run is on {device} "
                          "(use run.amp=none)")


CONTINUABLE = ("run.out", "run.device", "run.progress", "run.log_every", "run.save_every", "run.max_steps",
               "run.knn_every", "run.batch_size", "run.ddp_bucket_mb", "data.workers", "data.cache_mb")
"""Options a run may continue with other values (they change where it runs, what it shows or where it stops,
never its results); any other difference is refused (:mod:`coclr.runfolder`). ``run.batch_size`` is per process:
what must stay is the global batch, recorded as ``run.global_batch``, so a run continues on any number of
processes."""


def run_options(config: PretrainConfig, world: int) -> dict[str, Any]:
    """The options a run folder records: the configuration, with the global batch of ``world`` processes."""
    options = to_dict(config)
    options["run"]["global_batch"] = config.run.batch_size * world
    return options


def _checkpoint_options(folder: Path) -> dict[str, Any] | None:
    """The options of a run folder written before run records existed: those its last checkpoint holds."""
    if not (folder / LAST).is_file():
        return None
    checkpoint = load_checkpoint(folder / LAST)
    options = checkpoint["config"]
    options["run"]["global_batch"] = options["run"]["batch_size"] * checkpoint.get("world_size", 1)
    return options


PRETRAIN_FOLDER = FolderRule("pretrain", "a pretrain run", may_differ=CONTINUABLE, restart=True)
"""How a pretrain run folder is continued or refused (:mod:`coclr.runfolder`)."""


def check_run_folder(config: PretrainConfig, restart: bool = False) -> bool:
    """Whether ``run.out`` holds a run started with the same options (to continue); other options are refused,
    naming each that differs; with ``restart``, an earlier run is moved aside first (refused while another job
    holds it). Under torchrun, rank 0 moves it and every process checks after it. Reads only, without
    ``restart``."""
    if restart and is_main():
        restart_folder(config.run.out, PRETRAIN_FOLDER)
    if restart and dist.is_initialized():
        dist.barrier()
    return check_folder(config.run.out, PRETRAIN_FOLDER, run_options(config, world_size()), _checkpoint_options)


def claim_run_folder(config: PretrainConfig, world: int):
    """Hold ``run.out`` while the loop writes it (a context manager): on rank 0, the folder is created, locked (a
    second job is refused and leaves it untouched), checked again and its options recorded before anything is
    written; the other processes of a torchrun job write under rank 0's lock, and a refusal stops them all."""
    return held_by_main(lambda: claim_folder(config.run.out, PRETRAIN_FOLDER, run_options(config, world),
                                             legacy=_checkpoint_options))
