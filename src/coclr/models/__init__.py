"""Models: the S3D backbone, the projection head and linear classifier, the encoder, and checkpoint loading.

- :class:`S3D` (``width``, ``gating``): the backbone, 5-D feature map out, named as the authors' code.
- :class:`ProjectionHead`, :class:`LinearClassifier`: heads on the pooled feature.
- :class:`Encoder`, :func:`build_encoder`: backbone + pooling + head, L2-normalised embeddings.
- :func:`load_encoder`, :func:`load_classifier`, :func:`save_encoder`: our files and the authors' /
  torchvision's checkpoints, loaded strictly with ``torch.load(weights_only=True)``.
"""

from coclr.models.encoder import Encoder, build_encoder
from coclr.models.heads import LinearClassifier, ProjectionHead
from coclr.models.loading import load_classifier, load_encoder, save_encoder
from coclr.models.s3d import S3D, scaled_channels

__all__ = [
    "S3D",
    "scaled_channels",
    "ProjectionHead",
    "LinearClassifier",
    "Encoder",
    "build_encoder",
    "load_encoder",
    "load_classifier",
    "save_encoder",
]
