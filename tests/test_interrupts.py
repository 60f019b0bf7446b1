"""SIGINT and SIGTERM stop every long command within seconds, with one line saying what was kept (exit 130, 143),
and the same command continues; environment errors (kernels that cannot be built, an unwritable cache) are one
line before any work. Real commands in subprocesses on small generated data.

Where the test is about work in flight, that work takes minutes (a large video's flow), so a command that waited
for its workers (instead of stopping them) would not exit in time. Signals go to the command's process group (as
Ctrl-C in a terminal, ``timeout`` or a batch scheduler send them) or to the command alone (``kill PID``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from coclr import native
from coclr.interrupts import (
    Interrupted,
    check_interrupt,
    check_stop,
    deferred_interrupts,
    interrupted,
    signals_interrupt,
)
from coclr.store.clipstore import ClipStore
from coclr.synth import random_store
from conftest import REPO_ROOT


@pytest.fixture(autouse=True)
def _sigint_not_ignored():
    """A suite started in the background (``cmd &``) ignores SIGINT, and so would every command it starts (an
    ignored signal stays ignored across exec, and ``coclr`` keeps it so): these tests signal with SIGINT, so they
    run with Python's default handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)

STOP_SECONDS = 30.0
"""How long a signalled command may take to exit: generous for a loaded 2-core machine; what it guards against
(waiting for the work in flight, a hang, an abort) takes minutes, forever, or crashes."""
PYTHON_COCLR = (sys.executable, "-m", "coclr")


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The commands' environment: this checkout, one thread, and a temporary folder of their own (checked empty
    after), the C loops' cache shared with the other tests unless ``extra`` says otherwise."""
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1", "TMPDIR": str(temp),
            **extra}


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``coclr ARGV`` in a process group of its own, stdout and stderr into ``log``.out / .err."""
    return subprocess.Popen([*PYTHON_COCLR, *argv], env=env, start_new_session=True, cwd=REPO_ROOT,
                            stdout=log.with_suffix(".out").open("w"), stderr=log.with_suffix(".err").open("w"))


def stop_when(process: subprocess.Popen, ready: Callable[[], bool], signum: int, group: bool,
              log: Path) -> tuple[int, str, float]:
    """Send ``signum`` to the command (its whole group with ``group``) once ``ready()`` holds; returns its exit
    status, its last stderr line and the seconds it took to exit. Fails if it ended before, or outlived
    :data:`STOP_SECONDS`, or left a process of its group behind."""
    try:
        deadline = time.monotonic() + 300
        while not ready():
            assert process.poll() is None, f"ended before it was signalled:\n{log.with_suffix('.err').read_text()}"
            assert time.monotonic() < deadline, "never got ready"
            time.sleep(0.05)
        signalled = time.monotonic()
        os.killpg(process.pid, signum) if group else process.send_signal(signum)
        try:
            status = process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {STOP_SECONDS:.0f} s after {signal.Signals(signum).name}")
        seconds = time.monotonic() - signalled
        while time.monotonic() - signalled < STOP_SECONDS:  # its workers go with it
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("a worker process outlived the command")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    err = log.with_suffix(".err").read_text()
    assert "Traceback" not in err and "terminate called" not in err, err
    return status, last_line(err), seconds


def last_line(text: str) -> str:
    """The last line a command wrote (progress bars are redrawn with carriage returns)."""
    return [line for line in re.split(r"[\r\n]", text) if line.strip()][-1]


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*PYTHON_COCLR, *argv], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600)


def assert_clean(env: dict[str, str], *folders: Path) -> None:
    """No temporary folder or file left behind: in the commands' temporary folder (but caches: the C loops' fallback,
    when the test uses it, and PyTorch's compiler's, which any run makes), and no partial entry in ``folders``."""
    left = [p.name for p in Path(env["TMPDIR"]).iterdir() if not p.name.startswith(("coclr-cache-", "torchinductor"))]
    assert not left, f"left in the temporary folder: {left}"
    for folder in folders:
        assert not list(folder.rglob("*.partial")), list(folder.rglob("*.partial"))


def entries(store: Path, view: str) -> int:
    folder = store / view
    return len(list(folder.rglob("*.frames"))) if folder.is_dir() else 0


def long_entry(store: Path, key: str, frames: int, size: tuple[int, int]) -> Callable[[], None]:
    """Make ``key``'s RGB entry ``frames`` frames of noise of ``size``, whose flow takes minutes (work in flight
    that a command must abandon to stop in seconds); returns the function that puts the original entry back."""
    import numpy as np

    from coclr.store.clipstore import write_entry
    from coclr.store.jpeg import encode_jpeg

    path = ClipStore(store).entry_path(key, "rgb")
    saved = path.with_name(path.name + ".saved")
    os.link(path, saved)
    noise = np.random.default_rng(0).integers(0, 256, (frames, *size, 3), dtype=np.uint8)
    write_entry(store, key, "rgb", [encode_jpeg(frame) for frame in noise], fps=25.0)
    return lambda: os.replace(saved, path)


# ------------------------------------------------------------------------------------------------ in process


def test_signals_raise_interrupted_once_and_handlers_come_back():
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted) as caught, signals_interrupt():
        with signals_interrupt():  # nested blocks (a command's, a study's): one signal interrupts them once
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
            pytest.fail("not interrupted")
    assert (caught.value.signum, caught.value.exit_status, caught.value.signal_name) == (15, 143, "SIGTERM")
    assert isinstance(caught.value, KeyboardInterrupt)
    assert {signum: signal.getsignal(signum) for signum in before} == before

    with pytest.raises(Interrupted) as caught, signals_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        finally:  # cleanup is not interrupted by a second signal
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
    assert caught.value.exit_status == 130

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a shell starts a background job's SIGINT
    try:
        with signals_interrupt():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) is not before[signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_deferred_signal_raises_at_the_check_not_where_it_lands():
    """Code that an exception may not land in the middle of (a lock taken, a child reaped but not recorded) runs to
    its end; the signal raises at the loop's next check, or as the deferring block ends."""
    finished = []
    with pytest.raises(Interrupted) as caught, signals_interrupt(), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # where the handler runs: it must not raise here
            pass
        finished.append("critical")
        check_interrupt()
        finished.append("after the check")
    assert finished == ["critical"] and caught.value.signum == signal.SIGTERM

    with pytest.raises(Interrupted) as caught, signals_interrupt():
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            finished.append("block")
        finished.append("after the block")  # no check in the block: its end raises
    assert finished[1:] == ["block"] and caught.value.signum == signal.SIGINT
    check_interrupt()  # nothing held back any more: no error

    with signals_interrupt(), deferred_interrupts():
        check_interrupt()  # no signal: no error

    with pytest.raises(Interrupted), signals_interrupt():  # a block inside another: the outer one's end raises
        with deferred_interrupts():
            with deferred_interrupts():  # (a checkpoint's atomic write inside the trainer's save)
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):
                    pass
            finished.append("inner ended")  # (it raised here: the trainer then named no checkpoint beside one)
        finished.append("after the outer")
    assert finished[-1] == "inner ended"


