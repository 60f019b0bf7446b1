"""Batched clip augmentation against slow per-clip references (slicing + F.interpolate, numpy, colorsys, OpenCV)."""

from __future__ import annotations

import colorsys
import dataclasses
import math
import sys
import types

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coclr.config import from_dict
from coclr.data.augment import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    JITTER_OPS,
    AugmentParams,
    ClipAugment,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    center_crop,
    crop_resize,
    gaussian_blur,
    ten_crop,
)
from coclr.data.views import view_kind
from coclr.errors import ConfigError, DataError

MEAN = np.array(IMAGENET_MEAN).reshape(3, 1, 1, 1)
STD = np.array(IMAGENET_STD).reshape(3, 1, 1, 1)
NO_COLOUR = dict(jitter_p=0.0, gray_p=0.0, blur_p=0.0)


def random_frames(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def unnormalize(clip: torch.Tensor) -> np.ndarray:
    """Model input ``[3, T, H, W]`` back to [0, 1]."""
    return clip.double().numpy() * STD + MEAN


def with_boxes(params: AugmentParams, boxes: list[tuple[int, int, int, int]]) -> AugmentParams:
    return dataclasses.replace(params, boxes=torch.tensor(boxes, dtype=torch.float64))


def reference_crop(frames: torch.Tensor, box, flip: bool, size: int) -> np.ndarray:
    """One clip ``uint8 [T, H, W, 3]``, an integer box: slicing + F.interpolate -> ``[3, T, S, S]`` in [0, 1]."""
    x0, y0, w, h = (int(v) for v in box)
    patch = frames[:, y0:y0 + h, x0:x0 + w].permute(0, 3, 1, 2).double()
    out = F.interpolate(patch, size=(size, size), mode="bilinear", align_corners=False)
    if flip:
        out = out.flip(-1)
    return out.permute(1, 0, 2, 3).numpy() / 255


def np_luma(img: np.ndarray) -> np.ndarray:
    return 0.299 * img[0] + 0.587 * img[1] + 0.114 * img[2]


def np_jitter_op(index: int, img: np.ndarray, factor: float) -> np.ndarray:
    """torchvision ColorJitter formulas on one clip ``[3, T, H, W]`` (contrast: mean over the whole clip)."""
    if index == 0:
        return np.clip(img * factor, 0, 1)
    if index == 1:
        return np.clip(factor * img + (1 - factor) * np_luma(img).mean(), 0, 1)
    if index == 2:
        return np.clip(factor * img + (1 - factor) * np_luma(img)[None], 0, 1)
    out = np.empty_like(img)
    for idx in np.ndindex(img.shape[1:]):
        h, s, v = colorsys.rgb_to_hsv(*img[(slice(None), *idx)])
        out[(slice(None), *idx)] = colorsys.hsv_to_rgb((h + factor) % 1.0, s, v)
    return out


def np_blur(img: np.ndarray, sigma: float, radius: int) -> np.ndarray:
    out = np.empty_like(img)
    ksize = 2 * radius + 1
    for c in range(img.shape[0]):
        for t in range(img.shape[1]):
            out[c, t] = cv2.GaussianBlur(img[c, t], (ksize, ksize), sigmaX=sigma, sigmaY=sigma,
                                         borderType=cv2.BORDER_REFLECT_101)
    return out


def reference_augment(frames: torch.Tensor, params: AugmentParams, i: int, aug: ClipAugment) -> np.ndarray:
    """The whole training pipeline for clip ``i``, op by op, in float64."""
    img = reference_crop(frames[i], params.boxes[i].tolist(), bool(params.flip[i]), aug.size)
    if params.jitter[i]:
        for op_index in params.jitter_order[i].tolist():
            img = np_jitter_op(op_index, img, float(params.jitter_factors[i, op_index]))
    if params.grayscale[i]:
        img = np.repeat(np_luma(img)[None], 3, axis=0)
    if params.blur[i]:
        sigma = float(params.blur_sigma[i])
        img = np_blur(img, sigma, math.ceil(3 * sigma))  # each clip's kernel spans 3 of its own sigma
    return (img - MEAN) / STD


@pytest.mark.parametrize("cpu_8bit", [False, True])
def test_full_pipeline_matches_per_clip_reference(cpu_8bit):
    """The float path equals the float64 reference; the 8-bit CPU path is within the rounding of its steps
    (hue in 256ths of a turn, a grey level per operation) and unbiased on average."""
    aug = ClipAugment(size=16, jitter_p=0.75, gray_p=0.4, blur_p=0.5, cpu_8bit=cpu_8bit)
    frames = random_frames(8, 3, 24, 32, 3)
    params = aug.draw_params(8, 24, 32, torch.Generator().manual_seed(3))
    boxes = [(3, 2, 20, 18), (0, 0, 32, 24), (10, 5, 16, 16), (1, 7, 22, 17),
             (5, 0, 17, 24), (12, 8, 20, 16), (0, 4, 24, 20), (7, 3, 18, 21)]
    params = with_boxes(params, boxes)
    # the draw exercises every branch: flips, jitter, grayscale and blur on some clips, not on others
    for flags in (params.flip, params.jitter, params.grayscale, params.blur):
        assert flags.any() and not flags.all()
    out = aug.apply({"rgb": frames}, params)["rgb"]
    assert out.shape == (8, 3, 3, 16, 16) and out.dtype == torch.float32
    for i in range(8):
        expected = reference_augment(frames, params, i, aug)
        if not cpu_8bit:
            np.testing.assert_allclose(out[i].double().numpy(), expected, atol=2e-4)
            continue
        error = (out[i].double().numpy() - expected) * STD * 255  # in grey levels
        assert np.abs(error).max() < 8 and np.abs(error).mean() < 1.0 and abs(error.mean()) < 0.5, i


def test_crop_geometry_matches_slicing_and_interpolate():
    frames = random_frames(4, 2, 40, 50, 3)
    boxes = torch.tensor([[[0, 0, 50, 40]], [[5, 3, 20, 30]], [[30, 10, 20, 20]], [[2, 9, 16, 31]]],
                         dtype=torch.float64)
    flip = torch.tensor([[False], [True], [False], [True]])
    out = crop_resize(frames, boxes, flip, 16)
    assert out.shape == (4, 1, 3, 2, 16, 16)
    for i in range(4):
        ref = reference_crop(frames[i], boxes[i, 0].tolist(), bool(flip[i, 0]), 16)
        np.testing.assert_allclose(out[i, 0].double().numpy(), ref, atol=1e-5)


def test_upsampling_crop_matches_reference_inside_the_box():
    """Zoomed-in crops read real neighbours at the box edge (F.interpolate replicates the edge): compare inside."""
    frames = random_frames(1, 2, 40, 50, 3)
    box = (10, 12, 8, 8)
    out = crop_resize(frames, torch.tensor([[box]], dtype=torch.float64), torch.tensor([[False]]), 32)[0, 0]
    ref = reference_crop(frames[0], box, False, 32)
    inside = slice(2, 30)  # samples x0 + (j + 0.5) / 4 - 0.5 lie in [x0, x0 + 7] for j in 2..29
    np.testing.assert_allclose(out[..., inside, inside].double().numpy(), ref[..., inside, inside], atol=1e-5)


@pytest.mark.parametrize("height,width", [(128, 171), (240, 320), (64, 300)])
def test_crops_never_squash(height, width):
    aug = ClipAugment()
    params = aug.draw_params(20000, height, width, torch.Generator().manual_seed(0))
    x0, y0, w, h = params.boxes.unbind(1)
    aspect = w / h
    assert (aspect >= 3 / 4 - 1e-9).all() and (aspect <= 4 / 3 + 1e-9).all()
    assert (x0 >= 0).all() and (y0 >= 0).all()
    assert (x0 + w <= width + 1e-9).all() and (y0 + h <= height + 1e-9).all()
    area = w * h / (height * width)
    assert (area <= 1 + 1e-9).all()
    # the area is drawn in [0.2, 1]; only a box that cannot fit at its aspect ratio is shrunk, to the largest
    # box of that aspect ratio (for 128x171 frames that is never below 0.56 of the frame)
    largest_fit = torch.minimum(height * aspect / width, width / (aspect * height)).clamp(max=1)
    assert (area >= torch.minimum(largest_fit, torch.tensor(0.2)) - 1e-9).all()
    if (height, width) != (64, 300):
        assert (area >= 0.2 - 1e-9).all()
    # aspect ratios cover the range instead of collapsing to the frame's
    assert aspect.min() < 0.8 and aspect.max() > 1.25
    if (height, width) == (128, 171):
        # ~31% of single draws do not fit; with resampling the full-height fallback is (almost) never used
        full_height = (h >= height - 1e-9).double().mean().item()
        assert full_height < 0.001
        # log-aspect is drawn uniformly: about half of the boxes are wider than tall
        assert 0.4 < (aspect > 1).double().mean().item() < 0.6


def test_identical_frames_give_identical_output_frames():
    aug = ClipAugment(size=24, jitter_p=1.0, gray_p=0.5, blur_p=1.0)
    image = random_frames(4, 1, 30, 40, 3)
    frames = image.expand(4, 5, 30, 40, 3).contiguous()
    out = aug({"rgb": frames}, torch.Generator().manual_seed(1))["rgb"]
    for t in range(1, 5):
        torch.testing.assert_close(out[:, :, t], out[:, :, 0], rtol=0, atol=1e-6)


def test_frame_permutation_commutes_with_augmentation():
    """Every frame gets the same transform whatever its position: augmenting a time-permuted clip permutes
    the output (contrast uses the mean over the whole clip, which a permutation keeps)."""
    aug = ClipAugment(size=24, jitter_p=1.0, gray_p=0.3, blur_p=0.7)
    frames = random_frames(6, 7, 30, 40, 3)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    params = aug.draw_params(6, 30, 40, torch.Generator().manual_seed(5))
    out = aug.apply({"rgb": frames}, params)["rgb"]
    out_perm = aug.apply({"rgb": frames[:, perm]}, params)["rgb"]
    torch.testing.assert_close(out_perm, out[:, :, perm], rtol=0, atol=1e-5)


def test_geometric_relation_between_frames_is_kept():
    """Frames ``base + t``: crops are affine in intensity, so output frame t - frame 0 is t/255/std exactly."""
    aug = ClipAugment(size=20, **NO_COLOUR)
    base = random_frames(3, 1, 30, 40, 3) // 2
    frames = (base + torch.arange(6, dtype=torch.uint8).view(1, 6, 1, 1, 1) * 10).contiguous()
    out = aug({"rgb": frames}, torch.Generator().manual_seed(2))["rgb"].double()
    step = torch.tensor(IMAGENET_STD, dtype=torch.float64).view(1, 3, 1, 1, 1) * 255
    expected = torch.arange(6, dtype=torch.float64).view(1, 1, 6, 1, 1) * 10 / step
    torch.testing.assert_close(out - out[:, :, :1], expected.expand_as(out), rtol=0, atol=1e-5)


def test_rgb_and_flow_share_crop_and_flip_and_flow_u_is_negated():
    aug = ClipAugment(size=16, **NO_COLOUR)
    frames = random_frames(16, 3, 24, 32, 3)
    params = aug.draw_params(16, 24, 32, torch.Generator().manual_seed(4))
    assert params.flip.any() and not params.flip.all()
    out = aug.apply({"rgb": frames, "flow": frames}, params)
    for i in range(16):
        rgb, flow = unnormalize(out["rgb"][i]), unnormalize(out["flow"][i])
        np.testing.assert_allclose(flow[1:], rgb[1:], atol=1e-6)
        expected_u = 1 - rgb[0] if params.flip[i] else rgb[0]
        np.testing.assert_allclose(flow[0], expected_u, atol=1e-6)


@pytest.mark.parametrize("flip_p", [0.0, 1.0])
def test_flipped_flow_decodes_to_negated_horizontal_flow(flip_p):
    q_u, q_v = 200, 60  # decoded: u = 200*40/255 - 20 = 11.37 px, v = -10.59 px
    flow = torch.empty(2, 4, 24, 32, 3, dtype=torch.uint8)
    flow[..., 0], flow[..., 1], flow[..., 2] = q_u, q_v, 128
    # all colour operations on: flow must ignore them
    aug = ClipAugment(size=16, flip_p=flip_p, jitter_p=1.0, gray_p=1.0, blur_p=1.0)
    out = aug({"flow": flow}, torch.Generator().manual_seed(0))["flow"]
    decoded = unnormalize(out[0]) * 255 * 40 / 255 - 20
    sign = -1 if flip_p else 1
    np.testing.assert_allclose(decoded[0], sign * (q_u * 40 / 255 - 20), atol=1e-4)
    np.testing.assert_allclose(decoded[1], q_v * 40 / 255 - 20, atol=1e-4)
    np.testing.assert_allclose(decoded[2], 128 * 40 / 255 - 20, atol=1e-4)  # the constant channel


@pytest.mark.parametrize("cpu_8bit", [False, True])
def test_no_colour_operations_on_flow(cpu_8bit):
    """With every colour op forced on, flow output is exactly its geometric reference (crop, flip, u -> 1-u);
    in 8 bits, within the crop's rounding (half a grey level, positions to 1/32 pixel)."""
    aug = ClipAugment(size=16, jitter_p=1.0, gray_p=1.0, blur_p=1.0, kinds={"dis": "flow"}, cpu_8bit=cpu_8bit)
    flow = random_frames(4, 3, 24, 32, 3, seed=7)
    params = aug.draw_params(4, 24, 32, torch.Generator().manual_seed(8))
    params = with_boxes(params, [(3, 2, 20, 18), (0, 0, 32, 24), (10, 5, 16, 16), (12, 4, 19, 19)])
    out = aug.apply({"flow": flow, "dis": flow}, params)
    for i in range(4):
        ref = reference_crop(flow[i], params.boxes[i].tolist(), bool(params.flip[i]), 16)
        if params.flip[i]:
            ref[0] = 1 - ref[0]
        np.testing.assert_allclose(unnormalize(out["flow"][i]), ref, atol=4 / 255 if cpu_8bit else 1e-5)
    torch.testing.assert_close(out["dis"], out["flow"], rtol=0, atol=0)


@pytest.mark.parametrize("cpu_8bit", [False, True])
def test_grayscale_is_luminance(cpu_8bit):
    aug = ClipAugment(size=16, jitter_p=0.0, gray_p=1.0, blur_p=0.0, cpu_8bit=cpu_8bit)
    frames = random_frames(2, 2, 24, 32, 3)
    params = with_boxes(aug.draw_params(2, 24, 32, torch.Generator().manual_seed(0)),
                        [(0, 0, 32, 24), (4, 4, 20, 18)])
    out = aug.apply({"rgb": frames}, params)["rgb"]
    for i in range(2):
        gray = unnormalize(out[i])
        crop = reference_crop(frames[i], params.boxes[i].tolist(), bool(params.flip[i]), 16)
        for c in range(3):
            np.testing.assert_allclose(gray[c], 0.299 * crop[0] + 0.587 * crop[1] + 0.114 * crop[2],
                                       atol=5 / 255 if cpu_8bit else 1e-5)
            assert np.abs(gray[c] - crop[c]).max() > 0.05  # not one of the channels


def test_gaussian_blur_matches_opencv():
    clips = torch.rand(3, 3, 2, 20, 24, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.1, 0.9, 2.0])
    out = gaussian_blur(clips, sigma, radius=6)
    for i in range(3):  # OpenCV's kernel of 2 ceil(3 sigma) + 1 taps: each clip's own span in the batch's array
        ref = np_blur(clips[i].numpy(), float(sigma[i]), math.ceil(3 * float(sigma[i])))
        np.testing.assert_allclose(out[i].numpy(), ref, atol=1e-5)
    torch.testing.assert_close(gaussian_blur(clips, torch.full((3,), 1e-3), 6), clips)  # tiny sigma: identity


