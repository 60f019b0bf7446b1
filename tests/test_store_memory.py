"""Store jobs in bounded memory: entries written frame by frame (the bytes of the one-go write), store and flow jobs
whose peak memory does not grow with a video's length (traced allocations of a short and a 4x longer video)."""

from __future__ import annotations

import tracemalloc
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from coclr.errors import DataError, VideoDecodeError
from coclr.store import clipstore
from coclr.store.build import build_store
from coclr.store.clipstore import ClipStore, EntryWriter, create_store, encode_header, entry_path, write_entry
from coclr.store.jobs import run_entry_jobs
from coclr.store.jpeg import encode_jpeg
from coclr.video.indexes import VideoEntry, VideoIndex


def noise_frames(count: int, height: int = 12, width: int = 16, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [encode_jpeg(rng.integers(0, 256, (height, width, 3), np.uint8), 90) for _ in range(count)]


def new_store(root: Path, keys: list[str]) -> Path:
    create_store(root, VideoIndex("x", ["a"], [VideoEntry(key, 0, "train") for key in keys]))
    return root


@pytest.mark.parametrize("buffer_bytes", [0, 1500, None])
def test_an_entry_written_frame_by_frame_has_the_bytes_of_the_one_go_format(tmp_path, buffer_bytes):
    """Whether the frames stay in memory (None: the default buffer), go to the scratch file from the first frame (0)
    or after a few (1500 bytes), the entry file is the header of all frames followed by the frames, as an entry
    written whole always was, and reads back verified."""
    root = new_store(tmp_path, ["a/v.avi"])
    frames = noise_frames(40)
    with EntryWriter(root, "a/v.avi", "rgb", buffer_bytes=buffer_bytes) as writer:
        for frame in frames:
            writer.add(frame)
        assert writer.commit(30.0) == 40
    expected = encode_header("a/v.avi", 12, 16, 30.0, frames) + b"".join(frames)
    path = entry_path(root, "a/v.avi", "rgb")
    assert path.read_bytes() == expected
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no scratch or temporary file left
    store = ClipStore(root)
    assert store.read_encoded("a/v.avi", "rgb", range(40)) == frames
    assert store.check_entry("a/v.avi", "rgb") is None


def test_an_error_while_the_frames_are_made_writes_nothing(tmp_path, monkeypatch):
    """A generator of frames that fails half-way (a video corrupt at frame 30) leaves no entry and no file: the
    scratch file of the frames past the buffer has no name, and the job lists the video as failed."""
    root = new_store(tmp_path, ["a/bad.avi", "a/good.avi"])
    monkeypatch.setattr(clipstore, "ENTRY_BUFFER_BYTES", 2000)
    frames = noise_frames(60)

    def failing():
        yield from frames[:30]
        raise VideoDecodeError("a/bad.avi: corrupt video data at frame 30")

    with pytest.raises(VideoDecodeError, match="frame 30"):
        write_entry(root, "a/bad.avi", "rgb", failing(), 25.0)
    folder = entry_path(root, "a/bad.avi", "rgb").parent
    assert not folder.exists() or list(folder.iterdir()) == []
    summary = run_entry_jobs(root, "rgb", ["a/bad.avi", "a/good.avi"], GeneratorJob(frames), workers=0)
    assert summary.done == 1 and [key for key, _ in summary.failed] == ["a/bad.avi"]
    assert "frame 30" in summary.failed[0][1]
    store = ClipStore(root)
    assert not store.has("a/bad.avi", "rgb") and store.read_encoded("a/good.avi", "rgb", range(60)) == frames
    with pytest.raises(DataError, match="no frames"):
        write_entry(root, "a/good.avi", "rgb", iter(()), 25.0)


class GeneratorJob:
    """A store job whose frames are a generator; the key "a/bad.avi" fails at frame 30."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames

    def __call__(self, key: str):
        def frames():
            for number, frame in enumerate(self.frames):
                if key == "a/bad.avi" and number == 30:
                    raise VideoDecodeError(f"{key}: corrupt video data at frame 30")
                yield frame
        return frames(), 25.0


def write_mpeg4(path: Path, frames: int, width: int = 96, height: int = 72) -> Path:
    """A video of a moving gradient (every frame differs), MPEG-4 part 2: fast to write and decode."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    y, x = np.mgrid[0:height, 0:width]
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=Fraction(25))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for t in range(frames):
            image = np.stack([(x + 2 * t) % 256, (y + t) % 256, (x + y + 3 * t) % 256], -1).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def traced_peak(function, *args, **kwargs) -> int:
    """The peak of the Python and NumPy allocations made while ``function(*args, **kwargs)`` runs, in bytes."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        function(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_the_store_job_holds_the_same_memory_for_a_video_four_times_longer(tmp_path, monkeypatch):
    """`coclr data store`'s job (decode, encode, write) on a 150- and a 600-frame video, in this process, traced: the
    longer video's peak exceeds the shorter one's by far less than a quarter of the bytes its entry adds (or a
    tenth of the decoded frames it adds), where a job that held the decoded video, or its encoded frames, would
    exceed it by all of them."""
    monkeypatch.setattr(clipstore, "ENTRY_BUFFER_BYTES", 64 * 1024)
    videos = tmp_path / "videos"
    for n in (150, 600):
        write_mpeg4(videos / "a" / f"{n}.mp4", n)
    peaks, sizes = {}, {}
    for n in (150, 600):
        one = VideoIndex("x", ["a"], [VideoEntry(f"a/{n}.mp4", 0, "train")])
        out = tmp_path / f"store{n}"
        build_store(one, videos, out, short_side=None, workers=0)  # warm-up: imports, codec tables
        new_out = tmp_path / f"traced{n}"
        peaks[n] = traced_peak(build_store, one, videos, new_out, short_side=None, workers=0)
        sizes[n] = entry_path(new_out, f"a/{n}.mp4", "rgb").stat().st_size
        assert ClipStore(new_out).num_frames(f"a/{n}.mp4", "rgb") == n
    growth = peaks[600] - peaks[150]
    decoded_growth = 450 * 72 * 96 * 3
    assert growth < 0.25 * (sizes[600] - sizes[150]), (peaks, sizes)
    assert growth < 0.1 * decoded_growth, (peaks, sizes)


def test_the_cpu_flow_job_holds_the_same_memory_for_a_video_four_times_longer(tmp_path, monkeypatch):
    """`coclr flow`'s CPU job (DIS here) reads, solves and writes a 600-frame video in parts: its traced peak exceeds
    that of a 150-frame video by far less than a quarter of the flow entry's added bytes, where the job that read
    the whole RGB entry and gathered every flow frame before writing exceeded it by both."""
    from coclr.store.flow_extract import extract_flow

    monkeypatch.setattr(clipstore, "ENTRY_BUFFER_BYTES", 64 * 1024)
    peaks, sizes = {}, {}
    for n in (20, 150, 600):  # 20: a warm-up (imports, OpenCV's first calls)
        root = new_store(tmp_path / f"store{n}", ["a/v.mp4"])
        base = np.random.default_rng(n).integers(0, 256, (48, 72, 3), np.uint8)
        write_entry(root, "a/v.mp4", "rgb", (encode_jpeg(np.roll(base, t, axis=1), 90) for t in range(n)), 25.0)
        peaks[n] = traced_peak(extract_flow, root, backend="dis", workers=0)
        sizes[n] = (entry_path(root, "a/v.mp4", "flow_dis").stat().st_size
                    + entry_path(root, "a/v.mp4", "rgb").stat().st_size)
        assert ClipStore(root).num_frames("a/v.mp4", "flow_dis") == n - 1
    assert peaks[600] - peaks[150] < 0.25 * (sizes[600] - sizes[150]), (peaks, sizes)


def test_the_tvl1_torch_pipeline_holds_the_same_memory_for_a_video_four_times_longer(tmp_path, monkeypatch):
    """The device pipeline of `coclr flow` (tvl1-torch, here on the CPU, in this process) reads a video in chunks (8
    pairs here) and writes its entry part by part: its traced peak for 600 frames exceeds that for 150 by far less
    than a quarter of the bytes the entries add, where the pipeline that decoded whole videos and gathered all of a
    video's flow before encoding it exceeded it by its decoded frames and flow."""
    from coclr.flow.params import TVL1Params
    from coclr.store import flow_pipeline as pipeline
    from coclr.store.flow_extract import extract_flow

    monkeypatch.setattr(clipstore, "ENTRY_BUFFER_BYTES", 64 * 1024)
    monkeypatch.setattr(pipeline, "DECODE_CHUNK", 8)
    params = TVL1Params(nscales=1, warps=1, outer_iterations=1, inner_iterations=1)
    peaks, sizes = {}, {}
    for n in (20, 150, 600):  # 20: a warm-up
        root = new_store(tmp_path / f"store{n}", ["a/v.mp4"])
        base = np.random.default_rng(n).integers(0, 256, (48, 72, 3), np.uint8)
        write_entry(root, "a/v.mp4", "rgb", (encode_jpeg(np.roll(base, t, axis=1), 90) for t in range(n)), 25.0)
        peaks[n] = traced_peak(extract_flow, root, backend="tvl1-torch", device="cpu", params=params, workers=0,
                               batch_pairs=8, kernels="torch")
        sizes[n] = (entry_path(root, "a/v.mp4", "flow").stat().st_size
                    + entry_path(root, "a/v.mp4", "rgb").stat().st_size)
        assert ClipStore(root).num_frames("a/v.mp4", "flow") == n - 1
    decoded_growth = 450 * 48 * 72 * 3  # gray frames and two flow channels
    assert peaks[600] - peaks[150] < 0.25 * (sizes[600] - sizes[150]), (peaks, sizes)
    assert peaks[600] - peaks[150] < 0.1 * decoded_growth, (peaks, sizes)
