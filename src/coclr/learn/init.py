"""The checkpoints a learn run starts from (``coclr learn --init FILE [--flow-init FILE]``).

Any file :func:`coclr.load_encoder` reads (the authors' released checkpoints, torchvision's ``s3d`` weights, ours)
starts the InfoNCE stage of its view instead of random weights; the other view starts from scratch unless it has a
checkpoint too. The checkpoint fixes the network (its S3D width) and the clips (frames and crop side, as it
recorded them, else its format's: :func:`coclr.embed.settings.recorded_settings`), so the plan only sizes the
schedule (:func:`coclr.learn.budget.choose_plan` with ``fixed``); a flow checkpoint also fixes the flow bound its
inputs were clipped to. The file is identified by its sha256 (part of the run's recorded options: a continued run
keeps its start) and copied into the run folder in our format (``OUT/init/encoder_<view>.pth``), which the
pipeline loads and whose label-free measures the report shows beside every stage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coclr.errors import ConfigError
from coclr.learn.budget import Model

FOLDER = "init"
"""The run folder's subfolder holding the starting encoders (our format)."""
OPTIONS = {"rgb": "--init", "flow": "--flow-init"}
"""The command-line option that gives each view's starting checkpoint."""


@dataclass
class Start:
    """One view's starting checkpoint: the file given, its content hash and format, the network and clips it fixes,
    and (flow) the bound its inputs were clipped to."""

    view: str
    source: str
    sha256: str
    format: str
    model: Model
    flow_bound: float | None = None

    def record(self) -> dict[str, Any]:
        """What the plan records of it (:attr:`coclr.learn.budget.Plan.init`)."""
        return {"source": self.source, "sha256": self.sha256, "format": self.format, "model": vars(self.model),
                "flow_bound": self.flow_bound}


def read_starts(rgb: str | os.PathLike[str] | None, flow: str | os.PathLike[str] | None) -> dict[str, Start]:
    """The starting checkpoints given (view -> :class:`Start`), each read and checked before any work: a file
    :func:`~coclr.models.loading.load_encoder` refuses, an encoder of the other view, or two checkpoints of
    different networks or clips are refused in one line naming the file and the option."""
    from coclr.data.views import view_kind  # noqa: PLC0415
    from coclr.embed.settings import EmbedSettings, recorded_settings  # noqa: PLC0415 (heavy: torch)
    from coclr.models.loading import (  # noqa: PLC0415
        checkpoint_format,
        checkpoint_sha256,
        load_encoder,
        read_clip_settings,
        require_checkpoint_file,
    )
    from coclr.train.config import ModelOptions  # noqa: PLC0415

    starts: dict[str, Start] = {}
    for view, given in (("rgb", rgb), ("flow", flow)):
        if given is None:
            continue
        option = OPTIONS[view]
        path = require_checkpoint_file(given, option)
        backbone, head = load_encoder(path)  # an unreadable file or format is one line naming it
        network = ModelOptions()  # the network learn trains: S3D without gating, its head's dimension
        if backbone.gating != network.gating:
            raise ConfigError(f"{option}: {path} is an S3D-G encoder (self-gating); coclr learn trains S3D without "
                              "gating: give a checkpoint of one")
        if head is not None and head.out_dim != network.embed_dim:
            raise ConfigError(f"{option}: {path}'s projection head gives {head.out_dim} dimensions, where coclr "
                              f"learn's gives {network.embed_dim}: give a checkpoint with a {network.embed_dim}-d "
                              "head, or one without a head (its backbone alone)")
        trained = read_clip_settings(path).get("view")
        if trained is not None and view_kind(trained) != view:
            where = (f"give it as {OPTIONS[view_kind(trained)]}" if view_kind(trained) in OPTIONS else
                     f"coclr learn trains {' and '.join(OPTIONS)} encoders only: give one of those")
            raise ConfigError(f"{option}: {path} is an encoder of {trained!r} clips, not of {view} ones; {where}")
        settings = recorded_settings(path, view)
        defaults = EmbedSettings()
        model = Model(float(backbone.width), int(settings.get("size", defaults.size)),
                      int(settings.get("length", defaults.length)))
        starts[view] = Start(view, str(path.resolve()), checkpoint_sha256(path), checkpoint_format(path), model,
                             float(settings["flow_bound"]) if view == "flow" else None)
    if len(starts) == 2 and starts["rgb"].model != starts["flow"].model:
        raise ConfigError(f"--init {rgb} ({starts['rgb'].model}) and --flow-init {flow} ({starts['flow'].model}) "
                          "hold different networks or clips: the two views of a run share them; give checkpoints "
                          "of one network")
    return starts


def start_model(starts: dict[str, Start]) -> Model | None:
    """The network and clips the starting checkpoints fix (None: none given, the plan chooses)."""
    return next(iter(starts.values())).model if starts else None


def recorded_starts(starts: dict[str, Start]) -> dict[str, str]:
    """What a run folder records of its starts (view -> sha256): another file refuses the continuation."""
    return {view: start.sha256 for view, start in starts.items()}


def start_file(out: Path, view: str) -> Path:
    """The copy of ``view``'s starting encoder in the run folder ``out``."""
    return out / FOLDER / f"encoder_{view}.pth"


def copy_starts(out: Path, starts: dict[str, Start]) -> dict[str, Path]:
    """Write each starting encoder into ``out`` in our format (:func:`start_file`; kept when a continued run wrote
    it already: the folder's record holds its sha256), with the clips of the run's store (the network's clips, a
    short side of their size, the bound of its flow) as a stage trained there records them, so that it embeds as
    they do when it is exported; returns view -> file."""
    from coclr.models.encoder import Encoder  # noqa: PLC0415 (heavy: torch)
    from coclr.models.loading import load_encoder, read_clip_settings, save_encoder  # noqa: PLC0415
    from coclr.train.model import recorded_clip_settings  # noqa: PLC0415

    files = {}
    for view, start in starts.items():
        target = start_file(out, view)
        if not target.is_file() or "short_side" not in read_clip_settings(target):  # (a copy written before the
            target.parent.mkdir(parents=True, exist_ok=True)  # store's clips were recorded: its embedding failed)
            backbone, head = load_encoder(start.source)
            clip_settings = recorded_clip_settings(view, {"length": start.model.length, "stride": 1,
                                                          "size": start.model.size}, None, start.model.size,
                                                   start.flow_bound)
            save_encoder(target, Encoder(backbone, head), meta={"stage": f"init_{view}", "view": view,
                                                                  "method": "init", "source": start.source,
                                                                  "sha256": start.sha256, "format": start.format,
                                                                  "clip_settings": clip_settings})
        files[view] = target
    return files
