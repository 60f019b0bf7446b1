"""Whether features can carry any information: a collapsed encoder gives every video (nearly) the same feature.

An encoder whose training collapsed (every video mapped to one point, or to one line) still yields a retrieval
R@1 and a linear-probe accuracy, and they can look like a real result. :func:`feature_health` measures the
spread of a set of features so that every evaluation record, the CLI and the report can say so.
"""

from __future__ import annotations

import numpy as np

MIN_RELATIVE_VARIANCE = 1e-6
"""Below this share of the features' mean squared norm, their variance across videos counts as none."""
MIN_EFFECTIVE_RANK = 1.1
"""Below this effective rank the features vary along one line only (1: every feature on one line through their
mean; what an encoder gives whose features all point the same way, pairwise cosine 1)."""
MAX_ROWS = 20_000
"""Larger sets are measured on this many rows drawn with a fixed seed (the measure is a property of the spread)."""


def feature_health(features: np.ndarray) -> dict[str, float | bool]:
    """``relative_variance`` (variance across videos / mean squared norm), ``effective_rank`` (the exponential of
    the entropy of the covariance's normalised eigenvalues, Roy and Vetterli 2007: 1 for features on one line, D
    for an isotropic spread) and ``degenerate`` (either below its threshold)."""
    x = np.asarray(features, dtype=np.float64)
    if len(x) > MAX_ROWS:
        x = x[np.random.default_rng(0).choice(len(x), MAX_ROWS, replace=False)]
    centered = x - x.mean(axis=0)
    spread = float((centered ** 2).sum(axis=1).mean())
    relative = spread / max(float((x ** 2).sum(axis=1).mean()), 1e-300)
    eigenvalues = np.clip(np.linalg.eigvalsh(centered.T @ centered), 0, None)
    total = eigenvalues.sum()
    if total > 0:
        share = eigenvalues[eigenvalues > 0] / total
        rank = float(np.exp(-(share * np.log(share)).sum()))
    else:
        rank = 0.0
    degenerate = relative < MIN_RELATIVE_VARIANCE or rank < MIN_EFFECTIVE_RANK
    return {"relative_variance": relative, "effective_rank": rank, "degenerate": bool(degenerate)}


def health_warnings(health: list[dict]) -> list[str]:
    """One line per stream whose train or test features are degenerate (``health``: per stream ``{"view",
    "checkpoint", "train", "test"}``)."""
    lines = []
    for stream in health:
        bad = [split for split in ("train", "test") if stream[split]["degenerate"]]
        if bad:
            measures = stream[bad[0]]
            lines.append(f"degenerate features from {stream['checkpoint']} ({stream['view']}, {' and '.join(bad)}): "
                         f"variance across videos {measures['relative_variance']:.2g} of their squared norm, "
                         f"effective rank {measures['effective_rank']:.2f}: the encoder collapsed; its numbers "
                         "are no evidence of a representation")
    return lines


def streams_health(streams, train: list, test: list) -> list[dict]:
    """:func:`feature_health` of each stream's train and test features (``VideoFeatures``), for a record."""
    return [{"view": stream.view, "checkpoint": str(stream.checkpoint), "train": feature_health(tr.features),
             "test": feature_health(te.features)} for stream, tr, te in zip(streams, train, test)]
