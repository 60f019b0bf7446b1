"""Stopping a command on SIGINT (Ctrl-C) or SIGTERM (``kill``, ``timeout``, a batch scheduler): the one rule.

Every command runs under :func:`signals_interrupt` (``cli._world.run_command``): either signal raises
:class:`Interrupted` in the main thread, as Ctrl-C raises ``KeyboardInterrupt``, so the code that holds workers,
threads and locks stops them on its way out (``finally`` blocks, context managers) instead of the process dying
with them running (SIGTERM's default) or waiting for them. Every write is atomic, so what was finished is kept
and what was in flight is discarded; the layer that knows what was kept says so (:func:`interrupted`), and the
command prints one line and exits with ``128 + signal`` (130, 143). Only the first signal interrupts: cleanup is
bounded, and a second Ctrl-C arriving in the middle of it would leave workers running. Where the exception lands
in code whose exceptions Python ignores (a fork hook, a ``__del__``), the signal is sent again. A loop that mostly waits
on library code an exception must not land in (a child's poll, a progress bar's locks) holds the signal back to
its own safe points (:func:`deferred_interrupts`, :func:`check_interrupt`).

Worker processes do not stop on their own account: a pool worker leaves Ctrl-C to its parent, which kills it
(:func:`default_signals_in_worker`, ``store.jobs.stop_pool``); a DataLoader worker ends its loop quietly on either
signal (:func:`loader_worker_signals`) while its parent shuts the loader down. A thread is told to stop through a
:class:`threading.Event` it checks between units of work (:func:`check_stop`).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

INTERRUPTING = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a command as Ctrl-C does."""
_CHILD_SIGNAL = getattr(signal, "SIGCHLD", None)