@pytest.mark.parametrize("op_index", range(4))
def test_jitter_ops_match_reference_formulas(op_index):
    clips = torch.rand(3, 3, 2, 6, 7, generator=torch.Generator().manual_seed(op_index), dtype=torch.float64)
    factors = torch.tensor([-0.1, 0.03, 0.1]) if op_index == 3 else torch.tensor([0.6, 1.0, 1.4])
    out = JITTER_OPS[op_index](clips, factors.double())
    for i in range(3):
        ref = np_jitter_op(op_index, clips[i].numpy(), float(factors[i]))
        np.testing.assert_allclose(out[i].numpy(), ref, atol=1e-9)


def _torchvision_functional():
    """torchvision's functional ops (test-only; its plain import fails in this environment)."""
    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(name, types.ModuleType(name))
    try:
        from torchvision.transforms import functional
    except Exception as error:  # noqa: BLE001 - any import failure means: not available here
        pytest.skip(f"torchvision not importable: {error}")
    return functional


def test_jitter_ops_match_torchvision():
    tvf = _torchvision_functional()
    clips = torch.rand(2, 3, 1, 9, 11, generator=torch.Generator().manual_seed(0))
    factors = torch.tensor([0.7, 1.3])
    shifts = torch.tensor([-0.08, 0.1])
    for i in range(2):
        frame = clips[i, :, 0]
        checks = [
            (adjust_brightness(clips, factors)[i, :, 0], tvf.adjust_brightness(frame, float(factors[i])), 1e-6),
            # torchvision weighs grey as 0.2989 R + 0.587 G + 0.114 B (ours: 0.299): differences below 1e-3
            (adjust_contrast(clips, factors)[i, :, 0], tvf.adjust_contrast(frame, float(factors[i])), 1e-3),
            (adjust_saturation(clips, factors)[i, :, 0], tvf.adjust_saturation(frame, float(factors[i])), 1e-3),
            (adjust_hue(clips, shifts)[i, :, 0], tvf.adjust_hue(frame, float(shifts[i])), 1e-5),
        ]
        for ours, theirs, atol in checks:
            torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)