def test_a_signal_during_a_checkpoint_names_that_checkpoint(tmp_path, monkeypatch):
    """SIGTERM as the checkpoint was renamed into place said "no checkpoint yet" beside it (the trainer recorded it
    after the write's deferred signal had raised)."""
    from coclr.train import trainer as module

    class Saving:
        out, position = tmp_path, module.Position()
        saved = None
        state = staticmethod(lambda: {"x": 1})

    def write(state, path):
        os.kill(os.getpid(), signal.SIGTERM)  # lands in the write
        with deferred_interrupts():
            path.write_bytes(b"x")

    monkeypatch.setattr(module, "atomic_torch_save", write)
    monkeypatch.setattr(module, "is_main", lambda: True)
    saving = Saving()
    with pytest.raises(Interrupted), signals_interrupt():
        module.Trainer.save(saving)
    assert saving.saved is not None and (tmp_path / "checkpoint_last.pth").is_file()


def test_a_signal_landing_in_the_training_logs_waits_for_the_record_and_the_writer_closes(tmp_path):
    """Raised inside TensorBoard's writer, an interruption could leave it unable to close (a stopped ``coclr task``
    that never exited): the trainer's record is written whole, the signal raises after it, and the writer closes
    with every scalar in its file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from coclr.train.trainer import Trainer

    writer = SummaryWriter(str(tmp_path / "tb"))
    add_scalar = writer.add_scalar

    def signalled_inside(*args, **kwargs):  # the signal lands in the writer's own code
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        return add_scalar(*args, **kwargs)

    writer.add_scalar = signalled_inside
    with (tmp_path / "log.jsonl").open("a") as jsonl:
        with pytest.raises(Interrupted) as caught, signals_interrupt():
            Trainer._write(None, {"step": 3, "epoch": 1, "loss": 2.5, "lr": 0.1}, jsonl, writer)
            pytest.fail("the interruption was lost")
    assert caught.value.signum == signal.SIGTERM
    closing = threading.Thread(target=writer.close, daemon=True)
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), "TensorBoard's writer did not close"
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]} == \
        {"loss": [(3, 2.5)], "lr": [(3, pytest.approx(0.1))]}


def test_a_signal_landing_where_exceptions_are_ignored_still_interrupts():
    """Python ignores an exception raised in a ``__del__`` or a fork hook (it prints "Exception ignored"): the
    interruption landing there is sent again, not lost with the command running on."""

    class SignalledAsItIsDeleted:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs here, where its exception is ignored
                pass

    unraisable = sys.unraisablehook
    with pytest.raises(Interrupted) as caught, signals_interrupt():
        SignalledAsItIsDeleted()  # deleted at once
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.01)
        pytest.fail("the interruption was lost")
    assert caught.value.signum == signal.SIGTERM and sys.unraisablehook is unraisable


def test_a_loader_worker_keeps_a_dropped_descriptor_handover_quiet(capsys):
    """A parent interrupted while it fetches a batch's memory drops the connection multiprocessing's descriptor
    sharer serves in the worker: that thread's report through sys.excepthook is left unsaid; the same error
    elsewhere, and any other error there, are printed."""
    import multiprocessing

    from coclr.interrupts import quiet_dropped_sharing

    def raised(error: BaseException, filename: str):
        code = compile("def serve(error):\n    raise error\n", filename, "exec")
        scope: dict = {}
        exec(code, scope)
        try:
            scope["serve"](error)
        except BaseException:
            return sys.exc_info()
        raise AssertionError("not raised")

    sharer = "/usr/lib/python3/multiprocessing/resource_sharer.py"
    for error in (EOFError(), ConnectionResetError(104, "reset"), BrokenPipeError(32, "broken"),
                  multiprocessing.AuthenticationError("digest received was wrong")):
        quiet_dropped_sharing(*raised(error, sharer))
        assert capsys.readouterr().err == ""
    quiet_dropped_sharing(*raised(ValueError("a real bug"), sharer))
    quiet_dropped_sharing(*raised(EOFError("elsewhere"), "/somewhere/else.py"))
    err = capsys.readouterr().err
    assert "ValueError: a real bug" in err and "EOFError: elsewhere" in err and err.count("Traceback") == 2


EXITING_WORKER = """
import multiprocessing, multiprocessing.util, os, signal, sys, time
from coclr.interrupts import loader_worker_signals

