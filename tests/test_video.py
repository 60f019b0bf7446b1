"""Video decoding: real clips of every container in ../shared, synthetic videos made with PyAV, bad files."""

from __future__ import annotations

import os
import re
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from coclr.errors import VideoDecodeError
from coclr.video.decode import (
    DAMAGE_TOLERANCE,
    VideoInfo,
    VideoReader,
    decode_frames_at,
    decode_frames_between,
    decode_video,
    decode_video_with_rate,
    probe_video,
    short_side_size,
    why_not_video,
    write_mp4,
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
    path = write_video(tmp_path / "wide.mp4", frames)
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


def _remux(source: Path, target: Path, shift_seconds: float = 0.0, **options) -> Path:
    """``source``'s video packets in a new MP4, their timestamps moved back by ``shift_seconds`` (an edit list then
    hides what comes before 0, as ``ffmpeg -ss 1 -c copy`` writes it)."""
    with av.open(str(source)) as container, av.open(str(target), "w", options=options) as out:
        stream = container.streams.video[0]
        shift = round(shift_seconds / stream.time_base)
        copy = out.add_stream_from_template(stream)
        for packet in container.demux(stream):
            if packet.size:
                packet.pts -= shift
                packet.dts -= shift
                packet.stream = copy
                out.mux(packet)
    return target


def test_intact_files_whose_header_counts_frames_never_shown_are_not_called_truncated(tmp_path):
    """An MP4 trimmed by an edit list (its header counts the frames before the cut) and an AVI with dropped frames
    (counted, but no packet) were refused as "truncated or corrupt: decoded 20 of the 30 frames its header
    announces"; a player shows them whole, as PyAV decodes them."""
    frames = numbered_frames(21, 32, 48)
    source = write_mp4(tmp_path / "source.mp4", np.concatenate([frames, frames[:9]]), 10.0, "libx264")
    trimmed = _remux(source, tmp_path / "trimmed.mp4", shift_seconds=1.0)
    with av.open(str(trimmed)) as container:
        assert container.streams.video[0].frames == 30  # the header counts the 10 frames before the cut
    decoded = decode_video(trimmed)
    assert frame_numbers(decoded) == list(range(10, 21)) + list(range(9))
    dropped = tmp_path / "dropped.avi"
    with av.open(str(dropped), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
        for index, pts in enumerate([*range(8), *range(12, 20)]):  # frames 8-11 dropped by the capture
            frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24")
            frame.pts = pts
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(dropped)) as container:
        assert container.streams.video[0].frames == 20
    assert frame_numbers(decode_video(dropped)) == list(range(16))
    # what is truncated still is: the AVI cut in half, and the MP4 without its end
    for name, whole in (("half.avi", dropped), ("half.mp4", _remux(trimmed, tmp_path / "fast.mp4",
                                                                   movflags="faststart"))):
        half = tmp_path / name
        half.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
        with pytest.raises(VideoDecodeError, match=re.escape(str(half))):
            decode_video(half)


def test_a_file_cut_short_decodes_alike_whatever_the_decoders_threads(tmp_path, monkeypatch):
    """A file whose last packet is cut short failed ("corrupt video data") where FFmpeg decoded with one or two
    threads and passed with three or more (its default is one per core): whether a video was used depended on the
    machine. The cut packet's frame is missing, which the truncation check judges; the threads are fixed."""
    import coclr.video.decode as decode

    frames = np.random.default_rng(0).integers(0, 255, (40, 64, 64, 3), dtype=np.uint8)  # noise: large packets
    whole = _remux(write_mp4(tmp_path / "source.mp4", frames, 10.0, "libx264"), tmp_path / "whole.mp4",
                   movflags="faststart")
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 99 // 100])
    counts = set()
    for threads in (1, 2, 3, 8):
        monkeypatch.setattr(decode, "DECODE_THREADS", threads)
        counts.add(len(decode_video(cut)))
    assert max(counts) < 40 and min(counts) >= 36
    monkeypatch.undo()
    with VideoReader(cut) as reader:
        assert reader._stream.thread_count == decode.DECODE_THREADS


def test_streaming_reader_and_frames_at_match_the_whole_decode(shared_clips):
    path = shared_clips / "flipping_a_pancake.mkv"
    whole = decode_video(path, short_side=64, fps=12.5)
    with VideoReader(path, 64, 12.5) as reader:
        streamed = np.stack(list(reader))
    assert reader.fps == 12.5 and reader.decoded == 310
    np.testing.assert_array_equal(streamed, whole)
    indices = [0, 7, 7, len(whole) - 1, len(whole) + 5]
    np.testing.assert_array_equal(decode_frames_at(path, indices, 64, 12.5), whole[np.minimum(indices, len(whole) - 1)])


# ------------------------------------------------------------------------------------------------ time


def test_frame_times_are_the_timestamps_of_a_variable_frame_rate_video_with_a_late_start(tmp_path):
    """Window and frame times come from the presentation timestamps, from the first frame on: a clock that starts
    at 2 s (as MPEG-TS streams do) and frames 40 ms then 1 s apart; index / average rate would be far off."""
    times_ms = [2000, 2040, 2080, 2120, 3120, 4120, 4160, 4200]
    expected = [(t - times_ms[0]) / 1000 for t in times_ms]
    for codec, suffix in (("ffv1", ".mkv"), ("libx264", ".mp4")):
        path = write_video(tmp_path / f"vfr{suffix}", numbered_frames(len(times_ms), 32, 48), codec=codec,
                           times_ms=times_ms)
        with VideoReader(path) as reader:
            frames, times = zip(*reader.timed())
        assert frame_numbers(np.stack(frames)) == list(range(len(times_ms))), codec
        assert list(times) == pytest.approx(expected, abs=1e-9), codec
        naive = [i / reader.fps for i in range(len(times_ms))]
        assert max(abs(a - b) for a, b in zip(naive, expected)) > 0.5  # what frame index / average rate gave
        assert reader.end_time > expected[-1]
        # The frames shown between two times: those on screen at some moment of [start, end).
        for start, end in ((0.05, 0.09), (0.1, 2.1), (2.13, 5.0), (0.0, 0.04)):
            shown = [i for i, t in enumerate(expected)
                     if t < end and (expected[i + 1] if i + 1 < len(expected) else reader.end_time) > start]
            assert frame_numbers(decode_frames_between(path, start, end)) == shown, (codec, start, end)


def test_stamps_that_restart_or_start_below_zero_keep_the_whole_timeline(tmp_path):
    """Two MPEG-TS recordings joined into one file restart their stamps: the second half was timed at the first
    half's last frame (every window of it zero seconds long) and --fps dropped it. A stream whose clock wrapped
    (its first stamps below zero) was "truncated: its frames end at 2.00 s of the 3.00 s its header announces"."""
    one = write_transport_stream(tmp_path / "one.ts", numbered_frames(10, 32, 48), fps=25)
    joined = tmp_path / "joined.ts"
    joined.write_bytes(one.read_bytes() * 2)
    with VideoReader(joined) as reader:
        frames, times = zip(*reader.timed())
    assert len(frames) == 20 and list(times) == pytest.approx([i / 25 for i in range(20)], abs=1e-6)
    assert reader.end_time == pytest.approx(0.8)
    assert len(decode_video(joined, fps=10)) == 8  # (4 before: the second recording dropped)
    wrapped = write_transport_stream(tmp_path / "wrapped.ts", numbered_frames(50, 32, 48), 25,
                                     [2 ** 33 - 90000 + 3600 * i for i in range(50)], Fraction(1, 90000))
    # (1 s below the 33-bit clock's wrap, then 1 s after it)
    with VideoReader(wrapped) as reader:
        frames, times = zip(*reader.timed())
    assert len(frames) == 50 and times[-1] == pytest.approx(49 / 25, abs=1e-6)


def test_a_video_shorter_than_half_an_output_frame_keeps_its_frame(tmp_path):
    """One frame at 25 fps, resampled to 10 fps, lasted round(0.4) = 0 output frames: "the video has no frame"."""
    path = write_video(tmp_path / "one.mp4", numbered_frames(1, 32, 48), fps=25, codec="libx264")
    frames = decode_video(path, fps=10)
    assert len(frames) == 1 and frame_numbers(frames) == [0]


def test_packed_b_frames_of_an_avi_are_timed_by_their_dts(shared_clips):
    """XviD AVIs give reordered pts (1, 2, 4, 3, 5, 7, 6 ...); FFmpeg's best-effort rule (with one frame of
    hindsight) times every frame of this constant-rate file at index / 25, and resampling at the file's own rate
    gives every frame once, in order."""
    path = shared_clips / "v_ApplyEyeMakeup_g01_c01.avi"
    with av.open(str(path)) as container:
        pts = [frame.pts for frame in container.decode(video=0)]
    assert any(b < a for a, b in zip(pts, pts[1:]))  # the file really has reordered pts
    with VideoReader(path, short_side=16) as reader:
        frames, times = zip(*reader.timed())
    assert list(times) == pytest.approx([i / 25 for i in range(164)], abs=1e-9)
    assert reader.end_time == pytest.approx(164 / 25)
    np.testing.assert_array_equal(decode_video(path, short_side=16, fps=25), np.stack(frames))


# ------------------------------------------------------------------------------------------------ orientation


def write_turned(path: Path, frames: np.ndarray, degrees: float | None = None, hflip: bool = False,
                 vflip: bool = False, tag: str | None = None, codec: str = "ffv1", aspect: Fraction | None = None
                 ) -> Path:
    """``frames`` encoded with a display matrix (PyAV's ``set_display_rotation``: ``degrees`` counterclockwise,
    then the flips) or a legacy ``rotate`` tag, pixels ``aspect`` times as wide as high where given (a sample
    aspect ratio: an MP4 records it); ``ffv1`` is lossless, ``libx264`` deterministic."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=10)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "bgr0" if codec == "ffv1" else "yuv420p"
        if aspect is not None:
            stream.codec_context.sample_aspect_ratio = aspect
        if codec == "libx264":
            stream.options = {"threads": "1"}
        if degrees is not None:
            stream.set_display_rotation(degrees, hflip=hflip, vflip=vflip)
        if tag is not None:
            stream.metadata["rotate"] = tag
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.mark.parametrize("degrees,hflip,vflip", [(90, False, False), (-90, False, False), (180, False, False),
                                                 (90, True, False), (-90, True, False), (0, True, False),
                                                 (0, False, True)])
def test_display_matrix_turns_the_frames_as_a_player_shows_them(tmp_path, degrees, hflip, vflip):
    """The reference is the matrix's documented meaning: PyAV writes ``degrees`` counterclockwise (FFmpeg's
    av_display_rotation_get reads it back so), then mirrors; np.rot90 turns counterclockwise."""
    frames = np.random.default_rng(3).integers(0, 256, (3, 12, 20, 3), dtype=np.uint8)
    shown = np.rot90(frames, degrees // 90, axes=(1, 2))
    shown = shown[:, :, ::-1] if hflip else shown
    shown = shown[:, ::-1] if vflip else shown
    path = write_turned(tmp_path / "turned.mkv", frames, degrees, hflip, vflip)
    np.testing.assert_array_equal(decode_video(path), shown)
    info = probe_video(path)
    assert (info.height, info.width) == shown.shape[1:3]
    with VideoReader(path) as reader:
        list(reader)
    assert (reader.orientation.rotation, reader.orientation.mirrored) == (info.rotation, info.mirrored)
    assert bool(reader.orientation)


def test_a_phone_video_is_turned_and_resized_like_its_upright_copy(tmp_path):
    """An H.264 MP4 marked as a phone marks a portrait recording (rotation -90: shown turned clockwise) decodes to
    the unmarked file's frames turned clockwise, resized first in the coded orientation (the same size either way);
    probe_video gives the size as shown. A legacy ``rotate`` tag (degrees clockwise, here in Matroska) too."""
    frames = np.random.default_rng(4).integers(0, 256, (4, 32, 48, 3), dtype=np.uint8)
    plain = write_turned(tmp_path / "plain.mp4", frames, codec="libx264")
    phone = write_turned(tmp_path / "phone.mp4", frames, -90, codec="libx264")
    assert plain.read_bytes() != phone.read_bytes()
    np.testing.assert_array_equal(decode_video(phone), np.rot90(decode_video(plain), -1, axes=(1, 2)))
    small = decode_video(phone, short_side=16)
    np.testing.assert_array_equal(small, np.rot90(decode_video(plain, short_side=16), -1, axes=(1, 2)))
    assert small.shape == (4, 24, 16, 3)
    assert probe_video(phone) == VideoInfo(frames=4, fps=10.0, width=32, height=48, rotation=90, mirrored=False)
    tagged = write_turned(tmp_path / "tagged.mkv", frames, tag="90")
    np.testing.assert_array_equal(decode_video(tagged), np.rot90(frames, -1, axes=(1, 2)))


def test_a_turn_that_is_not_a_quarter_turn_is_refused(tmp_path):
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    path = write_turned(tmp_path / "tilted.mkv", frames, 30)
    with pytest.raises(VideoDecodeError, match=f"{path}: .*30 degrees"):
        decode_video(path)
    for tag in ("nan", "inf", "quarter"):  # a tag that is no angle is that video's failure, not a ValueError
        path = write_turned(tmp_path / f"{tag}.mkv", frames, tag=tag)
        with pytest.raises(VideoDecodeError, match=f"rotate tag '{tag}' is not a number of degrees"):
            decode_video(path)


def write_anamorphic(path: Path, frames: np.ndarray, aspect: Fraction) -> Path:
    """``frames`` in lossless FFV1 in an MP4 (``path``), marked with pixels ``aspect`` times as wide as high (a sample
    aspect ratio)."""
    return write_turned(path, frames, aspect=aspect)


def test_anamorphic_pixels_are_read_as_coded_and_their_aspect_reported(tmp_path):
    """Pixels that are not square (DV, DVD, HDV; Kinetics clips scaled to 340x256, whose display aspect their pixels
    keep) are read as coded, as OpenCV, decord and the reference implementation's frame extraction read them (the
    paper's frames), and the aspect a player would apply is reported; a nonsensical one (a damaged header) is
    square. The real Kinetics-style clips have such pixels (cleaning_pool 1024/765: shown 455 px wide)."""
    frames = np.random.default_rng(5).integers(0, 256, (3, 24, 32, 3), dtype=np.uint8)
    path = write_anamorphic(tmp_path / "wide.mp4", frames, Fraction(2))
    np.testing.assert_array_equal(decode_video(path), frames)
    assert probe_video(path) == VideoInfo(frames=3, fps=10.0, width=32, height=24)
    with VideoReader(path) as reader:
        assert reader.pixel_aspect == 2
    for aspect, reported in ((Fraction(10, 11), Fraction(10, 11)), (Fraction(255, 1), 1)):
        with VideoReader(write_anamorphic(tmp_path / "other.mp4", frames, aspect)) as reader:
            assert reader.pixel_aspect == reported
    # turned a quarter, the frames as shown have pixels twice as tall as wide (it reported the coded 2)
    for degrees, reported in ((90, Fraction(1, 2)), (-90, Fraction(1, 2)), (180, Fraction(2))):
        turned = write_turned(tmp_path / f"turned{degrees}.mp4", frames, degrees, aspect=Fraction(2))
        with VideoReader(turned) as reader:
            assert next(iter(reader)).shape[:2] == ((24, 32) if degrees == 180 else (32, 24))
            assert reader.pixel_aspect == reported


# ------------------------------------------------------------------------------------------------ damage


def damaged_copy(source: Path, target: Path, size: int = 4096, seed: int = 0, at: float = 0.5) -> Path:
    """A copy of ``source`` with ``size`` random bytes (fixed seed) written over it from the fraction ``at`` of the
    file (default: the middle)."""
    data = bytearray(source.read_bytes())
    start = int(len(data) * at)
    data[start: start + size] = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    target.write_bytes(bytes(data))
    return target


def reference_damage(path: Path) -> tuple[list[int], int]:
    """Slow reference: (the damaged frames, the number of frames) of a video decoded by PyAV: frame i is damaged when
    some frame j <= i was reported corrupt and no clean key frame lies in (j, i]."""
    with av.open(str(path)) as container:
        container.streams.video[0].codec_context.thread_count = 1  # the plain decoder, no threads
        flags = [(frame.is_corrupt, frame.key_frame) for frame in container.decode(video=0)]
    damaged = [i for i in range(len(flags))
               if any(flags[j][0] and not any(key and not corrupt for corrupt, key in flags[j + 1: i + 1])
                      for j in range(i + 1))]
    return damaged, len(flags)


def test_damage_is_counted_and_above_a_tenth_of_the_frames_fails(shared_clips, tmp_path):
    """4 KB of random bytes in the middle of real files: the MP4s and the XviD AVI decode without an error from
    FFmpeg, with a sixth to a half of their frames visibly wrong; the decoder flags one frame, and every frame after
    it until the next key frame predicts from it. Counted so, they fail; the other AVI's damage (one GOP of 12
    frames) is within the tolerance and counted. (arm_wrestling's flag comes from the decoder with one thread or
    frame threads, ours; PyAV's default slice threads on 2 threads missed it.)"""
    for name, fails in (("cleaning_pool.mp4", True), ("arm_wrestling.mp4", True),
                        ("v_ApplyEyeMakeup_g01_c01.avi", True), ("v_Basketball_g01_c01.avi", False)):
        path = damaged_copy(shared_clips / name, tmp_path / name)
        frames, total = reference_damage(path)
        damaged = len(frames)
        assert damaged > 0, name
        assert fails == (damaged > DAMAGE_TOLERANCE * total), name
        with VideoReader(path, short_side=32) as reader:
            if fails:
                with pytest.raises(VideoDecodeError, match=f"{path}: damaged: {damaged} of its {total} frames"):
                    list(reader)
            else:
                list(reader)
        assert (reader.damaged, reader.decoded) == (damaged, total), name
    # What the count measures: the frames that visibly differ from the intact file's.
    source, path = shared_clips / "cleaning_pool.mp4", tmp_path / "cleaning_pool.mp4"
    with av.open(str(source)) as intact, av.open(str(path)) as broken:
        differs = [i for i, (a, b) in enumerate(zip(intact.decode(video=0), broken.decode(video=0)))
                   if np.abs(a.to_ndarray(format="rgb24").astype(int) - b.to_ndarray(format="rgb24")).mean() > 1]
    counted = set(reference_damage(path)[0])
    assert len(differs) > 50 and len(counted & set(differs)) >= 0.95 * len(differs)  # measured: 95 of the 96


def _frames_by_stamp(path: Path) -> dict[int, np.ndarray]:
    """Every frame PyAV decodes from ``path``, by its presentation stamp (slow reference)."""
    with av.open(str(path)) as container:
        return {frame.pts: frame.to_ndarray(format="rgb24").astype(np.int16) for frame in container.decode(video=0)}


def _spoilt(intact: Path, damaged: Path) -> tuple[int, int, int]:
    """(frames lost, frames visibly different, frames) of ``damaged`` against the ``intact`` file, by stamp."""
    before, after = _frames_by_stamp(intact), _frames_by_stamp(damaged)
    lost = [stamp for stamp in before if stamp not in after]
    differs = [stamp for stamp in before if stamp in after and np.abs(before[stamp] - after[stamp]).mean() > 1]
    return len(lost), len(differs), len(before)


def test_a_damaged_transport_stream_is_seen_by_its_packets_and_the_frames_it_lost(shared_clips, tmp_path):
    """A hole in an MPEG transport stream: the demuxer flags the packet it cut into, the decoder often flags
    nothing, and the frames whose packets it swallowed are simply gone: a synthetic intra-only stream (4 KB in the
    middle: 12 of 60 frames gone) was stored as intact (damaged 0, exit 0). Now the frames from the flagged packet
    to the next key frame count, and so do the frames lost at the damage: a real clip's H.264 remuxed, hit at 30%
    (84 frames visibly wrong, 1 lost), fails; hit at 75% it is kept with every spoilt frame counted; an intact
    stream and two joined ones are not damaged."""
    intact = _remux(shared_clips / "cleaning_pool.mp4", tmp_path / "pool.ts")
    with VideoReader(intact, short_side=32) as reader:
        assert len(list(reader)) == 300 and reader.damaged == 0
    for at, fails in ((0.3, True), (0.75, False)):
        damaged = damaged_copy(intact, tmp_path / f"pool_{at}.ts", at=at)
        lost, differs, total = _spoilt(intact, damaged)
        assert fails == (lost + differs > DAMAGE_TOLERANCE * total), (at, lost, differs)  # the truth of each
        with VideoReader(damaged, short_side=32) as reader:
            if fails:
                with pytest.raises(VideoDecodeError, match=rf"{damaged}: damaged: \d+ of its {total} frames"):
                    list(reader)
            else:
                list(reader)
        assert reader.damaged >= lost + differs, (at, reader.damaged, lost, differs)  # every spoilt frame counted
    frames = np.zeros((60, 48, 64, 3), np.uint8)
    frames[..., 1] = (np.arange(60) * 37 % 256)[:, None, None]
    whole = tmp_path / "intra.ts"
    with av.open(str(whole), "w", format="mpegts") as container:
        stream = container.add_stream("mpeg2video", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for number, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = number
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    holed = damaged_copy(whole, tmp_path / "holed.ts")
    lost, _, total = _spoilt(whole, holed)
    assert lost > DAMAGE_TOLERANCE * total  # (measured: 12 of 60)
    with pytest.raises(VideoDecodeError, match=rf"{holed}: damaged: .*, {lost} of them lost at the damage\)"):
        decode_video(holed, short_side=16)
    joined = tmp_path / "joined.ts"  # two recordings, each stamped from its start: the join is no damage
    joined.write_bytes(whole.read_bytes() * 2)
    with VideoReader(joined, short_side=16) as reader:
        assert len(list(reader)) == 120 and reader.damaged <= 1 and reader.lost == 0


def test_a_jump_of_the_stamps_counts_as_lost_only_at_the_damage():
    """A camera's pause (a jump of the stamps) 15 frames after a frame the decoder flagged was counted as lost
    frames, all through the flagged frame's group of pictures: an H.264 video of 300 frames, 25 of them damaged,
    failed at 40 of 315. A jump right after the damage is counted; one later is a variable frame rate."""
    from types import SimpleNamespace

    from coclr.video.decode import _Clock, _Damage

    def count(flagged: int, gap_at: int, frames: int = 300) -> tuple[int, int]:
        clock = _Clock(Fraction(1, 30000), Fraction(30))
        damage = _Damage(clock)
        stamp = 0
        for number in range(frames):
            stamp += 1000 * (16 if number == gap_at else 1)  # (a gap of 15 frame periods)
            frame = SimpleNamespace(pts=stamp, dts=stamp, is_corrupt=number == flagged,
                                    key_frame=number % 60 == 20)
            clock.observe(frame)
            damage(frame)
        return damage.frames, damage.lost

    assert count(flagged=235, gap_at=250) == (25, 0)  # flagged 235, next key frame 260: 25 damaged, no loss
    assert count(flagged=235, gap_at=236) == (25 + 15, 15)  # the jump right after the flagged frame: lost there
    assert count(flagged=235, gap_at=238) == (25 + 15, 15)  # within two periods of it
    assert count(flagged=235, gap_at=239) == (25, 0)


def test_a_matroska_cluster_skipped_by_ffmpeg_is_corruption(shared_clips, tmp_path):
    """FFmpeg's Matroska reader skips the damaged cluster without an error (161 of 310 frames, the frames after it
    on time): the stretch of the file no packet covers gives it away; the intact file has none."""
    path = damaged_copy(shared_clips / "flipping_a_pancake.mkv", tmp_path / "pancake.mkv")
    with av.open(str(path)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 161  # silently
    with pytest.raises(VideoDecodeError, match=rf"{path}: corrupt: the \d+ bytes from offset \d+ are no readable"):
        decode_video(path, short_side=16)
    assert len(decode_video(shared_clips / "flipping_a_pancake.mkv", short_side=16)) == 310


# ------------------------------------------------------------------------------------------------ which files


def write_transport_stream(path: Path, frames: np.ndarray, fps: int = 10, stamps: list[int] | None = None,
                           time_base: Fraction | None = None) -> Path:
    """An MPEG-TS of ``frames`` in H.264 at ``fps``, stamped ``stamps`` (in ``time_base``) when given."""
    with av.open(str(path), "w", format="mpegts") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        if time_base is not None:
            stream.time_base = stream.codec_context.time_base = time_base
        for number, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            if stamps is not None:
                frame.pts, frame.time_base = stamps[number], time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_song_with_cover(path: Path) -> Path:
    """An MP4 of silence whose only video stream is a cover picture (disposition attached_pic), as music files have."""
    with av.open(str(path), "w", format="mp4") as container:
        sound = container.add_stream("aac", rate=16000)
        cover = container.add_stream("mjpeg", rate=1)
        cover.width, cover.height, cover.pix_fmt = 16, 16, "yuvj420p"
        cover.disposition = av.stream.Disposition.attached_pic
        black = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
        picture = black.reformat(format="yuvj420p")
        for packet in [*cover.encode(picture), *cover.encode()]:
            container.mux(packet)
        for number in range(10):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, 1024 * number
            for packet in sound.encode(frame):
                container.mux(packet)
        for packet in sound.encode():
            container.mux(packet)
    return path


def test_a_file_is_a_video_by_its_name_or_when_pyav_opens_it_as_one(tmp_path):
    frames = numbered_frames(6, 32, 48)
    stream = write_transport_stream(tmp_path / "clip.ts", frames)
    (tmp_path / "CLIP.MTS").write_bytes(stream.read_bytes())
    (tmp_path / "no_extension").write_bytes(stream.read_bytes())
    (tmp_path / "source.ts").write_text("export const answer: number = 42;\n" * 50)  # TypeScript
    (tmp_path / "notes.txt").write_text("a note\n")
    (tmp_path / "noise.bin").write_bytes(np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes())
    (tmp_path / "empty.mp4").write_bytes(b"")
    for name in ("clip.ts", "CLIP.MTS", "no_extension", "empty.mp4"):
        assert why_not_video(tmp_path / name) is None, name
    assert why_not_video(tmp_path / "notes.txt") == "its name ends in .txt"
    for name in ("source.ts", "noise.bin"):
        assert why_not_video(tmp_path / name), name
    song = write_song_with_cover(tmp_path / "song")
    assert why_not_video(song) == "the file has no video stream, only a still picture (cover art)"
    with pytest.raises(VideoDecodeError, match="only a still picture"):
        decode_video(write_song_with_cover(tmp_path / "song.mp4"))
    assert frame_numbers(decode_video(tmp_path / "CLIP.MTS")) == list(range(6))
    with VideoReader(tmp_path / "clip.ts") as reader:
        assert [time for _, time in reader.timed()] == pytest.approx([i / 10 for i in range(6)])  # from 0, not 1.4 s


FORKED_COLLECT = """
import gc, os, sys, time
import av, numpy as np
from coclr.video.decode import decode_video

guarded = sys.argv[2] == "guarded"
gc.disable()  # only the collections below
if guarded:
    decode_video(sys.argv[1])  # our decoding: from now on a child leaves the parent's garbage alone
frame = av.VideoFrame.from_ndarray(np.zeros((96, 128, 3), np.uint8), format="rgb24")
small = frame.reformat(width=64, height=48, format="yuv420p")  # a scaler with slice threads
cycle = [frame, small]
cycle.append(cycle)  # garbage only the collector frees
del frame, small, cycle
collections = []
gc.callbacks.append(lambda phase, info: collections.append(phase))
pid = os.fork()
if pid == 0:
    gc.collect()  # a DataLoader worker's collector, freeing the scaler without its threads
    os._exit(0)
frozen, parent_collections = gc.get_freeze_count(), len(collections)
freed = gc.collect()  # the parent's collector still frees the cycle, where the scaler's threads are
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    if os.waitpid(pid, os.WNOHANG)[0]:
        print(f"finished, {parent_collections} collections at the fork, {frozen} objects left frozen, {freed} freed")
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    print("hung")
"""


def test_a_fork_after_decoding_leaves_no_scaler_for_the_child_to_free(tmp_path):
    """FFmpeg's scalers run slice threads: a PyAV frame left as garbage and freed by a forked child's collector waits
    forever for threads the child does not have (a learn run hung so in curation). Once coclr has decoded, a forked
    child's collector leaves what the parent held alone (frozen for the fork), and the parent's collector frees it
    after; the fork itself runs no collection (a full one per fork took 0.1-0.2 s beside PyTorch). Without that the
    same child hangs (the check that the hazard is real, where PyAV threads its scalers: 17 and later, on more than
    one core)."""
    import subprocess
    import sys

    video = write_mp4(tmp_path / "v.mp4", np.zeros((4, 32, 48, 3), np.uint8), fps=10)
    outcome = {mode: subprocess.run([sys.executable, "-c", FORKED_COLLECT, str(video), mode], capture_output=True,
                                    text=True, timeout=120).stdout.strip() for mode in ("guarded", "plain")}
    finished = re.fullmatch(r"finished, 0 collections at the fork, 0 objects left frozen, (\d+) freed",
                            outcome["guarded"])
    assert finished and int(finished[1]) >= 3, outcome["guarded"]  # the frame, its copy, the list
    if int(av.__version__.split(".")[0]) >= 17 and (os.cpu_count() or 1) > 1:  # scalers with slice threads
        assert outcome["plain"] == "hung"


def test_the_same_frames_make_the_same_mp4_whatever_was_encoded_before(tmp_path):
    from coclr.video.decode import write_mp4

    rng = np.random.default_rng(0)
    clips = [(np.cumsum(rng.integers(0, 255, (60, 246, 338, 3), dtype=np.uint8), axis=0) // 8 % 255).astype(np.uint8)
             for _ in range(2)]  # moving texture, of a size whose rows x264's SIMD code reads past

    def encoded(frames: np.ndarray, name: str) -> bytes:
        return write_mp4(tmp_path / name, frames, 25.0, crf=38).read_bytes()

    first = encoded(clips[0], "first.mp4")
    assert encoded(clips[0], "again.mp4") == first  # what the first left in memory was read into the second
    encoded(clips[1], "other.mp4")
    assert encoded(clips[0], "after another.mp4") == first


def test_a_folder_or_nothing_where_a_video_is_named_says_which(tmp_path):
    with pytest.raises(VideoDecodeError, match="a folder, not a video file"):
        decode_video(tmp_path)
    with pytest.raises(VideoDecodeError, match="video file not found"):
        decode_video(tmp_path / "missing.mp4")
    # links: one in a loop was "video file not found", as was one to nothing
    (tmp_path / "a.mp4").symlink_to(tmp_path / "b.mp4")
    (tmp_path / "b.mp4").symlink_to(tmp_path / "a.mp4")
    (tmp_path / "gone.mp4").symlink_to(tmp_path / "nowhere.mp4")
    with pytest.raises(VideoDecodeError, match=r"a\.mp4: a symbolic link in a loop \(it leads back to itself\)"):
        decode_video(tmp_path / "a.mp4")
    with pytest.raises(VideoDecodeError, match=r"gone\.mp4: a link to .*nowhere\.mp4, which does not exist"):
        decode_video(tmp_path / "gone.mp4")


def test_a_labels_file_that_is_a_folder_says_so(tmp_path):
    from coclr.errors import DataError
    from coclr.video.indexes import manifest_text

    (tmp_path / "labels.csv").mkdir()
    with pytest.raises(DataError, match=r"labels\.csv: a folder, not a manifest"):
        manifest_text(tmp_path / "labels.csv")
