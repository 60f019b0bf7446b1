"""One MoCo-style learner for every method: InfoNCE, UberNCE, CoCLR and CMC differ only in the positive mask.

A :class:`ViewLearner` trains one view's encoder: query encoder, EMA key encoder and momentum queue. The
:class:`PretrainModel` around it (or two of them) supplies what a method needs from the other view:

- ``infonce``, ``ubernce``: one view, nothing else;
- ``coclr`` (alternating, the paper): a frozen ``sampler`` encoder of the other view embeds the key clip's
  other view; those embeddings are queued beside the keys and mined for top-K positives (with
  ``method.mine_in=both``, beside a frozen ``own_sampler`` copy of the trained view's start: the summed
  similarity ranks);
- ``coclr`` with ``simultaneous`` and ``cmc``: two learners trained at once, each taking the other's key
  embeddings as its "other view" (mined by coclr; contrasted directly by cmc).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from coclr.core.loss import logits_from, multi_positive_nce
from coclr.core.methods import METHODS, positive_mask
from coclr.core.momentum import momentum_copy, momentum_update, shuffled_forward
from coclr.core.positives import summed_similarity_embedding
from coclr.core.queue import MomentumQueue
from coclr.models.encoder import Encoder


def frozen_forward(forward: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``forward()`` under inference mode (no autograd bookkeeping at all: the key encoder and CoCLR's sampler
    are never trained through), returned as an ordinary tensor, because the loss uses the keys as constants and
    autograd may save them for its backward pass, which inference-mode tensors cannot be."""
    with torch.inference_mode():
        out = forward()
    return out.clone()


@dataclass
class Targets:
    """What the data knows of each sample: class label (oracle and monitoring only), video index, source group."""

    labels: torch.Tensor
    videos: torch.Tensor
    groups: torch.Tensor


