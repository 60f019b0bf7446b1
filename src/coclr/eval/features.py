"""Video-level features of a frozen backbone, for retrieval and the linear probe, with a content-keyed cache.

Protocol (paper, section 4.3): the pooled backbone feature (no projection head)
of every half-overlapping sliding window of a video, centre crop only (no colour operations at test time),
averaged over the windows of the video. Query AND gallery videos are treated the same way (the reference
code used one random clip per gallery video). The clips are normalised as the encoder takes them: ImageNet's mean
and standard deviation (the paper's, and every encoder coclr trains), or what a file records or its format implies
(Kinetics' for torchvision's ``s3d``).

The cache is keyed by the sha256 of the checkpoint *file content* plus what determines the data: the store's
settings, the split's videos with their labels and the checksum of each one's entry (:meth:`ClipStore.checksum`,
which changes with any stored byte), the view, clip length, frame stride, crop size, autocast, and a normalisation
other than ImageNet's. So retraining a checkpoint or
rebuilding a store in place (other frames, other JPEG quality) never serves stale features (the reference keyed its
cache by folder), and a store moved elsewhere keeps its cache. Not keyed: the batch size and the thread count, which
change nothing on the CPU in float32 (the rounding only, under autocast or on a GPU): there the features are those of
``coclr embed``'s network (the fused inference copy,
:func:`~coclr.models.inference.inference_network`), every batch padded to its full size
(:func:`~coclr.models.inference.padded`), so a window's feature is the same bits whatever shares its batch and on
any number of threads, and identical videos tie (with the eager network and a short last batch they differed by
rounding, and R@1 depended on the batch size). Nor the CPU kind or the device, which change the rounding only (unit
features within about 3e-5 of each other).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from coclr.atomic import atomic_open, file_state, remove_stale_partials_of
from coclr.clips import IMAGENET_MEAN, IMAGENET_STD, PAPER_CLIPS, recorded_clips
from coclr.data import augment
from coclr.data.datasets import WindowClips, usable_entries
from coclr.data.views import is_flow_view, stored_view, view_kind
from coclr.errors import CheckpointError, ConfigError, DataError
from coclr.eval.options import ClipConfig
from coclr.interrupts import loader_worker_signals
from coclr.models.heads import unit_length
from coclr.models.inference import inference_network, padded
from coclr.models.loading import (
    TRAIN_FORMAT,
    implied_clip_settings,
    load_encoder,
    open_checkpoint,
    read_clip_settings,
    require_checkpoint_file,
)
from coclr.progress import bar as progress_bar
from coclr.runfolder import check_output_folder
from coclr.store.flow_views import bound_key, method_key, stored_bound

CACHE_FORMAT = 5
"""Bumped whenever the way features are computed changes, which invalidates every cache entry (3: each window's
feature L2-normalised before the video's mean; 4: on the CPU the fused inference network, every batch padded to its
full size; 5: each video's windows cropped from its own frames, not fitted to the split's most common size)."""


class VideoFeatures(NamedTuple):
    """One feature row per video of a split, in the split's index order."""

    features: np.ndarray
    """``float32 [N, D]``: window features averaged per video."""
    labels: np.ndarray
    """``int64 [N]``: class index of each video."""
    keys: list[str]
    """Store key (relative path) of each video."""


Normalisation = tuple[tuple[float, ...], tuple[float, ...]]
"""An encoder's input normalisation, ``(mean, std)`` per channel (:func:`input_normalisation`)."""
IMAGENET = (tuple(IMAGENET_MEAN), tuple(IMAGENET_STD))
"""The normalisation of the paper's clips, and of every encoder coclr trains."""


def input_normalisation(checkpoint: str | Path) -> Normalisation:
    """The normalisation ``checkpoint``'s encoder takes its clips in: what it recorded or its format implies
    (:func:`coclr.models.loading.implied_clip_settings`: Kinetics' for torchvision's ``s3d``), else ImageNet's."""
    settings = implied_clip_settings(checkpoint)
    return (tuple(settings.get("mean") or IMAGENET[0]), tuple(settings.get("std") or IMAGENET[1]))


