"""Flow extraction into a clip store: frame counts, direction of motion, resuming, a kill in the middle, and
errors on bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from coclr.cli import main as cli_main
from coclr.errors import ConfigError, DataError
from coclr.flow.encode import uint8_to_flow
from coclr.flow.params import TVL1Params
from coclr.store.clipstore import ClipStore, create_store, entry_path, write_entry
from coclr.store.flow_extract import extract_flow, resolve_backend
from coclr.store.jpeg import encode_jpeg
from coclr.threads import opencv_threads
from coclr.video.indexes import VideoEntry, VideoIndex
from conftest import view_locked_by_another_process

REPO = Path(__file__).resolve().parents[1]
FAST_TVL1 = TVL1Params(nscales=3, warps=2, outer_iterations=3, inner_iterations=10)
FAST_OVERRIDES = ["nscales=3", "warps=2", "outer_iterations=3", "inner_iterations=10"]


def moving_texture(frames: int, dx: int, dy: int, height: int = 48, width: int = 64, seed: int = 0) -> np.ndarray:
    """RGB frames ``uint8 [frames, H, W, 3]`` of a smooth texture whose content moves by (dx, dy) px per frame."""
    rng = np.random.default_rng(seed)
    margin = 4 * frames
    big = cv2.GaussianBlur(rng.uniform(0, 255, (height + 2 * margin, width + 2 * margin, 3)).astype(np.float32),
                           (0, 0), 2.0)
    big = ((big - big.min()) / (big.max() - big.min()) * 255).astype(np.uint8)
    # frame t at (y, x) shows big[margin + y - t*dy, margin + x - t*dx]: content at (x, y) moves to (x+dx, y+dy)
    return np.stack([big[margin - t * dy: margin - t * dy + height, margin - t * dx: margin - t * dx + width]
                     for t in range(frames)])


def make_store(root: Path, videos: dict[str, np.ndarray], quality: int = 90, fps: float = 25.0,
               test_keys: tuple[str, ...] = ()) -> None:
    """A store of ``videos`` (one class), in the train split except ``test_keys``."""
    index = VideoIndex("synthetic", ["moving"],
                       [VideoEntry(key, 0, "test" if key in test_keys else "train") for key in videos])
    create_store(root, index, quality=quality)
    for key, frames in videos.items():
        write_entry(root, key, "rgb", [encode_jpeg(frame, quality) for frame in frames], fps=fps)


def median_motion(store: ClipStore, key: str, view: str, bound: float = 20.0) -> np.ndarray:
    """Median (u, v) of every stored flow frame of ``key``, away from the borders: [frames, 2]."""
    images = store.read(key, view, range(store.num_frames(key, view)))
    flow = uint8_to_flow(images, bound)[:, 10:-10, 10:-10]
    return np.median(flow.reshape(len(flow), -1, 2), axis=1)


MOTIONS = {"right_up.avi": (4, 2, -1), "left_down/clip.avi": (3, -1, 2)}  # key: (frames, dx, dy)


@pytest.fixture
def small_store(tmp_path: Path) -> Path:
    videos = {key: moving_texture(n, dx, dy, seed=i) for i, (key, (n, dx, dy)) in enumerate(MOTIONS.items())}
    videos["still.avi"] = moving_texture(1, 0, 0)
    make_store(tmp_path / "store", videos)
    return tmp_path / "store"


@pytest.mark.parametrize("backend, view, kwargs", [
    ("tvl1", "flow", {"params": FAST_TVL1}),
    ("dis", "flow_dis", {}),
    ("tvl1-torch", "flow", {"params": TVL1Params(nscales=2, warps=1, outer_iterations=2, inner_iterations=10),
                            "device": "cpu", "batch_pairs": 2}),
])
def test_extraction_writes_n_minus_1_frames_along_the_motion(small_store, backend, view, kwargs):
    summary = extract_flow(small_store, backend=backend, workers=1, **kwargs)
    assert summary.done == 2 and summary.skipped == 0
    assert [key for key, _ in summary.failed] == ["still.avi"]
    assert "1 RGB frame" in summary.failed[0][1]
    assert summary.frames == sum(n - 1 for n, _, _ in MOTIONS.values())
    store = ClipStore(small_store)
    for key, (frames, dx, dy) in MOTIONS.items():
        assert store.num_frames(key, view) == frames - 1
        assert store.frame_size(key, view) == (48, 64)
        assert store.fps(key, view) == 25.0
        np.testing.assert_allclose(median_motion(store, key, view), [[dx, dy]] * (frames - 1), atol=0.25)
        third = store.read(key, view, [0])[..., 2].astype(int)
        assert np.abs(third - 128).max() <= 3  # the constant channel, up to JPEG colour conversion


def test_a_second_run_skips_finished_videos_and_retries_failed_ones(small_store):
    extract_flow(small_store, backend="dis", workers=1)
    entry = entry_path(small_store, "right_up.avi", "flow_dis")
    stamp = entry.stat().st_mtime_ns
    again = extract_flow(small_store, backend="dis", workers=1)
    assert again.done == 0 and again.skipped == 2 and len(again.failed) == 1
    assert entry.stat().st_mtime_ns == stamp


def test_keys_restrict_the_work(small_store):
    summary = extract_flow(small_store, backend="dis", workers=1, keys=["right_up.avi"])
    assert summary.done == 1 and not summary.failed
    assert not ClipStore(small_store).has("left_down/clip.avi", "flow_dis")


def test_a_split_restricts_the_work_from_the_api_and_the_cli(tmp_path, capsys):
    videos = {key: moving_texture(n, dx, dy, seed=i) for i, (key, (n, dx, dy)) in enumerate(MOTIONS.items())}
    make_store(tmp_path / "store", videos, test_keys=("left_down/clip.avi",))
    assert cli_main(["flow", str(tmp_path / "store"), "--backend", "dis", "--workers", "1", "--split", "test"]) == 0
    assert "flow_dis: 1 done" in capsys.readouterr().out
    store = ClipStore(tmp_path / "store")
    assert store.has("left_down/clip.avi", "flow_dis") and not store.has("right_up.avi", "flow_dis")
    summary = extract_flow(tmp_path / "store", backend="dis", workers=1, split="train")
    assert summary.done == 1 and summary.skipped == 0 and store.has("right_up.avi", "flow_dis")
    empty = extract_flow(tmp_path / "store", backend="dis", workers=1, split="val")
    assert empty.done == 0 and "has no val videos (its splits: test, train): nothing to do" in str(empty)


def test_flow_quality_follows_the_stores_jpeg_quality(tmp_path):
    frames = {"a.avi": moving_texture(3, 1, 1)}
    sizes = {}
    for quality in (30, 95):
        make_store(tmp_path / str(quality), frames, quality=quality)
        extract_flow(tmp_path / str(quality), backend="dis", workers=1)
        sizes[quality] = entry_path(tmp_path / str(quality), "a.avi", "flow_dis").stat().st_size
    assert sizes[30] < sizes[95]


def test_the_bound_is_recorded_and_a_resumed_extraction_must_keep_it(small_store, capsys):
    """Flow stored at +-5 px decodes (with that bound) to the same motion in steps four times finer; the store
    records the bound, and extracting more of the view with another bound is refused before any work."""
    # still.avi fails (one frame), the rest is done
    assert cli_main(["flow", str(small_store), "--backend", "dis", "--workers", "1", "--bound", "5"]) == 3
    capsys.readouterr()
    store = ClipStore(small_store)
    assert store.meta["flow_dis_bound_px"] == 5.0
    fine = {key: median_motion(store, key, "flow_dis", bound=5.0) for key in MOTIONS}
    for key, (frames, dx, dy) in MOTIONS.items():
        np.testing.assert_allclose(fine[key], [[dx, dy]] * (frames - 1), atol=0.25)
    codes = store.read("right_up.avi", "flow_dis", [0])[..., 0].astype(int)
    assert np.median(codes) - 128 == pytest.approx(2 * 255 / 10, abs=3)  # 2 px right at 25.5 codes per px
    entry = entry_path(small_store, "right_up.avi", "flow_dis")
    entry.unlink()
    with pytest.raises(ConfigError, match=r"flow view 'flow_dis' with --bound=5\.0 \(given 20\.0\)"):
        extract_flow(small_store, backend="dis", workers=1)  # the default bound, 20
    assert not entry.exists()
    assert extract_flow(small_store, backend="dis", workers=1, bound=5.0).done == 1


def test_a_view_extracted_before_bounds_were_recorded_counts_as_20_px(small_store):
    extract_flow(small_store, backend="dis", workers=1, keys=["right_up.avi"])
    meta = json.loads((small_store / "store.json").read_text())
    assert meta["meta"].pop("flow_dis_bound_px") == 20.0
    (small_store / "store.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"--bound=20\.0 \(given 5\.0\)"):
        extract_flow(small_store, backend="dis", workers=1, bound=5.0)
    assert extract_flow(small_store, backend="dis", workers=1, keys=["left_down/clip.avi"]).done == 1
    assert ClipStore(small_store).meta["flow_dis_bound_px"] == 20.0


# --- bad input ----------------------------------------------------------------------------------------------

def test_bad_input_is_a_clear_error_before_any_work(small_store, tmp_path):
    with pytest.raises(DataError, match="missing"):
        extract_flow(tmp_path / "missing", backend="dis")
    with pytest.raises(ConfigError, match="'farneback'"):
        extract_flow(small_store, backend="farneback")
    with pytest.raises(ConfigError, match="warps"):
        extract_flow(small_store, backend="tvl1", params=TVL1Params(warps=0))
    with pytest.raises(ConfigError, match="dis backend"):
        extract_flow(small_store, backend="dis", params=TVL1Params())
    with pytest.raises(ConfigError, match="'rgb'"):
        extract_flow(small_store, backend="dis", view="rgb")
    with pytest.raises(DataError, match="nope.avi"):
        extract_flow(small_store, backend="dis", keys=["nope.avi"])
    with pytest.raises(ConfigError, match="split.*'validation'"):
        extract_flow(small_store, backend="dis", split="validation")
    with pytest.raises(ConfigError, match="device"):
        extract_flow(small_store, backend="tvl1", device="cuda")
    with pytest.raises(ConfigError, match="'gpu0'"):
        extract_flow(small_store, backend="tvl1-torch", device="gpu0")
    with pytest.raises(ConfigError, match="bound: .*positive"):
        extract_flow(small_store, backend="dis", bound=0.0)
    for bound in (1e30, 1e-30):  # every value 128 (all motion lost); two thirds clipped to 0 or 255
        with pytest.raises(ConfigError, match="bound: the flow bound must be from 0.05 to 4096 px"):
            extract_flow(small_store, backend="dis", bound=bound)
    with pytest.raises(ConfigError, match="kernels: c runs the iterations of tvl1-torch; the tvl1 backend is"):
        extract_flow(small_store, backend="tvl1", kernels="c")  # it ran OpenCV without a word
    for backend, given in (("dis", {"batch_pairs": 3}), ("tvl1", {"jpeg": "nvjpeg"}), ("dis", {"stop_every": 3})):
        key = next(iter(given))  # ignored without a word too
        with pytest.raises(ConfigError, match=f"{key}: applies to the tvl1-torch backend; the {backend} backend"):
            extract_flow(small_store, backend=backend, **given)
    with pytest.raises(ConfigError, match="stop_every: applies to the fast mode"):
        extract_flow(small_store, backend="tvl1-torch", device="cpu", stop_every=3)
    empty = tmp_path / "empty"
    create_store(empty, VideoIndex("empty", ["a"], [VideoEntry("a.avi", 0, "train")]))
    with pytest.raises(DataError, match="no 'rgb' view"):
        extract_flow(empty, backend="dis")
    assert not (small_store / "flow").exists() and not (small_store / "flow_dis").exists()
    assert not any(key.endswith("_bound_px") for key in ClipStore(small_store).meta)


def test_auto_picks_our_tvl1_where_it_is_fast_and_continues_a_view_with_its_backend(monkeypatch):
    import torch

    import coclr.store.flow_extract as extract

    backend, device = resolve_backend("auto")
    if torch.cuda.is_available():
        assert (backend.name, device) == ("tvl1-torch", "cuda")
    else:  # the CPU: our TV-L1 where its C loops build (the default test machines have a compiler)
        assert (backend.name, device) == ("tvl1-torch", "cpu")
    assert resolve_backend("auto", "cpu", kernels="torch")[0].name == "tvl1"  # PyTorch operations: OpenCV is faster
    assert resolve_backend("auto", "cpu", recorded="tvl1")[0].name == "tvl1"  # a view continues as it started
    assert resolve_backend("auto", "cpu", kernels="torch", recorded="tvl1-torch")[0].name == "tvl1-torch"
    assert resolve_backend("auto", "cpu", recorded="dis") == (resolve_backend("dis")[0], None)  # any backend
    monkeypatch.setattr(extract.TVL1_KERNEL, "usable", lambda: False)  # no compiler: OpenCV's
    assert resolve_backend("auto", "cpu")[0].name == "tvl1"


def test_auto_decides_without_compiling(tmp_path, monkeypatch):
    """Choosing the backend compiles nothing: a compiler found is enough (the loops are compiled when used)."""
    import coclr.flow.tvl1_cpu as tvl1_cpu
    from coclr import native

    monkeypatch.setenv("COCLR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tvl1_cpu.KERNEL, "_state", [])
    monkeypatch.setattr(native, "compile_sources", lambda *args: pytest.fail("compiled to decide"))
    monkeypatch.setattr(native, "find_compiler", lambda: ["cc"])
    assert resolve_backend("auto", "cpu")[0].name == "tvl1-torch"
    monkeypatch.setattr(native, "find_compiler", lambda: None)
    assert resolve_backend("auto", "cpu")[0].name == "tvl1"
    assert not (tmp_path / "cache").exists()


def test_auto_continues_a_view_started_with_opencv(small_store):
    """A view begun by ``auto`` when it meant OpenCV's tvl1 is continued with OpenCV's tvl1, not refused."""
    keys = ClipStore(small_store).keys()
    extract_flow(small_store, backend="tvl1", keys=keys[:1], workers=0)
    summary = extract_flow(small_store, backend="auto", device="cpu", keys=keys[:2], workers=0)
    assert (summary.done, summary.skipped, summary.failed) == (1, 1, [])
    assert ClipStore(small_store).meta["flow_method"]["backend"] == "tvl1"


def test_cli_reports_bad_input_as_one_line(small_store, tmp_path, capsys):
    cases = [
        ([str(tmp_path / "missing")], "missing"),
        ([str(small_store), "warps=0"], "warps"),
        ([str(small_store), "bogus=1"], "bogus"),
        ([str(small_store), "--backend", "dis", "warps=3"], "dis backend"),
        (["--backend", "dis", str(small_store), "warps=3", "--workers", "1"], "dis backend"),
        ([str(small_store), "--split", "testing"], "'testing'"),
    ]
    for args, needle in cases:
        assert cli_main(["flow", *args]) == 2
        error = capsys.readouterr().err
        assert error.startswith("coclr flow: error:") and needle in error
    with pytest.raises(SystemExit):
        cli_main(["flow", str(small_store), "--backend", "farneback"])
    assert not (small_store / "flow").exists()


def test_cli_extracts_and_prints_the_summary(small_store, capsys):
    status = cli_main(["flow", str(small_store), "--backend", "dis", "--workers", "1", "--view", "motion"])
    out, err = capsys.readouterr()
    assert status == 3  # finished, the 1-frame video failed
    assert "motion: 2 done" in out and "1 failed" in out and "still.avi" in out
    assert ClipStore(small_store).num_frames("right_up.avi", "motion") == 3
    assert "--view motion: training takes a view as flow by its name (flow, flow_...)" in err  # (refused mid-training)
    assert cli_main(["flow", str(small_store), "--backend", "dis", "--view", "rgbdiff"]) == 2  # (training read RGB
    assert "--view rgbdiff: training computes this view from rgb on the fly" in capsys.readouterr().err  # differences)
    assert not (small_store / "rgbdiff").exists()
    # a name no view can have, or the source view, is one line: a note that training would not take it stood above
    for view, said in ((".lock", "invalid view name '.lock'"), ("../up", "invalid view name '../up'"),
                       ("rgb", "flow cannot be written into the 'rgb' view")):
        assert cli_main(["flow", str(small_store), "--backend", "dis", "--view", view]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], lines


# --- kill and resume ----------------------------------------------------------------------------------------

def _flow_command(store: Path) -> list[str]:
    return [sys.executable, "-m", "coclr", "flow", str(store), "--backend", "tvl1", "--workers", "2",
            *FAST_OVERRIDES]


def test_killed_extraction_resumes_to_the_same_result(tmp_path):
    count = 30
    videos = {f"v{i:02d}.avi": moving_texture(4, 1 + i % 3, i % 2 - 1, seed=i) for i in range(count)}
    store_root = tmp_path / "store"
    make_store(store_root, videos)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    process = subprocess.Popen(_flow_command(store_root), env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    flow_dir = store_root / "flow"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if flow_dir.is_dir() and len(list(flow_dir.rglob("*.frames"))) >= 4:
                break
            time.sleep(0.02)
        assert process.poll() is None, "the run ended before it could be killed"
        os.killpg(process.pid, signal.SIGKILL)  # the CLI and its worker processes, mid-run
    finally:
        process.wait()
    finished_at_kill = len(list(flow_dir.rglob("*.frames")))
    print(f"killed with {finished_at_kill} of {count} entries complete")
    assert 4 <= finished_at_kill < count

    resumed = subprocess.run(_flow_command(store_root), env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{count - finished_at_kill} done, {finished_at_kill} skipped" in resumed.stdout
    assert not list(flow_dir.glob(".*partial"))

    with opencv_threads(1):  # the workers' setting, so the reference is computed identically
        reference = extract_flow(store_root, backend="tvl1", view="reference", workers=1, params=FAST_TVL1)
    assert reference.done == count
    store = ClipStore(store_root)
    assert store.verify("flow", decode=True) == []
    for key in videos:
        frames = range(store.num_frames(key, "flow"))
        assert len(frames) == 3
        assert store.read_encoded(key, "flow", frames) == store.read_encoded(key, "reference", frames), key


def test_two_flow_jobs_on_one_view_never_mix(small_store: Path):
    """A view records its backend and parameters: resuming it with another backend or other TV-L1 parameters is
    refused, naming them; a second job of the same kind is refused while the first holds the view's lock."""
    from coclr.store.flow_views import method_key

    extract_flow(small_store, backend="tvl1", view="flow", params=FAST_TVL1, workers=1, keys=["right_up.avi"])
    assert ClipStore(small_store).meta[method_key("flow")]["backend"] == "tvl1"
    with pytest.raises(ConfigError, match=r"backend='tvl1' \(given 'tvl1-torch'\)"):
        extract_flow(small_store, backend="tvl1-torch", view="flow", params=FAST_TVL1, device="cpu")
    with pytest.raises(ConfigError, match=r"with warps=2 \(given 3\)"):
        extract_flow(small_store, backend="tvl1", view="flow", params=TVL1Params(nscales=3, warps=3,
                     outer_iterations=3, inner_iterations=10), workers=1)
    with view_locked_by_another_process(small_store, "flow"):
        with pytest.raises(DataError, match="view 'flow' is being written by another job"):
            extract_flow(small_store, backend="tvl1", view="flow", params=FAST_TVL1, workers=1)
    summary = extract_flow(small_store, backend="tvl1", view="flow", params=FAST_TVL1, workers=1)
    assert (summary.done, summary.skipped) == (1, 1) and len(summary.failed) == 1  # still.avi has one frame


