"""Checks of the Triton kernels (TV-L1's against the PyTorch scheme, S3D's max-pool against ``F.max_pool3d``), run by
tests/test_flow_triton.py and tests/test_pool_triton.py in a child process: under Triton's interpreter on CPU
tensors (``TRITON_INTERPRET=1`` must be set before triton is imported, so not in the pytest process), or compiled on
a GPU (``CHECK_DEVICE=cuda``). Usage: ``TRITON_INTERPRET=1 python tests/triton_checks.py CHECK [CHECK ...]``."""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

from coclr.flow.params import TVL1Params
from coclr.flow.tvl1 import TorchPasses, make_passes, median_of_active, tvl1_flow
from coclr.flow.tvl1_triton import TritonPasses, TritonSettings

DEVICE = torch.device(os.environ.get("CHECK_DEVICE", "cpu"))
TOLERANCE = 1e-5 if DEVICE.type == "cpu" else 1e-4
"""Float rounding: numpy (the interpreter) against PyTorch on the CPU; FMA contraction differs on a GPU."""
STEPS = (0.15 * 0.3, 0.3, 0.25 / 0.3)  # lambda * theta, theta, tau / theta at OpenCV's defaults
SMALL_TILES = TritonSettings(block_h=32, block_w=32, num_warps=1)  # several tiles on small images


def random_state(batch: int, channels: int, height: int, width: int, seed: int) -> tuple[torch.Tensor, ...]:
    """A mid-solve state (flow, px, py) and data term (image gradient, rho, -1/|grad|^2), as linearise makes it."""
    g = torch.Generator().manual_seed(seed)
    flow = torch.randn(batch, channels, height, width, generator=g)
    px, py = (0.2 * torch.randn(batch, channels, height, width, generator=g) for _ in range(2))
    grad = 10 * torch.randn(batch, channels, height, width, generator=g)
    if channels == 3:
        grad[:, 2] = 0.2  # the gamma channel is a constant
    rho = 5 * torch.randn(batch, 1, height, width, generator=g)
    ninv = -1.0 / grad[:, :2].square().sum(1, keepdim=True).clamp_min(torch.finfo(torch.float32).eps)
    return tuple(t.to(DEVICE) for t in (flow, px, py, grad, rho, ninv))


def check_passes() -> None:
    """One pass of 1 and 4 iterations, exact and fast, 2 or 3 channels, frozen pairs, tiles with halos: the
    PyTorch iterations to float rounding, with the same stop flags."""
    torch_passes, triton_passes = TorchPasses(), TritonPasses(SMALL_TILES)
    cases = [(2, (30, 40), [(1, True), (4, True), (4, False)]), (3, (13, 37), [(3, True)])]  # (channels, size, runs)
    for channels, (height, width), runs in cases:
        state = random_state(3, channels, height, width, seed=channels)  # 2 x 2 tiles of 24 x 24 at n = 4
        active = torch.tensor([True, False, True], device=DEVICE)
        for n, exact in runs:
            ours = triton_passes.run_pass(*state, active, n, 1e-3, *STEPS, exact)
            reference = torch_passes.run_pass(*state, active, n, 1e-3, *STEPS, exact)
            for name, a, b in zip(("flow", "px", "py"), ours[:3], reference[:3]):
                assert (a - b).abs().max() < TOLERANCE, (channels, n, exact, name, float((a - b).abs().max()))
            assert torch.equal(ours[3], reference[3]), (channels, n, exact)
            assert torch.equal(ours[0][1], state[0][1]) and torch.equal(ours[1][1], state[1][1])  # frozen
    print("passes: ok")


def check_rollback() -> None:
    """Exact mode: a pair whose test fires inside a pass ends exactly where single iterations end it; fast mode
    runs the whole pass and stops the pair after it."""
    torch_passes, triton_passes = TorchPasses(), TritonPasses()
    n = 5
    state = random_state(3, 2, 20, 28, seed=7)
    active = torch.ones(3, dtype=torch.bool, device=DEVICE)
    changes = []  # squared update of every iteration of every pair, never stopping
    flow, px, py = state[:3]
    gate = torch.ones(3, 1, 1, 1, device=DEVICE)
    for _ in range(n):
        flow, px, py, change = torch_passes.step_fn(flow, px, py, *state[3:], gate, *STEPS)
        changes.append(change)
    changes = torch.stack(changes, 1)  # [pair, iteration]
    threshold = float(changes[:, 3].min() + changes[:, 3].max()) / 2  # some pairs fire at iteration 3, some later
    fires = [(int((row <= threshold).nonzero()[0]) if (row <= threshold).any() else n) for row in changes]
    assert any(first < n - 1 for first in fires) and any(first >= n - 1 for first in fires), fires
    for exact in (True, False):
        ours = triton_passes.run_pass(*state, active, n, threshold, *STEPS, exact)
        reference = torch_passes.run_pass(*state, active, n, threshold, *STEPS, exact)
        for a, b in zip(ours[:3], reference[:3]):
            assert (a - b).abs().max() < TOLERANCE, (exact, float((a - b).abs().max()))
        assert torch.equal(ours[3], reference[3])
        assert ours[3].tolist() == [first == n for first in fires]  # fired in the pass: stopped, in both modes
    exact = triton_passes.run_pass(*state, active, n, threshold, *STEPS, True)
    fast = triton_passes.run_pass(*state, active, n, threshold, *STEPS, False)
    stopped = fires.index(min(fires))
    assert (exact[0][stopped] - fast[0][stopped]).abs().max() > 1e-4  # the fast pass ran on
    print("rollback: ok")


