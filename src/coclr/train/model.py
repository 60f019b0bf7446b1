"""The networks of a pretraining run: the learner(s) a method needs, initialised from checkpoints as configured,
CoCLR's frozen sampler, and what each encoder records about the clips it is trained on."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from coclr.clips import IMAGENET_MEAN, IMAGENET_STD
from coclr.data.views import is_flow_view, stored_view, view_kind
from coclr.errors import CheckpointError, ConfigError
from coclr.models.encoder import Encoder, build_encoder
from coclr.models.loading import load_encoder, read_clip_settings
from coclr.store.flow_views import recorded_method, stored_bound
from coclr.train.config import PretrainConfig
from coclr.train.learner import PretrainModel, ViewLearner


def _same_architecture(path: str, backbone, head, ours: dict[str, Any], option: str) -> None:
    """Refuse the encoder read from ``path`` (``backbone``, ``head``) when it is not of the architecture ``ours``
    (``model.width``, ``model.gating``, ``model.embed_dim``), naming both."""
    theirs = {"model.width": backbone.width, "model.gating": backbone.gating,
              "model.embed_dim": None if head is None else head.out_dim}
    differ = [f"{key}={ours[key]!r} (the checkpoint: {theirs[key]!r})" for key in ours
              if theirs[key] is not None and theirs[key] != ours[key]]
    if differ:
        raise CheckpointError(f"{option}: {path} holds another encoder than the run's: {', '.join(differ)}")


def check_architecture(path: str | Path, config: PretrainConfig, option: str) -> None:
    """:func:`load_into`'s refusal of an encoder of another architecture than ``config``'s model, before anything is
    built (a pipeline checks the encoders its later stages start from before its first stage trains)."""
    backbone, head = load_encoder(path)
    model = config.model
    _same_architecture(str(path), backbone, head, {"model.width": model.width, "model.gating": model.gating,
                                                   "model.embed_dim": model.embed_dim}, option)


def load_into(encoder: Encoder, path: str, option: str) -> None:
    """Initialise ``encoder`` from any checkpoint ``load_encoder`` reads (``option`` names where the path came
    from), its BatchNorm epsilon too; the architectures must match, or the error names both."""
    backbone, head = load_encoder(path)
    _same_architecture(path, backbone, head, {"model.width": encoder.backbone.width,
                                              "model.gating": encoder.backbone.gating,
                                              "model.embed_dim": encoder.head.out_dim}, option)
    encoder.backbone.load_state_dict(backbone.state_dict())
    encoder.backbone.set_bn_eps(backbone.bn_eps)  # (torchvision's 1e-3: its statistics were kept under it)
    if head is not None:
        encoder.head.load_state_dict(head.state_dict())


def check_view_of(path: str, view: str, option: str) -> None:
    """A checkpoint that records the view it was trained on must be of the kind of ``view`` (a flow encoder does
    not initialise, mine for or evaluate an RGB network)."""
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

    sampler = None
    if method.needs_sampler:
        backbone, head = load_encoder(method.sampler_checkpoint)  # draws nothing from the global generator
        if head is None:
            raise CheckpointError(f"{method.sampler_checkpoint}: has no projection head, so it cannot embed "
                                  "clips for positive mining (a pretraining checkpoint is needed)")
        sampler = Encoder(backbone, head)
    # What the queue keeps of each key clip's other view: the sampler's embedding (or the other trained view's),
    # beside the trained view's own start's with mine_in=both
    other_dim = (sampler.head.out_dim if sampler is not None else config.model.embed_dim) \
        + (config.model.embed_dim if method.mines_in_own_view else 0)

    def learner(init: str, option: str) -> ViewLearner:
        return ViewLearner(encoder(init, option), method=method.name, queue_size=method.queue_size,
                           temperature=method.temperature, momentum=method.momentum, topk=method.topk,
                           own_drop_prob=method.own_drop_prob, group_positives=method.group_positives,
                           loss_form=method.form, generator=generator,
                           dropped_own_as_negative=method.dropped_own_as_negative, other_dim=other_dim)

    learners = {config.data.view: learner(method.init_checkpoint, "method.init_checkpoint")}
    if method.trains_two_views:
        learners[config.data.second_view] = learner(method.second_init_checkpoint, "method.second_init_checkpoint")
    # mine_in=both: the trained view's start, kept frozen, embeds the key clips beside the other view's encoder
    own_sampler = copy.deepcopy(learners[config.data.view].encoder_q) if method.mines_in_own_view else None
    return PretrainModel(learners, sampler=sampler, sampler_view=config.data.second_view if sampler else None,
                         own_sampler=own_sampler)


def sampler_unlike_training(config: PretrainConfig, store) -> list[str]:
    """How the clips CoCLR's frozen sampler (``method.sampler_checkpoint``) embeds to mine positives differ from those
    it was trained on, one line each: their length, stride or size, and the store's frames (short side, frame rate,
    flow bound: :func:`coclr.eval.features.unlike_training`). It then mines from inputs it never saw. Nothing for a
    run without a sampler, or a checkpoint that records none of them."""
    from coclr.eval.features import unlike_training  # noqa: PLC0415 (the evaluation's rule, read once here)

    method = config.method
    if not method.needs_sampler:
        return []
    path = method.sampler_checkpoint
    recorded = read_clip_settings(path)
    lines = [f"method.sampler_checkpoint: {path} was trained on clips of {key} {recorded[key]}; it mines on clips of "
             f"data.{key}={getattr(config.data, key)}" for key in ("length", "stride", "size")
             if recorded.get(key) is not None and recorded[key] != getattr(config.data, key)]
    return lines + [f"method.sampler_checkpoint: {line}" for line in unlike_training(store, path,
                                                                                      config.data.second_view)]


def clip_settings(config: PretrainConfig, store, view: str) -> dict[str, Any]:
    """What the encoder of ``view`` is trained on (recorded in its checkpoints, see
    :func:`coclr.models.loading.read_clip_settings`): clip shape, the store's frame rate and short side, the
    normalisation and, for flow, the stored bound and method."""
    stored = stored_view(view) if is_flow_view(view) else None
    return recorded_clip_settings(view, config.data.clips.to_dict(), store.meta.get("fps"),
                                  store.meta.get("short_side"), stored and stored_bound(store, stored),
                                  stored and recorded_method(store, stored))


def recorded_clip_settings(view: str, clips: dict[str, int], fps: float | None, short_side: int | None,
                           flow_bound: float | None, flow_method: dict[str, Any] | None = None) -> dict[str, Any]:
    """The clip settings an encoder of ``view`` records (:func:`clip_settings`): ``clips`` (length, stride, size),
    the frames' rate and short side, the normalisation and, for flow, the bound and the method (of a store, or of
    the store a run will make: a warm start's copy; None: not recorded)."""
    flow = is_flow_view(view)
    return {"view": view, **clips, "fps": fps, "short_side": short_side, "mean": list(IMAGENET_MEAN),
            "std": list(IMAGENET_STD), "flow_bound": flow_bound if flow else None,
            "flow_method": flow_method if flow else None}

