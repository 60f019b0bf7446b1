"""The built-in synthetic dataset: classes are defined by motion, appearance is shared across classes.

It poses, in miniature, the problem CoCLR is about. Every clip shows a textured background and a few textured
foreground objects. The *class* is how the objects move (translate up, zoom in, oscillate, spin, ...); the
*appearance* (background texture and palette, object shapes, colours and sizes, lighting) belongs to a
*scene*, and each scene performs several classes. Train and test use disjoint scenes, so appearance cannot
tell the classes apart: an RGB network trained by instance discrimination is tempted to cluster by
appearance, while optical flow sees the motion. (``actor_cue`` > 0 adds appearance that correlates with the
class, each class's typical actor: an object shape and colours, as real actions have typical actors.)

Like UCF101, the clips of one (scene, action) pair are consecutive segments of one continuous source video
(a *group*: ``scene0003_zoom_in``), and entries are keyed ``scene0003/zoom_in/c01``.

Every class is invariant under a horizontal flip (training augmentation flips clips, and CoCLR pairs flipped
and unflipped views of one video), so there is "translate_horizontal" rather than left and right, and
"rotate" and "circle" in either sense.

Each clip is a pure function of ``(config, clip key)``: randomness comes from generators seeded with the
seed and the names of the scene, group and clip, so parallel or resumed generation gives identical bytes.
Rendering is vectorised NumPy over all frames of a clip, with analytic, band-limited textures and
anti-aliased shape edges, so that motion is sub-pixel smooth and optical flow can follow it.

Example::

    config = load_config(SynthConfig, overrides=["frames=16"])
    summary = generate_synthetic("data/synth", config, workers=2)
"""

from __future__ import annotations

import colorsys
import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coclr.config import option, require, to_dict, validate
from coclr.atomic import atomic_write_text
from coclr.data.indexes import VideoEntry, VideoIndex
from coclr.data.jobs import JobSummary, run_entry_jobs
from coclr.data.jpeg import encode_jpeg
from coclr.data.store import create_store
from coclr.errors import ConfigError, DataError

MOTIONS: tuple[str, ...] = (
    "translate_up",
    "translate_down",
    "translate_horizontal",
    "oscillate_horizontal",
    "oscillate_vertical",
    "zoom_in",
    "zoom_out",
    "rotate",
    "circle",
    "still",
)
"""Motion classes, in the order ``num_classes`` takes them. All are invariant under a horizontal flip."""

SHAPES: tuple[str, ...] = ("disc", "square", "triangle", "ring", "cross", "hexagon", "ellipse")
"""Shapes a scene draws its objects from."""
ACTORS: dict[str, str] = {
    "translate_up": "triangle",
    "translate_down": "disc",
    "translate_horizontal": "ellipse",
    "oscillate_horizontal": "square",
    "oscillate_vertical": "hexagon",
    "zoom_in": "ring",
    "zoom_out": "dome",
    "rotate": "cross",
    "circle": "disc",
    "still": "square",
}
"""The typical actor's shape for each class, taken with probability ``actor_cue``; "dome" is an actor
shape only, so the scenes' own shapes do not depend on this table. The actor's colours are
``actor_colours(motion)``."""
BACKGROUNDS: tuple[str, ...] = ("noise", "stripes", "checker")

KEY_PATTERN = re.compile(r"^(scene\d{4})/([a-z_]+)/c(\d{2,})$")
ZOOM_RANGE = (0.6, 1.5)
"""Smallest and largest size of an object, relative to its base size (zooming objects sweep this range;
the others get a fixed size from it, so single frames of every class show the same sizes)."""
OCTAVES = 3
"""Octaves of the background texture (see ``render_background``)."""
ZOOM_FADE = 0.2
"""Fraction of a zoom cycle over which an object fades in (and out) so that cycles do not pop."""


