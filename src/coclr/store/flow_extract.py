"""Optical flow extraction into a clip store, as in the paper: flow between consecutive RGB frames of every
video, clipped to +-20 px (``bound``), stored as uint8 JPEG frames (``n`` RGB frames give ``n - 1`` flow frames).
The bound of each flow view is recorded in the store's metadata (``<view>_bound_px``), with its backend,
parameters and mode (``<view>_method``), and a resumed extraction must use the same ones; one extraction at a
time writes a view (:func:`coclr.store.jobs.job_view_lock`).

Backends (:data:`BACKENDS`):

* ``tvl1``: OpenCV's dual TV-L1 on the CPU, the paper's flow; one worker process per core.
* ``dis``: OpenCV's Dense Inverse Search ("medium" preset), a cheaper unsupervised flow, ~100x faster than
  TV-L1 on the CPU and less accurate; stored under its own view (``flow_dis``) by default.
* ``tvl1-torch``: the PyTorch TV-L1 (:func:`coclr.flow.tvl1.tvl1_flow`, Triton kernels on CUDA) on a torch
  device, in batches of ``batch_pairs`` frame pairs taken across videos, with decoding and JPEG encoding in
  worker processes (:class:`~coclr.store.flow_pipeline.FlowPipeline`); the only backend with the ``fast`` mode.
* ``auto``: ``tvl1-torch`` when CUDA is available (and no CPU device was asked for) or the fast mode was asked
  for, else ``tvl1``.

Extraction goes through :func:`coclr.store.jobs.run_entry_jobs` (or ``run_entry_stream``), so it is resumable
(finished videos are skipped), writes each entry atomically, shows progress with ETA and lists failures (e.g. a
1-frame video) instead of stopping. In a distributed job (``torchrun ... -m coclr flow``: a ``torch.distributed``
group) every process extracts its share of the videos, each video in exactly one process.

Example::

    summary = extract_flow("stores/ucf101", backend="tvl1", workers=16)
    print(summary)   # flow: 13320 done, 0 skipped, 0 failed; ... frames/s
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from coclr.clips import JPEG_QUALITY
from coclr.distributed import init_distributed, launched_world_size, pick_device, rank, world_size
from coclr.errors import ConfigError, DataError
from coclr.flow.backends import ALIASES, BACKENDS, FlowBackend
from coclr.flow.encode import FLOW_BOUND, check_bound, flow_to_uint8
from coclr.flow.opencv import opencv_video_flow
from coclr.flow.options import BATCH_PAIRS, FlowOptions
from coclr.flow.params import TVL1Params, check_mode
from coclr.flow.tvl1_cpu import KERNEL as TVL1_KERNEL
from coclr.runfolder import check_output_folder
from coclr.store.clipstore import ClipStore, check_view_name
from coclr.store.flow_pipeline import FlowPipeline
from coclr.store.flow_source import SOURCE_VIEW, gray_frames, source_frames
from coclr.store.flow_views import (
    bound_key,
    flow_method,
    flow_view_rule,
    method_key,
    recorded_method,
    recorded_settings,
)
from coclr.store.jobs import GROUP_TIMEOUT, JobSummary, run_entry_jobs, run_entry_stream, writing_view
from coclr.store.jpeg import encode_jpeg
from coclr.threads import check_workers, usable_cores
from coclr.video.indexes import SPLITS

DECODE_CHUNK = 64
"""Frame pairs read, decoded and solved at a time on the CPU backends (memory does not grow with a video's length)."""


def resolve_backend(name: str, device: str | None = None, mode: str = "exact", kernels: str = "auto",
                    recorded: str | None = None) -> tuple[FlowBackend, str | None]:
    """The concrete backend for ``name`` and the torch device it runs on (None for the OpenCV backends).

    ``auto`` continues a view with the backend it was started with (``recorded``), so that the same command keeps
    its meaning; otherwise it picks ``tvl1-torch`` when ``device`` is a CUDA device (or None
    and CUDA is available), when ``mode`` is ``fast``, when ``kernels`` names the fused ones (``c``, ``triton``:
    they must then run, or the job is refused), or on the CPU when a C compiler for its fused loops is found
    (decided without compiling them: ``coclr.flow.tvl1_cpu.KERNEL.usable()``) and ``kernels`` allows
    them (several times OpenCV's speed: docs/performance.md); otherwise OpenCV's ``tvl1``.
    Under torchrun, ``cuda`` means the process's own GPU (``cuda:LOCAL_RANK``). Raises :class:`ConfigError` for an
    unknown backend, an unusable device or a mode the backend lacks.
    """
    name = ALIASES.get(name, name)
    if name not in BACKENDS:
        raise ConfigError(f"backend: unknown flow backend {name!r} (choose from {', '.join([*BACKENDS, *ALIASES])})")
    if name == "auto":
        if recorded in BACKENDS and recorded != "auto":
            name = recorded
        elif mode == "fast" or kernels in ("c", "triton") or pick_device(device).type == "cuda":
            name = "tvl1-torch"  # fused kernels asked for by name: refused before any video if they cannot run
        else:  # PyTorch operations on the CPU are slower than OpenCV
            name = "tvl1-torch" if kernels == "auto" and TVL1_KERNEL.usable() else "tvl1"
    if mode != "exact" and name != "tvl1-torch":
        raise ConfigError(f"mode: the {mode} mode is computed by the tvl1-torch backend only, not by {name}")
    backend = BACKENDS[name]
    if not backend.gpu:
        if device is not None and not device.startswith("cpu"):
            raise ConfigError(f"device: the {name} backend runs on the CPU with OpenCV, not on {device!r} "
                              "(use --backend tvl1-torch for a GPU)")
        return backend, None
    return backend, _check_device(device)


def _check_device(device: str | None) -> str:

    return str(pick_device(device))


def encode_flow_frames(flow: np.ndarray, quality: int = JPEG_QUALITY, bound: float = FLOW_BOUND) -> list[bytes]:
    """JPEG bytes of flow ``[N, H, W, 2]`` in the stored format (``flow_to_uint8``, then JPEG)."""
    return [encode_jpeg(image, quality) for image in flow_to_uint8(flow, bound)]


def _is_entry_shard(path: Path) -> bool:
    """Whether ``path`` is one of the 256 sub-folders of a view's entry files (``ab/``)."""
    return path.is_dir() and len(path.name) == 2 and all(c in "0123456789abcdef" for c in path.name)


@dataclass
class _StoreJob:
    """Base of the store jobs: opens the store once per process, lazily (the handle is not pickled)."""

    root: str

    def __post_init__(self) -> None:
        self._store: ClipStore | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_store"] = None
        return state

    def store(self) -> ClipStore:
        if self._store is None:
            self._store = ClipStore(self.root)
        return self._store


@dataclass
class OpenCVFlowJob(_StoreJob):
    """Store job (picklable, for worker processes): flow of one video with OpenCV TV-L1 or DIS.

    State: the store handle (see :class:`_StoreJob`)."""

    method: str
    params: TVL1Params
    quality: int
    bound: float = FLOW_BOUND

    def __call__(self, key: str) -> tuple[Iterator[bytes], float]:
        count, fps = source_frames(self.store(), key)
        return self._flow_frames(key, count), fps

    def _flow_frames(self, key: str, count: int) -> Iterator[bytes]:
        """The encoded flow frames of ``key``, computed :data:`DECODE_CHUNK` pairs at a time from its RGB entry as
        its flow entry is written (memory does not grow with the video's length)."""
        store = self.store()
        for start in range(0, count - 1, DECODE_CHUNK):
            stop = min(count, start + DECODE_CHUNK + 1)  # one frame of overlap: the next chunk's first pair
            gray = gray_frames(store, key, start, stop)
            yield from encode_flow_frames(opencv_video_flow(gray, self.method, self.params), self.quality, self.bound)


def cpu_workers(workers: int | None) -> int:
    """The worker processes of this process: ``workers`` (0: none), or for None its share of the machine's cores
    (all of them, or under torchrun an equal share for each process of the machine, ``LOCAL_WORLD_SIZE``)."""
    if workers is not None:
        return workers
    return max(1, usable_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))




