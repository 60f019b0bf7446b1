"""The clip settings an embedding is computed with: from the checkpoint, else the paper's, each overridable.

An encoder gives useful features only for clips like the ones it was trained on, so every setting defaults to
what the checkpoint recorded from its training (:func:`coclr.models.loading.read_clip_settings`). Files that
record nothing get the defaults of their format:

- the CoCLR authors' checkpoints and ours without a record: the paper's test clips, 32 consecutive frames of
  the video at its own frame rate, the short side resized to 128 px, the centre 128 x 128 crop, ImageNet mean and
  standard deviation (as in training, :mod:`coclr.data.augment`), flow clipped to +-20 px;
- torchvision's ``s3d`` (Kinetics-400 weights): frames at 15 fps, the short side resized to 256 px (its own
  transform squashes each frame to 256 x 256), the centre 224 x 224 crop, torchvision's Kinetics mean and standard
  deviation.

The windows default to the ones ``coclr eval`` uses (half-overlapping, the last one reaching the end), so each
window's feature is the one the paper's retrieval computes for it.
"""

from __future__ import annotations

import dataclasses
import numbers
from pathlib import Path
from typing import Any

import numpy as np

from coclr.clips import (
    CLIP_KEYS,
    FLOW_BOUND,
    IMAGENET_MEAN,
    IMAGENET_STD,
    SHORT_SIDE,
    ClipSettings,
    check_flow_bound,
    check_fps,
    check_normalisation,
    check_short_side,
    clip_option,
)
from coclr.config import from_dict, option, require, whole_number
from coclr.data.views import view_kind
from coclr.errors import ConfigError
from coclr.flow.backends import flow_of_method
from coclr.flow.params import TVL1Params


def _pixels(text: str) -> int:
    """``--short-side``: whole pixels (0: the decoded size, :func:`_settings`)."""
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--short-side: expected a whole number of pixels (0: the decoded size), got {text!r}"
                          ) from None


FEATURES = ("backbone", "head")
PRECISIONS = (None, "bf16")

#: Clip settings shared by the RGB and the flow stream (their windows must cover the same frames).
SHARED_KEYS = (*CLIP_KEYS, "fps", "short_side")