@dataclass
class SynthConfig:
    """Options of the synthetic dataset generator. Lengths are fractions of the frame's shorter side."""

    seed: int = option(0, "random seed; the whole dataset is a function of it and of the other options")
    num_classes: int = option(8, f"number of motion classes: the first N of {', '.join(MOTIONS)}; with "
                              "`motions`, its length")
    motions: list[str] = option([], "the classes by motion name, in label order (empty: the first num_classes "
                                "of MOTIONS), for a class set that leaves some motions out")
    train_scenes: int = option(24, "scenes (appearances) used for the training split")
    test_scenes: int = option(8, "scenes used for the test split (disjoint from the training scenes)")
    actions_per_scene: int = option(4, "how many classes each scene performs (labels are balanced)")
    clips_per_action: int = option(2, "clips per (scene, action): consecutive segments of one source video")
    frames: int = option(16, "frames per clip")
    height: int = option(32, "frame height in pixels")
    width: int = option(32, "frame width in pixels")
    fps: float = option(25.0, "frame rate recorded in the store")
    objects_min: int = option(2, "fewest foreground objects in a scene")
    objects_max: int = option(3, "most foreground objects in a scene")
    size_min: float = option(0.12, "smallest base object radius (fraction of the shorter side)")
    size_max: float = option(0.2, "largest base object radius (fraction of the shorter side)")
    speed_min: float = option(0.035, "slowest object speed, fraction of the shorter side per frame "
                              "(0.035 is 2.2 px/frame at 64 px); rotation and zoom use it at the rim")
    speed_max: float = option(0.06, "fastest object speed, fraction of the shorter side per frame")
    period_min: float = option(7.0, "shortest period (frames) of oscillation, circling and zoom cycles")
    period_max: float = option(10.0, "longest period (frames) of oscillation, circling and zoom cycles")
    camera_drift: float = option(0.006, "largest camera pan speed, fraction of the shorter side per frame")
    camera_jitter: float = option(0.004, "camera shake (standard deviation, fraction of the shorter side)")
    noise: float = option(0.01, "standard deviation of the per-pixel Gaussian noise (intensities in [0, 1])")
    actor_cue: float = option(0.0, "probability that an object of a (scene, action) video is the action's "
                              "typical actor (shape from ACTORS, colours from actor_colours): appearance that "
                              "correlates with the class as real actions have typical actors and places; "
                              "0: appearance says nothing of the class")
    jpeg_quality: int = option(95, "JPEG quality of the stored frames (95: luma within about 1 level at 32x32)")

    def validate(self) -> None:
        require(self.seed >= 0, "seed", "must be non-negative")
        require(2 <= self.num_classes <= len(MOTIONS), "num_classes", f"must be in [2, {len(MOTIONS)}]")
        unknown = [name for name in self.motions if name not in MOTIONS]
        require(not unknown, "motions", f"unknown motions {unknown} (known: {', '.join(MOTIONS)})")
        require(len(set(self.motions)) == len(self.motions), "motions", "must not repeat a motion")
        require(not self.motions or len(self.motions) == self.num_classes, "num_classes",
                f"must equal the number of names in motions ({len(self.motions)}), got {self.num_classes}")
        require(self.train_scenes >= 1, "train_scenes", "must be at least 1")
        require(self.test_scenes >= 1, "test_scenes", "must be at least 1")
        require(1 <= self.actions_per_scene <= self.num_classes, "actions_per_scene",
                f"must be in [1, num_classes={self.num_classes}]")
        require(self.train_scenes * self.actions_per_scene >= self.num_classes, "train_scenes",
                "train_scenes * actions_per_scene must be at least num_classes (every class in training)")
        require(self.test_scenes * self.actions_per_scene >= self.num_classes, "test_scenes",
                "test_scenes * actions_per_scene must be at least num_classes (every class in the test)")
        require(self.train_scenes + self.test_scenes <= 10000, "train_scenes", "at most 10000 scenes in all")
        require(1 <= self.clips_per_action <= 99, "clips_per_action", "must be in [1, 99]")
        require(self.frames >= 2, "frames", "must be at least 2")
        require(self.height >= 16, "height", "must be at least 16")
        require(self.width >= 16, "width", "must be at least 16")
        require(self.fps > 0, "fps", "must be positive")
        require(1 <= self.objects_min <= self.objects_max, "objects_min", "must be in [1, objects_max]")
        require(self.objects_max <= 8, "objects_max", "must be at most 8")
        require(0 < self.size_min <= self.size_max, "size_min", "must be in (0, size_max]")
        require(self.size_max * ZOOM_RANGE[1] < 0.5, "size_max", f"must be below {0.5 / ZOOM_RANGE[1]:.3f}")
        require(0 < self.speed_min <= self.speed_max, "speed_min", "must be in (0, speed_max]")
        require(self.speed_max <= 0.25, "speed_max", "must be at most 0.25")
        require(2 < self.period_min <= self.period_max, "period_min", "must be in (2, period_max]")
        require(0 <= self.camera_drift <= 0.05, "camera_drift", "must be in [0, 0.05]")
        require(0 <= self.camera_jitter <= 0.05, "camera_jitter", "must be in [0, 0.05]")
        require(0 <= self.noise <= 0.2, "noise", "must be in [0, 0.2]")
        require(0 <= self.actor_cue <= 1, "actor_cue", "must be in [0, 1]")
        require(1 <= self.jpeg_quality <= 100, "jpeg_quality", "must be in [1, 100]")

    @property
    def classes(self) -> list[str]:
        """The class names, index = label."""
        return list(self.motions) or list(MOTIONS[: self.num_classes])


# ----------------------------------------------------------------------------------------------- randomness


def _name_words(name: str) -> list[int]:
    return list(np.frombuffer(hashlib.blake2b(name.encode(), digest_size=16).digest(), dtype="<u4").tolist())


def named_rng(seed: int, *names: str) -> np.random.Generator:
    """A generator that is a pure function of the seed and the names (stable across runs and platforms)."""
    words = [seed]
    for name in names:
        words.extend(_name_words(name))
    return np.random.default_rng(np.random.SeedSequence(words))


