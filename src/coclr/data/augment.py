"""Batched, clip-consistent video augmentation (CPU or GPU) and the evaluation-time crops.

Augmentation runs in the training loop on whole batches of stored frames (``uint8 [B, T, H, W, 3]``) after
they reach the device, and returns model inputs (``float [B, 3, T, size, size]``, normalised). Parameters are
drawn once per clip from a CPU :class:`torch.Generator`, so every frame of a clip gets the same crop, flip,
colour jitter, grayscale and blur, all views of a sample share crop and flip, and CPU and GPU runs with the
same seed draw the same parameters.

View kinds (see :func:`coclr.data.views.view_kind`):

- ``"rgb"``: colour frames; geometric and colour operations.
- ``"flow"``: stored optical flow (channel 0 = u, 1 = v, 2 = 128; value ``q`` decodes to ``q * 40/255 - 20``
  pixels). Geometric operations only; a horizontal flip maps ``u -> 1 - u`` in [0, 1] space, which is the
  exact negation of the decoded horizontal flow. Flow values are not rescaled by the crop's zoom (as in the
  reference); they go through the same [0, 1] scaling and per-channel normalisation as RGB.
- ``"rgbdiff"``: RGB given with ``T + 1`` frames; every operation of ``"rgb"`` is applied, then the output is
  the difference of consecutive normalised frames (``T`` frames), i.e. ``(x[t+1] - x[t]) / std``.

Example::

    augment = ClipAugment(size=128)
    out = augment({"rgb": rgb_uint8, "flow": flow_uint8}, torch.Generator().manual_seed(0))
    out["rgb"].shape  # [B, 3, T, 128, 128]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from coclr.clips import IMAGENET_MEAN, IMAGENET_STD
from coclr.config import option, require
from coclr.data.augment_cpu import crop_clip, rgb_to_planes
from coclr.data.views import VIEW_KINDS, view_kind
from coclr.errors import DataError

LUMA_WEIGHTS = (0.299, 0.587, 0.114)
CROP_CANDIDATES = 10
TEN_CROP_ORDER = ("top_left", "top_right", "bottom_left", "bottom_right", "center")


@dataclass
class AugmentParams:
    """The random parameters of one batch, one row per clip, on the CPU.

    Boxes are ``(x0, y0, w, h)`` in pixels of a ``height x width`` frame whose pixel ``i`` covers
    ``[i, i + 1)``; they are not rounded (sub-pixel crops). Jitter factors follow torchvision's ColorJitter:
    multiplicative factors for brightness, contrast and saturation, an additive hue shift in turns.
    """

    height: int
    width: int
    boxes: Tensor  # float64 [B, 4]
    flip: Tensor  # bool [B]
    jitter: Tensor  # bool [B]: colour jitter applied
    jitter_factors: Tensor  # float64 [B, 4]: brightness, contrast, saturation, hue
    jitter_order: Tensor  # int64 [B, 4]: a permutation of the four jitter ops (indices into JITTER_OPS)
    grayscale: Tensor  # bool [B]
    blur: Tensor  # bool [B]
    blur_sigma: Tensor  # float64 [B]

    @property
    def batch_size(self) -> int:
        return self.boxes.shape[0]

    def select(self, index: slice | Tensor) -> AugmentParams:
        """The parameters of a subset of the clips (e.g. one process's share of a global batch)."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)
                                           if isinstance(getattr(self, f.name), Tensor)})


@dataclass
class AugmentOptions:
    """What a training run chooses of its augmentation: the pretrain configuration's ``augment`` options, recorded
    in its run folder. :class:`ClipAugment` is these and the settings no run changes (crop side, aspect ratios,
    jitter strengths, blur sigmas, normalisation); ``ClipAugment.of(options, size)`` makes one."""

    crop_area: list[float] = option([0.2, 1.0], "range of the crop area as a fraction of the frame area (random "
                                                "resized crop)")
    flip_p: float = option(0.5, "probability of a horizontal flip (flow's u is negated when flipped)")
    jitter_p: float = option(0.8, "probability of colour jitter per clip (RGB only; strengths 0.4, 0.4, 0.4, 0.1 as "
                                  "torchvision's ColorJitter)")
    gray_p: float = option(0.2, "probability of converting a clip to luminance grayscale (RGB only)")
    blur_p: float = option(0.5, "probability of Gaussian blur per clip (RGB only; sigma 0.1-2; 0 for finetuning)")
    cpu_8bit: bool = option(True, "on CPU tensors, augment clip by clip in 8 bits (C loops and OpenCV), rounding "
                                  "after each operation as the authors' PIL pipeline does (several times faster); "
                                  "false: the device path's float operations")

    def validate(self) -> None:
        area = tuple(self.crop_area)
        require(len(area) == 2 and 0 < area[0] <= area[1] <= 1, "crop_area",
                f"must be [min, max] with 0 < min <= max <= 1, got {list(area)}")
        for key in ("flip_p", "jitter_p", "gray_p", "blur_p"):
            value = getattr(self, key)
            require(0 <= value <= 1, key, f"must be a probability in [0, 1], got {value}")


