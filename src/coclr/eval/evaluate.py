"""Evaluating a checkpoint: one function for every protocol, used by ``coclr eval`` and by the study.

:func:`evaluate_checkpoint` runs one task (retrieval, linear probe or finetuning) of one or two streams (encoder
checkpoint + store view) on a store and returns its JSON record (inputs, clip settings, left-out videos, feature
health, results). The command line and the study only choose the inputs and options; how a task is run, what it
reads and what it records is decided here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coclr.errors import ConfigError
from coclr.eval.features import ClipConfig, Stream
from coclr.eval.finetune import FinetuneConfig, evaluate_finetune, save_probabilities
from coclr.eval.linear import LinearProbeConfig, evaluate_linear
from coclr.eval.retrieval import DEFAULT_KS, evaluate_retrieval
from coclr.store.clipstore import open_store

TASKS = ("retrieval", "linear", "finetune")


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


def evaluate_checkpoint(task: str, store, streams: Sequence[Stream], clips: ClipConfig,
                        options: TaskOptions | None = None, *, name: str | None = None,
                        device: str | torch.device = "cpu", train_split: str = "train", test_split: str = "test",
                        with_views: Sequence[str] = (), progress: bool = True) -> dict[str, Any]:
    """The record of ``task`` on ``streams`` (one stream, or two fused), on the videos of ``store`` that have
    every stream's view and ``with_views``; ``name`` is the method name the report shows (default: from the
    checkpoints)."""
    options = options or TaskOptions()
    store = open_store(store)
    store.index.require_labels(f"evaluation ({task})", [train_split, test_split])
    common: dict[str, Any] = {"train_split": train_split, "test_split": test_split, "device": device,
                              "progress": progress, "with_views": with_views}
    streams = list(streams)
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
        record = evaluate_finetune(store, streams, options.work_dir, clips, options.finetune, **common)
    else:
        raise ConfigError(f"task: {task!r} is not one of {', '.join(TASKS)}")
    if name:
        record["name"] = name
    return record
