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
def _few_threads(monkeypatch):
    """Keep tests reproducible and polite on a 2-core CI machine."""
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    yield
