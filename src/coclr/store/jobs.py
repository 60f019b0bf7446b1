"""The engine of long store jobs: one job per entry of a view, in worker processes, resumable and atomic.

Building the RGB view (:mod:`coclr.store.build`), optical flow extraction (:mod:`coclr.store.flow_extract`) and the
synthetic dataset (:mod:`coclr.synth`) all run through :func:`run_entry_jobs`: a picklable
``job(key) -> (encoded_frames, fps)`` runs in a process pool, its entry is written atomically as its frames come
(a generator of frames is never held whole, so memory does not grow with a video's length), complete ones skipped
(unless the store lists them as failed or damaged: those are tried again), failures counted, listed and recorded
in the store (``failed_<view>.json``), so training and evaluation can leave them out knowingly. A full disk is
nobody's failure: the job stops at once (:class:`~coclr.store.clipstore.StorageFullError`). One job at a time
writes a view: a second one started on the same store and view is refused while the first runs (the lock goes
with the process, so a killed job leaves none behind). Interrupted (SIGINT, SIGTERM: :mod:`coclr.interrupts`), a
job stops its workers at once, discards what they were writing and says how many entries are done and kept.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from coclr.atomic import remove_stale_partials
from coclr.distributed import (
    all_gather_objects,
    held_by_main,
    is_distributed,
    rank,
    world_size,
)
from coclr.filelock import exclusive_lock
from coclr.interrupts import default_signals_in_worker, interrupted
from coclr.progress import bar as progress_bar
from coclr.runfolder import claim_folder
from coclr.store.clipstore import (
    STORE_FOLDER,
    ClipStore,
    IndexUpdate,
    StorageFullError,
    adopt_pending_notes,
    check_view_name,
    drop_pending_notes,
    record_failures,
    record_notes,
    recorded_meta,
    store_record,
    write_entry,
)
from coclr.text import shown
from coclr.threads import opencv_threads, usable_cores, worker_opencv_threads
from coclr.video.indexes import VideoIndex

EntryJob = Callable[[str], tuple[Iterable[bytes], float] | tuple[Iterable[bytes], float, dict[str, Any]]]
"""A store job: entry key -> (encoded frames, frames per second[, notes: what to record about the entry, e.g. its
damaged frames, in the store's ``notes_<view>.json``]). Must be picklable. The frames may be a generator that makes
them as they are written (:func:`~coclr.store.clipstore.write_entry` consumes it frame by frame), so a job over a
long video holds one frame at a time, not the whole video; an error it raises fails the entry. The notes may be
filled while the frames are made (what a decoder counts is known at the end)."""
RecordFn = Callable[..., None]
"""Called once per key as it ends: (key, frames written, error message or None[, notes or None])."""
EntryStream = Callable[[list[str], RecordFn], None]
"""Runs a list of keys (none of them complete): writes each entry with :func:`coclr.store.clipstore.write_entry` and
calls the :data:`RecordFn` once per key, in any order (for a pipeline that batches work across entries)."""
GROUP_TIMEOUT = timedelta(days=30)
"""How long the processes of a distributed store job wait for each other (at the end, for the slowest one)."""


@contextmanager
def view_lock(root: str | Path, view: str, holder: str | None = None) -> Iterator[None]:
    """Hold the writing lock of ``view`` in the store at ``root`` (``.lock_<view>``), or raise :class:`DataError`
    naming the process that holds it (``holder``, written into the lock file; by default this process)."""
    def busy(who: str) -> str:
        return (f"{root}: view {view!r} is being written by another job ({who}); wait for it to end or stop it, "
                "then run this command again")

    with exclusive_lock(Path(root) / f".lock_{view}", busy, holder):
        yield


@contextmanager
def job_view_lock(root: str | Path, view: str) -> Iterator[None]:
    """:func:`view_lock` for all processes of one job: in a distributed job (a ``torch.distributed`` group), rank 0
    takes the lock for every rank, the others wait until it has it (or raise the same error), and rank 0 keeps it
    until every rank has finished. A second job is refused as long as rank 0 lives.

    Across machines sharing a file system this is as good as its ``flock``: Linux NFS clients emulate ``flock``
    with POSIX locks, which NFSv4 (and NLM for v3) honour across clients; file systems mounted with node-local
    locks (Lustre ``localflock``) refuse a second job only on rank 0's machine.
    """
    holder = None
    if is_distributed():
        holder = f"pid {os.getpid()} on {socket.gethostname()}, rank 0 of a distributed job of {world_size()} processes"
    with held_by_main(lambda: _locked_and_swept(root, view, holder)):
        yield


@contextmanager
def _locked_and_swept(root: str | Path, view: str, holder: str | None) -> Iterator[None]:
    """:func:`view_lock`, then the temporary files of killed writers removed (:func:`remove_stale_partials`): by
    the process that holds the lock, before any rank of its job writes. A rank sweeping as it starts took a live
    writer on another machine for dead (its pid is not one of this machine's) and removed its entry half-written."""
    with view_lock(root, view, holder):
        remove_stale_partials(Path(root) / view)
        yield


@contextmanager
def writing_view(root: str | Path, view: str, index: VideoIndex, replace_index: bool = False,
                 also: Sequence[str] = (), command: str = STORE_FOLDER.command, **meta: Any) -> Iterator[IndexUpdate]:
    """Hold ``view`` of the store at ``root`` for a job that first creates or updates the store (its index and
    metadata, :func:`~coclr.store.clipstore.create_store`); yields what changed in the index. The store's claim is
    every folder's (:func:`~coclr.runfolder.claim_folder` with :func:`~coclr.store.clipstore.store_record`), so that
    a refused job writes nothing: the store's checks (reads only), the view's lock (:func:`job_view_lock`: a second
    job on the view is refused, one on another view goes on beside it), the checks again, then the update.
    ``also``: other views the job removes entries of, held too (a job writing one of them is refused); ``command``:
    the command as a refusal names it (``coclr data synth`` was named ``coclr data store``)."""
    updates: list[IndexUpdate] = []
    record = store_record(index, replace_index, updates.append, **meta)

    @contextmanager
    def locks() -> Iterator[None]:
        with ExitStack() as held:
            for name in (view, *also):
                held.enter_context(job_view_lock(root, name))
            yield

    rule = STORE_FOLDER if command == STORE_FOLDER.command else dataclasses.replace(STORE_FOLDER, command=command)
    with claim_folder(root, rule, recorded_meta(meta), record=record, lock=locks):
        # the view's folder now: a view stopped before its first entry is listed, as its recorded settings are (it
        (Path(root) / view).mkdir(exist_ok=True)  # was hidden from info and verify, yet refused other settings)
        yield updates[0]


@dataclass
class JobSummary:
    """What a store job did: entries written, skipped (already complete) and failed (key, message), frames
    written and wall-clock seconds; in a distributed job, those of process ``rank`` of ``world``, and the
    ``totals`` of all processes (done, skipped, failed, frames)."""

    view: str = ""
    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    noted: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What the jobs noted about the entries they wrote (``notes_<view>.json``): damaged frames kept, a turn."""
    attempted: list[str] = field(default_factory=list, repr=False)
    """The keys the job ran (done or failed), whose earlier notes it replaces."""
    frames: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    """Lines shown before the counts (e.g. how the store's index changed)."""
    rank: int = 0
    world: int = 1
    totals: tuple[int, int, int, int] | None = None

    def __str__(self) -> str:
        rate = self.frames / self.seconds if self.seconds > 0 else 0.0
        who = f"[rank {self.rank} of {self.world}] " if self.world > 1 else ""
        lines = [*self.notes, f"{who}{self.view or 'entries'}: {self.done} done, {self.skipped} skipped (already "
                 f"complete), {len(self.failed)} failed; {self.frames} frames in {self.seconds:.1f} s ({rate:.1f} "
                 "frames/s)"]
        lines += [f"  failed: {key}: {message}" for key, message in self.failed]
        lines += [f"  damaged: {key}: {note['damaged_frames']} damaged frames (reported corrupt, predicted from one, "
                  "or lost at the damage), within its tolerance: stored, noted in notes_<view>.json"
                  for key, note in self.noted.items() if note.get("damaged_frames")]
        if self.totals is not None and self.rank == 0:
            done, skipped, failed, frames = self.totals
            lines.append(f"all {self.world} processes: {done} done, {skipped} skipped, {failed} failed; {frames} "
                         "frames")
        return "\n".join(map(shown, lines))


def shard(keys: Sequence[str]) -> list[str]:
    """This process's share of ``keys`` in a distributed job: every ``world_size``-th key from its rank on, so each
    key goes to exactly one process whatever is already done; all keys in one process."""
    return list(keys[rank()::world_size()])


def run_entry_jobs(root: str | Path, view: str, keys: Iterable[str], job: EntryJob, workers: int | None = None,
                   desc: str | None = None, start_method: str | None = None,
                   weight: Callable[[str], int] | None = None) -> JobSummary:
    """Run ``job(key) -> (encoded_frames, fps)`` for every key whose entry of ``view`` is not complete yet,
    in a pool of ``workers`` processes (None: one per core; 0, as DataLoader's ``num_workers``, or 1: in this
    process), writing each result atomically as soon as it is done.

    Resumable: a killed run leaves only complete entries (and stray temporary files, removed by the next
    run), and the next run skips them. A job that raises (e.g. :class:`VideoDecodeError`) or whose worker
    process dies is counted and listed in the summary and recorded in the store (:func:`record_failures`: the
    keys of this run lose their earlier failures); the run goes on. Shows a progress bar with ETA. Another job
    writing the same view of the same store is refused before any work (:func:`job_view_lock`). In a
    distributed job (a ``torch.distributed`` group, e.g. under torchrun) each process runs its :func:`shard`.

    ``start_method`` is the multiprocessing start method of the pool. By default it is "fork" where the
    platform has it (workers start at once and work from any main program: scripts without a
    ``__main__`` guard, notebooks, stdin) unless CUDA is initialised in this process, which forked children
    cannot use: then "spawn" (the job must then be importable by the workers).
    """
    try:
        pickle.dumps(job)
    except Exception as error:
        raise TypeError(f"the job must be picklable to run in worker processes: {error}") from None

    def stream(todo: list[str], record: RecordFn) -> None:
        count = max(1, min(usable_cores() if workers is None else workers, len(todo)))
        if count == 1:
            for key in todo:
                record(*_run_and_write(str(root), view, key, job))
        else:
            _run_in_pool(str(root), view, todo, job, count, record, start_method or default_start_method())

    return run_entry_stream(root, view, keys, stream, desc, weight)


def run_entry_stream(root: str | Path, view: str, keys: Iterable[str], stream: EntryStream,
                     desc: str | None = None, weight: Callable[[str], int] | None = None) -> JobSummary:
    """:func:`run_entry_jobs` with the work done by ``stream(todo, record)`` (:data:`EntryStream`), for jobs that
    are not one call per key: the same checks, sharding, lock, skipping of complete entries, progress bar (on
    rank 0), failure records and summary. ``weight(key)``: the frames of a key's work where they are known before
    it (a flow job's: its rgb entry's), so that the bar and its ETA count frames, not videos of any length."""
    started = time.perf_counter()
    store = ClipStore(root)
    keys = list(dict.fromkeys(keys))
    store.check_keys(keys)
    check_view_name(view)
    keys = shard(keys)
    with job_view_lock(store.root, view):
        summary = JobSummary(view)
        summary.noted.update(adopt_pending_notes(store, view, keys))  # (of a job killed before it recorded them)
        try:
            _run_stream(store, view, keys, stream, desc, summary, weight)
        except BaseException:  # interrupted, or stopped: what the entries written noted is kept all the same (a video
            with suppress(OSError, StorageFullError):  # changed later is then told), and what failed
                record_failures(store.root, view, summary.attempted, summary.failed)
                record_notes(store.root, view, summary.attempted, summary.noted)
                drop_pending_notes(store, view, summary.attempted)
            raise
        record_failures(store.root, view, keys, summary.failed)
        record_notes(store.root, view, summary.attempted, summary.noted)
        drop_pending_notes(store, view, summary.attempted)
        summary.rank, summary.world = rank(), world_size()
        if summary.world > 1:
            counts = all_gather_objects((summary.done, summary.skipped, len(summary.failed), summary.frames))
            summary.totals = tuple(sum(column) for column in zip(*counts))
    summary.seconds = time.perf_counter() - started
    return summary


def _run_stream(store: ClipStore, view: str, keys: list[str], stream: EntryStream, desc: str | None,
                summary: JobSummary, weight: Callable[[str], int] | None = None) -> JobSummary:
    listed = store.failed(view)  # failed or damaged: tried again (a damaged entry's file exists)
    todo = [key for key in keys if key in listed or not store.has(key, view)]
    summary.skipped = len(keys) - len(todo)
    weights = {key: _weight_of(weight, key) for key in todo} if weight is not None else None

    with progress_bar(total=sum(weights.values()) if weights is not None else len(todo),
                      desc=desc or f"{view} entries", unit="frame" if weights is not None else "video",
                      smoothing=0.05, dynamic_ncols=True, disable=rank() != 0) as progress:
        done: set[str] = set()

        def record(key: str, frames: int, error: str | None, notes: dict[str, Any] | None = None) -> None:
            summary.attempted.append(key)
            if notes:
                summary.noted[key] = notes
            if error is None:
                done.add(key)
                summary.done += 1
                summary.frames += frames
            else:
                summary.failed.append((key, error))
            told = {"videos": f"{len(summary.attempted)}/{len(todo)}"} if weights is not None else {}
            if summary.failed:
                told["failed"] = len(summary.failed)
            if told:
                progress.set_postfix(told, refresh=False)
            progress.update(weights[key] if weights is not None else 1)

        if todo:
            try:
                stream(todo, record)
            except StorageFullError as error:  # stop at once: the entries left would fail the same way
                raise error.with_remaining(len(todo) - summary.done - len(summary.failed)) from None
            except KeyboardInterrupt as error:  # the stream stopped its workers; what they were writing goes
                if not is_distributed():  # (a rank cannot tell another machine's live writers: the next job sweeps)
                    remove_stale_partials(store.root / view)
                # kept: those recorded, and those written whose result had not come back (not those listed before)
                written = {key for key in todo if key not in listed and store.has(key, view)}
                raise interrupted(error, f"{view}: {summary.skipped + len(done | written)} of {len(keys)} videos done "
                                  "and kept") from None
    return summary


def _weight_of(weight: Callable[[str], int], key: str) -> int:
    """``weight(key)``, at least 1; 1 where it cannot be told (a damaged entry: the job's own failure says why)."""
    try:
        return max(1, int(weight(key)))
    except Exception:  # noqa: BLE001 (the key's work reports it)
        return 1


_WORKER_JOB: EntryJob | None = None


def init_worker(job: EntryJob | None, parent_pid: int) -> None:
    """Initialiser of a pool worker process: the job it runs (:func:`_run_in_worker`), one OpenCV thread, Ctrl-C
    left to the parent (which stops the pool: :func:`stop_pool`), SIGTERM's default (an exit), and an exit soon after
    the parent (``parent_pid``) is gone."""
    global _WORKER_JOB
    _WORKER_JOB = job
    worker_opencv_threads()  # one process per core already; OpenCV's own threads would oversubscribe
    default_signals_in_worker()
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()


def _exit_when_orphaned(parent_pid: int) -> None:
    """Stop this worker soon after its parent is killed (a pool worker would otherwise wait forever)."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _run_in_worker(root: str, view: str, key: str) -> tuple[str, int, str | None, dict[str, Any] | None]:
    assert _WORKER_JOB is not None
    return _run_and_write(root, view, key, _WORKER_JOB)


def _run_and_write(root: str, view: str, key: str,
                   job: EntryJob) -> tuple[str, int, str | None, dict[str, Any] | None]:
    """Run one job and write its entry; returns (key, frames written, error message or None, notes or None)."""
    try:
        encoded, fps, *notes = job(key)
        noted = notes[0] if notes else None  # (complete once the frames are made, before the entry is put in place)
        frames = write_entry(root, key, view, encoded, fps, noted)
        return key, frames, None, noted or None
    except StorageFullError:  # the storage's fault, not the entry's: the job stops (no video is blamed)
        raise
    except Exception as error:  # one bad entry must not stop a job over thousands of videos
        return key, 0, f"{type(error).__name__}: {error}", None


def default_start_method() -> str:
    if "fork" not in multiprocessing.get_all_start_methods():
        return "spawn"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "spawn"
    return "fork"


def _run_in_pool(root: str, view: str, todo: list[str], job: EntryJob, workers: int,
                 record: Callable[[str, int, str | None], None], start_method: str) -> None:
    """Run the keys in a process pool with at most 2 jobs per worker in flight, so results stream in order
    of completion; a worker that dies (crash, out of memory) breaks the pool, a new pool takes the rest, and each
    key that was in flight is run again alone (:func:`_run_pools`)."""
    with opencv_threads(1):  # a forked worker would hang stopping the threads of an OpenCV pool running here
        _run_pools(root, view, todo, job, workers, record, multiprocessing.get_context(start_method))


WORKER_DIED = "worker process died (crash or out of memory) while running this entry, alone in its pool"
"""The failure of an entry whose worker died with it and died again when it ran alone."""


def _run_pools(root: str, view: str, todo: list[str], job: EntryJob, workers: int,
               record: Callable[[str, int, str | None], None], context: multiprocessing.context.BaseContext) -> None:
    """Pools until every key is recorded. The keys in flight when a worker died (up to 2 per worker: the one that
    killed it, and others queued or running beside it) are run again one at a time, in a pool of one worker: only a
    key whose own worker dies again fails (they all failed, with the same reason, where one video was at fault), and
    a new such pool takes the suspects left."""
    pending = list(reversed(todo))
    suspects: list[str] = []
    while pending or suspects:
        if suspects:
            for key in _one_pool(root, view, suspects, job, 1, record, context, per_worker=1):
                record(key, 0, WORKER_DIED)
        else:
            suspects.extend(reversed(_one_pool(root, view, pending, job, workers, record, context)))


def _one_pool(root: str, view: str, queue: list[str], job: EntryJob, workers: int,
              record: Callable[[str, int, str | None], None], context: multiprocessing.context.BaseContext,
              per_worker: int = 2) -> list[str]:
    """Run the keys popped from ``queue`` in one pool, at most ``per_worker`` in flight per worker, until it is empty
    or a worker dies; returns the keys that were in flight when it died (not recorded)."""
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=init_worker, initargs=(job, os.getpid()))
    in_flight: dict[Future, str] = {}
    broken = False
    died: list[str] = []
    try:
        while (queue and not broken) or in_flight:
            while queue and not broken and len(in_flight) < per_worker * workers:
                key = queue.pop()
                try:
                    in_flight[pool.submit(_run_in_worker, root, view, key)] = key
                except BrokenProcessPool:
                    broken = True
                    if in_flight:
                        queue.append(key)
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
                    died.append(key)
        pool.shutdown(wait=True)
    except BaseException:
        stop_pool(pool)
        raise
    return died


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop a process pool now (on an interruption or an error): its queued tasks cancelled, its workers killed and
    reaped. What they were doing is discarded: each write is atomic, and the temporary files of the writers killed
    are removed by :func:`remove_stale_partials`. Waiting for the tasks in flight instead could take minutes (a
    long video's flow)."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):  # Python < 3.14: no terminate_workers
        process.kill()
    pool.shutdown(wait=True, cancel_futures=True)  # the pool, broken, reaps every worker (so none is a zombie that
    # remove_stale_partials would take for a live writer) before its manager thread ends
