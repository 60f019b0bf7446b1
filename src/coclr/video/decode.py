"""Video decoding with PyAV: probe a file, decode it to RGB frames, resample the frame rate, resize.

Every container FFmpeg reads works (AVI/XviD, MP4/H.264, MKV, WebM, ...). Decoding uses FFmpeg's own
threads; frames are converted to RGB by libswscale and resized with OpenCV's ``INTER_AREA``, which averages
every source pixel a target pixel covers: the anti-aliased choice for the downscaling a clip store does
(bilinear sampling would skip pixels and alias fine texture); on a 340x256 H.264 clip it cost less than
swscale's own area filter and within 6% of its bicubic one, and it is deterministic (``docs/store.md``).

A file that cannot be decoded completely (corrupt, truncated, empty, not a video, or with more damaged frames than
:data:`DAMAGE_TOLERANCE` allows) raises :class:`~coclr.errors.VideoDecodeError` naming the file, so one bad video in a
dataset of thousands is reported and skipped instead of silently giving a short, empty or garbled clip.

Frames are what a player shows: turned as the file's display matrix (or legacy ``rotate`` tag) says, timed by their
presentation timestamps (variable frame rate, edit lists, a clock that does not start at 0), and counted damaged when
the decoder reports them corrupt (``docs/store.md``, "Decoding and resizing"). Pixels are taken as coded, as OpenCV,
decord, torchvision and the reference implementation's frame extraction take them: a file whose pixels are not
square (a sample aspect ratio other than 1: DV, DVD and HDV footage, and Kinetics clips scaled to 340x256 that keep
their display aspect so) is read at its coded width, and the aspect is reported (:func:`pixel_aspect`).

Example::

    frames = decode_video("v_ApplyEyeMakeup_g01_c01.avi", short_side=128, fps=25)  # uint8 [N, 128, 171, 3]
"""

from __future__ import annotations

import functools
import gc
import math
import os
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from coclr.errors import VideoDecodeError, why_no_file

VIDEO_EXTENSIONS = (".avi", ".mp4", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg", ".flv", ".wmv", ".3gp", ".3g2",
                    ".m2ts", ".m2t", ".mxf", ".ogv", ".vob", ".asf", ".f4v", ".mk3d", ".qt", ".dv", ".divx", ".rmvb",
                    ".y4m", ".nut", ".ivf")
"""File name endings taken as videos without opening the file. Any other file is a video when PyAV opens it as one
(:func:`why_not_video`): so ``.ts`` and ``.mts`` (MPEG transport streams, but also TypeScript sources) are decided
by their content."""

NOT_VIDEO_EXTENSIONS = (".txt", ".csv", ".tsv", ".lst", ".json", ".jsonl", ".yaml", ".yml", ".xml", ".md", ".rst",
                        ".html", ".htm", ".log", ".py", ".sh", ".ini", ".cfg", ".toml", ".srt", ".vtt", ".ass",
                        ".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".heic", ".svg",
                        ".wav", ".mp3", ".flac", ".aac", ".m4a", ".oga", ".opus", ".wma",
                        ".npy", ".npz", ".pth", ".pt", ".pkl", ".h5", ".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz",
                        ".7z", ".pdf", ".doc", ".docx", ".frames")
"""File name endings of text, images, sound, arrays and archives (a clip store's ``.frames``: JPEG frames packed):
not videos, and not opened to find out."""

SKIPPED_BYTES_TOLERANCE = 16384
"""Bytes of a Matroska or WebM file between two packets that no packet covers, above which the file is corrupt: a
healthy file has a few dozen bytes of block and cluster headers there (29 at most in the real clip measured), a
damaged cluster that FFmpeg skipped tens of kilobytes (200,662 bytes for 4 KB of random bytes)."""

DAMAGE_TOLERANCE = 0.10
"""A video may have at most this fraction of damaged frames (reported corrupt by the decoder or the demuxer,
predicted from one until the next key frame, or lost at the damage: :class:`_Damage`); more is a
:class:`VideoDecodeError`. Fewer are kept and counted (``damaged``)."""

# Demuxers that accept almost any file (text as ANSI art, single images): such a file is not a video.
_NOT_VIDEO_FORMATS = frozenset({"tty", "image2", "bin", "lavfi"})
_NOT_VIDEO_CODECS = frozenset({"ansi", "bintext", "xbin", "idf"})
_ATTACHED_PIC = 0x0400  # AV_DISPOSITION_ATTACHED_PIC: a cover picture, not a video

# A decode that yields fewer frames than the header promises by more than this is a truncated file.
# Headers of sound files are off by a frame or two (an AVI that ffmpeg pads to 165 frames decodes 164).
DECODE_THREADS = 2
"""Decoder threads per video (FFmpeg's frame or slice threading): fixed, so that every machine decodes a damaged
stream's concealed frames alike; decoding is parallel across videos, in worker processes."""
_TRUNCATION_TOLERANCE_FRAMES = 3
_TRUNCATION_TOLERANCE_FRACTION = 0.05