def test_a_video_too_short_for_flow_is_left_out_of_training_and_said_so(small_store: Path):
    """still.avi has one frame: its flow job fails and the store lists it; a two-view dataset leaves it out (with
    the reason), while an RGB-only one keeps it."""
    from coclr.data.datasets import TrainClips

    extract_flow(small_store, backend="dis", view="flow", workers=1)
    store = ClipStore(small_store)
    assert list(store.failed("flow")) == ["still.avi"] and "flow needs at least 2" in store.failed("flow")["still.avi"]
    two_views = TrainClips(store, "train", ["rgb", "flow"], length=2)
    assert [e.path for e in two_views.entries] == ["right_up.avi", "left_down/clip.avi"]
    assert "1 RGB frame" in two_views.left_out["still.avi"]
    assert len(TrainClips(store, "train", ["rgb"], length=2)) == 3


def test_the_batch_of_frame_pairs_is_chosen_by_the_library_for_every_caller():
    """tvl1-torch's default batch follows the device in extract_flow itself, so `coclr learn` (which calls it
    directly) gets a GPU's batch on a GPU, as `coclr flow` does."""
    import torch

    from coclr.store.flow_extract import BATCH_PAIRS, default_batch_pairs

    assert default_batch_pairs(None) == default_batch_pairs("cpu") == BATCH_PAIRS["cpu"] == 64
    assert default_batch_pairs("cuda") == default_batch_pairs("cuda:1") == BATCH_PAIRS["cuda"] == 256
    assert default_batch_pairs(torch.device("cuda", 0)) == 256 and default_batch_pairs(torch.device("cpu")) == 64


