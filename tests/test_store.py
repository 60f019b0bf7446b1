"""The clip store: JPEG frames packed per video, atomic resumable parallel jobs, verification, the CLI."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from coclr.cli import main
from coclr.errors import DataError
from coclr.store.build import build_store
from coclr.store.clipstore import LOCK_FILE, ClipStore, create_store, entry_path, pending_notes_path, write_entry
from coclr.store.jobs import run_entry_jobs
from coclr.store.jpeg import decode_jpeg, encode_jpeg
from coclr.video.decode import decode_video
from coclr.video.indexes import VideoEntry, VideoIndex
from conftest import view_locked_by_another_process
from test_video import write_video

REPO_ROOT = Path(__file__).resolve().parents[1]


def make_dataset(root: Path, count: int, frames: int = 12, size: tuple[int, int] = (36, 48),
                 seed: int = 0) -> VideoIndex:
    """``count`` small lossy videos (.avi, MPEG-4) in two classes, with their index."""
    rng = np.random.default_rng(seed)
    entries = []
    y, x = np.mgrid[0: size[0], 0: size[1]]
    for i in range(count):
        label = i % 2
        base = rng.integers(0, 200, 3)
        video = np.stack([np.stack([(x * (3 + label) + 4 * t + base[0]) % 256, (y * 5 + base[1]) % 256,
                                    np.full_like(x, base[2] + t)], -1) for t in range(frames)]).astype(np.uint8)
        path = f"class{label}/video{i:03d}.avi"
        (root / f"class{label}").mkdir(parents=True, exist_ok=True)
        write_video(root / path, video, fps=15, codec="mpeg4")
        entries.append(VideoEntry(path, label, "train" if i % 4 else "test"))
    return VideoIndex("toy", ["class0", "class1"], entries)


def reference_jpeg_round_trip(frame: np.ndarray, quality: int) -> np.ndarray:
    """What a stored frame must decode to: OpenCV's JPEG of the RGB frame, decoded by OpenCV."""
    ok, data = cv2.imencode(".jpg", frame[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return cv2.imdecode(data, cv2.IMREAD_COLOR)[..., ::-1]


def test_jpeg_round_trip_keeps_channel_order():
    frame = np.zeros((16, 24, 3), np.uint8)
    frame[..., 0] = 250  # pure red in RGB
    decoded = decode_jpeg(encode_jpeg(frame, 95))
    assert decoded.shape == (16, 24, 3)
    assert decoded[..., 0].min() > 240 and decoded[..., 1:].max() < 10
    noise = np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8)
    np.testing.assert_array_equal(decode_jpeg(encode_jpeg(noise, 70)), reference_jpeg_round_trip(noise, 70))
    with pytest.raises(ValueError):
        decode_jpeg(b"not a jpeg")
    # A side past JPEG's limit (a 4000x2 video at a short side of 128 is 256000 px wide): OpenCV printed its own
    # error and the reason said only that it could not encode
    assert len(encode_jpeg(np.zeros((2, 65500, 3), np.uint8))) > 0
    with pytest.raises(ValueError, match=r"a frame of 65501x2 px has a side longer than JPEG's 65500: resize to a "
                                         r"smaller short side \(--short-side\)"):
        encode_jpeg(np.zeros((2, 65501, 3), np.uint8))


def test_store_round_trip_equals_jpeg_of_the_source_frames(tmp_path):
    index = make_dataset(tmp_path / "videos", 3)
    summary = build_store(index, tmp_path / "videos", tmp_path / "store", short_side=24, quality=80, workers=1)
    assert (summary.done, summary.skipped, summary.failed, summary.frames) == (3, 0, [], 36)
    store = ClipStore(tmp_path / "store")
    assert store.keys() == [e.path for e in index.entries]
    assert store.index == index
    assert store.meta == {"short_side": 24, "quality": 80, "fps": None}
    assert store.views() == ["rgb"]
    for key in store.keys():
        source = decode_video(tmp_path / "videos" / key, short_side=24)
        assert store.has(key, "rgb") and not store.has(key, "flow")
        assert store.num_frames(key, "rgb") == len(source) == 12
        assert store.frame_size(key, "rgb") == (24, 32)
        assert store.fps(key, "rgb") == 15
        frames = store.read(key, "rgb", range(12))
        assert frames.dtype == np.uint8 and frames.shape == (12, 24, 32, 3)
        for stored, original in zip(frames, source):
            np.testing.assert_array_equal(stored, reference_jpeg_round_trip(original, 80))
        assert store.read_encoded(key, "rgb", [3, 4]) == [encode_jpeg(source[3], 80), encode_jpeg(source[4], 80)]


def test_reads_of_any_index_pattern_match_the_full_read(tmp_path):
    index = VideoIndex("x", ["a"], [VideoEntry("a/v.avi", 0, "train")])
    create_store(tmp_path, index)
    frames = np.random.default_rng(3).integers(0, 256, (20, 8, 10, 3), dtype=np.uint8)
    write_entry(tmp_path, "a/v.avi", "flow", [encode_jpeg(f, 90) for f in frames], fps=30.0)
    store = ClipStore(tmp_path)
    full = store.read("a/v.avi", "flow", np.arange(20))
    for indices in ([5], [19, 0, 7], [2, 2, 3, 3, 3, 19], list(range(0, 20, 3)), np.array([4, 5, 6, 9], np.int32)):
        np.testing.assert_array_equal(store.read("a/v.avi", "flow", indices), full[np.asarray(indices)])
    assert store.read("a/v.avi", "flow", []).shape == (0, 8, 10, 3)
    with pytest.raises(DataError, match="20 frames"):
        store.read("a/v.avi", "flow", [20])
    with pytest.raises(DataError, match="a/v.avi"):
        store.read("a/v.avi", "rgb", [0])  # the view was never built
    with pytest.raises(DataError, match="no entry"):
        store.num_frames("b/w.avi", "flow")


def test_failed_videos_are_counted_and_listed_and_the_run_goes_on(tmp_path):
    index = make_dataset(tmp_path / "videos", 4)
    bad = index.entries[1].path
    (tmp_path / "videos" / bad).write_bytes(os.urandom(4000))
    summary = build_store(index, tmp_path / "videos", tmp_path / "store", short_side=24, workers=2)
    assert summary.done == 3 and summary.skipped == 0
    assert [key for key, _ in summary.failed] == [bad]
    assert "VideoDecodeError" in summary.failed[0][1] and bad in summary.failed[0][1]
    assert f"failed: {bad}" in str(summary) and "frames/s" in str(summary)
    store = ClipStore(tmp_path / "store")
    assert [store.has(e.path, "rgb") for e in index.entries] == [True, False, True, True]
    again = build_store(index, tmp_path / "videos", tmp_path / "store", short_side=24, workers=1)
    assert (again.done, again.skipped, [k for k, _ in again.failed]) == (0, 3, [bad])


def test_missing_videos_stop_the_build_before_any_work(tmp_path):
    index = make_dataset(tmp_path / "videos", 2)
    (tmp_path / "videos" / index.entries[0].path).unlink()
    with pytest.raises(DataError, match=re.escape(index.entries[0].path)):
        build_store(index, tmp_path / "videos", tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_a_synthetic_store_is_not_taken_over_by_decoded_videos(tmp_path):
    """`coclr data store` on a `coclr data synth` store replaced its index and recorded both datasets' settings,
    exit 0; it is refused before any write."""
    from coclr.synth import generate_synthetic
    from coclr.synth.config import SynthConfig

    generate_synthetic(tmp_path / "synth", SynthConfig(train_scenes=1, test_scenes=1, num_classes=2,
                                                       actions_per_scene=2, clips_per_action=1, frames=8), workers=0)
    before = {path: path.read_bytes() for path in (tmp_path / "synth").rglob("*") if path.is_file()}
    index = make_dataset(tmp_path / "videos", 2)
    with pytest.raises(DataError, match="holds a store whose rgb frames `coclr data synth` wrote, not decoded videos"):
        build_store(index, tmp_path / "videos", tmp_path / "synth")
    assert {path: path.read_bytes() for path in (tmp_path / "synth").rglob("*") if path.is_file()} == before
    (tmp_path / "synth" / "store.json").write_text('{"format": "coclr-clip-store", "version": 2, "meta": "x"}')
    for argv in (["data", "info", str(tmp_path / "synth")],):  # (a traceback: 'str' object has no attribute 'items')
        assert main(argv) == 2


def test_create_store_is_idempotent_and_refuses_another_index(tmp_path):
    index = VideoIndex("x", ["a"], [VideoEntry("a/1.avi", 0, "train")])
    create_store(tmp_path, index, short_side=128)
    create_store(tmp_path, index, short_side=128, flow_backend="tvl1")
    assert ClipStore(tmp_path).meta == {"short_side": 128, "flow_backend": "tvl1"}
    with pytest.raises(DataError, match="--short-side=128"):
        create_store(tmp_path, index, short_side=112)
    with pytest.raises(DataError, match=r"--short-side=128 \(given 0 \(the decoded size\)\);"):  # (it was "null")
        create_store(tmp_path, index, short_side=None)
    (tmp_path / LOCK_FILE).unlink()
    before = (tmp_path / "store.json").stat().st_mtime_ns
    create_store(tmp_path, index, short_side=128)  # every key recorded: only read, so a read-only store will do
    assert not (tmp_path / LOCK_FILE).exists() and (tmp_path / "store.json").stat().st_mtime_ns == before
    other = VideoIndex("x", ["a"], [VideoEntry("a/2.avi", 0, "train")])
    with pytest.raises(DataError, match="different index"):
        create_store(tmp_path, other)
    with pytest.raises(DataError, match="not a clip store"):
        ClipStore(tmp_path / "nowhere")


def _add_key_when_all_are_ready(root: Path, index: VideoIndex, key: str, barrier) -> None:
    barrier.wait()
    create_store(root, index, **{key: key})


@pytest.mark.skipif(sys.platform == "win32", reason="the metadata lock is flock (POSIX)")
def test_stores_updated_at_the_same_time_keep_every_key(tmp_path):
    """Processes that add metadata to one store at once (two flow views extracted side by side) each read,
    update and rewrite store.json; without the lock, the last writer drops the keys of the others."""
    index = VideoIndex("x", ["a"], [VideoEntry("a/1.avi", 0, "train")])
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    processes = 6
    for attempt in range(8):
        root = tmp_path / f"store{attempt}"
        create_store(root, index, short_side=128)
        barrier = context.Barrier(processes)
        workers = [context.Process(target=_add_key_when_all_are_ready, args=(root, index, f"key{n}", barrier))
                   for n in range(processes)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert [worker.exitcode for worker in workers] == [0] * processes
        assert ClipStore(root).meta == {"short_side": 128, **{f"key{n}": f"key{n}" for n in range(processes)}}


class FramesOfKey:
    """A picklable test job: ``count`` frames whose grey value is the key's number; fails on "bad" keys."""

    def __init__(self, count: int = 3) -> None:
        self.count = count

    def __call__(self, key: str) -> tuple[list[bytes], float]:
        if "bad" in key:
            raise ValueError(f"cannot make {key}")
        value = int(re.sub(r"\D", "", key))
        return [encode_jpeg(np.full((8, 8, 3), value, np.uint8), 95)] * self.count, 10.0


class ExitOnKey(FramesOfKey):
    """A job whose worker process dies on one key (as on a segfault or the out-of-memory killer)."""

    def __call__(self, key: str) -> tuple[list[bytes], float]:
        if key == "k/3":
            os._exit(3)
        return super().__call__(key)


class PidOfKey(FramesOfKey):
    """A job that notes the process each key ran in (visible here only when it ran in this process)."""

    def __init__(self) -> None:
        super().__init__()
        self.pids: list[int] = []

    def __call__(self, key: str) -> tuple[list[bytes], float]:
        self.pids.append(os.getpid())
        return super().__call__(key)


def test_workers_0_runs_every_job_in_this_process_as_dataloader(tmp_path):
    keys = ["k/1", "k/2", "k/3"]
    create_store(tmp_path, VideoIndex("x", ["k"], [VideoEntry(k, 0, "train") for k in keys]))
    job = PidOfKey()
    assert run_entry_jobs(tmp_path, "v", ["k/1", "k/2", "k/3"], job, workers=0).done == 3
    assert job.pids == [os.getpid()] * 3
    pooled = PidOfKey()
    assert run_entry_jobs(tmp_path, "w", ["k/1", "k/2", "k/3"], pooled, workers=2).done == 3
    assert pooled.pids == []  # ran in worker processes


def test_run_entry_jobs_writes_skips_and_lists_failures(tmp_path):
    keys = ["k/1", "k/2", "k/bad", "k/4"]
    create_store(tmp_path, VideoIndex("x", ["k"], [VideoEntry(k, 0, "train") for k in keys]))
    summary = run_entry_jobs(tmp_path, "synthetic", keys, FramesOfKey(), workers=1, desc="test")
    assert (summary.done, summary.skipped, summary.frames) == (3, 0, 9)
    assert summary.failed == [("k/bad", "ValueError: cannot make k/bad")]
    store = ClipStore(tmp_path)
    assert store.read("k/4", "synthetic", [0, 2])[:, 0, 0, 0].tolist() == [4, 4]
    assert run_entry_jobs(tmp_path, "synthetic", keys[:2], FramesOfKey(), workers=1).skipped == 2
    with pytest.raises(DataError, match="k/9"):
        run_entry_jobs(tmp_path, "synthetic", ["k/9"], FramesOfKey(), workers=1)
    with pytest.raises(TypeError, match="picklable"):
        run_entry_jobs(tmp_path, "synthetic", ["k/1"], lambda key: ([], 1.0), workers=1)
    with pytest.raises(DataError, match="view name"):
        run_entry_jobs(tmp_path, "../up", ["k/1"], FramesOfKey(), workers=1)


def test_a_job_that_knows_each_keys_frames_counts_frames_not_videos(tmp_path):
    """Nine 6-frame videos and one of 300: the bar stood at 80% (8 of 10 videos), under a second left, for 25 s."""
    from coclr.progress import observed

    keys = ["k/1", "k/2", "k/bad", "k/4"]
    create_store(tmp_path, VideoIndex("x", ["k"], [VideoEntry(k, 0, "train") for k in keys]))
    seen = []
    frames = {"k/1": 10, "k/2": 1, "k/bad": 300}  # (k/4: not told, counted as one)

    def weight(key):
        return frames[key]

    with observed(lambda desc, count, total, earlier=False: seen.append((count, total))):
        summary = run_entry_jobs(tmp_path, "w", keys, FramesOfKey(), workers=1, weight=weight)
    assert summary.done == 3 and len(summary.failed) == 1
    assert sorted(count for count, _ in seen if count) == [1, 1, 10, 300] and {t for _, t in seen} == {312}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_dying_worker_fails_only_its_entry(tmp_path, start_method):
    if start_method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {start_method} on this platform")
    keys = [f"k/{i}" for i in range(1, 7)]
    create_store(tmp_path, VideoIndex("x", ["k"], [VideoEntry(k, 0, "train") for k in keys]))
    summary = run_entry_jobs(tmp_path, "v", keys, ExitOnKey(), workers=2, start_method=start_method)
    # the keys in flight beside it (up to 2 a worker) failed with it, blamed for a death not theirs: each is run
    # again alone, and only the one whose own worker dies again fails
    assert summary.failed == [("k/3", "worker process died (crash or out of memory) while running this entry, "
                                      "alone in its pool")]
    assert summary.done == 5
    store = ClipStore(tmp_path)
    assert all(store.has(k, "v") for k in keys if k != "k/3") and not store.has("k/3", "v")


def test_write_entry_is_atomic_and_stale_partials_are_cleaned(tmp_path):
    keys = ["a/1", "a/2"]
    create_store(tmp_path, VideoIndex("x", ["a"], [VideoEntry(k, 0, "train") for k in keys]))
    write_entry(tmp_path, "a/1", "rgb", [encode_jpeg(np.zeros((4, 4, 3), np.uint8), 90)], fps=25)
    written = entry_path(tmp_path, "a/1", "rgb")
    assert sorted(p.name for p in written.parent.iterdir()) == [written.name]  # no temporary file left
    dead_pid = 2 ** 22 + 12345  # above the default pid_max of 4194304: no such process
    second = entry_path(tmp_path, "a/2", "rgb")
    second.parent.mkdir(parents=True, exist_ok=True)
    stale = second.parent / f".{second.name}.{dead_pid}.x1y2z3.partial"
    stale.write_bytes(b"half an entry")
    assert not ClipStore(tmp_path).has("a/2", "rgb")
    run_entry_jobs(tmp_path, "rgb", keys, FramesOfKey(), workers=1)
    assert not stale.exists()
    with pytest.raises(DataError, match="no frames"):
        write_entry(tmp_path, "a/1", "rgb", [], fps=25)


def test_verify_finds_missing_and_damaged_entries(tmp_path):
    keys = ["a/1", "a/2", "a/3", "a/4"]
    create_store(tmp_path, VideoIndex("x", ["a"], [VideoEntry(k, 0, "train") for k in keys]))
    frames = [encode_jpeg(np.full((8, 8, 3), v, np.uint8), 90) for v in (10, 20, 30)]
    for key in keys[:3]:
        write_entry(tmp_path, key, "rgb", frames, fps=25)
    store = ClipStore(tmp_path)
    assert store.verify("rgb", decode=True) == [("a/4", "missing")]
    truncated = entry_path(tmp_path, "a/1", "rgb")
    truncated.write_bytes(truncated.read_bytes()[:-10])
    zeroed = entry_path(tmp_path, "a/2", "rgb")
    data = bytearray(zeroed.read_bytes())
    data[-len(frames[2]):] = bytes(len(frames[2]))  # the last frame's bytes are destroyed, size unchanged
    zeroed.write_bytes(bytes(data))
    quick = dict(ClipStore(tmp_path).verify("rgb"))  # the checksums find the destroyed frame without decoding
    assert set(quick) == {"a/1", "a/2", "a/4"} and "size" in quick["a/1"] and "frame 2 checksum" in quick["a/2"]
    deep = dict(ClipStore(tmp_path).verify("rgb", decode=True))
    assert set(deep) == {"a/1", "a/2", "a/4"} and "frame 2" in deep["a/2"]


def _read_in_child(store: ClipStore) -> np.ndarray:
    return store.read("a/1", "rgb", [0, 1])


def test_store_is_picklable_for_dataloader_workers(tmp_path):
    create_store(tmp_path, VideoIndex("x", ["a"], [VideoEntry("a/1", 0, "train")]))
    frames = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    write_entry(tmp_path, "a/1", "rgb", [encode_jpeg(f, 90) for f in frames], fps=25)
    store = ClipStore(tmp_path)
    expected = store.read("a/1", "rgb", [0, 1])  # fills the header cache
    clone = pickle.loads(pickle.dumps(store))
    assert clone._headers == {} and clone.root == store.root
    with multiprocessing.get_context("fork").Pool(1) as pool:
        np.testing.assert_array_equal(pool.apply(_read_in_child, (store,)), expected)


def test_cli_index_store_info(tmp_path, capsys):
    index = make_dataset(tmp_path / "videos", 3, frames=6)
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"),
                 "--out", str(tmp_path / "index.json")]) == 0
    assert "2 classes, 3 videos" in capsys.readouterr().out
    assert len(VideoIndex.load(tmp_path / "index.json")) == len(index)
    assert main(["data", "store", "--index", str(tmp_path / "index.json"), "--root", str(tmp_path / "videos"),
                 "--out", str(tmp_path / "store"), "--short-side", "16", "--workers", "1"]) == 0
    assert "rgb: 3 done, 0 skipped" in capsys.readouterr().out
    assert main(["data", "info", str(tmp_path / "store"), "--verify", "--decode"]) == 0
    out = capsys.readouterr().out
    assert "3 videos, 2 classes" in out and "view 'rgb': 3/3 entries complete" in out and "0 damaged" in out
    (tmp_path / "videos" / index.entries[0].path).unlink()
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"),
                 "--out", str(tmp_path / "index2.json")]) == 0  # the folder scan finds the remaining two
    csv_file = tmp_path / "list.csv"
    csv_file.write_text("".join(f"{e.path},{e.label}\n" for e in index.entries))
    assert main(["data", "index", "--format", "csv", "--annotations", str(csv_file), "--root",
                 str(tmp_path / "videos"), "--out", str(tmp_path / "index3.json")]) == 2
    assert index.entries[0].path in capsys.readouterr().err
    assert main(["data", "index", "--format", "csv", "--annotations", str(csv_file), "--root",
                 str(tmp_path / "videos"), "--drop-missing", "--out", str(tmp_path / "index3.json")]) == 0
    assert len(VideoIndex.load(tmp_path / "index3.json")) == 2


