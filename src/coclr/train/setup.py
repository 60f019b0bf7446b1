"""What the pretrain entry point does before the loop: the device and precision, the processes (torchrun joins
its process group here), the inputs checked, the run folder continued or refused, and every part of the run built.

:func:`setup_run` checks all of it, once, before anything is built or written; :func:`build_parts` then builds the
data, model, optimiser, augmentation and DDP wrapper (:class:`RunParts`), which
:func:`coclr.train.run.start_run` hands to the :class:`~coclr.train.trainer.Trainer`, which only runs the loop.
The run folder follows :mod:`coclr.runfolder` through two calls: :func:`check_run_folder` (reads only) in
:func:`setup_run`, and :func:`claim_run_folder` (lock, check again, record) once the parts are built, before the
first write (a part that cannot be built, a checkpoint of another encoder, leaves the folder untouched; with
``--restart``, the claim moves the earlier run aside, only then).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coclr import seeding
from coclr.config import to_dict
from coclr.core.methods import METHODS
from coclr.data.augment import ClipAugment
from coclr.data.batch_decode import resolve_decode
from coclr.data.datasets import TrainClips, left_out_message
from coclr.distributed import held_by_main, init_distributed, is_main, pick_device, rank, world_size
from coclr.errors import ConfigError
from coclr.models.loading import require_checkpoint_file
from coclr.runfolder import FolderRule, check_folder, check_restart, claim_folder
from coclr.store.clipstore import open_store
from coclr.train.checkpoint import load_checkpoint
from coclr.train.config import PretrainConfig
from coclr.train.learner import PretrainModel
from coclr.train.model import build_model, check_view_of, clip_settings, sampler_unlike_training
from coclr.train.sampler import ResumableSampler

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
    ``restart``, that an earlier run may be moved aside). Raises a :class:`~coclr.errors.CoclrError` before any
    work."""
    device = resolve_device(config.run.device)
    check_inputs(config, device)
    config = resolve_precision(config, device)
    init_distributed(device)
    continues = check_run_folder(config, restart)
    return RunSetup(config, device, rank(), world_size(), continues)


@dataclass
class RunParts:
    """Every part of a run, built by :func:`build_parts` for the loop: where it runs (``setup``), the data
    (``dataset``, ``decode``: where frames are decoded, ``data_order``), what each view's encoder is trained on
    (``clip_settings``, recorded in every checkpoint), the networks (``model``, and ``ddp`` that wraps it across
    processes, or the model itself), the optimiser with its schedule and loss scaler, and the augmentation."""

    setup: RunSetup
    dataset: TrainClips
    decode: str
    data_order: ResumableSampler
    clip_settings: dict[str, dict[str, Any]]
    model: PretrainModel
    ddp: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    augment: ClipAugment


def log_line(text: str) -> None:
    """One line of the run's output (rank 0 only)."""
    if is_main():
        print(f"[coclr pretrain] {text}", flush=True)


