"""The clips an encoder sees: frames per clip, frame stride and crop side, with their defaults in one place.

Pretraining (``data.*``), evaluation (``coclr eval``), embedding (``coclr embed``), the study (``eval.*``) and
checkpoints (:func:`coclr.models.loading.read_clip_settings`) all describe clips with these three numbers; their
options take default, help and checks from :class:`ClipSettings` (:func:`clip_option`, :meth:`ClipSettings.check`),
so that a default changes in one place. The defaults are the paper's: 32 consecutive frames, 128 px crops.
The frames they are cut from are decoded at :data:`SHORT_SIDE` and stored as JPEG of :data:`JPEG_QUALITY` unless
a command is told otherwise (``coclr data store``, the study, ``coclr embed``, ``coclr learn``).
Knows nothing of files, models or the CLI, so every package may import it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from coclr.config import from_dict, option, require, whole_number
from coclr.errors import ConfigError

SHORT_SIDE = 128
"""The short side, in pixels, videos are decoded at by default (the paper's: its 128 px crops fit)."""
JPEG_QUALITY = 90
"""The JPEG quality of stored frames (RGB, and flow when the store records none)."""
FLOW_BOUND = 20.0
"""Flow magnitudes beyond this many pixels per frame are clipped (the I3D convention): a store's default, and what an
encoder that records no bound is fed."""
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
"""The RGB normalisation of training, evaluation and embedding (ImageNet's mean and standard deviation)."""
KINETICS_MEAN = (0.43216, 0.394666, 0.37645)
KINETICS_STD = (0.22803, 0.22145, 0.216989)
"""torchvision's normalisation of its Kinetics-400 video models (``VideoClassification`` transform)."""
FORMAT_CLIPS = {"torchvision": {"fps": 15.0, "short_side": 256, "size": 224, "mean": KINETICS_MEAN,
                                "std": KINETICS_STD}}
"""The clips of a checkpoint format that records none, where they are not the paper's: torchvision's ``s3d`` takes
224 x 224 clips at 15 fps with Kinetics' normalisation, as its inference transform gives them. That transform
resizes every frame to 256 x 256 (a 4:3 frame squashed) before its centre 224; frames here keep their aspect ratio
(the short side at 256 px, then the centre 224 x 224), so a wide video is seen narrower and undistorted. An embedding
uses these, and an export records them."""
FPS_RANGE = (0.01, 1000.0)
"""The frame rates videos may be decoded at (a store's, an embedding's, the synthetic videos'): one frame every
100 s to 1000 frames a second (past which a resampled video is made of copies of its frames)."""
MIN_LENGTH = 8
MIN_SIZE = 32
"""The smallest clip coclr takes, 8 frames of 32 x 32 pixels: the smallest that every stride of S3D halves exactly
down to a 1x1x1 map. (The layers themselves run on as little as 5 x 17 x 17, where the padded borders weigh on
every stage: a policy, not the layers' limit.)"""
MAX_CLIP_PIXELS = 2 ** 26
"""The most pixels a clip may hold, frames x side x side (256 frames of 512 x 512, 128 of 724 x 724; the paper's
32 x 128 x 128 is 0.5M): 0.8 GB of float32 a clip before the network's activations multiply it, where a typo
(a side of 100000) would ask for hundreds of gigabytes. Checkpoints' recorded clips are held to it too."""


def feature_map_size(length: int, height: int, width: int) -> tuple[int, int, int]:
    """The (T, H, W) of S3D's last feature map for clips of ``length`` x ``height`` x ``width``: what batch-norm in
    training mode averages over with the batch (one position at the smallest clips, so a batch of one clip has a
    single value per channel, which it cannot normalise)."""
    def halved(size: int) -> int:  # a stride-2 stage of window 7 or 3, padded to keep the size (conv1, 3x3 pools)
        return (size - 1) // 2 + 1

    t = halved(halved(length)) // 2  # Conv_1a, MaxPool_4a, MaxPool_5a (window 2, no padding)
    h, w = ((halved(halved(halved(halved(side))))) // 2 for side in (height, width))  # + MaxPool_2a, MaxPool_3a
    return t, h, w


MAX_SHORT_SIDE = 4320
"""The largest short side frames may be resized to (8K video's): beyond it every frame is only enlarged, and one
frame takes hundreds of megabytes."""


def check_short_side(value: int | None, key: str, least: int = 1) -> None:
    """Refuse, as ``ConfigError("key: ...")``, a short side to resize frames to outside ``least`` ..
    :data:`MAX_SHORT_SIDE` (None: the decoded size, fine)."""
    require(value is None or (whole_number(value) and least <= value <= MAX_SHORT_SIDE), key,
            f"must be a whole number of pixels from {least} to {MAX_SHORT_SIDE}, got {value!r}")


def _number(value: Any) -> bool:
    """Whether ``value`` is a real number (not a bool, not text)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fps(value: float | None, key: str) -> None:
    """Refuse a frame rate outside :data:`FPS_RANGE` (None: every decoded frame, fine)."""
    require(value is None or (_number(value) and FPS_RANGE[0] <= value <= FPS_RANGE[1]), key,
            f"must be a number between {FPS_RANGE[0]} and {FPS_RANGE[1]} frames per second, got {value!r}")


def check_normalisation(value: Any, key: str, positive: bool = False) -> None:
    """Refuse a per-channel mean or standard deviation (``positive``) that is not 3 finite numbers (None: the
    default, fine): a NaN or infinity makes every embedding NaN, a standard deviation of 0 every input infinite."""
    if value is None:
        return
    numbers = isinstance(value, (list, tuple)) and all(_number(v) for v in value)
    require(numbers and len(value) == 3, key, f"needs 3 values, got {value}")
    require(all(math.isfinite(v) for v in value), key,
            f"needs finite values, got {value} (a NaN or infinity would make every embedding NaN)")
    require(not positive or all(v > 0 for v in value), key, f"needs positive values, got {value}")


BOUND_RANGE = (0.05, 4096.0)
"""The flow bounds a view may have, in pixels: below, a step of the 255 is a thousandth of a pixel and every motion
is clipped; above, every motion of a frame rounds to the middle value (a bound of 1e30 stored flow of 128 only)."""


def check_bound(bound: float) -> float:
    """``bound`` as a float; a ``ValueError`` unless it is a number of pixels within :data:`BOUND_RANGE`."""
    if not (isinstance(bound, numbers.Real) and 0 < bound < float("inf")):
        raise ValueError(f"the flow bound must be a positive number of pixels, got {bound!r}")
    if not BOUND_RANGE[0] <= bound <= BOUND_RANGE[1]:
        raise ValueError(f"the flow bound must be from {BOUND_RANGE[0]:g} to {BOUND_RANGE[1]:g} px (20 is the I3D "
                         f"convention for frames of 128 px or more: scale it with the frame size), got {bound!r}")
    return float(bound)


def check_flow_bound(value: float | None, key: str) -> None:
    """Refuse a flow clipping bound that is not a number of pixels within :data:`BOUND_RANGE`
    (:func:`check_bound`; None: no flow, fine)."""
    if value is not None:
        try:
            check_bound(value if _number(value) else float("nan"))
        except ValueError as error:
            raise ConfigError(f"{key}: {error}") from None


def is_flow_view(view: str) -> bool:
    """Whether ``view`` names a flow view: its name starts with "flow" (``flow``, ``flow_dis``, ...), the one rule
    by which training, evaluation, embedding and an export's card tell a flow view (:mod:`coclr.data.views`) and
    ``coclr flow`` names the views it writes. Flow views have one frame fewer than the RGB they come from."""
    return view.startswith("flow")


def check_recorded(settings: Mapping[str, Any]) -> None:
    """Refuse recorded clip settings (a checkpoint's ``clip_settings``) that no reader can use, naming the key: a
    clip shape S3D cannot take, a frame rate, short side, normalisation or flow bound outside the rules the
    options that set them follow."""
    from_dict(ClipSettings, recorded_clips(settings))  # (its types and values, named as the options name them)
    view, method = settings.get("view"), settings.get("flow_method")
    if view is not None and not (isinstance(view, str) and view):  # (a number: a traceback in embed, eval, pretrain)
        raise ConfigError(f"view: must be the name of a view (rgb, flow, ...), got {view!r}")
    if method is not None and not isinstance(method, dict):
        raise ConfigError(f"flow_method: must be a mapping (its backend and parameters), got {method!r}")
    check_fps(settings.get("fps"), "fps")
    check_short_side(settings.get("short_side"), "short_side")
    check_normalisation(settings.get("mean"), "mean")
    check_normalisation(settings.get("std"), "std", positive=True)
    check_flow_bound(settings.get("flow_bound"), "flow_bound")


@dataclasses.dataclass(frozen=True)
class ClipSettings:
    """Frames per clip, the step between them and the side of the square crop fed to the network."""

    length: int = option(32, "frames per clip (the paper: 32)")
    stride: int = option(1, "temporal step between the frames of a clip (1: consecutive frames)")
    size: int = option(128, "side of the square crop fed to the network (the paper: 128)")

    def validate(self) -> None:
        for key in ("length", "stride", "size"):  # (a library caller's 8.5 failed every video, "8" a TypeError)
            require(whole_number(getattr(self, key)), key, f"must be a whole number, got {getattr(self, key)!r}")
        require(self.length >= MIN_LENGTH, "length", f"must be >= {MIN_LENGTH} (the smallest input S3D takes is "
                f"{MIN_LENGTH}x{MIN_SIZE}x{MIN_SIZE}), got {self.length}")
        require(self.stride >= 1, "stride", f"must be >= 1, got {self.stride}")
        require(self.size >= MIN_SIZE, "size", f"must be >= {MIN_SIZE} (the smallest S3D input), got {self.size}")
        pixels = self.length * self.size * self.size  # the key at fault: size when even the shortest clip is too big
        key = "size" if MIN_LENGTH * self.size * self.size > MAX_CLIP_PIXELS else "length"
        require(pixels <= MAX_CLIP_PIXELS, key, f"{self.length} frames of {self.size} x {self.size} px "
                f"are {pixels:,} pixels a clip ({pixels * 12 / 2 ** 30:,.1f} GiB as float32, before the network's "
                f"activations); at most {MAX_CLIP_PIXELS:,} (e.g. 256 frames of 512 x 512)")

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, options: Any) -> ClipSettings:
        """The clip settings of an options object that has ``length``, ``stride`` and ``size`` (a config)."""
        return cls(**{key: getattr(options, key) for key in CLIP_KEYS})

    @classmethod
    def check(cls, options: Any) -> None:
        """Validate the clip options of a config (errors name the option, as its own ``validate`` would)."""
        cls.of(options).validate()


CLIP_KEYS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(ClipSettings))
"""``("length", "stride", "size")``: the keys of a clip shape, in records and checkpoints."""

PAPER_CLIPS: dict[str, int] = ClipSettings().to_dict()
"""The paper's clips (used when a checkpoint records none)."""


def clip_option(key: str, help: str | None = None) -> Any:
    """A config field for clip setting ``key`` with its one default (``help``: a command's own wording)."""
    field = ClipSettings.__dataclass_fields__[key]
    return option(field.default, help or field.metadata["help"])


def recorded_clips(record: Mapping[str, Any]) -> dict[str, int]:
    """The clip keys present in a record (a checkpoint's ``clip_settings``, an evaluation's config)."""
    return {key: record[key] for key in CLIP_KEYS if record.get(key) is not None}