def work(queue, marker):
    loader_worker_signals()
    multiprocessing.util.get_temp_dir()  # as a worker that shared a tensor holds one
    queue.put(b"x" * (1 << 22))  # more than the pipe holds: its exit waits for a reader that never comes
    multiprocessing.util.Finalize(None, open, (marker, "w"), exitpriority=100)  # the first thing its exit does

if __name__ == "__main__":
    marker = sys.argv[1]
    queue = multiprocessing.get_context("fork").Queue()
    worker = multiprocessing.get_context("fork").Process(target=work, args=(queue, marker))
    worker.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # in its exit, waiting for the batch to be read
    assert worker.is_alive()
    os.kill(worker.pid, signal.SIG%s)  # the loader's shutdown terminates a worker that does not exit
    worker.join(30)
    print("exit", worker.exitcode, flush=True)
"""


@pytest.mark.parametrize("signame", ["TERM", "INT"])
def test_a_loader_worker_signalled_in_its_exit_ends_without_a_traceback(tmp_path, signame):
    """A DataLoader worker stopped by Ctrl-C leaves its loop, then waits in its exit to flush a batch into a pipe its
    stopping parent no longer reads; the loader's shutdown then terminates it (and a second Ctrl-C may land there):
    the signal ends it at once, with no traceback (seen: 'Process-1: Traceback ... util._exit_function()')."""
    script = tmp_path / "worker.py"
    script.write_text(EXITING_WORKER % signame)
    temp = tmp_path / "temp"
    temp.mkdir()
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "exiting")], capture_output=True, text=True,
                            timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "TMPDIR": str(temp)})
    assert result.returncode == 0 and "exit" in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert not list(temp.iterdir())  # its temporary folder went with it


def test_the_innermost_layer_says_what_was_kept():
    inner = interrupted(Interrupted(signal.SIGTERM), "3 of 5 videos done and kept")
    outer = interrupted(inner, "what was finished is kept")
    assert outer is inner and outer.kept == "3 of 5 videos done and kept" and outer.signum == signal.SIGTERM
    assert interrupted(KeyboardInterrupt(), "x").signum == signal.SIGINT  # Ctrl-C without our handler


@pytest.mark.parametrize("kernels", ["c", "torch"])
def test_a_solve_told_to_stop_ends_with_interrupted(kernels):
    if kernels == "c":
        from coclr.flow.tvl1_cpu import KERNEL

        if KERNEL.load() is None:
            pytest.skip("no C compiler here")
    from coclr.flow.tvl1 import tvl1_flow

    frames = torch.randint(0, 256, (2, 2, 32, 32)).float()
    stop = threading.Event()
    stop.set()
    with pytest.raises(Interrupted):
        tvl1_flow(frames[0], frames[1], kernels=kernels, stop=stop)
    check_stop(None)  # no event: never stops


def _block_forever(_: int) -> None:
    threading.Event().wait()


def test_stop_pool_kills_workers_busy_with_work_that_does_not_end():
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from coclr.store.jobs import stop_pool

    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
    futures = [pool.submit(_block_forever, i) for i in range(4)]
    processes = list(pool._processes.values())
    stop_pool(pool)
    assert all(process.exitcode == -signal.SIGKILL for process in processes)  # reaped: no zombie
    assert all(future.done() for future in futures)


# ------------------------------------------------------------------------------------------------ flow


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    """6 videos of 8 random frames (36 x 40), RGB only."""
    return random_store(tmp_path_factory.mktemp("interrupts") / "store", videos=6, frames=8, views=("rgb",))


def copy_store(store: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(store, to)
    return to


@pytest.mark.parametrize("backend, view, signum, size", [
    ("tvl1", "flow", signal.SIGTERM, (288, 320)),  # 29 pairs of 7 s on a loaded 2-core machine
    pytest.param("dis", "flow_dis", signal.SIGINT, (512, 512), marks=pytest.mark.slow),  # seconds (DIS is fast)
])
def test_opencv_flow_stops_its_workers_at_once_and_continues(tmp_path, small_store, backend, view, signum, size):
    """The last video takes minutes: signalled once every other video is done, the command must stop the worker
    computing it, say 5 of 6 are kept, and the same command then does the last one."""
    store = copy_store(small_store, tmp_path / "store")
    keys = ClipStore(store).keys()
    restore = long_entry(store, keys[-1], 30, size)
    env = environment(tmp_path)
    argv = ["flow", str(store), "--backend", backend, "--workers", "2"]
    process = start(argv, env, tmp_path / "run")
    status, line, _ = stop_when(process, lambda: entries(store, view) == len(keys) - 1, signum,
                                group=signum == signal.SIGINT, log=tmp_path / "run")
    assert status == 128 + signum
    assert line == (f"coclr flow: interrupted ({signal.Signals(signum).name}); {view}: 5 of 6 videos done and kept; "
                    "run the same command to continue")
    assert_clean(env, store)
    restore()  # a small video again, so that the rest is quick
    again = run(argv, env)
    assert again.returncode == 0, again.stderr
    assert f"{view}: 1 done, 5 skipped" in again.stdout
    assert ClipStore(store).verify(view) == [] and entries(store, view) == len(keys)
    assert_clean(env, store)


@pytest.fixture(scope="module")
def c_kernels():
    from coclr.flow.tvl1_cpu import KERNEL

    if KERNEL.load() is None:
        pytest.skip("no C compiler here")


@pytest.mark.parametrize("kernels, size, overrides, signum", [
    ("c", (96, 96), [], signal.SIGINT),  # a batch of the C loops: a fraction of a second
    pytest.param("torch", (32, 32), ["outer_iterations=2"], signal.SIGTERM, marks=pytest.mark.slow),  # PyTorch ops
])
def test_tvl1_torch_stops_its_device_thread_mid_batch_and_continues(tmp_path, c_kernels, kernels, size, overrides,
                                                                    signum):
    """8 batches of 4 pairs, one video each: signalled when the first video is written, the device thread is
    solving a later batch. It must be told to stop: a thread left solving aborted the interpreter at exit
    ("terminate called without an active exception", status 134)."""
    store = random_store(tmp_path / "store", videos=8, frames=5, size=size, views=("rgb",))
    env = environment(tmp_path, OMP_NUM_THREADS="2")  # the C loops' pairs on threads: torch operations in between
    argv = ["flow", str(store), *overrides, "--backend", "tvl1-torch", "--kernels", kernels, "--workers", "1",
            "--batch-pairs", "4"]
    process = start(argv, env, tmp_path / "run")
    status, line, _ = stop_when(process, lambda: entries(store, "flow") >= 1, signum, group=signum == signal.SIGINT,
                                log=tmp_path / "run")
    assert status == 128 + signum
    kept = re.fullmatch(rf"coclr flow: interrupted \({signal.Signals(signum).name}\); flow: (\d) of 8 videos done "
                        r"and kept; run the same command to continue", line)
    assert kept and 1 <= int(kept.group(1)) == entries(store, "flow") < 8, line  # what is on disk
    assert_clean(env, store)
    again = run(argv, env)
    assert again.returncode == 0, again.stderr
    assert f"flow: {8 - int(kept.group(1))} done, {kept.group(1)} skipped" in again.stdout
    assert ClipStore(store).verify("flow") == [] and entries(store, "flow") == 8
    assert_clean(env, store)


# ------------------------------------------------------------------------------------------------ environment errors


def test_c_kernels_that_cannot_be_built_are_one_line_before_any_video(tmp_path, small_store):
    store = copy_store(small_store, tmp_path / "store")
    before = sorted(p.name for p in store.iterdir())
    env = environment(tmp_path, CC="false", COCLR_CACHE_DIR=str(tmp_path / "cache"))  # a compiler that fails
    for backend in ("auto", "tvl1-torch"):
        result = run(["flow", str(store), "--backend", backend, "--kernels", "c"], env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            "coclr flow: error: kernels='c': the C loops cannot be built here: false failed: exit 1; kernels='auto' "
            "or 'torch' run without them"]
    assert sorted(p.name for p in store.iterdir()) == before  # nothing written: no view, no metadata
    assert_clean(env, store, tmp_path / "cache")


def _build_library(queue) -> None:
    from coclr.flow import tvl1_cpu

    queue.put(str(tvl1_cpu.KERNEL.build()))


def test_an_unwritable_cache_falls_back_to_one_private_folder_built_by_two_processes_at_once(tmp_path, monkeypatch,
                                                                                            c_kernels):
    import multiprocessing

    from coclr.flow import tvl1_cpu

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("COCLR_CACHE_DIR", str(tmp_path / "file" / "cache"))  # under a file: cannot be made
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    builders = [context.Process(target=_build_library, args=(queue,)) for _ in range(2)]
    for builder in builders:
        builder.start()
    paths = {queue.get(timeout=300) for _ in builders}
    for builder in builders:
        builder.join()
    fallback = tmp_path / "tmp" / f"coclr-cache-{os.getuid()}"
    assert [p.name for p in (tmp_path / "tmp").iterdir()] == [fallback.name]  # one folder, nothing else
    assert paths == {str(path) for path in fallback.iterdir()} and len(paths) == 1  # one object, no build folder
    assert fallback.stat().st_mode & 0o777 == 0o700
    monkeypatch.setattr(native, "compile_sources", lambda *args: pytest.fail("compiled again"))
    assert str(tvl1_cpu.KERNEL.build()) in paths  # reused


def test_no_folder_for_the_c_loops_is_one_error_naming_both(tmp_path, monkeypatch, c_kernels):
    from coclr.flow import tvl1_cpu

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("COCLR_CACHE_DIR", str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / f"coclr-cache-{os.getuid()}").write_text("")  # the fallback is a file
    with pytest.raises(tvl1_cpu.CompileError) as caught:
        tvl1_cpu.KERNEL.build()
    message = str(caught.value)
    assert message.startswith("no folder to keep the compiled C loops in: ") and "\n" not in message
    assert f"{tmp_path}/file/cache: Not a directory" in message and "coclr-cache-" in message
    assert message.endswith("(set COCLR_CACHE_DIR to a folder you may write)")
    assert [p.name for p in (tmp_path / "tmp").iterdir()] == [f"coclr-cache-{os.getuid()}"]  # nothing left


@pytest.mark.slow
def test_an_unwritable_cache_falls_back_to_one_private_folder_shared_by_commands(tmp_path, small_store, c_kernels):
    """Two extractions at once with a cache that cannot be written: both build into the one fallback folder of the
    user (no folder per process), and leave nothing else; with no folder at all, ``--kernels c`` is one line."""
    (tmp_path / "file").write_text("")
    env = environment(tmp_path, COCLR_CACHE_DIR=str(tmp_path / "file" / "cache"))  # under a file: cannot be made
    stores = [copy_store(small_store, tmp_path / f"store{i}") for i in range(2)]
    argv = ["--backend", "tvl1-torch", "--kernels", "c", "--workers", "0"]
    processes = [start(["flow", str(store), *argv], env, tmp_path / f"run{i}") for i, store in enumerate(stores)]
    assert [process.wait(600) for process in processes] == [0, 0], (tmp_path / "run0.err").read_text()
    fallback = Path(env["TMPDIR"]) / f"coclr-cache-{os.getuid()}"
    assert [p.suffix for p in fallback.iterdir()] == [".so"]  # one object, no build folder left
    assert fallback.stat().st_mode & 0o777 == 0o700
    assert_clean(env, *stores)

    for path in fallback.iterdir():
        path.unlink()
    fallback.rmdir()
    fallback.write_text("")  # the fallback cannot be a folder either
    result = run(["flow", str(stores[0]), "--view", "flow_other", *argv], env)
    assert result.returncode == 2
    assert re.fullmatch(r"coclr flow: error: kernels='c': the C loops cannot be built here: no folder to keep the "
                        r"compiled C loops in: .*file/cache: Not a directory; .*coclr-cache-\d+: .*; kernels='auto' "
                        r"or 'torch' run without them\n", result.stderr), result.stderr
    assert not (stores[0] / "flow_other").exists()


def test_the_fallback_cache_is_refused_unless_private(tmp_path, monkeypatch):

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = native.fallback_cache_dir()
    assert folder.parent == tmp_path
    assert native.private_folder(folder) == folder and folder.stat().st_mode & 0o777 == 0o700
    assert native.private_folder(folder) == folder  # made by another process first: fine
    folder.chmod(0o777)
    with pytest.raises(OSError, match="only it may write"):
        native.private_folder(folder)
    folder.rmdir()
    folder.symlink_to(tmp_path)
    with pytest.raises(OSError, match="only it may write"):
        native.private_folder(folder)


# ------------------------------------------------------------------------------------------------ other commands
@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    from test_eval_helpers import save_tiny_encoder

    return save_tiny_encoder(tmp_path_factory.mktemp("encoder") / "encoder.pth")


TINY = ["model.width=0.125", "data.length=8", "data.size=32", "method.queue_size=8", "method.topk=2",
        "method.wait_for_full_queue=false", "run.batch_size=4", "run.save_every=1"]
"""A pretraining small enough for the CPU, with a checkpoint after every step."""


def checkpoint_step(path: Path) -> int:
    from coclr.train.checkpoint import load_checkpoint

    return load_checkpoint(path)["position"]["global_step"]


@pytest.mark.slow
def test_pretrain_stopped_by_sigterm_to_its_group_keeps_its_checkpoint_and_continues(tmp_path):
    """SIGTERM to the whole group (``timeout``, SLURM) reaches the DataLoader workers too: the command still says
    which checkpoint is kept (not PyTorch's "DataLoader worker killed" error) and the same command continues."""
    store = random_store(tmp_path / "store", videos=12, frames=12, views=("rgb",))
    out = tmp_path / "run"
    env = environment(tmp_path)
    argv = ["pretrain", f"data.store={store}", f"run.out={out}", *TINY, "data.workers=2", "optim.epochs=1000"]
    process = start(argv, env, tmp_path / "run")
    status, line, _ = stop_when(process, lambda: (out / "checkpoint_last.pth").is_file(), signal.SIGTERM, group=True,
                                log=tmp_path / "run")
    assert status == 143
    kept = re.fullmatch(rf"coclr pretrain: interrupted \(SIGTERM\); {out}/checkpoint_last\.pth kept \((?:end of )?"
                        r"epoch \d+(?:, \d+ videos into it)?, step (\d+)\)(?:; the \d+ steps after it are trained "
                        r"again)?; run the same command to continue", line)
    assert kept, line
    step = int(kept.group(1))
    assert checkpoint_step(out / "checkpoint_last.pth") == step
    assert_clean(env, out)
    again = run([*argv, f"run.max_steps={step + 2}"], env)  # the same command told where to stop (may change)
    assert again.returncode == 0, again.stderr
    assert f"(step {step})" in again.stdout and checkpoint_step(out / "checkpoint_last.pth") == step + 2


@pytest.mark.slow
def test_a_pipeline_stopped_in_a_stage_names_it_and_continues(tmp_path):
    store = random_store(tmp_path / "store", videos=12, frames=12)
    out = tmp_path / "run"
    env = environment(tmp_path)
    argv = ["pipeline", f"data.store={store}", f"run.out={out}", *TINY, "data.workers=0", "pipeline.cycles=1"]
    process = start(argv, env, tmp_path / "run")
    checkpoint = out / "infonce_rgb" / "checkpoint_last.pth"
    status, line, _ = stop_when(process, checkpoint.is_file, signal.SIGINT, group=True, log=tmp_path / "run")
    assert status == 130
    assert re.fullmatch(rf"coclr pipeline: interrupted \(SIGINT\); stage 1/\d+ infonce_rgb: {checkpoint} kept "
                        r"\(.*step (\d+)\).*; run the same command to continue", line), line
    step = checkpoint_step(checkpoint)
    assert_clean(env, out)
    again = run([*argv, f"run.max_steps={step + 1}"], env)
    assert again.returncode == 0, again.stderr
    assert f"(step {step})" in again.stdout and checkpoint_step(checkpoint) == step + 1


@pytest.mark.slow
def test_finetune_stopped_keeps_its_epochs_and_continues(tmp_path, encoder):
    from test_eval_helpers import make_tiny_store

    store = make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8)
    work = tmp_path / "work"
    env = environment(tmp_path)
    argv = ["eval", "finetune", "--checkpoint", str(encoder), "--store", str(store), "--work-dir", str(work),
            "--epochs", "10", "--milestones", "8", "--length", "8", "--size", "32", "--batch-size", "6",
            "--workers", "1", "--out", str(tmp_path / "result.json")]
    process = start(argv, env, tmp_path / "run")
    status, line, _ = stop_when(process, lambda: any(work.rglob("finetune_last.pt")), signal.SIGTERM, group=False,
                                log=tmp_path / "run")
    assert status == 143
    kept = re.fullmatch(r"coclr eval: interrupted \(SIGTERM\); (\d+) of 10 finetuning epochs done and kept in "
                        r".*finetune_last\.pt; run the same command to continue", line)
    assert kept and 1 <= int(kept.group(1)) < 10, line
    assert_clean(env, work)
    import json

    import torch

    state = torch.load(next(work.rglob("finetune_last.pt")), weights_only=True)
    assert state["epoch"] == int(kept.group(1)) and len(state["losses"]) == state["epoch"]
    again = run(argv, env)
    assert again.returncode == 0, again.stderr
    losses = json.loads((tmp_path / "result.json").read_text())["results"]["train_losses"]
    assert len(losses) == 10 and losses[: state["epoch"]] == pytest.approx(state["losses"])  # the kept epochs' own


