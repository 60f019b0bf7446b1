"""Which candidates are positives: the only thing that differs between InfoNCE, UberNCE, CoCLR and CMC.

Every method scores a query against its own key and the queue with the same loss
(:func:`coclr.core.loss.multi_positive_nce`). The methods differ only in the positive set: these are the rules,
pure functions of tensors, and :mod:`coclr.core.methods` says which method uses which.

Every rule returns a bool mask ``[B, 1+K]``: column 0 is the own key, columns ``1..K`` the queue entries in
storage order (CMC: ``[B, 2(1+K)]``, the own-view candidates then the other-view candidates).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from coclr.config import whole_number
from coclr.core.loss import similarity


def _with_own_key(queue_positives: torch.Tensor) -> torch.Tensor:
    """Prepend the always-positive own-key column to a ``[B, K]`` mask."""
    own = torch.ones(queue_positives.shape[0], 1, dtype=torch.bool, device=queue_positives.device)
    return torch.cat([own, queue_positives], dim=1)


def instance_positives(batch_size: int, queue_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """InfoNCE: only the own key (column 0) is positive; every queue entry is a negative."""
    mask = torch.zeros(batch_size, 1 + queue_size, dtype=torch.bool, device=device)
    mask[:, 0] = True
    return mask


def label_positives(labels: torch.Tensor, queue_labels: torch.Tensor) -> torch.Tensor:
    """UberNCE: own key + queued keys of the same class; a negative label (unknown) never matches."""
    if labels.dim() != 1 or queue_labels.dim() != 1:
        raise ValueError(
            f"labels [B] and queue_labels [K] must be 1-D, got {tuple(labels.shape)}, {tuple(queue_labels.shape)}"
        )
    same = (labels[:, None] == queue_labels[None, :]) & (labels[:, None] >= 0)
    return _with_own_key(same)


def group_matches(groups: torch.Tensor, queue_groups: torch.Tensor, queue_valid: torch.Tensor) -> torch.Tensor:
    """``[B, K]``: valid queue entries from the same source group (id >= 0) as each key clip."""
    return (groups[:, None] == queue_groups[None, :]) & (groups[:, None] >= 0) & queue_valid[None, :]


def cross_view_topk_positives(
    other_keys: torch.Tensor,
    queue_other: torch.Tensor,
    topk: int,
    queue_valid: torch.Tensor,
    groups: torch.Tensor | None = None,
    queue_groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """CoCLR: own key + the ``topk`` queue entries most similar in the other view (+ source-group siblings).

    Similarity is the dot product of the key clip's other-view embedding ``other_keys [B, D]`` with the queued
    other-view embeddings ``queue_other [K, D]``, in float32 whatever the autocast state (a bf16 score reorders
    near-equal candidates). Only valid (written) slots are ever mined; with fewer than
    ``topk`` valid slots, all of them are. Ties are broken by lower queue index first (as a stable descending
    sort would), so the mask is deterministic on every device.

    With ``groups``/``queue_groups`` (source-video ids; ``-1`` = unknown), queue entries of the same group
    are positives too (UCF101 "sibling" clips) and, as in the authors' code, are excluded from the mining,
    so the ``topk`` mined positives come in addition to them.
    """
    if other_keys.dim() != 2 or queue_other.dim() != 2 or other_keys.shape[1] != queue_other.shape[1]:
        raise ValueError(
            f"other_keys [B, D] and queue_other [K, D] disagree: {tuple(other_keys.shape)}, {tuple(queue_other.shape)}"
        )
    if not whole_number(topk) or topk < 0:
        raise ValueError(f"topk must be a whole number >= 0, got {topk!r}")
    if queue_valid.shape != (queue_other.shape[0],):
        raise ValueError(f"queue_valid must be [K] = [{queue_other.shape[0]}] (one flag a queue slot), got "
                         f"{tuple(queue_valid.shape)}")
    if (groups is None) != (queue_groups is None):
        raise ValueError("pass both groups and queue_groups, or neither")
    if groups is not None and queue_groups is not None and (
            groups.shape != (other_keys.shape[0],) or queue_groups.shape != (queue_other.shape[0],)):
        raise ValueError(f"groups [B] and queue_groups [K] must match other_keys [B, D] and queue_other [K, D]: got "
                         f"{tuple(groups.shape)} and {tuple(queue_groups.shape)} for B={other_keys.shape[0]}, "
                         f"K={queue_other.shape[0]}")
    queue_valid = queue_valid.to(torch.bool)
    siblings = (
        group_matches(groups, queue_groups, queue_valid)
        if groups is not None and queue_groups is not None
        else torch.zeros(other_keys.shape[0], queue_other.shape[0], dtype=torch.bool, device=other_keys.device)
    )
    minable = queue_valid[None, :] & ~siblings
    scores = similarity(other_keys, queue_other).masked_fill(~minable, float("-inf"))
    return _with_own_key((top_k_lowest_index_ties(scores, topk) & minable) | siblings)


def summed_similarity_embedding(views: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[B, sum D]``: unit-norm embeddings of the same clips in several spaces, side by side, in float32.

    The dot product of two such rows is the sum of the clips' cosine similarities in each space, so
    :func:`cross_view_topk_positives` on them mines the top-K of the summed similarity (CoCLR's two-view mining,
    ``method.mine_in=both``): a candidate must be close in both spaces to win, where one space's errors would
    not be the other's. One space: its embedding as it is (the paper's mining).
    """
    if not views:
        raise ValueError("summed_similarity_embedding: no embedding given")
    if any(v.dim() != 2 or v.shape[0] != views[0].shape[0] for v in views):
        raise ValueError(f"summed_similarity_embedding: embeddings [B, D] of the same clips expected, got "
                         f"{[tuple(v.shape) for v in views]}")
    if len(views) == 1:
        return views[0]
    return torch.cat([v.float() for v in views], dim=1)


def top_k_lowest_index_ties(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the ``k`` largest scores of each row, ties at the k-th score going to lower indices.

    Equal to taking the first ``k`` of a stable descending sort, but costs one ``topk`` and a cumulative sum
    instead of a full sort: everything strictly above the k-th
    largest score is taken, and the remaining places go to the first entries equal to it.
    """
    k = min(k, scores.shape[1])
    if k == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    kth = scores.topk(k, dim=1).values[:, -1:]
    above = scores > kth
    tied = scores == kth
    places_left = k - above.sum(dim=1, keepdim=True)
    return above | (tied & (tied.cumsum(dim=1) <= places_left))


def cross_view_instance_positives(
    batch_size: int, queue_size: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """CMC: ``[B, 2(1+K)]`` over [own key, own-view queue | other view's key, other-view queue].

    The positives are the same clip in both views: columns ``0`` and ``1+K``.
    """
    mask = torch.zeros(batch_size, 2 * (1 + queue_size), dtype=torch.bool, device=device)
    mask[:, 0] = True
    mask[:, 1 + queue_size] = True
    return mask


def drop_own_positive(mask: torch.Tensor) -> torch.Tensor:
    """Rows with more than one positive lose column 0 as a positive (a new mask is returned).

    The own key stays a candidate in the loss's denominator, because the logits are untouched. The authors
    do this with probability 0.9 per iteration in CoCLR: otherwise the easy self-similarity dominates the
    numerator and the mined positives receive little gradient.
    """
    out = mask.clone()
    out[:, 0] &= mask.sum(dim=1) <= 1
    return out
