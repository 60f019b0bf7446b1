"""Process settings of the libraries we call, for every entry point: OpenMP's wait policy, PyTorch's huge-page
allocations; and OpenCV's pool size.

OpenMP threads that finish a parallel region spin, by default, for a while before sleeping. When another
process keeps a core busy, a spinning thread steals the core that the thread holding the rest of the work
needs, and 2 threads run slower than 1 (measured: TV-L1 on 2 threads 4x slower than on 1 while another
process spins on one core, ``docs/performance.md``). With a passive wait policy an idle OpenMP thread sleeps
at once, so a second thread can only help. OpenMP reads the policy once, when the runtime is loaded (on
``import torch``), so :func:`apply_process_policy` must run before torch is imported: ``coclr.cli`` calls it
when it is imported (the ``coclr`` script, ``python -m coclr`` and ``torchrun -m coclr`` all import it
first); ``benchmarks/compare.py`` gives both sides' workers the same settings. A value the user has set is kept.

Large CPU tensors (a batch of clips is 50-100 MB) are fresh memory mappings each time: the first touch of each
4 KiB page faults and zeroes it, a sizeable part of writing a normalised batch. With ``THP_MEM_ALLOC_ENABLE``
PyTorch's CPU allocator asks for transparent huge pages (``madvise``) on allocations of 2 MiB and more, 512 times
fewer faults (measured: docs/performance.md). PyTorch reads it once, at its first allocation, so it is set with
the OpenMP policy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: Environment settings of the OpenMP runtimes (GNU libgomp reads the first, Intel/LLVM libiomp the second).
OPENMP_POLICY = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
#: PyTorch's CPU allocator: transparent huge pages for allocations of 2 MiB and more (Linux; ignored elsewhere).
ALLOCATOR_POLICY = {"THP_MEM_ALLOC_ENABLE": "1"}
#: Everything :func:`apply_process_policy` sets.
PROCESS_POLICY = {**OPENMP_POLICY, **ALLOCATOR_POLICY}


def apply_process_policy() -> bool:
    """Set :data:`PROCESS_POLICY` in the environment where not set; True if torch was not imported yet (so the
    settings take effect in this process; child processes inherit them either way)."""
    for key, value in PROCESS_POLICY.items():
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
