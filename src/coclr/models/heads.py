"""Heads on the pooled backbone feature: the contrastive projection head and the linear classifier."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def unit_length(features: torch.Tensor) -> torch.Tensor:
    """Rows ``[B, D]`` L2-normalised (a zero row stays zero), as the authors' evaluation model gives each clip's
    pooled feature (``F.normalize``): computed in float64 after an exact power-of-two rescaling of each row, so that
    a row of tiny values (an untrained narrow network's features can be 1e-19) becomes a unit vector too, not a row
    under ``F.normalize``'s floor. Returned in ``features``' dtype."""
    rows = features.double()
    _, exponent = torch.frexp(rows.abs().amax(dim=1, keepdim=True))
    return F.normalize(torch.ldexp(rows, -exponent), dim=1).to(features.dtype)


class ProjectionHead(nn.Module):
    """MoCo/CoCLR projection head: Linear -> ReLU -> Linear, returning the un-normalised embedding.

    The authors implemented it as 1x1x1 convolutions on the pooled map (``encoder_q.2`` and ``.4``); these
    are the same maps written as ``fc1`` and ``fc2``.
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int = 128) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(hidden_dim, out_dim)
        self.in_dim, self.hidden_dim, self.out_dim = in_dim, hidden_dim, out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, in_dim]`` -> ``[B, out_dim]``."""
        return self.fc2(self.relu(self.fc1(x)))


class LinearClassifier(nn.Module):
    """Classifier on pooled features: optional L2 normalisation, optional BatchNorm1d, optional Dropout, then one
    Linear layer.

    Submodules mirror the authors' ``LinearClassifier`` so their checkpoints map key for key:
    ``final_bn`` (only with ``final_bn=True``) and ``final_fc`` = ``Sequential(Linear)`` when ``dropout == 0``
    (keys ``final_fc.0.*``) or ``Sequential(Dropout, Linear)`` otherwise (keys ``final_fc.1.*``); ``l2_norm`` (their
    ``use_l2_norm``) has no parameters. The linear probe uses ``l2_norm=True, final_bn=True`` (the authors set both
    for it, and neither otherwise); finetuning uses ``dropout=0.9``.
    """

    def __init__(self, in_dim: int, num_classes: int, final_bn: bool = False, dropout: float = 0.0,
                 l2_norm: bool = False) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.l2_norm = l2_norm
        self.final_bn = nn.BatchNorm1d(in_dim) if final_bn else None
        linear = nn.Linear(in_dim, num_classes)
        self.final_fc = nn.Sequential(nn.Dropout(dropout), linear) if dropout > 0 else nn.Sequential(linear)
        if self.final_bn is not None:
            nn.init.ones_(self.final_bn.weight)
            nn.init.zeros_(self.final_bn.bias)
        nn.init.normal_(linear.weight, mean=0.0, std=0.01)
        nn.init.zeros_(linear.bias)
        self.in_dim, self.num_classes, self.dropout = in_dim, num_classes, dropout

    @property
    def linear(self) -> nn.Linear:
        """The final Linear layer (last entry of ``final_fc``)."""
        return self.final_fc[-1]  # type: ignore[return-value]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Pooled features ``[B, in_dim]`` -> class logits ``[B, num_classes]``."""
        if self.l2_norm:
            features = unit_length(features)
        if self.final_bn is not None:
            features = self.final_bn(features)
        return self.final_fc(features)