# ------------------------------------------------------------------------------------------ dataset layout


@dataclass(frozen=True)
class ClipSpec:
    """One clip of the dataset: its store key, label, split and source group."""

    key: str
    label: int
    split: str
    group: str


def scene_name(index: int) -> str:
    return f"scene{index:04d}"


def clip_key(scene: str, action: str, clip: int) -> str:
    """The store key of clip ``clip`` (1-based) of ``action`` in ``scene``: ``scene0003/zoom_in/c01``."""
    return f"{scene}/{action}/c{clip:02d}"


def parse_key(key: str) -> tuple[str, str, int]:
    """``(scene, action, clip)`` of a clip key; raises ConfigError naming the key if it is malformed."""
    match = KEY_PATTERN.match(key)
    if match is None or match.group(2) not in MOTIONS:
        raise ConfigError(f"synthetic clip key {key!r} is not of the form sceneNNNN/<motion>/cNN")
    return match.group(1), match.group(2), int(match.group(3))


def scene_actions(seed: int, num_scenes: int, per_scene: int, num_classes: int, split: str) -> list[list[int]]:
    """The classes each scene performs: balanced (class counts differ by at most one), random combinations.

    Scenes are filled one by one with the least used classes so far, ties broken at random.
    """
    rng = named_rng(seed, "actions", split)
    counts = np.zeros(num_classes, dtype=np.int64)
    plan = []
    for _ in range(num_scenes):
        order = np.lexsort((rng.random(num_classes), counts))
        chosen = sorted(int(c) for c in order[:per_scene])
        counts[chosen] += 1
        plan.append(chosen)
    return plan


def dataset_clips(config: SynthConfig) -> list[ClipSpec]:
    """Every clip of the dataset, train scenes first; a function of the config only."""
    classes = config.classes
    clips = []
    first_scene = 0
    for split, num_scenes in (("train", config.train_scenes), ("test", config.test_scenes)):
        plan = scene_actions(config.seed, num_scenes, config.actions_per_scene, config.num_classes, split)
        for offset, labels in enumerate(plan):
            scene = scene_name(first_scene + offset)
            for label in labels:
                group = f"{scene}_{classes[label]}"
                for clip in range(1, config.clips_per_action + 1):
                    clips.append(ClipSpec(clip_key(scene, classes[label], clip), label, split, group))
        first_scene += num_scenes
    return clips


# ------------------------------------------------------------------------------------------- appearance


def _random_colour(rng: np.random.Generator, saturation: tuple[float, float],
                   value: tuple[float, float]) -> np.ndarray:
    """An RGB colour in [0, 1] from a random hue and the given saturation and value ranges."""
    hue = rng.random()
    sat = rng.uniform(*saturation)
    val = rng.uniform(*value)
    channel = np.array([0.0, 2.0 / 3.0, 1.0 / 3.0])
    rgb = np.clip(np.abs(((hue + channel) % 1.0) * 6.0 - 3.0) - 1.0, 0.0, 1.0)
    return val * (1.0 - sat + sat * rgb)


def _contrasting_colour(rng: np.random.Generator, against: np.ndarray, distance: float = 0.35) -> np.ndarray:
    """A saturated colour at least ``distance`` (Euclidean, RGB in [0, 1]) from ``against``, so that objects
    stand out from the background and optical flow can follow them (the best of a few draws)."""
    best, best_distance = against, -1.0
    for _ in range(16):
        colour = _random_colour(rng, (0.5, 1.0), (0.3, 1.0))
        gap = float(np.linalg.norm(colour - against))
        if gap > best_distance:
            best, best_distance = colour, gap
        if gap >= distance:
            break
    return best


@dataclass(frozen=True)
class ObjectStyle:
    """Appearance of one foreground object: shape, two pattern colours, pattern, base radius."""

    shape: str
    colours: np.ndarray  # [2, 3]
    pattern: str  # "stripes" or "sectors"
    pattern_frequency: float
    pattern_phase: float
    radius: float  # base radius, fraction of the shorter side


@dataclass(frozen=True)
class SceneStyle:
    """Appearance shared by every clip of a scene (a place and its actors)."""

    background: str
    palette: np.ndarray  # [2, 3] background colours
    frequencies: np.ndarray  # [K, 2] background wave vectors, cycles per shorter side
    phases: np.ndarray  # [K]
    amplitudes: np.ndarray  # [K]
    sharpness: float
    objects: tuple[ObjectStyle, ...]
    gain: float
    gradient: np.ndarray  # [2] lighting gradient per shorter side (x, y)


