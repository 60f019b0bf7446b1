"""The pretraining loop: one trainer for every method and view, on one process or many (torchrun).

Under ``torchrun`` every process reads its own slice of each global batch (:class:`ResumableSampler`), keys
are gathered before they are queued, the key forward uses shuffle-BN, and rank 0 writes checkpoints and
logs. Randomness is derived from ``(seed, epoch, step)`` rather than carried in generators, so a run killed
at any moment and resumed from its last checkpoint continues exactly as if uninterrupted, on any number of
processes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from coclr import seeding
from coclr.atomic import atomic_duplicate, atomic_torch_save, atomic_write_text, read_json_lines
from coclr.config import to_dict
from coclr.core.distributed import init_distributed, is_main, local_device, rank, world_size
from coclr.data.augment import ClipAugment
from coclr.data.batch_decode import collate_clips, decode_batch, resolve_decode
from coclr.data.datasets import TrainClips
from coclr.errors import CheckpointError, CoclrError, ConfigError
from coclr.models.encoder import Encoder, build_encoder
from coclr.models.loading import load_encoder, read_clip_settings
from coclr.runfolder import check_folder, move_aside, record_folder
from coclr.train.checkpoint import TRAIN_FORMAT, load_checkpoint, rng_state
from coclr.train.config import PretrainConfig
from coclr.train.learner import PretrainModel, Targets, ViewLearner
from coclr.train.sampler import EpochItems, ResumableSampler

LAST = "checkpoint_last.pth"
BEST = "checkpoint_best.pth"


class NonFiniteLossError(CoclrError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class Position:
    """Where training stands: ``consumed`` videos of ``epoch`` have been used by all processes together."""

    epoch: int = 0
    consumed: int = 0
    global_step: int = 0


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
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"run.device: {name!r} requested but CUDA is not available")
        name = local_device(name)
    return torch.device(name)


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


def step_generator(seed: int, epoch: int, step: int) -> torch.Generator:
    """The generator of one iteration's augmentation and own-key dropout: the same on every process."""
    return seeding.generator(seed, epoch, step)


def load_into(encoder: Encoder, path: str, option: str) -> None:
    """Initialise ``encoder`` from any checkpoint ``load_encoder`` reads (``option`` names where the path came
    from); the architectures must match, or the error names both."""
    backbone, head = load_encoder(path)
    theirs = {"model.width": backbone.width, "model.gating": backbone.gating,
              "model.embed_dim": None if head is None else head.out_dim}
    ours = {"model.width": encoder.backbone.width, "model.gating": encoder.backbone.gating,
            "model.embed_dim": encoder.head.out_dim}
    differ = [f"{key}={ours[key]!r} (the checkpoint: {theirs[key]!r})" for key in ours
              if theirs[key] is not None and theirs[key] != ours[key]]
    if differ:
        raise CheckpointError(f"{option}: {path} holds another encoder than the run's: {', '.join(differ)}")
    encoder.backbone.load_state_dict(backbone.state_dict())
    if head is not None:
        encoder.head.load_state_dict(head.state_dict())


def check_view_of(path: str, view: str, option: str) -> None:
    """A checkpoint that records the view it was trained on must be of the kind of ``view`` (a flow encoder does
    not initialise, mine for or evaluate an RGB network)."""
    from coclr.data.views import view_kind

    trained = read_clip_settings(path).get("view")
    if trained is not None and view_kind(trained) != view_kind(view):
        raise ConfigError(f"{option}: {path} was trained on {trained!r} clips, but is used here for the "
                          f"{view!r} view")