def _store_command(index: Path, videos: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "coclr", "data", "store", "--index", str(index), "--root", str(videos),
            "--out", str(out), "--short-side", "32", "--quality", "85", "--workers", "2"]


@pytest.mark.slow
def test_killed_build_resumes_to_a_byte_identical_store(tmp_path):
    index = make_dataset(tmp_path / "videos", 40, frames=60, size=(60, 80))
    index.save(tmp_path / "index.json")
    reference = build_store(index, tmp_path / "videos", tmp_path / "reference", short_side=32, quality=85,
                            workers=1)
    assert reference.done == 40
    out = tmp_path / "store"
    process = subprocess.Popen(_store_command(tmp_path / "index.json", tmp_path / "videos", out),
                               cwd=REPO_ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            written = list((out / "rgb").rglob("*.frames")) if (out / "rgb").is_dir() else []
            if len(written) >= 3:
                break
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)  # the parent only: its workers must notice and stop
        process.wait()
        complete_at_kill = len(list((out / "rgb").rglob("*.frames")))
        assert 3 <= complete_at_kill < 40, "the build was not interrupted in the middle"
        killed = ClipStore(out)  # each entry written has its notes beside it (a replaced video is then told)
        written = [entry.path for entry in killed.index.entries if killed.has(entry.path, "rgb")]
        assert written and all(pending_notes_path(out, key, "rgb").is_file() or "sha256" in
                               killed.notes("rgb").get(key, {}) for key in written)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("worker processes outlived their killed parent")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    resumed = subprocess.run(_store_command(tmp_path / "index.json", tmp_path / "videos", out), cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    skipped = int(re.search(r"(\d+) skipped", resumed.stdout).group(1))
    assert skipped >= complete_at_kill
    store = ClipStore(out)
    assert store.verify("rgb", decode=True) == []
    assert not list(out.rglob("*.partial"))
    for key in store.keys():
        assert entry_path(out, key, "rgb").read_bytes() == entry_path(tmp_path / "reference", key, "rgb").read_bytes()
    assert store.notes("rgb") == ClipStore(tmp_path / "reference").notes("rgb")  # every note, none lost
    assert not list(out.rglob("*.notes"))


def test_a_video_name_of_255_bytes_does_not_break_the_store(tmp_path, capsys):
    """Entry files are named by a hash of the key: the longest name a file system holds (255 bytes) stores,
    resumes and is listed like any other, and the entry keeps its key."""
    index = make_dataset(tmp_path / "videos", 2, frames=6)
    long_name = "class0/" + "v" * 251 + ".avi"
    os.rename(tmp_path / "videos" / index.entries[0].path, tmp_path / "videos" / long_name)
    index = VideoIndex("toy", index.classes, [VideoEntry(long_name, 0, "train"), index.entries[1]])
    summary = build_store(index, tmp_path / "videos", tmp_path / "store", short_side=16, workers=1)
    assert (summary.done, summary.failed) == (2, [])
    store = ClipStore(tmp_path / "store")
    assert store.num_frames(long_name, "rgb") == 6 and len(store.entry_path(long_name, "rgb").name) < 64
    assert build_store(index, tmp_path / "videos", tmp_path / "store", short_side=16, workers=1).skipped == 2
    assert main(["data", "info", str(tmp_path / "store"), "--verify"]) == 0
    assert "2/2 entries complete" in capsys.readouterr().out


def test_an_updated_index_replaces_the_old_one_in_place_and_keeps_the_work_done(tmp_path, capsys):
    index = make_dataset(tmp_path / "videos", 5, frames=6)
    first = VideoIndex("toy", index.classes, index.entries[:4])
    build_store(first, tmp_path / "videos", tmp_path / "store", short_side=16, workers=1)
    entry = ClipStore(tmp_path / "store").entry_path(first.entries[1].path, "rgb")
    written = entry.stat().st_mtime_ns
    updated = VideoIndex("toy", index.classes, [index.entries[0], *index.entries[2:]])  # one removed, one added
    summary = build_store(updated, tmp_path / "videos", tmp_path / "store", short_side=16, workers=1)
    assert (summary.done, summary.skipped) == (1, 3)
    assert "1 video(s) added, 1 removed" in str(summary)
    store = ClipStore(tmp_path / "store")
    assert store.index == updated and store.unlisted("rgb") == [first.entries[1].path]
    assert entry.stat().st_mtime_ns == written  # the removed video's entry is kept, not rewritten
    with pytest.raises(DataError, match="different index"):  # other jobs never replace an index by mistake
        create_store(tmp_path / "store", first)
    with pytest.raises(DataError, match="--short-side=16 \\(given 24\\)"):
        build_store(updated, tmp_path / "videos", tmp_path / "store", short_side=24, workers=1)
    assert main(["data", "info", str(tmp_path / "store")]) == 0
    assert "1 entries of videos no longer in the index" in capsys.readouterr().out


def test_failures_are_recorded_in_the_store_and_cleared_when_the_entry_is_made(tmp_path):
    from coclr.store.clipstore import read_failures

    keys = ["k/1", "k/bad", "k/3"]
    create_store(tmp_path, VideoIndex("x", ["k"], [VideoEntry(k, 0, "train") for k in keys]))
    run_entry_jobs(tmp_path, "v", keys, FramesOfKey(), workers=1)
    assert read_failures(tmp_path, "v") == {"k/bad": "ValueError: cannot make k/bad"}
    assert ClipStore(tmp_path).failed("v") == {"k/bad": "ValueError: cannot make k/bad"}
    run_entry_jobs(tmp_path, "v", ["k/1"], FramesOfKey(), workers=1)  # a job that did not attempt it keeps it
    assert list(read_failures(tmp_path, "v")) == ["k/bad"]
    run_entry_jobs(tmp_path, "v", keys, FramesOfKeyFixed(), workers=1)
    assert read_failures(tmp_path, "v") == {} and ClipStore(tmp_path).has("k/bad", "v")


class FramesOfKeyFixed(FramesOfKey):
    """The job of FramesOfKey after its bug was fixed: "bad" keys give frames of value 0."""

    def __call__(self, key: str) -> tuple[list[bytes], float]:
        return super().__call__(key.replace("bad", "0"))


def test_a_second_job_on_a_view_is_refused_and_a_killed_jobs_lock_is_free(tmp_path):
    keys = ["k/1", "k/2"]
    create_store(tmp_path, VideoIndex("x", ["k"], [VideoEntry(k, 0, "train") for k in keys]))
    with view_locked_by_another_process(tmp_path, "v") as pid:
        with pytest.raises(DataError, match=rf"view 'v' is being written by another job \(pid {pid} on"):
            run_entry_jobs(tmp_path, "v", keys, FramesOfKey(), workers=1)
        assert not ClipStore(tmp_path).has("k/1", "v")
        assert run_entry_jobs(tmp_path, "other", keys, FramesOfKey(), workers=1).done == 2  # other views are free
    # The holder was killed with SIGKILL: the lock went with it.
    assert run_entry_jobs(tmp_path, "v", keys, FramesOfKey(), workers=1).done == 2


def _write_version_1_store(root: Path, frames: list[bytes]) -> None:
    """A store as the first format wrote it: entries at <view>/<key>.frames, no key in the entry header."""
    import json
    import struct

    index = VideoIndex("old", ["a"], [VideoEntry("a/1.avi", 0, "train"), VideoEntry("a/2.avi", 0, "train")])
    root.mkdir()
    index.save(root / "index.json")
    (root / "store.json").write_text(json.dumps({"format": "coclr-clip-store", "version": 1, "meta": {}}))
    header = struct.pack("<8sIIIId", b"COCLRFRM", 1, len(frames), 8, 8, 25.0)
    start = len(header) + 8 * (len(frames) + 1)
    offsets = np.cumsum([start] + [len(f) for f in frames]).astype("<u8")
    (root / "rgb" / "a").mkdir(parents=True)
    (root / "rgb" / "a" / "1.avi.frames").write_bytes(header + offsets.tobytes() + b"".join(frames))


def test_stores_of_the_first_version_are_read_and_resumed(tmp_path):
    frames = [encode_jpeg(np.full((8, 8, 3), v, np.uint8), 95) for v in (40, 80)]
    _write_version_1_store(tmp_path / "old", frames)
    store = ClipStore(tmp_path / "old")
    assert store.version == 1 and store.verify("rgb") == [("a/2.avi", "missing")]
    assert store.read("a/1.avi", "rgb", [1])[0, 0, 0, 0] == decode_jpeg(frames[1])[0, 0, 0]
    run_entry_jobs(tmp_path / "old", "rgb", store.keys(), FramesOfKey(), workers=1)  # resumes in its own layout
    assert (tmp_path / "old" / "rgb" / "a" / "2.avi.frames").is_file()
    assert ClipStore(tmp_path / "old").verify("rgb", decode=True) == []


def test_a_frame_rate_no_video_can_be_decoded_at_is_refused_before_any_write(tmp_path, capsys):
    from coclr.cli import main
    from coclr.config import from_dict
    from coclr.errors import ConfigError
    from coclr.synth import SynthConfig
    from test_embed import moving_square, write_video

    write_video(tmp_path / "videos" / "v.mp4", moving_square(8))
    assert main(["data", "index", "--format", "folder", "--unlabelled", "--root", str(tmp_path / "videos"), "--out",
                 str(tmp_path / "index.json")]) == 0
    for fps in ("1e-300", "5000"):  # a division by zero per video; copies of every frame
        assert main(["data", "store", "--index", str(tmp_path / "index.json"), "--root", str(tmp_path / "videos"),
                     "--out", str(tmp_path / "store"), "--fps", fps]) == 2
        assert "fps: must be a number between 0.01 and 1000.0 frames per second" in capsys.readouterr().err
    assert main(["data", "store", "--index", str(tmp_path / "index.json"), "--root", str(tmp_path / "videos"),
                 "--out", str(tmp_path / "store"), "--workers", "-1"]) == 2  # not one worker, silently
    assert "workers: must be 0 or more" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()
    with pytest.raises(ConfigError, match="fps: must be a number between 0.01 and 1000.0"):
        from_dict(SynthConfig, {"fps": 0.001})


def test_an_interrupted_build_keeps_what_its_entries_noted(tmp_path, monkeypatch):
    """Ctrl-C recorded no notes (they were written when the job ended): a video replaced after it was decoded then
    went unseen by every later run."""
    from coclr.store import build as module
    from test_embed import moving_square, write_video

    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(8, seed=number))
    index = VideoIndex("videos", [], [VideoEntry(f"v{number}.mp4", None, "train", None) for number in range(3)])
    decode = module.DecodeVideoJob.__call__

    def stopped_at_the_third(self, key):
        if key == "v2.mp4":
            raise KeyboardInterrupt
        return decode(self, key)

    monkeypatch.setattr(module.DecodeVideoJob, "__call__", stopped_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        build_store(index, tmp_path / "videos", tmp_path / "store", short_side=32, workers=0)
    assert set(ClipStore(tmp_path / "store").notes("rgb")) == {"v0.mp4", "v1.mp4"}
    monkeypatch.setattr(module.DecodeVideoJob, "__call__", decode)
    write_video(tmp_path / "videos" / "v0.mp4", moving_square(12, seed=5))  # replaced after it was decoded
    summary = build_store(index, tmp_path / "videos", tmp_path / "store", short_side=32, workers=0)
    assert "1 video(s) changed since they were decoded" in str(summary)
    assert ClipStore(tmp_path / "store").num_frames("v0.mp4", "rgb") == 12


def two_videos_with_flow(tmp_path) -> tuple[Path, list[str]]:
    """Two small videos in ``tmp_path/videos``, stored with their DIS flow in ``tmp_path/store``; returns the store
    and the command line of ``coclr data store`` that made it."""
    from coclr.cli import main
    from test_embed import moving_square, write_video

    for number in range(2):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(8, seed=number))
    index, store = tmp_path / "index.json", tmp_path / "store"
    assert main(["data", "index", "--format", "folder", "--unlabelled", "--root", str(tmp_path / "videos"), "--out",
                 str(index)]) == 0
    command = ["data", "store", "--index", str(index), "--root", str(tmp_path / "videos"), "--out", str(store),
               "--short-side", "32", "--workers", "0"]
    assert main(command) == 0 and main(["flow", str(store), "--backend", "dis", "--workers", "0"]) == 0
    return store, command


