"""Shared test fixtures: paths to the real data in ../shared (skipped when absent) and small helpers."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from coclr.synth import random_store as make_random_store  # noqa: F401 (the tests' random store)

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



@pytest.fixture
def start_trainer():
    """``start_trainer(config)``: the :class:`~coclr.train.trainer.Trainer` of a started run
    (:func:`coclr.train.run.start_run`), its folder held until the test ends, for tests that look inside a run."""
    from contextlib import ExitStack

    from coclr.train.run import start_run

    with ExitStack() as stack:
        yield lambda config, restart=False: stack.enter_context(start_run(config, restart))


def _hold_lock(path: str, ready) -> None:
    import time

    from coclr.filelock import exclusive_lock

    with exclusive_lock(path):
        ready.set()
        time.sleep(600)


@contextmanager
def locked_by_another_process(path: Path):
    """A process that holds the lock file ``path`` (as a running job does) for the duration; on exit it is killed
    with SIGKILL, as ``kill -9`` would. Yields its pid."""
    import multiprocessing
    import signal

    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(target=_hold_lock, args=(str(path), ready))
    holder.start()
    try:
        assert ready.wait(30), "the lock holder did not start"
        yield holder.pid
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()


def view_locked_by_another_process(root: Path, view: str):
    """:func:`locked_by_another_process` on the writing lock of ``view`` in the store at ``root``."""
    return locked_by_another_process(Path(root) / f".lock_{view}")
