"""The fused inference network of ``coclr embed`` (BatchNorm folded into the convolutions, ReLU fused with them):
the fold against conv -> BatchNorm, the fused S3D against the eager one, independent of the thread count, and
the embeddings of real clips and generated videos against the unfused float32 path."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import coclr.models.inference as inference_module
from coclr.embed.embedder import Embedder
from coclr.models.inference import ConvReLU, fold_batchnorm, fused_for_inference, has_fused_convolution
from coclr.models.s3d import S3D
from test_embed import SMALL, moving_square
from test_eval_helpers import save_tiny_encoder

COSINE_BOUND = 0.9999
"""How close the fused network's embeddings must stay to the unfused float32 path's."""


def calibrated_s3d(width: float, seed: int = 0) -> S3D:
    """An S3D whose BatchNorm statistics are set on random clips (one pass in training mode), then in eval mode:
    the statistics and affine parameters the fold has to get right are all non-trivial. Clips of the tests' size
    (16 x 64 x 64), so that the deepest layers' statistics are taken over enough positions to keep the activations
    of the same size as the input's."""
    torch.manual_seed(seed)
    backbone = S3D(width=width)
    for module in backbone.modules():
        if isinstance(module, nn.BatchNorm3d):
            module.momentum = None
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.uniform_(module.bias, -0.2, 0.2)
    backbone.train()
    with torch.no_grad():
        backbone(torch.rand(4, 3, 16, 64, 64) * 4 - 2)
    return backbone.eval()


def row_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.flatten(1).double(), b.flatten(1).double(), dim=1)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("conv_bias", [False, True])
def test_fold_batchnorm_is_conv_then_batchnorm(dtype, atol, conv_bias):
    torch.manual_seed(0)
    conv = nn.Conv3d(5, 7, (3, 1, 3), stride=(1, 2, 1), padding=(1, 0, 1), bias=conv_bias).to(dtype)
    bn = nn.BatchNorm3d(7).to(dtype).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.1, 3)
        bn.weight.uniform_(-2, 2)
        bn.bias.uniform_(-1, 1)
    x = torch.randn(2, 5, 6, 9, 8, dtype=dtype)
    weight, bias = fold_batchnorm(conv, bn)
    with torch.no_grad():
        expected = bn(conv(x))
    torch.testing.assert_close(F.conv3d(x, weight, bias, conv.stride, conv.padding), expected, atol=atol, rtol=0)
    assert weight.dtype == bias.dtype == dtype
    with pytest.raises(ValueError, match="running statistics"):
        fold_batchnorm(conv, nn.BatchNorm3d(7, track_running_stats=False))


def test_the_fused_copy_computes_the_eager_network_and_leaves_it_alone():
    """The fused S3D gives the eval-mode network's features as closely as float32 does: against the eager network
    run in float64, cosine >= 0.9999 per clip and an error at most 10x the eager float32 network's own (measured:
    2.8x, 1.1e-4 of the largest feature, cosine 0.999999997), on the oneDNN op and on the fallback; no BatchNorm
    is left and every convolution runs oneDNN's fused op where PyTorch has it (the profile shows no separate
    BatchNorm or ReLU); the network it was made from is unchanged."""
    backbone = calibrated_s3d(0.25).train()
    before = {name: value.clone() for name, value in backbone.state_dict().items()}
    fused = fused_for_inference(backbone)
    assert backbone.training and not fused.training
    assert all(torch.equal(value, before[name]) for name, value in backbone.state_dict().items())
    assert not any(isinstance(m, nn.BatchNorm3d) for m in fused.modules())
    convs = [m for m in fused.modules() if isinstance(m, ConvReLU)]
    assert len(convs) == sum(isinstance(m, nn.BatchNorm3d) for m in backbone.modules()) == 77
    assert not any(p.requires_grad for p in fused.parameters())

    backbone.eval()
    x = (torch.rand(3, 3, 16, 64, 64) * 4 - 2).contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad(), torch.profiler.profile() as profile:
        eager = backbone(x)
        out = fused.to(memory_format=torch.channels_last_3d)(x)
    with torch.no_grad():
        exact = copy.deepcopy(backbone).double()(x.double())
    if has_fused_convolution():
        ops = {event.key: event.count for event in profile.key_averages()}
        assert ops.get("mkldnn::_convolution_pointwise") == 77, ops
        # every BatchNorm and ReLU in the profile is the eager network's: the fused one runs none
        assert ops.get("aten::native_batch_norm") == ops.get("aten::relu_") == 77, ops

    for conv in convs:
        conv.fused = False  # conv3d then an in-place ReLU: what a CUDA tensor or a PyTorch without the op runs
    with torch.no_grad():
        fallback = fused(x)
    float32_error = (eager.double() - exact).abs().max()
    for result in (out, fallback):
        assert result.shape == exact.shape
        assert row_cosines(result, exact).min() >= COSINE_BOUND
        assert (result.double() - exact).abs().max() <= 10 * float32_error


