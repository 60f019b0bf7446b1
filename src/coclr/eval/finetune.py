"""End-to-end finetuning of a pretrained backbone for classification, with the ten-crop test (paper, 4.3).

Protocol: S3D backbone -> average pool -> Dropout(0.9) -> Linear, all trained with cross-entropy; the
backbone's learning rate is the classifier's x0.1, as in the authors' code. Training clips get the
pretraining augmentation without Gaussian blur (``ClipAugment(blur_p=0)``). At test time every sliding
window (half overlap) of every test video is cut into the centre crop, and separately into ten crops
(centre + four corners, each with its horizontal flip); softmax probabilities are averaged per video.

Model selection never looks at the test split: the model after the last of a fixed number of epochs is
tested (the reference picked its best epoch on the test set).

The job is resumable: a checkpoint of the model, optimiser, schedule and loss scale is written atomically after every
epoch, and each epoch's randomness (clip choice, augmentation, dropout, batch order) is a function of
``(seed, epoch)``, so a resumed run trains exactly as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from coclr import seeding
from coclr.atomic import (
    atomic_open,
    atomic_torch_save,
    atomic_write_json,
    read_json_record,
    remove_stale_partials_of,
)
from coclr.cpu import arithmetic, arithmetic_changes
from coclr.data.augment import ClipAugment
from coclr.data.datasets import TrainClips
from coclr.data.views import is_flow_view, stored_view
from coclr.errors import CheckpointError, CoclrError, DataError
from coclr.eval.features import (
    IMAGENET,
    ClipConfig,
    Normalisation,
    check_inputs,
    input_normalisation,
    input_record,
    load_backbone,
    normalisation_key,
    predict_windows,
    split_entries,
    stream_views,
    videos_digest,
)
from coclr.eval.fusion import fuse_probabilities, require_finite, topk_accuracy
from coclr.eval.options import FinetuneConfig, check_ten_crops
from coclr.interrupts import interrupted, loader_worker_signals
from coclr.models.encoder import Encoder
from coclr.models.heads import LinearClassifier
from coclr.models.loading import checkpoint_sha256, read_checkpoint_file, save_encoder
from coclr.progress import bar as progress_bar
from coclr.runfolder import FolderRule, check_folder, check_output_file, check_place, claim_folder
from coclr.store.flow_views import recorded_method, stored_bound
from coclr.text import to_bytes

STATE_FILE = "finetune_last.pt"
PROBS_FILE = "finetune_probabilities.npz"
ENCODER_FILE = "finetuned_encoder.pth"
RESULT_FILE = "finetune_result.json"
FUSED_FILE = "fused_probabilities.npz"
STATE_FORMAT = "coclr.finetune"


def _as_flags(settings: dict[str, Any]) -> dict[str, Any]:
    """A finetuning folder's settings as ``coclr eval finetune``'s flags name them (a refusal named
    ``clips.batch_size``, ``finetune.lr`` where ``--batch-size``, ``--lr`` were typed)."""
    flags = {"checkpoint_sha256": "--checkpoint (its sha256)", "store": "--store", "view": "--view",
             "train_split": "--train-split"}
    shown: dict[str, Any] = {}
    for key, value in settings.items():
        if key in ("clips", "finetune") and isinstance(value, dict):
            shown.update({"--" + name.replace("_", "-"): item for name, item in value.items()})
        else:
            shown[flags.get(key, key)] = value
    return shown


FINETUNE_FOLDER = FolderRule("finetune", "a finetuning job", other="another folder (--work-dir)",
                             since=("train_videos_sha256",), may_differ=("--ten-crop-short-side",), shown=_as_flags)
"""How a finetuning folder is continued or refused (:mod:`coclr.runfolder`): its settings are the job's
fingerprint (checkpoint content, store, view, training videos with their labels and stored content, clip and
finetuning options; not the workers, nor the test's short side: another one tests the trained network again)."""


class Classifier(nn.Module):
    """Backbone -> global average pool -> :class:`LinearClassifier` (Dropout then Linear)."""

    def __init__(self, backbone: nn.Module, num_classes: int, dropout: float) -> None:
        super().__init__()

        self.backbone = backbone
        self.classifier = LinearClassifier(backbone.out_channels, num_classes, dropout=dropout)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        """Clips ``[B, 3, T, H, W]`` -> logits ``[B, num_classes]``."""
        return self.classifier(self.backbone(clips).mean(dim=(2, 3, 4)))


def build_optimizer(model: Classifier, config: FinetuneConfig) -> torch.optim.Optimizer:
    """Adam with two parameter groups: the classifier at ``lr``, the backbone at ``lr * backbone_lr_scale``."""
    return torch.optim.Adam([
        {"params": model.classifier.parameters(), "lr": config.lr},
        {"params": model.backbone.parameters(), "lr": config.lr * config.backbone_lr_scale},
    ], weight_decay=config.weight_decay)


def _save_state(path: Path, model: Classifier, optimizer: torch.optim.Optimizer, scheduler, epoch: int,
                fingerprint: dict[str, object], losses: list[float | None],
                scaler: torch.amp.GradScaler | None = None) -> None:

    device = next(model.parameters()).device
    atomic_torch_save({"format": STATE_FORMAT, "epoch": epoch, "fingerprint": fingerprint,
                       "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                       "scheduler": scheduler.state_dict(), "losses": list(losses),
                       "scaler": {} if scaler is None else scaler.state_dict(),
                       "arithmetic": arithmetic(device)}, path)


def _read_state(path: Path) -> dict:
    """The finetuning state in ``path``; one that cannot be read (written atomically, so damaged from outside) is a
    :class:`CheckpointError` saying what to do."""
    remedy = "delete it to finetune from the first epoch, or give another --work-dir"
    try:
        state = read_checkpoint_file(path)
    except CheckpointError as error:
        raise CheckpointError(f"{error}; it is the finetuning state of this folder: {remedy}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path}: not a finetuning state file (format {STATE_FORMAT!r}): {remedy}")
    return state


def _state_fingerprint(folder: Path) -> dict[str, object] | None:
    """The settings of a finetuning folder written before folders recorded them: those of its state file."""
    path = folder / STATE_FILE
    return (_read_state(path).get("fingerprint") or {}) if path.is_file() else None


def _resume(path: Path, model: Classifier, optimizer: torch.optim.Optimizer, scheduler, epochs: int,
            scaler: torch.amp.GradScaler | None = None) -> list[float | None]:
    """Load the last epoch's state when it exists (its folder holds the same job: :data:`FINETUNE_FOLDER`);
    returns the training loss of each epoch done (None for one a state written before they were kept). Continued
    under other threads or kernels than it trained on (of its ``epochs``), it says so."""
    if not path.is_file():
        return []
    state = _read_state(path)
    done = int(state["epoch"])
    if done < epochs:  # (nothing left to train: silent)
        for change in arithmetic_changes(state.get("arithmetic"), arithmetic(next(model.parameters()).device), None,
                                         1, "the finetuning"):
            warnings.warn(f"{path}: {change}", stacklevel=2)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler"):  # (a state written before the scaler was kept: a fresh one)
        scaler.load_state_dict(state["scaler"])
    losses = [None if loss is None else float(loss) for loss in state.get("losses") or []]
    return losses if len(losses) == done else [None] * done


def loss_scaler(device: torch.device, amp: bool) -> torch.amp.GradScaler:
    """The loss scaler of float16 autocast (on CUDA), which keeps small gradients from flushing to zero; disabled
    (a pass-through) for bfloat16 and float32."""
    return torch.amp.GradScaler(device.type, enabled=amp and device.type == "cuda")


def train_epoch(model: Classifier, loader, augment, optimizer: torch.optim.Optimizer, view: str,
                device: torch.device, amp: bool, generator: torch.Generator, progress: bool, desc: str,
                scaler: torch.amp.GradScaler | None = None) -> float:
    """One epoch of cross-entropy training; returns the mean loss. ``scaler`` scales the loss before the backward
    pass (:func:`loss_scaler`; none: unscaled)."""

    model.train()
    total, count = 0.0, 0
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    for batch in progress_bar(loader, desc=desc, unit="batch", disable=not progress, leave=False):
        frames = batch[view][:, 0].to(device, non_blocking=True)  # one clip per video
        clips = augment({view: frames}, generator)[view]
        labels = batch["label"].to(device)
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=amp):
            loss = F.cross_entropy(model(clips).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:  # (a step whose scaled gradients overflowed is skipped and the scale lowered)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        total += float(loss.detach()) * len(labels)
        count += len(labels)
    return total / max(count, 1)


def finetune_fingerprint(checkpoint_sha256: str, store, view: str, train_split: str, clip_config: ClipConfig,
                         config: FinetuneConfig, with_views: Sequence[str] = (),
                         normalisation: Normalisation = IMAGENET) -> dict[str, object]:
    """The settings a finetuning folder records (:data:`FINETUNE_FOLDER`): what determines the finetuned network
    (the checkpoint's content, the store, the view, the training videos with their labels and stored content, the
    clip and finetuning options, and the input normalisation where it is not ImageNet's)."""
    entries = split_entries(store, train_split, [view, *with_views])  # the videos TrainClips trains on
    fingerprint = {"checkpoint_sha256": checkpoint_sha256, "store": str(Path(store.root).resolve()), "view": view,
                   "train_split": train_split,
                   "videos_sha256": hashlib.sha256(to_bytes("\n".join(e.path for e in entries))).hexdigest(),
                   "train_videos_sha256": videos_digest(store, view, train_split, with_views),
                   "clips": dataclasses.asdict(clip_config), "finetune": dataclasses.asdict(config),
                   **normalisation_key(normalisation)}
    fingerprint["clips"].pop("workers")
    return fingerprint


def finetune(checkpoint: str | Path, checkpoint_sha256: str, store, view: str, out_dir: str | Path,
             clip_config: ClipConfig | None = None, config: FinetuneConfig | None = None,
             train_split: str = "train", test_split: str = "test", device: str | torch.device = "cpu",
             progress: bool = True, with_views: Sequence[str] = (),
             on_epoch: Callable[[int], None] | None = None) -> dict[str, object]:
    """Finetune the checkpoint's backbone on ``train_split`` and test it on ``test_split`` (the videos that have
    ``view`` and the views of ``with_views``); ``on_epoch(n)`` is told each time ``n`` epochs are done and kept.

    Writes ``out_dir/finetune_last.pt`` after every epoch (resumed from when present), the finetuned backbone to
    ``out_dir/finetuned_encoder.pth`` (an encoder file, for retrieval and probes of the finetuned network) and the
    per-video test probabilities to ``out_dir/finetune_probabilities.npz`` (at a ten-crop short side other than the
    default, a file named by it: :func:`probabilities_name`; ``keys``, ``labels``, ``center``,
    ``ten_crop``) and the results with the inputs they came from to ``out_dir/finetune_result.json``, so that the
    same call on a finished folder returns them without training or testing again. Returns the results:
    centre-crop and ten-crop top-1/top-5 (percent) and the training losses. Clips are normalised as the checkpoint's
    encoder takes them (:func:`~coclr.eval.features.input_normalisation`), in training and at test, as for its
    frozen features.
    """


    clip_config = clip_config or ClipConfig()
    config = config or FinetuneConfig()
    check_ten_crops(config, clip_config.size)  # (the ten crops, after every epoch of training)
    device = torch.device(device)
    out_dir = Path(out_dir)
    num_classes = len(store.index.classes)
    dataset = TrainClips(store, train_split, [view], clip_config.length, clip_config.stride, num_clips=1,
                         seed=config.seed, with_views=with_views)
    normalisation = input_normalisation(checkpoint)
    fingerprint = finetune_fingerprint(checkpoint_sha256, store, view, train_split, clip_config, config, with_views,
                                       normalisation)
    tested = {"fingerprint": fingerprint, "test_split": test_split, "with_views": list(with_views),
              "test_videos_sha256": videos_digest(store, view, test_split, with_views)}  # (tested again if changed)
    with claim_folder(out_dir, FINETUNE_FOLDER, fingerprint, legacy=_state_fingerprint):
        finished = _finished(out_dir, tested)
        if finished is not None:
            return finished

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = Classifier(load_backbone(checkpoint), num_classes, config.dropout).to(device)
        optimizer = build_optimizer(model, config)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, config.milestones, gamma=0.1)
        scaler = loss_scaler(device, clip_config.amp)
        state_path = out_dir / STATE_FILE
        losses = _resume(state_path, model, optimizer, scheduler, config.epochs, scaler)  # (a resumed run's result
        # lists every epoch's)
        done = len(losses)

        mean, std = normalisation
        augment = ClipAugment(size=clip_config.size, blur_p=0.0, mean=mean, std=std)
        try:
            for epoch in progress_bar(range(done, config.epochs), desc="finetune", unit="epoch",
                                      disable=not progress, initial=done, total=config.epochs):
                dataset.set_epoch(epoch)
                loader = DataLoader(dataset, batch_size=clip_config.batch_size, shuffle=True,
                                    drop_last=len(dataset) > clip_config.batch_size, num_workers=clip_config.workers,
                                    generator=seeding.generator(config.seed, epoch, seeding.ORDER),
                                    pin_memory=device.type == "cuda", worker_init_fn=loader_worker_signals)
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    torch.manual_seed(seeding.derive_seed(config.seed, epoch))  # this epoch's dropout, restored after
                    losses.append(train_epoch(model, loader, augment, optimizer, view, device, clip_config.amp,
                                              seeding.generator(config.seed, epoch, seeding.AUGMENT), progress,
                                              f"epoch {epoch + 1}", scaler))
                if not math.isfinite(losses[-1]):  # (before its state is kept: a rerun does not continue from NaN)
                    raise CoclrError(f"finetuning diverged: the training loss of epoch {epoch + 1} is {losses[-1]}; "
                                     f"{done} epoch(s) kept, nothing tested: give a lower --lr (or "
                                     "--backbone-lr-scale)")
                scheduler.step()
                _save_state(state_path, model, optimizer, scheduler, epoch + 1, fingerprint, losses, scaler)
                done = epoch + 1
                if on_epoch is not None:
                    on_epoch(done)
        except KeyboardInterrupt as error:  # the epoch under way is trained again
            raise interrupted(error, f"{done} of {config.epochs} finetuning epochs done and kept in {state_path}") \
                from None

        model.eval()
        flow = stored_view(view) if is_flow_view(view) else None
        _save_finetuned(out_dir / ENCODER_FILE, model, view, clip_config, checkpoint_sha256, normalisation,
                        flow and stored_bound(store, flow), flow and recorded_method(store, flow))
        short_side = config.ten_crop_short_side or round(clip_config.size * 8 / 7)

        def probabilities(clips: torch.Tensor) -> torch.Tensor:
            return model(clips).float().softmax(dim=1)

        center, entries = predict_windows(probabilities, store, view, test_split, clip_config, device,
                                          with_views=with_views, progress=progress, desc="test centre crop",
                                          normalisation=normalisation)
        ten, _ = predict_windows(probabilities, store, view, test_split, clip_config, device, with_views=with_views,
                                 ten_crop=True, short_side=short_side, progress=progress, desc="test ten crops",
                                 normalisation=normalisation)
        keys = [entry.path for entry in entries]
        labels = np.array([entry.label_id for entry in entries], dtype=np.int64)
        probabilities_file = out_dir / probabilities_name(short_side, clip_config.size)
        for crops in (center, ten):
            require_finite(crops.numpy(), "the finetuning", "give a lower --lr (or --backbone-lr-scale)")
        save_probabilities(probabilities_file, keys, labels, center=center.numpy(), ten_crop=ten.numpy())
        center_acc, ten_acc = topk_accuracy(center.numpy(), labels), topk_accuracy(ten.numpy(), labels)
        result = {"top1": round(100 * ten_acc[1], 4), "top5": round(100 * ten_acc[5], 4),
                  "center_top1": round(100 * center_acc[1], 4), "center_top5": round(100 * center_acc[5], 4),
                  "ten_crop_short_side": short_side, "epochs": config.epochs, "train_losses": losses,
                  "probabilities": str(probabilities_file)}
        atomic_write_json(out_dir / RESULT_FILE, {**tested, "result": result})
        return result


