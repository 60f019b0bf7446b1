"""Every method, each defined once: its positive rule, its loss form, and what it needs from data and views.

InfoNCE, UberNCE, CoCLR and CMC share the learner, the queue, the logits and the loss; they differ in which
candidates count as positives (:mod:`coclr.core.positives` holds the rules) and, following from that, in what
the queue stores and which views and encoders they need. The supervised Cross-Entropy baseline (Table 1) is a row
too, without a positive rule: it is trained by finetuning a random encoder with labels. The learner, the trainer,
the configuration, the report, the study and the benchmarks ask :data:`METHODS` instead of testing method names;
the help text of ``method.name`` is generated from it. Adding a method is one row here and its positive rule in
:mod:`coclr.core.positives`. :data:`MINING_SPACES` says where CoCLR may mine (``method.mine_in``).

============  ===========================================================================================
``infonce``   the own key only (instance discrimination)
``ubernce``   own key + queued keys with the same class label (the supervised oracle)
``coclr``     own key + the top-K queued keys whose *other view* is most similar to the key clip's other
              view (+ optionally queued sibling clips of the same source group); InfoNCE until the
              queue is full
``cmc``       the same clip in both views: own key and the other view's key of the clip
``cross_entropy``  no positives: end-to-end training with class labels (not a ``coclr pretrain`` method)
============  ===========================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from coclr.core.positives import (
    cross_view_instance_positives,
    cross_view_topk_positives,
    drop_own_positive,
    instance_positives,
    label_positives,
)
from coclr.core.queue import MomentumQueue
from coclr.errors import ConfigError


@dataclass(frozen=True)
class Batch:
    """What a positive rule may read about one batch: the queue of the trained view (read, never written) and
    what is known of the key clips."""

    batch_size: int
    queue: MomentumQueue
    labels: torch.Tensor | None = None
    """``[B]`` class labels (UberNCE)."""
    groups: torch.Tensor | None = None
    """``[B]`` source-group ids (CoCLR with ``group_positives``; video ids make other clips of a video positives)."""
    other_keys: torch.Tensor | None = None
    """``[B, D']`` the other view's embeddings of the key clips (CoCLR: from the frozen encoder)."""


@dataclass(frozen=True)
class Mining:
    """CoCLR's options: ``topk`` positives mined per query, sibling clips as positives, and the probability per
    iteration that rows with mined positives drop their own key (drawn once from ``generator``; seed it alike on
    every rank for the same decision everywhere)."""

    topk: int = 5
    group_positives: bool = False
    own_drop_prob: float = 0.9
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:  # (a probability of 3 or a top-0 were taken as given)
        if not (isinstance(self.own_drop_prob, (int, float)) and 0 <= self.own_drop_prob <= 1):
            raise ValueError(f"own_drop_prob must be a probability in [0, 1], got {self.own_drop_prob!r}")
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1:
            raise ValueError(f"topk must be a whole number of at least 1, got {self.topk!r}")


def _needed(method: str, name: str, value: torch.Tensor | None, batch: Batch) -> torch.Tensor:
    """``value`` on the queue's device, or a clear error when the method needs it and it is missing or mis-sized."""
    if value is None:
        raise ValueError(f"positive_mask: method {method!r} needs {name}")
    if value.shape[0] != batch.batch_size:
        raise ValueError(f"positive_mask: {name} has {value.shape[0]} rows, expected batch_size={batch.batch_size}")
    return value.to(batch.queue.keys.device)


def _draw(probability: float, generator: torch.Generator | None) -> bool:
    """One Bernoulli draw from ``generator`` (CPU unless the generator lives elsewhere), without a GPU sync."""
    device = generator.device if generator is not None else "cpu"
    return bool(torch.rand((), generator=generator, device=device) < probability)


def _infonce(batch: Batch, mining: Mining) -> torch.Tensor:
    return instance_positives(batch.batch_size, batch.queue.size, batch.queue.keys.device)


def _ubernce(batch: Batch, mining: Mining) -> torch.Tensor:
    return label_positives(_needed("ubernce", "labels", batch.labels, batch), batch.queue.labels)


def _coclr(batch: Batch, mining: Mining) -> torch.Tensor:
    queue = batch.queue
    other_keys = _needed("coclr", "other_keys", batch.other_keys, batch)
    groups = (_needed("coclr", "groups (group_positives=True)", batch.groups, batch)
              if mining.group_positives else None)
    if not queue.is_full():
        return instance_positives(batch.batch_size, queue.size, queue.keys.device)
    mask = cross_view_topk_positives(other_keys, queue.other, mining.topk, queue.valid, groups=groups,
                                     queue_groups=queue.groups if mining.group_positives else None)
    return drop_own_positive(mask) if _draw(mining.own_drop_prob, mining.generator) else mask


def _cmc(batch: Batch, mining: Mining) -> torch.Tensor:
    return cross_view_instance_positives(batch.batch_size, batch.queue.size, batch.queue.keys.device)


@dataclass(frozen=True)
class Method:
    """One method: its positive rule and what follows from it.

    ``other_view``: None (one view), ``"mined"`` (CoCLR: the queue stores the other view's embedding of each
    key clip and positives are mined in it) or ``"contrasted"`` (CMC: the other view's keys are candidates).
    ``two_views``: trains both views at once always (CMC), when asked (CoCLR ``simultaneous``) or never.
    ``rule`` None: not contrastive (Cross-Entropy), so not a ``coclr pretrain`` method.
    """

    name: str
    display: str
    """The name in the paper's Table 1."""
    summary: str
    """What the method does, in a few words (the help text of ``method.name``)."""
    rule: Callable[[Batch, Mining], torch.Tensor] | None
    loss_form: Literal["mil", "supcon"] | None
    uses_labels: bool = False
    other_view: Literal["mined", "contrasted"] | None = None
    two_views: Literal["always", "when_simultaneous", "never"] = "never"
    waits_for_full_queue: bool = False
    """The reference code takes no optimiser step until the queue is full in CoCLR only."""
    aliases: tuple[str, ...] = ()
    """Other names records may carry for it (older files)."""

    @property
    def contrastive(self) -> bool:
        """Whether it is trained by ``coclr pretrain`` (it has a positive rule)."""
        return self.rule is not None

    @property
    def from_scratch(self) -> bool:
        """Whether it learns from one view alone, without labels or another encoder: the CoCLR schedule's first
        stage (cycle 0)."""
        return self.contrastive and not self.uses_labels and self.other_view is None

    @property
    def queues_other_view(self) -> bool:
        """Whether the queue stores each key clip's other-view embedding."""
        return self.other_view is not None

    @property
    def mines(self) -> bool:
        """Whether its positives are mined in the other view's embedding space (CoCLR)."""
        return self.other_view == "mined"

    @property
    def scores_positives(self) -> bool:
        """Whether positives besides the own key come from the queue (their class precision is logged)."""
        return self.uses_labels or self.mines

    def trains_two_views(self, simultaneous: bool) -> bool:
        return self.two_views == "always" or (self.two_views == "when_simultaneous" and simultaneous)

    def needs_sampler(self, simultaneous: bool) -> bool:
        """Whether a frozen encoder of the other view must embed the key clips (alternating CoCLR)."""
        return self.mines and not simultaneous


METHODS: dict[str, Method] = {method.name: method for method in (
    Method("infonce", "InfoNCE", "own key", _infonce, "mil"),
    Method("ubernce", "UberNCE", "label oracle", _ubernce, "supcon", uses_labels=True),
    Method("coclr", "CoCLR", "top-K mined in the other view", _coclr, "mil", other_view="mined",
           two_views="when_simultaneous", waits_for_full_queue=True),
    Method("cmc", "CMC", "same clip in both views", _cmc, "mil", other_view="contrasted", two_views="always"),
    Method("cross_entropy", "Cross-Ent.", "supervised training with labels", None, None, uses_labels=True,
           aliases=("supervised",)),
)}
"""Every method by name. UberNCE's loss is the SupCon form, as in the authors' UberNCE code."""

CONTRASTIVE: dict[str, Method] = {name: m for name, m in METHODS.items() if m.contrastive}
"""The methods ``coclr pretrain`` trains (those with a positive rule)."""


@dataclass(frozen=True)
class MiningSpace:
    """Where CoCLR mines its positives (``method.mine_in``): the embeddings whose summed cosine similarity ranks
    the queue (:func:`coclr.core.positives.summed_similarity_embedding`)."""

    name: str
    summary: str
    own_view: bool
    """Besides the frozen other view's embedding, a frozen copy of the trained view's encoder as the stage
    started (its initialisation) embeds the key clips too."""


MINING_SPACES: dict[str, MiningSpace] = {space.name: space for space in (
    MiningSpace("other", "the other view's top-K, as in the paper", own_view=False),
    MiningSpace("both", "the top-K of the summed similarity in the other view and in the trained view (the "
                        "frozen copy of its encoder as the stage started)", own_view=True),
)}
"""CoCLR's mining spaces. ``both`` is not in the paper: a clip's neighbours in RGB and in flow err in different
ways, so positives close in both may more often be of the query's class (issue 59)."""


def mining_help() -> str:
    """The help text of ``method.mine_in``."""
    return "CoCLR (alternating): where positives are mined: " + "; ".join(
        f"{s.name}: {s.summary}" for s in MINING_SPACES.values())


def method(name: str) -> Method:
    """The contrastive method called ``name``; a :class:`ConfigError` naming the known ones otherwise."""
    if name not in CONTRASTIVE:
        raise ConfigError(f"method {name!r} is not one of {', '.join(CONTRASTIVE)}")
    return CONTRASTIVE[name]


def find_method(name: str) -> Method | None:
    """The method a record names (its name or an alias); None for anything else (a random encoder, a file)."""
    return next((m for m in METHODS.values() if name == m.name or name in m.aliases), None)


def display_name(name: str) -> str:
    """The Table 1 name of the method a record names, or the name itself when no method has it."""
    found = find_method(name)
    return found.display if found else name


def methods_help() -> str:
    """The help text of ``method.name``: every contrastive method with what it does."""
    return "positive-set rule: " + ", ".join(f"{m.name} ({m.summary})" for m in CONTRASTIVE.values())


def positive_mask(name: str, *, batch_size: int, queue: MomentumQueue, labels: torch.Tensor | None = None,
                  groups: torch.Tensor | None = None, other_keys: torch.Tensor | None = None, topk: int = 5,
                  group_positives: bool = False, own_drop_prob: float = 0.9,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """The positive set of method ``name`` for one batch: bool ``[B, 1+K]`` (``[B, 2(1+K)]`` for CMC) on the
    queue's device; column 0 is the own key, then the queue in storage order (see :class:`Batch` and
    :class:`Mining` for the arguments)."""
    return method(name).rule(Batch(batch_size, queue, labels, groups, other_keys),
                             Mining(topk, group_positives, own_drop_prob, generator))