@dataclass
class ClipAugment(AugmentOptions):
    """Training augmentation of a batch of clips: random resized crop, flip, colour jitter, grayscale, blur.

    Call it as ``augment(views, generator)``; or ``draw_params`` then ``apply`` to reuse or inspect the
    parameters. Crops never squash the frame: the crop box has the drawn aspect ratio (log-uniform in
    ``ratio``) and area (uniform fraction of the frame in ``area``); like torchvision, up to 10 candidate boxes
    are drawn per clip (vectorised, always the same number of random draws) and the first that fits the frame
    is used; if none fits (probability ~1e-5 at 128x171), the last is shrunk into the frame keeping its
    aspect ratio. The four jitter ops run in a random order per clip, as in torchvision's ColorJitter.
    Finetuning uses ``blur_p=0``. On CPU tensors (``cpu_8bit``) the same operations and parameters run in
    8 bits, clip by clip (:meth:`_cpu_clips`); on a GPU, in float over the whole batch.
    """

    size: int = option(128, "output height and width of the crops")
    ratio: tuple[float, float] = option((3 / 4, 4 / 3), "range of the crop aspect ratio w/h (log-uniform)")
    jitter: tuple[float, float, float, float] = option(
        (0.4, 0.4, 0.4, 0.1), "colour jitter strengths: brightness, contrast, saturation, hue (torchvision)")
    blur_sigma: tuple[float, float] = option((0.1, 2.0), "range of the Gaussian blur sigma in output pixels")
    mean: tuple[float, float, float] = option(IMAGENET_MEAN, "per-channel mean for normalisation")
    std: tuple[float, float, float] = option(IMAGENET_STD, "per-channel standard deviation for normalisation")
    kinds: dict[str, str] = option({}, "view name -> kind (rgb, flow, rgbdiff) for names the naming rule "
                                       "('rgb', 'rgbdiff', 'flow...') does not cover")

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def of(cls, options: AugmentOptions, size: int) -> ClipAugment:
        """The augmentation a run's ``options`` choose, with crops of ``size``."""
        return cls(size=size, **{field.name: getattr(options, field.name)
                                 for field in dataclasses.fields(AugmentOptions)})

    def validate(self) -> None:
        super().validate()
        require(self.size >= 1, "size", f"must be positive, got {self.size}")
        require(len(self.ratio) == 2 and 0 < self.ratio[0] <= self.ratio[1], "ratio",
                f"must be (min, max) with 0 < min <= max, got {self.ratio}")
        require(len(self.jitter) == 4 and all(s >= 0 for s in self.jitter) and self.jitter[3] <= 0.5, "jitter",
                f"must be 4 non-negative strengths with hue <= 0.5, got {self.jitter}")
        require(len(self.blur_sigma) == 2 and 0 < self.blur_sigma[0] <= self.blur_sigma[1], "blur_sigma",
                f"must be (min, max) with 0 < min <= max, got {self.blur_sigma}")
        require(self.blur_radius < self.size, "blur_sigma",
                f"max sigma {self.blur_sigma[1]} needs a kernel radius {self.blur_radius} below size {self.size}")
        require(len(self.mean) == 3, "mean", f"needs 3 values, got {self.mean}")
        require(len(self.std) == 3 and all(s > 0 for s in self.std), "std", f"needs 3 positive values, got {self.std}")
        for name, kind in self.kinds.items():
            require(kind in VIEW_KINDS, f"kinds.{name}", f"{kind!r} is not one of {', '.join(VIEW_KINDS)}")

    @property
    def blur_radius(self) -> int:
        """Radius of a batch's Gaussian kernel array: 3 sigma of the largest sigma (each clip's kernel is zero
        beyond 3 of its own sigma, :func:`kernel_radius`)."""
        return math.ceil(3 * self.blur_sigma[1])

    def __call__(self, views: Mapping[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
        """Augment every view of the batch with one parameter draw per clip."""
        batch, height, width = check_views(views, self.kinds)
        return self.apply(views, self.draw_params(batch, height, width, generator))

    def draw_params(self, batch_size: int, height: int, width: int, generator: torch.Generator) -> AugmentParams:
        """Draw the parameters of ``batch_size`` clips of ``height x width`` frames (always the same draws)."""
        if generator.device.type != "cpu":
            raise ValueError(f"generator must be a CPU torch.Generator, got one on {generator.device}")
        if min(batch_size, height, width) < 1:
            raise DataError(f"cannot draw parameters for batch {batch_size} of {height}x{width} frames")

        def uniform(low: float, high: float, *shape: int) -> Tensor:
            return low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)

        boxes = sample_crop_boxes(batch_size, height, width, tuple(self.crop_area), self.ratio, generator)
        flip = torch.rand(batch_size, generator=generator) < self.flip_p
        jitter = torch.rand(batch_size, generator=generator) < self.jitter_p
        brightness, contrast, saturation, hue = self.jitter
        jitter_factors = torch.stack([
            uniform(max(0.0, 1 - brightness), 1 + brightness, batch_size),
            uniform(max(0.0, 1 - contrast), 1 + contrast, batch_size),
            uniform(max(0.0, 1 - saturation), 1 + saturation, batch_size),
            uniform(-hue, hue, batch_size),
        ], dim=1)
        jitter_order = torch.rand(batch_size, len(JITTER_OPS), generator=generator).argsort(dim=1)
        grayscale = torch.rand(batch_size, generator=generator) < self.gray_p
        blur = torch.rand(batch_size, generator=generator) < self.blur_p
        blur_sigma = uniform(self.blur_sigma[0], self.blur_sigma[1], batch_size)
        return AugmentParams(height, width, boxes, flip, jitter, jitter_factors, jitter_order, grayscale, blur,
                             blur_sigma)

    def apply(self, views: Mapping[str, Tensor], params: AugmentParams) -> dict[str, Tensor]:
        """Apply ``params`` to every view: ``uint8 [B, T, H, W, 3]`` -> normalised ``float [B, 3, T', S, S]``."""
        batch, height, width = check_views(views, self.kinds)
        if (batch, height, width) != (params.batch_size, params.height, params.width):
            raise DataError(f"views of batch {batch} with {height}x{width} frames do not match parameters drawn "
                            f"for batch {params.batch_size} with {params.height}x{params.width} frames")
        on_device = DeviceParams.upload(params, self.mean, self.std, next(iter(views.values())).device)
        out = {}
        for name, frames in views.items():
            kind = view_kind(name, self.kinds)
            if frames.device.type == "cpu" and self.cpu_8bit:
                out[name] = self._cpu_clips(frames, params, kind)
                continue
            clips = crop_resize(frames, on_device.boxes[:, None], on_device.flip[:, None], self.size)[:, 0]
            if kind == "flow":
                clips = negate_flow_u(clips, on_device.flip)
            else:
                clips = self._colour(clips, on_device)
            out[name] = _finish(clips, kind, on_device.mean, on_device.std)
        return out

    def _cpu_clips(self, frames: Tensor, params: AugmentParams, kind: str) -> Tensor:
        """The CPU path of :meth:`apply`: ``uint8 [B, T, H, W, 3]`` -> normalised ``float [B, 3, T, S, S]``.

        The operations and parameters of the device path, computed clip by clip in 8 bits, rounding after each
        operation as the authors' PIL pipeline does (a few grey levels from the device path's float result): each
        clip's working set stays in the cache, and 8-bit vectorised loops do the per-pixel work with a quarter of
        float32's memory traffic. The crop and the normalisation are :mod:`coclr.data.augment_cpu`'s C loops, the
        colour operations and the blur OpenCV's.
        """
        batch, steps = frames.shape[:2]
        out = torch.empty((batch, 3, steps, self.size, self.size), dtype=torch.float32)
        scale = [1 / (255 * s) for s in self.std]
        shift = [-m / s for m, s in zip(self.mean, self.std)]
        planes = out.numpy().reshape(batch, 3, steps * self.size, self.size)
        for b in range(batch):
            clip = crop_resize_u8(frames[b].numpy(), params.boxes[b].tolist(), bool(params.flip[b]), self.size)
            if kind == "flow":
                if params.flip[b]:
                    np.subtract(255, clip[..., 0], out=clip[..., 0])
            else:
                clip = colour_clip_u8(clip, params, b, self.blur_radius)
            rgb_to_planes(np.ascontiguousarray(clip), scale, shift, planes[b])  # x / (255 std) - mean / std
        return frame_difference(out) if kind == "rgbdiff" else out

    def _colour(self, clips: Tensor, params: DeviceParams) -> Tensor:
        """Colour jitter, grayscale and blur of RGB clips in [0, 1], each on the clips drawn for it."""
        for op_index, index, factor in params.jitter_steps:
            clips[index] = JITTER_OPS[op_index](clips[index], factor.to(clips.dtype))
        if params.grayscale is not None:
            clips[params.grayscale] = grayscale(clips[params.grayscale])
        if params.blur is not None:
            sigma = params.blur_sigma.to(clips.dtype)
            clips[params.blur] = gaussian_blur(clips[params.blur], sigma, self.blur_radius)
        return clips


@dataclass
class DeviceParams:
    """A batch's augmentation parameters on the augmenting device, as :meth:`ClipAugment.apply` uses them.

    Built by :meth:`upload` from the CPU draw in one host-to-device copy (pinned and non-blocking on CUDA): a
    blocking copy waits for the GPU's queue, and the per-op copies it replaces were 20 or more per view. Which
    clips each operation touches is decided on the CPU (the draw is there), so the sizes of the index tensors
    are known to the host and no Python branch depends on a device value.
    """

    boxes: Tensor  # float64 [B, 4]
    flip: Tensor  # bool [B]
    jitter_steps: list[tuple[int, Tensor, Tensor]]  # (JITTER_OPS index, clip indices, factors), in order
    grayscale: Tensor | None  # int64 clip indices, None when no clip is converted
    blur: Tensor | None  # int64 clip indices, None when no clip is blurred
    blur_sigma: Tensor  # float64, one per blurred clip
    mean: Tensor  # float64 [3]
    std: Tensor  # float64 [3]

    @staticmethod
    def upload(params: AugmentParams, mean: tuple[float, ...], std: tuple[float, ...],
               device: torch.device) -> DeviceParams:
        """Pack ``params`` (CPU) into one float64 buffer, copy it to ``device`` once, and slice it there."""
        parts: list[Tensor] = [params.boxes.reshape(-1).double(), params.flip.double()]
        jitter: list[tuple[int, int]] = []  # (op index, clips)
        for position in range(len(JITTER_OPS)):
            for op_index in range(len(JITTER_OPS)):
                chosen = torch.nonzero(params.jitter & (params.jitter_order[:, position] == op_index)).flatten()
                if len(chosen):
                    jitter.append((op_index, len(chosen)))
                    parts += [chosen.double(), params.jitter_factors[chosen, op_index].double()]
        gray = torch.nonzero(params.grayscale).flatten()
        blur = torch.nonzero(params.blur).flatten()
        parts += [gray.double(), blur.double(), params.blur_sigma[blur].double(),
                  torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)]
        host = torch.cat(parts)
        if device.type == "cuda":
            host = host.pin_memory()
        values = host.to(device, non_blocking=True)
        batch = params.batch_size
        sizes = [4 * batch, batch, *(n for _, count in jitter for n in (count, count)), len(gray), len(blur),
                 len(blur), 3, 3]
        pieces = list(values.split(sizes))
        boxes, flip = pieces[0].view(batch, 4), pieces[1].bool()
        steps = [(op_index, pieces[2 + 2 * i].long(), pieces[3 + 2 * i]) for i, (op_index, _) in enumerate(jitter)]
        gray_index, blur_index, sigma, mean_t, std_t = pieces[2 + 2 * len(jitter):]
        return DeviceParams(boxes, flip, steps, gray_index.long() if len(gray) else None,
                            blur_index.long() if len(blur) else None, sigma, mean_t, std_t)