class Interrupted(KeyboardInterrupt):
    """The command was stopped by signal ``signum`` (SIGINT or SIGTERM); ``kept`` says what its work kept (one
    phrase, set by the layer that knows: :func:`interrupted`), None while no layer said."""

    def __init__(self, signum: int = signal.SIGINT, kept: str | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.kept = kept

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """The shell's status of a process ended by the signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def interrupted(error: KeyboardInterrupt, kept: str) -> Interrupted:
    """``error`` as an :class:`Interrupted` saying ``kept`` (what the interrupted work kept), unless an inner layer
    said it already; a plain ``KeyboardInterrupt`` (Ctrl-C in a program that did not install
    :func:`signals_interrupt`) counts as SIGINT. Raise the result ``from None``."""
    if not isinstance(error, Interrupted):
        error = Interrupted(signal.SIGINT)
    if error.kept is None:
        error.kept = kept
    return error


_STATE = {"depth": 0, "received": 0, "deferring": 0, "deferred": 0, "in_hook": 0}
"""Of the :func:`signals_interrupt` blocks of this process (they nest): how many are open, and the signal that
interrupted them (0: none yet); one signal interrupts all of them once. Of the :func:`deferred_interrupts` blocks:
how many are open, and the signal they hold back (0: none). Whether the hook that sends a lost interruption again
is running (a signal handled inside it would be lost too)."""

SEND_AGAIN_SECONDS = 0.01
"""How long after its exception was lost an interrupting signal is sent again: time for the code that lost it to
return."""


def _send_again(signum: int) -> None:
    """Send ``signum`` to this process again in :data:`SEND_AGAIN_SECONDS`, from a thread of its own (sent now, its
    handler would run inside the code that called this)."""

    def send() -> None:
        time.sleep(SEND_AGAIN_SECONDS)
        os.kill(os.getpid(), signum)

    threading.Thread(target=send, name="coclr-interrupt-again", daemon=True).start()


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """While the block runs in the main thread, the first SIGINT or SIGTERM raises :class:`Interrupted` there;
    later ones are ignored while the blocks clean up. Blocks nest (a command's, a study's); elsewhere (another
    thread) nothing changes, and neither does a signal this process was started ignoring (a shell's background
    job ignores SIGINT)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        if _STATE["received"]:
            return  # cleanup is under way (bounded); an exception raised inside it would leave workers behind
        if _STATE["in_hook"]:
            _send_again(signum)  # the exception would be lost in the hook below: later
            return
        _STATE["received"] = signum
        if _CHILD_SIGNAL is not None and callable(signal.getsignal(_CHILD_SIGNAL)):
            # PyTorch's handler raises RuntimeError in this thread, at the next child's exit, while a DataLoader
            # worker that died of a signal is registered: of the one that stops us, when it was sent to the whole
            # process group (timeout, SLURM), and the loaders are shut down only as the exception unwinds (or at
            # exit). The error would replace the interruption with a traceback, so it stays off in this process.
            signal.signal(_CHILD_SIGNAL, _child_exited)
        if _STATE["deferring"]:
            _STATE["deferred"] = signum  # raised at the block's next check_interrupt, or as it ends
            return
        raise Interrupted(signum)

    unraisable_hook = sys.unraisablehook

    def interrupt_again(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, Interrupted) and _STATE["received"]:
            # The exception landed where Python ignores exceptions (a fork hook, a __del__, a weakref callback):
            # lost there, it would leave the command running with its signals ignored. The signal is sent again,
            # for its handler to raise in the next code that can.
            _STATE["in_hook"] += 1
            try:
                _STATE["received"] = 0
                _send_again(unraisable.exc_value.signum)
            finally:
                _STATE["in_hook"] -= 1
            return
        unraisable_hook(unraisable)

    previous = {signum: signal.signal(signum, interrupt) for signum in INTERRUPTING
                if signal.getsignal(signum) is not signal.SIG_IGN}  # ignored by whoever started us (cmd &): kept
    sys.unraisablehook = interrupt_again
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1
        if not _STATE["depth"]:
            _STATE["received"] = _STATE["deferred"] = 0
        sys.unraisablehook = unraisable_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Inside a :func:`signals_interrupt` block: the interrupting signal does not raise wherever the main thread
    happens to be, but at the next :func:`check_interrupt` or as this block ends. For a loop that calls code an
    exception may not land in the middle of: ``subprocess.Popen.poll`` takes a lock that an exception raised just
    after it leaves taken (a later ``wait`` on that process then blocks for ever), tqdm takes two locks one after
    the other, ``Popen`` forks then records the child. The loop calls :func:`check_interrupt` where stopping is
    safe (around its sleep); a sleep interrupted by the signal goes on for its remaining time (PEP 475), so the
    loop's steps should be short."""
    _STATE["deferring"] += 1
    try:
        yield
    finally:
        _STATE["deferring"] -= 1
    if not _STATE["deferring"]:  # (a block inside another leaves the signal to the outer one's end)
        check_interrupt()


def check_interrupt() -> None:
    """Raise :class:`Interrupted` if :func:`deferred_interrupts` holds a signal back: where the deferring loop may
    stop."""
    signum = _STATE["deferred"]
    if signum:
        _STATE["deferred"] = 0
        raise Interrupted(signum)


def _child_exited(signum: int, frame: object) -> None:
    """SIGCHLD's handler once interrupted: nothing (a no-op rather than SIG_DFL, whose pending signals CPython
    reports as "ignored due to race condition")."""


def default_signals_in_worker() -> None:
    """In a worker process its parent stops: Ctrl-C (sent to the whole terminal's group) is left to the parent,
    which stops its workers itself; SIGTERM kills the worker at once (the default), its in-flight work discarded."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def check_stop(stop: threading.Event | None) -> None:
    """Raise :class:`Interrupted` once ``stop`` is set: how a thread of a job (which signals do not reach) ends its
    work at a safe point, told by the main thread that was interrupted."""
    if stop is not None and stop.is_set():
        raise Interrupted()


def loader_worker_signals(worker_id: int = 0) -> None:
    """In a DataLoader worker (as its ``worker_init_fn``, or called from it): SIGTERM ends the worker as Ctrl-C does
    (PyTorch's worker loop stops quietly on the ``KeyboardInterrupt``), through its normal exit. PyTorch's own
    handler kills a worker outright when SIGTERM comes from another process than its parent, as ``timeout`` and
    batch schedulers send it to a whole process group: a killed worker leaves its temporary folders behind
    (multiprocessing's ``pymp-*``), and its parent, stopped by the same signal, shuts the loader down anyway.

    A parent interrupted while it fetches a batch's shared memory from the worker drops the connection that hands
    over the file descriptor; the worker's sharing thread then reports the dropped connection as a traceback
    (:func:`quiet_dropped_sharing` keeps that one quiet: the parent is stopping, and says so in one line).

    A worker stopped mid-loop then waits in its exit to flush its last batch into a pipe its stopping parent no
    longer reads, until the loader's shutdown terminates it: a signal that finds it there ends it at once, its
    temporary folder removed, where an exception would only print a traceback from multiprocessing's exit."""
    signal.signal(signal.SIGTERM, _end_loader_worker)
    signal.signal(signal.SIGINT, _end_loader_worker)
    sys.excepthook = quiet_dropped_sharing


def _end_loader_worker(signum: int, frame: object) -> None:
    if multiprocessing.util._exiting:  # past its loop, in multiprocessing's exit: nothing there is waited for
        shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)
        os._exit(128 + signum)
    raise KeyboardInterrupt


def quiet_dropped_sharing(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """``sys.excepthook`` of a DataLoader worker: an error of a connection its peer dropped (end of file, a reset or
    broken pipe, a failed handshake) in multiprocessing's file-descriptor sharer (``resource_sharer``, whose
    thread reports through this hook) is left unsaid; every other exception is printed as Python prints it."""
    dropped = issubclass(kind, (EOFError, ConnectionError, multiprocessing.AuthenticationError))
    if dropped and any(frame.f_code.co_filename.endswith("resource_sharer.py") for frame, _ in traceback.walk_tb(tb)):
        return
    sys.__excepthook__(kind, value, tb)


# ------------------------------------------------------------------ a process that outlives its parent

def die_with_parent() -> None:
    """In a child process (``preexec_fn``): be killed when the parent dies, however it dies (``kill -9`` too), so that
    no job goes on training and holding its folder behind a job that is gone (Linux; elsewhere nothing). Only
    the one call: between fork and exec of a process with threads, nothing may take a lock (import, load a
    library, start a process), so ``prctl`` was looked up in the parent."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal a process gets when its parent exits."""


def _find_prctl():  # noqa: ANN202 (a ctypes function)
    """libc's ``prctl`` from the symbols the process has loaded (no search of the file system), or None."""
    try:
        return ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):
        return None


_PRCTL = _find_prctl()


def stop_with_launcher() -> None:
    """Under torchrun (``LOCAL_RANK`` set): be sent SIGTERM when the launcher dies, however it dies (``kill -9``, the
    out-of-memory killer). torchrun starts each process in a session of its own, which a kill of torchrun's process
    group does not reach: they went on training, holding their folder's lock, with nobody to report to. SIGTERM
    stops the command as Ctrl-C does (what was done is kept). Linux only; elsewhere nothing."""
    if "LOCAL_RANK" not in os.environ or _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)  # (no test of the parent's pid: torchrun may be pid 1, a container's)
