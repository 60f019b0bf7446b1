"""An inference-only copy of the S3D backbone: each BatchNorm folded into its convolution, the ReLU fused into it,
and the max-pools without indices.

In evaluation mode a BatchNorm is a per-channel affine map, so conv -> BN is one convolution with scaled weights
and a bias (the standard inference fold). The folded convolution and its ReLU then run as one oneDNN primitive,
``mkldnn::_convolution_pointwise`` (the op inductor's freezing emits), on float32 CPU tensors where PyTorch has
it: one pass over each activation instead of three, and every convolution in oneDNN (eager PyTorch sends most of
S3D's float32 3D convolutions to its im2col path, ``slow_conv3d_forward``: 56 of the 77 in a profile). Elsewhere
(CUDA, other dtypes, a PyTorch without the op) the same module runs ``conv3d`` then an in-place ReLU.

The same features to rounding (the fold changes where the products are rounded; docs/embed.md gives the
measured cosines), independent of the thread count to rounding (the same bits on the Xeon measured; the eager
network's differed by up to 2e-6).
Its max-pools compute no argmax indices on the CPU (:class:`coclr.models.pool_cpu.MaxPool3dInference`: the same
values). Training is untouched: :func:`fused_for_inference` builds a separate module from an eval-mode backbone; it has
no BatchNorm to update and no gradient.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from coclr.models.pool_cpu import MaxPool3dInference
from coclr.models.s3d import BasicConv3d, STConv3d

__all__ = ["ConvReLU", "fold_batchnorm", "fused_for_inference", "has_fused_convolution", "inference_layout",
           "inference_network", "padded"]


def has_fused_convolution() -> bool:
    """Whether this PyTorch has oneDNN's fused convolution + pointwise op for CPU tensors (built with oneDNN,
    and recent enough to register ``mkldnn::_convolution_pointwise``)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def fold_batchnorm(conv: nn.Conv3d, bn: nn.BatchNorm3d) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, bias)`` of the convolution equal to ``bn(conv(x))`` with ``bn`` in evaluation mode:
    ``weight * s`` and ``(conv_bias - running_mean) * s + bn_bias`` per output channel, ``s = bn_weight /
    sqrt(running_var + eps)``; computed in float64, returned in the convolution's dtype."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("fold_batchnorm needs a BatchNorm with running statistics (track_running_stats=True)")
    with torch.no_grad():
        scale = torch.rsqrt(bn.running_var.double() + bn.eps)
        if bn.weight is not None:
            scale = scale * bn.weight.double()
        weight = conv.weight.double() * scale.view(-1, *([1] * (conv.weight.dim() - 1)))
        conv_bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(scale)
        bias = (conv_bias - bn.running_mean.double()) * scale
        if bn.bias is not None:
            bias = bias + bn.bias.double()
    dtype = conv.weight.dtype
    return weight.to(dtype).contiguous(), bias.to(dtype)


class ConvReLU(nn.Module):
    """``relu(conv3d(x))`` with a BatchNorm folded into the convolution (:func:`fold_batchnorm`), for inference.

    oneDNN's fused convolution + ReLU on float32 CPU tensors (:func:`has_fused_convolution`), else ``conv3d``
    and an in-place ReLU. Buffers ``weight`` and ``bias``.
    """

    def __init__(self, conv: nn.Conv3d, bn: nn.BatchNorm3d) -> None:
        super().__init__()
        if isinstance(conv.padding, str):
            raise ValueError(f"ConvReLU needs numeric padding, got {conv.padding!r}")
        weight, bias = fold_batchnorm(conv, bn)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.stride, self.padding = list(conv.stride), list(conv.padding)
        self.dilation, self.groups = list(conv.dilation), conv.groups
        self.fused = has_fused_convolution()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.device.type == "cpu" and x.dtype == torch.float32 == self.weight.dtype:
            return torch.ops.mkldnn._convolution_pointwise(x, self.weight, self.bias, self.padding, self.stride,
                                                           self.dilation, self.groups, "relu", [], "")
        return F.relu(F.conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups),
                      inplace=True)

    def extra_repr(self) -> str:
        out_channels, in_channels, *kernel = self.weight.shape
        return (f"{in_channels * self.groups}, {out_channels}, kernel_size={tuple(kernel)}, "
                f"stride={tuple(self.stride)}, padding={tuple(self.padding)}, fused={self.fused}")


def fused_for_inference(backbone: nn.Module) -> nn.Module:
    """A copy of ``backbone`` for inference: every :class:`~coclr.models.s3d.BasicConv3d` becomes a
    :class:`ConvReLU`, every :class:`~coclr.models.s3d.STConv3d` two of them (BatchNorm folded with its running
    statistics, so use it as an eval-mode network), every ``nn.MaxPool3d`` a
    :class:`~coclr.models.pool_cpu.MaxPool3dInference`; in eval mode, without gradients. ``backbone`` is
    unchanged."""
    fused = copy.deepcopy(backbone).eval()
    for parent in list(fused.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, BasicConv3d):
                setattr(parent, name, ConvReLU(child.conv, child.bn))
            elif isinstance(child, STConv3d):
                setattr(parent, name, nn.Sequential(ConvReLU(child.conv1, child.bn1),
                                                    ConvReLU(child.conv2, child.bn2)))
            elif isinstance(child, nn.MaxPool3d):
                setattr(parent, name, MaxPool3dInference.of(child))
    return fused.requires_grad_(False)


def inference_network(backbone: torch.nn.Module, head: torch.nn.Module | None, device: torch.device,
                      precision: str | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The network an embedding runs: clips ``[N, C, T, H, W]`` -> ``backbone``'s pooled feature (through ``head``
    unless None), on ``device`` in evaluation mode, in :func:`inference_layout`; float32 on the CPU runs the fused
    inference copy of the backbone (:func:`~coclr.models.inference.fused_for_inference`), bf16 the eager one under
    autocast; the head runs on one pooled feature at a time (a linear layer's sums are ordered by the rows it is
    given: a video's vector would depend on the others of its batch). (``coclr learn``'s calibration times it as
    built here.)"""
    backbone.to(device).eval()
    if device.type == "cpu" and precision is None:
        backbone = fused_for_inference(backbone)
    layout = inference_layout(device)
    backbone.to(memory_format=layout)
    if head is not None:
        head.to(device).eval()

    def network(clips: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            pooled = backbone(clips.contiguous(memory_format=layout)).float().mean(dim=(2, 3, 4))
        if head is None:
            return pooled
        return torch.cat([head(row) for row in pooled.split(1)])  # a row at a time: the same bits in any batch

    return network


def inference_layout(device: torch.device) -> torch.memory_format:
    """The memory layout the networks run in: channels-last 3D on the CPU, where oneDNN's convolutions run it
    faster than the default layout at the same precision (measured, docs/embed.md), the default elsewhere."""
    return torch.channels_last_3d if device.type == "cpu" else torch.contiguous_format


def padded(clips: torch.Tensor, size: int) -> torch.Tensor:
    """``clips`` with its last row repeated up to ``size`` rows. Every batch has the same number of rows so that a
    window's features never depend on how many other windows shared its batch: oneDNN picks its algorithm (and
    so its rounding) by batch shape, while a row's result does not depend on the other rows of a batch of one
    shape. So a video gets the same vector alone, in a folder, under any number of processes or decoders."""
    missing = size - len(clips)
    if missing <= 0:
        return clips
    return torch.cat([clips, clips[-1:].expand(missing, *clips.shape[1:])])
