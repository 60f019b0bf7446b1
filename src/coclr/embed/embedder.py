"""Embed video files with a pretrained encoder: per-window and per-video vectors, any length, any container.

Pipeline: decoding workers (a DataLoader over the videos, each worker reading its share with PyAV) stream
chunks of frames, resized to the settings' short side and resampled to their frame rate, to this process,
which cuts the windows as soon as their frames have arrived, computes flow on the fly for a two-stream
embedding, and runs the encoder on batches of windows from any videos (on the GPU when present). Memory is
bounded whatever the video's length: a video's frames are kept only until its windows have been cut.

Each window is prepared exactly as ``coclr eval`` prepares a clip read from a store (centre crop of
:func:`coclr.eval.features.eval_views`, the same normalisation), and the windows are the ones
:func:`coclr.data.sampling.sliding_windows` gives for the whole video; the per-video vector is the mean of the
window features, L2-normalised. So each window's feature of a file equals the one ``coclr eval`` extracts from a
store of it, but for the store's JPEG compression of the frames (eval's video feature averages the windows each
L2-normalised first, as the authors' retrieval: docs/embed.md).

A flow stream (a flow checkpoint beside the RGB one, or a flow encoder alone): flow between consecutive frames
is computed with the PyTorch TV-L1 (:func:`coclr.flow.tvl1.tvl1_flow`) on the embedding device, from the frames'
grayscale, and quantised to the stored uint8 format with the flow encoder's bound (what the flow encoder saw in
training); every stream then uses the windows of the ``n - 1`` frames that have a flow frame (as a two-view store
sample does). A two-stream vector is the concatenation of the L2-normalised RGB and flow vectors, divided by
sqrt(2): unit length, and the cosine similarity of two such vectors is the mean of the two streams' cosine
similarities (the paper's two-stream retrieval by averaged similarities).

Example::

    embedder = Embedder("encoder_rgb.pth")
    result = embedder.embed("video.mp4")
    result.vector.shape, result.windows.shape, result.starts[:3]   # (1024,), (W, 1024), seconds
"""

from __future__ import annotations

import array
import dataclasses
import math
import numbers
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from coclr.clips import check_fps
from coclr.config import whole_number
from coclr.cpu import require_native_bfloat16
from coclr.data.augment import center_crop
from coclr.data.sampling import clip_span, sliding_windows
from coclr.distributed import pick_device
from coclr.embed.options import EmbedJob
from coclr.embed.settings import EmbedSettings, checkpoint_view, resolve_settings
from coclr.errors import CheckpointError, ConfigError, DataError, out_of_memory
from coclr.flow.encode import flow_to_uint8
from coclr.flow.opencv import DIS_MIN_SIDE, opencv_video_flow, rgb_to_gray
from coclr.flow.params import TVL1Params
from coclr.flow.tvl1 import tvl1_flow
from coclr.interrupts import loader_worker_signals
from coclr.models.heads import unit_length
from coclr.models.inference import inference_network, padded
from coclr.models.loading import load_encoder
from coclr.progress import bar as progress_bar
from coclr.threads import check_workers, usable_cores, worker_opencv_threads
from coclr.video.decode import VideoReader, size_change

CHUNK_FRAMES = 32
"""Frames a decoding worker sends at a time."""


