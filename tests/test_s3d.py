"""S3D backbone: parameter counts, output shapes, width scaling, gating, init, memory-format invariance and the
inception pool."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from coclr.models.s3d import S3D, InceptionMaxPool3d, SepInception

# The layer table of the paper's S3D (docs/ARCHITECTURE.md), written out again here so the counts below are
# independent of the implementation's own table.
STEM = [("st", 3, 64, 7), ("basic", 64, 64, 1), ("st", 64, 192, 3)]
MIXED = [
    (64, 96, 128, 16, 32, 32),
    (128, 128, 192, 32, 96, 64),
    (192, 96, 208, 16, 48, 64),
    (160, 112, 224, 24, 64, 64),
    (128, 128, 256, 24, 64, 64),
    (112, 144, 288, 32, 64, 64),
    (256, 160, 320, 32, 128, 128),
    (256, 160, 320, 32, 128, 128),
    (384, 192, 384, 48, 128, 128),
]


def expected_parameter_count(width: float, gating: bool) -> int:
    """Parameters of S3D by a loop over the layer table (conv weights, BN weight+bias, gating FC)."""

    def ch(c: int) -> int:
        return max(1, math.floor(c * width + 0.5))

    def basic(cin: int, cout: int) -> int:
        return cin * cout + 2 * cout

    def st(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k + 2 * cout + cout * cout * k + 2 * cout

    total = 0
    for kind, cin, cout, k in STEM:
        cin = cin if cin == 3 else ch(cin)  # the RGB / flow input is never scaled
        total += st(cin, ch(cout), k) if kind == "st" else basic(cin, ch(cout))
    cin = ch(192)
    for row in MIXED:
        b0, b1a, b1b, b2a, b2b, b3 = (ch(c) for c in row)
        total += basic(cin, b0) + basic(cin, b1a) + st(b1a, b1b, 3) + basic(cin, b2a) + st(b2a, b2b, 3)
        total += basic(cin, b3)
        if gating:
            total += sum(c * c + c for c in (b0, b1b, b2b, b3))
        cin = b0 + b1b + b2b + b3
    return total


def expected_output_size(size: tuple[int, int, int]) -> tuple[int, int, int]:
    """Output T', H', W' by applying each strided stage's (kernel, stride, pad) in turn."""
    stages = [  # per dimension (t, h, w): (kernel, stride, padding)
        ((7, 2, 3), (7, 2, 3), (7, 2, 3)),  # Conv_1a
        ((1, 1, 0), (3, 2, 1), (3, 2, 1)),  # MaxPool_2a
        ((1, 1, 0), (3, 2, 1), (3, 2, 1)),  # MaxPool_3a
        ((3, 2, 1), (3, 2, 1), (3, 2, 1)),  # MaxPool_4a
        ((2, 2, 0), (2, 2, 0), (2, 2, 0)),  # MaxPool_5a
    ]
    out = list(size)
    for stage in stages:
        out = [(n + 2 * p - k) // s + 1 for n, (k, s, p) in zip(out, stage)]
    return tuple(out)  # type: ignore[return-value]


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_parameter_counts_match_the_paper_network():
    assert count(S3D()) == 7_910_048
    assert count(S3D(gating=True)) == 9_098_000
    # the independent counter agrees with the published figures, so it can be trusted at other widths
    assert expected_parameter_count(1.0, False) == 7_910_048
    assert expected_parameter_count(1.0, True) == 9_098_000


@pytest.mark.parametrize("width,gating", [(0.25, False), (0.125, False), (0.25, True), (0.3, False)])
def test_parameter_count_at_reduced_width(width, gating):
    model = S3D(width=width, gating=gating)
    assert count(model) == expected_parameter_count(width, gating)
    last = MIXED[-1]
    assert model.out_channels == sum(max(1, math.floor(c * width + 0.5)) for c in (last[0], last[2], last[4], last[5]))


@pytest.fixture(scope="module")
def full_s3d() -> S3D:
    return S3D().eval()


@pytest.mark.parametrize("size", [(8, 32, 32), (9, 33, 33)])
def test_output_shapes_full_width(full_s3d, size):
    with torch.no_grad():
        out = full_s3d(torch.randn(2, 3, *size))
    assert full_s3d.out_channels == 1024
    assert tuple(out.shape) == (2, 1024, *expected_output_size(size))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "width,size", [(0.125, (32, 128, 128)), (0.125, (16, 64, 64)), (0.25, (8, 32, 32)), (0.125, (12, 56, 72))]
)
def test_output_shapes_reduced_width(width, size):
    model = S3D(width=width).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, *size))
    assert tuple(out.shape) == (1, model.out_channels, *expected_output_size(size))
    assert expected_output_size((32, 128, 128)) == (4, 4, 4)  # the table's 3x32x128x128 -> 1024x4x4x4


@pytest.mark.parametrize("shape", [(1, 3, 7, 32, 32), (1, 3, 8, 31, 32), (1, 1, 8, 32, 32), (3, 8, 32, 32)])
def test_bad_input_shapes_are_refused_with_the_shape(shape):
    with pytest.raises(ValueError, match=r"\(.*\)"):
        S3D(width=0.125)(torch.zeros(shape))


def test_initialisation():
    torch.manual_seed(0)
    model = S3D(width=0.5)
    conv_weights = torch.cat([m.weight.detach().flatten() for m in model.modules() if isinstance(m, torch.nn.Conv3d)])
    assert abs(conv_weights.mean().item()) < 1e-3
    assert conv_weights.std().item() == pytest.approx(0.01, rel=0.02)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm3d):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0)
            assert module.eps == 1e-5 and module.momentum == 0.1
    assert all(m.eps == 1e-3 for m in S3D(width=0.125, bn_eps=1e-3).modules() if isinstance(m, torch.nn.BatchNorm3d))


def test_authors_submodule_names():
    keys = set(S3D(width=0.125).state_dict())
    for key in [
        "Conv_1a.conv1.weight",
        "Conv_1a.bn2.running_var",
        "Conv_2b.conv.weight",
        "Conv_2b.bn.num_batches_tracked",
        "Conv_2c.conv2.weight",
        "Mixed_3b.branch0.0.conv.weight",
        "Mixed_3b.branch1.1.conv1.weight",
        "Mixed_4e.branch2.1.bn2.running_mean",
        "Mixed_5c.branch3.1.conv.weight",
    ]:
        assert key in keys
    assert not any(key.startswith("block") for key in keys)
    gated = set(S3D(width=0.125, gating=True).state_dict()) - keys
    assert "Mixed_3b.gating_b0.fc.weight" in gated and "Mixed_5c.gating_b3.fc.bias" in gated


def test_self_gating_matches_a_per_channel_loop():
    torch.manual_seed(0)
    block = SepInception(8, (4, 3, 5, 2, 3, 2), gating=True).eval()
    plain = SepInception(8, (4, 3, 5, 2, 3, 2), gating=False).eval()
    plain.load_state_dict({k: v for k, v in block.state_dict().items() if "gating" not in k})
    x = torch.randn(2, 8, 3, 5, 5)
    with torch.no_grad():
        ungated = plain(x)
        out = block(x)
    gates = [block.gating_b0, block.gating_b1, block.gating_b2, block.gating_b3]
    sizes = [4, 5, 3, 2]
    expected = ungated.clone()
    start = 0
    for gate, size in zip(gates, sizes):
        w, b = gate.fc.weight.detach(), gate.fc.bias.detach()
        for n in range(x.shape[0]):
            mean = [ungated[n, start + c].mean().item() for c in range(size)]
            for c in range(size):
                logit = b[c].item() + sum(w[c, j].item() * mean[j] for j in range(size))
                expected[n, start + c] = ungated[n, start + c] / (1 + math.exp(-logit))
        start += size
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_channels_last_3d_gives_the_same_output():
    torch.manual_seed(0)
    model = S3D(width=0.125, gating=True).eval()
    x = torch.randn(2, 3, 8, 40, 40)
    with torch.no_grad():
        reference = model(x)
        model_cl = model.to(memory_format=torch.channels_last_3d)
        out = model_cl(x.contiguous(memory_format=torch.channels_last_3d))
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d])
def test_inception_pool_matches_a_loop_over_windows(memory_format):
    """Values and gradient of the pool (channels-last copy on CPU) equal a max over each clipped 3x3x3 window."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 6).contiguous(memory_format=memory_format).requires_grad_()
    out = InceptionMaxPool3d()(x)
    assert out.shape == x.shape and out.is_contiguous(memory_format=memory_format)  # the layout it was given
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    expected, expected_grad = torch.empty_like(out), torch.zeros_like(x)
    n, c, t, h, w = x.shape
    for i, j, a, b, d in itertools.product(range(n), range(c), range(t), range(h), range(w)):
        window = x[i, j, max(a - 1, 0) : a + 2, max(b - 1, 0) : b + 2, max(d - 1, 0) : d + 2].detach()
        expected[i, j, a, b, d] = window.max()
        at = torch.unravel_index(window.argmax(), window.shape)
        where = (i, j, max(a - 1, 0) + at[0], max(b - 1, 0) + at[1], max(d - 1, 0) + at[2])
        expected_grad[where] += weights[i, j, a, b, d]
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(x.grad, expected_grad)