def scene_style(config: SynthConfig, scene: str) -> SceneStyle:
    """The appearance of ``scene``: a pure function of the seed and the scene name."""
    rng = named_rng(config.seed, "scene", scene)
    background = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    if background == "noise":
        count = 6
        magnitude = rng.uniform(1.0, 2.0, count)
    else:
        count = 1
        magnitude = rng.uniform(1.2, 2.4, count)
    angle = rng.uniform(0, 2 * math.pi, count)
    frequencies = np.stack([magnitude * np.cos(angle), magnitude * np.sin(angle)], axis=1)
    palette = np.stack([_random_colour(rng, (0.2, 0.8), (0.25, 0.9)) for _ in range(2)])
    num_objects = int(rng.integers(config.objects_min, config.objects_max + 1))
    objects = tuple(
        ObjectStyle(
            shape=SHAPES[int(rng.integers(len(SHAPES)))],
            colours=np.stack([_contrasting_colour(rng, palette.mean(0)) for _ in range(2)]),
            pattern=("stripes", "sectors")[int(rng.integers(2))],
            pattern_frequency=float(rng.uniform(1.0, 1.6)),
            pattern_phase=float(rng.uniform(0, 2 * math.pi)),
            radius=float(rng.uniform(config.size_min, config.size_max)),
        )
        for _ in range(num_objects)
    )
    gradient_angle = rng.uniform(0, 2 * math.pi)
    gradient = rng.uniform(0.0, 0.3) * np.array([math.cos(gradient_angle), math.sin(gradient_angle)])
    return SceneStyle(
        background=background,
        palette=palette,
        frequencies=frequencies,
        phases=rng.uniform(0, 2 * math.pi, count),
        amplitudes=rng.uniform(0.5, 1.0, count),
        sharpness=float(rng.uniform(1.5, 4.0)),
        objects=objects,
        gain=float(rng.uniform(0.75, 1.15)),
        gradient=gradient,
    )


# ------------------------------------------------------------------------------------------------- motion


@dataclass(frozen=True)
class Trajectory:
    """Screen-independent state of one object over the frames of a clip (world coordinates, pixels)."""

    x: np.ndarray  # [T] centre
    y: np.ndarray  # [T]
    radius: np.ndarray  # [T] pixels
    angle: np.ndarray  # [T] radians
    opacity: np.ndarray  # [T] in [0, 1]


def _sawtooth(times: np.ndarray, period: float, phase: float) -> tuple[np.ndarray, np.ndarray]:
    """(cycle index, position in the cycle in [0, 1)) of each time."""
    cycles = times / period + phase
    index = np.floor(cycles)
    return index, cycles - index


def zoom_rate(speed: float, side: float) -> float:
    """Growth of the log-size per frame of a zoom whose motion is ``speed`` pixels/frame half a frame away
    from its centre."""
    return speed / (0.5 * side)


def object_trajectory(motion: str, times: np.ndarray, rng: np.random.Generator, sign: float,
                      speed: float, base_radius: float, period: float, frame: tuple[float, float]) -> Trajectory:
    """Trajectory of one object performing ``motion`` at ``times`` (frame numbers of the source video).

    ``speed`` is in pixels per frame (at the rim for rotation and zoom), ``base_radius`` in pixels,
    ``frame = (height, width)``. ``rng`` draws the object's own start state; ``sign`` (+1 or -1) is the
    sense shared by the objects of a group (left or right, clockwise or not).
    """
    height, width = frame
    steps = len(times)
    x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
    angle0 = rng.uniform(0, 2 * math.pi)
    phase = rng.uniform(0, 1)
    log_low, log_high = math.log(ZOOM_RANGE[0]), math.log(ZOOM_RANGE[1])
    fixed_radius = base_radius * math.exp(rng.uniform(log_low, log_high))
    x, y = np.full(steps, x0), np.full(steps, y0)
    radius = np.full(steps, fixed_radius)
    angle = np.full(steps, angle0)
    opacity = np.ones(steps)
    wave = np.sin(2 * math.pi * (times / period + phase))
    amplitude = speed * period / (2 * math.pi)  # peak speed of a sinusoid = speed
    if motion == "translate_up":
        y = y0 - speed * times
    elif motion == "translate_down":
        y = y0 + speed * times
    elif motion == "translate_horizontal":
        x = x0 + sign * speed * times
    elif motion == "oscillate_horizontal":
        x = x0 + amplitude * wave
    elif motion == "oscillate_vertical":
        y = y0 + amplitude * wave
    elif motion == "circle":
        turn = 2 * math.pi * (times / period + phase)
        x = x0 + amplitude * np.cos(sign * turn)
        y = y0 + amplitude * np.sin(sign * turn)
    elif motion == "rotate":
        angle = angle0 + sign * (speed / fixed_radius) * times
    elif motion in ("zoom_in", "zoom_out"):
        # The object grows (or shrinks) at the camera's zoom rate, the rim moving at about ``speed``.
        period = math.log(ZOOM_RANGE[1] / ZOOM_RANGE[0]) / zoom_rate(speed, min(height, width))
        cycle, progress = _sawtooth(times, period, phase)
        growth = progress if motion == "zoom_in" else 1.0 - progress
        radius = base_radius * np.exp(log_low + (log_high - log_low) * growth)
        opacity = np.clip(np.minimum(progress, 1.0 - progress) / ZOOM_FADE, 0.0, 1.0)
        # Each cycle appears somewhere else (a low-discrepancy walk), so positions stay uniform.
        x = (x0 + cycle * 0.6180339887 * width) % width
        y = (y0 + cycle * 0.7548776662 * height) % height
    elif motion != "still":
        raise ConfigError(f"unknown motion {motion!r} (known: {', '.join(MOTIONS)})")
    return Trajectory(x=x, y=y, radius=radius, angle=angle, opacity=opacity)


