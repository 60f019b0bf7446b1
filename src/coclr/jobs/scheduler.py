"""Running jobs (a study's, learn's): each task (:mod:`coclr.jobs.tasks`) in a child process once the jobs it needs
are done, a few at a time.

Every job gets its share of the CPU threads, but a job whose result depends on its thread count (training,
finetuning on a CPU), which gets the count its caller fixes (and, with GPUs, one GPU each, in turn); its task, and
that fixed count, are recorded in ``OUT/logs/<name>.task.json``, which the child reads (``coclr task RECORD``: run it
by hand to retry one job, on the same threads), and
its output goes to ``OUT/logs/<name>.log``. A progress bar counts the training epochs of all of them, with an ETA.
A job that fails stops the jobs that need it; the others run on; then the failures are raised together with the end
of each one's log. Running the study again continues every job where it stopped (each task is resumable). When the
study stops early (interrupted, SIGTERM, an error of its own), it stops its running jobs first, so that none goes on
writing, and holding its folder, behind its back.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coclr.atomic import atomic_write_json
from coclr.errors import EXIT_SOME_FAILED, CoclrError
from coclr.interrupts import check_interrupt, deferred_interrupts, die_with_parent, interrupted, signals_interrupt
from coclr.jobs.tasks import EPOCHS_DONE, THREADS_KEY, Task, check_records
from coclr.progress import bar as progress_bar
from coclr.threads import usable_cores


@dataclass
class Job:
    """One job: its ``task`` (:class:`coclr.jobs.tasks.Task`), run in a child process once the jobs named in
    ``deps`` are done. ``runs``: the run folders whose training logs count its epochs (progress)."""

    name: str
    task: Task
    deps: tuple[str, ...] = ()
    epochs: int = 0
    runs: tuple[Path, ...] = ()


def threads_per_job(processes: int) -> int:
    """Intra-op threads of a job whose result does not depend on them (:attr:`Task.thread_bound` false): the
    machine's cores shared among the jobs that run at once."""
    return max(1, usable_cores() // processes)


@dataclass
class _Running:
    job: Job
    process: subprocess.Popen
    slot: int
    log: Path = field(repr=False, default=Path())
    writes: frozenset[Path] = frozenset()


def _claimed_folders(task: Task) -> frozenset[Path]:
    """The folders ``task`` will claim (:meth:`Task.writes`), resolved. A task whose inputs cannot tell them (a
    checkpoint that does not read) claims none here: it fails on its own, with its own message, when it runs."""
    try:
        return frozenset(Path(folder).resolve() for folder in task.writes())
    except Exception:  # noqa: BLE001 (the task's own run reports it)
        return frozenset()


_TOLD = re.compile(rf'^\{{"{EPOCHS_DONE}": (\d+)\}}$', re.MULTILINE)


def _epochs_done(job: Job, finished: bool, logs: Path) -> int:
    """Training epochs a job has logged (all of them once it finished): in its runs' ``log.jsonl``, and in its own
    log where its task tells them (:attr:`~coclr.jobs.tasks.Task.tells_epochs`: finetuning), the last it told."""
    if finished:
        return job.epochs
    done = 0
    for run in job.runs:
        log = run / "log.jsonl"
        if log.is_file():
            done += sum('"epoch_loss"' in line for line in log.read_text().splitlines())
    own = logs / f"{job.name}.log"
    if job.task.tells_epochs and own.is_file():  # (the last told: a run started over tells from 1 again)
        told = _TOLD.findall(own.read_text(errors="replace"))
        done += int(told[-1]) if told else 0
    return min(done, job.epochs)


def wait_for_an_exit(processes: Sequence[subprocess.Popen], seconds: float, step: float = 0.05) -> None:
    """Sleep up to ``seconds``, returning as soon as one of ``processes`` has exited: a job that needs it starts
    at once, and the progress is read once per ``seconds`` only. Where a signal is deferred
    (:func:`~coclr.interrupts.deferred_interrupts`), this is where it stops the loop: between polls."""
    deadline = time.monotonic() + seconds
    while True:
        check_interrupt()
        if any(process.poll() is not None for process in processes):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(step, left))