@dataclass
class StepOutput:
    """Loss of one learner and its detached statistics (tensors: no host sync until logged)."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor]


class ViewLearner(nn.Module):
    """Query encoder, EMA key encoder and queue of one trained view.

    State (all in ``state_dict``): ``encoder_q`` (trained), ``encoder_k`` (EMA of ``encoder_q``, m),
    ``queue`` (keys with labels, video ids, groups and, for two-view methods, the other view's embeddings).
    """

    def __init__(self, encoder: Encoder, method: str, queue_size: int, temperature: float, momentum: float,
                 topk: int, own_drop_prob: float, group_positives: bool, loss_form: str,
                 generator: torch.Generator | None = None, dropped_own_as_negative: bool = True,
                 other_dim: int | None = None):
        super().__init__()
        self.method = method
        self.temperature = temperature
        self.momentum = momentum
        self.topk = topk
        self.own_drop_prob = own_drop_prob
        self.dropped_own_as_negative = dropped_own_as_negative
        self.group_positives = group_positives
        self.loss_form = loss_form
        self.encoder_q = encoder
        self.encoder_k = momentum_copy(encoder)
        embed_dim = encoder.arch["embed_dim"]
        self.spec = METHODS[method]
        # The other view's embedding of each key clip (what CoCLR mines by): its encoder's dimension, the
        # trained encoder's unless given (a sampler of another embed_dim; mine_in=both: the two spaces' sum)
        other_dim = (embed_dim if other_dim is None else other_dim) if self.spec.queues_other_view else 0
        self.queue = MomentumQueue(queue_size, embed_dim, other_dim=other_dim, generator=generator,
                                   contrasted_other=self.spec.other_view == "contrasted")

    @torch.no_grad()
    def momentum_update(self) -> None:
        """Move the key encoder towards the query encoder (EMA with ``momentum``)."""
        momentum_update(self.encoder_q, self.encoder_k, self.momentum)

    def embed_keys(self, key_clip: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The key encoder's embeddings of the key clips, with shuffle-BN across processes (its permutation drawn
        from ``generator``), computed without autograd."""
        return frozen_forward(lambda: shuffled_forward(self.encoder_k, key_clip, generator))

    def step(self, query_clip: torch.Tensor, keys: torch.Tensor, targets: Targets,
             other_keys: torch.Tensor | None, generator: torch.Generator | None, keep_own: bool = False) -> StepOutput:
        """Loss for one batch; then enqueue the keys (and their other-view embeddings). With ``keep_own``, CoCLR
        keeps every row's own key as a positive this step (no own-key drop)."""
        q = self.encoder_q(query_clip)
        queue = self.queue
        # Copies: the queue is overwritten in place by the enqueue below, after the graph is built.
        logits = logits_from(q, keys, queue.keys.clone(), self.temperature)
        if self.spec.other_view == "contrasted":  # CMC: the other view's key and queue are candidates too
            logits = torch.cat([logits, logits_from(q, other_keys, queue.other.clone(), self.temperature)], dim=1)
        with torch.no_grad():
            mask = positive_mask(self.method, batch_size=q.shape[0], queue=queue, labels=targets.labels,
                                 groups=targets.groups, other_keys=other_keys, topk=self.topk,
                                 group_positives=self.group_positives,
                                 own_drop_prob=0.0 if keep_own else self.own_drop_prob,
                                 generator=generator)
        excluded = None
        if not self.dropped_own_as_negative:  # column 0 is a positive unless CoCLR dropped it this step
            excluded = torch.zeros_like(mask)
            excluded[:, 0] = ~mask[:, 0]
        # The rules give every row a positive and exclude only dropped own keys: no check (a host sync on GPUs).
        loss = multi_positive_nce(logits, mask, form=self.loss_form, excluded=excluded, check_masks=False)
        stats = self._stats(logits.detach(), mask, targets.labels)
        queue.enqueue(keys, labels=targets.labels, video_ids=targets.videos, groups=targets.groups,
                      other=other_keys if queue.other.shape[1] else None)
        return StepOutput(loss, stats)

    def _stats(self, logits: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Pretext top-1 (the best-scoring candidate is a positive or the own key) and the precision of the
        mined positives (fraction whose class is the query's; the signal behind the paper's Figure 4; NaN when
        no mined positive's class is known, which the trainer leaves out of its log)."""
        best = logits.argmax(dim=1, keepdim=True)
        hit = mask.gather(1, best).squeeze(1) | (best.squeeze(1) == 0)
        stats = {"top1": hit.float().mean()}
        if self.spec.scores_positives:
            queue_labels = self.queue.labels
            queue_mask = mask[:, 1 : 1 + queue_labels.shape[0]]
            known = (labels >= 0).unsqueeze(1) & (queue_labels >= 0).unsqueeze(0)
            same_class = known & (queue_labels.unsqueeze(0) == labels.unsqueeze(1))
            stats["mined_positives"] = queue_mask.sum().float() / mask.shape[0]
            # NaN where no mined positive has a known class (nothing mined yet, unlabelled videos): not logged
            scored = (queue_mask & known).sum().float()
            stats["mined_precision"] = (queue_mask & same_class).sum().float() / scored
        return stats


class PretrainModel(nn.Module):
    """The module a training process runs (and DDP wraps): one or two view learners and an optional sampler.

    ``forward`` takes the two augmented clips of each view (``query[view]``, ``key[view]``) and returns the
    summed loss with per-view statistics.
    """

    def __init__(self, learners: dict[str, ViewLearner], sampler: Encoder | None = None,
                 sampler_view: str | None = None, own_sampler: Encoder | None = None):
        super().__init__()
        self.learners = nn.ModuleDict(learners)
        self.sampler = sampler
        self.sampler_view = sampler_view
        self.own_sampler = own_sampler
        for frozen in (sampler, own_sampler):
            if frozen is not None:
                frozen.requires_grad_(False)

    def train(self, mode: bool = True) -> PretrainModel:
        super().train(mode)
        for frozen in (self.sampler, self.own_sampler):
            if frozen is not None:
                frozen.eval()
        return self

    def forward(self, query: dict[str, torch.Tensor], key: dict[str, torch.Tensor], targets: Targets,
                generator: torch.Generator | None = None, keep_own: bool = False,
                shuffle_generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The summed loss and per-view statistics of one batch. ``generator`` draws CoCLR's own-key drop,
        ``shuffle_generator`` the shuffle-BN permutation of the key forward (several processes)."""
        keys = {}
        for view, learner in self.learners.items():
            learner.momentum_update()
            keys[view] = learner.embed_keys(key[view], shuffle_generator)
        if self.sampler is not None:
            keys[self.sampler_view] = frozen_forward(lambda: self.sampler(key[self.sampler_view]))
        total = 0.0
        stats: dict[str, torch.Tensor] = {}
        for view, learner in self.learners.items():
            other_view = next((v for v in keys if v != view), None)
            other = keys[other_view] if other_view is not None and learner.spec.queues_other_view else None
            if self.own_sampler is not None and other is not None:  # mined in both views' spaces
                own = frozen_forward(lambda clip=key[view]: self.own_sampler(clip))
                other = summed_similarity_embedding([other, own])
            out = learner.step(query[view], keys[view], targets, other, generator, keep_own)
            total = total + out.loss
            stats[f"{view}/loss"] = out.loss.detach()
            stats.update({f"{view}/{name}": value for name, value in out.stats.items()})
        return total, stats

    @property
    def queues_full(self) -> bool:
        """Whether every learner's queue is full (known on the host: no device read per step)."""
        return all(learner.queue.is_full() for learner in self.learners.values())