def check_views(views: Mapping[str, Tensor], kinds: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """Check that every view is ``uint8 [B, T, H, W, 3]`` with shared ``B, H, W``; return ``(B, H, W)``."""
    if not views:
        raise DataError("no views to augment")
    shape = None
    for name, frames in views.items():
        kind = view_kind(name, kinds)
        if frames.dtype != torch.uint8 or frames.ndim != 5 or frames.shape[-1] != 3:
            raise DataError(f"view {name!r}: expected uint8 [B, T, H, W, 3], got {frames.dtype} "
                            f"{list(frames.shape)}")
        if kind == "rgbdiff" and frames.shape[1] < 2:
            raise DataError(f"view {name!r}: rgbdiff needs T + 1 >= 2 frames, got {frames.shape[1]}")
        batch, _, height, width, _ = frames.shape
        if shape is None:
            shape = (name, batch, height, width)
        elif (batch, height, width) != shape[1:]:
            raise DataError(f"view {name!r}: batch {batch} of {height}x{width} frames, but view {shape[0]!r} has "
                            f"batch {shape[1]} of {shape[2]}x{shape[3]} frames")
    assert shape is not None
    return shape[1], shape[2], shape[3]


def sample_crop_boxes(batch_size: int, height: int, width: int, area: tuple[float, float],
                      ratio: tuple[float, float], generator: torch.Generator) -> Tensor:
    """Random ``(x0, y0, w, h)`` boxes with area fraction in ``area`` and aspect ratio ``w/h`` in ``ratio``.

    Draws ``CROP_CANDIDATES`` candidates per clip and keeps the first that fits the frame; if none fits, the
    last is shrunk (same aspect ratio) to the largest box that fits. Never stretches the aspect ratio.
    """
    shape = (batch_size, CROP_CANDIDATES)
    fraction = area[0] + (area[1] - area[0]) * torch.rand(shape, generator=generator, dtype=torch.float64)
    log_ratio = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * torch.rand(
        shape, generator=generator, dtype=torch.float64)
    box_area = fraction * height * width
    w = torch.sqrt(box_area * log_ratio.exp())
    h = torch.sqrt(box_area / log_ratio.exp())
    fits = (w <= width) & (h <= height)
    pick = torch.where(fits.any(dim=1), fits.to(torch.int8).argmax(dim=1), CROP_CANDIDATES - 1)[:, None]
    w, h = w.gather(1, pick)[:, 0], h.gather(1, pick)[:, 0]
    shrink = torch.clamp(torch.minimum(width / w, height / h), max=1.0)
    w, h = w * shrink, h * shrink
    offset = torch.rand(batch_size, 2, generator=generator, dtype=torch.float64)
    x0 = offset[:, 0] * (width - w)
    y0 = offset[:, 1] * (height - h)
    return torch.stack([x0, y0, w, h], dim=1)


def crop_resize(frames: Tensor, boxes: Tensor, flip: Tensor, size: int) -> Tensor:
    """Bilinear crops of ``uint8 [B, T, H, W, 3]`` frames: ``float [B, N, 3, T, size, size]`` in [0, 1].

    ``boxes`` is ``[B, N, 4]`` (``x0, y0, w, h`` in pixels) and ``flip`` ``bool [B, N]``: N crops per clip, all
    frames alike, in one ``grid_sample`` over the clip's frames stacked as channels. Output pixel ``j`` samples
    the frame at ``x0 + (j + 0.5) * w / size - 0.5`` (pixel centres at integers, as ``F.interpolate`` with
    ``align_corners=False`` on the cropped box); edge pixels are replicated outside the frame. No antialiasing.
    """
    batch, steps, height, width, _ = frames.shape
    crops = boxes.shape[1]
    device = frames.device
    boxes = boxes.to(device=device, dtype=torch.float32)
    centres = (torch.arange(size, device=device, dtype=torch.float32) + 0.5) / size
    xs = boxes[..., 0:1] + centres * boxes[..., 2:3]  # [B, N, S] in frame coordinates (0 .. width)
    ys = boxes[..., 1:2] + centres * boxes[..., 3:4]
    xs = torch.where(flip.to(device)[..., None], xs.flip(-1), xs)
    grid = torch.stack(torch.broadcast_tensors((xs * (2 / width) - 1)[:, :, None, :],
                                               (ys * (2 / height) - 1)[:, :, :, None]), dim=-1)
    channels = torch.empty((batch, 3, steps, height, width), dtype=torch.float32, device=device)
    channels.copy_(frames.permute(0, 4, 1, 2, 3))
    out = F.grid_sample(channels.view(batch, 3 * steps, height, width), grid.view(batch, crops * size, size, 2),
                        mode="bilinear", padding_mode="border", align_corners=False)
    return out.div_(255).view(batch, 3, steps, crops, size, size).permute(0, 3, 1, 2, 4, 5)


def crop_resize_u8(frames: np.ndarray, box: list[float], flip: bool, size: int) -> np.ndarray:
    """:func:`crop_resize` of one clip in 8 bits: ``uint8 [T, H, W, 3]`` -> ``uint8 [T, size, size, 3]``.

    The same sample positions, bilinear, edge pixels replicated (:func:`coclr.data.augment_cpu.crop_clip`:
    positions to 1/2048 pixel, the result rounded once).
    """
    height, width = frames.shape[1:3]
    x0, y0, w, h = box
    centres = (np.arange(size, dtype=np.float64) + 0.5) / size
    xs = np.clip(x0 + centres * w - 0.5, 0, width - 1)
    ys = np.clip(y0 + centres * h - 0.5, 0, height - 1)
    return crop_clip(frames, xs[::-1] if flip else xs, ys)


def colour_clip_u8(clip: np.ndarray, params: AugmentParams, index: int, blur_radius: int) -> np.ndarray:
    """:meth:`ClipAugment._colour` of clip ``index`` in 8 bits (``uint8 [T, S, S, 3]``, changed in place): the
    jitter ops in the clip's drawn order, grayscale, blur; OpenCV, each result rounded (as PIL's)."""
    steps, height, width, _ = clip.shape
    image = clip.reshape(steps * height, width, 3)  # the per-pixel ops see the clip as one tall image
    if params.jitter[index]:
        factors = params.jitter_factors[index].tolist()
        for op_index in params.jitter_order[index].tolist():
            image = _JITTER_U8[op_index](image, factors[op_index])
    if params.grayscale[index]:
        image = cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)
    clip = image.reshape(steps, height, width, 3)
    if params.blur[index]:
        sigma = params.blur_sigma[index : index + 1]
        own = int(kernel_radius(sigma))  # the taps beyond it are zero: not run
        kernel = gaussian_kernels(sigma, blur_radius)[0, blur_radius - own : blur_radius + own + 1].numpy()
        for frame in clip:
            cv2.sepFilter2D(frame, -1, kernel, kernel, dst=frame, borderType=cv2.BORDER_REFLECT_101)
    return clip


