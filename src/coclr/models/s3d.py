"""S3D backbone (Xie et al., "Rethinking Spatiotemporal Feature Learning", 2018), as used by CoCLR.

The module and parameter names follow the authors' CoCLR code (``Conv_1a``, ``Mixed_3b.branch1.1.conv1`` ...),
so their checkpoints map onto this network key for key (see :mod:`coclr.models.loading`). Unlike theirs, each
layer is registered once (no ``block1``..``block5`` aliases) and a width multiplier builds smaller networks of
the same shape for CPU demos and tests.

Width rounding: every channel count ``c`` of the layer table becomes ``max(1, floor(c * width + 0.5))``
(round half up), see :func:`scaled_channels`. Width 1 is the paper's network: 7,910,048 parameters, or
9,098,000 with S3D-G self-gating; the output has 1024 channels.

Input ``[B, 3, T, H, W]`` with T >= 8 and H, W >= 32; output ``[B, out_channels, T', H', W']`` with
``T' = floor(ceil(T / 4) / 2)``, ``H' = floor(ceil(H / 16) / 2)``, ``W'`` likewise (32x128x128 -> 4x4x4).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

from coclr.clips import MIN_LENGTH, MIN_SIZE

#: Channel table of the separable inception blocks: (name, [b0, b1a, b1b, b2a, b2b, b3]) at width 1.
INCEPTION_TABLE: tuple[tuple[str, tuple[int, int, int, int, int, int]], ...] = (
    ("Mixed_3b", (64, 96, 128, 16, 32, 32)),
    ("Mixed_3c", (128, 128, 192, 32, 96, 64)),
    ("Mixed_4b", (192, 96, 208, 16, 48, 64)),
    ("Mixed_4c", (160, 112, 224, 24, 64, 64)),
    ("Mixed_4d", (128, 128, 256, 24, 64, 64)),
    ("Mixed_4e", (112, 144, 288, 32, 64, 64)),
    ("Mixed_4f", (256, 160, 320, 32, 128, 128)),
    ("Mixed_5b", (256, 160, 320, 32, 128, 128)),
    ("Mixed_5c", (384, 192, 384, 48, 128, 128)),
)

#: Smallest input (T, H, W) the network takes: the clips' rule (:data:`coclr.clips.MIN_LENGTH`, ``MIN_SIZE``).
MIN_INPUT_SIZE = (MIN_LENGTH, MIN_SIZE, MIN_SIZE)


def scaled_channels(channels: int, width: float) -> int:
    """Channel count of a layer at ``width``: ``max(1, floor(channels * width + 0.5))`` (round half up)."""
    return max(1, math.floor(channels * width + 0.5))


def _init_conv_bn(conv: nn.Conv3d, bn: nn.BatchNorm3d) -> None:
    """The authors' initialisation: conv weights N(0, 0.01), BatchNorm weight 1 and bias 0."""
    nn.init.normal_(conv.weight, mean=0.0, std=0.01)
    nn.init.ones_(bn.weight)
    nn.init.zeros_(bn.bias)


class BasicConv3d(nn.Module):
    """Conv3d (no bias) -> BatchNorm3d -> ReLU. Submodules ``conv`` and ``bn``, as in the authors' code."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int, int] = 1,
        stride: int | tuple[int, int, int] = 1,
        padding: int | tuple[int, int, int] = 0,
        bn_eps: float = 1e-5,
        bn_momentum: float = 0.1,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm3d(out_channels, eps=bn_eps, momentum=bn_momentum)
        self.relu = nn.ReLU(inplace=True)
        _init_conv_bn(self.conv, self.bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class STConv3d(nn.Module):
    """Separable conv: (1,k,k) spatial conv -> BN -> ReLU -> (k,1,1) temporal conv -> BN -> ReLU.

    ``stride`` applies to space in ``conv1`` and to time in ``conv2``; ``padding`` likewise.
    Submodules ``conv1, bn1, conv2, bn2`` as in the authors' code.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        bn_eps: float = 1e-5,
        bn_momentum: float = 0.1,
    ) -> None:
        super().__init__()
        k, s, p = kernel_size, stride, padding
        self.conv1 = nn.Conv3d(in_channels, out_channels, (1, k, k), stride=(1, s, s), padding=(0, p, p), bias=False)
        self.bn1 = nn.BatchNorm3d(out_channels, eps=bn_eps, momentum=bn_momentum)
        self.conv2 = nn.Conv3d(out_channels, out_channels, (k, 1, 1), stride=(s, 1, 1), padding=(p, 0, 0), bias=False)
        self.bn2 = nn.BatchNorm3d(out_channels, eps=bn_eps, momentum=bn_momentum)
        self.relu = nn.ReLU(inplace=True)
        _init_conv_bn(self.conv1, self.bn1)
        _init_conv_bn(self.conv2, self.bn2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(x)))


