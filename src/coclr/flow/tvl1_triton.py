"""Triton kernels of the PyTorch TV-L1 (:mod:`coclr.flow.tvl1`): fused multi-iteration passes and the median.

The inner iterations (thresholding, primal update, dual update) are memory-bound: one iteration of the eager
PyTorch scheme reads and writes the images about 22 times. A *pass* here runs ``n`` iterations of a tile in one
kernel: the tile is read once with a halo of ``halo >= n`` pixels on every side, iterated in registers, and its
interior written once. One iteration moves information by one pixel (the divergence reads the left and upper
dual values, the gradient the right and lower flow values), so after ``n`` iterations the interior is exactly
what ``n`` separate iterations give. Neighbour values are exchanged through a small per-program scratch area
in global memory (it stays in the L1/L2 caches) between block barriers; programs are persistent (a loop over
tiles), so the scratch area is sized by the number of programs, not of tiles.

Every iteration's squared flow update is summed per tile (a fixed order, so results do not depend on what else
is in the batch) and reduced per pair by :func:`_stop_kernel`, which applies the stop test of the mode:

* ``exact``: OpenCV's test after every iteration. A pair whose test fires at iteration ``k < n - 1`` of a pass
  is run again from the pass's input for ``k + 1`` iterations (only its tiles run; the others exit at once), so
  the result is the one of single iterations;
* ``fast``: the pass runs its ``n`` iterations and the pair stops after it if the test fired at any of them (a
  warp runs up to ``n - 1`` iterations more than OpenCV's).

A pair that has stopped is frozen as in the PyTorch scheme (its steps are multiplied by 0).

The kernels run on any Triton from 3.0 on (long-standing ``tl`` operations only, IEEE ``div_rn``/``sqrt_rn``
as PyTorch divides and takes roots) and, with ``TRITON_INTERPRET=1`` set before Triton is imported, on CPU
tensors, which is how the tests check them against the PyTorch scheme.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from coclr.flow._median_triton import _median3, _median5


@triton.jit
def _dual(p_x, p_y, gx, gy, tau_gate):
    """The dual update of one channel: ``(p + tau/theta grad u) / (1 + tau/theta |grad u|)``."""
    denom = tl.sqrt_rn(gx * gx + gy * gy) * tau_gate + 1.0
    return tl.div_rn(p_x + tau_gate * gx, denom), tl.div_rn(p_y + tau_gate * gy, denom)


PASS_SCALARS = ("height", "width", "tiles_x", "tiles", "total", "n_iter", "halo", "nmax", "lambda_theta", "theta",
                "tau_over_theta")
"""The pass kernel's run-time scalars: not specialised on their values, so that one compiled kernel per channel
count and block serves every image size and pass length (``benchmarks/kernels_sm90.py`` compiles them all)."""


@triton.jit(do_not_specialize=PASS_SCALARS)
def _pass_kernel(flow_ptr, px_ptr, py_ptr, grad_ptr, rho_ptr, ninv_ptr, iters_ptr,
                 out_flow_ptr, out_px_ptr, out_py_ptr, sums_ptr, scratch_ptr,
                 height, width, tiles_x, tiles, total, n_iter, halo, nmax, lambda_theta, theta, tau_over_theta,
                 CH: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr):
    """Up to ``n_iter`` inner iterations of every tile of every pair; pair ``b`` runs ``iters[b]`` of them with
    its steps on and the rest frozen, or is skipped (nothing read or written) when ``iters[b] < 0``.

    ``flow, px, py``: ``[B, CH, H, W]``; ``grad``: ``[B, CH, H, W]`` (the warped image gradient, and gamma);
    ``rho``, ``ninv``: ``[B, 1, H, W]``; ``sums``: ``[B, tiles, nmax]`` squared updates per tile and iteration.
    The gamma channel of ``grad`` is a constant per pair (:func:`~coclr.flow.tvl1.linearise`): it is read once
    per tile as a scalar, not held as a block (fewer live values: no spills with 3 channels).
    """
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rows = tl.arange(0, BH)[:, None]
    cols = tl.arange(0, BW)[None, :]
    loc = rows * BW + cols
    block = BH * BW
    plane = height * width
    # scratch planes of this program: flow [CH], px [CH], py [CH]
    scratch = scratch_ptr + pid.to(tl.int64) * (3 * CH * block)
    s_px = scratch + CH * block
    s_py = scratch + 2 * CH * block
    inner_h = BH - 2 * halo
    inner_w = BW - 2 * halo
    for t in range(pid, total, programs):
        b = t // tiles
        tile = t - b * tiles
        steps = tl.load(iters_ptr + b)
        if steps >= 0:
            ty = tile // tiles_x
            tx = tile - ty * tiles_x
            ys = ty * inner_h - halo + rows
            xs = tx * inner_w - halo + cols
            img = (ys >= 0) & (ys < height) & (xs >= 0) & (xs < width)
            keep = img & (rows >= halo) & (rows < BH - halo) & (cols >= halo) & (cols < BW - halo)
            left = img & (xs > 0) & (cols > 0)
            up = img & (ys > 0) & (rows > 0)
            right = cols < BW - 1
            down = rows < BH - 1
            has_gx = xs < width - 1
            has_gy = ys < height - 1
            off = ys * width + xs
            base = b.to(tl.int64) * CH * plane
            base1 = b.to(tl.int64) * plane
            u0 = tl.load(flow_ptr + base + off, mask=img, other=0.0)
            u1 = tl.load(flow_ptr + base + plane + off, mask=img, other=0.0)
            px0 = tl.load(px_ptr + base + off, mask=img, other=0.0)
            px1 = tl.load(px_ptr + base + plane + off, mask=img, other=0.0)
            py0 = tl.load(py_ptr + base + off, mask=img, other=0.0)
            py1 = tl.load(py_ptr + base + plane + off, mask=img, other=0.0)
            gamma = 0.0
            u2 = tl.zeros([BH, BW], tl.float32)
            px2 = tl.zeros([BH, BW], tl.float32)
            py2 = tl.zeros([BH, BW], tl.float32)
            if CH == 3:
                gamma = tl.load(grad_ptr + base + 2 * plane)
                u2 = tl.load(flow_ptr + base + 2 * plane + off, mask=img, other=0.0)
                px2 = tl.load(px_ptr + base + 2 * plane + off, mask=img, other=0.0)
                py2 = tl.load(py_ptr + base + 2 * plane + off, mask=img, other=0.0)
            for i in range(n_iter):
                gate = (i < steps).to(tl.float32)
                # the data term is read again every iteration (from L1) rather than held: fewer live values
                g0 = tl.load(grad_ptr + base + off, mask=img, other=0.0)
                g1 = tl.load(grad_ptr + base + plane + off, mask=img, other=0.0)
                rho_c = tl.load(rho_ptr + base1 + off, mask=img, other=0.0)
                ninv = tl.load(ninv_ptr + base1 + off, mask=img, other=0.0)
                # thresholding: v = u + clamp(-rho / |grad I1w|^2, -l_t, l_t) grad I1w
                rho = rho_c + g0 * u0
                rho = rho + g1 * u1
                if CH == 3:
                    rho = rho + gamma * u2
                step = tl.minimum(tl.maximum(rho * ninv, -lambda_theta), lambda_theta) * gate
                # the left and upper dual values, for the divergence
                tl.store(s_px + loc, px0)
                tl.store(s_px + block + loc, px1)
                tl.store(s_py + loc, py0)
                tl.store(s_py + block + loc, py1)
                if CH == 3:
                    tl.store(s_px + 2 * block + loc, px2)
                    tl.store(s_py + 2 * block + loc, py2)
                tl.debug_barrier()
                div0 = px0 + py0 - tl.load(s_px + loc - 1, mask=left, other=0.0)
                div0 = div0 - tl.load(s_py + loc - BW, mask=up, other=0.0)
                div1 = px1 + py1 - tl.load(s_px + block + loc - 1, mask=left, other=0.0)
                div1 = div1 - tl.load(s_py + block + loc - BW, mask=up, other=0.0)
                # primal update: u = v + theta div p
                new0 = (u0 + step * g0) + theta * div0 * gate
                new1 = (u1 + step * g1) + theta * div1 * gate
                change = (new0 - u0) * (new0 - u0) + (new1 - u1) * (new1 - u1)
                u0 = new0
                u1 = new1
                if CH == 3:
                    div2 = px2 + py2 - tl.load(s_px + 2 * block + loc - 1, mask=left, other=0.0)
                    div2 = div2 - tl.load(s_py + 2 * block + loc - BW, mask=up, other=0.0)
                    new2 = (u2 + step * gamma) + theta * div2 * gate
                    change = change + (new2 - u2) * (new2 - u2)
                    u2 = new2
                total_change = tl.sum(tl.sum(tl.where(keep, change, 0.0), axis=1), axis=0)
                tl.store(sums_ptr + (b * tiles + tile) * nmax + i, total_change)
                # the right and lower flow values, for the forward gradient
                tl.store(scratch + loc, u0)
                tl.store(scratch + block + loc, u1)
                if CH == 3:
                    tl.store(scratch + 2 * block + loc, u2)
                tl.debug_barrier()
                tau_gate = gate * tau_over_theta
                gx = tl.where(has_gx, tl.load(scratch + loc + 1, mask=right, other=0.0) - u0, 0.0)
                gy = tl.where(has_gy, tl.load(scratch + loc + BW, mask=down, other=0.0) - u0, 0.0)
                px0, py0 = _dual(px0, py0, gx, gy, tau_gate)
                gx = tl.where(has_gx, tl.load(scratch + block + loc + 1, mask=right, other=0.0) - u1, 0.0)
                gy = tl.where(has_gy, tl.load(scratch + block + loc + BW, mask=down, other=0.0) - u1, 0.0)
                px1, py1 = _dual(px1, py1, gx, gy, tau_gate)
                if CH == 3:
                    gx = tl.where(has_gx, tl.load(scratch + 2 * block + loc + 1, mask=right, other=0.0) - u2, 0.0)
                    gy = tl.where(has_gy, tl.load(scratch + 2 * block + loc + BW, mask=down, other=0.0) - u2, 0.0)
                    px2, py2 = _dual(px2, py2, gx, gy, tau_gate)
            tl.store(out_flow_ptr + base + off, u0, mask=keep)
            tl.store(out_flow_ptr + base + plane + off, u1, mask=keep)
            tl.store(out_px_ptr + base + off, px0, mask=keep)
            tl.store(out_px_ptr + base + plane + off, px1, mask=keep)
            tl.store(out_py_ptr + base + off, py0, mask=keep)
            tl.store(out_py_ptr + base + plane + off, py1, mask=keep)
            if CH == 3:
                tl.store(out_flow_ptr + base + 2 * plane + off, u2, mask=keep)
                tl.store(out_px_ptr + base + 2 * plane + off, px2, mask=keep)
                tl.store(out_py_ptr + base + 2 * plane + off, py2, mask=keep)


@triton.jit(do_not_specialize=("tiles", "n_iter", "threshold"))
def _stop_kernel(sums_ptr, active_ptr, rerun_ptr, tiles, n_iter, threshold,
                 EXACT: tl.constexpr, BT: tl.constexpr, NMAX: tl.constexpr):
    """Per pair: sum the tiles' squared updates of every iteration of the pass (a fixed order) and apply the stop
    test. ``active`` (int8) is updated in place; in exact mode ``rerun[b]`` is the number of iterations to run
    again from the pass's input (the test fired before the last iteration) or -1."""
    b = tl.program_id(0)
    its = tl.arange(0, NMAX)
    totals = tl.zeros([NMAX], tl.float32)
    for start in range(0, tiles, BT):
        ts = start + tl.arange(0, BT)
        part = tl.load(sums_ptr + (b * tiles + ts[:, None]) * NMAX + its[None, :],
                       mask=(ts[:, None] < tiles) & (its[None, :] < n_iter), other=0.0)
        totals += tl.sum(part, axis=0)
    fired = (totals <= threshold) & (its < n_iter)
    first = tl.min(tl.where(fired, its, NMAX), axis=0)
    active = tl.load(active_ptr + b) != 0
    if EXACT:
        tl.store(rerun_ptr + b, tl.where(active & (first < n_iter - 1), first + 1, -1))
    tl.store(active_ptr + b, (active & (first >= n_iter)).to(tl.int8))