def test_a_video_changed_since_it_was_decoded_is_decoded_again_and_its_flow_removed(tmp_path, capsys):
    from coclr.cli import main
    from coclr.store.clipstore import ClipStore
    from test_embed import moving_square, write_video

    store, command = two_videos_with_flow(tmp_path)
    write_video(tmp_path / "videos" / "v0.mp4", moving_square(12, seed=5))  # rewritten in place: 12 frames, not 8
    capsys.readouterr()
    assert main(command) == 0
    printed = capsys.readouterr().out
    assert "1 video(s) changed since they were decoded" in printed and "rgb: 1 done, 1 skipped" in printed
    clips = ClipStore(store)
    assert clips.num_frames("v0.mp4", "rgb") == 12 and clips.num_frames("v1.mp4", "rgb") == 8
    assert not clips.has("v0.mp4", "flow_dis") and clips.has("v1.mp4", "flow_dis")  # its flow is computed again
    assert main(command) == 0 and "rgb: 0 done, 2 skipped" in capsys.readouterr().out  # the same command: nothing
    # While a flow job writes its view, a video changed since: its flow would be computed from the frames removed
    # (and kept, stale, for good). Refused, untouched; with nothing changed, the two go on side by side.
    from conftest import view_locked_by_another_process

    write_video(tmp_path / "videos" / "v1.mp4", moving_square(10, seed=6))
    before = {path: path.read_bytes() for path in store.rglob("*") if path.is_file() and "lock" not in path.name}
    with view_locked_by_another_process(store, "flow_dis"):
        assert main(command) == 2
        assert "view 'flow_dis' is being written by another job" in capsys.readouterr().err
        assert {path: path.read_bytes() for path in store.rglob("*")
                if path.is_file() and "lock" not in path.name} == before
    assert main(command) == 0 and "1 video(s) changed" in capsys.readouterr().out
    with view_locked_by_another_process(store, "flow_dis"):
        assert main(command) == 0  # nothing changed: the flow job's view is not touched