def camera_path(times: np.ndarray, rng: np.random.Generator, drift: float,
                jitter: float) -> tuple[np.ndarray, np.ndarray]:
    """Camera offset (x, y) in pixels at ``times``: a slow pan plus a smooth shake.

    The shake is a sum of random sinusoids (periods of 3 to 12 frames, standard deviation ``jitter``), a
    function of time alone, so every clip of a group sees the same camera at the same source time.
    """
    direction = rng.uniform(0, 2 * math.pi)
    speed = rng.uniform(0, drift)
    waves = 4
    periods = rng.uniform(3.0, 12.0, size=(2, waves))
    phases = rng.uniform(0, 2 * math.pi, size=(2, waves))
    shake = np.sin(2 * math.pi * times[None, :, None] / periods[:, None, :] + phases[:, None, :]).sum(-1)
    shake *= jitter * math.sqrt(2.0 / waves)  # each sinusoid has variance 1/2
    return speed * math.cos(direction) * times + shake[0], speed * math.sin(direction) * times + shake[1]


# ---------------------------------------------------------------------------------------------- rendering


def _polygon_sdf(u: np.ndarray, v: np.ndarray, sides: int) -> np.ndarray:
    """Signed distance (unit circumradius) to a regular polygon with a vertex on the +u axis (approximate
    outside, exact along edges: enough for a one-pixel anti-aliased edge)."""
    apothem = math.cos(math.pi / sides)
    distance = np.full(u.shape, -np.inf)
    for k in range(sides):
        normal = math.pi / sides + 2 * math.pi * k / sides
        np.maximum(distance, u * math.cos(normal) + v * math.sin(normal) - apothem, out=distance)
    return distance