def test_training_step_reaches_every_parameter():
    torch.manual_seed(0)
    model = S3D(width=0.125, gating=True).train()
    model(torch.randn(2, 3, 8, 32, 32)).mean().backward()
    without_grad = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert without_grad == []
    bn = model.Conv_1a.bn1
    assert bn.num_batches_tracked.item() == 1 and not torch.all(bn.running_mean == 0)


def test_clips_of_another_dtype_and_an_infinite_width_are_one_clear_error():
    """A float64 clip was torch's "expected scalar type Double but found Float"; width=inf an OverflowError."""
    network = S3D(width=0.125).eval()
    with pytest.raises(ValueError, match="S3D's weights are torch.float32 and the clips torch.float64"):
        network(torch.zeros(1, 3, 8, 32, 32, dtype=torch.float64))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # autocast takes both: not refused
        assert network(torch.zeros(1, 3, 8, 32, 32)).shape[1] == network.out_channels
    with pytest.raises(ValueError, match="width must be a positive finite number"):
        S3D(width=float("inf"))


def test_a_network_its_own_loader_would_refuse_is_not_built():
    """S3D(bn_eps=0) saved a file load_encoder refused, bn_eps=-1 gave NaN features, gating="no" a gated network."""
    for bn_eps in (0.0, -1.0, float("nan"), True, "1e-5"):
        with pytest.raises(ValueError, match="bn_eps must be a positive finite number"):
            S3D(width=0.125, bn_eps=bn_eps)
    for gating in ("no", 1, None):
        with pytest.raises(ValueError, match="gating must be true or false"):
            S3D(width=0.125, gating=gating)
    assert S3D(width=0.125, bn_eps=1e-3, gating=True).gating is True
