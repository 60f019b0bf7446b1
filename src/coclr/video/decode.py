"""Video decoding with PyAV: probe a file, decode it to RGB frames, resample the frame rate, resize.

Every container FFmpeg reads works (AVI/XviD, MP4/H.264, MKV, WebM, ...). Decoding uses FFmpeg's own
threads; frames are converted to RGB by libswscale and resized with OpenCV's ``INTER_AREA``, which averages
every source pixel a target pixel covers: the anti-aliased choice for the downscaling a clip store does
(bilinear sampling would skip pixels and alias fine texture); on a 340x256 H.264 clip it cost less than
swscale's own area filter and within 6% of its bicubic one, and it is deterministic (``docs/store.md``).

A file that cannot be decoded completely (corrupt, truncated, empty, not a video) raises
:class:`~coclr.errors.VideoDecodeError` naming the file, so one bad video in a dataset of thousands is
reported and skipped instead of silently giving a short or empty clip.

Example::

    frames = decode_video("v_ApplyEyeMakeup_g01_c01.avi", short_side=128, fps=25)  # uint8 [N, 128, 171, 3]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from coclr.errors import VideoDecodeError

VIDEO_EXTENSIONS = (".avi", ".mp4", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg", ".flv", ".wmv", ".3gp")
"""File name endings treated as videos when scanning folders."""

# Demuxers that accept almost any file (text as ANSI art, single images): such a file is not a video.
_NOT_VIDEO_FORMATS = frozenset({"tty", "image2", "bin", "lavfi"})
_NOT_VIDEO_CODECS = frozenset({"ansi", "bintext", "xbin", "idf"})

# A decode that yields fewer frames than the header promises by more than this is a truncated file.
# Headers of sound files are off by a frame or two (an AVI that ffmpeg pads to 165 frames decodes 164).
_TRUNCATION_TOLERANCE_FRAMES = 3
_TRUNCATION_TOLERANCE_FRACTION = 0.05


@dataclass(frozen=True)
class VideoInfo:
    """What a video holds: frame count (exact when ``probe_video(exact=True)``), frame rate and size."""

    frames: int
    fps: float
    width: int
    height: int


def probe_video(path: str | Path, exact: bool = False) -> VideoInfo:
    """Frame count, frame rate and size of the video stream of ``path``.

    The frame count comes from the container header; when the header has none (Matroska, WebM) or when
    ``exact`` is set, the frames are counted by decoding the whole stream (what :func:`decode_video`
    returns).
    """
    path = Path(path)
    with _open(path) as container:
        stream = container.streams.video[0]
        rate = _frame_rate(stream)
        if rate is None:
            raise VideoDecodeError(f"{path}: the video stream has no frame rate")
        fps = float(rate)
        width, height = stream.codec_context.width, stream.codec_context.height
        frames = int(stream.frames or 0)
        if frames <= 0 or exact:
            frames = sum(1 for _ in _decoded_frames(container, stream, path))
    if width <= 0 or height <= 0:
        raise VideoDecodeError(f"{path}: the video stream has no frame size")
    return VideoInfo(frames=frames, fps=fps, width=width, height=height)


def decode_video(path: str | Path, short_side: int | None = None, fps: float | None = None) -> np.ndarray:
    """Decode every frame of ``path`` as ``uint8 [N, H, W, 3]`` RGB.

    Args:
        path: the video file.
        short_side: resize so that the shorter side has this many pixels, keeping the aspect ratio
            (``INTER_AREA``); ``None`` keeps the decoded size.
        fps: resample to this frame rate by timestamps: output frame ``k`` is the source frame whose
            timestamp is nearest to ``k / fps`` (frames are repeated or dropped, as FFmpeg's ``fps`` filter
            does), and the output lasts ``round(duration * fps)`` frames; ``None`` keeps every decoded frame.

    Raises:
        VideoDecodeError: the file is missing, not a video, corrupt, empty or truncated.
    """
    return decode_video_with_rate(path, short_side, fps)[0]


def decode_video_with_rate(path: str | Path, short_side: int | None = None,
                           fps: float | None = None) -> tuple[np.ndarray, float]:
    """:func:`decode_video`, also returning the frame rate of the frames (``fps``, or the source's)."""
    with VideoReader(path, short_side, fps) as reader:
        frames = list(reader)
    return np.stack(frames), reader.fps


class VideoReader:
    """The frames of :func:`decode_video`, one at a time, so that a video of any length is read in bounded
    memory (``with VideoReader(path, 128) as reader: for frame in reader: ...``).

    Opening checks the file (missing, empty, not a video, no frame rate: :class:`VideoDecodeError`). Iterating
    yields ``uint8 [H, W, 3]`` RGB frames and raises :class:`VideoDecodeError` when the data is corrupt, when
    no frame decodes, or, after the last frame, when fewer frames decoded than the header announces (a
    truncated file). ``fps`` is the rate of the frames yielded; ``decoded`` counts the source frames so far.
    State: the open container (closed at the end of the iteration or by :meth:`close`).
    """

    def __init__(self, path: str | Path, short_side: int | None = None, fps: float | None = None) -> None:
        self.path = Path(path)
        if short_side is not None and short_side < 1:
            raise ValueError(f"short_side must be positive, got {short_side}")
        if fps is not None and not fps > 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self._container = _open(self.path)
        self._stream = self._container.streams.video[0]
        source_fps = _frame_rate(self._stream)
        if source_fps is None:
            self.close()
            raise VideoDecodeError(f"{self.path}: the video stream has no frame rate")
        self.source_fps = source_fps
        self.expected = _expected_frames(self._container, self._stream, source_fps)
        self.fps = float(fps if fps is not None else source_fps)
        self._target_fps = fps
        self._converter = _RGBConverter(short_side)
        self.decoded = 0

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None

    def __iter__(self) -> Iterator[np.ndarray]:
        if self._container is None:
            raise ValueError(f"{self.path}: the reader is closed")
        try:
            frames = _decoded_frames(self._container, self._stream, self.path)
            if self._target_fps is None:
                for frame in frames:
                    self.decoded += 1
                    yield self._converter(frame)
            else:
                yield from _resample(frames, self._converter, self._stream, self.source_fps, self._target_fps, self)
            expected = self.expected
            if self.decoded == 0:
                raise VideoDecodeError(f"{self.path}: no video frame could be decoded")
            if expected is not None and self.decoded < expected - max(_TRUNCATION_TOLERANCE_FRAMES,
                                                                      _TRUNCATION_TOLERANCE_FRACTION * expected):
                raise VideoDecodeError(f"{self.path}: truncated or corrupt: decoded {self.decoded} of the {expected} "
                                       "frames its header announces")
        finally:
            self.close()


def decode_frames_at(path: str | Path, indices: Sequence[int], short_side: int | None = None,
                     fps: float | None = None) -> np.ndarray:
    """The frames at ``indices`` (of the frames :func:`decode_video` gives) as ``uint8 [len(indices), H, W, 3]``,
    read in one streaming pass that keeps only those frames; indices past the end repeat the last frame."""
    wanted = {int(i) for i in indices}
    if not wanted:
        raise ValueError("no frame indices given")
    kept: dict[int, np.ndarray] = {}
    last, stop = None, max(wanted)
    with VideoReader(path, short_side, fps) as reader:
        for number, frame in enumerate(reader):
            last = frame
            if number in wanted:
                kept[number] = frame
            if number >= stop:
                break
    assert last is not None
    return np.stack([kept.get(int(i), last) for i in indices])


def write_mp4(path: str | Path, frames: np.ndarray, fps: float, codec: str = "libx264") -> Path:
    """Encode ``uint8 [N, H, W, 3]`` RGB frames as an MP4 file (``yuv420p``; H.264 at CRF 18 by default, which
    needs even sizes), for test and benchmark videos. Raises :class:`VideoDecodeError` naming the file when FFmpeg
    cannot encode it."""
    import av  # noqa: PLC0415 (optional)

    path = Path(path)
    try:
        with av.open(str(path), mode="w", format="mp4") as container:
            stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": "18"} if codec == "libx264" else {}
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    except av.FFmpegError as error:
        raise VideoDecodeError(f"{path}: cannot encode MP4 with codec {codec!r}: {error}") from None
    return path


def resize_short_side(frame: np.ndarray, short_side: int) -> np.ndarray:
    """Resize ``[H, W, C]`` so that ``min(H, W) == short_side``, keeping the aspect ratio (``INTER_AREA``)."""
    height, width = frame.shape[:2]
    new_height, new_width = short_side_size(height, width, short_side)
    if (new_height, new_width) == (height, width):
        return frame
    return cv2.resize(frame, (new_width, new_height), interpolation=cv2.INTER_AREA)


def short_side_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """The ``(height, width)`` with the shorter side equal to ``short_side`` and the same aspect ratio."""
    if height <= width:
        return short_side, max(1, round(width * short_side / height))
    return max(1, round(height * short_side / width)), short_side


class _RGBConverter:
    """Turns decoded PyAV frames into RGB arrays, resized to a short side (state: nothing but the size)."""

    def __init__(self, short_side: int | None) -> None:
        self.short_side = short_side

    def __call__(self, frame) -> np.ndarray:
        rgb = frame.to_ndarray(format="rgb24")
        return rgb if self.short_side is None else resize_short_side(rgb, self.short_side)


def _open(path: Path):
    import av  # noqa: PLC0415 (optional)

    if not path.is_file():
        raise VideoDecodeError(f"{path}: video file not found")
    if path.stat().st_size == 0:
        raise VideoDecodeError(f"{path}: the file is empty")
    try:
        container = av.open(str(path), mode="r")
    except (av.FFmpegError, OSError, ValueError) as error:
        raise VideoDecodeError(f"{path}: cannot open as a video: {error}") from None
    try:
        format_names = set(container.format.name.split(","))
        if format_names & _NOT_VIDEO_FORMATS or any(name.endswith("_pipe") for name in format_names):
            raise VideoDecodeError(f"{path}: not a video (FFmpeg reads it as {container.format.name!r})")
        if not container.streams.video:
            raise VideoDecodeError(f"{path}: the file has no video stream")
        stream = container.streams.video[0]
        if stream.codec_context.name in _NOT_VIDEO_CODECS:
            raise VideoDecodeError(f"{path}: not a video (codec {stream.codec_context.name!r})")
        stream.thread_type = "AUTO"
    except BaseException:
        container.close()
        raise
    return container


def _decoded_frames(container, stream, path: Path) -> Iterator:
    """Decoded frames in presentation order; FFmpeg errors become VideoDecodeError naming the file."""
    import av  # noqa: PLC0415 (optional)

    try:
        yield from container.decode(stream)
    except (av.FFmpegError, OSError, ValueError) as error:
        raise VideoDecodeError(f"{path}: corrupt video data: {error}") from None


def _frame_rate(stream) -> Fraction | None:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return Fraction(rate) if rate and rate > 0 else None


def _expected_frames(container, stream, fps: Fraction) -> int | None:
    """The frame count the header announces (or its duration implies), to detect truncated files."""
    if stream.frames and stream.frames > 0:
        return int(stream.frames)
    if stream.duration and stream.time_base:
        return int(stream.duration * stream.time_base * fps)
    if container.duration and container.duration > 0:
        return int(Fraction(container.duration, 1_000_000) * fps)
    return None


def _resample(frames: Iterator, convert: _RGBConverter, stream, source_fps: Fraction, fps: float,
              counter: VideoReader) -> Iterator[np.ndarray]:
    """Sample frames at times ``k / fps``, yielding the output frames; counts decoded frames on ``counter``.

    Output ``k`` takes the source frame with the nearest timestamp (ties go to the later frame), so the
    millisecond rounding of Matroska timestamps does not drop frames; the video lasts until its last frame
    plus one source frame period. Only the frames that are sampled are converted to RGB.
    """
    target = Fraction(fps).limit_denominator(1_000_000)
    time_base = stream.time_base
    previous = None
    previous_rgb: np.ndarray | None = None
    previous_time = Fraction(0)
    first_time: Fraction | None = None
    next_index = 0
    for frame in frames:
        time = _frame_time(frame, time_base, counter.decoded, source_fps)
        if first_time is None:
            first_time = time
        time -= first_time
        if previous is not None:
            midpoint = (previous_time + time) / 2
            while Fraction(next_index) / target < midpoint:
                if previous_rgb is None:
                    previous_rgb = convert(previous)
                yield previous_rgb
                next_index += 1
        previous, previous_rgb, previous_time = frame, None, time
        counter.decoded += 1
    if previous is not None:
        end = previous_time + 1 / source_fps
        last = max(next_index, round(end * target))
        if last > next_index:
            previous_rgb = convert(previous)
            for _ in range(last - next_index):
                yield previous_rgb


def _frame_time(frame, time_base, index: int, source_fps: Fraction) -> Fraction:
    if frame.pts is None or time_base is None:
        return index / source_fps
    return frame.pts * time_base