@triton.jit(do_not_specialize=("height", "width", "tiles_x"))
def _median_kernel(flow_ptr, active_ptr, out_ptr, height, width, tiles_x,
                   CH: tl.constexpr, KSIZE: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr):
    """The ``KSIZE x KSIZE`` median of u and v of the pairs still iterating; the other channels and pairs are
    copied."""
    tile = tl.program_id(0)
    b = tl.program_id(1)
    ty = tile // tiles_x
    tx = tile - ty * tiles_x
    ys = ty * BH + tl.arange(0, BH)[:, None]
    xs = tx * BW + tl.arange(0, BW)[None, :]
    inside = (ys < height) & (xs < width)
    off = ys * width + xs
    plane = height * width
    active = tl.load(active_ptr + b) != 0
    for c in tl.static_range(CH):
        base = flow_ptr + (b.to(tl.int64) * CH + c) * plane
        value = tl.load(base + off, mask=inside, other=0.0)
        if c < 2:
            if active:
                if KSIZE == 5:
                    value = _median5(base, ys, xs, height, width, inside)
                else:
                    value = _median3(base, ys, xs, height, width, inside)
        tl.store(out_ptr + (b.to(tl.int64) * CH + c) * plane + off, value, mask=inside)


@dataclass(frozen=True)
class TritonSettings:
    """Launch settings of the pass kernel: the block (``block_h x block_w`` pixels with the halo, powers of two;
    ``gamma_block_w`` wide with the gamma channel), warps per program and persistent programs per multiprocessor
    (results do not depend on them, except for float rounding of the stop test's sums: the tile size sets their
    order).

    The defaults compile for sm_90 without spills under Triton 3.6 and 3.9 (``benchmarks/kernels_sm90.py``, with
    ``FP_FUSION``): 16 warps hold 4 pixels of a 64x32 block per thread (2 channels: 128 registers on 3.6, 79 on
    3.9; gamma: 128 and 91). A 64x64 block at 16 warps spilled 192 B on Triton 3.6 (0 on 3.9), at 8 warps 316 B
    and 8 B, at 32 warps 144 B and 0 (2026-11-27).
    """

    block_h: int = 64
    block_w: int = 32
    gamma_block_w: int = 32
    num_warps: int = 16
    programs_per_sm: int = 4