@dataclass(frozen=True)
class VideoInfo:
    """What a video holds: frame count (exact when ``probe_video(exact=True)``), frame rate and size as decoded
    (after the turn its display matrix asks for: ``rotation`` degrees clockwise, then ``mirrored`` left-right)."""

    frames: int
    fps: float
    width: int
    height: int
    rotation: int = 0
    mirrored: bool = False


def probe_video(path: str | Path, exact: bool = False) -> VideoInfo:
    """Frame count, frame rate and size of the video stream of ``path``.

    The frame count comes from the container header; when the header has none (Matroska, WebM) or when
    ``exact`` is set, the frames are counted by decoding the whole stream (what :func:`decode_video`
    returns). The first frame is decoded to read the display matrix.
    """
    path = Path(path)
    with _open(path) as container:
        stream = _video_stream(container)
        rate = _frame_rate(stream)
        if rate is None:
            raise VideoDecodeError(f"{path}: the video stream has no frame rate")
        fps = float(rate)
        width, height = stream.codec_context.width, stream.codec_context.height
        frames = int(stream.frames or 0)
        decoded = _decoded_frames(container, stream, path)
        first = next(decoded, None)
        turn = Orientation.of(first, stream, path) if first is not None else Orientation()
        if frames <= 0 or exact:
            frames = (first is not None) + sum(1 for _ in decoded)
    if width <= 0 or height <= 0:
        raise VideoDecodeError(f"{path}: the video stream has no frame size")
    if turn.rotation in (90, 270):
        width, height = height, width
    return VideoInfo(frames=frames, fps=fps, width=width, height=height, rotation=turn.rotation,
                     mirrored=turn.mirrored)


