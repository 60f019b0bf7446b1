"""coclr: self-supervised co-training for video representation learning (CoCLR, NeurIPS 2020).

The public entry points are re-exported here lazily, so that ``import coclr`` (and ``coclr --help``)
does not import torch:

- :func:`coclr.load_encoder` loads an S3D encoder from our checkpoints or the authors' released ones.
- :class:`coclr.Embedder` embeds video files (per-video and per-window vectors) with such an encoder.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load_encoder": ("coclr.models.loading", "load_encoder"),
    "S3D": ("coclr.models.s3d", "S3D"),
    "Embedder": ("coclr.embed.embedder", "Embedder"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib  # noqa: PLC0415 (lazy attribute)

        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(module_name), attr)
    raise AttributeError(f"module 'coclr' has no attribute {name!r}")