FP_FUSION = False
"""Every launch passes ``enable_fp_fusion=FP_FUSION``, what ``TRITON_DEFAULT_FP_FUSION=0`` sets as the default (and
it overrides that variable either way). With fusion on, Triton lets LLVM and ptxas contract a multiply and an
add into one FMA (one rounding instead of two), wherever they like; off, every ``*``, ``+`` and ``-`` is its own
IEEE float32 operation, as NumPy runs them under ``TRITON_INTERPRET=1``, where the tests check the kernels
(``tests/test_flow_triton.py``): the compiled kernels then compute what was tested, whatever Triton's default
(on in 3.6 and 3.9, off from 3.10), except for the order of ``tl.sum``'s additions. The kernels are memory-bound:
the unfused multiplies cost no measurable time there (not measured on a GPU: none here)."""

MEDIAN_BLOCK = (16, 64)
MEDIAN_WARPS = 8
"""The median kernel's block and warps: 4 pixels per thread keep the 25 values of a 5x5 window in registers on
sm_90 (8 pixels per thread, at 4 warps, spilled)."""


def block_shape(settings: TritonSettings, halo: int, channels: int = 2) -> tuple[int, int]:
    """The pass kernel's block for a halo of ``halo`` pixels and ``channels`` state channels: the settings'
    block, each side doubled until the interior is at least 4 pixels wide."""
    block_h, block_w = settings.block_h, settings.gamma_block_w if channels == 3 else settings.block_w
    while block_h - 2 * halo < 4:
        block_h *= 2
    while block_w - 2 * halo < 4:
        block_w *= 2
    return block_h, block_w


