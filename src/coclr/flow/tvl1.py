"""Dual TV-L1 optical flow in PyTorch: batched, device-agnostic, numerically the scheme of OpenCV's DualTVL1.

The algorithm is the duality-based TV-L1 of Zach, Pock and Bischof (2007) in the form of the IPOL
implementation (Sanchez, Meinhardt-Llopis and Facciolo 2013) as OpenCV's ``optflow::DualTVL1OpticalFlow``
runs it on the CPU:

* pyramid: each scale is the previous one resized by ``scale_step`` with bilinear interpolation (no
  pre-smoothing), sizes rounded to the nearest integer; scales smaller than 16 px are dropped;
* per scale, the centred gradient of the second image (one-sided halves at the borders) is computed once;
  per warp the second image and its gradient are warped by the current flow with bicubic interpolation
  (zero outside the image) and the data term is linearised around the current flow;
* per warp, up to ``outer_iterations`` rounds of: a median filter of the flow, then up to
  ``inner_iterations`` primal-dual iterations (thresholding step on ``rho`` against ``lambda * theta *
  |grad I1w|^2``, divergence of the dual variable by backward differences, primal update, forward gradient,
  dual update with the projection ``p = (p + tau/theta grad u) / (1 + tau/theta |grad u|)``); the warp
  ends early once the squared flow update summed over the image drops to ``epsilon^2 * area``;
* the flow is upsampled bilinearly to the next scale and multiplied by ``1 / scale_step``.

Batching: every pair of a batch is solved at once, with all arrays ``[B, C, H, W]``. The early stop is per
pair, as in OpenCV: a pair whose update fell below the threshold is frozen by zeroing its step sizes (its
``lambda * theta``, ``theta`` and ``tau / theta`` become 0, which leaves ``u`` and ``p`` exactly unchanged),
so no pixel-sized masking pass is needed and each pair's result is the one a single run gives. The host
reads the flags (a device synchronisation) every ``check_every`` iterations (1 on the CPU, where it is
free, :data:`GPU_CHECK_PASSES` passes on a GPU): the warp ends when all pairs have stopped, and once a
quarter of the working pairs have stopped they are dropped from the working set, so a batch costs about the sum of
its pairs' iterations.
Reading the flags less often costs only the wasted iterations of frozen pairs, never accuracy.

Modes (:data:`~coclr.flow.params.MODES`): ``exact`` tests for stopping after every inner iteration, as
OpenCV; ``fast`` every ``stop_every`` iterations, so that the inner iterations run in passes which the Triton
kernels of :mod:`~coclr.flow.tvl1_triton` fuse into one kernel each (used on CUDA tensors when Triton
imports; on CPU tensors the C loops of :mod:`~coclr.flow.tvl1_cpu` run a whole warp per call when a C compiler
builds them; :class:`TorchPasses` runs the same passes with PyTorch operations anywhere).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from coclr.errors import ConfigError, DataError
from coclr.flow.median import median_blur
from coclr.flow.options import KERNELS
from coclr.flow.params import FAST_STOP_EVERY, TVL1Params, check_mode
from coclr.flow.tvl1_cpu import CompileError, CPasses, c_passes
from coclr.interrupts import check_stop

FLT_EPSILON = float(torch.finfo(torch.float32).eps)
"""OpenCV's threshold under which the squared image gradient counts as zero (``numeric_limits<float>``)."""
MIN_SCALE_SIZE = 16
"""OpenCV stops building the pyramid at the first scale narrower or lower than this many pixels."""
MIN_IMAGE_SIZE = 3
"""The finite differences of the scheme need at least this many rows and columns."""
GPU_CHECK_PASSES = 3
"""On a GPU the host reads the stop flags (a synchronisation, which drains the queue of launched kernels) once
every this many passes: frozen pairs cost at most that many passes of wasted work, a read per pass would
leave the GPU idle once per pass."""
CPU_CHUNK_PIXELS = 1 << 18
"""On the CPU, pairs are solved in chunks of about this many pixels: larger batches fall out of the caches
and run slower per pair, while a GPU needs the whole batch to fill it."""