def _scale_u8(image: np.ndarray, factor: float, constant: float = 0.0) -> np.ndarray:
    """``round(factor * image + constant)``, saturated to 0..255."""
    return cv2.addWeighted(image, factor, image, 0.0, constant)


def _brightness_u8(image: np.ndarray, factor: float) -> np.ndarray:
    return _scale_u8(image, factor)


def _contrast_u8(image: np.ndarray, factor: float) -> np.ndarray:
    mean = float(np.dot(cv2.mean(image)[:3], LUMA_WEIGHTS))  # the clip's mean luminance
    return _scale_u8(image, factor, (1.0 - factor) * mean)


def _saturation_u8(image: np.ndarray, factor: float) -> np.ndarray:
    """``factor * rgb + (1 - factor) * luminance`` per pixel: one 3x3 colour matrix (``cv2.transform``)."""
    matrix = factor * np.eye(3) + (1.0 - factor) * np.tile(LUMA_WEIGHTS, (3, 1))
    return cv2.transform(image, matrix.astype(np.float32))


def _hue_u8(image: np.ndarray, shift: float) -> np.ndarray:
    """Hue rotation in 8-bit HSV (hue in 256ths of a turn, wrapping), as torchvision's PIL ``adjust_hue``."""
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV_FULL)
    hue = hsv[..., 0]
    np.add(hue, np.uint8(round(shift * 256) % 256), out=hue, casting="unsafe")
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL)