@pytest.mark.slow
def test_embed_stopped_keeps_the_videos_done_and_continues(tmp_path, encoder):
    """The last video is long: signalled once every other one is written, the command stops its decoding worker,
    keeps what is done (merged by the next run) and the same command embeds the rest."""
    from coclr.embed.output import Embeddings
    from test_embed import moving_square, write_video

    videos = tmp_path / "videos"
    for number in range(5):
        write_video(videos / f"v{number}.mp4", moving_square(10, seed=number))
    write_video(videos / "v5.mp4", moving_square(3000, seed=5))  # minutes of windows on a loaded CPU
    out = tmp_path / "out"
    env = environment(tmp_path)
    argv = ["embed", str(videos), "--checkpoint", str(encoder), "--length", "8", "--size", "32", "--short-side", "32",
            "--workers", "2", "--flush-every", "1", "--out", str(out)]
    process = start(argv, env, tmp_path / "run")
    status, line, _ = stop_when(process, lambda: len(list((out / "chunks").glob("*.npz"))) >= 5
                                if (out / "chunks").is_dir() else False, signal.SIGINT, group=True,
                                log=tmp_path / "run")
    assert status == 130
    assert line == f"coclr embed: interrupted (SIGINT); {out}: 5 of 6 videos embedded and kept; run the same command " \
                   "to continue"
    assert_clean(env, out)
    write_video(videos / "v5.mp4", moving_square(10, seed=5))  # a short one now: the rest is quick
    again = run(argv, env)
    assert again.returncode == 0, again.stderr
    assert "1 videos embedded" in again.stdout and "5 skipped" in again.stdout
    assert len(Embeddings(out).videos) == 6