def decode_video(path: str | Path, short_side: int | None = None, fps: float | None = None) -> np.ndarray:
    """Decode every frame of ``path`` as ``uint8 [N, H, W, 3]`` RGB.

    Args:
        path: the video file.
        short_side: resize so that the shorter side has this many pixels, keeping the aspect ratio
            (``INTER_AREA``); ``None`` keeps the decoded size.
        fps: resample to this frame rate by timestamps: output frame ``k`` is the source frame whose
            timestamp is nearest to ``k / fps`` (frames are repeated or dropped; FFmpeg's ``fps`` filter keeps
            the last of the source frames that round to one output frame, so 30 -> 10 gives it frames 1, 4, 7
            where nearest gives 0, 3, 6: docs/store.md), and
            the output lasts ``round(duration * fps)`` frames; ``None`` keeps every decoded frame.

    Raises:
        VideoDecodeError: the file is missing, not a video, corrupt, empty, truncated or too damaged.
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
    memory (``with VideoReader(path, 128) as reader: for frame in reader: ...``; :meth:`timed` also gives each
    frame's time).

    Opening checks the file (missing, empty, not a video, no frame rate: :class:`VideoDecodeError`). Iterating
    yields ``uint8 [H, W, 3]`` RGB frames, turned as the display matrix says, and raises :class:`VideoDecodeError`
    when a packet cannot be decoded or a Matroska stretch was skipped (:func:`_decoded_frames`), when no frame
    decodes, and, after the last frame, when fewer frames decoded than the header announces or they end before its
    duration (a truncated file), or when more than :data:`DAMAGE_TOLERANCE` of them are damaged.
    ``fps`` is the rate of the frames yielded; ``decoded`` counts the source frames so far, ``damaged`` the
    damaged ones among them and those lost at the damage (:class:`_Damage`), ``lost`` the latter;
    ``pixel_aspect`` is the aspect of a pixel a player would apply; ``orientation`` is known once the first frame
    is decoded; ``end_time`` (seconds from the first frame) once the last one is.
    State: the open container (closed at the end of the iteration or by :meth:`close`).
    """

    def __init__(self, path: str | Path, short_side: int | None = None, fps: float | None = None) -> None:
        self.path = Path(path)
        if short_side is not None and short_side < 1:
            raise ValueError(f"short_side must be positive, got {short_side}")
        if fps is not None and not fps > 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self._container = _open(self.path)
        self._stream = _video_stream(self._container)
        source_fps = _frame_rate(self._stream)
        if source_fps is None:
            self.close()
            raise VideoDecodeError(f"{self.path}: the video stream has no frame rate")
        self.source_fps = source_fps
        self.expected = int(self._stream.frames) if self._stream.frames and self._stream.frames > 0 else None
        self.expected_end = None if self.expected is not None else _expected_end(self._container, self._stream)
        self.fps = float(fps if fps is not None else source_fps)
        self._target_fps = fps
        self._coded_pixel_aspect = pixel_aspect(self._stream)
        self._converter = _RGBConverter(short_side)
        self.short_side = short_side
        self.decoded = 0
        self.damaged = 0
        self.lost = 0
        self.orientation = Orientation()
        self.end_time: float | None = None
        self._clock = _Clock(self._stream.time_base, source_fps)
        self._end: int | Fraction | None = None
        self._end_on_stream_clock: Fraction | None = None
        self._discarded = [0]

    @property
    def pixel_aspect(self) -> Fraction:
        """A pixel's width over its height in the frames as shown (1: square; the frames keep the coded width): the
        coded picture's, inverted where the frames are turned a quarter (a player stretches the coded 80 x 48 of
        pixels twice as wide to 160 x 48 and turns it to 48 x 160, whose pixels are then twice as tall as wide).
        Known once the first frame is decoded (:attr:`orientation`)."""
        turned = self.orientation.rotation in (90, 270)
        return 1 / self._coded_pixel_aspect if turned else self._coded_pixel_aspect

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None

    def __iter__(self) -> Iterator[np.ndarray]:
        for frame, _ in self.timed():
            yield frame

    def timed(self) -> Iterator[tuple[np.ndarray, float]]:
        """``(frame, time)`` pairs: the frames of the iteration and when each is shown, in seconds from the first
        frame (from the presentation timestamps; with ``fps``, ``k / fps`` for output frame ``k``)."""
        if self._container is None:
            raise ValueError(f"{self.path}: the reader is closed")
        try:
            frames, clock = self._source_frames(), self._clock
            if self._target_fps is None:
                for frame, ticks in frames:
                    yield self._converter(frame), clock.seconds(ticks)
                self.end_time = None if self._end is None else clock.seconds(self._end)
            else:
                self.end_time = yield from _resample(frames, self._converter, self._target_fps, clock,
                                                     lambda: self._end)
            self._check_complete()
        finally:
            self.close()

    def _source_frames(self) -> Iterator[tuple[object, int | Fraction]]:
        """The decoded frames with their times in ticks of the clock (:class:`_Clock`); sets the orientation from the
        first frame, counts the decoded and damaged frames, and the end time after the last."""
        clock = self._clock
        damage = _Damage(clock)
        held = None  # each frame is timed once the next one is observed
        for frame in _decoded_frames(self._container, self._stream, self.path, self._discarded, damage):
            if self.decoded == 0:
                self.orientation = self._converter.orientation = Orientation.of(frame, self._stream, self.path)
            clock.observe(frame)
            self.damaged = damage(frame)
            self.lost = damage.lost
            self.decoded += 1
            if held is not None:
                yield held, clock.time(held)
            held = frame
        if held is not None:
            yield held, clock.time(held)
            self._end = clock.end()  # (from stamp 0, or from the first frame where that is later: a stream that starts
            self._end_on_stream_clock = max(clock.on_stream_clock(self._end), self._end * clock.unit)  # at a
            # negative stamp, its clock having wrapped, counts its duration from its first frame)

    def _check_complete(self) -> None:
        expected = self.expected
        if self.decoded == 0:
            raise VideoDecodeError(f"{self.path}: no video frame could be decoded")
        # The frames a header counts include those never shown: before an MP4 edit list's start (discarded
        # packets), and an AVI's dropped frames (no packet, a gap in the timestamps): a truncated file misses frames
        # at its end, which neither accounts for
        spanned = self.decoded if self._end is None else max(
            self.decoded, round(self._clock.seconds(self._end) * float(self.source_fps)))
        shown = spanned + self._discarded[0]
        if expected is not None and shown < expected - max(_TRUNCATION_TOLERANCE_FRAMES,
                                                           _TRUNCATION_TOLERANCE_FRACTION * expected):
            raise VideoDecodeError(f"{self.path}: truncated or corrupt: decoded {self.decoded} of the {expected} "
                                   "frames its header announces")
        end, announced = self._end_on_stream_clock, self.expected_end
        if announced is not None and end is not None and end < announced - max(
                _TRUNCATION_TOLERANCE_FRAMES / self.source_fps, _TRUNCATION_TOLERANCE_FRACTION * announced):
            raise VideoDecodeError(f"{self.path}: truncated or corrupt: its frames end at {float(end):.2f} s of the "
                                   f"{float(announced):.2f} s its header announces")
        frames = self.decoded + self.lost
        if self.damaged > DAMAGE_TOLERANCE * frames:
            lost = f", {self.lost} of them lost at the damage" if self.lost else ""
            raise VideoDecodeError(f"{self.path}: damaged: {self.damaged} of its {frames} frames "
                                   f"({100 * self.damaged / frames:.0f}%, more than "
                                   f"{100 * DAMAGE_TOLERANCE:.0f}%{lost}) are corrupt as the decoder or demuxer "
                                   "reports, or predicted from a corrupt one; get an intact copy of the file")