_JITTER_U8: tuple[Callable[[np.ndarray, float], np.ndarray], ...] = (
    _brightness_u8, _contrast_u8, _saturation_u8, _hue_u8)


def center_crop(views: Tensor | Mapping[str, Tensor], size: int, kinds: Mapping[str, str] | None = None,
                mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD,
                ) -> Tensor | dict[str, Tensor]:
    """Evaluation crop: resize the short side to ``size``, take the centre ``size x size``; normalise.

    Computed as one bilinear resize of the centred square of side ``min(H, W)`` (no intermediate rounding).
    Takes ``uint8 [B, T, H, W, 3]`` (an RGB view) or a dict of views; returns ``float [B, 3, T', size, size]``
    (or a dict of them). No colour operations and no flip; ``mean``/``std`` as in training.
    """
    return _eval_crops(views, size, kinds, mean, std, ten=False)


def ten_crop(views: Tensor | Mapping[str, Tensor], size: int, short_side: int | None = None,
             kinds: Mapping[str, str] | None = None, mean: tuple[float, ...] = IMAGENET_MEAN,
             std: tuple[float, ...] = IMAGENET_STD) -> Tensor | dict[str, Tensor]:
    """The finetune test crops: ``float [B, 10, 3, T', size, size]`` (or a dict of them), normalised.

    Crops 0-4 are ``TEN_CROP_ORDER`` (top-left, top-right, bottom-left, bottom-right, centre), 5-9 the same
    crops flipped horizontally (flow's u negated), as torchvision's TenCrop. The crops are ``size x size``
    pixels of the frame after resizing its short side to ``short_side`` (default: no resize).
    """
    return _eval_crops(views, size, kinds, mean, std, ten=True, short_side=short_side)


