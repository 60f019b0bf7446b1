"""The CPU augmentation's C loops: the crops' fixed-point bilinear samples and the normalisation are the NumPy
computation's integers and float32 values bit for bit, on any split of the work; NumPy computes them (one warning)
without a compiler. The crops are the float bilinear crop's values to within the final rounding."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from coclr import native
from coclr.data import augment_cpu
from coclr.data.augment import IMAGENET_MEAN, IMAGENET_STD, crop_resize, crop_resize_u8
from coclr.data.augment_cpu import crop_clip, rgb_to_planes

SCALE = [1 / (255 * s) for s in IMAGENET_STD]
SHIFT = [-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]


def _reference(rgb: np.ndarray, scale, shift) -> np.ndarray:
    """The definition, one channel at a time: float32(float32(x * scale) + shift)."""
    pixels = rgb.reshape(-1, 3).astype(np.float32)
    return np.stack([(pixels[:, c] * np.float32(scale[c])).astype(np.float32) + np.float32(shift[c])
                     for c in range(3)]).astype(np.float32)


def _image(pixels: int, seed: int) -> np.ndarray:
    rgb = np.random.default_rng(seed).integers(0, 256, (pixels, 3), dtype=np.uint8)
    rgb[:256] = np.arange(256, dtype=np.uint8)[:, None]  # every value in every channel
    return rgb


needs_compiler = pytest.mark.skipif(native.find_compiler() is None,
                                    reason="no C compiler found (set CC or install gcc)")


@needs_compiler
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("pixels", [256, 256 * 1031 + 7])
def test_the_c_loop_gives_the_definition_bit_for_bit(monkeypatch, threads, pixels):
    monkeypatch.setattr(native, "thread_count", lambda: threads)
    rgb = _image(pixels, pixels + threads)
    out = np.full((3, pixels), np.nan, np.float32)
    rgb_to_planes(rgb, SCALE, SHIFT, out)
    assert augment_cpu.KERNEL.load() is not None  # the C ran
    np.testing.assert_array_equal(out, _reference(rgb, SCALE, SHIFT))
    exact = (rgb.T.astype(np.float64) / 255 - np.array(IMAGENET_MEAN)[:, None]) / np.array(IMAGENET_STD)[:, None]
    np.testing.assert_allclose(out, exact, rtol=0, atol=2e-6)  # the normalisation, to float32 rounding


def _frames(steps: int, height: int, width: int, seed: int) -> np.ndarray:
    frames = np.random.default_rng(seed).integers(0, 256, (steps, height, width, 3), dtype=np.uint8)
    frames[0, :, :3] = 255  # extremes at the edges the crops replicate
    frames[-1, -2:] = 0
    return frames


CROPS = [  # (x0, y0, w, h, flip) on 23x31 frames: inside, the whole frame, edges, up- and downscaled, flipped
    (3.3, 2.7, 12.4, 9.1, False), (0.0, 0.0, 31.0, 23.0, True), (20.5, 15.25, 10.5, 7.75, False),
    (0.0, 0.0, 1.0, 1.0, True), (1.7, 0.2, 29.0, 22.5, True)]


@needs_compiler
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_the_c_crops_are_numpys_integers_and_the_float_crop_rounded(monkeypatch, threads):
    frames = _frames(4, 23, 31, threads)
    views = torch.from_numpy(frames)[None]
    for box in CROPS:
        monkeypatch.setattr(native, "thread_count", lambda: threads)
        ours = crop_resize_u8(frames, list(box[:4]), box[4], 16)
        assert augment_cpu.KERNEL.load() is not None  # the C ran
        monkeypatch.setattr(augment_cpu.KERNEL, "load", lambda warn=True: None)
        np.testing.assert_array_equal(ours, crop_resize_u8(frames, list(box[:4]), box[4], 16))  # NumPy's
        monkeypatch.undo()
        exact = crop_resize(views, torch.tensor([[box[:4]]], dtype=torch.float64), torch.tensor([[box[4]]]), 16)
        exact = exact[0, 0].permute(1, 2, 3, 0).double().numpy() * 255  # [T, S, S, 3] in grey levels
        error = np.abs(ours - exact)  # rounded once; each weight to 1/4096 of 255 grey levels at most
        assert error.max() <= 0.5 + 2 * 255 / 4096 and error.mean() < 0.3, box


@needs_compiler
def test_same_bits_on_every_instruction_set(monkeypatch, tmp_path):
    """The loops compiled for the baseline, for AVX2 (the AVX2-only CPU kind) and for this CPU (AVX-512 here, where
    it has it) give the same crops and planes, byte for byte."""
    marches = [None, "-march=native"] + (["-march=x86-64-v3"] if {"avx2", "fma"} <= set(native.cpu_flags().split())
                                         else [])
    frames, rgb = _frames(5, 57, 83, 11), _image(256 * 301, 12)
    results = []
    for index, march in enumerate(marches):
        flags = [flag for flag in native.FLAGS if flag != "-march=native"] + ([march] if march else [])
        (tmp_path / str(index)).mkdir()
        library = augment_cpu._open(augment_cpu.KERNEL.compile(native.find_compiler(), flags, tmp_path / str(index)))
        monkeypatch.setattr(augment_cpu.KERNEL, "load", lambda warn=True, library=library: library)
        crops = [crop_resize_u8(frames, [x0 * 83 / 31, y0 * 57 / 23, w * 83 / 31, h * 57 / 23], flip, 37)
                 for x0, y0, w, h, flip in CROPS]
        planes = np.empty((3, len(rgb)), np.float32)
        rgb_to_planes(rgb, SCALE, SHIFT, planes)
        results.append((crops, planes))
    for crops, planes in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(crops, results[0][0])), marches
        assert np.array_equal(planes.view(np.uint32), results[0][1].view(np.uint32)), marches


def test_crops_take_any_frames_and_refuse_positions_outside(monkeypatch):
    frames = _frames(3, 9, 12, 7)
    xs, ys = np.linspace(0, 11, 5), np.linspace(0.5, 8, 4)
    strided = np.ascontiguousarray(np.concatenate([frames, frames], axis=2))[:, :, ::2]  # not contiguous
    np.testing.assert_array_equal(crop_clip(strided, xs, ys), crop_clip(np.ascontiguousarray(strided), xs, ys))
    np.testing.assert_array_equal(crop_clip(frames, np.arange(12.0), np.arange(9.0)), frames)  # pixel centres
    for bad_xs, bad_ys in ((xs + 0.1, ys), (xs - 0.1, ys), (xs, ys[::-1]), (xs, ys + 1.5)):
        with pytest.raises(ValueError, match="positions outside"):
            crop_clip(frames, bad_xs, bad_ys)
    with pytest.raises(ValueError, match="frames must be"):
        crop_clip(frames[..., :2], xs, ys)


def test_without_a_compiler_numpy_computes_the_same_with_one_warning(monkeypatch):
    monkeypatch.setattr(augment_cpu.KERNEL, "_state", [])
    monkeypatch.setattr(native, "find_compiler", lambda: None)
    rgb, out = _image(3000, 1), np.empty((3, 3000), np.float32)
    with pytest.warns(RuntimeWarning, match="no C compiler found"):
        rgb_to_planes(rgb, SCALE, SHIFT, out)
    np.testing.assert_array_equal(out, _reference(rgb, SCALE, SHIFT))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        rgb_to_planes(rgb, [0.5, 1, 2], [0, -1, 3], out)
        np.testing.assert_array_equal(crop_clip(_frames(2, 9, 12, 3), np.arange(12.0), np.arange(9.0)),
                                      _frames(2, 9, 12, 3))
    np.testing.assert_array_equal(out, _reference(rgb, [0.5, 1, 2], [0, -1, 3]))


def test_bad_arrays_are_refused():
    rgb, out = _image(300, 2), np.zeros((3, 300), np.float32)  # (np.empty may hold a signalling NaN: its cast warns)
    for bad_rgb, bad_out, match in ((rgb.astype(np.int16), out, "rgb must be"), (rgb[::2], out, "rgb must be"),
                                    (rgb, out[:, :299], "out must be"), (rgb, out.astype(np.float64), "out must be"),
                                    (rgb, out.T, "out must be")):
        with pytest.raises(ValueError, match=match):
            rgb_to_planes(bad_rgb, SCALE, SHIFT, bad_out)
    with pytest.raises(ValueError, match="3 values each"):
        rgb_to_planes(rgb, SCALE[:2], SHIFT, out)