@dataclass(frozen=True)
class Orientation:
    """How a player turns the decoded picture: ``rotation`` degrees clockwise (0, 90, 180, 270), then ``mirrored``
    left-right. Read from the display matrix the decoder attaches to a frame (FFmpeg's rules of ``ffmpeg``'s
    autorotation, fftools), else from the legacy ``rotate`` tag of the stream (degrees clockwise)."""

    rotation: int = 0
    mirrored: bool = False

    @classmethod
    def of(cls, frame, stream, path: Path) -> Orientation:
        """The orientation of ``frame`` of ``stream`` (file ``path``, named in the error for a turn that is not a
        quarter turn, which no frame array can show without resampling)."""
        matrix = _display_matrix(frame)
        if matrix is not None:
            return cls._of_matrix(matrix, path)
        tag = next((value for key, value in (stream.metadata or {}).items() if key.lower() == "rotate"), None)
        if tag is None:
            return cls()
        try:
            degrees = float(tag) % 360
        except ValueError:
            degrees = math.nan
        if not math.isfinite(degrees):
            raise VideoDecodeError(f"{path}: the stream's rotate tag {tag!r} is not a number of degrees")
        return cls(_quarter_turns(degrees, path) * 90)

    @classmethod
    def _of_matrix(cls, m: Sequence[int], path: Path) -> Orientation:
        # av_display_rotation_get, then fftools' get_rotation and its choice of transpose/flip filters.
        scale0, scale1 = math.hypot(m[0], m[3]), math.hypot(m[1], m[4])
        if scale0 == 0 or scale1 == 0:
            return cls()
        theta = -round(-math.degrees(math.atan2(m[1] / scale1, m[0] / scale0)))
        theta -= 360 * math.floor(theta / 360 + 0.9 / 360)
        turns = _quarter_turns(theta, path)
        if turns == 1:  # transpose=clock, or cclock_flip (the transpose: a clockwise turn, then a mirror)
            return cls(90, m[3] > 0)
        if turns == 3:  # transpose=cclock, or clock_flip (a counterclockwise turn, then a mirror)
            return cls(270, m[3] < 0)
        if turns == 2:  # hflip and/or vflip
            hflip, vflip = m[0] < 0, m[4] < 0
            return cls(180, False) if hflip and vflip else cls(0, True) if hflip else cls(180, True) if vflip \
                else cls()
        return cls(180, True) if m[4] < 0 else cls()  # vflip

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """``frame`` ``[H, W, C]`` as shown."""
        if self.rotation:
            frame = np.rot90(frame, -self.rotation // 90)
        if self.mirrored:
            frame = frame[:, ::-1]
        return np.ascontiguousarray(frame) if self else frame

    def __bool__(self) -> bool:
        return bool(self.rotation or self.mirrored)


def _quarter_turns(degrees: float, path: Path) -> int:
    turns = round(degrees / 90)
    if abs(degrees - 90 * turns) >= 1.0:
        raise VideoDecodeError(f"{path}: its display matrix turns the picture by {degrees:.0f} degrees, not a multiple "
                               "of 90; re-encode it upright (ffmpeg -i IN OUT applies the turn)")
    return turns % 4


def _display_matrix(frame) -> list[int] | None:
    """The 3x3 display matrix (9 int32, FFmpeg's layout) the decoder attached to ``frame``, or None."""
    from av.sidedata.sidedata import Type  # noqa: PLC0415 (optional)

    for data in frame.side_data:
        if data.type == Type.DISPLAYMATRIX:
            raw = bytes(data)
            if len(raw) >= 36:
                return np.frombuffer(raw[:36], "<i4").tolist()
    return None


RESTART_PERIODS = 2
"""A frame stamped more than this many frame periods before the previous one starts a new stretch of stamps (see
:class:`_Clock`); a smaller step back is jitter, timed with the previous frame."""


class _Clock:
    """The time of each decoded frame from the first one, in ticks of the stream's time base (exact integers, so that
    timing costs a few integer operations a frame; :meth:`seconds` converts): FFmpeg's best-effort timestamp
    (``guess_correct_pts``: the frame's pts, unless pts went backwards more often than dts, as the packed B-frames
    of AVI files make them, then its dts), decided with one frame of hindsight (:meth:`observe` the next frame
    before asking the :meth:`time` of this one), so that the frame just before the first backward pts is timed by
    its dts too. A frame without either timestamp comes one frame period (``1 / fps``) after the previous one
    (without a time base, ticks are frame periods); time never runs backwards: a stamp a little before the previous
    frame's is timed with it, and one more than :data:`RESTART_PERIODS` frame periods before it restarts the
    timeline one period after it (segments of a recording joined into one file, each stamped from its own start).
    State: the counts of faulty timestamps, the last ones, the first stamp, the previous time and duration."""

    def __init__(self, time_base: Fraction | None, fps: Fraction) -> None:
        self.has_base = bool(time_base)
        self.unit = Fraction(time_base) if time_base else 1 / Fraction(fps)
        """Seconds per tick."""
        period = 1 / Fraction(fps) / self.unit
        self.period: int | Fraction = int(period) if period.denominator == 1 else period
        self.faulty_pts = self.faulty_dts = 0
        self.last_pts: int | None = None
        self.last_dts: int | None = None
        self.first: int | Fraction | None = None
        self.previous: int | Fraction | None = None
        self.duration: int | None = None

    def observe(self, frame) -> None:
        """Count ``frame``'s timestamps that do not advance (decoded frames come in presentation order)."""
        pts, dts = frame.pts, frame.dts
        if dts is not None:
            self.faulty_dts += self.last_dts is not None and dts <= self.last_dts
            self.last_dts = dts
        elif pts is not None:
            self.last_dts = pts
        if pts is not None:
            self.faulty_pts += self.last_pts is not None and pts <= self.last_pts
            self.last_pts = pts
        elif dts is not None:
            self.last_pts = dts

    def stamp(self, frame) -> int | None:
        """The timestamp of ``frame`` (observed already) that its time follows: its pts, or its dts where pts went
        backwards more often (None: neither)."""
        pts, dts = frame.pts, frame.dts
        return pts if pts is not None and (dts is None or self.faulty_pts <= self.faulty_dts) else dts

    def time(self, frame) -> int | Fraction:
        """The time of ``frame`` (observed already) in ticks, frames given in order."""
        stamp = self.stamp(frame)
        following = 0 if self.previous is None else self.previous + self.period
        if stamp is None or not self.has_base:
            time = following
        else:
            if self.first is None:
                self.first = stamp - following
            time = stamp - self.first
            if self.previous is not None and time < self.previous - RESTART_PERIODS * self.period:
                self.first = stamp - following  # the stamps restarted (recordings joined, a clock that wrapped):
                time = following  # the timeline goes on, one frame period after the previous frame
            elif self.previous is not None and time < self.previous:
                time = self.previous
        self.previous = time
        self.duration = frame.duration if self.has_base else None
        return time

    def end(self) -> int | Fraction:
        """When the last frame stops being shown, in ticks: its time plus its duration (else one frame period)."""
        assert self.previous is not None
        return self.previous + (self.duration if self.duration and self.duration > 0 else self.period)

    def seconds(self, ticks: int | Fraction) -> float:
        """``ticks`` in seconds (the float nearest the exact value)."""
        if type(ticks) is int:
            return ticks * self.unit.numerator / self.unit.denominator
        return float(ticks * self.unit)

    def on_stream_clock(self, ticks: int | Fraction) -> Fraction:
        """``ticks`` (from the first frame) in seconds of the stream's own clock (from its stamp 0)."""
        return ((self.first or 0) + ticks) * self.unit


LOSS_REACH = 2
"""Frame periods after a frame flagged corrupt, or one that reached a corrupt packet's stamp, within which a jump of
the timestamps counts as frames lost (:class:`_Damage`): a hole in a transport stream flags the packet it cut into,
and the packets it swallowed whole follow it (measured: the jump one frame after it)."""


class _Damage:
    """Counts damaged frames: those the decoder reports corrupt (``frame.is_corrupt``: FFmpeg's decode error
    flags, set when it concealed errors, or its corrupt flag), those shown from the time of a packet the demuxer
    reports corrupt (``corrupt_packets``: an MPEG transport stream's damaged packet decodes without a flag), every
    frame after one until the next key frame, since those predict from it (a 4 KB hole in an H.264 P-frame visibly
    spoils every frame up to the next IDR frame, while the decoder flags one), and the frames lost where the
    timestamps jump at the damage (``lost``: within :data:`LOSS_REACH` frame periods after a flagged frame or a
    corrupt packet's time; a hole in a transport stream loses frames without a trace but the jump; a jump elsewhere
    is a variable frame rate), on the stamps of ``clock`` (:class:`_Clock`; none without a time base).
    State: the counts, whether damage is spreading, the corrupt packets not reached yet and the last stamp."""

    def __init__(self, clock: _Clock | None = None) -> None:
        self.frames = 0
        self.lost = 0
        self.spreading = False
        self.corrupt_packets: list[int | None] = []
        """Presentation stamps of corrupt packets whose frames were not decoded yet (None: a packet without one,
        reached by the next frame)."""
        self.clock = clock if clock is not None and clock.has_base else None
        self.period = self.clock.period if self.clock is not None else None
        self.last_pts: int | None = None
        self.reached: int | None = None
        """The stamp of the last frame that was flagged corrupt or reached a corrupt packet's."""

    def __call__(self, frame) -> int:
        """Count ``frame`` (observed by the clock already); returns the damaged frames so far."""
        pts = self.clock.stamp(frame) if self.clock is not None else frame.pts
        reached = False
        if self.corrupt_packets:
            reached = any(stamp is None or pts is None or stamp <= pts for stamp in self.corrupt_packets)
            self.corrupt_packets = [stamp for stamp in self.corrupt_packets
                                    if not (stamp is None or pts is None or stamp <= pts)]
        if self.period and pts is not None and self.last_pts is not None and (
                reached or (self.reached is not None
                            and 0 <= self.last_pts - self.reached <= LOSS_REACH * self.period)):
            lost = max(0, round((pts - self.last_pts) / self.period) - 1)  # (a stamp back, a restart: none)
            self.lost += lost
            self.frames += lost
        if (reached or frame.is_corrupt) and pts is not None:
            self.reached = pts
        if frame.is_corrupt or reached:
            self.spreading = True
        elif frame.key_frame:
            self.spreading = False
        self.frames += self.spreading
        if pts is not None:
            self.last_pts = pts
        return self.frames


def decode_frames_between(path: str | Path, start: float, end: float, short_side: int | None = None,
                          fps: float | None = None) -> np.ndarray:
    """The frames shown between ``start`` and ``end`` seconds (times as :meth:`VideoReader.timed` gives them; a
    frame is shown from its time to the next frame's) as ``uint8 [N, H, W, 3]``, read in one streaming pass that
    stops at ``end``; when none is, the last frame."""
    kept: list[np.ndarray] = []
    last: np.ndarray | None = None
    last_time = 0.0
    with VideoReader(path, short_side, fps) as reader:
        for frame, time in reader.timed():
            if last is not None and last_time < end and time > start:
                kept.append(last)
            last, last_time = frame, time
            if time >= end:
                break
        else:
            if last is not None and last_time < end and (reader.end_time is None or reader.end_time > start):
                kept.append(last)
    if not kept:
        assert last is not None
        kept.append(last)
    return np.stack(kept)


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


@functools.cache
def spare_children_our_garbage() -> None:
    """From now on, a child this process forks never frees, by its garbage collector, what this process held when
    it forked (once registered, for the process's life): the parent freezes its objects before the fork
    (``gc.freeze``: its collector's permanent generation, which the child inherits) and unfreezes them after it.

    FFmpeg's scalers run slice threads: a PyAV frame or stream left in a reference cycle and freed by the garbage
    collector of a forked child (a DataLoader worker) waits forever in ``pthread_cond_destroy`` for threads the
    child does not have (a learn run hung so in curation). Left to the parent's collector, where those threads are,
    it is freed cleanly, and a fork costs no collection of the parent's objects. Called where PyAV is used, so a
    process that never decodes changes nothing."""
    os.register_at_fork(before=gc.freeze, after_in_parent=gc.unfreeze)


X264_EXACT = {"threads": "1", "x264-params": "asm=0"}
"""x264 on one thread, without its SIMD code: with that code the file depends on what the process encoded before (a
read of memory it did not write: the same frames, encoded twice, decoded up to 191 levels apart), and its threads
change the file with their count, so an altered copy, and the threshold calibrated on it, were not the same twice.
Without both, the same frames give the same bytes (docs/curate.md: what it costs)."""


def write_mp4(path: str | Path, frames: np.ndarray, fps: float, codec: str = "libx264", crf: int = 18) -> Path:
    """Encode ``uint8 [N, H, W, 3]`` RGB frames as an MP4 file (``yuv420p``; H.264 at CRF ``crf``, 18 by default,
    which needs even sizes), for test and benchmark videos and altered copies. The same frames give the same file
    on any machine, whatever ran before in the process (:data:`X264_EXACT`). Raises :class:`VideoDecodeError`
    naming the file when FFmpeg cannot encode it."""
    import av  # noqa: PLC0415 (optional)

    spare_children_our_garbage()

    path = Path(path)
    try:
        with av.open(str(path), mode="w", format="mp4") as container:
            stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf), **X264_EXACT} if codec == "libx264" else {}
            for number, frame in enumerate(frames):
                picture = av.VideoFrame.from_ndarray(frame, format="rgb24")
                picture.pts = number
                for packet in stream.encode(picture):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    except av.FFmpegError as error:
        raise VideoDecodeError(f"{path}: cannot encode MP4 with codec {codec!r}: {error}") from None
    return path


