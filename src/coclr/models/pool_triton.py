"""S3D's max-pools for training on a GPU: Triton kernels on channels_last_3d memory, with one byte of argmax a value.

PyTorch's CUDA ``max_pool3d`` was the largest part of full S3D's forward and backward on an H200 (a third of the
device time at 32x128x128, bf16, channels_last_3d: ``benchmarks/s3d_gpu_parts.py``,
``docs/experiments/2026-11-29-gpu-h200.md``): its kernels walk one channel plane at a time, keep an int64 index per
output value and scatter the backward with atomic adds. :func:`max_pool3d` instead gives each program a block of
output positions by a block of channels (:data:`TILE` values), which are contiguous in channels_last_3d memory,
records the argmax as the window offset (``dt * kh * kw + dh * kw + dw``, one byte), and computes the backward as a
gather: each input value adds the gradients of the outputs whose argmax it is, in float32, with no atomics.

The same values as PyTorch: the maximum is exact, NaN propagates (the last NaN of the window is its argmax), and
ties go to the first maximum in (t, h, w) order, as PyTorch's kernels choose; the gradient therefore goes to the
same inputs. It is summed in float32 and rounded once, where PyTorch's CUDA backward adds into the bfloat16 gradient
with atomics, rounding at each add: where an input is the maximum of many windows the two differ by several
roundings (up to 5-7% of the largest gradient at S3D's stride-1 pools), ours the nearer to the exact sum.

Used by :class:`coclr.models.s3d.MaxPool3d` for CUDA tensors in channels_last_3d when Triton is importable;
``tests/triton_checks.py`` checks the kernels against ``F.max_pool3d`` under Triton's interpreter on the CPU and
compiled on CUDA, ``benchmarks/kernels_sm90.py`` compiles them for sm_90 without spills.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CL3 = torch.channels_last_3d
MAX_WINDOW = 127
"""The largest window (kt * kh * kw) whose offset fits the int8 argmax."""


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """PyTorch's output length without ceil mode."""
    return (size + 2 * padding - kernel) // stride + 1


@triton.jit
def _position(index, T, H, W):
    """(n, t, h, w) of flat positions in a (N, T, H, W) grid."""
    w = index % W
    rest = index // W
    h = rest % H
    rest = rest // H
    return rest // T, rest % T, h, w