class SelfGating(nn.Module):
    """S3D-G feature gating: ``x * sigmoid(fc(mean of x over T, H, W))``, one weight per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.sigmoid(self.fc(x.mean(dim=(2, 3, 4))))
        return x * weights[:, :, None, None, None]


class MaxPool3d(nn.MaxPool3d):
    """``nn.MaxPool3d`` that pools CUDA tensors in channels_last_3d with the Triton kernels of
    :mod:`coclr.models.pool_triton` (the same values, a one-byte argmax, a backward without atomics) on GPUs of
    compute capability 8.0 or newer, for the pools those kernels are faster at (:attr:`triton_pays`); elsewhere,
    without Triton, or inside ``torch.compile`` (which makes its own kernels), PyTorch's."""

    @property
    def geometry(self) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]:
        """(window, stride, padding), each as (t, h, w)."""
        return _triple(self.kernel_size), _triple(self.stride), _triple(self.padding)

    @property
    def triton_pays(self) -> bool:
        """Whether the Triton kernels beat PyTorch's at this pool on a GPU: the pools that do not stride in time.
        Measured pool by pool in S3D on an H200 (``benchmarks/s3d_gpu_parts.py --parts pools``,
        docs/experiments/2026-11-29-gpu-h200-2.md): the two that stride in time (MaxPool_4a, MaxPool_5a) ran at
        about half PyTorch's speed, every other one faster."""
        return self.geometry[1][0] == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.triton_pays and x.device.type == "cuda" and x.dim() == 5
                and x.is_contiguous(memory_format=torch.channels_last_3d)
                and not torch.compiler.is_compiling() and not self.ceil_mode and not self.return_indices
                and _triple(self.dilation) == (1, 1, 1) and _triton_pool() is not None
                and _ampere_or_newer(x.device.index if x.device.index is not None else torch.cuda.current_device())):
            return _triton_pool().max_pool3d(x, *self.geometry)
        return super().forward(x)