def build_parts(setup: RunSetup) -> RunParts:
    """Build every part of the run ``setup`` describes: the dataset (its left-out videos said), the data order, the
    model (its weights drawn from the run's seed and nothing else; channels-last and compiled as the options ask),
    the fused Adam optimiser on the trained parameters, its schedule and loss scaler, the augmentation, and the DDP
    wrapper when several processes train."""
    config, device = setup.config, setup.device
    decode = resolve_decode(config.data.decode, device, frame_cache=config.data.cache_mb > 0)
    dataset = TrainClips(config.data.store, config.data.split, config.views, config.data.length, config.data.stride,
                         num_clips=2, seed=config.run.seed, frame_size=config.data.frame_size,
                         cache_mb=config.data.cache_mb, encoded=decode == "device",
                         segment_frames=config.data.segment_frames, segment_with=[config.data.second_view])
    if dataset.left_out:
        log_line(left_out_message(dataset.store, config.data.split, config.views, dataset.left_out))
    settings = {view: clip_settings(config, dataset.store, view) for view in config.views}
    if is_main():
        for line in sampler_unlike_training(config, dataset.store):
            warnings.warn(line, stacklevel=2)
    check_steps_taken(config, len(dataset), setup.world)
    data_order = ResumableSampler(len(dataset), config.run.batch_size, seed=config.run.seed, rank=setup.rank,
                                  world_size=setup.world)
    queue_generator = torch.Generator().manual_seed(seeding.queue_seed(config.run.seed))
    with torch.random.fork_rng(devices=[]):  # the weights' initialisation draws from the seed, nothing else
        torch.manual_seed(config.run.seed)
        model = build_model(config, queue_generator).to(device)
    if config.run.channels_last and device.type == "cuda":
        model.to(memory_format=torch.channels_last_3d)
    if config.run.compile:
        for learner in model.learners.values():
            learner.encoder_q.compile()
            learner.encoder_k.compile()
        for frozen in (model.sampler, model.own_sampler):
            if frozen is not None:
                frozen.compile()
    trained = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel updates every parameter in one pass (much faster than the per-parameter loop for small
    # networks); it exists on CPU and CUDA.
    optimizer = torch.optim.Adam(trained, lr=config.optim.lr, weight_decay=config.optim.weight_decay,
                                 fused=device.type in ("cpu", "cuda"))
    scaler = torch.amp.GradScaler(device.type, enabled=config.run.amp == "fp16" and device.type == "cuda")
    return RunParts(setup, dataset, decode, data_order, settings, model, _wrap(model, setup), optimizer,
                    _scheduler(config, optimizer), scaler, ClipAugment.of(config.augment, config.data.size))


def check_steps_taken(config: PretrainConfig, videos: int, processes: int = 1, where: str = "", keys: str = "",
                      epochs_key: str = "optim.epochs") -> None:
    """Refuse a run on ``videos`` training videos (over ``processes``) that would take no optimiser step: fewer
    videos than one batch, or a method that takes no step until its queue is full (CoCLR, as the authors' code)
    whose iterations would all go to filling it; it would end with its starting encoder, changed in nothing but
    its batch-norm statistics, as if it had trained. ``where`` names the run in the message, ``keys`` prefixes the
    options as the caller's configuration names them, ``epochs_key`` is the option that sets its epochs."""
    global_batch = config.run.batch_size * processes
    per_epoch = videos // global_batch
    if per_epoch == 0:
        raise ConfigError(f"{where}{keys}run.batch_size={config.run.batch_size}: {videos} training video(s) are fewer "
                          f"than one batch of {global_batch} clips; lower {keys}run.batch_size")
    method = config.method
    filling = -(-method.queue_size // global_batch)
    iterations = config.optim.epochs * per_epoch
    if method.waits and iterations <= filling:
        raise ConfigError(f"{where}{keys}method.queue_size={method.queue_size}: {method.name} takes no optimiser step "
                          f"until its queue is full, after {filling} iterations of {global_batch} clips, and this run "
                          f"has {iterations} ({config.optim.epochs} epoch(s) of {per_epoch}): it would train "
                          f"nothing; lower {keys}method.queue_size or raise {epochs_key}")


def warn_queue_of_own_keys(config: PretrainConfig, instances: int) -> None:
    """Warn when the queue is not smaller than the ``instances`` trained on: from the second epoch on, every
    query then meets earlier keys of its own video among the queue's negatives (a method without labels), which
    stalls or collapses the training on a small store."""
    method = config.method
    if not instances or method.queue_size < instances or METHODS[method.name].uses_labels:
        return
    smaller = queue_within_a_third(instances)
    if METHODS[method.name].mines:
        smaller = max(smaller, method.topk + 1)  # (a queue must hold more than the top-K mined)
    remedy = (f"a queue within a third of the instances (method.queue_size={smaller}) avoids it"
              if smaller < instances else "more videos (or stretches of them: data.segment_frames) avoid it")
    warnings.warn(f"method.queue_size={method.queue_size} is not smaller than the {instances} training "
                  f"instance(s): from the second epoch on every clip meets earlier keys of its own video in the "
                  f"queue as negatives, which can stall or collapse the training; {remedy}", stacklevel=2)


def warn_short_instances(config: PretrainConfig, frames: Sequence[int]) -> None:
    """Warn when most training instances (of ``frames`` frames each) are shorter than a clip spans: each clip then
    repeats its instance's last frame, and both clips of an instance start at its first frame, the same frames
    (only the augmentation tells them apart), so the contrast learns little."""
    data = config.data
    span = (data.length - 1) * data.stride + 1
    short = sum(count < span for count in frames)
    if not frames or 2 * short <= len(frames):
        return
    what = (f"stretches of data.segment_frames={data.segment_frames}" if data.segment_frames is not None
            else "videos")
    remedy = "lower data.length or data.stride" + (" (or raise data.segment_frames)"
                                                     if data.segment_frames is not None else "")
    warnings.warn(f"{short} of the {len(frames)} training instances ({what}) have fewer frames than a clip spans "
                  f"({span}: data.length={data.length}, data.stride={data.stride}): their clips repeat the last frame, "
                  f"and the two clips of an instance are the same frames; {remedy}", stacklevel=2)


def warn_warmup_past_the_end(config: PretrainConfig, per_epoch: int, global_batch: int) -> None:
    """Warn when the lr's warm-up would not end before the run does: it counts from the first optimiser step, which
    a method that waits for a full queue (CoCLR) takes only after ``method.queue_size`` keys were queued, so
    ``optim.warmup_epochs`` close to ``optim.epochs`` leaves the lr below its schedule to the end."""
    method, optim = config.method, config.optim
    filling = -(-method.queue_size // global_batch) if method.waits else 0
    total = optim.epochs * per_epoch
    if not filling or filling + optim.warmup_epochs * per_epoch <= total:
        return
    most = max(0.0, (total - filling) / per_epoch)
    warnings.warn(f"optim.warmup_epochs={optim.warmup_epochs:g}: the warm-up starts at the first optimiser step, "
                  f"after the {filling} iteration(s) that fill the queue (method.queue_size={method.queue_size}), "
                  f"and would not end before the run's last iteration ({total}): the lr stays below its schedule to "
                  f"the end; optim.warmup_epochs={math.floor(most * 100) / 100:g} or less ends it in time",
                  stacklevel=2)


def queue_within_a_third(instances: int) -> int:
    """The largest power of two within a third of ``instances`` (at least 2): a queue that rarely holds a key of
    the query's own video (the quick study's 128 of 384)."""
    return 1 << (max(2, instances // 3).bit_length() - 1)


def check_steps_on_videos(config: PretrainConfig, videos: int, processes: int = 1, where: str = "", keys: str = "",
                          epochs_key: str = "optim.epochs") -> None:
    """:func:`check_steps_taken` before the run's dataset is built, on the ``videos`` of its split: a run on
    stretches of videos (``data.segment_frames``) has more instances than videos, and is left to the trainer's
    count."""
    if config.data.segment_frames is None:
        check_steps_taken(config, videos, processes, where, keys, epochs_key)


def _scheduler(config: PretrainConfig, optimizer: torch.optim.Optimizer) -> Any:
    """The learning-rate schedule of ``optim.schedule``."""
    optim = config.optim
    if optim.schedule == "milestones":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, optim.milestones, optim.gamma)
    if optim.schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=optim.gamma, patience=optim.patience)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0)


def _wrap(model: nn.Module, setup: RunSetup) -> nn.Module:
    """``model`` wrapped by DistributedDataParallel when several processes train; else itself."""
    if setup.world == 1:
        return model
    device_ids = [setup.device.index] if setup.device.type == "cuda" else None
    with warnings.catch_warnings():  # newer torch renames broadcast_buffers; the old name works on 2.4+
        warnings.simplefilter("ignore", FutureWarning)
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False,
                                                   bucket_cap_mb=setup.config.run.ddp_bucket_mb)


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
    """The device of ``run.device`` (:func:`coclr.distributed.pick_device`)."""
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
        if path:
            require_checkpoint_file(path, f"method.{key}")
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


PATH_OPTIONS = ("data.store", "method.init_checkpoint", "method.second_init_checkpoint", "method.sampler_checkpoint")
"""The options that name files or folders: a run folder compares and records them as absolute paths."""
def as_typed(options: dict[str, Any]) -> dict[str, Any]:
    """A run's settings as a refusal names them: the global batch as the options that make it (no option is named
    ``run.global_batch``)."""
    run = options.get("run")
    if not isinstance(run, dict) or "global_batch" not in run:
        return options
    run = dict(run)
    run["batch_size x processes"] = run.pop("global_batch")
    return {**options, "run": run}


PRETRAIN_FOLDER = FolderRule("pretrain", "a pretrain run", may_differ=CONTINUABLE, restart=True, paths=PATH_OPTIONS,
                             shown=as_typed)
"""How a pretrain run folder is continued or refused (:mod:`coclr.runfolder`)."""


def check_run_folder(config: PretrainConfig, restart: bool = False) -> bool:
    """Whether ``run.out`` holds a run started with the same options (to continue); other options are refused,
    naming each that differs; with ``restart``, whether an earlier run may be moved aside (:func:`claim_run_folder`
    moves it once every part is built: a run refused by a later check is left where it was). Reads only."""
    if restart:  # every process: the same refusal on each (not rank 0's alone, the others waiting for it)
        check_restart(config.run.out, PRETRAIN_FOLDER, legacy=_checkpoint_options)
        return False
    return check_folder(config.run.out, PRETRAIN_FOLDER, run_options(config, world_size()), _checkpoint_options)


def claim_run_folder(config: PretrainConfig, world: int, restart: bool = False):
    """Hold ``run.out`` while the loop writes it (a context manager): on rank 0, an earlier run moved aside first
    with ``restart``, the folder created, locked (a second job is refused and leaves it untouched), checked again
    and its options recorded before anything is written; the other processes of a torchrun job write under rank
    0's lock, and a refusal stops them all."""
    return held_by_main(lambda: claim_folder(config.run.out, PRETRAIN_FOLDER, run_options(config, world),
                                             restart=restart, legacy=_checkpoint_options))
