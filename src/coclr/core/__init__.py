"""The contrastive core: one loss, four positive-set rules, the momentum queue and key encoder.

Pure tensor code, device-agnostic, knowing nothing of files or the command line. InfoNCE, UberNCE, CoCLR
and CMC share :func:`multi_positive_nce` and differ only in their positive rule; :data:`METHODS` defines each.
"""

from coclr.core.loss import logits_from, multi_positive_nce
from coclr.core.methods import CONTRASTIVE, METHODS, Method, find_method, method, positive_mask
from coclr.core.momentum import momentum_copy, momentum_update, shuffled_forward
from coclr.core.positives import (
    cross_view_instance_positives,
    cross_view_topk_positives,
    drop_own_positive,
    instance_positives,
    label_positives,
)
from coclr.core.queue import MomentumQueue

__all__ = [
    "CONTRASTIVE",
    "METHODS",
    "Method",
    "MomentumQueue",
    "cross_view_instance_positives",
    "cross_view_topk_positives",
    "drop_own_positive",
    "find_method",
    "instance_positives",
    "label_positives",
    "logits_from",
    "method",
    "momentum_copy",
    "momentum_update",
    "multi_positive_nce",
    "positive_mask",
    "shuffled_forward",
]
