"""Atomic writes: a duplicate made by hard link or by copy keeps its content when the source is rewritten."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coclr import atomic
from coclr.atomic import atomic_duplicate, atomic_write_text


@pytest.mark.parametrize("links", [True, False], ids=["hard link", "copy"])
def test_duplicate_keeps_its_content_when_the_source_is_rewritten(tmp_path, monkeypatch, links):
    if not links:
        def no_links(*args, **kwargs):
            raise OSError("hard links not supported")

        monkeypatch.setattr(os, "link", no_links)
    source, copy = tmp_path / "last.pth", tmp_path / "best.pth"
    atomic_write_text(copy, "older")
    atomic_write_text(source, "epoch 3")
    atomic_duplicate(source, copy)
    assert copy.read_text() == "epoch 3"
    assert (os.stat(copy).st_ino == os.stat(source).st_ino) == links
    atomic_write_text(source, "epoch 4")
    assert copy.read_text() == "epoch 3"
    assert source.read_text() == "epoch 4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pth", "last.pth"]  # no temporary files left


def test_duplicate_of_a_missing_source_fails_and_leaves_the_target(tmp_path):
    atomic_write_text(tmp_path / "best.pth", "kept")
    with pytest.raises(FileNotFoundError):
        atomic_duplicate(tmp_path / "missing.pth", tmp_path / "best.pth")
    assert (tmp_path / "best.pth").read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["best.pth"]


def interrupt_at(event_number: int, write) -> bool:
    """Run ``write()`` with Ctrl-C's exception raised at its ``event_number``-th profiling event (a call or return
    of Python or C code: where a signal's handler runs, after a system call returns included); True when it
    raised there, False when the write finished first."""
    count, armed = 0, True

    def profile(frame, event, arg):
        nonlocal count
        count += 1
        if armed and count == event_number:
            sys.setprofile(None)
            raise KeyboardInterrupt

    sys.setprofile(profile)
    try:
        write()
        armed = False
    except KeyboardInterrupt:
        return True
    finally:
        sys.setprofile(None)
    return False


@pytest.mark.parametrize("write", ["text", "duplicate"])
def test_an_interruption_at_any_point_leaves_the_old_or_the_new_file_and_nothing_at_exit(tmp_path, write):
    """SIGINT or SIGTERM (raised as an exception at the next call or return, as Python runs a signal's handler)
    may come anywhere in a write, inside the temporary file's creation and at the start of its cleanup too: the
    target holds its old or its new content, and once the process exits (its exit hook) no temporary file is
    left."""
    target, source = tmp_path / "checkpoint_best.pth", tmp_path / "checkpoint_last.pth"
    writes = {"text": lambda: atomic_write_text(target, "new"), "duplicate": lambda: atomic_duplicate(source, target)}
    interrupted = 0
    for event_number in range(1, 100_000):
        atomic_write_text(target, "old")
        atomic_write_text(source, "new")
        if not interrupt_at(event_number, writes[write]):
            break
        interrupted += 1
        assert target.read_text() in ("old", "new"), event_number
        atomic._remove_unfinished()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, source.name]), event_number
    assert target.read_text() == "new"
    assert interrupted > 10  # the profile reached into the write


def test_a_forked_childs_exit_leaves_its_parents_write_and_the_parents_exit_removes_it(tmp_path):
    """A write entered, then a child forked, which exits (its exit would finish the suspended write's cleanup):
    the parent's temporary file stays; then the parent stopped by Ctrl-C's exception before the write's exit ran:
    the file is gone once the parent has exited."""
    script = f"""
import os
from coclr.atomic import atomic_open
write = atomic_open({str(tmp_path / "entry")!r}, "wb")
write.__enter__().write(b"part")
child = os.fork()
if child == 0:
    raise SystemExit(0)  # the child's exit hooks run here (a plain exit, not multiprocessing's os._exit)
os.waitpid(child, 0)
assert len(os.listdir({str(tmp_path)!r})) == 1, "the child removed its parent's file"
raise KeyboardInterrupt
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "KeyboardInterrupt" in done.stderr, done.stderr
    assert "the child removed" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_scratch_folder_left_by_a_killed_process_is_removed_by_the_next(tmp_path, monkeypatch):
    """coclr learn killed with SIGKILL while measuring left its folders in /tmp for good (16 MB each time)."""
    import tempfile

    from coclr.atomic import scratch_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale, live, other = (tmp_path / f"coclr-timing.{gone}.x1", tmp_path / f"coclr-timing.{os.getpid()}.x2",
                          tmp_path / f"coclr-learn-calibration.{gone}.x3")
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "frames.bin").write_bytes(b"0" * 10)
    with scratch_folder("timing") as made:
        assert Path(made).is_dir() and Path(made).name.startswith(f"coclr-timing.{os.getpid()}.")
        assert not stale.exists() and live.exists() and other.exists()  # (another kind's: its own to clean)
    assert not Path(made).exists()


def test_a_checkpoint_write_that_fails_is_the_error_of_the_world_naming_the_file(tmp_path):
    """A disk full (here the file size limit, as ``ulimit -f`` sets it) while torch.save wrote was a RuntimeError
    of its zip writer ("unexpected pos 704 vs 598"), a traceback, not the one line naming the path."""
    script = f"""
import errno, resource, signal, torch
from coclr.atomic import atomic_torch_save
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
try:
    atomic_torch_save({{"w": torch.zeros(1_000_000)}}, {str(tmp_path / "c.pth")!r})
except OSError as error:
    print(error.errno == errno.EFBIG, error.filename)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(Path(atomic.__file__).parents[1])})
    assert result.stdout.split() == ["True", str(tmp_path / "c.pth")], result.stderr
    assert os.listdir(tmp_path) == []  # no partial file left


def test_a_lock_that_cannot_be_written_names_its_file(tmp_path):
    """The disk full as a lock wrote its holder was 'No space left on device' naming no path."""
    script = f"""
import errno, resource, signal
from coclr.filelock import exclusive_lock
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
try:
    with exclusive_lock({str(tmp_path / ".lock")!r}):
        pass
except OSError as error:
    print(error.errno == errno.EFBIG, error.filename)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(Path(atomic.__file__).parents[1])})
    assert result.stdout.split() == ["True", str(tmp_path / ".lock")], result.stderr
