"""Linear probe on frozen features: BatchNorm1d then one linear layer (paper, section 4.3; Appendix Table 6).

Trained on cached video features (:mod:`coclr.eval.features`), which makes it fast and deterministic given a
seed. Hyper-parameters (learning rate, weight decay, number of epochs) are chosen from a small grid on a
stratified, seeded held-out part of the TRAIN split; the probe is then retrained on the whole train split with
the chosen ones and evaluated once on the test split. The reference picked its best epoch on the test set.

The learning rate is constant, so the probe after ``e`` epochs of a longer run is exactly a probe trained for
``e`` epochs: every epoch count of the grid is scored along one run per (lr, weight decay) pair.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from coclr.config import validate
from coclr.errors import CoclrError, DataError
from coclr.eval.features import (
    ClipConfig,
    VideoFeatures,
    cached_features,
    check_inputs,
    input_record,
    stream_views,
)
from coclr.eval.fusion import fuse_probabilities, require_finite, topk_accuracy
from coclr.eval.health import health_warnings, streams_health
from coclr.eval.options import LinearProbeConfig
from coclr.models.heads import LinearClassifier
from coclr.models.loading import checkpoint_sha256
from coclr.progress import bar as progress_bar
from coclr.threads import torch_threads


@dataclasses.dataclass
class LinearProbeResult:
    """Chosen hyper-parameters, their held-out scores, and the test accuracy and per-video probabilities."""

    selected: dict[str, float]
    """``lr``, ``weight_decay``, ``epochs`` chosen on the held-out train part."""
    grid: list[dict[str, float]]
    """Every grid point with its held-out top-1 accuracy and loss."""
    top1: float
    top5: float
    probabilities: np.ndarray
    """``float32 [N_test, C]``: softmax of the final probe, per test video."""
    keys: list[str]
    """Test video keys, in the order of ``probabilities``."""

    def to_json(self) -> dict[str, object]:
        return {"top1": round(100 * self.top1, 4), "top5": round(100 * self.top5, 4), "selected": self.selected,
                "grid": self.grid}


def checked_holdout(labels: np.ndarray, config: LinearProbeConfig) -> tuple[np.ndarray, np.ndarray]:
    """:func:`stratified_holdout` of the train videos' ``labels`` as the probe's selection draws it, refused in one
    line when it holds out nothing (checked on the index's labels before any feature is extracted, too)."""
    fit, held = stratified_holdout(labels, config.val_fraction, config.seed)
    if len(held) == 0:
        raise DataError("the linear probe's held-out split is empty: every class has a single train video")
    return fit, held


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into (fit, held-out): ``round(fraction * n_c)`` videos of each class ``c`` with at least
    two videos are held out (at least one, never all), chosen by a seeded permutation."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        if len(members) < 2:
            continue
        count = min(len(members) - 1, max(1, round(fraction * len(members))))
        held.append(rng.permutation(members)[:count])
    held_out = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    fit = np.setdiff1d(np.arange(len(labels)), held_out)
    return fit, held_out


def _new_probe(dim: int, num_classes: int, seed: int, device: torch.device) -> torch.nn.Module:

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probe = LinearClassifier(dim, num_classes, final_bn=True, l2_norm=True)
    return probe.to(device)


@torch.no_grad()
def _predict(probe: torch.nn.Module, features: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    probe.eval()
    return torch.cat([probe(features[i : i + batch_size]) for i in range(0, len(features), batch_size)])


def train_probe(features: np.ndarray, labels: np.ndarray, num_classes: int, lr: float, weight_decay: float,
                epochs: int, batch_size: int = 256, seed: int = 0, device: str | torch.device = "cpu",
                score_at: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
                on_epoch: Callable[[], None] | None = None) -> tuple[torch.nn.Module, dict[int, tuple[float, float]]]:
    """Train a probe (L2 normalisation, BatchNorm1d, Linear: the authors' linear probe) with Adam at a constant
    ``lr`` for ``epochs`` epochs.

    ``score_at`` maps epoch counts to held-out ``(features, labels)``; the probe is scored (top-1 accuracy,
    mean cross-entropy) after each of those epochs. ``on_epoch`` is called after every epoch (progress).
    Deterministic given ``seed`` on a given device.
    """
    device = torch.device(device)
    x = torch.as_tensor(np.asarray(features, dtype=np.float32), device=device)
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64), device=device)
    if len(x) < 2:
        raise DataError(f"the linear probe needs at least 2 training videos, got {len(x)}")
    probe = _new_probe(x.shape[1], num_classes, seed, device)
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    scores: dict[int, tuple[float, float]] = {}
    for epoch in range(1, epochs + 1):
        probe.train()
        order = torch.randperm(len(x), generator=generator).to(device)
        for start in range(0, len(x), batch_size):
            batch = order[start : start + batch_size]
            if len(batch) < 2:  # BatchNorm needs two samples: a last batch of one video is skipped
                continue
            loss = F.cross_entropy(probe(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if score_at and epoch in score_at:
            held_x, held_y = score_at[epoch]
            logits = _predict(probe, torch.as_tensor(held_x, device=device))
            target = torch.as_tensor(held_y, device=device)
            scores[epoch] = (float((logits.argmax(1) == target).float().mean()),
                             float(F.cross_entropy(logits, target)))
        if on_epoch is not None:
            on_epoch()
    return probe, scores


def select_hyperparameters(features: np.ndarray, labels: np.ndarray, num_classes: int, config: LinearProbeConfig,
                           device: str | torch.device = "cpu", on_epoch: Callable[[], None] | None = None
                           ) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Choose (lr, weight decay, epochs) on a held-out part of the TRAIN features only.

    The best held-out top-1 wins; ties go to the lower held-out loss, then to the earlier grid point.
    """
    fit, held = checked_holdout(labels, config)
    held_data = (np.asarray(features)[held], np.asarray(labels)[held])
    grid: list[dict[str, float]] = []
    for lr, weight_decay in itertools.product(config.lrs, config.weight_decays):
        _, scores = train_probe(np.asarray(features)[fit], np.asarray(labels)[fit], num_classes, lr, weight_decay,
                                max(config.epochs), config.batch_size, config.seed, device,
                                score_at={e: held_data for e in config.epochs}, on_epoch=on_epoch)
        for epochs in sorted(config.epochs):
            accuracy, loss = scores[epochs]
            grid.append({"lr": lr, "weight_decay": weight_decay, "epochs": epochs, "val_top1": accuracy,
                         "val_loss": loss if math.isfinite(loss) else None})  # (None: it diverged)
    if all(point["val_loss"] is None for point in grid):
        raise CoclrError("the linear probe diverged at every setting of its grid (held-out loss NaN or infinite); "
                         "give lower --lrs")
    # a setting that diverged ranks last (its NaN loss compared false both ways, and its accuracy was class 0's)
    best = min(range(len(grid)), key=lambda i: (grid[i]["val_loss"] is None, -grid[i]["val_top1"],
                                                grid[i]["val_loss"] or 0.0, i))
    selected = {name: grid[best][name] for name in ("lr", "weight_decay", "epochs")}
    return selected, grid


def _checked(features: VideoFeatures, name: str, num_classes: int) -> VideoFeatures:
    """``features`` as the probe takes them (float32 ``[N, D]`` rows, int64 labels), or one :class:`DataError`
    naming the split and what is wrong: a probe fitted to NaN rows scored chance as if it had trained."""
    rows = np.asarray(features.features)
    labels = np.asarray(features.labels)
    if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.number):
        raise DataError(f"{name} features must be numbers [videos, dimensions], got {rows.dtype} {rows.shape}")
    if labels.ndim != 1 or len(labels) != len(rows) or len(features.keys) != len(rows):
        raise DataError(f"{name}: {len(rows)} feature rows, {len(labels)} labels and {len(features.keys)} keys; "
                        "each video needs one of each")
    if labels.dtype == bool or not np.issubdtype(labels.dtype, np.number) \
            or not np.array_equal(labels, np.round(labels)):
        raise DataError(f"{name} labels must be class indices (whole numbers), got {labels.dtype}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{name} labels must be in [0, {num_classes}), got {labels.min()}..{labels.max()}")
    if not np.isfinite(rows).all():
        raise DataError(f"{name} features hold NaN or infinite values (in {int((~np.isfinite(rows)).any(1).sum())} "
                        "video(s)): the encoder's output is broken")
    return VideoFeatures(rows.astype(np.float32, copy=False), labels.astype(np.int64), list(features.keys))


def _check_features(train: VideoFeatures, test: VideoFeatures, num_classes: int
                    ) -> tuple[VideoFeatures, VideoFeatures]:
    train, test = _checked(train, "train", num_classes), _checked(test, "test", num_classes)
    if train.features.shape[1] != test.features.shape[1]:
        raise DataError(f"train and test features differ in size: {train.features.shape[1]} vs "
                        f"{test.features.shape[1]}")
    return train, test


def linear_probe(train: VideoFeatures, test: VideoFeatures, num_classes: int, config: LinearProbeConfig | None = None,
                 device: str | torch.device = "cpu", progress: bool = False) -> LinearProbeResult:
    """Select hyper-parameters on held-out train videos, retrain on all train videos, test once. ``progress``
    shows a bar over all the training epochs (the grid's, then the final probe's) with an ETA."""

    config = config or LinearProbeConfig()
    validate(config)
    train, test = _check_features(train, test, num_classes)
    grid_epochs = len(config.lrs) * len(config.weight_decays) * max(config.epochs)
    one_thread = torch_threads(1 if torch.device(device).type == "cpu" else None)  # (the probe is tiny; on more
    # threads its BatchNorm's and Adam's sums round otherwise, and the grid chose another setting: 41.7 or 25.0)
    with one_thread, progress_bar(total=grid_epochs, desc="linear probe", unit="epoch", disable=not progress,
                                  leave=False) as bar:
        selected, grid = select_hyperparameters(train.features, train.labels, num_classes, config, device,
                                                on_epoch=lambda: bar.update(1))
        bar.total = grid_epochs + int(selected["epochs"])
        bar.refresh()  # show the new total (and ETA) now, not at the next timed redraw
        probe, _ = train_probe(train.features, train.labels, num_classes, selected["lr"], selected["weight_decay"],
                               int(selected["epochs"]), config.batch_size, config.seed, device,
                               on_epoch=lambda: bar.update(1))
        logits = _predict(probe, torch.as_tensor(test.features, device=torch.device(device)))
    probabilities = logits.softmax(dim=1).float().cpu().numpy()
    require_finite(probabilities, "the linear probe", "give lower --lrs")
    accuracy = topk_accuracy(probabilities, test.labels, (1, 5))
    return LinearProbeResult(selected, grid, accuracy[1], accuracy[5], probabilities, list(test.keys))


def evaluate_linear(store, streams: list, clip_config=None, probe_config: LinearProbeConfig | None = None,
                    train_split: str = "train", test_split: str = "test", device: str | torch.device = "cpu",
                    cache_dir=None, progress: bool = True, with_views: Sequence[str] = ()
                    ) -> tuple[dict[str, object], np.ndarray, list[str]]:
    """The linear-probe protocol for one checkpoint (or two: probabilities averaged) as a JSON record, on the videos
    that have every stream's view and the views of ``with_views``.

    Returns ``(record, test probabilities [N, C], test keys)``; with two streams the probabilities and the
    record's ``results`` are the fused ones and ``per_stream`` holds each probe alone.
    """

    clip_config = clip_config or ClipConfig()
    probe_config = probe_config or LinearProbeConfig()
    check_inputs(store, list(streams), [train_split, test_split], with_views)
    shas = [checkpoint_sha256(stream.checkpoint) for stream in streams]
    num_classes = len(store.index.classes)
    results, features = [], []
    for stream, sha in zip(streams, shas):
        views = stream_views(streams, with_views)
        train, test = (cached_features(stream.checkpoint, store, stream.view, split, clip_config, cache_dir, device,
                                       checkpoint_sha256=sha, progress=progress, with_views=views)
                       for split in (train_split, test_split))
        features.append((train, test))
        results.append(linear_probe(train, test, num_classes, probe_config, device, progress))
    probabilities, keys = results[0].probabilities, results[0].keys
    for other in results[1:]:
        probabilities = fuse_probabilities(probabilities, keys, other.probabilities, other.keys)
    labels = np.array([store.entry(key).label for key in keys])
    accuracy = topk_accuracy(probabilities, labels, (1, 5))
    record = {"task": "linear", **input_record(store, list(streams), {"train": train_split, "test": test_split}, shas,
                                                    with_views),
              "config": {"clips": dataclasses.asdict(clip_config), "probe": dataclasses.asdict(probe_config)},
              "results": {"top1": round(100 * accuracy[1], 4), "top5": round(100 * accuracy[5], 4)}}
    record["feature_health"] = streams_health(streams, [f[0] for f in features], [f[1] for f in features],
                                                store)
    record["warnings"] = health_warnings(record["feature_health"])
    if len(results) == 1:
        record["results"].update(selected=results[0].selected, grid=results[0].grid)
    else:
        record["per_stream"] = [result.to_json() for result in results]
    return record, probabilities, keys