def _eval_crops(views: Tensor | Mapping[str, Tensor], size: int, kinds: Mapping[str, str] | None,
                mean: tuple[float, ...], std: tuple[float, ...], ten: bool,
                short_side: int | None = None) -> Tensor | dict[str, Tensor]:
    single = isinstance(views, Tensor)
    named: Mapping[str, Tensor] = {"rgb": views} if single else views
    batch, height, width = check_views(named, kinds)
    if ten:
        scale = min(height, width) / (short_side or min(height, width))
        side = size * scale
        if side > min(height, width) + 1e-9:
            raise DataError(f"ten_crop: crop size {size} exceeds the {height}x{width} frames "
                            f"(short side resized to {short_side or min(height, width)})")
        right, bottom, cx, cy = width - side, height - side, (width - side) / 2, (height - side) / 2
        corners = [(0, 0), (right, 0), (0, bottom), (right, bottom), (cx, cy)]
        boxes = torch.tensor([[x, y, side, side] for x, y in corners] * 2, dtype=torch.float64)
        flip = torch.tensor([False] * 5 + [True] * 5)
    else:
        side = min(height, width)
        boxes = torch.tensor([[(width - side) / 2, (height - side) / 2, side, side]], dtype=torch.float64)
        flip = torch.tensor([False])
    boxes = boxes.expand(batch, -1, -1)
    flip = flip.expand(batch, -1)
    out = {}
    for name, frames in named.items():
        kind = view_kind(name, kinds)
        clips = crop_resize(frames, boxes, flip, size)
        if kind == "flow":
            clips = negate_flow_u(clips, flip)
        clips = _finish(clips, kind, mean, std)
        out[name] = clips if ten else clips[:, 0]
    return out["rgb"] if single else out