def shape_sdf(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Signed distance to ``shape`` in object units (radius 1), negative inside."""
    if shape == "disc":
        return np.hypot(u, v) - 1.0
    if shape == "ring":
        return np.abs(np.hypot(u, v) - 0.68) - 0.32
    if shape == "square":
        return np.maximum(np.abs(u), np.abs(v)) - 0.8
    if shape == "triangle":
        return _polygon_sdf(u, v, 3)
    if shape == "hexagon":
        return _polygon_sdf(u, v, 6)
    if shape == "cross":
        au, av = np.abs(u), np.abs(v)
        return np.minimum(np.maximum(au - 1.0, av - 0.38), np.maximum(au - 0.38, av - 1.0))
    if shape == "ellipse":
        return (np.hypot(u, v / 0.55) - 1.0) * 0.55
    if shape == "dome":
        return np.maximum(np.hypot(u, v + 0.4) - 1.0, -v)
    raise ConfigError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)}, dome)")


def object_pattern(style: ObjectStyle, u: np.ndarray, v: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """Pattern in [0, 1] painted on the object, in object coordinates (so it turns and scales with it).

    ``radius`` (pixels) caps the stripe frequency at a period of 4 pixels, below which stripes would alias.
    """
    if style.pattern == "stripes":
        cycles = np.minimum(style.pattern_frequency * 1.5, radius / 2.0)
        wave = np.sin(math.pi * cycles * u + style.pattern_phase)
    else:
        sectors = round(1 + style.pattern_frequency)  # 2 or 3 sectors: unambiguous at rim speeds used
        wave = np.sin(sectors * np.arctan2(v, u) + style.pattern_phase) * np.clip(np.hypot(u, v) / 0.35, 0, 1)
    return 0.5 + 0.5 * wave


def texture_field(style: SceneStyle, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """The scene's band-limited texture (about [-1, 1]) at coordinates in units of the shorter side."""
    field = np.zeros(np.broadcast_shapes(xs.shape, ys.shape))
    for (fx, fy), phase, amplitude in zip(style.frequencies, style.phases, style.amplitudes):
        wave = np.sin(2 * math.pi * (fx * xs + fy * ys) + phase)
        if style.background == "checker":
            wave = wave * np.sin(2 * math.pi * (-fy * xs + fx * ys) + phase)
        field += amplitude * wave
    return field / max(1.0, math.sqrt(float((style.amplitudes**2).sum()) / 2))


def render_background(style: SceneStyle, xs: np.ndarray, ys: np.ndarray, zoom: np.ndarray,
                      view: tuple[float, float]) -> np.ndarray:
    """Background colours ``[T, H, W, 3]`` at coordinates ``xs [T, 1, W]``, ``ys [T, H, 1]`` (units of the
    shorter side, origin at the zoom centre) for a camera zoom of ``zoom [T]`` octaves; ``view`` is the
    texture point at the zoom centre.

    The texture is a sum of octaves (2x apart) whose weights rise and fall with the zoom, so a camera can
    zoom in or out forever without a jump (the visual analogue of a Shepard tone); a fixed zoom gives the
    same kind of picture, so single frames do not tell zooming classes from the others.
    """
    phase = (zoom % 1.0)[:, None, None]
    field = np.zeros(np.broadcast_shapes(xs.shape, ys.shape))
    for octave in range(OCTAVES):
        scale = 2.0 ** (octave + phase - 1)
        weight = np.sin(math.pi * (octave + phase) / OCTAVES) ** 2
        field += weight * texture_field(style, xs / scale + view[0], ys / scale + view[1])
    field /= OCTAVES / 2  # the weights sum to OCTAVES / 2 at every zoom
    mix = 1.0 / (1.0 + np.exp(-style.sharpness * field))
    return style.palette[0] + (style.palette[1] - style.palette[0]) * mix[..., None]


def composite_object(canvas: np.ndarray, style: ObjectStyle, path: Trajectory, cam_x: np.ndarray,
                     cam_y: np.ndarray, frame: tuple[int, int]) -> None:
    """Paint one object over ``canvas [T, H, W, 3]`` in place, wrapping around the frame edges."""
    height, width = frame
    steps = len(path.x)
    centre_x = (path.x - cam_x)[:, None, None]
    centre_y = (path.y - cam_y)[:, None, None]
    dx = (np.arange(width)[None, None, :] + 0.5 - centre_x + width / 2) % width - width / 2
    dy = (np.arange(height)[None, :, None] + 0.5 - centre_y + height / 2) % height - height / 2
    cos, sin = np.cos(path.angle)[:, None, None], np.sin(path.angle)[:, None, None]
    radius = path.radius[:, None, None]
    u = (cos * dx + sin * dy) / radius
    v = (-sin * dx + cos * dy) / radius
    coverage = np.clip(0.5 - shape_sdf(style.shape, u, v) * radius, 0.0, 1.0)
    alpha = (coverage * path.opacity[:, None, None]).reshape(steps, height, width, 1)
    pattern = object_pattern(style, u, v, radius)[..., None]
    colour = style.colours[0] + (style.colours[1] - style.colours[0]) * pattern
    canvas *= 1.0 - alpha
    canvas += alpha * colour


def actor_colours(motion: str) -> np.ndarray:
    """The two pattern colours ``[2, 3]`` of ``motion``'s typical actor: a bright and a dark shade of a hue
    of its own (the classes' hues are evenly spaced around the colour wheel)."""
    rgb = np.array(colorsys.hsv_to_rgb(MOTIONS.index(motion) / len(MOTIONS), 1.0, 1.0))
    return np.stack([0.95 * rgb, 0.45 * rgb])


def group_objects(config: SynthConfig, style: SceneStyle, scene: str, motion: str) -> tuple[ObjectStyle, ...]:
    """The objects of the (scene, motion) group: the scene's, each replaced by the motion's typical actor
    (shape ``ACTORS[motion]``, colours ``actor_colours(motion)``; pattern and size stay the scene's) with
    probability ``config.actor_cue``, drawn per group so that all clips of a video agree."""
    draws = named_rng(config.seed, "actor", f"{scene}_{motion}").random(len(style.objects))
    actor = {"shape": ACTORS[motion], "colours": actor_colours(motion)}
    return tuple(dataclasses.replace(obj, **actor) if draw < config.actor_cue else obj
                 for obj, draw in zip(style.objects, draws))


def render_clip(config: SynthConfig, key: str) -> np.ndarray:
    """The frames ``uint8 [T, H, W, 3]`` (RGB) of clip ``key``: a pure function of the config and the key."""
    scene, motion, clip = parse_key(key)
    if motion not in config.classes:
        raise ConfigError(f"synthetic clip key {key!r}: motion {motion!r} is not among the "
                          f"{config.num_classes} classes of this config")
    height, width = config.height, config.width
    side = float(min(height, width))
    style = scene_style(config, scene)
    group = named_rng(config.seed, "group", f"{scene}_{motion}")
    times = np.arange((clip - 1) * config.frames, clip * config.frames, dtype=np.float64)
    cam_x, cam_y = camera_path(times, group, config.camera_drift * side, config.camera_jitter * side)
    view_x, view_y = group.uniform(0, 4, size=2)  # the part of the background this group films
    speed = group.uniform(config.speed_min, config.speed_max) * side
    sign = float(group.choice([-1.0, 1.0]))
    light = group.uniform(0.92, 1.08)
    centre_x = width / 2 + group.uniform(-0.15, 0.15) * side
    centre_y = height / 2 + group.uniform(-0.15, 0.15) * side
    zoom = np.full(len(times), group.uniform(0, 1))
    if motion in ("zoom_in", "zoom_out"):
        octaves_per_frame = zoom_rate(speed, side) / math.log(2)
        zoom = zoom + (1.0 if motion == "zoom_in" else -1.0) * octaves_per_frame * times

    xs = (np.arange(width)[None, None, :] + 0.5 + cam_x[:, None, None] - centre_x) / side
    ys = (np.arange(height)[None, :, None] + 0.5 + cam_y[:, None, None] - centre_y) / side
    canvas = render_background(style, xs, ys, zoom, (view_x, view_y))
    for object_style in group_objects(config, style, scene, motion):
        path = object_trajectory(
            motion, times, group, sign,
            speed=speed * group.uniform(0.9, 1.1),
            base_radius=object_style.radius * side * group.uniform(0.9, 1.1),
            period=group.uniform(config.period_min, config.period_max),
            frame=(height, width),
        )
        composite_object(canvas, object_style, path, cam_x, cam_y, (height, width))

    gx = (np.arange(width) + 0.5 - width / 2) / side
    gy = (np.arange(height) + 0.5 - height / 2) / side
    lighting = style.gain * light * (1.0 + style.gradient[0] * gx[None, :] + style.gradient[1] * gy[:, None])
    canvas *= lighting[None, :, :, None]
    if config.noise > 0:
        canvas += named_rng(config.seed, "noise", key).normal(0.0, config.noise, size=canvas.shape)
    return np.clip(np.rint(canvas * 255.0), 0, 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------------ outputs


def synthetic_index(config: SynthConfig) -> VideoIndex:
    """The :class:`~coclr.data.indexes.VideoIndex` of the dataset (entry paths are the clip keys)."""
    entries = [VideoEntry(c.key, c.label, c.split, c.group) for c in dataset_clips(config)]
    return VideoIndex("synth", config.classes, entries)


@dataclass(frozen=True)
class SynthClipJob:
    """Store job of the "rgb" view: render a clip and encode its frames as JPEG (picklable)."""

    config: SynthConfig

    def __call__(self, key: str) -> tuple[list[bytes], float]:
        frames = render_clip(self.config, key)
        return [encode_jpeg(frame, self.config.jpeg_quality) for frame in frames], self.config.fps


@dataclass
class SynthSummary:
    """What :func:`generate_synthetic` did: the dataset's size and the store job's summary."""

    out: str
    config: SynthConfig
    train: int
    test: int
    job: JobSummary

    @property
    def ok(self) -> bool:
        return not self.job.failed

    def __str__(self) -> str:
        c = self.config
        return (f"synthetic dataset in {self.out}: {c.num_classes} motion classes, {self.train} train clips "
                f"({c.train_scenes} scenes), {self.test} test clips ({c.test_scenes} scenes), {c.frames} frames "
                f"of {c.width}x{c.height}, seed {c.seed}\n{self.job}")


def generate_synthetic(out: str | Path, config: SynthConfig, workers: int = 0) -> SynthSummary:
    """Write the dataset as a clip store at ``out`` (index + "rgb" view), in parallel and resumably.

    The generator's options are recorded in the store metadata, so resuming into ``out`` with other options
    fails with a clear error naming each of them (:func:`~coclr.data.store.create_store`) instead of mixing two
    datasets. ``workers``: processes (0: one per core).
    """
    validate(config)
    index = synthetic_index(config)
    create_store(out, index, generator="coclr.data.synth", synth=recorded_options(config))
    keys = [entry.path for entry in index.entries]
    job = run_entry_jobs(out, "rgb", keys, SynthClipJob(config), workers, desc="rendering synthetic clips")
    counts = index.split_counts()
    return SynthSummary(str(out), config, counts.get("train", 0), counts.get("test", 0), job)


def recorded_options(config: SynthConfig) -> dict[str, Any]:
    """The options written to a store's metadata. ``motions`` is left out while empty: stores generated
    before that option existed do not record it, and they still resume."""
    options = to_dict(config)
    if not options["motions"]:
        del options["motions"]
    return options


def write_videos(out_dir: str | Path, config: SynthConfig, codec: str = "libx264") -> Path:
    """Write every clip as an MP4 file under ``out_dir`` (``<key>.mp4``) and a CSV manifest
    ``manifest.csv`` (``path,label,split,group``, labels as class names) for
    :func:`~coclr.data.indexes.csv_index`, so the video-file path of the data pipeline can be tested on the
    same data. H.264 needs even sizes, and lossy coding means decoded frames are close to, not equal to,
    the store's. Returns the manifest path; existing complete files are kept (resumable)."""
    import csv
    import io

    import av

    validate(config)
    if config.height % 2 or config.width % 2:
        raise ConfigError(f"height/width: MP4 (H.264) output needs even sizes, got {config.width}x{config.height}")
    out_dir = Path(out_dir)
    rows = []
    for clip in dataset_clips(config):
        path = out_dir / f"{clip.key}.mp4"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.partial")
            try:
                _encode_mp4(temp, render_clip(config, clip.key), config.fps, codec, av)
                temp.replace(path)
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
        rows.append([f"{clip.key}.mp4", config.classes[clip.label], clip.split, clip.group])
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["path", "label", "split", "group"])
    writer.writerows(rows)
    manifest = out_dir / "manifest.csv"
    atomic_write_text(manifest, text.getvalue())
    return manifest


def _encode_mp4(path: Path, frames: np.ndarray, fps: float, codec: str, av) -> None:
    from fractions import Fraction

    try:
        with av.open(str(path), mode="w", format="mp4") as container:
            stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": "18"} if codec == "libx264" else {}
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    except av.FFmpegError as error:
        raise DataError(f"{path}: cannot encode MP4 with codec {codec!r}: {error}") from None


# -------------------------------------------------------------------------------------------- diagnostics
# Simple, fixed features that check the dataset poses the intended problem: appearance alone should not
# tell the classes apart across scenes, motion should (used by the tests and benchmarks/bench_synth.py).


def appearance_features(frames: np.ndarray) -> np.ndarray:
    """Appearance of a clip ``uint8 [T, H, W, 3]``: a 4x4x4 colour histogram of all its frames and an
    8x8 thumbnail of its first frame (what one frame shows, without motion)."""
    import cv2

    bins = (frames // 64).reshape(-1, 3).astype(np.int64)
    histogram = np.bincount(bins[:, 0] * 16 + bins[:, 1] * 4 + bins[:, 2], minlength=64) / len(bins)
    thumbnail = cv2.resize(frames[0], (8, 8), interpolation=cv2.INTER_AREA).reshape(-1) / 255.0
    return np.concatenate([histogram * 8.0, thumbnail])


def clip_flow(frames: np.ndarray) -> np.ndarray:
    """Optical flow ``float32 [T-1, H, W, 2]`` between consecutive frames (OpenCV DIS, fast preset
    "medium"): a quick stand-in for the TV-L1 flow of the training pipeline."""
    import cv2

    gray = [cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY) for frame in frames]
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)
    return np.stack([dis.calc(a, b, None) for a, b in zip(gray[:-1], gray[1:])])


