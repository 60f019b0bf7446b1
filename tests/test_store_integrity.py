"""Integrity of the clip store: checksums written with every entry and checked on every read, damaged entries named,
listed, left out and rebuilt, `coclr data verify`, stores built before checksums, and a full disk."""

from __future__ import annotations

import errno
import json
import struct
from dataclasses import replace

import numpy as np
import pytest
import xxhash

import coclr.store.clipstore as clipstore
from coclr.cli import main
from coclr.data.datasets import TrainClips, usable_entries
from coclr.flow.params import TVL1Params
from coclr.store.build import build_store
from coclr.store.clipstore import ClipStore, DamagedEntryError, create_store, read_failures, write_entry
from coclr.store.flow_extract import extract_flow
from coclr.store.jpeg import decode_jpeg, decode_jpeg_strict, encode_jpeg
from coclr.video.indexes import VideoEntry, VideoIndex
from test_flow_extract import make_store, moving_texture
from test_store import make_dataset


def _noise_frames(count: int, seed: int = 0, size: tuple[int, int] = (32, 40)) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [encode_jpeg(rng.integers(0, 256, (*size, 3), dtype=np.uint8), 90) for _ in range(count)]


def _store_with(tmp_path, frames: dict[str, list[bytes]], split: str = "train"):
    index = VideoIndex("t", ["c"], [VideoEntry(key, 0, split) for key in frames])
    create_store(tmp_path / "store", index)
    for key, encoded in frames.items():
        write_entry(tmp_path / "store", key, "rgb", encoded, 25.0)
    return ClipStore(tmp_path / "store")