@dataclasses.dataclass
class VideoEmbedding:
    """The embedding of one video file."""

    path: str
    vector: np.ndarray
    """``float32 [D]``: the per-video embedding (mean of the window features, L2-normalised)."""
    windows: np.ndarray
    """``float32 [W, D]``: one L2-normalised embedding per window."""
    starts: np.ndarray
    """``float64 [W]``: start time of each window in seconds from the video's first frame: when its first frame is
    shown (the frames' presentation timestamps; with the settings' ``fps``, ``k / fps`` for frame ``k``)."""
    ends: np.ndarray
    """``float64 [W]``: end time of each window in seconds (when its last frame stops being shown: the next frame's
    time, or the end of the video)."""
    fps: float
    """Frame rate of the frames the windows count (the settings' ``fps``, or the video's own average rate)."""
    frames: int
    """Frames of the video at that rate."""
    duration: float | None = None
    """Seconds from the first frame to the end of the last (``frames / fps`` when not given)."""
    damaged_frames: int = 0
    """Source frames reported damaged (by the decoder or a transport stream's demuxer), predicted from one, or lost at
    the damage (within the tolerance, else a failure)."""
    rotation: int = 0
    """Degrees the frames were turned clockwise as the file's display matrix asks (then mirrored if ``mirrored``)."""
    mirrored: bool = False
    pixel_aspect: float = 1.0
    """A source pixel's width over its height as a player shows it (1: square); the frames keep the coded width."""
    padded: bool = False
    """The video is shorter than one window (with its flow): its one window repeats its last frame."""
    parts: list[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list, repr=False)
    """With several streams, each stream's own (vector, windows), L2-normalised: what it alone embeds."""

    def __post_init__(self) -> None:
        if self.duration is None:
            self.duration = self.frames / self.fps

    def stream(self, index: int) -> VideoEmbedding:
        """The embedding of stream ``index`` alone (the same windows and times)."""
        vector, windows = self.parts[index]
        return dataclasses.replace(self, vector=vector, windows=windows, parts=[])


@dataclasses.dataclass
class EmbedFailure:
    """A video that could not be embedded, with the reason (one line)."""

    path: str
    error: str