def is_video_name(path: str | Path) -> bool:
    """Whether the name of ``path`` ends in one of :data:`VIDEO_EXTENSIONS`: a video without opening it."""
    return str(path).lower().endswith(VIDEO_EXTENSIONS)


def why_not_video(path: str | Path) -> str | None:
    """None when the file ``path`` is a video, else why not (a few words). The one rule of which files are videos
    (the inputs of ``coclr embed``, its folder scans, ``coclr data index --format folder``): a name ending in
    :data:`VIDEO_EXTENSIONS` is one (a broken one fails when decoded); a name ending in :data:`NOT_VIDEO_EXTENSIONS`
    is not; any other file (``.ts``, ``.MTS``, no extension ...) is one when PyAV opens it and finds a video stream
    in a video container (``_open``'s checks), whatever its extension."""
    path = Path(path)
    if is_video_name(path):
        return None
    if path.name.lower().endswith(NOT_VIDEO_EXTENSIONS):
        return f"its name ends in {path.suffix}"
    try:
        _open(path).close()
    except VideoDecodeError as error:
        text = str(error)
        return text[len(f"{path}: "):] if text.startswith(f"{path}: ") else text
    return None


def size_change(first: np.ndarray, frame: np.ndarray, number: int, short_side: int | None) -> str | None:
    """Why frame ``number`` of a video cannot follow its ``first`` (None when it can): its size changed mid-stream
    (a stream spliced from two encodings), and a clip, a store entry or a window holds frames of one size. The sizes
    are the frames' as decoded, at ``short_side`` when they were resized to it."""
    if frame.shape == first.shape:
        return None
    resized = f" (as resized to a short side of {short_side} px)" if short_side else ""
    return (f"the frame size changes mid-stream, from {first.shape[1]}x{first.shape[0]} to {frame.shape[1]}x"
            f"{frame.shape[0]} at frame {number}{resized}; re-encode the video at one size (e.g. ffmpeg -i IN -vf "
            "scale=W:H OUT)")


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


