"""The pretraining loop: one trainer for every method and view, on one process or many (torchrun).

The trainer runs the loop only: :func:`coclr.train.setup.setup_run` has picked the device, joined the processes
and checked the run folder before it (:func:`coclr.train.run.pretrain`), and :mod:`coclr.train.model` builds
the networks.

Under ``torchrun`` every process reads its own slice of each global batch (:class:`ResumableSampler`), keys
are gathered before they are queued, the key forward uses shuffle-BN, and rank 0 writes checkpoints and
logs. Randomness is derived from ``(seed, epoch, step)`` rather than carried in generators, so a run killed
at any moment and resumed from its last checkpoint continues exactly as if uninterrupted on the same number of
processes, and on another number with the same global batch, clips and order (not bit for bit: BatchNorm's
statistics in training are each process's own batch's). Interrupted (SIGINT, SIGTERM: :mod:`coclr.interrupts`),
it stops at once and says which checkpoint is kept and how many steps after it will be trained again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter

from coclr import seeding
from coclr.atomic import atomic_duplicate, atomic_torch_save, atomic_write_text, read_json_lines
from coclr.config import to_dict
from coclr.cpu import arithmetic, arithmetic_changes
from coclr.data.batch_decode import collate_clips, decode_batch
from coclr.distributed import is_main, mean_where_defined
from coclr.errors import CheckpointError, CoclrError
from coclr.eval.monitor import knn_recall
from coclr.interrupts import deferred_interrupts, interrupted, loader_worker_signals
from coclr.progress import bar as progress_bar
from coclr.progress import duration
from coclr.threads import reuse_freed_memory
from coclr.train.checkpoint import TRAIN_FORMAT, load_checkpoint, rng_state
from coclr.train.learner import Targets
from coclr.train.sampler import EpochItems
from coclr.train.setup import (
    BEST,
    LAST,
    RunParts,
    log_line,
    warn_queue_of_own_keys,
    warn_short_instances,
    warn_warmup_past_the_end,
)


class NonFiniteLossError(CoclrError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class Position:
    """Where training stands: ``consumed`` videos of ``epoch`` have been used by all processes together; and what
    the epoch's record needs of its steps so far (their summed loss, the mean over processes; their number; their
    seconds), so that a run resumed mid-epoch logs, schedules and keeps its best checkpoint by the same epoch loss
    as a run that was not stopped."""

    epoch: int = 0
    consumed: int = 0
    global_step: int = 0
    loss_sum: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    first_step: int | None = None
    """The iteration (``global_step``) of the run's first optimiser step, from which the warm-up and the own-key
    epochs count (CoCLR takes none while its queue fills); None: none yet."""

    def where(self) -> str:
        """Where it stands, in the words of the epochs' lines (counted from 1)."""
        if self.consumed:
            return f"epoch {self.epoch + 1}, {self.consumed} videos into it"
        return f"the end of epoch {self.epoch}" if self.epoch else "the start"


def train_loader_worker(worker_id: int = 0) -> None:
    """The training loader's workers (its ``worker_init_fn``): SIGTERM ends one cleanly
    (:func:`coclr.interrupts.loader_worker_signals`), and its freed memory is kept for its next batches
    (:func:`coclr.threads.reuse_freed_memory`: each batch's decoded and augmented clips are large arrays made
    afresh)."""
    loader_worker_signals(worker_id)
    reuse_freed_memory()


def step_generator(seed: int, epoch: int, step: int) -> torch.Generator:
    """The generator of one iteration's augmentation and own-key dropout: the same on every process."""
    return seeding.generator(seed, epoch, step)


POSITION_KEYS = tuple(field.name for field in dataclasses.fields(Position))
"""What a checkpoint's ``"position"`` holds."""

RECENT_EPOCHS = 5
"""The epochs whose mean step time sets the pace of the rest of a run (:func:`run_left`): recent ones, as the first
pays for warming up."""


