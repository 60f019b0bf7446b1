"""The tvl1-torch extraction pipeline (decoding workers, batches across videos, encoding workers) writes the bytes
that solving each video alone writes; the batcher covers every pair once; errors stay with their videos; the mode
is recorded per view; the fast mode keeps its accuracy bounds on real data."""

from __future__ import annotations

import json
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
import torch

from coclr.errors import ConfigError
from coclr.flow.encode import flow_to_uint8
from coclr.flow.opencv import opencv_tvl1, rgb_to_gray
from coclr.flow.params import TVL1Params
from coclr.flow.tvl1 import tvl1_flow
from coclr.native import find_compiler
from coclr.store.clipstore import ClipStore
from coclr.store.flow_extract import extract_flow
from coclr.store.flow_pipeline import OPEN_SIZES, _Batcher
from coclr.store.flow_views import method_key
from coclr.store.jpeg import decode_jpeg, encode_jpeg
from coclr.video.decode import resize_short_side
from middlebury import endpoint_error
from test_flow_extract import make_store, moving_texture
from test_flow_tvl1 import CROP, load_pair

SHORT = TVL1Params(nscales=2, warps=1, outer_iterations=2, inner_iterations=10)


def mixed_videos() -> dict[str, np.ndarray]:
    """Videos of two frame sizes and several lengths (one spans batches of 3 pairs), one too short and one too
    small for flow."""
    videos = {f"a{i}.avi": moving_texture(n, 1 + i % 2, i % 3 - 1, seed=i) for i, n in enumerate((6, 2, 3, 5))}
    videos.update({f"b{i}.avi": moving_texture(n, -1, 1, height=40, width=56, seed=10 + i)
                   for i, n in enumerate((4, 2))})
    videos["single_frame.avi"] = moving_texture(1, 0, 0)
    videos["tiny.avi"] = moving_texture(3, 0, 0, height=2, width=2)
    return videos


def reference_entry(store: ClipStore, key: str, params: TVL1Params, mode: str, quality: int = 90) -> list[bytes]:
    """The stored frames of ``key`` computed the obvious way: the video's pairs alone, quantised, encoded."""
    blobs = store.read_encoded(key, "rgb", range(store.num_frames(key, "rgb")))
    frames = np.stack([decode_jpeg(blob) for blob in blobs])
    gray = torch.from_numpy(rgb_to_gray(frames))
    flow = tvl1_flow(gray[:-1], gray[1:], params, mode=mode)
    return [encode_jpeg(image, quality) for image in flow_to_uint8(flow.permute(0, 2, 3, 1)).numpy()]


@pytest.mark.parametrize("mode, workers", [("exact", 2), ("fast", 2), ("exact", 0)])
def test_the_pipeline_writes_what_each_video_alone_gives(tmp_path, mode, workers):
    # workers=0: decoding and encoding in this process, as DataLoader's num_workers=0
    videos = mixed_videos()
    make_store(tmp_path / "store", videos)
    summary = extract_flow(tmp_path / "store", backend="tvl1-torch", device="cpu", params=SHORT, workers=workers,
                           batch_pairs=3, mode=mode)
    failed = dict(summary.failed)
    assert set(failed) == {"single_frame.avi", "tiny.avi"}
    assert "1 RGB frame" in failed["single_frame.avi"] and "too small" in failed["tiny.avi"]
    assert summary.done == 6 and summary.frames == 5 + 1 + 2 + 4 + 3 + 1
    assert any("waited for input" in note for note in summary.notes), summary.notes
    # the pairs solved: a failed video's (tiny.avi's, which failed in the solve) are not counted
    assert any(note.startswith(f"{summary.frames} frame pairs of 6 videos") for note in summary.notes), summary.notes
    store = ClipStore(tmp_path / "store")
    for key in videos:
        if key not in failed:
            frames = range(store.num_frames(key, "flow"))
            assert store.read_encoded(key, "flow", frames) == reference_entry(store, key, SHORT, mode), key
    assert store.meta[method_key("flow")]["mode"] == mode
    assert set(store.failed("flow")) == set(failed)


@pytest.mark.parametrize("workers", [0, 2])
def test_videos_read_in_chunks_give_the_entries_of_whole_videos(tmp_path, monkeypatch, workers):
    """Chunks of 2 pairs (a 6-frame video is 3 of them, cut across batches of 3 pairs), encoded part by part, in
    processes or not: every entry holds the frames of its video solved alone, and the failures are the same."""
    from coclr.store import flow_pipeline as pipeline

    monkeypatch.setattr(pipeline, "DECODE_CHUNK", 2)
    videos = mixed_videos()
    make_store(tmp_path / "store", videos)
    summary = extract_flow(tmp_path / "store", backend="tvl1-torch", device="cpu", params=SHORT, workers=workers,
                           batch_pairs=3)
    failed = dict(summary.failed)
    assert set(failed) == {"single_frame.avi", "tiny.avi"} and summary.done == 6
    store = ClipStore(tmp_path / "store")
    for key in set(videos) - set(failed):
        frames = range(store.num_frames(key, "flow"))
        assert store.read_encoded(key, "flow", frames) == reference_entry(store, key, SHORT, "exact"), key
    assert not store.has("tiny.avi", "flow")  # its first chunk's batch failed: nothing of it written


