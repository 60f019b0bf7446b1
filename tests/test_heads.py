"""Projection head, linear classifier and encoder, compared with numpy computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coclr.models import S3D, Encoder, LinearClassifier, ProjectionHead, build_encoder


def as_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def test_projection_head_is_linear_relu_linear():
    torch.manual_seed(0)
    head = ProjectionHead(6, 5, 3)
    x = torch.randn(4, 6)
    w1, b1, w2, b2 = (as_np(p) for p in (head.fc1.weight, head.fc1.bias, head.fc2.weight, head.fc2.bias))
    expected = np.maximum(as_np(x) @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(as_np(head(x)), expected, rtol=1e-5, atol=1e-6)
    assert sorted(head.state_dict()) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]


@pytest.mark.parametrize("final_bn,dropout", [(False, 0.0), (True, 0.0), (True, 0.9), (False, 0.5)])
def test_linear_classifier_layout_and_eval_output(final_bn, dropout):
    torch.manual_seed(0)
    clf = LinearClassifier(8, 3, final_bn=final_bn, dropout=dropout)
    fc = "final_fc.1" if dropout > 0 else "final_fc.0"
    expected_keys = {f"{fc}.weight", f"{fc}.bias"}
    if final_bn:
        bn_keys = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
        expected_keys |= {f"final_bn.{k}" for k in bn_keys}
        with torch.no_grad():
            clf.final_bn.running_mean.uniform_(-1, 1)
            clf.final_bn.running_var.uniform_(0.5, 2)
            clf.final_bn.weight.uniform_(0.5, 2)
            clf.final_bn.bias.uniform_(-1, 1)
    assert set(clf.state_dict()) == expected_keys
    clf.eval()
    x = torch.randn(5, 8)
    feats = as_np(x)
    if final_bn:
        bn = clf.final_bn
        feats = (feats - as_np(bn.running_mean)) / np.sqrt(as_np(bn.running_var) + bn.eps)
        feats = feats * as_np(bn.weight) + as_np(bn.bias)
    expected = feats @ as_np(clf.linear.weight).T + as_np(clf.linear.bias)
    np.testing.assert_allclose(as_np(clf(x)), expected, rtol=1e-5, atol=1e-6)


def test_linear_classifier_dropout_acts_in_training_only():
    torch.manual_seed(0)
    clf = LinearClassifier(16, 2, dropout=0.5)
    x = torch.randn(64, 16)
    assert not torch.allclose(clf.train()(x), clf.eval()(x))
    with pytest.raises(ValueError, match="1.0"):
        LinearClassifier(4, 2, dropout=1.0)


@pytest.fixture(scope="module")
def small_encoder() -> Encoder:
    torch.manual_seed(0)
    return build_encoder(width=0.125, embed_dim=16).eval()


def test_encoder_features_are_the_spatiotemporal_mean(small_encoder):
    x = torch.randn(2, 3, 16, 64, 64)
    with torch.no_grad():
        fmap = as_np(small_encoder.backbone(x))
        features = as_np(small_encoder.features(x))
    assert features.shape == (2, small_encoder.backbone.out_channels)
    _, _, t, h, w = fmap.shape
    assert (t, h, w) == (2, 2, 2)
    expected = np.zeros(features.shape)
    for i in range(t):
        for j in range(h):
            for k in range(w):
                expected += fmap[:, :, i, j, k]
    np.testing.assert_allclose(features, expected / (t * h * w), rtol=1e-5, atol=1e-6)


def test_encoder_forward_is_the_normalised_head_output(small_encoder):
    x = torch.randn(3, 3, 8, 32, 32)
    with torch.no_grad():
        projected = as_np(small_encoder.head(small_encoder.features(x)))
        out = as_np(small_encoder(x))
    assert out.shape == (3, 16)
    np.testing.assert_allclose(out, projected / np.linalg.norm(projected, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)


def test_build_encoder_paper_shapes_and_arch_round_trip():
    encoder = build_encoder()
    assert encoder.backbone.out_channels == 1024
    assert tuple(encoder.head.fc1.weight.shape) == (1024, 1024)  # FC-1024
    assert tuple(encoder.head.fc2.weight.shape) == (128, 1024)  # FC-128
    assert encoder.arch == {"width": 1.0, "gating": False, "embed_dim": 128, "bn_eps": 1e-5}

    small = build_encoder(width=0.25, gating=True, embed_dim=32, bn_eps=1e-3)
    rebuilt = build_encoder(**small.arch)
    shapes = {k: tuple(v.shape) for k, v in small.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in rebuilt.state_dict().items()} == shapes
    assert rebuilt.arch == small.arch and rebuilt.backbone.bn_eps == 1e-3


def test_features_only_encoder():
    encoder = Encoder(S3D(width=0.125), None)
    assert encoder.arch["embed_dim"] is None
    with pytest.raises(RuntimeError, match="features"):
        encoder(torch.zeros(1, 3, 8, 32, 32))
    assert build_encoder(width=0.125, embed_dim=None).head is None