def default_batch_pairs(device) -> int:
    """:data:`BATCH_PAIRS` for a torch device (or its name; None: the CPU)."""
    kind = "cpu" if device is None else str(device).split(":")[0]
    return BATCH_PAIRS.get(kind, BATCH_PAIRS["cpu"])


def extract_flow(store_root: str | Path, backend: str = FlowOptions.backend, view: str | None = None,
                 params: TVL1Params | None = None, workers: int | None = None, device: str | None = None,
                 keys: Sequence[str] | None = None, batch_pairs: int | None = None, split: str | None = None,
                 bound: float = FlowOptions.bound, mode: str = FlowOptions.mode,
                 stop_every: int = FlowOptions.stop_every, kernels: str = FlowOptions.kernels,
                 jpeg: str = FlowOptions.jpeg) -> JobSummary:
    """Compute flow for the videos of the store at ``store_root`` (all, or ``keys``) into ``view``.

    ``split`` ("train", "val" or "test") keeps only that split's videos (of ``keys``, when given): training
    needs the train split's flow first, and the rest can follow beside it.

    ``view`` defaults to the backend's (``flow`` for TV-L1, ``flow_dis`` for DIS). ``params``: TV-L1
    parameters (default: OpenCV's); not accepted by ``dis``. ``workers``: processes for the CPU backends, or for
    decoding and JPEG encoding around ``tvl1-torch`` (None: one per core, or under torchrun the process's share of
    them; 0: none, everything in this process). ``device``, ``batch_pairs`` (frame pairs per solve, across
    videos; None: :func:`default_batch_pairs` of the device), ``mode`` and ``stop_every``
    (:data:`~coclr.flow.params.MODES`), ``kernels`` (``auto``, ``torch``, ``triton`` or ``c``) and ``jpeg``
    (``opencv`` or ``nvjpeg``) apply to ``tvl1-torch``. JPEG quality is the store's RGB quality (metadata
    ``quality``). ``bound``: flow is clipped to +-``bound`` px before quantisation
    (:func:`~coclr.flow.encode.flow_to_uint8`).

    Bad input (not a store, no RGB view, unknown backend or key, bad parameter or device, a bound, backend,
    parameter or mode other than the view was started with) raises a :class:`~coclr.errors.CoclrError` before any
    work. Resumable: complete entries are skipped. In a distributed job each process extracts its share.
    """
    check_mode(mode, stop_every)
    store = ClipStore(store_root)
    recorded = recorded_method(store, view or BACKENDS["auto"].default_view) if backend == "auto" else None
    chosen, torch_device = resolve_backend(backend, device, mode, kernels, recorded and recorded.get("backend"))
    if params is not None and chosen.name == "dis":
        raise ConfigError("TV-L1 parameters were given, but the dis backend does not use them")
    if kernels != "auto" and not chosen.gpu:  # (it ran OpenCV, saying nothing)
        raise ConfigError(f"kernels: {kernels} runs the iterations of tvl1-torch; the {chosen.name} backend is "
                          "OpenCV's own: leave --kernels out, or give --backend tvl1-torch")
    given = {"batch_pairs": batch_pairs is not None, "jpeg": jpeg != FlowOptions.jpeg,
             "stop_every": stop_every != FlowOptions.stop_every}
    unused = [key for key, set_ in given.items() if set_] if not chosen.gpu else []
    if unused:  # (they were ignored)
        raise ConfigError(f"{unused[0]}: applies to the tvl1-torch backend; the {chosen.name} backend is OpenCV's "
                          f"own: leave --{unused[0].replace('_', '-')} out, or give --backend tvl1-torch")
    if given["stop_every"] and mode == "exact":
        raise ConfigError("stop_every: applies to the fast mode (--mode fast); the exact mode tests for stopping "
                          "after every inner iteration")
    params = params or TVL1Params()
    params.validate()
    check_workers(workers, "workers")
    if batch_pairs is None:
        batch_pairs = default_batch_pairs(torch_device)
    if batch_pairs < 1:
        raise ConfigError(f"batch_pairs: must be at least 1, got {batch_pairs}")
    try:
        bound = check_bound(bound)
    except ValueError as error:
        raise ConfigError(f"bound: {error}") from None
    view = view or chosen.default_view
    check_view_name(view)
    if view == SOURCE_VIEW:
        raise ConfigError(f"view: flow cannot be written into the {SOURCE_VIEW!r} view")
    if not (store.root / SOURCE_VIEW).is_dir():
        raise DataError(f"{store.root}: the store has no {SOURCE_VIEW!r} view to compute flow from")
    keys = list(store.keys() if keys is None else keys)
    if split is not None:
        if split not in SPLITS:
            raise ConfigError(f"split: must be one of {', '.join(SPLITS)}, got {split!r}")
        other_splits = {entry.path for entry in store.index.entries if entry.split != split}
        keys = [key for key in keys if key not in other_splits]  # unknown keys stay, to be reported
        if not keys:  # nothing to do, and said (it said "0 done", as if the split's flow were complete)
            present = sorted({entry.split for entry in store.index.entries})
            return JobSummary(view or chosen.default_view, rank=rank(), world=world_size(), notes=[
                f"{store.root}: the store has no {split} videos (its splits: {', '.join(present)}): nothing to do"])
    store.check_keys(keys)
    failed_rgb = store.failed(SOURCE_VIEW)
    unbuilt = [key for key in keys if key not in failed_rgb and not store.has(key, SOURCE_VIEW)]
    if unbuilt:  # (each was listed as a failure of flow, "its RGB extraction failed?", which it had not)
        more = f" and {len(unbuilt) - 1} more" if len(unbuilt) > 1 else ""
        raise DataError(f"{store.root}: the {SOURCE_VIEW!r} view is not finished: {unbuilt[0]}{more} of the "
                        f"{len(keys)} videos have no {SOURCE_VIEW!r} entry and no recorded failure; run the same coclr "
                        "data store command again to finish it, then this one")
    quality = int(store.meta.get("quality") or JPEG_QUALITY)
    root = str(store.root.resolve())
    workers = cpu_workers(workers)
    if chosen.gpu:  # picks its kernels, checks them and its encoder: what cannot run here is refused before the
        # store is touched; decoding costs about half as much as encoding
        decoders = min(workers, max(1, workers // 3))
        pipeline = FlowPipeline(root, view, params, quality, torch_device, batch_pairs, decoders,
                                min(workers, max(1, workers - decoders)), bound, mode, stop_every, kernels, jpeg)
    used = pipeline.passes_name if chosen.gpu else None
    settings = {bound_key(view): bound, method_key(view): flow_method(chosen.name, params, mode, stop_every, used)}
    recorded = recorded_settings(store, view)
    before = recorded.get(method_key(view))
    if before is not None and "kernels" not in before:  # begun before views recorded their kernels: unknown, so
        settings[method_key(view)].pop("kernels", None)  # not compared, and left unrecorded
    flow_view_rule(view).check(store.root, recorded, settings)
    if not recorded:  # a new view: a folder of that name holds nothing but entry files (none of the user's files)
        check_output_folder(store.root / view, "flow", _is_entry_shard, f"entry files ({view}/ab/<hash>.frames)")
    settings[method_key(view)] = store.meta.get(method_key(view), settings[method_key(view)])  # as recorded
    if launched_world_size() > 1:  # under torchrun, once every check above passed on every process (a process
        # refused by them tells the others, coclr.distributed.share_refusal); they meet only at the start and the end
        init_distributed(torch.device(torch_device or "cpu"), timeout=GROUP_TIMEOUT)
    def pairs(key: str) -> int:  # (the bar counts frame pairs: a long video is not one step like a short one)
        return store.num_frames(key, "rgb") - 1

    with writing_view(root, view, store.index, command="flow", **settings):
        if not chosen.gpu:
            job = OpenCVFlowJob(root, chosen.name, params, quality, bound)
            return run_entry_jobs(root, view, keys, job, workers, desc=f"flow ({chosen.name}) -> {view}",
                                  weight=pairs)
        summary = run_entry_stream(root, view, keys, pipeline,
                                   desc=f"flow (tvl1-torch {mode} on {torch_device}) -> {view}", weight=pairs)
    if pipeline.stats.pairs:
        summary.notes.append(str(pipeline.stats))
    return summary
