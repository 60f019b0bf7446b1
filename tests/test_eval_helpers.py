"""Builders shared by the evaluation and report tests: a tiny clip store and a tiny saved encoder.

Imported by the other ``test_eval_*`` / ``test_report*`` modules (pytest puts ``tests/`` on ``sys.path``);
the single test here checks the builders themselves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CLASS_COLOURS = ((220, 30, 30), (30, 200, 40), (40, 60, 230))
"""Dominant colour of each class's frames (so screenshots can be checked for thumbnail colours)."""


def make_tiny_store(root: Path, train_per_class: int = 4, test_per_class: int = 2, frames: int = 12,
                    height: int = 40, width: int = 48, views: tuple[str, ...] = ("rgb",), seed: int = 0) -> Path:
    """A store of three classes whose frames are the class colour plus a moving bright square and noise.

    Flow views (any name starting with ``flow``) get one frame fewer than RGB, as real flow does.
    """
    from coclr.store.clipstore import create_store, write_entry
    from coclr.store.jpeg import encode_jpeg
    from coclr.video.indexes import VideoEntry, VideoIndex

    rng = np.random.default_rng(seed)
    classes = ["red_class", "green_class", "blue_class"]
    entries = []
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for label in range(len(classes)):
            for clip in range(count):
                entries.append(VideoEntry(f"{classes[label]}/{split}_{clip:02d}.avi", label, split, f"g{clip:02d}"))
    index = VideoIndex("tiny", classes, entries)
    create_store(root, index)
    for entry in entries:
        base = np.array(CLASS_COLOURS[entry.label], dtype=np.float64)
        for view in views:
            count = frames - 1 if view.startswith("flow") else frames
            encoded = []
            for t in range(count):
                frame = base + rng.normal(0, 12, size=(height, width, 3))
                y, x = (3 * t + 5 * entry.label) % (height - 8), (2 * t) % (width - 8)
                frame[y : y + 8, x : x + 8] = 250
                encoded.append(encode_jpeg(np.clip(frame, 0, 255).astype(np.uint8)))
            write_entry(root, entry.path, view, encoded, fps=25.0)
    return root


def save_tiny_encoder(path: Path, seed: int = 0, width: float = 0.125, meta: dict | None = None) -> Path:
    """A randomly initialised width-``width`` encoder saved with :func:`save_encoder`."""
    import torch

    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    torch.manual_seed(seed)
    encoder = build_encoder(width=width)
    # Calibrate the BatchNorm statistics on random clips, so that features are well scaled (not ~0).
    for module in encoder.modules():
        if isinstance(module, torch.nn.BatchNorm3d):
            module.momentum = None
    encoder.train()
    with torch.no_grad():
        encoder.backbone(torch.randn(4, 3, 8, 32, 32))
    encoder.eval()
    return save_encoder(path, encoder, meta or {"method": "infonce", "view": "rgb"})


def test_tiny_store_and_encoder(tmp_path):
    from coclr import load_encoder
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", views=("rgb", "flow")))
    assert len(store.keys()) == 18
    key = store.keys()[0]
    assert store.num_frames(key, "rgb") == 12 and store.num_frames(key, "flow") == 11
    frame = store.read(key, "rgb", [0])[0]
    assert abs(float(frame[..., 0].mean()) - CLASS_COLOURS[0][0]) < 30
    backbone, head = load_encoder(save_tiny_encoder(tmp_path / "enc.pt"))
    assert backbone.out_channels == 128 and head is not None
