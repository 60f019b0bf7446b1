"""Rendering a synthetic clip: scene and object appearance, motion paths, and the anti-aliased frames."""

from __future__ import annotations

import colorsys
import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from coclr.errors import ConfigError
from coclr.synth.config import (
    ACTORS,
    BACKGROUNDS,
    MOTIONS,
    OCTAVES,
    SHAPES,
    ZOOM_FADE,
    ZOOM_RANGE,
    SynthConfig,
    named_rng,
    parse_key,
)

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
