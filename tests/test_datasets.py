"""The training dataset's in-memory frame cache: the same samples as uncached reads, bounded, never pickled."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from coclr.config import from_dict
from coclr.data.datasets import TrainClips
from coclr.errors import ConfigError
from coclr.train.config import DataOptions
from conftest import make_random_store

VIEWS = ["rgb", "flow", "rgbdiff"]


def _samples(dataset: TrainClips, epoch: int) -> list[dict]:
    dataset.set_epoch(epoch)
    return [dataset[i] for i in range(len(dataset))]


def _assert_same(first: list[dict], second: list[dict]) -> None:
    for a, b in zip(first, second, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert np.array_equal(a[name].numpy(), b[name].numpy()), name


@pytest.fixture
def store(tmp_path):
    return make_random_store(tmp_path / "store", videos=6, frames=12, size=(36, 40))


def test_cached_reads_equal_uncached_reads_and_skip_the_store(store):
    """Frames fitted to another size and a derived view: every epoch's samples are those of uncached reads, and
    once every entry was read, later epochs never touch the store."""
    plain = TrainClips(store, "train", VIEWS, length=8, stride=1, seed=3, frame_size=(32, 32))
    cached = TrainClips(store, "train", VIEWS, length=8, stride=1, seed=3, frame_size=(32, 32), cache_mb=64)
    _assert_same(_samples(plain, 0), _samples(cached, 0))
    assert len(cached._cache) == 6 * 2  # every entry of the stored rgb and flow views

    def no_reads(*args, **kwargs):
        raise AssertionError("the store was read although every entry is cached")

    cached.store.read = no_reads
    for epoch in (1, 2):
        _assert_same(_samples(plain, epoch), _samples(cached, epoch))


def test_the_cache_stops_growing_at_its_budget(store):
    """One 12-frame 32x32 entry is 36 KiB: a 0.05 MiB budget holds two entries, then reads go to the store."""
    plain = TrainClips(store, "train", ["rgb"], length=8, seed=0, frame_size=(32, 32))
    cached = TrainClips(store, "train", ["rgb"], length=8, seed=0, frame_size=(32, 32), cache_mb=0.05)
    _assert_same(_samples(plain, 0), _samples(cached, 0))
    entry_bytes = 12 * 32 * 32 * 3
    assert len(cached._cache) == 2
    assert cached._cached_bytes == 2 * entry_bytes
    _assert_same(_samples(plain, 1), _samples(cached, 1))


def test_the_cache_is_not_pickled_to_worker_processes(store):
    cached = TrainClips(store, "train", ["rgb"], length=8, seed=0, cache_mb=64)
    _samples(cached, 0)
    copy = pickle.loads(pickle.dumps(cached))
    assert cached._cache and not copy._cache and copy._cached_bytes == 0
    assert copy.cache_bytes == cached.cache_bytes
    _assert_same(_samples(cached, 1), _samples(copy, 1))


def test_cache_options_are_validated():
    with pytest.raises(ConfigError, match="cache_mb: needs workers=0"):
        from_dict(DataOptions, {"store": "s", "length": 8, "size": 32, "workers": 2, "cache_mb": 100})
    with pytest.raises(ConfigError, match="cache_mb: must be non-negative"):
        from_dict(DataOptions, {"store": "s", "length": 8, "size": 32, "workers": 0, "cache_mb": -1})
    with pytest.raises(ValueError, match="cache_mb"):
        TrainClips("unused", "train", ["rgb"], length=8, cache_mb=-1)


def test_videos_whose_view_failed_are_left_out_and_unbuilt_views_are_an_error(tmp_path, capsys, start_trainer):
    """A video whose flow job failed (recorded by the store) is left out of training with a message naming the
    failure list; a video whose flow was simply not extracted yet stops training before any work."""
    import os

    from coclr.data.datasets import usable_entries
    from coclr.errors import DataError
    from coclr.store.clipstore import ClipStore, entry_path, record_failures
    from test_train import tiny_config

    store_root = make_random_store(tmp_path / "store", videos=9, frames=12, test_videos=2)
    short = "c1/v001"
    os.unlink(entry_path(store_root, short, "flow"))
    with pytest.raises(DataError, match=r"view 'flow' is missing for 1 of the 9 'train' videos \(c1/v001\)"):
        usable_entries(ClipStore(store_root), "train", ["rgb", "flow"])
    record_failures(store_root, "flow", [short], [(short, "DataError: c1/v001: 1 RGB frame, flow needs at least 2")])
    store = ClipStore(store_root)
    kept, left_out = usable_entries(store, "train", ["rgb", "flow"])
    assert short not in [e.path for e in kept] and len(kept) == 8
    assert left_out == {short: "no 'flow' entry: DataError: c1/v001: 1 RGB frame, flow needs at least 2"}
    assert usable_entries(store, "train", ["rgb"]) == (  # RGB-only training keeps it
        [e for e in store.index.entries if e.split == "train"], {})
    config = tiny_config(store_root, tmp_path / "run", "method.name=cmc")
    trainer = start_trainer(config)
    assert len(trainer.dataset) == 8
    out = capsys.readouterr().out
    assert "left out 1 'train' video(s) whose jobs failed" in out and str(store_root / "failed_flow.json") in out


def test_stretches_of_long_videos_are_instances_and_whole_short_videos_are_one(tmp_path):
    """``segment_frames``: each video is cut into stretches, each an instance whose two clips lie inside it; a video
    shorter than two stretches is one instance; when every video is one, the samples are those without stretches."""
    from coclr.data.sampling import segment_counts, segments_of

    assert segments_of([10, 33, 40, 5], 16).tolist() == [[0, 0, 10], [1, 0, 16], [1, 16, 17], [2, 0, 16],
                                                         [2, 16, 24], [3, 0, 5]]
    assert segment_counts([10, 33, 40, 5], 16).tolist() == [1, 2, 2, 1]
    assert segments_of([10, 33], None).tolist() == [[0, 0, 10], [1, 0, 33]]
    store = make_random_store(tmp_path / "long", videos=3, frames=41, size=(16, 16))
    dataset = TrainClips(store, "train", ["rgb", "flow"], length=4, seed=1, segment_frames=10)
    assert len(dataset) == 3 * 4  # 40 aligned frames each: four stretches of 10
    for epoch in range(3):
        dataset.set_epoch(epoch)
        for item in range(len(dataset)):
            sample = dataset[item]
            video, first, frames = dataset.segments[item]
            assert int(sample["video"]) == item
            for clip in sample["rgb"]:  # frames are random: find each clip's frames in its video
                whole = dataset._read_frames(dataset.entries[video].path, "rgb", np.arange(41))
                starts = [s for s in range(41 - 3) if np.array_equal(whole[s: s + 4], clip.numpy())]
                assert starts and first <= starts[0] and starts[0] + 4 <= first + frames
    short = make_random_store(tmp_path / "short", videos=4, frames=12, size=(16, 16))
    whole = TrainClips(short, "train", ["rgb", "flow"], length=4, seed=2)
    cut = TrainClips(short, "train", ["rgb", "flow"], length=4, seed=2, segment_frames=8)  # 11 frames: one
    assert len(cut) == len(whole) == 4
    _assert_same(_samples(whole, 0), _samples(cut, 0))
    with pytest.raises(ValueError, match="segment_frames"):
        TrainClips(short, "train", ["rgb"], length=4, segment_frames=0)
    even = make_random_store(tmp_path / "even", videos=3, frames=32, size=(16, 16))  # 32 RGB frames, 31 of flow
    both = TrainClips(even, "train", ["rgb", "flow"], length=4, segment_frames=16)
    assert len(both) == 3 and len(TrainClips(even, "train", ["rgb"], length=4, segment_frames=16)) == 6
    for view, other in (("rgb", "flow"), ("flow", "rgb")):  # a pipeline's one-view stages: the same stretches
        alone = TrainClips(even, "train", [view], length=4, segment_frames=16, segment_with=[other])
        assert alone.segments.tolist() == both.segments.tolist()
    assert TrainClips(even, "train", ["rgb"], length=4, segment_with=["flow"]).segments.tolist() == \
        TrainClips(even, "train", ["rgb"], length=4).segments.tolist()  # no stretches: each video whole, as before
    from coclr.store.clipstore import ClipStore

    store = ClipStore(even)
    key = store.index.entries[0].path
    flow_entry = store.entry_path(key, "flow")
    data = bytearray(flow_entry.read_bytes())
    data[60] ^= 0xFF  # its header damaged: a view this RGB run never reads must not stop it
    flow_entry.write_bytes(bytes(data))
    alone = TrainClips(even, "train", ["rgb"], length=4, segment_frames=16, segment_with=["flow"])
    assert alone.segments[:, 0].tolist().count(0) == 2 and len(alone) == 4  # that video cut in its own frames
    with pytest.raises(ConfigError, match="segment_frames"):
        from_dict(DataOptions, {"store": "x", "segment_frames": 0})