@pytest.mark.slow
def test_data_store_and_synth_stop_and_continue(tmp_path):
    """``coclr data store`` (decoding workers) and ``coclr data synth`` (rendering workers): the same engine."""
    from coclr.store.build import build_store  # noqa: F401 (the command under test)
    from test_store import make_dataset

    index = make_dataset(tmp_path / "videos", 24, frames=40, size=(120, 160))
    index.save(tmp_path / "index.json")
    out = tmp_path / "store"
    env = environment(tmp_path)
    argv = ["data", "store", "--index", str(tmp_path / "index.json"), "--root", str(tmp_path / "videos"), "--out",
            str(out), "--short-side", "32", "--workers", "2"]
    process = start(argv, env, tmp_path / "store_run")
    status, line, _ = stop_when(process, lambda: entries(out, "rgb") >= 2, signal.SIGTERM, group=False,
                                log=tmp_path / "store_run")
    assert status == 143
    kept = re.fullmatch(r"coclr data: interrupted \(SIGTERM\); rgb: (\d+) of 24 videos done and kept; run the same "
                        r"command to continue", line)
    assert kept and int(kept.group(1)) == entries(out, "rgb") < 24, line
    assert_clean(env, out)
    again = run(argv, env)
    assert again.returncode == 0, again.stderr
    assert ClipStore(out).verify("rgb") == [] and entries(out, "rgb") == 24

    synth = tmp_path / "synth"
    argv = ["data", "synth", "--out", str(synth), "--workers", "2", "train_scenes=8", "test_scenes=2", "frames=32",
            "height=64", "width=64"]
    process = start(argv, env, tmp_path / "synth_run")
    status, line, _ = stop_when(process, lambda: entries(synth, "rgb") >= 2, signal.SIGINT, group=True,
                                log=tmp_path / "synth_run")
    assert status == 130
    kept = re.fullmatch(r"coclr data: interrupted \(SIGINT\); rgb: (\d+) of 80 videos done and kept; run the same "
                        r"command to continue", line)
    assert kept and int(kept.group(1)) == entries(synth, "rgb") < 80, line
    again = run(argv, env)
    assert again.returncode == 0, again.stderr
    assert ClipStore(synth).verify("rgb") == [] and entries(synth, "rgb") == 80
    assert_clean(env, synth)


