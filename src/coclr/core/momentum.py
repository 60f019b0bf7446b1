"""The momentum (EMA) key encoder and shuffle-BN, as in MoCo.

The key encoder is a copy of the query encoder whose parameters follow an exponential moving average of
the query encoder's; it is never optimised. Its BatchNorm layers keep their own running statistics.
Shuffle-BN computes the key encoder's BatchNorm statistics on a random subset of the global batch, so a
query and its key never share batch statistics (which would let the model cheat through them).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from coclr.distributed import all_gather_sizes_concat, broadcast_, is_distributed, rank


def momentum_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with ``requires_grad=False`` on every parameter (the initial key encoder)."""
    target = copy.deepcopy(module)
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    return target


@torch.no_grad()
def momentum_update(online: nn.Module, target: nn.Module, m: float = 0.999) -> None:
    """In place: ``target_param = m * target_param + (1 - m) * online_param`` for every parameter.

    Buffers (BatchNorm running statistics) of ``target`` are not averaged: the key encoder keeps its own.
    Parameters are paired in registration order (pass the unwrapped module, not a DDP wrapper, if the two
    differ) and updated with one fused ``torch._foreach_lerp_`` over all of them.
    """
    if not 0.0 <= m <= 1.0:
        raise ValueError(f"momentum m must be in [0, 1], got {m}")
    online_params = list(online.parameters())
    target_params = list(target.parameters())
    if len(online_params) != len(target_params):
        raise ValueError(f"online has {len(online_params)} parameters but target has {len(target_params)}")
    for index, (a, b) in enumerate(zip(online_params, target_params)):
        if a.shape != b.shape:
            raise ValueError(f"parameter {index}: online shape {tuple(a.shape)} != target shape {tuple(b.shape)}")
    torch._foreach_lerp_([p.data for p in target_params], [p.data for p in online_params], 1.0 - m)


@torch.no_grad()
def shuffled_forward(module: nn.Module, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``module(x)`` with shuffle-BN across ranks; returns this rank's outputs, in ``x``'s order, without gradient.

    Under DDP: gather ``x`` from all ranks, draw one permutation of the global batch on rank 0 (from
    ``generator``) and broadcast it, forward this rank's shard of the permuted batch (as many rows as its
    own batch), gather the outputs, undo the permutation and return this rank's rows. BatchNorm statistics
    are thus computed over a random mix of every rank's clips. Ranks may hold different batch sizes.

    In a single process this is a plain ``module(x)``: BatchNorm statistics are then computed over the whole
    key batch, the best a single device can do, and a permutation of that batch would change nothing.
    """
    if not is_distributed():
        return module(x)
    everything, sizes = all_gather_sizes_concat(x)
    total = everything.shape[0]
    if rank() == 0:
        device = generator.device if generator is not None else x.device
        permutation = torch.randperm(total, generator=generator, device=device).to(x.device)
    else:
        permutation = torch.empty(total, dtype=torch.long, device=x.device)
    broadcast_(permutation, src=0)
    start = sum(sizes[: rank()])
    shard = permutation[start : start + x.shape[0]]
    shuffled_out, _ = all_gather_sizes_concat(module(everything[shard]))
    out = torch.empty_like(shuffled_out)
    out[permutation] = shuffled_out
    return out[start : start + x.shape[0]]