PIXEL_ASPECT_RANGE = (Fraction(1, 4), Fraction(4))
"""Sample aspect ratios reported (:func:`pixel_aspect`); one outside (a damaged or nonsensical header) is taken as
square pixels."""


def pixel_aspect(stream) -> Fraction:
    """The width of a pixel of ``stream`` over its height as a player shows it (FFmpeg's guess from the container
    and the codec: ``sample_aspect_ratio``); 1 when unset or outside :data:`PIXEL_ASPECT_RANGE`. Frames are decoded
    at their coded size all the same (the module docstring); this is what is recorded of them."""
    aspect = stream.sample_aspect_ratio
    if not aspect or not PIXEL_ASPECT_RANGE[0] <= Fraction(aspect) <= PIXEL_ASPECT_RANGE[1]:
        return Fraction(1)
    return Fraction(aspect)


class _RGBConverter:
    """Turns decoded PyAV frames into RGB arrays as shown: resized to a short side in the coded orientation, then
    turned (:class:`Orientation`: the turn moves pixels only, so resizing first costs less and gives the same
    size). State: the size and the orientation."""

    def __init__(self, short_side: int | None) -> None:
        self.short_side = short_side
        self.orientation = Orientation()

    def __call__(self, frame) -> np.ndarray:
        rgb = frame.to_ndarray(format="rgb24", **_one_thread())  # the same pixels as on every thread, and no
        # threads left behind a frame (decoding runs in parallel processes already; spare_children_our_garbage)
        if self.short_side is not None:
            rgb = resize_short_side(rgb, self.short_side)
        return self.orientation(rgb)


