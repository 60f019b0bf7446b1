"""The one contrastive loss shared by InfoNCE, UberNCE, CoCLR and CMC.

All four methods score a query against the same candidates (its own key first, then the queue) and
differ only in which candidates count as positives (:mod:`coclr.core.positives`). The loss therefore takes
``logits [B, N]`` and a boolean ``positive_mask [B, N]``:

- ``form="mil"``, multi-instance NCE (the CoCLR loss, eq. 1 of the paper): the sum over positives is
  *inside* the log, ``-log sum_{p in P} softmax(logits)_p``.
- ``form="supcon"``: the sum is *outside* the log, ``-mean_{p in P} log softmax(logits)_p`` (the form of the
  authors' UberNCE code and of supervised contrastive learning).

With a single positive in column 0 both reduce exactly to InfoNCE, ``cross_entropy(logits, 0)``. An optional
``excluded`` mask leaves candidates out of a row altogether (CoCLR's dropped own key, when it is not to act as a
negative).
"""

from __future__ import annotations

import math
import numbers
from typing import Literal

import torch

from coclr.errors import ConfigError

LossForm = Literal["mil", "supcon"]
Reduction = Literal["mean", "none"]

LOSS_FORMS: tuple[str, ...] = ("mil", "supcon")
REDUCTIONS: tuple[str, ...] = ("mean", "none")


def _check_inputs(logits: torch.Tensor, positive_mask: torch.Tensor, check_values: bool = True) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, N], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a float tensor (similarities over the temperature), got {logits.dtype}")
    if positive_mask.shape != logits.shape:
        raise ValueError(
            f"positive_mask shape {tuple(positive_mask.shape)} differs from logits shape {tuple(logits.shape)}"
        )
    if positive_mask.dtype != torch.bool:
        raise ValueError(f"positive_mask must be bool, got {positive_mask.dtype}")
    if logits.shape[0] == 0:  # (its mean was NaN, silently)
        raise ValueError("logits hold no query (a batch of 0 rows); a loss needs at least one")
    if not check_values:
        return
    has_positive = positive_mask.any(dim=1)
    if not bool(has_positive.all()):
        rows = torch.nonzero(~has_positive).flatten().tolist()
        raise ValueError(f"row(s) {rows[:10]} of positive_mask have no positive; every query needs at least one")


def multi_positive_nce(
    logits: torch.Tensor,
    positive_mask: torch.Tensor,
    form: LossForm = "mil",
    reduction: Reduction = "mean",
    excluded: torch.Tensor | None = None,
    check_masks: bool = True,
) -> torch.Tensor:
    """Contrastive loss of queries with one or more positives among their candidates.

    Args:
        logits: ``[B, N]`` similarities divided by the temperature; every column is in the denominator.
        positive_mask: ``[B, N]`` bool, True where a candidate is a positive; every row needs one.
        form: ``"mil"`` (multi-instance NCE, ``-log`` of the summed positive probability, computed as
            ``logsumexp(positives) - logsumexp(all)``) or ``"supcon"`` (mean of ``-log softmax`` over the
            positives).
        reduction: ``"mean"`` over the batch, or ``"none"`` for the per-row losses ``[B]``.
        excluded: optional ``[B, N]`` bool, True where a candidate takes no part in the row's loss (neither
            positive nor in the denominator); it must not mark a positive.
        check_masks: check the masks' values (every row has a positive, no excluded positive). Reading the result
            waits for the device (a host synchronisation on GPUs); callers whose masks hold these properties by
            construction, as the training step's, pass False. Shapes and dtypes are always checked.

    Raises:
        ValueError: on shape or dtype mismatch, an excluded positive, or naming the rows that have no positive.
        ConfigError: for an unknown ``form`` or ``reduction``.
    """
    if form not in LOSS_FORMS:
        raise ConfigError(f"loss form {form!r} is not one of {LOSS_FORMS}")
    if reduction not in REDUCTIONS:
        raise ConfigError(f"loss reduction {reduction!r} is not one of {REDUCTIONS}")
    _check_inputs(logits, positive_mask, check_masks)
    if logits.dtype in (torch.float16, torch.bfloat16):  # thousands of columns summed in 8 bits of mantissa: the
        logits = logits.float()  # loss was off by a tenth of a nat; computed in float32, as the training's logits are
    if excluded is not None:
        if excluded.shape != logits.shape or excluded.dtype != torch.bool:
            raise ValueError(f"excluded must be a bool tensor of shape {tuple(logits.shape)}, got "
                             f"{excluded.dtype} {tuple(excluded.shape)}")
        if check_masks and bool((excluded & positive_mask).any()):
            raise ValueError("excluded marks a positive; a candidate cannot be both")
        logits = logits.masked_fill(excluded, float("-inf"))

    log_normaliser = torch.logsumexp(logits, dim=1)
    if form == "mil":
        positive_logits = logits.masked_fill(~positive_mask, float("-inf"))
        per_row = log_normaliser - torch.logsumexp(positive_logits, dim=1)
    else:
        log_prob = logits - log_normaliser[:, None]
        summed = torch.where(positive_mask, log_prob, torch.zeros_like(log_prob)).sum(dim=1)
        per_row = -summed / positive_mask.sum(dim=1).to(logits.dtype)
    return per_row.mean() if reduction == "mean" else per_row


