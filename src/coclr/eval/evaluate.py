"""Evaluating a checkpoint: one function for every protocol, used by ``coclr eval`` and by the study.

:func:`evaluate_checkpoint` runs one task (retrieval, linear probe or finetuning) of one or two streams (encoder
checkpoint + store view) on a store and returns its JSON record (inputs, clip settings, left-out videos, feature
health, results, and the digest of what determined them). The command line and the study only choose the inputs
and options; how a task is run, what it reads and what it records is decided here once, and so is when an earlier
record of the same inputs stands for a new evaluation (:func:`inputs_digest`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coclr.cpu import require_native_bfloat16
from coclr.errors import ConfigError
from coclr.eval.features import (
    ClipConfig,
    Stream,
    cache_key,
    check_classes,
    input_normalisation,
    split_entries,
    stream_views,
)
from coclr.eval.finetune import evaluate_finetune, save_probabilities
from coclr.eval.linear import checked_holdout, evaluate_linear
from coclr.eval.options import FinetuneConfig, LinearProbeConfig
from coclr.eval.retrieval import DEFAULT_KS, evaluate_retrieval
from coclr.models.loading import checkpoint_sha256
from coclr.store.clipstore import open_store

TASKS = ("retrieval", "linear", "finetune")
RECORD_FORMAT = 1
"""Bumped whenever what a task computes from the same inputs changes: a record of another format is not reused."""


@dataclass
class TaskOptions:
    """The options of each task (only the chosen task's are read).

    ``ks``: retrieval R@k; ``probe``: the linear probe's; ``finetune`` and ``work_dir``: finetuning's and the folder
    of its resumable work (required for finetuning); ``cache_dir``: the feature cache of retrieval and the probe;
    ``probabilities``: a file for the linear probe's test probabilities (none written when None)."""

    ks: Sequence[int] = DEFAULT_KS
    probe: LinearProbeConfig = field(default_factory=LinearProbeConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    work_dir: str | Path | None = None
    cache_dir: str | Path | None = None
    probabilities: str | Path | None = None


def inputs_digest(task: str, store, streams: Sequence[Stream], clips: ClipConfig, options: TaskOptions, *,
                  train_split: str = "train", test_split: str = "test", with_views: Sequence[str] = ()) -> str:
    """The sha256 of everything ``task``'s record is a function of: the task's own options, and for every stream
    and split what its features are a function of (:func:`coclr.eval.features.cache_key`: the checkpoint's content,
    the store's settings, the split's videos and the content of their entries, the clip options). Not the paths,
    batch size, workers or device: the same digest means the same inputs, so an earlier record of it stands."""
    store = open_store(store)
    own = {"retrieval": {"ks": list(options.ks)}, "linear": dataclasses.asdict(options.probe),
           "finetune": dataclasses.asdict(options.finetune)}
    if task not in own:
        raise ConfigError(f"task: {task!r} is not one of {', '.join(TASKS)}")
    views = stream_views(streams, with_views)
    data = [cache_key(checkpoint, store, stream.view, split, clips, views, normalisation)
            for stream in streams  # each checkpoint hashed and read once
            for checkpoint, normalisation in [(checkpoint_sha256(stream.checkpoint),
                                               input_normalisation(stream.checkpoint))]
            for split in (train_split, test_split)]
    inputs = {"format": RECORD_FORMAT, "task": task, "options": own[task], "streams": data}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def check_evaluable(task: str, store, streams: Sequence[Stream], options: TaskOptions, train_split: str = "train",
                    test_split: str = "test", with_views: Sequence[str] = ()) -> None:
    """What the index alone tells, refused before any feature is extracted: splits without labels, splits of one
    class (every score 100 by construction), and for the linear probe a selection that would hold out nothing."""
    store.index.require_labels(f"evaluation ({task})", [train_split, test_split])
    views = [*stream_views(streams, with_views)]
    check_split_labels(split_entries(store, train_split, views), split_entries(store, test_split, views), task,
                       options.probe if task == "linear" else None, train_split, test_split)


def check_split_labels(train: Sequence, test: Sequence, task: str, probe: LinearProbeConfig | None = None,
                       train_split: str = "train", test_split: str = "test") -> None:
    """The index entries of the two splits refused for an evaluation (``task``, a study's too, before it trains):
    one class in all (:func:`~coclr.eval.features.check_classes`), and with ``probe`` a selection that would hold
    out nothing (:func:`~coclr.eval.linear.checked_holdout`)."""
    check_classes(list(train), list(test), train_split, test_split, task)
    if probe is not None:
        checked_holdout(np.array([entry.label_id for entry in train]), probe)


def evaluate_checkpoint(task: str, store, streams: Sequence[Stream], clips: ClipConfig,
                        options: TaskOptions | None = None, *, name: str | None = None,
                        device: str | torch.device = "cpu", train_split: str = "train", test_split: str = "test",
                        with_views: Sequence[str] = (), progress: bool = True,
                        earlier: dict[str, Any] | None = None,
                        on_epoch: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The record of ``task`` on ``streams`` (one stream, or two fused), on the videos of ``store`` that have
    every stream's view and ``with_views``; ``name`` is the method name the report shows (default: from the
    checkpoints). ``earlier``: a record this function returned before, returned again without any work when it
    was computed from the same inputs (its ``inputs_sha256``, :func:`inputs_digest`). ``on_epoch``: finetuning's
    (:func:`coclr.eval.finetune.evaluate_finetune`)."""
    options = options or TaskOptions()
    if train_split == test_split:  # each test video would find itself (retrieval R@1 100), or train on itself
        raise ConfigError(f"--train-split and --test-split are both {train_split!r}: an evaluation needs two "
                          "splits (the test videos query, or are classified by what was fitted on, the others)")
    if clips.amp and torch.device(device).type == "cpu":
        require_native_bfloat16("amp", "leave --amp off")
    store = open_store(store)
    streams = list(streams)
    check_evaluable(task, store, streams, options, train_split, test_split, with_views)
    digest = inputs_digest(task, store, streams, clips, options, train_split=train_split, test_split=test_split,
                           with_views=with_views)
    if earlier is not None and earlier.get("inputs_sha256") == digest:
        return earlier
    common: dict[str, Any] = {"train_split": train_split, "test_split": test_split, "device": device,
                              "progress": progress, "with_views": with_views}
    if task == "retrieval":
        record = evaluate_retrieval(store, streams, clips, options.ks, cache_dir=options.cache_dir, **common)
    elif task == "linear":
        record, probabilities, keys = evaluate_linear(store, streams, clips, options.probe,
                                                      cache_dir=options.cache_dir, **common)
        if options.probabilities is not None:
            labels = [store.entry(key).label for key in keys]
            path = save_probabilities(options.probabilities, keys, labels, probabilities=probabilities)
            record["results"]["probabilities"] = str(path)
    elif task == "finetune":
        if options.work_dir is None:
            raise ConfigError("finetune: needs a work folder for its resumable state (work_dir)")
        record = evaluate_finetune(store, streams, options.work_dir, clips, options.finetune, on_epoch=on_epoch,
                                   **common)
    record["inputs_sha256"] = digest
    if name:
        record["name"] = name
    return record