def _flip(path, start: int, count: int = 256) -> None:
    data = bytearray(path.read_bytes())
    for i in range(start, start + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _write_unverified_entry(path, key: str, frames: list[bytes], fps: float = 25.0) -> None:
    """An entry file as version 2 wrote it (key, no checksums)."""
    height, width = decode_jpeg(frames[0]).shape[:2]
    key_bytes = key.encode()
    header = struct.pack("<8sIIIId", b"COCLRFRM", 2, len(frames), height, width, fps)
    header += struct.pack("<I", len(key_bytes)) + key_bytes
    start = len(header) + 8 * (len(frames) + 1)
    offsets = np.cumsum([start] + [len(f) for f in frames]).astype("<u8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + offsets.tobytes() + b"".join(frames))


def test_every_frame_and_the_header_carry_an_xxh3_checksum(tmp_path):
    frames = _noise_frames(5)
    store = _store_with(tmp_path, {"c/a.avi": frames})
    raw = store.entry_path("c/a.avi", "rgb").read_bytes()
    header = store._header("c/a.avi", "rgb")
    for i, frame in enumerate(frames):  # the stored bytes of each frame, and their checksum, from the file itself
        start, stop = int(header.offsets[i]), int(header.offsets[i + 1])
        assert raw[start:stop] == frame
        assert int(header.checksums[i]) == xxhash.xxh3_64_intdigest(frame)
    header_end = int(header.offsets[0])
    assert struct.unpack("<Q", raw[header_end - 8: header_end])[0] == xxhash.xxh3_64_intdigest(raw[:header_end - 8])
    assert store.checksum("c/a.avi", "rgb") == f"{xxhash.xxh3_64_intdigest(raw[:header_end - 8]):016x}"


def test_flipped_bytes_in_a_frame_are_named_listed_left_out_and_rebuilt(tmp_path):
    index = make_dataset(tmp_path / "videos", 4, frames=12)
    build_store(index, tmp_path / "videos", tmp_path / "store", short_side=24, quality=90, workers=1)
    store = ClipStore(tmp_path / "store")
    key = [e.path for e in index.entries if e.split == "train"][0]
    path = store.entry_path(key, "rgb")
    good = path.read_bytes()
    header = store._header(key, "rgb")
    start = int(header.offsets[5]) + 40  # inside frame 5
    _flip(path, start, 16)
    store = ClipStore(tmp_path / "store")
    store.read(key, "rgb", range(0, 5))  # frames before it are intact and read
    with pytest.raises(DamagedEntryError) as caught:
        store.read(key, "rgb", range(3, 8))
    message = str(caught.value)
    expected = f"{int(header.checksums[5]):016x}"
    found = f"{xxhash.xxh3_64_intdigest(path.read_bytes()[int(header.offsets[5]): int(header.offsets[6])]):016x}"
    assert "\n" not in message
    for part in (str(tmp_path / "store"), repr(key), path.name, "frame 5", f"expected {expected}", f"found {found}"):
        assert part in message
    assert key in read_failures(tmp_path / "store", "rgb")
    kept, left_out = usable_entries(ClipStore(tmp_path / "store"), "train", ["rgb"])
    assert key in left_out and key not in [e.path for e in kept]
    summary = build_store(index, tmp_path / "videos", tmp_path / "store", short_side=24, quality=90, workers=1)
    assert (summary.done, summary.skipped, summary.failed) == (1, 3, [])
    assert path.read_bytes() == good and read_failures(tmp_path / "store", "rgb") == {}


def test_a_damaged_header_is_named_with_its_checksums(tmp_path):
    store = _store_with(tmp_path, {"c/a.avi": _noise_frames(3)})
    path = store.entry_path("c/a.avi", "rgb")
    _flip(path, 60, 1)  # inside the frame offsets table
    with pytest.raises(DamagedEntryError, match=r"video 'c/a.avi', entry rgb/.*: header checksum expected "
                       r"[0-9a-f]{16}, found [0-9a-f]{16}"):
        ClipStore(tmp_path / "store").num_frames("c/a.avi", "rgb")
    assert "c/a.avi" in read_failures(tmp_path / "store", "rgb")


def test_a_damaged_frame_count_is_a_damaged_entry_not_a_huge_read(tmp_path):
    store = _store_with(tmp_path, {"c/a.avi": _noise_frames(3), "c/b.avi": _noise_frames(3, seed=1)})
    path = store.entry_path("c/a.avi", "rgb")
    data = bytearray(path.read_bytes())
    data[12:16] = struct.pack("<I", 0x7FFFFFFF)  # the frame count field
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedEntryError, match=r"video 'c/a.avi', entry rgb/.*: frame table of 2147483647 frames "
                       "longer than the file"):
        ClipStore(store.root).num_frames("c/a.avi", "rgb")
    dataset = TrainClips(store.root, "train", ["rgb"], length=2, num_clips=1)
    assert [e.path for e in dataset.entries] == ["c/b.avi"]


def test_training_leaves_out_an_entry_found_damaged_during_the_run(tmp_path, capsys):
    store = _store_with(tmp_path, {f"c/{i}.avi": _noise_frames(8, seed=i) for i in range(3)})
    dataset = TrainClips(store.root, "train", ["rgb"], length=4, num_clips=1)
    header = store._header("c/1.avi", "rgb")
    _flip(store.entry_path("c/1.avi", "rgb"), int(header.offsets[0]), int(header.offsets[-1] - header.offsets[0]))
    sample = dataset[1]  # its video is damaged: the next one gives the sample
    assert int(sample["video"]) == 2
    assert "damaged entry" in capsys.readouterr().err
    assert "c/1.avi" in read_failures(store.root, "rgb")
    assert int(dataset[1]["video"]) == 2 and [int(dataset[i]["video"]) for i in (0, 2)] == [0, 2]
    assert "c/1.avi" in usable_entries(ClipStore(store.root), "train", ["rgb"])[1]


def test_a_dataset_leaves_out_an_entry_whose_header_is_damaged(tmp_path, capsys):
    store = _store_with(tmp_path, {f"c/{i}.avi": _noise_frames(8, seed=i) for i in range(3)})
    _flip(store.entry_path("c/2.avi", "rgb"), 70, 1)
    dataset = TrainClips(store.root, "train", ["rgb"], length=4, num_clips=1)
    assert [e.path for e in dataset.entries] == ["c/0.avi", "c/1.avi"] and "c/2.avi" in dataset.left_out
    assert "header checksum expected" in capsys.readouterr().err
    assert "c/2.avi" in read_failures(store.root, "rgb")


def test_data_info_verify_decode_reports_256_flipped_bytes(tmp_path, capsys):
    index = make_dataset(tmp_path / "videos", 2, frames=12)
    build_store(index, tmp_path / "videos", tmp_path / "store", short_side=32, quality=90, workers=1)
    store = ClipStore(tmp_path / "store")
    key = store.keys()[0]
    header = store._header(key, "rgb")
    _flip(store.entry_path(key, "rgb"), int(header.offsets[6]) + 200)
    assert main(["data", "info", str(tmp_path / "store"), "--verify", "--decode"]) == 3  # some damaged
    out = capsys.readouterr().out
    assert "rgb: 1 verified, 1 damaged, 0 missing" in out and f"video {key!r}" in out


def test_strict_decoding_reports_libjpeg_corrupt_data_warnings():
    frame = _noise_frames(1, size=(64, 80))[0]
    damaged = bytearray(frame)
    for i in range(len(frame) // 2, len(frame) // 2 + 256):
        damaged[i] ^= 0xFF
    assert decode_jpeg(bytes(damaged)).shape == (64, 80, 3)  # decodes "as far as it goes"
    with pytest.raises(ValueError, match="Corrupt JPEG data"):
        decode_jpeg_strict(bytes(damaged))
    np.testing.assert_array_equal(decode_jpeg_strict(frame), decode_jpeg(frame))


def test_verify_decode_catches_damage_in_an_entry_without_checksums(tmp_path):
    store = _store_with(tmp_path, {"c/a.avi": _noise_frames(3, size=(64, 80))})
    frames = _noise_frames(3, seed=1, size=(64, 80))
    damaged = bytearray(frames[1])
    for i in range(len(damaged) // 2, len(damaged) // 2 + 256):
        damaged[i] ^= 0xFF
    frames[1] = bytes(damaged)
    index = VideoIndex("t", ["c"], [VideoEntry("c/a.avi", 0, "train"), VideoEntry("c/b.avi", 0, "train")])
    create_store(store.root, index, replace_index=True)
    _write_unverified_entry(ClipStore(store.root).entry_path("c/b.avi", "rgb"), "c/b.avi", frames)
    store = ClipStore(store.root)
    assert store.verify("rgb") == []  # no checksum: only a decoder can tell
    problems = store.verify("rgb", decode=True)
    assert [key for key, _ in problems] == ["c/b.avi"] and "Corrupt JPEG data" in problems[0][1]


def test_verify_names_every_missing_entry_by_video_and_exits_3(tmp_path, capsys):
    """A deleted entry file (and one whose job failed) is named by video and entry file in one line each, by
    `coclr data verify` and `coclr data info --verify` alike, and the status is 3 (some inputs are not good), not 0."""
    store = _store_with(tmp_path, {f"c/{n}.avi": _noise_frames(2, seed=n) for n in range(4)})
    deleted = store.entry_path("c/1.avi", "rgb")
    deleted.unlink()
    store.entry_path("c/3.avi", "rgb").unlink()
    clipstore.record_failures(store.root, "rgb", ["c/3.avi"], [("c/3.avi", "VideoDecodeError: cannot open")])
    for command in (["data", "verify", str(store.root)], ["data", "info", str(store.root), "--verify"]):
        assert main(command) == 3, command
        out = capsys.readouterr().out
        lines = [line.strip() for line in out.splitlines() if line.strip().startswith("missing entry")]
        entry = deleted.relative_to(store.root)
        assert lines == [f"missing entry: store {store.root}, video 'c/1.avi', entry {entry}: "
                         "no entry file (deleted, or never written)",
                         f"missing entry: store {store.root}, video 'c/3.avi', entry "
                         f"{store.entry_path('c/3.avi', 'rgb').relative_to(store.root)}: its job failed: "
                         "VideoDecodeError: cannot open"], out
        assert "rgb: 2 verified, 0 damaged, 2 missing" in out and "coclr data store" in out
    assert list(read_failures(store.root, "rgb")) == ["c/3.avi"]  # verify lists damage, not what was never written


def test_a_synthetic_store_s_missing_entries_are_written_by_the_synthesis(tmp_path, capsys):
    """Verify said `coclr data store` writes a synthetic store's missing rgb entries (a store of no videos: it needs
    an --index and a --root it does not have); the synthesis run again on the folder does."""
    from coclr.config import from_dict
    from coclr.store.clipstore import ClipStore
    from coclr.synth import SynthConfig, generate_synthetic

    config = from_dict(SynthConfig, {"train_scenes": 1, "test_scenes": 1, "num_classes": 2, "actions_per_scene": 2,
                                     "clips_per_action": 1, "frames": 8, "height": 32, "width": 32})
    generate_synthetic(tmp_path / "store", config, workers=0)
    store = ClipStore(tmp_path / "store")
    store.entry_path(store.keys()[0], "rgb").unlink()
    assert main(["data", "verify", str(store.root)]) == 3
    assert "(`coclr data synth` for rgb" in capsys.readouterr().out
    generate_synthetic(tmp_path / "store", config, workers=0)
    assert main(["data", "verify", str(store.root)]) == 0


def test_verify_command_checks_every_entry_and_add_gives_old_entries_checksums(tmp_path, capsys):
    store = _store_with(tmp_path, {"c/a.avi": _noise_frames(3)})
    index = VideoIndex("t", ["c"], [VideoEntry(k, 0, "train") for k in ("c/a.avi", "c/b.avi", "c/c.avi")])
    create_store(store.root, index, replace_index=True)
    old = {key: _noise_frames(4, seed=i) for i, key in enumerate(("c/b.avi", "c/c.avi"))}
    for key, frames in old.items():
        _write_unverified_entry(ClipStore(store.root).entry_path(key, "rgb"), key, frames)
    store = ClipStore(store.root)
    assert [store.checksum(k, "rgb") is None for k in store.keys()] == [False, True, True]
    TrainClips(store, "train", ["rgb"], length=2)
    assert "2 of 3 'rgb' entries have no checksums" in capsys.readouterr().err  # one line: unverified
    assert main(["data", "verify", str(store.root)]) == 0
    captured = capsys.readouterr()
    assert "rgb: 1 verified, 0 damaged, 0 missing, 2 unverified" in captured.out and "ETA" not in captured.out
    assert "verify rgb" in captured.err  # the progress bar
    assert main(["data", "verify", str(store.root), "--add"]) == 0
    assert "rgb: 1 verified, 0 damaged, 0 missing, 2 checksums added" in capsys.readouterr().out
    for key, frames in old.items():  # a reader that cached the old headers reads the rewritten files right
        assert store.read_encoded(key, "rgb", range(4)) == frames and store.checksum(key, "rgb") is not None
    store = ClipStore(store.root)
    for key, frames in old.items():
        assert store.checksum(key, "rgb") is not None
        assert store.read_encoded(key, "rgb", range(4)) == frames  # the same frames, now verified
    _flip(store.entry_path("c/c.avi", "rgb"), int(store._header("c/c.avi", "rgb").offsets[2]) + 10, 4)
    assert main(["data", "verify", str(store.root)]) == 3
    out = capsys.readouterr().out
    assert "rgb: 2 verified, 1 damaged" in out and "damaged entry: store" in out
    assert list(read_failures(store.root, "rgb")) == ["c/c.avi"]


def test_a_full_disk_stops_the_store_job_blames_no_video_and_a_rerun_completes(tmp_path, monkeypatch, capsys):
    index = make_dataset(tmp_path / "videos", 5, frames=6)
    index.save(tmp_path / "index.json")
    real_open = clipstore.atomic_open
    writes = []

    def full_after_two(path, mode="wb", fsync=True):
        if str(path).endswith(".frames"):  # (the entries; their notes, written beside them first, are small)
            writes.append(path)
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, fsync)

    monkeypatch.setattr(clipstore, "atomic_open", full_after_two)
    command = ["data", "store", "--index", str(tmp_path / "index.json"), "--root", str(tmp_path / "videos"),
               "--out", str(tmp_path / "store"), "--short-side", "24", "--workers", "1"]
    assert main(command) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("decoding")]
    assert len(lines) == 1 and "No space left on device (ENOSPC)" in lines[0]
    assert str(tmp_path / "store" / "rgb") in lines[0] and "B free" in lines[0]
    assert "3 entries left, about" in lines[0] and "run the same command again" in lines[0]
    assert len(writes) == 3  # stopped at once
    assert read_failures(tmp_path / "store", "rgb") == {}  # no video blamed
    monkeypatch.setattr(clipstore, "atomic_open", real_open)
    assert main(command) == 0
    assert "3 done, 2 skipped" in capsys.readouterr().out
    assert not list((tmp_path / "store").rglob("*.notes"))  # (the third's, beside no entry: removed)


@pytest.mark.parametrize("code", [errno.EFBIG, errno.ENOSPC])
def test_a_full_disk_is_a_storage_error_from_the_writer(tmp_path, monkeypatch, code):
    store = _store_with(tmp_path, {})
    create_store(store.root, VideoIndex("t", ["c"], [VideoEntry("c/a.avi", 0, "train")]), replace_index=True)

    def full(path, mode="wb", fsync=True):
        raise OSError(code, "full")

    monkeypatch.setattr(clipstore, "atomic_open", full)
    with pytest.raises(clipstore.StorageFullError, match=errno.errorcode[code]):
        write_entry(store.root, "c/a.avi", "rgb", _noise_frames(2), 25.0)
    assert json.loads((store.root / "store.json").read_text())["version"] == 2
    monkeypatch.setattr(clipstore, "atomic_write_json", lambda path, data: full(path))
    with pytest.raises(clipstore.StorageFullError, match=rf"{store.root}: .*writing failed_rgb.json"):
        clipstore.record_failures(store.root, "rgb", [], [("c/a.avi", "x")])


FLOW_RUNS = [("dis", {}),
             ("tvl1-torch", {"params": TVL1Params(nscales=1, warps=1, outer_iterations=1, inner_iterations=2),
                             "device": "cpu", "batch_pairs": 2})]


@pytest.mark.parametrize("backend, kwargs", FLOW_RUNS)
def test_flow_reads_are_verified_and_a_damaged_rgb_entry_fails_only_its_video(tmp_path, backend, kwargs):
    make_store(tmp_path / "store", {f"v{i}.avi": moving_texture(4, 1, 1, seed=i) for i in range(3)})
    store = ClipStore(tmp_path / "store")
    header = store._header("v1.avi", "rgb")
    _flip(store.entry_path("v1.avi", "rgb"), int(header.offsets[2]) + 30, 8)
    summary = extract_flow(tmp_path / "store", backend=backend, workers=1, **kwargs)
    assert summary.done == 2 and [key for key, _ in summary.failed] == ["v1.avi"]
    assert "damaged entry" in summary.failed[0][1] and "frame 2 checksum expected" in summary.failed[0][1]
    assert "v1.avi" in read_failures(tmp_path / "store", "rgb")


@pytest.mark.parametrize("backend, kwargs", FLOW_RUNS)
def test_a_full_disk_stops_flow_extraction_and_a_rerun_completes(tmp_path, monkeypatch, backend, kwargs):
    make_store(tmp_path / "store", {f"v{i}.avi": moving_texture(4, 1, 1, seed=i) for i in range(3)})
    real_open = clipstore.atomic_open

    def full(path, mode="wb", fsync=True):
        if "flow" in str(path):
            raise OSError(errno.EFBIG, "File too large")
        return real_open(path, mode, fsync)

    monkeypatch.setattr(clipstore, "atomic_open", full)
    view = "flow_dis" if backend == "dis" else "flow"
    with pytest.raises(clipstore.StorageFullError, match=r"File too large \(EFBIG\).*3 entries left"):
        extract_flow(tmp_path / "store", backend=backend, workers=1, **kwargs)
    assert read_failures(tmp_path / "store", view) == {}
    monkeypatch.setattr(clipstore, "atomic_open", real_open)
    summary = extract_flow(tmp_path / "store", backend=backend, workers=1, **kwargs)
    assert (summary.done, summary.failed) == (3, [])


def test_evaluation_names_a_damaged_entry_and_its_rerun_leaves_it_out(tmp_path):
    from coclr.eval.features import ClipConfig, extract_features, load_backbone
    from test_eval_helpers import make_tiny_store, save_tiny_encoder

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=1, test_per_class=1, frames=8))
    backbone = load_backbone(save_tiny_encoder(tmp_path / "encoder.pt"))
    config = ClipConfig(length=8, size=32, batch_size=4)
    key = [e.path for e in store.index.entries if e.split == "test"][1]
    header = store._header(key, "rgb")
    _flip(store.entry_path(key, "rgb"), int(header.offsets[3]) + 20, 8)
    with pytest.raises(DamagedEntryError, match=rf"video '{key}'.*frame 3 checksum expected"):
        extract_features(backbone, ClipStore(store.root), "rgb", "test", config, progress=False)
    clipstore.record_failures(store.root, "rgb", [key], [])  # as if it had not been listed
    with pytest.raises(DamagedEntryError) as caught:  # read by a DataLoader worker: the same one line
        extract_features(backbone, ClipStore(store.root), "rgb", "test", replace(config, workers=1), progress=False)
    assert str(caught.value).startswith("damaged entry: store") and "\n" not in str(caught.value)
    rerun = extract_features(backbone, ClipStore(store.root), "rgb", "test", config, progress=False)
    assert key not in rerun.keys and len(rerun.keys) == 2


