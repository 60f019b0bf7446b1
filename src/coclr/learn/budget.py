"""How ``coclr learn`` fits its work to a wall-clock budget on this machine: measure, then choose.

The work of a run is proportional to the footage (decoding it into the store, its flow, embedding it) and to the
training steps. A short calibration measures on this machine, with the footage's own videos where it can, the
seconds of each unit: a decoded source frame, a video and a frame of the store job (timed as it runs, in its
workers), a flow pair, a training step and an inference forward of each candidate network. :func:`choose_plan`
then keeps the largest network (width, crop side, frames per clip) that affords the quick study's number of
training steps after the footage's fixed costs, and gives the training every second left of the budget (less a
margin), split over the stages as the quick study splits its epochs. Too few videos, or a budget that leaves too
few steps for even the smallest network, are refused in one line that says what would do.

Everything here but :func:`measure_costs` is arithmetic on the measured :class:`Costs`, so the choice is
tested with costs given by the tests.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coclr.atomic import scratch_folder
from coclr.data.sampling import clip_span, segment_counts, spread
from coclr.errors import ConfigError
from coclr.flow.encode import bound_for
from coclr.progress import duration
from coclr.text import shown
from coclr.threads import torch_threads, usable_cores
from coclr.train.setup import queue_within_a_third
from coclr.train.timing import inference_on_one_thread, time_training

MIN_VIDEOS = 8
"""Fewest videos a run learns from: contrastive learning needs other videos as negatives in every batch."""
TARGET_STEPS = 1920
"""Training steps (batches) that make a useful encoder: the quick study's, which learns the built-in data's
classes (40 InfoNCE epochs per view and two cycles of 20 epochs per view, at 12 batches an epoch)."""
MIN_STEPS = 480
"""Fewest training steps worth running (a quarter of :data:`TARGET_STEPS`); a budget that leaves fewer is refused."""
MARGIN = 0.95
"""The share of the budget the plan fills: the rest absorbs the error of the estimates."""
SUGGESTION_HEADROOM = 1.25
"""A refused budget's suggestion is this much above what the measurement needed: the next run measures again, on a
machine that may be slower then (it said 3m, then at 3m 4m, under load)."""
FIXED_SECONDS = 5.0
"""Seconds of work outside the phases the plan estimates: the process's start, exporting, the report."""
STAGE_SHARES = {"infonce": 0.25, "coclr": 0.125}
"""Share of the training steps of each stage: the quick study's epochs (40 InfoNCE per view, 20 per CoCLR stage,
two cycles): a quarter for each InfoNCE stage, an eighth for each of the four CoCLR stages."""
MAX_EPOCHS = {"coclr": 100}
"""At most this many epochs per CoCLR stage (and twice as many per InfoNCE stage): a few videos and a long budget
would otherwise repeat them thousands of times (what is left of the budget is not spent)."""
REPEATS = 3
"""Timings of the same work whose median is its cost (a flow pair, an encoded frame): one timing of a fraction of a
second moved by a fifth between runs on a shared machine."""
SAMPLE_VIDEOS = 4
"""Videos the measurement decodes (spread over the inputs): the decoding speed, and frame pairs for the flow."""
PAIRS = 4
"""Consecutive frame pairs of each sampled video whose flow is timed and measured."""
STORE_FRAMES = 96
"""Frames of each sampled video the store's work is timed on (:func:`_time_store`): past its decoder's start, few
enough for long videos."""
STORE_SECONDS = 0.2
"""Seconds of each worker's work the store's timing aims at (:func:`_time_store`; the median of :data:`REPEATS`)."""
FLOW_VIDEOS = 16
"""Videos whose first frames time the flow (spread over the inputs, :func:`_time_flow_pairs`, :func:`_time_flow_job`):
a pair's cost follows its video's motion (a fifth apart between sets of 64 of the synthetic videos), so more videos
with fewer pairs each."""
FLOW_PAIRS = 128
"""Frame pairs the flow is timed on, split between the :data:`FLOW_VIDEOS` (8 each; more from each of fewer): what
a tenth of a second's timing cannot tell (one moved by a fifth between runs), a few tenths hold."""
FLOW_KEYS = 32
"""Videos of one frame pair each in the flow job's timing: their per-video part (reading, writing, the pool's round
trip, a batch's share), which a folder of short videos is mostly made of."""
TIMED_BATCHES = 4
"""Batches of windows whose forward through the embedding's network is timed at once (:func:`_time_embedding`): one
batch of a tiny network takes a few milliseconds, which a thread's late wake-up moves by a third."""
MOTION_PERCENTILE = 99.0
"""Flow is clipped at this percentile of the footage's motion (:func:`flow_bound`)."""
QUALITY_VIDEOS = 512
"""Videos whose features measure each stage's quality (a sample of larger footage)."""
BATCH = 32
"""Clips per training batch (smaller footage: an eighth of its instances, at least 2)."""
SEGMENT_SPANS = 2
"""A video longer than this many clip spans is cut into stretches of that length, each a training instance
(``data.segment_frames``): eight videos of a few hundred frames give a hundred instances, enough for batches and a
queue to contrast (docs/learn.md); a video shorter than two stretches is one instance, as in the paper."""
CURATE_VIDEOS = 4
"""Most videos whose altered copies calibrate the near-duplicate threshold of the run's curation (``coclr curate
--calibrate``; each gets one copy per alteration, at most :data:`coclr.curate.calibrate.MAX_FRAMES` frames)."""
CURATE_SHARE = 0.1
"""The calibration of the curation's threshold takes at most this share of the budget: fewer videos' copies where
four would take more (eight clips of ten seconds at 3 minutes: two fifths of the run went to it), none (the
similarity distribution's rule) where even one would (:func:`curate_videos`)."""


@dataclass(frozen=True)
class Model:
    """A network and clip size the plan may choose: S3D ``width``, ``length`` frames of ``size`` x ``size``."""

    width: float
    size: int
    length: int

    def __str__(self) -> str:
        return f"S3D width {self.width:g}, clips of {self.length} frames at {self.size}x{self.size} px"

    @property
    def key(self) -> str:
        return f"w{self.width:g}_s{self.size}_l{self.length}"


MODELS = (Model(0.125, 32, 8), Model(0.25, 32, 8), Model(0.25, 64, 8), Model(0.5, 64, 16), Model(0.5, 112, 16),
          Model(1.0, 128, 32))
"""The candidates, cheapest first: the quick study's network (width 0.125, 8 frames of 32 px, its CPU size) up to
the paper's S3D (width 1, 32 frames of 128 px)."""


