"""coclr embed: inputs, settings, windows and features against slow references, the store equivalence on real
clips, two streams, the output folder (incremental runs, failures, SIGKILL and interrupted commits)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coclr.cli import main as cli_main
from coclr.clips import KINETICS_MEAN
from coclr.data.sampling import sliding_windows
from coclr.embed.embedder import Embedder, EmbedFailure, combine
from coclr.embed.inputs import expand_inputs
from coclr.embed.output import Embeddings, EmbeddingWriter, read_settings
from coclr.embed.settings import resolve_settings
from coclr.errors import CheckpointError, ConfigError, DataError
from test_eval_helpers import save_tiny_encoder

REPO_ROOT = Path(__file__).resolve().parents[1]
SMALL = {"length": 8, "size": 32, "short_side": 32}
"""Settings that make a tiny encoder fast on the CPU."""


def moving_square(frames: int, height: int = 32, width: int = 40, seed: int = 0) -> np.ndarray:
    """Frames of a bright square moving over a noisy background of a colour drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    base = rng.integers(20, 200, 3)
    video = np.clip(base + rng.normal(0, 15, (frames, height, width, 3)), 0, 255).astype(np.uint8)
    for t in range(frames):
        y, x = (2 * t + 3 * seed) % (height - 8), (3 * t + 5 * seed) % (width - 8)
        video[t, y: y + 8, x: x + 8] = 255
    return video


def write_video(path: Path, frames: np.ndarray, fps: float = 25.0, codec: str = "libx264") -> Path:
    from coclr.video.decode import write_mp4

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_mp4(path, frames, fps, codec)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("enc") / "encoder.pth")


@pytest.fixture(scope="module")
def flow_encoder(tmp_path_factory) -> Path:
    settings = {"view": "flow", "length": 8, "stride": 1, "size": 32, "fps": None, "short_side": 32,
                "flow_bound": 5.0}
    return save_tiny_encoder(tmp_path_factory.mktemp("flowenc") / "flow.pth", seed=1,
                             meta={"method": "infonce", "view": "flow", "clip_settings": settings})


# ------------------------------------------------------------------------------------------------ inputs


def test_inputs_expand_files_folders_lists_and_globs(tmp_path, monkeypatch):
    clips = tmp_path / "clips"
    a = write_video(clips / "a.mp4", moving_square(4))
    b = write_video(clips / "sub" / "deeper" / "b.mp4", moving_square(4))
    (clips / "notes.txt").write_text("not listed as a video")
    (clips / ".hidden").mkdir()
    write_video(clips / ".hidden" / "c.mp4", moving_square(4))
    listing = tmp_path / "list.csv"
    listing.write_text("path\n# a comment\n\nclips/a.mp4\nclips/missing.mp4,extra,columns\n")
    monkeypatch.chdir(tmp_path)

    assert expand_inputs(["clips"]) == [a, b]
    assert expand_inputs(["clips/**/*.mp4"]) == [a, b]
    assert expand_inputs([str(listing)]) == [a, tmp_path / "clips" / "missing.mp4"]  # missing: a failure later
    manifest = tmp_path / "labels.csv"  # a manifest's header in any order: its path column (it read "label", "3")
    manifest.write_text("label,path\n3,clips/a.mp4\n5,clips/sub/deeper/b.mp4\n")
    assert expand_inputs([str(manifest)]) == [a, b]
    assert expand_inputs(["clips/a.mp4", "clips", str(a)]) == [a, b]  # duplicates dropped, order kept
    with pytest.raises(DataError, match="nope.mp4: no such file.*empty: no videos"):
        (tmp_path / "empty").mkdir()
        expand_inputs(["nope.mp4", "empty"])
    with pytest.raises(DataError, match="matches no file"):
        expand_inputs(["clips/*.webm"])
    split = tmp_path / "trainlist01.txt"  # a UCF101 split file's lines, "path label": every line failed
    split.write_text("clips/a.mp4 1\nclips/sub/deeper/b.mp4 7\n")
    assert expand_inputs([str(split)]) == [a, b]
    marked = tmp_path / "excel.txt"  # a byte-order mark (Notepad, a spreadsheet's "UTF-8") made the first path missing
    marked.write_bytes(b"\xef\xbb\xbfclips/a.mp4\r\nclips/sub/deeper/b.mp4\r\n")
    assert expand_inputs([str(marked)]) == [a, b]


def test_a_folder_scan_leaves_out_coclrs_own_output_folders_but_synthetic_videos(tmp_path):
    from coclr.atomic import atomic_write_json

    kept = [write_video(tmp_path / "clips" / "a.mp4", moving_square(4)),
            write_video(tmp_path / "clips" / "synth" / "videos" / "s.mp4", moving_square(4))]
    atomic_write_json(tmp_path / "clips" / "synth" / "run.json", {"command": "data synth --videos", "options": {}})
    copy = write_video(tmp_path / "clips" / "curated" / "calibration" / "videos" / "a_trim.mp4", moving_square(4))
    atomic_write_json(tmp_path / "clips" / "curated" / "run.json", {"command": "curate", "options": {}})
    (tmp_path / "clips" / "out").mkdir()
    atomic_write_json(tmp_path / "clips" / "out" / "embed.json", {"format": "coclr-embeddings"})
    notes: list[str] = []
    assert expand_inputs([tmp_path / "clips"], notes) == kept  # a curation's altered copies are not the user's
    assert any("left out 2 folder(s) of coclr's own outputs" in note and "curated (coclr curate)" in note
               for note in notes), notes
    assert expand_inputs([copy.parent]) == [copy]  # named itself, a folder is scanned
    # a pattern reached into them, while its note said they were left out
    for pattern in ("clips/**", "clips/**/*.mp4", "clips/*"):
        notes = []
        assert expand_inputs([str(tmp_path / pattern)], notes) == kept, pattern
        assert any("curated (coclr curate)" in note for note in notes), (pattern, notes)
    assert expand_inputs([str(copy.parent / "*.mp4")]) == [copy]  # below the pattern's start: asked for


def test_a_pattern_does_not_follow_links_to_folders_round_a_loop(tmp_path):
    """Two links up (``..``) made `g2/**/*.avi` walk without end (glob.glob follows them); one made names forty
    folders deep, each a note."""
    import signal

    video = write_video(tmp_path / "g2" / "a.mp4", moving_square(4))
    (tmp_path / "g2" / "sub").mkdir()
    (tmp_path / "g2" / "sub" / "up").symlink_to("..")
    (tmp_path / "g2" / "sub" / "up2").symlink_to("..")
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the pattern's walk did not end"))
    signal.alarm(20)
    try:
        for pattern in ("g2/**/*.mp4", "g2/**", "g2/*"):
            notes: list[str] = []
            assert expand_inputs([str(tmp_path / pattern)], notes) == [video], pattern
            assert sum(len(note) for note in notes) < 2000, notes
    finally:
        signal.alarm(0)


def test_a_pattern_takes_a_link_to_nothing_as_a_scan_does(tmp_path):
    """``clips/*.mp4`` left out a link to nothing and a link in a loop in silence (exit 0), where a scan of the
    folder listed both as failures; a pattern of those links only was "matches no video (only files that are not
    videos)"."""
    video = write_video(tmp_path / "clips" / "a.mp4", moving_square(4))
    (tmp_path / "clips" / "b.mp4").symlink_to("/nowhere/b.mp4")
    (tmp_path / "clips" / "c.mp4").symlink_to("c.mp4")
    links = [tmp_path / "clips" / "b.mp4", tmp_path / "clips" / "c.mp4"]
    assert expand_inputs([tmp_path / "clips"]) == [video, *links]
    assert expand_inputs([str(tmp_path / "clips" / "*.mp4")]) == [video, *links]
    assert expand_inputs([str(tmp_path / "clips" / "[bc].mp4")]) == links


def test_a_folder_the_scan_cannot_read_is_noted_with_its_videos_left_out(tmp_path, monkeypatch):
    """A subfolder without read permission: its videos were left out of embed and learn in silence (exit 0), and
    the folder itself given was "no videos in this folder"."""
    kept = write_video(tmp_path / "clips" / "a.mp4", moving_square(4))
    write_video(tmp_path / "clips" / "locked" / "b.mp4", moving_square(4))
    scandir = os.scandir

    def refusing(path="."):  # (as root, chmod 000 does not stop a read: the refusal is made here)
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    notes: list[str] = []
    assert expand_inputs([tmp_path / "clips"], notes) == [kept]
    assert any(f"could not read 1 folder(s), whose videos are left out: {tmp_path / 'clips' / 'locked'} "
               "(Permission denied)" in note for note in notes), notes
    monkeypatch.setattr(os, "access", lambda path, mode: not os.fspath(path).endswith("locked"))
    with pytest.raises(DataError, match="locked: the folder cannot be read"):
        expand_inputs([tmp_path / "clips" / "locked"])


# ------------------------------------------------------------------------------------------------ settings


