"""Training recipes shared by the commands that compose training stages (``coclr study``, ``coclr learn``).

The quick study's options are measured to learn on a CPU (docs/synth.md); ``coclr learn`` scales them to a
footage and a budget (:mod:`coclr.learn.recipe`).
"""

from __future__ import annotations

from typing import Any

STUDY_TRAIN: dict[str, Any] = {
    "data": {"length": 8, "stride": 1, "size": 32, "workers": 0, "cache_mb": 256},
    "model": {"width": 0.125},
    "method": {"queue_size": 128, "temperature": 0.07, "momentum": 0.99, "topk": 5, "own_positive_epochs": 4.0,
               "wait_for_full_queue": True},
    "optim": {"lr": 0.001, "warmup_epochs": 2.0},
    "augment": {"crop_area": [0.6, 1.0], "flip_p": 0.5, "jitter_p": 0.0, "gray_p": 0.0, "blur_p": 0.0,
                "cpu_8bit": False},
    "run": {"batch_size": 32, "progress": False, "log_every": 50, "device": "cpu"},
}
"""The quick study's training options (``coclr pretrain`` options shared by every stage), sized for a tiny S3D
on 32-px clips: its departures from the paper's recipe are in docs/synth.md, a sentence each. ``cache_mb`` keeps
each process's decoded frames in memory (the split is about 14 MiB per view; reads are the same either way);
``cpu_8bit`` false keeps the float augmentation its recorded results (docs/synth.md) were computed with."""