class Embedder:
    """An encoder checkpoint (and optionally a flow encoder) ready to embed video files.

    ``Embedder(checkpoint, device=None, flow_checkpoint=None, batch_size=16, workers=None, **settings)``:
    ``device`` defaults to CUDA when available; ``workers`` decoding processes (None: up to 8, one core left to this
    process; 0: decode here); ``settings`` override any :class:`~coclr.embed.settings.EmbedSettings` key (e.g.
    ``feature="head"``, ``window_step=8``), the rest come from the checkpoint (see
    :func:`~coclr.embed.settings.resolve_settings`). State: the loaded networks on ``device`` (float32 on the CPU:
    BatchNorm folded and ReLU fused into the convolutions, :func:`~coclr.models.inference.fused_for_inference`).
    """

    def __init__(self, checkpoint: str | os.PathLike[str], device: str | torch.device | None = None,
                 flow_checkpoint: str | os.PathLike[str] | None = None, batch_size: int = EmbedJob.batch_size,
                 workers: int | None = None, **settings: Any) -> None:

        self.checkpoint = Path(checkpoint)
        self.flow_checkpoint = Path(flow_checkpoint) if flow_checkpoint is not None else None
        self.settings: EmbedSettings = resolve_settings(self.checkpoint, self.flow_checkpoint, **settings)
        short = self.settings.short_side
        if (self.settings.flow_method or {}).get("backend") == "dis" and short and short < DIS_MIN_SIDE:
            raise ConfigError(f"--short-side {short}: frames too small for DIS flow, which the flow encoder was "
                              f"trained on (it needs {DIS_MIN_SIDE} px on each side); give --short-side "
                              f"{DIS_MIN_SIDE} or more")  # (before any video: each failed alone; at its own size there)
        if not whole_number(batch_size) or batch_size < 1:
            raise ConfigError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")
        batch_size = int(batch_size)
        check_workers(workers, "workers")
        self.batch_size = batch_size
        self.workers = workers if workers is not None else max(1, min(8, usable_cores() - 1))
        self.device = pick_device(device)
        check_precision(self.settings.precision, self.device)
        checkpoints = [(self.checkpoint, checkpoint_view(self.checkpoint))]
        if self.flow_checkpoint is not None:
            checkpoints.append((self.flow_checkpoint, "flow"))
        self.streams = [_Stream.load(path, view, *self._normalisation(view), self.settings.feature, self.device,
                                     load_encoder, self.settings.precision) for path, view in checkpoints]
        self.dim = sum(stream.dim for stream in self.streams)

    def _normalisation(self, view: str) -> tuple:
        settings = self.settings
        return (settings.flow_mean, settings.flow_std) if view == "flow" else (settings.mean, settings.std)

    def embed(self, path: str | os.PathLike[str]) -> VideoEmbedding:
        """The embedding of one video; an unreadable file raises :class:`~coclr.errors.DataError` naming it."""
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"embed takes one video's path, got {type(path).__name__} {path!r:.80}; embed_many "
                              "takes many")
        for _, result in self.stream([path], workers=0):
            if isinstance(result, EmbedFailure):
                raise DataError(result.error)
            return result
        raise AssertionError("stream() yields one result per path")

    def embed_frames(self, frames: np.ndarray, fps: float, name: str = "<frames>") -> VideoEmbedding:
        """The embedding of decoded frames ``uint8 [N, H, W, 3]`` (RGB) at ``fps``, already at the settings'
        short side and frame rate (as :func:`coclr.video.decode.decode_video` gives them)."""
        if not (isinstance(frames, np.ndarray) and frames.dtype == np.uint8 and frames.ndim == 4
                and frames.shape[-1] == 3):
            raise DataError(f"{name}: expected uint8 frames [N, H, W, 3], got {getattr(frames, 'dtype', None)} "
                            f"{getattr(frames, 'shape', None)}")
        if fps is None:
            raise ConfigError("fps: the frames' rate is needed (frames per second), got None")
        if isinstance(fps, numbers.Real) and not isinstance(fps, (bool, np.bool_)):
            fps = float(fps)  # (a Fraction, as PyAV gives a stream's rate, or a NumPy number)
        check_fps(fps, "fps")  # (a rate of 0, below 0 or NaN made every window's seconds wrong, or a traceback)
        runner = _Runner(self, [name])
        times = np.arange(len(frames), dtype=np.float64) / fps
        messages = [("frames", 0, (frames[start: start + CHUNK_FRAMES], times[start: start + CHUNK_FRAMES]))
                    for start in range(0, len(frames), CHUNK_FRAMES)]
        end = ("end", 0, _end_facts(fps, len(frames) / fps))
        results = [result for message in [*messages, end] for result in runner.handle(message)]
        results += runner.finish()
        result = results[0][1]
        if isinstance(result, EmbedFailure):
            raise DataError(result.error)
        return result

    def embed_many(self, paths: Iterable[str | os.PathLike[str]], progress: bool = False,
                   skip_errors: bool = False) -> Iterator[VideoEmbedding]:
        """The embeddings of ``paths``, in their order, decoded by the worker processes meanwhile. An unreadable
        file raises :class:`~coclr.errors.DataError` naming it, or is left out with ``skip_errors``."""
        paths = path_list(paths, "embed_many")
        done: dict[int, VideoEmbedding | EmbedFailure] = {}
        next_index = 0
        for index, result in self.stream(paths, progress=progress):
            done[index] = result
            while next_index in done:
                item = done.pop(next_index)
                next_index += 1
                if isinstance(item, EmbedFailure):
                    if not skip_errors:
                        raise DataError(item.error)
                    continue
                yield item

    def stream(self, paths: Sequence[str | os.PathLike[str]], workers: int | None = None, progress: bool = False,
               desc: str = "embedding") -> Iterator[tuple[int, VideoEmbedding | EmbedFailure]]:
        """``(position in paths, result)`` for every path, in the order the videos finish; never raises for
        a bad video (it gives an :class:`EmbedFailure`). ``progress`` shows a bar with the ETA."""
        paths = path_list(paths, "stream")
        workers = self.workers if workers is None else workers
        runner = _Runner(self, paths)
        sizes = _file_sizes(paths) if progress else [1] * len(paths)
        finished = 0
        with progress_bar(total=sum(sizes), desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                          disable=not progress, dynamic_ncols=True, smoothing=0.05) as bar:

            def done(index: int, result: VideoEmbedding | EmbedFailure) -> None:
                nonlocal finished
                finished += 1
                runner.failed += isinstance(result, EmbedFailure)
                bar.set_postfix_str(f"videos={finished}/{len(paths)}" + (f", failed={runner.failed}"
                                                                         if runner.failed else ""), refresh=False)
                bar.update(sizes[index])

            for message in _decoded_messages(paths, self.settings, workers):
                for index, result in runner.handle(message):
                    done(index, result)
                    yield index, result
            for index, result in runner.finish():
                done(index, result)
                yield index, result