def probabilities_name(short_side: int, size: int) -> str:
    """The test probabilities' file of a ten-crop test at ``short_side``: :data:`PROBS_FILE` at the default (the
    paper's ratio for ``size``), else named by it, so that a test at another short side replaces no result an
    earlier test reported."""
    if short_side == round(size * 8 / 7):
        return PROBS_FILE
    return PROBS_FILE.replace(".npz", f"_short_side_{short_side}.npz")


def _finished(out_dir: Path, tested: dict[str, object]) -> dict[str, object] | None:
    """The results of a finished job with the same inputs in ``out_dir`` (its files all present), else None."""
    try:
        record = read_json_record(out_dir / RESULT_FILE)
    except (OSError, DataError):
        return None
    if record is None or {k: record.get(k) for k in tested} != json.loads(json.dumps(tested)):
        return None
    result = record.get("result")
    probabilities = result.get("probabilities") if isinstance(result, dict) else None
    if not isinstance(probabilities, str) or not (out_dir / Path(probabilities).name).is_file() \
            or not all((out_dir / name).is_file() for name in (STATE_FILE, ENCODER_FILE)):
        return None  # (the path as this run names the folder's file: the recorded one was relative to the first
    return {**result, "probabilities": str(out_dir / Path(probabilities).name)}  # run's working folder)