def test_a_damaged_flow_entry_is_rebuilt_by_the_next_flow_run(tmp_path):
    make_store(tmp_path / "store", {f"v{i}.avi": moving_texture(4, 1, 1, seed=i) for i in range(2)})
    extract_flow(tmp_path / "store", backend="dis", workers=1)
    store = ClipStore(tmp_path / "store")
    path = store.entry_path("v0.avi", "flow_dis")
    good = path.read_bytes()
    _flip(path, int(store._header("v0.avi", "flow_dis").offsets[1]) + 5, 4)
    with pytest.raises(DamagedEntryError, match="frame 1 checksum"):
        store.read("v0.avi", "flow_dis", [1])
    summary = extract_flow(tmp_path / "store", backend="dis", workers=1)
    assert (summary.done, summary.skipped) == (1, 1) and path.read_bytes() == good
    assert read_failures(tmp_path / "store", "flow_dis") == {}


def test_without_xxhash_entries_are_written_unverified_and_checksummed_ones_named(tmp_path, monkeypatch):
    """A machine without xxhash (a bare GPU machine) writes version-2 entries, byte for byte what version 2 wrote,
    and reads them as unverified; an entry with checksums gets one line saying what to install."""
    frames = _noise_frames(3)
    verified = _store_with(tmp_path / "a", {"v/a": frames})
    monkeypatch.setattr(clipstore, "xxhash", None)
    store = _store_with(tmp_path / "b", {"v/b": frames})
    _write_unverified_entry(tmp_path / "expected.frames", "v/b", frames)
    assert store.entry_path("v/b", "rgb").read_bytes() == (tmp_path / "expected.frames").read_bytes()
    assert store.checksum("v/b", "rgb") is None
    np.testing.assert_array_equal(store.read("v/b", "rgb", [0, 2]), np.stack([decode_jpeg(frames[i]) for i in (0, 2)]))
    with pytest.raises(clipstore.DataError, match="needs the xxhash package: pip install xxhash"):
        ClipStore(verified.root).read("v/a", "rgb", [0])