def run_left(step_seconds: list[float], steps_per_epoch: int, epoch: int, epochs: int, done_in_epoch: int,
             step: int, max_steps: int, check_seconds: Sequence[float] = (), check_every: int = 0) -> float | None:
    """Seconds the run has left: its steps left (to the last epoch, or to ``max_steps`` when that comes first) at the
    mean seconds a step of the last :data:`RECENT_EPOCHS` epochs trained (``step_seconds``, one per epoch), and the
    checks left after the epochs it ends (every ``check_every`` epochs: the kNN monitor) at the mean of the last ones
    (``check_seconds``); None before a step was timed."""
    if not step_seconds:
        return None
    steps = max(0, (epochs - epoch) * steps_per_epoch - done_in_epoch)
    last_epoch = epochs
    if max_steps:
        steps = min(steps, max(0, max_steps - step))
        last_epoch = min(epochs, max_steps // max(1, steps_per_epoch))
    recent = step_seconds[-RECENT_EPOCHS:]
    left = steps * sum(recent) / len(recent)
    if check_every and check_seconds:
        checks = max(0, last_epoch // check_every - epoch // check_every)  # (after epochs epoch+1 .. last_epoch)
        recent = list(check_seconds)[-RECENT_EPOCHS:]
        left += checks * sum(recent) / len(recent)
    return left


MIN_MINING_SPREAD = 1e-3
"""A sampler's queued embeddings (unit vectors) all within this distance of their mean embed every clip alike."""


class Trainer:
    """Runs the loop of one pretraining stage over the parts it is handed (:class:`~coclr.train.setup.RunParts`,
    built by :func:`~coclr.train.setup.build_parts` in :func:`~coclr.train.run.start_run`, which holds the run
    folder while it runs); ``run()`` returns the path of the last checkpoint. A run folder that holds a run
    continues from its last checkpoint.
    """

    def __init__(self, parts: RunParts):
        setup = parts.setup
        config = self.config = setup.config
        self.device, self.rank, self.world = setup.device, setup.rank, setup.world
        self.out = Path(config.run.out)
        self.progress_label = ""
        """Shown before the epoch in the progress bar (the pipeline names its stage)."""
        self.decode = parts.decode
        """Where frames are decoded: "workers" (DataLoader workers) or "device" (this process, batch by batch)."""
        self.dataset = parts.dataset
        self.clip_settings = parts.clip_settings
        """What each view's encoder is trained on, recorded in every checkpoint."""
        self.data_order = parts.data_order
        self.model = parts.model
        self.ddp = parts.ddp
        self.optimizer, self.scheduler, self.scaler = parts.optimizer, parts.scheduler, parts.scaler
        self.augment = parts.augment
        self.position = Position()
        self.saved: Position | None = None
        """The position of the checkpoint in the run folder (None: none yet)."""
        self.best_loss = math.inf
        self.lr_factor = 1.0
        """The share of the scheduled lr the last iteration stepped with (warm-up; 0: it took no step)."""
        self.step_seconds: list[float] = []
        """The seconds a step of each epoch this process trained (what :func:`run_left` paces the rest by)."""
        self.check_seconds: list[float] = []
        """The seconds each kNN check of this process took (what :func:`run_left` paces the checks left by)."""
        if (self.out / LAST).is_file():
            self._load(self.out / LAST)
        elif is_main():  # (said when the run starts, not again as it continues)
            warn_queue_of_own_keys(config, len(self.dataset))
            warn_warmup_past_the_end(config, self.data_order.batches_per_epoch, self.data_order.global_batch)
            warn_short_instances(config, self.dataset.segments[:, 2].tolist())

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
            "encoders": {v: {"arch": dict(learner.encoder_q.arch), "backbone": learner.encoder_q.backbone.state_dict(),
                             "head": learner.encoder_q.head.state_dict(),
                             "clip_settings": self.clip_settings[v]}
                         for v, learner in self.model.learners.items()},
            "config": to_dict(self.config),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "position": dataclasses.asdict(self.position),
            "best_loss": self.best_loss,
            "world_size": self.world,
            "videos": len(self.dataset),
            "arithmetic": arithmetic(self.device),
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
        pos = ckpt["position"]  # (a checkpoint from before the epoch's steps were kept: their loss from here on)
        self.position = Position(**{key: pos[key] for key in POSITION_KEYS if key in pos})
        if "first_step" not in pos:  # (a checkpoint from before it was kept counted from the run's first iteration)
            self.position.first_step = 0
        self.saved = dataclasses.replace(self.position)
        self.best_loss = ckpt["best_loss"]
        self._log_line(f"resumed from {path} at {self.position.where()} (step {self.position.global_step})")
        if is_main() and self.position.epoch < self.config.optim.epochs:  # (a run with nothing left to train: silent)
            for change in arithmetic_changes(ckpt.get("arithmetic"), arithmetic(self.device), ckpt.get("world_size"),
                                             self.world):
                warnings.warn(f"{path}: {change}", stacklevel=2)
        trained = ckpt.get("videos")  # (a checkpoint from before it was recorded: not known)
        if isinstance(trained, int) and trained != len(self.dataset) and is_main():
            why = ("videos left out since, e.g. found damaged" if len(self.dataset) < trained
                   else "videos added to the store since, or the store replaced")
            warnings.warn(f"{path}: the run trained on {trained} instances and continues on {len(self.dataset)} "
                          f"({why}): from here its order and steps per epoch are not those of the run it would have "
                          "been uninterrupted", stacklevel=2)

    def save(self, best: bool = False) -> None:
        """Write the checkpoint (the main process; every process records where it stands: :meth:`kept`). An
        interruption waits until both are done: raised as the file was renamed into place, it said "no checkpoint
        yet" (or named the one before) beside the checkpoint it had just written. A best checkpoint is written as
        the best first, then as the last: a kill between the two leaves the last one before it, which continues
        into this best again (the other way, the last already held the new best loss, and the best stayed behind
        or missing for good)."""
        with deferred_interrupts():
            if is_main():
                if best:
                    atomic_torch_save(self.state(), self.out / BEST)
                    atomic_duplicate(self.out / BEST, self.out / LAST)
                else:
                    atomic_torch_save(self.state(), self.out / LAST)
            self.saved = dataclasses.replace(self.position)

    # ------------------------------------------------------------------ logging

    def _log_line(self, text: str) -> None:
        log_line(text)

    def _open_logs(self):
        if not is_main():
            return None, None

        self.out.mkdir(parents=True, exist_ok=True)
        log_path = self.out / "log.jsonl"
        if log_path.exists():  # drop records past the checkpoint we resumed from (an epoch's end it did not reach
            kept = [record for record in read_json_lines(log_path)  # included), and a line a kill cut short
                    if record.get("step", 0) <= self.position.global_step
                    and not ("epoch_loss" in record and record.get("epoch", 0) > self.position.epoch)]
            atomic_write_text(log_path, "".join(json.dumps(record) + "\n" for record in kept))
        if self.position.epoch >= self.config.optim.epochs or self._done():  # nothing left to log: no new
            return log_path.open("a"), None  # TensorBoard file (each rerun of a finished run added an empty one)
        with deferred_interrupts():  # see _write
            return log_path.open("a"), SummaryWriter(str(self.out / "tb"), purge_step=self.position.global_step + 1)

    def _write(self, record: dict[str, Any], jsonl, writer) -> None:
        """One record to ``log.jsonl`` and TensorBoard. An interruption waits for the record to be written
        (:func:`~coclr.interrupts.deferred_interrupts`): raised inside TensorBoard's writer it can leave the
        writer's queue or thread in a state where closing it then waits for ever (seen: a stopped ``coclr task``
        that did not exit)."""
        if jsonl is None:
            return
        with deferred_interrupts():
            jsonl.write(json.dumps(record) + "\n")
            jsonl.flush()
            for name, value in record.items() if writer is not None else ():
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
        stepping = queue_full or not self.config.method.waits
        if stepping and pos.first_step is None:
            pos.first_step = pos.global_step
        stepped = pos.global_step - pos.first_step if pos.first_step is not None else 0  # optimiser steps before
        step = pos.consumed // self.data_order.global_batch
        step_gen = step_generator(self.config.run.seed, pos.epoch, step)
        batch = decode_batch(batch, self.device)
        query, key = self._batch_views(batch, step_gen)
        targets = Targets(batch["label"].to(self.device, non_blocking=True),
                          batch["video"].to(self.device, non_blocking=True),
                          batch["group"].to(self.device, non_blocking=True))
        with self._autocast():
            loss, stats = self.ddp(query, key, targets, step_gen, self.keeps_own_key(stepped),
                                   seeding.generator(self.config.run.seed, pos.epoch, step, seeding.SHUFFLE))
        self.optimizer.zero_grad(set_to_none=True)
        self.lr_factor = 0.0  # (no step taken: the lr it logs)
        if stepping:
            self.scaler.scale(loss).backward()
            factor = self.lr_factor = self.warmup_factor(stepped)
            scheduled = [group["lr"] for group in self.optimizer.param_groups]
            for group, lr in zip(self.optimizer.param_groups, scheduled):
                group["lr"] = lr * factor
            self.scaler.step(self.optimizer)
            for group, lr in zip(self.optimizer.param_groups, scheduled):  # the scheduler owns the lr
                group["lr"] = lr
            self.scaler.update()
        return loss.detach(), stats

    def keeps_own_key(self, iteration: int) -> bool:
        """Whether optimiser step ``iteration`` (0-based, of this run: :attr:`Position.first_step`) keeps every own
        key a positive: during the first ``method.own_positive_epochs`` epochs of iterations."""
        return iteration < self.config.method.own_positive_epochs * self.data_order.batches_per_epoch

    def warmup_factor(self, iteration: int) -> float:
        """The share of the scheduled lr that optimiser step ``iteration`` (0-based, of this run:
        :attr:`Position.first_step`) uses: (i + 1) / warm-up iterations during ``optim.warmup_epochs``, then 1.
        Saved iteration counts make resuming continue the warm-up where it stopped."""
        iterations = self.config.optim.warmup_epochs * self.data_order.batches_per_epoch
        return min(1.0, (iteration + 1) / iterations) if iterations > 0 else 1.0

    def run(self) -> Path:
        """Train until ``optim.epochs`` (or ``run.max_steps``); returns the last checkpoint."""
        config = self.config
        workers = config.data.workers
        loader = DataLoader(self.dataset, batch_size=config.run.batch_size, sampler=EpochItems(self.data_order),
                            num_workers=workers, collate_fn=collate_clips, pin_memory=self.device.type == "cuda",
                            persistent_workers=workers > 0, prefetch_factor=4 if workers else None, drop_last=True,
                            worker_init_fn=train_loader_worker)
        jsonl, writer = self._open_logs()
        queue_full = self.model.queues_full
        nonfinite = torch.zeros((), dtype=torch.bool, device=self.device)
        steps_per_epoch = self.data_order.batches_per_epoch
        instances = (f"{len(self.dataset)} instances ({len(self.dataset.entries)} videos in stretches)"
                     if config.data.segment_frames is not None else f"{len(self.dataset)} videos")
        self._log_line(f"{config.method.name} on {'+'.join(self.model.learners)}: {instances}, "
                       f"{steps_per_epoch} iterations/epoch, {self.world} process(es), device {self.device}")
        try:
            while self.position.epoch < config.optim.epochs and not self._done():
                epoch = self.position.epoch
                self.dataset.set_epoch(epoch)
                self.data_order.set_epoch(epoch, self.position.consumed)
                self._set_train_mode()
                progress = self._progress(steps_per_epoch)
                epoch_loss = torch.tensor(self.position.loss_sum, device=self.device)  # a resumed epoch's steps
                epoch_steps = self.position.steps
                started = time.time() - self.position.seconds
                for batch in loader:
                    loss, stats = self.train_step(batch, queue_full)
                    nonfinite |= ~torch.isfinite(loss)
                    epoch_loss += loss
                    epoch_steps += 1
                    self.position.consumed += self.data_order.global_batch
                    self.position.global_step += 1
                    if not queue_full:
                        queue_full = self.model.queues_full
                        if queue_full:
                            self._check_mining_space()
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
                        self._hold_epoch(epoch_loss, epoch_steps, started)
                        self.save()
                    if self._done():
                        break
                if progress is not None:
                    progress.close()
                self._check_finite(nonfinite)
                if self.position.consumed >= steps_per_epoch * self.data_order.global_batch:
                    self._end_epoch(epoch_loss, epoch_steps, time.time() - started, jsonl, writer)
                else:
                    self._hold_epoch(epoch_loss, epoch_steps, started)
                    self.save()
        except KeyboardInterrupt as error:  # the steps since the checkpoint are lost: say which one is kept
            raise interrupted(error, self.kept()) from None
        finally:
            if jsonl is not None:
                with deferred_interrupts():  # see _write
                    jsonl.close()
                    if writer is not None:
                        writer.close()
        return self.out / LAST

    def kept(self) -> str:
        """What a stop now keeps of the run: its checkpoint (where it stands, and the steps done after it, which
        the same command trains again), or nothing yet."""
        saved = self.saved
        if saved is None:
            return f"{self.out}: no checkpoint yet (the first comes after epoch 1, or after run.save_every steps)"
        if not is_main():  # (rank 0 writes it: stopped first, it may not have written the one this rank counts)
            return f"{self.out / LAST} kept, as rank 0 last wrote it (the same command continues from it)"
        redo = self.position.global_step - saved.global_step
        since = f"; the {redo} steps after it are trained again" if redo else ""
        return f"{self.out / LAST} kept ({saved.where()}, step {saved.global_step}){since}"

    @property
    def finished(self) -> bool:
        """All configured epochs are done (false when ``run.max_steps`` stopped the run early)."""
        return self.position.epoch >= self.config.optim.epochs

    def _done(self) -> bool:
        return bool(self.config.run.max_steps) and self.position.global_step >= self.config.run.max_steps

    def _progress(self, steps_per_epoch: int):
        """The epoch's bar: drawn on rank 0 with ``run.progress``; a job that observes its parts sees its steps
        either way (:mod:`coclr.progress`)."""
        if not is_main():
            return None
        done = self.position.consumed // self.data_order.global_batch
        label = f"{self.progress_label}: " if self.progress_label else ""
        return progress_bar(total=steps_per_epoch, initial=done, desc=f"{label}epoch {self.position.epoch + 1}/"
                            f"{self.config.optim.epochs}{self._left(steps_per_epoch)}", unit="it",
                            dynamic_ncols=True, leave=False, disable=not self.config.run.progress)

    def _left(self, steps_per_epoch: int) -> str:
        """The run's time left, as the bar and each epoch's line say it ("" before an epoch has been timed, and once
        nothing is left)."""
        left = run_left(self.step_seconds, steps_per_epoch, self.position.epoch, self.config.optim.epochs,
                        self.position.consumed // self.data_order.global_batch, self.position.global_step,
                        self.config.run.max_steps, self.check_seconds, self.config.run.knn_every)
        return "" if not left else f", about {duration(left)} left"

    def _check_mining_space(self) -> None:
        """Once, as the queues fill: a frozen sampler that embeds every clip alike (a collapsed encoder, or one whose
        BatchNorm statistics never settled) makes CoCLR's top-K the first queue slots, and the run mined at random
        with normal-looking figures; said in one warning."""
        if self.model.sampler is None or not is_main():
            return
        for learner in self.model.learners.values():
            other = learner.queue.other.float()
            if other.numel() == 0:
                continue
            spread = float((other - other.mean(dim=0)).norm(dim=1).max())  # (unit rows: 0 when every one is alike)
            if spread < MIN_MINING_SPREAD:
                warnings.warn(f"method.sampler_checkpoint {self.config.method.sampler_checkpoint}: it embeds every "
                              f"clip of the full queue alike (rows within {spread:.1e} of their mean): the positives "
                              "it mines are arbitrary; give a sampler that has learnt (check it with coclr eval "
                              "retrieval), or train its view longer", stacklevel=2)
                return

    def _check_finite(self, nonfinite: torch.Tensor) -> None:
        if bool(nonfinite):
            kept = (f"the last good checkpoint is kept in {self.out / LAST}" if self.saved is not None
                    else "no checkpoint was saved yet")
            raise NonFiniteLossError(
                f"the loss became NaN or infinite before step {self.position.global_step}; stopped, {kept} (try a "
                "lower optim.lr, a higher method.temperature, or run.amp=none)")

    def _record(self, loss: torch.Tensor, stats: dict[str, torch.Tensor]) -> dict[str, Any]:
        values = torch.stack([loss.float(), *(v.float() for v in stats.values())])
        if self.world > 1:
            values = mean_where_defined(values)
        values = values.tolist()
        record = {"step": self.position.global_step, "epoch": self.position.epoch, "loss": values[0],
                  "lr": self.optimizer.param_groups[0]["lr"] * self.lr_factor}
        # A statistic undefined at this step (NaN: mined precision with nothing mined of a known class) is left out
        record.update((name, value) for name, value in zip(stats.keys(), values[1:]) if math.isfinite(value))
        return record

    def _hold_epoch(self, epoch_loss: torch.Tensor, steps: int, started: float) -> None:
        """Keep the epoch's steps so far in the position a checkpoint saves (every process calls it: the loss is
        their mean, which each process starts from when resumed)."""
        total = epoch_loss.detach().float().clone()
        if self.world > 1:
            dist.all_reduce(total)
            total /= self.world
        self.position.loss_sum, self.position.steps = float(total), steps
        self.position.seconds = time.time() - started

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
            checked = time.perf_counter()
            record.update(self._knn())
            self.check_seconds.append(time.perf_counter() - checked)
        self._write(record, jsonl, writer)
        self.step_seconds.append(seconds / max(steps, 1))
        self.position = Position(epoch + 1, 0, self.position.global_step, first_step=self.position.first_step)
        knn = "".join(f", {k} {v:.1f}" for k, v in record.items() if k.startswith("knn"))
        self._log_line(f"epoch {epoch + 1}/{self.config.optim.epochs}: loss {mean_loss:.4f} "
                       f"({seconds:.1f} s{self._left(self.data_order.batches_per_epoch)}){knn}")
        improved = mean_loss < self.best_loss
        self.best_loss = min(self.best_loss, mean_loss)
        self.save(best=improved)

    def _knn(self) -> dict[str, float]:
        """R@1 of test videos retrieving train videos with the trained encoder (labels used only here)."""

        encoder = self.model.learners[self.config.data.view].encoder_q
        return knn_recall(encoder.backbone, self.config.data.store, self.config.data.view,
                          length=self.config.data.length, stride=self.config.data.stride,
                          size=self.config.data.size, device=self.device)


