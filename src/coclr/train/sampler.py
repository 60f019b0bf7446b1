"""The order in which training videos are visited: seeded per epoch, split across processes, resumable.

Each epoch visits a permutation of the videos drawn from ``(seed, epoch)``. Consecutive global batches of
``batch_size x world_size`` videos are cut from it, and process ``r`` takes the ``r``-th contiguous slice of
each, so the keys gathered from all processes come in the same order as in one process with the global batch.
Resuming skips the videos already consumed in the epoch, counted globally, so a run can continue on a
different number of processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from coclr.seeding import generator


class ResumableSampler(Sampler[int]):
    """Indices for one process; ``set_epoch(epoch, consumed)`` selects the epoch and the resume position."""

    def __init__(self, num_samples: int, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1):
        if num_samples < batch_size * world_size:
            raise ValueError(f"{num_samples} training videos are fewer than one global batch "
                             f"({batch_size} x {world_size} processes)")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.consumed = 0

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def batches_per_epoch(self) -> int:
        """Full global batches per epoch (the remainder of the permutation is dropped)."""
        return self.num_samples // self.global_batch

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Visit ``epoch``'s permutation from position ``consumed`` (videos already used by all processes)."""
        self.epoch = epoch
        self.consumed = consumed

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.num_samples, generator=generator(self.seed, self.epoch))
        usable = self.batches_per_epoch * self.global_batch
        remaining = order[self.consumed : usable]
        remaining = remaining[: len(remaining) // self.global_batch * self.global_batch]
        batches = remaining.view(-1, self.world_size, self.batch_size)[:, self.rank]
        return iter(batches.reshape(-1).tolist())

    def __len__(self) -> int:
        remaining = max(0, self.batches_per_epoch * self.global_batch - self.consumed)
        return remaining // self.global_batch * self.batch_size


class EpochItems(Sampler[tuple[int, int]]):
    """The items of a :class:`ResumableSampler` as ``(epoch, index)`` pairs, so that DataLoader workers that live
    across epochs read every item for the epoch the sampler is at (``TrainClips`` takes such pairs)."""

    def __init__(self, order: ResumableSampler):
        self.order = order

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.order.epoch
        return ((epoch, index) for index in self.order)

    def __len__(self) -> int:
        return len(self.order)
