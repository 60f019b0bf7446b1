"""Process settings of the libraries we call, for every entry point: OpenMP's wait policy, PyTorch's huge-page
allocations, a temporary folder multiprocessing's sockets fit in; OpenCV's pool size, and forking safely after
OpenCV's pool ran; and, for the processes that repeat one batch's work, glibc's malloc keeping freed memory.

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
the OpenMP policy. Where the same large arrays are made batch after batch (a training loader's worker, the
embedding's forwards), :func:`reuse_freed_memory` and :func:`freed_memory_reused` go further: the freed memory
stays in glibc's heap, its pages present, and is reused without any fault.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from coclr.errors import ConfigError

#: Environment settings of the OpenMP runtimes (GNU libgomp reads the first, Intel/LLVM libiomp the second).
OPENMP_POLICY = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
#: PyTorch's CPU allocator: transparent huge pages for allocations of 2 MiB and more (Linux; ignored elsewhere).
ALLOCATOR_POLICY = {"THP_MEM_ALLOC_ENABLE": "1"}
#: Everything :func:`apply_process_policy` sets.
PROCESS_POLICY = {**OPENMP_POLICY, **ALLOCATOR_POLICY}


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity where the OS keeps one (a container or ``taskset`` may give it
    fewer than the machine has), else the machine's count; at least 1. The one rule every default of workers and
    threads starts from."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


WORKERS_PER_CORE = 8
MOST_WORKERS_ANYWHERE = 64
"""The most worker processes an option may ask for: :data:`WORKERS_PER_CORE` per usable core, and this many on any
machine (a shipped config's 12 loader workers run under a one-core allocation too). Each is a process with its own
libraries and buffers on work that keeps a core busy: beyond that they only share the cores and fill memory (10,000
would start 10,000 processes)."""


def most_workers() -> int:
    """The most worker processes an option may ask for on this machine (:data:`WORKERS_PER_CORE`)."""
    return max(MOST_WORKERS_ANYWHERE, WORKERS_PER_CORE * usable_cores())


def check_workers(workers: int | None, key: str, zero: str = "work in this process") -> None:
    """Refuse, as ``ConfigError("key: ...")``, a count of worker processes no run should start: negative, or more
    than :func:`most_workers`. None (the default: one per core) and 0 (``zero`` says what it means: by default none,
    work in this process, as DataLoader's ``num_workers``) are fine. The one rule of every ``workers`` option."""
    if workers is None:
        return
    if workers < 0:
        raise ConfigError(f"{key}: must be 0 or more (0: {zero}), got {workers}")
    if workers > most_workers():
        raise ConfigError(f"{key}: {workers} worker processes on {usable_cores()} usable cores; at most "
                          f"{most_workers()} here ({WORKERS_PER_CORE} per core, {MOST_WORKERS_ANYWHERE} on any "
                          "machine)")


def apply_process_policy() -> bool:
    """Set :data:`PROCESS_POLICY` in the environment where not set; True if torch was not imported yet (so the
    settings take effect in this process; child processes inherit them either way). (Importing ``coclr`` gives
    multiprocessing a temporary folder its sockets fit in: :func:`short_socket_folder`.)"""
    for key, value in PROCESS_POLICY.items():
        os.environ.setdefault(key, value)
    return "torch" not in sys.modules


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
"""glibc's ``mallopt`` parameters (``malloc.h``) that :func:`reuse_freed_memory` sets."""
MALLOC_REUSE = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2 ** 31 - 1}
"""Large blocks from the heap, not from fresh mappings; the heap's top never trimmed."""
MALLOC_DEFAULTS = {M_TRIM_THRESHOLD: 128 * 1024, M_MMAP_MAX: 65536}
"""Their glibc defaults, put back when :func:`freed_memory_reused` ends."""


def _mallopt(settings: dict[int, int]) -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all([bool(mallopt(key, value)) for key, value in settings.items()])  # a list: every one is set


_REUSE_LOCK = threading.Lock()
_REUSE = {"for_life": False, "open": 0}
"""Whether :func:`reuse_freed_memory` set the policy for the process's life, and how many
:func:`freed_memory_reused` stretches are open: glibc's defaults come back only when neither holds."""


def reuse_freed_memory() -> bool:
    """From now on glibc's ``malloc`` keeps the memory freed in this process for its next allocations instead of
    handing it back to the system (:data:`MALLOC_REUSE`); True where that took effect (glibc; elsewhere nothing
    changes). For a process that repeats the same work, batch after batch, for all its life (a training loader's
    worker, :func:`coclr.train.trainer.train_loader_worker`); :func:`freed_memory_reused` for a stretch of one.

    Why: each batch allocates its large arrays afresh (decoded clips, augmented copies, a network's activations:
    tens to hundreds of MB); as fresh mappings every page of them faults and is zeroed again at its first touch,
    the same pages every batch. Kept in the heap they are reused as they are (the fused S3D's forward 1.36x,
    docs/embed.md; our training loader 1.17x, docs/training_speed.md). The values computed do not change; the process
    keeps its peak memory."""
    with _REUSE_LOCK:
        took = _mallopt(MALLOC_REUSE)
        _REUSE["for_life"] = _REUSE["for_life"] or took
        return took


@contextmanager
def freed_memory_reused() -> Iterator[bool]:
    """Within: :func:`reuse_freed_memory`'s policy; when the last open stretch ends (they nest, in any threads),
    glibc's defaults again (:data:`MALLOC_DEFAULTS`) and the kept memory handed back (``malloc_trim``), unless the
    process set the policy for its life. Yields whether it took effect. :func:`coclr.embed.run.embed_videos` runs
    within it on the CPU."""
    with _REUSE_LOCK:
        took = _mallopt(MALLOC_REUSE)
        _REUSE["open"] += took
    try:
        yield took
    finally:
        if took:
            with _REUSE_LOCK:
                _REUSE["open"] -= 1
                if not _REUSE["open"] and not _REUSE["for_life"]:
                    _mallopt(MALLOC_DEFAULTS)
                    ctypes.CDLL(None).malloc_trim(ctypes.c_size_t(0))


SOCKET_PATH_MAX = 107
"""The longest path of a Unix socket (``sun_path``: 108 bytes on Linux, the last a NUL)."""
SOCKET_NAMES = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
"""What multiprocessing adds to the temporary folder for a socket's path (its folder, then the socket)."""
SHORT_TEMP_FOLDERS = ("/tmp", "/var/tmp", "/usr/tmp")


def short_socket_folder() -> str | None:
    """Where ``TMPDIR`` is too long for a Unix socket path under it, multiprocessing's own temporary folder (its
    sockets) goes under the first writable system folder instead; returns that folder (None: nothing changed).

    A data loader's worker hands each batch's shared memory to the parent through such a socket. Python 3.11
    raises "AF_UNIX path too long" in the worker's queue thread, which drops the batch, and the parent waits for it
    for ever (python/cpython#132124; Python 3.14 falls back the same way)."""
    import tempfile  # noqa: PLC0415
    from multiprocessing import process, util  # noqa: PLC0415

    if os.name != "posix" or process.current_process()._config.get("tempdir") is not None:
        return None
    if len(tempfile.gettempdir()) + SOCKET_NAMES <= SOCKET_PATH_MAX:
        return None
    for base in SHORT_TEMP_FOLDERS:
        if len(base) + SOCKET_NAMES <= SOCKET_PATH_MAX and os.access(base, os.W_OK | os.X_OK):
            folder = tempfile.mkdtemp(prefix="pymp-", dir=base)
            import shutil  # noqa: PLC0415

            # removed at exit as multiprocessing removes its own (by this process only, not by forked children)
            util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
            process.current_process()._config["tempdir"] = folder
            return folder
    return None


@contextmanager
def _pool_threads(threads: int | None, pool: Callable[[], tuple[Callable[[], int], Callable[[int], None]]]
                  ) -> Iterator[None]:
    """Run a block with a library's thread pool set to ``threads`` (None: leave it alone); ``pool()`` imports the
    library (only when asked) and gives its getter and setter."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    get, put = pool()
    previous = get()
    put(threads)
    try:
        yield
    finally:
        put(previous)


def _opencv_pool() -> tuple[Callable[[], int], Callable[[int], None]]:
    import cv2  # noqa: PLC0415 (heavy: the CLI imports this module at start, before any command needs OpenCV)

    return cv2.getNumThreads, cv2.setNumThreads


def _torch_pool() -> tuple[Callable[[], int], Callable[[int], None]]:
    import torch  # noqa: PLC0415 (heavy: the CLI imports this module at start, before torch)

    return torch.get_num_threads, torch.set_num_threads


def opencv_threads(threads: int | None) -> AbstractContextManager[None]:
    """Run a block with OpenCV's thread pool set to ``threads`` (None: leave OpenCV's setting alone)."""
    return _pool_threads(threads, _opencv_pool)


def torch_threads(threads: int | None) -> AbstractContextManager[None]:
    """Run a block with PyTorch's intra-op threads set to ``threads`` (None: leave PyTorch's setting alone)."""
    return _pool_threads(threads, _torch_pool)


_SAVED = threading.local()


def _before_fork() -> None:
    cv2 = sys.modules.get("cv2")
    _SAVED.opencv_threads = cv2.getNumThreads() if cv2 is not None else 1
    if _SAVED.opencv_threads > 1:
        cv2.setNumThreads(1)  # OpenCV stops its pool threads, so the child inherits no half-owned pool


def _after_fork_in_parent() -> None:
    if getattr(_SAVED, "opencv_threads", 1) > 1:
        sys.modules["cv2"].setNumThreads(_SAVED.opencv_threads)


if hasattr(os, "register_at_fork"):
    # OpenCV's thread pool (pthreads) is not fork-safe: a child forked after the parent ran a parallel OpenCV call
    # inherits the pool's state without its threads, and its first cv2.setNumThreads waits for them forever
    # (measured: one fork in two to eight hung). Worker processes (store jobs, flow decoders, embed decoders, data
    # loaders) are forked, so every fork of this process parks the pool first and restores it after.
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


def worker_opencv_threads() -> None:
    """In a worker process: OpenCV on one thread (the workers are one per core already)."""
    import cv2  # noqa: PLC0415 (heavy: this module is imported when the CLI starts)

    cv2.setNumThreads(1)
