"""The synthetic dataset written out: as a clip store (resumable, parallel) or as MP4 files with their labels apart."""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coclr.atomic import atomic_write_text
from coclr.config import to_dict, validate
from coclr.errors import ConfigError
from coclr.flow.backends import is_flow_view
from coclr.runfolder import FolderRule, claim_folder
from coclr.store.clipstore import create_store, write_entry
from coclr.store.jobs import JobSummary, run_entry_jobs, writing_view
from coclr.store.jpeg import encode_jpeg
from coclr.synth.config import SynthConfig, dataset_clips
from coclr.synth.render import render_clip
from coclr.threads import check_workers
from coclr.video.decode import write_mp4
from coclr.video.indexes import VideoEntry, VideoIndex

# ------------------------------------------------------------------------------------------------ outputs


def synthetic_index(config: SynthConfig) -> VideoIndex:
    """The :class:`~coclr.video.indexes.VideoIndex` of the dataset (entry paths are the clip keys)."""
    entries = [VideoEntry(c.key, c.label, c.split, c.group) for c in dataset_clips(config)]
    return VideoIndex("synth", config.classes, entries)


@dataclass(frozen=True)
class SynthClipJob:
    """Store job of the "rgb" view: render a clip and encode its frames as JPEG (picklable)."""

    config: SynthConfig

    def __call__(self, key: str) -> tuple[list[bytes], float]:
        frames = render_clip(self.config, key)
        return [encode_jpeg(frame, self.config.jpeg_quality) for frame in frames], self.config.fps


@dataclass
class SynthSummary:
    """What :func:`generate_synthetic` did: the dataset's size and the store job's summary."""

    out: str
    config: SynthConfig
    train: int
    test: int
    job: JobSummary

    @property
    def ok(self) -> bool:
        return not self.job.failed

    def __str__(self) -> str:
        c = self.config
        return (f"synthetic dataset in {self.out}: {c.num_classes} motion classes, {self.train} train clips "
                f"({c.train_scenes} scenes), {self.test} test clips ({c.test_scenes} scenes), {c.frames} frames "
                f"of {c.width}x{c.height}, seed {c.seed}\n{self.job}")


def generate_synthetic(out: str | Path, config: SynthConfig, workers: int | None = None) -> SynthSummary:
    """Write the dataset as a clip store at ``out`` (index + "rgb" view), in parallel and resumably.

    The generator's options are recorded in the store metadata, so resuming into ``out`` with other options
    fails with a clear error naming each of them (:func:`~coclr.store.clipstore.create_store`) instead of mixing two
    datasets; another job writing the store's frames is refused before anything is written. ``workers``:
    processes (None: one per core; 0: in this process).
    """
    validate(config)
    check_workers(workers, "workers")
    index = synthetic_index(config)
    keys = [entry.path for entry in index.entries]
    with writing_view(out, "rgb", index, command="data synth", generator="coclr.synth",
                      synth=recorded_options(config)):
        job = run_entry_jobs(out, "rgb", keys, SynthClipJob(config), workers, desc="rendering synthetic clips")
    counts = index.split_counts()
    return SynthSummary(str(out), config, counts.get("train", 0), counts.get("test", 0), job)


def recorded_options(config: SynthConfig) -> dict[str, Any]:
    """The options written to a store's metadata. ``motions`` is left out while empty: stores generated
    before that option existed do not record it, and they still resume."""
    options = to_dict(config)
    if not options["motions"]:
        del options["motions"]
    return options


VIDEOS_FOLDER = "videos"
LABELS_FILE = "labels.csv"
SYNTH_VIDEOS_FOLDER = FolderRule("data synth --videos", "the videos of a synthetic dataset")
"""A folder of the dataset's videos records the generator's options: the same ones continue, others are refused."""


def video_name(config: SynthConfig, key: str) -> str:
    """The file name of a clip's video: a hash of the seed and the clip's key, so that neither the name nor the
    names' order tells the class, the scene or the split (a person or a program learning from the folder sees
    videos, nothing else)."""
    return hashlib.sha256(f"{config.seed}:{key}".encode()).hexdigest()[:12] + ".mp4"


def write_videos(out_dir: str | Path, config: SynthConfig, codec: str = "libx264") -> Path:
    """Write every clip as an MP4 file ``out_dir/videos/<name>.mp4`` (:func:`video_name`) and the labels apart,
    in ``out_dir/labels.csv``: the ``--format csv`` manifest (``path,label,split,group``; paths relative to
    ``out_dir``, labels as class names) for :func:`~coclr.video.indexes.csv_index`, so that learning from the
    folder can be scored against labels it never saw. H.264 needs even sizes, and lossy coding means decoded
    frames are close to, not equal to, the store's. Returns the manifest path; complete files are kept
    (resumable: each video is written to a temporary name, then renamed)."""
    validate(config)
    if config.height % 2 or config.width % 2:
        raise ConfigError(f"height/width: MP4 (H.264) output needs even sizes, got {config.width}x{config.height}")
    out_dir = Path(out_dir)
    with claim_folder(out_dir, SYNTH_VIDEOS_FOLDER, recorded_options(config)):
        return _write_videos(out_dir, config, codec)


def _write_videos(out_dir: Path, config: SynthConfig, codec: str) -> Path:
    videos = out_dir / VIDEOS_FOLDER
    videos.mkdir(parents=True, exist_ok=True)
    rows = []
    for clip in dataset_clips(config):
        name = video_name(config, clip.key)
        path = videos / name
        if not path.is_file():
            temp = path.with_name(f".{name}.partial")
            try:
                write_mp4(temp, render_clip(config, clip.key), config.fps, codec)
                temp.replace(path)
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
        rows.append([f"{VIDEOS_FOLDER}/{name}", config.classes[clip.label], clip.split, clip.group])
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["path", "label", "split", "group"])
    writer.writerows(sorted(rows))
    manifest = out_dir / LABELS_FILE
    atomic_write_text(manifest, text.getvalue())
    return manifest


def random_store(root: str | Path, videos: int = 12, frames: int = 12, size: tuple[int, int] = (36, 40),
                 classes: int = 3, views: tuple[str, ...] = ("rgb", "flow"), test_videos: int = 0,
                 seed: int = 0) -> Path:
    """A clip store of random frames (flow views get one frame fewer): ``videos`` train and ``test_videos`` test
    entries in ``classes`` classes, two per source group, for testing and timing the mechanics of training and
    evaluation (nothing in it can be learned)."""
    rng = np.random.default_rng(seed)
    entries = [VideoEntry(f"c{i % classes}/v{i:03d}", i % classes, "train" if i < videos else "test",
                          f"g{i // 2:03d}") for i in range(videos + test_videos)]
    create_store(root, VideoIndex("random", [f"class{c}" for c in range(classes)], entries))
    for entry in entries:
        for view in views:
            count = frames - 1 if is_flow_view(view) else frames
            pixels = rng.integers(0, 256, (count, *size, 3), dtype=np.uint8)
            write_entry(root, entry.path, view, [encode_jpeg(f) for f in pixels], fps=25.0)
    return Path(root)