def test_a_kill_while_a_changed_videos_entries_are_removed_leaves_its_flow_found(tmp_path, capsys, monkeypatch):
    """The entries of a changed video were removed view by view in name order: a flow view named after "rgb"
    ("tvl1", "zflow") lost its entry after the rgb view did, and a kill between the two left the old flow, which the
    next run (seeing no rgb entry, so no change) and the flow job (seeing a whole entry) kept for good. The rgb
    entry goes last: a kill leaves it, and the next run finds the video changed again."""
    from pathlib import Path as PathType

    from coclr.cli import main
    from coclr.store.clipstore import ClipStore
    from test_embed import moving_square, write_video

    store, command = two_videos_with_flow(tmp_path)
    assert main(["flow", str(store), "--backend", "dis", "--workers", "0", "--view", "zflow"]) == 0
    write_video(tmp_path / "videos" / "v0.mp4", moving_square(12, seed=5))
    unlink = PathType.unlink
    removed: list[PathType] = []

    def killed_after_the_second(path, missing_ok=False):
        unlink(path, missing_ok=missing_ok)
        removed.append(path)
        if sum(p.suffix == ".frames" for p in removed) == 2:
            raise KeyboardInterrupt  # (the kill, right after two of its three entries are gone)

    monkeypatch.setattr(PathType, "unlink", killed_after_the_second)
    with pytest.raises(KeyboardInterrupt):
        from coclr.store.build import build_store
        from coclr.video.indexes import VideoIndex

        build_store(VideoIndex.load(tmp_path / "index.json"), tmp_path / "videos", store, short_side=32, workers=0)
    monkeypatch.setattr(PathType, "unlink", unlink)
    clips = ClipStore(store)
    assert clips.has("v0.mp4", "rgb")  # (the rgb entry is the last one removed)
    capsys.readouterr()
    assert main(command) == 0 and "1 video(s) changed since they were decoded" in capsys.readouterr().out
    clips = ClipStore(store)
    assert clips.num_frames("v0.mp4", "rgb") == 12
    assert not clips.has("v0.mp4", "zflow") and not clips.has("v0.mp4", "flow_dis")


