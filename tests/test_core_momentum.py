"""Momentum key encoder: copy, EMA update vs a loop, shuffled_forward in one process."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from coclr.core.momentum import momentum_copy, momentum_update, shuffled_forward


def small_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def test_momentum_copy_is_frozen_deep_copy():
    online = small_net(0)
    target = momentum_copy(online)
    assert all(not p.requires_grad for p in target.parameters())
    assert all(p.requires_grad for p in online.parameters())
    for a, b in zip(online.state_dict().values(), target.state_dict().values()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()


def test_momentum_update_matches_loop_and_leaves_buffers():
    online, target = small_net(0), small_net(1)
    target.train()(torch.randn(8, 4))  # give the target's BatchNorm its own running statistics
    online.train()(torch.randn(8, 4) * 5)
    expected = {
        name: 0.9 * t + 0.1 * o
        for (name, t), o in zip(target.named_parameters(), online.parameters())
    }
    buffers_before = {name: b.clone() for name, b in target.named_buffers()}
    online_before = {name: p.clone() for name, p in online.state_dict().items()}

    momentum_update(online, target, m=0.9)

    for name, parameter in target.named_parameters():
        torch.testing.assert_close(parameter, expected[name])
    for name, buffer in target.named_buffers():
        assert torch.equal(buffer, buffers_before[name]), name
    for name, value in online.state_dict().items():
        assert torch.equal(value, online_before[name]), name


def test_momentum_update_limits():
    online, target = small_net(0), small_net(1)
    before = [p.clone() for p in target.parameters()]
    momentum_update(online, target, m=1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters()))
    momentum_update(online, target, m=0.0)
    assert all(torch.equal(a, b) for a, b in zip(online.parameters(), target.parameters()))


def test_momentum_update_mismatch_errors():
    with pytest.raises(ValueError, match="parameters"):
        momentum_update(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="shape"):
        momentum_update(nn.Linear(2, 2), nn.Linear(2, 3))


def test_shuffled_forward_single_process_is_plain_forward_without_grad():
    net = small_net(2).train()
    x = torch.randn(5, 4)
    reference = momentum_copy(net)
    out = shuffled_forward(net, x)
    assert not out.requires_grad
    torch.testing.assert_close(out, reference(x))
    # BatchNorm statistics were updated on the whole batch, as a plain forward does.
    torch.testing.assert_close(net[1].running_mean, reference[1].running_mean)
