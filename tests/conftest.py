"""Shared test fixtures: paths to the real data in ../shared (skipped when absent) and small helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("COCLR_SHARED", REPO_ROOT.parent / "shared"))


def shared_path(*parts: str) -> Path:
    """A path under ../shared; the calling test is skipped when it does not exist."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared test data not available: {path}")
    return path


@pytest.fixture
def shared_clips() -> Path:
    """The folder of eight real action clips (../shared/data/clips)."""
    return shared_path("data", "clips")


@pytest.fixture
def middlebury() -> Path:
    """The Middlebury optical-flow pairs with ground truth (../shared/data/flow/middlebury)."""
    return shared_path("data", "flow", "middlebury")


@pytest.fixture
def fixtures_dir() -> Path:
    """The authors'-format checkpoint fixture and its expected outputs (../shared/fixtures)."""
    return shared_path("fixtures")


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: the tiny test networks gain nothing from more, and tests that start their own
    processes (gloo, kill-and-resume, the demo) would otherwise oversubscribe the 2-core CI machine, where
    spinning OpenMP threads make every op many times slower."""
    import torch

    torch.set_num_threads(1)
    yield


def make_random_store(root: Path, videos: int = 12, frames: int = 12, size: tuple[int, int] = (36, 40),
                      classes: int = 3, views: tuple[str, ...] = ("rgb", "flow"), test_videos: int = 0,
                      seed: int = 0) -> Path:
    """A small clip store of random frames (flow views get one frame fewer), for testing mechanics."""
    import numpy as np

    from coclr.data.indexes import VideoEntry, VideoIndex
    from coclr.data.jpeg import encode_jpeg
    from coclr.data.store import create_store, write_entry

    rng = np.random.default_rng(seed)
    entries = [VideoEntry(f"c{i % classes}/v{i:03d}", i % classes, "train" if i < videos else "test",
                          f"g{i // 2:03d}") for i in range(videos + test_videos)]
    create_store(root, VideoIndex("random", [f"class{c}" for c in range(classes)], entries))
    for entry in entries:
        for view in views:
            count = frames - 1 if view.startswith("flow") else frames
            pixels = rng.integers(0, 256, (count, *size, 3), dtype=np.uint8)
            write_entry(root, entry.path, view, [encode_jpeg(f) for f in pixels], fps=25.0)
    return root