def _finish(clips: Tensor, kind: str, mean: tuple[float, ...] | Tensor, std: tuple[float, ...] | Tensor) -> Tensor:
    """Normalise ``[..., 3, T, H, W]`` clips in [0, 1]; difference consecutive frames for rgbdiff."""
    clips = normalize(clips, mean, std)
    return frame_difference(clips) if kind == "rgbdiff" else clips


def normalize(clips: Tensor, mean: tuple[float, ...] | Tensor = IMAGENET_MEAN,
              std: tuple[float, ...] | Tensor = IMAGENET_STD) -> Tensor:
    """``(x - mean) / std`` per channel of ``[..., 3, T, H, W]`` clips in [0, 1] (RGB and flow alike); ``mean``
    and ``std`` as tuples or as tensors already on the clips' device (no copy per call).

    Returns a new contiguous tensor.
    """
    shape = (3, 1, 1, 1)
    mean_t = torch.as_tensor(mean, device=clips.device).to(clips.dtype).view(shape)
    std_t = torch.as_tensor(std, device=clips.device).to(clips.dtype).view(shape)
    out = torch.empty(clips.shape, dtype=clips.dtype, device=clips.device)
    return torch.sub(clips, mean_t, out=out).div_(std_t)


def frame_difference(clips: Tensor) -> Tensor:
    """Differences of consecutive frames, ``x[t + 1] - x[t]``, of ``[..., C, T + 1, H, W]`` -> ``T`` frames."""
    return clips[..., 1:, :, :] - clips[..., :-1, :, :]


def negate_flow_u(clips: Tensor, flip: Tensor) -> Tensor:
    """Negate the horizontal flow (``u -> 1 - u`` in [0, 1]) of flipped clips.

    ``clips`` is ``[B, 3, T, H, W]`` or ``[B, N, 3, T, H, W]`` with ``flip`` ``bool [B]`` or ``[B, N]``.
    """
    flip = flip.to(clips.device).view(*flip.shape, 1, 1, 1)
    u = clips[..., 0, :, :, :]
    clips[..., 0, :, :, :] = torch.where(flip, 1 - u, u)
    return clips


def _per_clip(values: Tensor) -> Tensor:
    """``[B]`` -> ``[B, 1, 1, 1, 1]`` to broadcast over ``[B, 3, T, H, W]``."""
    return values.view(-1, 1, 1, 1, 1)


def luminance(clips: Tensor) -> Tensor:
    """ITU-R 601 luma ``0.299 R + 0.587 G + 0.114 B`` of ``[B, 3, T, H, W]`` -> ``[B, 1, T, H, W]``."""
    red, green, blue = clips.unbind(1)
    return (LUMA_WEIGHTS[0] * red + LUMA_WEIGHTS[1] * green + LUMA_WEIGHTS[2] * blue).unsqueeze(1)


def grayscale(clips: Tensor) -> Tensor:
    """Luminance replicated to 3 channels (torchvision's Grayscale(3), with 0.299/0.587/0.114 weights)."""
    return luminance(clips).expand_as(clips)