def check_median() -> None:
    """The 5x5 and 3x3 medians equal the comparator network of the PyTorch scheme (and so cv2.medianBlur)
    bit for bit, on several tiles, for the pairs still iterating only; the gamma channel is copied."""
    passes = TritonPasses()
    g = torch.Generator().manual_seed(3)
    flow = torch.randn(3, 3, 37, 70, generator=g)
    flow[0, 0] = flow[0, 0].round()  # ties
    flow, active = flow.to(DEVICE), torch.tensor([True, False, True], device=DEVICE)
    for ksize in (5, 3):
        ours = passes.median(flow, active, ksize)
        assert torch.equal(ours, median_of_active(flow, active, ksize)), ksize
    print("median: ok")


def textures(pairs: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Smooth random images and their copies shifted by a pair-dependent sub-pixel motion."""
    rng = np.random.default_rng(0)
    big = torch.from_numpy(rng.uniform(0, 255, (pairs, 1, height + 8, width + 8)).astype(np.float32))
    kernel = torch.ones(1, 1, 5, 5) / 25
    smooth = torch.nn.functional.conv2d(big, kernel)[:, 0]
    prev = smooth[:, 2: 2 + height, 2: 2 + width]
    nxt = torch.stack([smooth[i, 2 + i % 2: 2 + i % 2 + height, 3: 3 + width] for i in range(pairs)])
    return prev.contiguous().to(DEVICE), nxt.contiguous().to(DEVICE)


def check_solve() -> None:
    """A whole small solve (two scales, medians, warps, compaction) gives the PyTorch flow in both modes."""
    prev, nxt = textures(2, 24, 32)
    params = TVL1Params(nscales=2, warps=1, outer_iterations=2, inner_iterations=6)
    assert isinstance(make_passes("triton", DEVICE), TritonPasses)
    for mode in ("exact", "fast"):
        ours = tvl1_flow(prev, nxt, params, mode=mode, stop_every=3, kernels="triton")
        reference = tvl1_flow(prev, nxt, params, mode=mode, stop_every=3, kernels="torch")
        difference = (ours - reference).abs()
        assert difference.mean() < 1e-5 and difference.max() < 1e-3, (mode, float(difference.max()))
    print("solve: ok")


POOLS = (((1, 3, 3), (1, 2, 2), (0, 1, 1)), ((3, 3, 3), (2, 2, 2), (1, 1, 1)), ((2, 2, 2), (2, 2, 2), (0, 0, 0)),
         ((3, 3, 3), (1, 1, 1), (1, 1, 1)))
"""S3D's max-pools: the stem's (MaxPool_2a/3a, 4a, 5a) and the inception blocks'."""


def check_pool() -> None:
    """S3D's max-pools on channels_last_3d tensors: the values of ``F.max_pool3d`` bit for bit, NaN included, and
    the gradient it gives, with ties (values on a coarse grid, many zeros as after a ReLU) and odd sizes; channel
    counts below, at and above a block of channels (64). The gradients are small integers, so sums are exact. Also
    under inference mode."""
    from coclr.models.pool_triton import max_pool3d  # noqa: PLC0415 (after TRITON_INTERPRET is read)

    g = torch.Generator().manual_seed(0)
    dtypes = (torch.float32,) if DEVICE.type == "cpu" else (torch.float32, torch.bfloat16)
    for (window, stride, padding), channels, size in zip(POOLS * 2, (3, 64, 70, 5, 1, 16, 9, 66),
                                                         ((4, 9, 7), (3, 6, 6), (5, 5, 6), (4, 5, 3)) * 2):
        x = torch.randint(-2, 6, (2, channels, *size), generator=g).float().clamp_min(0) / 4
        x[0, 0, 0, 0, 0] = float("nan")
        for dtype in dtypes:
            ours_in = x.to(DEVICE, dtype).contiguous(memory_format=torch.channels_last_3d).requires_grad_()
            ref_in = x.to(DEVICE, dtype).requires_grad_()
            ours = max_pool3d(ours_in, window, stride, padding)
            reference = torch.nn.functional.max_pool3d(ref_in, window, stride, padding)
            assert ours.is_contiguous(memory_format=torch.channels_last_3d)
            assert torch.equal(ours.isnan(), reference.isnan()), (window, channels)
            assert torch.equal(ours.nan_to_num(-1), reference.nan_to_num(-1)), (window, channels, dtype)
            grad = torch.randint(-3, 4, reference.shape, generator=g).to(DEVICE, dtype)
            ours.backward(grad)
            reference.backward(grad)
            assert torch.equal(ours_in.grad, ref_in.grad), (window, channels, dtype,
                                                            float((ours_in.grad - ref_in.grad).abs().max()))
    with torch.inference_mode():  # as the key encoder and CoCLR's sampler run
        x = torch.rand(2, 16, 4, 6, 6, generator=g).to(DEVICE).contiguous(memory_format=torch.channels_last_3d)
        assert torch.equal(max_pool3d(x, *POOLS[-1]), torch.nn.functional.max_pool3d(x, *POOLS[-1]))
    print("pool: ok")


CHECKS = {"passes": check_passes, "rollback": check_rollback, "median": check_median, "solve": check_solve,
          "pool": check_pool}

if __name__ == "__main__":
    assert DEVICE.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    torch.set_num_threads(1)
    for name in sys.argv[1:]:
        CHECKS[name]()