def _file_sizes(paths: Sequence[str]) -> list[int]:
    """Each video's bytes (at least 1: a file gone or empty), by which the progress bar counts: a video's decoding
    and windows take time in step with its length, which its bytes follow where a count of videos of any length
    does not (the ETA of a folder of short clips and one long film)."""
    sizes = []
    for path in paths:
        try:
            sizes.append(max(1, os.stat(path).st_size))
        except OSError:
            sizes.append(1)
    return sizes


# ------------------------------------------------------------------------------------------------ networks


@dataclasses.dataclass
class _Stream:
    """One network of the embedding: the view it reads, its normalisation, and a function clips -> features."""

    view: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    network: Any
    dim: int

    @classmethod
    def load(cls, checkpoint: Path, view: str, mean, std, feature: str, device: torch.device, load_encoder,
             precision: str | None = None) -> _Stream:
        """The networks of ``checkpoint`` on ``device`` (:func:`inference_network`)."""
        backbone, head = load_encoder(checkpoint, map_location="cpu")
        if feature == "head":
            if head is None:
                raise CheckpointError(f"{checkpoint}: has no projection head; embed its backbone feature instead "
                                      "(feature 'backbone')")
            dim = head.out_dim
        else:
            head, dim = None, backbone.out_channels
        return cls(view, tuple(mean), tuple(std), inference_network(backbone, head, device, precision), dim)


def check_precision(precision: str | None, device: torch.device) -> None:
    """Refuse a precision the device cannot run: bf16 on a CPU needs bfloat16 dot-product instructions (AVX-512 BF16
    or AMX, :func:`coclr.cpu.native_bfloat16`, by the CPU's flags; without them oneDNN converts to float32 and runs
    slower than float32). ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` is no such test: it is true on any CPU
    with AVX-512."""
    if precision == "bf16" and device.type == "cpu":
        require_native_bfloat16("precision", "leave the precision at float32")


def path_list(paths: Iterable[str | os.PathLike[str]], method: str) -> list[str]:
    """``paths`` as a list of strings; one path given where many are taken (a string is iterable: its characters
    were taken as paths, "/: a folder, not a video file") refused in one line."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise ConfigError(f"{method} takes a list of paths, got one ({paths!r:.80}); give [path], or embed(path)")
    return [str(p) for p in paths]


def combine(features: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-stream features ``[N, D_i]`` (or one ``[D_i]``) -> one unit vector per row: the L2-normalised streams
    concatenated and divided by sqrt(number of streams). Each stream is normalised as ``coclr eval`` normalises a
    clip's features (:func:`~coclr.models.heads.unit_length`): a stream of tiny features (an untrained or narrow
    network's can be 1e-13) is a unit vector too, not a row under ``F.normalize``'s floor that left the vector
    short and the other stream its whole weight."""
    parts = [unit_length(f.float().reshape(-1, f.shape[-1])).reshape(f.shape) for f in features]
    return torch.cat(parts, dim=-1) / math.sqrt(len(parts))


# ------------------------------------------------------------------------------------------------ decoding


def _decoded_messages(paths: Sequence[str], settings: EmbedSettings, workers: int) -> Iterator[tuple]:
    """The decoders' messages for ``paths``: ``("frames", i, (uint8 [c, H, W, 3], float64 [c] times))``, then
    ``("end", i, facts)`` (:func:`_end_facts`) or ``("error", i, message)``; from ``workers`` processes (0: decoded
    here)."""
    source = _DecodedVideos(list(paths), settings.short_side, settings.fps)
    if workers == 0 or len(paths) <= 1:
        yield from source
        return

    loader = DataLoader(source, batch_size=None, num_workers=min(workers, len(paths)), worker_init_fn=_init_decoder)
    yield from loader


def _init_decoder(_worker: int) -> None:
    loader_worker_signals()
    worker_opencv_threads()