def _save_finetuned(path: Path, model: Classifier, view: str, clip_config: ClipConfig, source_sha256: str,
                    normalisation: Normalisation = IMAGENET, flow_bound: float | None = None,
                    flow_method: dict | None = None) -> None:
    """The finetuned backbone as an encoder file that records the clips it was finetuned on: their shape, their
    normalisation and a flow view's bound and method (so that its embeddings, evaluations and exports take them too;
    an export said "mean None, std None" and lost the bound)."""
    settings: dict[str, object] = {"view": view, **clip_config.clips.to_dict()}
    settings["mean"], settings["std"] = (list(values) for values in normalisation)
    if flow_bound is not None:
        settings["flow_bound"] = float(flow_bound)
    if flow_method is not None:
        settings["flow_method"] = flow_method
    save_encoder(path, Encoder(model.backbone, None), meta={"method": "finetuned", "view": view,
                                                            "finetuned_from": source_sha256,
                                                            "clip_settings": settings})


def save_probabilities(path: str | Path, keys: list[str], labels: np.ndarray, **probabilities: np.ndarray) -> Path:
    """Per-video class probabilities as ``.npz`` (``keys``, ``labels`` and one array per name), atomically (a killed
    write's temporary file removed)."""
    remove_stale_partials_of(path)
    with atomic_open(path, "wb") as out:
        np.savez(out, keys=np.array(keys), labels=np.asarray(labels), **probabilities)
    return Path(path)