def _program_count(device: torch.device, work: int, per_sm: int) -> int:
    if device.type == "cuda":
        return max(1, min(work, torch.cuda.get_device_properties(device).multi_processor_count * per_sm))
    return max(1, min(work, 4))  # the interpreter runs programs one after another


class TritonPasses:
    """Runs passes of inner iterations and the median filter with the Triton kernels; state: the launch settings
    and a per-device scratch buffer for the programs, grown on demand."""

    name = "triton"
    """The kernels, as ``kernels=`` names them and a flow view records them."""
    fused = True
    """A pass of ``n`` iterations reads and writes the images about once (see the module docstring)."""

    def __init__(self, settings: TritonSettings = TritonSettings()) -> None:
        self.settings = settings
        self._scratch: dict[torch.device, Tensor] = {}

    def _scratch_for(self, device: torch.device, elements: int) -> Tensor:
        buffer = self._scratch.get(device)
        if buffer is None or buffer.numel() < elements:
            buffer = torch.empty(elements, dtype=torch.float32, device=device)
            self._scratch[device] = buffer
        return buffer

    def run_pass(self, flow: Tensor, px: Tensor, py: Tensor, image_grad: Tensor, rho_const: Tensor,
                 neg_inv_grad_sq: Tensor, active: Tensor, n: int, threshold: float, lambda_theta: float,
                 theta: float, tau_over_theta: float, exact: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``n`` iterations of the working pairs (``active [B]`` bool; stopped pairs stay frozen) with the stop test
        of the mode; returns the new ``(flow, px, py, active)``."""
        batch, channels, height, width = flow.shape
        halo = max(n, 1)
        settings = self.settings
        block_h, block_w = block_shape(settings, halo, channels)
        inner_h, inner_w = block_h - 2 * halo, block_w - 2 * halo
        tiles_x, tiles_y = triton.cdiv(width, inner_w), triton.cdiv(height, inner_h)
        tiles = tiles_x * tiles_y
        nmax = triton.next_power_of_2(n)
        inputs = [t.contiguous() for t in (flow, px, py, image_grad, rho_const, neg_inv_grad_sq)]
        outputs = [torch.empty_like(t) for t in inputs[:3]]
        sums = torch.empty(batch, tiles, nmax, dtype=torch.float32, device=flow.device)
        programs = _program_count(flow.device, batch * tiles, settings.programs_per_sm)
        scratch = self._scratch_for(flow.device, programs * 3 * channels * block_h * block_w)
        flags = active.to(torch.int8)
        constants = (height, width, tiles_x, tiles, batch * tiles)
        steps = (lambda_theta, theta, tau_over_theta)
        meta = dict(CH=channels, BH=block_h, BW=block_w, num_warps=settings.num_warps, enable_fp_fusion=FP_FUSION)
        iters = torch.where(active, n, 0).to(torch.int32)
        _pass_kernel[(programs,)](*inputs, iters, *outputs, sums, scratch, *constants, n, halo, nmax, *steps, **meta)
        rerun = torch.empty(batch, dtype=torch.int32, device=flow.device)
        _stop_kernel[(batch,)](sums, flags, rerun, tiles, n, threshold, EXACT=exact, BT=64, NMAX=nmax,
                               enable_fp_fusion=FP_FUSION)
        if exact and n > 1:
            # pairs whose test fired inside the pass: again from the pass's input, for exactly their iterations
            _pass_kernel[(programs,)](*inputs, rerun, *outputs, sums, scratch, *constants, n, halo, nmax, *steps,
                                      **meta)
        return outputs[0], outputs[1], outputs[2], flags.bool()

    def median(self, flow: Tensor, active: Tensor, ksize: int) -> Tensor:
        """``flow`` with the ``ksize x ksize`` median applied to u and v of the pairs still iterating."""
        batch, channels, height, width = flow.shape
        flow = flow.contiguous()
        out = torch.empty_like(flow)
        block_h, block_w = MEDIAN_BLOCK
        tiles_x = triton.cdiv(width, block_w)
        grid = (tiles_x * triton.cdiv(height, block_h), batch)
        _median_kernel[grid](flow, active.to(torch.int8), out, height, width, tiles_x, CH=channels, KSIZE=ksize,
                             BH=block_h, BW=block_w, num_warps=MEDIAN_WARPS,
                             enable_fp_fusion=FP_FUSION)
        return out