def _blend(image: Tensor, other: Tensor, factor: Tensor) -> Tensor:
    """``clamp(f * image + (1 - f) * other, 0, 1)`` with a factor per clip (torchvision's ``_blend``)."""
    factor = _per_clip(factor)
    return (factor * image + (1 - factor) * other).clamp_(0, 1)


def adjust_brightness(clips: Tensor, factor: Tensor) -> Tensor:
    """Scale intensities by ``factor`` per clip, clamped to [0, 1]."""
    return (clips * _per_clip(factor)).clamp_(0, 1)


def adjust_contrast(clips: Tensor, factor: Tensor) -> Tensor:
    """Blend each clip with the mean luminance of the whole clip (all frames: one intensity map per clip)."""
    return _blend(clips, luminance(clips).mean(dim=(1, 2, 3, 4), keepdim=True), factor)


def adjust_saturation(clips: Tensor, factor: Tensor) -> Tensor:
    """Blend each pixel with its luminance."""
    return _blend(clips, luminance(clips), factor)


def adjust_hue(clips: Tensor, shift: Tensor) -> Tensor:
    """Rotate the HSV hue by ``shift`` turns per clip (torchvision's adjust_hue; S and V unchanged).

    RGB -> hue as torchvision (in sextants, [0, 6)), then back with the closed form
    ``channel_n = V - C * clamp(min(k, 4 - k), 0, 1)``, ``k = (n + hue) mod 6``, ``n = 5, 3, 1`` for R, G, B,
    where V is the max and C the max - min of the pixel's channels; in-place where possible (it is the
    costliest jitter op).
    """
    red, green, blue = clips.unbind(1)
    value = torch.maximum(red, green)
    torch.maximum(value, blue, out=value)
    chroma = torch.minimum(red, green)
    torch.minimum(chroma, blue, out=chroma)
    torch.sub(value, chroma, out=chroma)
    is_red, is_green = value == red, value == green
    numerator = torch.where(is_red, green - blue, torch.where(is_green, blue - red, red - green))
    base = torch.where(is_red, 0.0, torch.where(is_green, 2.0, 4.0))
    hue = numerator.div_(torch.where(chroma > 0, chroma, 1.0)).add_(base).add_(6 * shift.view(-1, 1, 1, 1))
    out = torch.empty_like(clips)
    for channel, offset in enumerate((5.0, 3.0, 1.0)):
        k = torch.add(hue, offset).remainder_(6)
        torch.sub(value, torch.minimum(k, 4 - k).clamp_(0, 1).mul_(chroma), out=out[:, channel])
    return out


JITTER_OPS: tuple[Callable[[Tensor, Tensor], Tensor], ...] = (
    adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


def kernel_radius(sigma: Tensor) -> Tensor:
    """The radius of each sigma's Gaussian kernel: ``ceil(3 sigma)`` taps on each side (OpenCV's choice for 8-bit
    images; PIL's Gaussian blur, which the authors' pipeline uses, spans about as far)."""
    return torch.ceil(3 * sigma)


def gaussian_kernels(sigma: Tensor, radius: int) -> Tensor:
    """Normalised 1-D Gaussian kernels ``[B, 2 * radius + 1]``, one per sigma, each zero beyond its own
    :func:`kernel_radius` (``radius`` is the largest: one array for the batch)."""
    taps = torch.arange(-radius, radius + 1, dtype=sigma.dtype, device=sigma.device)
    weights = torch.exp(-0.5 * (taps / sigma[:, None]) ** 2)
    weights = torch.where(taps.abs() <= kernel_radius(sigma)[:, None], weights, 0)
    return weights / weights.sum(dim=1, keepdim=True)


def gaussian_blur(clips: Tensor, sigma: Tensor, radius: int) -> Tensor:
    """Separable Gaussian blur of ``[B, C, T, H, W]`` clips, one sigma per clip, reflect borders (OpenCV's
    BORDER_REFLECT_101), kernel ``2 * radius + 1`` taps; one depthwise conv per axis for the whole batch."""
    batch, channels, steps, height, width = clips.shape
    planes = batch * channels * steps
    kernel = gaussian_kernels(sigma, radius).to(clips.dtype)
    kernel = kernel[:, None, :].expand(batch, channels * steps, -1).reshape(planes, 1, 1, 2 * radius + 1)
    x = clips.reshape(1, planes, height, width)
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="reflect"), kernel, groups=planes)
    x = F.conv2d(F.pad(x, (0, 0, radius, radius), mode="reflect"), kernel.transpose(2, 3), groups=planes)
    return x.view(batch, channels, steps, height, width)
