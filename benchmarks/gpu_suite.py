"""The speed of the whole training path in one command: one table (and a JSON file) from the JPEG decoder to the
projected wall time of the paper's UCF101 study.

    python benchmarks/gpu_suite.py [--json gpu_suite.json] [--tiny] [--parts step,epoch]
    python benchmarks/gpu_suite.py --quick --out quick.json   # TV-L1, step and epoch only; no PyAV, contrib, ../shared

The JSON file is rewritten after every figure and part, so a run cut short keeps the figures measured so far.

On a CUDA machine it runs the full suite in under 8 minutes (every part has a time budget and stops early when
it is spent; the table says so). On the CPU the parts meant for a GPU run a tiny version (the demo's network on
32-px clips); the data-path parts, which measure CPU cores, run at the paper's frame size. ``--tiny`` makes every
part tiny: the CI test runs it so that the suite cannot rot (its figures mean nothing).

Parts, in order:

- ``decoders``: JPEG frames/s on one core of cv2.imdecode (the store's decoder), PIL, and simplejpeg and
  PyTurboJPEG when importable, each checked to decode to cv2's pixels; nvJPEG (torchvision, batched) on CUDA.
- ``loader_core``: clips/s on one core of our loader (store read + decode + fit, as a DataLoader worker does;
  then also with the augmentation on the CPU; and reading bytes only, for decoding on the GPU) against a
  re-implementation of the reference code's per-frame PIL pipeline (one JPEG file per frame, PIL decode, PIL
  transforms per frame), with the ratios.
- ``step``: the training step (the trainer's ``train_step``: device augmentation, query, key and for CoCLR sampler
  forward, loss, backward, Adam) of full S3D at 32x128x128 for InfoNCE and CoCLR: fp32, bf16, bf16 +
  channels_last_3d, + torch.compile (its compile time apart), batch 32-128; samples/s and peak memory; and the
  host synchronisations per step (CUDA's sync debug mode).
- ``dataloader``: the DataLoader alone over a store at the paper's frame size, 4-16 workers, frames decoded in
  the workers or read as bytes and decoded in the training process (nvJPEG on CUDA).
- ``epoch``: one InfoNCE and one CoCLR epoch through the real ``Trainer`` on a store of UCF101's size (9,537
  train videos) of synthetic videos: the steady rate with the loader included.
- ``features``: feature extraction for evaluation (sliding windows of the test split).
- ``flow``: frame pairs/s of our PyTorch TV-L1 at 128x171 (OpenCV's defaults); accuracy and the comparison with
  OpenCV are in benchmarks/bench_tvl1.py.
- ``quality``: bf16 against fp32 on the synthetic dataset: retrieval R@1 after a short run of each, beside the
  spread between two fp32 seeds (CUDA only: bf16 autocast is refused on the CPU).
- ``projection``: the wall time of the whole UCF101 study (flow, pretraining, retrieval features) from the rates
  measured here, labelled with the device they were measured on.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import io
import math
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torch.utils._python_dispatch

from coclr.config import load_config
from coclr.core.methods import METHODS
from coclr.data.augment import IMAGENET_MEAN, IMAGENET_STD, ClipAugment
from coclr.data.batch_decode import collate_clips, decode_batch, gpu_decoder_available
from coclr.data.datasets import TrainClips
from coclr.store.clipstore import create_store, write_entry
from coclr.store.jpeg import decode_jpeg, encode_jpeg
from coclr.train.config import PretrainConfig
from coclr.video.indexes import VideoEntry, VideoIndex
from frame_pool import frame_pool

PARTS = ("decoders", "loader_core", "step", "dataloader", "epoch", "features", "flow", "quality", "projection")
UCF101 = {"train": 9537, "test": 3783, "mean_frames": 186, "flow_pairs": 2.5e6}
"""UCF101 split 1: videos per split, mean frames per video at 25 fps (2.5 M frame pairs of flow in all)."""
STUDY = {"infonce_epochs": 300, "cycles": 2, "cycle_epochs": 100, "evaluated_encoders": 4}
"""The paper's schedule: InfoNCE 300 epochs per view, two CoCLR cycles of 100 epochs per view; retrieval features
of train and test for the 4 encoders of Table 1's unsupervised rows (InfoNCE and CoCLR, RGB and flow)."""
TOTAL_BUDGET_S = 450.0


@dataclass
class Sizes:
    """What one part measures with: the network and clips, and how much of each."""

    width: float
    length: int
    size: int
    frame: tuple[int, int]
    batches: tuple[int, ...]
    steps: int
    warmup: int
    train_videos: int
    test_videos: int
    entry_frames: int
    workers: tuple[int, ...]
    decode_frames: int
    core_clips: int
    flow_pairs: int
    quality_epochs: int


FLOW_SIZES = ((128, 171), (256, 340))
"""The frame sizes of the TV-L1 figures (height, width): the paper's UCF101 and Kinetics-400 sizes."""
QUICK_PARTS = ("flow", "step", "epoch")
"""``--quick``: the TV-L1 rates, the training step (samples/s, peak memory, host synchronisations) and an epoch
through the Trainer with its loader (samples/s, the share of time the GPU waited for data)."""

FULL = Sizes(width=1.0, length=32, size=128, frame=(128, 171), batches=(32, 64, 128), steps=10, warmup=3,
             train_videos=UCF101["train"], test_videos=UCF101["test"], entry_frames=36, workers=(4, 8, 16),
             decode_frames=256, core_clips=24, flow_pairs=128, quality_epochs=12)
TINY = Sizes(width=0.0625, length=8, size=32, frame=(36, 48), batches=(2, 4), steps=1, warmup=1, train_videos=8,
             test_videos=4, entry_frames=10, workers=(0, 2), decode_frames=16, core_clips=2, flow_pairs=1,
             quality_epochs=1)


@dataclass
class Row:
    part: str
    case: str
    value: float
    unit: str
    note: str = ""