def is_probabilities_file(path: str | Path) -> bool:
    """Whether ``path`` is a file :func:`save_probabilities` wrote (an ``.npz`` with ``keys`` and ``labels``)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {"keys", "labels"} <= set(getattr(data, "files", ()))
    except (OSError, ValueError, EOFError):
        return False


def load_probabilities(path: str | Path) -> dict[str, np.ndarray]:
    """Read a file written by :func:`save_probabilities` (``keys`` as a list of str)."""
    with np.load(path, allow_pickle=False) as data:
        out = {name: data[name] for name in data.files}
    out["keys"] = [str(key) for key in out["keys"]]
    return out


def stream_folder(out_dir: str | Path, view: str, checkpoint_sha256: str, views: Sequence[str]) -> Path:
    """Where a stream is finetuned: named by its view, its checkpoint's content and the views every evaluated
    video has, so that one- and two-stream evaluations of the same checkpoint share the work."""
    others = sorted(set(views) - {view})
    return Path(out_dir) / "_".join([view, checkpoint_sha256[:12], *(["with", *others] if others else [])])


def stream_folders(streams: Sequence, out_dir: str | Path, with_views: Sequence[str] = ()) -> list[Path]:
    """Where :func:`evaluate_finetune` finetunes each of ``streams`` (:func:`stream_folder`; their checkpoints
    must exist): two evaluations whose checkpoints have the same bytes write the same folder."""
    views = stream_views(streams, with_views)
    return [stream_folder(out_dir, stream.view, checkpoint_sha256(stream.checkpoint), views) for stream in streams]


def evaluate_finetune(store, streams: list, out_dir: str | Path, clip_config: ClipConfig | None = None,
                      config: FinetuneConfig | None = None, train_split: str = "train", test_split: str = "test",
                      device: str | torch.device = "cpu", progress: bool = True,
                      with_views: Sequence[str] = (), on_epoch: Callable[[int], None] | None = None
                      ) -> dict[str, object]:
    """The finetune protocol for one checkpoint (or two: ten-crop probabilities averaged) as a JSON record, on the
    videos that have every stream's view and the views of ``with_views``; ``on_epoch(n)``: told as each stream's
    ``n``-th epoch is done and kept.

    Each stream is finetuned in its own folder (:func:`stream_folder`); with two streams the fused
    probabilities go to ``out_dir/fused_probabilities.npz`` and ``results`` are the fused accuracies.
    """

    clip_config = clip_config or ClipConfig()
    config = config or FinetuneConfig()
    check_inputs(store, list(streams), [train_split, test_split], with_views)
    shas = [checkpoint_sha256(stream.checkpoint) for stream in streams]
    out_dir = Path(out_dir)
    views = stream_views(streams, with_views)
    check_place(out_dir, FINETUNE_FOLDER.command)  # a work folder holds finetuning folders (each claimed) ...
    if len(streams) > 1:  # ... and the fused probabilities: rewritten only if they are that
        check_output_file(out_dir / FUSED_FILE, FINETUNE_FOLDER.command, is_probabilities_file,
                          "a probabilities file")
    folders = stream_folders(streams, out_dir, with_views)
    for stream, sha, folder in zip(streams, shas, folders):  # every folder before any work
        check_folder(folder, FINETUNE_FOLDER,
                     finetune_fingerprint(sha, store, stream.view, train_split, clip_config, config, views,
                                          input_normalisation(stream.checkpoint)), _state_fingerprint)
    per_stream = [finetune(stream.checkpoint, sha, store, stream.view, folder, clip_config, config, train_split,
                           test_split, device, progress, views, on_epoch)
                  for stream, sha, folder in zip(streams, shas, folders)]
    record = {"task": "finetune", **input_record(store, list(streams), {"train": train_split, "test": test_split}, shas,
                                                    views),
              "config": {"clips": dataclasses.asdict(clip_config), "finetune": dataclasses.asdict(config)}}
    if len(per_stream) == 1:
        record["results"] = per_stream[0]
        return record
    loaded = [load_probabilities(result["probabilities"]) for result in per_stream]
    fused = {name: fuse_probabilities(loaded[0][name], loaded[0]["keys"], loaded[1][name], loaded[1]["keys"])
             for name in ("center", "ten_crop")}
    labels = loaded[0]["labels"]
    path = save_probabilities(out_dir / FUSED_FILE, loaded[0]["keys"], labels, **fused)
    center_acc, ten_acc = topk_accuracy(fused["center"], labels), topk_accuracy(fused["ten_crop"], labels)
    record["results"] = {"top1": round(100 * ten_acc[1], 4), "top5": round(100 * ten_acc[5], 4),
                         "center_top1": round(100 * center_acc[1], 4), "center_top5": round(100 * center_acc[5], 4),
                         "probabilities": str(path)}
    record["per_stream"] = per_stream
    return record
