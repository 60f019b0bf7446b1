"""The ``tvl1-torch`` extraction as a pipeline that keeps the device busy: CPU processes decode and encode, the
device solves batches of frame pairs taken across videos.

1. Decoding: a ``DataLoader`` whose worker processes read each video's RGB entry in chunks of
   :data:`DECODE_CHUNK` frame pairs and decode them to grayscale ``uint8 [n + 1, H, W]`` (prefetched, handed over in
   shared memory).
2. Batching (the calling thread): the frame pairs of the chunks, in order, are cut into batches of
   ``batch_pairs`` pairs of one frame size; a video may span batches and a batch may hold many videos. Up to
   :data:`OPEN_SIZES` frame sizes are batched at once; a new size closes the oldest open batch early.
3. Solving (a device thread): :func:`~coclr.flow.tvl1.tvl1_flow` on the device, then the flow is quantised
   there (:func:`~coclr.flow.encode.quantise_flow`) and only the uint8 u and v come back to the host (or,
   with ``jpeg="nvjpeg"``, the JPEG bytes encoded on the GPU by torchvision's nvJPEG).
4. Encoding and writing: each part of a video that is back, in order, is JPEG-encoded by a worker process, and
   the calling thread adds the frames to the video's entry (:class:`~coclr.store.clipstore.EntryWriter`), which is
   written atomically once its last pair is in.

Two batches wait for the device at most, a few chunks wait to be batched and at most two parts per encoding
process are in flight, so memory stays bounded whatever the videos' lengths, and a slow stage holds back the
others instead of piling up work. :class:`PipelineStats` records
how long the device thread waited for input. Each pair's flow is the one a batch of one gives (the solver is
batch-invariant), so the stored bytes do not depend on the batching.

Stopped by an error or an interruption (SIGINT, SIGTERM: :mod:`coclr.interrupts`) in the calling thread, it tells
the device thread to stop (it ends within one pair's warp: ``tvl1_flow(stop=...)``) and waits for it, and kills the
encoding processes: what was written is kept, what was in flight is discarded. A thread left solving would keep the
process from exiting cleanly (a daemon thread inside torch or a C call when the interpreter ends aborts it).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from coclr.errors import ConfigError
from coclr.flow.encode import FLOW_BOUND, flow_image, quantise_flow
from coclr.flow.options import JPEG_ENCODERS
from coclr.flow.params import TVL1Params
from coclr.flow.tvl1 import make_passes, tvl1_flow
from coclr.interrupts import loader_worker_signals
from coclr.store.clipstore import ClipStore, EntryWriter, StorageFullError
from coclr.store.flow_source import gray_frames, source_frames
from coclr.store.jobs import RecordFn, default_start_method, init_worker, stop_pool
from coclr.store.jpeg import encode_jpeg
from coclr.threads import opencv_threads, worker_opencv_threads

if TYPE_CHECKING:
    import torch

OPEN_SIZES = 4
"""Frame sizes with a batch being filled at once (each holds up to ``batch_pairs`` pairs of frames)."""
DECODE_CHUNK = 256
"""Frame pairs of a video decoded (and then solved, encoded and added to its entry) at a time, so that memory does
not grow with a video's length."""


@dataclass
class PipelineStats:
    """Where the time of a pipeline run went: ``solve_seconds`` in the device thread's solves (TV-L1, quantisation,
    copies), ``wait_seconds`` waiting for a batch to solve, ``wall_seconds`` from start to the last entry written."""

    videos: int = 0
    pairs: int = 0
    batches: int = 0
    solve_seconds: float = 0.0
    wait_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def wait_share(self) -> float:
        """The share of the run's time in which the device had nothing to solve."""
        return 1.0 - self.solve_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def __str__(self) -> str:
        rate = self.pairs / self.wall_seconds if self.wall_seconds > 0 else 0.0
        return (f"{self.pairs} frame pairs of {self.videos} videos in {self.batches} batches, {rate:.1f} pairs/s; "
                f"the device solved for {self.solve_seconds:.1f} s of {self.wall_seconds:.1f} s and waited for input "
                f"{100 * self.wait_share:.1f}% of the time")


@dataclass(frozen=True)
class _Chunk:
    """Frames ``start .. stop - 1`` of video ``key`` (its pairs ``start .. stop - 2``)."""

    key: str
    start: int
    stop: int


