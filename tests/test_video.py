"""Video decoding: real clips of every container in ../shared, synthetic videos made with PyAV, bad files."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from coclr.errors import VideoDecodeError
from coclr.video.decode import (
    VideoReader,
    decode_frames_at,
    decode_video,
    decode_video_with_rate,
    probe_video,
    short_side_size,
)

# Frame counts and rates from ../shared/data/README.md (full decode).
REAL_CLIPS = {
    "v_ApplyEyeMakeup_g01_c01.avi": (164, 25.0, 320, 240),
    "v_BaseballPitch_g01_c01.avi": (107, 29.97, 320, 240),
    "v_Basketball_g01_c01.avi": (141, 29.97, 320, 240),
    "archery_ucf_format.avi": (131, 25.0, 320, 240),
    "abseiling_k400.mp4": (250, 25.0, 454, 256),
    "arm_wrestling.mp4": (280, 28.0, 340, 256),
    "cleaning_pool.mp4": (300, 30.0, 340, 256),
    "flipping_a_pancake.mkv": (310, 30.0, 426, 240),
}
GREY_STEP = 12


def write_video(path: Path, frames: np.ndarray, fps: float = 10, codec: str = "ffv1",
                times_ms: list[int] | None = None) -> Path:
    """Encode ``uint8 [N, H, W, 3]`` RGB frames with PyAV; ``ffv1`` (in .mkv) is lossless. ``times_ms`` gives
    each frame its own timestamp (variable frame rate)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "bgr0" if codec == "ffv1" else "yuv420p"
        if times_ms is not None:
            stream.codec_context.time_base = stream.time_base = Fraction(1, 1000)
        for i, frame in enumerate(frames):
            video_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
            if times_ms is not None:
                video_frame.pts, video_frame.time_base = times_ms[i], Fraction(1, 1000)
            for packet in stream.encode(video_frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def numbered_frames(count: int, height: int = 16, width: int = 20) -> np.ndarray:
    """Frames whose constant grey value (12 * index, up to 21 frames) identifies them even after lossy coding."""
    values = (GREY_STEP * np.arange(count)).astype(np.uint8)
    return np.broadcast_to(values[:, None, None, None], (count, height, width, 3)).copy()


def frame_numbers(frames: np.ndarray) -> list[int]:
    return [int(round(v / GREY_STEP)) for v in frames.reshape(len(frames), -1).mean(axis=1)]


def nearest_frame_reference(times: list[float], fps: float, count: int) -> list[int]:
    """Slow reference: for output k, the source frame whose time is nearest to k / fps (ties: the later)."""
    chosen = []
    for k in range(count):
        target = k / fps
        distances = [abs(t - target) for t in times]
        best = min(distances)
        chosen.append(max(i for i, d in enumerate(distances) if abs(d - best) < 1e-9))
    return chosen


def test_real_clips_decode_with_documented_counts(shared_clips):
    for name, (frames, fps, width, height) in REAL_CLIPS.items():
        path = shared_clips / name
        info = probe_video(path)
        assert info.frames == frames, name
        assert info.fps == pytest.approx(fps, abs=0.01), name
        assert (info.width, info.height) == (width, height), name
        decoded, rate = decode_video_with_rate(path, short_side=32)
        expected_size = short_side_size(height, width, 32)
        assert decoded.shape == (frames, *expected_size, 3), name
        assert decoded.dtype == np.uint8
        assert rate == pytest.approx(fps, abs=0.01)


def test_mkv_without_frame_count_is_counted_by_decoding(shared_clips):
    path = shared_clips / "flipping_a_pancake.mkv"
    with av.open(str(path)) as container:
        assert container.streams.video[0].frames == 0  # the header really has no count
    assert probe_video(path).frames == 310 == probe_video(path, exact=True).frames


def test_full_size_decode_matches_pyav_reference(shared_clips):
    path = shared_clips / "v_Basketball_g01_c01.avi"
    with av.open(str(path)) as container:
        reference = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    np.testing.assert_array_equal(decode_video(path), reference)


def test_lossless_video_round_trips(tmp_path):
    frames = np.random.default_rng(0).integers(0, 256, (9, 24, 32, 3), dtype=np.uint8)
    path = write_video(tmp_path / "clip.mkv", frames)
    np.testing.assert_array_equal(decode_video(path), frames)
    assert probe_video(path) == probe_video(path, exact=True)
    assert probe_video(path).frames == 9


@pytest.mark.parametrize("codec,suffix", [("mpeg4", ".avi"), ("libx264", ".mp4"), ("mpeg4", ".mkv")])
def test_lossy_containers_decode_every_frame(tmp_path, codec, suffix):
    frames = numbered_frames(15, 32, 48)
    path = write_video(tmp_path / f"clip{suffix}", frames, fps=12.5, codec=codec)
    decoded, fps = decode_video_with_rate(path)
    assert fps == 12.5
    assert frame_numbers(decoded) == list(range(15))


def test_short_side_resize_is_area_interpolation(tmp_path):
    frames = np.random.default_rng(1).integers(0, 256, (3, 60, 90, 3), dtype=np.uint8)
    path = write_video(tmp_path / "wide.mkv", frames)
    small = decode_video(path, short_side=20)
    assert small.shape == (3, 20, 30, 3)
    for frame, source in zip(small, frames):
        np.testing.assert_array_equal(frame, cv2.resize(source, (30, 20), interpolation=cv2.INTER_AREA))
    tall = write_video(tmp_path / "tall.mkv", frames.transpose(0, 2, 1, 3).copy())
    assert decode_video(tall, short_side=20).shape == (3, 30, 20, 3)


@pytest.mark.parametrize("target_fps", [4.0, 7.5, 10.0, 25.0])
def test_resampling_picks_the_nearest_frame_in_time(tmp_path, target_fps):
    count, source_fps = 20, 10.0
    path = write_video(tmp_path / "numbered.mkv", numbered_frames(count), fps=source_fps)
    decoded, fps = decode_video_with_rate(path, fps=target_fps)
    expected_count = round(count / source_fps * target_fps)
    times = [i / source_fps for i in range(count)]
    assert fps == target_fps
    assert frame_numbers(decoded) == nearest_frame_reference(times, target_fps, expected_count)


def test_resampling_follows_timestamps_of_variable_frame_rate_video(tmp_path):
    times_ms = [0, 100, 150, 400, 500, 520, 900]
    path = write_video(tmp_path / "vfr.mkv", numbered_frames(len(times_ms)), times_ms=times_ms)
    decoded = decode_video(path, fps=10)
    covered = 10  # outputs at 0..900 ms; what follows the last frame depends on the estimated frame rate
    reference = nearest_frame_reference([t / 1000 for t in times_ms], 10, covered)
    assert frame_numbers(decoded)[:covered] == reference


def _assert_decode_error(path: Path) -> None:
    with pytest.raises(VideoDecodeError) as error:
        decode_video(path)
    assert str(path) in str(error.value)
    with pytest.raises(VideoDecodeError) as error:
        probe_video(path)
    assert str(path) in str(error.value)


def test_random_bytes_raise(tmp_path):
    path = tmp_path / "corrupt.avi"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes())
    _assert_decode_error(path)


