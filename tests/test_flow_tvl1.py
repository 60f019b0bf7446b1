"""PyTorch TV-L1: each building block against OpenCV or a slow loop, the whole solver against OpenCV's
DualTVL1 on real Middlebury pairs (same settings, same input), batching, and a known translation."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from coclr.errors import DataError
from coclr.flow.opencv import opencv_tvl1
from coclr.flow.params import TVL1Params
from coclr.flow.tvl1 import (
    build_pyramid,
    centered_gradient,
    divergence,
    forward_gradient,
    median_blur,
    pixel_grid,
    pyramid_sizes,
    tvl1_flow,
    warp_bicubic,
)
from coclr.flow.tvl1_cpu import c_passes
from middlebury import endpoint_error, read_flo

CROP = (slice(100, 260), slice(150, 350))  # 160 x 200: all five default scales stay above 16 px


@pytest.fixture(autouse=True)
def _one_thread():
    """One thread each for OpenCV and torch: fair, and robust on a busy 2-core machine."""
    torch.set_num_threads(1)
    previous = cv2.getNumThreads()
    cv2.setNumThreads(1)
    yield
    cv2.setNumThreads(previous)


def smooth_texture(height: int, width: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = rng.uniform(0, 255, size=(height, width)).astype(np.float32)
    blurred = cv2.GaussianBlur(noise, (0, 0), 2.0)
    return ((blurred - blurred.min()) / (blurred.max() - blurred.min()) * 255).astype(np.uint8)


def load_pair(root: Path, name: str, crop=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    first = cv2.imread(str(root / name / "frame10.png"), cv2.IMREAD_GRAYSCALE)
    second = cv2.imread(str(root / name / "frame11.png"), cv2.IMREAD_GRAYSCALE)
    gt = read_flo(root / name / "flow10.flo")
    if crop is not None:
        first, second, gt = (np.ascontiguousarray(a[crop]) for a in (first, second, gt))
    return first, second, gt


def ours(first: np.ndarray, second: np.ndarray, params: TVL1Params | None = None, **kwargs) -> np.ndarray:
    flow = tvl1_flow(torch.from_numpy(first)[None], torch.from_numpy(second)[None], params or TVL1Params(), **kwargs)
    return flow[0].permute(1, 2, 0).numpy()


def as_batch(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32))[None, None]


# ---- building blocks ----------------------------------------------------------------------------------


def test_pyramid_is_opencvs_resize_chain():
    image = smooth_texture(101, 133, seed=1).astype(np.float32)
    sizes = pyramid_sizes(101, 133, 5, 0.8)
    levels = build_pyramid(as_batch(image), 5, 0.8)
    expected = image
    for size, level in zip(sizes, levels):
        assert level.shape[-2:] == size == expected.shape
        np.testing.assert_allclose(level[0, 0].numpy(), expected, atol=1e-3)
        expected = cv2.resize(expected, None, fx=0.8, fy=0.8, interpolation=cv2.INTER_LINEAR)
    # OpenCV drops scales below 16 px: 40 -> 32 -> 26 -> 21 -> 17 -> (14 stops)
    assert pyramid_sizes(40, 200, 8, 0.8) == [(40, 200), (32, 160), (26, 128), (21, 102), (17, 82)]


def test_centered_gradient_follows_opencvs_border_rule():
    image = np.random.default_rng(2).uniform(0, 255, (7, 9)).astype(np.float32)
    h, w = image.shape
    dx, dy = np.zeros_like(image), np.zeros_like(image)
    for y in range(h):
        for x in range(w):
            dx[y, x] = 0.5 * (image[y, min(x + 1, w - 1)] - image[y, max(x - 1, 0)])
            dy[y, x] = 0.5 * (image[min(y + 1, h - 1), x] - image[max(y - 1, 0), x])
    got = centered_gradient(as_batch(image))[0].numpy()
    np.testing.assert_allclose(got[0], dx, atol=1e-5)
    np.testing.assert_allclose(got[1], dy, atol=1e-5)


def test_forward_gradient_and_divergence_follow_opencv_loops():
    rng = np.random.default_rng(3)
    field, px, py = (rng.standard_normal((6, 8)).astype(np.float32) for _ in range(3))
    h, w = field.shape
    gx, gy, div = np.zeros_like(field), np.zeros_like(field), np.zeros_like(field)
    for y in range(h):
        for x in range(w):
            gx[y, x] = field[y, x + 1] - field[y, x] if x < w - 1 else 0.0
            gy[y, x] = field[y + 1, x] - field[y, x] if y < h - 1 else 0.0
            div[y, x] = (px[y, x] - (px[y, x - 1] if x > 0 else 0.0)) + (py[y, x] - (py[y - 1, x] if y > 0 else 0.0))
    tgx, tgy = forward_gradient(torch.from_numpy(field))
    np.testing.assert_allclose(tgx.numpy(), gx, atol=1e-6)
    np.testing.assert_allclose(tgy.numpy(), gy, atol=1e-6)
    np.testing.assert_allclose(divergence(torch.from_numpy(px), torch.from_numpy(py)).numpy(), div, atol=1e-6)
    # with the dual field zero where the gradient is (last column / row), -div is the adjoint of the gradient
    px[:, -1] = 0
    py[-1, :] = 0
    tdiv = divergence(torch.from_numpy(px), torch.from_numpy(py)).numpy()
    assert np.sum(gx * px + gy * py) == pytest.approx(-np.sum(field * tdiv), rel=1e-4)


@pytest.mark.parametrize("ksize", [3, 5])
def test_median_blur_is_cv2s(ksize):
    rng = np.random.default_rng(ksize)
    field = rng.standard_normal((2, 2, 23, 31)).astype(np.float32)
    field[0, 0] = np.round(field[0, 0])  # many ties
    got = median_blur(torch.from_numpy(field), ksize).numpy()
    for b in range(2):
        for c in range(2):
            np.testing.assert_array_equal(got[b, c], cv2.medianBlur(field[b, c], ksize))


def test_bicubic_warp_is_cv2_remap():
    image = smooth_texture(48, 64, seed=4).astype(np.float32)
    rng = np.random.default_rng(5)
    flow = rng.uniform(-6, 6, (2, 48, 64)).astype(np.float32)  # reaches past the borders too
    xs, ys = np.meshgrid(np.arange(64, dtype=np.float32), np.arange(48, dtype=np.float32))
    expected = cv2.remap(image, xs + flow[0], ys + flow[1], cv2.INTER_CUBIC)
    grid_x, grid_y = pixel_grid(48, 64, torch.device("cpu"))
    got = warp_bicubic(as_batch(image), torch.from_numpy(flow)[None], grid_x, grid_y)[0, 0].numpy()
    assert np.abs(got - expected).mean() < 1e-3
    assert np.abs(got - expected).max() < 0.05  # of 255; float rounding of the sampling positions


@pytest.mark.parametrize("height, width", [(48, 64), (37, 53), (128, 171), (2, 9)])
def test_a_flow_of_zero_reads_every_pixel_exactly(height, width):
    """Through grid_sample's normalised coordinates a whole-pixel position read its pixel wrong by up to 1e-3 of 255
    (cv2.remap reads it exactly)."""
    image = smooth_texture(height, width, seed=7).astype(np.float32) * 3.7
    grid_x, grid_y = pixel_grid(height, width, torch.device("cpu"))
    zero = torch.zeros(1, 2, height, width)
    np.testing.assert_array_equal(warp_bicubic(as_batch(image), zero, grid_x, grid_y)[0, 0].numpy(), image)
    shift = torch.zeros(1, 2, height, width)
    shift[:, 0] = 1.0  # a whole pixel to the right: the next column, and 0 past the last
    expected = np.concatenate([image[:, 1:], np.zeros((height, 1), np.float32)], axis=1)
    np.testing.assert_array_equal(warp_bicubic(as_batch(image), shift, grid_x, grid_y)[0, 0].numpy(), expected)


@pytest.mark.parametrize("kernels", ["torch", "c"])
def test_two_identical_frames_have_no_motion_as_in_opencv(kernels):
    """A repeated frame (a still, a duplicated frame of a video) had a flow of up to 4 px, largest at the borders,
    where OpenCV's is exactly 0."""
    if kernels == "c" and c_passes() is None:
        pytest.skip("no C compiler")
    frame = (smooth_texture(64, 85, seed=3) * 0.8 + 20).astype(np.uint8)
    assert np.abs(opencv_tvl1(frame, frame)).max() == 0
    assert np.abs(ours(frame, frame.copy(), kernels=kernels)).max() == 0