@dataclass
class Footage:
    """What the videos hold: how many, their frames in all, and the frame counts and short sides that bound the
    clip (no crop larger than the median short side, no clip longer than the shortest tenth of the videos)."""

    videos: int
    frames: int
    short_side: int
    """the median short side of the videos, in pixels"""
    aspect: float
    """the median ratio of the long side to the short side"""
    short_frames: int
    """the 10th percentile of the frame counts"""
    frame_counts: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, infos: Sequence[Any]) -> Footage:
        """From :class:`~coclr.video.decode.VideoInfo` of each readable video."""
        frames = np.array([max(1, info.frames) for info in infos])
        shorts = np.array([min(info.width, info.height) for info in infos])
        aspects = np.array([max(info.width, info.height) / max(1, min(info.width, info.height)) for info in infos])
        return cls(len(infos), int(frames.sum()), int(np.median(shorts)), float(np.median(aspects)),
                   int(np.percentile(frames, 10)), [int(f) for f in frames])

    def instances(self, model: Model) -> int:
        """Training instances of ``model``'s plan: each video's stretches of :func:`segment_frames` (its frames
        that have flow, as the training dataset counts them)."""
        usable = [max(1, frames - 1) for frames in self.frame_counts]
        return int(segment_counts(usable, segment_frames(model)).sum())

    def fits(self, model: Model) -> bool:
        """Whether the clips of ``model`` suit the videos: a crop no larger than the median short side (rounded
        down to 32 px, never below the smallest model's), and a clip and its flow within all but the shortest tenth
        of the videos (:attr:`short_frames`), or no longer than the smallest model's (which any footage takes)."""
        if model == MODELS[0]:
            return True
        largest = max(MODELS[0].size, self.short_side // 32 * 32)
        span = clip_span(model.length, 1)
        return model.size <= largest and (span <= clip_span(MODELS[0].length, 1) or span + 1 <= self.short_frames)


@dataclass
class Costs:
    """Seconds per unit of work on this machine, measured by :func:`measure_costs` (or given by a test)."""

    decode_frame: float
    """decoding one source frame and resizing it (one process)"""
    store_frame: dict[int, float]
    """JPEG-encoding one frame at each short side (one process)"""
    flow_pair: dict[int, float]
    """TV-L1 flow of one frame pair at each short side, as the embedding computes it (a video's chunk of pairs at
    once, on every thread; :func:`_time_flow_pairs`); plans made before also counted the flow job by it"""
    step: dict[str, float]
    """one InfoNCE training step of each model (:attr:`Model.key`), on every thread of the process"""
    lone_step: dict[str, float]
    """one step of each model on one thread: what each of two InfoNCE stages trained side by side takes, one core
    each (a CPU job of one process on two cores or more; :attr:`side_by_side`)"""
    forward: dict[str, float]
    """one clip through each model's encoder without gradients, in batches of :data:`INFERENCE_BATCH` (CoCLR's
    miner, inference)"""
    epoch: dict[str, float]
    """the end of an epoch of each model: writing its checkpoint (a cost of its own with few videos an epoch)"""
    stage: dict[str, float]
    """starting a training stage of each model (the dataset, the networks, the optimiser)"""
    workers: int
    """processes the store and flow jobs run at once (on each machine)"""
    seconds: float = 0.0
    """what the measurement took"""
    start: dict[str, float] = field(default_factory=dict)
    """starting a training stage of each model in a process of its own, side by side with another (the imports
    too): the InfoNCE stages' (:attr:`side_by_side`)"""
    processes: int = 1
    """processes of the job (torchrun's world): each trains on its share of every batch, embeds its share"""
    side_by_side: bool = False
    """whether the two InfoNCE stages train at once, one thread each (a CPU job of one process on two cores or
    more: tiny networks use two threads poorly, two processes well)"""
    machines: int = 1
    """machines of the job: each decodes and computes flow for its share of the videos"""
    single_step: dict[str, float] = field(default_factory=dict)
    """one step of each model on one thread, alone, timed in turn with :attr:`step` (A B B A: a slower moment of the
    machine slows both); the CoCLR stages' step where :func:`one_thread`"""
    single_forward: dict[str, float] = field(default_factory=dict)
    """one clip through each model's encoder on one thread, timed in turn with :attr:`forward`: the CoCLR miner's
    forward where :func:`one_thread` (with OpenMP's passive wait, a tiny network's forward on two threads can take
    three times its time on one; plans made before have none, and count :attr:`forward`)"""
    encode_frame: float = 0.0
    """encoding one source frame as H.264 (``write_mp4``: the curation's altered copies; 0: not measured, as in
    plans made before)"""
    thumbnail: float = 0.0
    """making one video's animated thumbnail for the curation's page (frames decoded through the video, a GIF), with
    a thread per worker at it as the curation makes them (its pool's seconds per video; plans made before timed one
    thread, and divided by the workers; 0: not measured)"""
    fingerprint: dict[str, float] = field(default_factory=dict)
    """fingerprinting one video for the curation's duplicates with each model's first block
    (:mod:`coclr.curate.fingerprint`: frames decoded through the video, the block), with a thread per worker at it
    (as :attr:`thumbnail`; plans made before timed the widest candidate's block on one thread)"""
    thumbnail_start: float = 0.0
    """what the threads' first thumbnails cost beyond :attr:`thumbnail`, once per job (:func:`_time_per_video`)"""
    fingerprint_start: dict[str, float] = field(default_factory=dict)
    """what the threads' first fingerprints cost beyond :attr:`fingerprint`, once per job: 0.2 s a thread on the
    clips, where a fingerprint takes 0.06"""
    window: dict[str, float] = field(default_factory=dict)
    """one stored window read and through each model's backbone as the quality measures run it (in batches of
    :data:`~coclr.train.timing.INFERENCE_BATCH`, on :attr:`Plan.inference_threads`; plans made before have none and
    count :attr:`forward`)"""
    load: dict[str, float] = field(default_factory=dict)
    """loading a stage's encoder file of each model (the quality measures load every stage's; 0 where not timed)"""
    embed_forward: dict[str, float] = field(default_factory=dict)
    """one window through the network ``coclr embed`` runs of each model (:func:`~coclr.models.inference.
    inference_network`: on the CPU the fused inference copy), in batches of
    :data:`~coclr.train.timing.INFERENCE_BATCH` on every thread (:func:`_time_embedding`; plans made before have none
    and count :attr:`forward`)"""
    embed_load: dict[str, float] = field(default_factory=dict)
    """loading an encoder file of each model into that network (0 where not timed)"""
    store_job: dict[int, float] = field(default_factory=dict)
    """the store job's start at each short side (its pool's processes, to their first video; :func:`_time_store`;
    plans made before have none of the store's three costs and count :attr:`decode_frame` and :attr:`store_frame`
    divided by the workers)"""
    store_video: dict[int, float] = field(default_factory=dict)
    """a video's own part of the store job at each short side, with :attr:`workers` processes at once (opening it,
    starting its decoder, its first frame, writing its entry, the pool's round trip)"""
    store_next: dict[int, float] = field(default_factory=dict)
    """each further frame of a video in the store job at each short side (decoded, resized, JPEG-encoded), with
    :attr:`workers` processes at once"""
    flow_job: dict[int, float] = field(default_factory=dict)
    """the flow job's start at each short side (:func:`_time_flow_job`; plans made before have none of the flow
    job's three costs and count :attr:`flow_pair` and :attr:`store_frame` over the workers for each pair)"""
    flow_video: dict[int, float] = field(default_factory=dict)
    """a video's own part of the flow job at each short side (its entry read and written, its share of a batch's
    call, the pool's round trip)"""
    flow_next: dict[int, float] = field(default_factory=dict)
    """each frame pair of the flow job at each short side (decoded, solved in batches across videos, JPEG-encoded,
    with its workers at once)"""
    flow_call: dict[int, float] = field(default_factory=dict)
    """what one TV-L1 call costs beyond its pairs at each short side (the embedding solves each chunk of a video in a
    call: a folder of short videos pays it once a video; 0 where not timed)"""
    motion: dict[int, float] = field(default_factory=dict)
    """the :data:`MOTION_PERCENTILE` th percentile of the flow's horizontal and vertical magnitudes (px per frame)
    on the sampled videos' first frame pairs, at each short side (:func:`flow_bound`)"""


@dataclass
class Plan:
    """What a run does: the network and clips, the schedule, the estimates per phase, and why."""

    model: Model
    batch: int
    """clips per batch of each process"""
    queue: int
    topk: int
    epochs: dict[str, int]
    """epochs of each stage kind ("infonce", "coclr")"""
    steps: int
    """training steps in all"""
    estimates: dict[str, float]
    """seconds of each phase, estimated"""
    budget: float
    reasons: list[str]
    processes: int = 1
    """processes the plan was made for (the global batch is ``batch`` times this)"""
    segment_frames: int | None = None
    """frames of a training instance (``data.segment_frames``; None: each video is one, as in plans made before)"""
    short_videos: list[str] = field(default_factory=list)
    """the videos shorter than one clip and its flow (padded by repeating their last frame)"""
    flow_bound: float | None = None
    """flow is clipped to +- this many pixels (:func:`coclr.flow.encode.bound_for` the clip side; None: the I3D
    convention's 20, as in plans made before)"""
    costs: dict[str, Any] = field(default_factory=dict)
    """the measured :class:`Costs` the plan was made from (what each part of the work takes here)"""
    threads: int | None = None
    """threads of the CoCLR stages, trained in the job's own process (None: every core; 1 where one thread was
    measured faster: :func:`one_thread`)"""
    inference_threads: int | None = None
    """threads of the quality measures' forwards (None: every core; 1 where a forward was measured faster on one
    thread: :func:`~coclr.train.timing.inference_on_one_thread`)"""
    init: dict[str, dict[str, Any]] = field(default_factory=dict)
    """view -> the checkpoint its InfoNCE stage starts from (``source``: the file given, ``sha256``, ``format``;
    :mod:`coclr.learn.init`); empty: both views from scratch. The model is then the checkpoint's."""
    fit_budget: bool = False
    """whether each CoCLR stage is sized as it starts by the time the budget has left (:func:`size_stage`); False:
    every stage trains the planned epochs (a plan given to follow, and plans made before)"""
    curate_videos: int | None = None
    """videos whose altered copies calibrate the curation's duplicate threshold (:func:`curate_videos`; 0: the
    similarity distribution's rule; None: :data:`CURATE_VIDEOS`, as plans made before)"""
    stage_epochs: dict[str, int] = field(default_factory=dict)
    """stage -> the epochs it was sized to as it started (:func:`size_stage`; kept, so a stage continues as it
    started)"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def coclr_epoch_seconds(self) -> float:
        """The estimated seconds of one epoch of one CoCLR stage (the CoCLR phase's estimate over its epochs)."""
        return self.estimates["coclr"] / max(1, 4 * self.epochs["coclr"])

    def stage_steps(self, stages: Sequence[Any]) -> int:
        """The training steps of ``stages`` (:class:`~coclr.train.pipeline.Stage`, each trained for its epochs at
        the plan's steps per epoch)."""
        epochs = 2 * self.epochs["infonce"] + 4 * self.epochs["coclr"]
        return round(self.steps / max(1, epochs) * sum(stage.epochs for stage in stages))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(**{**data, "model": Model(**data["model"])})

    def describe(self) -> str:
        total = sum(self.estimates.values())
        lines = [f"plan: {self.model}; batch {self.batch}, queue {self.queue}, top-{self.topk} mined positives; "
                 f"InfoNCE {self.epochs['infonce']} epochs per view, CoCLR 2 cycles of {self.epochs['coclr']} epochs "
                 f"per view ({self.steps} steps); about {duration(total)} of the {duration(self.budget)} budget"]
        lines += [f"  {reason}" for reason in self.reasons]
        for view, entry in self.init.items():
            lines.append(f"  {view} starts from {entry['source']} ({entry['format']} checkpoint, sha256 "
                         f"{entry['sha256'][:12]}...)")
        if self.fit_budget:
            lines.append(f"  each CoCLR stage is sized as it starts by the time left, to end near {SIZED_SHARE:.0%} "
                         "of the budget")
        if self.short_videos:
            shown = ", ".join(self.short_videos[:5]) + (" ..." if len(self.short_videos) > 5 else "")
            lines.append(f"  warning: {len(self.short_videos)} video(s) shorter than one clip and its flow "
                         f"({clip_span(self.model.length, 1) + 1} frames), padded by repeating their last frame: "
                         f"{shown}")
        return "\n".join(lines)


def one_thread(costs: Costs, key: str) -> bool:
    """Whether the CoCLR stages of model ``key`` train faster on one thread than on every core (a CPU job of one
    process): a step on one thread (:attr:`Costs.single_step`) took less than one on every thread
    (:attr:`Costs.step`) — a tiny network's operations are too small to share between threads."""
    return costs.side_by_side and costs.single_step.get(key, math.inf) < costs.step.get(key, 0.0)


def infonce_side_by_side(device, processes: int) -> bool:
    """Whether the two InfoNCE stages train at once, one thread each: a CPU job of one process on two cores or more
    (tiny networks use a second thread poorly, a second process well)."""
    return str(device).startswith("cpu") and processes == 1 and usable_cores() >= 2


def segment_frames(model: Model) -> int:
    """Frames of a training instance of ``model``: :data:`SEGMENT_SPANS` clip spans."""
    return SEGMENT_SPANS * clip_span(model.length, 1)


def batch_for(instances: int) -> int:
    """Clips per batch: :data:`BATCH`, or an eighth of fewer instances (at least 2): the queue holds the
    negatives, so a smaller batch costs little but makes each step cheaper, and few instances get more steps."""
    return max(2, min(BATCH, instances // 8))


def queue_for(instances: int, batch: int) -> int:
    """Keys in the queue: the largest power of two within a third of the instances (the quick study's 128 of 384),
    at most 2048 (the paper's on UCF101) and at least the batch."""
    return max(batch, min(2048, queue_within_a_third(instances)))


def windows_of(footage: Footage, model: Model) -> int:
    """Inference windows of every video (:func:`~coclr.data.sampling.sliding_windows`, counted: one for a video no
    longer than a clip, else one every half clip and one ending at the last frame)."""
    span = clip_span(model.length, 1)
    hop = max(1, model.length // 2)
    frames = np.asarray(footage.frame_counts, dtype=np.int64)
    starts = (frames - span) // hop + 1
    windows = np.where(frames <= span, 1, starts + ((frames - span) % hop != 0))
    return int(windows.sum())


def steps_per_epoch(footage: Footage, model: Model, batch: int, processes: int = 1) -> int:
    """Steps of an epoch: a sample of every instance, ``batch`` per process."""
    return max(1, footage.instances(model) // (batch * processes))


def estimates(footage: Footage, model: Model, costs: Costs, steps: int, batch: int,
              budget: float | None = None) -> dict[str, float]:
    """Seconds of each phase of a run of ``model`` with ``steps`` training steps of ``batch`` clips per process:
    half of them InfoNCE (its two stages side by side when :attr:`Costs.side_by_side`), half CoCLR (whose steps
    also run the frozen miner forward); the curation's calibration as ``budget`` affords it (:func:`curate_videos`;
    None: of :data:`CURATE_VIDEOS` videos)."""
    size = model.size
    pairs = max(0, footage.frames - footage.videos)
    quality_videos = min(footage.videos, QUALITY_VIDEOS)
    quality_windows = windows_of(footage, model) * quality_videos / footage.videos
    key = model.key
    epoch_steps = steps_per_epoch(footage, model, batch, costs.processes)
    infonce = 2 * STAGE_SHARES["infonce"] * steps
    coclr = steps - infonce
    if costs.side_by_side:  # the two stages at once, each on one core, in a process of its own
        infonce_seconds = (infonce / 2 * costs.lone_step[key] + infonce / 2 / epoch_steps * costs.epoch[key]
                           + costs.start[key])
    else:
        infonce_seconds = infonce * costs.step[key] + infonce / epoch_steps * costs.epoch[key]
    shared = costs.machines  # the store, flow and embedding jobs split the videos between machines
    alone = one_thread(costs, key)
    coclr_step = costs.single_step[key] if alone else costs.step[key]
    miner = costs.single_forward.get(key, costs.forward[key]) if alone else costs.forward[key]
    return {
        "store": store_seconds(footage, size, costs),
        "flow": flow_seconds(footage, size, costs),
        "infonce": infonce_seconds + 2 * costs.stage[key],
        "coclr": (coclr * (coclr_step + batch * miner) + coclr / epoch_steps * costs.epoch[key]
                  + 4 * costs.stage[key]),
        # two passes over the files (RGB; both streams, writing flow alone too), each decoding them in the job's
        # workers as the store does (on few cores they take them from this process's work: counted one after the
        # other), flow computed on the fly by one; four encoders loaded (RGB alone; RGB and flow; flow alone)
        "embed": (2 * decoding_seconds(footage, size, costs) + (pairs * costs.flow_pair[size]
                  + flow_calls(footage.frame_counts or [2] * footage.videos) * costs.flow_call.get(size, 0.0)
                  + 3 * windows_of(footage, model) * embed_forward(costs, key)) / shared
                  + 4 * costs.embed_load.get(key, 0.0)),
        "quality": 6 * (quality_windows * costs.window.get(key, costs.forward[key]) + costs.load.get(key, 0.0)),
        "curate": curate_seconds(footage, model, costs, curate_videos(footage, model, costs, budget)),
        "fixed": FIXED_SECONDS,
    }


def store_seconds(footage: Footage, size: int, costs: Costs) -> float:
    """Seconds of the store job at clips of ``size`` px: its start, then each worker's share of the videos' own parts
    and further frames at their costs with every worker busy (:func:`_time_store`); where those were not timed
    (plans made before), every frame decoded and encoded at one process's cost, divided by the workers."""
    if size not in costs.store_next:
        return footage.frames * (costs.decode_frame + costs.store_frame[size]) / costs.workers / costs.machines
    work = footage.videos * costs.store_video[size] + max(0, footage.frames - footage.videos) * costs.store_next[size]
    return costs.store_job[size] + work / max(1, min(costs.workers, footage.videos)) / costs.machines


def flow_seconds(footage: Footage, size: int, costs: Costs) -> float:
    """Seconds of the flow job at clips of ``size`` px: its start, then the videos' own parts and their frame pairs
    at their costs in the job (:func:`_time_flow_job`); where those were not timed (plans made before), each pair
    solved at :attr:`Costs.flow_pair` and encoded at one process's JPEG cost divided by the workers."""
    pairs = max(0, footage.frames - footage.videos)
    if size not in costs.flow_next:
        return pairs * (costs.flow_pair[size] + costs.store_frame[size] / costs.workers) / costs.machines
    work = footage.videos * costs.flow_video[size] + pairs * costs.flow_next[size]
    return costs.flow_job[size] + work / costs.machines


def flow_calls(frame_counts: Sequence[int]) -> int:
    """TV-L1 calls of computing the flow of videos of ``frame_counts`` frames as the embedding does: one per chunk
    of :data:`~coclr.embed.embedder.CHUNK_FRAMES` frames of each video (a video of one frame has none)."""
    from coclr.embed.embedder import CHUNK_FRAMES  # noqa: PLC0415 (heavy: torch)

    return sum(-(-frames // CHUNK_FRAMES) for frames in frame_counts if frames > 1)


def decoding_seconds(footage: Footage, size: int, costs: Costs) -> float:
    """Seconds of decoding every video to clips of ``size`` px in the job's workers (the embedding's decoders): the
    store job's (:func:`store_seconds`), whose timing holds decoding in the workers at once; plans made before, every
    frame at one process's cost, divided by the workers."""
    if size not in costs.store_next:
        return footage.frames * costs.decode_frame / costs.workers / costs.machines
    return store_seconds(footage, size, costs)


def embed_forward(costs: Costs, key: str) -> float:
    """Seconds of one window through the embedding's network of model ``key`` (:attr:`Costs.embed_forward`; plans
    made before, the training's encoder on every thread, :attr:`Costs.forward`)."""
    return costs.embed_forward.get(key, costs.forward[key])


def curate_seconds(footage: Footage, model: Model, costs: Costs, videos: int = CURATE_VIDEOS) -> float:
    """Seconds of the run's curation (:mod:`coclr.curate`): the altered copies of ``videos`` videos that calibrate
    its thresholds (:func:`calibration_seconds`), a fingerprint of each video and of each copy, and a thumbnail of
    each video, up to the page's most, made on a thread per core (:attr:`Costs.fingerprint`,
    :attr:`Costs.thumbnail`, timed so, and each pool's start once; where no thumbnail could be timed, a decode of
    every frame over the workers)."""
    from coclr.curate.alter import ALTERATIONS  # noqa: PLC0415
    from coclr.curate.run import CurateOptions  # noqa: PLC0415

    thumbnails = (costs.thumbnail_start + min(footage.videos, CurateOptions.thumbnails) * costs.thumbnail
                  if costs.thumbnail else footage.frames * costs.decode_frame / costs.workers)
    prints = footage.videos + min(videos, footage.videos) * len(ALTERATIONS)
    fingerprints = costs.fingerprint_start.get(model.key, 0.0) + prints * costs.fingerprint.get(model.key, 0.0)
    return calibration_seconds(footage, model, costs, videos) + thumbnails + fingerprints


def calibration_seconds(footage: Footage, model: Model, costs: Costs, videos: int) -> float:
    """Seconds of the curation's calibration on ``videos`` videos: their altered copies written (encoded at the
    source size) and embedded on both streams (decoded, their flow, two forwards per window; the two encoders
    loaded once)."""
    from coclr.curate.alter import ALTERATIONS  # noqa: PLC0415
    from coclr.curate.calibrate import MAX_FRAMES  # noqa: PLC0415

    frames = min(MAX_FRAMES, footage.frames / footage.videos)
    windows = max(1.0, frames / max(1, model.length // 2))
    copies = min(videos, footage.videos) * len(ALTERATIONS)
    calls = flow_calls([math.ceil(frames)]) * costs.flow_call.get(model.size, 0.0)
    return copies * (frames * (costs.encode_frame + costs.decode_frame + costs.flow_pair[model.size]) + calls
                     + 2 * windows * embed_forward(costs, model.key)) + (2 * costs.embed_load.get(model.key, 0.0)
                                                                          if copies else 0.0)


def curate_videos(footage: Footage, model: Model, costs: Costs, budget: float | None) -> int:
    """Videos whose altered copies calibrate the curation's threshold: the most, up to :data:`CURATE_VIDEOS`,
    whose calibration takes at most :data:`CURATE_SHARE` of ``budget`` (0: the similarity distribution's rule;
    None: :data:`CURATE_VIDEOS`)."""
    most = min(CURATE_VIDEOS, footage.videos)
    if budget is None:
        return most
    return next((videos for videos in range(most, 0, -1)
                 if calibration_seconds(footage, model, costs, videos) <= CURATE_SHARE * budget), 0)


TRAINING = ("infonce", "coclr")
"""The phases of :func:`estimates` that grow with the training steps."""
SIZED_SHARE = 0.93
"""The share of the budget a run aims to end at when its CoCLR stages are sized as they start (:func:`size_stage`):
the middle of 85-100%, the rest for the error of the phases after them. (The plan itself fills :data:`MARGIN`:
it sizes the network and the InfoNCE stages, whose error the CoCLR stages then absorb.)"""
LATER = ("quality", "embed", "curate", "fixed")
"""The phases after the training (:func:`estimates`): what the last CoCLR stage must leave time for."""
PACE_LIMITS = (0.5, 2.0)
"""The pace of the work so far (:func:`pace`) is trusted within these bounds (a phase of a few seconds can take
several times its estimate on a busy machine)."""
PACE_BAND = 1.15
"""A pace within this factor of 1 is the estimates' own error, not the machine's speed, and counts as 1; beyond it,
only the part past the band counts (:func:`pace`). The phases before the CoCLR stages (mostly the InfoNCE stages)
missed their estimates by up to a tenth or so, and the later phases' misses did not follow them (over 24 runs of
the clips and the synthetic videos, a correlation of -0.06 to 0.22): a pace from that error moved their estimates
by as much again, the wrong way as often as the right one; a busy machine moves every phase by more."""


def pace(estimated: dict[str, float], took: dict[str, float]) -> float:
    """How fast the machine goes against the plan: the seconds the phases in ``took`` took over their estimated
    seconds (phases without an estimate ignored), within :data:`PACE_LIMITS`, less the estimates' own error
    (:data:`PACE_BAND`: 1 within it, the ratio over the band's edge beyond it); 1 before any phase."""
    done = [name for name in took if estimated.get(name)]
    if not done:
        return 1.0
    ratio = min(PACE_LIMITS[1], max(PACE_LIMITS[0], sum(took[name] for name in done)
                                    / sum(estimated[name] for name in done)))
    return max(1.0, ratio / PACE_BAND) if ratio >= 1.0 else min(1.0, ratio * PACE_BAND)


def size_stage(plan: Plan, spent: float, took: dict[str, float], stages_left: int,
               epoch_seconds: float | None) -> tuple[int, dict[str, Any]]:
    """The epochs of the next CoCLR stage, one of ``stages_left`` still to train, when ``spent`` seconds of the run
    are gone and the phases before the CoCLR stages took ``took`` (name -> seconds): the seconds left to
    :data:`SIZED_SHARE` of the budget, less the later phases' estimates (:data:`LATER`) at the :func:`pace` of
    those phases, shared evenly by the stages left at ``epoch_seconds`` an epoch (measured on the CoCLR stages
    trained so far; None: the plan's estimate of the CoCLR phase per epoch); whole epochs, rounded, at least one
    and at most :data:`MAX_EPOCHS`. A machine that ran slower or faster than its calibration, or an estimate that
    was off, is corrected by the stages still to come: the last stage absorbs what the others left. Returns the
    epochs and what they were chosen from (``learn.json`` records it)."""
    speed = pace(plan.estimates, {name: seconds for name, seconds in took.items() if name not in TRAINING[1:]})
    later = sum(plan.estimates.get(name, 0.0) for name in LATER) * speed
    left = plan.budget * SIZED_SHARE - spent - later
    per_epoch = epoch_seconds if epoch_seconds is not None else plan.coclr_epoch_seconds
    epochs = max(1, min(MAX_EPOCHS["coclr"], round(left / max(1, stages_left) / per_epoch)))
    return epochs, {"epochs": epochs, "planned": plan.epochs["coclr"], "seconds_left": round(left, 1),
                    "later_phases": round(later, 1), "pace": round(speed, 3), "epoch_seconds": round(per_epoch, 3),
                    "measured": epoch_seconds is not None, "stages_left": stages_left}


def require_videos(readable: int, unreadable: Sequence[str] = ()) -> None:
    """Refuse, in one line naming the ``unreadable`` ones (the first few), fewer than :data:`MIN_VIDEOS` readable
    videos: checked as soon as the videos are probed, before the machine is measured."""
    if readable < MIN_VIDEOS:
        named = ""
        if unreadable:
            listed = ", ".join(shown(path) for path in unreadable[:3])
            more = f" and {len(unreadable) - 3} more" if len(unreadable) > 3 else ""
            named = f" ({len(unreadable)} could not be read: {listed}{more})"
        raise ConfigError(f"{readable} readable video(s){named}: learning needs at least {MIN_VIDEOS} (each batch "
                          "contrasts a video with the others); give more videos")


def choose_plan(footage: Footage, costs: Costs, budget: float, spent: float = 0.0,
                fixed: Model | None = None) -> Plan:
    """The plan for ``footage`` within ``budget`` seconds, ``spent`` of which are gone (probing, calibration).

    The largest model of :data:`MODELS` that suits the footage (:meth:`Footage.fits`) and affords
    :data:`TARGET_STEPS` within :data:`MARGIN` of the budget; else the cheapest one, if it affords
    :data:`MIN_STEPS`; else a refusal naming the budget that would do. With ``fixed`` (the network of a checkpoint
    the run starts from), that model, given every step the budget affords, or a refusal when it does not afford
    the smallest schedule (:func:`least_steps`)."""
    require_videos(footage.videos)
    if fixed is not None:
        return _fixed_plan(footage, costs, budget, spent, fixed)
    available = budget * MARGIN - spent
    affordable: dict[Model, int] = {}
    for model in MODELS:
        if model.key not in costs.step or not footage.fits(model):
            continue
        batch = plan_batch(footage, model, costs.processes)
        fixed = estimates(footage, model, costs, 0, batch, budget)
        per_step = _per_step(footage, model, costs, batch)
        affordable[model] = int((available - sum(fixed.values())) / per_step)
    if not affordable:
        raise ConfigError("no network was measured for these videos")
    cheapest = min(affordable, key=lambda m: MODELS.index(m))
    good = [m for m, steps in affordable.items() if steps >= TARGET_STEPS]
    batch = plan_batch(footage, cheapest, costs.processes)
    least = schedule(MIN_STEPS, steps_per_epoch(footage, cheapest, batch, costs.processes), up=True)[1]
    if good:
        model = max(good, key=lambda m: MODELS.index(m))
    elif affordable[cheapest] >= least:
        model = cheapest
    else:
        fixed = sum(estimates(footage, cheapest, costs, 0, batch, budget).values())
        per_step = _per_step(footage, cheapest, costs, batch)
        needed = (spent + fixed + least * per_step) / MARGIN
        raise ConfigError(f"--budget {as_given(budget)} is too small for {footage.videos} videos on this machine: "
                          + too_small(spent, fixed, f"the smallest network ({cheapest}) needs "
                                      f"{duration(least * per_step)} for {least} training steps", needed))
    return _plan(footage, costs, model, affordable[model], budget, spent,
                 _reasons(footage, costs, model, affordable, budget))


def as_given(budget: float) -> str:
    """A budget as a user writes it (``100s``, ``3m``), not rounded: "--budget 2 min is too small ...; give --budget
    2m" read as a contradiction where 100 s was given."""
    return f"{budget / 60:g}m" if budget % 60 == 0 else f"{budget:g}s"


def suggested_minutes(needed: float) -> int:
    """The budget, in whole minutes, a refusal suggests for a run that needs ``needed`` seconds as measured."""
    return math.ceil(needed * SUGGESTION_HEADROOM / 60)


def least_steps(footage: Footage, model: Model, processes: int = 1) -> int:
    """Training steps of the smallest schedule of ``model``: one epoch of each CoCLR stage (and the InfoNCE
    stages' share of it, :func:`schedule`)."""
    return schedule(0, steps_per_epoch(footage, model, plan_batch(footage, model, processes), processes), up=True)[1]


def too_small(spent: float, fixed: float, training: str, needed: float) -> str:
    """The end of a refused budget's line: what it had to hold (the measurement so far, the footage's phases, the
    ``training`` said, all within :data:`MARGIN` of it: the parts summed to less than the budget when the first and
    the margin went unsaid) and the budget that would do (``needed`` seconds)."""
    return (f"this measurement took {duration(spent)}, storing, flow and embedding would take about {duration(fixed)}, "
            f"and {training}, all within {MARGIN:.0%} of the budget; give --budget {suggested_minutes(needed)}m or "
            "more, or fewer videos")


def _fixed_plan(footage: Footage, costs: Costs, budget: float, spent: float, model: Model) -> Plan:
    """The plan of ``model``, fixed by a checkpoint (:func:`choose_plan` with ``fixed``)."""
    batch = plan_batch(footage, model, costs.processes)
    fixed = sum(estimates(footage, model, costs, 0, batch, budget).values())
    per_step = _per_step(footage, model, costs, batch)
    affordable = int((budget * MARGIN - spent - fixed) / per_step)
    least = least_steps(footage, model, costs.processes)
    if affordable < least:
        needed = (spent + fixed + least * per_step) / MARGIN
        raise ConfigError(f"--budget {as_given(budget)} cannot afford one epoch of the starting checkpoint's network "
                          f"({model}) on {footage.videos} videos on this machine: "
                          + too_small(spent, fixed, f"its smallest schedule ({least} steps: one epoch of each CoCLR "
                                      f"stage, two of each InfoNCE stage) {duration(least * per_step)}", needed))
    reasons = [f"{footage.videos} videos, {footage.frames} frames (median short side {footage.short_side} px); "
               f"measured here: {1e3 * costs.decode_frame:.2f} ms to decode a frame, "
               f"{1e3 * costs.flow_pair[model.size]:.2f} ms of flow per frame pair at {model.size} px, "
               f"{costs.workers} worker(s)",
               f"{model}: the starting checkpoint's network and clips; {1e3 * costs.step[model.key]:.0f} ms a step, "
               f"{affordable} steps within {MARGIN:.0%} of {duration(budget)}"]
    return _plan(footage, costs, model, affordable, budget, spent, reasons)


def measured_bound_reason(bound: float) -> str:
    """The plan's reason for its flow bound when the footage's motion chose it (a starting flow checkpoint's bound
    replaces it: :func:`coclr.learn.run.with_starts`)."""
    return f"flow clipped to +-{bound:g} px (the footage's motion, measured on its first frames)"


def _plan(footage: Footage, costs: Costs, model: Model, affordable: int, budget: float, spent: float,
          reasons: list[str]) -> Plan:
    """The plan of ``model`` given ``affordable`` training steps (``reasons``: why this model)."""
    batch = plan_batch(footage, model, costs.processes)
    epochs, steps = schedule(affordable, steps_per_epoch(footage, model, batch, costs.processes))
    queue = queue_for(footage.instances(model), batch * costs.processes)
    threads = 1 if one_thread(costs, model.key) else None
    inference = model.key in costs.window and inference_on_one_thread(
        costs.forward[model.key], costs.single_forward.get(model.key, costs.forward[model.key]))
    bound = flow_bound(costs, model.size)
    reasons.append(f"{footage.instances(model)} training instances: a video, or a stretch of {segment_frames(model)} "
                   f"frames of a longer one; {measured_bound_reason(bound)}")
    if threads == 1:
        reasons.append("CoCLR trains on one thread: this network's steps were measured faster on one thread than on "
                       "every core")
    if inference:
        reasons.append("the quality measures run on one thread: this network's forward was measured faster there")
    curated = curate_videos(footage, model, costs, budget)
    if curated < min(CURATE_VIDEOS, footage.videos):
        one = calibration_seconds(footage, model, costs, 1)
        reasons.append(f"the curation calibrates its duplicate threshold on {curated} video(s)' altered copies, the "
                       f"most within {CURATE_SHARE:.0%} of the budget" if curated else
                       f"the curation sets its duplicate threshold by the similarity distribution: calibrating it on "
                       f"one video's altered copies would take {duration(one)}, over {CURATE_SHARE:.0%} of the budget")
    recorded = {name: ({str(key): item for key, item in value.items()} if isinstance(value, dict) else value)
                for name, value in asdict(costs).items()}  # as JSON keeps them
    return Plan(model, batch, queue, min(5, max(1, queue // 2)), epochs, steps,
                {"measure": spent, **estimates(footage, model, costs, steps, batch, budget)}, budget, reasons,
                costs.processes, segment_frames(model), flow_bound=bound, costs=recorded, threads=threads,
                curate_videos=curated, fit_budget=True, inference_threads=1 if inference else None)


def flow_bound(costs: Costs, side: int) -> float:
    """The flow bound for the footage at clips of ``side`` px: the :data:`MOTION_PERCENTILE` th percentile of its
    measured motion, rounded up to two significant digits, within [1/16, 1] of the I3D bound scaled to the side
    (:func:`coclr.flow.encode.bound_for`): footage that moves little gets flow images that use their range (small
    values are otherwise lost to the 8-bit and JPEG quantisation), and no footage a wider bound than the paper's."""
    ceiling = bound_for(side)
    motion = costs.motion.get(side)
    if motion is None or not math.isfinite(motion) or motion <= 0:
        return ceiling
    digits = 1 - math.floor(math.log10(motion))
    rounded = math.ceil(motion * 10 ** digits) / 10 ** digits
    return float(min(ceiling, max(ceiling / 16, rounded)))


def schedule(steps: float, epoch_steps: int, up: bool = False) -> tuple[dict[str, int], int]:
    """The epochs of each stage kind for about ``steps`` training steps of ``epoch_steps`` an epoch, split as
    :data:`STAGE_SHARES` (whole epochs; at most :data:`MAX_EPOCHS`; rounded down, or with ``up`` up), and the steps
    they make."""
    share = steps * STAGE_SHARES["coclr"] / epoch_steps
    cycle = max(1, min(MAX_EPOCHS["coclr"], math.ceil(share) if up else int(share)))
    epochs = {"infonce": round(cycle * STAGE_SHARES["infonce"] / STAGE_SHARES["coclr"]), "coclr": cycle}
    return epochs, epoch_steps * (2 * epochs["infonce"] + 4 * epochs["coclr"])


def plan_batch(footage: Footage, model: Model, processes: int = 1) -> int:
    """Clips per batch of each of ``processes`` for ``model`` (:func:`batch_for` of each process's instances)."""
    return batch_for(footage.instances(model) // processes)


def _per_step(footage: Footage, model: Model, costs: Costs, batch: int) -> float:
    """Seconds of one more training step (its share of the epoch's end included)."""
    more, none = estimates(footage, model, costs, 1000, batch), estimates(footage, model, costs, 0, batch)
    return sum(more[phase] - none[phase] for phase in TRAINING) / 1000


def _reasons(footage: Footage, costs: Costs, model: Model, affordable: dict[Model, int], budget: float) -> list[str]:
    """Why ``model``: what each candidate would afford, and the measured costs."""
    lines = [f"{footage.videos} videos, {footage.frames} frames (median short side {footage.short_side} px); "
             f"measured here: {1e3 * costs.decode_frame:.2f} ms to decode a frame, "
             f"{1e3 * costs.flow_pair[model.size]:.2f} ms of flow per frame pair at {model.size} px, "
             f"{costs.workers} worker(s)"]
    for candidate, steps in affordable.items():
        verdict = ("chosen" if candidate == model else
                   "affords fewer steps than the target" if steps < TARGET_STEPS else "smaller")
        lines.append(f"{candidate}: {1e3 * costs.step[candidate.key]:.0f} ms a step, {max(steps, 0)} steps within "
                     f"{MARGIN:.0%} of {duration(budget)} (target {TARGET_STEPS}): {verdict}")
    skipped = [m for m in MODELS if m not in affordable and not footage.fits(m)]
    if skipped:
        lines.append(f"not for these videos (crop above their median short side, or clip longer than a tenth of "
                     "them): "
                     f"{'; '.join(map(str, skipped))}")
    unmeasured = [m for m in MODELS if m not in affordable and footage.fits(m)]
    if unmeasured:
        lines.append(f"not measured (predicted from the smaller ones measured to afford fewer than {TARGET_STEPS} "
                     "steps, its own measurement included): " + "; ".join(map(str, unmeasured)))
    return lines


# ------------------------------------------------------------------------------------------------ measuring


Progress = Callable[[str, "float | None"], None]
"""Told what the measurement is doing and the seconds it expects it still needs (None: not known yet)."""


def measure_costs(sample_videos: Sequence[str], footage: Footage, device, workers: int,
                  deadline: float, processes: int = 1, machines: int = 1, report: Progress | None = None,
                  fixed: Model | None = None) -> Costs:
    """Measure :class:`Costs` on this machine: decoding on :data:`SAMPLE_VIDEOS` of the footage's own videos (spread
    over them), then for each candidate network, from the cheapest up, JPEG and flow on their frames at its clip
    side (once per side; with the footage's motion there), a few training steps and forwards, the embedding's network
    (:func:`_time_embedding`), the store job on their first frames at its side (:func:`_time_store`, once per
    side), and the flow job and the flow's pairs on the first frames of :data:`FLOW_VIDEOS` (:func:`_time_flow_job`
    after the training timings; :func:`_time_flow_pairs` once before them and twice after), until one would not
    afford :data:`TARGET_STEPS` within ``deadline`` seconds of work, or the next is predicted not to after its own
    measurement (:func:`still_measured`); with ``fixed``, that network alone.
    ``report`` is told each part and the seconds left (:func:`measuring_left`)."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.flow.opencv import rgb_to_gray  # noqa: PLC0415 (heavy: torch)
    from coclr.flow.tvl1 import tvl1_flow  # noqa: PLC0415 (heavy: torch)
    from coclr.store.jpeg import encode_jpeg  # noqa: PLC0415
    from coclr.video.decode import VideoReader, resize_short_side  # noqa: PLC0415

    report = report or (lambda what, left: None)
    started = time.perf_counter()
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    videos: list[list[np.ndarray]] = []  # the first frames of each sampled video
    timings: list[tuple[float, int]] = []  # (seconds, frames) of each video decoded
    report("decoding a few videos", None)
    sampled = spread_over(sample_videos, SAMPLE_VIDEOS)
    for path in sampled:
        try:
            begin = time.perf_counter()
            frames: list[np.ndarray] = []
            with VideoReader(path) as reader:
                for frame in reader:
                    frames.append(frame)
                    if len(frames) == 48:
                        break
            timings.append((time.perf_counter() - begin, len(frames)))
            videos.append(frames)
        except Exception:  # an unreadable sample is the store job's failure to report, not the calibration's
            continue
    if not any(videos):
        raise ConfigError("none of the first videos could be decoded to measure this machine: check the inputs")
    timed = timings[1:] or timings  # the first one also warms the decoder up
    decode_frame = sum(seconds for seconds, _ in timed) / max(1, sum(count for _, count in timed))
    costs = Costs(decode_frame, {}, {}, {}, {}, {}, {}, {}, workers, processes=processes, machines=machines,
                  side_by_side=infonce_side_by_side(device, processes), encode_frame=_time_encoding(videos))
    costs.thumbnail_start, costs.thumbnail = _time_thumbnail(sampled, workers)
    flow_sample = spread_over(sample_videos, FLOW_VIDEOS)
    flow_frames = -(-FLOW_PAIRS // len(flow_sample)) + 1
    flow_videos = [frames for frames in (_first_frames(path, flow_frames) for path in flow_sample)
                   if len(frames) > 1] or [[frames[0], np.roll(frames[0], 1, axis=1)] for frames in videos if frames]
    # (videos of one frame: that frame and itself shifted by a pixel, as the motion's pairs)

    def measure_size(size: int) -> None:  # JPEG and flow at a clip side, once a candidate of that side is measured
        report(f"JPEG and TV-L1 flow at {size} px", None)
        small = [[resize_short_side(frame, size) for frame in frames[:PAIRS + 1]] for frames in videos if frames]
        begin = time.perf_counter()
        for frames in small:
            for frame in frames:
                encode_jpeg(frame)
        costs.store_frame[size] = (time.perf_counter() - begin) / sum(len(frames) for frames in small)
        grays = []
        for frames in small:
            gray = torch.from_numpy(np.stack([rgb_to_gray(frame[None])[0] for frame in frames]).astype(np.float32))
            grays.append((gray if len(gray) > 1 else torch.cat([gray, gray.roll(1, dims=-1)])).to(device))
        flows = [tvl1_flow(gray[:-1], gray[1:]) for gray in grays]  # (also builds the kernels: C loops, Triton)
        costs.motion[size] = float(np.percentile(np.concatenate([flow.abs().cpu().numpy().ravel() for flow in flows]),
                                                 MOTION_PERCENTILE))
        flow_grays[size] = [torch.from_numpy(rgb_to_gray(np.stack([resize_short_side(frame, size) for frame in frames]))
                                             .astype(np.float32)).to(device) for frames in flow_videos]
        flow_timings[size] = [_time_flow_pairs(flow_grays[size], sync)]  # more after the training timings
        costs.flow_pair[size], costs.flow_call[size] = flow_timings[size][0]

    def measure_store(size: int) -> None:  # the store job at a clip side: timed after a training timing, as the
        # job runs in a process that has trained (forking it costs more than forking a fresh one)
        report(f"the store job at {size} px", None)
        timed_store = store_costs(sampled, size, workers, footage, decode_frame)
        if timed_store is not None:
            costs.store_job[size], costs.store_video[size], costs.store_next[size] = timed_store
        report(f"the flow job at {size} px", None)  # its timings and the flow's, spread over the measurement: a
        # moment of the machine moved one timing of a fraction of a second by a fifth
        timed_flow = flow_job_costs([[resize_short_side(frame, size) for frame in frames] for frames in flow_videos],
                                    workers)
        if timed_flow is not None:
            costs.flow_job[size], costs.flow_video[size], costs.flow_next[size] = timed_flow
        flow_timings[size] += [_time_flow_pairs(flow_grays[size], sync) for _ in range(REPEATS - 1)]
        costs.flow_pair[size], costs.flow_call[size] = medians(flow_timings[size])

    flow_timings: dict[int, list[tuple[float, float]]] = {}  # (pair, call) timings of the flow at each side
    flow_grays: dict[int, list[Any]] = {}  # the flow videos' frames at each side, grey, on the device
    candidates = [fixed] if fixed is not None else [model for model in MODELS if footage.fits(model)]
    took: list[tuple[Model, float]] = []
    with scratch_folder("learn-calibration") as tmp:
        for number, model in enumerate(candidates):
            left = deadline - (time.perf_counter() - started)
            if not still_measured(took, [model], footage, costs, left):
                break  # its own measurement would leave it too few steps
            begin = time.perf_counter()
            if model.size not in costs.flow_pair:
                measure_size(model.size)
            report(f"training steps of {model} ({number + 1} of at most {len(candidates)})",
                   measuring_left(took, candidates[number:], footage, costs, left))
            batch = plan_batch(footage, model, processes)
            measured = time_training(model.width, model.size, model.length, Path(tmp) / model.key, device, batch)
            if costs.side_by_side:
                measured["lone_step"], measured["start"] = _time_side_by_side(model, batch)
            for name in ("step", "lone_step", "single_step", "forward", "single_forward", "epoch", "stage", "start",
                         "window", "load"):
                fallback = (measured["step"] if name in ("lone_step", "single_step")
                            else measured["forward"] if name in ("single_forward", "window") else 0.0)
                getattr(costs, name)[model.key] = measured.get(name, fallback)
            costs.embed_forward[model.key], costs.embed_load[model.key] = _time_embedding(
                model, device, Path(tmp) / f"{model.key}_embed")
            costs.fingerprint_start[model.key], costs.fingerprint[model.key] = _time_fingerprint(
                sampled, workers, model.width)
            if model.size not in costs.store_job:
                measure_store(model.size)
            took.append((model, time.perf_counter() - begin))
            if _affordable(footage, model, costs, deadline - (time.perf_counter() - started)) < TARGET_STEPS:
                break  # a larger network would afford even fewer
    costs.seconds = time.perf_counter() - started
    return costs


def _affordable(footage: Footage, model: Model, costs: Costs, left: float) -> float:
    """Training steps of ``model`` (measured in ``costs``) that ``left`` seconds of work afford."""
    batch = plan_batch(footage, model, costs.processes)
    return ((left - sum(estimates(footage, model, costs, 0, batch, left).values()))
            / _per_step(footage, model, costs, batch))


def work(model: Model) -> float:
    """How much computing a clip of ``model`` takes, relatively: channels squared (width), pixels and frames."""
    return model.width ** 2 * model.size ** 2 * model.length


def still_measured(took: Sequence[tuple[Model, float]], remaining: Sequence[Model], footage: Footage, costs: Costs,
                   left: float) -> list[tuple[Model, float]]:
    """The ``remaining`` candidates the measurement will still time, each with the seconds its timing is predicted
    to take, from those measured (``took``: each model and the seconds its measurement took; none: the first
    candidate, its seconds unknown, 0): a candidate's measurement and its training steps grow with its :func:`work`
    to the power fitted on the last two measured (0.5 after one), and one is timed only while it is predicted to
    afford :data:`TARGET_STEPS` in the ``left`` seconds less its own measurement and those before it: a network
    that its own measurement would make unaffordable is not measured."""
    if not took:
        return [(model, 0.0) for model in remaining[:1]]
    (last, seconds) = took[-1]
    power = 0.5
    if len(took) >= 2 and work(last) > work(took[-2][0]) and seconds > 0 and took[-2][1] > 0:
        power = min(1.0, max(0.2, math.log(seconds / took[-2][1]) / math.log(work(last) / work(took[-2][0]))))
    found, spent = [], 0.0
    for model in remaining:
        scale = (work(model) / work(last)) ** power
        spent += seconds * scale
        if _affordable(footage, last, costs, left - spent) / scale < TARGET_STEPS:
            break
        found.append((model, seconds * scale))
    return found


def measuring_left(took: Sequence[tuple[Model, float]], remaining: Sequence[Model], footage: Footage, costs: Costs,
                   left: float) -> float | None:
    """The seconds the measurement of the ``remaining`` candidates still takes (:func:`still_measured`); None
    before any candidate was measured."""
    if not took:
        return None
    return sum(seconds for _, seconds in still_measured(took, remaining, footage, costs, left))


def _time_encoding(videos: list[list[np.ndarray]]) -> float:
    """Seconds to encode one of the sampled videos' frames as H.264 (as the curation writes its altered copies):
    the first video's, cropped to even sides, the median of :data:`REPEATS` runs after a first (which loads
    the encoder)."""
    from coclr.video.decode import write_mp4  # noqa: PLC0415 (heavy: av)

    frames = np.stack(next(frames for frames in videos if frames))
    frames = frames[:, : frames.shape[1] // 2 * 2, : frames.shape[2] // 2 * 2]
    if min(frames.shape[1:3]) < 2:
        return 0.0
    with scratch_folder("learn-calibration") as tmp:
        write_mp4(Path(tmp) / "first.mp4", frames[:2], 25.0)
        names = itertools.count()
        return _median_seconds(lambda: write_mp4(Path(tmp) / f"timed{next(names)}.mp4", frames, 25.0)) / len(frames)


def spread_over(paths: Sequence[str], count: int) -> list[str]:
    """At most ``count`` of ``paths``, spread evenly over them (the first and the last among them)."""
    return [paths[int(i)] for i in spread(len(paths), count)]


def medians(runs: Sequence[tuple[float, ...] | None]) -> tuple[float, ...] | None:
    """Each figure's median over the timings ``runs`` that gave figures (None: a timing that had nothing to time);
    None when none did."""
    timed = [run for run in runs if run is not None]
    return tuple(float(np.median(figure)) for figure in zip(*timed)) if timed else None


def _median_seconds(work: Callable[[], object], sync: Callable[[], object] = lambda: None) -> float:
    """The median of :data:`REPEATS` timings of ``work()`` (``sync``: waits for the device before and after)."""
    timed = []
    for _ in range(REPEATS):
        sync()
        begin = time.perf_counter()
        work()
        sync()
        timed.append(time.perf_counter() - begin)
    return float(np.median(timed))


def _first_frames(path: str, count: int) -> list[np.ndarray]:
    """The first ``count`` frames of the video at ``path``, no larger than the largest candidate's clips need (kept
    in memory; fewer if it is shorter; none if it cannot be read: the store job reports it)."""
    from coclr.video.decode import VideoReader, resize_short_side  # noqa: PLC0415

    largest = max(model.size for model in MODELS)
    try:
        with VideoReader(path) as reader:
            return [resize_short_side(frame, min(largest, *frame.shape[:2]))
                    for frame in itertools.islice(reader, count)]
    except Exception:  # an unreadable sample is the store job's failure to report, not the calibration's
        return []


def _time_flow_pairs(grays: Sequence[Any], sync: Callable[[], object] = lambda: None) -> tuple[float, float]:
    """Seconds of a frame pair's TV-L1 flow and of what a call costs beyond its pairs, one timing of each: the pairs
    of the sampled videos ``grays`` (each ``[frames, H, W]`` on the device; their motion decides how long a pair
    takes) solved as the embedding solves a video's chunk (calls of up to
    :data:`~coclr.embed.embedder.CHUNK_FRAMES` pairs of a frame size), and each video's first pair in a call of its
    own (``G`` calls of ``N`` pairs took ``T``, the single calls ``t`` each on the mean: a pair
    ``(T - G t) / (N - G)``, a call ``t`` less a pair)."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.embed.embedder import CHUNK_FRAMES  # noqa: PLC0415 (heavy: torch)
    from coclr.flow.tvl1 import tvl1_flow  # noqa: PLC0415 (heavy: torch)

    by_size: dict[tuple[int, ...], list[int]] = {}
    for number, gray in enumerate(grays):
        by_size.setdefault(tuple(gray.shape[1:]), []).append(number)
    calls = []
    for numbers in by_size.values():
        pairs = [(number, pair) for number in numbers for pair in range(len(grays[number]) - 1)]
        for first in range(0, len(pairs), CHUNK_FRAMES):
            chunk = pairs[first:first + CHUNK_FRAMES]
            calls.append(tuple(torch.stack([grays[number][pair + shift] for number, pair in chunk])
                               for shift in (0, 1)))
    sync()
    begin = time.perf_counter()
    for previous, following in calls:
        tvl1_flow(previous, following)
    sync()
    batched = time.perf_counter() - begin
    begin = time.perf_counter()
    for gray in grays:
        tvl1_flow(gray[:1], gray[1:2])
    sync()
    single = (time.perf_counter() - begin) / len(grays)
    solved = sum(len(previous) for previous, _ in calls)
    pair = max(0.0, (batched - len(calls) * single) / (solved - len(calls))) if solved > len(calls) else single
    return (pair, max(0.0, single - pair)) if pair > 0 else (batched / solved, 0.0)


def flow_job_costs(videos: Sequence[Sequence[np.ndarray]], workers: int) -> tuple[float, float, float] | None:
    """The flow job's start, a video's own part and a further frame pair (:func:`_time_flow_job` on the sampled
    ``videos``' first frames at the clip side), each the median of :data:`REPEATS` timings; None when no video has
    a pair or none has two."""
    return medians([_time_flow_job(videos, workers) for _ in range(REPEATS)])


def _time_flow_job(videos: Sequence[Sequence[np.ndarray]], workers: int) -> tuple[float, float, float] | None:
    """The flow job's costs timed as it runs: the job itself (:func:`~coclr.store.flow_extract.extract_flow` as
    ``coclr learn`` runs it, its backend and ``workers``) on a temporary store of the sampled ``videos``' frames
    (RGB frames at the clip side), three times after a first: one video of one pair; :data:`FLOW_KEYS` videos of one
    pair (the videos' first pairs, then their second ones, ...); every frame of each video. The job solves its pairs
    on the cores its decoding and JPEG workers share (on the synthetic videos a pair took a fifth more in the job than
    solved alone). :func:`flow_job_figures` takes the three costs from their seconds. None when no video has a pair
    or none has two (a pair's cost and a video's could not be told apart)."""
    from coclr.progress import observed  # noqa: PLC0415
    from coclr.store.clipstore import create_store, write_entry  # noqa: PLC0415
    from coclr.store.flow_extract import extract_flow  # noqa: PLC0415 (heavy: torch)
    from coclr.store.jpeg import encode_jpeg  # noqa: PLC0415
    from coclr.video.indexes import unlabelled_index  # noqa: PLC0415

    videos = [list(frames) for frames in videos if len(frames) > 1]
    long_pairs = sum(len(frames) - 1 for frames in videos)
    if long_pairs <= len(videos):
        return None
    pairs = [frames[number:number + 2] for number in range(max(map(len, videos)) - 1)  # each video's first, ...
             for frames in videos if number < len(frames) - 1]
    jobs = {"warm": [pairs[0]], "one": [pairs[0]], "short": [pairs[number % len(pairs)] for number in range(FLOW_KEYS)],
            "long": videos}  # (the first job of a process also imports and builds what the job needs: not timed)
    entries = {f"{job}{number}.mp4": frames for job, keyed in jobs.items() for number, frames in enumerate(keyed)}
    seconds = []
    with scratch_folder("learn-calibration") as scratch:
        create_store(scratch, unlabelled_index(list(entries), "calibration"))
        for key, frames in entries.items():
            write_entry(scratch, key, "rgb", [encode_jpeg(frame) for frame in frames], 25.0)
        with observed(lambda *_: None):  # (no bar of its own: the measuring line is drawn)
            for job, keyed in jobs.items():
                begin = time.perf_counter()
                extract_flow(scratch, backend="auto", workers=workers,
                             keys=[f"{job}{number}.mp4" for number in range(len(keyed))])
                seconds.append(time.perf_counter() - begin)
    return flow_job_figures(seconds[1:], FLOW_KEYS, len(videos), long_pairs)


def flow_job_figures(seconds: Sequence[float], short_videos: int, long_videos: int,
                     long_pairs: int) -> tuple[float, float, float]:
    """The flow job's three costs from the ``seconds`` of its three timed jobs (:func:`_time_flow_job`): one video of
    one pair (the start, a video and a pair), ``short_videos`` of one pair (a video and a pair, that many times) and
    ``long_videos`` of ``long_pairs`` pairs in all (each video's first pair as the short ones', a further pair
    each): its start, a video's own part and a further pair, none below 0."""
    one, short, long = seconds
    first = max(0.0, (short - one) / max(1, short_videos - 1))  # a video of one pair, the job's start aside
    start = max(0.0, one - first)
    further = max(0.0, (long - start - long_videos * first) / (long_pairs - long_videos))
    return start, max(0.0, first - further), further


def _time_per_video(paths: Sequence[str], work: Callable[[str], object], workers: int = 1) -> tuple[float, float]:
    """Seconds of the start and of each video of ``work`` over ``paths`` with ``workers`` threads at it, as the
    curation runs its thumbnails and fingerprints (a thread pool, one per core: a decoder already keeps more than one
    core busy, so threads on few cores share them). After one untimed run on the first readable video (which loads
    what the work needs), each thread runs it once at once (a thread's first run costs more: that round's excess over
    the threads' share of the videos is the start), then the pool goes through every video once per thread: its
    seconds over the videos done (over all of them: the videos differ in length and size; the median of a few picked
    the cheap ones). (0, 0) when none could be read (the store job reports those)."""
    import threading  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    def done(path: str) -> bool:
        try:
            work(path)
        except Exception:  # an unreadable sample: the store job reports it
            return False
        return True

    first = next((path for path in paths if done(path)), None)
    if first is None:
        return 0.0, 0.0
    threads = max(1, workers)
    barrier = threading.Barrier(threads)

    def warm(path: str) -> None:  # each thread once: one waiting here takes no other, so every thread takes one
        done(path)
        try:
            barrier.wait(60)
        except threading.BrokenBarrierError:
            pass

    with ThreadPoolExecutor(threads) as pool:
        begin = time.perf_counter()
        list(pool.map(warm, [first] * threads))
        started = time.perf_counter() - begin
        begin = time.perf_counter()
        count = sum(pool.map(done, [path for _ in range(threads) for path in paths]))
        seconds = time.perf_counter() - begin
    if not count:
        return 0.0, 0.0
    return max(0.0, started - seconds / count * threads), seconds / count


def _time_embedding(model: Model, device, folder: Path) -> tuple[float, float]:
    """Seconds of one window through the network ``coclr embed`` runs of ``model`` (built as the embedding builds it,
    :func:`~coclr.models.inference.inference_network`; :data:`TIMED_BATCHES` batches of
    :data:`~coclr.train.timing.INFERENCE_BATCH` at a time, on every thread), and of loading an encoder file into
    that network (each file once, as the embedding loads each encoder); each the median of :data:`REPEATS` after a
    first, which builds what they need."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.models.encoder import build_encoder  # noqa: PLC0415
    from coclr.models.inference import inference_network  # noqa: PLC0415
    from coclr.models.loading import load_encoder, save_encoder  # noqa: PLC0415
    from coclr.train.timing import INFERENCE_BATCH  # noqa: PLC0415

    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    folder.mkdir(parents=True, exist_ok=True)
    encoder = build_encoder(width=model.width)
    loads, network = [], None
    for number in range(REPEATS + 1):
        path = save_encoder(folder / f"embed{number}.pth", encoder)
        begin = time.perf_counter()
        backbone, _ = load_encoder(path, map_location="cpu")
        network = inference_network(backbone, None, device)
        loads.append(time.perf_counter() - begin)
    clips = torch.randn(INFERENCE_BATCH, 3, model.length, model.size, model.size, device=device)
    with torch.inference_mode():
        network(clips)
        forward = _median_seconds(lambda: [network(clips) for _ in range(TIMED_BATCHES)], sync)
    return forward / TIMED_BATCHES / INFERENCE_BATCH, float(np.median(loads[1:]))


def store_costs(paths: Sequence[str], size: int, workers: int, footage: Footage,
                decode_frame: float) -> tuple[float, float, float] | None:
    """The store job's start, a video's own part and a further frame at clips of ``size`` px (:func:`_time_store` on
    the sampled ``paths``), each the median of :data:`REPEATS` timings; None when no video could be read. Each timing
    is sized by a guess of a key's seconds: its frames (at most :data:`STORE_FRAMES`, the footage's median) at twice
    one process's decoding (``decode_frame``; the JPEG, the workers sharing cores) and 3 ms of its own part."""
    key_seconds = min(STORE_FRAMES, int(np.median(footage.frame_counts or [1]))) * 2 * decode_frame + 0.003
    return medians([_time_store(paths, size, workers, key_seconds) for _ in range(REPEATS)])


def _time_store(paths: Sequence[str], size: int, workers: int, key_seconds: float) -> tuple[float, float, float] | None:
    """The store job's costs at clips of ``size`` px, timed as it runs: the job itself (its pool of ``workers``
    processes, each frame decoded, resized and JPEG-encoded, each entry written, the results gathered) over keys that
    are the first :data:`STORE_FRAMES` frames of the videos of ``paths`` in turn, as many as make about
    :data:`STORE_SECONDS` of each worker's work (``key_seconds``: a guess of one key's). One decoder
    already keeps more than one core busy (FFmpeg's frame threads), so workers on few cores share them; a job of many
    short videos is mostly its per-video part (opening, the entry's write, the pool's round trip).

    Returns the seconds of the job's start (to each worker's first video, the mean), of a video's own part
    (everything of a worker's time but its further frames, per video) and of a further frame (each video's cost per
    frame weighted by its length, as the footage's frames are): :func:`store_seconds` counts them. None when no
    video could be read (the store job reports those)."""
    from coclr.progress import observed  # noqa: PLC0415
    from coclr.store.clipstore import create_store  # noqa: PLC0415
    from coclr.store.jobs import run_entry_jobs  # noqa: PLC0415 (heavy: torch)
    from coclr.video.indexes import unlabelled_index  # noqa: PLC0415

    keys = [f"{number}.mp4" for number in range(max(len(paths) * workers,
                                                    min(64 * workers, round(workers * STORE_SECONDS / key_seconds))))]
    with scratch_folder("learn-calibration") as scratch:
        create_store(scratch, unlabelled_index(keys, "calibration"))
        with observed(lambda *_: None):  # (no bar of its own: the measuring line is drawn)
            started = time.perf_counter()
            summary = run_entry_jobs(scratch, "rgb", keys, _FirstFrames(tuple(paths), size), workers)
            ended = time.perf_counter()
    notes = list(summary.noted.values())
    return store_figures(notes, started, ended) if notes else None


def store_figures(notes: Sequence[dict[str, Any]], started: float, ended: float) -> tuple[float, float, float]:
    """The store job's three costs from the ``notes`` of its timed videos (:class:`_FirstFrames`) and the job's
    ``started`` and ``ended`` times (:func:`_time_store`): its start, the mean of the workers' first ``begin``
    after ``started``; a video's own part, the workers' time from their first video to the job's end less the
    videos' further frames, per video; a further frame, each video's seconds per further frame weighted by its
    length (``frames``)."""
    by_worker: dict[int, list[float]] = {}
    for note in notes:
        by_worker.setdefault(note["worker"], []).append(note["begin"])
    firsts = [min(begins) for begins in by_worker.values()]
    further = sum(note["seconds"] for note in notes)
    own = (sum(ended - first for first in firsts) - further) / len(notes)
    weights = np.array([note["frames"] for note in notes], dtype=np.float64)
    per_frame = np.array([note["seconds"] / max(1, note["further"]) for note in notes])
    return float(np.mean(firsts) - started), max(0.0, own), float((weights * per_frame).sum() / weights.sum())


@dataclass(frozen=True)
class _FirstFrames:
    """The store's job (:class:`~coclr.store.build.DecodeVideoJob`) on the first :data:`STORE_FRAMES` frames of a
    video of ``paths`` (key ``N.mp4``: the N-th, in turn), noting the worker, when the video began, the seconds and
    number of its frames after the first, and its length (the weight of its cost per frame)."""

    paths: tuple[str, ...]
    size: int

    def __call__(self, key: str):
        from coclr.clips import JPEG_QUALITY  # noqa: PLC0415
        from coclr.store.build import encoded_frames  # noqa: PLC0415
        from coclr.video.decode import VideoReader  # noqa: PLC0415

        notes: dict[str, Any] = {"worker": os.getpid(), "begin": time.perf_counter()}
        reader = VideoReader(self.paths[int(key.split(".")[0]) % len(self.paths)], self.size)

        def frames():
            marks = []
            for frame in itertools.islice(encoded_frames(reader, JPEG_QUALITY), STORE_FRAMES):
                marks.append(time.perf_counter())
                yield frame
            marks.append(time.perf_counter())
            notes.update(seconds=marks[-1] - marks[0], further=len(marks) - 2,
                         frames=reader.expected or len(marks) - 1)

        return frames(), reader.fps, notes


def _time_thumbnail(paths: Sequence[str], workers: int = 1) -> tuple[float, float]:
    """Seconds of the start and of one video of the curation's thumbnails (as :func:`coclr.curate.run.
    write_thumbnails` makes them), with ``workers`` threads at them (:func:`_time_per_video`)."""
    from coclr.curate.run import THUMBNAIL_FRAMES, THUMBNAIL_HEIGHT  # noqa: PLC0415
    from coclr.embed.search import file_thumbnail  # noqa: PLC0415 (heavy: torch)
    from coclr.eval.gallery import animated_gif  # noqa: PLC0415

    return _time_per_video(paths, lambda path: animated_gif(
        file_thumbnail(path, num_frames=THUMBNAIL_FRAMES, height=THUMBNAIL_HEIGHT)), workers)


def _time_fingerprint(paths: Sequence[str], workers: int = 1, width: float = 1.0) -> tuple[float, float]:
    """Seconds of the start and of one video of the curation's fingerprints (as
    :func:`coclr.curate.fingerprint.fingerprints` makes them, with the first block of the network of ``width``: the
    run's encoder's, whose width moves the cost by half on 2 cores; each kept in a file), with ``workers`` threads at
    them, each convolution on one thread (:func:`_time_per_video`)."""
    from coclr.atomic import atomic_open  # noqa: PLC0415
    from coclr.curate.fingerprint import fingerprint_file  # noqa: PLC0415
    from coclr.models.s3d import S3D  # noqa: PLC0415

    stem = S3D(width=width).Conv_1a.eval()
    names = itertools.count()

    def fingerprint(path: str, folder: Path) -> None:  # and kept in a file of its own, as the curation keeps them
        found = fingerprint_file(path, stem)
        with atomic_open(folder / f"{next(names)}.npy", "wb") as handle:
            np.save(handle, found, allow_pickle=False)

    with torch_threads(1), scratch_folder("learn-calibration") as tmp:
        return _time_per_video(paths, lambda path: fingerprint(path, Path(tmp)), workers)


def _time_side_by_side(model: Model, batch: int, steps: int = 5) -> tuple[float, float]:
    """Seconds of one training step of ``model`` in each of two processes training side by side, one thread each
    (the mean of the two's medians: both run the same work), and the seconds such a process takes to start
    (imports, store, networks; the slower of the two): measured with two real child processes, started as the
    InfoNCE stages are (:func:`coclr.jobs.scheduler.start_task`)."""
    from coclr.jobs.scheduler import log_tail, start_task, stop_processes  # noqa: PLC0415 (heavy: torch)
    from coclr.jobs.tasks import TrainingTiming  # noqa: PLC0415

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    launched = time.time()
    with scratch_folder("learn-calibration") as tmp:
        results = [Path(tmp) / f"side{number}.json" for number in range(2)]
        children = [start_task(TrainingTiming(model.width, model.size, model.length, batch, steps, launched, result),
                               result.stem, Path(tmp), env) for result in results]
        timings = []
        try:
            for (child, log), result in zip(children, results):
                if child.wait(600) != 0 or not result.is_file():
                    error = ConfigError("the calibration of two processes side by side failed: "
                                        f"{log_tail(log, 5).strip()[-300:]}")
                    error.lines = True  # (its log's tail, line by line)
                    raise error
                timings.append(json.loads(result.read_text()))
        finally:  # (a failed or stopped calibration leaves no child behind)
            stop_processes([child for child, _ in children])
    return float(np.mean([t["step"] for t in timings])), max(t["started"] for t in timings)