class _DecodedChunks:
    """Map-style dataset over chunks of videos: item ``i`` is ``{"key", "first", "frames": uint8 [n + 1, H, W] or
    None, "error"}`` (decoding errors are returned, not raised, so one bad video does not stop the loader)."""

    def __init__(self, root: str, chunks: list[_Chunk]) -> None:
        self.root = root
        self.chunks = chunks
        self._store = None

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int) -> dict:
        import torch  # noqa: PLC0415 (heavy)

        chunk = self.chunks[i]
        try:
            if self._store is None:
                self._store = ClipStore(self.root)
            frames = gray_frames(self._store, chunk.key, chunk.start, chunk.stop)
            return {"key": chunk.key, "first": chunk.start, "frames": torch.from_numpy(frames), "error": ""}
        except Exception as error:  # reported for this video; the others go on
            return {"key": chunk.key, "first": chunk.start, "frames": None, "error": f"{type(error).__name__}: {error}"}


def _decoder_init(_: int) -> None:
    import torch  # noqa: PLC0415 (heavy)

    loader_worker_signals()
    worker_opencv_threads()
    torch.set_num_threads(1)


def encode_part(key: str, first: int, frames: np.ndarray, quality: int) -> tuple[str, int, list[bytes] | str]:
    """Worker task: the JPEG bytes of a part of a video's quantised flow ``uint8 [n, H, W, 2]`` (its pairs from
    ``first`` on); returns (key, first, the bytes, or an error message)."""
    try:
        return key, first, [encode_jpeg(image, quality) for image in flow_image(frames)]
    except Exception as error:  # one bad part fails its video, not the others
        return key, first, f"{type(error).__name__}: {error}"


@dataclass
class _Segment:
    """Pairs ``first .. first + len(frames) - 2`` of video ``key``: its frames ``uint8 [n + 1, H, W]``."""

    key: str
    first: int
    frames: object  # torch.Tensor

    @property
    def pairs(self) -> int:
        return self.frames.shape[0] - 1


@dataclass
class _Video:
    """A video whose pairs are being solved: its pair count and fps, the parts solved and not yet sent to encoding
    and those encoded and not yet written (by their first pair), and its entry being written."""

    pairs: int
    fps: float
    parts: dict[int, object] = field(default_factory=dict)
    encoded: dict[int, list[bytes]] = field(default_factory=dict)
    sent: int = 0  # pairs sent to encoding
    written: int = 0  # pairs added to the entry
    writer: EntryWriter | None = None