class _DecodedVideos(torch.utils.data.IterableDataset):
    """Streams the frames of the videos, each worker its share (video ``i`` goes to worker ``i % workers``)."""

    def __init__(self, paths: list[str], short_side: int | None, fps: float | None) -> None:
        self.paths, self.short_side, self.fps = paths, short_side, fps

    def __iter__(self) -> Iterator[tuple]:

        info = torch.utils.data.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for index in range(first, len(self.paths), step):
            try:
                with VideoReader(self.paths[index], self.short_side, self.fps) as reader:
                    chunk: list[np.ndarray] = []
                    times: list[float] = []
                    first: np.ndarray | None = None
                    for number, (frame, time) in enumerate(reader.timed()):
                        first = frame if first is None else first
                        if (changed := size_change(first, frame, number, self.short_side)) is not None:
                            raise DataError(changed)  # (its windows would mix two framings: no crop makes one clip)
                        chunk.append(frame)
                        times.append(time)
                        if len(chunk) == CHUNK_FRAMES:
                            yield ("frames", index, (np.stack(chunk), np.asarray(times, np.float64)))
                            chunk, times = [], []
                    if chunk:
                        yield ("frames", index, (np.stack(chunk), np.asarray(times, np.float64)))
                    yield ("end", index, _end_facts(reader.fps, reader.end_time, reader.damaged,
                                                    reader.orientation.rotation, reader.orientation.mirrored,
                                                    reader.pixel_aspect))
            except Exception as error:  # one bad file must not stop the others
                if out_of_memory(error):  # but this machine's memory is the job's: every file would fail alike,
                    raise  # and each be skipped as failed when the job is run again
                yield ("error", index, _message(self.paths[index], error))


def _end_facts(fps: float, end: float | None, damaged: int = 0, rotation: int = 0,
               mirrored: bool = False, pixel_aspect: float = 1.0) -> dict[str, Any]:
    """What the end of a video tells the runner: its frame rate, when its last frame ends (seconds), its damaged
    frames, how its frames were turned and its pixels' aspect."""
    return {"fps": float(fps), "end": end, "damaged": int(damaged), "rotation": int(rotation),
            "mirrored": bool(mirrored), "pixel_aspect": float(pixel_aspect)}


def _message(path: str, error: BaseException) -> str:
    """The first line of an input's error, naming its file (whole: a line break in the name is not the line's)."""
    full = str(error).strip().replace(path, "\0")
    text = full.splitlines()[0].replace("\0", path) if full else type(error).__name__
    return text if path in text else f"{path}: {type(error).__name__}: {text}"


# ------------------------------------------------------------------------------------------------ windows


class _VideoWindows:
    """Cuts the windows of one video from its frames as they arrive (and its flow, for two streams).

    Windows are those of ``sliding_windows(n, length, stride, hop)`` for the final frame count ``n``: the
    ones at multiples of the hop are cut as soon as their frames are there, the last one (ending at the last
    frame) when the video ends. Frames are dropped once no window can need them.
    State: the kept frames (``base`` = index of the first kept), the flow of the kept frames, the last frame.
    """

    def __init__(self, settings: EmbedSettings) -> None:
        self.length, self.stride = settings.length, settings.stride
        self.span = clip_span(settings.length, settings.stride)
        self.hop = settings.hop
        self.with_flow = settings.computes_flow
        self.frames: list[np.ndarray] = []
        self.flow: list[np.ndarray] = []
        self.base = 0
        self.received = 0
        self.next_start = 0
        self.cut: set[int] = set()

    @property
    def available(self) -> int:
        """Frames that windows may use so far (for two streams: those with a flow frame)."""
        return self.base + (len(self.flow) if self.with_flow else len(self.frames))

    @property
    def padded(self) -> bool:
        """Whether the video (all of it arrived) is shorter than one window: its one window repeats its last frame."""
        return self.available < self.span

    def add(self, frames: np.ndarray, flow: np.ndarray | None) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Add decoded frames (and the flow frames they complete); returns the windows now complete."""
        self.frames.extend(frames)
        if flow is not None:
            self.flow.extend(flow)
        self.received += len(frames)
        ready = []
        while self.next_start + self.span <= self.available:
            ready.append(self._window(self.next_start + self.stride * np.arange(self.length)))
            self.next_start += self.hop
        self._trim()
        return ready

    def finish(self) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """The windows not cut yet, once every frame has arrived."""
        total = self.available
        if total < 1:
            raise DataError("an embedding of flow needs at least 2 frames (flow is computed between frames)"
                            if self.with_flow else "the video has no frame")
        windows = sliding_windows(total, self.length, self.stride, self.hop)
        return [self._window(indices) for indices in windows if int(indices[0]) not in self.cut]

    def _window(self, indices: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        indices = np.minimum(indices, self.available - 1)
        self.cut.add(int(indices[0]))
        local = indices - self.base
        views = {"rgb": np.stack([self.frames[i] for i in local])}
        if self.with_flow:
            views["flow"] = np.stack([self.flow[i] for i in local])
        return indices, views

    def _trim(self) -> None:
        """Drop frames before the earliest one a later window can start at."""
        keep_from = max(0, min(self.next_start, self.available - self.span))
        drop = keep_from - self.base
        if drop > 0:
            if self.with_flow:
                drop = min(drop, len(self.frames) - 1)  # the last frame pairs with the next chunk's first
                del self.flow[:drop]
            del self.frames[:drop]
            self.base += drop


# ------------------------------------------------------------------------------------------------ inference


@dataclasses.dataclass
class _Pending:
    """A video being embedded: its window cutter, the windows' features (per stream) and times."""

    path: str
    windows: _VideoWindows
    features: dict[int, list[torch.Tensor]] = dataclasses.field(default_factory=dict)
    starts: list[int] = dataclasses.field(default_factory=list)
    ends: list[int] = dataclasses.field(default_factory=list)
    times: array.array = dataclasses.field(default_factory=lambda: array.array("d"))
    """The time of every frame received (8 bytes a frame): windows are timed by their frames' timestamps."""
    queued: int = 0
    end: dict[str, Any] | None = None
    """The facts of the video's end (:func:`_end_facts`), once every frame has arrived."""
    failed: str | None = None