def build_model(config: PretrainConfig, generator: torch.Generator) -> PretrainModel:
    """The learner(s) a method needs, initialised as configured; sampler loaded and frozen for coclr."""
    method = config.method

    def encoder(init: str, option: str) -> Encoder:
        built = build_encoder(width=config.model.width, gating=config.model.gating,
                              embed_dim=config.model.embed_dim)
        if init:
            load_into(built, init, option)
        return built

    def learner(init: str, option: str) -> ViewLearner:
        return ViewLearner(encoder(init, option), method=method.name, queue_size=method.queue_size,
                           temperature=method.temperature, momentum=method.momentum, topk=method.topk,
                           own_drop_prob=method.own_drop_prob, group_positives=method.group_positives,
                           loss_form=method.form, generator=generator,
                           dropped_own_as_negative=method.dropped_own_as_negative)

    learners = {config.data.view: learner(method.init_checkpoint, "method.init_checkpoint")}
    sampler = None
    if method.trains_two_views:
        learners[config.data.second_view] = learner(method.second_init_checkpoint, "method.second_init_checkpoint")
    elif method.spec.needs_sampler(method.simultaneous):
        backbone, head = load_encoder(method.sampler_checkpoint)
        if head is None:
            raise CheckpointError(f"{method.sampler_checkpoint}: has no projection head, so it cannot embed "
                                  "clips for positive mining (a pretraining checkpoint is needed)")
        sampler = Encoder(backbone, head)
    return PretrainModel(learners, sampler=sampler, sampler_view=config.data.second_view if sampler else None)


def clip_settings(config: PretrainConfig, store, view: str) -> dict[str, Any]:
    """What the encoder of ``view`` is trained on (recorded in its checkpoints, see
    :func:`coclr.models.loading.read_clip_settings`): clip shape, the store's frame rate and short side, the
    normalisation and, for flow, the stored bound."""
    from coclr.data.augment import IMAGENET_MEAN, IMAGENET_STD
    from coclr.data.views import is_flow_view, stored_view
    from coclr.flow.extract import stored_bound

    data = config.data
    return {"view": view, "length": data.length, "stride": data.stride, "size": data.size,
            "fps": store.meta.get("fps"), "short_side": store.meta.get("short_side"),
            "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD),
            "flow_bound": stored_bound(store, stored_view(view)) if is_flow_view(view) else None}


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


def check_run_folder(config: PretrainConfig, restart: bool = False) -> bool:
    """Whether ``run.out`` holds a run started with the same options (to continue); other options are refused,
    naming each that differs; with ``restart``, an earlier run is moved aside first. Under torchrun, rank 0 moves
    it and every process checks after it."""
    if restart and is_main():
        move_aside(config.run.out, "pretrain")
    if restart and dist.is_initialized():
        dist.barrier()
    return check_folder(config.run.out, "pretrain", run_options(config, world_size()), CONTINUABLE,
                        _checkpoint_options)