def test_a_video_touched_or_copied_keeps_its_entry_and_its_flow(tmp_path, capsys):
    """``touch``, ``cp`` or ``rsync`` without its times: the same content with another modification time was
    decoded again and every video's flow removed (hours of TV-L1 on UCF101)."""
    import os
    import shutil

    from coclr.cli import main
    from test_embed import moving_square, write_video

    store, command = two_videos_with_flow(tmp_path)
    flow = {path: path.read_bytes() for path in (store / "flow_dis").rglob("*.frames")}
    os.utime(tmp_path / "videos" / "v0.mp4", ns=(1, 1))  # touched
    shutil.copyfile(tmp_path / "videos" / "v1.mp4", tmp_path / "copy.mp4")  # copied back without its times
    (tmp_path / "copy.mp4").replace(tmp_path / "videos" / "v1.mp4")
    capsys.readouterr()
    assert main(command) == 0
    printed = capsys.readouterr().out
    assert "changed since they were decoded" not in printed and "rgb: 0 done, 2 skipped" in printed
    assert {path: path.read_bytes() for path in (store / "flow_dis").rglob("*.frames")} == flow
    assert main(command) == 0  # noted again: the next run compares no content
    write_video(tmp_path / "videos" / "v0.mp4", moving_square(8, seed=7))  # the same size, other frames
    assert main(command) == 0 and "1 video(s) changed since they were decoded" in capsys.readouterr().out


