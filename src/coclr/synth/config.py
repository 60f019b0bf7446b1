"""The synthetic dataset's options, class names and layout: which clips exist, with their keys, labels, splits and
source groups, and the named random streams every clip is a function of."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from coclr.clips import MAX_SHORT_SIDE, check_fps
from coclr.config import option, require
from coclr.errors import ConfigError

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


MAX_CLIP_PIXELS = 2**27
"""The most pixels (frames x height x width) of one synthetic clip: each is rendered whole in memory (a clip of 10^8
frames failed with a MemoryError after minutes of work)."""


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
        require(16 <= self.height <= MAX_SHORT_SIDE, "height", f"must be from 16 to {MAX_SHORT_SIDE} pixels")
        require(16 <= self.width <= MAX_SHORT_SIDE, "width", f"must be from 16 to {MAX_SHORT_SIDE} pixels")
        require(self.frames * self.height * self.width <= MAX_CLIP_PIXELS, "frames",
                f"{self.frames} frames of {self.height} x {self.width} px are more than a clip is rendered in "
                f"memory as ({MAX_CLIP_PIXELS:,} pixels); give fewer frames, or smaller ones")
        check_fps(self.fps, "fps")
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
