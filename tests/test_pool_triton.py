"""S3D's max-pools on a GPU (:mod:`coclr.models.pool_triton`): the Triton kernels give ``F.max_pool3d``'s values and
gradient (ties and NaN included), checked under Triton's interpreter on the CPU and compiled on CUDA; every pool of
S3D goes through the class that dispatches to them, and the CPU keeps PyTorch's pools."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from coclr.models.s3d import S3D, InceptionMaxPool3d, MaxPool3d
from test_flow_triton import interpret, needs_triton


@needs_triton
def test_the_kernels_give_max_pool3d_values_and_gradient_under_the_interpreter():
    assert interpret("pool").splitlines() == ["pool: ok"]


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_compiled_kernels_give_max_pool3d_values_and_gradient_on_cuda():
    assert interpret("pool", device="cuda").splitlines() == ["pool: ok"]


def test_every_pool_of_s3d_dispatches_through_maxpool3d():
    pools = [m for m in S3D(width=0.125).modules() if isinstance(m, nn.MaxPool3d)]
    assert len(pools) == 13 and all(isinstance(m, MaxPool3d) for m in pools)
    assert sum(isinstance(m, InceptionMaxPool3d) for m in pools) == 9


def test_on_the_cpu_the_pools_are_pytorchs(monkeypatch):
    from coclr.models import s3d

    monkeypatch.setattr(s3d, "_triton_pool", lambda: pytest.fail("the Triton pool was asked for on the CPU"))
    x = torch.randn(2, 5, 4, 9, 9).contiguous(memory_format=torch.channels_last_3d)
    for pool in (MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1)), InceptionMaxPool3d()):
        assert torch.equal(pool(x), torch.nn.functional.max_pool3d(x, pool.kernel_size, pool.stride, pool.padding))


def test_the_pools_that_stride_in_time_keep_pytorchs_on_the_gpu():
    """The Triton kernels were measured slower than PyTorch's at the two pools that stride in time (on an H200), so
    those two keep PyTorch's; the eleven others take Triton's."""
    model = S3D(width=0.125)
    pools = {name: m for name, m in model.named_modules() if isinstance(m, MaxPool3d)}
    assert sorted(name for name, m in pools.items() if not m.triton_pays) == ["MaxPool_4a", "MaxPool_5a"]
    assert all(m.geometry[1][0] == 1 for m in pools.values() if m.triton_pays)