def eval_views(frames: torch.Tensor, view: str, size: int, ten_crop: bool = False,
               short_side: int | None = None, normalisation: Normalisation = IMAGENET) -> torch.Tensor:
    """Test-time inputs of uint8 clips ``[B, T, H, W, 3]`` of ``view`` -> normalised ``[B, V, 3, T', S, S]``.

    V = 1: the centre crop of the frames resized to short side ``size``. V = 10 (``ten_crop``): the centre
    and four corner crops of the frames resized to short side ``short_side``, each also flipped (flow's
    horizontal component negated), see :func:`coclr.data.augment.ten_crop`. No colour operation at test time.
    """
    mean, std = normalisation
    if ten_crop:
        return augment.ten_crop({view: frames}, size, short_side=short_side, mean=mean, std=std)[view]
    return augment.center_crop({view: frames}, size, mean=mean, std=std)[view].unsqueeze(1)


def _autocast(device: torch.device, enabled: bool):
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=enabled)


def split_entries(store, split: str, views: Sequence[str] = ()) -> list:
    """The index entries of ``split`` that have every view of ``views`` (those whose job failed are left out,
    :func:`coclr.data.datasets.usable_entries`); a clear error when none is left or a view is not built yet."""

    return usable_entries(store, split, views)[0]


def check_classes(train: list, test: list, train_split: str, test_split: str, task: str) -> None:
    """Refuse, before any work, splits whose videos are all of one class (every score would be 100 by construction:
    it was reported as a result, with a warning and exit status 0), or a training split of one class (the gallery
    or the probe knows one class: every score is the share of the test videos of it, whatever the features)."""
    if len({entry.label for entry in [*train, *test]}) == 1:
        raise DataError(f"evaluation ({task}): every {train_split!r} and {test_split!r} video is of one class, so "
                        "every score would be 100 by construction; evaluate on splits of two or more classes")
    if len({entry.label for entry in train}) == 1:
        raise DataError(f"evaluation ({task}): every {train_split!r} video is of one class, so every score would be "
                        f"the share of {test_split!r} videos of that class, whatever the features; evaluate with a "
                        f"{train_split!r} split of two or more classes")


def label_warnings(train: list, test: list, train_split: str, test_split: str) -> list[str]:
    """What makes a score mean less than it seems, said before any work: test videos of classes that no training
    video has (each a miss, whatever the features). (One class in all is refused: :func:`check_classes`.)"""
    unseen = sum(entry.label not in {e.label for e in train} for entry in test)
    if unseen:
        return [f"{unseen} of the {len(test)} {test_split!r} videos are of classes no {train_split!r} video has: each "
                "counts as a miss, whatever the features"]
    return []


@torch.no_grad()
def predict_windows(model: Callable[[torch.Tensor], torch.Tensor], store, view: str, split: str, config: ClipConfig,
                    device: str | torch.device = "cpu", ten_crop: bool = False, short_side: int | None = None,
                    progress: bool = True, desc: str = "windows", with_views: Sequence[str] = (),
                    normalisation: Normalisation = IMAGENET) -> tuple[torch.Tensor, list]:
    """Run ``model`` on every sliding window of every video of ``split`` (that also has the views of
    ``with_views``) and average its outputs per video.

    ``model`` maps clips ``[B, 3, T, S, S]`` (under ``normalisation``) to ``[B, D]``; with ``ten_crop`` each window is
    given as ten crops whose outputs are averaged with the windows. Returns the per-video mean ``[N, D]``
    (float32, on the CPU) and the split's index entries in the same order. The caller sets eval mode.
    """
    windows = WindowClips(store, split, view, config.length, config.stride, with_views=with_views)
    sums: torch.Tensor | None = None
    counts = torch.zeros(len(windows.entries), dtype=torch.float64)
    for videos, out in _window_outputs(model, windows, config, device, ten_crop, short_side, progress, desc,
                                       normalisation):
        if sums is None:
            sums = torch.zeros(len(windows.entries), out.shape[1], dtype=torch.float64)
        sums.index_add_(0, videos, out)
        counts.index_add_(0, videos, torch.ones(len(out), dtype=torch.float64))
    assert sums is not None and bool((counts > 0).all()), "every video has at least one window"
    return (sums / counts[:, None]).float(), windows.entries


