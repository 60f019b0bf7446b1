"""A first-in first-out queue of momentum keys and what is known about each key clip.

The queue supplies the negatives of every method and, through its extra fields, the positives of UberNCE
(``labels``), of CoCLR (``other``: the other view's embedding of each key clip, and ``groups``: source-video
ids of sibling clips) and bookkeeping (``video_ids``).
"""

from __future__ import annotations

import torch
from torch import nn

from coclr.config import whole_number
from coclr.distributed import all_gather_concat

UNKNOWN = -1
"""Value of ``labels``, ``video_ids`` and ``groups`` for slots never written or written without the field."""


class MomentumQueue(nn.Module):
    """Ring buffer of the last ``size`` keys, identical on every rank and saved in checkpoints.

    State (all persistent buffers, so ``state_dict`` saves and restores it exactly):

    - ``keys`` ``[K, D]`` float: the keys, initialised random and L2-normalised (as in MoCo), so the first
      iterations have negatives before anything was written.
    - ``labels``, ``video_ids``, ``groups`` ``[K]`` long: class label, video index and source-group id of each
      key clip; ``-1`` when unknown or never written.
    - ``other`` ``[K, other_dim]`` float: the other view's embedding of each key clip: zeros until written where
      it is mined in (CoCLR: unwritten slots are never candidates), random and L2-normalised like ``keys`` where
      it is contrasted against (``contrasted_other``, CMC: the other view's negatives before anything was written).
    - ``ptr`` long scalar: the slot the next key goes to.
    - ``full`` bool scalar: True once every slot has been written at least once.

    :meth:`is_full` answers from the host: the number of rows written is known there, so a training step need not
    wait for the device to learn whether the queue is full (the buffers are read once after loading a state).

    Slots are written in order ``0, 1, ..., K-1, 0, ...``, so before the queue is full the written slots
    are exactly ``[0, ptr)``. Because keys are gathered from all ranks before writing, the state depends
    only on the global batches, not on how they were split over processes.

    Args:
        size: number of slots ``K`` (any positive number; it need not divide the batch size).
        dim: key dimension ``D``.
        other_dim: dimension of the other-view embedding (0 when unused).
        generator: random generator for the initial keys (for reproducible initialisation).
        contrasted_other: whether ``other`` holds candidates of the loss (CMC), so starts random like ``keys``.
    """

    keys: torch.Tensor
    labels: torch.Tensor
    video_ids: torch.Tensor
    groups: torch.Tensor
    other: torch.Tensor
    ptr: torch.Tensor
    full: torch.Tensor

    def __init__(self, size: int, dim: int, other_dim: int = 0, generator: torch.Generator | None = None,
                 contrasted_other: bool = False) -> None:
        super().__init__()
        if not all(map(whole_number, (size, dim, other_dim))) or size < 1 or dim < 1 or other_dim < 0:
            raise ValueError(f"MomentumQueue needs size >= 1, dim >= 1, other_dim >= 0; got {size}, {dim}, {other_dim}")
        self.size = size
        self.dim = dim
        self.other_dim = other_dim
        keys = torch.randn(size, dim, generator=generator)
        self.register_buffer("keys", nn.functional.normalize(keys, dim=1))
        self.register_buffer("labels", torch.full((size,), UNKNOWN, dtype=torch.long))
        self.register_buffer("video_ids", torch.full((size,), UNKNOWN, dtype=torch.long))
        self.register_buffer("groups", torch.full((size,), UNKNOWN, dtype=torch.long))
        other = torch.zeros(size, other_dim)
        if contrasted_other and other_dim:
            other = nn.functional.normalize(torch.randn(size, other_dim, generator=generator), dim=1)
        self.register_buffer("other", other)
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("full", torch.zeros((), dtype=torch.bool))
        self._host_state: tuple[int, bool] | None = (0, False)
        """``(ptr, full)`` as known on the host; None after a state was loaded (read on the next is_full)."""

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}, other_dim={self.other_dim}"

    def is_full(self) -> bool:
        """``full`` as a Python bool, followed on the host through every enqueue: no device read, except once after
        a state was loaded into the buffers."""
        if self._host_state is None:
            self._host_state = (int(self.ptr), bool(self.full))
        return self._host_state[1]

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._host_state = None

    @property
    def valid(self) -> torch.Tensor:
        """Bool ``[K]``: slots written at least once (all of them once ``full``)."""
        return self.full | (torch.arange(self.size, device=self.ptr.device) < self.ptr)

    def _field(self, name: str, value: torch.Tensor | None, rows: int) -> torch.Tensor:
        """A ``[rows]`` long field, ``-1`` when missing; checked before any collective starts."""
        device = self.keys.device
        if value is None:
            return torch.full((rows,), UNKNOWN, dtype=torch.long, device=device)
        if value.shape != (rows,):
            raise ValueError(f"enqueue: {name} must have shape ({rows},), got {tuple(value.shape)}")
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:  # (1.7 was stored as 1)
            raise ValueError(f"enqueue: {name} must be whole numbers (an integer dtype), got {value.dtype}")
        return value.to(device=device, dtype=torch.long)

    @torch.no_grad()
    def enqueue(
        self,
        keys: torch.Tensor,
        labels: torch.Tensor | None = None,
        video_ids: torch.Tensor | None = None,
        groups: torch.Tensor | None = None,
        other: torch.Tensor | None = None,
    ) -> None:
        """Gather this batch from all ranks and write it at ``ptr``, wrapping around.

        Missing ``labels``, ``video_ids`` or ``groups`` are written as ``-1``. ``other`` is required exactly
        when ``other_dim > 0`` (a missing one would later be mined as if it were an embedding). If the
        gathered batch is larger than the queue, only its last ``K`` entries remain. All ranks must call
        this together.
        """
        rows = keys.shape[0]
        if keys.dim() != 2 or keys.shape[1] != self.dim:
            raise ValueError(f"enqueue: keys must be [B, {self.dim}], got {tuple(keys.shape)}")
        if self.other_dim > 0 and other is None:
            raise ValueError(
                f"enqueue: this queue stores other-view embeddings (other_dim={self.other_dim}); pass other"
            )
        if other is None:
            other = self.other.new_zeros((rows, 0))
        if other.shape != (rows, self.other_dim):
            raise ValueError(f"enqueue: other must be [{rows}, {self.other_dim}], got {tuple(other.shape)}")
        # Two collectives per call: the floats side by side, the long fields side by side.
        floats = torch.cat([keys.to(self.keys), other.to(self.other)], dim=1)
        longs = torch.stack(
            [self._field(n, v, rows) for n, v in (("labels", labels), ("video_ids", video_ids), ("groups", groups))],
            dim=1,
        )
        floats, longs = all_gather_concat(floats), all_gather_concat(longs)
        self._write(floats[:, : self.dim], floats[:, self.dim :], longs)

    def _write(self, keys: torch.Tensor, other: torch.Tensor, longs: torch.Tensor) -> None:
        total = keys.shape[0]
        kept = min(total, self.size)
        # Entry i of the batch goes to slot (ptr + i) % K; of a batch larger than K, the last K survive.
        offsets = torch.arange(total - kept, total, device=self.ptr.device)
        slots = (self.ptr + offsets) % self.size
        self.keys.index_copy_(0, slots, keys[total - kept :])
        self.other.index_copy_(0, slots, other[total - kept :])
        self.labels.index_copy_(0, slots, longs[total - kept :, 0])
        self.video_ids.index_copy_(0, slots, longs[total - kept :, 1])
        self.groups.index_copy_(0, slots, longs[total - kept :, 2])
        self.full |= self.ptr + total >= self.size
        self.ptr.copy_((self.ptr + total) % self.size)
        if self._host_state is not None:
            ptr, full = self._host_state
            self._host_state = ((ptr + total) % self.size, full or ptr + total >= self.size)
