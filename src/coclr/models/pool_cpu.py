"""Max-pooling for the inference network on the CPU: the maximum of each window, without indices, in plain C.

PyTorch's CPU max-pool always computes the argmax indices beside the maximum (``max_pool3d_with_indices``, also
when no gradient is wanted), and was about a fifth of the fused inference network's time
(``benchmarks/roofline_embed.py``). :class:`MaxPool3dInference` takes the place of S3D's ``nn.MaxPool3d`` layers in
:func:`coclr.models.inference.fused_for_inference`: on float32 CPU tensors it runs ``pool_cpu.c`` (package data,
built on first use by :mod:`coclr.native`) on the channels-last memory, the output planes split over
:func:`coclr.native.for_each`'s threads; elsewhere, or when the C cannot be built (one warning), ``F.max_pool3d``.
The values are PyTorch's bit for bit either way (the maximum is exact; NaN propagates as in PyTorch), so the thread
count, the split and the path change nothing.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from coclr import native


def _open(path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    function = library.coclr_max_pool3d
    function.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int] * 3 + [ctypes.c_long] + [ctypes.c_int] * 12 + \
        [ctypes.c_long] * 2
    function.restype = ctypes.c_int
    return library


KERNEL = native.Kernel("pool_cpu", Path(__file__).with_name("pool_cpu.c"), _open,
                       "the C max-pool is unavailable, inference pools with PyTorch (slower)")
"""The C max-pool (:class:`coclr.native.Kernel`): built and loaded on first use."""


def _triple(value: int | tuple[int, ...]) -> tuple[int, int, int]:
    return (value,) * 3 if isinstance(value, int) else tuple(value)  # type: ignore[return-value]


def max_pool3d(x: torch.Tensor, kernel_size, stride, padding) -> torch.Tensor:
    """``F.max_pool3d(x, kernel_size, stride, padding)`` (no dilation, no ceil mode) of a float32 CPU tensor
    ``[N, C, T, H, W]`` in plain C when it can be built; the output is channels-last 3D, the values the same."""
    library = KERNEL.load()
    if library is None:
        return F.max_pool3d(x, kernel_size, stride, padding)
    kernel, step, pad = _triple(kernel_size), _triple(stride), _triple(padding)
    if x.dim() != 5 or x.numel() == 0 or min(step) < 1 or min(kernel) < 1 or min(pad) < 0 \
            or any(p > k // 2 for p, k in zip(pad, kernel)) \
            or any(s + 2 * p < k for s, p, k in zip(x.shape[2:], pad, kernel)):
        return F.max_pool3d(x, kernel_size, stride, padding)  # PyTorch's result, or its error, for such input
    x = x.contiguous(memory_format=torch.channels_last_3d)
    n, c, *sizes = x.shape
    out_sizes = [(s + 2 * p - k) // d + 1 for s, p, k, d in zip(sizes, pad, kernel, step)]
    out = torch.empty((n, c, *out_sizes), dtype=x.dtype, memory_format=torch.channels_last_3d)
    planes = n * out_sizes[0]
    chunks = min(torch.get_num_threads(), planes)
    bounds = [planes * i // chunks for i in range(chunks + 1)]

    def pool(chunk: int) -> int:
        return library.coclr_max_pool3d(x.data_ptr(), out.data_ptr(), *sizes, c, *kernel, *step, *pad, *out_sizes,
                                        bounds[chunk], bounds[chunk + 1])

    with torch.profiler.record_function("coclr::max_pool3d"):  # named in profiles, as an op would be
        native.for_each(chunks, pool)
    return out


class MaxPool3dInference(nn.Module):
    """An ``nn.MaxPool3d`` (no dilation, no ceil mode) for inference: :func:`max_pool3d` on float32 CPU tensors,
    returning the input's memory format; ``F.max_pool3d`` elsewhere. No gradient flows through the C path."""

    def __init__(self, kernel_size, stride, padding) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    @classmethod
    def of(cls, pool: nn.MaxPool3d) -> MaxPool3dInference:
        if pool.dilation not in (1, (1, 1, 1)) or pool.ceil_mode or pool.return_indices:
            raise ValueError(f"MaxPool3dInference needs no dilation, ceil mode or indices, got {pool}")
        return cls(pool.kernel_size, pool.stride, pool.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype != torch.float32 or (torch.is_grad_enabled() and x.requires_grad):
            return F.max_pool3d(x, self.kernel_size, self.stride, self.padding)
        out = max_pool3d(x, self.kernel_size, self.stride, self.padding)
        return out if x.is_contiguous(memory_format=torch.channels_last_3d) else out.contiguous()

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