def test_verification_is_a_library_function_the_commands_show(tmp_path):
    """store.verify: the counts and the problem lines of a view, found without any command; an unknown view is
    refused naming the store's views."""
    from coclr.errors import DataError
    from coclr.store.verify import check_views, verify_view

    store = _store_with(tmp_path, {"a": _noise_frames(4), "b": _noise_frames(4, seed=1), "c": _noise_frames(4, 2)})
    _flip(store.entry_path("b", "rgb"), int(store._header("b", "rgb").offsets[2]) + 30, 16)
    store.entry_path("c", "rgb").unlink()
    seen = []
    found = verify_view(ClipStore(store.root), "rgb", on_problem=seen.append, progress=False)
    assert found.counts["verified"] == 1 and found.counts["damaged"] == 1 and found.counts["missing"] == 1
    assert found.bad == 2 and seen == found.problems and len(seen) == 2
    assert "'b'" in seen[0] and "frame 2" in seen[0] and "video 'c'" in seen[1]
    assert check_views(store, None) == ["rgb"]
    with pytest.raises(DataError, match="no view 'flow' \\(views: rgb\\)"):
        check_views(store, ["flow"])


def test_verify_of_a_store_that_may_not_be_written_does_not_say_it_listed_the_damage(tmp_path, capsys,
                                                                                     monkeypatch):
    """A read-only store: verify said the damaged entries "are listed in failed_rgb.json", which it could not
    write."""
    from coclr.store import clipstore

    index = make_dataset(tmp_path / "videos", 2, frames=12)
    build_store(index, tmp_path / "videos", tmp_path / "store", short_side=32, quality=90, workers=1)
    store = ClipStore(tmp_path / "store")
    key = store.keys()[0]
    _flip(store.entry_path(key, "rgb"), int(store._header(key, "rgb").offsets[6]) + 200)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(clipstore, "record_failures", read_only)
    assert main(["data", "verify", str(tmp_path / "store")]) == 3
    out = capsys.readouterr().out
    assert "1 damaged entries could not be listed in" in out and "are listed in" not in out