class _Batcher:
    """Cuts the frame pairs of videos into batches of ``size`` pairs, one open batch per frame size (at most
    :data:`OPEN_SIZES`: a new size closes the oldest)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.open: OrderedDict[tuple[int, int], list[_Segment]] = OrderedDict()

    def add(self, key: str, frames, start: int = 0) -> Iterator[list[_Segment]]:
        """The batches completed by the pairs of video ``key`` (frames ``[N, H, W]``, its frames from ``start`` on)."""
        shape = tuple(frames.shape[1:])
        if shape not in self.open and len(self.open) >= OPEN_SIZES:
            yield self.open.popitem(last=False)[1]
        first = 0
        while first < frames.shape[0] - 1:
            batch = self.open.setdefault(shape, [])
            take = min(self.size - sum(segment.pairs for segment in batch), frames.shape[0] - 1 - first)
            batch.append(_Segment(key, start + first, frames[first: first + take + 1]))
            first += take
            if sum(segment.pairs for segment in batch) == self.size:
                yield self.open.pop(shape)

    def flush(self) -> Iterator[list[_Segment]]:
        """The open batches, however full."""
        while self.open:
            yield self.open.popitem(last=False)[1]


@dataclass
class FlowPipeline:
    """The :data:`~coclr.store.jobs.EntryStream` of ``tvl1-torch`` extraction (see the module docstring).

    ``decode_workers`` and ``encode_workers``: processes of the two CPU stages (0: in this process);
    ``batch_pairs``: frame pairs per
    device batch; ``mode``, ``stop_every``, ``kernels``: passed to :func:`~coclr.flow.tvl1.tvl1_flow`;
    ``jpeg``: ``opencv`` (worker processes) or ``nvjpeg`` (torchvision on the GPU). State: ``stats`` of the last
    run.
    """

    root: str
    view: str
    params: TVL1Params
    quality: int
    device: str
    batch_pairs: int = 64
    decode_workers: int = 1
    encode_workers: int = 1
    bound: float = FLOW_BOUND
    mode: str = "exact"
    stop_every: int = 5
    kernels: str = "auto"
    jpeg: str = "opencv"

    def __post_init__(self) -> None:
        import torch  # noqa: PLC0415 (heavy)

        self.stats = PipelineStats()
        self.passes_name = make_passes(self.kernels, torch.device(self.device)).name
        """The kernels ``kernels`` stands for here (``auto`` resolved), which solve every batch and the view records;
        kernels that cannot run here are refused now, before any video."""
        if self.jpeg not in JPEG_ENCODERS:
            raise ConfigError(f"jpeg: must be one of {', '.join(JPEG_ENCODERS)}, got {self.jpeg!r}")
        if self.jpeg == "nvjpeg":
            check_nvjpeg(self.device)

    def __call__(self, todo: list[str], record: RecordFn) -> None:
        with opencv_threads(1):  # a forked worker would hang stopping the threads of an OpenCV pool running here
            self._run(todo, record)

    def _run(self, todo: list[str], record: RecordFn) -> None:
        import torch  # noqa: PLC0415 (heavy)
        from torch.utils.data import DataLoader  # noqa: PLC0415 (heavy)

        started = time.perf_counter()
        self.stats = PipelineStats()
        run = _Run(self, record)
        chunks = run.plan(todo)
        loader = DataLoader(_DecodedChunks(self.root, chunks), batch_size=None, num_workers=self.decode_workers,
                            prefetch_factor=4 if self.decode_workers else None, worker_init_fn=_decoder_init,
                            pin_memory=torch.device(self.device).type == "cuda")
        batches: queue.Queue = queue.Queue(maxsize=2)
        results: queue.Queue = queue.Queue()
        stop = threading.Event()
        solver = threading.Thread(target=self._solve_batches, args=(batches, results, stop), name="flow-device",
                                  daemon=True)
        solver.start()
        finished = False
        try:
            batcher = _Batcher(self.batch_pairs)
            for item in loader:
                if item["key"] not in run.videos:
                    continue  # failed already (an earlier chunk, or its encoding)
                if item["error"]:
                    run.finish(item["key"], 0, item["error"])
                    continue
                for batch in batcher.add(item["key"], item["frames"], item["first"]):
                    self._put(batches, batch, solver, run, results)
                run.handle(results, block=False)
            for batch in batcher.flush():
                self._put(batches, batch, solver, run, results)
            self._put(batches, None, solver, run, results)
            solver.join()
            run.handle(results, block=False)
            run.drain()
            finished = True
        finally:
            if solver.is_alive():  # stopped by an error or an interruption: the device thread ends within a warp
                stop.set()
                try:
                    batches.put_nowait(None)  # wakes it if it waits for a batch (if the queue is full, it does not)
                except queue.Full:
                    pass
                solver.join()
            run.close(abort=not finished)
        self.stats.wall_seconds = time.perf_counter() - started

    @staticmethod
    def _put(batches: queue.Queue, batch: list[_Segment] | None, solver: threading.Thread, run: _Run,
             results: queue.Queue) -> None:
        """Queue a batch for the device, handling finished work while the queue is full."""
        while True:
            try:
                batches.put(batch, timeout=0.05)
                return
            except queue.Full:
                if not solver.is_alive():
                    raise RuntimeError("the device thread of the flow pipeline ended unexpectedly") from None
                run.handle(results, block=False)

    def _solve_batches(self, batches: queue.Queue, results: queue.Queue, stop: threading.Event) -> None:
        """The device thread: solve batches until the end marker or ``stop`` (then within a pair's warp); every batch
        solved gives one result, an error included."""
        import torch  # noqa: PLC0415 (heavy)


        device = torch.device(self.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        with torch.inference_mode():
            while True:
                waited = time.perf_counter()
                batch = batches.get()
                start = time.perf_counter()
                self.stats.wait_seconds += start - waited
                if batch is None or stop.is_set():
                    return
                try:
                    prev, nxt = upload_pairs([segment.frames for segment in batch], device)
                    flow = tvl1_flow(prev, nxt, self.params, mode=self.mode, stop_every=self.stop_every,
                                     kernels=self.passes_name, stop=stop)
                    uv = quantise_flow(flow.permute(0, 2, 3, 1), self.bound)
                    out = nvjpeg_encode(uv, self.quality) if self.jpeg == "nvjpeg" else uv.cpu().numpy()
                    results.put((batch, out, None))
                    self.stats.pairs += sum(segment.pairs for segment in batch)  # (a failed batch's are no result)
                except KeyboardInterrupt:  # told to stop (check_stop): the batch is abandoned
                    return
                except Exception as error:  # the batch's videos fail; the next batches go on
                    results.put((batch, None, f"{type(error).__name__}: {error}"))
                self.stats.solve_seconds += time.perf_counter() - start
                self.stats.batches += 1


def upload_pairs(videos: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The consecutive frame pairs of ``videos`` (``[N_i, H, W]`` each, one size) as ``(prev, next)`` on ``device``.

    Both are gathered into one host buffer, pinned when ``device`` is a GPU, and copied in one non-blocking copy:
    the DataLoader pins each video's frames, but concatenating them makes a new, pageable tensor, whose copy
    would wait for the GPU's queue.
    """
    import torch  # noqa: PLC0415 (heavy); heavy: this module is imported by processes that never touch a device

    pairs = sum(len(frames) - 1 for frames in videos)
    first = videos[0]
    host = torch.empty((2, pairs, *first.shape[1:]), dtype=first.dtype, pin_memory=device.type == "cuda")
    torch.cat([frames[:-1] for frames in videos], out=host[0])
    torch.cat([frames[1:] for frames in videos], out=host[1])
    on_device = host.to(device, non_blocking=True)
    return on_device[0], on_device[1]


class _Run:
    """The bookkeeping of one pipeline run in the calling thread: videos being solved, encoding tasks in flight
    (at most two per process) and the keys already finished (each is recorded exactly once)."""

    def __init__(self, pipeline: FlowPipeline, record: RecordFn) -> None:
        self.pipeline = pipeline
        self.record = record
        self.videos: dict[str, _Video] = {}
        self.finished: set[str] = set()
        self.in_flight: dict[Future, tuple[str, int]] = {}
        self.pool: ProcessPoolExecutor | None = None

    def plan(self, todo: list[str]) -> list[_Chunk]:
        """The chunks of the videos of ``todo`` (:data:`DECODE_CHUNK` pairs each, one frame of overlap); a video
        that cannot give flow (no RGB entry, fewer than 2 frames) fails here."""
        store = ClipStore(self.pipeline.root)
        chunks = []
        for key in todo:
            try:
                count, fps = source_frames(store, key)
            except Exception as error:  # reported for this video; the others go on
                self.finish(key, 0, f"{type(error).__name__}: {error}")
                continue
            self.videos[key] = _Video(count - 1, fps)
            chunks += [_Chunk(key, start, min(count, start + DECODE_CHUNK + 1))
                       for start in range(0, count - 1, DECODE_CHUNK)]
        return chunks

    def finish(self, key: str, frames: int, error: str | None) -> None:
        if key in self.finished:
            return
        self.finished.add(key)
        video = self.videos.pop(key, None)
        if video is not None and video.writer is not None:
            video.writer.discard()
        if error is None:
            self.pipeline.stats.videos += 1
        self.record(key, frames, error)

    def handle(self, results: queue.Queue, block: bool) -> None:
        """Take the device's results: each video's parts go to encoding in order; collect finished encodings."""
        while True:
            try:
                batch, out, error = results.get(block=block, timeout=0.05 if block else None)
            except queue.Empty:
                break
            offset = 0
            for segment in batch:
                part = None if out is None else out[offset: offset + segment.pairs]
                offset += segment.pairs
                video = self.videos.get(segment.key)
                if video is None:
                    continue  # failed already
                if error is not None:
                    self.finish(segment.key, 0, error)
                    continue
                video.parts[segment.first] = part
                self._submit(segment.key, video)
        self._collect(block=False)

    def _submit(self, key: str, video: _Video) -> None:
        """Send the parts of ``key`` that follow those sent already to encoding (JPEG bytes from the device, already
        encoded, go straight to the entry)."""
        while video.sent in video.parts and key in self.videos:
            first = video.sent
            part = video.parts.pop(first)
            video.sent += len(part)
            if not isinstance(part, np.ndarray):
                self._encoded(key, first, list(part))
                continue
            while len(self.in_flight) >= 2 * max(1, self.pipeline.encode_workers):
                self._collect(block=True)
            args = (encode_part, key, first, part, self.pipeline.quality)
            try:
                future = self._pool().submit(*args)
            except BrokenProcessPool:
                self._replace_pool()
                future = self._pool().submit(*args)
            self.in_flight[future] = (key, first)

    def _encoded(self, key: str, first: int, frames: list[bytes] | str) -> None:
        """Add the encoded part of ``key`` from pair ``first`` to its entry, in order; write the entry when complete."""
        video = self.videos.get(key)
        if video is None:
            return  # failed already
        if isinstance(frames, str):
            self.finish(key, 0, frames)
            return
        video.encoded[first] = frames
        try:
            while video.written in video.encoded:
                part = video.encoded.pop(video.written)
                if video.writer is None:
                    video.writer = EntryWriter(self.pipeline.root, key, self.pipeline.view)
                for frame in part:
                    video.writer.add(frame)
                video.written += len(part)
            if video.written == video.pairs:
                self.finish(key, video.writer.commit(video.fps), None)
        except StorageFullError:  # the storage's fault, not the entry's: the job stops (no video is blamed)
            raise
        except Exception as error:  # one bad entry must not stop the others
            self.finish(key, 0, f"{type(error).__name__}: {error}")

    def _pool(self) -> ProcessPoolExecutor | _InProcess:
        if self.pool is None and self.pipeline.encode_workers == 0:
            self.pool = _InProcess()
        if self.pool is None:
            context = multiprocessing.get_context(default_start_method())
            self.pool = ProcessPoolExecutor(self.pipeline.encode_workers, mp_context=context,
                                            initializer=init_worker, initargs=(None, os.getpid()))
        return self.pool

    def _replace_pool(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = None

    def _collect(self, block: bool) -> None:
        if not self.in_flight:
            return
        done, _ = wait(self.in_flight, timeout=None if block else 0, return_when=FIRST_COMPLETED)
        broken = False
        for future in done:
            key, first = self.in_flight.pop(future)
            try:
                self._encoded(*future.result())
            except BrokenProcessPool:
                broken = True
                self.finish(key, 0, "an encoding worker process died (crash or out of memory) while this entry, "
                                    "or another beside it, was in flight; run the same command again")
        if broken:
            self._replace_pool()

    def drain(self) -> None:
        """Wait for every encoding in flight."""
        while self.in_flight:
            self._collect(block=True)

    def close(self, abort: bool = False) -> None:
        """Shut the encoding pool down; ``abort`` (an error or interruption): at once, its tasks discarded."""
        if isinstance(self.pool, ProcessPoolExecutor) and abort:
            stop_pool(self.pool)
        elif self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool = None
        for video in self.videos.values():  # stopped by an error: nothing of an unfinished entry is kept
            if video.writer is not None:
                video.writer.discard()


class _InProcess:
    """The executor of ``encode_workers=0``: runs each task at once in this process."""

    def submit(self, function, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(function(*args))
        except Exception as error:  # reported by future.result(), as from a pool
            future.set_exception(error)
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def check_nvjpeg(device: str) -> None:
    """Raise :class:`ConfigError` unless torchvision's GPU JPEG encoder can serve ``device``."""
    import torch  # noqa: PLC0415 (heavy)

    if torch.device(device).type != "cuda":
        raise ConfigError(f"jpeg: nvjpeg encodes on a CUDA device, not on {device!r}")
    try:
        from torchvision.io import encode_jpeg as _  # noqa: F401, PLC0415 (optional)
    except ImportError:
        raise ConfigError("jpeg: nvjpeg needs torchvision (with CUDA), which is not importable here") from None


def nvjpeg_encode(uv, quality: int) -> list[bytes]:
    """JPEG bytes of quantised flow ``uint8 [P, H, W, 2]`` on a CUDA device, encoded there by torchvision's nvJPEG
    (its chroma subsampling and tables differ from OpenCV's, so the bytes do too)."""
    from torchvision.io import encode_jpeg as gpu_encode  # noqa: PLC0415 (optional)

    images = flow_image(uv).permute(0, 3, 1, 2).contiguous()
    encoded = gpu_encode(list(images), quality=quality)
    return [bytes(data.cpu().numpy().tobytes()) for data in encoded]
