"""The inference max-pool in C: PyTorch's values bit for bit, for every pool of S3D and odd shapes, NaN and
infinities included, on any thread count; the fused network uses it and falls back to PyTorch without a compiler."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from coclr import native
from coclr.models import pool_cpu
from coclr.models.inference import fused_for_inference
from coclr.models.pool_cpu import MaxPool3dInference, max_pool3d
from coclr.models.s3d import S3D

pytestmark = pytest.mark.skipif(native.find_compiler() is None, reason="no C compiler found (set CC or install gcc)")

S3D_POOLS = [((1, 3, 3), (1, 2, 2), (0, 1, 1)), (3, 2, 1), (2, 2, 0), (3, 1, 1)]
"""(kernel, stride, padding) of S3D's max-pools: the stem's, MaxPool_4a, MaxPool_5a, the inception blocks'."""


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN, and the same shape."""
    return a.shape == b.shape and torch.equal(torch.nan_to_num(a, nan=7.5), torch.nan_to_num(b, nan=7.5)) and \
        torch.equal(a.isnan(), b.isnan())


@pytest.mark.parametrize(("kernel", "stride", "padding"), [*S3D_POOLS, ((2, 3, 1), (1, 2, 3), (1, 1, 0))])
@pytest.mark.parametrize("shape", [(2, 5, 7, 9, 6), (1, 17, 4, 5, 5), (3, 64, 2, 3, 8)])
def test_the_same_values_as_pytorch(kernel, stride, padding, shape):
    generator = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=generator)
    x.view(-1)[::7] = float("nan")  # NaN propagates as in PyTorch, ...
    x.view(-1)[3::11] = float("-inf")  # ... and infinities stay
    x.view(-1)[5::13] = float("inf")
    x[0, 0] = float("-inf")  # a window of -inf only
    for layout in (torch.contiguous_format, torch.channels_last_3d):
        source = x.contiguous(memory_format=layout)
        expected = F.max_pool3d(source, kernel, stride, padding)
        ours = max_pool3d(source, kernel, stride, padding)
        assert ours.is_contiguous(memory_format=torch.channels_last_3d) and _same(ours, expected)
        module = MaxPool3dInference(kernel, stride, padding)(source)
        assert module.is_contiguous(memory_format=layout) and _same(module, expected)


def test_other_input_is_pytorchs_to_answer():
    """Empty, unbatched or invalid input gets PyTorch's result or PyTorch's error."""
    for x in (torch.randn(0, 3, 4, 4, 4), torch.randn(3, 4, 4, 4)):
        assert torch.equal(max_pool3d(x, 3, 1, 1), F.max_pool3d(x, 3, 1, 1))
    with pytest.raises(RuntimeError, match="pad should be"):
        max_pool3d(torch.randn(1, 2, 4, 4, 4), 3, 1, 2)
    with pytest.raises(RuntimeError):
        max_pool3d(torch.randn(1, 2, 4, 4, 4), 3, 0, 1)


def test_any_thread_count_gives_the_same_bits():
    x = torch.randn(3, 40, 6, 9, 9).contiguous(memory_format=torch.channels_last_3d)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            results.append(max_pool3d(x, 3, 1, 1))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], other) for other in results[1:])
    assert torch.equal(results[0], F.max_pool3d(x, 3, 1, 1))


def test_the_fused_network_pools_in_c_with_the_same_features():
    torch.manual_seed(0)
    backbone = S3D(width=0.25).eval()
    fused = fused_for_inference(backbone)
    pools = [m for m in fused.modules() if isinstance(m, MaxPool3dInference)]
    assert len(pools) == sum(isinstance(m, torch.nn.MaxPool3d) for m in backbone.modules()) == 4 + 9
    x = torch.randn(2, 3, 8, 32, 32).contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        ours = fused(x)
        for pool in pools:  # the same network with PyTorch's pools
            pool.forward = lambda t, p=pool: F.max_pool3d(t, p.kernel_size, p.stride, p.padding)
        theirs = fused(x)
    assert torch.equal(ours, theirs) and pool_cpu.KERNEL.load() is not None  # the C pools ran


def test_without_a_compiler_pytorch_pools_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(pool_cpu.KERNEL, "_state", [])
    monkeypatch.setattr(native, "find_compiler", lambda: None)
    x = torch.randn(1, 4, 3, 5, 5)
    with pytest.warns(RuntimeWarning, match="no C compiler found"):
        first = max_pool3d(x, 3, 1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        assert torch.equal(max_pool3d(x, 3, 1, 1), first)
    assert torch.equal(first, F.max_pool3d(x, 3, 1, 1))