@dataclasses.dataclass
class EmbedSettings:
    """Everything that changes an embedding (recorded in the output folder's ``embed.json``)."""

    length: int = clip_option("length", "frames per window")
    stride: int = clip_option("stride", "step between the frames of a window (1: consecutive frames)")
    size: int = clip_option("size", "side of the square centre crop fed to the network, after resizing the short "
                                    "side")
    fps: float | None = option(None, "resample videos to this frame rate first",
                               cli={"shown": "the checkpoint's store's, else every decoded frame"})
    short_side: int | None = option(SHORT_SIDE, "resize frames so the short side has this many pixels before cropping "
                                         "(0: keep the decoded size)", cli={"parse": _pixels})
    mean: tuple[float, float, float] = option(IMAGENET_MEAN, "per-channel mean of the RGB normalisation",
                                              cli={"nargs": 3, "shown": "the checkpoint's, else ImageNet's; "
                                                   "Kinetics' for torchvision's s3d"})
    std: tuple[float, float, float] = option(IMAGENET_STD, "per-channel std of the RGB normalisation",
                                             cli={"nargs": 3, "shown": "as --mean"})
    window_step: int | None = option(None, "frames between the starts of consecutive windows",
                                       cli={"shown": "half a window, as coclr eval"})
    feature: str = option("backbone", "backbone: the pooled backbone feature (1024-d at full width, the paper's "
                                      "retrieval feature); head: the projection head's output (128-d)",
                          cli={"choices": FEATURES, "shown": "backbone"})
    flow_bound: float | None = option(None, "flow stream only: flow clipped to +-this many px before its uint8 "
                                            "quantisation (as the flow encoder's store did)",
                                      cli={"shown": "the flow checkpoint's, else 20"})
    flow_method: dict[str, Any] | None = option(None, "flow stream only: how flow is computed, as the flow encoder's "
                                                "store computed it (coclr.flow.backends.flow_of_method; None: "
                                                "TV-L1 at OpenCV's default parameters, the paper's flow)",
                                                cli={"hidden": True})
    flow_mean: tuple[float, float, float] | None = option(None, "flow stream only: mean of the flow normalisation",
                                                          cli={"hidden": True})
    flow_std: tuple[float, float, float] | None = option(None, "flow stream only: std of the flow normalisation",
                                                         cli={"hidden": True})
    precision: str | None = option(None, "bf16: the backbone under bfloat16 autocast (oneDNN's AVX-512 BF16/AMX "
                                         "kernels on a CPU): faster, but not within cosine 0.999 of float32 on "
                                         "every network (docs/embed.md); fp32: float32",
                                   cli={"choices": ("fp32", "bf16"), "shown": "fp32",
                                        "parse": lambda text: None if text == "fp32" else text})

    def validate(self) -> None:
        ClipSettings.check(self)
        check_fps(self.fps, "fps")
        check_short_side(self.short_side, "short_side")
        require(self.window_step is None or (whole_number(self.window_step) and self.window_step >= 1),
                "window_step", f"must be a whole number of frames, at least 1, got {self.window_step!r}")
        require(self.feature in FEATURES, "feature", f"must be one of {', '.join(FEATURES)}, got {self.feature!r}")
        for key in ("mean", "std", "flow_mean", "flow_std"):
            check_normalisation(getattr(self, key), key, positive=key.endswith("std"))
        require(self.precision in PRECISIONS, "precision", f"must be None (float32) or 'bf16', got {self.precision!r}")
        check_flow_bound(self.flow_bound, "flow_bound")
        method = self.flow_method
        require(method is None or (isinstance(method, dict) and (
            method == {"backend": "dis"} or (method.get("backend") == "tvl1" and isinstance(method.get("params"), dict)
                                             and set(method) == {"backend", "params"}))), "flow_method",
                f"must be None, {{'backend': 'dis'}} or {{'backend': 'tvl1', 'params': {{...}}}}, got {method!r}")
        if method is not None and method["backend"] == "tvl1":
            from_dict(TVL1Params, method["params"], prefix="flow_method.params.")

    @property
    def default_step(self) -> int:
        """Frames between the starts of windows by default: half a window, as ``coclr eval``'s."""
        return max(1, self.length // 2) * self.stride

    @property
    def hop(self) -> int:
        """Frames between the starts of consecutive windows (``window_step``, else :attr:`default_step`)."""
        return self.window_step or self.default_step

    @property
    def computes_flow(self) -> bool:
        """Whether a flow stream is embedded (flow alone, or beside RGB): flow is computed on the fly, and the
        windows cover the frames that have a flow frame."""
        return self.flow_bound is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (tuples as lists), as recorded in ``embed.json``."""
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in dataclasses.asdict(self).items()}


def recorded_settings(checkpoint: str | Path, expected_view: str) -> dict[str, Any]:
    """What ``checkpoint`` recorded (or its format implies) as :class:`EmbedSettings` keys; refuses an encoder
    trained on another kind of view than ``expected_view`` ("rgb" or "flow")."""
    from coclr.models.loading import implied_clip_settings  # noqa: PLC0415 (torch)

    recorded = implied_clip_settings(checkpoint)
    view = recorded.get("view")
    if view is not None and view_kind(view) != expected_view:
        option_name = "--flow-checkpoint" if expected_view == "flow" else "--checkpoint"
        raise ConfigError(f"{checkpoint}: the encoder was trained on the {view!r} view, but {option_name} takes "
                          f"an encoder of {expected_view!r} clips")
    out = {key: recorded[key] for key in (*SHARED_KEYS, "mean", "std") if recorded.get(key) is not None}
    if "fps" in recorded:
        out["fps"] = recorded["fps"]  # None is a recorded value here: every decoded frame
    if expected_view == "flow":
        out = {("flow_" + key if key in ("mean", "std") else key): value for key, value in out.items()}
        out["flow_bound"] = recorded["flow_bound"] if recorded.get("flow_bound") is not None else FLOW_BOUND
        out["flow_method"] = flow_of_method(recorded.get("flow_method"), recorded.get("view"))
    return out


def checkpoint_view(checkpoint: str | Path) -> str:
    """The kind of view ("rgb" or "flow") an encoder was trained on, as it recorded; "rgb" for files that record
    nothing (the authors', torchvision's)."""
    from coclr.models.loading import read_clip_settings  # noqa: PLC0415 (torch)

    view = read_clip_settings(checkpoint).get("view")
    return "rgb" if view is None else view_kind(view)


def resolve_settings(checkpoint: str | Path, flow_checkpoint: str | Path | None = None,
                     **overrides: Any) -> EmbedSettings:
    """The settings for ``checkpoint`` (and ``flow_checkpoint``): recorded, else the format's defaults, else the
    paper's; ``overrides`` (any :class:`EmbedSettings` key) win. The two streams must agree on the clip shape
    and frame rate (:data:`SHARED_KEYS`) unless an override settles it. A ``checkpoint`` trained on flow is a
    flow stream alone (no ``flow_checkpoint`` then)."""
    known = {field.name for field in dataclasses.fields(EmbedSettings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: unknown embedding setting (known: {', '.join(sorted(known))})")
    if checkpoint_view(checkpoint) == "flow":
        if flow_checkpoint is not None:
            raise ConfigError(f"{checkpoint}: a flow encoder embeds a flow stream alone; for two streams give the RGB "
                              "encoder as --checkpoint and the flow encoder as --flow-checkpoint")
        values = {key: value for key, value in recorded_settings(checkpoint, "flow").items()}
        values.setdefault("flow_mean", IMAGENET_MEAN)
        values.setdefault("flow_std", IMAGENET_STD)
        return _settings(values, overrides)
    values = recorded_settings(checkpoint, "rgb")
    if flow_checkpoint is not None:
        flow = recorded_settings(flow_checkpoint, "flow")
        for key in SHARED_KEYS:
            if key in values and key in flow and values[key] != flow[key] and overrides.get(key) is None:
                raise ConfigError(f"{key}: {checkpoint} was trained with {values[key]!r} and {flow_checkpoint} with "
                                  f"{flow[key]!r}; the two streams need the same windows: choose one with --"
                                  f"{key.replace('_', '-')}")
            if key in flow:
                values.setdefault(key, flow[key])
        values.update({key: value for key, value in flow.items() if key not in SHARED_KEYS})
        values.setdefault("flow_mean", IMAGENET_MEAN)
        values.setdefault("flow_std", IMAGENET_STD)
    elif given := [key for key in ("flow_bound", "flow_mean", "flow_std") if overrides.get(key) is not None]:
        raise ConfigError(f"{', '.join(given)}: {'apply' if len(given) > 1 else 'applies'} to a flow stream only: give "
                          "--flow-checkpoint (a flow encoder), or leave it out")
    return _settings(values, overrides)


def _plain(value: Any) -> Any:
    """A setting given as a library user may have it (a NumPy array or scalar, a ``Fraction`` frame rate as PyAV
    gives it) as the plain Python value the settings hold and record."""
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else tuple(value.tolist())
    if isinstance(value, (list, tuple)):
        return tuple(_plain(item) for item in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, numbers.Rational) and not isinstance(value, int):
        return float(value)
    return value


def _settings(values: dict[str, Any], overrides: dict[str, Any]) -> EmbedSettings:
    """The checked settings of ``values`` with the ``overrides`` that are set."""
    values.update({key: _plain(value) for key, value in overrides.items() if value is not None})
    values = {key: tuple(value) if isinstance(value, list) else value for key, value in values.items()}
    if values.get("short_side") == 0:  # --short-side 0: the decoded size, as in coclr data store
        values["short_side"] = None
    settings = EmbedSettings(**values)
    settings.validate()
    if settings.window_step == settings.default_step:  # the default given by its value: recorded as the default
        settings.window_step = None
    return settings