def test_reproducible_with_seed_and_different_with_another():
    aug = ClipAugment(size=16)
    views = {"rgb": random_frames(4, 3, 24, 32, 3), "flow": random_frames(4, 3, 24, 32, 3, seed=1)}
    first = aug(views, torch.Generator().manual_seed(11))
    again = aug(views, torch.Generator().manual_seed(11))
    other = aug(views, torch.Generator().manual_seed(12))
    for name in views:
        torch.testing.assert_close(first[name], again[name], rtol=0, atol=0)
        assert (first[name] - other[name]).abs().max() > 0.1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_gpu_matches_cpu():
    """The GPU runs the float path: the same as the CPU's float path (``cpu_8bit=False``) to float rounding."""
    aug = ClipAugment(size=32, cpu_8bit=False)
    views = {"rgb": random_frames(4, 5, 48, 64, 3), "flow": random_frames(4, 5, 48, 64, 3, seed=1)}
    cpu = aug(views, torch.Generator().manual_seed(0))
    gpu = aug({k: v.cuda() for k, v in views.items()}, torch.Generator().manual_seed(0))
    for name in views:
        torch.testing.assert_close(gpu[name].cpu(), cpu[name], rtol=0, atol=2e-4)


def smooth_frames(batch: int, frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Clips of slowly moving sinusoids, one per channel (frames like a video's, where interpolation is smooth)."""
    generator = torch.Generator().manual_seed(seed)
    y = torch.arange(height, dtype=torch.float64)[:, None]
    x = torch.arange(width, dtype=torch.float64)[None]
    scale = torch.tensor([0.3, 0.3, 2 * math.pi], dtype=torch.float64)
    out = torch.empty(batch, frames, height, width, 3, dtype=torch.float64)
    for i in range(batch):
        for c in range(3):
            fx, fy, phase = (torch.rand(3, generator=generator, dtype=torch.float64) * scale).tolist()
            for t in range(frames):
                out[i, t, :, :, c] = 128 + 100 * torch.sin(fx * x + fy * y + phase + 0.2 * t)
    return out.round().to(torch.uint8)


def test_8bit_path_is_the_float_path_to_its_rounding():
    """The default CPU path (8 bits, rounding after each operation as the authors' PIL pipeline) against the float
    path with the same parameters, in grey levels: flow (crop and flip) within the rounding of its resize, RGB within
    that of its colour operations (hue in 256ths of a turn), unbiased."""
    aug = ClipAugment(size=32, jitter_p=0.75, gray_p=0.4, blur_p=0.5)
    views = {"rgb": smooth_frames(8, 5, 48, 64), "flow": smooth_frames(8, 5, 48, 64, seed=1)}
    params = aug.draw_params(8, 48, 64, torch.Generator().manual_seed(0))
    for flags in (params.flip, params.jitter, params.grayscale, params.blur):
        assert flags.any() and not flags.all()
    eight_bit = aug.apply(views, params)
    exact = dataclasses.replace(aug, cpu_8bit=False).apply(views, params)
    std = torch.tensor(IMAGENET_STD, dtype=torch.float64).reshape(1, 3, 1, 1, 1)
    for name, (worst, mean) in {"rgb": (12, 0.75), "flow": (1.5, 0.35)}.items():
        error = (eight_bit[name] - exact[name]).double() * std * 255
        assert error.abs().max() < worst and error.abs().mean() < mean and abs(error.mean()) < 0.1, name


def test_rgbdiff_is_difference_of_augmented_frames():
    aug = ClipAugment(size=16)
    frames = random_frames(3, 5, 24, 32, 3)
    out = aug({"rgb": frames, "rgbdiff": frames}, torch.Generator().manual_seed(0))
    assert out["rgbdiff"].shape == (3, 3, 4, 16, 16)
    torch.testing.assert_close(out["rgbdiff"], out["rgb"][:, :, 1:] - out["rgb"][:, :, :-1], rtol=0, atol=1e-6)


def quadrant_frame(height: int, width: int) -> torch.Tensor:
    """A frame whose every pixel is distinct: R = 10 x, G = 20 y, B = 7 (x + y)."""
    y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    return torch.stack([10 * x, 20 * y, 7 * (x + y)], dim=-1).to(torch.uint8)


def test_ten_crop_geometry():
    frame = quadrant_frame(8, 12)
    frames = frame.expand(2, 3, 8, 12, 3).contiguous()
    out = ten_crop({"rgb": frames, "flow": frames}, 4)
    assert out["rgb"].shape == (2, 10, 3, 3, 4, 4)
    expected = [frame[:4, :4], frame[:4, 8:], frame[4:, :4], frame[4:, 8:], frame[2:6, 4:8]]
    expected += [crop.flip(1) for crop in expected]
    for k, crop in enumerate(expected):
        ref = crop.permute(2, 0, 1).double().numpy()[:, None] / 255
        np.testing.assert_allclose(unnormalize(out["rgb"][1, k])[:, 2], ref[:, 0], atol=1e-5)
        flow_ref = ref.copy()
        if k >= 5:
            flow_ref[0] = 1 - flow_ref[0]
        np.testing.assert_allclose(unnormalize(out["flow"][0, k])[:, 0], flow_ref[:, 0], atol=1e-5)


def test_ten_crop_after_short_side_resize():
    frame = quadrant_frame(8, 12)
    frames = frame.expand(1, 1, 8, 12, 3).contiguous()
    out = ten_crop(frames, 2, short_side=4)  # frame resized to 4x6, crops of 2x2 = 4x4 boxes of the frame
    boxes = [(0, 0), (8, 0), (0, 4), (8, 4), (4, 2)]
    for k, (x0, y0) in enumerate(boxes):
        ref = reference_crop(frames[0], (x0, y0, 4, 4), False, 2)
        np.testing.assert_allclose(unnormalize(out[0, k]), ref, atol=1e-5)
        np.testing.assert_allclose(unnormalize(out[0, k + 5]), ref[..., ::-1], atol=1e-5)
    with pytest.raises(DataError, match="crop size 10"):
        ten_crop(frames, 10)


def test_center_crop():
    frame = quadrant_frame(8, 12)
    frames = frame.expand(2, 3, 8, 12, 3).contiguous()
    exact = center_crop(frames, 8)
    assert exact.shape == (2, 3, 3, 8, 8)
    np.testing.assert_allclose(unnormalize(exact[0]), reference_crop(frames[0], (2, 0, 8, 8), False, 8), atol=1e-5)
    small = center_crop({"rgb": frames, "rgbdiff": frames}, 4)
    np.testing.assert_allclose(unnormalize(small["rgb"][1]), reference_crop(frames[1], (2, 0, 8, 8), False, 4),
                               atol=1e-5)
    assert small["rgbdiff"].shape == (2, 3, 2, 4, 4)
    torch.testing.assert_close(small["rgbdiff"], small["rgb"][:, :, 1:] - small["rgb"][:, :, :-1])


def test_view_kinds_and_bad_input():
    assert [view_kind(n) for n in ("rgb", "rgbdiff", "flow", "flow_dis")] == ["rgb", "rgbdiff", "flow", "flow"]
    assert view_kind("dis", {"dis": "flow"}) == "flow"
    aug = ClipAugment(size=8)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ConfigError, match="'depth'"):
        aug({"depth": random_frames(1, 2, 16, 16, 3)}, gen)
    with pytest.raises(DataError, match="'flow'.*16x20.*'rgb'.*16x16"):
        aug({"rgb": random_frames(1, 2, 16, 16, 3), "flow": random_frames(1, 2, 16, 20, 3)}, gen)
    with pytest.raises(DataError, match="uint8"):
        aug({"rgb": torch.zeros(1, 2, 16, 16, 3)}, gen)
    with pytest.raises(DataError, match="rgbdiff needs"):
        aug({"rgbdiff": random_frames(1, 1, 16, 16, 3)}, gen)
    with pytest.raises(ConfigError, match="crop_area"):
        ClipAugment(crop_area=[0.5, 0.2])
    with pytest.raises(ConfigError, match="jitter_p"):
        from_dict(ClipAugment, {"jitter_p": 1.5})
    with pytest.raises(ConfigError, match="kinds.dis"):
        from_dict(ClipAugment, {"kinds": {"dis": "depth"}})
    config = from_dict(ClipAugment, {"blur_p": 0.0, "crop_area": [0.3, 1.0]})
    assert config.blur_p == 0.0 and config.crop_area == [0.3, 1.0]
    assert math.isclose(config.ratio[1], 4 / 3)


class Transfers:
    """Counts, while active, the copies between devices that ``Tensor.to`` and ``Tensor.copy_`` make, blocking (no
    ``non_blocking=True``) or not, and the host reads (``item``, ``tolist``, ``__bool__``, ``nonzero``, ``cpu``) of
    tensors on ``device``."""

    def __init__(self, monkeypatch, device: torch.device) -> None:
        self.blocking = self.non_blocking = self.reads = 0
        to, copy = torch.Tensor.to, torch.Tensor.copy_
        counter = self

        def watched_to(tensor, *args, **kwargs):
            out = to(tensor, *args, **kwargs)
            if out.device != tensor.device:
                counter._count(kwargs.get("non_blocking", False) or (len(args) > 2 and args[2] is True))
            return out

        def watched_copy(target, source, non_blocking=False):
            if target.device != source.device:
                counter._count(non_blocking)
            return copy(target, source, non_blocking)

        monkeypatch.setattr(torch.Tensor, "to", watched_to)
        monkeypatch.setattr(torch.Tensor, "copy_", watched_copy)
        for name in ("item", "tolist", "__bool__", "nonzero", "cpu"):
            original = getattr(torch.Tensor, name)

            def watched(tensor, *args, _original=original, **kwargs):
                if tensor.device == device:
                    counter.reads += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, watched)

    def _count(self, non_blocking: bool) -> None:
        if non_blocking:
            self.non_blocking += 1
        else:
            self.blocking += 1