STOP_SECONDS = 30.0
"""How long a stopped job may take to exit after SIGTERM before it is killed."""
COMMAND = (sys.executable, "-m", "coclr", "task")
"""What runs a job's task: ``COMMAND + [RECORD]`` (``coclr task``), the file of the task's record."""


def stop_processes(processes: Sequence[subprocess.Popen], grace: float = STOP_SECONDS) -> None:
    """SIGTERM to every process still running, then SIGKILL to those still running after ``grace`` seconds."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_task(task: Task, name: str, logs: Path, env: Mapping[str, str],
               command: Sequence[str] = COMMAND, threads: int | None = None) -> tuple[subprocess.Popen, Path]:
    """Start ``task`` in a child process (``COMMAND + [RECORD]``) that dies with this one: the one way a job of coclr
    starts one. Its record goes to ``logs/<name>.task.json`` (with ``threads``, the count its result depends on,
    where one is fixed: :data:`~coclr.jobs.tasks.THREADS_KEY`), its output (appended) to ``logs/<name>.log``, which is
    returned with the process."""
    record = check_records([(name, task)])[name]
    record_file = logs / f"{name}.task.json"
    atomic_write_json(record_file, record if threads is None else {**record, THREADS_KEY: threads})
    log = logs / f"{name}.log"
    with log.open("a") as handle:
        handle.write(f"{RUN_MARK} {time.strftime('%Y-%m-%d %H:%M:%S')}\n")  # (a failure shows this run's lines)
        handle.flush()
        process = subprocess.Popen([*command, str(record_file)], stdout=handle, stderr=subprocess.STDOUT,
                                   env=dict(env), preexec_fn=die_with_parent)
    return process, log


RUN_MARK = "=== coclr job started"
"""The line :func:`start_task` writes into a job's log before each run (the log is appended to)."""


def log_tail(log: Path, lines: int = 15) -> str:
    """The last ``lines`` of a job's log since its last run started (what a failure shows: an earlier run's
    lines above it read as this run's)."""
    if not log.is_file():
        return ""
    text = log.read_text(errors="replace").splitlines()
    starts = [number for number, line in enumerate(text) if line.startswith(RUN_MARK)]
    return "\n".join(text[(starts[-1] + 1) if starts else 0:][-lines:])