# ---- the solver against OpenCV ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["RubberWhale", "Dimetrodon"])
def test_matches_opencv_on_middlebury_crop(middlebury, name):
    first, second, gt = load_pair(middlebury, name, CROP)
    theirs = opencv_tvl1(first, second)
    mine = ours(first, second)
    epe_theirs, epe_mine = endpoint_error(theirs, gt)["epe"], endpoint_error(mine, gt)["epe"]
    assert epe_mine <= 1.1 * epe_theirs, (epe_mine, epe_theirs)
    difference = np.abs(mine - theirs)
    assert difference.mean() < 0.02, difference.mean()
    assert (difference.max(axis=-1) > 0.1).mean() < 0.01


def test_other_settings_match_opencv(middlebury):
    """Illumination term, 3x3 median, fewer scales and iterations, scale step 0.5: each reaches the solver."""
    first, second, gt = load_pair(middlebury, "Dimetrodon", (slice(100, 228), slice(200, 360)))
    params = TVL1Params(gamma=0.2, median_filtering=3, nscales=3, warps=3, outer_iterations=4, scale_step=0.5)
    theirs, mine = opencv_tvl1(first, second, params), ours(first, second, params)
    assert endpoint_error(mine, gt)["epe"] <= 1.1 * endpoint_error(theirs, gt)["epe"]
    assert np.abs(mine - theirs).mean() < 0.02
    default = ours(first, second)
    assert np.abs(default - mine).mean() > 10 * np.abs(mine - theirs).mean()  # the settings changed something