@pytest.mark.parametrize("views", [("rgb",), ("rgb", "flow"), ("rgb", "rgbdiff", "flow")])
def test_augmenting_a_batch_on_another_device_copies_its_parameters_once_without_blocking(views, monkeypatch):
    """The parameters (drawn on the CPU) reach the augmenting device in one non-blocking copy per batch whatever
    the views and draws, and nothing is read back: the frames are on the ``meta`` device (shapes only), where
    any read of a value would fail and every copy from the CPU is a copy to another device."""
    augment = ClipAugment(size=16, jitter_p=0.9, gray_p=0.5, blur_p=0.5)
    meta = torch.device("meta")
    frames = {name: torch.zeros(6, 4, 20, 24, 3, dtype=torch.uint8, device=meta) for name in views}
    for seed in range(3):
        params = augment.draw_params(6, 20, 24, torch.Generator().manual_seed(seed))
        transfers = Transfers(monkeypatch, meta)
        out = augment.apply(frames, params)
        monkeypatch.undo()
        assert (transfers.blocking, transfers.non_blocking, transfers.reads) == (0, 1, 0), seed
        assert all(clips.device == meta for clips in out.values())


def test_the_transfer_counter_sees_a_blocking_copy(monkeypatch):
    meta = torch.device("meta")
    transfers = Transfers(monkeypatch, meta)
    torch.zeros(3).to(meta)
    torch.zeros(3, device=meta).copy_(torch.zeros(3))
    torch.zeros(3).to(meta, non_blocking=True)
    monkeypatch.undo()
    assert (transfers.blocking, transfers.non_blocking) == (2, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_augmenting_on_cuda_makes_no_synchronising_call():
    augment = ClipAugment(size=16, jitter_p=0.9, gray_p=0.5, blur_p=0.5)
    frames = {"rgb": torch.zeros(6, 4, 20, 24, 3, dtype=torch.uint8, device="cuda"),
              "flow": torch.zeros(6, 4, 20, 24, 3, dtype=torch.uint8, device="cuda")}
    params = augment.draw_params(6, 20, 24, torch.Generator().manual_seed(0))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = augment.apply(frames, params)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out["rgb"].shape == (6, 3, 4, 16, 16)


def test_cpu_8bit_path_takes_non_contiguous_views_and_any_batch_split():
    """A strided view gives what its contiguous copy gives, and a clip's output does not depend on the batch it
    is augmented in (the 8-bit path works clip by clip)."""
    aug = ClipAugment(size=16, jitter_p=1.0, gray_p=0.5, blur_p=0.5)
    view = random_frames(4, 2, 24, 64, 3)[:, :, :, ::2]  # every other column: each frame is strided
    assert not view[0].is_contiguous()
    params = aug.draw_params(4, 24, 32, torch.Generator().manual_seed(6))
    out = aug.apply({"rgb": view}, params)["rgb"]
    torch.testing.assert_close(out, aug.apply({"rgb": view.contiguous()}, params)["rgb"], rtol=0, atol=0)
    half = aug.apply({"rgb": view[2:]}, params.select(slice(2, 4)))["rgb"]
    torch.testing.assert_close(half, out[2:], rtol=0, atol=0)