def motion_features(flow: np.ndarray) -> np.ndarray:
    """Motion of a clip from its flow ``[T-1, H, W, 2]``: a magnitude-weighted histogram of flow
    directions, the mean flow and its temporal autocorrelation (translation vs oscillation), the radial
    flow about the frame centre and the mean divergence (zoom), the mean absolute curl (rotation) and the
    mean speed."""
    import cv2

    steps, height, width, _ = flow.shape
    u, v = flow[..., 0], flow[..., 1]
    magnitude = np.hypot(u, v)
    direction = ((np.arctan2(v, u) + math.pi) / (2 * math.pi) * 8).astype(np.int64) % 8
    histogram = np.stack([np.bincount(d.ravel(), weights=m.ravel(), minlength=8)
                          for d, m in zip(direction, magnitude)])
    histogram /= histogram.sum(axis=1, keepdims=True) + 1e-6
    weight = magnitude.sum(axis=(1, 2)) + 1e-6
    mean_u = (u * magnitude).sum(axis=(1, 2)) / weight
    mean_v = (v * magnitude).sum(axis=(1, 2)) / weight
    energy = float((mean_u**2 + mean_v**2).mean()) + 1e-6
    lags = [float((mean_u[:-lag] * mean_u[lag:] + mean_v[:-lag] * mean_v[lag:]).mean()) / energy
            if lag < steps else 0.0 for lag in (2, 4)]
    ys, xs = np.mgrid[0:height, 0:width] + 0.5
    rx, ry = xs - width / 2, ys - height / 2
    radial = float(((u * rx + v * ry) / (np.hypot(rx, ry) + 1e-6)).mean())
    smooth = np.stack([cv2.GaussianBlur(f, (0, 0), 2) for f in flow])
    divergence = np.gradient(smooth[..., 0], axis=2) + np.gradient(smooth[..., 1], axis=1)
    curl = np.gradient(smooth[..., 1], axis=2) - np.gradient(smooth[..., 0], axis=1)
    return np.concatenate([histogram.mean(axis=0), [
        np.abs(mean_u).mean(), mean_v.mean(), np.abs(mean_v).mean(), *lags, radial,
        divergence.mean(), np.abs(curl).mean(), magnitude.mean()]])


def nearest_neighbour_accuracy(train: np.ndarray, train_labels: np.ndarray, test: np.ndarray,
                               test_labels: np.ndarray) -> float:
    """Accuracy of 1-nearest-neighbour classification (Euclidean, features standardised on ``train``)."""
    mean, std = train.mean(axis=0), train.std(axis=0) + 1e-6
    train, test = (train - mean) / std, (test - mean) / std
    distances = ((test[:, None, :] - train[None, :, :]) ** 2).sum(axis=-1)
    return float((train_labels[distances.argmin(axis=1)] == test_labels).mean())