def test_a_view_whose_folder_is_gone_is_checked_as_missing_entries(tmp_path, capsys):
    """A store's rgb folder deleted: `data verify` printed nothing at exit 0, and `data info` "no views yet"; a flow
    view deleted while the store records its method, the same. An entry path that is a folder made `data info` fail
    with "Is a directory", naming no file."""
    import shutil

    from coclr.store.flow_views import method_key

    store = _store_with(tmp_path, {f"c/{n}.avi": _noise_frames(2, seed=n) for n in range(3)})
    create_store(store.root, store.index, short_side=32, quality=90, **{method_key("flow"): {"backend": "dis"}})
    shutil.rmtree(store.root / "rgb")
    assert main(["data", "verify", str(store.root)]) == 3
    out = capsys.readouterr().out
    assert "rgb: 0 verified, 0 damaged, 3 missing" in out and "flow: 0 verified, 0 damaged, 3 missing" in out
    assert main(["data", "verify", str(store.root), "--view", "rgb"]) == 3  # (it was "no view 'rgb'")
    assert main(["data", "info", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "view 'rgb': 0/3 entries complete" in out and "no views yet" not in out
    entry = store.entry_path("c/0.avi", "rgb")
    write_entry(store.root, "c/1.avi", "rgb", _noise_frames(2), 25.0)
    entry.mkdir(parents=True)
    assert main(["data", "info", str(store.root)]) == 0
    assert "view 'rgb': 1/3 entries complete" in capsys.readouterr().out


def test_an_unverified_entry_listed_as_damaged_is_not_passed_by_a_plain_verify(tmp_path, capsys):
    """An entry written before checksums, found damaged by `verify --add` (listed in failed_rgb.json): a later plain
    verify said "0 damaged, 1 unverified" at exit 0, while training left it out."""
    store = _store_with(tmp_path, {"c/a.avi": _noise_frames(3), "c/b.avi": _noise_frames(3, seed=1)})
    frames = _noise_frames(4, seed=2)
    frames[2] = frames[2][: len(frames[2]) // 2]
    path = store.entry_path("c/b.avi", "rgb")
    path.unlink()
    _write_unverified_entry(path, "c/b.avi", frames)
    assert main(["data", "verify", str(store.root), "--add"]) == 3
    assert list(read_failures(store.root, "rgb")) == ["c/b.avi"]
    capsys.readouterr()
    assert main(["data", "verify", str(store.root)]) == 3
    out = capsys.readouterr().out
    assert "rgb: 1 verified, 1 damaged, 0 missing" in out and "found damaged before and listed: " in out
