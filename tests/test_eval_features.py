"""Video features: window averaging, the content-keyed cache, test-time crop geometry, input checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coclr.errors import CheckpointError, DataError
from coclr.eval.features import (
    ClipConfig,
    Stream,
    cached_features,
    check_inputs,
    checkpoint_meta,
    eval_views,
    extract_features,
    load_backbone,
)
from test_eval_helpers import make_tiny_store, save_tiny_encoder

CONFIG = ClipConfig(length=8, stride=1, size=32, batch_size=5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from coclr.store.clipstore import ClipStore

    root = tmp_path_factory.mktemp("features")
    store = ClipStore(make_tiny_store(root / "store", train_per_class=2, test_per_class=1, frames=12,
                                      views=("rgb", "flow")))
    return store, save_tiny_encoder(root / "encoder.pt", seed=0), root


def test_features_are_window_means_of_pooled_backbone(tiny):
    """Reference: every half-overlapping window of a video, one at a time, centre crop, pooled map, mean."""
    from coclr.data.sampling import sliding_windows

    store, checkpoint, _ = tiny
    backbone = load_backbone(checkpoint)
    result = extract_features(backbone, store, "rgb", "test", CONFIG, progress=False)
    assert result.features.shape == (3, backbone.out_channels) and result.features.dtype == np.float32
    entries = [e for e in store.index.entries if e.split == "test"]
    assert result.keys == [e.path for e in entries] and result.labels.tolist() == [e.label for e in entries]
    for row, entry in enumerate(entries):
        windows = sliding_windows(store.num_frames(entry.path, "rgb"), 8, 1)
        assert [w[0] for w in windows] == [0, 4]  # 12 frames: half overlap, the last one ends the video
        pooled = []
        for indices in windows:
            frames = torch.from_numpy(store.read(entry.path, "rgb", indices))[None]
            with torch.no_grad():
                pooled.append(backbone(eval_views(frames, "rgb", 32)[:, 0]).mean(dim=(2, 3, 4))[0])
        # each window's feature L2-normalised before the mean, as the authors' evaluation model gives it
        reference = torch.nn.functional.normalize(torch.stack(pooled), dim=1).mean(0).numpy()
        # batched vs one-by-one convolutions: float rounding
        np.testing.assert_allclose(result.features[row], reference, rtol=1e-4, atol=1e-5 * np.abs(reference).max())
    assert not backbone.training


def test_features_are_the_same_bits_for_every_batch_size_and_thread_count(tiny):
    """Identical videos did not tie: the eager network's output for a window depended on the batch it shared (the last
    one short) and the thread count, and R@1 with it (50.0 at batch 16 on one thread, 75.0 otherwise)."""
    from dataclasses import replace

    store, checkpoint, _ = tiny
    backbone = load_backbone(checkpoint)
    threads = torch.get_num_threads()
    try:
        results = []
        for size, count in ((16, 1), (5, 2), (3, 1), (1, 2)):
            torch.set_num_threads(count)
            results.append(extract_features(backbone, store, "rgb", "train", replace(CONFIG, batch_size=size),
                                            progress=False).features)
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_a_window_of_tiny_features_counts_as_much_as_any_other():
    """unit_length makes rows of any size unit vectors (an untrained narrow network's pooled features can be
    1e-19, under F.normalize's floor), and a zero row stays zero."""
    from coclr.models.heads import unit_length

    rows = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    scaled = rows * torch.tensor([1e-19, 1e-6, 1.0, 1e12])[:, None]
    expected = torch.nn.functional.normalize(rows.double(), dim=1).float()
    torch.testing.assert_close(unit_length(scaled), expected, rtol=1e-6, atol=1e-7)
    assert unit_length(scaled).dtype == torch.float32
    assert not unit_length(torch.zeros(2, 16)).any()


def test_checkpoint_meta_of_exported_encoders_and_training_checkpoints(tmp_path):
    """Reports name the method of every kind of our checkpoints (UberNCE's labels column depends on it)."""
    exported = save_tiny_encoder(tmp_path / "enc.pt", meta={"method": "coclr", "view": "flow", "stage": "cycle1_flow"})
    assert checkpoint_meta(exported) == {"method": "coclr", "view": "flow", "stage": "cycle1_flow"}
    torch.save({"format": "coclr.train", "version": 1, "method": "ubernce", "view": "rgb", "best_loss": 3.5,
                "model": {"w": torch.zeros(2)}}, tmp_path / "checkpoint_last.pth")
    assert checkpoint_meta(tmp_path / "checkpoint_last.pth") == {"method": "ubernce", "view": "rgb"}
    torch.save({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "theirs.pth")
    (tmp_path / "broken.pth").write_bytes(b"not a checkpoint")
    assert checkpoint_meta(tmp_path / "theirs.pth") == {} and checkpoint_meta(tmp_path / "broken.pth") == {}


def test_cache_is_keyed_by_checkpoint_content(tiny, tmp_path, monkeypatch):
    store, _, _ = tiny
    checkpoint = save_tiny_encoder(tmp_path / "model.pt", seed=1)
    cache = tmp_path / "cache"
    first = cached_features(checkpoint, store, "rgb", "test", CONFIG, cache, progress=False)
    assert len(list(cache.glob("*.npz"))) == 1 and not list(cache.glob("*.tmp"))

    import coclr.eval.features as features

    def no_loading(path):
        raise AssertionError("a cache hit must not load the model")

    monkeypatch.setattr(features, "load_backbone", no_loading)
    hit = cached_features(checkpoint, store, "rgb", "test", CONFIG, cache, progress=False)
    np.testing.assert_array_equal(hit.features, first.features)
    monkeypatch.undo()

    save_tiny_encoder(checkpoint, seed=2)  # same path and folder, new content
    fresh = cached_features(checkpoint, store, "rgb", "test", CONFIG, cache, progress=False)
    expected = extract_features(load_backbone(checkpoint), store, "rgb", "test", CONFIG, progress=False)
    np.testing.assert_array_equal(fresh.features, expected.features)
    assert not np.allclose(fresh.features, first.features)
    assert len(list(cache.glob("*.npz"))) == 2
    for damaged in sorted(cache.glob("*.npz")):  # cut short (a full disk, a copy): it was a BadZipFile traceback
        damaged.write_bytes(damaged.read_bytes()[:100])
    again = cached_features(checkpoint, store, "rgb", "test", CONFIG, cache, progress=False)
    np.testing.assert_array_equal(again.features, fresh.features)


def test_cache_key_covers_the_data_configuration(tiny):
    from dataclasses import replace

    from coclr.eval.features import cache_key

    store, _, _ = tiny
    base = cache_key("abc", store, "rgb", "test", CONFIG)
    variants = [cache_key("abd", store, "rgb", "test", CONFIG), cache_key("abc", store, "flow", "test", CONFIG),
                cache_key("abc", store, "rgb", "train", CONFIG)]
    variants += [cache_key("abc", store, "rgb", "test", replace(CONFIG, **{name: value}))
                 for name, value in (("length", 16), ("stride", 2), ("size", 64), ("amp", True))]
    assert all(variant != base for variant in variants)
    assert cache_key("abc", store, "rgb", "test", replace(CONFIG, batch_size=1, workers=2)) == base
    # another flow view extracted: the RGB features stand (they were extracted again after every coclr flow), a
    # flow view's own bound or method keys its features
    import copy

    other = copy.copy(store)
    other.meta = {**store.meta, "flow_dis_bound_px": 20.0, "flow_dis_method": {"backend": "dis", "params": None}}
    assert cache_key("abc", other, "rgb", "test", CONFIG) == base
    assert cache_key("abc", other, "flow", "test", CONFIG) == cache_key("abc", store, "flow", "test", CONFIG)
    from coclr.eval.features import settings_of_views

    assert "flow_dis_method" in settings_of_views(other.meta, ["flow_dis"])
    rebound = copy.copy(store)
    rebound.meta = {**store.meta, "flow_bound_px": 5.0}
    assert cache_key("abc", rebound, "flow", "test", CONFIG) != cache_key("abc", store, "flow", "test", CONFIG)


def test_cache_is_keyed_by_store_content_not_its_path(tmp_path, monkeypatch):
    """A store rebuilt in place with other frames (other JPEG quality) must not be served from the cache; the same
    store rebuilt identically (deterministic encoding, so the same checksums), or moved, is."""
    import shutil

    import coclr.eval.features as features
    from coclr.store.build import build_store
    from coclr.store.clipstore import ClipStore
    from test_store import make_dataset

    index = make_dataset(tmp_path / "videos", 8, frames=12, size=(36, 48))
    checkpoint = save_tiny_encoder(tmp_path / "model.pt", seed=1)
    cache = tmp_path / "cache"

    def features_of(quality: int, where: str = "store"):
        shutil.rmtree(tmp_path / where, ignore_errors=True)
        build_store(index, tmp_path / "videos", tmp_path / where, short_side=36, quality=quality, workers=1)
        return cached_features(checkpoint, ClipStore(tmp_path / where), "rgb", "test", CONFIG, cache, progress=False)

    first = features_of(90)
    other = features_of(20)  # rebuilt in place: other frames
    expected = extract_features(load_backbone(checkpoint), ClipStore(tmp_path / "store"), "rgb", "test", CONFIG,
                                progress=False)
    np.testing.assert_array_equal(other.features, expected.features)
    assert not np.allclose(other.features, first.features)
    assert len(list(cache.glob("*.npz"))) == 2

    def no_loading(path):
        raise AssertionError("a cache hit must not load the model")

    monkeypatch.setattr(features, "load_backbone", no_loading)
    np.testing.assert_array_equal(features_of(90).features, first.features)  # same content: served from the cache
    np.testing.assert_array_equal(features_of(90, "moved").features, first.features)


def test_ten_crop_geometry_of_a_known_frame():
    """Crops of a frame with unique pixel values: without resizing each crop is an exact slice; crops 0-4
    are top-left, top-right, bottom-left, bottom-right, centre; 5-9 the same flipped; flow's u is negated."""
    height, width, size = 40, 52, 32
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    frames = torch.from_numpy(np.stack([frame, frame[::-1].copy()]))[None]  # [1, T=2, H, W, 3]
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])

    def expected(top, left, flip=False, flow=False):
        crop = frames[0].numpy()[:, top : top + size, left : left + size].astype(np.float64) / 255
        if flip:
            crop = crop[:, :, ::-1]
            if flow:
                crop = crop.copy()
                crop[..., 0] = 1 - crop[..., 0]
        return ((crop - mean) / std).transpose(3, 0, 1, 2)  # [3, T, S, S]

    corners = [(0, 0), (0, width - size), (height - size, 0), (height - size, width - size),
               ((height - size) // 2, (width - size) // 2)]
    for view in ("rgb", "flow"):
        crops = eval_views(frames, view, size, ten_crop=True, short_side=height)
        assert crops.shape == (1, 10, 3, 2, size, size)
        for i, (top, left) in enumerate(corners):
            np.testing.assert_allclose(crops[0, i].numpy(), expected(top, left), atol=1e-4)
            np.testing.assert_allclose(crops[0, 5 + i].numpy(), expected(top, left, True, view == "flow"), atol=1e-4)
    centre = eval_views(frames, "rgb", height)  # no resize: the centred square of side H
    np.testing.assert_allclose(centre[0, 0].numpy(), expected_square(frames, height, mean, std), atol=1e-4)


def expected_square(frames, side, mean, std):
    width = frames.shape[3]
    left = (width - side) // 2
    crop = frames[0].numpy()[:, :, left : left + side].astype(np.float64) / 255
    return ((crop - mean) / std).transpose(3, 0, 1, 2)


def test_input_checks_fail_before_work(tiny, tmp_path):
    store, checkpoint, _ = tiny
    check_inputs(store, [Stream(checkpoint, "rgb"), Stream(checkpoint, "flow")], ["train", "test"])
    with pytest.raises(CheckpointError, match="missing.pt"):
        check_inputs(store, [Stream(tmp_path / "missing.pt", "rgb")], ["train"])
    with pytest.raises(DataError, match="'flow_dis' is missing for 6 of the 6 'train' videos"):
        check_inputs(store, [Stream(checkpoint, "flow_dis")], ["train"])
    with pytest.raises(DataError, match="split 'val' has no videos"):
        check_inputs(store, [Stream(checkpoint, "rgb")], ["val"])


def test_a_derived_view_is_keyed_by_the_entries_it_reads(tiny, tmp_path):
    """rgbdiff is computed from the stored RGB: every evaluation of an rgbdiff encoder was refused ("no 'rgbdiff'
    entry ... not built yet"), keying its features by an entry that is never stored."""
    from coclr.eval.features import cache_key

    store, _, _ = tiny
    key = cache_key("abc", store, "rgbdiff", "test", CONFIG)
    assert key["view"] == "rgbdiff" and key != cache_key("abc", store, "rgb", "test", CONFIG)
    assert key["videos_sha256"] == cache_key("abc", store, "rgb", "test", CONFIG)["videos_sha256"]
    checkpoint = save_tiny_encoder(tmp_path / "diff.pt", meta={"method": "infonce", "view": "rgbdiff"})
    result = cached_features(checkpoint, store, "rgbdiff", "test", CONFIG, tmp_path / "cache", progress=False)
    assert result.features.shape[0] == 3 and np.isfinite(result.features).all()


def test_features_take_the_normalisation_the_encoder_records(tiny, tmp_path):
    """An encoder that records Kinetics' mean and standard deviation (torchvision's s3d implies them) got clips
    under ImageNet's all the same, unlike coclr embed; now its own, and keyed apart in the cache."""
    from coclr.clips import KINETICS_MEAN, KINETICS_STD
    from coclr.eval.features import IMAGENET, cache_key, input_normalisation

    store, imagenet_checkpoint, _ = tiny
    settings = {"view": "rgb", "mean": list(KINETICS_MEAN), "std": list(KINETICS_STD)}
    checkpoint = save_tiny_encoder(tmp_path / "kinetics.pt", seed=0,
                                   meta={"method": "infonce", "view": "rgb", "clip_settings": settings})
    assert input_normalisation(checkpoint) == (KINETICS_MEAN, KINETICS_STD)
    assert input_normalisation(imagenet_checkpoint) == IMAGENET
    backbone = load_backbone(checkpoint)
    got = cached_features(checkpoint, store, "rgb", "test", CONFIG, tmp_path / "cache", progress=False)
    kinetics = extract_features(backbone, store, "rgb", "test", CONFIG, progress=False,
                                normalisation=(KINETICS_MEAN, KINETICS_STD))
    imagenet = extract_features(backbone, store, "rgb", "test", CONFIG, progress=False)
    np.testing.assert_array_equal(got.features, kinetics.features)
    assert not np.allclose(got.features, imagenet.features, atol=1e-3)
    assert cache_key("abc", store, "rgb", "test", CONFIG, normalisation=(KINETICS_MEAN, KINETICS_STD)) != \
        cache_key("abc", store, "rgb", "test", CONFIG)
    assert "normalisation" not in cache_key("abc", store, "rgb", "test", CONFIG)  # earlier keys stand


def test_a_videos_features_do_not_depend_on_the_other_videos_of_its_split(tmp_path):
    """A portrait video among landscape ones was fitted to the split's most common size before its centre crop (71%
    of its centre square), and cut otherwise when the others were portrait: its features changed with its
    neighbours, and as a query and as a gallery item."""
    from coclr.data.datasets import WindowClips
    from coclr.eval.features import ClipConfig, window_features
    from coclr.models.loading import load_encoder
    from coclr.store.clipstore import ClipStore, write_entry
    from coclr.store.jpeg import encode_jpeg

    root = make_tiny_store(tmp_path / "store", train_per_class=1, test_per_class=2, frames=10, height=40, width=56)
    rng = np.random.default_rng(5)
    portrait = "green_class/test_01.avi"
    write_entry(root, portrait, "rgb", [encode_jpeg(rng.integers(0, 255, (56, 40, 3), dtype=np.uint8))
                                        for _ in range(10)], fps=25.0)
    backbone, _ = load_encoder(save_tiny_encoder(tmp_path / "enc.pt"))
    backbone.eval()
    store, config = ClipStore(root), ClipConfig(length=8, size=32, batch_size=4)
    together, videos, keys, _ = window_features(backbone, store, "rgb", "test", config)
    alone, _, _, _ = window_features(backbone, store, "rgb", "test", config, keys=[portrait])
    np.testing.assert_allclose(together[videos == keys.index(portrait)], alone, rtol=0, atol=0)
    windows = WindowClips(store, "test", "rgb", 8)
    batches = windows.batches(4)
    assert sorted(i for batch in batches for i in batch) == list(range(len(windows)))
    assert all(len({windows.sizes[windows.windows[i][0]] for i in batch}) == 1 for batch in batches)