def test_batch_equals_single_runs(middlebury):
    pairs = [load_pair(middlebury, name, (slice(100, 196), slice(150, 278)))[:2]
             for name in ("RubberWhale", "Dimetrodon")]
    texture = smooth_texture(96, 128, seed=6)
    pairs.append((texture, np.roll(texture, (1, -2), axis=(0, 1))))
    prev = torch.from_numpy(np.stack([p[0] for p in pairs]))
    nxt = torch.from_numpy(np.stack([p[1] for p in pairs]))
    params = TVL1Params(nscales=3)
    batched = tvl1_flow(prev, nxt, params, chunk_size=3, check_every=4)
    assert batched.shape == (3, 2, 96, 128) and batched.dtype == torch.float32
    for i in range(3):
        single = tvl1_flow(prev[i : i + 1], nxt[i : i + 1], params)
        torch.testing.assert_close(batched[i : i + 1], single, atol=1e-5, rtol=0)


def test_known_translation_is_recovered():
    shift_x, shift_y = 2.25, -1.5
    prev = smooth_texture(96, 128, seed=7)
    matrix = np.float32([[1, 0, shift_x], [0, 1, shift_y]])
    nxt = cv2.warpAffine(prev, matrix, (128, 96), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT)
    flow = ours(prev, nxt, TVL1Params(nscales=3))
    interior = flow[10:-10, 10:-10]
    assert np.abs(interior[..., 0] - shift_x).mean() < 0.05
    assert np.abs(interior[..., 1] - shift_y).mean() < 0.05


def test_bad_input_is_rejected_with_its_shape():
    frames = torch.zeros(2, 32, 32)
    with pytest.raises(DataError, match=r"\(2, 32, 32\) and \(2, 32, 31\)"):
        tvl1_flow(frames, torch.zeros(2, 32, 31))
    with pytest.raises(DataError, match=r"\[B, H, W\]"):
        tvl1_flow(frames[0], frames[0])
    with pytest.raises(DataError, match="too small"):
        tvl1_flow(torch.zeros(1, 2, 40), torch.zeros(1, 2, 40))
    from coclr.errors import ConfigError

    with pytest.raises(ConfigError, match="warps"):
        tvl1_flow(frames, frames, TVL1Params(warps=0))


# ---- slow: full resolution, compiled path -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name, bound", [("RubberWhale", 0.173), ("Dimetrodon", 0.199)])
def test_full_resolution_middlebury_accuracy(middlebury, name, bound):
    first, second, gt = load_pair(middlebury, name)
    mine = ours(first, second)
    theirs = opencv_tvl1(first, second)
    assert endpoint_error(mine, gt)["epe"] <= bound
    assert endpoint_error(mine, gt)["epe"] <= 1.1 * endpoint_error(theirs, gt)["epe"]
    assert np.abs(mine - theirs).mean() < 0.02


@pytest.mark.slow
def test_compiled_iteration_gives_the_eager_result(middlebury):
    first, second, _ = load_pair(middlebury, "RubberWhale", (slice(100, 196), slice(150, 278)))
    params = TVL1Params(nscales=2, warps=2)
    eager, compiled = ours(first, second, params), ours(first, second, params, compile=True)
    assert np.abs(eager - compiled).mean() < 1e-3