@dataclass
class Suite:
    """The rows measured so far, what each part did, and the time left."""

    device: torch.device
    tmp: Path
    model: Sizes
    data: Sizes
    started: float = field(default_factory=time.perf_counter)
    rows: list[Row] = field(default_factory=list)
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    stores: dict[str, Path] = field(default_factory=dict)
    cache: dict[tuple, Any] = field(default_factory=dict)
    decodes: tuple[str | None, ...] = (None,)
    """The epoch part's ``data.decode`` values, run in this order for each method (None: the Trainer's default);
    ``("workers", "device", "device", "workers")`` compares the two interleaved."""
    report: Callable[[Suite], None] = lambda suite: None
    """Called after every row and part (writes the JSON file: a run cut short keeps every figure it measured)."""

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def add(self, part: str, case: str, value: float, unit: str, note: str = "") -> None:
        self.rows.append(Row(part, case, float(value), unit, note))
        print(f"  {case}: {value:,.2f} {unit}{f'  ({note})' if note else ''}", flush=True)
        self.report(self)

    def value(self, part: str, case_start: str) -> float | None:
        """The first value of ``part`` whose case starts with ``case_start`` (None when not measured)."""
        return next((r.value for r in self.rows if r.part == part and r.case.startswith(case_start)), None)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


class Budget:
    """A part's time budget: ``left()`` seconds, ``spent`` once it is over (the part then stops early)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    @property
    def spent(self) -> bool:
        return self.left() <= 0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


class one_core:
    """One intra-op thread for torch and OpenCV while measuring a figure per core; restored after."""

    def __enter__(self):
        self.saved = torch.get_num_threads(), cv2.getNumThreads()
        torch.set_num_threads(1)
        cv2.setNumThreads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved[0])
        cv2.setNumThreads(self.saved[1])


# ------------------------------------------------------------------------------------------- frames and stores

def flow_like(frames: list[np.ndarray]) -> list[np.ndarray]:
    """Stored-flow-like images (u, v around 128, third channel 128) from the brightness changes of a video."""
    gray = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY).astype(np.float32) for f in frames]
    out = []
    for a, b in zip(gray, gray[1:] + gray[-1:]):
        change = cv2.GaussianBlur(b - a, (0, 0), 3)
        u = np.clip(128 + 4 * change, 0, 255)
        v = np.clip(128 - 4 * cv2.GaussianBlur(change, (0, 0), 5), 0, 255)
        out.append(np.stack([u, v, np.full_like(u, 128)], axis=-1).astype(np.uint8))
    return out


def pool_store(root: Path, sizes: Sizes, views: tuple[str, ...] = ("rgb", "flow")) -> Path:
    """A store of ``train_videos`` + ``test_videos`` entries of ``entry_frames`` frames at the paper's frame
    size (flow one frame fewer), cycling through the encoded frames of a few videos: UCF101's number of videos
    without rendering or encoding each."""
    if root.exists():
        return root
    videos, _ = frame_pool(sizes.frame, sizes.entry_frames)
    encoded = {"rgb": [[encode_jpeg(f) for f in video] for video in videos],
               "flow": [[encode_jpeg(f) for f in flow_like(video)][:-1] for video in videos]}
    classes = 10
    total = sizes.train_videos + sizes.test_videos
    entries = [VideoEntry(f"c{i % classes}/v{i:05d}", i % classes, "train" if i < sizes.train_videos else "test",
                          f"g{i // 4:05d}") for i in range(total)]
    create_store(root, VideoIndex("suite", [f"class{c}" for c in range(classes)], entries), short_side=sizes.frame[0])
    jobs = [(entry.path, view, encoded[view][i % len(videos)]) for i, entry in enumerate(entries) for view in views]
    with ThreadPoolExecutor(16) as pool:  # each write ends with an fsync, which releases the GIL
        list(pool.map(lambda job: write_entry(root, *job, fps=25.0), jobs))
    return root


def sampler_checkpoint(path: Path, width: float) -> Path:
    """A flow encoder for CoCLR's frozen sampler (random weights: the speed does not depend on them)."""
    if not path.exists():
        from coclr.models.encoder import build_encoder
        from coclr.models.loading import save_encoder

        save_encoder(path, build_encoder(width=width), meta={"clip_settings": {"view": "flow"}})
    return path


def training_config(suite: Suite, store: Path, out: Path, *overrides: str) -> PretrainConfig:
    sizes = suite.model
    return load_config(PretrainConfig, None, [
        f"data.store={store}", f"run.out={out}", f"model.width={sizes.width}", f"data.length={sizes.length}",
        f"data.size={sizes.size}", "run.progress=false", "run.log_every=50", "method.queue_size=2048",
        f"run.device={suite.device.type}", *overrides])


def method_overrides(suite: Suite, method: str) -> list[str]:
    if not METHODS[method].needs_sampler(simultaneous=False):
        return [f"method.name={method}"]
    checkpoint = sampler_checkpoint(suite.tmp / f"sampler_{suite.model.width}.pth", suite.model.width)
    return ["method.name=coclr", f"method.sampler_checkpoint={checkpoint}", "method.group_positives=true"]


# ---------------------------------------------------------------------------------------------------- decoders

