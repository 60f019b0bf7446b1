"""Training checkpoints: atomic writes, ``weights_only`` reads, and the RNG states of a process.

A checkpoint is a dict of tensors and plain values. Besides the full training state it carries, at the top
level, the trained encoder in the form :func:`coclr.load_encoder` reads (``format``, ``arch``, ``backbone``,
``head``), so every stage's checkpoint loads directly for evaluation.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coclr.errors import CheckpointError
from coclr.models.encoder import build_encoder
from coclr.models.loading import TRAIN_FORMAT, read_checkpoint_file, save_encoder


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read one of our training checkpoints (tensors only: :func:`~coclr.models.loading.read_checkpoint_file`)."""
    path = Path(path)
    data = read_checkpoint_file(path, map_location)
    if not isinstance(data, dict) or data.get("format") != TRAIN_FORMAT:
        raise CheckpointError(f"{path}: not a coclr training checkpoint (no format {TRAIN_FORMAT!r})")
    return data


def trained_views(checkpoint: dict[str, Any]) -> list[str]:
    """The views whose encoders a training checkpoint holds (two where both trained: CMC, simultaneous CoCLR)."""
    return list(checkpoint.get("encoders") or {})


def write_view_encoders(checkpoint: str | Path, files: Mapping[str, Path], meta: Mapping[str, Any]) -> None:
    """Write the encoder of each view in ``files`` that a training checkpoint holds as its own file, in
    :func:`~coclr.models.loading.save_encoder`'s form with ``meta``, the view and its clip settings: the only way
    to load a second view's encoder, since the checkpoint itself loads as its first view's."""
    encoders = load_checkpoint(checkpoint)["encoders"]
    for view, path in files.items():
        entry = encoders[view]
        encoder = build_encoder(**entry["arch"])
        encoder.backbone.load_state_dict(entry["backbone"])
        encoder.head.load_state_dict(entry["head"])
        save_encoder(path, encoder, meta={**meta, "view": view, "clip_settings": entry.get("clip_settings")})


def rng_state() -> dict[str, Any]:
    """RNG states of Python, NumPy and torch (CPU and CUDA), as tensors and plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
