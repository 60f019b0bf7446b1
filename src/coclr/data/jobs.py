"""The engine of long store jobs: one job per entry of a view, in worker processes, resumable and atomic.

Building the RGB view (:mod:`coclr.data.build`), optical flow extraction (:mod:`coclr.data.flow.extract`) and the
synthetic dataset (:mod:`coclr.data.synth`) all run through :func:`run_entry_jobs`: a picklable
``job(key) -> (encoded_frames, fps)`` runs in a process pool, finished entries are written atomically, complete
ones skipped, failures counted, listed and recorded in the store (``failed_<view>.json``), so training and
evaluation can leave them out knowingly. One job at a time writes a view: a second one started on the same store
and view is refused while the first runs (the lock goes with the process, so a killed job leaves none behind).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

import cv2

from coclr.atomic import PARTIAL_SUFFIX
from coclr.data.store import ClipStore, check_view_name, record_failures, write_entry
from coclr.errors import DataError

EntryJob = Callable[[str], tuple[Sequence[bytes], float]]
"""A store job: entry key -> (encoded frames, frames per second). Must be picklable."""


@contextmanager
def view_lock(root: str | Path, view: str) -> Iterator[None]:
    """Hold the writing lock of ``view`` in the store at ``root`` (``.lock_<view>``, ``flock``), or raise
    :class:`DataError` naming the process that holds it. The kernel releases it when its process ends, so a job
    killed with SIGKILL leaves no stale lock. Where ``fcntl`` does not exist (Windows), no lock is taken."""
    if fcntl is None:
        yield
        return
    path = Path(root) / f".lock_{view}"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise DataError(f"{root}: view {view!r} is being written by another job ({holder}); wait for it to end "
                            "or stop it, then run this command again") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


@dataclass
class JobSummary:
    """What a store job did: entries written, skipped (already complete) and failed (key, message),
    frames written and wall-clock seconds."""

    view: str = ""
    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    frames: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    """Lines shown before the counts (e.g. how the store's index changed)."""

    def __str__(self) -> str:
        rate = self.frames / self.seconds if self.seconds > 0 else 0.0
        lines = [*self.notes, f"{self.view or 'entries'}: {self.done} done, {self.skipped} skipped (already "
                 f"complete), {len(self.failed)} failed; {self.frames} frames in {self.seconds:.1f} s ({rate:.1f} "
                 "frames/s)"]
        lines += [f"  failed: {key}: {message}" for key, message in self.failed]
        return "\n".join(lines)


def run_entry_jobs(root: str | Path, view: str, keys: Iterable[str], job: EntryJob, workers: int = 0,
                   desc: str | None = None, start_method: str | None = None) -> JobSummary:
    """Run ``job(key) -> (encoded_frames, fps)`` for every key whose entry of ``view`` is not complete yet,
    in a pool of ``workers`` processes (0: one per core; 1: in this process), writing each result
    atomically as soon as it is done.

    Resumable: a killed run leaves only complete entries (and stray temporary files, removed by the next
    run), and the next run skips them. A job that raises (e.g. :class:`VideoDecodeError`) or whose worker
    process dies is counted and listed in the summary and recorded in the store (:func:`record_failures`: the
    keys of this run lose their earlier failures); the run goes on. Shows a progress bar with ETA. Another job
    writing the same view of the same store is refused before any work (:func:`view_lock`).

    ``start_method`` is the multiprocessing start method of the pool. By default it is "fork" where the
    platform has it (workers start at once and work from any main program: scripts without a
    ``__main__`` guard, notebooks, stdin) unless CUDA is initialised in this process, which forked children
    cannot use: then "spawn" (the job must then be importable by the workers).
    """
    started = time.perf_counter()
    store = ClipStore(root)
    keys = list(dict.fromkeys(keys))
    store.check_keys(keys)
    check_view_name(view)
    try:
        pickle.dumps(job)
    except Exception as error:
        raise TypeError(f"the job must be picklable to run in worker processes: {error}") from None
    with view_lock(store.root, view):
        summary = _run_jobs(store, view, keys, job, workers, desc, start_method)
        record_failures(store.root, view, keys, summary.failed)
    summary.seconds = time.perf_counter() - started
    return summary


def _run_jobs(store: ClipStore, view: str, keys: list[str], job: EntryJob, workers: int, desc: str | None,
              start_method: str | None) -> JobSummary:
    root = str(store.root)
    summary = JobSummary(view)
    todo = [key for key in keys if not store.has(key, view)]
    summary.skipped = len(keys) - len(todo)
    remove_stale_partials(store.root / view)
    workers = workers if workers > 0 else (os.cpu_count() or 1)
    workers = max(1, min(workers, len(todo)))
    from tqdm import tqdm

    with tqdm(total=len(todo), desc=desc or f"{view} entries", unit="video", smoothing=0.05,
              dynamic_ncols=True) as progress:
        def record(key: str, frames: int, error: str | None) -> None:
            if error is None:
                summary.done += 1
                summary.frames += frames
            else:
                summary.failed.append((key, error))
                progress.set_postfix(failed=len(summary.failed), refresh=False)
            progress.update(1)

        if todo and workers == 1:
            for key in todo:
                record(*_run_and_write(root, view, key, job))
        elif todo:
            _run_in_pool(root, view, todo, job, workers, record, start_method or _default_start_method())
    return summary


def remove_stale_partials(folder: Path) -> int:
    """Delete temporary entry files under ``folder`` left by killed writers (whose process is gone)."""
    removed = 0
    if not folder.is_dir():
        return removed
    for directory, _, files in os.walk(folder):
        for name in files:
            if not name.endswith(PARTIAL_SUFFIX):
                continue
            pid = _writer_pid(name)
            if pid is not None and _process_alive(pid):
                continue
            Path(directory, name).unlink(missing_ok=True)
            removed += 1
    return removed


def _writer_pid(name: str) -> int | None:
    parts = name.split(".")
    for part in reversed(parts[:-2]):
        if part.isdigit():
            return int(part)
    return None


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_WORKER_JOB: EntryJob | None = None


def _init_worker(job: EntryJob, parent_pid: int) -> None:
    global _WORKER_JOB
    _WORKER_JOB = job
    cv2.setNumThreads(1)  # one process per core already; OpenCV's own threads would oversubscribe
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled once, by the parent, which stops the pool
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()


def _exit_when_orphaned(parent_pid: int) -> None:
    """Stop this worker soon after its parent is killed (a pool worker would otherwise wait forever)."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _run_in_worker(root: str, view: str, key: str) -> tuple[str, int, str | None]:
    assert _WORKER_JOB is not None
    return _run_and_write(root, view, key, _WORKER_JOB)


def _run_and_write(root: str, view: str, key: str, job: EntryJob) -> tuple[str, int, str | None]:
    """Run one job and write its entry; returns (key, frames written, error message or None)."""
    try:
        encoded, fps = job(key)
        write_entry(root, key, view, encoded, fps)
        return key, len(encoded), None
    except Exception as error:  # one bad entry must not stop a job over thousands of videos
        return key, 0, f"{type(error).__name__}: {error}"


def _default_start_method() -> str:
    if "fork" not in multiprocessing.get_all_start_methods():
        return "spawn"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "spawn"
    return "fork"


def _run_in_pool(root: str, view: str, todo: list[str], job: EntryJob, workers: int,
                 record: Callable[[str, int, str | None], None], start_method: str) -> None:
    """Run the keys in a process pool with at most 2 jobs per worker in flight, so results stream in order
    of completion and a worker that dies (crash, out of memory) costs only its in-flight keys: they are
    failed and a new pool takes the rest."""
    context = multiprocessing.get_context(start_method)
    pending = list(reversed(todo))
    while pending:
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                   initargs=(job, os.getpid()))
        in_flight: dict[Future, str] = {}
        broken = False
        try:
            while (pending and not broken) or in_flight:
                while pending and not broken and len(in_flight) < 2 * workers:
                    key = pending.pop()
                    try:
                        in_flight[pool.submit(_run_in_worker, root, view, key)] = key
                    except BrokenProcessPool:
                        broken = True
                        if in_flight:
                            pending.append(key)
                        else:
                            record(key, 0, "worker processes could not be started")
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in finished:
                    key = in_flight.pop(future)
                    try:
                        record(*future.result())
                    except BrokenProcessPool:
                        broken = True
                        record(key, 0, "worker process died (crash or out of memory) while running this entry")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