def test_a_video_decoded_by_a_killed_job_is_noted_whole_by_the_next(tmp_path, capsys):
    """``kill -9`` of `data store` lost the content sha256 of the videos it had decoded (the job notes it as it ends):
    a later ``touch`` of one decoded it again and removed its flow. The next run notes it, from the file that is
    still the one noted before decoding."""
    import os

    from coclr.cli import main
    from coclr.store.clipstore import ClipStore, record_notes

    store, command = two_videos_with_flow(tmp_path)
    note = ClipStore(store).notes("rgb")["v0.mp4"]
    killed = {key: value for key, value in note.items() if key != "sha256"}  # what a killed job leaves noted
    record_notes(store, "rgb", ["v0.mp4"], {"v0.mp4": killed})
    assert main(command) == 0  # nothing to decode: the lost sha256 noted again
    assert ClipStore(store).notes("rgb")["v0.mp4"] == note
    flow = {path: path.read_bytes() for path in (store / "flow_dis").rglob("*.frames")}
    os.utime(tmp_path / "videos" / "v0.mp4", ns=(1, 1))  # touched
    capsys.readouterr()
    assert main(command) == 0
    assert "changed since they were decoded" not in capsys.readouterr().out
    assert {path: path.read_bytes() for path in (store / "flow_dis").rglob("*.frames")} == flow


def test_a_store_whose_first_job_was_killed_notes_every_sha256_on_the_next_run(tmp_path, capsys):
    """A first job killed before it noted anything left only the notes made before decoding: no sha256 anywhere, so
    the store was taken for one from before sha256 were noted and never mended (a touch then removed flow)."""
    import os

    from coclr.cli import main
    from coclr.store.build import HASHED
    from coclr.store.clipstore import ClipStore, record_notes

    store, command = two_videos_with_flow(tmp_path)
    notes = ClipStore(store).notes("rgb")
    record_notes(store, "rgb", list(notes), {})  # the job's notes lost with it (an earlier version's job) ...
    record_notes(store, "rgb", [], {key: {"source": note["source"], HASHED: True}  # ... but for those it made
                                    for key, note in notes.items()})  # before decoding
    assert not any("sha256" in note for note in ClipStore(store).notes("rgb").values())
    assert main(command) == 0
    assert {key: note["sha256"] for key, note in ClipStore(store).notes("rgb").items()} == {
        key: note["sha256"] for key, note in notes.items()}
    flow = {path: path.read_bytes() for path in (store / "flow_dis").rglob("*.frames")}
    os.utime(tmp_path / "videos" / "v1.mp4", ns=(1, 1))  # touched
    capsys.readouterr()
    assert main(command) == 0
    assert "changed since they were decoded" not in capsys.readouterr().out
    assert {path: path.read_bytes() for path in (store / "flow_dis").rglob("*.frames")} == flow