def test_empty_file_raises(tmp_path):
    path = tmp_path / "empty.mp4"
    path.write_bytes(b"")
    _assert_decode_error(path)


def test_text_file_raises(tmp_path):
    for name in ("notes.txt", "notes.mp4"):
        path = tmp_path / name
        path.write_text("".join(f"this is line {i} of a text file, not a video\n" for i in range(100)))
        _assert_decode_error(path)


def test_missing_file_raises(tmp_path):
    _assert_decode_error(tmp_path / "nowhere.avi")


def test_truncated_synthetic_videos_raise(tmp_path):
    frames = np.random.default_rng(2).integers(0, 256, (40, 32, 48, 3), dtype=np.uint8)
    for codec, suffix in (("mpeg4", ".avi"), ("ffv1", ".mkv"), ("libx264", ".mp4")):
        whole = write_video(tmp_path / f"whole{suffix}", frames, codec=codec)
        assert len(decode_video(whole)) == 40
        half = tmp_path / f"half{suffix}"
        data = whole.read_bytes()
        half.write_bytes(data[: len(data) // 2])
        with pytest.raises(VideoDecodeError, match=str(half)):
            decode_video(half)


def test_truncated_real_videos_raise(shared_clips, tmp_path):
    for name in REAL_CLIPS:
        data = (shared_clips / name).read_bytes()
        half = tmp_path / f"half_{name}"
        half.write_bytes(data[: len(data) // 2])
        with pytest.raises(VideoDecodeError, match=str(half)):
            decode_video(half, short_side=16)


def test_streaming_reader_and_frames_at_match_the_whole_decode(shared_clips):
    path = shared_clips / "flipping_a_pancake.mkv"
    whole = decode_video(path, short_side=64, fps=12.5)
    with VideoReader(path, 64, 12.5) as reader:
        streamed = np.stack(list(reader))
    assert reader.fps == 12.5 and reader.decoded == 310
    np.testing.assert_array_equal(streamed, whole)
    indices = [0, 7, 7, len(whole) - 1, len(whole) + 5]
    np.testing.assert_array_equal(decode_frames_at(path, indices, 64, 12.5), whole[np.minimum(indices, len(whole) - 1)])