def test_the_batcher_covers_every_pair_once_in_full_batches():
    batcher = _Batcher(4)
    sizes = [(8, 8), (8, 9), (8, 8), (9, 9), (9, 8), (7, 7), (8, 8), (6, 6)]  # more sizes than OPEN_SIZES
    lengths = [7, 2, 4, 3, 9, 2, 5, 3]
    batches = []
    for i, (size, length) in enumerate(zip(sizes, lengths)):
        frames = torch.arange(length, dtype=torch.uint8)[:, None, None].expand(length, *size)
        batches += list(batcher.add(f"v{i}", frames))
        assert len(batcher.open) <= OPEN_SIZES
    closed_early = len(batches)
    batches += list(batcher.flush())
    covered: dict[str, list[int]] = {}
    for batch in batches:
        assert len({tuple(segment.frames.shape[1:]) for segment in batch}) == 1  # one frame size per batch
        assert sum(segment.pairs for segment in batch) <= 4
        for segment in batch:
            assert segment.frames[:, 0, 0].tolist() == list(range(segment.first, segment.first + segment.pairs + 1))
            covered.setdefault(segment.key, []).extend(range(segment.first, segment.first + segment.pairs))
    assert {key: sorted(pairs) for key, pairs in covered.items()} == {
        f"v{i}": list(range(length - 1)) for i, length in enumerate(lengths)}
    assert closed_early >= 4 and sum(segment.pairs for segment in batches[0]) == 4


def test_the_mode_is_recorded_and_a_view_never_mixes_modes(tmp_path):
    make_store(tmp_path / "store", {"a.avi": moving_texture(3, 1, 0), "b.avi": moving_texture(3, 0, 1, seed=1)})
    root = tmp_path / "store"
    extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, keys=["a.avi"], mode="fast",
                 stop_every=3)
    recorded = ClipStore(root).meta[method_key("flow")]
    assert (recorded["mode"], recorded["stop_every"]) == ("fast", 3)
    with pytest.raises(ConfigError, match=r"mode='fast' \(given 'exact'\)"):
        extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT)
    with pytest.raises(ConfigError, match=r"--stop-every=3 \(given 5\)"):
        extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, mode="fast")
    with pytest.raises(ConfigError, match="mode: the fast mode is computed by the tvl1-torch backend only"):
        extract_flow(root, backend="tvl1", params=SHORT, mode="fast", view="other")
    with pytest.raises(ConfigError, match="mode: must be one of exact, fast"):
        extract_flow(root, backend="tvl1-torch", device="cpu", mode="quick")
    assert extract_flow(root, backend="auto", device="cpu", params=SHORT, mode="fast", stop_every=3).done == 1
    # a view recorded before modes existed holds exact flow: exact resumes it, fast is refused
    extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, keys=["a.avi"], view="old")
    meta = json.loads((root / "store.json").read_text())
    del meta["meta"][method_key("old")]["mode"]
    (root / "store.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="mode='exact'"):
        extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, view="old", mode="fast")
    assert extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, view="old").done == 1


@pytest.mark.skipif(find_compiler() is None, reason="no C compiler for the C loops")
def test_the_kernels_are_recorded_and_a_view_never_mixes_them(tmp_path):
    """Kernels agree to float rounding, not bit for bit: a view records those that computed it (``auto``
    resolved), and another job on it with other kernels is refused naming both; a view begun before kernels were
    recorded continues with any."""
    make_store(tmp_path / "store", {"a.avi": moving_texture(3, 1, 0), "b.avi": moving_texture(3, 0, 1, seed=1)})
    root = tmp_path / "store"
    extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, keys=["a.avi"])  # auto: the C loops
    assert ClipStore(root).meta[method_key("flow")]["kernels"] == "c"
    with pytest.raises(ConfigError, match=r"kernels='c' \(given 'torch'\)"):
        extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, kernels="torch")
    assert extract_flow(root, backend="auto", device="cpu", params=SHORT, kernels="c").done == 1
    extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, keys=["a.avi"], view="old", kernels="torch")
    meta = json.loads((root / "store.json").read_text())
    del meta["meta"][method_key("old")]["kernels"]
    (root / "store.json").write_text(json.dumps(meta))
    assert extract_flow(root, backend="tvl1-torch", device="cpu", params=SHORT, view="old").done == 1
    assert "kernels" not in ClipStore(root).meta[method_key("old")]