def test_the_test_split_of_a_folder_keeps_its_videos_as_videos_are_added(tmp_path, capsys):
    """--test-fraction took the first round(fraction x groups) in hash order: adding two videos moved a video the
    encoder had trained on into the test split, without a word."""
    from coclr.store.clipstore import ClipStore, create_store
    from coclr.video.indexes import split_by_group

    def index(count: int) -> VideoIndex:
        return split_by_group(VideoIndex("f", ["a"], [VideoEntry(f"a/v{n:02d}.mp4", 0, "train", None)
                                                      for n in range(count)]), 0.3)

    for count in range(2, 40):
        before = {e.path: e.split for e in index(count).entries}
        after = {e.path: e.split for e in index(count + 2).entries}
        moved = [path for path, split in before.items() if after[path] != split]
        assert all(before[path] == "test" for path in moved) or sum(s == "test" for s in before.values()) == \
            count - 1, (count, moved)  # only the guard of a class all in test may move to test
        assert 0 < sum(s == "test" for s in after.values()) < count + 2
    fractions = [sum(e.split == "test" for e in index(400).entries) / 400]
    assert 0.25 < fractions[0] < 0.35
    # An index whose update moves a video from train to test says so (an old index, or another seed).
    create_store(tmp_path / "store", index(10))
    other = split_by_group(VideoIndex("f", ["a"], [VideoEntry(f"a/v{n:02d}.mp4", 0, "train", None)
                                                   for n in range(10)]), 0.3, seed=1)
    update = create_store(tmp_path / "store", other, replace_index=True)
    assert update.from_train and "moved from the train split to the test split" in str(update)
    assert ClipStore(tmp_path / "store").index.to_dict() == other.to_dict()
    # to val (Kinetics is evaluated on it: --test-split val) the move was said nothing of
    trained = next(e.path for e in other.entries if e.split == "train")
    val = VideoIndex("f", ["a"], [VideoEntry(e.path, 0, "val" if e.path == trained else e.split, None)
                                  for e in other.entries])
    update = create_store(tmp_path / "store", val, replace_index=True)
    assert update.from_train == ((trained, "val"),) and "to the val split" in str(update)


def test_an_index_that_numbers_the_classes_otherwise_says_so(tmp_path):
    """HMDB51's classes were once ordered by their split files' names: an index made again numbers climb and
    climb_stairs the other way, and the store took it without a word."""
    from coclr.store.clipstore import create_store

    entries = [("climb/a.avi", "climb"), ("climb_stairs/b.avi", "climb_stairs"), ("kick/c.avi", "kick")]

    def index(classes: list[str]) -> VideoIndex:
        return VideoIndex("h", classes, [VideoEntry(path, classes.index(name), "train", None)
                                         for path, name in entries])

    create_store(tmp_path / "store", index(["climb_stairs", "climb", "kick"]))
    update = create_store(tmp_path / "store", index(["climb", "climb_stairs", "kick"]), replace_index=True)
    assert set(update.relabelled) == {"climb/a.avi", "climb_stairs/b.avi"}
    assert "2 video(s) have another class than before (its number or name; e.g. " in str(update)
    assert not create_store(tmp_path / "store", index(["climb", "climb_stairs", "kick"]), replace_index=True)
    # a class renamed keeps its number: taken without a word
    renamed = VideoIndex("h", ["climb", "climb_stairs", "kicking"], [VideoEntry(path, ["climb", "climb_stairs",
                         "kick"].index(name), "train", None) for path, name in entries])
    assert create_store(tmp_path / "store", renamed, replace_index=True).relabelled == ("kick/c.avi",)


def test_a_store_that_may_not_be_written_stops_the_job_blaming_no_video(tmp_path, capsys, monkeypatch):
    """A store folder the user may not write (another owner's, a read-only mount): every video was decoded, then
    listed as failed ("PermissionError"), exit 3, and training told it had left them out."""
    import errno

    from coclr.cli import main
    from coclr.store import clipstore
    from test_embed import moving_square, write_video

    for number in range(3):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(8, seed=number))
    index, store = tmp_path / "index.json", tmp_path / "store"
    assert main(["data", "index", "--format", "folder", "--unlabelled", "--root", str(tmp_path / "videos"), "--out",
                 str(index)]) == 0
    opened = clipstore.atomic_open

    def refused(path, *args, **kwargs):
        if str(path).endswith(clipstore.ENTRY_SUFFIX):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(clipstore, "atomic_open", refused)
    capsys.readouterr()
    assert main(["data", "store", "--index", str(index), "--root", str(tmp_path / "videos"), "--out", str(store),
                 "--short-side", "32", "--workers", "0"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "decoding videos" not in line]
    assert len(err) == 1 and "Permission denied (EACCES): the store may not be written there" in err[0], err
    assert "3 entries left: make the store's folders writable" in err[0]
    assert not (store / "failed_rgb.json").exists()


def test_a_view_named_as_one_of_the_stores_files_is_refused_before_any_work(tmp_path, capsys):
    """`coclr flow --view failed_rgb.json` made that folder, and every later `data store` failed on it after
    decoding."""
    from coclr.cli import main
    from test_eval_helpers import make_tiny_store

    store = make_tiny_store(tmp_path / "store", train_per_class=1, test_per_class=1, frames=8)
    before = sorted(path.name for path in store.iterdir())
    assert main(["flow", str(store), "--backend", "dis", "--view", "failed_rgb.json", "--workers", "0"]) == 2
    assert "a name ending in .json is one of the store's own files" in capsys.readouterr().err
    assert sorted(path.name for path in store.iterdir()) == before


def test_an_anamorphic_video_is_stored_as_coded_and_its_aspect_noted(tmp_path):
    """Pixels twice as wide as high: the entry holds the coded frames (as the reference's frame extraction), and the
    notes give the aspect a player would apply (nothing was noted); square pixels note nothing."""
    from fractions import Fraction

    from test_video import write_anamorphic, write_turned

    frames = np.random.default_rng(0).integers(0, 256, (4, 24, 16, 3), dtype=np.uint8)
    (tmp_path / "videos").mkdir()
    write_anamorphic(tmp_path / "videos" / "wide.mp4", frames, Fraction(2))
    write_turned(tmp_path / "videos" / "square.mkv", frames)
    index = VideoIndex("f", ["a"], [VideoEntry("wide.mp4", 0, "train"), VideoEntry("square.mkv", 0, "train")])
    build_store(index, tmp_path / "videos", tmp_path / "store", short_side=16, workers=0)
    store = ClipStore(tmp_path / "store")
    assert store.read("wide.mp4", "rgb", range(4)).shape == store.read("square.mkv", "rgb", range(4)).shape
    notes = store.notes("rgb")
    assert notes["wide.mp4"]["pixel_aspect"] == "2" and "pixel_aspect" not in notes.get("square.mkv", {})


def test_what_a_job_killed_after_writing_an_entry_noted_is_recorded_by_the_next(tmp_path, capsys):
    """``kill -9`` between an entry's write and the job's record of its notes (at its end) lost the turn and the
    damaged frames of the video for good: the next run skipped the entry. The notes are written beside the entry
    before it is put in place, and the next run records them."""
    from coclr.store.build import DecodeVideoJob
    from coclr.store.clipstore import pending_notes_path
    from coclr.store.jobs import _run_and_write
    from test_video import write_turned

    frames = np.random.default_rng(0).integers(0, 256, (6, 24, 32, 3), dtype=np.uint8)
    (tmp_path / "videos").mkdir()
    for name in ("turned.mp4", "plain.mp4"):
        write_turned(tmp_path / "videos" / name, frames, degrees=-90 if name == "turned.mp4" else None,
                     codec="libx264")
    index = VideoIndex("f", ["a"], [VideoEntry("turned.mp4", 0, "train"), VideoEntry("plain.mp4", 0, "train")])
    whole = build_store(index, tmp_path / "videos", tmp_path / "whole", short_side=16, workers=0)
    expected = ClipStore(tmp_path / "whole").notes("rgb")
    assert whole.done == 2 and expected["turned.mp4"]["rotation"] == 90
    assert not list((tmp_path / "whole").rglob("*.notes"))  # recorded, not left beside the entries
    # A job killed after the worker wrote the first entry, before the job recorded anything:
    create_store(tmp_path / "killed", index, short_side=16, quality=90, fps=None)
    job = DecodeVideoJob(str((tmp_path / "videos").resolve()), 16, 90, None)
    assert _run_and_write(str(tmp_path / "killed"), "rgb", "turned.mp4", job)[2] is None
    assert pending_notes_path(tmp_path / "killed", "turned.mp4", "rgb").is_file()
    assert "turned.mp4" not in ClipStore(tmp_path / "killed").notes("rgb")
    resumed = build_store(index, tmp_path / "videos", tmp_path / "killed", short_side=16, workers=0)
    assert (resumed.done, resumed.skipped) == (1, 1)
    assert ClipStore(tmp_path / "killed").notes("rgb") == expected
    assert not list((tmp_path / "killed").rglob("*.notes"))


def test_a_store_job_says_what_it_changed_before_decoding(tmp_path, capsys):
    """A video moved from the train split to the test split was said only in the summary at the end: a job
    interrupted while decoding never said it, and the next found the index in place (nothing to say)."""
    from coclr.store.build import DecodeVideoJob

    index = make_dataset(tmp_path / "videos", 2, frames=6)
    build_store(index, tmp_path / "videos", tmp_path / "store", short_side=16, workers=0)
    moved = VideoIndex("toy", index.classes, [VideoEntry(e.path, e.label, "test") for e in index.entries])
    said: list[str] = []

    def interrupting(self, key):
        raise KeyboardInterrupt

    original = DecodeVideoJob.__call__
    for entry in index.entries:  # (entries to decode again)
        entry_path(tmp_path / "store", entry.path, "rgb").unlink()
    DecodeVideoJob.__call__ = interrupting
    try:
        with pytest.raises(KeyboardInterrupt):
            build_store(moved, tmp_path / "videos", tmp_path / "store", short_side=16, workers=0,
                        announce=said.append)
    finally:
        DecodeVideoJob.__call__ = original
    assert len(said) == 1 and "1 video(s) moved from the train split to the test split" in said[0]
    summary = build_store(moved, tmp_path / "videos", tmp_path / "store", short_side=16, workers=0)
    assert summary.done == 2 and not summary.notes  # the index was in place: nothing more to say


def test_a_refused_store_job_reads_no_video_through_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """A job refused for another --quality first hashed every video whose modification time had changed (all of
    them after a ``cp -r``) and rewrote the store's notes."""
    import coclr.store.build as build

    index = make_dataset(tmp_path / "videos", 2, frames=6)
    build_store(index, tmp_path / "videos", tmp_path / "store", short_side=16, workers=0)
    for entry in index.entries:
        os.utime(tmp_path / "videos" / entry.path, ns=(1, 1))  # touched
    before = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in (tmp_path / "store").rglob("*")
              if path.is_file() and "lock" not in path.name}
    hashed = []
    monkeypatch.setattr(build, "file_sha256", lambda path: hashed.append(path) or "0")
    with pytest.raises(DataError, match="--quality=90 \\(given 80\\)"):
        build_store(index, tmp_path / "videos", tmp_path / "store", short_side=16, quality=80, workers=0)
    assert not hashed
    assert {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in (tmp_path / "store").rglob("*")
            if path.is_file() and "lock" not in path.name} == before