def pyramid_sizes(height: int, width: int, nscales: int, scale_step: float) -> list[tuple[int, int]]:
    """Sizes ``(h, w)`` of the pyramid scales, finest first, as OpenCV builds them.

    Each scale is ``round(previous * scale_step)`` (OpenCV's ``resize`` with ``fx = fy = scale_step``); the
    pyramid stops before the first scale with a side under :data:`MIN_SCALE_SIZE`.
    """
    sizes = [(height, width)]
    for _ in range(1, nscales):
        prev_h, prev_w = sizes[-1]
        size = (round(prev_h * scale_step), round(prev_w * scale_step))
        if size[0] < MIN_SCALE_SIZE or size[1] < MIN_SCALE_SIZE:
            break
        sizes.append(size)
    return sizes


def build_pyramid(images: Tensor, nscales: int, scale_step: float) -> list[Tensor]:
    """Pyramid of ``images [B, C, H, W]``, finest first, each scale resized bilinearly from the previous.

    Matches ``cv2.resize(prev, None, fx=scale_step, fy=scale_step, interpolation=cv2.INTER_LINEAR)``: the
    sampling positions use ``scale_step`` itself (not the ratio of the rounded sizes), hence the ATen op that
    takes both the output size and the scale.
    """
    sizes = pyramid_sizes(images.shape[-2], images.shape[-1], nscales, scale_step)
    levels = [images]
    for size in sizes[1:]:
        levels.append(torch.ops.aten.upsample_bilinear2d(levels[-1], list(size), False, scale_step, scale_step))
    return levels


def centered_gradient(image: Tensor) -> Tensor:
    """``[B, 2, H, W]`` (d/dx, d/dy) of ``image [B, 1, H, W]`` by centred differences, as OpenCV computes it.

    At the borders OpenCV takes half the one-sided difference, which equals the centred difference of the
    image padded by replicating its edge.
    """
    padded = F.pad(image, (1, 1, 1, 1), mode="replicate")
    dx = 0.5 * (padded[..., 1:-1, 2:] - padded[..., 1:-1, :-2])
    dy = 0.5 * (padded[..., 2:, 1:-1] - padded[..., :-2, 1:-1])
    return torch.cat((dx, dy), dim=1)


def forward_gradient(field: Tensor) -> tuple[Tensor, Tensor]:
    """Forward differences (d/dx, d/dy) of ``field [..., H, W]``, zero in the last column / row (OpenCV)."""
    dx = F.pad(field[..., :, 1:] - field[..., :, :-1], (0, 1))
    dy = F.pad(field[..., 1:, :] - field[..., :-1, :], (0, 0, 0, 1))
    return dx, dy


def divergence(px: Tensor, py: Tensor) -> Tensor:
    """Divergence of the dual field ``(px, py)`` by backward differences; the adjoint of :func:`forward_gradient`.

    OpenCV's boundary handling: values before the first column / row count as zero.
    """
    div = px + py
    div[..., :, 1:] -= px[..., :, :-1]
    div[..., 1:, :] -= py[..., :-1, :]
    return div