class InceptionMaxPool3d(MaxPool3d):
    """The inception blocks' 3x3x3 stride-1 max-pool; on CPU it pools a channels-last copy of its input.

    For this kernel PyTorch's CPU max-pool is faster, forward and backward, on channels-last tensors
    (``python benchmarks/bench_s3d_pool.py`` measures it). The values are the same, returned in the input's
    layout. The stem's strided pools are not faster that way and stay :class:`MaxPool3d`; on CUDA it pools as
    :class:`MaxPool3d` does.
    """

    def __init__(self) -> None:
        super().__init__(3, stride=1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.is_contiguous(memory_format=torch.channels_last_3d):
            return super().forward(x)
        return super().forward(x.contiguous(memory_format=torch.channels_last_3d)).contiguous()


def _triple(value: int | Sequence[int]) -> tuple[int, int, int]:
    return (value,) * 3 if isinstance(value, int) else tuple(value)  # type: ignore[return-value]


@functools.cache
def _ampere_or_newer(device_index: int) -> bool:
    """The pools' Triton kernels are compiled for and checked on sm_90; older than sm_80 keeps PyTorch's."""
    return torch.cuda.get_device_capability(device_index) >= (8, 0)


@functools.cache
def _triton_pool():
    """:mod:`coclr.models.pool_triton`, or None where Triton does not import."""
    try:
        from coclr.models import pool_triton  # noqa: PLC0415 (optional: Triton)
    except ImportError:
        return None
    return pool_triton


class SepInception(nn.Module):
    """Separable inception block; the four branch outputs are concatenated on channels.

    ``branch0`` = 1x1x1; ``branch1``/``branch2`` = 1x1x1 then STConv3d k=3; ``branch3`` = 3x3x3 max-pool
    (stride 1) then 1x1x1. With ``gating``, each branch output is self-gated (``gating_b0`` .. ``gating_b3``).
    """

    def __init__(
        self,
        in_channels: int,
        channels: Sequence[int],
        gating: bool = False,
        bn_eps: float = 1e-5,
        bn_momentum: float = 0.1,
    ) -> None:
        super().__init__()
        if len(channels) != 6:
            raise ValueError(f"SepInception needs 6 channel counts [b0, b1a, b1b, b2a, b2b, b3], got {channels!r}")
        b0, b1a, b1b, b2a, b2b, b3 = channels
        bn = {"bn_eps": bn_eps, "bn_momentum": bn_momentum}
        self.branch0 = nn.Sequential(BasicConv3d(in_channels, b0, **bn))
        self.branch1 = nn.Sequential(BasicConv3d(in_channels, b1a, **bn), STConv3d(b1a, b1b, 3, 1, 1, **bn))
        self.branch2 = nn.Sequential(BasicConv3d(in_channels, b2a, **bn), STConv3d(b2a, b2b, 3, 1, 1, **bn))
        self.branch3 = nn.Sequential(InceptionMaxPool3d(), BasicConv3d(in_channels, b3, **bn))
        self.gating = gating
        if gating:
            self.gating_b0 = SelfGating(b0)
            self.gating_b1 = SelfGating(b1b)
            self.gating_b2 = SelfGating(b2b)
            self.gating_b3 = SelfGating(b3)
        self.out_channels = b0 + b1b + b2b + b3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0, x1, x2, x3 = self.branch0(x), self.branch1(x), self.branch2(x), self.branch3(x)
        if self.gating:
            x0, x1, x2, x3 = self.gating_b0(x0), self.gating_b1(x1), self.gating_b2(x2), self.gating_b3(x3)
        return torch.cat((x0, x1, x2, x3), dim=1)


def _positive(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
            and value > 0)


def check_arch(width: object, gating: object, bn_eps: object) -> None:
    """The rule of :class:`S3D`'s construction arguments (also of a checkpoint's ``arch``, checked before a network is
    built: :func:`coclr.models.loading.load_encoder`): a ``ValueError`` naming the one at fault. A width or epsilon
    that is not a positive finite number (an infinite width was an OverflowError deep inside; an epsilon of 0 or less
    gave NaN features wherever a channel's variance is small), a gating that is not a bool (``bool("no")`` built a
    gated network)."""
    if not _positive(width):
        raise ValueError(f"width must be a positive finite number, got {width!r}")
    if not _positive(bn_eps):
        raise ValueError(f"bn_eps must be a positive finite number, got {bn_eps!r}")
    if not isinstance(gating, bool):
        raise ValueError(f"gating must be true or false, got {gating!r}")


class S3D(nn.Module):
    """S3D backbone returning the 5-D feature map (pooling and heads live outside it).

    Args:
        width: channel multiplier (see :func:`scaled_channels` for the rounding); 1.0 is the paper's network.
        gating: add S3D-G self-gating to every inception branch (the CoCLR paper's models do not use it).
        bn_eps: BatchNorm epsilon (1e-5 as in the authors' code; torchvision's S3D uses 1e-3).
        bn_momentum: BatchNorm momentum for the running statistics.

    Attributes:
        out_channels: channels of the output map (1024 at width 1).
        width, gating, bn_eps: the construction arguments, kept to rebuild the network.
    """

    def __init__(self, width: float = 1.0, gating: bool = False, bn_eps: float = 1e-5, bn_momentum: float = 0.1):
        super().__init__()
        check_arch(width, gating, bn_eps)
        self.width = float(width)
        self.gating = bool(gating)
        self.bn_eps = float(bn_eps)
        bn = {"bn_eps": bn_eps, "bn_momentum": bn_momentum}

        def ch(c: int) -> int:
            return scaled_channels(c, width)

        self.Conv_1a = STConv3d(3, ch(64), 7, stride=2, padding=3, **bn)
        self.MaxPool_2a = MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.Conv_2b = BasicConv3d(ch(64), ch(64), **bn)
        self.Conv_2c = STConv3d(ch(64), ch(192), 3, stride=1, padding=1, **bn)
        self.MaxPool_3a = MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.MaxPool_4a = MaxPool3d(3, stride=2, padding=1)
        self.MaxPool_5a = MaxPool3d(2, stride=2)

        in_channels = ch(192)
        for name, channels in INCEPTION_TABLE:
            block = SepInception(in_channels, [ch(c) for c in channels], gating=gating, **bn)
            self.add_module(name, block)
            in_channels = block.out_channels
        self.out_channels = in_channels

    def set_bn_eps(self, eps: float) -> None:
        """Every BatchNorm's epsilon (weights whose running statistics were kept under another: torchvision's)."""
        self.bn_eps = float(eps)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm3d):
                module.eps = self.bn_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 3, T, H, W]`` -> ``[B, out_channels, T', H', W']``."""
        if x.dim() != 5 or x.shape[1] != 3:
            raise ValueError(f"S3D expects a [B, 3, T, H, W] tensor, got shape {tuple(x.shape)}")
        # clips of another dtype than the weights: torch's message named neither the input nor the remedy (under
        # autocast the convolutions take both; a network fused for inference holds its weights as buffers)
        weight = next(self.parameters(), None)
        if weight is None:
            weight = next((buffer for buffer in self.buffers() if buffer.is_floating_point()), None)
        if weight is not None and x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(f"S3D's weights are {weight.dtype} and the clips {x.dtype}: give {weight.dtype} clips "
                             "(normalised, as the training's were), or move the network to their dtype")
        if any(size < least for size, least in zip(x.shape[2:], MIN_INPUT_SIZE)):
            raise ValueError(f"S3D needs T x H x W of at least {MIN_INPUT_SIZE}, got {tuple(x.shape[2:])}")
        x = self.Conv_1a(x)
        x = self.Conv_2c(self.Conv_2b(self.MaxPool_2a(x)))
        x = self.Mixed_3c(self.Mixed_3b(self.MaxPool_3a(x)))
        x = self.MaxPool_4a(x)
        for name in ("Mixed_4b", "Mixed_4c", "Mixed_4d", "Mixed_4e", "Mixed_4f"):
            x = getattr(self, name)(x)
        x = self.MaxPool_5a(x)
        return self.Mixed_5c(self.Mixed_5b(x))
