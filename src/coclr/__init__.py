"""coclr: self-supervised co-training for video representation learning (CoCLR, NeurIPS 2020).

The public entry points are re-exported here lazily, so that ``import coclr`` (and ``coclr --help``)
does not import torch:

- :func:`coclr.load_encoder` loads an S3D encoder from our checkpoints or the authors' released ones.
- :class:`coclr.Embedder` embeds video files (per-video and per-window vectors) with such an encoder.
"""

from __future__ import annotations

from typing import Any

from coclr.threads import short_socket_folder
from coclr.version import __version__

short_socket_folder()  # every use, the library's as the CLI's: a data loader's workers need sockets that fit

__all__ = ["__version__", "load_encoder", "S3D", "Embedder"]


def __getattr__(name: str) -> Any:
    """The public entry points, imported when first asked for (``import coclr`` does not import torch)."""
    if name == "load_encoder":
        from coclr.models.loading import load_encoder  # noqa: PLC0415 (lazy attribute)

        return load_encoder
    if name == "S3D":
        from coclr.models.s3d import S3D  # noqa: PLC0415 (lazy attribute)

        return S3D
    if name == "Embedder":
        from coclr.embed.embedder import Embedder  # noqa: PLC0415 (lazy attribute)

        return Embedder
    raise AttributeError(f"module 'coclr' has no attribute {name!r}")