def clip_pairs(path: Path, count: int, short_side: int = 128, start: int = 10) -> torch.Tensor:
    """``count`` consecutive grayscale frames ``uint8 [count, H, W]`` from frame ``start``, at ``short_side``."""
    frames = []
    with av.open(str(path)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index >= start:
                frames.append(rgb_to_gray(resize_short_side(frame.to_ndarray(format="rgb24"), short_side)))
            if len(frames) == count:
                break
    return torch.from_numpy(np.stack(frames))


def test_fast_mode_stored_flow_of_real_clips_is_within_half_a_unit_of_exact(shared_clips):
    """The bound of the fast mode on real video: the stored 8-bit flow within 0.5 units (mean absolute
    difference) of the exact mode's, on 2 pairs of each of the 8 clips at short side 128."""
    differences = []
    for clip in sorted(shared_clips.iterdir()):
        frames = clip_pairs(clip, 3)
        exact, fast = (flow_to_uint8(tvl1_flow(frames[:-1], frames[1:], mode=mode).permute(0, 2, 3, 1)).int()
                       for mode in ("exact", "fast"))
        difference = (exact - fast)[..., :2].abs().float()
        assert difference.mean() < 0.5, (clip.name, float(difference.mean()))
        differences.append(difference.mean())
    assert 0 < float(torch.stack(differences).mean()) < 0.5  # the modes differ, within the bound


@pytest.mark.parametrize("name", ["RubberWhale", "Dimetrodon"])
def test_fast_mode_middlebury_error_is_within_two_percent_of_opencv_on_a_crop(middlebury, name):
    first, second, gt = load_pair(middlebury, name, CROP)
    theirs = endpoint_error(opencv_tvl1(first, second), gt)["epe"]
    flow = tvl1_flow(torch.from_numpy(first)[None], torch.from_numpy(second)[None], mode="fast")
    ours = endpoint_error(flow[0].permute(1, 2, 0).numpy(), gt)["epe"]
    assert abs(ours - theirs) <= 0.02 * theirs, (ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["RubberWhale", "Dimetrodon"])
def test_fast_mode_middlebury_error_is_within_two_percent_of_opencv(middlebury, name):
    first, second, gt = load_pair(middlebury, name)
    theirs = endpoint_error(opencv_tvl1(first, second), gt)["epe"]
    for stop_every in (5, 10):
        flow = tvl1_flow(torch.from_numpy(first)[None], torch.from_numpy(second)[None], mode="fast",
                         stop_every=stop_every)
        ours = endpoint_error(flow[0].permute(1, 2, 0).numpy(), gt)["epe"]
        assert abs(ours - theirs) <= 0.02 * theirs, (stop_every, ours, theirs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvjpeg_frames_decode_like_opencvs(tmp_path):
    pytest.importorskip("torchvision")
    make_store(tmp_path / "store", {"a.avi": moving_texture(5, 1, -1)})
    root = tmp_path / "store"
    extract_flow(root, backend="tvl1-torch", device="cuda", params=SHORT, view="cv")
    extract_flow(root, backend="tvl1-torch", device="cuda", params=SHORT, view="nv", jpeg="nvjpeg")
    store = ClipStore(root)
    a, b = (store.read("a.avi", view, range(4)).astype(int) for view in ("cv", "nv"))
    assert np.abs(a - b).mean() < 1.0
    assert cv2.imdecode(np.frombuffer(store.read_encoded("a.avi", "nv", [0])[0], np.uint8), 1) is not None


def test_the_pairs_of_a_batch_go_to_the_device_in_one_copy_as_consecutive_frames(monkeypatch):
    """``upload_pairs`` gives the concatenated pairs (the reference: ``torch.cat`` of each video's slices) in one
    non-blocking copy from one host buffer (pinned on a GPU: a concatenation of pinned frames is not)."""
    import torch

    from coclr.store.flow_pipeline import upload_pairs

    videos = [torch.randint(0, 256, (n, 5, 7), dtype=torch.uint8) for n in (3, 1, 4)]
    copies = []
    to = torch.Tensor.to

    def watched(tensor, *args, **kwargs):
        copies.append(kwargs.get("non_blocking", False))
        return to(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", watched)
    prev, nxt = upload_pairs(videos, torch.device("cpu"))
    monkeypatch.undo()
    assert copies == [True]
    assert torch.equal(prev, torch.cat([v[:-1] for v in videos]))
    assert torch.equal(nxt, torch.cat([v[1:] for v in videos]))
    if torch.cuda.is_available():
        prev, nxt = upload_pairs(videos, torch.device("cuda"))
        assert torch.equal(prev.cpu(), torch.cat([v[:-1] for v in videos]))