@pytest.mark.slow
def test_a_study_stopped_stops_its_commands_and_says_what_is_kept(tmp_path):
    """The quick study, stopped while its training commands run: they stop (each keeping its checkpoint), and the
    study says how many are done."""
    from test_study import REDUCED
    from test_train import with_options

    out = tmp_path / "demo"
    env = environment(tmp_path)
    argv = ["demo", "--out", str(out), *with_options(REDUCED, "schedule.infonce_epochs=1000")]
    process = start(argv, env, tmp_path / "run")
    status, line, _ = stop_when(process, lambda: any((out / "pipeline").rglob("checkpoint_last.pth"))
                                if (out / "pipeline").is_dir() else False, signal.SIGTERM, group=False,
                                log=tmp_path / "run")
    assert status == 143
    assert re.fullmatch(rf"coclr demo: interrupted \(SIGTERM\); 0 of \d+ jobs done and kept; .* stopped at their "
                        rf"checkpoints \(logs: {out}/logs\); run the same command to continue", line), line
    logs = "".join(path.read_text() for path in (out / "logs").glob("*.log"))
    assert "interrupted (SIGTERM)" in logs  # each command said what it kept


def test_an_interrupted_restart_says_to_continue_without_restart(monkeypatch, capsys):
    """`--restart` stopped midway said "run the same command to continue": that command moved the kept work aside
    and started over."""
    import coclr.cli as cli

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_command", stopped)
    assert cli.main(["pretrain", "run.out=somewhere", "--restart"]) == 130
    assert capsys.readouterr().err.strip().endswith(
        "what was finished is kept; run the same command without --restart (which would start over) to continue")
    assert cli.main(["pretrain", "run.out=somewhere"]) == 130
    assert capsys.readouterr().err.strip().endswith("what was finished is kept; run the same command to continue")


