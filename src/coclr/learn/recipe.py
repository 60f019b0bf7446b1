"""The training ``coclr learn`` runs for a plan: the quick study's recipe, scaled to the footage and the budget.

The quick study (docs/synth.md) is the recipe measured to learn on a CPU: InfoNCE on RGB and on flow, then two
cycles of CoCLR, each stage starting from the last one of its view; a lr warm-up, the lr divided by ten for the
last part of every stage, and CoCLR keeping every own key a positive for its first steps. Its epochs are fixed
for 384 videos in batches of 32 (12 steps an epoch); here they are counted in steps, so that they mean the same
for any number of videos. At clips of 64 px or less the augmentation is the quick study's (crops of 60-100% of
the area and flips: the paper's crops, blur and colour changes erase small objects and make the multi-positive
losses collapse at 32 px, docs/experiments/2026-11-25-quick-study-recipe.md); larger clips get the paper's.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

from coclr.errors import ConfigError
from coclr.learn.budget import Plan
from coclr.train.recipes import STUDY_TRAIN

WARMUP_STEPS = 24
"""Steps of the lr warm-up at the start of each stage (the quick study's 2 epochs of 12 steps)."""
OWN_POSITIVE_STEPS = 48
"""Steps at the start of each CoCLR stage during which every own key stays a positive (the quick study's 4 epochs)."""
DECAY_SHARE = {"infonce": 0.125, "coclr": 0.25}
"""The last share of each stage's epochs at a tenth of the lr (the quick study's last 5 of 40 and of 20)."""
SMALL_CLIPS = 64
"""Clips up to this side take the quick study's augmentation, larger ones the paper's."""
CACHE_MB = 2048
"""MiB of decoded frames the CPU training keeps in memory (the footage's frames fit at the small sizes)."""


def milestones(epochs: int, share: float) -> list[int]:
    """The epoch from which the last ``share`` of ``epochs`` runs at a tenth of the lr (none for one epoch)."""
    start = epochs - round(share * epochs)
    return [start] if 0 < start < epochs else []


def sized(stage, epochs: int):
    """A CoCLR ``stage`` (:class:`~coclr.train.pipeline.Stage`, as planned) sized to ``epochs``, its lr decayed for
    the same last share of them as the plan's; sized shorter than planned, its warm-up and own-key phase shrink in
    proportion (``Stage.share``), as the plan shaped them."""
    return dataclasses.replace(stage, epochs=epochs, milestones=milestones(epochs, DECAY_SHARE["coclr"]),
                               share=min(1.0, epochs / max(1, stage.epochs)))


def pipeline_options(plan: Plan, store: str, out: str, seed: int, device: str, instances: int,
                     processes: int = 1, starts: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``coclr pipeline`` options (:class:`~coclr.train.config.PipelineConfig`) of ``plan`` for a job of
    ``processes`` (its global batch, the plan's, shared between them), over ``instances`` training instances (the
    store's usable videos, or their stretches of ``plan.segment_frames``); ``starts``: view -> the checkpoint its
    InfoNCE stage starts from."""
    model = plan.model
    global_batch = plan.batch * plan.processes
    if global_batch % processes:
        raise ConfigError(f"the plan's global batch of {global_batch} clips ({plan.processes} process(es) of "
                          f"{plan.batch}) cannot be shared by {processes} processes: continue this run with a number "
                          f"of processes that divides {global_batch}")
    steps_per_epoch = max(1, instances // global_batch)
    on_gpu = device.startswith("cuda")
    options = copy.deepcopy(STUDY_TRAIN)
    options["data"].update(store=os.path.abspath(store), view="rgb", second_view="flow", length=model.length, stride=1,
                           size=model.size, workers=4 if on_gpu else 0, cache_mb=0 if on_gpu else CACHE_MB,
                           segment_frames=plan.segment_frames)
    options["model"] = {"width": model.width}
    options["method"].update(queue_size=plan.queue, topk=plan.topk,
                             own_positive_epochs=min(OWN_POSITIVE_STEPS / steps_per_epoch, plan.epochs["coclr"]))
    options["optim"].update(warmup_epochs=min(WARMUP_STEPS / steps_per_epoch, min(plan.epochs.values())),
                            schedule="milestones")
    if model.size > SMALL_CLIPS:  # the paper's augmentation
        options["augment"] = {"cpu_8bit": not on_gpu}
    options["run"].update(batch_size=global_batch // processes, progress=True, device=device, seed=seed,
                          out=os.path.abspath(out))  # (its jobs' records run from any folder)
    options["pipeline"] = {
        "cycles": 2, "infonce_epochs": plan.epochs["infonce"], "cycle_epochs": plan.epochs["coclr"],
        "cycle_lr": 5e-4, "mode": "alternate",
        "infonce_milestones": milestones(plan.epochs["infonce"], DECAY_SHARE["infonce"]),
        "cycle_milestones": milestones(plan.epochs["coclr"], DECAY_SHARE["coclr"])}
    for key, view in (("init", "rgb"), ("second_init", "flow")):
        if (starts or {}).get(view):
            options["pipeline"][key] = starts[view]
    return options
