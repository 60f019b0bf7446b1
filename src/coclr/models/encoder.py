"""The contrastive encoder: S3D backbone -> global average pool -> projection head -> L2 normalisation."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from coclr.models.heads import ProjectionHead
from coclr.models.s3d import S3D


class Encoder(nn.Module):
    """Backbone plus projection head, as ``encoder_q`` in the authors' code.

    ``features`` gives the pooled backbone feature used by evaluation (retrieval, probes); ``forward`` the
    L2-normalised embedding used by the contrastive losses.

    Attributes:
        backbone: the :class:`S3D` network (5-D map out).
        head: the :class:`ProjectionHead` on the pooled feature, or None for a features-only encoder.
    """

    def __init__(self, backbone: S3D, head: ProjectionHead | None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    @property
    def arch(self) -> dict[str, Any]:
        """Plain dict from which :func:`build_encoder` rebuilds this architecture (stored in checkpoints)."""
        return {
            "width": self.backbone.width,
            "gating": self.backbone.gating,
            "embed_dim": None if self.head is None else self.head.out_dim,
            "bn_eps": self.backbone.bn_eps,
        }

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Clips ``[B, 3, T, H, W]`` -> pooled backbone features ``[B, D]`` (mean over time and space)."""
        return self.backbone(x).mean(dim=(2, 3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Clips ``[B, 3, T, H, W]`` -> L2-normalised embeddings ``[B, embed_dim]``."""
        if self.head is None:
            raise RuntimeError("this Encoder has no projection head; use .features(x) for pooled features")
        return F.normalize(self.head(self.features(x)), dim=1)


def build_encoder(
    width: float = 1.0, gating: bool = False, embed_dim: int | None = 128, bn_eps: float = 1e-5
) -> Encoder:
    """A freshly initialised :class:`Encoder`: S3D at ``width`` and an FC-D -> ReLU -> FC-``embed_dim`` head.

    The head's hidden size equals the backbone's output channels (FC-1024 at width 1, as in the paper).
    ``embed_dim=None`` builds a features-only encoder (no head). ``build_encoder(**encoder.arch)`` rebuilds
    the same architecture.
    """
    backbone = S3D(width=width, gating=gating, bn_eps=bn_eps)
    dim = backbone.out_channels
    head = None if embed_dim is None else ProjectionHead(dim, dim, embed_dim)
    return Encoder(backbone, head)