@functools.cache
def _one_thread() -> dict[str, int]:
    """``reformat``'s option for one thread, where PyAV has it (17 and later, whose reformatting is threaded)."""
    import av  # noqa: PLC0415 (optional)

    return {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}


def _open(path: Path):
    import av  # noqa: PLC0415 (optional)

    spare_children_our_garbage()
    if not path.is_file():
        raise VideoDecodeError(f"{path}: {why_no_file(path, 'video file')}")
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
        stream = _video_stream(container, path)
        if stream.codec_context.name in _NOT_VIDEO_CODECS:
            raise VideoDecodeError(f"{path}: not a video (codec {stream.codec_context.name!r})")
        # Threads fixed, not FFmpeg's default of one per core: a damaged stream's concealed pixels depend on the
        # thread count, so a video would embed otherwise on another machine
        stream.thread_type, stream.thread_count = "AUTO", DECODE_THREADS
    except BaseException:
        container.close()
        raise
    return container


def _video_stream(container, path: Path | None = None):
    """The first video stream that is not a still picture (a cover image attached to a sound file is not a video);
    with ``path``, none is a :class:`VideoDecodeError` naming it."""
    for stream in container.streams.video:
        if not int(getattr(stream, "disposition", 0)) & _ATTACHED_PIC:
            return stream
    if path is None:
        raise AssertionError("opened without a video stream")
    if container.streams.video:
        raise VideoDecodeError(f"{path}: the file has no video stream, only a still picture (cover art)")
    raise VideoDecodeError(f"{path}: the file has no video stream")