@triton.jit
def _forward(x, y, arg, C, T, H, W, To, Ho, Wo, P,
             KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, ST: tl.constexpr, SH: tl.constexpr,
             SW: tl.constexpr, PT: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
             BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = p < P
    c_ok = c < C
    n, to, ho, wo = _position(p, To, Ho, Wo)
    best = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    where = tl.zeros((BLOCK_P, BLOCK_C), tl.int32)
    for dt in tl.static_range(KT):
        ti = to * ST - PT + dt
        for dh in tl.static_range(KH):
            hi = ho * SH - PH + dh
            for dw in tl.static_range(KW):
                wi = wo * SW - PW + dw
                ok = p_ok & (ti >= 0) & (ti < T) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
                row = (((n * T + ti) * H + hi) * W + wi).to(tl.int64) * C
                value = tl.load(x + row[:, None] + c[None, :], mask=ok[:, None] & c_ok[None, :],
                                other=float("-inf")).to(tl.float32)
                take = (value > best) | (value != value)
                best = tl.where(take, value, best)
                where = tl.where(take, (dt * KH + dh) * KW + dw, where)
    out = p.to(tl.int64)[:, None] * C + c[None, :]
    mask = p_ok[:, None] & c_ok[None, :]
    tl.store(y + out, best.to(y.dtype.element_ty), mask=mask)
    tl.store(arg + out, where.to(tl.int8), mask=mask)


@triton.jit
def _backward(grad_y, arg, grad_x, C, T, H, W, To, Ho, Wo, Q,
              KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, ST: tl.constexpr, SH: tl.constexpr,
              SW: tl.constexpr, PT: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
              BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    q = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    q_ok = q < Q
    c_ok = c < C
    n, ti, hi, wi = _position(q, T, H, W)
    total = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for dt in tl.static_range(KT):
        st = ti + PT - dt  # = to * ST for the output whose window holds ti at offset dt
        to = st // ST
        for dh in tl.static_range(KH):
            sh = hi + PH - dh
            ho = sh // SH
            for dw in tl.static_range(KW):
                sw = wi + PW - dw
                wo = sw // SW
                ok = (q_ok & (st >= 0) & (st % ST == 0) & (to < To) & (sh >= 0) & (sh % SH == 0) & (ho < Ho)
                      & (sw >= 0) & (sw % SW == 0) & (wo < Wo))
                row = (((n * To + to) * Ho + ho) * Wo + wo).to(tl.int64) * C
                mask = ok[:, None] & c_ok[None, :]
                at = tl.load(arg + row[:, None] + c[None, :], mask=mask, other=-1)
                grad = tl.load(grad_y + row[:, None] + c[None, :], mask=mask, other=0.0).to(tl.float32)
                total += tl.where(at.to(tl.int32) == (dt * KH + dh) * KW + dw, grad, 0.0)
    out = q.to(tl.int64)[:, None] * C + c[None, :]
    tl.store(grad_x + out, total.to(grad_x.dtype.element_ty), mask=q_ok[:, None] & c_ok[None, :])


TILE = 256
"""Values per program (positions x channels): larger tiles spill registers on sm_90 (``benchmarks/kernels_sm90.py``)."""
WARPS = 4


def _blocks(channels: int) -> tuple[int, int]:
    """(positions, channels) per program: :data:`TILE` values, the channels a power of two up to 64."""
    block_c = min(64, 1 << max(channels - 1, 0).bit_length())
    return TILE // block_c, block_c


def _launch(kernel, tensors, shape_in, shape_out, count, window, stride, padding, channels) -> None:
    block_p, block_c = _blocks(channels)
    grid = (triton.cdiv(count, block_p), triton.cdiv(channels, block_c))
    geometry = dict(zip(("KT", "KH", "KW", "ST", "SH", "SW", "PT", "PH", "PW"), (*window, *stride, *padding)))
    kernel[grid](*tensors, channels, *shape_in, *shape_out, count, **geometry, BLOCK_P=block_p, BLOCK_C=block_c,
                 num_warps=WARPS, enable_fp_fusion=False)  # as every launch of the project's kernels


class _MaxPool3d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, window, stride, padding):
        n, c, t, h, w = x.shape
        out = tuple(output_size(*a) for a in zip((t, h, w), window, stride, padding))
        y = torch.empty((n, c, *out), device=x.device, dtype=x.dtype, memory_format=CL3)
        arg = torch.empty((n, c, *out), device=x.device, dtype=torch.int8, memory_format=CL3)
        if y.numel():
            _launch(_forward, (x, y, arg), (t, h, w), out, n * out[0] * out[1] * out[2], window, stride, padding, c)
        ctx.save_for_backward(arg)
        ctx.geometry = (x.shape, x.dtype, window, stride, padding)
        ctx.mark_non_differentiable(arg)
        return y, arg

    @staticmethod
    def backward(ctx, grad_y, _grad_arg):
        (arg,) = ctx.saved_tensors
        shape, dtype, window, stride, padding = ctx.geometry
        n, c, t, h, w = shape
        grad_y = grad_y.contiguous(memory_format=CL3)
        grad_x = torch.empty(shape, device=grad_y.device, dtype=dtype, memory_format=CL3)
        if grad_x.numel():
            _launch(_backward, (grad_y, arg, grad_x), (t, h, w), tuple(arg.shape[2:]), n * t * h * w, window, stride,
                    padding, c)
        return grad_x, None, None, None


def max_pool3d(x: torch.Tensor, kernel_size: tuple[int, int, int], stride: tuple[int, int, int],
               padding: tuple[int, int, int]) -> torch.Tensor:
    """``F.max_pool3d(x, kernel_size, stride, padding)`` (no dilation, no ceil mode) on channels_last_3d memory
    (the output in channels_last_3d too); differentiable."""
    if kernel_size[0] * kernel_size[1] * kernel_size[2] > MAX_WINDOW:
        raise ValueError(f"a window of {kernel_size} does not fit the one-byte argmax (at most {MAX_WINDOW} values)")
    if any(p > k // 2 for p, k in zip(padding, kernel_size)):
        raise ValueError(f"padding {padding} exceeds half the window {kernel_size}, as F.max_pool3d refuses")
    y, _ = _MaxPool3d.apply(x.contiguous(memory_format=CL3), tuple(kernel_size), tuple(stride), tuple(padding))
    return y