def pixel_grid(height: int, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Column and row coordinates ``[1, H, W]`` each, float32."""
    ys = torch.arange(height, device=device, dtype=torch.float32)
    xs = torch.arange(width, device=device, dtype=torch.float32)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return grid_x[None], grid_y[None]


def warp_bicubic(images: Tensor, flow: Tensor, grid_x: Tensor, grid_y: Tensor) -> Tensor:
    """``images [B, K, H, W]`` sampled at ``(x + u, y + v)`` by bicubic interpolation, zero outside.

    ``cv2.remap(..., INTER_CUBIC, BORDER_CONSTANT)``: the same cubic kernel (a = -0.75) and taps outside the
    image read as 0. A whole-pixel position (a flow of 0 among them) reads its pixel exactly, as OpenCV's does: the
    images are given zeros on the right and below up to sides of 2^k + 1 pixels, so that ``grid_sample``'s
    normalised coordinates scale by powers of two, which round nothing (at the images' own sides a flow of 0 read
    its pixel wrong by up to 1e-3 of 255, and two identical frames had a flow of up to 4 px where OpenCV's is 0).
    """
    height, width = images.shape[-2:]
    tall, wide = _power_of_two_side(height), _power_of_two_side(width)
    if (tall, wide) != (height, width):
        images = F.pad(images, (0, wide - width, 0, tall - height))  # zeros: what the taps outside read anyway
    norm_x = (grid_x + flow[:, 0]) * (2.0 / (wide - 1)) - 1.0
    norm_y = (grid_y + flow[:, 1]) * (2.0 / (tall - 1)) - 1.0
    grid = torch.stack((norm_x, norm_y), dim=-1)
    return F.grid_sample(images, grid, mode="bicubic", padding_mode="zeros", align_corners=True)


def _power_of_two_side(side: int) -> int:
    """The least ``2^k + 1`` (k >= 0) at least ``side``."""
    return (1 << (side - 2).bit_length()) + 1 if side > 2 else 2


@dataclass
class LinearisedData:
    """The data term linearised around the flow ``u0`` of the current warp (constant during the warp).

    ``image_grad``: ``[B, C, H, W]`` the warped gradient of the second image (and ``gamma`` as a third
    channel when the illumination term is on); ``rho_const``: ``[B, 1, H, W]`` ``I1w - grad I1w . u0 - I0``;
    ``neg_inv_grad_sq``: ``[B, 1, H, W]`` ``-1 / max(|grad I1w|^2, FLT_EPSILON)``.
    """

    image_grad: Tensor
    rho_const: Tensor
    neg_inv_grad_sq: Tensor


def linearise(i0: Tensor, i1_and_grad: Tensor, flow: Tensor, grid_x: Tensor, grid_y: Tensor,
              gamma: float) -> LinearisedData:
    """Warp the second image and its gradient by ``flow [B, C, H, W]`` and linearise the data term there."""
    warped = warp_bicubic(i1_and_grad, flow, grid_x, grid_y)
    i1w, grad = warped[:, :1], warped[:, 1:]
    grad_sq = grad.square().sum(dim=1, keepdim=True)
    rho_const = i1w - (grad * flow[:, :2]).sum(dim=1, keepdim=True) - i0
    grad = torch.cat((grad, torch.full_like(i1w, gamma)), dim=1) if gamma else grad.contiguous()
    return LinearisedData(grad, rho_const, -1.0 / grad_sq.clamp_min(FLT_EPSILON))


def primal_dual_step(flow: Tensor, px: Tensor, py: Tensor, image_grad: Tensor, rho_const: Tensor,
                     neg_inv_grad_sq: Tensor, gate: Tensor, lambda_theta: float, theta: float,
                     tau_over_theta: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One inner iteration of the scheme; returns the new ``(flow, px, py)`` and the squared update per pair.

    ``flow, px, py``: ``[B, C, H, W]``; ``gate [B, 1, 1, 1]`` is 1 for pairs still iterating and 0 for
    pairs that have stopped, whose step sizes it zeroes so that they stay exactly unchanged.
    Thresholding: ``v = u + clamp(-rho / |grad I1w|^2, -lambda theta, lambda theta) grad I1w`` is OpenCV's
    three cases (``rho < -l_t g``, ``rho > l_t g``, otherwise) in one expression.
    """
    rho = rho_const
    for channel in range(flow.shape[1]):
        rho = torch.addcmul(rho, image_grad[:, channel : channel + 1], flow[:, channel : channel + 1])
    step = torch.clamp(rho * neg_inv_grad_sq, -lambda_theta, lambda_theta).mul_(gate)
    v = torch.addcmul(flow, step, image_grad)
    new_flow = torch.addcmul(v, divergence(px, py), gate, value=theta)
    change = torch.linalg.vector_norm(new_flow - flow, dim=(1, 2, 3)).square()
    gx, gy = forward_gradient(new_flow)
    tau_gate = gate * tau_over_theta
    denom = torch.addcmul(gx * gx, gy, gy).sqrt_().mul_(tau_gate).add_(1.0)
    new_px = torch.addcmul(px, tau_gate, gx).div_(denom)
    new_py = torch.addcmul(py, tau_gate, gy).div_(denom)
    return new_flow, new_px, new_py, change


def median_of_active(flow: Tensor, active: Tensor, ksize: int) -> Tensor:
    """``flow`` with the median filter applied to u and v of the pairs still iterating (``active [B]``)."""
    motion = flow[:, :2]
    smoothed = torch.where(active[:, None, None, None], median_blur(motion, ksize), motion)
    return torch.cat((smoothed, flow[:, 2:]), dim=1) if flow.shape[1] > 2 else smoothed


@dataclass
class WarpWork:
    """The pairs of a batch still iterating in the current warp, with their state and data term.

    ``rows [N]`` are their positions in the batch; ``active [N]`` is False for pairs that have met the stop
    criterion since the last compaction (they are frozen, see :func:`primal_dual_step`, until removed).
    """

    rows: Tensor
    active: Tensor
    flow: Tensor
    px: Tensor
    py: Tensor
    data: LinearisedData

    def select(self, keep: Tensor) -> WarpWork:
        """The work restricted to the entries ``keep`` (indices into this work)."""
        data = LinearisedData(*(t.index_select(0, keep) for t in vars(self.data).values()))
        return WarpWork(self.rows.index_select(0, keep), self.active.index_select(0, keep),
                        self.flow.index_select(0, keep), self.px.index_select(0, keep),
                        self.py.index_select(0, keep), data)


StepFn = Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]
MedianFn = Callable[[Tensor, Tensor, int], Tensor]


class Passes(Protocol):
    """An implementation of the inner iterations: passes of ``n`` iterations and the median filter.

    An implementation may also define ``run_warp`` (see :class:`~coclr.flow.tvl1_cpu.CPasses`): a whole warp,
    medians and passes, in one call; :class:`ScaleSolver` then uses it instead of driving the passes."""

    name: str
    """The kernels, as ``kernels=`` names them (``torch``, ``c``, ``triton``) and a flow view records them."""
    fused: bool
    """Whether a pass costs about one iteration's memory traffic (then exact mode runs long passes too)."""

    def run_pass(self, flow: Tensor, px: Tensor, py: Tensor, image_grad: Tensor, rho_const: Tensor,
                 neg_inv_grad_sq: Tensor, active: Tensor, n: int, threshold: float, lambda_theta: float,
                 theta: float, tau_over_theta: float, exact: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...

    def median(self, flow: Tensor, active: Tensor, ksize: int) -> Tensor: ...


class TorchPasses:
    """Passes of inner iterations with PyTorch operations (any device): :func:`primal_dual_step` ``n`` times.

    State: the step and median functions (eager, or through ``torch.compile``)."""

    name = "torch"
    fused = False

    def __init__(self, step_fn: StepFn = primal_dual_step, median_fn: MedianFn = median_of_active) -> None:
        self.step_fn = step_fn
        self.median_fn = median_fn

    def run_pass(self, flow: Tensor, px: Tensor, py: Tensor, image_grad: Tensor, rho_const: Tensor,
                 neg_inv_grad_sq: Tensor, active: Tensor, n: int, threshold: float, lambda_theta: float,
                 theta: float, tau_over_theta: float, exact: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``n`` iterations of the pairs with ``active [B]`` set (the others stay frozen) and the stop test of the
        mode: after every iteration (``exact``), or once after the pass for every iteration of it (``fast``: a
        pair stops if any of them met the test). Returns the new ``(flow, px, py, active)``."""
        gate = active.to(flow.dtype)[:, None, None, None]
        fired = torch.zeros_like(active)
        for _ in range(n):
            flow, px, py, change = self.step_fn(flow, px, py, image_grad, rho_const, neg_inv_grad_sq, gate,
                                                lambda_theta, theta, tau_over_theta)
            if exact:
                active = active & (change > threshold)
                gate = active.to(flow.dtype)[:, None, None, None]
            else:
                fired |= change <= threshold
        return flow, px, py, active if exact else active & ~fired

    def median(self, flow: Tensor, active: Tensor, ksize: int) -> Tensor:
        return self.median_fn(flow, active, ksize)


class ScaleSolver:
    """Runs the warps of one pyramid scale for a batch.

    State: ``flow [B, C, H, W]`` (u, v and, with ``gamma``, the illumination term) and the dual variables
    ``px, py [B, C, H, W]``, which start at zero at each scale and persist across its warps. The inner iterations
    run in passes (``passes``: :class:`TorchPasses` or the Triton kernels) of ``stop_every`` iterations in the
    fast mode, and of one iteration in the exact mode unless the passes are fused (then the Triton kernels roll
    back a pair whose test fired inside a pass). Every ``check_every`` iterations the host reads the stop flags:
    the warp ends when every pair has stopped, and once at least ``compact_fraction`` of the working pairs have
    stopped they are written back and dropped from the working set, so a batch costs about the sum of its pairs'
    iterations rather than the batch size times the slowest pair's.
    """

    def __init__(self, params: TVL1Params, passes: Passes, check_every: int, mode: str = "exact",
                 stop_every: int = FAST_STOP_EVERY, compact_fraction: float = 0.25,
                 stop: threading.Event | None = None) -> None:
        self.params = params
        self.stop = stop
        """Once set, the solve ends before its next warp or pass (:func:`~coclr.interrupts.check_stop`)."""
        self.passes = passes
        self.check_every = check_every
        self.exact = mode == "exact"
        self.stop_every = stop_every
        self.pass_length = stop_every if not self.exact or passes.fused else 1
        self.compact_fraction = compact_fraction
        self.pair_iterations = 0
        """Inner iterations times working pairs, summed (the work done, for profiling)."""

    def solve(self, i0: Tensor, i1: Tensor, flow: Tensor) -> Tensor:
        """Refine ``flow`` on images ``i0, i1 [B, 1, H, W]`` of this scale; returns the new flow."""
        params = self.params
        height, width = i0.shape[-2:]
        grid_x, grid_y = pixel_grid(height, width, i0.device)
        i1_and_grad = torch.cat((i1, centered_gradient(i1)), dim=1)
        px = torch.zeros_like(flow)
        py = torch.zeros_like(flow)
        threshold = params.epsilon**2 * height * width
        for _ in range(params.warps):
            data = linearise(i0, i1_and_grad, flow, grid_x, grid_y, params.gamma)
            flow, px, py = self._iterate(flow, px, py, data, threshold)
        return flow

    def _iterate(self, flow: Tensor, px: Tensor, py: Tensor, data: LinearisedData,
                 threshold: float) -> tuple[Tensor, Tensor, Tensor]:
        """The outer and inner iterations of one warp; returns the batch's new ``(flow, px, py)``."""
        params = self.params
        steps = (params.lambda_ * params.theta, params.theta, params.tau / params.theta)
        run_warp = getattr(self.passes, "run_warp", None)
        check_stop(self.stop)
        if run_warp is not None:
            flow, px, py, iterations = run_warp(flow, px, py, data.image_grad, data.rho_const, data.neg_inv_grad_sq,
                                                threshold, steps, params.outer_iterations, params.inner_iterations,
                                                params.median_filtering, self.exact, self.stop_every)
            self.pair_iterations += iterations
            return flow, px, py
        batch = flow.shape[0]
        rows = torch.arange(batch, device=flow.device)
        active = torch.ones(batch, dtype=torch.bool, device=flow.device)
        work = WarpWork(rows, active, flow, px, py, data)
        since_check = 0
        for _ in range(params.outer_iterations):
            if params.median_filtering > 1:
                work.flow = self.passes.median(work.flow, work.active, params.median_filtering)
            done = 0
            while done < params.inner_iterations:
                check_stop(self.stop)
                n = min(self.pass_length, params.inner_iterations - done)
                work.flow, work.px, work.py, work.active = self.passes.run_pass(
                    work.flow, work.px, work.py, work.data.image_grad, work.data.rho_const,
                    work.data.neg_inv_grad_sq, work.active, n, threshold, *steps, self.exact,
                )
                done += n
                self.pair_iterations += n * work.rows.shape[0]
                since_check += n
                if since_check < self.check_every:
                    continue
                since_check = 0
                still = int(work.active.sum())
                if still == 0:
                    return self._store(flow, px, py, work)
                if still <= (1.0 - self.compact_fraction) * work.rows.shape[0]:
                    flow, px, py = self._store(flow, px, py, work)
                    work = work.select(work.active.nonzero().squeeze(1))
        return self._store(flow, px, py, work)

    @staticmethod
    def _store(flow: Tensor, px: Tensor, py: Tensor, work: WarpWork) -> tuple[Tensor, Tensor, Tensor]:
        """The batch state ``(flow, px, py)`` with the working pairs' current state written into it."""
        if work.rows.shape[0] == flow.shape[0]:  # nothing dropped yet: the work is the whole batch
            return work.flow, work.px, work.py
        return (flow.index_copy(0, work.rows, work.flow), px.index_copy(0, work.rows, work.px),
                py.index_copy(0, work.rows, work.py))


_COMPILED: dict[str, Callable] = {}


def compiled(fn: Callable) -> Callable:
    """``fn`` through ``torch.compile`` (built once per process; shapes become dynamic after the first)."""
    if fn.__name__ not in _COMPILED:
        _COMPILED[fn.__name__] = torch.compile(fn, dynamic=None)
    return _COMPILED[fn.__name__]


def triton_available() -> bool:
    """Whether the Triton kernels import (Triton installed and working)."""
    try:
        import coclr.flow.tvl1_triton  # noqa: F401, PLC0415 (optional)
    except ImportError:
        return False
    return True


def make_passes(kernels: str, device: torch.device, compile: bool = False,
                stop: threading.Event | None = None) -> Passes:
    """The implementation of the inner iterations: ``triton`` (the fused kernels of
    :mod:`~coclr.flow.tvl1_triton`), ``c`` (the fused C loops of :mod:`~coclr.flow.tvl1_cpu`, CPU tensors),
    ``torch``, or ``auto``: Triton on CUDA devices when it imports, the C loops on the CPU when they build here
    (unless ``compile`` asks for the compiled PyTorch iteration), else PyTorch operations. ``stop``: the C loops
    end between pairs once it is set. Kernels asked for by name that cannot run here raise :class:`DataError`."""
    if kernels not in KERNELS:
        raise ConfigError(f"kernels: must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if kernels == "auto":
        if device.type == "cpu" and not compile:
            passes = c_passes(stop=stop)
            if passes is not None:
                return passes
        kernels = "triton" if device.type == "cuda" and triton_available() else "torch"
    if kernels == "c":
        if device.type != "cpu":
            raise DataError(f"kernels='c' runs on CPU tensors, got tensors on {device}")
        try:
            return c_passes(required=True, stop=stop)
        except CompileError as error:
            raise DataError(f"kernels='c': {error}; kernels='auto' or 'torch' run without them") from error
    if kernels == "torch":
        return TorchPasses(compiled(primal_dual_step) if compile else primal_dual_step,
                       compiled(median_of_active) if compile else median_of_active)
    if not triton_available():
        raise DataError("kernels='triton': Triton is not importable here (pip install triton)")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise DataError("kernels='triton' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 before "
                        "triton is imported")
    from coclr.flow.tvl1_triton import TritonPasses  # noqa: PLC0415 (optional)

    return TritonPasses()


def _check_inputs(prev: Tensor, next: Tensor) -> None:
    if not isinstance(prev, Tensor) or not isinstance(next, Tensor):
        raise DataError(f"tvl1_flow expects torch tensors, got {type(prev).__name__} and {type(next).__name__}")
    if prev.ndim != 3 or prev.shape != next.shape:
        raise DataError(
            f"tvl1_flow expects two grayscale batches [B, H, W] of the same shape, got {tuple(prev.shape)} "
            f"and {tuple(next.shape)}"
        )
    if prev.device != next.device:
        raise DataError(f"tvl1_flow: frames on different devices ({prev.device} and {next.device})")
    if prev.is_complex() or next.is_complex() or prev.dtype == torch.bool or next.dtype == torch.bool:
        raise DataError(f"tvl1_flow expects real grayscale values 0..255, got {prev.dtype} and {next.dtype}")
    if min(prev.shape[1:]) < MIN_IMAGE_SIZE:
        raise DataError(f"tvl1_flow: frames of {tuple(prev.shape[1:])} px are too small (at least 3 x 3)")


def tvl1_flow(prev: Tensor, next: Tensor, params: TVL1Params | None = None, *, mode: str = "exact",
              stop_every: int = FAST_STOP_EVERY, check_every: int | None = None, chunk_size: int | None = None,
              compile: bool = False, kernels: str = "auto", stop: threading.Event | None = None) -> Tensor:
    """Dual TV-L1 flow from ``prev`` to ``next`` for every pair of a batch: float32 ``[B, 2, H, W]`` (u, v).

    ``prev, next``: grayscale ``[B, H, W]``, values 0..255 (any real dtype, any device; the result is on the
    same device). Channel 0 is the horizontal motion, 1 the vertical, in pixels:
    ``next[y + v, x + u] ~ prev[y, x]``. Each pair's flow is the one a batch of one gives.

    ``mode``: ``exact`` (OpenCV's stop test after every inner iteration) or ``fast`` (the test every
    ``stop_every`` iterations; :data:`~coclr.flow.params.MODES`). ``kernels``: ``auto`` (the fused Triton
    kernels on CUDA when Triton imports, the fused C loops of :mod:`~coclr.flow.tvl1_cpu` on the CPU when a C
    compiler builds them, else PyTorch operations), ``torch``, ``c`` or ``triton`` (on CPU tensors only under
    ``TRITON_INTERPRET=1``). ``check_every``: inner iterations between host reads of the per-pair stop flags
    (default 1 on the CPU, where reading is free; elsewhere :data:`GPU_CHECK_PASSES` passes of ``stop_every``; the
    result does not depend on it, only the wasted work does; the C loops test inside each warp and ignore it).
    ``chunk_size``: pairs solved together (default: all on a GPU; on the CPU as many as keep the working arrays
    cache-sized, about :data:`CPU_CHUNK_PIXELS` pixels, per thread for the C loops). ``compile``: run the
    PyTorch iteration and median filter through ``torch.compile`` (the first call of each size compiles for a
    minute or more; ``auto`` then takes PyTorch operations on the CPU). ``stop``: a :class:`threading.Event`; once
    it is set, the solve ends at its next warp, pass or (C loops) pair with :class:`~coclr.interrupts.Interrupted`:
    how a thread solving for an interrupted job (:class:`~coclr.store.flow_pipeline.FlowPipeline`) is told to stop.
    """
    _check_inputs(prev, next)
    params = TVL1Params() if params is None else params
    params.validate()
    check_mode(mode, stop_every)
    on_cpu = prev.device.type == "cpu"
    if check_every is None:
        check_every = 1 if on_cpu else GPU_CHECK_PASSES * stop_every
    if check_every < 1:
        raise ValueError(f"check_every must be at least 1, got {check_every}")
    batch, height, width = prev.shape
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    passes = make_passes(kernels, prev.device, compile, stop)
    if chunk_size is None:
        # the C loops solve each pair on its own thread, so each thread gets a cache-sized share
        per_thread = torch.get_num_threads() if isinstance(passes, CPasses) else 1
        chunk_size = max(1, CPU_CHUNK_PIXELS // (height * width)) * per_thread if on_cpu else batch
    solver = ScaleSolver(params, passes, check_every, mode, stop_every, stop=stop)
    flows = [solve_pyramid(prev[start : start + chunk_size], next[start : start + chunk_size], params, solver)
             for start in range(0, max(batch, 1), chunk_size)]
    return flows[0] if len(flows) == 1 else torch.cat(flows)


def solve_pyramid(prev: Tensor, next: Tensor, params: TVL1Params, solver: ScaleSolver) -> Tensor:
    """Coarse-to-fine TV-L1 for one chunk of pairs ``[N, H, W]``: float32 flow ``[N, 2, H, W]``."""
    images = torch.stack((prev, next), dim=1).to(torch.float32)
    pyramid = build_pyramid(images, params.nscales, params.scale_step)
    channels = 3 if params.gamma else 2
    coarsest = pyramid[-1]
    flow = coarsest.new_zeros(coarsest.shape[0], channels, *coarsest.shape[-2:])
    for level in reversed(range(len(pyramid))):
        flow = solver.solve(pyramid[level][:, :1], pyramid[level][:, 1:], flow)
        if level > 0:
            flow = F.interpolate(flow, size=pyramid[level - 1].shape[-2:], mode="bilinear", align_corners=False)
            flow[:, :2] *= 1.0 / params.scale_step
    return flow[:, :2].contiguous()