class Trainer:
    """Runs one pretraining stage; ``run()`` returns the path of the last checkpoint.

    The run folder ``run.out`` follows :mod:`coclr.runfolder`: a trainer on a folder started with the same options
    continues it from its last checkpoint; other options are refused before any work, unless ``restart``.
    """

    def __init__(self, config: PretrainConfig, restart: bool = False):
        self.device = resolve_device(config.run.device)
        check_inputs(config, self.device)
        config = self.config = resolve_precision(config, self.device)
        init_distributed(self.device)
        self.rank, self.world = rank(), world_size()
        self.out = Path(config.run.out)
        self.progress_label = ""
        """Shown before the epoch in the progress bar (the pipeline names its stage)."""
        check_run_folder(config, restart)
        self.decode = resolve_decode(config.data.decode, self.device, frame_cache=config.data.cache_mb > 0)
        """Where frames are decoded: "workers" (DataLoader workers) or "device" (this process, batch by batch)."""
        self.dataset = TrainClips(config.data.store, config.data.split, config.views, config.data.length,
                                  config.data.stride, num_clips=2, seed=config.run.seed,
                                  frame_size=config.data.frame_size, cache_mb=config.data.cache_mb,
                                  encoded=self.decode == "device")
        if self.dataset.left_out:
            from coclr.data.datasets import left_out_message

            self._log_line(left_out_message(self.dataset.store, config.data.split, config.views,
                                            self.dataset.left_out))
        self.clip_settings = {view: clip_settings(config, self.dataset.store, view) for view in config.views}
        """What each view's encoder is trained on, recorded in every checkpoint."""
        self.data_order = ResumableSampler(len(self.dataset), config.run.batch_size, seed=config.run.seed,
                                           rank=self.rank, world_size=self.world)
        queue_generator = torch.Generator().manual_seed(seeding.queue_seed(config.run.seed))
        with torch.random.fork_rng(devices=[]):  # the weights' initialisation draws from the seed, nothing else
            torch.manual_seed(config.run.seed)
            self.model = build_model(config, queue_generator).to(self.device)
        if config.run.channels_last and self.device.type == "cuda":
            self.model.to(memory_format=torch.channels_last_3d)
        if config.run.compile:
            for learner in self.model.learners.values():
                learner.encoder_q.compile()
                learner.encoder_k.compile()
            if self.model.sampler is not None:
                self.model.sampler.compile()
        self.trained = [p for p in self.model.parameters() if p.requires_grad]
        # The fused kernel updates every parameter in one pass (much faster than the per-parameter loop for small
        # networks); it exists on CPU and CUDA.
        self.optimizer = torch.optim.Adam(self.trained, lr=config.optim.lr, weight_decay=config.optim.weight_decay,
                                          fused=self.device.type in ("cpu", "cuda"))
        self.scheduler = self._scheduler()
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.run.amp == "fp16"
                                           and self.device.type == "cuda")
        aug = config.augment
        self.augment = ClipAugment(size=config.data.size, area=tuple(aug.crop_area), flip_p=aug.flip_p,
                                   jitter_p=aug.jitter_p, gray_p=aug.gray_p, blur_p=aug.blur_p,
                                   cpu_8bit=aug.cpu_8bit)
        self.ddp = self._wrap()
        self.position = Position()
        self.best_loss = math.inf
        if (self.out / LAST).is_file():
            self._load(self.out / LAST)

    def _scheduler(self):
        optim = self.config.optim
        if optim.schedule == "milestones":
            return torch.optim.lr_scheduler.MultiStepLR(self.optimizer, optim.milestones, optim.gamma)
        if optim.schedule == "plateau":
            return torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer, factor=optim.gamma,
                                                              patience=optim.patience)
        return torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda epoch: 1.0)

    def _wrap(self) -> nn.Module:
        if self.world == 1:
            return self.model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        with warnings.catch_warnings():  # newer torch renames broadcast_buffers; the old name works on 2.4+
            warnings.simplefilter("ignore", FutureWarning)
            return nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids, broadcast_buffers=False,
                                                       bucket_cap_mb=self.config.run.ddp_bucket_mb)

    # ------------------------------------------------------------------ state

    def state(self) -> dict[str, Any]:
        """Everything needed to continue exactly, plus the trained encoder in ``load_encoder``'s form."""
        view = self.config.data.view
        encoder = self.model.learners[view].encoder_q
        return {
            "format": TRAIN_FORMAT,
            "version": 1,
            "view": view,
            "method": self.config.method.name,
            "arch": dict(encoder.arch),
            "backbone": encoder.backbone.state_dict(),
            "head": encoder.head.state_dict(),
            "clip_settings": self.clip_settings[view],
            "encoders": {v: {"arch": dict(lrn.encoder_q.arch), "backbone": lrn.encoder_q.backbone.state_dict(),
                             "head": lrn.encoder_q.head.state_dict(),
                             "clip_settings": self.clip_settings[v]}
                         for v, lrn in self.model.learners.items()},
            "config": to_dict(self.config),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "position": {"epoch": self.position.epoch, "consumed": self.position.consumed,
                         "global_step": self.position.global_step},
            "best_loss": self.best_loss,
            "world_size": self.world,
        }

    def _load(self, path: Path) -> None:
        ckpt = load_checkpoint(path, map_location="cpu")
        missing, unexpected = self.model.load_state_dict(ckpt["model"], strict=False)
        if missing or unexpected:
            raise CheckpointError(f"{path}: model state does not match: missing {missing}, "
                                  f"unexpected {unexpected}")
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        pos = ckpt["position"]
        self.position = Position(pos["epoch"], pos["consumed"], pos["global_step"])
        self.best_loss = ckpt["best_loss"]
        self._log_line(f"resumed from {path} at epoch {self.position.epoch}, "
                       f"{self.position.consumed} videos into it (step {self.position.global_step})")

    def save(self, best: bool = False) -> None:
        if not is_main():
            return
        state = self.state()
        atomic_torch_save(state, self.out / LAST)
        if best:
            atomic_duplicate(self.out / LAST, self.out / BEST)

    # ------------------------------------------------------------------ logging

    def _log_line(self, text: str) -> None:
        if is_main():
            print(f"[coclr pretrain] {text}", flush=True)

    def _open_logs(self):
        if not is_main():
            return None, None
        from torch.utils.tensorboard import SummaryWriter

        self.out.mkdir(parents=True, exist_ok=True)
        log_path = self.out / "log.jsonl"
        if log_path.exists():  # drop records past the checkpoint we resumed from, and a line a kill cut short
            kept = [record for record in read_json_lines(log_path)
                    if record.get("step", 0) <= self.position.global_step]
            atomic_write_text(log_path, "".join(json.dumps(record) + "\n" for record in kept))
        return log_path.open("a"), SummaryWriter(str(self.out / "tb"), purge_step=self.position.global_step + 1)

    def _write(self, record: dict[str, Any], jsonl, writer) -> None:
        if jsonl is None:
            return
        jsonl.write(json.dumps(record) + "\n")
        jsonl.flush()
        for name, value in record.items():
            if name not in ("step", "epoch") and isinstance(value, (int, float)):
                writer.add_scalar(name, value, record["step"])

    # ------------------------------------------------------------------ training

    def _batch_views(self, batch: dict[str, torch.Tensor], step_gen: torch.Generator):
        """Augment the two clips of every view: views of one clip share crop and flip, the two clips differ.

        Parameters are drawn for the whole global batch on every process and each takes its slice, so the
        augmentation of a sample does not depend on the number of processes.
        """
        views = self.config.views
        local = batch[views[0]].shape[0]
        start = self.rank * local
        # Whole (pinned, contiguous) tensors are copied without blocking; a slice would be staged through pageable
        # memory first.
        on_device = {v: batch[v].to(self.device, non_blocking=True) for v in views}
        out = []
        for clip in range(2):
            clip_views = {v: on_device[v][:, clip] for v in views}
            height, width = clip_views[views[0]].shape[2:4]
            params = self.augment.draw_params(local * self.world, height, width, step_gen)
            params = params.select(slice(start, start + local))
            augmented = self.augment.apply(clip_views, params)
            if self.config.run.channels_last and self.device.type == "cuda":
                augmented = {v: x.contiguous(memory_format=torch.channels_last_3d) for v, x in augmented.items()}
            out.append(augmented)
        return out

    def _autocast(self):
        amp = self.config.run.amp
        if amp == "none" or self.device.type != "cuda":
            return nullcontext()
        return torch.autocast("cuda", dtype=torch.bfloat16 if amp == "bf16" else torch.float16)

    def _set_train_mode(self) -> None:
        self.model.train()
        if self.config.run.freeze_bn:
            for module in self.model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def train_step(self, batch: dict[str, torch.Tensor], queue_full: bool) -> tuple[torch.Tensor, dict]:
        pos = self.position
        step = pos.consumed // self.data_order.global_batch
        step_gen = step_generator(self.config.run.seed, pos.epoch, step)
        batch = decode_batch(batch, self.device)
        query, key = self._batch_views(batch, step_gen)
        targets = Targets(batch["label"].to(self.device, non_blocking=True),
                          batch["video"].to(self.device, non_blocking=True),
                          batch["group"].to(self.device, non_blocking=True))
        with self._autocast():
            loss, stats = self.ddp(query, key, targets, step_gen, self.keeps_own_key(pos.global_step),
                                   seeding.generator(self.config.run.seed, pos.epoch, step, seeding.SHUFFLE))
        self.optimizer.zero_grad(set_to_none=True)
        if queue_full or not self.config.method.waits:
            self.scaler.scale(loss).backward()
            factor = self.warmup_factor(pos.global_step)
            scheduled = [group["lr"] for group in self.optimizer.param_groups]
            for group, lr in zip(self.optimizer.param_groups, scheduled):
                group["lr"] = lr * factor
            self.scaler.step(self.optimizer)
            for group, lr in zip(self.optimizer.param_groups, scheduled):  # the scheduler owns the lr
                group["lr"] = lr
            self.scaler.update()
        return loss.detach(), stats

    def keeps_own_key(self, iteration: int) -> bool:
        """Whether iteration ``iteration`` (0-based, of this run) keeps every own key a positive: during the
        first ``method.own_positive_epochs`` epochs of iterations."""
        return iteration < self.config.method.own_positive_epochs * self.data_order.batches_per_epoch

    def warmup_factor(self, iteration: int) -> float:
        """The share of the scheduled lr that iteration ``iteration`` (0-based, of this run) uses: (i + 1) /
        warm-up iterations during ``optim.warmup_epochs``, then 1. Saved iteration counts make resuming
        continue the warm-up where it stopped."""
        iterations = self.config.optim.warmup_epochs * self.data_order.batches_per_epoch
        return min(1.0, (iteration + 1) / iterations) if iterations > 0 else 1.0

    def run(self) -> Path:
        """Train until ``optim.epochs`` (or ``run.max_steps``); returns the last checkpoint. The torch settings
        of ``run.deterministic`` (and cuDNN's autotuner on CUDA) hold while it runs and are restored after."""
        with torch_settings(self.config.run.deterministic, self.device):
            return self._run()

    def _run(self) -> Path:
        config = self.config
        workers = config.data.workers
        loader = DataLoader(self.dataset, batch_size=config.run.batch_size, sampler=EpochItems(self.data_order),
                            num_workers=workers, collate_fn=collate_clips, pin_memory=self.device.type == "cuda",
                            persistent_workers=workers > 0, prefetch_factor=4 if workers else None, drop_last=True)
        if is_main():
            record_folder(self.out, "pretrain", run_options(config, self.world))
        jsonl, writer = self._open_logs()
        queue_full = self.model.queues_full
        nonfinite = torch.zeros((), dtype=torch.bool, device=self.device)
        steps_per_epoch = self.data_order.batches_per_epoch
        self._log_line(f"{config.method.name} on {config.data.view}: {len(self.dataset)} videos, "
                       f"{steps_per_epoch} iterations/epoch, {self.world} process(es), device {self.device}")
        try:
            while self.position.epoch < config.optim.epochs and not self._done():
                epoch = self.position.epoch
                self.dataset.set_epoch(epoch)
                self.data_order.set_epoch(epoch, self.position.consumed)
                self._set_train_mode()
                progress = self._progress(steps_per_epoch)
                epoch_loss = torch.zeros((), device=self.device)
                epoch_steps = 0
                started = time.time()
                for batch in loader:
                    loss, stats = self.train_step(batch, queue_full)
                    nonfinite |= ~torch.isfinite(loss)
                    epoch_loss += loss
                    epoch_steps += 1
                    self.position.consumed += self.data_order.global_batch
                    self.position.global_step += 1
                    if not queue_full:
                        queue_full = self.model.queues_full
                    if progress is not None:
                        progress.update(1)
                    step = self.position.global_step
                    if step % config.run.log_every == 0:
                        self._check_finite(nonfinite)
                        record = self._record(loss, stats)
                        if progress is not None:
                            progress.set_postfix(loss=f"{record['loss']:.3f}")
                        self._write(record, jsonl, writer)
                    if config.run.save_every and step % config.run.save_every == 0:
                        self._check_finite(nonfinite)
                        self.save()
                    if self._done():
                        break
                if progress is not None:
                    progress.close()
                self._check_finite(nonfinite)
                if self.position.consumed >= steps_per_epoch * self.data_order.global_batch:
                    self._end_epoch(epoch_loss, epoch_steps, time.time() - started, jsonl, writer)
                else:
                    self.save()
        finally:
            if jsonl is not None:
                jsonl.close()
                writer.close()
        return self.out / LAST

    @property
    def finished(self) -> bool:
        """All configured epochs are done (false when ``run.max_steps`` stopped the run early)."""
        return self.position.epoch >= self.config.optim.epochs

    def _done(self) -> bool:
        return bool(self.config.run.max_steps) and self.position.global_step >= self.config.run.max_steps

    def _progress(self, steps_per_epoch: int):
        if not (is_main() and self.config.run.progress):
            return None
        from tqdm import tqdm

        done = self.position.consumed // self.data_order.global_batch
        label = f"{self.progress_label}: " if self.progress_label else ""
        return tqdm(total=steps_per_epoch, initial=done, desc=f"{label}epoch {self.position.epoch + 1}/"
                    f"{self.config.optim.epochs}", unit="it", dynamic_ncols=True, leave=False)

    def _check_finite(self, nonfinite: torch.Tensor) -> None:
        if bool(nonfinite):
            raise NonFiniteLossError(
                f"the loss became NaN or infinite before step {self.position.global_step}; stopped. The last "
                f"good checkpoint is kept in {self.out / LAST} (try a lower optim.lr or run.amp=none)")

    def _record(self, loss: torch.Tensor, stats: dict[str, torch.Tensor]) -> dict[str, Any]:
        values = torch.stack([loss.float(), *(v.float() for v in stats.values())])
        if self.world > 1:
            dist.all_reduce(values)
            values /= self.world
        values = values.tolist()
        record = {"step": self.position.global_step, "epoch": self.position.epoch, "loss": values[0],
                  "lr": self.optimizer.param_groups[0]["lr"]
                  * self.warmup_factor(self.position.global_step - 1)}
        record.update(zip(stats.keys(), values[1:]))
        return record

    def _end_epoch(self, epoch_loss: torch.Tensor, steps: int, seconds: float, jsonl, writer) -> None:
        mean_loss = epoch_loss / max(steps, 1)
        if self.world > 1:
            dist.all_reduce(mean_loss)
            mean_loss /= self.world
        mean_loss = float(mean_loss)
        epoch = self.position.epoch
        with warnings.catch_warnings():  # an epoch spent filling the queue takes no optimiser step
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                self.scheduler.step(mean_loss)
            else:
                self.scheduler.step()
        record = {"step": self.position.global_step, "epoch": epoch + 1, "epoch_loss": mean_loss,
                  "epoch_seconds": seconds}
        if self.config.run.knn_every and (epoch + 1) % self.config.run.knn_every == 0:
            record.update(self._knn())
        self._write(record, jsonl, writer)
        self._log_line(f"epoch {epoch + 1}/{self.config.optim.epochs}: loss {mean_loss:.4f} "
                       f"({seconds:.1f} s)" + "".join(f", {k} {v:.1f}" for k, v in record.items()
                                                     if k.startswith("knn")))
        self.position = Position(epoch + 1, 0, self.position.global_step)
        improved = mean_loss < self.best_loss
        self.best_loss = min(self.best_loss, mean_loss)
        self.save(best=improved)

    def _knn(self) -> dict[str, float]:
        """R@1 of test videos retrieving train videos with the trained encoder (labels used only here)."""
        from coclr.eval.monitor import knn_recall

        encoder = self.model.learners[self.config.data.view].encoder_q
        return knn_recall(encoder.backbone, self.config.data.store, self.config.data.view,
                          length=self.config.data.length, stride=self.config.data.stride,
                          size=self.config.data.size, device=self.device)


def pretrain(config: PretrainConfig, restart: bool = False) -> Path:
    """Run one pretraining stage, or continue the one in ``run.out`` (see :class:`Trainer`); returns the last
    checkpoint."""
    trainer = Trainer(config, restart=restart)
    try:
        return trainer.run()
    finally:
        if dist.is_initialized():
            dist.barrier()