def logits_from(q: torch.Tensor, k: torch.Tensor, queue_keys: torch.Tensor, tau: float | torch.Tensor
                ) -> torch.Tensor:
    """Logits ``[B, 1+K]`` of queries against their own key (column 0) and the queue (columns 1..).

    ``logits = [q . k_own, q . queue^T] / tau``: negatives come only from the queue, never from the other
    rows of the batch (as in MoCo and the authors' code). ``q`` and ``k`` are ``[B, D]``, ``queue_keys``
    ``[K, D]``; all are expected L2-normalised. The logits are computed in float32 whatever the inputs' dtype
    and the autocast state (:func:`float32_scores`). For CMC, concatenate this for the own view and the other
    view along dim 1. ``tau``: a number, or a 0-dim float tensor (a learnt temperature: its gradient flows).
    """
    if q.shape != k.shape or q.dim() != 2:
        raise ValueError(f"q and k must both be [B, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    if queue_keys.dim() != 2 or queue_keys.shape[1] != q.shape[1]:
        raise ValueError(f"queue_keys must be [K, {q.shape[1]}], got {tuple(queue_keys.shape)}")
    learnt = isinstance(tau, torch.Tensor) and tau.dim() == 0 and tau.is_floating_point()  # (kept in the graph)
    value = float(tau.detach()) if learnt else tau
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
        kind = (f"a {tau.dtype} tensor of shape {tuple(tau.shape)}"
                + (f" holding {float(tau.detach().reshape(-1)[0]):g}" if tau.numel() == 1 else "")
                if isinstance(tau, torch.Tensor) else repr(tau))
        raise ValueError(f"tau (the temperature) must be a positive number or a 0-dim float tensor, got "
                         f"{kind}")  # (0: inf, < 0: negated)
    tau = tau if learnt else float(tau)
    with float32_scores(q):
        own = (q.float() * k.float()).sum(dim=1, keepdim=True)
        return torch.cat([own, similarity(q, queue_keys)], dim=1) / tau


def float32_scores(reference: torch.Tensor) -> torch.autocast:
    """A context in which autocast is off on ``reference``'s device: scores computed inside stay float32.

    Under bf16 autocast a dot product of unit vectors is rounded to 8 bits of mantissa (errors up to ~0.004,
    0.04 after the temperature), enough to reorder near-equal candidates; the logits and the mined positives
    are what the methods differ in, so they are computed in float32 whatever the encoders run in.
    """
    return torch.autocast(device_type=reference.device.type, enabled=False)


def similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[N, M]`` float32 dot products of the rows of ``a [N, D]`` with those of ``b [M, D]``, autocast or not."""
    with float32_scores(a):
        return a.float() @ b.float().T