def test_the_fused_network_does_not_depend_on_the_thread_count():
    """The same bits on the Intel Xeon it was measured on (oneDNN's forward convolutions do not split their sums
    across threads); the bound leaves room for a CPU whose kernels order a sum by the thread count: rounding only."""
    fused = fused_for_inference(calibrated_s3d(0.25)).to(memory_format=torch.channels_last_3d)
    x = (torch.rand(2, 3, 16, 64, 64) * 4 - 2).contiguous(memory_format=torch.channels_last_3d)
    threads = torch.get_num_threads()
    outputs = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            with torch.no_grad():
                outputs.append(fused(x))
    finally:
        torch.set_num_threads(threads)
    scale = outputs[0].abs().max()
    assert all((outputs[0] - other).abs().max() <= 1e-6 * scale for other in outputs[1:])


def unfused_embedder(monkeypatch, *args, **kwargs) -> Embedder:
    """The embedder as it was before the fusion: the eager float32 network (channels-last 3D on the CPU)."""
    with monkeypatch.context() as patch:
        patch.setattr(inference_module, "fused_for_inference", lambda backbone: backbone)
        return Embedder(*args, **kwargs)


def assert_close_embeddings(fused, unfused, what: str) -> None:
    window_cosine = min(float((a.windows * b.windows).sum(axis=1).min()) for a, b in zip(fused, unfused))
    vector_cosine = min(float(a.vector @ b.vector) for a, b in zip(fused, unfused))
    print(f"{what}: fused vs unfused float32, min cosine windows {window_cosine:.8f}, videos {vector_cosine:.8f}")
    assert window_cosine >= COSINE_BOUND and vector_cosine >= COSINE_BOUND
    for a, b in zip(fused, unfused):
        np.testing.assert_array_equal(a.starts, b.starts)


@pytest.mark.parametrize("width", [0.125, 0.25])
def test_embeddings_of_generated_videos_stay_within_cosine_09999_of_the_unfused_path(tmp_path, monkeypatch, width):
    encoder = save_tiny_encoder(tmp_path / "encoder.pth", width=width)
    videos = [moving_square(frames, seed=seed) for seed, frames in enumerate((9, 30, 47))]
    fused = Embedder(encoder, workers=0, batch_size=4, **SMALL)
    unfused = unfused_embedder(monkeypatch, encoder, workers=0, batch_size=4, **SMALL)
    assert_close_embeddings([fused.embed_frames(v, 25.0) for v in videos],
                            [unfused.embed_frames(v, 25.0) for v in videos], f"generated videos, width {width}")


def test_embeddings_of_real_clips_stay_within_cosine_09999_of_the_unfused_path(tmp_path, monkeypatch, shared_clips):
    encoder = save_tiny_encoder(tmp_path / "encoder.pth", width=0.25)
    paths = [shared_clips / name for name in ("v_ApplyEyeMakeup_g01_c01.avi", "arm_wrestling.mp4")]
    settings = {"length": 16, "size": 64, "short_side": 64}
    fused = Embedder(encoder, workers=0, **settings)
    unfused = unfused_embedder(monkeypatch, encoder, workers=0, **settings)
    assert_close_embeddings(list(fused.embed_many(paths)), list(unfused.embed_many(paths)), "real clips, width 0.25")


@pytest.mark.slow
def test_the_full_width_network_on_a_real_clip_stays_within_the_bound(tmp_path, monkeypatch, shared_clips):
    """The paper's S3D (width 1, 32 x 128 x 128 windows) on one real clip."""
    encoder = save_tiny_encoder(tmp_path / "encoder.pth", width=1.0)
    path = shared_clips / "v_BaseballPitch_g01_c01.avi"
    fused = Embedder(encoder, workers=0, batch_size=8)
    unfused = unfused_embedder(monkeypatch, encoder, workers=0, batch_size=8)
    assert fused.settings.size == 128 and fused.settings.length == 32
    assert_close_embeddings([fused.embed(path)], [unfused.embed(path)], "real clip, full width")