def test_the_default_batch_gives_the_flow_of_any_other(tmp_path):
    from coclr.store.clipstore import ClipStore
    from coclr.store.flow_extract import extract_flow
    from coclr.synth.output import random_store

    flows = []
    for name, batch in (("default", None), ("two", 2)):
        store = random_store(tmp_path / name, videos=4, frames=6, views=("rgb",))
        extract_flow(store, backend="tvl1-torch", device="cpu", workers=0, batch_pairs=batch)
        opened = ClipStore(store)
        flows.append([opened.read_encoded(key, "flow", range(opened.num_frames(key, "flow")))
                      for key in sorted(opened.keys())])
    for default, two in zip(*flows):
        assert len(default) == len(two) == 5 and default == two


def test_flow_on_a_store_whose_rgb_view_is_not_finished_is_refused_before_any_work(tmp_path, capsys):
    """A `coclr data store` killed half-way, then `coclr flow`: every video not decoded yet was listed as a failure
    of flow, "its RGB extraction failed?", with exit status 3; it had not failed, it was not done."""
    from coclr.store.clipstore import record_failures
    from coclr.synth import random_store

    store = random_store(tmp_path / "store", videos=4, frames=4, size=(16, 16), views=("rgb",))
    entry_path(store, "c1/v001", "rgb").unlink()  # (never decoded: the job was stopped first)
    assert cli_main(["flow", str(store), "--backend", "dis", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert "the 'rgb' view is not finished: c1/v001 of the 4 videos have no 'rgb' entry and no recorded failure; " \
           "run the same coclr data store command again" in err, err
    assert not (store / "flow_dis").exists()
    record_failures(store, "rgb", ["c1/v001"], [("c1/v001", "VideoDecodeError: damaged")])  # a failure: its input's
    assert cli_main(["flow", str(store), "--backend", "dis", "--workers", "0"]) == 3
    assert "c1/v001: no 'rgb' entry" in capsys.readouterr().out


def test_an_rgb_frame_that_does_not_decode_or_fit_is_its_entrys_damage_listed_for_rebuilding(tmp_path):
    """An rgb entry read unchecked (written before checksums) failed its flow with OpenCV's "cannot decode an image
    from 1048 bytes", or NumPy's "all input arrays must have the same shape", naming no frame; and the remedy it
    was given, `coclr data store` again, did nothing: the rgb entry was not listed as failed, so it was skipped."""
    good, wide = encode_jpeg(np.zeros((16, 16, 3), np.uint8), 90), encode_jpeg(np.zeros((16, 24, 3), np.uint8), 90)
    keys = ["ok.avi", "garbled.avi", "wide.avi"]
    create_store(tmp_path, VideoIndex("x", ["a"], [VideoEntry(key, 0, "train") for key in keys]))
    for key, frames in (("ok.avi", [good] * 3), ("garbled.avi", [good, b"\xff\xd8 not a jpeg", good]),
                        ("wide.avi", [good, good, wide])):
        write_entry(tmp_path, key, "rgb", frames, fps=10.0)
    summary = extract_flow(tmp_path, backend="dis", workers=0)
    failed = dict(summary.failed)
    assert summary.done == 1 and set(failed) == {"garbled.avi", "wide.avi"}
    assert "damaged entry" in failed["garbled.avi"] and "frame 1 does not decode" in failed["garbled.avi"]
    assert "frame 2 is 24x16, the entry's frames are 16x16" in failed["wide.avi"]
    assert set(ClipStore(tmp_path).failed("rgb")) == {"garbled.avi", "wide.avi"}  # (the rgb job rebuilds them)