def part_decoders(suite: Suite, budget: Budget) -> None:
    videos, source = frame_pool(suite.data.frame, max(1, suite.data.decode_frames // 4))
    blobs = [encode_jpeg(f, 90) for video in videos for f in video][: suite.data.decode_frames]
    reference = [decode_jpeg(b) for b in blobs]
    print(f"  {len(blobs)} frames of {suite.data.frame[1]}x{suite.data.frame[0]}, JPEG quality 90, "
          f"{np.mean([len(b) for b in blobs]) / 1024:.1f} KiB each, from {source}")
    decoders: dict[str, Callable[[bytes], np.ndarray]] = {"cv2.imdecode": decode_jpeg}

    def pil(data: bytes) -> np.ndarray:
        from PIL import Image

        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    decoders["PIL"] = pil
    try:
        import simplejpeg

        decoders["simplejpeg"] = lambda data: simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ImportError:
        print("  simplejpeg: not installed")
    try:
        from turbojpeg import TJPF_RGB, TurboJPEG

        turbo = TurboJPEG()
        decoders["PyTurboJPEG"] = lambda data: turbo.decode(data, pixel_format=TJPF_RGB)
    except (ImportError, RuntimeError, OSError) as error:
        print(f"  PyTurboJPEG: not usable ({str(error).splitlines()[0] if str(error) else type(error).__name__})")
    rates = {}
    with one_core():
        for name, decode in decoders.items():
            decoded = [decode(b) for b in blobs]
            worst = max(int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()) for a, b in zip(reference, decoded))
            best = math.inf
            for _ in range(3):
                start = time.perf_counter()
                for b in blobs:
                    decode(b)
                best = min(best, time.perf_counter() - start)
            rates[name] = len(blobs) / best
            suite.add("decoders", f"{name}, 1 core", rates[name], "frames/s",
                      "cv2's pixels" if worst == 0 else f"differs from cv2 by up to {worst} levels")
    for name in rates:
        if name != "cv2.imdecode":
            suite.add("decoders", f"{name} / cv2.imdecode", rates[name] / rates["cv2.imdecode"], "x")
    if suite.cuda and gpu_decoder_available():
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_jpeg as nvjpeg

        tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        batch = (tensors * (4096 // len(tensors) + 1))[:4096]
        nvjpeg(batch[:64], mode=ImageReadMode.RGB, device=suite.device)  # initialisation
        synchronize(suite.device)
        start = time.perf_counter()
        calls = 0
        while calls < 3 or time.perf_counter() - start < 2:
            nvjpeg(batch, mode=ImageReadMode.RGB, device=suite.device)
            calls += 1
        synchronize(suite.device)
        rate = calls * len(batch) / (time.perf_counter() - start)
        images = nvjpeg(tensors, mode=ImageReadMode.RGB, device=suite.device)
        diff = [(img.permute(1, 2, 0).cpu().numpy().astype(np.int16) - ref).__abs__() for img, ref in
                zip(images, reference)]
        suite.add("decoders", f"nvJPEG (torchvision), batches of {len(batch)}", rate, "frames/s",
                  f"|diff| to cv2: mean {np.mean([d.mean() for d in diff]):.3f}, max {max(d.max() for d in diff)}")
        suite.add("decoders", "nvJPEG / cv2.imdecode on 1 core", rate / rates["cv2.imdecode"], "x")


# ------------------------------------------------------------------------------- the loader against the reference

@dataclass
class ReferenceClipParams:
    """One clip's random parameters, drawn once as the reference code's 'consistent' transforms do."""

    box: tuple[int, int, int, int]
    flip: bool
    jitter: tuple[float, float, float, float] | None
    order: list[int]
    gray_channel: int | None
    blur_sigma: float | None


def reference_params(rng: np.random.Generator, height: int, width: int) -> ReferenceClipParams:
    for _ in range(10):  # torchvision's RandomResizedCrop, area 0.2-1, ratio 3/4-4/3
        area = rng.uniform(0.2, 1.0) * height * width
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= width and 0 < h <= height:
            x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            break
    else:
        x, y, w, h = 0, 0, width, height
    jitter = None
    if rng.random() < 0.8:
        jitter = (rng.uniform(0.6, 1.4), rng.uniform(0.6, 1.4), rng.uniform(0.6, 1.4), rng.uniform(-0.1, 0.1))
    return ReferenceClipParams((x, y, w, h), bool(rng.random() < 0.5), jitter, list(rng.permutation(4)),
                               int(rng.integers(3)) if rng.random() < 0.2 else None,
                               rng.uniform(0.1, 2.0) if rng.random() < 0.5 else None)


def reference_frame(image, params: ReferenceClipParams, size: int) -> torch.Tensor:
    """The reference code's per-frame transforms on a PIL image, with the clip's parameters: crop and resize,
    flip, colour jitter (PIL ImageEnhance and an HSV hue shift, as torchvision's functional ops on PIL images),
    its per-frame channel 'grayscale', PIL Gaussian blur, to tensor, normalise."""
    from PIL import Image, ImageEnhance, ImageFilter

    x, y, w, h = params.box
    image = image.crop((x, y, x + w, y + h)).resize((size, size), Image.BILINEAR)
    if params.flip:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    if params.jitter is not None:
        for op in params.order:
            factor = params.jitter[op]
            if op == 0:
                image = ImageEnhance.Brightness(image).enhance(factor)
            elif op == 1:
                image = ImageEnhance.Contrast(image).enhance(factor)
            elif op == 2:
                image = ImageEnhance.Color(image).enhance(factor)
            else:
                hue, saturation, value = image.convert("HSV").split()
                shifted = (np.asarray(hue, dtype=np.uint8) + np.uint8(round(factor * 255) % 256)).astype(np.uint8)
                image = Image.merge("HSV", (Image.fromarray(shifted, "L"), saturation, value)).convert("RGB")
    if params.gray_channel is not None:
        channel = image.split()[params.gray_channel]
        image = Image.merge("RGB", (channel, channel, channel))
    if params.blur_sigma is not None:
        image = image.filter(ImageFilter.GaussianBlur(radius=params.blur_sigma))
    tensor = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return tensor.sub_(mean).div_(std)


def reference_clip(folder: Path, start: int, length: int, size: int, rng: np.random.Generator) -> torch.Tensor:
    """One training clip as the reference implementation loads it: one JPEG file per frame, PIL decoding,
    per-frame PIL transforms; ``float [3, T, size, size]``."""
    from PIL import Image

    frames = []
    params = None
    for index in range(start, start + length):
        with open(folder / f"image_{index + 1:05d}.jpg", "rb") as file:
            image = Image.open(file).convert("RGB")
        if params is None:
            params = reference_params(rng, image.height, image.width)
        frames.append(reference_frame(image, params, size))
    return torch.stack(frames, dim=1)


def part_loader_core(suite: Suite, budget: Budget) -> None:
    sizes = suite.data
    length, clips = 32, sizes.core_clips
    videos, source = frame_pool(sizes.frame, 64)
    store = suite.tmp / "core_store"
    encoded = [[encode_jpeg(f) for f in video] for video in videos]
    entries = [VideoEntry(f"c0/v{i:03d}", 0, "train") for i in range(16)]
    create_store(store, VideoIndex("core", ["c0"], entries))
    frame_folders = suite.tmp / "core_frames"
    for i, entry in enumerate(entries):
        write_entry(store, entry.path, "rgb", encoded[i % len(encoded)], fps=25.0)
        folder = frame_folders / entry.path
        folder.mkdir(parents=True)
        for index, blob in enumerate(encoded[i % len(encoded)]):
            (folder / f"image_{index + 1:05d}.jpg").write_bytes(blob)
    print(f"  32-frame clips of {sizes.frame[1]}x{sizes.frame[0]} from {source}; one thread")
    dataset = TrainClips(store, "train", ["rgb"], length=length, seed=0)
    raw = TrainClips(store, "train", ["rgb"], length=length, seed=0, encoded=True)
    augment = ClipAugment(size=128)
    generator = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    counts = {name: 0 for name in ("ours", "ours_aug", "bytes", "reference")}
    seconds = dict.fromkeys(counts, 0.0)
    rounds = 0
    with one_core():
        while rounds < 1 or (rounds < 50 and counts["reference"] < clips and not budget.spent):
            item = (rounds, rounds % len(dataset))
            start = time.perf_counter()
            sample = dataset[item]
            seconds["ours"] += time.perf_counter() - start
            counts["ours"] += 2
            start = time.perf_counter()
            augment({"rgb": dataset[item]["rgb"]}, generator)
            seconds["ours_aug"] += time.perf_counter() - start
            counts["ours_aug"] += 2
            start = time.perf_counter()
            raw[item]
            seconds["bytes"] += time.perf_counter() - start
            counts["bytes"] += 2
            folder = frame_folders / entries[rounds % len(entries)].path
            for _ in range(2):
                first = int(rng.integers(0, 64 - length + 1))
                start = time.perf_counter()
                reference_clip(folder, first, length, 128, rng)
                seconds["reference"] += time.perf_counter() - start
                counts["reference"] += 1
            rounds += 1
            del sample
    rate = {name: counts[name] / seconds[name] for name in counts}
    suite.add("loader_core", "reference: frame files + PIL decode + per-frame PIL transforms", rate["reference"],
              "clips/s per core")
    suite.add("loader_core", "ours: store read + decode + fit (augmentation on the GPU)", rate["ours"],
              "clips/s per core")
    suite.add("loader_core", "ours + ClipAugment on the CPU", rate["ours_aug"], "clips/s per core")
    suite.add("loader_core", "ours, workers read bytes (decoding on the GPU)", rate["bytes"], "clips/s per core")
    suite.add("loader_core", "ours / reference", rate["ours"] / rate["reference"], "x", "the goal is 3x")
    suite.add("loader_core", "ours + CPU augmentation / reference", rate["ours_aug"] / rate["reference"], "x")


# ------------------------------------------------------------------------------------------------------- step

@dataclass(frozen=True)
class StepCase:
    method: str
    batch: int
    amp: str
    channels_last: bool
    compile: bool = False

    @property
    def name(self) -> str:
        precision = self.amp if self.amp != "none" else "fp32"
        return (f"{self.method} {precision}{' + channels_last' if self.channels_last else ''}"
                f"{' + compile' if self.compile else ''}, batch {self.batch}")


def step_cases(suite: Suite) -> list[StepCase]:
    if not suite.cuda:
        return [StepCase("infonce", suite.model.batches[0], "none", False),
                StepCase("coclr", suite.model.batches[0], "none", False)]
    small, *larger = suite.model.batches
    cases = [StepCase("infonce", small, "none", False), StepCase("infonce", small, "bf16", False)]
    cases += [StepCase("infonce", b, "bf16", True) for b in suite.model.batches]
    cases += [StepCase("coclr", small, "none", False), StepCase("coclr", small, "bf16", True)]
    cases += [StepCase("coclr", larger[0], "bf16", True)] if larger else []
    cases += [StepCase("infonce", larger[0] if larger else small, "bf16", True, compile=True)]
    return cases


def one_batch(suite: Suite, views: list[str], batch_size: int) -> dict[str, torch.Tensor]:
    """The first ``batch_size`` samples of the step store (read once per views, at the largest batch)."""
    key = ("batch", *views)
    if key not in suite.cache:
        dataset = TrainClips(suite.stores["step"], "train", views, suite.model.length, seed=0)
        suite.cache[key] = torch.utils.data.default_collate([dataset[i] for i in range(max(suite.model.batches))])
    # Whole tensors in pinned memory on CUDA, as the Trainer's DataLoader hands them over (pin_memory): a pageable
    # batch would make each step wait for a staged copy the training loop does not make.
    batch = {name: value[:batch_size] for name, value in suite.cache[key].items()}
    return {name: value.pin_memory() for name, value in batch.items()} if suite.cuda else batch


def part_step(suite: Suite, budget: Budget) -> None:
    from coclr.train.setup import torch_settings

    with torch_settings(False, suite.device):  # cuDNN's autotuner, as in Trainer.run
        step_all(suite, budget)


def step_all(suite: Suite, budget: Budget) -> None:
    from coclr.train.run import start_run

    for case in step_cases(suite):
        if budget.spent:
            suite.parts["step"].setdefault("skipped", []).append(case.name)
            continue
        release_memory(suite.device)
        config = training_config(suite, suite.stores["step"], suite.tmp / "step_run",
                                 *method_overrides(suite, case.method),
                                 f"run.batch_size={case.batch}", f"run.amp={case.amp}",
                                 f"run.channels_last={str(case.channels_last).lower()}",
                                 f"run.compile={str(case.compile).lower()}", "data.decode=workers",
                                 "method.wait_for_full_queue=false")
        shutil.rmtree(config.run.out, ignore_errors=True)
        with start_run(config) as trainer:
            trainer._set_train_mode()
            batch = one_batch(suite, config.views, case.batch)
            start = time.perf_counter()
            trainer.train_step(batch, queue_full=True)
            synchronize(suite.device)
            first = time.perf_counter() - start
            for _ in range(suite.model.warmup - 1):
                trainer.train_step(batch, queue_full=True)
            synchronize(suite.device)
            start = time.perf_counter()
            for _ in range(suite.model.steps):
                trainer.train_step(batch, queue_full=True)
            synchronize(suite.device)
            per_step = (time.perf_counter() - start) / suite.model.steps
            note = f"peak {peak_gib(suite.device):.1f} GiB" if suite.cuda else ""
            if case.compile:
                note += f", compile + first step {first:.0f} s"
            suite.add("step", case.name, case.batch / per_step, "samples/s", note.strip(", "))
            if not suite.cuda or (case.amp == "bf16" and case.channels_last and not case.compile
                                  and case.batch == suite.model.batches[0]):
                count_syncs(suite, trainer, batch, case)
            del trainer, batch
    release_memory(suite.device)


class ReadBacks(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ops that read a value back to the host (``item``, ``bool``, ...) or size their output by the
    data: the ops that would wait for a GPU."""

    OPS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.OPS
        return func(*args, **(kwargs or {}))


def count_syncs(suite: Suite, trainer, batch: dict[str, torch.Tensor], case: StepCase) -> None:
    """Host synchronisations per training step: CUDA's sync debug mode warns at every one. On the CPU, the ops
    that would read back (those on CPU-drawn augmentation parameters included, which stay on the CPU in a GPU
    run too): tests/test_train_speed.py checks where each comes from."""
    steps = max(1, suite.model.steps // 2)
    if not suite.cuda:
        with ReadBacks() as reads:
            for _ in range(steps):
                trainer.train_step(batch, queue_full=True)
        suite.add("step", f"read-back ops per step, {case.method}", reads.count / steps, "ops/step",
                  "CPU proxy: CPU-side parameter draws included")
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                trainer.train_step(batch, queue_full=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]  # not the mode's own warning
    where = sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs})
    suite.add("step", f"host synchronisations per step, {case.method}", len(syncs) / steps, "syncs/step",
              "CUDA sync debug mode; " + (", ".join(where[:6]) or "none"))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            trainer.train_step(batch, queue_full=True)
        synchronize(suite.device)  # one cudaDeviceSynchronize, not counted
    blocking = {event.key: event.count for event in profiler.key_averages()
                if event.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                                 "cudaMemcpy")}
    blocking["cudaDeviceSynchronize"] = blocking.get("cudaDeviceSynchronize", 1) - 1
    suite.add("step", f"blocking CUDA calls per step in the profiler, {case.method}",
              sum(blocking.values()) / steps, "calls/step",
              ", ".join(f"{k} {v}" for k, v in blocking.items() if v) or "none")


# ---------------------------------------------------------------------------------------------------- dataloader

def part_dataloader(suite: Suite, budget: Budget) -> None:
    from torch.utils.data import DataLoader

    sizes = suite.model
    batch_size = sizes.batches[0]
    cpus = os.cpu_count() or 1
    cases = [(w, "workers", ["rgb"]) for w in sizes.workers if w <= cpus]
    cases += [(max(w for w in sizes.workers if w <= cpus), "device", ["rgb"])]
    cases += [(max(w for w in sizes.workers if w <= cpus), mode, ["rgb", "flow"]) for mode in ("workers", "device")]
    print(f"  batches of {batch_size} two-clip samples of {sizes.length} frames at {sizes.frame[1]}x{sizes.frame[0]}, "
          f"{cpus} CPUs")
    for workers, decode, views in cases:
        where = "workers" if decode == "workers" else "training process"
        name = f"{'+'.join(views)}, {workers} workers, decoded in the {where}"
        if budget.spent:
            suite.parts["dataloader"].setdefault("skipped", []).append(name)
            continue
        key = ("dataset", *views, decode)
        if key not in suite.cache:
            suite.cache[key] = TrainClips(suite.stores["main"], "train", views, sizes.length, seed=0,
                                          encoded=decode == "device")
        dataset = suite.cache[key]
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                            collate_fn=collate_clips, pin_memory=suite.cuda, drop_last=True,
                            persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
        iterator = iter(loader)
        decode_batch(next(iterator), suite.device)  # workers started
        seconds_cap = min(max(3.0, budget.left() / 4), 15.0)
        start = time.perf_counter()
        batches = 0
        for batch in iterator:
            decoded = decode_batch(batch, suite.device)
            for view in views:
                decoded[view].to(suite.device, non_blocking=True)
            batches += 1
            if time.perf_counter() - start > seconds_cap or batches >= len(loader) - 2:
                break
        synchronize(suite.device)
        rate = batches * batch_size / (time.perf_counter() - start)
        suite.add("dataloader", name, rate, "samples/s")
        del iterator, loader


# ------------------------------------------------------------------------------------------------------ epoch

class StepClock:
    """When each step's work began and ended on the device: CUDA events on a GPU (timestamped when the GPU reaches
    them, so the gap between one step's end and the next one's start is time the GPU had nothing to do), the host's
    clock on the CPU. Reading them waits for the device: once, after the run."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[Any, Any]] = []

    def now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def waiting_share(self, first: int) -> float:
        """The share of the time from step ``first``'s start to the last step's end the device spent waiting between
        steps (for the loader, or for the host)."""
        marks = self.marks[first:]
        if len(marks) < 2:
            return math.nan
        if self.cuda:
            gaps = sum(end.elapsed_time(start) for (_, end), (start, _) in zip(marks, marks[1:]))
            return gaps / marks[0][0].elapsed_time(marks[-1][1])
        gaps = sum(start - end for (_, end), (start, _) in zip(marks, marks[1:]))
        return gaps / (marks[-1][1] - marks[0][0])


def timed_run(suite: Suite, config: PretrainConfig, budget_s: float) -> dict[str, float]:
    """Train one epoch through the Trainer (loader included); the steady rate and the share of the time the device
    waited between steps are measured from the end of the warm-up steps; the run stops early (``run.max_steps``)
    once ``budget_s`` is spent after the warm-up (whose first step, in a fresh process, holds cuDNN's autotuning:
    tens of seconds for full S3D; the part's hard time limit still bounds it)."""
    from coclr.train.run import start_run

    with start_run(config) as trainer:
        step = trainer.train_step
        marks: list[float] = []
        clock = StepClock(suite.device)
        warmup = max(1, suite.model.warmup)
        start = time.perf_counter()

        def spent() -> bool:
            return len(marks) >= warmup and time.perf_counter() - marks[warmup - 1] > budget_s

        def timed_step(batch, queue_full):
            began = clock.now()
            out = step(batch, queue_full)
            clock.marks.append((began, clock.now()))
            last = len(marks) + 1 == trainer.data_order.batches_per_epoch or spent()
            if len(marks) == warmup - 1 or last:  # the GPU has finished the steps timed
                synchronize(suite.device)
            marks.append(time.perf_counter())
            if last:  # stop after this step
                trainer.config.run.max_steps = trainer.position.global_step + 1
            return out

        trainer.train_step = timed_step
        trainer.run()
        synchronize(suite.device)
        end = time.perf_counter()
        steps = len(marks)
        steady = ((steps - warmup) * config.run.batch_size / (marks[-1] - marks[warmup - 1]) if steps > warmup
                  else math.nan)
        return {"steps": steps, "of": trainer.data_order.batches_per_epoch, "steady": steady, "wall": end - start,
                "waiting": clock.waiting_share(warmup), "peak_gib": peak_gib(suite.device), "decode": trainer.decode,
                "amp": trainer.config.run.amp, "channels_last": trainer.config.run.channels_last}


def part_epoch(suite: Suite, budget: Budget) -> None:
    sizes = suite.model
    batch = sizes.batches[1] if suite.cuda and len(sizes.batches) > 1 else sizes.batches[0]
    workers = max(w for w in sizes.workers if w <= (os.cpu_count() or 1)) if suite.cuda else 0
    runs = [(method, decode) for method in ("infonce", "coclr") for decode in suite.decodes]
    for done, (method, decode) in enumerate(runs):
        out = suite.tmp / f"epoch_{method}"
        shutil.rmtree(out, ignore_errors=True)
        release_memory(suite.device)
        config = training_config(suite, suite.stores["main"], out, *method_overrides(suite, method), "optim.epochs=1",
                                 f"run.batch_size={batch}", f"data.workers={workers}",
                                 *([f"data.decode={decode}"] if decode else []),
                                 "method.wait_for_full_queue=false")  # every step a full one
        result = timed_run(suite, config, budget.left() / (len(runs) - done) - 5)
        note = (f"{result['steps']} of {result['of']} steps, decode {result['decode']}, amp {result['amp']}, "
                f"channels_last {result['channels_last']}, {workers} workers; wall {result['wall']:.0f} s with "
                "start-up")
        suite.add("epoch", f"{method} epoch through the Trainer, batch {batch}, decode {result['decode']}",
                  result["steady"], "samples/s",
                  f"{note}; peak {result['peak_gib']:.2f} GiB")
        suite.add("epoch", f"{method} epoch, decode {result['decode']}, share of the time the "
                           f"{suite.device.type.upper()} waited between steps",
                  100 * result["waiting"], "%", "between the end of a step's work and the start of the next one's")


# ---------------------------------------------------------------------------------------------------- features

def part_features(suite: Suite, budget: Budget) -> None:
    from coclr.eval.features import ClipConfig, extract_features
    from coclr.models.s3d import S3D

    sizes = suite.model
    workers = max(w for w in sizes.workers if w <= (os.cpu_count() or 1))
    backbone = S3D(width=sizes.width).to(suite.device)
    if suite.cuda:
        backbone = backbone.to(memory_format=torch.channels_last_3d)
    for amp in ((False, True) if suite.cuda else (False,)):
        config = ClipConfig(length=sizes.length, size=sizes.size, batch_size=max(sizes.batches), workers=workers,
                            amp=amp)
        from coclr.data.datasets import WindowClips

        windows = len(WindowClips(suite.stores["main"], "test", "rgb", sizes.length))
        synchronize(suite.device)
        start = time.perf_counter()
        extract_features(backbone, suite.stores["main"], "rgb", "test", config, suite.device, progress=False)
        synchronize(suite.device)
        rate = windows / (time.perf_counter() - start)
        suite.add("features", f"retrieval features, test split, {'fp16 autocast' if amp else 'fp32'}", rate,
                  "clips/s", f"{windows} windows, batch {config.batch_size}, {workers} workers")
    del backbone
    release_memory(suite.device)


# -------------------------------------------------------------------------------------------------------- flow

def part_flow(suite: Suite, budget: Budget) -> None:
    """Our TV-L1's frame pairs/s on the device; when benchmarks/bench_tvl1.py offers ``suite_rows(device, tiny)``
    (rows of ``(case, value, unit, note)``), its figures are added."""
    from coclr.flow.tvl1 import tvl1_flow

    try:  # benchmarks/ is on the path: the script's own folder, or pytest's pythonpath
        import bench_tvl1 as bench
    except Exception as error:  # it needs ../shared/data; a broken import must not stop the suite
        print(f"  benchmarks/bench_tvl1.py not importable here ({type(error).__name__}: {error})")
        bench = None
    if bench is not None and hasattr(bench, "suite_rows"):
        for case, value, unit, note in bench.suite_rows(suite.device, suite.model is TINY):
            suite.add("flow", case, value, unit, note)

    source = "synthetic frames (coclr.synth)"
    for frame in FLOW_SIZES if suite.model is not TINY else (suite.model.frame,):
        videos, source = frame_pool(frame, 2 if not suite.cuda else 17)
        gray = np.stack([cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in videos[0]])
        pairs = suite.model.flow_pairs
        index = np.arange(pairs) % (len(gray) - 1)
        prev = torch.from_numpy(gray[index]).to(suite.device)
        next_ = torch.from_numpy(gray[index + 1]).to(suite.device)
        for mode in ("fast", "exact"):
            if budget.spent:
                suite.parts["flow"].setdefault("skipped", []).append(f"{frame[1]}x{frame[0]} {mode}")
                continue
            # warm-up on the timed shape: Triton's compile and the allocator's growth stay out of the timing
            tvl1_flow(prev, next_, mode=mode)
            synchronize(suite.device)
            start = time.perf_counter()
            tvl1_flow(prev, next_, mode=mode)
            synchronize(suite.device)
            rate = pairs / (time.perf_counter() - start)
            suite.add("flow", f"our TV-L1 {mode}, {frame[1]}x{frame[0]}, batch of {pairs} pairs", rate, "pairs/s",
                      f"OpenCV's defaults, {source}; peak {peak_gib(suite.device):.2f} GiB; accuracy and OpenCV: "
                      "benchmarks/bench_tvl1.py")


# ----------------------------------------------------------------------------------------------------- quality

def part_quality(suite: Suite, budget: Budget) -> None:
    """bf16 against fp32 on the synthetic dataset: InfoNCE on RGB for a few epochs, then kNN R@1."""
    from coclr.eval.monitor import knn_recall
    from coclr.synth import SynthConfig, generate_synthetic
    from coclr.train.run import start_run

    store = suite.tmp / "synth"
    synth = SynthConfig(height=64, width=64, frames=16, train_scenes=48, test_scenes=16, actor_cue=0.5)
    generate_synthetic(store, synth)  # one worker per core
    results = {}
    for name, amp, seed in (("fp32, seed 0", "none", 0), ("bf16, seed 0", "bf16", 0), ("fp32, seed 1", "none", 1)):
        out = suite.tmp / f"quality_{amp}_{seed}"
        config = load_config(PretrainConfig, None, [
            f"data.store={store}", f"run.out={out}", "model.width=1.0", "data.length=8", "data.size=64",
            "data.workers=4", "method.queue_size=1024", f"optim.epochs={suite.model.quality_epochs}",
            "run.batch_size=32", f"run.amp={amp}", f"run.seed={seed}", "run.progress=false"])
        with start_run(config) as trainer:
            trainer.run()
            recall = knn_recall(trainer.model.learners["rgb"].encoder_q.backbone, str(store), "rgb", length=8, stride=1,
                                size=64, device=suite.device)
            results[name] = recall["knn_R@1"]
            suite.add("quality", f"R@1 after {suite.model.quality_epochs} InfoNCE epochs, {name}", results[name], "%")
            del trainer
            release_memory(suite.device)
    gap = abs(results["bf16, seed 0"] - results["fp32, seed 0"])
    spread = abs(results["fp32, seed 1"] - results["fp32, seed 0"])
    suite.add("quality", "|bf16 - fp32| beside |fp32 seed 1 - seed 0|", gap, "R@1 points",
              f"seed spread {spread:.1f} points: {'within' if gap <= max(spread, 2.0) else 'outside'} the noise")


# -------------------------------------------------------------------------------------------------- projection

def part_projection(suite: Suite, budget: Budget) -> None:
    """Hours of the whole study from the measured rates (the epoch rates, else the step rates)."""
    infonce = suite.value("epoch", "infonce") or suite.value("step", "infonce bf16 + channels_last")
    coclr = suite.value("epoch", "coclr") or suite.value("step", "coclr bf16 + channels_last")
    if not suite.cuda:
        infonce = infonce or suite.value("step", "infonce")
        coclr = coclr or suite.value("step", "coclr")
    flow = suite.value("flow", "our TV-L1")
    features = max((r.value for r in suite.rows if r.part == "features"), default=None)
    if None in (infonce, coclr, flow, features):
        suite.parts["projection"]["status"] = "skipped: a rate it needs was not measured"
        return
    videos = UCF101["train"] + UCF101["test"]
    windows = videos * ((UCF101["mean_frames"] - 32) // 16 + 2)
    hours = {
        "flow (TV-L1, 2.5 M frame pairs)": UCF101["flow_pairs"] / flow / 3600,
        "InfoNCE, 300 epochs x 2 views": 2 * STUDY["infonce_epochs"] * UCF101["train"] / infonce / 3600,
        "CoCLR, 2 cycles x 2 views x 100 epochs": (STUDY["cycles"] * 2 * STUDY["cycle_epochs"] * UCF101["train"]
                                                   / coclr / 3600),
        "retrieval features, 4 encoders": STUDY["evaluated_encoders"] * windows / features / 3600,
    }
    device = torch.cuda.get_device_name(suite.device) if suite.cuda else "CPU"
    label = f"projection from rates measured here on {device}{'' if suite.cuda else ' (tiny sizes: meaningless)'}"
    for name, value in hours.items():
        suite.add("projection", name, value, "h", label)
    suite.add("projection", "the whole UCF101 study", sum(hours.values()), "h", label)


# ----------------------------------------------------------------------------------------------------- running

BUDGETS = {"decoders": 15, "loader_core": 20, "step": 160, "dataloader": 45, "epoch": 70, "features": 25,
           "flow": 60, "quality": 80, "projection": 1}
"""Seconds per part on a GPU machine (the store of UCF101's size takes about half a minute more). A part stops
starting new cases once its budget is spent; :func:`time_limit` stops one that overruns it."""


class PartTimeLimit(Exception):
    """A part ran past its hard time limit (its budget and a grace); the figures it measured are kept."""


def hard_limit(budget_s: float) -> float:
    """A part's hard time limit: its budget, then as much again and a minute for the case it was in."""
    return 2 * budget_s + 60


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`PartTimeLimit` in the main thread once ``seconds`` have passed (SIGALRM; the Python code of a
    long call, such as torch.compile's, is interrupted too). No limit off the main thread or without SIGALRM."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise PartTimeLimit(f"stopped at its time limit of {seconds:.0f} s; the figures measured before are kept")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
PART_FUNCTIONS = {"decoders": part_decoders, "loader_core": part_loader_core, "step": part_step,
                  "dataloader": part_dataloader, "epoch": part_epoch, "features": part_features, "flow": part_flow,
                  "quality": part_quality, "projection": part_projection}
NEEDS_STORE = {"step", "dataloader", "epoch", "features"}


def run_suite(parts: list[str], tiny: bool, tmp: Path, device: torch.device,
              report: Callable[[Suite], None] = lambda suite: None,
              decodes: tuple[str | None, ...] = (None,)) -> Suite:
    """Run ``parts`` in order; ``report(suite)`` after each row and part, so that a run cut short keeps its
    figures."""
    model = TINY if tiny or device.type != "cuda" else FULL
    suite = Suite(device, tmp, model, TINY if tiny else FULL, decodes=decodes, report=report)
    for name in parts:
        suite.parts[name] = {"status": "pending"}
        if name == "quality" and not suite.cuda:
            suite.parts[name]["status"] = "skipped: bf16 autocast is for CUDA devices; not measured on the CPU"
            continue
        if suite.elapsed() > TOTAL_BUDGET_S and name != "projection":
            suite.parts[name]["status"] = "skipped: the suite's time budget is spent"
            continue
        print(f"== {name} ==", flush=True)
        start = time.perf_counter()
        try:
            if name in NEEDS_STORE and "main" not in suite.stores:
                suite.stores["main"] = pool_store(tmp / "store", model)
                step_videos = dataclasses.replace(model, train_videos=2 * max(model.batches), test_videos=0)
                suite.stores["step"] = pool_store(tmp / "step_store", step_videos)
                suite.parts[name]["store_seconds"] = round(time.perf_counter() - start, 1)
            budget_s = (BUDGETS[name] if suite.cuda else 60) * (len(suite.decodes) if name == "epoch" else 1)
            with time_limit(hard_limit(budget_s)):
                PART_FUNCTIONS[name](suite, Budget(budget_s))
            if suite.parts[name]["status"] == "pending":
                suite.parts[name]["status"] = "done"
        except PartTimeLimit as error:
            suite.parts[name]["status"] = str(error)
        except Exception as error:  # one failing part does not lose the others' figures
            traceback.print_exc()
            suite.parts[name]["status"] = f"error: {type(error).__name__}: {error}"
        suite.parts[name]["seconds"] = round(time.perf_counter() - start, 1)
        report(suite)
    return suite


def print_table(suite: Suite) -> None:
    print()
    print("| part | case | value | unit | note |")
    print("|---|---|---|---|---|")
    for row in suite.rows:
        print(f"| {row.part} | {row.case} | {row.value:,.2f} | {row.unit} | {row.note} |")
    for name, part in suite.parts.items():
        if part["status"] != "done" or part.get("skipped"):
            print(f"{name}: {part['status']}" + (f"; not run (budget): {', '.join(part['skipped'])}"
                                                 if part.get("skipped") else ""))
    print(f"total {suite.elapsed():.0f} s")


def environment(device: torch.device) -> dict[str, Any]:
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "device_type": device.type, "torch": torch.__version__, "python": platform.python_version(),
            "opencv": cv2.__version__, "cpus": os.cpu_count(), "gpu_jpeg_decoder": gpu_decoder_available()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", "--out", type=Path, default=Path("gpu_suite.json"),
                        help="where to write the results (rewritten after every figure)")
    parser.add_argument("--quick", action="store_true", help=f"only the parts {','.join(QUICK_PARTS)}")
    parser.add_argument("--tiny", action="store_true", help="every part tiny (the CI test; figures meaningless)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto (cuda when available), cpu or cuda")
    parser.add_argument("--decode", default="",
                        help="comma-separated data.decode values (workers, device) the epoch part runs in this order "
                             "for each method, e.g. workers,device,device,workers (default: the Trainer's choice)")
    args = parser.parse_args(argv)
    parts = list(QUICK_PARTS) if args.quick else [p for p in args.parts.split(",") if p]
    decodes = tuple(d for d in args.decode.split(",") if d) or (None,)
    if any(d not in ("workers", "device", None) for d in decodes):
        parser.error(f"--decode takes workers and device, got {args.decode!r}")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine's torch sees no CUDA device (--device auto runs on the CPU)")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    env = environment(device)
    print(f"gpu_suite on {env['device']} ({device}), torch {env['torch']}, {env['cpus']} CPUs, "
          f"{'tiny' if args.tiny else 'full' if device.type == 'cuda' else 'CPU (model parts tiny)'}", flush=True)
    from coclr.atomic import atomic_write_json

    def report(suite: Suite) -> None:
        atomic_write_json(args.json, {"environment": env, "tiny": args.tiny, "seconds": round(suite.elapsed(), 1),
                                      "parts": suite.parts, "rows": [row.__dict__ for row in suite.rows]})

    with tempfile.TemporaryDirectory(prefix="coclr_gpu_suite_") as tmp:
        suite = run_suite(parts, args.tiny, Path(tmp), device, report, decodes)
    print_table(suite)
    report(suite)
    print(f"wrote {args.json}")
    return 1 if any(p["status"].startswith("error") for p in suite.parts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