def _decoded_frames(container, stream, path: Path, discarded: list[int] | None = None,
                    damage: _Damage | None = None) -> Iterator:
    """Decoded frames in presentation order; a packet FFmpeg cannot decode (its frame is lost) becomes
    VideoDecodeError naming the file, and so does, in Matroska and WebM, a stretch of the file that no packet of any
    stream covers (:data:`SKIPPED_BYTES_TOLERANCE`): FFmpeg's Matroska reader skips a damaged cluster without an
    error and goes on at the next one, so the frames it held are lost in silence (and those files announce no
    frame count to miss). ``discarded[0]`` counts the packets the container marks as never shown; the stamps of
    the packets the demuxer marks corrupt go to ``damage`` (:class:`_Damage`)."""
    import av  # noqa: PLC0415 (optional)

    watch = "matroska" in container.format.name
    end: int | None = None
    cut = False  # a packet of the stream was cut short (a file's end)
    try:
        for packet in container.demux() if watch else container.demux(stream):
            if watch and packet.pos is not None and packet.pos >= 0 and packet.size:
                if end is not None and packet.pos - end > SKIPPED_BYTES_TOLERANCE:
                    raise VideoDecodeError(f"{path}: corrupt: the {packet.pos - end} bytes from offset {end} are no "
                                           "readable part of the file (FFmpeg skipped them), and the frames they held "
                                           "are lost")
                end = max(end or 0, packet.pos + packet.size)
            if packet.stream_index != stream.index:
                continue
            cut = cut or packet.is_corrupt
            if packet.is_corrupt and damage is not None:
                damage.corrupt_packets.append(packet.pts)
            if discarded is not None and getattr(packet, "is_discard", False):
                discarded[0] += 1  # decoded for its references, never shown: before an MP4 edit list's start
            try:
                frames = packet.decode()
            except av.FFmpegError:
                if cut:  # its frame is missing, which the truncation check judges; the error (at that packet or a
                    continue  # later one, as the decoder's threads have it) was raised or swallowed by thread count
                raise
            yield from frames
    except (av.FFmpegError, OSError, ValueError) as error:
        raise VideoDecodeError(f"{path}: corrupt video data: a packet could not be decoded: {error}") from None


def _frame_rate(stream) -> Fraction | None:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return Fraction(rate) if rate and rate > 0 else None


def _expected_end(container, stream) -> Fraction | None:
    """When a header without a frame count says the video ends, in seconds, to detect truncated files (Matroska,
    WebM). Compared with when the last frame ends on the stream's own clock, which may start late: a duration that
    counts from the first frame (MPEG-TS) is then passed by that much, never missed, and a variable frame rate does
    not matter (a frame count from duration * rate would be wrong for it)."""
    if stream.duration and stream.time_base:
        return stream.duration * Fraction(stream.time_base)
    if container.duration and container.duration > 0:
        return Fraction(container.duration, 1_000_000)
    return None


def _resample(frames: Iterator[tuple[object, int | Fraction]], convert: _RGBConverter, fps: float, clock: _Clock,
              source_end: Callable[[], int | Fraction | None]) -> Generator[tuple[np.ndarray, float], None,
                                                                            float | None]:
    """Sample the source frames (timed in ticks of ``clock``) at times ``k / fps``, yielding ``(output frame,
    k / fps)``; returns when the last output frame ends, in seconds (None when there was no frame).

    Output ``k`` takes the source frame with the nearest time (ties go to the later frame), so the millisecond
    rounding of Matroska timestamps does not drop frames; the video lasts until its last frame stops being shown
    (``source_end()``, read once the frames are exhausted). Only the frames that are sampled are converted to RGB.
    Comparisons are exact, in integers: output ``k`` comes before the midpoint ``(a + b) / 2`` of two source frames
    when ``2 k / (unit * fps) < a + b``.
    """
    target = Fraction(fps).limit_denominator(1_000_000)
    scale = clock.unit * target  # output frames per tick
    per_tick, ticks_per = scale.numerator, scale.denominator
    numerator, denominator = target.numerator, target.denominator
    previous = None
    previous_rgb: np.ndarray | None = None
    previous_ticks: int | Fraction = 0
    next_index = 0
    for frame, ticks in frames:
        if previous is not None:
            bound = (previous_ticks + ticks) * per_tick
            while 2 * next_index * ticks_per < bound:
                if previous_rgb is None:
                    previous_rgb = convert(previous)
                yield previous_rgb, next_index * denominator / numerator
                next_index += 1
        previous, previous_rgb, previous_ticks = frame, None, ticks
    end = source_end()
    if previous is None or end is None:
        return None
    last = max(next_index, round(end * scale), 1)  # (a video shorter than half an output frame: its one frame)
    if last > next_index:
        previous_rgb = convert(previous)
        for index in range(next_index, last):
            yield previous_rgb, index * denominator / numerator
    return last * denominator / numerator