def how_it_ended(returncode: int) -> str:
    """A child's end as a person reads it: the signal that killed it (SIGKILL: the out-of-memory killer's way), or
    its exit status."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}" + (" (out of memory?)" if -returncode == signal.SIGKILL else "")


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them: its list where it is set (a job's GPU
    ``i`` is the ``i``-th of them, never a GPU the user left out), else every GPU torch sees, by index."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [name.strip() for name in given.split(",") if name.strip()]
    import torch  # noqa: PLC0415 (heavy)

    return [str(index) for index in range(torch.cuda.device_count())]


def running_text(running: Sequence[Job]) -> str:
    """The jobs under way as the progress bar names them; a job of no epochs (flow: its videos, not epochs) is said
    to be outside the count and the ETA (the bar stood at 100%, nothing left, while the test split's flow ran)."""
    return ", ".join(job.name if job.epochs else f"{job.name} (not in the count or the ETA)" for job in running)


def run_jobs(jobs: list[Job], out: Path, processes: int, gpus: list[int] | None = None,
             desc: str = "study", poll_seconds: float = 1.0, command: Sequence[str] = COMMAND,
             threads: int | None = None) -> list[str]:
    """Run ``jobs`` (in priority order), each task in a child process (:func:`start_task`), at most ``processes`` at
    once (a task whose result depends on its thread count, :attr:`~coclr.jobs.tasks.Task.thread_bound`, on
    ``threads`` of them whatever ``processes`` is; the others, and every task with ``threads`` None, on their share
    of the cores, :func:`threads_per_job`),
    each after the jobs named in its ``deps`` and never beside one that claims the same folder
    (:meth:`~coclr.jobs.tasks.Task.writes`); raises :class:`CoclrError` naming every failed job (and those
    it stopped) once the others are done. Every task is checked to reach its process as it is before any starts.
    Stopped early (Ctrl-C, SIGTERM, an error), it stops the jobs still running before it returns. Returns the jobs
    that went through their inputs with some failed (a store's or flow job's exit status 3, each input listed in its
    log): done, so the jobs after them run on the inputs that worked, where one bad video stopped a whole study."""

    check_records([(job.name, job.task) for job in jobs])
    share = threads_per_job(processes)
    pending = list(jobs)
    running: list[_Running] = []
    done: set[str] = set()
    failed: list[tuple[Job, Path, str]] = []
    partly: list[str] = []
    blocked: list[Job] = []
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def start(job: Job, slot: int, writes: frozenset[Path]) -> _Running:
        fixed = threads if job.task.thread_bound else None
        count = fixed if fixed is not None else share
        env = {**os.environ, "OMP_NUM_THREADS": str(count), "MKL_NUM_THREADS": str(count)}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus()[gpus[slot % len(gpus)]]
        process, log = start_task(job.task, job.name, logs, env, command, fixed)
        return _Running(job, process, slot, log, writes)

    claims: dict[str, frozenset[Path]] = {}  # a job's folders, read once its inputs are done (they stay as read)

    total = sum(job.epochs for job in jobs)
    earlier = sum(_epochs_done(job, False, logs) for job in jobs)  # (a resumed run's: not this run's time)
    try:
        with signals_interrupt(), deferred_interrupts(), \
                progress_bar(total=total, initial=earlier, desc=desc, unit="epoch", dynamic_ncols=True) as bar:
            while pending or running:
                for item in list(running):
                    if item.process.poll() is None:
                        continue
                    running.remove(item)
                    if item.process.returncode in (0, EXIT_SOME_FAILED):
                        done.add(item.job.name)
                        if item.process.returncode:
                            partly.append(item.job.name)
                    else:
                        failed.append((item.job, item.log, how_it_ended(item.process.returncode)))
                stopped = {job.name for job, _, _ in failed} | {job.name for job in blocked}
                for job in list(pending):
                    if stopped & set(job.deps):
                        pending.remove(job)
                        blocked.append(job)
                free = [slot for slot in range(processes) if slot not in {item.slot for item in running}]
                for job in list(pending):
                    if not free:
                        break
                    if set(job.deps) <= done:
                        if job.name not in claims:
                            claims[job.name] = _claimed_folders(job.task)
                        if any(claims[job.name] & item.writes for item in running):
                            continue  # after the job that writes its folder: it then finds the work done
                        pending.remove(job)
                        running.append(start(job, free.pop(0), claims[job.name]))
                if not running and pending:  # nothing can start: a dependency is not a job of this run
                    missing = sorted({dep for job in pending for dep in job.deps} - done)
                    raise CoclrError(f"jobs {', '.join(job.name for job in pending)} wait for {', '.join(missing)}, "
                                     "which no job provides")
                epochs = sum(_epochs_done(job, job.name in done, logs) for job in jobs)
                bar.set_postfix_str(running_text([item.job for item in running]), refresh=False)
                if epochs > bar.n:  # (an update of 0 restarts tqdm's clock of the epoch under way: the rate of
                    bar.update(epochs - bar.n)  # an epoch would be the poll's second, the ETA far too short)
                if pending or running:
                    wait_for_an_exit([item.process for item in running], poll_seconds)
    except KeyboardInterrupt as error:
        stopped = f"; {', '.join(item.job.name for item in running)} stopped at their checkpoints (logs: {logs})"
        raise interrupted(error, f"{len(done)} of {len(jobs)} jobs done and kept"
                          f"{stopped if running else ''}") from None
    finally:
        stop_processes([item.process for item in running])
    if failed:
        tails = "\n".join(f"--- {job.name}, {ended} ({log}; alone: coclr task "
                          f"{shlex.quote(str(logs / f'{job.name}.task.json'))}):\n" + log_tail(log)
                          for job, log, ended in failed)
        stopped = f"; not run, as they need them: {', '.join(job.name for job in blocked)}" if blocked else ""
        error = CoclrError(f"failed: {', '.join(job.name for job, _, _ in failed)}{stopped}\n{tails}")
        error.lines = True  # (the log tails, line by line)
        raise error
    return partly