class _Runner:
    """Turns decoder messages into results: cuts windows, batches them through the networks, assembles videos.

    State: the videos in progress and the queue of prepared windows (normalised crops on the device).
    """

    def __init__(self, embedder: Embedder, paths: list[str]) -> None:
        self.embedder = embedder
        self.settings = embedder.settings
        self.paths = paths
        self.videos: dict[int, _Pending] = {}
        self.queue: list[tuple[int, int, list[torch.Tensor]]] = []  # (video, window number, crops per stream)
        self.queued_windows = 0
        self.failed = 0
        self.last_gray: dict[int, np.ndarray] = {}
        self.reported: set[int] = set()

    def handle(self, message: tuple) -> list[tuple[int, VideoEmbedding | EmbedFailure]]:
        kind, index, payload = message
        if index in self.reported:  # the rest of a video that failed already
            return []
        video = self.videos.get(index)
        if video is None:
            video = self.videos[index] = _Pending(self.paths[index], _VideoWindows(self.settings))
        if video.failed is None:
            try:
                if kind == "frames":
                    frames, times = (item.numpy() if isinstance(item, torch.Tensor) else item for item in payload)
                    video.times.extend(times.tolist())
                    self._enqueue(index, video, video.windows.add(frames, self._flow(index, frames)))
                elif kind == "end":
                    video.end = payload
                    self._enqueue(index, video, video.windows.finish())
                    self.last_gray.pop(index, None)
                else:
                    video.failed = str(payload)
            except Exception as error:  # any error from one video is that video's failure, never the job's
                if out_of_memory(error):  # (but memory is the job's: see _DecodedVideos)
                    raise
                video.failed = _message(video.path, error)
        out = []
        while self.queued_windows >= self.embedder.batch_size:
            self._run_batch()
        out.extend(self._collect())
        return out

    def finish(self) -> list[tuple[int, VideoEmbedding | EmbedFailure]]:
        while self.queue:
            self._run_batch()
        out = self._collect()
        assert not self.videos, f"videos left unfinished: {[v.path for v in self.videos.values()]}"
        return out

    def _flow(self, index: int, frames: np.ndarray) -> np.ndarray | None:
        """Flow frames (uint8, the stored format) from the previous frame to each of ``frames``."""
        if not self.settings.computes_flow:
            return None

        gray = rgb_to_gray(frames)
        previous = self.last_gray.get(index)
        self.last_gray[index] = gray[-1]
        if previous is not None:
            gray = np.concatenate([previous[None], gray])
        if len(gray) < 2:
            return np.zeros((0, *frames.shape[1:]), np.uint8)
        method = self.settings.flow_method  # (the flow the encoder was trained on: flow_of_method)
        if method is not None and method["backend"] == "dis":  # (as the store's DIS view computes it)
            if min(gray.shape[1:]) < DIS_MIN_SIDE:
                raise DataError(f"frames of {gray.shape[2]} x {gray.shape[1]} px are too small for DIS flow, which "
                                f"the flow encoder was trained on (it needs {DIS_MIN_SIDE} px on each side): give a "
                                "larger --short-side")
            return flow_to_uint8(opencv_video_flow(gray, "dis"), self.settings.flow_bound)
        params = TVL1Params(**method["params"]) if method is not None else None
        device_gray = torch.from_numpy(gray).to(self.embedder.device)
        with torch.inference_mode():
            flow = tvl1_flow(device_gray[:-1], device_gray[1:], params)
            return flow_to_uint8(flow.permute(0, 2, 3, 1), self.settings.flow_bound).cpu().numpy()

    def _enqueue(self, index: int, video: _Pending, windows: list[tuple[np.ndarray, dict[str, np.ndarray]]]) -> None:
        """Crop and normalise the windows on the device, and queue them for the networks."""
        if not windows:
            return

        crops = []
        for stream in self.embedder.streams:
            clips = torch.from_numpy(np.stack([views[stream.view] for _, views in windows])).to(self.embedder.device)
            crops.append(center_crop({stream.view: clips}, self.settings.size, mean=stream.mean,
                                     std=stream.std)[stream.view])
        for number, (indices, _) in enumerate(windows):
            video.starts.append(int(indices[0]))
            video.ends.append(int(indices[-1]) + 1)
            self.queue.append((index, video.queued + number, [c[number] for c in crops]))
        video.queued += len(windows)
        self.queued_windows += len(windows)

    @torch.no_grad()
    def _run_batch(self) -> None:
        size = self.embedder.batch_size
        batch, self.queue = self.queue[:size], self.queue[size:]
        self.queued_windows -= len(batch)
        outputs = [stream.network(padded(torch.stack([crops[s] for _, _, crops in batch]), size))[: len(batch)]
                   .float().cpu() for s, stream in enumerate(self.embedder.streams)]
        for row, (index, number, _) in enumerate(batch):
            self.videos[index].features[number] = [output[row] for output in outputs]

    def _collect(self) -> list[tuple[int, VideoEmbedding | EmbedFailure]]:
        """The videos that are complete (ended with all windows computed) or failed."""
        out = []
        for index in list(self.videos):
            video = self.videos[index]
            if video.failed is not None:
                if any(item[0] == index for item in self.queue):
                    self.queue = [item for item in self.queue if item[0] != index]
                    self.queued_windows = len(self.queue)
                out.append((index, EmbedFailure(video.path, video.failed)))
            elif video.end is not None and len(video.features) == video.queued:
                out.append((index, self._assemble(video)))
            else:
                continue
            del self.videos[index]
            self.reported.add(index)
            self.last_gray.pop(index, None)
        return out

    def _assemble(self, video: _Pending) -> VideoEmbedding:
        per_stream = [torch.stack([video.features[n][s] for n in range(video.queued)])
                      for s in range(len(self.embedder.streams))]
        means = [features.double().mean(dim=0).float() for features in per_stream]
        vector, windows = combine(means), combine(per_stream)
        parts = ([(combine([mean]).numpy(), combine([features]).numpy()) for mean, features in zip(means, per_stream)]
                 if len(per_stream) > 1 else [])
        facts = video.end
        end = float(facts["end"])
        times = np.frombuffer(video.times, np.float64)
        starts = times[np.asarray(video.starts, np.int64)]
        ends = np.array([times[e] if e < len(times) else end for e in video.ends], np.float64)
        return VideoEmbedding(video.path, vector.numpy(), windows.numpy(), starts, ends, float(facts["fps"]),
                              video.windows.received, duration=end, damaged_frames=int(facts["damaged"]),
                              rotation=int(facts["rotation"]), mirrored=bool(facts["mirrored"]),
                              pixel_aspect=float(facts.get("pixel_aspect", 1.0)),
                              padded=video.windows.padded, parts=parts)