def test_settings_from_checkpoint_format_and_overrides(tmp_path, encoder, flow_encoder):
    paper = resolve_settings(encoder)
    assert (paper.length, paper.stride, paper.size, paper.short_side, paper.fps) == (32, 1, 128, 128, None)
    recorded = save_tiny_encoder(tmp_path / "rec.pth", meta={"clip_settings": {
        "view": "rgb", "length": 16, "stride": 2, "size": 112, "fps": 12.5, "short_side": 120,
        "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}})
    settings = resolve_settings(recorded, length=8)
    assert (settings.length, settings.stride, settings.size, settings.fps, settings.short_side) == \
        (8, 2, 112, 12.5, 120)
    assert settings.mean == (0.5, 0.5, 0.5) and settings.std == (0.25, 0.25, 0.25)
    assert resolve_settings(recorded, short_side=0).short_side is None  # --short-side 0: the decoded size

    # torchvision's s3d: its own Kinetics transform unless overridden.
    from coclr.models.loading import _torchvision_name
    from coclr.models.s3d import S3D

    torchvision = tmp_path / "s3d_tv.pth"
    torch.save({_torchvision_name(k): v for k, v in S3D(width=0.125, bn_eps=1e-3).state_dict().items()}, torchvision)
    tv = resolve_settings(torchvision)
    assert (tv.size, tv.short_side, tv.fps, tv.mean) == (224, 256, 15.0, KINETICS_MEAN)
    assert resolve_settings(torchvision, mean=(0.1, 0.2, 0.3)).mean == (0.1, 0.2, 0.3)

    rgb8 = save_tiny_encoder(tmp_path / "rgb8.pth", meta={"clip_settings": {
        "view": "rgb", "length": 8, "size": 32, "short_side": 32, "fps": None}})
    two = resolve_settings(rgb8, flow_encoder)
    assert two.computes_flow and two.flow_bound == 5.0 and two.length == 8
    with pytest.raises(ConfigError, match=r"length: .* 16 and .* 8.*--length"):
        resolve_settings(recorded, flow_encoder)
    assert resolve_settings(recorded, flow_encoder, length=8, size=32, short_side=32, fps=25.0, stride=1).length == 8
    alone = resolve_settings(flow_encoder)  # a flow encoder alone: the flow stream
    assert alone.computes_flow and alone.flow_bound == 5.0 and (alone.length, alone.short_side) == (8, 32)
    with pytest.raises(ConfigError, match="trained on the 'rgb' view, but --flow-checkpoint"):
        resolve_settings(rgb8, rgb8)
    with pytest.raises(ConfigError, match="window_step"):
        resolve_settings(encoder, window_step=0)
    with pytest.raises(ConfigError, match="unknown embedding setting"):
        resolve_settings(encoder, crop=3)
    # an RGB encoder given a flow setting: named as given (it listed flow_mean and flow_std, which have no flags)
    with pytest.raises(ConfigError, match=r"^flow_bound: applies to a flow stream only: give --flow-checkpoint"):
        resolve_settings(rgb8, flow_bound=5.0)


def test_head_feature_needs_a_head(tmp_path):
    from coclr.models.loading import _torchvision_name
    from coclr.models.s3d import S3D

    torchvision = tmp_path / "s3d_tv.pth"
    torch.save({_torchvision_name(k): v for k, v in S3D(width=0.125, bn_eps=1e-3).state_dict().items()}, torchvision)
    with pytest.raises(CheckpointError, match="no projection head"):
        Embedder(torchvision, feature="head")


# ------------------------------------------------------------------------------------------------ features


def reference_embedding(backbone, frames: np.ndarray, length: int, stride: int, size: int, hop=None):
    """Obviously correct: every window of the whole video (sliding_windows), centre crop, pooled feature."""
    from coclr.data.augment import center_crop

    windows = sliding_windows(len(frames), length, stride, hop)
    clips = torch.from_numpy(np.stack([frames[w] for w in windows]))
    with torch.no_grad():
        features = backbone(center_crop(clips, size)).mean(dim=(2, 3, 4))
    return windows, F.normalize(features.double().mean(0), dim=0).float(), F.normalize(features, dim=1)


@pytest.mark.parametrize("frames, hop", [(5, None), (8, None), (9, None), (37, None), (37, 3), (70, 16)])
def test_windows_and_features_match_a_whole_video_reference(encoder, frames, hop):
    """Streaming (chunks of 32 frames, windows cut as frames arrive) gives the windows and features of the
    whole-video computation, for videos shorter than a window, exactly one, and longer ones."""
    from coclr.models.loading import load_encoder

    video = moving_square(frames)
    embedder = Embedder(encoder, workers=0, window_step=hop, **SMALL)
    result = embedder.embed_frames(video, fps=20.0)
    backbone, _ = load_encoder(encoder)
    windows, vector, per_window = reference_embedding(backbone, video, 8, 1, 32, hop)
    assert result.frames == frames and result.fps == 20.0
    np.testing.assert_array_equal(result.starts * 20.0, [w[0] for w in windows])
    np.testing.assert_allclose(result.ends * 20.0, [w[-1] + 1 for w in windows])
    np.testing.assert_allclose(result.vector, vector.numpy(), atol=1e-5)
    np.testing.assert_allclose(result.windows, per_window.numpy(), atol=1e-5)
    assert abs(np.linalg.norm(result.vector) - 1) < 1e-5


@pytest.mark.parametrize("fps", [0, -25.0, float("nan"), float("inf"), None])
def test_frames_at_a_rate_no_video_has_are_refused_naming_fps(encoder, fps):
    """A rate of 0 was a ZeroDivisionError; below 0, NaN or infinite gave windows at negative, NaN or zero
    seconds."""
    from coclr.errors import ConfigError

    with pytest.raises(ConfigError, match="^fps: "):
        Embedder(encoder, workers=0, **SMALL).embed_frames(moving_square(9), fps)


def test_a_rate_and_settings_as_pyav_and_numpy_give_them_are_numbers(encoder):
    """PyAV's ``Fraction`` rate and NumPy's numbers and arrays were refused as not numbers ("must be between 0.01
    and 1000.0 frames per second, got 30000/1001"; "mean: needs 3 values, got [0.5 0.5 0.5]")."""
    from fractions import Fraction

    video = moving_square(12)
    base = Embedder(encoder, workers=0, mean=(0.5, 0.5, 0.5), **SMALL).embed_frames(video, 30000 / 1001)
    other = Embedder(encoder, workers=0, mean=np.array([0.5, 0.5, 0.5]), **SMALL)
    assert other.settings.mean == (0.5, 0.5, 0.5) and type(other.settings.mean[0]) is float
    assert Embedder(encoder, workers=0, fps=np.array(25.0), **SMALL).settings.fps == 25.0  # (a 0-d array)
    for fps in (Fraction(30000, 1001), np.float64(30000 / 1001)):
        result = other.embed_frames(video, fps)
        assert result.fps == base.fps and type(result.fps) is float
        np.testing.assert_array_equal(result.vector, base.vector)


def test_head_feature_is_the_projection_of_the_pooled_feature(encoder):
    from coclr.models.loading import load_encoder

    video = moving_square(20)
    result = Embedder(encoder, workers=0, feature="head", **SMALL).embed_frames(video, 25.0)
    backbone, head = load_encoder(encoder)
    windows, _, _ = reference_embedding(backbone, video, 8, 1, 32)
    from coclr.data.augment import center_crop

    with torch.no_grad():
        outputs = head(backbone(center_crop(torch.from_numpy(np.stack([video[w] for w in windows])), 32))
                       .mean(dim=(2, 3, 4)))
    assert result.vector.shape == (128,)
    np.testing.assert_allclose(result.vector, F.normalize(outputs.double().mean(0), dim=0).numpy(), atol=1e-5)


def test_two_stream_concatenates_rgb_and_on_the_fly_flow(tmp_path, flow_encoder):
    """Flow is TV-L1 between consecutive frames, quantised with the flow encoder's bound; both streams use the
    n - 1 frames that have flow; the vector is the two normalised vectors concatenated, over sqrt(2)."""
    from coclr.data.augment import center_crop
    from coclr.flow.encode import flow_to_uint8
    from coclr.flow.opencv import rgb_to_gray
    from coclr.flow.tvl1 import tvl1_flow
    from coclr.models.loading import load_encoder

    rgb_encoder = save_tiny_encoder(tmp_path / "rgb.pth")
    video = moving_square(45)  # two decoder chunks: the pair across the chunk boundary must be there
    embedder = Embedder(rgb_encoder, workers=0, flow_checkpoint=flow_encoder, **SMALL)
    result = embedder.embed_frames(video, 25.0)
    assert embedder.dim == 256 and result.vector.shape == (256,)

    gray = torch.from_numpy(rgb_to_gray(video))
    flow = flow_to_uint8(tvl1_flow(gray[:-1], gray[1:]).permute(0, 2, 3, 1), 5.0).numpy()
    windows = sliding_windows(len(video) - 1, 8, 1)
    features = []
    for checkpoint, frames, view in ((rgb_encoder, video, "rgb"), (flow_encoder, flow, "flow")):
        backbone, _ = load_encoder(checkpoint)
        clips = torch.from_numpy(np.stack([frames[w] for w in windows]))
        with torch.no_grad():
            features.append(backbone(center_crop({view: clips}, 32)[view]).mean(dim=(2, 3, 4)))
    expected = combine([f.double().mean(0) for f in features])
    np.testing.assert_allclose(result.vector, expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(result.windows, combine(features).numpy(), atol=1e-5)
    assert len(result.starts) == len(windows)


def test_the_library_refuses_a_path_for_paths_and_an_odd_batch_size_in_one_line(encoder, tmp_path):
    """embed_many("a.mp4") took each character as a path ("/: a folder, not a video file"); batch_size=2.5 and "4"
    failed inside the first batch with a TypeError."""
    for size in (2.5, "4", 0, True):
        with pytest.raises(ConfigError, match="batch_size must be a whole number"):
            Embedder(encoder, workers=0, batch_size=size)
    embedder = Embedder(encoder, workers=0, batch_size=np.int64(2))
    assert embedder.batch_size == 2 and type(embedder.batch_size) is int
    video = str(tmp_path / "a.mp4")
    with pytest.raises(ConfigError, match="embed_many takes a list of paths, got one"):
        list(embedder.embed_many(video))
    with pytest.raises(ConfigError, match="stream takes a list of paths"):
        list(embedder.stream(tmp_path / "a.mp4"))
    with pytest.raises(ConfigError, match="embed takes one video's path, got list"):
        embedder.embed([video])
    # clip settings of the wrong type: accepted, then every video failed ("list indices must be integers")
    for key, value, said in (("length", 8.5, "length: must be a whole number, got 8.5"),
                             ("length", "8", "length: must be a whole number, got '8'"),
                             ("window_step", 2.5, "window_step: must be a whole number of frames"),
                             ("short_side", 32.5, "short_side: must be a whole number of pixels"),
                             ("fps", "25", "fps: must be a number between 0.01 and 1000.0 .*, got '25'")):
        with pytest.raises(ConfigError, match=said):
            Embedder(encoder, workers=0, **{key: value})


def test_tiny_features_are_unit_vectors_and_each_stream_keeps_its_half():
    """An untrained narrow encoder's pooled features (about 1e-13) stayed under F.normalize's floor: its vectors had
    norm 0.0002, and beside another stream its half of the two-stream vector had 0.4 of the other's length."""
    generator = torch.Generator().manual_seed(0)
    tiny, plain = 1e-14 * torch.randn(5, 8, generator=generator), torch.randn(5, 6, generator=generator)
    both = combine([tiny, plain])
    np.testing.assert_allclose(both.norm(dim=1).numpy(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(both[:, :8].norm(dim=1).numpy(), 2 ** -0.5, rtol=1e-6)
    np.testing.assert_allclose(combine([tiny[0]]).norm().item(), 1.0, rtol=1e-6)  # (a video's mean: one row)
    assert torch.allclose(combine([plain]), torch.nn.functional.normalize(plain, dim=1), atol=1e-7)


def test_a_flow_encoder_alone_embeds_the_flow_stream_of_the_two_stream_embedding(tmp_path, flow_encoder):
    """A checkpoint trained on flow is a flow stream alone: its vectors are the flow half of the two-stream
    vectors (times sqrt 2), over the same n - 1 frames; a flow encoder given as --checkpoint beside
    --flow-checkpoint is refused."""
    from coclr.errors import ConfigError

    rgb_encoder = save_tiny_encoder(tmp_path / "rgb.pth")
    video = moving_square(45)
    both = Embedder(rgb_encoder, workers=0, flow_checkpoint=flow_encoder, **SMALL).embed_frames(video, 25.0)
    alone = Embedder(flow_encoder, workers=0, **SMALL).embed_frames(video, 25.0)
    assert alone.vector.shape == (128,)
    np.testing.assert_allclose(alone.vector, both.vector[128:] * np.sqrt(2), atol=1e-5)
    np.testing.assert_allclose(alone.windows, both.windows[:, 128:] * np.sqrt(2), atol=1e-5)
    np.testing.assert_array_equal(alone.starts, both.starts)
    with pytest.raises(ConfigError, match="flow stream alone"):
        Embedder(flow_encoder, workers=0, flow_checkpoint=flow_encoder, **SMALL)


def test_a_flow_encoder_is_fed_the_flow_its_store_computed(tmp_path):
    """A flow encoder trained on DIS flow (view flow_dis) was fed TV-L1 flow, silently (the two differ by about 2
    of the 255 units on average, up to 60). Embed computes the flow the checkpoint records of its store's view:
    DIS, TV-L1 at other parameters, else TV-L1 at OpenCV's defaults (any backend or mode); a checkpoint that
    records no method is taken at its view's name."""
    from coclr.data.augment import center_crop
    from coclr.flow.backends import flow_of_method
    from coclr.flow.encode import flow_to_uint8
    from coclr.flow.opencv import opencv_dis, rgb_to_gray
    from coclr.flow.params import TVL1Params
    from coclr.flow.tvl1 import tvl1_flow
    from coclr.models.loading import load_encoder
    from coclr.store.flow_views import flow_method

    video = moving_square(20, 48, 64)
    gray = rgb_to_gray(video)
    warps = TVL1Params(warps=1)
    flows = {
        "dis": flow_to_uint8(np.stack([opencv_dis(a, b) for a, b in zip(gray[:-1], gray[1:])]), 5.0),
        "tvl1": flow_to_uint8(tvl1_flow(torch.from_numpy(gray[:-1]), torch.from_numpy(gray[1:])).permute(0, 2, 3, 1),
                              5.0).numpy(),
        "warps": flow_to_uint8(tvl1_flow(torch.from_numpy(gray[:-1]), torch.from_numpy(gray[1:]), warps)
                               .permute(0, 2, 3, 1), 5.0).numpy()}
    assert np.abs(flows["dis"].astype(int) - flows["tvl1"]).mean() > 0.5  # (the difference that went unseen)
    windows = sliding_windows(len(video) - 1, 8, 1)

    def embedded(view: str, method: dict | None) -> np.ndarray:
        settings = {"view": view, "length": 8, "stride": 1, "size": 32, "fps": None, "short_side": 48,
                    "flow_bound": 5.0, **({"flow_method": method} if method is not None else {})}
        checkpoint = save_tiny_encoder(tmp_path / f"{view}_{len(list(tmp_path.iterdir()))}.pth", seed=1,
                                       meta={"method": "infonce", "view": view, "clip_settings": settings})
        return Embedder(checkpoint, workers=0, length=8, size=32).embed_frames(video, 25.0).windows

    backbone, _ = load_encoder(save_tiny_encoder(tmp_path / "reference.pth", seed=1))

    def expected(flow: np.ndarray) -> np.ndarray:
        clips = torch.from_numpy(np.stack([flow[w] for w in windows]))
        with torch.no_grad():
            features = backbone(center_crop({"flow": clips}, 32)["flow"]).mean(dim=(2, 3, 4))
        return F.normalize(features, dim=1).numpy()

    default = flow_method("tvl1-torch", TVL1Params(), "fast", kernels="c")
    cases = [("flow_dis", flow_method("dis", TVL1Params()), "dis"), ("flow_dis", None, "dis"),
             ("flow", flow_method("tvl1", warps), "warps"), ("flow", default, "tvl1"), ("flow", None, "tvl1")]
    for view, method, flow in cases:
        windows_of = embedded(view, method)
        np.testing.assert_allclose(windows_of, expected(flows[flow]), atol=1e-4, err_msg=f"{view} {method}")
        for other in set(flows) - {flow}:  # (each other flow is far from it)
            assert np.abs(windows_of - expected(flows[other])).max() > 1e-2, (view, method, other)
    assert flow_of_method(default, "flow") is None and flow_of_method(None, "flow_dis") == {"backend": "dis"}
    from coclr.embed.output import EMBED_FOLDER

    before = {"length": 8, "size": 32, "flow_bound": 5.0}  # (a folder recorded before flow_method was: TV-L1)
    assert EMBED_FOLDER.differing(before, {**before, "flow_method": None}) == []
    assert EMBED_FOLDER.differing(before, {**before, "flow_method": {"backend": "dis"}}), "DIS rows beside TV-L1 ones"
    with pytest.raises(ConfigError, match="flow_method: must be None"):
        resolve_settings(save_tiny_encoder(tmp_path / "odd.pth"), flow_method={"backend": "farneback"})
    dis = save_tiny_encoder(tmp_path / "dis.pth", seed=1, meta={"method": "infonce", "view": "flow_dis"})
    with pytest.raises(ConfigError, match="--short-side 12: frames too small for DIS flow"):  # (each video failed)
        Embedder(dis, workers=0, length=8, size=32, short_side=12)
    tiny = np.ascontiguousarray(video[:, :12, :12])  # (decoded at its own size: that video's failure, said why)
    with pytest.raises(DataError, match="frames of 12 x 12 px are too small for DIS flow, which the flow encoder"):
        Embedder(dis, workers=0, length=8, size=32, short_side=0).embed_frames(tiny, 25.0)


def test_an_encoder_of_a_dis_view_records_the_method_and_its_card_says_it(tmp_path):
    """What training records of a flow view (its store's method), which embedding reads back: DIS here, named in
    the model card of an export."""
    from coclr.flow.backends import flow_of_method
    from coclr.models.exported import export_encoder
    from coclr.store.clipstore import ClipStore
    from coclr.store.flow_extract import extract_flow
    from coclr.synth.output import random_store
    from coclr.train.config import PretrainConfig
    from coclr.train.model import clip_settings

    root = random_store(tmp_path / "store", videos=2, frames=4, size=(24, 24), views=("rgb",))
    extract_flow(root, backend="dis", workers=0, bound=5.0)
    recorded = clip_settings(PretrainConfig(), ClipStore(root), "flow_dis")
    assert recorded["flow_method"] == {"backend": "dis", "params": None} and recorded["flow_bound"] == 5.0
    assert flow_of_method(recorded["flow_method"], "flow_dis") == {"backend": "dis"}
    assert clip_settings(PretrainConfig(), ClipStore(root), "rgb")["flow_method"] is None
    encoder = save_tiny_encoder(tmp_path / "enc.pth", meta={"method": "infonce", "view": "flow_dis",
                                                            "clip_settings": recorded})
    export_encoder(encoder, "safetensors", tmp_path / "export")
    card = (tmp_path / "export" / "README.md").read_text()
    assert "optical flow as its training store held it (computed by dis; channels u, v" in card


def test_a_two_stream_pass_writes_the_flow_streams_folder_as_a_flow_encoder_alone_does(tmp_path, flow_encoder):
    """``embed_videos(..., streams={1: (folder, flow-only embedder)})``: one pass writes the two-stream folder and
    the flow stream's folder, which holds what ``coclr embed --checkpoint flow.pth`` writes (the same rows, vectors
    and record; ``coclr search`` embeds its queries the same way); a stream recorded as another embedder's is
    refused."""
    from coclr.embed.output import read_settings
    from coclr.embed.run import embed_videos
    from coclr.errors import ConfigError

    rgb_encoder = save_tiny_encoder(tmp_path / "rgb.pth", meta={"clip_settings": {
        "view": "rgb", "length": 8, "stride": 1, "size": 32, "fps": None, "short_side": 32}})
    videos = tmp_path / "videos"
    for number in range(3):
        write_video(videos / f"v{number}.mp4", moving_square(12 + 7 * number, seed=number))
    (videos / "broken.mp4").write_bytes(b"\x00" * 900)
    both = Embedder(rgb_encoder, workers=0, flow_checkpoint=flow_encoder)
    alone = Embedder(flow_encoder, workers=0)
    summary = embed_videos([videos], tmp_path / "two", both, progress=False,
                           streams={1: (tmp_path / "flow", alone)})
    assert summary.done == 3 and len(summary.failed) == 1
    separate = embed_videos([videos], tmp_path / "separate", alone, progress=False)
    assert separate.done == 3
    one, other = Embeddings(tmp_path / "flow"), Embeddings(tmp_path / "separate")
    assert [r["path"] for r in one.video_records] == [r["path"] for r in other.video_records]
    np.testing.assert_allclose(one.videos, other.videos, atol=1e-6)
    np.testing.assert_allclose(one.windows, other.windows, atol=1e-6)
    assert read_settings(tmp_path / "flow") == read_settings(tmp_path / "separate")
    assert len((tmp_path / "flow" / "failed.jsonl").read_text().splitlines()) == 1  # broken.mp4, listed there too
    with pytest.raises(ConfigError, match="cannot be recorded"):
        embed_videos([videos], tmp_path / "wrong", both, progress=False, streams={1: (tmp_path / "w", both)})


def test_store_and_files_give_the_same_features_on_real_clips(tmp_path, shared_clips, encoder):
    """``coclr eval``'s window features of a store of real clips give the file embeddings: exactly when the embedder is
    given the store's JPEG-compressed frames, and within the JPEG error from the files themselves. Measured
    (tiny random encoder, quality 90, 64 px crops of 16 frames): distances between the unit vectors of 0.010 to
    0.017, against 0.029 between the two closest different clips; asserted: at most 0.025, and each file's
    nearest stored video is its own."""
    from coclr.eval.features import ClipConfig, window_features
    from coclr.models.loading import load_encoder
    from coclr.store.build import build_store
    from coclr.store.clipstore import ClipStore
    from coclr.store.jpeg import decode_jpeg, encode_jpeg
    from coclr.video.decode import decode_video_with_rate
    from coclr.video.indexes import VideoEntry, VideoIndex

    names = ["v_BaseballPitch_g01_c01.avi", "v_Basketball_g01_c01.avi", "archery_ucf_format.avi"]  # all 320x240
    index = VideoIndex("clips", ["any"], [VideoEntry(name, 0, "train") for name in names])
    build_store(index, shared_clips, tmp_path / "store", short_side=128, quality=90, workers=1)
    config = ClipConfig(length=16, stride=1, size=64)
    backbone, _ = load_encoder(encoder)
    # the windows' pooled features as `coclr eval` computes them; a video's vector is their mean, normalised (eval's
    # own video feature is the mean of the windows normalised first, the authors' retrieval: docs/embed.md)
    windows, videos, _, _ = window_features(backbone, ClipStore(tmp_path / "store"), "rgb", "train", config)
    means = np.stack([windows[videos == row].astype(np.float64).mean(axis=0) for row in range(len(names))])
    expected = means / np.linalg.norm(means, axis=1, keepdims=True)

    embedder = Embedder(encoder, workers=0, length=16, size=64, short_side=128)
    from_files = np.stack([r.vector for r in embedder.embed_many([shared_clips / n for n in names])])
    for row, name in enumerate(names):
        frames, fps = decode_video_with_rate(shared_clips / name, 128)
        jpeg = np.stack([decode_jpeg(encode_jpeg(frame, 90)) for frame in frames])
        np.testing.assert_allclose(embedder.embed_frames(jpeg, fps).vector, expected[row], atol=1e-5)
    distances = np.linalg.norm(from_files[:, None] - expected[None], axis=2)
    others = distances[~np.eye(3, dtype=bool)]
    print(f"file vs store: {np.round(np.diag(distances), 4)}; closest other clip {others.min():.4f}")
    assert np.diag(distances).max() <= 0.025
    assert distances.argmin(axis=1).tolist() == [0, 1, 2]


QUICK_CLIPS = ("archery_ucf_format.avi", "arm_wrestling.mp4", "v_BaseballPitch_g01_c01.avi")


@pytest.mark.parametrize("names", [pytest.param(QUICK_CLIPS, id="three"),
                                   pytest.param(None, id="all", marks=pytest.mark.slow)])
def test_copies_of_real_clips_retrieve_their_original(tmp_path, shared_clips, encoder, names):
    """Re-encoded with another codec, resized, trimmed by a second at the start: each copy's nearest video among
    the originals is its original (three clips by default, all eight with -m slow)."""
    import av

    from coclr.embed.search import nearest

    originals = sorted(p for p in shared_clips.iterdir() if names is None or p.name in names)
    copies, owners = [], []
    for number, path in enumerate(originals):
        with av.open(str(path)) as container:
            fps = float(container.streams.video[0].average_rate)
        from coclr.video.decode import decode_video

        frames = decode_video(path)
        height, width = frames.shape[1:3]
        small = decode_video(path, short_side=(min(height, width) * 3 // 4) // 2 * 2)
        small = small[:, : small.shape[1] // 2 * 2, : small.shape[2] // 2 * 2]
        codec = "mpeg4" if path.suffix != ".avi" else "libx264"
        copies += [write_video(tmp_path / f"{number}_codec.mp4", frames[:, : height // 2 * 2, : width // 2 * 2], fps,
                               codec),
                   write_video(tmp_path / f"{number}_resized.mp4", small, fps),
                   write_video(tmp_path / f"{number}_trimmed.mp4", frames[round(fps):, : height // 2 * 2,
                                                                          : width // 2 * 2], fps)]
        owners += [number] * 3
    embedder = Embedder(encoder, workers=1, length=16, size=64, short_side=64)
    gallery = np.stack([r.vector for r in embedder.embed_many(originals)])
    queries = np.stack([r.vector for r in embedder.embed_many(copies)])
    _, rows = nearest(gallery, queries, 1)
    assert rows[:, 0].tolist() == owners


# ------------------------------------------------------------------------------------------------ output folder


def run_cli(*argv: str) -> int:
    return cli_main(["embed", *map(str, argv), "--quiet", "--workers", "0"])


def check_folder(root: Path) -> Embeddings:
    """Every row valid: one row per path, arrays and JSON lines agree, unit vectors, windows point back."""
    folder = Embeddings(root)
    paths = [r["path"] for r in folder.video_records]
    assert len(paths) == len(set(paths)), "duplicate video rows"
    assert [r["row"] for r in folder.video_records] == list(range(len(paths)))
    assert [r["row"] for r in folder.window_records] == list(range(len(folder.window_records)))
    np.testing.assert_allclose(np.linalg.norm(folder.videos, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(folder.windows, axis=1), 1, atol=1e-5)
    for record in folder.video_records:
        own = [w for w in folder.window_records if w["video"] == record["row"]]
        assert len(own) == record["windows"] and own[0]["row"] == record["first_window"]
        assert own[-1]["end"] == pytest.approx(record["duration"])
    return folder


def test_embed_cli_incremental_rerun_changed_video_and_failures(tmp_path, encoder, capsys):
    videos = tmp_path / "videos"
    for number, frames in enumerate((12, 30, 5)):  # 5 frames: shorter than one window
        write_video(videos / f"v{number}.mp4", moving_square(frames, seed=number))
    (videos / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(2000))
    listing = tmp_path / "more.txt"
    write_video(tmp_path / "other" / "listed.mp4", moving_square(16, seed=7))
    listing.write_text("other/listed.mp4\nother/gone.mp4\n")
    out = tmp_path / "out"
    common = ["--checkpoint", encoder, "--out", out, "--length", "8", "--size", "32", "--short-side", "32"]

    assert run_cli(videos, listing, *common) == 3  # finished, with 2 failed
    printed = capsys.readouterr().out
    assert "4 videos embedded" in printed and "2 failed" in printed and "broken.mp4" in printed
    folder = check_folder(out)
    assert len(folder.videos) == 4 and folder.videos.shape[1] == 128
    failed = [json.loads(line) for line in (out / "failed.jsonl").read_text().splitlines()]
    assert sorted(Path(f["path"]).name for f in failed) == ["broken.mp4", "gone.mp4"]
    short = folder.video_records[folder.row_of(videos / "v2.mp4")]
    assert short["frames"] == 5 and short["windows"] == 1 and short["duration"] == pytest.approx(0.2)
    recorded = json.loads((out / "embed.json").read_text())
    assert recorded["settings"]["length"] == 8 and len(recorded["checkpoint"]["sha256"]) == 64
    assert {"torch", "av", "numpy"} <= set(recorded["versions"])

    # The same command again: nothing to do (the failed files are not retried while unchanged), and the same
    # outcome: the folder still lacks those two, each named with its earlier reason.
    assert run_cli(videos, listing, *common) == 3
    printed = capsys.readouterr().out
    assert "0 videos embedded" in printed and "6 skipped (4 already there, 2 failed before and unchanged)" in printed
    assert "failed before, unchanged: " + str(videos / "broken.mp4") in printed and "gone.mp4" in printed

    # A new video and a changed one: only those are embedded; the changed one keeps its row.
    before = np.array(Embeddings(out).videos)
    write_video(videos / "v3.mp4", moving_square(20, seed=3))
    row = folder.row_of(videos / "v1.mp4")
    write_video(videos / "v1.mp4", moving_square(24, seed=11))
    assert run_cli(videos, listing, *common) == 3
    assert "2 videos embedded" in capsys.readouterr().out
    after = check_folder(out)
    assert len(after.videos) == 5 and after.row_of(videos / "v1.mp4") == row
    assert not np.allclose(after.videos[row], before[row])
    unchanged = [r for r in range(4) if r != row]
    np.testing.assert_array_equal(after.videos[unchanged], before[unchanged])
    expected = Embedder(encoder, workers=0, **SMALL).embed(videos / "v1.mp4")
    np.testing.assert_allclose(after.videos[row], expected.vector, atol=1e-6)

    # Other settings on the same folder: refused before any work, naming the key and both values.
    assert cli_main(["embed", str(videos), *map(str, common), "--window-step", "2", "--quiet"]) == 2
    assert "window_step=null (given 2)" in capsys.readouterr().err


def test_sigkill_at_any_moment_then_rerun_completes(tmp_path, encoder):
    """A run killed with SIGKILL (after some chunks were written) and run again gives every video exactly once,
    with the same vectors as an uninterrupted run."""
    videos = tmp_path / "videos"
    for number in range(10):
        write_video(videos / f"v{number:02d}.mp4", moving_square(12 + 3 * number, seed=number))
    command = [sys.executable, "-m", "coclr", "embed", str(videos), "--checkpoint", str(encoder), "--length", "8",
               "--size", "32", "--short-side", "32", "--workers", "0", "--flush-every", "1", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "killed"
    process = subprocess.Popen([*command, "--out", str(out)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list((out / "chunks").glob("*.npz"))) < 3 and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = list((out / "chunks").glob("*.npz"))
    assert partial, "the run was killed before it wrote anything"
    subprocess.run([*command, "--out", str(out)], env=env, check=True, stdout=subprocess.DEVNULL)
    reference = tmp_path / "reference"
    subprocess.run([*command, "--out", str(reference)], env=env, check=True, stdout=subprocess.DEVNULL)
    resumed, clean = check_folder(out), check_folder(reference)
    assert len(resumed.videos) == 10 and not list((out / "chunks").glob("*"))
    for record in clean.video_records:
        np.testing.assert_allclose(resumed.videos[resumed.row_of(record["path"])], clean.videos[record["row"]],
                                   atol=1e-6)


def test_a_commit_interrupted_between_renames_is_finished_by_the_next_run(tmp_path, encoder, monkeypatch):
    """A kill between the renames of a commit (simulated: os.replace fails after the first) leaves files that
    disagree; opening the folder again finishes the commit from commit.json."""
    from coclr.embed import output

    embedder = Embedder(encoder, workers=0, **SMALL)
    from coclr.embed.run import folder_record

    record = folder_record(embedder)
    results = [embedder.embed_frames(moving_square(10 + n, seed=n), 25.0, f"/videos/v{n}.mp4") for n in range(3)]
    with EmbeddingWriter(tmp_path / "out", record) as writer:
        writer.add(results[0], (1, 1))
    real_replace, calls = os.replace, []

    def failing_replace(source, target):
        if str(source).endswith(".next"):  # the commit's renames (os is one module: atomic writes come here too)
            calls.append(target)
            if len(calls) == 2:
                raise KeyboardInterrupt("killed")
        real_replace(source, target)

    monkeypatch.setattr(output.os, "replace", failing_replace)
    with pytest.raises(KeyboardInterrupt):
        with EmbeddingWriter(tmp_path / "out", record) as writer:
            writer.add(results[1], (1, 1))
            writer.add(results[2], (1, 1))
    monkeypatch.setattr(output.os, "replace", real_replace)
    assert (tmp_path / "out" / "commit.json").is_file()
    with pytest.raises(DataError, match="interrupted"):
        Embeddings(tmp_path / "out")
    with EmbeddingWriter(tmp_path / "out", record):
        pass
    folder = check_folder(tmp_path / "out")
    assert [r["path"] for r in folder.video_records] == [r.path for r in results]
    np.testing.assert_allclose(folder.videos, np.stack([r.vector for r in results]), atol=1e-7)


def test_a_run_stopped_after_later_inputs_finished_continues_to_the_folder_of_one_run(tmp_path, encoder):
    """With workers, videos finish out of input order: a run stopped after the third input finished (not the first
    two) left its chunk, which the next run merged at once, so the rows came out in the order the stop left
    (v2, v0, v1), and another than an uninterrupted run's; rows of an earlier run's inputs that this run does not
    have come after this run's."""
    from coclr.embed.run import folder_record

    embedder = Embedder(encoder, workers=0, **SMALL)
    record = folder_record(embedder)
    results = [embedder.embed_frames(moving_square(10 + n, seed=n), 25.0, f"/videos/v{n}.mp4") for n in range(4)]
    paths = [result.path for result in results[:3]]
    with EmbeddingWriter(tmp_path / "whole", record) as writer:
        writer.place(paths)
        for order in (2, 0, 1):  # (finished out of order, merged once)
            writer.add(results[order], (1, 1), order)
    with pytest.raises(KeyboardInterrupt):
        with EmbeddingWriter(tmp_path / "stopped", record, flush_videos=1) as writer:
            writer.place([*paths, results[3].path])  # (an earlier command's inputs: one more)
            writer.add(results[3], (1, 1), 3)
            writer.add(results[2], (1, 1), 2)
            raise KeyboardInterrupt
    with EmbeddingWriter(tmp_path / "stopped", record) as writer:
        writer.place(paths)
        assert [path for path in paths if not writer.todo(path, (1, 1))] == [paths[2]]
        for order in (0, 1):
            writer.add(results[order], (1, 1), order)
    whole, stopped = check_folder(tmp_path / "whole"), check_folder(tmp_path / "stopped")
    assert [r["path"] for r in stopped.video_records] == [*paths, results[3].path]
    np.testing.assert_array_equal(stopped.videos[:3], whole.videos)
    assert list(stopped.window_records[:len(whole.window_records)]) == list(whole.window_records)


def test_a_failure_record_edited_by_hand_is_one_line(tmp_path, encoder):
    """``{}`` in failed.jsonl was a KeyError's traceback when the folder was continued."""
    from coclr.embed.run import folder_record

    record = folder_record(Embedder(encoder, workers=0, **SMALL))
    with EmbeddingWriter(tmp_path / "out", record):
        pass
    (tmp_path / "out" / "failed.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match=r"failed.jsonl: damaged \(record 1: no path\)"):
        with EmbeddingWriter(tmp_path / "out", record):
            pass


def test_an_anamorphic_video_is_embedded_as_coded_and_its_pixels_aspect_recorded(tmp_path, encoder):
    """A video of pixels twice as wide as high is embedded from its coded frames (its vector that of a square-pixel
    file of them), and its row gives the aspect; square pixels add nothing to a row."""
    from fractions import Fraction

    from test_video import write_anamorphic, write_turned

    frames = moving_square(12, seed=1)
    (tmp_path / "videos").mkdir()
    write_anamorphic(tmp_path / "videos" / "wide.mp4", frames, Fraction(2))
    write_turned(tmp_path / "videos" / "square.mkv", frames)  # (lossless FFV1 too)
    out = tmp_path / "out"
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", out, "--length", "8", "--size", "32",
                   "--short-side", "32") == 0
    folder = check_folder(out)
    wide, square = (folder.video_records[folder.row_of(tmp_path / "videos" / name)] for name in ("wide.mp4",
                                                                                                  "square.mkv"))
    assert wide["pixel_aspect"] == 2.0 and "pixel_aspect" not in square
    np.testing.assert_array_equal(folder.videos[wide["row"]], folder.videos[square["row"]])


def test_a_second_writer_of_one_folder_is_refused_while_the_first_holds_it(tmp_path, encoder):
    """Two runs never write one output folder at once: the second is refused, naming the holder; once the first
    has ended (even by SIGKILL) the folder opens again."""
    from coclr.embed.run import folder_record
    from coclr.runfolder import LOCK_FILE
    from conftest import locked_by_another_process

    record = folder_record(Embedder(encoder, workers=0, **SMALL))
    (tmp_path / "out").mkdir()
    with locked_by_another_process(tmp_path / "out" / LOCK_FILE) as pid:
        with pytest.raises(DataError, match=rf"another coclr embed is writing this folder \(pid {pid} on"):
            EmbeddingWriter(tmp_path / "out", record).__enter__()
    with EmbeddingWriter(tmp_path / "out", record):
        pass


# ------------------------------------------------------------------------------------------------ faults (issue 36)


def write_size_change_video(path: Path, first: int = 33, second: int = 32) -> Path:
    """An MPEG-TS stream spliced from two encodings of other frame sizes (40x32, then 32x48), as a cut-and-joined
    file is: the decoder gives ``first - 1`` frames of one size (the first encoding's last frame is lost at the
    splice), then frames of the other; ``first=33`` puts the change at frame 32, a decoding chunk boundary."""
    import av

    parts = []
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    for count, (height, width) in ((first, (32, 40)), (second, (48, 32))):
        part = path.with_name(f"{path.stem}_{height}x{width}.ts")
        with av.open(str(part), "w", format="mpegts") as container:
            stream = container.add_stream("mpeg2video", rate=25)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            for frame in rng.integers(0, 255, (count, height, width, 3), dtype=np.uint8):
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        parts.append(part.read_bytes())
        part.unlink()
    path.write_bytes(b"".join(parts))
    return path


def failed_records(out: Path) -> dict[str, str]:
    return {Path(r["path"]).name: r["error"] for r in map(json.loads, (out / "failed.jsonl").read_text().splitlines())}


def test_a_video_whose_frame_size_changes_mid_stream_fails_alone(tmp_path, encoder, capsys):
    """The size changes at a decoding chunk boundary (frame 32): that video is a failure with its reason, the
    others are embedded, the job finishes with status 3, and a rerun does not stumble on it again."""
    from coclr.video.decode import VideoReader

    videos = tmp_path / "videos"
    changing = write_size_change_video(videos / "spliced.mpg")
    with VideoReader(changing, 32) as reader:
        shapes = [frame.shape for frame in reader]
    assert shapes[31] != shapes[32] and len(set(shapes[:32])) == len(set(shapes[32:])) == 1  # the chunk boundary
    for number in range(2):
        write_video(videos / f"v{number}.mp4", moving_square(20, seed=number))
    out = tmp_path / "out"
    common = ["--checkpoint", encoder, "--out", out, "--length", "8", "--size", "32", "--short-side", "32"]
    assert run_cli(videos, *common) == 3
    printed = capsys.readouterr().out
    assert "2 videos embedded" in printed and "1 failed" in printed
    said = ("the frame size changes mid-stream, from 40x32 to 32x48 at frame 32 (as resized to a short side of 32 px); "
            "re-encode the video at one size")
    assert said in failed_records(out)["spliced.mpg"]
    from coclr.errors import VideoDecodeError
    from coclr.store.build import encoded_frames

    with pytest.raises(VideoDecodeError) as raised:  # a store's entry: the same rule and words (it quoted the
        list(encoded_frames(VideoReader(changing, 32), 90))  # resized sizes as if decoded, and no remedy)
    assert said in str(raised.value)
    assert sorted(Path(r["path"]).name for r in check_folder(out).video_records) == ["v0.mp4", "v1.mp4"]
    assert run_cli(videos, *common) == 3  # nothing left to do: the failure is remembered while the file is unchanged
    assert "0 videos embedded (0 windows), 3 skipped (2 already there, 1 failed before and unchanged)" in \
        capsys.readouterr().out


def test_any_error_from_one_video_is_that_videos_failure(tmp_path, encoder, monkeypatch):
    """Not only DataError: whatever one video raises while its windows are cut is its failure, the job goes on."""
    from coclr.embed import embedder as embedder_module

    real_add = embedder_module._VideoWindows.add

    def add(self, frames, flow):
        if frames.shape[0] == 7:  # the 7-frame video
            raise RuntimeError("something unexpected")
        return real_add(self, frames, flow)

    monkeypatch.setattr(embedder_module._VideoWindows, "add", add)
    paths = [write_video(tmp_path / f"v{n}.mp4", moving_square(frames, seed=n)) for n, frames in enumerate((12, 7, 9))]
    results = dict(Embedder(encoder, workers=0, **SMALL).stream(paths))
    assert isinstance(results[1], EmbedFailure) and "RuntimeError: something unexpected" in results[1].error
    assert str(paths[1]) in results[1].error
    assert results[0].vector.shape == results[2].vector.shape == (128,)


def test_nan_normalisation_is_refused_before_any_work(tmp_path, encoder, capsys):
    write_video(tmp_path / "videos" / "v.mp4", moving_square(10))
    with pytest.raises(SystemExit) as stopped:  # the command line refuses it as it parses the numbers
        cli_main(["embed", str(tmp_path / "videos"), "--checkpoint", str(encoder), "--out", str(tmp_path / "out"),
                  "--mean", "nan", "0", "0", "--quiet"])
    assert stopped.value.code == 2 and "--mean: expected a finite number, got 'nan'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="mean: needs finite values"):  # and the library as it checks them
        resolve_settings(encoder, mean=(float("nan"), 0.0, 0.0))
    with pytest.raises(ConfigError, match="std: needs finite values"):
        resolve_settings(encoder, std=(1.0, float("inf"), 1.0))


def test_exit_status_rule_in_help_and_when_every_video_failed(tmp_path, encoder, capsys):
    from coclr.cli import EXIT_CODES, build_parser

    def help_text(parser) -> str:
        return " ".join(parser.format_help().split())

    parser = build_parser()
    assert EXIT_CODES in help_text(parser)
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("embed", "flow", "data"):
        assert EXIT_CODES in help_text(subcommands.choices[name])
    (tmp_path / "videos").mkdir()
    for name in ("a.mp4", "b.mp4"):
        (tmp_path / "videos" / name).write_bytes(os.urandom(500))
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", tmp_path / "out", *sum(
        ([f"--{k.replace('_', '-')}", v] for k, v in SMALL.items()), [])) == 3
    assert "0 videos embedded" in capsys.readouterr().out


def test_rows_of_replaced_and_removed_files_are_dropped(tmp_path, encoder, capsys):
    """A file replaced by one that fails: its old row is dropped with the failure recorded. A removed file, or
    one changed outside this run's inputs: its row is dropped, said in one line. The other rows keep their
    vectors and windows, in their order."""
    videos = tmp_path / "videos"
    paths = [write_video(videos / f"v{n}.mp4", moving_square(12 + 4 * n, seed=n)) for n in range(4)]
    extra = write_video(tmp_path / "elsewhere" / "x.mp4", moving_square(14, seed=9))
    out = tmp_path / "out"
    common = ["--checkpoint", encoder, "--out", out, *sum(([f"--{k.replace('_', '-')}", v] for k, v in SMALL.items()),
                                                          [])]
    assert run_cli(videos, extra, *common) == 0
    before = check_folder(out)
    vectors = {Path(r["path"]).name: np.array(before.videos[r["row"]]) for r in before.video_records}
    capsys.readouterr()

    paths[1].write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(3000))  # replaced by a file that fails
    paths[2].unlink()  # removed
    write_video(extra, moving_square(20, seed=10))  # changed, and not among the next run's inputs
    # Until the next run, a reader can tell the rows not to serve.
    stale = Embeddings(out).stale_rows()
    assert sorted(Path(before.video_records[row]["path"]).name for row in stale) == ["v1.mp4", "v2.mp4", "x.mp4"]
    assert run_cli(videos, *common) == 3
    printed = capsys.readouterr().out
    assert "dropped the rows of 2 files removed or changed" in printed and "v2.mp4 (removed)" in printed
    assert "x.mp4 (changed since it was embedded)" in printed
    after = check_folder(out)
    assert [Path(r["path"]).name for r in after.video_records] == ["v0.mp4", "v3.mp4"]
    assert len(after.stale_rows()) == 0
    for record in after.video_records:
        np.testing.assert_array_equal(after.videos[record["row"]], vectors[Path(record["path"]).name])
    assert "v1.mp4" in failed_records(out)
    # The replaced file becomes good again: embedded again, as a new row.
    write_video(paths[1], moving_square(16, seed=1))
    assert run_cli(videos, *common) == 0
    assert [Path(r["path"]).name for r in check_folder(out).video_records] == ["v0.mp4", "v3.mp4", "v1.mp4"]


def test_a_symbolic_link_loop_is_named_and_every_real_file_embedded_once(tmp_path, encoder, capsys, monkeypatch):
    videos = tmp_path / "videos"
    a = write_video(videos / "a.mp4", moving_square(10))
    b = write_video(videos / "sub" / "b.mp4", moving_square(12, seed=1))
    (videos / "again").symlink_to(".")  # a loop
    (videos / "sub" / "up").symlink_to("..")  # another loop
    (videos / "alias.mp4").symlink_to("a.mp4")  # another name of a real file
    (videos / "zlink").symlink_to("sub")  # a second way into one folder
    notes: list[str] = []
    assert expand_inputs([videos], notes) == [a, b]
    assert len(notes) == 2 and "not followed 3 symbolic links" in notes[0] and "again" in notes[0]
    assert f"under the file's own name where given, else the first: {a} (also named {videos / 'alias.mp4'})" \
        in notes[1]
    assert run_cli(videos, "--checkpoint", encoder, "--out", tmp_path / "out",
                   *sum(([f"--{k.replace('_', '-')}", v] for k, v in SMALL.items()), [])) == 0
    printed = capsys.readouterr().out
    assert "2 videos embedded" in printed and "not followed 3 symbolic links" in printed


# ------------------------------------------------------------------------------------------------ same folder, any way


def test_the_head_feature_does_not_depend_on_the_batch_size(encoder):
    """The projection head's linear layers ordered their sums by the rows given: ``--batch-size`` 1 and 5 gave
    other bits (up to 6e-8 on a video, 1.5e-7 on a window). It runs a row at a time: the same bits."""
    videos = [moving_square(frames, seed=n) for n, frames in enumerate((9, 21, 14))]
    vectors = {}
    for batch in (1, 5):
        embedder = Embedder(encoder, workers=0, batch_size=batch, feature="head", **SMALL)
        vectors[batch] = [embedder.embed_frames(video, 25.0) for video in videos]
    for one, five in zip(vectors[1], vectors[5]):
        np.testing.assert_array_equal(one.vector, five.vector)
        np.testing.assert_array_equal(one.windows, five.windows)


def test_a_videos_vector_does_not_depend_on_its_batch_companions_or_threads(encoder):
    """Batches always have ``batch_size`` rows (the last padded), so a video's vector is the same, bit for bit,
    embedded alone or among other videos; with another torch thread count it is the same to rounding (oneDNN's
    fused convolutions gave the same bits on the Intel Xeon measured; the eager network before them differed by up
    to 2e-6)."""
    videos = [moving_square(frames, seed=n) for n, frames in enumerate((9, 21, 14, 30))]
    embedder = Embedder(encoder, workers=0, batch_size=4, **SMALL)
    alone = [embedder.embed_frames(video, 25.0).vector for video in videos]
    runner_results = {}
    from coclr.embed.embedder import _end_facts, _Runner

    runner = _Runner(embedder, [f"v{n}" for n in range(len(videos))])
    chunks = sorted((start, n) for n, video in enumerate(videos) for start in range(0, len(video), 8))
    times = np.arange(30) / 25.0
    messages = [("frames", n, (videos[n][start: start + 8], times[start: start + 8][: len(videos[n][start:])]))
                for start, n in chunks]  # the videos interleaved
    ends = [("end", n, _end_facts(25.0, len(video) / 25.0)) for n, video in enumerate(videos)]
    for message in [*messages, *ends]:
        runner_results.update(runner.handle(message))
    runner_results.update(runner.finish())
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        other_threads = [embedder.embed_frames(video, 25.0).vector for video in videos]
    finally:
        torch.set_num_threads(threads)
    for n in range(len(videos)):
        np.testing.assert_array_equal(runner_results[n].vector, alone[n])
        np.testing.assert_allclose(other_threads[n], alone[n], rtol=0, atol=1e-6)


def embed_command(*extra: str) -> list[str]:
    return ["-m", "coclr", "embed", *extra, "--length", "8", "--size", "32", "--short-side", "32", "--workers", "0",
            "--quiet", "--batch-size", "4"]


@pytest.mark.slow
def test_two_torchrun_processes_write_the_folder_of_one_process(tmp_path, encoder):
    """``torchrun --nproc_per_node=2 -m coclr embed`` (gloo): each process embeds every other video, rank 0 merges;
    the folder has the same rows in the same order and the same bytes as the one a single process writes."""
    from test_train_distributed import free_port

    videos = tmp_path / "videos"
    for number in range(7):
        write_video(videos / f"v{number}.mp4", moving_square(9 + 5 * number, seed=number))
    (videos / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(800))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    common = [str(videos), "--checkpoint", str(encoder)]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          f"--master_port={free_port()}", *embed_command(*common, "--out", str(tmp_path / "two"))],
                         env={k: v for k, v in env.items() if k not in ("MASTER_PORT",)}, capture_output=True,
                         text=True, timeout=300)
    assert "7 videos embedded by 2 processes" in two.stdout, two.stdout + two.stderr
    assert "1 failed" in two.stdout and "broken.mp4" in two.stdout
    one = subprocess.run([sys.executable, *embed_command(*common, "--out", str(tmp_path / "one"))], env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 3, one.stdout + one.stderr
    for name in ("videos.npy", "windows.npy", "videos.jsonl", "windows.jsonl", "failed.jsonl"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    assert not list((tmp_path / "two" / "chunks").glob("*"))
    assert len(check_folder(tmp_path / "two").videos) == 7


# ------------------------------------------------------------------------------------------------ inference speed-ups


def test_the_default_inference_keeps_cosine_0999_of_plain_float32(encoder):
    """The defaults (float32 on the CPU: BatchNorm folded and ReLU fused into oneDNN's convolutions, channels-last
    3D, padded batches) give the plain float32 network's window features within cosine 0.999 (in fact to rounding);
    bf16 is an opt-in that is recorded in the folder."""
    from coclr.data.augment import center_crop
    from coclr.models.loading import load_encoder

    video = moving_square(40, seed=3)
    embedder = Embedder(encoder, workers=0, batch_size=4, **SMALL)
    result = embedder.embed_frames(video, 25.0)
    backbone, _ = load_encoder(encoder)
    windows = sliding_windows(len(video), 8, 1)
    with torch.no_grad():
        plain = backbone(center_crop(torch.from_numpy(np.stack([video[w] for w in windows])), 32)).mean(dim=(2, 3, 4))
    cosine = F.cosine_similarity(torch.from_numpy(result.windows), plain, dim=1)
    assert cosine.min() >= 0.999 and torch.allclose(cosine, torch.ones_like(cosine), atol=1e-5)
    assert Embedder(encoder, workers=0, **SMALL).settings.precision is None


def test_bf16_is_close_to_float32_and_refused_where_the_cpu_has_no_bfloat16_instructions(encoder, monkeypatch):
    """bf16 is allowed by the CPU's flags (coclr.cpu.native_bfloat16: AVX512_BF16 or AMX), not by oneDNN's
    ``_is_mkldnn_bf16_supported`` (true on any AVX-512 CPU, where bfloat16 runs converted, slower than float32).
    Where allowed it stays within cosine 0.99 of float32 (run here with the check passed, whatever this CPU has)."""
    import coclr.cpu

    video = moving_square(40, seed=3)
    monkeypatch.setattr(coclr.cpu, "native_bfloat16", lambda: True)
    exact = Embedder(encoder, workers=0, **SMALL).embed_frames(video, 25.0)
    fast = Embedder(encoder, workers=0, precision="bf16", **SMALL).embed_frames(video, 25.0)
    cosine = (exact.windows * fast.windows).sum(axis=1)
    print(f"bf16 vs float32, tiny encoder: window cosine min {cosine.min():.5f}")
    assert cosine.min() > 0.99 and not np.array_equal(exact.windows, fast.windows)
    monkeypatch.setattr(coclr.cpu, "native_bfloat16", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)  # an AVX-512 CPU without BF16
    with pytest.raises(ConfigError, match="no bfloat16 instructions"):
        Embedder(encoder, workers=0, precision="bf16", **SMALL)


def test_rates_and_bounds_that_are_not_finite_or_sensible_are_refused_before_any_work(tmp_path, encoder, capsys):
    write_video(tmp_path / "videos" / "v.mp4", moving_square(10))
    command = ["embed", str(tmp_path / "videos"), "--checkpoint", str(encoder), "--out", str(tmp_path / "out")]
    for flag, value in (("--fps", "inf"), ("--flow-bound", "inf"), ("--fps", "nan")):
        with pytest.raises(SystemExit) as stopped:  # refused as the command line is read, by every float option
            cli_main([*command, flag, value])
        assert stopped.value.code == 2 and f"{flag}: expected a finite number, got '{value}'" in capsys.readouterr().err
    for fps in ("1e-300", "1e300"):  # finite, but no video can be resampled so (a division by zero, endless frames)
        assert cli_main([*command, "--fps", fps]) == 2
        assert "fps: must be a number between 0.01 and 1000.0 frames per second" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_folder_continued_with_its_checkpoint_moved_embeds_queries_with_it_there(tmp_path, encoder):
    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    write_video(tmp_path / "query.mp4", moving_square(12, seed=7))
    first, moved = shutil.copy(encoder, tmp_path / "first.pth"), tmp_path / "moved.pth"
    assert run_cli(tmp_path / "videos" / "v0.mp4", "--checkpoint", first, "--out", tmp_path / "out") == 0
    os.rename(first, moved)  # the same content (sha256) elsewhere: the folder continues with it
    assert run_cli(tmp_path / "videos", "--checkpoint", moved, "--out", tmp_path / "out") == 0
    assert read_settings(tmp_path / "out")["checkpoint"]["path"] == str(moved)
    assert cli_main(["search", str(tmp_path / "out"), "--query", str(tmp_path / "query.mp4"), "-k", "2"]) == 0


def test_damaged_arrays_are_one_line_for_search_and_embed(tmp_path, encoder, capsys):
    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", tmp_path / "out") == 0
    capsys.readouterr()
    arrays = tmp_path / "out" / "videos.npy"
    whole, records = arrays.read_bytes(), (tmp_path / "out" / "videos.jsonl").read_bytes()
    for damage, named in ((lambda: arrays.write_bytes(whole[:100]), "videos.npy: damaged (EOF"),
                          (lambda: (tmp_path / "out" / "videos.jsonl").write_bytes(records + b"{}\n"),
                           "damaged (videos.npy holds 3 rows, videos.jsonl 4 records)")):
        damage()
        assert cli_main(["search", str(tmp_path / "out"), "--query", "0"]) == 2
        assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", tmp_path / "out") == 2  # not skipped
        errors = capsys.readouterr().err.splitlines()
        assert len(errors) == 2 and all(named in line and "move it away and run coclr embed again" in line
                                        for line in errors), errors
        arrays.write_bytes(whole)
        (tmp_path / "out" / "videos.jsonl").write_bytes(records)


def _edit_line(path: Path, number: int, **changes) -> None:
    lines = path.read_text().splitlines()
    record = json.loads(lines[number])
    record.update(changes)
    for key in [key for key, value in changes.items() if value is ...]:
        del record[key]
    lines[number] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def test_records_changed_from_outside_are_one_line_for_search_curate_and_embed(tmp_path, encoder, capsys):
    """Records of the folder edited or cut from outside: a last line cut short was skipped by embed (as a log's
    would be), which then rewrote the folder without that video's row and said all was done; a window naming a
    video row that is not there was an IndexError (99) or another video's window (-1); a record without its
    mtime_ns a KeyError; videos.npy gone, advice to run embed, whose merge then raised ValueError. Each is now
    named damaged in one line by search, curate and embed, before any work."""
    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    out = tmp_path / "out"
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", out) == 0
    capsys.readouterr()
    kept = {name: (out / name).read_bytes() for name in ("videos.jsonl", "windows.jsonl", "videos.npy")}
    videos, windows = out / "videos.jsonl", out / "windows.jsonl"
    for damage, named in (
            (lambda: videos.write_bytes(kept["videos.jsonl"][:-20]), "videos.jsonl: damaged (record 3 is not JSON"),
            (lambda: windows.write_bytes(kept["windows.jsonl"][:-10]), "windows.jsonl: damaged (record "),
            (lambda: _edit_line(windows, 1, video=99), "windows.jsonl: damaged (record 2: video 99, of 3 video rows)"),
            (lambda: _edit_line(windows, 1, video=-1), "windows.jsonl: damaged (record 2: video -1, of 3 video rows)"),
            (lambda: _edit_line(videos, 1, mtime_ns=...), "videos.jsonl: damaged (record 2: no mtime_ns)"),
            (lambda: _edit_line(videos, 2, row=0), "videos.jsonl: damaged (record 3: row 0 on line 3)"),
            (lambda: (out / "videos.npy").unlink(), "videos.npy: damaged (missing, while videos.jsonl, windows.npy, "
                                                    "windows.jsonl are there)")):
        damage()
        assert cli_main(["search", str(out), "--query", "1", "--windows", "-k", "2"]) == 2
        assert cli_main(["curate", str(out), "--out", str(tmp_path / "curated"), "--threshold", "0.9",
                         "--no-fingerprints", "--quiet"]) == 2
        before = {name: (out / name).read_bytes() for name in ("videos.jsonl", "windows.jsonl")}
        write_video(tmp_path / "videos" / "new.mp4", moving_square(12, seed=9))  # (work for embed to do)
        assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", out) == 2
        (tmp_path / "videos" / "new.mp4").unlink()
        assert before == {name: (out / name).read_bytes() for name in ("videos.jsonl", "windows.jsonl")}
        errors = capsys.readouterr().err.splitlines()
        assert len(errors) == 3 and all(named in line and "move it away and run coclr embed again" in line
                                        for line in errors), (named, errors)
        for name, data in kept.items():
            (out / name).write_bytes(data)
        assert not (tmp_path / "curated").exists()


def test_settings_changed_from_outside_are_one_line_and_a_refusal_shows_the_options_values(tmp_path, encoder, capsys):
    """embed.json edited by hand: a length that is no number was a TypeError's traceback in a search by a query
    file, a checkpoint of null another; a refusal of --short-side 0 (the decoded size) said "given null"."""
    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    out = tmp_path / "out"
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", out, "--short-side", "32") == 0
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", out, "--short-side", "0") == 2
    assert "holds embeddings with short_side=32 (given 0)" in capsys.readouterr().err
    other = save_tiny_encoder(tmp_path / "other.pth", seed=7)  # another encoder, named by the option that gives it
    assert run_cli(tmp_path / "videos", "--checkpoint", other, "--out", out, "--short-side", "32") == 2
    assert "holds embeddings with --checkpoint (its sha256)='" in capsys.readouterr().err
    settings = out / "embed.json"
    kept = settings.read_text()
    for edit, named in ((lambda r: r["settings"].update(length="eight"), "embed.json: damaged (settings: "),
                        (lambda r: r.update(checkpoint=None), "embed.json: damaged (checkpoint: None, not a path")):
        record = json.loads(kept)
        edit(record)
        settings.write_text(json.dumps(record))
        assert cli_main(["search", str(out), "--query", str(tmp_path / "videos" / "v0.mp4"), "-k", "2"]) == 2
        assert cli_main(["curate", str(out), "--out", str(tmp_path / "curated"), "--quiet"]) == 2
        errors = capsys.readouterr().err.splitlines()
        assert len(errors) == 2 and all(named in line for line in errors), (named, errors)
        settings.write_text(kept)
        assert not (tmp_path / "curated").exists()


def test_a_row_that_is_not_finite_is_named_with_its_file(tmp_path, encoder, capsys):
    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    out = tmp_path / "out"
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", out) == 0
    rows = np.load(out / "videos.npy")
    rows[2, 5] = np.nan
    np.save(out / "videos.npy", rows)
    capsys.readouterr()
    for center in ([], ["--center"]):
        assert cli_main(["search", str(out), "--query", "0", *center]) == 2
        assert f"{out / 'videos.npy'}: damaged (row 2 holds NaN or infinite values)" in capsys.readouterr().err


def test_a_query_row_whose_file_is_gone_is_noted_and_its_page_refused_before_the_search(tmp_path, encoder, capsys):
    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", tmp_path / "out") == 0
    (tmp_path / "a file").write_text("mine")
    capsys.readouterr()
    under_a_file = tmp_path / "a file" / "p.html"
    assert cli_main(["search", str(tmp_path / "out"), "--query", "0", "--html", str(under_a_file)]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "a file: is a file, where" in printed.err  # before the search prints anything
    os.rename(tmp_path / "videos" / "v0.mp4", tmp_path / "v0 moved.mp4")
    assert cli_main(["search", str(tmp_path / "out"), "--query", "0", "-k", "1"]) == 0
    printed = capsys.readouterr()
    assert "note: row 0's file" in printed.err and "the query is the file as it was" in printed.err
    assert len([line for line in printed.out.splitlines() if " row " in line]) == 1
    assert cli_main(["search", str(tmp_path / "out"), "--query", "0", "--html", str(tmp_path / "p.html")]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "so a page cannot show it" in printed.err and not (tmp_path / "p.html").exists()


def test_a_query_through_a_link_to_an_embedded_file_is_that_row(tmp_path, encoder, capsys):
    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", tmp_path / "out") == 0
    os.symlink(tmp_path / "videos" / "v0.mp4", tmp_path / "link.mp4")
    capsys.readouterr()
    assert cli_main(["search", str(tmp_path / "out"), "--query", str(tmp_path / "link.mp4"), "-k", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert sorted(Path(hit["path"]).name for hit in hits) == ["v1.mp4", "v2.mp4"]  # the file itself left out


def test_a_file_has_one_row_under_whichever_name_a_folder_holds_it(tmp_path, encoder, capsys):
    """A link and its file named together: the file's own name is kept (a link's name was, and the note named the
    other as kept). A folder that holds a file under a link's name keeps that row when a later run names the file
    itself (it gained a second row), and a query by either name is that row (it came back as its own first hit)."""
    videos = tmp_path / "videos"
    real = write_video(videos / "real.mp4", moving_square(12))
    write_video(videos / "other.mp4", moving_square(14, seed=1))
    (videos / "a_link.mp4").symlink_to("real.mp4")  # sorted before the file it names
    notes: list[str] = []
    assert [path.name for path in expand_inputs([videos], notes)] == ["real.mp4", "other.mp4"]  # at its first place
    assert notes == [f"1 files named twice through symbolic links, embedded once, under the file's own name where "
                     f"given, else the first: {real} (also named {videos / 'a_link.mp4'})"]
    out = tmp_path / "out"
    assert run_cli(videos / "a_link.mp4", "--checkpoint", encoder, "--out", out) == 0
    assert run_cli(videos, "--checkpoint", encoder, "--out", out) == 0
    printed = capsys.readouterr().out
    assert f"kept under that name: {real} (as {videos / 'a_link.mp4'})" in printed and "1 videos embedded" in printed
    assert sorted(Path(r["path"]).name for r in check_folder(out).video_records) == ["a_link.mp4", "other.mp4"]
    assert cli_main(["search", str(out), "--query", str(real), "-k", "1", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [Path(hit["path"]).name for hit in hits] == ["other.mp4"]  # the query's own row left out


def test_a_search_with_no_hit_says_why(tmp_path, encoder, capsys):
    write_video(tmp_path / "videos" / "only.mp4", moving_square(12))
    assert run_cli(tmp_path / "videos", "--checkpoint", encoder, "--out", tmp_path / "out") == 0
    capsys.readouterr()
    assert cli_main(["search", str(tmp_path / "out"), "--query", "0"]) == 0
    assert "note: no hit: " in (err := capsys.readouterr().err) and "holds no other video as it was embedded" in err


def test_the_default_window_step_given_by_its_value_is_the_default(encoder):
    """--window-step 4 with 8-frame windows (the default: half a window) was recorded as 4 and refused continuing a
    folder made without it ("window_step=null (given 4)"), though the windows are the same."""
    default = resolve_settings(encoder, length=8)
    assert default.window_step is None and default.hop == 4
    assert resolve_settings(encoder, length=8, window_step=4) == default
    assert resolve_settings(encoder, length=8, window_step=3).hop == 3


def _interrupted_worker(rank: int, world: int, port: int, videos: str, encoder: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from coclr.distributed import init_distributed
    from coclr.embed.run import embed_videos

    init_distributed(torch.device("cpu"))
    embedder = Embedder(encoder, workers=0, batch_size=4, **SMALL)
    real = embedder.stream

    def stream(*args, **kwargs):  # stopped after its first video, as by SIGTERM
        for item in real(*args, **kwargs):
            yield item
            raise KeyboardInterrupt

    embedder.stream = stream
    with pytest.raises(KeyboardInterrupt) as stopped:
        embed_videos([videos], out, embedder, progress=False, flush_videos=100)
    assert f"1 videos embedded by this process (rank {rank}) kept" in stopped.value.kept


@pytest.mark.slow
def test_a_stopped_process_of_a_distributed_embedding_keeps_what_it_finished(tmp_path, encoder):
    """Under torchrun, the videos a process other than rank 0 had embedded but not yet written were lost when the
    job was stopped, while its line said they were kept."""
    import torch.multiprocessing as mp

    from test_train_distributed import free_port

    videos = tmp_path / "videos"
    for number in range(4):
        write_video(videos / f"v{number}.mp4", moving_square(9, seed=number))
    mp.spawn(_interrupted_worker, args=(2, free_port(), str(videos), str(encoder), str(tmp_path / "out")), nprocs=2,
             join=True)
    assert list((tmp_path / "out" / "chunks").glob("*rank1*"))  # rank 1's video, for the next run to merge


def test_the_decoded_size_is_short_side_0_and_a_bad_one_is_one_line(tmp_path, capsys):
    """--short-side's help offered "None: the decoded size", which the flag took for a bad integer."""
    assert "(0: keep the decoded size)" in " ".join(subprocess.run(
        [sys.executable, "-m", "coclr", "embed", "--help"], capture_output=True, text=True).stdout.split())
    assert cli_main(["embed", str(tmp_path / "none.mp4"), "--checkpoint", str(tmp_path / "enc.pth"), "--out",
                     str(tmp_path / "out"), "--short-side", "big"]) == 2
    assert "--short-side: expected a whole number of pixels (0: the decoded size), got 'big'" in capsys.readouterr().err


def test_memory_the_machine_lacks_stops_the_job_and_fails_no_video(encoder, tmp_path, capsys, monkeypatch):
    """A batch too large for this machine's memory was recorded as every video's failure ("RuntimeError: ...
    can't allocate memory"), and the same command with a smaller batch skipped each as "failed before and
    unchanged"."""
    import coclr.embed.embedder as embedder

    videos = [write_video(tmp_path / "videos" / f"v{n}.mp4", moving_square(12, seed=n)) for n in range(3)]
    common = ["embed", str(tmp_path / "videos"), "--checkpoint", str(encoder), "--out", str(tmp_path / "out"),
              "--length", "8", "--size", "32", "--short-side", "32", "--workers", "0", "--quiet"]

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 52531200 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(embedder, "center_crop", no_memory)
    assert cli_main(common) == 2
    assert "error: not enough memory for 52531200 bytes" in capsys.readouterr().err
    assert not (tmp_path / "out" / "failed.jsonl").exists() or not (tmp_path / "out" / "failed.jsonl").read_text()
    monkeypatch.undo()
    assert cli_main(common) == 0
    assert len(Embeddings(tmp_path / "out").videos) == len(videos)


def test_a_new_array_takes_its_disk_space_before_it_is_written(tmp_path):
    """Arrays were memory-mapped files with holes: on a full disk, a write through the map killed the process
    (SIGBUS, no message); their blocks are taken first, where a full disk is one error naming the file."""
    from coclr.embed.output import _new_array

    temps = {}
    array = _new_array(tmp_path / "videos.npy", (512, 1024), temps)
    size = os.stat(temps[tmp_path / "videos.npy"]).st_size
    assert size >= 512 * 1024 * 4 and array.shape == (512, 1024)
    if hasattr(os, "posix_fallocate"):
        assert os.stat(temps[tmp_path / "videos.npy"]).st_blocks * 512 >= size  # no hole left


def test_an_input_whose_name_says_out_of_memory_is_that_inputs_failure(encoder, tmp_path, capsys):
    """The job's memory check read an input's error text, which names the file: a damaged
    `Out of Memory (2019).mp4` stopped the whole job."""
    write_video(tmp_path / "videos" / "good.mp4", moving_square(12))
    (tmp_path / "videos" / "Out of Memory (2019).mp4").write_bytes(b"not a video")
    assert cli_main(["embed", str(tmp_path / "videos"), "--checkpoint", str(encoder), "--out", str(tmp_path / "out"),
                     "--length", "8", "--size", "32", "--short-side", "32", "--workers", "0", "--quiet"]) == 3
    failed = [json.loads(line) for line in (tmp_path / "out" / "failed.jsonl").read_text().splitlines()]
    assert [Path(record["path"]).name for record in failed] == ["Out of Memory (2019).mp4"]


def test_the_embedding_bar_counts_bytes_of_video_not_videos(tmp_path, encoder, capsys, monkeypatch):
    """The bar counted videos: a folder of short clips and one long film had its ETA from the clips' pace. It counts
    the videos' bytes (each in step with its length), and the videos done and failed beside them."""
    import coclr.embed.embedder as module

    short = write_video(tmp_path / "a.mp4", moving_square(8))
    long = write_video(tmp_path / "b.mp4", moving_square(64, seed=1))
    (tmp_path / "c.mp4").write_bytes(b"not a video")
    counted = []
    real = module.progress_bar

    def spy(*args, **kwargs):
        bar = real(*args, **kwargs)
        counted.append(bar)
        return bar

    monkeypatch.setattr(module, "progress_bar", spy)
    paths = [short, long, tmp_path / "c.mp4"]
    results = list(Embedder(encoder, workers=0, **SMALL).stream(paths, progress=True))
    assert len(results) == 3
    bar = counted[0]
    sizes = [path.stat().st_size for path in paths]
    assert bar.total == sum(sizes) and bar.n == sum(sizes) and sizes[1] > 2 * sizes[0]
    assert "videos=3/3, failed=1" in capsys.readouterr().err