def test_info_counts_the_failures_of_the_videos_indexed(tmp_path, capsys):
    """Failures recorded for videos since dropped from the index were counted with the index's: "6/7 complete",
    then "2 failed" where one of the seven had."""
    from coclr.store.clipstore import record_failures

    index = make_dataset(tmp_path / "videos", 3, frames=6)
    build_store(index, tmp_path / "videos", tmp_path / "store", short_side=16, workers=0)
    record_failures(tmp_path / "store", "rgb", [], [("gone/video.avi", "VideoDecodeError: broken"),
                                                    (index.entries[0].path, "VideoDecodeError: broken")])
    capsys.readouterr()
    main(["data", "info", str(tmp_path / "store")])
    out = capsys.readouterr().out
    assert "    1 failed, 1 of them damaged entries" in out, out


def _sweeping_rank(rank: int, world: int, port: int, root: str) -> None:
    """A rank of a 2-process job whose rank 0, once writing, holds a temporary file under a pid no process of this
    machine has (a live writer on another machine of a shared file system); rank 1 then starts its part."""
    import torch.distributed as dist

    from coclr.store.jobs import run_entry_stream

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    foreign = Path(root) / "rgb" / "ab" / f".{'ab' * 16}.frames.{2 ** 22 + 7}.x1y2z3.partial"
    started = Path(root) / "rank1-started"

    def stream(todo, record):
        if rank == 0:
            foreign.parent.mkdir(parents=True, exist_ok=True)
            foreign.write_bytes(b"an entry being written")
            (Path(root) / "rank0-writing").touch()
            deadline = time.monotonic() + 60
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert foreign.exists(), "a rank removed another machine's entry as it was written"
        else:
            started.touch()
        for key in todo:
            record(key, 0, None)

    if rank == 1:  # it starts its part (reads what failed before) once rank 0 writes
        failed = ClipStore.failed

        def later(self, view):
            deadline = time.monotonic() + 60
            while not (Path(root) / "rank0-writing").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            return failed(self, view)

        ClipStore.failed = later
    run_entry_stream(root, "rgb", ["a/1", "a/2"], stream)
    dist.destroy_process_group()


def test_no_rank_removes_what_another_machine_writes(tmp_path):
    """Each rank of a job over machines removed the temporary files of killed writers as it started, taking a live
    writer on another machine for dead (its pid is not one of this machine's): that entry failed. Only the process
    that takes the view's lock sweeps, before any rank writes."""
    import torch.multiprocessing as mp

    from test_train_distributed import free_port

    create_store(tmp_path, VideoIndex("x", ["a"], [VideoEntry(k, 0, "train") for k in ("a/1", "a/2")]))
    mp.spawn(_sweeping_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)


def test_a_view_stopped_before_its_first_entry_is_listed(tmp_path):
    """Ctrl-C before a flow job's first entry left its settings recorded, refusing any other, while `data info` and
    `data verify --view flow` said there was no such view."""
    from coclr.store.jobs import writing_view

    create_store(tmp_path, VideoIndex("x", ["k"], [VideoEntry("k/1", 0, "train")]))
    with pytest.raises(KeyboardInterrupt), writing_view(tmp_path, "flow", ClipStore(tmp_path).index, flow_bound=5.0):
        raise KeyboardInterrupt
    assert "flow" in ClipStore(tmp_path).views() and ClipStore(tmp_path).meta["flow_bound"] == 5.0