LAUNCHED = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
from coclr.interrupts import stop_with_launcher
def stopped(signum, frame):
    with open(sys.argv[1] + ".part", "w") as file:
        file.write(signal.Signals(signum).name)
    os.replace(sys.argv[1] + ".part", sys.argv[1])  # (whole when the test reads it)
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
stop_with_launcher()
print("ready", flush=True)
time.sleep(120)
''', sys.argv[1]], env={**os.environ, "LOCAL_RANK": "0"}, start_new_session=True, stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_process_torchrun_started_stops_when_torchrun_is_killed(tmp_path):
    """torchrun starts each process in a session of its own: `kill -9` of torchrun left them training, holding their
    folder's lock. Now each gets SIGTERM (a stop that keeps what was done) when its launcher dies."""
    marker = tmp_path / "stopped"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHED, str(marker)], stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    assert Path(f"/proc/{child}").exists() and not marker.exists()
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.05)
    assert marker.read_text() == "SIGTERM"


def test_a_command_that_does_not_share_its_work_is_refused_under_torchrun(tmp_path, monkeypatch, capsys):
    """`torchrun -m coclr data store | curate | export | eval ...` ran the whole command in every process: one refused
    by its sibling's lock ("another job"), or the result written once per process."""
    from coclr.cli import TORCHRUN_COMMANDS, main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["curate", str(tmp_path / "embeddings"), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        "coclr curate: error: runs as one process, not under torchrun (WORLD_SIZE=2): run `coclr curate` without "
        "torchrun; torchrun runs embed, flow, learn, pipeline, pretrain")
    assert not (tmp_path / "out").exists()
    assert "eval" not in TORCHRUN_COMMANDS and "data" not in TORCHRUN_COMMANDS


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_checkpoint_write_stops_cleanly_and_keeps_the_old_file(tmp_path, signum):
    """Raised inside torch.save, the interruption made its zip writer fail as it closed ("unexpected pos"): a
    traceback and exit status 1 instead of the one-line stop."""
    import contextlib

    import coclr.atomic as atomic
    from coclr.interrupts import Interrupted, signals_interrupt

    path = tmp_path / "checkpoint_last.pth"
    atomic.atomic_torch_save({"step": 1}, path)
    real_open = atomic.atomic_open

    class Signalling:  # the file torch.save writes: the signal arrives halfway through the tensors' bytes
        def __init__(self, file) -> None:
            self.file, self.written = file, 0

        def write(self, data) -> int:
            self.written += len(data)
            if self.written > 1 << 21:
                os.kill(os.getpid(), signum)
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

    @contextlib.contextmanager
    def signalling_open(*args, **kwargs):
        with real_open(*args, **kwargs) as file:
            yield Signalling(file)

    atomic.atomic_open = signalling_open
    try:
        with pytest.raises(Interrupted) as stopped, signals_interrupt():
            atomic.atomic_torch_save({"weights": torch.zeros(1 << 20), "more": torch.ones(1 << 20)}, path)
    finally:
        atomic.atomic_open = real_open
    assert stopped.value.signum == signum and stopped.value.__context__ is None
    assert torch.load(path, weights_only=True) == {"step": 1}  # the old file, whole
    assert sorted(item.name for item in tmp_path.iterdir()) == ["checkpoint_last.pth"]


AGAIN_WHILE_EXITING = """
import atexit, os, signal, sys, time
import coclr.cli as cli

def stopped(args):
    raise KeyboardInterrupt

def again():  # a second Ctrl-C while the interpreter runs its exit handlers
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    print("the exit handlers ran whole", flush=True)

cli.run_command = stopped
atexit.register(again)
sys.argv = ["coclr", "data", "info", "nowhere"]
sys.exit(cli.main())
"""


def test_a_second_ctrl_c_while_the_program_exits_is_ignored():
    """After the one-line stop, a second Ctrl-C raised in the exit handlers ("Exception ignored in atexit
    callback", a traceback)."""
    done = subprocess.run([sys.executable, "-c", AGAIN_WHILE_EXITING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert "the exit handlers ran whole" in done.stdout and "Traceback" not in done.stderr, done.stderr


def test_ctrl_c_while_the_commands_are_imported_is_one_line(monkeypatch, capsys):
    """Ctrl-C in the first second (the subcommands' imports) printed a traceback of the import under way."""
    import coclr.cli as cli

    def importing():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", importing)
    assert cli.main(["data", "info", "nowhere"]) == 130
    assert capsys.readouterr().err.strip() == "coclr: interrupted (SIGINT) while starting; nothing was done"