@torch.no_grad()
def window_features(backbone: nn.Module, store, view: str, split: str, config: ClipConfig,
                    device: str | torch.device = "cpu", keys: Sequence[str] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Pooled backbone features of every sliding window of the videos of ``split`` (``keys``: only these):
    ``float32 [W, D]``, the video (row of the returned keys) of each window, the videos' keys, and the first frame
    of each window. The caller sets eval mode."""
    windows = WindowClips(store, split, view, config.length, config.stride, keys=keys)
    parts = list(_window_outputs(_pooled_network(backbone, torch.device(device), config.amp), windows, config,
                                 device, progress=False))
    features = torch.cat([out for _, out in parts]).float().numpy()
    videos = torch.cat([video for video, _ in parts]).numpy()
    starts = np.array([int(indices[0]) for _, indices in windows.windows], dtype=np.int64)
    return features, videos, [entry.path for entry in windows.entries], starts


def _window_outputs(model: Callable[[torch.Tensor], torch.Tensor], windows: WindowClips, config: ClipConfig,
                    device: str | torch.device, ten_crop: bool = False, short_side: int | None = None,
                    progress: bool = False, desc: str = "windows", normalisation: Normalisation = IMAGENET
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(video of each window, output float64 [B, D] on the CPU)`` for each batch of ``windows``; ``model`` is given
    every batch at its full size (the last one padded, :func:`~coclr.models.inference.padded`), so an output never
    depends on how many windows shared its batch."""
    device = torch.device(device)
    loader = DataLoader(windows, batch_sampler=windows.batches(config.batch_size), num_workers=config.workers,
                        pin_memory=device.type == "cuda", worker_init_fn=loader_worker_signals)  # (one frame size a
    # batch: each video's crop is of its own frames)
    for batch in progress_bar(loader, desc=desc, unit="batch", disable=not progress, leave=False):
        count = len(batch["video"])  # (padded as the decoded clips: the smallest copy)
        crops = eval_views(padded(batch["clip"], config.batch_size).to(device, non_blocking=True), windows.view,
                           config.size, ten_crop, short_side, normalisation)
        with _autocast(device, config.amp):
            out = model(crops.flatten(0, 1))
        out = out.float().reshape(len(crops), crops.shape[1], -1)[:count]
        yield batch["video"], out.mean(dim=1).double().cpu()


def extract_features(backbone: nn.Module, store, view: str, split: str, config: ClipConfig | None = None,
                     device: str | torch.device = "cpu", progress: bool = True,
                     with_views: Sequence[str] = (), normalisation: Normalisation = IMAGENET) -> VideoFeatures:
    """Pooled backbone features of every video of ``split`` (that also has the views of ``with_views``): sliding
    windows (half overlap), centre crop, each window's feature L2-normalised, then averaged per video (as the
    authors' retrieval and linear probe take each clip's feature, so no window outweighs another by its size);
    clips normalised as the backbone takes them (``normalisation``). The backbone runs in eval mode without
    gradients; its mode is restored."""
    config = config or ClipConfig()
    device = torch.device(device)
    was_training = backbone.training
    backbone.eval().to(device)
    try:
        network = _pooled_network(backbone, device, config.amp)
        means, entries = predict_windows(lambda clips: unit_length(network(clips)), store, view, split, config, device,
                                         progress=progress, desc=f"features {view}/{split}", with_views=with_views,
                                         normalisation=normalisation)
    finally:
        backbone.train(was_training)
    labels = np.array([entry.label_id for entry in entries], dtype=np.int64)
    return VideoFeatures(means.numpy(), labels, [entry.path for entry in entries])


def _pooled_network(backbone: nn.Module, device: torch.device, amp: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """Clips -> ``backbone``'s pooled features ``[B, D]`` as the evaluations run it: on the CPU in float32, the network
    ``coclr embed`` runs (:func:`~coclr.models.inference.inference_network`: the fused inference copy, whose features
    do not depend on the thread count; the eager network's differed by up to 2e-6); elsewhere, or under autocast,
    ``backbone`` itself (in eval mode: the caller's)."""
    if device.type == "cpu" and not amp:
        return inference_network(backbone, None, device)
    return lambda clips: backbone(clips).mean(dim=(2, 3, 4))


def cache_key(checkpoint_sha256: str, store, view: str, split: str, config: ClipConfig,
              with_views: Sequence[str] = (), normalisation: Normalisation = IMAGENET) -> dict[str, object]:
    """Everything the features depend on: checkpoint content, the store's settings, view, split, the split's
    videos, their labels and the content of their entries (:func:`videos_digest`), clip options, and the input
    normalisation where it is not ImageNet's. Not the store's path."""
    key = {"format": CACHE_FORMAT, "checkpoint_sha256": checkpoint_sha256,
           "store_settings": settings_of_views(store.meta, [view, *with_views]), "view": view, "split": split,
           "videos_sha256": videos_digest(store, view, split, with_views), **config.data_key(),
           **normalisation_key(normalisation)}
    return key


def settings_of_views(meta: dict[str, object], views: Sequence[str]) -> dict[str, object]:
    """The store's settings less those of flow views other than ``views`` (their bound and method): extracting
    another flow view changes no feature of these (the RGB features were extracted again after every coclr flow)."""
    flow_views = {key.removesuffix(bound_key("")) for key in meta if key.endswith(bound_key(""))}  # (each records
    others = {key for other in flow_views - set(views) for key in (bound_key(other), method_key(other))}  # a bound)
    return {key: value for key, value in meta.items() if key not in others}


def normalisation_key(normalisation: Normalisation) -> dict[str, object]:
    """What a cache key or a folder's record holds of an input normalisation: nothing for ImageNet's (keys and
    folders from before it was recorded stand: they were all ImageNet's), else ``{"normalisation": [mean, std]}``."""
    return {} if normalisation == IMAGENET else {"normalisation": [list(values) for values in normalisation]}


def videos_digest(store, view: str, split: str, with_views: Sequence[str] = ()) -> str:
    """The sha256 of the videos of ``split`` that have ``view`` and ``with_views``: their keys, labels and the
    content of their entries of ``view`` (:func:`entry_identity`; a derived view's, of the view it reads)."""
    entries = split_entries(store, split, [view, *with_views])
    videos = [[e.path, e.label_id, entry_identity(store, e.path, stored_view(view))] for e in entries]
    return hashlib.sha256(json.dumps(videos).encode()).hexdigest()


def entry_identity(store, key: str, view: str) -> str:
    """What identifies the stored content of an entry: its checksum; for an entry written before checksums, its
    file's inode, size and modification time (a rebuilt entry is a new file: written atomically)."""
    value = store.checksum(key, view)
    if value is not None:
        return value
    state = file_state(store.entry_path(key, view))
    if state is None:
        raise DataError(f"{store.entry_path(key, view)}: the stored entry of {key!r} cannot be read")
    return f"unverified:{state.inode}:{state.size}:{state.mtime_ns}"


CACHE_FILES = "features_*.npz"
"""The names of feature cache files (:func:`cached_features`); a cache folder holds nothing else."""


def check_cache_dir(cache_dir: str | Path) -> None:
    """Refuse, before any work, a feature cache folder (``--cache-dir``) that holds other files than cache files or
    lies inside another command's folder (:func:`coclr.runfolder.check_output_folder`)."""
    check_output_folder(cache_dir, "feature cache", lambda path: path.is_file() and path.match(CACHE_FILES),
                        f"feature cache files, {CACHE_FILES}")


def _cache_path(cache_dir: Path, key: dict[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir / f"features_{key['view']}_{key['split']}_{digest}.npz"


def _read_cache(path: Path, key: dict[str, object]) -> VideoFeatures | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            if json.loads(str(data["key"])) != key:
                return None
            return VideoFeatures(data["features"].astype(np.float32), data["labels"].astype(np.int64),
                                 [str(k) for k in data["keys"]])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # damaged: computed again, written whole
        return None


def _write_cache(path: Path, key: dict[str, object], result: VideoFeatures) -> None:
    with atomic_open(path, "wb") as out:
        np.savez(out, features=result.features, labels=result.labels, keys=np.array(result.keys),
                 key=np.array(json.dumps(key, sort_keys=True)))


def load_backbone(checkpoint: str | Path) -> nn.Module:
    """The backbone of an encoder checkpoint (ours or the authors'); the projection head is dropped."""

    backbone, _head = load_encoder(checkpoint, map_location="cpu")
    return backbone


def cached_features(checkpoint: str | Path, store, view: str, split: str, config: ClipConfig | None = None,
                    cache_dir: str | Path | None = None, device: str | torch.device = "cpu",
                    checkpoint_sha256: str | None = None, backbone: nn.Module | None = None,
                    progress: bool = True, with_views: Sequence[str] = ()) -> VideoFeatures:
    """:func:`extract_features` for a checkpoint file, served from ``cache_dir`` when the same checkpoint
    content and data configuration were extracted before. The backbone is loaded only on a cache miss
    (or taken from ``backbone`` when given, which must be the checkpoint's)."""
    config = config or ClipConfig()
    normalisation = input_normalisation(checkpoint)
    if cache_dir is None:
        return extract_features(backbone or load_backbone(checkpoint), store, view, split, config, device, progress,
                                with_views, normalisation)
    key = cache_key(checkpoint_sha256 or open_checkpoint(checkpoint).sha256, store, view, split, config, with_views,
                    normalisation)
    path = _cache_path(Path(cache_dir), key)
    if path.is_file():
        hit = _read_cache(path, key)
        if hit is not None:
            return hit
    result = extract_features(backbone or load_backbone(checkpoint), store, view, split, config, device, progress,
                              with_views, normalisation)
    remove_stale_partials_of(path)  # (a killed run's: each as large as the features)
    _write_cache(path, key, result)
    return result


# ------------------------------------------------------------------------------------------ evaluation inputs

def trained_view(checkpoint: str | Path, given: str | None, option: str = "--view", default: str = "rgb") -> str:
    """The view to evaluate ``checkpoint`` on: ``given``, else the view it was trained on, else ``default``. A given
    view of another kind than the trained one (RGB for a flow encoder, say) is a :class:`ConfigError`."""

    trained = read_clip_settings(checkpoint).get("view")
    if given is None:
        return trained or default
    if trained is not None and view_kind(given) != view_kind(trained):
        raise ConfigError(f"{option} {given}: {checkpoint} was trained on {trained!r} clips; evaluate it on a "
                          f"{view_kind(trained)} view (e.g. {option} {trained})")
    return given


def trained_clips(checkpoints: Sequence[str | Path], **given: int | None) -> tuple[dict[str, int], dict[str, str]]:
    """The clip ``length``, ``stride`` and ``size`` to evaluate with: each one given, else the one the checkpoints
    were trained on (read_clip_settings; they must agree), else the paper's (:data:`PAPER_CLIPS`). Returns the
    values and where each came from ("given", "checkpoint", "paper")."""

    recorded = [(Path(c), read_clip_settings(c)) for c in checkpoints]
    values, sources = {}, {}
    for key, default in PAPER_CLIPS.items():
        if given.get(key) is not None:
            values[key], sources[key] = given[key], "given"
            continue
        found = {path: settings[key] for path, settings in recorded if settings.get(key) is not None}
        if len(set(found.values())) > 1:
            shown = ", ".join(f"{path.name}: {value}" for path, value in found.items())
            raise ConfigError(f"--{key}: the checkpoints were trained on clips of different {key} ({shown}); give "
                              f"--{key}")
        values[key], sources[key] = (next(iter(found.values())), "checkpoint") if found else (default, "paper")
    return values, sources


def unlike_training(store, checkpoint: str | Path, view: str) -> list[str]:
    """How the frames ``store`` gives ``view`` differ from those ``checkpoint`` recorded training on (short side,
    frame rate, flow bound), one line each: the encoder then sees objects at another scale, motion at another
    speed, or flow values it never saw, and its figures are not those of its own clips. Nothing for a checkpoint
    that records none of them."""
    recorded = read_clip_settings(checkpoint)
    here = {"short_side": store.meta.get("short_side"), "fps": store.meta.get("fps")}
    if is_flow_view(view):
        here["flow_bound"] = stored_bound(store, stored_view(view))
    said = {"short_side": ("frames of short side {} px", "frames as decoded", "data store --short-side"),
            "fps": ("frames at {} fps", "every decoded frame", "data store --fps"),
            "flow_bound": ("flow clipped at +-{} px", "unclipped flow", "flow --bound")}
    lines = []
    for key, value in here.items():
        if key not in recorded or recorded[key] == value or (value is None and key == "flow_bound"):
            continue
        shown, none, option = said[key]
        trained = shown.format(recorded[key]) if recorded[key] is not None else none
        this = shown.format(value) if value is not None else none
        lines.append(f"{Path(checkpoint).name} was trained on {trained}; this store's {view!r} has {this} (a store "
                     f"made with `coclr {option}` as its training store's gives it its own clips)")
    return lines


@dataclasses.dataclass(frozen=True)
class Stream:
    """One network to evaluate: an encoder checkpoint and the store view it reads (two for two-stream)."""

    checkpoint: Path
    view: str


def stream_views(streams: Sequence[Stream], with_views: Sequence[str] = ()) -> list[str]:
    """The views the streams read and ``with_views``, in order, each once: every stream evaluates the videos that
    have all of them (so that evaluations run apart compare the same videos)."""
    return list(dict.fromkeys([*(stream.view for stream in streams), *with_views]))


def check_inputs(store, streams: list[Stream], splits: list[str],
                 with_views: Sequence[str] = ()) -> dict[str, dict[str, str]]:
    """Fail before any work: missing checkpoint files, empty splits, or a stream's view not built yet. Returns,
    per split, the videos left out because a job of one of the views (or of ``with_views``) failed (key ->
    reason)."""

    for stream in streams:
        require_checkpoint_file(stream.checkpoint)
    return {split: usable_entries(store, split, stream_views(streams, with_views))[1] for split in splits}


def checkpoint_meta(path: str | Path) -> dict[str, object]:
    """What one of our checkpoints says it is (method, view, stage ...), or {} for other files: the ``meta``
    dict of an exported encoder, or the method and view of a training checkpoint."""

    try:
        payload = open_checkpoint(path).payload
    except CheckpointError:  # not ours or unreadable: load_encoder reports it properly when the model is loaded
        return {}
    if not isinstance(payload, dict):
        return {}
    meta = payload.get("meta")
    if payload.get("format") == TRAIN_FORMAT:
        meta = {key: payload.get(key) for key in ("method", "view")}
    return {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool))} if isinstance(meta, dict) else {}


def input_record(store, streams: list[Stream], splits: dict[str, str], shas: list[str],
                 with_views: Sequence[str] = ()) -> dict[str, object]:
    """What a result was computed from: checkpoints (path, content hash, meta), store, views, split sizes (the
    videos evaluated, and those left out because a job of one of their views failed)."""

    views = stream_views(streams, with_views)
    used = {role: usable_entries(store, name, views) for role, name in splits.items()}
    return {
        "store": str(Path(store.root).resolve()),
        "dataset": store.index.name,
        "num_classes": len(store.index.classes),
        "splits": {role: {"name": name, "videos": len(used[role][0]), "left_out": sorted(used[role][1])}
                   for role, name in splits.items()},
        "streams": [{"checkpoint": str(Path(s.checkpoint).resolve()), "checkpoint_sha256": sha, "view": s.view,
                     "meta": checkpoint_meta(s.checkpoint), "trained_clips": _trained_clip_shape(s.checkpoint)}
                    for s, sha in zip(streams, shas)],
    }


def _trained_clip_shape(checkpoint: str | Path) -> dict[str, int]:
    """The clip length, stride and size a checkpoint recorded from its training ({} when none)."""

    return recorded_clips(read_clip_settings(checkpoint))
