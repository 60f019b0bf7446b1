"""Thread pools of the libraries we call: OpenMP's wait policy for every entry point, OpenCV's pool size.

OpenMP threads that finish a parallel region spin, by default, for a while before sleeping. When another
process keeps a core busy, a spinning thread steals the core that the thread holding the rest of the work
needs, and 2 threads run slower than 1 (measured: TV-L1 on 2 threads 4x slower than on 1 while another
process spins on one core, ``docs/performance.md``). With a passive wait policy an idle OpenMP thread sleeps
at once, so a second thread can only help. OpenMP reads the policy once, when the runtime is loaded (on
``import torch``), so :func:`apply_openmp_policy` must run before torch is imported: ``coclr.cli`` calls it
when it is imported (the ``coclr`` script, ``python -m coclr`` and ``torchrun -m coclr`` all import it
first) and the benchmarks call it at their top. A value the user has set is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: Environment settings of the OpenMP runtimes (GNU libgomp reads the first, Intel/LLVM libiomp the second).
OPENMP_POLICY = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}


def apply_openmp_policy() -> bool:
    """Set :data:`OPENMP_POLICY` in the environment where not set; True if torch was not imported yet (so the
    setting takes effect in this process; child processes inherit it either way)."""
    for key, value in OPENMP_POLICY.items():
        os.environ.setdefault(key, value)
    return "torch" not in sys.modules


@contextmanager
def opencv_threads(threads: int | None) -> Iterator[None]:
    """Run a block with OpenCV's thread pool set to ``threads`` (None: leave OpenCV's setting alone)."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    import cv2  # noqa: PLC0415 (heavy: the CLI imports this module at start, before any command needs OpenCV)

    previous = cv2.getNumThreads()
    cv2.setNumThreads(threads)
    try:
        yield
    finally:
        cv2.setNumThreads(previous)
